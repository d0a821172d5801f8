"""Versioned, idempotent schema migrations, recorded in ``{db}.schema_migrations``.

Migrations are the numbered ``migrations/NNNN_name.sql`` files, applied in order; each file is a
list of statements separated by ``;`` at a line end, with ``{db}`` and ``{ttl_days}``
placeholders. Every statement is idempotent (``IF NOT EXISTS``), so a migration interrupted
half-way is simply re-run. The TTL of the raw tables follows ``store.ttl_days`` at every start.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

from gpuq.errors import MigrationError, StoreError
from gpuq.store.client import Store

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
TTL_TABLES = ("gpu_samples", "ray_resources", "pod_events", "node_events", "scheduler_events")


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    statements: tuple[str, ...]


def load_migrations() -> list[Migration]:
    out = []
    folder = resources.files("gpuq.store") / "migrations"
    for entry in folder.iterdir():
        m = _NAME.match(entry.name)
        if not m:
            continue
        text = "\n".join(l for l in entry.read_text().splitlines() if not l.lstrip().startswith("--"))
        stmts = tuple(s.strip() for s in re.split(r";\s*$", text, flags=re.M) if s.strip())
        out.append(Migration(int(m.group(1)), m.group(2), stmts))
    out.sort(key=lambda m: m.version)
    versions = [m.version for m in out]
    if len(set(versions)) != len(versions):
        raise MigrationError(max(versions), "two migration files share a version number")
    return out


def applied_versions(store: Store) -> set[int]:
    rows = store.query(f"SELECT version FROM {store.database}.schema_migrations").rows
    return {int(r[0]) for r in rows}


def migrate(store: Store, ttl_days: int = 90) -> list[int]:
    """Apply the migrations not yet recorded; return the versions applied now."""
    db = store.database
    store.command(f"CREATE DATABASE IF NOT EXISTS {db}")
    store.command(
        f"CREATE TABLE IF NOT EXISTS {db}.schema_migrations (version UInt32, name String, "
        f"applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = ReplacingMergeTree ORDER BY version"
    )
    done = applied_versions(store)
    applied = []
    for mig in load_migrations():
        if mig.version in done:
            continue
        for stmt in mig.statements:
            try:
                store.command(stmt.format(db=db, ttl_days=int(ttl_days)))
            except StoreError as exc:
                raise MigrationError(mig.version, f"{mig.name}: {exc}") from exc
        store.command(f"INSERT INTO {db}.schema_migrations (version, name) VALUES ({mig.version}, '{mig.name}')")
        applied.append(mig.version)
    _apply_ttl(store, ttl_days)
    return applied


def _apply_ttl(store: Store, ttl_days: int) -> None:
    rows = store.query(
        "SELECT name, engine_full FROM system.tables WHERE database = {db:String}",
        {"db": store.database}).rows
    engines = {r[0]: r[1] for r in rows}
    for table in TTL_TABLES:
        full = engines.get(table, "")
        if full and f"toIntervalDay({int(ttl_days)})" not in full.replace(" ", ""):
            store.command(
                f"ALTER TABLE {store.database}.{table} MODIFY TTL toDateTime(ts) + INTERVAL {int(ttl_days)} DAY")
