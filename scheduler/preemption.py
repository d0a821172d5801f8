"""Preemption: choose a minimal set of victims that lets a pending workload run.

Rules (FORMAT.md and issue 4; each has a test in tests/test_scheduler_preemption.py):

* only for a preemptor whose leaf queue stays at or below its guarantee after admission (with
  ``scheduler.reclaim: fair_share``, issue 21: or at or below its entitlement, in GPUs of any
  type: :func:`scheduler.quota.within_entitlement`);
* a victim's leaf queue and each of its ancestors not shared with the preemptor stay at or
  above their guarantee after the victims leave (so victims come only from queues above it);
  with ``fair_share`` also at or above their entitlement (:func:`scheduler.quota.below_entitlement`);
* victim priority <= preemptor priority; non-preemptible workloads are never victims; no victim
  across a preemption fence (fenced subtrees neither lose nor take by preemption);
* victims are whole gangs; the set is minimal: candidates are added in candidate order until the
  preemptor fits (its quota over its chain and its gang on real nodes of one type), then each
  added victim but the last is given back if the preemptor still fits without it.

Candidate order (the victim order; first is preempted first; this is the one place it is stated):
``(queue rank, originator, priority, -start_s, not idle, id)``:

1. the lowest-priority queue first: a victim's *queue rank* (:func:`queue_ranks`) is the queue
   ``priority`` of each queue on its chain from the top of the tree down to its leaf queue
   (department first, then the queue in it), padded with 0 (the default priority) to the tree's
   depth, compared level by level; KAI-Scheduler orders victims the same way (its victim queues
   are its queue order reversed, compared parent queue first, queue priority among the criteria;
   tests/data/kai, reclaim_test "reclaim from less prioritized queue"). Queues of equal rank
   (every queue at the default 0, as in most queue files) are one group, so this changes nothing
   there;
2. then, within it: non-originators, lower workload priority, the youngest (least work lost),
   GPUs the accounting sees idle, then the stable id.

Non-preemptible work is not a candidate at all, and the rules above (the victim-priority rule, the
floors, fences) decide who may be a victim; the order only decides who goes first.

Minimum runtime (issue 21): a running workload whose queue's ``min_runtime_s`` (in force there,
inherited, :mod:`accounting.queues`) has not passed since its start is no candidate of any search,
between queues or within one (:func:`protected_until`; it may be a victim from that instant on);
a search that found no set says how many such candidates it could have used and until when the
first is protected (:attr:`NoPlan.protected_until`).

Within a queue (issue 21; KAI-Scheduler's preempt action, Kueue's ``withinClusterQueue:
LowerPriority``): a pending workload of a queue with ``within_queue: lower_priority`` that finds no
victim set in other queues (or may not look there: its queue would go above its guarantee, or
under ``fair_share`` above its entitlement) may preempt its *own* leaf queue's work of strictly
lower priority (:func:`plan` with ``own=True``). Such a set holds only victims of its own queue, in
the same candidate order; the queue gives up its own work, so neither its guarantee, its
entitlement nor a floor bounds it (as Kueue lets a workload borrow when every candidate is of its
own ClusterQueue) but every max on its chain does, as always. Sets never mix the two kinds: the
rules of each stay checkable on their own.

The search runs on the cycle's working ledger and free index, never on the snapshot, and is
device-aware (issue 19): victims are given back on a :class:`~scheduler.placement.Trial` of the
index (an overlay of the nodes and devices they hold, with the preemptor's pods still short kept
as a count), which changes the index only once the search is settled, exactly as the same steps
on the index would have; the ledger's changes are undone by restoring the queues they touched. A
search that would fail and leave nothing behind is skipped (:meth:`Pool.quiet`). Every decision
is the same as a search on the index itself (tests/test_preemption_trial.py).
"""
from __future__ import annotations

from bisect import bisect_left
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from itertools import compress
from typing import NamedTuple

from accounting.queues import GPU_EQ
from scheduler.memo import CandidateOrder, CycleMemo
from scheduler.model import Gpus, Running, Workload
from scheduler.placement import FreeIndex
from scheduler.quota import (
    Ledger,
    Saved,
    Shortfall,
    Vec,
    below_entitlement,
    below_floor,
    over_guarantee,
    over_max,
    within_entitlement,
)
from scheduler.snapshot import Cluster, demand


