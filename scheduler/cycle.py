"""The scheduling cycle: ``schedule(snapshot, now) -> Decisions``.

Steps, in order: take working copies of the snapshot's occupancy; order the queues (lowest fair
share first, :mod:`scheduler.ordering`); nominate each queue's workloads in workload order; check
quota over the queue's chain; place the gang (best fit, falling back through its GPU types);
admit, or plan a preemption; requeue the rest with their reason and position.

As many workloads are admitted per cycle as fit. After an admission the queue's key is
recomputed and the queue goes back into the heap; a workload that cannot start does not stop the
ones behind it unless its queue is ``strict_fifo``.

Cost (docs/PERFORMANCE.md, "Scheduler at depth"): a cycle's cost follows what changed, not the
depth of the backlog. A walk stores a verdict per waiting workload, found once per gang shape, and
the reasons are built from the verdicts only when read (:class:`_Part`); a queue whose every
workload would take a verdict from memos is not walked at all, which is read from counts kept per
queue (:class:`_Agg`). Within a cycle, a gang shape that found no room keeps its message until a
preemption frees capacity. Across cycles the cluster's ``memo`` holds what never changes (each
queue's and gang shape's static fit), what is updated from the changes (the pending grouped by
queue, the per-queue counts, the victim candidates in order) and each pending workload's last
reason, reused as the same immutable object while it is unchanged. Nothing there is a decision:
each is a function of the snapshot, kept because recomputing it would cost a pass over the backlog.
"""
from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from operator import attrgetter
from types import MappingProxyType
from typing import NamedTuple, cast

from scheduler import reasons
from scheduler.errors import SnapshotError
from scheduler.model import (
    Admission,
    Decisions,
    PendingReason,
    PendingReasons,
    Preemption,
    ReasonCode,
    Workload,
    pending_reason,
)
from scheduler.ordering import QueueChanges, QueueKey, grouped, queue_changes, queue_key
from scheduler.placement import FreeIndex, node_slots
from scheduler.preemption import NoPlan, Plan, Pool, candidates, plan
from scheduler.quota import Ledger, Shortfall, never_within_max, over_guarantee, over_guarantee_pinned, over_max
from scheduler.snapshot import PINNED, Cluster, Snapshot, demand

PINNED_GPU = PINNED + "gpu"          # a queue's non-preemptible GPUs in its usage

Verdict = tuple[ReasonCode, str]


