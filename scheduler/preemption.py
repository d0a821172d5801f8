"""Preemption: choose a minimal set of victims that lets a pending workload run.

Rules (FORMAT.md and issue 4; each has a test in tests/test_scheduler_preemption.py):

* only for a preemptor whose leaf queue stays at or below its guarantee after admission;
* a victim's leaf queue and each of its ancestors not shared with the preemptor stay at or
  above their guarantee after the victims leave (so victims come only from queues above it);
* victim priority <= preemptor priority; non-preemptible workloads are never victims; no victim
  across a preemption fence (fenced subtrees neither lose nor take by preemption);
* victims are whole gangs; the set is minimal: candidates are added in candidate order until the
  preemptor fits (its quota over its chain and its gang on real nodes of one type), then each
  added victim but the last is given back if the preemptor still fits without it.

Candidate order (first is preempted first): ``(originator, priority, -start_s, not idle, id)``:
non-originators, lower priority, the youngest (least work lost), GPUs the accounting sees idle,
then the stable id. Non-preemptible work is not a candidate at all.

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
from scheduler.quota import Ledger, Saved, Shortfall, Vec, below_floor, over_guarantee, over_max
from scheduler.snapshot import Cluster, demand


def candidate_key(r: Running) -> tuple[bool, int, float, bool, str]:
    w = r.workload
    return (w.originator, w.priority, -r.start_s, not r.idle, w.id)


class Candidate(NamedTuple):
    id: str
    queue: str
    priority: int
    gpu_type: str
    vec: Vec
    running: Running


def candidates(cluster: Cluster, ledger: Ledger, running: Sequence[Running],
               memo: CycleMemo | None = None) -> list[Candidate]:
    """Running workloads that could ever be victims this cycle (preemptible, in a queue above
    its gpu guarantee), in candidate order. With ``memo`` (the cluster's), every preemptible
    running workload is kept in candidate order from one call to the next and only what started
    or stopped since is placed (:func:`_in_order`)."""
    g, eq = cluster.gpu_guarantee, cluster.equivalents
    over = {q for q in cluster.chains if ledger.used(q, "gpu") > g[q]}
    if eq is not None:                 # a queue above its gpu_eq guarantee lends too
        ge = cluster.guarantee
        over |= {q for q in cluster.chains if GPU_EQ in ge[q] and ledger.used(q, GPU_EQ) > ge[q][GPU_EQ]}
    if memo is not None:
        return [c for c in _in_order(memo, running, eq) if c.queue in over]
    rs = [r for r in running if r.workload.preemptible and r.workload.queue in over]
    rs.sort(key=candidate_key)
    return [_candidate(r, eq) for r in rs]


def _candidate(r: Running, eq: Mapping[str, Decimal] | None) -> Candidate:
    w = r.workload
    return Candidate(w.id, w.queue, w.priority, r.placement.gpu_type, demand(w, r.placement.gpu_type, eq), r)


def _in_order(memo: CycleMemo, running: Sequence[Running], eq: Mapping[str, Decimal] | None) -> list[Candidate]:
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
                    k = bisect_left(keys, candidate_key(c.running))
                    del keys[k], cands[k]
            for r in compress(running, map(came.__contains__, map(id, running))):
                if r.workload.preemptible:
                    key = candidate_key(r)
                    k = bisect_left(keys, key)
                    keys.insert(k, key)
                    c = _candidate(r, eq)
                    cands.insert(k, c)
                    by_id[id(r)] = c
            memo.candidates = CandidateOrder(running, ids, keys, cands, by_id)
            return cands
    rs = sorted((r for r in running if r.workload.preemptible), key=candidate_key)
    cands = [_candidate(r, eq) for r in rs]
    if len(ids) == len(running):
        memo.candidates = CandidateOrder(running, ids, [candidate_key(r) for r in rs], cands,
                                         {id(c.running): c for c in cands})
    return cands


class Pool:
    """The cycle's candidates (:func:`candidates`), also split by GPU type, and ``dead``: the ids
    that can no longer be victims this cycle (already preempted, or their own queue is at its
    floor). Dead entries are skipped, and dropped now and then. The live candidates are counted
    by (fence, priority) and by queue, so a failed search counts what it looked at (its reason
    says how many) without a pass over every candidate."""

    __slots__ = ("_by_fence", "_by_queue", "_dropped", "_fences", "_quiet", "all", "by_type", "dead")

    def __init__(self, cands: list[Candidate], fences: Mapping[str, frozenset[str]]) -> None:
        self.all = cands
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

    def quiet(self, cluster: Cluster, ledger: Ledger, index: FreeIndex, gpu_type: str, k: Gpus, pods: int) -> bool:
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
        * each one's own queue stays at or above its guarantee on every resource even with all
          of its candidates on the type taken away (a search kills a candidate only when taking it
          would drop its own queue below; it takes away at most these).

        Kept per shape while the pool's dead and the index are as they were; a quiet shape stays
        quiet (admissions only take capacity and add usage, and a candidate killed leaves the set)
        until a preemption (:meth:`preempted`: a victim on another type lowers its queue's usage
        but not its candidates on this one)."""
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
        quiet = quiet and not trial.fits() and not trial.moved() and not _may_kill(cluster, ledger, held)
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


def plan(
    cluster: Cluster,
    ledger: Ledger,
    index: FreeIndex,
    pool: Pool,
    w: Workload,
    types: tuple[str, ...],
) -> Plan | NoPlan:
    """Find victims for ``w`` on the first of ``types`` where a set exists, and apply its removal
    to ``ledger`` and ``index`` (the caller then places ``w``). The search adds to ``pool.dead``
    the victims it takes and the candidates whose own queue is at its floor. On failure nothing
    else is changed."""
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
        if s is not None:
            ineligible = ineligible or s
            continue
        ineligible = None
        taken: list[tuple[Running, Vec]] = []
        saved: Saved = {}                          # the ledger's queues as they were (the undo)
        tally = pool.tally(w, fence)               # counted before the search adds to the dead
        need_quota = _over_max_all(cluster, ledger, w.queue, vec)
        if not need_quota and pool.quiet(cluster, ledger, index, t, k, pods):
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
            pool.kill(r.workload.id, r.workload.queue, r.workload.priority)
        return Plan(t, tuple(r for r, _ in taken))
    return NoPlan(ineligible, considered, fenced)


def _may_kill(cluster: Cluster, ledger: Ledger, held: Mapping[str, Mapping[str, Gpus]]) -> bool:
    """Could a search kill a candidate: would some queue drop below its guarantee on a resource
    if all of ``held`` (queue -> its candidates' usage, summed) were taken away?"""
    guarantee = cluster.guarantee
    for q, h in held.items():
        g = guarantee[q]
        for res, amt in h.items():
            limit = g.get(res)
            if limit is not None and ledger.used(q, res) - amt < limit:
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