QueueRank = tuple[int, ...]
CandidateKey = tuple[QueueRank, bool, int, float, bool, str]


def candidate_key(r: Running, ranks: Mapping[str, QueueRank]) -> CandidateKey:
    """``r``'s place in the candidate order (module docstring); ``ranks``: :func:`queue_ranks`."""
    w = r.workload
    return (ranks[w.queue], w.originator, w.priority, -r.start_s, not r.idle, w.id)


def queue_ranks(cluster: Cluster) -> Mapping[str, QueueRank]:
    """Each queue's rank in the victim order: the ``priority`` of each queue on its chain from the
    top (the root left out) down to it, padded with 0 to the tree's depth so that every rank has
    the same length (a rank reversed, each priority negated, is the order reversed: the
    forecasts' timeline reads it so). A pure function of the cluster, kept in its memo."""
    memo = cluster.memo
    got = memo.queue_ranks
    if got is None:
        queues = cluster.config.queues
        tops = {q: tuple(queues[c].priority for c in reversed(chain[:-1])) for q, chain in cluster.chains.items()}
        depth = max(map(len, tops.values()), default=0)
        got = memo.queue_ranks = {q: t + (0,) * (depth - len(t)) for q, t in tops.items()}
    return got


class Candidate(NamedTuple):
    id: str
    queue: str
    priority: int
    gpu_type: str
    vec: Vec
    running: Running


def min_runtimes(cluster: Cluster) -> dict[str, float]:
    """Each queue whose work has a minimum runtime (``min_runtime_s`` above 0): that runtime. Empty
    in a cluster without one, where nothing below costs anything more."""
    return {q: cfg.min_runtime_s for q, cfg in cluster.config.queues.items() if cfg.min_runtime_s > 0}


def protected_until(r: Running, mins: Mapping[str, float]) -> float:
    """When ``r`` may first be a victim (its start, plus its queue's minimum runtime; ``mins``:
    :func:`min_runtimes`)."""
    return r.start_s + mins.get(r.workload.queue, 0.0)


def candidates(cluster: Cluster, ledger: Ledger, running: Sequence[Running],
               memo: CycleMemo | None = None, now: float | None = None) -> list[Candidate]:
    """Running workloads that could ever be victims this cycle (preemptible, in a queue above
    its gpu guarantee, and, with ``now``, past their minimum runtime), in candidate order. With
    ``memo`` (the cluster's), every preemptible running workload is kept in candidate order from
    one call to the next and only what started or stopped since is placed (:func:`_in_order`)."""
    g, eq = cluster.gpu_guarantee, cluster.equivalents
    over = {q for q in cluster.chains if ledger.used(q, "gpu") > g[q]}
    if eq is not None:                 # a queue above its gpu_eq guarantee lends too
        ge = cluster.guarantee
        over |= {q for q in cluster.chains if GPU_EQ in ge[q] and ledger.used(q, GPU_EQ) > ge[q][GPU_EQ]}
    ranks = queue_ranks(cluster)
    if memo is not None:
        out = [c for c in _in_order(memo, running, eq, ranks) if c.queue in over]
    else:
        rs = [r for r in running if r.workload.preemptible and r.workload.queue in over]
        rs.sort(key=lambda r: candidate_key(r, ranks))
        out = [_candidate(r, eq) for r in rs]
    if now is not None:
        mins = min_runtimes(cluster)
        if mins:
            out = [c for c in out if protected_until(c.running, mins) <= now]
    return out


