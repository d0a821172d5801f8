"""Start-time forecasts in the live service (issue 18): when each pending workload will start, how
sure that is, and how right the forecasts turned out.

:class:`Forecasts` (one per :class:`~scheduler.service.core.SchedulerService`, its
``forecasts``) wires the pure forecaster (:mod:`scheduler.forecast`, through
:func:`~scheduler.timeline.live_forecaster`) into the service:

* **what it learns from.** A :class:`~scheduler.forecast.DurationModel` of the observed running
  times of finished workloads, fed from the same events the service records: at start from the
  stored history (:meth:`learn`, called by :meth:`SchedulerService.restore` with what it replays:
  ``scheduler_events`` keeps ``store.retention.events_days`` of it), then live (:meth:`note`,
  called for every event the service emits). A workload's running time is its last run, or the
  sum of its runs for one that checkpoints (what counted towards its end, as the simulator
  counts it); a cancelled or rejected workload teaches nothing (it did not run to its end). A
  declared ``expected_duration_s`` (the API's ``expected_duration``, the Kubernetes annotation
  ``gpuq.io/expected-duration``) travels with the workload and its stored spec: the model scales
  it by what declared durations turned out to be.
* **off the scheduling path.** :meth:`refresh` forecasts every pending workload: the snapshot is
  taken under the service lock (the same one a cycle takes, a few milliseconds), the forward runs
  happen without it, and the results are kept by id. Forecasting simulates the cluster forward
  through the real policy many times; at thousands pending it takes seconds, which neither the
  scheduling cycle nor an API answer may wait for. ``gpuq serve`` runs :meth:`serve` in a thread
  of its own: a refresh at least every ``accounting.interval_s``, and soon after a submit (at most
  one per ``scheduler.cycle_interval_s``) so a new workload gets its forecast within a cycle or
  so. Reads (:meth:`eta`) are a dictionary lookup of what the last refresh found, ISO times
  already written. A forecast made from a snapshot that a workload has since left (admitted,
  preempted, cancelled meanwhile) is dropped (its generation moved on).
* **accuracy.** Each workload keeps its first forecast after submission (``submit``) and its
  latest one (``latest``); when it starts (an ``admit`` event) each is scored: the error of p50
  ``|p50 - start|``, whether the start fell inside ``[p10, p90]``, and the relative error (the
  error over the workload's wait since it became pending, for waits of at least
  :data:`MIN_WAIT_S`, as ``benchmarks/bench_eta.py`` scores the backtest). ``submit`` is scored
  at the first start only; ``latest`` at every start that had one. :class:`Accuracy` keeps per
  queue and kind the last :data:`KEEP` scores (``GET /forecasts/accuracy``, the dashboard) and
  counters since the process started (the ``gpuq_forecast_*`` metrics). Neither survives a
  restart: forecasts are not stored.
* **dry runs.** :meth:`dry_run` forecasts the dry-run workload alone (``targets`` = its id) on
  the dry run's own snapshot (the live state with it added), with a model and forecaster of its
  own so that it never waits for a refresh in progress.

Locks: :meth:`note` runs under the service lock and takes this module's ``_lock`` (never the
other way round); the forward runs hold only their engine's lock.
"""
from __future__ import annotations

import logging
import random
import statistics
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpuq.timefmt import iso
from scheduler import events as ev
from scheduler.forecast import DurationModel, Eta
from scheduler.timeline import Timeline, live_forecaster
from scheduler.model import Decisions, Workload
from scheduler.snapshot import Cluster, Snapshot

if TYPE_CHECKING:
    from scheduler.service.core import SchedulerService
    from scheduler.service.views import DryRun

log = logging.getLogger(__name__)

SUBMIT, LATEST = "submit", "latest"
KINDS = (SUBMIT, LATEST)
# a start this soon after the workload became pending is not scored for its relative error (the
# backtest's MIN_WAIT_S): an error of seconds over a wait of seconds says nothing
MIN_WAIT_S = 60.0
KEEP = 500                 # scores kept per (queue, kind) for the medians and shares
# |p50 - start|, half a minute to a day: few buckets, as the series are per queue and kind (a
# cluster of 10,000 queues already serves a 14 MB /metrics)
ERROR_BUCKETS_S = (30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 7200.0, 14400.0, 86400.0)
EPS = 1e-6


@dataclass(frozen=True, slots=True)
class Forecast:
    """One workload's forecast: made at ``made_s``, ``shown`` as the API gives it (ISO times)."""

    made_s: float
    eta: Eta
    shown: dict[str, str]


def made(now: float, eta: Eta) -> Forecast:
    return Forecast(now, eta, {"p10": iso(eta.p10), "p50": iso(eta.p50), "p90": iso(eta.p90), "at": iso(now)})


