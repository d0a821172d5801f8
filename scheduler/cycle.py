"""The scheduling cycle: ``schedule(snapshot, now) -> Decisions``.

Steps, in order: take working copies of the snapshot's occupancy; order the queues (lowest fair
share first, :mod:`scheduler.ordering`); nominate each queue's workloads in workload order; check
quota over the queue's chain; place the gang (best fit, falling back through its GPU types);
admit, or plan a preemption; requeue the rest with their reason and position.

As many workloads are admitted per cycle as fit. After an admission the queue's key is
recomputed and the queue goes back into the heap; a workload that cannot start does not stop the
ones behind it unless its queue is ``strict_fifo``.

Verdicts, then reasons. A walk (one queue's pending, in order, until one starts) stores one
verdict per waiting workload, a typed value of :mod:`scheduler.verdicts`: :class:`Settled` (code
and message known), :class:`NoRoom` / :class:`NoRoomAboveGuarantee` (the shape's room found none
this cycle; the message is the room's), :class:`AwaitingDelay` (may preempt once its delay has
passed). A shape's verdict is found once per walk and shared by its workloads. The reasons are
built from the verdicts only when :attr:`Decisions.pending` is first read (:class:`_Walked`,
:class:`_Quiet`), with what a verdict leaves to its reading (the room's message, the queue's
usage when walked, now) kept with the verdicts in :data:`Segment` s.

Cost (docs/PERFORMANCE.md, "Scheduler at depth"): a cycle's cost follows what changed, not the
depth of the backlog. A queue whose every workload would take a verdict that needs no walk is not
walked at all (:class:`_Quiet`), which is read from counts kept per queue
(:class:`scheduler.memo.QueueCounts`). Within a cycle, a gang shape that found no room keeps its
verdict until a preemption frees capacity (:attr:`_Cycle.all_full`). Across cycles the cluster's
``memo`` (:class:`scheduler.memo.CycleMemo`, each field named and documented there) holds what
never changes (the queue tree as read here, each queue's and gang shape's static :class:`Fit`),
what is updated from the changes (the pending grouped by queue, the per-queue counts and fits, the
victim candidates in order, the queue keys) and each pending workload's last reason, reused as the
same immutable object while it is unchanged. Nothing there is a decision: each is a function of
the snapshot, kept because recomputing it would cost a pass over the backlog.
"""
from __future__ import annotations

import heapq
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter
from types import MappingProxyType
from typing import NamedTuple, final

from scheduler import reasons
from scheduler.errors import SnapshotError
from scheduler.memo import (
    BuiltReasons,
    CycleMemo,
    FitList,
    KeptKey,
    Known,
    QueueChanges,
    QueueCounts,
    QueueFacts,
    QueueTable,
    Shape,
)
from scheduler.model import (
    Admission,
    Decisions,
    Gpus,
    PendingReason,
    PendingReasons,
    Preemption,
    ReasonCode,
    Workload,
    pending_reason,
)
from scheduler.ordering import QueueKey, ScoredKey, grouped, queue_key, queue_scores, scored_key
from scheduler.placement import FreeIndex, node_slots
from scheduler.preemption import NoPlan, Plan, Pool, candidates, own_candidates, plan, protected
from scheduler.quota import (
    Ledger,
    Shortfall,
    cycle_entitlements,
    never_within_max,
    over_guarantee,
    over_guarantee_pinned,
    over_max,
    within_entitlement,
)
from accounting.queues import GPU_EQ
from scheduler.snapshot import FAIR_SHARE, PINNED, UNBOUNDED, Cluster, Snapshot, demand
from scheduler.verdicts import (
    AllFull,
    AwaitingDelay,
    Fit,
    NoRoom,
    NoRoomAboveGuarantee,
    Settled,
    Verdict,
)

PINNED_GPU = PINNED + "gpu"          # a queue's non-preemptible GPUs in its usage


def schedule(snap: Snapshot, now: float) -> Decisions:
    cycle = _Cycle(snap, now)
    memo = snap.cluster.memo
    groups = grouped(memo, snap.pending, snap.changes)
    cycle.qchanges = memo.grouped_changes
    cycle.check_queues(groups)
    if snap.settings.reclaim == FAIR_SHARE and cycle.preemption:
        cycle.entitle(groups)
    key: Callable[[str], QueueKey | ScoredKey] = cycle.queue_key if snap.usage is None else cycle.scored_key
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


