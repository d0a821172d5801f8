"""The tenant's page of one queue (``GET /queues/{queue}/tenant``, issue 21): what a team needs to
know about its place in the cluster, from what the scheduler and the accounting already hold.

* ``guaranteed``, ``max``, ``weight``, ``priority``: the queue file's;
* ``now``: the accounting's "now" rows of the queue (one per GPU type and ``*``), every field they
  carry: allocated, pending, borrowed, lent, fair share, and ``entitlement`` where the accounting
  computes one (``scheduler.reclaim: fair_share``); ``entitlement`` is also lifted to the top
  (from the ``*`` row) when present;
* ``usage``: fair share over time (``scheduler.usage_half_life_s``): the half-life, the queue's
  decayed GPU-hours and score (:mod:`accounting.decay`) as the last cycle's snapshots carry them,
  when they were read, and ``rank``: the queue's place among the leaf queues by score (1: served
  first among queues equally owed GPUs, :mod:`scheduler.ordering`); ``{"half_life_s": 0}`` when off;
* ``pending``: its waiting workloads in queue order, each with its position, reason and start-time
  forecast (``eta``, as on ``/workloads``); ``running``: how many and their GPUs;
* ``preemptions``: the recent preemptions that took work of this queue (as ``/preemptions``
  records them, every field they carry) and those its work made; where the records carry the
  GPU-seconds a preemption threw away (a field ending ``gpu_seconds``), their sum as ``lost_gpu_seconds``.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping
from typing import Any

from accounting.decay import HOUR, score

PENDING_SHOWN = 200          # the page lists at most this many of the queue's pending workloads
PREEMPTIONS_READ = 1000      # and looks for its preemptions among this many recent ones


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat()


def ranks(usage: Mapping[str, float], weights: Mapping[str, float], leaves: frozenset[str]) -> dict[str, int]:
    """Each leaf queue's place by score (1 first; equal scores share a place)."""
    scores = sorted((score(usage.get(q, 0.0), weights[q]), q) for q in leaves)
    out: dict[str, int] = {}
    place, last = 0, None
    for i, (s, q) in enumerate(scores, 1):
        if s != last:
            place, last = i, s
        out[q] = place
    return out


def tenant_page(service: Any, accounting: Any, queue: str, now_s: float,
                readable_preemptions: Any, readable_workloads: Any) -> dict[str, Any] | None:
    """The page of ``queue`` (module docstring); None when the configuration has no such queue.
    ``readable_*``: the API's rewriting of instants in messages (:mod:`scheduler.api.readable`)."""
    config = service.config
    cfg = config.queues.get(queue)
    if cfg is None or queue == "root":
        return None
    out: dict[str, Any] = {"queue": queue, "at": _iso(now_s), "leaf": not cfg.children,
                           "guaranteed": dict(cfg.guaranteed), "max": dict(cfg.max), "weight": cfg.weight,
                           "priority": cfg.priority}
    rows = [r for r in accounting.rows() if r.get("queue") == queue] if accounting is not None else []
    out["now"] = rows
    star = next((r for r in rows if r.get("gpu_type") == "*"), None)
    if star is not None and "entitlement" in star:
        out["entitlement"] = star["entitlement"]
    half = float(service.settings.usage_half_life_s)
    usage: dict[str, Any] = {"half_life_s": half}
    got = service.usage_now()
    if half > 0 and got is not None:
        decayed, at = got
        leaves = frozenset(config.leaves())
        own = sum(v for q, v in decayed.items() if q == queue or q.startswith(queue + "."))
        usage.update({"decayed_gpu_hours": round(own / HOUR, 6), "at": _iso(at)})
        if queue in leaves:
            usage["score"] = score(decayed.get(queue, 0.0), cfg.weight)
            usage["rank"] = ranks(decayed, {q: config.queues[q].weight for q in leaves}, leaves)[queue]
            usage["queues_ranked"] = len(leaves)
    out["usage"] = usage
    pending = readable_workloads(service.workloads(queue, "pending", PENDING_SHOWN))
    out["pending"] = [{"id": v.id, "queue": v.queue, "gpus": v.gpus, "priority": v.priority,
                       "position": v.position, "reason_code": v.reason_code, "message": v.message,
                       "eta": getattr(v, "eta", None)} for v in pending]
    running = service.workloads(queue, "running")
    out["running"] = {"workloads": len(running), "gpus": sum(v.gpus for v in running)}
    mine = [dataclasses.asdict(r) for r in readable_preemptions(service.preemptions(PREEMPTIONS_READ))]
    hit = [r for r in mine if any(q == queue or q.startswith(queue + ".") for q in r.get("victim_queues", ()))]
    made = [r for r in mine if r.get("queue") == queue or str(r.get("queue", "")).startswith(queue + ".")]
    pre: dict[str, Any] = {"suffered": len(hit), "made": len(made), "recent": hit[:50]}
    costs = [v for r in hit for k, v in r.items() if k.endswith("gpu_seconds") and isinstance(v, (int, float))]
    if costs:
        pre["lost_gpu_seconds"] = sum(costs)
    out["preemptions"] = pre
    return out
