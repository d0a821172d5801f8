"""The scheduling cycle: ``schedule(snapshot, now) -> Decisions``.

Steps, in order: take working copies of the snapshot's occupancy; order the queues (lowest fair
share first, :mod:`scheduler.ordering`); nominate each queue's workloads in workload order; check
quota over the queue's chain; place the gang (best fit, falling back through its GPU types);
admit, or plan a preemption; requeue the rest with their reason and position.

As many workloads are admitted per cycle as fit. After an admission the queue's key is
recomputed and the queue goes back into the heap; a workload that cannot start does not stop the
ones behind it unless its queue is ``strict_fifo``.
"""
from __future__ import annotations

import heapq
from typing import cast

from scheduler import reasons
from scheduler.errors import SnapshotError
from scheduler.model import (
    Admission,
    Decisions,
    PendingReason,
    Preemption,
    ReasonCode,
    Workload,
)
from scheduler.ordering import by_queue, queue_key
from scheduler.placement import FreeIndex, node_slots
from scheduler.preemption import Candidate, NoPlan, Plan, candidates, plan
from scheduler.quota import Ledger, Shortfall, never_within_max, over_guarantee, over_max
from scheduler.snapshot import Cluster, Snapshot, demand

Verdict = tuple[ReasonCode, str]


def schedule(snap: Snapshot, now: float) -> Decisions:
    cycle = _Cycle(snap, now)
    groups = by_queue(snap.pending)
    cycle.check_queues(groups)
    heap = [(queue_key(cycle.cluster, cycle.ledger, q), q) for q in groups]
    heapq.heapify(heap)
    cursor = dict.fromkeys(groups, 0)
    while heap:
        _, q = heapq.heappop(heap)
        lst, i = groups[q], cursor[q]
        while i < len(lst):
            w = lst[i]
            i += 1
            if cycle.nominate(w):
                if i < len(lst):
                    cursor[q] = i
                    heapq.heappush(heap, (queue_key(cycle.cluster, cycle.ledger, q), q))
                break
            if cycle.cluster.config.queues[q].strict_fifo:
                cycle.block_behind(w, lst[i:], q)
                break
    return Decisions(now, tuple(cycle.admissions), tuple(cycle.preemptions), cycle.requeue(groups))