@dataclass(slots=True)
class _Open:
    """What this module follows of an open workload (pending or running)."""

    workload: Workload
    since_s: float                        # pending since (submitted, or preempted last)
    start_s: float | None = None          # running since
    ran_s: float = 0.0                    # earlier runs that count towards its end (checkpointing)
    started: bool = False                 # started at least once
    gen: int = 0                          # moves at each transition: a forecast of an older one is stale
    submit: Forecast | None = None        # the first forecast since its submission
    latest: Forecast | None = None        # the last refresh's, while pending


@dataclass(slots=True)
class _Tally:
    """One (queue, kind): the last scores and the counters since start."""

    recent: deque[tuple[float, bool, float | None]] = field(default_factory=lambda: deque(maxlen=KEEP))
    count: int = 0
    hits: int = 0
    error_sum_s: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * len(ERROR_BUCKETS_S))


class Accuracy:
    """How far the forecasts were from the starts, per queue and kind (``submit``, ``latest``)."""

    def __init__(self) -> None:
        self._tallies: dict[tuple[str, str], _Tally] = {}

    def add(self, queue: str, kind: str, eta: Eta, start_s: float, since_s: float) -> None:
        error = abs(eta.p50 - start_s)
        hit = eta.p10 - EPS <= start_s <= eta.p90 + EPS
        wait = start_s - since_s
        rel = error / wait if wait >= MIN_WAIT_S else None
        t = self._tallies.get((queue, kind))
        if t is None:
            t = self._tallies[(queue, kind)] = _Tally()
        t.recent.append((error, hit, rel))
        t.count += 1
        t.hits += hit
        t.error_sum_s += error
        for i, b in enumerate(ERROR_BUCKETS_S):
            if error <= b:
                t.buckets[i] += 1

    def rows(self) -> list[dict[str, Any]]:
        """Per queue and kind, over the last :data:`KEEP` starts: how many, the share inside
        [p10, p90], the median error of p50 in seconds and relative (None where no start waited
        :data:`MIN_WAIT_S`)."""
        out = []
        for (queue, kind), t in sorted(self._tallies.items()):
            rels = [r for _, _, r in t.recent if r is not None]
            n = len(t.recent)
            out.append({"queue": queue, "forecast": kind, "starts": n,
                        "inside_interval": sum(h for _, h, _ in t.recent) / n,
                        "median_error_s": statistics.median(e for e, _, _ in t.recent),
                        "median_relative_error": statistics.median(rels) if rels else None,
                        "scored_since_start": t.count})
        return out

    def counters(self) -> dict[tuple[str, str], tuple[int, int, float, list[int]]]:
        """(queue, kind) -> (scored, inside [p10, p90], error sum, cumulative error buckets)."""
        return {k: (t.count, t.hits, t.error_sum_s, list(t.buckets)) for k, t in self._tallies.items()}


