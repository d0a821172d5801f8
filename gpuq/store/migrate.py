"""Versioned, idempotent schema migrations, recorded in ``{db}.schema_migrations``.

Migrations are the numbered ``migrations/NNNN_name.sql`` files, applied in order; each file is a
list of statements separated by ``;`` at a line end, with ``{db}`` and ``{ttl[TABLE]}``
placeholders (the TTL expression of that table, :func:`ttl_expression`), and ``{since[ROLLUP]}``
in a migration that rebuilds rollups (:mod:`gpuq.store.rebuild`: the time the rebuild starts from,
fixed once per run, so that each DELETE and its INSERT cover the same range). Every statement is
idempotent (``IF NOT EXISTS``), so a migration interrupted half-way is simply re-run.

Retention is by kind (:data:`RETENTION`): raw series and their per-minute rollups keep
``store.retention.raw_days`` (alias ``store.ttl_days``), the hourly billing rollups
``rollup_days``, ``scheduler_events`` ``events_days``. The ledger (``gpu_allocations``), the
scheduler's restart state (``scheduler_state``) and the other bookkeeping tables have no TTL. At
every start each TTL'd table's TTL is compared with the settings and changed where it differs
(``ALTER TABLE ... MODIFY TTL``).

With ``store.cluster`` set (the store's ``cluster``) every statement, these included, is rewritten
by :func:`gpuq.store.cluster.cluster_statements`: Replicated tables ``ON CLUSTER`` under
``<table>_local`` and Distributed tables under the public names. Unset, the statements are the
files' text exactly as before. A store made one way is not converted to the other: migrating it
with the other setting stops with an error naming ``store.cluster``.

The TTL is computed on ``DateTime64`` (``toDateTime64(col, 3) + toIntervalDay(n)``, range to
2299): on ``DateTime`` (to 2106) ``toDateTime(ts) + INTERVAL 36500 DAY`` wrapped to 1990 and every
row expired at insert.
"""
from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from typing import Protocol

from gpuq.errors import ConfigError, MigrationError, StoreError
from gpuq.store import rebuild
from gpuq.store.client import Store
from gpuq.store.cluster import cluster_statements, local_name

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
    @property
    def raw_days(self) -> int: ...
    @property
    def rollup_days(self) -> int: ...
    @property
    def events_days(self) -> int: ...


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
        text = "\n".join(ln for ln in entry.read_text().splitlines() if not ln.lstrip().startswith("--"))
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


def _statements(stmt: str, cluster: str) -> list[str]:
    return cluster_statements(stmt, cluster) if cluster else [stmt]


def needs_since(mig: Migration) -> bool:
    """Whether ``mig`` rebuilds rollups (its statements name ``{since[ROLLUP]}``)."""
    return any("{since[" in stmt for stmt in mig.statements)


def migration_statements(mig: Migration, db: str, ttl: dict[str, str], cluster: str = "",
                         since: Mapping[str, str] | None = None) -> list[str]:
    """The statements that apply ``mig`` to database ``db`` (on ``cluster`` when set). ``since``:
    per rollup, the time its rebuild starts from (:func:`gpuq.store.rebuild.since_literals`), for a
    migration that rebuilds rollups."""
    if since is None and needs_since(mig):
        raise ValueError(f"migration {mig.version:04d}_{mig.name} rebuilds rollups: give since= (gpuq.store.rebuild)")
    return [out for stmt in mig.statements
            for out in _statements(stmt.format(db=db, ttl=ttl, since=since or {}), cluster)]


def bootstrap_statements(db: str, cluster: str = "") -> list[str]:
    """The database and ``schema_migrations``, before any migration."""
    return [*_statements(f"CREATE DATABASE IF NOT EXISTS {db}", cluster), *_statements(
        f"CREATE TABLE IF NOT EXISTS {db}.schema_migrations (version UInt32, name String, "
        f"applied_at DateTime64(3, 'UTC') DEFAULT now64(3)) ENGINE = ReplacingMergeTree ORDER BY version", cluster)]


