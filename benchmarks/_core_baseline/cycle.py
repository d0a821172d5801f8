"""The scheduling cycle: ``schedule(snapshot, now) -> Decisions``.

Steps, in order: take working copies of the snapshot's occupancy; order the queues (lowest fair
share first, :mod:`scheduler.ordering`); nominate each queue's workloads in workload order; check
quota over the queue's chain; place the gang (best fit, falling back through its GPU types);
admit, or plan a preemption; requeue the rest with their reason and position.

As many workloads are admitted per cycle as fit. After an admission the queue's key is
recomputed and the queue goes back into the heap; a workload that cannot start does not stop the
ones behind it unless its queue is ``strict_fifo``.

Cost (docs/PERFORMANCE.md): a cycle touches each pending workload once, and most of them cannot
start, so that path is kept short. Within a cycle, a gang shape that found no room keeps its
message until a preemption frees capacity, so a workload whose every type is such a shape, in a
queue above its guarantee, gets its reason from memos. Across cycles the cluster's ``memo`` holds
what never changes (each queue's and gang shape's static fit) and each pending workload's last
reason, reused as the same immutable object while it is unchanged: a steady cycle builds its
reasons' text but allocates next to nothing, so it also triggers next to no garbage collection.
"""
from __future__ import annotations

import heapq
from itertools import chain
from operator import attrgetter
from typing import NamedTuple

from benchmarks._core_baseline import reasons
from scheduler.errors import SnapshotError
from scheduler.model import (
    Admission,
    Decisions,
    PendingReason,
    Preemption,
    ReasonCode,
    Workload,
    pending_reason,
)
from benchmarks._core_baseline.ordering import by_queue, queue_key
from benchmarks._core_baseline.placement import FreeIndex, node_slots
from benchmarks._core_baseline.preemption import NoPlan, Plan, Pool, candidates, plan
from benchmarks._core_baseline.quota import Ledger, Shortfall, never_within_max, over_guarantee, over_max
from scheduler.snapshot import Cluster, Snapshot, demand

Verdict = tuple[ReasonCode, str]

# The memo this core keeps per cluster. ``Cluster.memo`` is now today's core's typed
# ``scheduler.memo.CycleMemo``, so this frozen core keeps its dict beside it, for the last cluster
# it saw (held here, so its id is not reused while the entry stands; another cluster replaces it).
_MEMO: list[tuple[Cluster, dict[object, object]]] = []


