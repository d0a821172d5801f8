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

Fixed load (a scenario's ``fixed:``, as the replay held it: ``fixed``, ``SimResult.held``) takes its GPUs on its node
like a running workload, and counts for its queue's GPUs held when it has a leaf queue; it has no
wait, no preemption and no GPU-seconds of any queue here (the summary gives its own).

The state changes only at event times, so every time integral is exact: a sum over the steps
between consecutive event times, up to the makespan.

GPU-equivalents (issue 19), only where the scenario's configuration sets them (a type's
``equivalent`` other than 1, or a queue's ``gpu_eq``: ``QueueConfig.has_equivalents``), each next to
its raw-GPU metric (a scenario without them gives exactly the rows it gave):

``utilization_eq``
    The queue's GPU-equivalent-seconds (each admitted run's GPUs times its type's ``equivalent``,
    from its admit to its finish or preemption, or the makespan) over the cluster's equivalents
    (each node's GPUs times its type's) times the makespan; in all, the queues' sum.
``stranded_gpu_eq_hours`` / ``stranded_gpus_eq_avg``
    The stranded GPUs above, each weighed by its node type's ``equivalent``.

Shares (issue 19): a pending pod asking a share of one GPU counts as asking one GPU here, and a
device that shares hold part of is not free (the admit's ``devices`` say which): free GPUs are
whole free devices, as the scheduler places whole gangs.
"""
from __future__ import annotations

from collections import Counter
from decimal import Decimal
from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.cycle import acceptable_types
from scheduler.model import Gpus, Workload, is_share
from scheduler.simulator.report import HeldLoad, percentile
from scheduler.snapshot import Cluster

METRICS = ("wait_p50_s", "wait_p90_s", "wait_p99_s", "utilization", "preemptions", "stranded_gpu_hours",
           "stranded_gpus_avg", "guarantee_violation_s")
EQ_METRICS = ("utilization_eq", "stranded_gpu_eq_hours", "stranded_gpus_eq_avg")   # only with equivalents
ALL = "(all)"


class _Pending:
    """Pending workloads of one scope (a queue, or all): per GPU type, a counter of GPUs per pod,
    and the stranded GPU-seconds seen so far. While the smallest pod ``m`` of a type is unchanged,
    the scope's stranded GPUs on that type are ``below[type][m]`` at every instant, so their
    integral over that stretch is a difference of the running integrals ``cum[type][m]``."""

    __slots__ = ("cum", "eq", "eq_s", "gpu_s", "mark", "per_type", "smallest")

    def __init__(self, types: Sequence[str], cum: Mapping[str, list[float]],
                 eq: Mapping[str, float] | None = None) -> None:
        self.cum = cum
        self.eq = eq or {}                      # type -> equivalent (1 when absent)
        self.eq_s = 0.0                         # stranded GPU-equivalent-seconds
        self.per_type: dict[str, Counter[int]] = {t: Counter() for t in types}
        self.smallest: dict[str, int] = {}      # type -> its smallest pending pod (types with pending)
        self.mark: dict[str, float] = {}        # type -> cum[type][smallest] when it became so
        self.gpu_s = 0.0

    def add(self, types: tuple[str, ...], k: int, sign: int) -> None:
        for t in types:
            c = self.per_type[t]
            c[k] += sign
            if c[k] == 0:
                del c[k]
            old = self.smallest.get(t)
            new = min(c) if c else None
            if new != old:
                cum = self.cum[t]
                if old is not None:
                    self._gain(t, cum[min(old, len(cum) - 1)] - self.mark[t])
                if new is None:
                    del self.smallest[t]
                else:
                    self.smallest[t] = new
                    self.mark[t] = cum[min(new, len(cum) - 1)]

    def close(self) -> float:
        for t in list(self.smallest):
            cum = self.cum[t]
            self._gain(t, cum[min(self.smallest[t], len(cum) - 1)] - self.mark[t])
            self.mark[t] = cum[min(self.smallest[t], len(cum) - 1)]
        return self.gpu_s

    def _gain(self, t: str, gpu_s: float) -> None:
        self.gpu_s += gpu_s
        self.eq_s += gpu_s * self.eq.get(t, 1.0)


def quality(cluster: Cluster, workloads: Sequence[Workload], events: Sequence[Mapping[str, Any]],
            summary: Mapping[str, Any], fixed: Sequence[HeldLoad] = ()) -> dict[str, dict[str, Any]]:
    """``{queue: {metric: value}, "(all)": {...}}`` for the leaf queues of the summary, in its order.
    Cost: O(events x GPU types) plus O(distinct event times x GPU types x GPUs per node)."""
    by_id = {w.id: w for w in workloads}
    queues = list(summary["queues"])
    makespan = float(summary["makespan_s"])
    capacity = sum(n.gpus for n in cluster.nodes) * makespan
    types_of: dict[str, tuple[str, ...]] = {}

    node_type = [n.gpu_type for n in cluster.nodes]
    free = [n.gpus for n in cluster.nodes]
    caps = {t: cluster.type_cap[t] for t in cluster.types}
    counts: dict[str, list[int]] = {t: [0] * (caps[t] + 1) for t in cluster.types}   # nodes by free count
    for i, f in enumerate(free):
        counts[node_type[i]][f] += 1
    index = cluster.node_index
    # cum[t][m]: integral over time so far of the free GPUs on type-t nodes with 0 < free < m
    cum: dict[str, list[float]] = {t: [0.0] * (caps[t] + 2) for t in cluster.types}

    with_eq = cluster.config.has_equivalents
    eq = {t: float(v) for t, v in cluster.config.equivalents().items()} if with_eq else {}
    scopes = {q: _Pending(cluster.types, cum, eq) for q in queues}
    every = _Pending(cluster.types, cum, eq)
    eq_s: dict[str, float] = dict.fromkeys(queues, 0.0)              # GPU-equivalent-seconds per queue
    eq_since: dict[str, tuple[float, float]] = {}                    # running: (admit t, GPU-eq it holds)
    held: dict[str, Gpus] = dict.fromkeys(queues, 0)                  # GPUs running per queue
    pending_gpus: dict[str, Counter[Gpus]] = {q: Counter() for q in queues}   # gang sizes pending
    shared: dict[tuple[str, str], Gpus] = {}              # (node, device) -> share in use, while > 0
    guarantee = {q: int(cluster.guarantee[q].get("gpu", 0)) for q in queues}
    violating: dict[str, float] = {}                                   # queue -> since when
    violation = dict.fromkeys(queues, 0.0)
    placed: dict[str, Any] = {}                # its placement, or its devices (a gang of shares)
    submitted: dict[str, float] = {}
    waits: dict[str, list[float]] = {q: [] for q in queues}
    preempted: Counter[str] = Counter()

    def pend(w: Workload, sign: int) -> None:
        types = types_of.get(w.id)
        if types is None:
            types = types_of[w.id] = acceptable_types(cluster, w)
        k = 1 if is_share(w.gpus_per_pod) else int(w.gpus_per_pod)   # a share needs one device
        scopes[w.queue].add(types, k, sign)
        every.add(types, k, sign)
        c = pending_gpus[w.queue]
        c[w.gpus] += sign
        if c[w.gpus] == 0:
            del c[w.gpus]

    def check(q: str, t: float) -> None:
        c = pending_gpus[q]
        on = bool(c) and held[q] + min(c) <= guarantee[q]
        if on and q not in violating:
            violating[q] = t
        elif not on and q in violating:
            violation[q] += t - violating.pop(q)

    def take(where: Mapping[str, int], sign: int) -> None:
        for name, g in where.items():
            move(index[name], sign * g)

    def move(i: int, by: int) -> None:
        c = counts[node_type[i]]
        c[free[i]] -= 1
        free[i] += by
        c[free[i]] += 1

    def take_shares(devices: Mapping[str, Mapping[str, float]], sign: int) -> None:
        """A gang of shares taking (-1) or giving back (1) its devices' shares: a device leaves
        the free ones when its first share is taken, and comes back when its last is given back."""
        for name, on in devices.items():
            for dev, share in on.items():
                key = (name, dev)
                was = shared.get(key, 0)
                now = was - sign * Decimal(str(share))
                if now:
                    shared[key] = now
                else:
                    del shared[key]
                if not was:
                    move(index[name], -1)
                elif not now:
                    move(index[name], 1)

    def integrate(dt: float) -> None:
        if dt <= 0:
            return
        for t, c in counts.items():
            acc, row = 0, cum[t]
            for m in range(1, len(row)):            # free GPUs on nodes with 0 < free < m
                acc += (m - 1) * c[m - 1]
                row[m] += acc * dt

    # fixed load's starts and ends, in time order (ends first on a tie), applied before the events
    # of their instant
    marks = sorted([(h.end_s, 0, i) for i, h in enumerate(fixed)] + [(h.start_s, 1, i) for i, h in enumerate(fixed)])
    next_mark = 0
    last = 0.0

    def hold(upto: float) -> None:
        nonlocal next_mark, last
        while next_mark < len(marks) and marks[next_mark][0] <= upto:
            t, start, i = marks[next_mark]
            next_mark += 1
            if t > last:
                integrate(min(t, makespan) - last)
                last = t
            h = fixed[i]
            take(h.placement, -1 if start else 1)
            q = h.queue
            if q is not None and q in held:
                held[q] += (1 if start else -1) * sum(h.placement.values())
                check(q, t)

    for e in events:
        t = float(e["t"])
        if marks:
            hold(t)
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
            if is_share(w.gpus_per_pod):
                placed[wid] = e["devices"]
                take_shares(e["devices"], -1)
            else:
                placed[wid] = e["placement"]
                take(e["placement"], -1)
            held[w.queue] += w.gpus
            if with_eq:
                eq_since[wid] = (t, float(w.gpus) * eq.get(str(e.get("gpu_type") or ""), 1.0))
            if wid in submitted:
                waits[w.queue].append(t - submitted.pop(wid))
        elif kind in ("finish", "preempt"):
            if is_share(w.gpus_per_pod):
                take_shares(placed.pop(wid), 1)
            else:
                take(placed.pop(wid), 1)
            held[w.queue] -= w.gpus
            if wid in eq_since:
                since, worth = eq_since.pop(wid)
                eq_s[w.queue] += (min(t, makespan) - since) * worth
            if kind == "preempt":
                preempted[w.queue] += 1
                pend(w, 1)
        check(w.queue, t)
    if marks:
        hold(makespan)
    if makespan > last:
        integrate(makespan - last)
    for q in list(violating):
        violation[q] += max(makespan - violating.pop(q), 0.0)

    for wid, (since, worth) in eq_since.items():
        eq_s[by_id[wid].queue] += max(makespan - since, 0.0) * worth

    out: dict[str, dict[str, Any]] = {}
    for q in queues:
        out[q] = _row(waits[q], summary["queues"][q]["gpu_seconds"] / capacity if capacity > 0 else 0.0,
                      preempted[q], scopes[q].close(), makespan, violation[q])
    everything = [x for q in queues for x in waits[q]]
    out[ALL] = _row(everything, float(summary["gpu_utilization"]), sum(preempted.values()), every.close(),
                    makespan, sum(violation.values()))
    if with_eq:
        eq_capacity = sum(n.gpus * eq.get(n.gpu_type, 1.0) for n in cluster.nodes) * makespan
        for q, scope in [*((q, scopes[q]) for q in queues), (ALL, every)]:
            used = sum(eq_s.values()) if q == ALL else eq_s[q]
            out[q].update(_eq_row(used / eq_capacity if eq_capacity > 0 else 0.0, scope.eq_s, makespan))
    return out


def _eq_row(utilization: float, stranded_eq_s: float, makespan: float) -> dict[str, Any]:
    return {
        "utilization_eq": round(utilization, 6) + 0.0,
        "stranded_gpu_eq_hours": round(stranded_eq_s / 3600.0, 6) + 0.0,
        "stranded_gpus_eq_avg": round(stranded_eq_s / makespan, 6) + 0.0 if makespan > 0 else 0.0,
    }


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