@final
class _MayPreempt:
    """A shape whose workloads may preempt in this walk (:meth:`_Cycle._pre_class`); not a verdict
    itself but what gives one per workload: its free-capacity message, its types where it stays
    within its guarantee, the delay, the verdict of those still within the delay, and the verdict
    of the victim search per priority (a search that started one is no verdict: the walk ends)."""

    __slots__ = ("delay_s", "eligible", "message", "own", "plans", "waiting", "why_not")

    def __init__(self, message: str, eligible: tuple[str, ...], delay_s: float,
                 own: tuple[str, ...] = (), why_not: str = "") -> None:
        self.message, self.eligible, self.delay_s = message, eligible, delay_s
        # within its own queue (within_queue): the types to search there, and, when it may not
        # preempt between queues, why not (the guarantee it would go above)
        self.own, self.why_not = own, why_not
        self.waiting = AwaitingDelay(message)
        self.plans: dict[int, Settled] = {}


class _Cycle:
    """The working state of one cycle; built from the snapshot, never writing to it."""

    def __init__(self, snap: Snapshot, now: float) -> None:
        self.snap = snap
        self.now = now
        self.cluster: Cluster = snap.cluster
        self.ledger = Ledger(snap.occupancy.usage)
        self.index = FreeIndex(snap.cluster, snap.occupancy.node_free, snap.occupancy.levels, snap.occupancy.partial)
        self.admissions: list[Admission] = []
        self.preemptions: list[Preemption] = []
        # queue -> its waiting ones (their verdicts; the reasons are built when first read)
        self.parts: dict[str, _Walked | _Quiet] = {}
        self.walked: dict[str, _Walked] = {}     # the walked ones of parts
        self.memo: CycleMemo = self.cluster.memo
        self.counts = self.memo.counts
        table = self.memo.queues
        if table is None:
            c = self.cluster
            table = self.memo.queues = QueueTable(
                frozenset(c.config.leaves()),
                frozenset(q for q, cfg in c.config.queues.items() if cfg.strict_fifo),
                dict(c.gpu_guarantee),
                frozenset(q for q, cfg in c.config.queues.items() if cfg.within_queue))
        self.leaves, self.strict, self.guarantees, self.within = table
        # reclaim: fair_share (:meth:`entitle`): each queue's entitlement this cycle, and per leaf
        # what its usage may reach by preempting, max(gpu guarantee, entitlement); under
        # ``guarantee``: None, and the gpu guarantees
        self.entitled: Mapping[str, Gpus] | None = None
        self.limits: Mapping[str, Gpus] = self.guarantees
        self.qchanges: QueueChanges = {}        # what this cycle's grouping changed (schedule sets it)
        self.fit_lists = self.memo.fit_lists
        self.known = _known(self.memo, len(snap.pending))
        self.qkeys = self.memo.queue_keys
        self.ctx = _Context(self.cluster, now, snap.settings.preemption_delay_s, self.known)
        self.preemption = snap.settings.preemption
        self.pool: Pool | None = None        # victim candidates, built on first need
        self.scores: dict[str, float] | None = None   # fair share over time: queue -> score (scored_key)
        # a gang shape that found no room stays without room until capacity is freed (admissions
        # only take): (type, gpus per pod, pods) -> its message; cleared by every preemption
        self.no_room: dict[tuple[str, Gpus, int], str] = {}
        # Fit.room whose every type is in no_room -> the shapes' free-capacity verdict (no_fit, the
        # joined message); a new dict after every preemption (segments keep the old one)
        self.all_full: AllFull = {}
        self.no_plan: dict[tuple[str, tuple[str, ...], Gpus, int, int], NoPlan] = {}
        self.no_own: dict[tuple[str, tuple[str, ...], Gpus, int, int], NoPlan] = {}   # within-queue searches
        self.ineligible: dict[tuple[str, Gpus, int], str] = {}

    def entitle(self, groups: dict[str, list[Workload]]) -> None:
        """``reclaim: fair_share``: find the cycle's entitlements (once per cycle, before any walk:
        :func:`scheduler.quota.cycle_entitlements`); a leaf may then preempt up to the larger of its
        gpu guarantee and its entitlement, and its reasons name both."""
        ent = self.entitled = cycle_entitlements(self.cluster, self.ledger, groups, self.memo)
        g = self.guarantees
        self.limits = {q: max(g[q], ent.get(q, 0)) for q in self.leaves}
        self.ctx = self.ctx._replace(entitled=ent)

    def queue_key(self, q: str) -> QueueKey:
        """:func:`scheduler.ordering.queue_key`, kept across cycles per queue while the queue's
        usage is the snapshot's same (immutable) mapping."""
        used = self.ledger.of(q)
        if type(used) is not MappingProxyType:             # the cycle's own copy: it changes
            return queue_key(self.cluster, self.ledger, q)
        rec = self.qkeys.get(q)
        if rec is not None and rec.usage is used:
            return rec.key
        k = queue_key(self.cluster, self.ledger, q)
        self.qkeys[q] = KeptKey(used, k)
        return k

    def scored_key(self, q: str) -> ScoredKey:
        """:func:`scheduler.ordering.scored_key` (fair share over time: the snapshot carries usage),
        the scores computed once per cycle and nothing kept across cycles (they change with time)."""
        scores = self.scores
        if scores is None:
            assert self.snap.usage is not None
            scores = self.scores = queue_scores(self.cluster, self.snap.usage)
        return scored_key(self.cluster, self.ledger, q, scores)

    def check_queues(self, groups: dict[str, list[Workload]]) -> None:
        leaves = self.leaves
        for q in groups:
            if q not in leaves:
                raise SnapshotError(f"workload {groups[q][0].id}", f"queue {q} is not a leaf queue")

    def walk(self, q: str, lst: list[Workload], i: int) -> int:
        """Nominate ``lst[i:]`` (queue ``q``'s pending, in order) until one starts; return the index
        after it, or ``len(lst)`` when none does.

        Nothing a verdict reads changes until one starts (the ledger, the free index; what a walk
        adds to the memos only names what it found), so a gang shape's verdict is found once per
        walk and every later workload of the shape takes it: the loop over the waiting ones stores
        a verdict per workload (:data:`scheduler.verdicts.Verdict`) and builds no reason; the
        reasons are built from the verdicts when first read (:class:`_Walked`). The common verdicts
        "no room for the shape's room this cycle" (:class:`NoRoom`, and
        :class:`NoRoomAboveGuarantee` when the queue is above its guarantee) are the shape's
        :class:`Fit`'s own, taken without a call.

        A non-preemptible workload whose queue's non-preemptible GPUs would go above its gpu
        guarantee takes the verdict ``non_preemptible_over_guarantee`` without a call too (what
        :meth:`free_capacity` and :meth:`_pre_class` would say for it, :func:`pinned_verdict`).

        A queue's first walk of a cycle is skipped when the queue is quiet: every one of its
        workloads would take a verdict that needs no walk now (it never fits, or its room has found
        no room this cycle and either preemption is off or the queue would go above its guarantee;
        or it is non-preemptible and over its guarantee as above). That is read from the queue's
        :class:`QueueCounts` (its rooms, its smallest gang, its smallest non-preemptible gang), not
        workload by workload; such a walk starts nothing and reads nothing that changes, and the
        queue's reasons derive from each workload's :class:`Fit` when read (:class:`_Quiet`)."""
        all_full, preemption = self.all_full, self.preemption
        used = self.ledger.used(q, "gpu")
        g = self.guarantees[q]
        lim = self.limits[q]                 # g, or under reclaim: fair_share max(g, entitlement)
        strict = q in self.strict
        # a queue whose work may preempt within it is never "above its guarantee" for the quick noes
        # below: its search within the queue is bounded by no guarantee (scheduler.preemption)
        within = preemption and q in self.within
        part = self.walked.get(q)
        if part is None:
            if not strict and not within:    # quiet? (every queue, every cycle: kept inline)
                a = self.counts.get(q)
                if a is None or a.lst is not lst:
                    a = self.counts_of(q, lst)
                if a.rooms.keys() <= all_full.keys() and (not preemption or not a.gpus or used + min(a.gpus) > lim) \
                        and (not a.pinned or self.ledger.used(q, PINNED_GPU) + min(a.pinned) > g):
                    n = len(lst)
                    self.parts[q] = _Quiet(self.ctx, q, lst, preemption, (0, n, all_full, used), a,
                                           self.ledger.used(q, PINNED_GPU) if a.pinned else 0)
                    return n
            part = self.walked[q] = self.parts[q] = _Walked(self.ctx, q, lst, [], [])
        fits = self.fits_of(q, lst)
        vs = part.verdicts
        start, n = i, len(lst)
        seen: dict[int, Settled | _MayPreempt] = {}      # Fit.key -> what the shape found in this walk
        pinned = self.ledger.used(q, PINNED_GPU)
        # what the queue may still take within its guarantee (its entitlement), found once: a
        # workload's test is one compare (``used + gpus > lim`` as ``gpus > left``: the same for
        # ints, and for exact shares)
        left, pinned_left = lim - used, g - pinned
        # non-preemptible gangs over the guarantee: one verdict per size in this walk (its message
        # says the sizes; a share's takes a decimal's formatting, issue 19's Alibaba replay)
        pinned_seen: dict[Gpus, Settled] | None = None
        v: Verdict | None
        while i < n:
            fit = fits[i]
            i += 1
            v = fit.never_fits
            if v is None:
                room = fit.room
                if fit.pinned and fit.gpus > pinned_left:    # non-preemptible, over its guarantee
                    if pinned_seen is None:
                        pinned_seen = {}
                    pv = pinned_seen.get(fit.gpus)
                    if pv is None:
                        pv = pinned_seen[fit.gpus] = pinned_verdict(q, pinned, fit.gpus, g)
                    vs.append(pv)
                    if strict:
                        break
                    continue
                if room in all_full:
                    if not preemption:
                        vs.append(fit.no_room)
                        if strict:
                            break
                        continue
                    if fit.gpus > left and not within:   # as in _pre_class: the quick no
                        vs.append(fit.no_room_above)
                        if strict:
                            break
                        continue
                found = seen.get(fit.key)
                if found is None:
                    w = lst[i - 1]
                    full = all_full.get(room)
                    if full is not None:            # what free_capacity would say, from the memo
                        miss = full
                    else:
                        got = self.free_capacity(w, fit)
                        if isinstance(got, Admission):
                            return self._started(part, start, i, all_full, used)
                        miss = got
                    found = seen[fit.key] = self._pre_class(w, fit, miss) if preemption else miss
                if type(found) is _MayPreempt:
                    w = lst[i - 1]
                    if self.now - w.submit_s < found.delay_s:
                        v = found.waiting
                    else:
                        pv = found.plans.get(w.priority)
                        if pv is None:
                            got = self._plan_verdict(w, found)
                            if isinstance(got, Admission):
                                return self._started(part, start, i, all_full, used)
                            pv = found.plans[w.priority] = got
                        v = pv
                else:
                    v = found
            vs.append(v)
            if strict:
                break
        if strict and i < n:
            head = lst[i - 1]
            msg = reasons.strict_fifo(head, q)
            behind = Settled(ReasonCode.BEHIND_HIGHER_PRIORITY, msg)
            fifo = Settled(ReasonCode.STRICT_FIFO, msg)
            vs.extend(behind if head.priority > w.priority else fifo for w in lst[i:])
        part.segments.append((start, n, all_full, used))
        return n

    def _started(self, part: _Walked, start: int, i: int, all_full: AllFull, used: Gpus) -> int:
        """``lst[i - 1]`` started: the walk's waiting ones are ``lst[start:i - 1]``."""
        part.segments.append((start, i - 1, all_full, used))
        return i

    def counts_of(self, q: str, lst: list[Workload]) -> QueueCounts:
        """``q``'s :class:`QueueCounts` for ``lst``, kept across cycles and updated from the
        workloads that left and joined the queue (:attr:`CycleMemo.grouped_changes`), else counted
        anew."""
        a = self.counts.get(q)
        if a is not None and a.lst is lst:
            return a
        ch = self.qchanges.get(q)
        left: Sequence[Workload]
        if a is not None and ch is not None and ch[0] is a.lst and len(ch[1]) + len(ch[2]) <= len(lst):
            left, came = ch[1], ch[2]
        else:
            a, left, came = QueueCounts(lst), (), lst
            self.counts[q] = a
        rooms, gpus, cluster, known = a.rooms, a.gpus, self.cluster, self.known
        for w in left:
            fit = fit_of(cluster, known, w)
            if fit.never is None:
                if not fit.pinned:
                    if rooms[fit.room] == 1:
                        del rooms[fit.room]
                    else:
                        rooms[fit.room] -= 1
                elif a.pinned[fit.gpus] == 1:
                    del a.pinned[fit.gpus]
                else:
                    a.pinned[fit.gpus] -= 1
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
        if fl is not None and fl.lst is lst:
            return fl.fits
        cluster, known = self.cluster, self.known
        fits = [fit_of(cluster, known, w) for w in lst]
        self.fit_lists[q] = FitList(lst, fits)
        return fits

    def free_capacity(self, w: Workload, fit: Fit) -> Admission | Settled:
        """Start ``w`` on free capacity of one of its types (its :class:`Admission`), or say why not.
        Until it starts, only :attr:`no_room` changes what this says for ``w``'s gang shape, in
        ``w``'s queue.

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
                short = over_guarantee_pinned(cluster, ledger, w.queue, demand(w, t, cluster.equivalents))
                if short is not None:
                    misses.append(reasons.pinned_over(short))
                    continue
            miss = self.no_room.get((t, k, pods))
            if miss is None:
                vec = demand(w, t, cluster.equivalents)
                short = over_max(cluster, ledger, w.queue, vec)
                if short is not None:
                    misses.append(reasons.quota_max(short))
                    room_only = pinned_only = False
                    continue
                placement = index.place(t, k, pods)
                if placement is not None:
                    ledger.add(cluster.chains[w.queue], vec)
                    admission = Admission(w, placement)
                    self.admissions.append(admission)
                    return admission
                miss = self.no_room[(t, k, pods)] = reasons.no_fit(
                    w, t, index.slots(t, k, pods),
                    index.largest_free(t) if type(k) is int else index.largest_share(t))
            code = ReasonCode.NO_FIT
            pinned_only = False
            misses.append(miss)
        message = misses[0] if len(misses) == 1 else "; ".join(dict.fromkeys(misses))
        if pinned_only:
            code = ReasonCode.NON_PREEMPTIBLE_OVER_GUARANTEE
        verdict = Settled(code, message)
        if room_only:
            self.all_full[fit.room] = verdict
        return verdict

    def _not_eligible(self, queue: str, used: Gpus, gpus: Gpus, g: int) -> str:
        why = self.ineligible.get((queue, used + gpus, g))
        if why is None:
            ent = self.entitled
            why = self.ineligible[(queue, used + gpus, g)] = reasons.not_eligible(
                Shortfall(queue, "gpu", g, used, gpus)) if ent is None else reasons.not_entitled(
                queue, used + gpus, g, ent.get(queue, 0))
        return why

    def _pre_class(self, w: Workload, fit: Fit, miss: Settled) -> Settled | _MayPreempt:
        """What preemption says for ``w``'s gang shape in this walk, ``miss`` being its
        free-capacity verdict: a final verdict (the queue would go above its guarantee), or a
        :class:`_MayPreempt` whose workloads wait for the preemption delay or search for victims."""
        code, message = miss
        if code is ReasonCode.NON_PREEMPTIBLE_OVER_GUARANTEE:
            return miss                # its queue holds at least that much: above its guarantee too
        cluster, ledger = self.cluster, self.ledger
        used, g = ledger.used(w.queue, "gpu"), cluster.gpu_guarantee[w.queue]
        types = fit.types
        own = types if w.queue in self.within else ()      # within_queue: its own queue's search too
        delay_s = self.snap.settings.preemption_delay_s
        # the gpu guarantee (under reclaim: fair_share, the entitlement) binds on every type: a quick
        # no between queues; a within-queue queue still searches its own work (no guarantee bounds it)
        if used + w.gpus > self.limits[w.queue]:
            why = self._not_eligible(w.queue, used, w.gpus, g)
            return _MayPreempt(message, (), delay_s, own, why) if own else Settled(code, f"{message}; {why}")
        if len(cluster.guarantee[w.queue]) == 1 and g != UNBOUNDED:   # a gpu guarantee only: just checked
            return _MayPreempt(message, types, delay_s, own)
        ent = self.entitled
        if within_entitlement(ledger, w.queue, w.gpus, ent):      # within its entitlement on every type
            return _MayPreempt(message, types, delay_s, own)
        eq = cluster.equivalents
        eligible = [t for t in types if over_guarantee(cluster, ledger, w.queue, demand(w, t, eq)) is None]
        if not eligible:
            short = over_guarantee(cluster, ledger, w.queue, demand(w, types[0], eq))
            assert short is not None
            why = reasons.not_eligible(short)
            if ent is not None:
                why += f"; and {reasons.amount(used + w.gpus)} gpu, above its entitlement {reasons.amount(ent.get(w.queue, 0))}"
            if own:
                return _MayPreempt(message, (), delay_s, own, why)
            return Settled(code, f"{message}; {why}")
        return _MayPreempt(message, tuple(eligible), delay_s, own)

    def _plan_verdict(self, w: Workload, pre: _MayPreempt) -> Admission | Settled:
        """Preempt for ``w`` (past its delay) and start it (its :class:`Admission`), or say why not."""
        cluster, ledger = self.cluster, self.ledger
        key = (w.queue, w.gpu_types, w.gpus_per_pod, w.pods, w.priority)
        result: Plan | NoPlan | None = None
        if pre.eligible:
            result = self.no_plan.get(key) or self._plan(w, pre.eligible)
            if isinstance(result, NoPlan):
                self.no_plan[key] = result
        within = False
        if pre.own and not isinstance(result, Plan):
            got = self.no_own.get(key) or self._plan(w, pre.own, own=True)
            if isinstance(got, NoPlan):
                self.no_own[key] = got
            else:
                result, within = got, True
            if result is None:
                result = got
        assert result is not None
        if isinstance(result, NoPlan):
            return self._no_plan_verdict(w, pre, result)
        vec = demand(w, result.gpu_type, cluster.equivalents)
        placement = self.index.place(result.gpu_type, w.gpus_per_pod, w.pods)
        assert placement is not None, "a preemption plan always leaves room for its preemptor"
        basis = "gpu" if cluster.gpu_guarantee[w.queue] != UNBOUNDED else GPU_EQ   # what its guarantee is in
        holds, g = ledger.used(w.queue, basis), cluster.guarantee[w.queue][basis]
        needed = w.gpus if basis == "gpu" else dict(vec)[GPU_EQ]
        ent = self.entitled
        if within:                       # its own queue's lower-priority work (within_queue)
            why = reasons.preempted_within(w.queue, w.priority, max(r.workload.priority for r in result.victims))
        elif ent is not None and over_guarantee(cluster, ledger, w.queue, vec) is not None:
            # above its guarantee: this preemption restores its entitlement (fair_share)
            why = reasons.preempted_entitled(w.queue, ledger.used(w.queue, "gpu"), w.gpus, ent.get(w.queue, 0),
                                             cluster.gpu_guarantee[w.queue])
        else:
            why = reasons.preempted(w.queue, holds, needed, g, basis)
        ledger.add(cluster.chains[w.queue], vec)
        victims = tuple(r.workload.id for r in result.victims)
        self.no_room.clear()
        self.all_full = {}               # a new one: parts built earlier keep reading the old one
        self.preemptions.append(Preemption(w.id, w.queue, victims, why))
        admission = Admission(w, placement, victims)
        self.admissions.append(admission)
        return admission

    def _no_plan_verdict(self, w: Workload, pre: _MayPreempt, result: NoPlan) -> Settled:
        """Why no search found victims for ``w``: between queues (fenced, or none of those
        considered), within its own queue (``pre.own``: none of its lower-priority work), and the
        candidates its queues' minimum runtime still protects. ``result``: the last search's (the
        one within the queue where there was one)."""
        parts = [pre.message]
        own = self.no_own.get((w.queue, w.gpu_types, w.gpus_per_pod, w.pods, w.priority)) if pre.own else None
        between = self.no_plan.get((w.queue, w.gpu_types, w.gpus_per_pod, w.pods, w.priority)) if pre.eligible else None
        code = ReasonCode.NO_VICTIMS
        if between is not None:
            if between.fenced:
                code = ReasonCode.FENCED
                parts.append(reasons.fenced(between.fenced))
            else:
                parts.append(reasons.no_victims(between.considered))
            if between.protected:
                parts.append(reasons.protected(between.protected, between.protected_until, self.now))
        elif pre.why_not:
            parts.append(pre.why_not)
        if own is not None:
            parts.append(reasons.no_victims_within(w.queue, w.priority, own.considered))
            if own.protected:
                parts.append(reasons.protected(own.protected, own.protected_until, self.now))
        return Settled(code, "; ".join(parts))

    def _plan(self, w: Workload, types: tuple[str, ...], own: bool = False) -> Plan | NoPlan:
        pool = self.pool
        if pool is None:
            now, running = self.now, self.snap.running
            pool = self.pool = Pool(candidates(self.cluster, self.ledger, running, self.memo, now),
                                    self.cluster.fences, protected(self.cluster, running, now))
        if own and pool.own is None:
            pool.own = own_candidates(self.cluster, self.snap.running, self.now, self.memo)
        result = plan(self.cluster, self.ledger, self.index, pool, w, types, own=own, entitled=self.entitled)
        pool.compact()
        return result

    def requeue(self, groups: dict[str, list[Workload]]) -> PendingReasons:
        """The waiting workloads, queue by queue (each one's position counts the waiting ones),
        built when first read."""
        parts = [self.parts[q] for q in groups if q in self.parts]
        return PendingReasons(parts, sum(map(len, parts)))


def acceptable_types(cluster: Cluster, w: Workload) -> tuple[str, ...]:
    """The workload's types that exist in the cluster, in its order (all types, in cluster order,
    when it accepts any)."""
    if not w.gpu_types:
        return cluster.types
    return tuple(t for t in w.gpu_types if t in cluster.type_nodes)


_SHAPE: Callable[[Workload], Shape] = attrgetter(
    "gpu_types", "gpus_per_pod", "pods", "cpu_millicores_per_pod", "memory_per_pod_bytes", "preemptible")


def _facts(cluster: Cluster, queue: str) -> QueueFacts:
    facts = cluster.memo.facts.get(queue)
    if facts is None:
        caps: dict[str, Gpus] = {}
        for q in cluster.chains[queue]:
            for key, m in cluster.config.queues[q].max.items():
                caps[key] = min(m, caps.get(key, m))
        why_not = reasons.above_guarantee_parts(queue, "gpu", cluster.gpu_guarantee[queue])
        facts = cluster.memo.facts[queue] = QueueFacts({}, caps, why_not)
    return facts


# lst[a:b] waited, with the walk's all_full (what its NoRoom verdicts read) and the queue's gpu
# usage when walked (what its NoRoomAboveGuarantee verdicts read)
Segment = tuple[int, int, AllFull, Gpus]


class _Context(NamedTuple):
    """What a queue's reasons read of their cycle, when built."""

    cluster: Cluster
    now: float
    delay_s: float
    known: dict[str, Known]
    entitled: Mapping[str, Gpus] | None = None     # reclaim: fair_share's entitlements (the reasons name them)