def schedule(snap: Snapshot, now: float) -> Decisions:
    cycle = _Cycle(snap, now)
    groups = grouped(snap.cluster.memo, snap.pending, snap.changes)
    cycle.qchanges = queue_changes(snap.cluster.memo)
    cycle.check_queues(groups)
    key = cycle.queue_key
    heap = [(key(q), q) for q in groups]
    heapq.heapify(heap)
    cursor = dict.fromkeys(groups, 0)
    while heap:
        _, q = heapq.heappop(heap)
        lst = groups[q]
        cursor[q] = i = cycle.walk(q, lst, cursor[q])
        if i < len(lst):                  # one started and work waits behind it
            heapq.heappush(heap, (key(q), q))
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
        # queue -> its waiting ones (their verdicts; the reasons are built when first read)
        self.parts: dict[str, _Part] = {}
        memo = self.cluster.memo
        self.aggs: dict[str, _Agg] = memo.setdefault(("aggs",), {})  # type: ignore[assignment]
        statics: tuple[frozenset[str], dict[str, int]] | None = memo.get(("strict, gpu guarantee",))  # type: ignore[assignment]
        if statics is None:
            c = self.cluster
            statics = memo[("strict, gpu guarantee",)] = (
                frozenset(q for q, cfg in c.config.queues.items() if cfg.strict_fifo),
                {q: g["gpu"] for q, g in c.guarantee.items()})
        self.strict, self.guarantees = statics
        self.qchanges: QueueChanges = {}        # what this cycle's grouping changed (schedule sets it)
        self.fit_lists: dict[str, tuple[list[Workload], list[Fit]]] = memo.setdefault(  # type: ignore[assignment]
            ("fits",), {})
        self.known = _known(snap.cluster, len(snap.pending))
        self.qkeys: dict[str, tuple[Mapping[str, int], QueueKey]] = memo.setdefault(  # type: ignore[assignment]
            ("queue keys",), {})
        self.ctx: _Context = (self.cluster, now, snap.settings.preemption_delay_s, self.known)
        self.preemption = snap.settings.preemption
        self.pool: Pool | None = None        # victim candidates, built on first need
        # a gang shape that found no room stays without room until capacity is freed (admissions
        # only take): (type, gpus per pod, pods) -> its message; cleared by every preemption
        self.no_room: dict[tuple[str, int, int], str] = {}
        # Fit.room (types, gpus per pod, pods) whose every type is in no_room -> the joined message
        self.all_full: dict[int, str] = {}
        self.no_plan: dict[tuple[str, tuple[str, ...], int, int, int], NoPlan] = {}
        self.ineligible: dict[tuple[str, int, int], str] = {}

    def queue_key(self, q: str) -> QueueKey:
        """:func:`scheduler.ordering.queue_key`, kept across cycles per queue while the queue's
        usage is the snapshot's same (immutable) mapping."""
        used = self.ledger.of(q)
        if type(used) is not MappingProxyType:             # the cycle's own copy: it changes
            return queue_key(self.cluster, self.ledger, q)
        rec = self.qkeys.get(q)
        if rec is not None and rec[0] is used:
            return rec[1]
        k = queue_key(self.cluster, self.ledger, q)
        self.qkeys[q] = (used, k)
        return k

    def check_queues(self, groups: dict[str, list[Workload]]) -> None:
        leaves: frozenset[str] | None = self.cluster.memo.get(("leaves",))  # type: ignore[assignment]
        if leaves is None:
            leaves = self.cluster.memo[("leaves",)] = frozenset(self.cluster.config.leaves())
        for q in groups:
            if q not in leaves:
                raise SnapshotError(f"workload {groups[q][0].id}", f"queue {q} is not a leaf queue")

    def walk(self, q: str, lst: list[Workload], i: int) -> int:
        """Nominate ``lst[i:]`` (queue ``q``'s pending, in order) until one starts; return the index
        after it, or ``len(lst)`` when none does.

        Nothing a verdict reads changes until one starts (the ledger, the free index; what a walk
        adds to the memos only names what it found), so a gang shape's verdict (:class:`Fit`) is
        found once per walk and every later workload of the shape takes it: the loop over the
        waiting ones stores a verdict per workload (:data:`Verdict`) and builds no reason; the
        reasons are built from the verdicts when first read (:class:`_Part`). The common verdict
        "no room for the shape anywhere, and the queue is above its guarantee" comes from the
        cycle's ``all_full`` without a call.

        A non-preemptible workload whose queue's non-preemptible GPUs would go above its gpu
        guarantee takes the verdict ``non_preemptible_over_guarantee`` without a call too (what
        :meth:`free_capacity` and :meth:`_pre_class` would say for it).

        A queue's first walk of a cycle is skipped when the queue is quiet: every one of its
        workloads would take a verdict from memos now (it never fits, or its room has found no
        room this cycle and either preemption is off or the queue would go above its guarantee;
        or it is non-preemptible and over its guarantee as above). That is read from the queue's
        :class:`_Agg` (its rooms, its smallest gang, its smallest non-preemptible gang), not
        workload by workload; such a walk starts nothing and reads nothing that changes, and the
        queue's reasons derive from each workload's :class:`Fit` when read."""
        all_full, preemption = self.all_full, self.preemption
        used = self.ledger.used(q, "gpu")
        g = self.guarantees[q]
        strict = q in self.strict
        part = self.parts.get(q)
        if part is None:
            if not strict:                   # quiet? (every queue, every cycle: kept inline)
                a = self.aggs.get(q)
                if a is None or a.lst is not lst:
                    a = self.agg_of(q, lst)
                if a.rooms.keys() <= all_full.keys() and (not preemption or not a.gpus or used + min(a.gpus) > g) \
                        and (not a.pinned or self.ledger.used(q, PINNED_GPU) + min(a.pinned) > g):
                    n = len(lst)
                    self.parts[q] = _Part(self.ctx, q, lst, preemption, [(0, n, all_full, used)], a,
                                          self.ledger.used(q, PINNED_GPU) if a.pinned else 0)
                    return n
            part = self.parts[q] = _Part(self.ctx, q, lst, [], [])
        fits = self.fits_of(q, lst)
        vs = cast("list[object]", part.verdicts)   # a walked (not quiet) queue's: a list
        start, n = i, len(lst)
        seen: dict[int, object] = {}            # Fit.key -> its verdict in this walk
        pinned = self.ledger.used(q, PINNED_GPU)
        verdict: Verdict | None
        while i < n:
            fit = fits[i]
            i += 1
            v: object = fit.never_v
            if v is None:
                room = fit.room
                if fit.pinned and pinned + fit.gpus > g:     # non-preemptible, over its guarantee
                    vs.append(pinned_verdict(q, pinned, fit.gpus, g))
                    if strict:
                        break
                    continue
                if room in all_full:
                    if not preemption:
                        vs.append(room)
                        if strict:
                            break
                        continue
                    if used + fit.gpus > g:      # as in _pre_class: the quick no
                        vs.append(~room)
                        if strict:
                            break
                        continue
                v = seen.get(fit.key)
                if v is None:
                    w = lst[i - 1]
                    miss = all_full.get(room)
                    if miss is not None:            # what free_capacity would say, from the memo
                        verdict = (ReasonCode.NO_FIT, miss)
                    else:
                        verdict = self.free_capacity(w, fit)
                        if verdict is None:
                            return self._started(q, part, start, i, all_full, used)
                    v = seen[fit.key] = self._pre_class(w, fit, *verdict) if preemption else verdict
                if type(v) is _Pre:
                    w = lst[i - 1]
                    if self.now - w.submit_s < v.delay_s:
                        v = v.waiting
                    else:
                        pv = v.plans.get(w.priority)
                        if pv is None:
                            pv = self._plan_verdict(w, v)
                            if pv is None:
                                return self._started(q, part, start, i, all_full, used)
                            v.plans[w.priority] = pv
                        v = pv
            vs.append(v)
            if strict:
                break
        if strict and i < n:
            head = lst[i - 1]
            msg = reasons.strict_fifo(head, q)
            behind, fifo = (ReasonCode.BEHIND_HIGHER_PRIORITY, msg), (ReasonCode.STRICT_FIFO, msg)
            vs.extend(behind if head.priority > w.priority else fifo for w in lst[i:])
        part.segments.append((start, n, all_full, used))
        return n

    def _started(self, q: str, part: _Part, start: int, i: int, all_full: dict[int, str], used: int) -> int:
        """``lst[i - 1]`` started: the walk's waiting ones are ``lst[start:i - 1]``."""
        part.segments.append((start, i - 1, all_full, used))
        return i

    def agg_of(self, q: str, lst: list[Workload]) -> _Agg:
        """``q``'s :class:`_Agg` for ``lst``, kept across cycles and updated from the workloads
        that left and joined the queue (:func:`scheduler.ordering.queue_changes`), else counted
        anew."""
        a = self.aggs.get(q)
        if a is not None and a.lst is lst:
            return a
        ch = self.qchanges.get(q)
        left: Sequence[Workload]
        if a is not None and ch is not None and ch[0] is a.lst and len(ch[1]) + len(ch[2]) <= len(lst):
            left, came = ch[1], ch[2]
        else:
            a, left, came = _Agg(lst), (), lst
            self.aggs[q] = a
        rooms, gpus, cluster, known = a.rooms, a.gpus, self.cluster, self.known
        for w in left:
            fit = fit_of(cluster, known, w)
            if fit.never is None:
                counts = rooms if not fit.pinned else a.pinned
                key = fit.room if not fit.pinned else fit.gpus
                if counts[key] == 1:
                    del counts[key]
                else:
                    counts[key] -= 1
                if gpus[fit.gpus] == 1:
                    del gpus[fit.gpus]
                else:
                    gpus[fit.gpus] -= 1
        for w in came:
            fit = fit_of(cluster, known, w)
            if fit.never is None:
                if not fit.pinned:
                    rooms[fit.room] = rooms.get(fit.room, 0) + 1
                else:
                    a.pinned[fit.gpus] = a.pinned.get(fit.gpus, 0) + 1
                gpus[fit.gpus] = gpus.get(fit.gpus, 0) + 1
        a.lst = lst
        return a

    def fits_of(self, q: str, lst: list[Workload]) -> list[Fit]:
        """The :class:`Fit` of each of ``lst`` (``q``'s pending), kept per queue across cycles while
        the list is the same object; a new list finds each workload's fit by id (:func:`fit_of`)."""
        fl = self.fit_lists.get(q)
        if fl is not None and fl[0] is lst:
            return fl[1]
        cluster, known = self.cluster, self.known
        fits = [fit_of(cluster, known, w) for w in lst]
        self.fit_lists[q] = (lst, fits)
        return fits

    def free_capacity(self, w: Workload, fit: Fit) -> Verdict | None:
        """Start ``w`` on free capacity of one of its types (``None``), or say why not. Until it
        starts, only :attr:`no_room` changes what this says for ``w``'s gang shape, in ``w``'s queue.

        A non-preemptible ``w`` (``fit.pinned``) starts only where its queue's non-preemptible
        work stays within the queue's guarantee; its verdict is never kept in :attr:`all_full`
        (its room is its own, :func:`static_fit`), so each walk checks that first."""
        cluster, ledger, index = self.cluster, self.ledger, self.index
        k, pods = w.gpus_per_pod, w.pods
        misses: list[str] = []
        code = ReasonCode.QUOTA_MAX
        room_only = not fit.pinned
        pinned_only = fit.pinned
        for t in fit.types:
            if fit.pinned:
                short = over_guarantee_pinned(cluster, ledger, w.queue, demand(w, t))
                if short is not None:
                    misses.append(reasons.pinned_over(short))
                    continue
            miss = self.no_room.get((t, k, pods))
            if miss is None:
                vec = demand(w, t)
                short = over_max(cluster, ledger, w.queue, vec)
                if short is not None:
                    misses.append(reasons.quota_max(short))
                    room_only = pinned_only = False
                    continue
                placement = index.place(t, k, pods)
                if placement is not None:
                    ledger.add(cluster.chains[w.queue], vec)
                    self.admissions.append(Admission(w, placement))
                    return None
                miss = self.no_room[(t, k, pods)] = reasons.no_fit(
                    w, t, index.slots(t, k, pods), index.largest_free(t))
            code = ReasonCode.NO_FIT
            pinned_only = False
            misses.append(miss)
        message = misses[0] if len(misses) == 1 else "; ".join(dict.fromkeys(misses))
        if room_only:
            self.all_full[fit.room] = message
        if pinned_only:
            code = ReasonCode.NON_PREEMPTIBLE_OVER_GUARANTEE
        return code, message

    def _not_eligible(self, queue: str, used: int, gpus: int, g: int) -> str:
        why = self.ineligible.get((queue, used + gpus, g))
        if why is None:
            why = self.ineligible[(queue, used + gpus, g)] = reasons.not_eligible(
                Shortfall(queue, "gpu", g, used, gpus))
        return why

    def _pre_class(self, w: Workload, fit: Fit, code: ReasonCode, message: str) -> Verdict | _Pre:
        """What preemption says for ``w``'s gang shape in this walk, ``code``/``message`` being its
        free-capacity verdict: a final verdict (the queue would go above its guarantee), or a
        :class:`_Pre` whose workloads wait for the preemption delay or search for victims."""
        if code is ReasonCode.NON_PREEMPTIBLE_OVER_GUARANTEE:
            return code, message       # its queue holds at least that much: above its guarantee too
        cluster, ledger = self.cluster, self.ledger
        used, g = ledger.used(w.queue, "gpu"), cluster.guarantee[w.queue]["gpu"]
        if used + w.gpus > g:          # the gpu guarantee binds on every type: a quick no
            return code, f"{message}; {self._not_eligible(w.queue, used, w.gpus, g)}"
        types = fit.types
        if len(cluster.guarantee[w.queue]) == 1:     # a gpu guarantee only: just checked, on every type
            return _Pre(message, types, self.snap.settings.preemption_delay_s)
        eligible = [t for t in types if over_guarantee(cluster, ledger, w.queue, demand(w, t)) is None]
        if not eligible:
            short = over_guarantee(cluster, ledger, w.queue, demand(w, types[0]))
            assert short is not None
            return code, f"{message}; {reasons.not_eligible(short)}"
        return _Pre(message, tuple(eligible), self.snap.settings.preemption_delay_s)

    def _plan_verdict(self, w: Workload, pre: _Pre) -> Verdict | None:
        """Preempt for ``w`` (past its delay) and start it (``None``), or say why not."""
        cluster, ledger = self.cluster, self.ledger
        key = (w.queue, w.gpu_types, w.gpus_per_pod, w.pods, w.priority)
        result = self.no_plan.get(key) or self._plan(w, pre.eligible)
        if isinstance(result, NoPlan):
            self.no_plan[key] = result
            if result.fenced:
                return ReasonCode.FENCED, f"{pre.message}; {reasons.fenced(result.fenced)}"
            return ReasonCode.NO_VICTIMS, f"{pre.message}; {reasons.no_victims(result.considered)}"
        vec = demand(w, result.gpu_type)
        placement = self.index.place(result.gpu_type, w.gpus_per_pod, w.pods)
        assert placement is not None, "a preemption plan always leaves room for its preemptor"
        holds, g = ledger.used(w.queue, "gpu"), cluster.guarantee[w.queue]["gpu"]
        ledger.add(cluster.chains[w.queue], vec)
        victims = tuple(r.workload.id for r in result.victims)
        self.no_room.clear()
        self.all_full = {}               # a new one: parts built earlier keep reading the old one
        self.preemptions.append(
            Preemption(w.id, w.queue, victims, reasons.preempted(w.queue, holds, w.gpus, g))
        )
        self.admissions.append(Admission(w, placement, victims))
        return None

    def _plan(self, w: Workload, types: tuple[str, ...]) -> Plan | NoPlan:
        if self.pool is None:
            self.pool = Pool(candidates(self.cluster, self.ledger, self.snap.running, self.cluster.memo),
                             self.cluster.fences)
        result = plan(self.cluster, self.ledger, self.index, self.pool, w, types)
        self.pool.compact()
        return result

    def requeue(self, groups: dict[str, list[Workload]]) -> PendingReasons:
        """The waiting workloads, queue by queue (each one's position counts the waiting ones),
        built when first read."""
        parts = [self.parts[q] for q in groups if q in self.parts]
        return PendingReasons(parts, sum(map(len, parts)))  # type: ignore[arg-type]


