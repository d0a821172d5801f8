"""Scheduling quality of one simulated run, per leaf queue and in all, from its events and its
cluster (``gpuq simulate --baseline``; docs/SCENARIOS.md). Pure: no I/O.

``wait_p50_s`` / ``wait_p90_s`` / ``wait_p99_s``
    Submit to first admit of each admitted workload (the summary's waits), linear interpolation
    between closest ranks (:func:`scheduler.simulator.report.percentile`); ``null`` when none.
``utilization``
    The queue's GPU-seconds over the cluster's GPUs times the run's makespan; in all, the
    summary's ``gpu_utilization`` (the queues' values add up to it).
``preemptions``
    Preempt events suffered by the queue's workloads.
``stranded_gpu_hours`` / ``stranded_gpus_avg``
    GPUs free but unusable by the smallest pending shape, integrated over the run (GPU-hours) and
    averaged over the makespan. At each instant, a node's free GPUs ``f > 0`` are stranded when
    some pending workload accepts the node's GPU type and every such workload asks more than
    ``f`` GPUs per pod; free GPUs on a node of a type no pending workload accepts are idle, not
    stranded, and so is everything when nothing is pending. In all: the pending workloads of
    every queue; per queue: that queue's pending workloads only. Pending starts at submit, ends at
    admit (or reject) and starts again at a preemption.
``guarantee_violation_s``
    Time the queue spends with demand its guarantee covers unmet: some pending workload would
    keep the queue within its guaranteed GPUs (GPUs it holds + the workload's GPUs <= its
    ``guaranteed.gpu``) and is not running. In all: the sum over queues (queue-seconds).

The state changes only at event times, so every time integral is exact: a sum over the steps
between consecutive event times, up to the makespan.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.cycle import acceptable_types
from scheduler.model import Workload
from scheduler.simulator.report import percentile
from scheduler.snapshot import Cluster

METRICS = ("wait_p50_s", "wait_p90_s", "wait_p99_s", "utilization", "preemptions", "stranded_gpu_hours",
           "stranded_gpus_avg", "guarantee_violation_s")
ALL = "(all)"


class _Pending:
    """Pending workloads of one scope (a queue, or all): per GPU type, a counter of GPUs per pod."""

    __slots__ = ("per_type",)

    def __init__(self, types: Sequence[str]) -> None:
        self.per_type: dict[str, Counter[int]] = {t: Counter() for t in types}

    def add(self, types: tuple[str, ...], k: int, sign: int) -> None:
        for t in types:
            c = self.per_type[t]
            c[k] += sign
            if c[k] == 0:
                del c[k]

    def stranded(self, free_by_type: Mapping[str, Counter[int]]) -> int:
        total = 0
        for t, c in self.per_type.items():
            if not c:
                continue
            smallest = min(c)
            for f, n in free_by_type[t].items():
                if 0 < f < smallest:
                    total += f * n
        return total


def quality(cluster: Cluster, workloads: Sequence[Workload], events: Sequence[Mapping[str, Any]],
            summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``{queue: {metric: value}, "(all)": {...}}`` for the leaf queues of the summary, in its order."""
    by_id = {w.id: w for w in workloads}
    queues = list(summary["queues"])
    makespan = float(summary["makespan_s"])
    capacity = sum(n.gpus for n in cluster.nodes) * makespan
    types_of = {wid: acceptable_types(cluster, w) for wid, w in by_id.items()}

    node_type = [n.gpu_type for n in cluster.nodes]
    free = [n.gpus for n in cluster.nodes]
    free_by_type: dict[str, Counter[int]] = {t: Counter() for t in cluster.types}
    for i, f in enumerate(free):
        free_by_type[node_type[i]][f] += 1
    index = cluster.node_index

    scopes = {q: _Pending(cluster.types) for q in queues}
    every = _Pending(cluster.types)
    held: dict[str, int] = dict.fromkeys(queues, 0)                   # GPUs running per queue
    pending_gpus: dict[str, Counter[int]] = {q: Counter() for q in queues}   # gang sizes pending
    guarantee = {q: int(cluster.guarantee[q].get("gpu", 0)) for q in queues}
    placed: dict[str, dict[str, int]] = {}
    submitted: dict[str, float] = {}
    waits: dict[str, list[float]] = {q: [] for q in queues}
    preempted: Counter[str] = Counter()
    stranded_all = 0.0
    stranded = dict.fromkeys(queues, 0.0)
    violation = dict.fromkeys(queues, 0.0)

    def pend(w: Workload, sign: int) -> None:
        types = types_of[w.id]
        scopes[w.queue].add(types, w.gpus_per_pod, sign)
        every.add(types, w.gpus_per_pod, sign)
        c = pending_gpus[w.queue]
        c[w.gpus] += sign
        if c[w.gpus] == 0:
            del c[w.gpus]

    def take(where: Mapping[str, int], sign: int) -> None:
        for name, g in where.items():
            i = index[name]
            fb = free_by_type[node_type[i]]
            fb[free[i]] -= 1
            free[i] += sign * g
            fb[free[i]] += 1

    def integrate(dt: float) -> None:
        nonlocal stranded_all
        if dt <= 0:
            return
        stranded_all += every.stranded(free_by_type) * dt
        for q in queues:
            c = pending_gpus[q]
            if not c:
                continue
            stranded[q] += scopes[q].stranded(free_by_type) * dt
            if held[q] + min(c) <= guarantee[q]:
                violation[q] += dt

    last = 0.0
    for e in events:
        t = float(e["t"])
        if t > last:
            integrate(min(t, makespan) - last)
            last = t
        kind, wid = e["event"], e["workload"]
        w = by_id[wid]
        if kind == "submit":
            submitted[wid] = t
            pend(w, 1)
        elif kind == "reject":
            pend(w, -1)
        elif kind == "admit":
            pend(w, -1)
            placed[wid] = e["placement"]
            take(e["placement"], -1)
            held[w.queue] += w.gpus
            if wid in submitted:
                waits[w.queue].append(t - submitted.pop(wid))
        elif kind in ("finish", "preempt"):
            take(placed.pop(wid), 1)
            held[w.queue] -= w.gpus
            if kind == "preempt":
                preempted[w.queue] += 1
                pend(w, 1)
    if makespan > last:
        integrate(makespan - last)

    out: dict[str, dict[str, Any]] = {}
    for q in queues:
        out[q] = _row(waits[q], summary["queues"][q]["gpu_seconds"] / capacity if capacity > 0 else 0.0,
                      preempted[q], stranded[q], makespan, violation[q])
    everything = [x for q in queues for x in waits[q]]
    out[ALL] = _row(everything, float(summary["gpu_utilization"]), sum(preempted.values()), stranded_all,
                    makespan, sum(violation.values()))
    return out


def _row(waits: list[float], utilization: float, preemptions: int, stranded_gpu_s: float, makespan: float,
         violation_s: float) -> dict[str, Any]:
    return {
        "wait_p50_s": percentile(waits, 50),
        "wait_p90_s": percentile(waits, 90),
        "wait_p99_s": percentile(waits, 99),
        "utilization": round(utilization, 6) + 0.0,
        "preemptions": preemptions,
        "stranded_gpu_hours": round(stranded_gpu_s / 3600.0, 6) + 0.0,
        "stranded_gpus_avg": round(stranded_gpu_s / makespan, 6) + 0.0 if makespan > 0 else 0.0,
        "guarantee_violation_s": round(violation_s, 6) + 0.0,
    }
