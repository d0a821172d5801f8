"""Materialised hourly accounting, for months of usage in well under a second.

:func:`materialize_hours` runs the exact engine queries (GPU-seconds from ``gpu_allocations``,
idle from the per-minute rollup) for each closed hour not yet done and stores the result in
``accounting_usage_1h`` (grain: hour, cluster, raw queue, namespace, GPU model and resource; no
workload). An hour is *closed* once the data an idle run crossing its end needs is in: its end
plus the idle window, a gap and a bucket is before now. A serving process calls it every few
minutes; the CLI's usage query then reads the materialised hours and computes only the rest (the
window's ragged edges, the open hours, any hour never materialised) live, one query per live
segment (GPU-seconds and idle together).

Each cycle also prunes ``gpu_allocations_open`` (:func:`prune_open_allocations`), which keeps the
"now" view and the open hours from reading every pod ever seen.
"""
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable

from accounting import decay
from accounting import store_adapter as sa
from accounting.idle import DEFAULT_PARAMS, IdleParams
from accounting.model import UsageAgg, Window
from gpuq.store import Store

HOUR = 3600.0
OPEN_KEEP_S = 86400.0       # gpu_allocations_open keeps the pods that ended less than this ago
COLUMNS = ("hour", "cluster", "queue", "namespace", "gpu_model", "gpu_resource", "gpu_seconds",
           "idle_gpu_seconds", "idle_threshold_pct", "idle_window_s", "computed_at")


def _utc(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.UTC)


def closed_until(now_s: float, params: IdleParams) -> float:
    """The end of the last hour that may be materialised at ``now_s``."""
    ready = now_s - params.window_s - params.max_gap_s - params.bucket_s
    return math.floor(ready / HOUR) * HOUR


def done_hours(store: Store, window: Window) -> list[float]:
    rows = sa._q(store, "SELECT DISTINCT toUnixTimestamp(hour) FROM {db}.accounting_hours "
                        "WHERE hour >= toDateTime({f:Int64}, 'UTC') AND hour < toDateTime({t:Int64}, 'UTC') ORDER BY 1",
                 {"f": int(window.start_s), "t": int(window.end_s)})
    return [float(r[0]) for r in rows]


def materialize_hours(store: Store, now_s: float, params: IdleParams = DEFAULT_PARAMS, *,
                      since_s: float | None = None, max_hours: int = 48) -> list[float]:
    """Compute and store up to ``max_hours`` closed hours not yet done (oldest first, from
    ``since_s``, default 48 hours back). Returns the hours written."""
    end = closed_until(now_s, params)
    start = math.floor((since_s if since_s is not None else end - 48 * HOUR) / HOUR) * HOUR
    if end <= start:
        return []
    done = set(done_hours(store, Window(start, end)))
    todo = [h for h in range(int(start), int(end), int(HOUR)) if float(h) not in done][:max_hours]
    for h in todo:
        w = Window(float(h), h + HOUR)
        aggs = sa.read_usage_idle(store, w, now_s, params, "1m", by_workload=False)
        stamp = _utc(now_s)
        merged = _merge(aggs)
        rows = [(_utc(h), *k, g, i, params.threshold_pct, params.window_s, stamp) for k, (g, i) in merged.items()]
        if rows:
            store.insert("accounting_usage_1h", rows, COLUMNS)
        store.insert("accounting_hours", [(_utc(h), stamp)], ("hour", "computed_at"))
    prune_open_allocations(store, now_s)
    return [float(h) for h in todo]


def prune_open_allocations(store: Store, now_s: float, keep_s: float = OPEN_KEEP_S) -> int:
    """Delete from ``gpu_allocations_open`` every row of the pods whose latest row ended before
    ``now_s - keep_s``. The cutoff is recorded first, so that a reader that sees it no longer
    takes the table for a window reaching before it. Deleted rows go at the next merges; when
    they are most of the table (the first prune of a store), it is compacted at once. Returns the
    number of pods deleted."""
    db, cutoff = store.database, round((now_s - keep_s) * 1000)
    ended = "maxIf(version, end IS NOT NULL AND end < fromUnixTimestamp64Milli({c:Int64}, 'UTC'))"
    gone = (f"SELECT cluster, uid FROM {db}.gpu_allocations_open GROUP BY cluster, uid "
            f"HAVING max(version) = {ended}")
    n, total = sa._q(store, f"SELECT countIf(v = e), count() FROM (SELECT max(version) AS v, {ended} AS e "
                            f"FROM {db}.gpu_allocations_open GROUP BY cluster, uid)", {"c": cutoff})[0]
    if n:
        store.insert("gpu_allocations_open_pruned", [(_utc(cutoff / 1000), _utc(now_s))],
                     ("cutoff", "computed_at"))
        # on a cluster: the local tables of every shard (gpuq.store.cluster; the sharding key is
        # (cluster, uid), so each shard holds all rows of the pods it deletes)
        target = store.mutation_target("gpu_allocations_open")
        store.command(f"DELETE FROM {target} WHERE (cluster, uid) IN ({gone})", {"c": cutoff})
        if 2 * n > total:
            store.command(f"OPTIMIZE TABLE {target} FINAL")
    return int(n)


