"""Start-time forecasts at the live service's cost: one event-driven pass, three paths.

:class:`scheduler.forecast.Forecaster` runs the production core forward, 16 times, through every
cycle until each target starts: faithful, but 25 s of CPU at 10,000 pending (docs/PERFORMANCE.md,
"Start-time forecasts"), where the live refresh has 1 s. :class:`Timeline` keeps what decides a
start and drops the cycle's overheads:

- the **same inputs**: the state after the present cycle (the core's own decisions at ``now``,
  :func:`scheduler.forecast.after_first`), durations from the same :class:`DurationModel`
  (declared ``expected_duration``, the observed running times of finished work like it with the
  running ones censored, its kinds), never a workload's true duration;
- the **same rules, event by event** instead of cycle by cycle: the clock jumps from one finish
  (or preemption-delay expiry) to the next, on the scheduler's grid; at each, queues are served
  lowest fair share first (:func:`scheduler.ordering.queue_key`; with fair share over time
  :func:`~scheduler.ordering.scored_key`, each queue's score held at its value now over the
  whole horizon: it moves by hours, a forecast looks ahead by minutes), each queue's workloads in
  workload order, the first that fits its queue chain's maxes (:func:`scheduler.quota.over_max`)
  and a best-fit gang placement (:class:`scheduler.placement.FreeIndex`, the core's own) starts,
  a ``strict_fifo`` queue's head blocking the rest; a workload within its queue's guarantee whose
  preemption delay has passed reclaims GPUs from preemptible work of queues above their
  guarantee (the core's victim order, :func:`scheduler.preemption.candidate_key`, and floor,
  :func:`scheduler.quota.below_floor`), and a victim waits again with what it has done (kept
  when it checkpoints). Issue 21's rules as the core has them: under ``reclaim: fair_share`` a
  workload within its queue's entitlement reclaims too and no victim's queue goes below its own
  (:func:`scheduler.quota.within_entitlement`, :func:`~scheduler.quota.below_entitlement`), the
  entitlements the core's own division (:func:`scheduler.quota.divide_entitlements`) of each
  queue's demand, kept as work finishes and divided again at the first pass after a finish (a
  start or a preemption leaves the demand as it was), only where the changed demands reach
  (:func:`scheduler.quota.entitlement_division`); a queue with ``within_queue:
  lower_priority`` that finds no victims elsewhere preempts its own strictly lower-priority work;
  work within its queue's ``min_runtime_s`` is no victim, and a search it kept from succeeding is
  tried again when the first such victim may be taken;
- **one pass, three paths** instead of sampled runs. The pass decides on the middle path's
  durations (:class:`_Quantiles`: each at its own quantile, spread evenly over the running and
  over the pending work by the sampler passed in; at the median without one); its start is the
  forecast's p50. Each start's low and high times are carried along its critical path: it
  starts, on the low path, when the finish that made room for it ends on the low path (plus the
  same wait for the grid), and ends its own run at its low-path duration; durations there are
  shifted by the normal score of :data:`LOW` (and of :data:`HIGH` on the high path). All durations
  shifted together move every start the same way, as an error of the whole workload mix would:
  what the 16 runs' sampled durations could not (they average out over a deep queue; their
  interval came out far too narrow, coverage 0.34 to 0.64 where 0.8 was the aim). The levels are
  the forecast's own quantiles, not fitted (``benchmarks/bench_eta.py``, docs/PERFORMANCE.md).

What it leaves out, against the core: the policy's refusals that a workload meets once (a
non-preemptible workload over its guarantee, the victim search's quota relief across queues), a
victim search's full length (it gives up after freeing four times the GPUs it needs, and is
tried again a preemption delay later) and its give-back of victims not needed, the order of
victims among equals, and work that will arrive later (nor its demand in the entitlements) (which makes every forecast lean early; the high path covers some of it). The check
against the core is ``tests/test_timeline.py`` (with every duration at its median, the same
starts as the core run forward, on every example scenario) and the backtest.

Cost: one pass over the finishes ahead of the last target, each event a few heap operations
and the placement of what starts; no cycle, no reasons, no snapshot: 0.7 s of CPU at 10,000
pending and 3.9 s at 50,000 (docs/PERFORMANCE.md, "The live refresh's cost").
"""
from __future__ import annotations

import heapq
import math
from bisect import bisect_left, insort
from itertools import chain
from collections.abc import Iterable, Mapping
from dataclasses import replace
from statistics import NormalDist

from scheduler.cycle import acceptable_types, schedule
from scheduler.forecast import EPS, DurationModel, Durations, Eta, Sampler, Present, after_first
from scheduler.memo import CycleMemo
from scheduler.model import Decisions, Gpus, Placement, Running, Workload
from scheduler.ordering import QueueKey, ScoredKey, queue_key, queue_scores, scored_key
from scheduler.placement import FreeIndex
from scheduler.preemption import QueueRank, min_runtimes, protected_until, queue_ranks
from scheduler.quota import (
    Ledger,
    below_entitlement,
    below_floor,
    demand_want,
    entitlement_division,
    over_guarantee,
    over_guarantee_pinned,
    over_max,
    Vec,
    queue_demand,
    within_entitlement,
)
from accounting.queues import GPU_EQ
from scheduler.snapshot import FAIR_SHARE, UNBOUNDED, Cluster, Settings, Snapshot, demand