def own_candidates(cluster: Cluster, running: Sequence[Running], now: float,
                   memo: CycleMemo | None = None) -> dict[str, list[Candidate]]:
    """For each queue with ``within_queue: lower_priority``: its preemptible running work past its
    minimum runtime, in candidate order (what a search within the queue may take; its guarantee
    does not bound it, so a queue at or below its guarantee has candidates too)."""
    within = {q for q in cluster.chains if cluster.config.queues[q].within_queue}
    if not within:
        return {}
    eq, ranks, mins = cluster.equivalents, queue_ranks(cluster), min_runtimes(cluster)
    if memo is not None:
        alls = _in_order(memo, running, eq, ranks)
    else:
        rs = sorted((r for r in running if r.workload.preemptible), key=lambda r: candidate_key(r, ranks))
        alls = [_candidate(r, eq) for r in rs]
    out: dict[str, list[Candidate]] = {}
    for c in alls:
        if c.queue in within and (not mins or protected_until(c.running, mins) <= now):
            out.setdefault(c.queue, []).append(c)
    return out


def protected(cluster: Cluster, running: Sequence[Running], now: float) -> list[tuple[float, Candidate]]:
    """The preemptible running work still within its queue's minimum runtime at ``now``, each with
    the instant it may first be a victim (no candidate yet; what a failed search's reason counts)."""
    mins = min_runtimes(cluster)
    if not mins:
        return []
    eq = cluster.equivalents
    return [(protected_until(r, mins), _candidate(r, eq)) for r in running
            if r.workload.preemptible and r.workload.queue in mins and protected_until(r, mins) > now]


def _candidate(r: Running, eq: Mapping[str, Decimal] | None) -> Candidate:
    w = r.workload
    return Candidate(w.id, w.queue, w.priority, r.placement.gpu_type, demand(w, r.placement.gpu_type, eq), r)


def _in_order(memo: CycleMemo, running: Sequence[Running], eq: Mapping[str, Decimal] | None,
              ranks: Mapping[str, QueueRank]) -> list[Candidate]:
    """Every preemptible one of ``running`` as a :class:`Candidate`, in candidate order, kept in
    ``memo.candidates`` (:class:`~scheduler.memo.CandidateOrder`) and updated by the ids that came and went (a set difference at C speed, then a
    bisection per change): the same list as sorting them all, at a cost that follows the change."""
    prev = memo.candidates
    ids = set(map(id, running))
    if prev is not None and len(ids) == len(running):
        _, old_ids, keys, cands, by_id = prev
        gone, came = old_ids - ids, ids - old_ids
        if len(gone) + len(came) <= len(running) // 4 + 64:
            for i in gone:
                c = by_id.pop(i, None)
                if c is not None:
                    k = bisect_left(keys, candidate_key(c.running, ranks))
                    del keys[k], cands[k]
            for r in compress(running, map(came.__contains__, map(id, running))):
                if r.workload.preemptible:
                    key = candidate_key(r, ranks)
                    k = bisect_left(keys, key)
                    keys.insert(k, key)
                    c = _candidate(r, eq)
                    cands.insert(k, c)
                    by_id[id(r)] = c
            memo.candidates = CandidateOrder(running, ids, keys, cands, by_id)
            return cands
    keyed = sorted((candidate_key(r, ranks), r) for r in running if r.workload.preemptible)
    cands = [_candidate(r, eq) for _, r in keyed]
    if len(ids) == len(running):
        memo.candidates = CandidateOrder(running, ids, [k for k, _ in keyed], cands,
                                         {id(c.running): c for c in cands})
    return cands


