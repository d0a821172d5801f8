"""Start-time forecasts: when will each pending workload start, with an interval.

A forecast simulates forward from the present through the production core
(:func:`scheduler.cycle.schedule`), the way the simulator replays a scenario: the running work
with the time it has already run, the pending work, the cluster, the settings (preemption, its
delay); cycles on the scheduler's grid, the clock jumping over idle stretches to the next finish,
arrival or preemption-delay expiry. What the forward runs do not know is how long each workload
will run, and what will arrive meanwhile; each run draws both from what is known now.

Durations (:class:`DurationModel`, :class:`Durations`), never a workload's true ``duration_s``
(the simulator's truth: reading it would make a backtest meaningless):

- a declared ``expected_duration_s`` scaled by a draw of the actual/declared ratio of finished
  workloads like it that declared one (with fewer than ``min_samples`` such ratios, the declared
  duration as it is);
- otherwise the observed running times of finished workloads like it: same queue, GPU types
  asked and shape (``gpus_per_pod`` x ``pods``), backing off to the same queue and GPU types,
  the same queue, then all, while a group has fewer than ``min_samples`` (:data:`MIN_SAMPLES`);
- as a Kaplan-Meier curve that counts the unfinished work as censored (a running workload will
  run longer than it has): the finished alone are biased short, the long ones being those still
  running (early in a history, by far);
- for a workload that has already run ``done`` seconds (running, or preempted with a
  checkpoint), its total conditional on exceeding ``done``, from its own group (counted in all,
  not above ``done``: backing off for a long runner would draw it among the long kinds); past
  every finished one, a Pareto tail of the group's own tail index (:func:`tail_index`);
- a kind (finest group) with too few finished is drawn as a whole (:class:`_Kind`): a Gaussian
  copula on the coarser group's curve, whose shared factor makes a sweep long or short together
  in a run and is moved by what is known of the kind (its few finished, its unfinished so far);
  without it the draws of a sweep of an unseen kind average out and its interval is far too
  narrow;
- before anything finished, a wide prior around ``prior_s``.

Arrivals (:class:`ArrivalModel`, optional): a block bootstrap of the recent submits, so work that
will come ahead (a queue below its guarantee, a higher priority) delays the forecast as it would
the start. Without it the forecast knows only the present's work and leans early; with it, it is
as good as the past is like the future (docs/PERFORMANCE.md: better intervals on steady synthetic
arrivals, far too late on the Alibaba trace's bursts), at several times the cost.

Randomness enters only through the :class:`Sampler` passed in (a ``random.Random(seed)`` does),
so a forecast is a pure function of its inputs and the seed.

**The interval.** ``runs`` forward runs (:data:`RUNS`), each with its own draws; a workload's
p10/p50/p90 are the quantiles (linear interpolation between order statistics) of its start across
the runs. This is the spread that the uncertainty of durations and arrivals gives, propagated
through the real policy (fair share, gangs, backfill, preemption), which no closed form follows.
The draws are stratified across runs (:class:`_Strata`), so 16 runs give steadier quantiles than
16 independent ones. Why it is calibrated, and where not: where the finished and running work
tell the distribution of the pending work's durations (the Kaplan-Meier curve, the kinds'
posterior) and the recent past tells what will arrive, the runs' starts are draws from the
start's distribution given the present, and the backtest (``benchmarks/bench_eta.py``,
docs/PERFORMANCE.md "Start-time forecasts") measures the share of actual starts inside [p10, p90]
against the 80 % this aims at. What the model cannot know narrows the truth's odds: a kind never
seen, a burst of arrivals unlike the past ones, a change in durations.

The first cycle is the present's own: the simulator passes the decisions its cycle made
(``first``), the same in every run, so a workload admitted in it gets ``p10 = p50 = p90 =`` that
cycle's time. A run stops once every target has started. Nothing here writes to the caller's
cluster or snapshot: the forward runs use a copy of the cluster with a memo of their own.
"""
from __future__ import annotations

import heapq
import math
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from statistics import NormalDist
from typing import Protocol

from scheduler.cycle import schedule
from scheduler.memo import CycleMemo
from scheduler.model import Decisions, Running, Workload
from scheduler.snapshot import Cluster, Occupancy, PendingChanges, Snapshot, occupancy_after

EPS = 1e-9