class Fit(NamedTuple):
    """What a gang shape allows whatever the cluster's state: why it never fits (or ``None``), its
    acceptable types in order, and a number for ``(types, gpus per pod, pods)``: the shapes
    that look for the same room (:attr:`_Cycle.all_full`); also a number for the shape itself
    (``key``), its GPUs, its verdict when it never fits, and whether it is non-preemptible
    (``pinned``: such shapes have rooms of their own, never in ``all_full``)."""

    never: str | None
    types: tuple[str, ...]
    room: int
    key: int
    gpus: int
    never_v: Verdict | None
    pinned: bool = False


def acceptable_types(cluster: Cluster, w: Workload) -> tuple[str, ...]:
    """The workload's types that exist in the cluster, in its order (all types, in cluster order,
    when it accepts any)."""
    if not w.gpu_types:
        return cluster.types
    return tuple(t for t in w.gpu_types if t in cluster.type_nodes)


_SHAPE = attrgetter("gpu_types", "gpus_per_pod", "pods", "cpu_millicores_per_pod", "memory_per_pod_bytes",
                    "preemptible")


class QueueFacts(NamedTuple):
    """What a cycle needs of a leaf queue that never changes, memoized on the cluster: its
    :class:`Fit` per gang shape (:data:`_SHAPE`), the smallest max of each resource over its
    chain, and :func:`reasons.above_guarantee_parts` for its gpu guarantee."""

    fits: dict[tuple[object, ...], Fit]
    caps: dict[str, int]
    why_not: tuple[str, str]


