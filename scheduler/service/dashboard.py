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
from accounting.idle import current, idle_method, join_methods
from accounting.ledger import by_slot, holder
from accounting.model import as_gpus
from accounting.queues import ROOT
from accounting.resolve import Resolver
from scheduler.model import gpus_in, gpus_out

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
    hold them: per workload (idle GPUs, since when; ``name`` as people know it, see
    :func:`workload_name`) and per node. An idle device counts for its holder by the holder's
    share of it (issue 19: a pod of 0.25 of an idle GPU is 0.25 idle GPUs, a MIG slice its
    fraction), and each workload says how its activity is known (``idle_method``)."""
    snap = acc.now_snapshot(live.store, now_s, live.params, pending=())
    resolver = Resolver(live.config)
    owner = by_slot(a for a in snap.allocations if a.start_s <= now_s and (a.end_s is None or a.end_s > now_s))
    work: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    nodes: dict[tuple[str, str], float] = {}
    for run in current(snap.idle_runs, now_s, live.params):
        a = holder(owner, run.cluster, run.namespace, run.pod, run.node)
        if a is None:                       # DCGM saw a pod the allocations do not hold: not counted
            continue
        key = (a.cluster, resolver.queue(a.queue, a.namespace), a.namespace, a.workload)
        w = work.setdefault(key, {"cluster": key[0], "queue": key[1], "namespace": key[2], "workload": key[3],
                                  "workload_id": a.workload_id, "name": workload_name(a),
                                  "gpu_type": resolver.gpu_type(a.gpu_model, a.gpu_resource), "nodes": set(),
                                  "idle_gpus": 0.0, "idle_since": run.start_s, "idle_method": ""})
        share = min(a.milli_gpus, 1000) / 1000      # a run is one device: the holder's share of it
        w["idle_gpus"] += share
        w["idle_method"] = join_methods((w["idle_method"], idle_method(a)))
        w["idle_since"] = min(w["idle_since"], run.start_s)
        w["nodes"].add(a.node)
        nodes[(a.cluster, a.node)] = nodes.get((a.cluster, a.node), 0.0) + share
    held = _held(snap.allocations, resolver, now_s)
    rows = []
    for key, w in sorted(work.items()):
        rows.append({**w, "nodes": sorted(w["nodes"]), "allocated_gpus": held.get(key, 0.0),
                     "idle_for_s": now_s - w["idle_since"]})
    rows.sort(key=lambda r: (-r["idle_gpus"] * r["idle_for_s"], r["queue"], r["workload"]))
    return {"at": now_s, "idle_gpus": sum(r["idle_gpus"] for r in rows), "workloads": rows,
            "nodes": [{"cluster": c, "node": n, "idle_gpus": v} for (c, n), v in sorted(nodes.items())]}


def workload_name(a: Any) -> str:
    """A workload as its users know it: the gpuq id when gpuq admitted it (a Ray placement group
    ``gpuq-<id>`` or a pod carrying the id), else ``namespace/name`` of the pod or its Ray cluster,
    or the bare name where there is no namespace (a Ray job outside Kubernetes)."""
    if a.workload_id:
        return str(a.workload_id)
    return f"{a.namespace}/{a.workload}" if a.namespace else str(a.workload)


def _held(allocs: Iterable[Any], resolver: Resolver, now_s: float) -> dict[tuple[str, str, str, str], float]:
    out: dict[tuple[str, str, str, str], float] = {}
    for a in allocs:
        if a.start_s <= now_s and (a.end_s is None or a.end_s > now_s):
            k = (a.cluster, resolver.queue(a.queue, a.namespace), a.namespace, a.workload)
            out[k] = out.get(k, 0.0) + a.gpus
    return out


_HEALTH = """
SELECT source, cluster, node, toUnixTimestamp64Milli(max(ts)) / 1000, count(),
       toUnixTimestamp64Milli(min(ts)) / 1000
FROM {db}.gpu_samples
WHERE ts > fromUnixTimestamp64Milli({since:Int64}, 'UTC') AND ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')
GROUP BY source, cluster, node
UNION ALL
SELECT 'kubernetes', cluster, '', toUnixTimestamp64Milli(max(ts)) / 1000, count(),
       toUnixTimestamp64Milli(min(ts)) / 1000
