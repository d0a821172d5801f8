"""What the dashboards read that the other routes do not serve: capacity and fragmentation per
type and node, idle allocated GPUs with how long they have been idle, the collectors' health and
the scheduler's recent events. Each function reshapes what the accounting or the store already
holds into plain dicts for :mod:`scheduler.api.routes_dashboard`; the arithmetic stays in
:mod:`accounting` (the "now" view, idle runs).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from accounting import service as acc
from accounting.idle import current
from accounting.queues import ROOT
from accounting.resolve import Resolver

EVENTS = ("submit", "admit", "preempt", "finish", "reject", "cancel")


def capacity(live: Any) -> dict[str, Any]:
    """Per GPU type (and ``*``, all types) and per node, from the last "now" view."""
    view = live.live_view()
    if view is None:
        return {"at": None, "types": [], "total": None, "nodes": [], "starving": [], "pending": {}}
    idle = {d.gpu_type: d.idle for d in view.distribution if d.queue == "*"}
    pending = {r.gpu_type: r.pending for r in view.rows if r.queue == ROOT and r.pending}

    def one(t: Any) -> dict[str, Any]:
        return {"gpu_type": t.gpu_type, "capacity": t.capacity, "allocated": t.allocated, "free": t.free,
                "idle": idle.get(t.gpu_type, sum(idle.values()) if t.gpu_type == "*" else 0.0),
                "fragmented_free": t.fragmented_free, "fragmentation_ratio": t.fragmentation_ratio,
                "fits": {str(k): v for k, v in t.fits.items()}}

    return {
        "at": view.at_s,
        "types": [one(t) for t in view.capacity.types],
        "total": one(view.capacity.total),
        "nodes": [{"cluster": n.cluster, "node": n.node, "gpu_type": n.gpu_type, "capacity": n.capacity,
                   "allocated": n.allocated, "free": n.free, "schedulable": n.schedulable,
                   "overcommitted": n.overcommitted} for n in view.capacity.nodes],
        "distribution": [{"gpu_type": d.gpu_type, "queue": d.queue, "capacity": d.capacity,
                          "allocated": d.allocated, "idle": d.idle, "free": d.free} for d in view.distribution],
        "starving": [{"queue": s.queue, "allocated": s.allocated, "guaranteed": s.guaranteed,
                      "pending": s.pending, "waiting_s": s.waiting_s} for s in view.starving],
        "pending": pending,
    }


def idle(live: Any, now_s: float) -> dict[str, Any]:
    """GPUs idle now (an open idle run, :func:`accounting.idle.current`) joined to the pods that
    hold them: per workload (idle GPUs, since when) and per node."""
    snap = acc.now_snapshot(live.store, now_s, live.params, pending=())
    resolver = Resolver(live.config)
    owner = {(a.cluster, a.namespace, a.pod, a.node): a for a in snap.allocations
             if a.start_s <= now_s and (a.end_s is None or a.end_s > now_s)}
    work: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    nodes: dict[tuple[str, str], float] = {}
    for run in current(snap.idle_runs, now_s, live.params):
        a = owner.get((run.cluster, run.namespace, run.pod, run.node))
        if a is None:                       # DCGM saw a pod the allocations do not hold: not counted
            continue
        key = (a.cluster, resolver.queue(a.queue, a.namespace), a.namespace, a.workload)
        w = work.setdefault(key, {"cluster": key[0], "queue": key[1], "namespace": key[2], "workload": key[3],
                                  "gpu_type": resolver.gpu_type(a.gpu_model, a.gpu_resource), "nodes": set(),
                                  "idle_gpus": 0.0, "idle_since": run.start_s})
        w["idle_gpus"] += 1.0
        w["idle_since"] = min(w["idle_since"], run.start_s)
        w["nodes"].add(a.node)
        nodes[(a.cluster, a.node)] = nodes.get((a.cluster, a.node), 0.0) + 1.0
    held = _held(snap.allocations, resolver, now_s)
    rows = []
    for key, w in sorted(work.items()):
        rows.append({**w, "nodes": sorted(w["nodes"]), "allocated_gpus": held.get(key, 0.0),
                     "idle_for_s": now_s - w["idle_since"]})
    rows.sort(key=lambda r: (-r["idle_gpus"] * r["idle_for_s"], r["queue"], r["workload"]))
    return {"at": now_s, "idle_gpus": sum(r["idle_gpus"] for r in rows), "workloads": rows,
            "nodes": [{"cluster": c, "node": n, "idle_gpus": v} for (c, n), v in sorted(nodes.items())]}


def _held(allocs: Iterable[Any], resolver: Resolver, now_s: float) -> dict[tuple[str, str, str, str], float]:
    out: dict[tuple[str, str, str, str], float] = {}
    for a in allocs:
        if a.start_s <= now_s and (a.end_s is None or a.end_s > now_s):
            k = (a.cluster, resolver.queue(a.queue, a.namespace), a.namespace, a.workload)
            out[k] = out.get(k, 0.0) + a.gpus
    return out


_HEALTH = """
SELECT source, cluster, node, toUnixTimestamp64Milli(max(ts)) / 1000, count()
FROM {db}.gpu_samples
WHERE ts > fromUnixTimestamp64Milli({since:Int64}, 'UTC') AND ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')
GROUP BY source, cluster, node
UNION ALL
SELECT 'kubernetes', cluster, '', toUnixTimestamp64Milli(max(ts)) / 1000, count()
FROM (SELECT cluster, ts FROM {db}.pod_events
      WHERE ts > fromUnixTimestamp64Milli({since:Int64}, 'UTC') AND ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')
      UNION ALL
      SELECT cluster, ts FROM {db}.node_events
      WHERE ts > fromUnixTimestamp64Milli({since:Int64}, 'UTC') AND ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC'))
GROUP BY cluster
UNION ALL
SELECT 'ray', cluster, '', toUnixTimestamp64Milli(max(ts)) / 1000, count()
FROM {db}.ray_nodes
WHERE ts > fromUnixTimestamp64Milli({since:Int64}, 'UTC') AND ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')
GROUP BY cluster"""


def collector_health(store: Any, now_s: float, stale_s: float, lookback_s: float = 86400.0,
                     registry: Any = None) -> dict[str, Any]:
    """The newest row each source wrote per cluster (and node, for GPU samples) in the last
    ``lookback_s``; ``stale`` when older than ``stale_s``. With the process's Prometheus
    ``registry`` (``gpuq serve`` runs the collectors), the scrape results per target as well."""
    rows = store.query(_HEALTH.replace("{db}", store.database),
                       {"since": int((now_s - lookback_s) * 1000), "n": int(now_s * 1000)}).rows
    sources = [{"source": str(s), "cluster": str(c), "node": str(n), "last_s": float(t), "rows": int(k),
                "age_s": now_s - float(t), "stale": now_s - float(t) > stale_s}
               for s, c, n, t, k in sorted(rows, key=lambda r: (str(r[0]), str(r[1]), str(r[2])))]
    return {"at": now_s, "stale_after_s": stale_s, "sources": sources, "targets": _scrapes(registry)}


def _scrapes(registry: Any) -> list[dict[str, Any]]:
    if registry is None:
        return []
    out: dict[tuple[str, str, str], dict[str, Any]] = {}
    for fam in registry.collect():
        if fam.name not in ("gpuq_collector_scrapes", "gpuq_collector_scrape_duration_seconds"):
            continue
        for s in fam.samples:
            lab = s.labels
            key = (lab.get("source", ""), lab.get("cluster", ""), lab.get("target", ""))
            t = out.setdefault(key, {"source": key[0], "cluster": key[1], "target": key[2],
                                     "ok": 0, "error": 0, "timeout": 0, "duration_s": None})
            if s.name == "gpuq_collector_scrapes_total" and lab.get("result") in ("ok", "error", "timeout"):
                t[lab["result"]] = int(s.value)
            elif s.name == "gpuq_collector_scrape_duration_seconds":
                t["duration_s"] = s.value
    return [out[k] for k in sorted(out)]


_EVENTS_SQL = """
SELECT t, seq, event, workload, queue, gpu_type, placement, by, reason
FROM {db}.scheduler_events
WHERE cluster = {c:String} AND t >= {t0:Float64} AND t <= {t1:Float64} AND event IN {kinds:Array(String)}
ORDER BY t DESC, seq DESC
LIMIT {limit:UInt32}"""


def scheduler_events(store: Any, cluster: str, start_s: float, end_s: float, kinds: Iterable[str],
                     limit: int) -> list[dict[str, Any]]:
    """The scheduler's recorded decisions in ``[start_s, end_s]``, newest first."""
    rows = store.query(_EVENTS_SQL.replace("{db}", store.database),
                       {"c": cluster, "t0": start_s, "t1": end_s, "kinds": list(kinds), "limit": limit}).rows
    return [{"t": float(t), "seq": int(seq), "event": str(e), "workload": str(w), "queue": str(q),
             "gpu_type": str(g), "gpus": int(sum((p or {}).values())), "placement": dict(p or {}),
             "by": str(b), "reason": str(r)} for t, seq, e, w, q, g, p, b, r in rows]