def _facts(cluster: Cluster, queue: str) -> QueueFacts:
    facts: QueueFacts | None = cluster.memo.get(("queue", queue))  # type: ignore[assignment]
    if facts is None:
        caps: dict[str, int] = {}
        for q in cluster.chains[queue]:
            for key, m in cluster.config.queues[q].max.items():
                caps[key] = min(m, caps.get(key, m))
        why_not = reasons.above_guarantee_parts(queue, "gpu", cluster.guarantee[queue]["gpu"])
        facts = cluster.memo[("queue", queue)] = QueueFacts({}, caps, why_not)
    return facts


Seen = tuple[Workload, Fit, PendingReason | None]

# A waiting workload's verdict, as a walk stores it: (code, message); an int r >= 0: no room for
# its shape (Fit.room r), the message all_full[r]; ~r: that message and the quick "no preemption:
# above its guarantee" (preemption on, the queue at or above its guarantee); a _Delay: waiting for
# the preemption delay. :class:`_Part` turns them into reasons.
Segment = tuple[int, int, dict[int, str], int]     # lst[a:b] waiting, the walk's all_full and usage

class _Agg:
    """What :meth:`_Cycle.walk` reads of a queue's pending list ``lst``, kept across cycles: how
    many of its preemptible workloads that can fit at all look for each room (:attr:`Fit.room`),
    how many of them all ask for each GPU count, and how many non-preemptible ones do."""

    __slots__ = ("gpus", "lst", "pinned", "rooms")

    def __init__(self, lst: list[Workload]) -> None:
        self.lst = lst
        self.rooms: dict[int, int] = {}
        self.gpus: dict[int, int] = {}
        self.pinned: dict[int, int] = {}


