"""Versioned, idempotent schema migrations, recorded in ``{db}.schema_migrations``.

Migrations are the numbered ``migrations/NNNN_name.sql`` files, applied in order; each file is a
list of statements separated by ``;`` at a line end, with ``{db}`` and ``{ttl[TABLE]}``
placeholders (the TTL expression of that table, :func:`ttl_expression`). Every statement is
idempotent (``IF NOT EXISTS``), so a migration interrupted half-way is simply re-run.

Retention is by kind (:data:`RETENTION`): raw series and their per-minute rollups keep
``store.retention.raw_days`` (alias ``store.ttl_days``), the hourly billing rollups
``rollup_days``, ``scheduler_events`` ``events_days``. The ledger (``gpu_allocations``), the
scheduler's restart state (``scheduler_state``) and the other bookkeeping tables have no TTL. At
every start each TTL'd table's TTL is compared with the settings and changed where it differs
(``ALTER TABLE ... MODIFY TTL``).

The TTL is computed on ``DateTime64`` (``toDateTime64(col, 3) + toIntervalDay(n)``, range to
2299): on ``DateTime`` (to 2106) ``toDateTime(ts) + INTERVAL 36500 DAY`` wrapped to 1990 and every
row expired at insert.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources
from typing import Protocol

from gpuq.errors import MigrationError, StoreError
from gpuq.store.client import Store

_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
MAX_RETENTION_DAYS = 36_500             # same bound as gpuq.settings (now + 100 years < 2299)

# table -> (kind of retention, its time column)
RETENTION: dict[str, tuple[str, str]] = {
    "gpu_samples": ("raw", "ts"), "ray_resources": ("raw", "ts"), "ray_nodes": ("raw", "ts"),
    "ray_jobs": ("raw", "ts"), "ray_placement_groups": ("raw", "ts"), "pod_events": ("raw", "ts"),
    "node_events": ("raw", "ts"), "gpu_samples_1m": ("raw", "minute"), "ray_resources_1m": ("raw", "minute"),
    "gpu_activity_1h": ("rollup", "hour"), "accounting_usage_1h": ("rollup", "hour"),
    "scheduler_events": ("events", "ts"),
}
TTL_TABLES = tuple(RETENTION)


class RetentionDays(Protocol):
    raw_days: int
    rollup_days: int
    events_days: int


@dataclass(frozen=True, slots=True)
class Retention:
    raw_days: int = 90
    rollup_days: int = 800
    events_days: int = 400


def ttl_expression(column: str, days: int) -> str:
    """A TTL that cannot wrap: DateTime64 arithmetic (as ClickHouse prints it back)."""
    days = int(days)
    if not 1 <= days <= MAX_RETENTION_DAYS:
        raise ValueError(f"retention of {days} days is outside 1..{MAX_RETENTION_DAYS}")
    return f"toDateTime64({column}, 3) + toIntervalDay({days})"


def ttl_expressions(retention: RetentionDays) -> dict[str, str]:
    days = {"raw": retention.raw_days, "rollup": retention.rollup_days, "events": retention.events_days}
    return {table: ttl_expression(col, days[kind]) for table, (kind, col) in RETENTION.items()}


def retention_days(retention: RetentionDays) -> dict[str, int]:
    """Each TTL'd table's retention in days."""
    days = {"raw": retention.raw_days, "rollup": retention.rollup_days, "events": retention.events_days}
    return {table: int(days[kind]) for table, (kind, _) in RETENTION.items()}


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


def migrate(store: Store, ttl_days: int = 90, retention: RetentionDays | None = None) -> list[int]:
    """Apply the migrations not yet recorded; return the versions applied now. ``retention``
    (``store.retention``) sets each kind's TTL; without it ``ttl_days`` is the raw series' and
    the other kinds keep their defaults."""
    ret: RetentionDays = retention if retention is not None else Retention(raw_days=int(ttl_days))
    ttl = ttl_expressions(ret)
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
                store.command(stmt.format(db=db, ttl=ttl))
            except StoreError as exc:
                raise MigrationError(mig.version, f"{mig.name}: {exc}") from exc
        store.command(f"INSERT INTO {db}.schema_migrations (version, name) VALUES ({mig.version}, '{mig.name}')")
        applied.append(mig.version)
    _apply_ttl(store, ttl)
    return applied


def _apply_ttl(store: Store, ttl: dict[str, str]) -> None:
    """Bring every TTL'd table's TTL to the settings (stores made before this version had
    ``toDateTime(ts) + INTERVAL n DAY``, one retention for all)."""
    rows = store.query(
        "SELECT name, engine_full FROM system.tables WHERE database = {db:String}",
        {"db": store.database}).rows
    engines = {r[0]: r[1].replace(" ", "") for r in rows}
    for table, expr in ttl.items():
        full = engines.get(table, "")
        if full and f"TTL{expr.replace(' ', '')}" not in full:
            store.command(f"ALTER TABLE {store.database}.{table} MODIFY TTL {expr}")