class _Part:
    """A queue's waiting workloads of one cycle, ``lst`` being its pending list: called, it builds
    their reasons from their verdicts (positions counted over the segments in order). The segments'
    all_full dicts only ever gain rooms, and a room's verdict, once there, stays, so what it builds
    does not depend on when it is called. Made as a :class:`_Walked` or a :class:`_Quiet`."""

    __slots__ = ("ctx", "lst", "queue")
    ctx: _Context
    queue: str
    lst: list[Workload]

    def _build(self, segments: Sequence[Segment], vs: list[Verdict]) -> list[PendingReason]:
        q, lst = self.queue, self.lst
        cluster, now, delay_s, known, entitled = self.ctx
        if entitled is None:
            head, tail = _facts(cluster, q).why_not
        else:
            head, tail = reasons.above_entitlement_parts(q, cluster.gpu_guarantee[q], entitled.get(q, 0))
        no_fit = ReasonCode.NO_FIT
        out: list[PendingReason] = []
        j = 0
        for a, b, all_full, used in segments:
            for k in range(a, b):
                w, v = lst[k], vs[j]
                j += 1
                if type(v) is Settled:
                    code, msg = v
                elif type(v) is NoRoom:
                    code, msg = no_fit, all_full[v.room].message
                elif type(v) is NoRoomAboveGuarantee:
                    code = no_fit
                    msg = f"{all_full[v.room].message}; {head}{reasons.amount(used + w.pods * w.gpus_per_pod)}{tail}"
                else:
                    code = ReasonCode.WAITING_PREEMPTION_DELAY
                    at = w.submit_s + delay_s
                    msg = f"{v.message}; {reasons.delay(now, at, delay_s)}"
                pos = len(out) + 1
                # the workload's last reason when equal: no new object, no garbage
                seen = known.get(w.id)
                if seen is not None and seen.workload is w:
                    last = seen.last
                    if last is None or last.position != pos or last.code is not code or last.message != msg:
                        last = seen.last = pending_reason(w.id, q, code, msg, pos)
                    out.append(last)
                else:
                    out.append(pending_reason(w.id, q, code, msg, pos))
        return out


