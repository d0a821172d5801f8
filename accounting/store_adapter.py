"""Thin reads from the public tables into the engine's snapshots. No arithmetic here beyond what
SQL aggregates (:mod:`accounting.sql`); every number the CLI shows is finished by the pure engine.

Idle detection reads one of three sources (``IdleSource``): ``raw`` (``gpu_samples``, exact),
``1m`` (the per-minute rollup, the same answer when every minute has samples) or ``1h``
(``gpu_activity_1h``: an hour is quiet when its highest activity is under the threshold and at
least ``60 - max_gap_s/60`` of its minutes have data; idle runs are whole hours, so a quiet
stretch shorter than its hours is missed: a lower bound of the exact figure, for long windows).
"""
from __future__ import annotations

import weakref

from collections.abc import Sequence
from fractions import Fraction
from typing import Any, Literal

from accounting import sql
from accounting.errors import AccountingQueryError
from accounting.idle import IdleParams
from accounting.ledger import ADMISSION, dedup
from accounting.model import Allocation, IdleRun, NodeCapacity, PendingDemand, UsageAgg, Window, milli
from gpuq.errors import StoreError
from gpuq.gpu_share import GPU_RESOURCE, SHARED_SUFFIX, mig_slice_milli, milli_floor, replicas
from gpuq.store import Store

IdleSource = Literal["raw", "1m", "1h"]


def _ms(t: float) -> int:
    return round(t * 1000)


