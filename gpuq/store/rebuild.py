"""Rebuilding the rollups from their raw rows (migration 0006, docs/SCHEMA.md "Rollups exactly once").

A rollup fed by a materialized view can be rebuilt from its raw table only where every raw row is
still there: from the first minute (hour) that starts at or after ``now - retention`` of the raw
table, the retention being the raw table's TTL as the store has it (``store.retention.raw_days``
when it cannot be read). :func:`since_times` gives that start per rollup; the migration deletes the
rollup's rows from there and inserts ``SELECT ... FROM raw GROUP BY ...`` with the view's own
expressions. Older rollup rows (``gpu_activity_1h`` keeps ``rollup_days``, the raw rows ``raw_days``)
are kept as they were: :func:`kept_rows` finds them and :func:`report_kept` logs each table and
time range that was not rebuilt.
"""
from __future__ import annotations

import datetime as dt
import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpuq.store.client import Store
from gpuq.store.cluster import cluster_statements, local_name

log = logging.getLogger("gpuq.store.migrate")

# rollup -> (raw table it is built from, its time column, seconds in one of its periods)
ROLLUPS: dict[str, tuple[str, str, int]] = {
    "gpu_samples_1m": ("gpu_samples", "minute", 60),
    "ray_resources_1m": ("ray_resources", "minute", 60),
    "gpu_activity_1h": ("gpu_samples", "hour", 3600),
}
_TTL_DAYS = re.compile(r" TTL .*?toIntervalDay\((\d+)\)")

# rollup -> (its columns, the view's SELECT list and the filter it adds, its GROUP BY): the view's own
# expressions (migrations 0001, 0002), checked against migration 0006 by tests/test_rollups_once.py
_VIEWS: dict[str, tuple[str, str, str, str]] = {
    "gpu_samples_1m": (
        ("minute, cluster, node, gpu_uuid, mig_instance, gpu_model, namespace, pod, metric, "
         "value_sum, value_count, value_min, value_max"),
        ("toStartOfMinute(ts) AS minute, cluster, node, gpu_uuid, mig_instance, "
         "anyLast(toString(gpu_model)) AS gpu_model, namespace, pod, metric, sum(value) AS value_sum, "
         "toUInt64(count()) AS value_count, min(value) AS value_min, max(value) AS value_max"),
        "",
        "minute, cluster, node, gpu_uuid, mig_instance, namespace, pod, metric"),
    "ray_resources_1m": (
        "minute, cluster, node, resource, state, value_sum, value_count, value_max",
        ("toStartOfMinute(ts) AS minute, cluster, node, resource, state, sum(value) AS value_sum, "
         "toUInt64(count()) AS value_count, max(value) AS value_max"),
        "",
        "minute, cluster, node, resource, state"),
    "gpu_activity_1h": (
        "hour, cluster, node, gpu_uuid, mig_instance, namespace, pod, prof_max, util_max, prof_minutes, util_minutes",
        ("toStartOfHour(ts) AS hour, cluster, node, gpu_uuid, mig_instance, namespace, pod, "
         "maxIf(value * 100, metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE') AS prof_max, "
         "maxIf(value, metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_max, "
         "groupBitOrIf(bitShiftLeft(toUInt64(1), toMinute(ts)), metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE') AS prof_minutes, "
         "groupBitOrIf(bitShiftLeft(toUInt64(1), toMinute(ts)), metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_minutes"),
        "metric IN ('DCGM_FI_PROF_GR_ENGINE_ACTIVE', 'DCGM_FI_DEV_GPU_UTIL') AND pod != '' AND ",
        "hour, cluster, node, gpu_uuid, mig_instance, namespace, pod"),
}


def statements(db: str, rollup: str, since: str, until: str | None = None) -> list[str]:
    """The DELETE and the INSERT ... SELECT that rebuild ``rollup`` from its raw rows for the periods
    from ``since`` (included) to ``until`` (excluded; open without it), both whole periods as SQL
    ``DateTime`` expressions. ``insert_deduplicate = 0``: a rebuild run again (an interrupted
    migration) must not be taken for the first run's INSERT (older servers deduplicate
    ``INSERT ... SELECT`` by the block's hash)."""
    source, col, _ = ROLLUPS[rollup]
    columns, select, where, group = _VIEWS[rollup]
    upto_rollup, upto_raw = (f" AND {col} < {until}", f" AND ts < {until}") if until else ("", "")
    return [f"DELETE FROM {db}.{rollup} WHERE {col} >= {since}{upto_rollup}",
            (f"INSERT INTO {db}.{rollup} ({columns})\nSELECT {select}\nFROM {db}.{source}\n"
             f"WHERE {where}ts >= {since}{upto_raw}\nGROUP BY {group}\nSETTINGS insert_deduplicate = 0")]