def _check_shape(store: Store, cluster: str) -> None:
    """Refuse a store made with the other ``store.cluster`` (no conversion is attempted)."""
    rows = store.query("SELECT engine FROM system.tables WHERE database = {db:String} AND name = 'schema_migrations'",
                       {"db": store.database}).rows
    if not rows:
        return
    distributed = rows[0][0] == "Distributed"
    if cluster and not distributed:
        raise ConfigError("store.cluster", f"is {cluster!r} but database {store.database!r} was created without a "
                                           f"cluster (its tables are not Distributed); gpuq does not convert a "
                                           f"store: unset store.cluster or use a new database")
    if not cluster and distributed:
        raise ConfigError("store.cluster", f"is unset but database {store.database!r} was created on a cluster "
                                           f"(its tables are Distributed): set store.cluster to that cluster's name")


def migrate(store: Store, ttl_days: int = 90, retention: RetentionDays | None = None,
            now: float | None = None) -> list[int]:
    """Apply the migrations not yet recorded; return the versions applied now. ``retention``
    (``store.retention``) sets each kind's TTL; without it ``ttl_days`` is the raw series' and
    the other kinds keep their defaults. ``store.cluster`` (set when the store was opened)
    picks the single-server or the cluster form of every statement. A migration that rebuilds
    rollups (0006) rebuilds them from the raw rows within retention at ``now`` (Unix seconds,
    default the clock) and logs the older rollup rows it kept (:mod:`gpuq.store.rebuild`)."""
    ret: RetentionDays = retention if retention is not None else Retention(raw_days=int(ttl_days))
    ttl = ttl_expressions(ret)
    db, cluster = store.database, store.cluster
    boot = bootstrap_statements(db, cluster)
    store.command(boot[0])
    _check_shape(store, cluster)
    for stmt in boot[1:]:
        store.command(stmt)
    done = applied_versions(store)
    applied = []
    for mig in load_migrations():
        if mig.version in done:
            continue
        try:
            since = _rebuild_since(store, ret, now) if needs_since(mig) else None
            for stmt in migration_statements(mig, db, ttl, cluster, since):
                store.command(stmt)
        except (StoreError, ValueError) as exc:
            raise MigrationError(mig.version, f"{mig.name}: {exc}") from exc
        store.command(f"INSERT INTO {db}.schema_migrations (version, name) VALUES ({mig.version}, '{mig.name}')")
        applied.append(mig.version)
    _apply_ttl(store, ttl)
    return applied


def _rebuild_since(store: Store, ret: RetentionDays, now: float | None) -> dict[str, str]:
    """The rebuild's start per rollup, fixed once for the whole migration; logs what it keeps."""
    times = rebuild.since_times(time.time() if now is None else now,
                                rebuild.store_raw_days(store, retention_days(ret)))
    rebuild.report_kept(rebuild.kept_rows(store, times))
    return {t: rebuild.literal(e) for t, e in times.items()}


def ttl_statements(store: Store, ttl: dict[str, str]) -> list[str]:
    """The ``MODIFY TTL`` statements that bring every TTL'd table's TTL to the settings (stores made
    before this version had ``toDateTime(ts) + INTERVAL n DAY``, one retention for all). On a
    cluster the local tables carry the TTL (read on the server the store talks to; the ALTER goes
    to every server)."""
    rows = store.query(
        "SELECT name, engine_full FROM system.tables WHERE database = {db:String}",
        {"db": store.database}).rows
    engines = {r[0]: r[1].replace(" ", "") for r in rows}
    out = []
    for table, expr in ttl.items():
        full = engines.get(local_name(table) if store.cluster else table, "")
        if full and f"TTL{expr.replace(' ', '')}" not in full:
            out += _statements(f"ALTER TABLE {store.database}.{table} MODIFY TTL {expr}", store.cluster)
    return out


def _apply_ttl(store: Store, ttl: dict[str, str]) -> None:
    for stmt in ttl_statements(store, ttl):
        store.command(stmt)