class _Delay:
    """The verdict of a shape's workloads that may preempt once their delay has passed."""

    __slots__ = ("message",)

    def __init__(self, message: str) -> None:
        self.message = message


class _Pre:
    """A shape whose workloads may preempt in this walk (:meth:`_Cycle._pre_class`): its
    free-capacity message, its types where it stays within its guarantee, the delay, the verdict
    of those still within it, and the verdicts of the victim search per priority."""

    __slots__ = ("delay_s", "eligible", "message", "plans", "waiting")

    def __init__(self, message: str, eligible: tuple[str, ...], delay_s: float) -> None:
        self.message, self.eligible, self.delay_s = message, eligible, delay_s
        self.waiting = _Delay(message)
        self.plans: dict[int, Verdict] = {}


# what a queue's reasons read of their cycle: the cluster, now, the preemption delay, _known
_Context = tuple[Cluster, float, float, dict[str, "Seen"]]


class _Part:
    """A queue's waiting workloads of one cycle: ``lst`` (its pending list), the walks' segments
    (:data:`Segment`) and one verdict each (or, for a quiet queue, whether preemption was on: each
    verdict then follows from the workload's fit). Called, it builds their reasons (positions counted
    over the segments in order); the segments' all_full dicts only ever gain rooms, so what it
    builds does not depend on when it is called."""

    __slots__ = ("agg", "ctx", "lst", "pinned", "queue", "segments", "verdicts")

    def __init__(self, ctx: _Context, queue: str, lst: list[Workload], verdicts: list[object] | bool,
                 segments: list[Segment], agg: _Agg | None = None, pinned: int = 0) -> None:
        self.ctx, self.queue, self.lst, self.verdicts, self.segments = ctx, queue, lst, verdicts, segments
        self.agg, self.pinned = agg, pinned       # a quiet queue's non-preemptible GPUs

    def __len__(self) -> int:
        return sum(b - a for a, b, _, _ in self.segments)

    def __call__(self) -> list[PendingReason]:
        q, lst, vs = self.queue, self.lst, self.verdicts
        cluster, _, _, known = self.ctx
        if type(vs) is bool:                 # a quiet queue (_Cycle.walk): verdicts from the fits
            # Its reasons follow from its list, the preemption setting, its usage and the message of
            # each room it reads: when all are as when they were last built, they are that list
            # (what the service reads every cycle; the agg is this list's only while unchanged).
            agg, (_, _, all_full, used) = self.agg, self.segments[0]
            built: dict[str, tuple[object, ...]] = cluster.memo.setdefault(("built",), {})  # type: ignore[assignment]
            sig = None
            if agg is not None and agg.lst is lst:
                sig = (lst, vs, used, self.pinned, tuple([all_full[r] for r in agg.rooms]))
                rec = built.get(q)
                if rec is not None and rec[0] is lst and rec[1:5] == sig[1:]:
                    return rec[5]  # type: ignore[return-value]
            out = self._build(self._derived(lst, vs, cluster, known, q, self.pinned))
            if sig is not None:
                built[q] = (*sig, out)
            return out
        return self._build(vs)

    @staticmethod
    def _derived(lst: list[Workload], pre: bool, cluster: Cluster, known: dict[str, Seen], q: str,
                 pinned: int) -> list[object]:
        vs: list[object] = []
        g = cluster.guarantee[q]["gpu"]
        for w in lst:
            fit = fit_of(cluster, known, w)
            v = fit.never_v
            if v is None and fit.pinned:
                v = pinned_verdict(q, pinned, fit.gpus, g)
            vs.append(v if v is not None else ~fit.room if pre else fit.room)
        return vs

    def _build(self, vs: list[object]) -> list[PendingReason]:
        q, lst = self.queue, self.lst
        cluster, now, delay_s, known = self.ctx
        head, tail = _facts(cluster, q).why_not
        no_fit = ReasonCode.NO_FIT
        out: list[PendingReason] = []
        j = 0
        for a, b, all_full, used in self.segments:
            for k in range(a, b):
                w, v = lst[k], vs[j]
                j += 1
                t = type(v)
                if t is tuple:
                    code, msg = v  # type: ignore[misc]
                elif t is int:
                    code = no_fit
                    if v >= 0:  # type: ignore[operator]
                        msg = all_full[v]  # type: ignore[index]
                    else:
                        msg = f"{all_full[~v]}; {head}{used + w.pods * w.gpus_per_pod}{tail}"  # type: ignore[operator]
                else:
                    code = ReasonCode.WAITING_PREEMPTION_DELAY
                    at = w.submit_s + delay_s
                    msg = f"{v.message}; {reasons.delay(now, at, delay_s)}"  # type: ignore[attr-defined]
                pos = len(out) + 1
                # the workload's last reason when equal: no new object, no garbage
                seen = known.get(w.id)
                if seen is not None and seen[0] is w:
                    last = seen[2]
                    if last is None or last.position != pos or last.code is not code or last.message != msg:
                        last = pending_reason(w.id, q, code, msg, pos)
                        known[w.id] = (w, seen[1], last)
                    out.append(last)
                else:
                    out.append(pending_reason(w.id, q, code, msg, pos))
        return out