class _Walked(_Part):
    """A walked queue's waiting workloads: the walks' segments and one verdict each."""

    __slots__ = ("segments", "verdicts")

    def __init__(self, ctx: _Context, queue: str, lst: list[Workload], verdicts: list[Verdict],
                 segments: list[Segment]) -> None:
        self.ctx, self.queue, self.lst = ctx, queue, lst     # (not _Part.__init__: one call less a walk)
        self.verdicts, self.segments = verdicts, segments

    def __len__(self) -> int:
        return sum(b - a for a, b, _, _ in self.segments)

    def __call__(self) -> list[PendingReason]:
        return self._build(self.segments, self.verdicts)


class _Quiet(_Part):
    """A quiet queue's waiting workloads (not walked, :meth:`_Cycle.walk`): all of ``lst``, each
    verdict following from the workload's :class:`Fit`, whether preemption was on, and the queue's
    non-preemptible GPUs (``pinned``; 0 when it has no non-preemptible work that can fit)."""

    __slots__ = ("counts", "pinned", "preemption", "segment")

    def __init__(self, ctx: _Context, queue: str, lst: list[Workload], preemption: bool, segment: Segment,
                 counts: QueueCounts, pinned: Gpus) -> None:
        self.ctx, self.queue, self.lst = ctx, queue, lst     # (not _Part.__init__: one call less a queue)
        self.preemption, self.segment, self.counts, self.pinned = preemption, segment, counts, pinned

    def __len__(self) -> int:
        return self.segment[1] - self.segment[0]

    def __call__(self) -> list[PendingReason]:
        # Its reasons follow from its list, the preemption setting, its usage, its non-preemptible
        # GPUs and the verdict of each room it reads: when all are as when they were last built,
        # they are that list (what the service reads every cycle; the counts are this list's only
        # while unchanged).
        q, lst, pre, counts, pinned = self.queue, self.lst, self.preemption, self.counts, self.pinned
        cluster, _, _, known, entitled = self.ctx
        ent = None if entitled is None else entitled.get(q, 0)
        _, _, all_full, used = self.segment
        built = cluster.memo.built
        rooms: tuple[Settled, ...] | None = None
        if counts.lst is lst:
            rooms = tuple([all_full[r] for r in counts.rooms])
            rec = built.get(q)
            if rec is not None and rec.lst is lst and rec.preemption is pre and rec.used == used \
                    and rec.entitled == ent and rec.pinned == pinned and rec.rooms == rooms:
                return rec.reasons
        g = cluster.gpu_guarantee[q]
        vs: list[Verdict] = []
        v: Verdict | None
        for w in lst:
            fit = fit_of(cluster, known, w)
            v = fit.never_fits
            if v is None:
                v = pinned_verdict(q, pinned, fit.gpus, g) if fit.pinned else fit.no_room_above if pre \
                    else fit.no_room
            vs.append(v)
        out = self._build((self.segment,), vs)
        if rooms is not None:
            built[q] = BuiltReasons(lst, pre, used, ent, pinned, rooms, out)
        return out