class _Engine:
    """A duration model and the forecaster of the cluster it last saw, used by one caller at a
    time (its lock). Finished running times arrive in ``inbox`` from any thread and enter the
    model when it is next used, so that no one waits for a forecast in progress to feed it."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self.lock = threading.Lock()
        self.model = DurationModel()
        self.inbox: deque[tuple[Workload, float]] = deque()
        self._cluster: Cluster | None = None
        self._forecaster: Timeline | None = None

    def forecast(self, snap: Snapshot, now: float, sampler: random.Random, targets: Iterable[str],
                 done_s: dict[str, float], cycle: bool = True, first: Decisions | None = None) -> dict[str, Eta]:
        """``cycle``: run the present cycle first (a dry run, whose workload may start now); the
        refresh passes False, its snapshot holding the last cycle's decisions already. ``first``:
        the present cycle's decisions, already made (the advisor's run)."""
        with self.lock:
            while self.inbox:
                w, ran = self.inbox.popleft()
                self.model.observe(w, ran)
            if self._forecaster is None or self._cluster is not snap.cluster:
                self._cluster = snap.cluster         # the service builds a new one at each change
                self._forecaster = live_forecaster(snap.cluster, self.interval_s)
            return self._forecaster.forecast(snap, now, self.model, sampler, targets=targets, done_s=done_s,
                                             cycle=cycle, first=first)


class Forecasts:
    """The service's forecasts (module docstring). ``interval_s``: the scheduler loop's interval
    (the forward runs' cycle grid); ``seed``: the forecasts' randomness (each refresh draws from
    ``seed`` and its count, so a forecast is reproducible)."""

    def __init__(self, service: SchedulerService, interval_s: float = 1.0, seed: int = 0) -> None:
        self._service = service
        self.interval_s = interval_s
        self.seed = seed
        self._lock = threading.Lock()
        self._open: dict[str, _Open] = {}
        self._refresh = _Engine(interval_s)
        self._dry = _Engine(interval_s)
        self._external = _Engine(interval_s)          # another scheduler's pending work (external)
        self._external_learnt: set[str] = set()
        self.accuracy = Accuracy()
        self._wake = threading.Event()
        self.refreshes = 0
        self.last_refresh_s: float | None = None      # the service clock of the last refresh
        self.last_duration_s: float | None = None     # its wall time
        self.forecast_count = 0                       # pending workloads with a forecast after it
        self.observed = 0                             # finished running times learnt

    # -- what happened (under the service lock) -------------------------------------------------------
    def note(self, t: float, kind: str, w: Workload) -> None:
        """An event the service recorded (``submit``, ``admit``, ``preempt``, ``finish``,
        ``cancel``, ``reject``) at ``t``, of ``w`` as it is now."""
        with self._lock:
            self._note(t, kind, w)
        if kind == "submit":
            self._wake.set()

    def _note(self, t: float, kind: str, w: Workload) -> None:
        wid = w.id
        if kind == "submit":
            self._open[wid] = _Open(w, t)
            return
        o = self._open.get(wid)
        if o is None:
            return
        o.workload = w
        o.gen += 1
        if kind == "admit":
            if o.latest is not None and o.latest.made_s <= t:
                self.accuracy.add(w.queue, LATEST, o.latest.eta, t, o.since_s)
            if not o.started and o.submit is not None and o.submit.made_s <= t:
                self.accuracy.add(w.queue, SUBMIT, o.submit.eta, t, o.since_s)
            o.started, o.start_s, o.latest, o.submit = True, t, None, None
        elif kind == "preempt":
            if o.start_s is not None:
                o.ran_s = o.ran_s + t - o.start_s if w.checkpoint else 0.0
            o.start_s, o.since_s, o.latest = None, t, None
        elif kind == "finish":
            del self._open[wid]
            if o.start_s is not None:
                ran = max(0.0, (o.ran_s if w.checkpoint else 0.0) + t - o.start_s)
                self._refresh.inbox.append((w, ran))
                self._dry.inbox.append((w, ran))
                self.observed += 1
        elif kind in ("cancel", "reject"):
            del self._open[wid]

    def learn(self, stored: Iterable[ev.StoredEvent]) -> int:
        """Follow the stored history (in the order the events took effect), as :meth:`note`
        follows the live events: the finished workloads' running times feed the model, the open
        ones are followed from there. Returns the running times learnt."""
        before = self.observed
        with self._lock:
            for s in stored:
                e = s.event
                wid, kind = str(e.get("workload") or ""), str(e["event"])
                if not wid:
                    continue
                if kind == "submit":
                    if not s.spec:
                        continue
                    try:
                        w, _ = ev.parse_spec(s.spec)
                    except (ValueError, TypeError) as exc:
                        log.warning("forecasts: the stored spec of %s is not readable (%s)", wid, exc)
                        continue
                else:
                    o = self._open.get(wid)
                    if o is None:
                        continue
                    w = o.workload
                queue = str(e.get("queue") or w.queue)
                self._note(float(e["t"]), kind, w if queue == w.queue else replace(w, queue=queue))
        n = self.observed - before
        if n:
            log.info("forecasts: learnt %d finished workloads' running times from the stored history", n)
        return n

    # -- reads ----------------------------------------------------------------------------------
    def eta(self, workload_id: str) -> dict[str, str] | None:
        """The last refresh's forecast of a pending workload, as the API shows it; None when it
        has none (not forecast yet, held, or no finite forecast)."""
        o = self._open.get(workload_id)
        f = o.latest if o is not None else None
        return f.shown if f is not None else None

    def forecast_of(self, workload_id: str) -> Forecast | None:
        o = self._open.get(workload_id)
        return o.latest if o is not None else None

    def status(self) -> dict[str, Any]:
        """``GET /forecasts/accuracy``: the last refresh and the accuracy per queue."""
        with self._lock:
            rows = self.accuracy.rows()
            at, took, n = self.last_refresh_s, self.last_duration_s, self.forecast_count
        return {"refreshed_at": iso(at) if at is not None else None, "refresh_s": took, "forecasts": n,
                "learnt": self.observed, "queues": rows}

    def counters(self) -> dict[tuple[str, str], tuple[int, int, float, list[int]]]:
        with self._lock:
            return self.accuracy.counters()

    # -- forecasting (no service lock held) ----------------------------------------------------------
    def refresh(self, now: float) -> int:
        """Forecast every pending workload the next cycle would see: the snapshot under the
        service lock, the forward runs without it. Returns how many got a forecast."""
        svc = self._service
        with svc._lock:
            snap = svc._snapshot()
            with self._lock:
                gens = {w.id: o.gen for w in snap.pending if (o := self._open.get(w.id)) is not None}
                admitting = {r.workload.id for r in snap.running
                             if (o := self._open.get(r.workload.id)) is not None and o.start_s is None}
                done = self._done(snap, now)
        sampler = random.Random(self.seed * 1_000_003 + self.refreshes)
        self.refreshes += 1
        t0 = time.perf_counter()
        got = self._refresh.forecast(snap, now, sampler, gens, done, cycle=False) if gens else {}
        took = time.perf_counter() - t0
        n = 0
        with self._lock:
            for wid, o in self._open.items():
                gen = gens.get(wid)
                if gen is None:
                    # held (policy, namespace), cancelling, or running: no forecast now; an
                    # admission in flight keeps the one it had until it starts
                    if o.start_s is None and wid not in admitting:
                        o.latest = None
                    continue
                if gen != o.gen:
                    continue                       # it changed since the snapshot
                eta = got.get(wid)
                if eta is None:
                    o.latest = None
                    continue
                f = made(now, eta)
                o.latest = f
                if o.submit is None and not o.started:
                    o.submit = f
                n += 1
            self.last_refresh_s, self.last_duration_s, self.forecast_count = now, took, n
        if took > max(5.0, 2 * self.interval_s):
            log.info("forecasts: %d pending workloads forecast in %.1f s", len(gens), took)
        return n

    def _done(self, snap: Snapshot, now: float) -> dict[str, float]:
        """Running time done that counts towards each end, where earlier runs count (``_lock`` held)."""
        done: dict[str, float] = {}
        for r in snap.running:
            o = self._open.get(r.workload.id)
            if o is not None and o.ran_s > 0 and r.workload.checkpoint:
                done[r.workload.id] = o.ran_s + max(0.0, now - r.start_s)
        for w in snap.pending:
            o = self._open.get(w.id)
            if o is not None and o.ran_s > 0:
                done[w.id] = o.ran_s
        return done

    def dry_run(self, out: DryRun, snap: Snapshot | None, now: float) -> DryRun:
        """``out`` with the forecast of its workload on ``snap`` (the dry run's snapshot, with the
        workload in it), forecast alone; unchanged for a rejected one or without a snapshot."""
        if snap is None or out.outcome == "reject":
            return out
        with self._lock:
            done = self._done(snap, now)
        sampler = random.Random(self.seed * 1_000_003 - 1)
        eta = self._dry.forecast(snap, now, sampler, (out.workload,), done).get(out.workload)
        return replace(out, eta=made(now, eta).shown) if eta is not None else out

    def external(self, snap: Snapshot, first: Decisions, now: float, targets: Iterable[str],
                 finished: Iterable[tuple[Workload, float]] = ()) -> dict[str, dict[str, str]]:
        """Start-time forecasts of another scheduler's pending workloads (``queues_from: kueue``,
        ``yunikorn``) as gpuq would run them: forward from the advisor's run
        (:func:`scheduler.service.advisor.run`: ``snap`` is the live snapshot with them added,
        ``first`` its decisions at ``now``), by the same timeline as gpuq's own. So it is gpuq's
        forecast under gpuq's policy with the other scheduler's quotas, not that scheduler's.
        ``finished``: that scheduler's finished workloads with their running times; each teaches
        this forecast's duration model once (gpuq's own forecasts learn from gpuq's events only).
        Called from the accounting loop; an engine of its own, so it never waits for a refresh."""
        for w, ran in finished:
            if w.id not in self._external_learnt and ran >= 0:
                self._external_learnt.add(w.id)
                self._external.inbox.append((w, ran))
        sampler = random.Random(self.seed * 1_000_003 - 2)
        got = self._external.forecast(snap, now, sampler, tuple(targets), {}, cycle=False, first=first)
        return {wid: made(now, eta).shown for wid, eta in got.items()}

    # -- the loop ---------------------------------------------------------------------------------------
    def serve(self, stop: threading.Event, clock: Callable[[], float], every_s: float, gap_s: float) -> None:
        """Refresh until ``stop``: at least every ``every_s``, and after a submit, at most once per
        ``gap_s`` (``gpuq serve``: the accounting interval and the cycle interval)."""
        while not stop.is_set():
            try:
                self.refresh(clock())
            except Exception:  # a refresh that fails is retried at the next; the scheduler goes on
                log.exception("forecasts: refresh failed")
            if stop.wait(gap_s):
                break
            self._wake.wait(max(0.0, every_s - gap_s))
            self._wake.clear()

    def wake(self) -> None:
        """Refresh now (and let :meth:`serve` see a stop without waiting out its interval)."""
        self._wake.set()