def pinned_verdict(queue: str, pinned: int, gpus: int, g: int) -> Verdict:
    """The verdict of a non-preemptible gang of ``gpus`` whose queue's non-preemptible work holds
    ``pinned`` GPUs of its gpu guarantee ``g`` (``pinned + gpus > g``): what
    :meth:`_Cycle.free_capacity` says for it on every type (the gpu guarantee binds on each)."""
    return (ReasonCode.NON_PREEMPTIBLE_OVER_GUARANTEE,
            reasons.pinned_over(Shortfall(queue, "gpu", g, pinned, gpus)))


def _known(cluster: Cluster, pending: int) -> dict[str, Seen]:
    """Workload id -> (the workload, its :class:`Fit`, its last reason), kept on the cluster across
    cycles: a waiting workload's fit is found by id (cheaper than by shape), and a reason equal
    to the last one is that same (immutable) object, so a steady cycle allocates next to nothing.
    Emptied when it holds far more than the pending workloads, so it stays bounded."""
    known: dict[str, Seen] = cluster.memo.setdefault(("known",), {})  # type: ignore[assignment]
    if len(known) > 4 * pending + 4096:
        known.clear()
    return known


def fit_of(cluster: Cluster, known: dict[str, Seen], w: Workload) -> Fit:
    """:func:`static_fit` of ``w``, found by id in ``known`` (:func:`_known`) and noted there."""
    seen = known.get(w.id)
    if seen is not None and seen[0] is w:
        return seen[1]
    fit = static_fit(cluster, w)
    known[w.id] = (w, fit, None)
    return fit