def pinned_verdict(queue: str, pinned: Gpus, gpus: Gpus, g: int) -> Settled:
    """The verdict of a non-preemptible gang of ``gpus`` whose queue's non-preemptible work holds
    ``pinned`` GPUs of its gpu guarantee ``g`` (``pinned + gpus > g``): what
    :meth:`_Cycle.free_capacity` says for it on every type (the gpu guarantee binds on each)."""
    return Settled(ReasonCode.NON_PREEMPTIBLE_OVER_GUARANTEE,
                   reasons.pinned_over(Shortfall(queue, "gpu", g, pinned, gpus)))


def _known(memo: CycleMemo, pending: int) -> dict[str, Known]:
    """Workload id -> :class:`Known` (the workload, its :class:`Fit`, its last reason), kept on the
    cluster across cycles: a waiting workload's fit is found by id (cheaper than by shape), and a
    reason equal to the last one is that same (immutable) object, so a steady cycle allocates next
    to nothing. Emptied when it holds far more than the pending workloads, so it stays bounded."""
    known = memo.known
    if len(known) > 4 * pending + 4096:
        known.clear()
    return known


def fit_of(cluster: Cluster, known: dict[str, Known], w: Workload) -> Fit:
    """:func:`static_fit` of ``w``, found by id in ``known`` (:func:`_known`) and noted there."""
    seen = known.get(w.id)
    if seen is not None and seen.workload is w:
        return seen.fit
    fit = static_fit(cluster, w)
    known[w.id] = Known(w, fit)
    return fit