class Pool:
    """The cycle's candidates (:func:`candidates`), also split by GPU type, and ``dead``: the ids
    that can no longer be victims this cycle (already preempted, or their own queue is at its
    floor). Dead entries are skipped, and dropped now and then. The live candidates are counted
    by (fence, priority) and by queue, so a failed search counts what it looked at (its reason
    says how many) without a pass over every candidate."""

    __slots__ = ("_by_fence", "_by_queue", "_dropped", "_fences", "_quiet", "all", "by_type", "dead", "own",
                 "protected", "taken")

    def __init__(self, cands: list[Candidate], fences: Mapping[str, frozenset[str]],
                 protected: Sequence[tuple[float, Candidate]] = ()) -> None:
        self.all = cands
        # within-queue candidates per queue (:func:`own_candidates`), set by the caller on first need
        self.own: dict[str, list[Candidate]] | None = None
        self.protected = protected                   # within their minimum runtime (:func:`protected`)
        self.taken: set[str] = set()                 # the victims taken so far this cycle
        by_type: dict[str, list[Candidate]] = {}
        by_queue: dict[str, dict[int, int]] = {}
        for c in cands:                              # one pass: by type, and counted by queue
            lst = by_type.get(c.gpu_type)
            if lst is None:
                by_type[c.gpu_type] = [c]
            else:
                lst.append(c)
            n = by_queue.get(c.queue)
            if n is None:
                by_queue[c.queue] = {c.priority: 1}
            else:
                n[c.priority] = n.get(c.priority, 0) + 1
        by_fence: Counter[tuple[frozenset[str], int]] = Counter()
        for q, n in by_queue.items():
            f = fences[q]
            for prio, k in n.items():
                by_fence[(f, prio)] += k
        self.by_type = by_type
        self.dead: set[str] = set()
        self._dropped = 0
        self._fences = fences
        self._by_fence = by_fence
        self._by_queue = by_queue
        # (type, gpus per pod, pods) -> (quiet, the stamp it was found at): :meth:`quiet`
        self._quiet: dict[tuple[str, Gpus, int], tuple[bool, tuple[int, int]]] = {}

    def took(self, vid: str, queue: str, priority: int) -> None:
        """``vid`` (of ``queue``, at ``priority``) was taken as a victim."""
        self.taken.add(vid)
        if vid not in self.dead and priority in self._by_queue.get(queue, ()):
            self.kill(vid, queue, priority)      # one of :attr:`all` (its queue lends): counted there

    def kill(self, vid: str, queue: str, priority: int) -> None:
        """``vid`` (of ``queue``, at ``priority``) can no longer be a victim this cycle."""
        self.dead.add(vid)
        self._by_fence[(self._fences[queue], priority)] -= 1
        self._by_queue[queue][priority] -= 1

    def tally(self, w: Workload, fence: frozenset[str]) -> tuple[int, int]:
        """(considered, fenced): the live candidates a search for ``w`` looks at (another queue,
        priority at most ``w``'s), inside ``w``'s fence and across it."""
        considered = fenced = 0
        for (f, prio), n in self._by_fence.items():
            if prio <= w.priority:
                if f == fence:
                    considered += n
                else:
                    fenced += n
        own = self._by_queue.get(w.queue)
        if own:
            considered -= sum(n for prio, n in own.items() if prio <= w.priority)
        return considered, fenced

    def of_type(self, gpu_type: str) -> list[Candidate]:
        """The candidates on ``gpu_type``, less the dead at the front (victims are mostly taken
        from the front: the youngest)."""
        cs = self.by_type.get(gpu_type)
        if not cs:
            return []
        i, n, dead = 0, len(cs), self.dead
        while i < n and cs[i].id in dead:
            i += 1
        del cs[:i]
        return cs

    def quiet(self, cluster: Cluster, ledger: Ledger, index: FreeIndex, gpu_type: str, k: Gpus, pods: int,
              entitled: Mapping[str, Gpus] | None = None) -> bool:
        """Would every search for a gang of ``pods`` x ``k`` on ``gpu_type`` that has no max to
        relieve (so takes only victims on the type) fail, and leave nothing behind: no candidate
        killed, no node's whole free count changed on the way (:meth:`scheduler.placement.Trial.moved`)?
        Then :func:`plan` skips it. Found from every live candidate on the type at once, a superset
        of what any search takes (issue 19: with shares, the same few victims on devices that other
        work holds too were taken, given back and taken again by search after search):

        * even with every one of them given back, the gang does not fit (so no subset makes it fit);
        * doing so changes no node's count of whole free devices: none is a whole gang (the
          first one found ends the look: not quiet), and no device would lose its last share (so
          no subset changes one either);
        * each one's own queue stays at or above its floor even with all of its candidates on the
          type taken away: its guarantee on every resource (:func:`~scheduler.quota.below_floor`)
          and, under ``reclaim: fair_share`` (``entitled``, what :func:`plan` gets), its
          entitlement in GPUs (:func:`~scheduler.quota.below_entitlement`); a search kills a
          candidate only when taking it would drop its own queue below one of them, and takes
          away at most these.

        The live candidates are :attr:`all`'s: work within its minimum runtime is none
        (:func:`candidates` with ``now``), and a search between queues takes a subset of them
        (another queue's, inside the fence, at most the preemptor's priority), so the rule does
        not depend on the preemptor. Kept per shape while the pool's dead and the index are as
        they were; a quiet shape stays quiet (admissions only take capacity and add usage, a
        candidate killed leaves the set, and the entitlements are the cycle's, as the pool is)
        until a preemption, between queues or within one (:meth:`preempted`: a victim on another
        type lowers its queue's usage but not its candidates on this one, and a preemptor smaller
        than its victims frees capacity)."""
        key = (gpu_type, k, pods)
        stamp = (len(self.dead), index.version)
        got = self._quiet.get(key)
        if got is not None and (got[0] or got[1] == stamp):
            return got[0]
        dead = self.dead
        trial = index.trial(gpu_type, k, pods)      # never settled: the index is not touched
        held: dict[str, dict[str, Gpus]] = {}       # queue -> what its candidates hold, summed
        quiet = True
        for c in self.by_type.get(gpu_type, ()):
            if c.id in dead:
                continue
            placement = c.running.placement
            if not placement.shares:                # a whole gang given back moves its nodes
                quiet = False
                break
            trial.release(placement)
            h = held.get(c.queue)
            if h is None:
                h = held[c.queue] = {}
            for res, amt in c.vec:
                h[res] = h.get(res, 0) + amt
        quiet = quiet and not trial.fits() and not trial.moved() and not _may_kill(cluster, ledger, held, entitled)
        self._quiet[key] = (quiet, stamp)
        return quiet

    def preempted(self) -> None:
        """A preemption was decided: no shape is known to be quiet any more."""
        self._quiet.clear()

    def compact(self) -> None:
        if len(self.dead) - self._dropped > len(self.all) // 8:
            dead = self.dead
            self.all = [c for c in self.all if c.id not in dead]
            self.by_type = {t: [c for c in cs if c.id not in dead] for t, cs in self.by_type.items()}
            self._dropped = len(dead)