class _Cycle:
    """The working state of one cycle; built from the snapshot, never writing to it."""

    def __init__(self, snap: Snapshot, now: float) -> None:
        self.snap = snap
        self.now = now
        self.cluster: Cluster = snap.cluster
        self.ledger = Ledger(snap.occupancy.usage)
        self.index = FreeIndex(snap.cluster, snap.occupancy.node_free)
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.verdicts: dict[str, Verdict] = {}
        self.started: set[str] = set()
        self.dead: set[str] = set()          # no longer victims this cycle (see preemption.plan)
        self.pool: list[Candidate] | None = None
        self.pool_dead = 0
        # a gang shape that found no room stays without room until capacity is freed (admissions
        # only take): (type, gpus per pod, pods) -> its message; cleared by every preemption
        self.no_room: dict[tuple[str, int, int], str] = {}
        self.no_plan: dict[tuple[str, tuple[str, ...], int, int, int], NoPlan] = {}
        self.ineligible: dict[tuple[str, int, int], str] = {}

    def check_queues(self, groups: dict[str, list[Workload]]) -> None:
        queues = self.cluster.config.queues
        for q in groups:
            if q not in queues or not queues[q].is_leaf or q == "root":
                raise SnapshotError(f"workload {groups[q][0].id}", f"queue {q} is not a leaf queue")

    def nominate(self, w: Workload) -> bool:
        """Try to start ``w`` now: free capacity first, then preemption. False: it waits."""
        cluster, ledger, index = self.cluster, self.ledger, self.index
        never, types = static_fit(cluster, w)
        if never is not None:
            self.verdicts[w.id] = (ReasonCode.NEVER_FITS, never)
            return False
        k, pods = w.gpus_per_pod, w.pods
        misses: list[str] = []
        code = ReasonCode.QUOTA_MAX
        for t in types:
            miss = self.no_room.get((t, k, pods))
            if miss is None:
                vec = demand(w, t)
                short = over_max(cluster, ledger, w.queue, vec)
                if short is not None:
                    misses.append(reasons.quota_max(short))
                    continue
                placement = index.place(t, k, pods)
                if placement is not None:
                    ledger.add(cluster.chains[w.queue], vec)
                    self._admit(Admission(w, placement))
                    return True
                miss = self.no_room[(t, k, pods)] = reasons.no_fit(
                    w, t, index.slots(t, k, pods), index.largest_free(t))
            code = ReasonCode.NO_FIT
            misses.append(miss)
        message = misses[0] if len(misses) == 1 else "; ".join(dict.fromkeys(misses))
        if self.snap.settings.preemption:
            verdict = self._preempt(w, types, code, message)
            if verdict is None:
                return True
            code, message = verdict
        self.verdicts[w.id] = (code, message)
        return False

    def _preempt(self, w: Workload, types: tuple[str, ...], code: ReasonCode, message: str) -> Verdict | None:
        cluster, ledger = self.cluster, self.ledger
        used, g = ledger.used(w.queue, "gpu"), cluster.guarantee[w.queue]["gpu"]
        if used + w.gpus > g:          # the gpu guarantee binds on every type: a quick no
            why = self.ineligible.get((w.queue, used + w.gpus, g))
            if why is None:
                why = self.ineligible[(w.queue, used + w.gpus, g)] = reasons.not_eligible(Shortfall(w.queue, "gpu", g, used, w.gpus))
            return code, f"{message}; {why}"
        eligible = [t for t in types if over_guarantee(cluster, ledger, w.queue, demand(w, t)) is None]
        if not eligible:
            short = over_guarantee(cluster, ledger, w.queue, demand(w, types[0]))
            assert short is not None
            return code, f"{message}; {reasons.not_eligible(short)}"
        delay = self.snap.settings.preemption_delay_s
        if self.now - w.submit_s < delay:
            at = w.submit_s + delay
            return ReasonCode.WAITING_PREEMPTION_DELAY, f"{message}; {reasons.delay(self.now, at, delay)}"
        key = (w.queue, w.gpu_types, w.gpus_per_pod, w.pods, w.priority)
        result = self.no_plan.get(key) or self._plan(w, tuple(eligible))
        if isinstance(result, NoPlan):
            self.no_plan[key] = result
            if result.fenced:
                return ReasonCode.FENCED, f"{message}; {reasons.fenced(result.fenced)}"
            return ReasonCode.NO_VICTIMS, f"{message}; {reasons.no_victims(result.considered)}"
        vec = demand(w, result.gpu_type)
        placement = self.index.place(result.gpu_type, w.gpus_per_pod, w.pods)
        assert placement is not None, "a preemption plan always leaves room for its preemptor"
        holds, g = ledger.used(w.queue, "gpu"), cluster.guarantee[w.queue]["gpu"]
        ledger.add(cluster.chains[w.queue], vec)
        victims = tuple(r.workload.id for r in result.victims)
        self.no_room.clear()
        self.preemptions.append(
            Preemption(w.id, w.queue, victims, reasons.preempted(w.queue, holds, w.gpus, g))
        )
        self._admit(Admission(w, placement, victims))
        return None

    def _plan(self, w: Workload, types: tuple[str, ...]) -> Plan | NoPlan:
        if self.pool is None:
            self.pool = candidates(self.cluster, self.ledger, self.snap.running)
        result = plan(self.cluster, self.ledger, self.index, self.pool, self.dead, w, types)
        if len(self.dead) - self.pool_dead > len(self.pool) // 8:     # compact now and then
            self.pool = [c for c in self.pool if c.id not in self.dead]
            self.pool_dead = len(self.dead)
        return result

    def _admit(self, a: Admission) -> None:
        self.admissions.append(a)
        self.started.add(a.workload.id)

    def block_behind(self, head: Workload, rest: list[Workload], queue: str) -> None:
        msg = reasons.strict_fifo(head, queue)
        for w in rest:
            code = ReasonCode.BEHIND_HIGHER_PRIORITY if head.priority > w.priority else ReasonCode.STRICT_FIFO
            self.verdicts[w.id] = (code, msg)

    def requeue(self, groups: dict[str, list[Workload]]) -> tuple[PendingReason, ...]:
        out: list[PendingReason] = []
        started, verdicts = self.started, self.verdicts
        for q, lst in groups.items():
            pos = 0
            for w in lst:
                if w.id in started:
                    continue
                pos += 1
                code, msg = verdicts[w.id]
                out.append(PendingReason(w.id, q, code, msg, pos))
        return tuple(out)


def acceptable_types(cluster: Cluster, w: Workload) -> tuple[str, ...]:
    """The workload's types that exist in the cluster, in its order (all types, in cluster order,
    when it accepts any)."""
    if not w.gpu_types:
        return cluster.types
    return tuple(t for t in w.gpu_types if t in cluster.type_nodes)


def static_fit(cluster: Cluster, w: Workload) -> tuple[str | None, tuple[str, ...]]:
    """``(never_fits(w), acceptable_types(w))``, memoized on the cluster per gang shape: both depend
    only on the static cluster and queue tree."""
    shape = (w.queue, w.gpu_types, w.gpus_per_pod, w.pods, w.cpu_millicores_per_pod, w.memory_per_pod_bytes)
    hit = cluster.memo.get(shape)
    if hit is None:
        hit = cluster.memo[shape] = (never_fits(cluster, w), acceptable_types(cluster, w))
    return cast(tuple[str | None, tuple[str, ...]], hit)


def never_fits(cluster: Cluster, w: Workload) -> str | None:
    """Why ``w`` can never run even on an empty cluster (a ``reject``), or ``None``."""
    types = acceptable_types(cluster, w)
    if not types:
        return reasons.no_type(w)
    why: list[str] = []
    for t in types:
        short = never_within_max(cluster, w.queue, demand(w, t))
        if short is not None:
            why.append(reasons.never_max(short))
            continue
        slots = node_slots(cluster, t, w.gpus_per_pod)
        if slots < w.pods:
            why.append(reasons.never_nodes(w, t, slots))
            continue
        return None
    return "; ".join(dict.fromkeys(why))