LOW, MID, HIGH = 0.1, 0.5, 0.9
"""The forecast's quantiles (p10, p50, p90): the paths' duration levels (:class:`_Quantiles`)."""
BINS = 32
"""Pending work's middle-path quantiles come in this many bins (durations drawn once per bin)."""

_Shape = tuple[tuple[str, ...], Gpus, int]          # types, gpus per pod, pods
_SORTED = 256
"""A victim search sorts the entries of the lists it may take from up to this many, and merges
more (``heapq.merge``: what it reads, not all)."""
_NORMAL = NormalDist()


class Timeline:
    """Forecasts for one cluster, :meth:`forecast` with the signature of
    :meth:`scheduler.forecast.Forecaster.forecast`. It keeps a copy of the cluster whose memo the
    present cycle uses when the caller has not run it (the caller's memo is never touched)."""

    def __init__(self, cluster: Cluster, interval_s: float,
                 levels: tuple[float, float, float] = (LOW, MID, HIGH), spread: bool = True) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        if not 0 < levels[0] <= levels[1] <= levels[2] < 1:
            raise ValueError("levels must rise within (0, 1)")
        self.cluster = replace(cluster, memo=CycleMemo())
        self.interval_s = interval_s
        self.levels = levels
        self.spread = spread
        self.events = 0                  # timeline events, over all forecasts (for benchmarks)

    def forecast(self, snap: Snapshot, now: float, model: DurationModel, sampler: Sampler | None = None, *,
                 targets: Iterable[str] | None = None, done_s: Mapping[str, float] | None = None,
                 first: Decisions | None = None, arrivals: object = None, cycle: bool = True) -> dict[str, Eta]:
        """The start-time forecast of each of ``targets`` (default: all pending), as
        :meth:`scheduler.forecast.Forecaster.forecast`. ``sampler`` spreads the middle path's
        quantiles (:class:`_Quantiles`; without one, every duration at its level); ``arrivals`` is
        accepted for the same signature and not used. ``cycle=False`` (the live
        service, whose last cycle's decisions are in ``snap`` already): no present cycle is run
        when ``first`` is not given; the timeline serves at ``now`` first instead, and what starts
        there is forecast at the next cycle, somewhere in ``(now, now + interval_s]``."""
        want = frozenset(w.id for w in snap.pending) if targets is None else frozenset(targets)
        own = replace(snap, cluster=self.cluster, changes=None)
        serve_now = first is None and not cycle
        if first is None:
            first = schedule(own, now) if cycle else Decisions(now, (), (), ())
        done_s = done_s or {}
        base, out = after_first(own, now, first, want, done_s)
        if not base.targets:
            return out
        unfinished = [(r.workload, base.done.get(r.workload.id, 0.0)) for r in base.running]
        unfinished += [(w, d) for w in base.pending if (d := base.done.get(w.id, 0.0)) > 0]
        durations = model.present(unfinished)
        dt = self.interval_s
        for wid, (lo, mid, hi) in self._run(own, base, durations, serve_now, sampler).items():
            if wid not in base.targets or math.isinf(hi):
                continue
            if serve_now and mid <= now + EPS:
                out[wid] = Eta(now, now + dt / 2, now + dt)     # at the next cycle, within an interval
            else:
                out[wid] = Eta(min(lo, mid), mid, max(hi, mid))
        return out

    def _run(self, snap: Snapshot, base: Present, durations: Durations, serve_now: bool,
             sampler: Sampler | None) -> dict[str, tuple[float, float, float]]:
        """The timeline: target id -> its start on the low, middle and high paths."""
        quantiles = _Quantiles(self.levels, base, sampler if self.spread else None)
        run = _Run(self.cluster, snap.settings, base, durations, quantiles, snap.usage)
        starts = run.go(self.interval_s, serve_now)
        self.events += run.events
        return starts