def _memo(cluster: Cluster) -> dict[object, object]:
    if _MEMO and _MEMO[0][0] is cluster:
        return _MEMO[0][1]
    memo: dict[object, object] = {}
    _MEMO[:] = [(cluster, memo)]
    return memo


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
        self.known = _known(snap.cluster, len(snap.pending))
        self.preemption = snap.settings.preemption
        self.pool: Pool | None = None        # victim candidates, built on first need
        # a gang shape that found no room stays without room until capacity is freed (admissions
        # only take): (type, gpus per pod, pods) -> its message; cleared by every preemption
        self.no_room: dict[tuple[str, int, int], str] = {}
        self.rooms_seen = 0                  # changes of no_room so far
        # Fit.room (types, gpus per pod, pods) whose every type is in no_room -> the joined message
        self.all_full: dict[int, str] = {}
        self.no_plan: dict[tuple[str, tuple[str, ...], int, int, int], NoPlan] = {}
        self.ineligible: dict[tuple[str, int, int], str] = {}

    def check_queues(self, groups: dict[str, list[Workload]]) -> None:
        leaves: frozenset[str] | None = _memo(self.cluster).get(("leaves",))  # type: ignore[assignment]
        if leaves is None:
            leaves = _memo(self.cluster)[("leaves",)] = frozenset(self.cluster.config.leaves())
        for q in groups:
            if q not in leaves:
                raise SnapshotError(f"workload {groups[q][0].id}", f"queue {q} is not a leaf queue")

    def walk(self, q: str, lst: list[Workload], i: int) -> int:
        """Nominate ``lst[i:]`` (queue ``q``'s pending, in order) until one starts; return the index
        after it, or ``len(lst)`` when none does. Nothing the queue's verdicts read changes until one
        starts, so the common verdict "no room for the shape anywhere, and the queue is above its
        guarantee" comes from memos, and so does the free-capacity verdict of a gang shape met
        before in this walk (the same steps as :meth:`free_capacity`, without the work)."""
        out = self.waiting.setdefault(q, [])
        cluster, all_full, known, preemption = self.cluster, self.all_full, self.known, self.preemption
        used, g = self.ledger.used(q, "gpu"), cluster.guarantee[q]["gpu"]
        strict = cluster.config.queues[q].strict_fifo
        head, tail = _facts(cluster, q).why_not
        met: dict[int, tuple[int, ReasonCode, str]] = {}     # id(fit) -> (rooms_seen, its verdict)
        no_fit, n = ReasonCode.NO_FIT, len(lst)
        while i < n:
            w = lst[i]
            i += 1
            seen = known.get(w.id)
            if seen is not None and seen[0] is w:
                _, fit, last = seen
            else:
                fit, last = static_fit(cluster, w), None
            never, _, room = fit
            miss = None if never is not None else all_full.get(room)
            gpus = w.pods * w.gpus_per_pod
            if never is not None:
                code, msg = ReasonCode.NEVER_FITS, never
            elif miss is not None and not preemption:
                code, msg = no_fit, miss
            elif miss is not None and used + gpus > g:      # as in _preempt: the quick no
                code, msg = no_fit, f"{miss}; {head}{used + gpus}{tail}"
            else:
                before = met.get(id(fit))
                if before is not None and before[0] == self.rooms_seen:
                    _, code, msg = before
                else:
                    verdict = self.free_capacity(w, fit)
                    if verdict is None:
                        return i
                    code, msg = verdict
                    met[id(fit)] = (self.rooms_seen, code, msg)
                if preemption:
                    verdict = self._preempt(w, fit.types, code, msg)
                    if verdict is None:
                        return i
                    code, msg = verdict
            pos = len(out) + 1
            if last is None or last.position != pos or last.code is not code or last.message != msg:
                last = pending_reason(w.id, q, code, msg, pos)
                known[w.id] = (w, fit, last)
            out.append(last)
            if strict:
                self.block_behind(w, lst[i:], out)
                return n
        return n

    def free_capacity(self, w: Workload, fit: Fit) -> Verdict | None:
        """Start ``w`` on free capacity of one of its types (``None``), or say why not. Until it
        starts, only :attr:`no_room` changes what this says for ``w``'s gang shape, in ``w``'s queue."""
        cluster, ledger, index = self.cluster, self.ledger, self.index
        k, pods = w.gpus_per_pod, w.pods
        misses: list[str] = []
        code = ReasonCode.QUOTA_MAX
        room_only = True
        for t in fit.types:
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
                self.rooms_seen += 1
            code = ReasonCode.NO_FIT
            misses.append(miss)
        message = misses[0] if len(misses) == 1 else "; ".join(dict.fromkeys(misses))
        if room_only:
            self.all_full[fit.room] = message
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
        self.rooms_seen += 1
        self.all_full.clear()
        self.preemptions.append(
            Preemption(w.id, w.queue, victims, reasons.preempted(w.queue, holds, w.gpus, g))
        )
        self.admissions.append(Admission(w, placement, victims))
        return None

    def _plan(self, w: Workload, types: tuple[str, ...]) -> Plan | NoPlan:
        if self.pool is None:
            self.pool = Pool(candidates(self.cluster, self.ledger, self.snap.running), self.cluster.fences)
        result = plan(self.cluster, self.ledger, self.index, self.pool, w, types)
        self.pool.compact()
        return result

    def block_behind(self, head: Workload, rest: list[Workload], out: list[PendingReason]) -> None:
        msg = reasons.strict_fifo(head, head.queue)
        for w in rest:
            code = ReasonCode.BEHIND_HIGHER_PRIORITY if head.priority > w.priority else ReasonCode.STRICT_FIFO
            out.append(pending_reason(w.id, head.queue, code, msg, len(out) + 1))

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