def static_fit(cluster: Cluster, w: Workload) -> Fit:
    """:class:`Fit` of ``w``, memoized on the cluster per queue and gang shape: it depends only on
    the static cluster and queue tree."""
    facts = _facts(cluster, w.queue)
    shape = _SHAPE(w)
    hit = facts.fits.get(shape)
    if hit is None:
        types = acceptable_types(cluster, w)
        rooms: dict[object, int] = cluster.memo.setdefault(("rooms",), {})  # type: ignore[assignment]
        pinned = not w.preemptible
        room_key = (types, w.gpus_per_pod, w.pods) if not pinned else (types, w.gpus_per_pod, w.pods, PINNED)
        room = rooms.setdefault(room_key, len(rooms))
        keys: dict[object, int] = cluster.memo.setdefault(("fit keys",), {})  # type: ignore[assignment]
        key = keys.setdefault((w.queue, shape), len(keys))
        never = _never_fits(cluster, w, types, facts.caps)
        hit = facts.fits[shape] = Fit(never, types, room, key, w.pods * w.gpus_per_pod,
                                      None if never is None else (ReasonCode.NEVER_FITS, never), pinned)
    return hit


def never_fits(cluster: Cluster, w: Workload) -> str | None:
    """Why ``w`` can never run even on an empty cluster (a ``reject``), or ``None``."""
    return _never_fits(cluster, w, acceptable_types(cluster, w), _facts(cluster, w.queue).caps)


def _never_fits(cluster: Cluster, w: Workload, types: tuple[str, ...], caps: dict[str, int]) -> str | None:
    if not types:
        return reasons.no_type(w)
    why: list[str] = []
    floor = cluster.guarantee[w.queue] if not w.preemptible else None
    for t in types:
        vec = demand(w, t)
        for key, amt in vec:
            cap = caps.get(key)
            if cap is not None and amt > cap:       # some max on the chain is below it: which one
                short = never_within_max(cluster, w.queue, vec)
                assert short is not None
                why.append(reasons.never_max(short))
                break
            g = floor.get(key) if floor is not None else None
            if g is not None and amt > g:           # non-preemptible, larger than its guarantee
                why.append(reasons.pinned_never(Shortfall(w.queue, key, g, 0, amt)))
                break
        else:
            slots = node_slots(cluster, t, w.gpus_per_pod)
            if slots >= w.pods:
                return None
            why.append(reasons.never_nodes(w, t, slots))
    return "; ".join(dict.fromkeys(why))