def rebuild_range(store: Store, source: str, first: float, last: float, now: float,
                  raw_days: Mapping[str, int]) -> list[str]:
    """Rebuild every rollup of ``source`` for the periods holding ``first`` .. ``last`` (Unix
    seconds), those no older than :func:`since_times` allows; return the rollups rebuilt. Rows
    inserted into ``source`` for those periods while it runs are counted twice."""
    done = []
    since = since_times(now, raw_days)
    for rollup, (src, _, period) in ROLLUPS.items():
        if src != source:
            continue
        start = max(int(first) // period * period, since[rollup])
        end = (int(last) // period + 1) * period
        if start >= end:
            continue
        for stmt in statements(store.database, rollup, literal(start), literal(end)):
            for out in (cluster_statements(stmt, store.cluster) if store.cluster else [stmt]):
                store.command(out)
        done.append(rollup)
    return done


@dataclass(frozen=True, slots=True)
class Kept:
    """Rows of ``table`` from ``first`` to ``last`` (its time column), older than ``since``, kept
    as they were: ``source`` no longer holds all the raw rows they were built from."""

    table: str
    source: str
    first: dt.datetime
    last: dt.datetime
    rows: int
    since: dt.datetime

    def message(self) -> str:
        return (f"{self.table}: could not rebuild {self.rows} rows from {self.first:%Y-%m-%d %H:%M} to "
                f"{self.last:%Y-%m-%d %H:%M} UTC (before {self.since:%Y-%m-%d %H:%M}, {self.source} no "
                f"longer holds all their raw rows): kept as they were")


def since_times(now: float, raw_days: Mapping[str, int]) -> dict[str, int]:
    """Per rollup, the Unix time (a whole period) from which it is rebuilt: the first period starting
    at or after ``now`` less its raw table's retention in days (``raw_days[source]``)."""
    out = {}
    for rollup, (source, _, period) in ROLLUPS.items():
        cutoff = math.ceil(now - int(raw_days[source]) * 86_400)
        out[rollup] = -(-cutoff // period) * period
    return out


def literal(epoch: int) -> str:
    """``epoch`` as a ClickHouse ``DateTime`` in UTC, for a migration's ``{since[...]}``."""
    return f"toDateTime('{dt.datetime.fromtimestamp(epoch, dt.UTC):%Y-%m-%d %H:%M:%S}', 'UTC')"


def since_literals(now: float, raw_days: Mapping[str, int]) -> dict[str, str]:
    return {t: literal(e) for t, e in since_times(now, raw_days).items()}


def store_raw_days(store: Store, fallback: Mapping[str, int]) -> dict[str, int]:
    """The retention in days that each raw source of a rollup has in the store (its TTL; the local
    table's on a cluster), ``fallback[source]`` where it has none that can be read."""
    sources = sorted({s for s, _, _ in ROLLUPS.values()})
    names = {local_name(s) if store.cluster else s: s for s in sources}
    rows = store.query("SELECT name, engine_full FROM system.tables WHERE database = {db:String} "
                       "AND name IN {names:Array(String)}", {"db": store.database, "names": list(names)}).rows
    found = {names[name]: int(m.group(1)) for name, full in rows if (m := _TTL_DAYS.search(full))}
    return {s: found.get(s, int(fallback[s])) for s in sources}


def kept_rows(store: Store, since: Mapping[str, int]) -> list[Kept]:
    """The rollup rows older than ``since`` (:func:`since_times`), per table: what a rebuild keeps."""
    out = []
    for table, (source, col, _) in ROLLUPS.items():
        first, last, n = store.query(
            f"SELECT min({col}), max({col}), count() FROM {store.database}.{table} WHERE {col} < {literal(since[table])}"
        ).rows[0]
        if n:
            out.append(Kept(table, source, _utc(first), _utc(last), int(n),
                            dt.datetime.fromtimestamp(since[table], dt.UTC)))
    return out


def report_kept(kept: list[Kept]) -> None:
    for k in kept:
        log.warning("%s", k.message())


def _utc(value: dt.datetime) -> dt.datetime:
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)