@dataclass(frozen=True, slots=True)
class Plan:
    gpu_type: str
    victims: tuple[Running, ...]


@dataclass(frozen=True, slots=True)
class NoPlan:
    not_eligible: Shortfall | None   # the guarantee the preemptor's queue would exceed, if that is why
    considered: int                   # candidates tried
    fenced: int                       # candidates skipped only because of a fence
    protected: int = 0                # candidates it could have used but for their minimum runtime
    protected_until: float = 0.0      # when the first of those may be a victim


def plan(
    cluster: Cluster,
    ledger: Ledger,
    index: FreeIndex,
    pool: Pool,
    w: Workload,
    types: tuple[str, ...],
    own: bool = False,
    entitled: Mapping[str, Gpus] | None = None,
) -> Plan | NoPlan:
    """Find victims for ``w`` on the first of ``types`` where a set exists, and apply its removal
    to ``ledger`` and ``index`` (the caller then places ``w``). The search adds to ``pool.dead``
    the victims it takes and the candidates whose own queue is at its floor. On failure nothing
    else is changed. ``own``: victims from ``w``'s own queue only (module docstring, "Within a
    queue"; ``pool.own`` set; no entitlement floor applies there: the queue gives up its own
    work). ``entitled``: the cycle's entitlements under ``reclaim: fair_share``
    (:func:`scheduler.quota.cycle_entitlements`), ``None`` under ``guarantee``."""
    if own:
        return _plan_own(cluster, ledger, index, pool, w, types)
    chain = cluster.chains[w.queue]
    shared = frozenset(chain)
    fence = cluster.fences[w.queue]
    fences = cluster.fences
    dead = pool.dead
    k, pods = w.gpus_per_pod, w.pods
    ineligible: Shortfall | None = None
    considered = fenced = 0
    for t in types:
        vec = demand(w, t, cluster.equivalents)
        s = over_guarantee(cluster, ledger, w.queue, vec)
        if s is not None and not within_entitlement(ledger, w.queue, w.gpus, entitled):
            ineligible = ineligible or s
            continue
        ineligible = None
        taken: list[tuple[Running, Vec]] = []
        saved: Saved = {}                          # the ledger's queues as they were (the undo)
        tally = pool.tally(w, fence)               # counted before the search adds to the dead
        need_quota = _over_max_all(cluster, ledger, w.queue, vec)
        if not need_quota and pool.quiet(cluster, ledger, index, t, k, pods, entitled):
            considered, fenced = considered + tally[0], fenced + tally[1]   # it would fail, changing nothing
            continue
        trial = index.trial(t, k, pods)            # the index changes once the search is settled
        need_nodes = not trial.fits()
        # need_quota only shrinks as victims go: with no max to relieve, only type-t victims help
        for vid, vq, vprio, vtype, vv, r in pool.all if need_quota else pool.of_type(t):
            if vid in dead or vq == w.queue or vprio > w.priority or fences[vq] != fence:
                continue
            if not ((need_nodes and vtype == t) or (need_quota and _shares(cluster, need_quota, vq, vv))):
                continue
            short = below_floor(cluster, ledger, vq, vv, shared)
            if short is None and entitled is not None:
                short = below_entitlement(cluster, ledger, vq, vv, shared, entitled)
            if short is not None:
                if short.queue == vq:
                    pool.kill(vid, vq, vprio)   # its own queue is at its floor: no preemptor can take it
                continue
            ledger.remove_saving(cluster.chains[vq], vv, saved)
            trial.release(r.placement)
            taken.append((r, vv))
            need_nodes = not trial.fits()
            if need_quota:                       # what is over a max stays so or drops out
                need_quota = _still_over(cluster, ledger, need_quota, vec)
            if not need_nodes and not need_quota:
                break
        else:                                    # undo: no set on this type
            ledger.restore(saved)
            trial.abandon()
            considered, fenced = considered + tally[0], fenced + tally[1]
            continue
        for j in range(len(taken) - 2, -1, -1):      # give back what is not needed
            r, vv = taken[j]
            ledger.add(cluster.chains[r.workload.queue], vv)
            trial.take(r.placement)
            if trial.fits() and over_max(cluster, ledger, w.queue, vec) is None:
                del taken[j]
            else:
                ledger.remove(cluster.chains[r.workload.queue], vv)
                trial.release(r.placement)
        trial.commit()
        pool.preempted()
        for r, _ in taken:
            pool.took(r.workload.id, r.workload.queue, r.workload.priority)
        return Plan(t, tuple(r for r, _ in taken))
    n, first = _protected_for(pool, w, fence, fences, own=False)
    return NoPlan(ineligible, considered, fenced, n, first)