def _q(store: Store, text: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
    try:
        return store.query(text.replace("{db}", store.database), params).rows
    except StoreError as exc:
        raise AccountingQueryError(str(exc)) from exc


OPEN_MARGIN_S = 3600.0


def alloc_table(store: Store, window: Window) -> str:
    """``gpu_allocations_open`` when it holds every allocation overlapping the window (the window
    starts an hour or more after the latest prune cutoff, so a prune running meanwhile cannot
    take one away), else ``gpu_allocations``."""
    return _sources(store, window)[0]


def ledger_sql(store: Store) -> str:
    """:data:`accounting.sql.LEDGER_KUEUE` once the store holds a Kueue Workload's row (remembered:
    rows are not taken back but by retention, and the Kueue ledger is right without them too), else
    :data:`accounting.sql.LEDGER` (the same rule for every other row, without the Kueue pieces'
    cost). A row that arrives between this check and the query is read by the plain ledger once:
    cut at its workload's first observed row, as before the pieces."""
    return _sources(store, Window(0.0, 0.0))[1]


def _alloc(store: Store, text: str, window: Window) -> str:
    table, ledger = _sources(store, window)
    return text.replace("@LEDGER@", ledger).replace("@ALLOC@", table)


_KUEUE_SEEN: weakref.WeakKeyDictionary[Store, set[str]] = weakref.WeakKeyDictionary()   # store -> databases


def _sources(store: Store, window: Window) -> tuple[str, str]:
    """:func:`alloc_table` and :func:`ledger_sql`, in one round trip (the Kueue check only until it
    finds a row)."""
    known = store.database in _KUEUE_SEEN.get(store, ())
    kueue = "1" if known else \
        "(SELECT count() FROM (SELECT 1 FROM {db}.gpu_allocations WHERE source = 'kueue' LIMIT 1))"
    rows = _q(store, f"SELECT toUnixTimestamp64Milli(max(cutoff)) / 1000, count(), {kueue} "
                     "FROM {db}.gpu_allocations_open_pruned", {})
    cutoff = float(rows[0][0]) if rows and rows[0][1] else None
    table = "gpu_allocations_open" if cutoff is None or window.start_s >= cutoff + OPEN_MARGIN_S else "gpu_allocations"
    if known or (rows and rows[0][2]):
        _KUEUE_SEEN.setdefault(store, set()).add(store.database)
        return table, sql.LEDGER_KUEUE
    return table, sql.LEDGER


def _window(window: Window, now_s: float) -> dict[str, Any]:
    return {"f": _ms(window.start_s), "t": _ms(window.end_s), "n": _ms(now_s)}


def read_usage(store: Store, window: Window, now_s: float, by_workload: bool = True) -> list[UsageAgg]:
    """GPU-seconds per UsageAgg key; without ``by_workload`` the workload is left empty (fewer rows)."""
    rows = _q(store, _alloc(store, sql.USAGE, window),
              {**_window(window, now_s), "by_workload": int(by_workload)})
    return [UsageAgg(str(c), str(q), str(ns), str(w), str(m), str(r), gpu_seconds=float(g))
            for c, q, ns, w, m, r, g in rows]


_LOSSES = """
SELECT cluster, queue, sum(lost_gpu_seconds) FROM {db}.scheduler_events
WHERE event = 'preempt' AND t >= {f:Float64} AND t < {t:Float64}
GROUP BY cluster, queue ORDER BY cluster, queue"""


_HAS_LOSSES = """
SELECT count() FROM system.columns
WHERE database = {d:String} AND table = 'scheduler_events' AND name = 'lost_gpu_seconds'"""


def read_preemption_losses(store: Store, window: Window) -> list[tuple[str, str, float]]:
    """``(cluster, victim queue, GPU-seconds)`` that gpuq's preemptions in ``window`` threw away,
    summed from their ``preempt`` events (``scheduler_events.lost_gpu_seconds``, issue 21; the
    scheduler's cluster name and queue path). Events from before that column hold 0; a store not
    migrated to it yet (0011) has none to read."""
    if not int(_q(store, _HAS_LOSSES, {"d": store.database})[0][0]):
        return []
    rows = _q(store, _LOSSES, {"f": float(window.start_s), "t": float(window.end_s)})
    return [(str(c), str(q), float(x)) for c, q, x in rows]


def read_allocations(store: Store, window: Window, now_s: float,
                     sources: tuple[str, ...] = ()) -> list[Allocation]:
    """The ledger's allocations overlapping the window (:mod:`accounting.ledger`), of ``sources``
    only when given (after the ledger chose each workload's source)."""
    rows, _ = read_ledger(store, window, now_s)
    return [a for a in rows if not sources or a.source in sources]


def read_ledger(store: Store, window: Window, now_s: float) -> tuple[list[Allocation], list[Allocation]]:
    """The ledger's allocations overlapping the window, and the history it was cut with: gpuq's
    observed rows that ended before the window (:func:`accounting.ledger.combine` takes them when
    the scheduler's live admissions are added)."""
    rows = [_allocation(r) for r in _q(store, _alloc(store, sql.LEDGER_ROWS, window), _window(window, now_s))]
    history = [a for a in rows if a.workload_id and a.source != ADMISSION and a.end_s is not None
               and a.end_s <= window.start_s]
    kept = [a for a in dedup(rows, window.start_s) if a.start_s < window.end_s]
    return kept, history


def _allocation(row: Sequence[Any]) -> Allocation:
    c, ns, p, u, q, n, m, g, s, e, r, pr, rc, src, wid, ok, o = row
    return Allocation(str(c), str(ns), str(p), str(u), str(q), str(n), str(m), int(g), float(s),
                      None if e is None else float(e), str(r), int(pr), str(rc), str(src), str(wid), str(ok), str(o))


def _runs_query(source: IdleSource, params: IdleParams, scan: dict[str, int]) -> tuple[str, dict[str, Any]]:
    """The idle-runs query for a source and scan range, with its parameters: buckets are numbered
    from ``b0`` (the scan's first bucket); short scans carry one byte per bucket and series, long
    ones a bitmap of their samples' codes (see :mod:`accounting.sql`)."""
    if source == "1h":
        bucket, reach = 3600, 3600
        extra = {"min_minutes": max(0, 60 - int(params.max_gap_s // 60))}
    else:
        bucket, reach = int(params.bucket_s), int(params.bucket_s + params.max_gap_s)
        extra = {}
    b0 = scan["scan"] // (bucket * 1000)
    nb = -(-scan["scan_end"] // (bucket * 1000)) - b0 + 1
    dense = source != "1h" and nb <= sql.RESAMPLE_MAX_BUCKETS
    runs = sql.RUNS.replace("@SUB@", sql.BUCKETS[(source, dense, source != "1h" and bucket == 60)])
    return runs, {"bucket": bucket, "reach": reach, "threshold": float(params.threshold_pct),
                  "window": int(params.window_s), "b0": b0, "b1": b0 + nb, **scan, **extra}


def _scan(window: Window, now_s: float, params: IdleParams, source: IdleSource) -> dict[str, int]:
    """A run crossing a window edge is idle by its whole length: scan a window's worth (and a gap)
    before and after, up to now."""
    bucket = 3600 if source == "1h" else params.bucket_s
    reach = max(params.window_s, bucket) + params.max_gap_s + bucket
    return {"scan": _ms(window.start_s - reach), "scan_end": _ms(min(window.end_s + reach, now_s))}


def read_usage_idle(store: Store, window: Window, now_s: float, params: IdleParams,
                    source: IdleSource = "1m", by_workload: bool = True) -> list[UsageAgg]:
    """GPU-seconds and idle GPU-seconds per UsageAgg key, in one query (one read of the allocations)."""
    runs, p = _runs_query(source, params, _scan(window, now_s, params, source))
    models = sorted(str(m) for (m,) in _q(store, _alloc(store, sql.MIG_MODELS, window), {}))
    rows = _q(store, _alloc(store, sql.USAGE_IDLE, window).replace("@SUB@", runs),
              {**_window(window, now_s), **p, "by_workload": int(by_workload), "mig_models": models,
               "mig_milli": [mig_slice_milli(m) for m in models]})
    return [UsageAgg(str(c), str(q), str(ns), str(w), str(m), str(r), gpu_seconds=float(g),
                     idle_gpu_seconds=float(i), idle_method=str(im))
            for c, q, ns, w, m, r, g, i, im in rows]


def read_idle(store: Store, window: Window, now_s: float, params: IdleParams,
              source: IdleSource = "1m", by_workload: bool = True) -> list[UsageAgg]:
    """Idle GPU-seconds per UsageAgg key (the keys with some)."""
    aggs = read_usage_idle(store, window, now_s, params, source, by_workload)
    return [UsageAgg(a.cluster, a.queue, a.namespace, a.workload, a.gpu_model, a.gpu_resource,
                     idle_gpu_seconds=a.idle_gpu_seconds, idle_method=a.idle_method)
            for a in aggs if a.idle_gpu_seconds > 0]


def read_idle_runs(store: Store, window: Window, now_s: float, params: IdleParams,
                   source: IdleSource = "1m") -> list[IdleRun]:
    runs, p = _runs_query(source, params, _scan(window, now_s, params, source))
    rows = _q(store, sql.IDLE_RUNS.replace("@SUB@", runs), {**_window(window, now_s), **p})
    return [IdleRun(str(c), str(n), str(g), str(ns), str(pod), float(s), float(e), str(mig), bool(o))
            for c, n, g, mig, ns, pod, s, e, o in sorted(rows)]


def read_nodes(store: Store, now_s: float) -> list[NodeCapacity]:
    """Kubernetes nodes (allocatable GPUs, MIG slices as their own model, counted as slices); a
    time-sliced (or MPS) node's devices over their replicas: a node of 4 GPUs advertising 16
    replicas holds 4 GPUs. For clusters that have no node events, Ray's nodes from the State API
    (``ray_nodes``), else from the metrics pages."""
    out: list[NodeCapacity] = []
    for c, n, model, gpus, ready, cordoned, _, mig, reps in _q(store, sql.NODES, {"n": _ms(now_s)}):
        ok = bool(ready) and not bool(cordoned)
        labels = {str(k): str(v) for k, v in (reps or {}).items()}
        if gpus:
            out.append(NodeCapacity(str(c), str(n), str(model), _devices(float(gpus), labels, GPU_RESOURCE), ok,
                                    replicas(labels, GPU_RESOURCE)))
        for res, count in sorted((mig or {}).items()):
            profile = str(res).removeprefix("nvidia.com/mig-").removesuffix(SHARED_SUFFIX)
            out.append(NodeCapacity(str(c), str(n), f"{model}-MIG-{profile}", _devices(float(count), labels, str(res)), ok))
    k8s = {nc.cluster for nc in out}
    state = [NodeCapacity(str(c), str(n), str(model or ""), milli(float(gpus)), True)
             for c, n, model, gpus in _q(store, sql.RAY_STATE_NODES, {"n": _ms(now_s)}) if str(c) not in k8s]
    out.extend(state)
    seen = k8s | {nc.cluster for nc in state}
    for c, n, model, gpus in _q(store, sql.RAY_NODES, {"n": _ms(now_s)}):
        if str(c) not in seen:
            out.append(NodeCapacity(str(c), str(n), str(model or ""), milli(float(gpus)), True))
    return out


def _devices(advertised: float, labels: dict[str, str], resource: str) -> int:
    """Milli-GPUs (MIG: milli-slices) of ``advertised`` devices the plugin made ``replicas`` of each."""
    return milli_floor(Fraction(str(advertised)) / replicas(labels, resource))


def read_pending(store: Store, now_s: float, lookback_s: float = 7 * 86400) -> list[PendingDemand]:
    rows = _q(store, sql.PENDING, {"n": _ms(now_s), "lookback": int(lookback_s)})
    return [PendingDemand(str(c), str(ns), str(w), str(q), milli(float(g)), float(since), str(m))
            for c, ns, w, q, g, since, m, *_ in rows]