class QueueFacts(NamedTuple):
    """What a cycle needs of a leaf queue that never changes, memoized on the cluster: its
    :class:`Fit` per gang shape (:data:`_SHAPE`), the smallest max of each resource over its
    chain, and :func:`reasons.above_guarantee_parts` for its gpu guarantee."""

    fits: dict[tuple[object, ...], Fit]
    caps: dict[str, int]
    why_not: tuple[str, str]


def _facts(cluster: Cluster, queue: str) -> QueueFacts:
    facts: QueueFacts | None = _memo(cluster).get(("queue", queue))  # type: ignore[assignment]
    if facts is None:
        caps: dict[str, int] = {}
        for q in cluster.chains[queue]:
            for key, m in cluster.config.queues[q].max.items():
                caps[key] = min(m, caps.get(key, m))
        why_not = reasons.above_guarantee_parts(queue, "gpu", cluster.guarantee[queue]["gpu"])
        facts = _memo(cluster)[("queue", queue)] = QueueFacts({}, caps, why_not)
    return facts


Seen = tuple[Workload, Fit, PendingReason]


def _known(cluster: Cluster, pending: int) -> dict[str, Seen]:
    """Workload id -> (the workload, its :class:`Fit`, its last reason), kept on the cluster across
    cycles: a waiting workload's fit is found by id (cheaper than by shape), and a reason equal
    to the last one is that same (immutable) object, so a steady cycle allocates next to nothing.
    Emptied when it holds far more than the pending workloads, so it stays bounded."""
    known: dict[str, Seen] = _memo(cluster).setdefault(("known",), {})  # type: ignore[assignment]
    if len(known) > 4 * pending + 4096:
        known.clear()
    return known


def static_fit(cluster: Cluster, w: Workload) -> Fit:
    """:class:`Fit` of ``w``, memoized on the cluster per queue and gang shape: it depends only on
    the static cluster and queue tree."""
    facts = _facts(cluster, w.queue)
    shape = _SHAPE(w)
    hit = facts.fits.get(shape)
    if hit is None:
        types = acceptable_types(cluster, w)
        rooms: dict[object, int] = _memo(cluster).setdefault(("rooms",), {})  # type: ignore[assignment]
        room = rooms.setdefault((types, w.gpus_per_pod, w.pods), len(rooms))
        hit = facts.fits[shape] = Fit(_never_fits(cluster, w, types, facts.caps), types, room)
    return hit


def never_fits(cluster: Cluster, w: Workload) -> str | None:
    """Why ``w`` can never run even on an empty cluster (a ``reject``), or ``None``."""
    return _never_fits(cluster, w, acceptable_types(cluster, w), _facts(cluster, w.queue).caps)


def _never_fits(cluster: Cluster, w: Workload, types: tuple[str, ...], caps: dict[str, int]) -> str | None:
    if not types:
        return reasons.no_type(w)
    why: list[str] = []
    for t in types:
        vec = demand(w, t)
        for key, amt in vec:
            cap = caps.get(key)
            if cap is not None and amt > cap:       # some max on the chain is below it: which one
                short = never_within_max(cluster, w.queue, vec)
                assert short is not None
                why.append(reasons.never_max(short))
                break
        else:
            slots = node_slots(cluster, t, w.gpus_per_pod)
            if slots >= w.pods:
                return None
            why.append(reasons.never_nodes(w, t, slots))
    return "; ".join(dict.fromkeys(why))