def _plan_own(cluster: Cluster, ledger: Ledger, index: FreeIndex, pool: Pool, w: Workload,
              types: tuple[str, ...]) -> Plan | NoPlan:
    """:func:`plan` within ``w``'s own queue: its candidates of strictly lower priority, in
    candidate order, added until ``w`` fits (every max on its chain, its gang on one type), then
    each but the last given back if ``w`` still fits without it. No guarantee or floor applies.
    On a :class:`~scheduler.placement.Trial` of the index and undone by restoring the ledger's
    queues, as :func:`plan` (the same steps, the same decisions); never skipped (:meth:`Pool.quiet`
    speaks of the search between queues)."""
    assert pool.own is not None
    cands = [c for c in pool.own.get(w.queue, ()) if c.priority < w.priority]
    taken_ids, chain = pool.taken, cluster.chains[w.queue]
    k, pods = w.gpus_per_pod, w.pods
    considered = 0
    for t in types:
        vec = demand(w, t, cluster.equivalents)
        taken: list[tuple[Running, Vec]] = []
        saved: Saved = {}                          # the ledger's queues as they were (the undo)
        trial = index.trial(t, k, pods)            # the index changes once the search is settled
        need_nodes = not trial.fits()
        need_quota = _over_max_all(cluster, ledger, w.queue, vec)
        live = [c for c in cands if c.id not in taken_ids]
        considered = max(considered, len(live))
        for c in live:
            if not ((need_nodes and c.gpu_type == t) or (need_quota and _shares(cluster, need_quota, c.queue, c.vec))):
                continue
            ledger.remove_saving(chain, c.vec, saved)
            trial.release(c.running.placement)
            taken.append((c.running, c.vec))
            need_nodes = not trial.fits()
            if need_quota:                       # what is over a max stays so or drops out
                need_quota = _still_over(cluster, ledger, need_quota, vec)
            if not need_nodes and not need_quota:
                break
        else:                                    # undo: no set on this type
            ledger.restore(saved)
            trial.abandon()
            continue
        for j in range(len(taken) - 2, -1, -1):      # give back what is not needed
            r, vv = taken[j]
            ledger.add(chain, vv)
            trial.take(r.placement)
            if trial.fits() and over_max(cluster, ledger, w.queue, vec) is None:
                del taken[j]
            else:
                ledger.remove(chain, vv)
                trial.release(r.placement)
        trial.commit()
        pool.preempted()                         # its victims may free more than its preemptor takes
        for r, _ in taken:
            pool.took(r.workload.id, r.workload.queue, r.workload.priority)
        return Plan(t, tuple(r for r, _ in taken))
    n, first = _protected_for(pool, w, cluster.fences[w.queue], cluster.fences, own=True)
    return NoPlan(None, considered, 0, n, first)