class _Quantiles:
    """The quantile each duration is drawn at on the low, middle and high paths.

    Without a sampler, every duration at ``levels`` (its median in the middle). With one (what
    the service and the simulator pass), the middle path is a stratified sample of one: the
    running workloads' quantiles spread evenly over (0, 1) in an order the sampler draws, and so
    are the pending ones' (in :data:`BINS` bins, so that durations are still drawn once per
    distribution and bin). A start that waits for the first of many finishes then sees an early
    one, as it would, and a start behind many sees their sum near its mean, not the sum of their
    medians (which the all-median path gave: far too late where one of many running pods frees
    the room, 1.27 against 0.69 relative error on the Alibaba replay; docs/PERFORMANCE.md). The
    low and high paths shift each workload's normal score by the levels' (-1.28 and +1.28 for
    0.1 and 0.9): the whole mix shorter or longer together, as on the all-median path."""

    __slots__ = ("levels", "shift_lo", "shift_hi", "us")

    def __init__(self, levels: tuple[float, float, float], base: Present, sampler: Sampler | None) -> None:
        self.levels = levels
        zmid = _NORMAL.inv_cdf(levels[1])
        self.shift_lo = _NORMAL.inv_cdf(levels[0]) - zmid
        self.shift_hi = _NORMAL.inv_cdf(levels[2]) - zmid
        self.us: dict[str, tuple[float, float, float]] = {}
        if sampler is None:
            return
        running = sorted(r.workload.id for r in base.running)
        for i, wid in zip(_permutation(len(running), sampler), running, strict=True):
            self.us[wid] = self._three((i + 0.5) / len(running))
        pending = sorted(w.id for w in base.pending)
        for i, wid in zip(_permutation(len(pending), sampler), pending, strict=True):
            self.us[wid] = self._three(((i * BINS) // len(pending) + 0.5) / BINS)

    def _three(self, u: float) -> tuple[float, float, float]:
        z = _NORMAL.inv_cdf(u)
        return (_NORMAL.cdf(z + self.shift_lo), u, _NORMAL.cdf(z + self.shift_hi))

    def of(self, wid: str) -> tuple[float, float, float]:
        got = self.us.get(wid)
        return self.levels if got is None else got


def _permutation(n: int, sampler: Sampler) -> list[int]:
    perm = list(range(n))
    for i in range(n - 1, 0, -1):                 # Fisher-Yates
        j = min(int(sampler.random() * (i + 1)), i)
        perm[i], perm[j] = perm[j], perm[i]
    return perm


class _Run:
    """The state of one timeline (:meth:`Timeline._run`).

    Pending work is kept per queue and shape (types, GPUs per pod, pods), each list in workload
    order and consumed from the front, so a queue's candidates are its shapes' heads. What a
    pass over the queues would recompute is cached and dropped when its inputs change: whether
    a shape fits the free GPUs (dropped when any GPU is taken or freed), each queue's key (when
    its usage changes), a queue's failed victim search (until new work borrows, or its own usage
    drops). A pass considers only the queues with a shape that fits, and those that may reclaim."""

    def __init__(self, cluster: Cluster, settings: Settings, base: Present,
                 durations: Durations, quantiles: _Quantiles, usage: Mapping[str, float] | None = None) -> None:
        self.cluster, self.durations, self.quantiles = cluster, durations, quantiles
        # fair share over time: the queues' scores as the snapshot has them, held over the horizon
        self.scores = None if usage is None else queue_scores(cluster, usage)
        self.now = base.now
        preemption = settings.preemption
        self.delay = settings.preemption_delay_s if preemption else math.inf
        # the queues whose pending work may preempt their own lower-priority work (within_queue),
        # and the minimum runtimes that keep work from being a victim (both rules of issue 21)
        self.within = frozenset(q for q, cfg in cluster.config.queues.items() if cfg.within_queue) \
            if preemption else frozenset()
        self.mins = min_runtimes(cluster)
        # reclaim: fair_share: each queue's demand (running plus pending GPUs of its subtree,
        # scheduler.quota.queue_demand), kept as work finishes (only a finish changes it), and the
        # entitlements divided from it (the core's division, scheduler.quota.entitlement_division),
        # found again at the first pass after a finish: as the core, once per cycle and never per
        # candidate; only the levels of the tree that the finishes' queues reach are divided again.
        # None under reclaim: guarantee
        self.entitled: Mapping[str, Gpus] | None = None
        self.qdemand: dict[str, Gpus] = {}
        self.redemand: set[str] = set()            # the queues whose demand changed since
        if preemption and settings.reclaim == FAIR_SHARE:
            pend: dict[str, Gpus] = {}
            for w in base.pending:
                pend[w.queue] = pend.get(w.queue, 0) + w.gpus
            self.qdemand = queue_demand(cluster, Ledger(base.occupancy.usage), pend)
            self.division = entitlement_division(cluster, self.qdemand, cluster.memo)
            self.entitled = self.division.of
        self.free = FreeIndex(cluster, base.occupancy.node_free, base.occupancy.levels, base.occupancy.partial)
        self.ledger = Ledger(base.occupancy.usage)
        self.cache: dict[tuple[object, float], tuple[float, float, float]] = {}
        self.done = dict(base.done)
        self.tot: dict[str, tuple[float, float, float]] = {}
        self.running: dict[str, tuple[Running, float, int]] = {}     # id -> (run, end, seq)
        self.bounds: dict[str, tuple[float, float]] = {}              # id -> its end (low, high)
        self.heap: list[tuple[float, int, str]] = []
        self.seq = 0
        now = self.now
        for r in base.running:
            wid = r.workload.id
            d = self.done.get(wid, 0.0)
            self.tot[wid] = (lo, mid, hi) = self.total(r.workload, d)
            self.seq += 1
            end = now + max(mid - d, 0.0)
            self.running[wid] = (r, end, self.seq)
            self.bounds[wid] = (now + max(lo - d, 0.0), now + max(hi - d, 0.0))
            self.heap.append((end, self.seq, wid))
        heapq.heapify(self.heap)
        # preemptible running work per GPU type, queue, priority and size in GPUs, each list in
        # reverse victim order (read from the end; what stops leaves its list, an empty list and
        # level are dropped). A search merges only the lists its victims may come from: between
        # queues, those of the queues above their guarantee (or entitlement) in its fence, of no
        # higher priority than the preemptor's, and of sizes that leave the queue at its floor or
        # above (while no minimum runtime is in play); within a queue, its own of lower priority.
        # The same victims in the same order as a scan of the type's whole list, without reading
        # the work a search passes over (under fair_share most of it: 3,604 searches at 10,000
        # pending, docs/PERFORMANCE.md)
        self.victims: dict[str, dict[str, dict[int, dict[Gpus, list[tuple[_VKey, str]]]]]] = {}
        self.vkeys: dict[str, _VKey] = {}
        self.ranks = queue_ranks(cluster)
        for r in base.running:
            w_ = r.workload
            if w_.preemptible:
                k = self.vkeys[w_.id] = _victim_key(r, self.running[w_.id][2], self.ranks)
                self.victims.setdefault(r.placement.gpu_type, {}).setdefault(w_.queue, {}).setdefault(
                    w_.priority, {}).setdefault(w_.pods * w_.gpus_per_pod, []).append((k, w_.id))
        for by_queue in self.victims.values():
            for by_prio in by_queue.values():
                for by_size in by_prio.values():
                    for lst in by_size.values():
                        lst.sort()
        # which of those lists a search between queues may take from, found again only for the
        # queues whose usage, floor or lists changed since the last search (:meth:`_past_floor`):
        # (type, priority) -> the queues above their guarantee (or entitlement) with a list of that
        # type and priority of a size that leaves them at their floor or above (any size where a
        # minimum runtime is in play); per such queue its usage and floor then
        self.past: dict[tuple[str, int], set[str]] = {}
        self.past_of: dict[str, set[tuple[str, int]]] = {}
        self.floors: dict[str, tuple[Gpus, Gpus]] = {}
        self.unsorted: set[str] = set()         # the queues to place again (:meth:`_past_floor`)
        self.pend: dict[tuple[str, _Shape], list[Workload]] = {}
        self.heads: dict[tuple[str, _Shape], int] = {}
        self.qshapes: dict[str, set[_Shape]] = {}
        self.shape_queues: dict[_Shape, set[str]] = {}
        for w in sorted(base.pending, key=_order):
            self.pend.setdefault((w.queue, _shape(cluster, w)), []).append(w)
        for (q, s) in self.pend:
            self.heads[(q, s)] = 0
            self.qshapes.setdefault(q, set()).add(s)
            self.shape_queues.setdefault(s, set()).add(q)
        self.strict = frozenset(q for q, cfg in cluster.config.queues.items() if cfg.strict_fifo)
        self.expiry = [(w.submit_s + self.delay, w.id) for w in base.pending
                       if self.now + EPS < w.submit_s + self.delay < math.inf]
        heapq.heapify(self.expiry)
        self.left = set(base.targets)
        self.starts: dict[str, tuple[float, float, float]] = {}
        self.trigger = (now, now, now)         # the event being served: (its time, low, high)
        self.fit: dict[_Shape, bool] = {}
        self.slots: dict[tuple[str, Gpus], int] = {}    # pods of a size that fit a type, while free is unchanged
        self.keys: dict[str, QueueKey | ScoredKey] = {}
        # the queues with pending work by key, kept between passes: an entry is current while its
        # number is the queue's in ``qver`` (a queue whose key changes is pushed again)
        self.qheap: list[tuple[QueueKey | ScoredKey, int, str]] = []
        self.qver: dict[str, int] = {}
        self.qseq = 0
        # queue -> (time, own, protected) of its last failed victim search: when, its ``own`` count
        # then, and when the first candidate that only its minimum runtime kept out may be a victim
        self.failed: dict[str, tuple[float, int, float]] = {}
        self.own: dict[str, int] = {}                      # per queue: rises when its usage drops
        self.qheads: dict[str, list[tuple[tuple[int, float, str], Workload, _Shape]]] = {}   # shapes' heads, in order
        # the leaf queues under their guarantee of GPUs (their work may reclaim) and above it (their
        # preemptible work may be reclaimed), kept by _track at every change of their usage
        self.below: set[str] = set()
        self.over: set[str] = set()
        self.leaves = tuple(cluster.config.leaves())
        self.leafset = frozenset(self.leaves)
        for q in self.leaves:
            self._track(q)              # (and enters each queue with pending work in the heap)
        self.events = 0

    def total(self, w: Workload, done: float) -> tuple[float, float, float]:
        """``w``'s total running time on the low, middle and high paths, given ``done`` seconds run
        (:class:`_Quantiles`)."""
        d = self.durations
        shared = d.shared(w)
        lo, mid, hi = self.quantiles.of(w.id)
        if done > 0:
            return (d.total(w, done, lo, lo if shared else None), d.total(w, done, mid, mid if shared else None),
                    d.total(w, done, hi, hi if shared else None))
        key = (d.fresh_key(w, shared), mid)
        x = self.cache.get(key)
        if x is None:
            x = self.cache[key] = (d.total(w, 0.0, lo, lo if shared else None),
                                   d.total(w, 0.0, mid, mid if shared else None),
                                   d.total(w, 0.0, hi, hi if shared else None))
        return x

    def push(self, q: str) -> None:
        """(Re)enter ``q`` in the queue heap at its key now, when it has pending work."""
        if self.qshapes.get(q):
            self.qseq += 1
            self.qver[q] = self.qseq
            heapq.heappush(self.qheap, (self.key(q), self.qseq, q))

    def key(self, q: str) -> QueueKey | ScoredKey:
        k = self.keys.get(q)
        if k is None:
            k = self.keys[q] = (queue_key(self.cluster, self.ledger, q) if self.scores is None
                                else scored_key(self.cluster, self.ledger, q, self.scores))
        return k

    def shape_fits(self, s: _Shape) -> bool:
        f = self.fit.get(s)
        if f is None:
            types, gpp, pods = s
            slots = self.slots
            f = False
            for t in types:
                n = slots.get((t, gpp))
                if n is None:
                    n = slots[(t, gpp)] = self.free.slots(t, gpp, 1 << 30)
                if n >= pods:
                    f = True
                    break
            self.fit[s] = f
        return f

    def _track(self, q: str) -> None:
        """``q``'s usage changed: its place among the queues below and above their guarantee, and
        in the queue heap (its key)."""
        self._classify(q)
        self.keys.pop(q, None)
        self.push(q)

    def _classify(self, q: str) -> None:
        """``q``'s place in :attr:`below` (its work may look for victims) and :attr:`over` (its
        preemptible work may be one): below or above its guarantee; under ``reclaim: fair_share``
        also below its entitlement, and above it as well as its guarantee (the core's preemptor
        and victim rules, :func:`scheduler.quota.within_entitlement` and
        :func:`~scheduler.quota.below_entitlement`, checked exactly in :meth:`reclaim`)."""
        key = "gpu" if self.cluster.gpu_guarantee[q] != UNBOUNDED else GPU_EQ   # what its guarantee is in
        used, g = self.ledger.used(q, key), self.cluster.guarantee[q].get(key, 0)
        over, below = used > g, used < g
        ent = self.entitled
        if ent is not None:
            e, gpus = ent.get(q, 0), self.ledger.used(q, "gpu")
            over, below = over and gpus > e, below or gpus < e
        (self.over.add if over else self.over.discard)(q)
        (self.below.add if below else self.below.discard)(q)
        self.unsorted.add(q)

    def _past_floor(self) -> None:
        """Place each queue in :attr:`unsorted` again in :attr:`past`: its usage, floor or victim
        lists may have changed (the lists change only with its usage). What a search between
        queues reads first; the search's own checks, per victim, are the core's."""
        ledger, victims, past, mins, ent = self.ledger, self.victims, self.past, self.mins, self.entitled
        guarantee = self.cluster.guarantee
        for q in self.unsorted:
            now: set[tuple[str, int]] = set()
            if q in self.over:
                floor = guarantee[q].get("gpu", 0)
                if ent is not None:
                    floor = max(floor, ent.get(q, 0))
                used = ledger.used(q, "gpu")
                self.floors[q] = (used, floor)
                protected = q in mins    # a protected candidate lowers the search's ``first``: any size
                for t_, by_queue in victims.items():
                    for p, by_size in by_queue.get(q, {}).items():
                        if protected or not used - min(by_size) < floor:
                            now.add((t_, p))
            was = self.past_of.get(q, set())
            if now != was:
                for tp in was - now:
                    past[tp].discard(q)
                for tp in now - was:
                    past.setdefault(tp, set()).add(q)
                self.past_of[q] = now
        self.unsorted.clear()

    def entitle(self) -> None:
        """``reclaim: fair_share``: the entitlements for the demand now, after a finish changed it
        (the same division as the core's cycle, of the levels the changed demands reach), and the
        place in :attr:`below` and :attr:`over` of each leaf whose entitlement changed."""
        qd, cluster = self.qdemand, self.cluster
        changed = self.division.update({q: demand_want(cluster, q, qd.get(q, 0)) for q in self.redemand})
        self.redemand.clear()
        for q in changed:
            if q in self.leafset:
                self._classify(q)

    def start(self, w: Workload, placement: Placement, t: float) -> None:
        self.ledger.add(self.cluster.chains[w.queue], demand(w, placement.gpu_type, self.cluster.equivalents))
        self._track(w.queue)
        self.fit.clear()
        self.slots.clear()
        d = self.done.get(w.id, 0.0)
        t_ = self.tot.get(w.id)
        if t_ is None:
            t_ = self.tot[w.id] = self.total(w, d)
        lo, mid, hi = t_
        self.seq += 1
        end = t + max(mid - d, 0.0)
        self.running[w.id] = (Running(w, placement, t), end, self.seq)
        if w.preemptible:
            k = self.vkeys[w.id] = _victim_key(self.running[w.id][0], self.seq, self.ranks)
            insort(self.victims.setdefault(placement.gpu_type, {}).setdefault(w.queue, {}).setdefault(
                w.priority, {}).setdefault(w.pods * w.gpus_per_pod, []), (k, w.id))
        at, t_lo, t_hi = self.trigger          # the start on the low and high paths: after the
        s_lo, s_hi = t_lo + (t - at), t_hi + (t - at)      # finish that made room, there
        self.bounds[w.id] = (s_lo + max(lo - d, 0.0), s_hi + max(hi - d, 0.0))
        heapq.heappush(self.heap, (end, self.seq, w.id))
        if w.id in self.left:
            self.left.discard(w.id)
            self.starts[w.id] = (s_lo, t, s_hi)

    def stop(self, wid: str, t: float, finished: bool) -> None:
        r, end, _ = self.running.pop(wid)
        w = r.workload
        self.free.release(r.placement)
        self.ledger.remove(self.cluster.chains[w.queue], demand(w, r.placement.gpu_type, self.cluster.equivalents))
        self._track(w.queue)
        self.own[w.queue] = self.own.get(w.queue, 0) + 1
        self.fit.clear()
        self.slots.clear()
        k = self.vkeys.pop(wid, None)
        if k is not None:                  # out of its victim list (a short one: its queue's, of its kind)
            by_queue = self.victims[r.placement.gpu_type]
            by_prio = by_queue[w.queue]
            by_size = by_prio[w.priority]
            size = w.pods * w.gpus_per_pod
            vl = by_size[size]
            del vl[bisect_left(vl, (k, wid))]
            if not vl:
                del by_size[size]
                if not by_size:
                    del by_prio[w.priority]
                    if not by_prio:
                        del by_queue[w.queue]
        if finished:
            if self.entitled is not None:          # its GPUs leave its queues' demand
                qd, gone = self.qdemand, w.gpus
                for a in self.cluster.chains[w.queue][:-1]:
                    left = qd[a] - gone
                    if left:
                        qd[a] = left
                    else:
                        del qd[a]
                    self.redemand.add(a)
            return
        self.bounds.pop(wid, None)
        if w.checkpoint:
            self.done[wid] = self.tot[wid][1] - (end - t)
        else:
            self.done.pop(wid, None)
        s = _shape(self.cluster, w)
        lst = self.pend.setdefault((w.queue, s), [])
        insort(lst, w, lo=self.heads.setdefault((w.queue, s), 0), key=_order)    # waits again, in order
        self.qheads.pop(w.queue, None)
        self.qshapes.setdefault(w.queue, set()).add(s)
        self.shape_queues.setdefault(s, set()).add(w.queue)
        self.push(w.queue)
        if self.now + EPS < w.submit_s + self.delay < math.inf:
            heapq.heappush(self.expiry, (w.submit_s + self.delay, wid))

    def consume(self, q: str, s: _Shape) -> None:
        """The head of ``q``'s shape ``s`` started: the next one of the shape becomes its head."""
        k = self.heads[(q, s)] + 1
        lst = self.pend[(q, s)]
        hs = self.qheads.get(q)
        if hs is not None:
            w = lst[k - 1]
            del hs[bisect_left(hs, (w.order_key,))]
            if k < len(lst):
                nxt = lst[k]
                insort(hs, (nxt.order_key, nxt, s))
        if k >= len(lst):
            del self.pend[(q, s)], self.heads[(q, s)]
            self.qshapes[q].discard(s)
            self.shape_queues[s].discard(q)
        elif k > 64 and k * 2 > len(lst):
            del lst[:k]
            self.heads[(q, s)] = 0
        else:
            self.heads[(q, s)] = k

    def try_place(self, w: Workload, types: tuple[str, ...]) -> Placement | None:
        for t_ in types:
            if not self.free.fits(t_, w.gpus_per_pod, w.pods):
                continue
            vec = demand(w, t_, self.cluster.equivalents)
            if over_max(self.cluster, self.ledger, w.queue, vec) is not None:
                continue
            # the core's rule of issue 17: non-preemptible work only within its queue's guarantee
            if not w.preemptible and over_guarantee_pinned(self.cluster, self.ledger, w.queue, vec) is not None:
                continue
            return self.free.place(t_, w.gpus_per_pod, w.pods)
        return None

    def reclaim(self, w: Workload, t: float) -> Placement | None:
        """Victims for ``w`` (its delay passed), as the core looks for them: among the preemptible
        work of queues above their guarantee (under ``fair_share`` above their entitlement too)
        when ``w``'s queue stays within its guarantee (or its entitlement), on each of its types;
        failing that, with ``within_queue``, its own queue's work of strictly lower priority. In
        the core's victim order, past each victim's minimum runtime; applied when a set frees room.
        A failed search notes in :attr:`failed` when the first victim that only a minimum runtime
        kept out may be taken, and the timeline wakes then (the core tries again every cycle)."""
        cluster, ledger, ent = self.cluster, self.ledger, self.entitled
        types = acceptable_types(cluster, w)
        vecs = [(t_, demand(w, t_, cluster.equivalents)) for t_ in types]
        # as the core: non-preemptible only within its guarantee, in either search
        if not w.preemptible:
            vecs = [(t_, vec) for t_, vec in vecs if over_guarantee_pinned(cluster, ledger, w.queue, vec) is None]
        first = math.inf                     # when the first protected candidate may be a victim
        if self.over:
            for t_, vec in vecs:
                if over_guarantee(cluster, ledger, w.queue, vec) is not None \
                        and not within_entitlement(ledger, w.queue, w.gpus, ent):
                    continue
                taken, first = self._search(w, t_, vec, t, first, own=False)
                if taken is not None:
                    return self._apply(w, t_, taken, t)
        if w.queue in self.within:
            for t_, vec in vecs:
                taken, first = self._search(w, t_, vec, t, first, own=True)
                if taken is not None:
                    return self._apply(w, t_, taken, t)
        self.failed[w.queue] = (t, self.own.get(w.queue, 0), first)
        if first < math.inf:
            heapq.heappush(self.expiry, (first, ""))
        return None

    def _search(self, w: Workload, t_: str, vec: Vec, t: float, first: float,
                own: bool) -> tuple[list[Running] | None, float]:
        """One victim search for ``w`` on type ``t_`` (``vec``: its demand there): between queues
        (the guarantee's floor, and the entitlement's under ``fair_share``), or (``own``) within
        ``w``'s queue, of strictly lower priority and bounded by no floor (the core's
        ``scheduler.preemption``). Victims are taken in the victim order until ``w`` fits its
        chain's maxes and one node group, and the trial is undone: the set (``None``: no set within
        the search's budget), and ``first`` lowered to when a candidate kept out only by its
        minimum runtime may be taken."""
        cluster, ledger, free, chains = self.cluster, self.ledger, self.free, self.cluster.chains
        fence = cluster.fences[w.queue]
        shared = frozenset(chains[w.queue])
        guarantee, ent, mins = cluster.guarantee, self.entitled, self.mins
        over, vkeys, running = self.over, self.vkeys, self.running
        taken: list[tuple[Running, Vec]] = []          # each victim of the trial, with its usage
        budget = 4 * w.pods * w.gpus_per_pod          # GPUs a search may free before giving up
        ok = False
        by_queue = self.victims.get(t_, {})
        lists: list[list[tuple[_VKey, str]]] = []
        prio = w.priority
        if own:
            for p, by_size in by_queue.get(w.queue, {}).items():
                if p < prio:
                    lists += by_size.values()
        else:                             # the lists a victim may come from (each checked again below)
            if self.unsorted:
                self._past_floor()
            fences, floors = cluster.fences, self.floors
            for (vt, p), qs in self.past.items():
                if vt != t_ or p > prio:
                    continue
                for vq in qs:
                    if vq == w.queue or fences[vq] != fence:
                        continue
                    by_size = by_queue[vq][p]
                    if vq in mins:        # a protected candidate lowers ``first`` before the floor test
                        lists += by_size.values()
                        continue
                    used, floor = floors[vq]     # only falls during the search: a size kept out now stays out
                    lists += [lst for size, lst in by_size.items() if not used - size < floor]
        order: Iterable[tuple[_VKey, str]]
        if len(lists) == 1:
            order = reversed(lists[0])
        elif sum(map(len, lists)) <= _SORTED:       # few (as a rule): one sort costs less than a merge
            order = sorted(chain.from_iterable(lists), reverse=True)
        else:
            order = heapq.merge(*map(reversed, lists), reverse=True)
        for k, vid in order:
            if vkeys.get(vid) != k:
                continue                  # stopped since (or a later run of it)
            r = running[vid][0]
            vw = r.workload
            vq = vw.queue
            if own:
                if vq != w.queue or vw.priority >= w.priority:
                    continue
            elif vq not in over or vq == w.queue or vw.priority > w.priority or cluster.fences[vq] != fence:
                continue
            if mins:
                until = protected_until(r, mins)
                if until > t + EPS:
                    first = min(first, until)
                    continue              # within its minimum runtime: no victim yet
            if not own:
                floor = guarantee[vq].get("gpu", 0)
                if ent is not None:
                    floor = max(floor, ent.get(vq, 0))
                if ledger.used(vq, "gpu") - vw.pods * vw.gpus_per_pod < floor:
                    continue                  # its queue at its floor (below_floor's first test, quickly)
            vv = demand(vw, t_, cluster.equivalents)
            if not own:
                if below_floor(cluster, ledger, vq, vv, shared) is not None:
                    continue
                if ent is not None and below_entitlement(cluster, ledger, vq, vv, shared, ent) is not None:
                    continue
            ledger.remove(chains[vq], vv)
            free.release(r.placement)
            taken.append((r, vv))
            if free.fits(t_, w.gpus_per_pod, w.pods) and over_max(cluster, ledger, w.queue, vec) is None:
                ok = True
                break
            budget -= vw.pods * vw.gpus_per_pod
            if budget <= 0:
                break
        for r, vv in reversed(taken):       # undo the trial; stop() applies it for real
            ledger.add(chains[r.workload.queue], vv)
            free.take(r.placement)
        return ([r for r, _ in taken] if ok else None), first

    def _apply(self, w: Workload, t_: str, taken: list[Running], t: float) -> Placement | None:
        """Stop ``taken`` (they wait again) and place ``w`` on ``t_``."""
        for r in taken:
            self.stop(r.workload.id, t, finished=False)
        return self.free.place(t_, w.gpus_per_pod, w.pods)

    def serve(self, t: float) -> None:
        """One pass at ``t``: start what fits, lowest fair share first (the queue heap, popped only
        while some shape still fits the free GPUs), then what may reclaim, by key."""
        fitting = [s for s, qs in self.shape_queues.items() if qs and self.shape_fits(s)]
        qheap, qver = self.qheap, self.qver
        popped: list[tuple[QueueKey | ScoredKey, int, str]] = []
        misses = 0
        if self.redemand:
            self.entitle()                      # a finish changed the demand: as the core's cycle
        while fitting and qheap:
            if misses >= 8:                     # the free GPUs may fit nothing any more
                misses = 0
                fitting = [x for x in fitting if self.shape_fits(x)]
                continue
            entry = heapq.heappop(qheap)
            q = entry[2]
            if qver.get(q) != entry[1]:
                continue                        # an older key of the queue
            if not self.qshapes.get(q):
                del qver[q]
                continue
            misses += 1
            for _, w, s in self.candidates(q):
                p = self.try_place(w, s[0]) if self.shape_fits(s) else None
                if p is None and (q in self.below or q in self.within) and self.may_reclaim(q, w, t):
                    p = self.reclaim(w, t)
                if p is not None:
                    self.consume(q, s)
                    self.start(w, p, t)       # pushes the queue again at its new key
                    misses = 0
                    break
            else:
                popped.append(entry)
        for entry in popped:                   # tried and waiting: back, unless pushed anew since
            if qver.get(entry[2]) == entry[1]:
                heapq.heappush(qheap, entry)
        if self.delay == math.inf:
            return
        # the queues that may reclaim (or preempt within) and did not above (nothing fitted any
        # more), by key
        may = self.below | self.within if self.within else self.below
        for _, q in sorted((self.key(q), q) for q in may if self.qshapes.get(q)):
            started = True
            while started and self.qshapes.get(q) and (q in self.below or q in self.within) \
                    and self.may_search(q, t):    # (what may_reclaim asks of the queue, once for all)
                started = False
                for _, w, s in self.candidates(q):
                    if t + EPS < w.submit_s + self.delay:
                        continue                  # its own delay not passed
                    p = self.reclaim(w, t)
                    if p is None:
                        break
                    self.consume(q, s)
                    self.start(w, p, t)
                    started = True
                    break

    def may_reclaim(self, q: str, w: Workload, t: float) -> bool:
        """Whether ``w`` (of ``q``, below its guarantee or entitlement, or preempting within its
        queue) may look for victims at ``t``: its delay has passed, and ``q``'s last search did not
        fail within a delay with nothing changed (nor with a victim kept out by its minimum runtime
        that may be taken now)."""
        if t + EPS < w.submit_s + self.delay:
            return False
        return self.may_search(q, t)

    def may_search(self, q: str, t: float) -> bool:
        """:meth:`may_reclaim`'s test of the queue: ``q``'s last victim search did not fail within a
        delay with nothing changed since (nor with a victim kept out by its minimum runtime that
        may be taken at ``t``)."""
        f = self.failed.get(q)
        return f is None or f[1] != self.own.get(q, 0) or t >= f[0] + self.delay or t + EPS >= f[2]

    def candidates(self, q: str) -> list[tuple[tuple[int, float, str], Workload, _Shape]]:
        """The heads of ``q``'s shapes in workload order (only the first, for a strict FIFO queue)."""
        heads = self.qheads.get(q)
        if heads is None:
            pend, at = self.pend, self.heads
            heads = self.qheads[q] = sorted(
                [(w_.order_key, w_, s_) for s_ in self.qshapes[q] for w_ in (pend[(q, s_)][at[(q, s_)]],)])
        return heads[:1] if q in self.strict else heads

    def go(self, dt: float, serve_now: bool = False) -> dict[str, tuple[float, float, float]]:
        """Serve event by event until every target has started or nothing more frees room;
        at ``now`` too with ``serve_now`` (else the present cycle has served it)."""
        t = now = self.now
        heap, running, expiry = self.heap, self.running, self.expiry
        serve_next = serve_now
        while self.left:
            if serve_next:
                self.serve(t)
                self.events += 1
                if not self.left:
                    break
            while heap and (heap[0][2] not in running or running[heap[0][2]][2] != heap[0][1]):
                heapq.heappop(heap)
            while expiry and expiry[0][0] <= t + EPS:
                heapq.heappop(expiry)
            e = min(heap[0][0] if heap else math.inf, expiry[0][0] if expiry else math.inf)
            if math.isinf(e):
                break                    # nothing more frees room: the rest never start here
            t = now + max(math.ceil((e - now) / dt - EPS), 1) * dt if e > t + EPS else t + dt
            self.trigger = (t, t, t)
            while heap and heap[0][0] <= t + EPS:
                end, n, wid = heapq.heappop(heap)
                cur = running.get(wid)
                if cur is not None and cur[2] == n:
                    self.stop(wid, t, finished=True)
                    lo, hi = self.bounds.pop(wid)
                    self.trigger = (end, lo, hi)       # the last finish before t made the room
            serve_next = True
        return self.starts


_VKey = tuple[tuple[int, ...], bool, int, float, bool, str, int]


def _victim_key(r: Running, seq: int, ranks: Mapping[str, QueueRank]) -> _VKey:
    """:func:`scheduler.preemption.candidate_key` reversed (but for the id among equals): the
    first victim last; ``seq`` tells this run of the workload from an earlier one. ``ranks``:
    :func:`scheduler.preemption.queue_ranks` (all of one length, so negating each priority
    reverses their order)."""
    w = r.workload
    return (tuple(-p for p in ranks[w.queue]), not w.originator, -w.priority, r.start_s, r.idle, w.id, seq)


def _order(w: Workload) -> tuple[int, float, str]:
    return w.order_key



def _shape(cluster: Cluster, w: Workload) -> _Shape:
    return (acceptable_types(cluster, w), w.gpus_per_pod, w.pods)


def live_forecaster(cluster: Cluster, interval_s: float) -> Timeline:
    """The forecaster the live service refreshes its forecasts with (``scheduler/service``): one
    place that chooses the method and its cost, so the service and ``POST /dry-run`` agree."""
    return Timeline(cluster, interval_s)
