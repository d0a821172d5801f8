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
from itertools import chain
from operator import attrgetter
from typing import NamedTuple, cast

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
        lst = groups[q]
        cursor[q] = i = cycle.walk(q, lst, cursor[q])
        if i < len(lst):                  # one started and work waits behind it
            heapq.heappush(heap, (queue_key(cycle.cluster, cycle.ledger, q), q))
    return Decisions(now, tuple(cycle.admissions), tuple(cycle.preemptions), cycle.requeue(groups))


class _Cycle:
    """The working state of one cycle; built from the snapshot, never writing to it."""

    def __init__(self, snap: Snapshot, now: float) -> None:
        self.snap = snap
        self.now = now
        self.cluster: Cluster = snap.cluster
        self.ledger = Ledger(snap.occupancy.usage)
        self.index = FreeIndex(snap.cluster, snap.occupancy.node_free, snap.occupancy.levels)
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        self.waiting: dict[str, list[PendingReason]] = {}   # queue -> its waiting ones, in order
        self.dead: set[str] = set()          # no longer victims this cycle (see preemption.plan)
        self.pool: list[Candidate] | None = None
        self.pool_dead = 0
        # a gang shape that found no room stays without room until capacity is freed (admissions
        # only take): (type, gpus per pod, pods) -> its message; cleared by every preemption
        self.no_room: dict[tuple[str, int, int], str] = {}
        # Fit.room (types, gpus per pod, pods) whose every type is in no_room -> the joined message
        self.all_full: dict[int, str] = {}
        self.no_plan: dict[tuple[str, tuple[str, ...], int, int, int], NoPlan] = {}
        self.ineligible: dict[tuple[str, int, int], str] = {}

    def check_queues(self, groups: dict[str, list[Workload]]) -> None:
        queues = self.cluster.config.queues
        for q in groups:
            if q not in queues or not queues[q].is_leaf or q == "root":
                raise SnapshotError(f"workload {groups[q][0].id}", f"queue {q} is not a leaf queue")

    def walk(self, q: str, lst: list[Workload], i: int) -> int:
        """Nominate ``lst[i:]`` (queue ``q``'s pending, in order) until one starts; return the index
        after it, or ``len(lst)`` when none does. Nothing the queue's verdicts read changes until one
        starts, so the common verdict "no room for the shape anywhere, and the queue is above its
        guarantee" comes from memos (the same steps :meth:`nominate` would take, without the work)."""
        out = self.waiting.setdefault(q, [])
        cluster, all_full = self.cluster, self.all_full
        fits = _fits(cluster, q)
        used, g = self.ledger.used(q, "gpu"), cluster.guarantee[q]["gpu"]
        preemption = self.snap.settings.preemption
        strict = cluster.config.queues[q].strict_fifo
        whys: dict[int, str] = {}             # gpus asked -> why the queue may not preempt
        n = len(lst)
        while i < n:
            w = lst[i]
            i += 1
            fit = fits.get(_SHAPE(w)) or static_fit(cluster, w)
            never, types, room = fit
            miss = None if never is not None else all_full.get(room)
            gpus = w.pods * w.gpus_per_pod
            if never is not None:
                out.append(PendingReason(w.id, q, ReasonCode.NEVER_FITS, never, len(out) + 1))
            elif miss is not None and not preemption:
                out.append(PendingReason(w.id, q, ReasonCode.NO_FIT, miss, len(out) + 1))
            elif miss is not None and used + gpus > g:      # as in _preempt: the quick no
                why = whys.get(gpus)
                if why is None:
                    why = whys[gpus] = self._not_eligible(q, used, gpus, g)
                out.append(PendingReason(w.id, q, ReasonCode.NO_FIT, f"{miss}; {why}", len(out) + 1))
            else:
                verdict = self.nominate(w, fit)
                if verdict is None:
                    return i
                out.append(PendingReason(w.id, q, verdict[0], verdict[1], len(out) + 1))
            if strict:
                self.block_behind(w, lst[i:], out)
                return n
        return n

    def nominate(self, w: Workload, fit: Fit) -> Verdict | None:
        """Try to start ``w`` on one of its types: free capacity first, then preemption. ``None``:
        it starts; otherwise why it waits."""
        cluster, ledger, index = self.cluster, self.ledger, self.index
        types = fit.types
        k, pods = w.gpus_per_pod, w.pods
        misses: list[str] = []
        code = ReasonCode.QUOTA_MAX
        room_only = True
        for t in types:
            miss = self.no_room.get((t, k, pods))
            if miss is None:
                vec = demand(w, t)
                short = over_max(cluster, ledger, w.queue, vec)
                if short is not None:
                    misses.append(reasons.quota_max(short))
                    room_only = False
                    continue
                placement = index.place(t, k, pods)
                if placement is not None:
                    ledger.add(cluster.chains[w.queue], vec)
                    self.admissions.append(Admission(w, placement))
                    return None
                miss = self.no_room[(t, k, pods)] = reasons.no_fit(
                    w, t, index.slots(t, k, pods), index.largest_free(t))
            code = ReasonCode.NO_FIT
            misses.append(miss)
        message = misses[0] if len(misses) == 1 else "; ".join(dict.fromkeys(misses))
        if room_only:
            self.all_full[fit.room] = message
        if self.snap.settings.preemption:
            return self._preempt(w, types, code, message)
        return code, message

    def _not_eligible(self, queue: str, used: int, gpus: int, g: int) -> str:
        why = self.ineligible.get((queue, used + gpus, g))
        if why is None:
            why = self.ineligible[(queue, used + gpus, g)] = reasons.not_eligible(
                Shortfall(queue, "gpu", g, used, gpus))
        return why

    def _preempt(self, w: Workload, types: tuple[str, ...], code: ReasonCode, message: str) -> Verdict | None:
        cluster, ledger = self.cluster, self.ledger
        used, g = ledger.used(w.queue, "gpu"), cluster.guarantee[w.queue]["gpu"]
        if used + w.gpus > g:          # the gpu guarantee binds on every type: a quick no
            return code, f"{message}; {self._not_eligible(w.queue, used, w.gpus, g)}"
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
        self.all_full.clear()
        self.preemptions.append(
            Preemption(w.id, w.queue, victims, reasons.preempted(w.queue, holds, w.gpus, g))
        )
        self.admissions.append(Admission(w, placement, victims))
        return None

    def _plan(self, w: Workload, types: tuple[str, ...]) -> Plan | NoPlan:
        if self.pool is None:
            self.pool = candidates(self.cluster, self.ledger, self.snap.running)
        result = plan(self.cluster, self.ledger, self.index, self.pool, self.dead, w, types)
        if len(self.dead) - self.pool_dead > len(self.pool) // 8:     # compact now and then
            self.pool = [c for c in self.pool if c.id not in self.dead]
            self.pool_dead = len(self.dead)
        return result

    def block_behind(self, head: Workload, rest: list[Workload], out: list[PendingReason]) -> None:
        msg = reasons.strict_fifo(head, head.queue)
        for w in rest:
            code = ReasonCode.BEHIND_HIGHER_PRIORITY if head.priority > w.priority else ReasonCode.STRICT_FIFO
            out.append(PendingReason(w.id, head.queue, code, msg, len(out) + 1))

    def requeue(self, groups: dict[str, list[Workload]]) -> tuple[PendingReason, ...]:
        """The waiting workloads, queue by queue (each one's position counts the waiting ones)."""
        waiting = self.waiting
        return tuple(chain.from_iterable(waiting[q] for q in groups if q in waiting))