def _merge(aggs: Iterable[UsageAgg]) -> dict[tuple[str, ...], tuple[float, float]]:
    out: dict[tuple[str, ...], tuple[float, float]] = {}
    for a in aggs:
        k = (a.cluster, a.queue, a.namespace, a.gpu_model, a.gpu_resource)
        g, i = out.get(k, (0.0, 0.0))
        out[k] = (g + a.gpu_seconds, i + a.idle_gpu_seconds)
    return out


def decayed_materialized(store: Store, now_s: float, half_life_s: float,
                         lookback_half_lives: float = 20.0) -> tuple[list[tuple[str, str, float]], float | None]:
    """Fair share over time (issue 21) from the hourly rollups: per (raw queue, namespace) the
    decayed GPU-seconds (:mod:`accounting.decay`) of the materialised hours that ended at or before
    ``now_s`` and less than ``lookback_half_lives`` half-lives ago (older ones count under one
    millionth), each hour taken as used evenly over it; and the end of the newest such hour (None:
    none), after which the caller counts the rest live. One aggregation in the store, whatever the
    number of hours: ``sum(gpu_seconds * 2 ** -((now - end) / H))`` there, times the even-hour
    factor here (:func:`accounting.decay.decayed_hours` is the same sum row by row)."""
    since = now_s - lookback_half_lives * half_life_s
    rows = sa._q(store, """
        SELECT queue, namespace, sum(gpu_seconds * exp2(-({now:Float64} - toUnixTimestamp(hour) - 3600) / {h:Float64})),
               max(toUnixTimestamp(hour))
        FROM {db}.accounting_usage_1h FINAL
        WHERE hour >= toDateTime({f:Int64}, 'UTC') AND toUnixTimestamp(hour) + 3600 <= {now:Float64}
        GROUP BY queue, namespace""", {"now": float(now_s), "h": float(half_life_s), "f": int(since)})
    even = decay.even_factor(HOUR, half_life_s)
    last = max((float(r[3]) for r in rows), default=None)
    return [(str(q), str(ns), float(s) * even) for q, ns, s, _ in rows], None if last is None else last + HOUR


def read_materialized(store: Store, window: Window) -> list[UsageAgg]:
    """The stored hours inside the window (whole hours only), aggregated over the window."""
    rows = sa._q(store, """
        SELECT cluster, queue, namespace, gpu_model, gpu_resource, sum(gpu_seconds), sum(idle_gpu_seconds)
        FROM {db}.accounting_usage_1h FINAL
        WHERE hour >= toDateTime({f:Int64}, 'UTC') AND hour < toDateTime({t:Int64}, 'UTC')
        GROUP BY cluster, queue, namespace, gpu_model, gpu_resource""",
                 {"f": int(window.start_s), "t": int(window.end_s)})
    return [UsageAgg(str(c), str(q), str(ns), "", str(m), str(r), float(g), float(i)) for c, q, ns, m, r, g, i in rows]


def live_segments(window: Window, done: Iterable[float]) -> tuple[list[Window], list[Window]]:
    """Split the window into runs of materialised hours and the rest (computed live)."""
    stored: list[Window] = []
    live: list[Window] = []
    t = window.start_s
    for h in sorted(done):
        if h < t or h + HOUR > window.end_s:
            continue
        if h > t:
            live.append(Window(t, h))
        if stored and stored[-1].end_s == h:
            stored[-1] = Window(stored[-1].start_s, h + HOUR)
        else:
            stored.append(Window(h, h + HOUR))
        t = h + HOUR
    if t < window.end_s:
        live.append(Window(t, window.end_s))
    return stored, live


def usage_aggs(store: Store, window: Window, now_s: float, params: IdleParams, *,
               by_workload: bool, idle_source: str = "1m") -> list[UsageAgg]:
    """Usage over the window: materialised hours where they exist (not when grouping by workload,
    which they do not keep), the rest live."""
    done = [] if by_workload else done_hours(store, window)
    stored, live = live_segments(window, done)
    out: list[UsageAgg] = []
    for w in stored:
        out += read_materialized(store, w)
    for w in live:
        out += sa.read_usage_idle(store, w, now_s, params, idle_source, by_workload)  # type: ignore[arg-type]
    return out