def static_fit(cluster: Cluster, w: Workload) -> Fit:
    """:class:`Fit` of ``w``, memoized on the cluster per queue and gang shape: it depends only on
    the static cluster and queue tree."""
    facts = _facts(cluster, w.queue)
    shape = _SHAPE(w)
    hit = facts.fits.get(shape)
    if hit is None:
        memo = cluster.memo
        types = acceptable_types(cluster, w)
        pinned = not w.preemptible
        room = memo.rooms.setdefault((types, w.gpus_per_pod, w.pods, pinned), len(memo.rooms))
        if room == len(memo.room_verdicts):               # a room first seen: its two verdicts
            memo.room_verdicts.append((NoRoom(room), NoRoomAboveGuarantee(room)))
        key = memo.fit_keys.setdefault((w.queue, shape), len(memo.fit_keys))
        never = _never_fits(cluster, w, types, facts.caps)
        hit = facts.fits[shape] = Fit(
            never, types, room, key, w.pods * w.gpus_per_pod, pinned,
            None if never is None else Settled(ReasonCode.NEVER_FITS, never), *memo.room_verdicts[room])
    return hit


def never_fits(cluster: Cluster, w: Workload) -> str | None:
    """Why ``w`` can never run even on an empty cluster (a ``reject``), or ``None``."""
    return _never_fits(cluster, w, acceptable_types(cluster, w), _facts(cluster, w.queue).caps)


def _never_fits(cluster: Cluster, w: Workload, types: tuple[str, ...], caps: Mapping[str, Gpus]) -> str | None:
    if not types:
        return reasons.no_type(w)
    why: list[str] = []
    floor = cluster.guarantee[w.queue] if not w.preemptible else None
    for t in types:
        vec = demand(w, t, cluster.equivalents)
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