def _protected_for(pool: Pool, w: Workload, fence: frozenset[str], fences: Mapping[str, frozenset[str]],
                   own: bool) -> tuple[int, float]:
    """(how many, the earliest end of protection) of the candidates within their minimum runtime
    that a search for ``w`` could have taken: another queue's inside its fence at a priority at
    most its own, or (``own``) its own queue's of strictly lower priority."""
    n, first = 0, 0.0
    for end, c in pool.protected:
        if own:
            ok = c.queue == w.queue and c.priority < w.priority
        else:
            ok = c.queue != w.queue and c.priority <= w.priority and fences[c.queue] == fence
        if ok:
            first = end if n == 0 or end < first else first
            n += 1
    return n, first


def _may_kill(cluster: Cluster, ledger: Ledger, held: Mapping[str, Mapping[str, Gpus]],
              entitled: Mapping[str, Gpus] | None) -> bool:
    """Could a search kill a candidate: would some queue drop below its floor if all of ``held``
    (queue -> its candidates' usage, summed) were taken away? The floor is what :func:`plan`
    checks a victim's own queue against: its guarantee on each resource (:func:`below_floor`)
    and, under ``reclaim: fair_share``, its entitlement in GPUs (:func:`below_entitlement`)."""
    guarantee = cluster.guarantee
    for q, h in held.items():
        g = guarantee[q]
        for res, amt in h.items():
            limit = g.get(res)
            if limit is not None and ledger.used(q, res) - amt < limit:
                return True
        if entitled is not None and ledger.used(q, "gpu") - h.get("gpu", 0) < entitled.get(q, 0):
            return True
    return False


def _over_max_all(cluster: Cluster, ledger: Ledger, queue: str, vec: Vec) -> list[tuple[str, str]]:
    """Every (queue, resource) on ``queue``'s chain whose max ``vec`` would break."""
    out = []
    queues = cluster.config.queues
    for q in cluster.chains[queue]:
        limits = queues[q].max
        if limits:
            for key, amt in vec:
                m = limits.get(key)
                if m is not None and ledger.used(q, key) + amt > m:
                    out.append((q, key))
    return out


def _still_over(cluster: Cluster, ledger: Ledger, need: list[tuple[str, str]], vec: Vec) -> list[tuple[str, str]]:
    """Those of ``need`` (:func:`_over_max_all`'s) that ``vec`` still breaks: what :func:`_over_max_all`
    says after victims left, since usage only went down (a max kept is never broken again)."""
    queues, amounts = cluster.config.queues, dict(vec)
    return [(q, key) for q, key in need if ledger.used(q, key) + amounts[key] > queues[q].max[key]]


def _shares(cluster: Cluster, need: list[tuple[str, str]], victim_queue: str, vv: Vec) -> bool:
    """Does taking ``vv`` from ``victim_queue`` relieve one of the maxes in ``need``? Relief only
    grows as victims are added, so a candidate that does not help now never will."""
    if not need:
        return False
    chain = cluster.chains[victim_queue]
    return any(q in chain and any(key == k for k, _ in vv) for q, key in need)