# A group's samples are used when it has at least this many finished; fewer back off to the next
# coarser group (and make the finest a kind drawn as a whole, _Kind, its own few finished moving
# its draws). 30 rather than 10 or 5: a kind's first ten to thirty runs tell its scale better
# through _Kind's posterior than as a sample of their own (docs/PERFORMANCE.md, "Start-time
# forecasts": on the synthetic replays of 800, 30 has the lower error).
MIN_SAMPLES = 30
# Forward runs per forecast: 8 cover less (docs/PERFORMANCE.md, "Start-time forecasts") for half
# the cost; the quantiles come from stratified draws (_Strata).
RUNS = 16
# The prior's spread when nothing has finished: a lognormal of this sigma around ``prior_s``.
PRIOR_SIGMA = 1.0
# The likeness of one kind's running times (DurationModel.likeness) before history can tell.
LIKENESS = 0.5
# The Pareto tail past every sample draws at most this many times ``done``.
TAIL_CAP = 100.0

_NORMAL = NormalDist()


class Sampler(Protocol):
    """The source of randomness: ``random()`` uniform on [0, 1) (``random.Random`` is one)."""

    def random(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Eta:
    """A start-time forecast: times on the caller's clock (absolute, not waits)."""

    p10: float
    p50: float
    p90: float

    def as_dict(self, ndigits: int = 6) -> dict[str, float]:
        return {"p10": round(self.p10, ndigits) + 0.0, "p50": round(self.p50, ndigits) + 0.0,
                "p90": round(self.p90, ndigits) + 0.0}


GroupKey = tuple[object, ...]


def group_keys(w: Workload) -> tuple[GroupKey, ...]:
    """The groups of workloads "like" ``w``, finest first: queue, GPU types asked and shape; queue
    and GPU types; queue; all."""
    return ((w.queue, w.gpu_types, w.gpus_per_pod, w.pods), (w.queue, w.gpu_types), (w.queue,), ())


class _Samples:
    """One group's samples, sorted on first read after a change (appends are O(1); the sort of a
    sorted list with a short unsorted tail is linear)."""

    __slots__ = ("xs", "dirty")

    def __init__(self) -> None:
        self.xs: list[float] = []
        self.dirty = False

    def add(self, x: float) -> None:
        self.xs.append(x)
        self.dirty = True

    def sorted(self) -> list[float]:
        if self.dirty:
            self.xs.sort()
            self.dirty = False
        return self.xs


class DurationModel:
    """What is known of running times: the observed running time of each finished workload,
    grouped by :func:`group_keys`, and, for those that declared one, its ratio to the declared
    ``expected_duration_s``. :meth:`observe` adds a finished workload; :meth:`present` gives the
    draws of one forecast (:class:`Durations`), which also know the work still running. No I/O:
    the caller feeds it (the simulator from its finishes, the service from its history)."""

    def __init__(self, min_samples: int = MIN_SAMPLES, prior_s: float = 3600.0) -> None:
        if min_samples < 1:
            raise ValueError("min_samples must be at least 1")
        if not prior_s > 0:
            raise ValueError("prior_s must be positive")
        self.min_samples = min_samples
        self.prior_s = prior_s
        self._runs: dict[GroupKey, _Samples] = {}
        self._ratios: dict[GroupKey, _Samples] = {}
        self._logs: dict[GroupKey, list[float]] = {}     # finest group -> [n, sum, sum of squares] of log
        self.observed = 0

    def observe(self, w: Workload, ran_s: float) -> None:
        """``w`` finished after running ``ran_s`` seconds in all (what counted towards its end:
        its last run, or every run since its start for one that checkpoints)."""
        if not ran_s >= 0 or math.isinf(ran_s):
            raise ValueError(f"observed running time of {w.id} must be finite and >= 0, got {ran_s!r}")
        self.observed += 1
        keys = group_keys(w)
        for k in keys:
            s = self._runs.get(k)
            if s is None:
                s = self._runs[k] = _Samples()
            s.add(ran_s)
        x = math.log(max(ran_s, 1e-3))
        acc = self._logs.get(keys[0])
        if acc is None:
            acc = self._logs[keys[0]] = [0.0, 0.0, 0.0]
        acc[0] += 1
        acc[1] += x
        acc[2] += x * x
        declared = w.expected_duration_s
        if declared:
            for k in keys:
                s = self._ratios.get(k)
                if s is None:
                    s = self._ratios[k] = _Samples()
                s.add(ran_s / declared)

    def likeness(self) -> float:
        """How alike the running times of one kind of workload are, compared with all: the share
        of the variance of log running times that lies between the finest groups (the intraclass
        correlation), from the groups with two finished or more; :data:`LIKENESS` while fewer
        than two such groups exist."""
        groups = [a for a in self._logs.values() if a[0] >= 2]
        if len(groups) < 2:
            return LIKENESS
        n = sum(a[0] for a in groups)
        mean = sum(a[1] for a in groups) / n
        within = sum(a[2] - a[1] * a[1] / a[0] for a in groups)
        between = sum(a[0] * (a[1] / a[0] - mean) ** 2 for a in groups)
        total = within + between
        return min(max(between / total, 0.0), 0.95) if total > 0 else LIKENESS

    def present(self, unfinished: Iterable[tuple[Workload, float]] = ()) -> Durations:
        """The draws of a forecast made now. ``unfinished``: each workload that has run (running
        now, or preempted with a checkpoint) with the seconds it has done: it will run longer than
        that. Left out, the finished sample is biased short (the long ones are the ones still
        running; early in a history, by far): the draws correct for it (Kaplan-Meier)."""
        return Durations(self, unfinished)


def tail_index(xs: Sequence[float]) -> float:
    """The Hill estimate of the tail index of the sorted ``xs`` from their top fifth (3 to 50 of
    them), within [0.5, 5]; 1 (a tail as heavy as a median of twice the start) with too few. How
    long a run that has outlived every finished one of its kind will go on is read from how the
    longest finished ones spread: a kind whose long runs are alike ends soon after them."""
    n = len(xs)
    k = min(max(n // 5, 3), 50)
    if n <= k or xs[n - k - 1] <= 0:
        return 1.0
    ref = math.log(xs[n - k - 1])
    spread = sum(math.log(x) for x in xs[n - k:]) / k - ref
    return min(max(1.0 / spread, 0.5), 5.0) if spread > 0 else 5.0


class _Survival:
    """A group's running times as a Kaplan-Meier survival curve: the finished ones are events,
    the unfinished ones censored at what they have done. ``times``: the distinct event times in
    order; ``dead[k]``: 1 - S(times[k]), non-decreasing; ``events``: the finished ones, sorted;
    ``last``: past the last event the curve is known flat up to here (the longest unfinished)."""

    __slots__ = ("events", "times", "dead", "last", "alpha")

    def __init__(self, events: list[float], censored: list[float]) -> None:
        self.events = events
        times: list[float] = []
        dead: list[float] = []
        n = len(events) + len(censored)
        s = 1.0
        i = j = 0
        ne, nc = len(events), len(censored)
        while i < ne:
            t = events[i]
            while j < nc and censored[j] < t:      # censored before t: no longer at risk
                j += 1
                n -= 1
            d = 0
            while i < ne and events[i] == t:
                d += 1
                i += 1
            s *= 1.0 - d / n
            n -= d
            times.append(t)
            dead.append(1.0 - s)
        self.times = times
        self.dead = dead
        self.last = max(times[-1] if times else 0.0, censored[-1] if censored else 0.0)
        self.alpha = tail_index(events)

    def cdf(self, x: float) -> float:
        """1 - S(x)."""
        k = bisect_right(self.times, x)
        return self.dead[k - 1] if k else 0.0

    def mid_cdf(self, x: float) -> float:
        """The middle of the curve's step at ``x`` (where an event at ``x`` ranks)."""
        k = bisect_left(self.times, x)
        before = self.dead[k - 1] if k else 0.0
        return (before + self.cdf(x)) / 2

    def draw(self, done: float, u: float) -> float:
        """A draw given more than ``done``: the first event time where the curve falls below
        ``S(done) x (1 - u)``; where it never does (the longest runs have not finished, or
        ``done`` is past them all), a Pareto tail from there (``last`` or ``done``) of the
        finished runs' own tail index (:func:`tail_index`): the total exceeds ``x`` with
        probability ``S x (base / x) ** alpha``."""
        times, dead = self.times, self.dead
        k0 = bisect_right(times, done)
        s0 = 1.0 - dead[k0 - 1] if k0 else 1.0
        if s0 <= 1e-12:                # past every finished one, none unfinished beyond
            return done * min(math.pow(max(1.0 - u, 1e-12), -1.0 / self.alpha), TAIL_CAP) if done > 0 else done
        target = s0 * (1.0 - u)
        k = bisect_right(dead, 1.0 - target, lo=k0)
        if k < len(times):
            return times[k]
        base = max(self.last, done)
        s_base = 1.0 - dead[-1] if dead else s0
        return base * min(math.pow(s_base / max(target, 1e-300), 1.0 / self.alpha), TAIL_CAP)


class Durations:
    """One forecast's draws of total running times (:meth:`DurationModel.present`)."""

    def __init__(self, model: DurationModel, unfinished: Iterable[tuple[Workload, float]]) -> None:
        self.model = model
        self._cen_runs: dict[GroupKey, list[float]] = {}
        self._cen_ratios: dict[GroupKey, list[float]] = {}
        for w, done in unfinished:
            if done <= 0:
                continue
            keys = group_keys(w)
            for k in keys:
                self._cen_runs.setdefault(k, []).append(done)
            if w.expected_duration_s:
                for k in keys:
                    self._cen_ratios.setdefault(k, []).append(done / w.expected_duration_s)
        for lst in self._cen_runs.values():
            lst.sort()
        for lst in self._cen_ratios.values():
            lst.sort()
        self._curves: dict[tuple[bool, GroupKey], _Survival | None] = {}
        self.loading = math.sqrt(model.likeness())
        self._kinds: dict[GroupKey, _Kind | None] = {}
        self._posteriors: dict[tuple[object, ...], list[float]] = {}

    def shared(self, w: Workload) -> bool:
        """Whether ``w``'s kind (its finest group) has too few finished to be drawn from its own
        (:meth:`total` then draws it as one of its kind, :class:`_Kind`)."""
        if self.loading <= 0:
            return False
        s = self.model._runs.get(group_keys(w)[0])
        return s is None or len(s.xs) < self.model.min_samples

    def _kind(self, w: Workload) -> _Kind | None:
        key = group_keys(w)[0]
        if key in self._kinds:
            return self._kinds[key]
        pooled = self._pick(False, group_keys(w)[1:], strict=False)
        kind = None
        if pooled is not None:
            s = self.model._runs.get(key)
            kind = _Kind(pooled, self.loading, s.sorted() if s is not None else [], self._cen_runs.get(key, []),
                         self._posteriors)
        self._kinds[key] = kind
        return kind

    def _curve(self, ratios: bool, key: GroupKey) -> _Survival | None:
        c = self._curves.get((ratios, key), self)
        if c is self:
            table = self.model._ratios if ratios else self.model._runs
            s = table.get(key)
            c = None
            if s is not None:
                cen = (self._cen_ratios if ratios else self._cen_runs).get(key, [])
                c = _Survival(s.sorted(), cen)
            self._curves[(ratios, key)] = c
        assert c is None or isinstance(c, _Survival)
        return c

    def _pick(self, ratios: bool, keys: Sequence[GroupKey], strict: bool) -> _Survival | None:
        """The finest group with at least ``min_samples`` finished; with none, the coarsest if it
        has any (``None`` with ``strict``, or when it has none). Counted in all, not above what a
        workload has done: backing off for a long-running one would draw it from a mix dominated
        by the long kinds (a bias measured in ``benchmarks/bench_eta.py``'s development); its
        own group's tail says how much longer it goes on."""
        need = self.model.min_samples
        for k in keys:
            c = self._curve(ratios, k)
            if c is not None and len(c.events) >= need:
                return c
        if strict:
            return None
        c = self._curve(ratios, keys[-1])
        return c if c is not None and c.events else None

    def total(self, w: Workload, done_s: float, u: float, u_kind: float | None = None) -> float:
        """A draw (``u`` uniform on [0, 1)) of ``w``'s total running time given that it has
        already run ``done_s`` seconds that count: above ``done_s`` (or equal, on a zero-length
        draw). Module docstring: declared, like it, its tail, the prior. ``u_kind``: for a
        workload whose kind has too few finished (:meth:`shared`), the uniform of its kind in this
        run, shared by all of the kind (:class:`_Kind`)."""
        keys = group_keys(w)
        declared = w.expected_duration_s
        if declared:
            c = self._pick(True, keys, strict=True)
            if c is not None:
                return declared * c.draw(done_s / declared, u)
            if declared > done_s:
                return declared
        if u_kind is not None:
            kind = self._kind(w)
            if kind is not None:
                return kind.draw(done_s, u, u_kind)
        c = self._pick(False, keys, strict=False)
        if c is not None:
            return c.draw(done_s, u)
        if done_s > 0:
            return done_s / max(1.0 - u, 1.0 / TAIL_CAP)
        return self.model.prior_s * math.exp(PRIOR_SIGMA * _NORMAL.inv_cdf(min(max(u, 1e-9), 1 - 1e-9)))

    def fresh_key(self, w: Workload, kind: bool) -> object:
        """A key such that workloads with equal keys draw the same total from nothing done:
        ``total(w, 0, u, u if kind else None)`` is the same for each ``u`` (what
        :meth:`total` reads: the declared duration and its ratio curve, the kind's posterior and
        pooled curve, or the group's curve). Kinds with the same evidence share one posterior
        object, so thousands of unseen kinds of one queue share a key."""
        keys = group_keys(w)
        declared = w.expected_duration_s
        if declared:
            c = self._pick(True, keys, strict=True)
            if c is not None or declared > 0:
                return ("declared", id(c), declared)
        if kind:
            k = self._kind(w)
            if k is not None:
                return ("kind", id(k.cdf), id(k.pooled))
        c = self._pick(False, keys, strict=False)
        return ("curve", id(c))


GRID = tuple(-4.0 + 8.0 * i / 40 for i in range(41))


def _grid_cdf(logs: Sequence[float]) -> list[float]:
    top = max(logs)
    acc, cdf = 0.0, []
    for lp in logs:
        acc += math.exp(lp - top)
        cdf.append(acc)
    return [c / acc for c in cdf]


_PRIOR_CDF = _grid_cdf([-0.5 * z * z for z in GRID])


class _Kind:
    """A kind of workload with too few finished to be drawn from its own, drawn as one of the
    kinds of the coarser group it backs off to (``pooled``): a Gaussian copula on that group's
    distribution ``F``, in which the normal score of a run is ``a z + sqrt(1 - a^2) e``, ``z`` the
    kind's (shared by its workloads), ``e`` the run's own, ``a^2`` the likeness
    (:meth:`DurationModel.likeness`). So a kind is long or short as a whole in a run (a sweep of
    long jobs is long throughout, and the interval of a workload behind its sweep is as wide as
    what is not known about the sweep), and what is known of it moves ``z``: the posterior of
    ``z`` (on a grid) given the kind's finished runs and the runs of its unfinished ones so far
    (each outlives what it has done). With nothing known, the draws are the pooled group's."""

    __slots__ = ("pooled", "a", "b", "cdf")

    def __init__(self, pooled: _Survival, a: float, finished: Sequence[float], unfinished: Sequence[float],
                 posteriors: dict[tuple[object, ...], list[float]] | None = None) -> None:
        """``posteriors``: posteriors already computed in this forecast, by what they depend on
        (the pooled curve, the scores rounded to 0.01: many kinds share one, a single running
        workload each)."""
        self.pooled, self.a = pooled, a
        b = self.b = math.sqrt(max(1.0 - a * a, 1e-6))
        if not finished and not unfinished:
            self.cdf = _PRIOR_CDF
            return
        cs = [_z(pooled.mid_cdf(x)) for x in finished]
        ds = [_z(pooled.cdf(x)) for x in unfinished]
        key: tuple[object, ...] | None = None
        if posteriors is not None:
            key = (id(pooled), a, tuple(round(c, 2) for c in cs), tuple(sorted(round(d, 2) for d in ds)))
            got = posteriors.get(key)
            if got is not None:
                self.cdf = got
                return
        logs = []
        # sum over the finished of ((c - a z) / b)^2, from their count, sum and sum of squares;
        # each unfinished: log P(score > d) = log(erfc((d - a z) / (b sqrt 2)) / 2)
        n, s1, s2 = len(cs), math.fsum(cs), math.fsum(c * c for c in cs)
        k = 1.0 / (b * math.sqrt(2.0))
        log, erfc = math.log, math.erfc
        for z in GRID:
            az = a * z
            lp = -0.5 * z * z - 0.5 * (s2 - 2.0 * az * s1 + n * az * az) / (b * b)
            for d in ds:
                lp += log(max(0.5 * erfc((d - az) * k), 1e-300))
            logs.append(lp)
        self.cdf = _grid_cdf(logs)
        if key is not None and posteriors is not None:
            posteriors[key] = self.cdf

    def draw(self, done: float, u: float, u_kind: float) -> float:
        k = bisect_left(self.cdf, u_kind)
        if k == 0:
            z = GRID[0]
        elif k >= len(GRID):
            z = GRID[-1]
        else:
            lo, hi = self.cdf[k - 1], self.cdf[k]
            z = GRID[k - 1] + (GRID[k] - GRID[k - 1]) * ((u_kind - lo) / (hi - lo) if hi > lo else 0.0)
        a, b = self.a, self.b
        p_lo = _NORMAL.cdf((_z(self.pooled.cdf(done)) - a * z) / b) if done > 0 else 0.0
        e = _z(p_lo + (1.0 - p_lo) * u)
        x = self.pooled.draw(0.0, _NORMAL.cdf(a * z + b * e))
        return x if x > done else self.pooled.draw(done, u)


class ArrivalModel:
    """Work that will arrive while the pending work waits, from the recent past: a forecast that
    knew only the present would miss what comes ahead of a workload later (a queue below its
    guarantee, a higher priority), and be late-blind. Each forward run draws its own future as a
    block bootstrap of the last ``window`` accepted submits: the span they cover, cut into
    ``blocks`` blocks, and a future as long as that span laid out block after block, each a copy
    of a block starting at a uniformly drawn instant of that span (its workloads shifted in time, with new ids and no
    duration: the forward run draws theirs like any other's). Blocks keep bursts and the mix of
    queues, shapes and priorities as they came. :meth:`observe` adds a submit (in time order)."""

    def __init__(self, window: int = 512, blocks: int = 8) -> None:
        if window < 2 or blocks < 1:
            raise ValueError("window must be at least 2 and blocks at least 1")
        self.window = window
        self.blocks = blocks
        self._subs: list[Workload] = []

    def observe(self, w: Workload) -> None:
        self._subs.append(w)
        if len(self._subs) > 4 * self.window:
            del self._subs[: len(self._subs) - self.window]

    def stream(self, now: float, sampler: Sampler, tag: str) -> Iterator[Workload]:
        """Arrivals in ``(now, now + span]``, ``span`` being how far back the window reaches (the
        past is extrapolated as far as it goes, no further), in submit order. ``tag`` makes the
        ids unique among runs."""
        hist = self._subs[-self.window:]
        if len(hist) < 2:
            return
        lo = hist[0].submit_s
        span = now - lo
        if not span > 0:
            return
        block = span / self.blocks
        times = [w.submit_s for w in hist]
        k = 0
        for b in range(self.blocks):
            t = now + b * block
            s = lo + sampler.random() * (span - block)
            i, j = bisect_left(times, s), bisect_left(times, s + block)
            for w in hist[i:j]:
                k += 1
                yield Workload(f"{tag}{k}/{w.id}", w.queue, w.pods, w.gpus_per_pod, w.gpu_types, w.priority,
                               w.preemptible, t + (w.submit_s - s), 0.0, w.checkpoint, w.originator,
                               w.cpu_millicores_per_pod, w.memory_per_pod_bytes, w.expected_duration_s)


def quantile(xs: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks of the sorted ``xs`` (numpy's default); an
    infinite neighbour gives infinity."""
    pos = (len(xs) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    a, b = xs[lo], xs[hi]
    if math.isinf(b) or math.isinf(a):
        return b if pos > lo else a
    return a + (b - a) * (pos - lo)


class _Strata:
    """The uniforms of one forecast's draws, per workload and run.

    Stratified across the runs (Latin hypercube): a workload's ``u`` in run ``k`` is
    ``(perm[k] + v) / runs`` for a permutation ``perm`` of the runs drawn for it, so its durations
    over the runs cover its distribution evenly instead of by chance; the quantiles of a start
    over the runs then vary much less for the same number of runs.

    A kind with too few finished (:meth:`Durations.shared`) gets a stratified uniform of its own
    per run too, shared by its workloads (:class:`_Kind`)."""

    __slots__ = ("runs", "rnd", "us", "kinds", "durations")

    def __init__(self, runs: int, rnd: Callable[[], float], durations: Durations) -> None:
        self.runs = runs
        self.rnd = rnd
        self.us: dict[str, list[float]] = {}
        self.kinds: dict[GroupKey, list[float]] = {}
        self.durations = durations

    def _stratified(self) -> list[float]:
        n, rnd = self.runs, self.rnd
        perm = list(range(n))
        for i in range(n - 1, 0, -1):                    # Fisher-Yates
            j = min(int(rnd() * (i + 1)), i)
            perm[i], perm[j] = perm[j], perm[i]
        return [(perm[i] + rnd()) / n for i in range(n)]

    def u(self, w: Workload, k: int) -> float:
        """``w``'s own uniform in run ``k``."""
        us = self.us.get(w.id)
        if us is None:
            us = self.us[w.id] = self._stratified()
        return us[k]

    def kind(self, w: Workload, k: int) -> float | None:
        """The uniform of ``w``'s kind in run ``k`` when the kind is drawn as a whole
        (:meth:`Durations.shared`), else ``None``."""
        if not self.durations.shared(w):
            return None
        key = group_keys(w)[0]
        ks = self.kinds.get(key)
        if ks is None:
            ks = self.kinds[key] = self._stratified()
        return ks[k]


def _z(u: float) -> float:
    return _NORMAL.inv_cdf(min(max(u, 1e-9), 1 - 1e-9))


@dataclass(frozen=True, slots=True)
class Present:
    """The state after the present cycle, shared by every run."""

    now: float
    running: tuple[Running, ...]
    pending: tuple[Workload, ...]
    occupancy: Occupancy
    done: Mapping[str, float]       # seconds that count towards its end, per running or pending
    targets: frozenset[str]         # still pending
    ids: frozenset[str]             # of running and pending (drawn stratified; arrivals are not)


def after_first(snap: Snapshot, now: float, first: Decisions, want: frozenset[str],
                done_s: Mapping[str, float]) -> tuple[Present, dict[str, Eta]]:
    """The state after the present cycle (``first``, the decisions at ``now`` on ``snap``), shared
    by every forward run, and the forecasts it settles: a target admitted in it starts at ``now``.
    ``done_s`` as in :meth:`Forecaster.forecast`."""
    running = {r.workload.id: r for r in snap.running}
    pending = {w.id: w for w in snap.pending}
    done: dict[str, float] = {wid: done_s.get(wid, now - r.start_s) for wid, r in running.items()}
    for wid in pending:
        d = done_s.get(wid, 0.0)
        if d > 0:
            done[wid] = d
    stopped: list[Running] = []
    started: list[Running] = []
    out: dict[str, Eta] = {}
    for a in first.admissions:
        for vid in a.victims:
            r = running.pop(vid)
            stopped.append(r)
            pending[vid] = r.workload
            if not r.workload.checkpoint:
                done.pop(vid, None)
        w = a.workload
        del pending[w.id]
        r = Running(w, a.placement, now)
        running[w.id] = r
        started.append(r)
        if w.id in want:
            out[w.id] = Eta(now, now, now)
    occ = occupancy_after(snap.cluster, snap.occupancy, stopped, started)
    targets = frozenset(wid for wid in want if wid in pending)
    return Present(now, tuple(running.values()), tuple(pending.values()), occ, done, targets,
                 frozenset(running) | frozenset(pending)), out


class Forecaster:
    """Forecasts for one cluster. It keeps its own copy of the cluster, whose ``memo`` the forward
    runs use (the caller's cluster memo, which the live cycles use, is never touched), and keeps
    that memo from one forecast to the next.

    ``interval_s`` is the scheduler's cycle interval; ``runs`` the forward runs per forecast;
    ``max_cycles`` bounds one run (a target not started by then has an infinite start).
    ``schedule_fn`` is the core (a baseline policy can be forecast the same way)."""

    def __init__(self, cluster: Cluster, interval_s: float, runs: int = RUNS, *,
                 schedule_fn: Callable[[Snapshot, float], Decisions] = schedule,
                 max_cycles: int | None = None) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be positive")
        if runs < 1:
            raise ValueError("runs must be at least 1")
        self.cluster = replace(cluster, memo=CycleMemo())
        self.interval_s = interval_s
        self.runs = runs
        self.schedule_fn = schedule_fn
        self.max_cycles = max_cycles
        self.cycles = 0                  # forward cycles run, over all forecasts (for benchmarks)

    def forecast(self, snap: Snapshot, now: float, model: DurationModel, sampler: Sampler, *,
                 targets: Iterable[str] | None = None, done_s: Mapping[str, float] | None = None,
                 first: Decisions | None = None, arrivals: ArrivalModel | None = None) -> dict[str, Eta]:
        """The start-time forecast of each of ``targets`` (ids of ``snap.pending``; default all),
        made at ``now`` from ``snap`` (the state a cycle at ``now`` sees).

        ``done_s``: running time already done that counts towards a workload's end, for a running
        one whose earlier runs count (a checkpointing workload that was preempted) and for a
        pending one preempted with a checkpoint; a running workload's default is
        ``now - start_s``, a pending one's 0. ``first``: the decisions the cycle at ``now`` made on
        ``snap`` when the caller has run it (the simulator does); otherwise the forecast runs it on
        its own copy. A target without a finite start in some run gets no forecast (not in the
        result). ``arrivals``: work expected to arrive meanwhile (:class:`ArrivalModel`); without it
        the forward runs see only the present's work."""
        want = frozenset(w.id for w in snap.pending) if targets is None else frozenset(targets)
        own = replace(snap, cluster=self.cluster, changes=None)
        if first is None:
            first = self.schedule_fn(own, now)
            self.cycles += 1
        done_s = done_s or {}
        base, out = after_first(own, now, first, want, done_s)
        if not base.targets:
            return out
        unfinished = [(r.workload, done_s.get(r.workload.id, now - r.start_s)) for r in snap.running]
        unfinished += [(w, done_s[w.id]) for w in snap.pending if done_s.get(w.id, 0.0) > 0]
        durations = model.present(unfinished)
        strata = _Strata(self.runs, sampler.random, durations)
        starts: dict[str, list[float]] = {wid: [] for wid in base.targets}
        for k in range(self.runs):
            stream = arrivals.stream(now, sampler, f"\x00eta{k}/") if arrivals is not None else None
            got = self._run(base, own, durations, sampler, stream, strata, k)
            for wid, lst in starts.items():
                lst.append(got.get(wid, math.inf))
        for wid, lst in starts.items():
            lst.sort()
            eta = Eta(quantile(lst, 0.1), quantile(lst, 0.5), quantile(lst, 0.9))
            if not math.isinf(eta.p90):
                out[wid] = eta
        return out

    def _run(self, base: Present, snap: Snapshot, durations: Durations, sampler: Sampler,
             stream: Iterator[Workload] | None, strata: _Strata, k: int) -> dict[str, float]:
        """One forward run with fresh draws: target id -> its first start."""
        cluster, settings, dt, now = self.cluster, snap.settings, self.interval_s, base.now
        total: dict[str, float] = {}
        done = dict(base.done)
        running = {r.workload.id: r for r in base.running}
        pending = {w.id: w for w in base.pending}
        ends: dict[str, tuple[float, int]] = {}
        heap: list[tuple[float, int, str]] = []
        seq = 0
        draw = durations.total
        rnd = sampler.random
        u = strata.u
        kind = strata.kind
        for wid, r in running.items():
            dn = done.get(wid, 0.0)
            tot = total[wid] = draw(r.workload, dn, u(r.workload, k), kind(r.workload, k))
            seq += 1
            end = now + max(tot - dn, 0.0)
            ends[wid] = (end, seq)
            heap.append((end, seq, wid))
        heapq.heapify(heap)
        expiry: list[tuple[float, str]] = []
        delay = settings.preemption_delay_s
        if settings.preemption:
            expiry = [(w.submit_s + delay, w.id) for w in base.pending if w.submit_s + delay > now + EPS]
            heapq.heapify(expiry)
        nxt = next(stream, None) if stream is not None else None
        left = set(base.targets)
        base_ids = base.ids
        starts: dict[str, float] = {}
        occ = base.occupancy
        last: tuple[Workload, ...] | None = None
        removed: list[Workload] = []
        added: list[Workload] = []
        admitted = True                      # the present cycle ran just before
        j = 0
        cap = self.max_cycles if self.max_cycles is not None else 20 * (len(pending) + len(running)) + 1000
        cycles = 0
        while left and cycles < cap:
            if admitted:
                j += 1
            else:
                while heap and ends.get(heap[0][2], (0.0, -1))[1] != heap[0][1]:
                    heapq.heappop(heap)
                while expiry and (expiry[0][0] <= now + j * dt + EPS or expiry[0][1] not in pending):
                    heapq.heappop(expiry)
                e = min(heap[0][0] if heap else math.inf, expiry[0][0] if expiry else math.inf,
                        nxt.submit_s if nxt is not None else math.inf)
                if math.isinf(e):
                    break
                j = max(j + 1, math.ceil((e - now) / dt - EPS))
            t = now + j * dt
            stopped: list[Running] = []
            while heap and heap[0][0] <= t + EPS:
                _, s, wid = heapq.heappop(heap)
                if ends.get(wid, (0.0, -1))[1] != s:
                    continue
                del ends[wid]
                stopped.append(running.pop(wid))
            if stopped:
                occ = occupancy_after(cluster, occ, stopped, ())
            while nxt is not None and nxt.submit_s <= t + EPS:
                assert stream is not None
                pending[nxt.id] = nxt
                added.append(nxt)
                if settings.preemption and nxt.submit_s + delay > t + EPS:
                    heapq.heappush(expiry, (nxt.submit_s + delay, nxt.id))
                nxt = next(stream, None)
            pend = tuple(pending.values())
            changes = None if last is None else PendingChanges(last, tuple(removed), tuple(added))
            last, removed, added = pend, [], []
            dec = self.schedule_fn(Snapshot(cluster, tuple(running.values()), pend, occ, settings, changes,
                                            snap.usage), t)
            cycles += 1
            admitted = bool(dec.admissions)
            if not admitted:
                continue
            stopped, started = [], []
            for a in dec.admissions:
                w = a.workload
                for vid in a.victims:
                    v = running.pop(vid)
                    stopped.append(v)
                    end = ends.pop(vid)[0]
                    vw = v.workload
                    if vw.checkpoint:
                        done[vid] = total[vid] - (end - t)
                    else:
                        done.pop(vid, None)
                    pending[vid] = vw
                    added.append(vw)
                    if settings.preemption:
                        heapq.heappush(expiry, (vw.submit_s + delay, vid))
                del pending[w.id]
                removed.append(w)
                if w.id in left:
                    left.discard(w.id)
                    starts[w.id] = t
                r = Running(w, a.placement, t)
                running[w.id] = r
                started.append(r)
                d0 = done.get(w.id, 0.0)
                known = total.get(w.id)
                tot = known if known is not None else (draw(w, d0, u(w, k), kind(w, k)) if w.id in base_ids
                                                      else draw(w, d0, rnd(), kind(w, k)))
                total[w.id] = tot
                seq += 1
                end = t + max(tot - d0, 0.0)
                ends[w.id] = (end, seq)
                heapq.heappush(heap, (end, seq, w.id))
            occ = occupancy_after(cluster, occ, stopped, started)
        self.cycles += cycles
        return starts