FROM (SELECT cluster, ts FROM {db}.pod_events
      WHERE ts > fromUnixTimestamp64Milli({since:Int64}, 'UTC') AND ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')
      UNION ALL
      SELECT cluster, ts FROM {db}.node_events
      WHERE ts > fromUnixTimestamp64Milli({since:Int64}, 'UTC') AND ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC'))
GROUP BY cluster
UNION ALL
SELECT 'ray', cluster, '', toUnixTimestamp64Milli(max(ts)) / 1000, count(),
       toUnixTimestamp64Milli(min(ts)) / 1000
FROM {db}.ray_nodes
WHERE ts > fromUnixTimestamp64Milli({since:Int64}, 'UTC') AND ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')
GROUP BY cluster"""


def collector_health(store: Any, now_s: float, stale_s: float, lookback_s: float = 86400.0,
                     registry: Any = None) -> dict[str, Any]:
    """The newest (and oldest) row each source wrote per cluster (and node, for GPU samples) in the
    last ``lookback_s``; ``stale`` when older than ``stale_s``; ``data_since`` where the history
    starts (:func:`data_since`), so the dashboards fit their time range to a younger history. With the process's Prometheus
    ``registry`` (``gpuq serve`` runs the collectors), the scrape results per target as well."""
    rows = store.query(_HEALTH.replace("{db}", store.database),
                       {"since": int((now_s - lookback_s) * 1000), "n": int(now_s * 1000)}).rows
    sources: list[dict[str, Any]] = [{"source": str(s), "cluster": str(c), "node": str(n), "last_s": float(t), "rows": int(k),
                "first_s": float(f), "age_s": now_s - float(t), "stale": now_s - float(t) > stale_s}
               for s, c, n, t, k, f in sorted(rows, key=lambda r: (str(r[0]), str(r[1]), str(r[2])))]
    since = data_since(store, now_s, lookback_s, [x["first_s"] for x in sources])
    return {"at": now_s, "stale_after_s": stale_s, "lookback_s": lookback_s, "data_since": since,
            "sources": sources, "targets": _scrapes(registry)}


_SINCE = """
SELECT toUnixTimestamp64Milli(min(start)) / 1000, count() FROM {db}.gpu_allocations
WHERE start <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')
UNION ALL
SELECT toUnixTimestamp64Milli(min(ts)) / 1000, count() FROM {db}.scheduler_events
WHERE ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')"""


def data_since(store: Any, now_s: float, lookback_s: float, firsts: Iterable[float]) -> float | None:
    """Where the history starts: the oldest of the collectors' rows (``firsts``), the ledger's
    allocations and the scheduler's events, but at most ``lookback_s`` back; None when there is
    nothing at all."""
    found = [float(t) for t, n in store.query(_SINCE.replace("{db}", store.database),
                                              {"n": int(now_s * 1000)}).rows if int(n)]
    oldest = min([*firsts, *found], default=None)
    return None if oldest is None else max(oldest, now_s - lookback_s)


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
SELECT t, seq, event, workload, queue, gpu_type, placement_milli, by, reason, lost_gpu_seconds
FROM {db}.scheduler_events
WHERE cluster = {c:String} AND t >= {t0:Float64} AND t <= {t1:Float64} AND event IN {kinds:Array(String)}
ORDER BY t DESC, seq DESC
LIMIT {limit:UInt32}"""


def scheduler_events(store: Any, cluster: str, start_s: float, end_s: float, kinds: Iterable[str],
                     limit: int) -> list[dict[str, Any]]:
    """The scheduler's recorded decisions in ``[start_s, end_s]``, newest first. ``gpus`` and
    ``gpu_type`` are the workload's: an admit carries its placement; a finish, preempt or cancel of
    a running workload the placement of its last admit before it (since its last preemption);
    anything else (submit, reject, a
    pending workload's cancel) the GPUs its submission asked for (``gpu_type`` '' there). A
    ``preempt`` also has ``lost_gpu_seconds``, the work it threw away (issue 21)."""
    rows = store.query(_EVENTS_SQL.replace("{db}", store.database),
                       {"c": cluster, "t0": start_s, "t1": end_s, "kinds": list(kinds), "limit": limit}).rows
    out = [{"t": float(t), "seq": int(seq), "event": str(e), "workload": str(w), "queue": str(q),
            "gpu_type": str(g), "gpus": as_gpus(int(sum((p or {}).values()))),
            "placement": {str(k): as_gpus(int(v)) for k, v in (p or {}).items()},
            "by": str(b), "reason": str(r), **({"lost_gpu_seconds": float(x)} if e == "preempt" else {})}
           for t, seq, e, w, q, g, p, b, r, x in rows]
    bare = [e for e in out if not e["placement"]]
    if bare:
        _fill_gpus(store, cluster, bare)
    return out


_HELD_SQL = """
SELECT workload, t, seq, event, gpu_type, placement_milli, spec
FROM {db}.scheduler_events
WHERE cluster = {c:String} AND workload IN {ids:Array(String)} AND event IN ('submit', 'admit', 'preempt')
  AND t <= {t1:Float64}
ORDER BY t, seq"""


def _fill_gpus(store: Any, cluster: str, events: list[dict[str, Any]]) -> None:
    """``gpus``/``gpu_type`` of events without a placement, from the workload's admits and its
    submission (see :func:`scheduler_events`)."""
    import json

    ids = sorted({e["workload"] for e in events})
    t1 = max(e["t"] for e in events)
    history: dict[str, list[tuple[float, int, str, str, int | float]]] = {}
    for wid, t, seq, kind, g, p, spec in store.query(_HELD_SQL.replace("{db}", store.database),
                                                    {"c": cluster, "ids": ids, "t1": t1}).rows:
        if kind != "submit":
            gpus = as_gpus(int(sum((p or {}).values())))
        else:
            try:
                d = json.loads(spec) if spec else {}
                gpus = gpus_out(int(d.get("pods", 1)) * gpus_in(d.get("gpus_per_pod", 0)))
            except (ValueError, TypeError, AttributeError, ArithmeticError):
                continue
        history.setdefault(str(wid), []).append((float(t), int(seq), str(kind), str(g), gpus))
    for e in events:
        last_admit = last_submit = None
        for t, seq, kind, g, gpus in history.get(e["workload"], ()):
            if (t, seq) > (e["t"], e["seq"]) or ((t, seq) == (e["t"], e["seq"]) and kind == "preempt"):
                break                                             # later, or the preemption itself
            if kind == "submit":
                last_submit, last_admit = (g, gpus), None         # a new submission of the same id
            elif kind == "admit":
                last_admit = (g, gpus)
            else:                                                 # preempted: pending again
                last_admit = None
        running = e["event"] in ("finish", "preempt", "cancel") and last_admit is not None
        held = last_admit if running else last_submit
        if held is not None:
            e["gpus"] = held[1]
            e["gpu_type"] = held[0] if running else e["gpu_type"]