class Fit(NamedTuple):
    """What a gang shape allows whatever the cluster's state: why it never fits (or ``None``), its
    acceptable types in order, and a number for ``(types, gpus per pod, pods)``: the shapes
    that look for the same room (:attr:`_Cycle.all_full`)."""

    never: str | None
    types: tuple[str, ...]
    room: int


def acceptable_types(cluster: Cluster, w: Workload) -> tuple[str, ...]:
    """The workload's types that exist in the cluster, in its order (all types, in cluster order,
    when it accepts any)."""
    if not w.gpu_types:
        return cluster.types
    return tuple(t for t in w.gpu_types if t in cluster.type_nodes)


_SHAPE = attrgetter("gpu_types", "gpus_per_pod", "pods", "cpu_millicores_per_pod", "memory_per_pod_bytes")


def _fits(cluster: Cluster, queue: str) -> dict[tuple[object, ...], Fit]:
    """The queue's :class:`Fit` memo on the cluster, keyed by the gang shape (:data:`_SHAPE`)."""
    fits = cluster.memo.get(("fits", queue))
    if fits is None:
        fits = cluster.memo[("fits", queue)] = {}
    return cast(dict[tuple[object, ...], Fit], fits)


def static_fit(cluster: Cluster, w: Workload) -> Fit:
    """:class:`Fit` of ``w``, memoized on the cluster per queue and gang shape: it depends only on
    the static cluster and queue tree."""
    fits = _fits(cluster, w.queue)
    shape = _SHAPE(w)
    hit = fits.get(shape)
    if hit is None:
        types = acceptable_types(cluster, w)
        rooms = cast(dict[object, int], cluster.memo.setdefault(("rooms",), {}))
        room = rooms.setdefault((types, w.gpus_per_pod, w.pods), len(rooms))
        hit = fits[shape] = Fit(never_fits(cluster, w), types, room)
    return hit


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
