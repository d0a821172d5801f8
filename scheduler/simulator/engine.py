"""The simulated clock around the production core: ``schedule()`` runs on a grid of
``cycle_interval_s``; the clock jumps over idle stretches to the next grid time at or after the
next submit, finish or preemption-delay expiry or end of a minimum runtime, so a long trace costs what its events cost.

At one instant the order is: finishes (in start order), the ends and then the starts of fixed load
(the scenario's optional ``fixed:``, below), submits (in file order, each followed by
its ``reject`` if it can never run or is over its queue's policy, :mod:`scheduler.policy`), then the cycle's preemptions, each just before its
preemptor's admission. A preempted workload goes back to pending; it keeps what it ran when it
``checkpoint``s and starts over otherwise.

With ``eta`` (:class:`EtaOptions`, ``gpuq simulate --eta``) each cycle that sees workloads
submitted since the last one forecasts their start (:mod:`scheduler.forecast`) from that cycle's
snapshot and decisions, with a duration model fed by the finishes so far, and puts it on their
``submit`` event as ``eta``. The forecast runs on its own copy of the cluster and reads nothing
the replay decides with: the events are the same with or without it, ``eta`` keys aside.

Fixed load (:class:`scheduler.simulator.scenario.Fixed`) runs beside the core as a non-preemptible
running workload (``fixed:<id>``, in its queue, or in the root when it has none: held outside every
leaf queue, bounded by no max), as the live service runs the foreign work it sees: it is never a
victim and makes no event. At its start it takes its node when the GPUs are free there, else the
node of its GPU type with the fewest free GPUs that has room (the replay may have placed work
where history did not), else it is *displaced*: not held, and named in the summary. A scenario
without ``fixed:`` runs exactly as before: nothing of this is touched.

Fair share over time (``scheduler.usage_half_life_s`` > 0, issue 21): each queue's decayed usage
(:class:`accounting.decay.DecayedUsage`) follows the replay's own starts and stops (admits,
finishes, preemptions, and fixed load held in a queue) on the simulated clock, and every cycle's
snapshot carries it at the cycle's time (:attr:`scheduler.snapshot.Snapshot.usage`): a pure
function of the events so far, the same on every run. Off (0, the default), no snapshot carries
usage and nothing of this runs.
"""
from __future__ import annotations

import gc
import heapq
import math
import random
import time
from bisect import insort
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from accounting.decay import DecayedUsage
from scheduler.cycle import never_fits, schedule
from scheduler.events import event as make_event
from scheduler.forecast import MIN_SAMPLES, RUNS, ArrivalModel, DurationModel, Forecaster
from scheduler.model import Decisions, Placement, Running, Workload, gpus_out, lost_gpu_seconds, whole
from scheduler.timeline import HIGH, LOW, MID, Timeline
from scheduler.policy import refusal
from scheduler.progress import Progress
from scheduler.simulator.report import HeldLoad, QueueStats, SimResult, summarize
from scheduler.simulator.scenario import Fixed, Scenario
from scheduler.snapshot import Cluster, Occupancy, PendingChanges, Snapshot, occupancy_after, occupancy_of

class Devices:
    """Which physical devices of each node every running gang holds (an ``admit``'s ``devices``,
    issue 19). The core counts whole free devices per node and names the devices that shares hold
    part of by *slot* (:attr:`scheduler.model.Placement.shares`); this table gives each gang its
    device indices: a whole gang the lowest free ones, a slot the lowest free device when the core
    first opens it, kept while any share holds it. The core never places more than a node holds,
    so a free device is always there; running short is a bug, said loudly."""

    def __init__(self, cluster: Cluster) -> None:
        self.free: dict[str, list[int]] = {n.name: list(range(n.gpus)) for n in cluster.nodes}  # sorted
        self.slot_dev: dict[tuple[str, int], int] = {}
        self.slot_used: dict[tuple[str, int], Decimal] = {}
        self.held: dict[str, tuple[Placement, dict[str, dict[str, int | float]]]] = {}   # id -> placement, devices

    def _lowest(self, node: str) -> int:
        free = self.free[node]
        if not free:
            raise AssertionError(f"node {node}: no free device left for a placement the core made")
        return free.pop(0)

    def take(self, wid: str, p: Placement) -> dict[str, dict[str, int | float]]:
        """Give ``wid`` devices for ``p``; its ``devices`` as an event carries them."""
        out: dict[str, dict[str, int | float]] = {}
        self.held[wid] = (p, out)
        if not p.shares:
            for node, n in p.nodes:
                out[node] = {str(self._lowest(node)): 1 for _ in range(int(n))}
            return out
        for node, slot, share in p.shares:
            key = (node, slot)
            dev = self.slot_dev.get(key)
            if dev is None:
                dev = self.slot_dev[key] = self._lowest(node)
            self.slot_used[key] = self.slot_used.get(key, Decimal(0)) + share
            out.setdefault(node, {})[str(dev)] = gpus_out(share)
        return out

    def give(self, wid: str) -> None:
        """Give back what ``wid`` holds."""
        p, devices = self.held.pop(wid)
        if p.shares:
            for node, slot, share in p.shares:
                key = (node, slot)
                left = self.slot_used[key] - share
                if left:
                    self.slot_used[key] = left
                else:
                    del self.slot_used[key]
                    insort(self.free[node], self.slot_dev.pop(key))
            return
        for node, on in devices.items():
            for d in on:
                insort(self.free[node], int(d))


EPS = 1e-9
ROOT = "root"             # the queue tree's implicit root: fixed load outside every leaf queue
FIXED_PREFIX = "fixed:"


@dataclass(frozen=True, slots=True)
class EtaOptions:
    """How ``simulate`` forecasts start times: ``method`` ``"timeline"`` (:mod:`scheduler.timeline`,
    what the live service runs: one event-driven timeline per quantile, ``levels``) or ``"runs"``
    (:class:`scheduler.forecast.Forecaster`: the core run forward ``runs`` times per forecast), the duration model's ``min_samples`` and ``prior_s``, the ``seed`` of the sampler
    (each forecast draws from ``random.Random(seed * 1_000_003 + cycle)``), and ``arrivals``: also
    draw the work that will arrive (:class:`scheduler.forecast.ArrivalModel`), off by default
    (docs/PERFORMANCE.md, "Start-time forecasts": it helps where arrivals repeat the past and
    overshoots badly where they come in bursts unlike it, at several times the cost)."""

    runs: int = RUNS
    method: str = "timeline"
    levels: tuple[float, float, float] = (LOW, MID, HIGH)
    spread: bool = True                  # the timeline's middle path a stratified sample (scheduler.timeline._Quantiles)
    min_samples: int = MIN_SAMPLES
    prior_s: float = 3600.0
    seed: int = 0
    arrivals: bool = False


class _Eta:
    """The forecasting side of a replay: the model fed by finishes, the submit events waiting for
    their forecast, and what each workload ran in earlier runs that counts (checkpoints)."""

    def __init__(self, sc: Scenario, opts: EtaOptions) -> None:
        self.opts = opts
        self.model = DurationModel(opts.min_samples, opts.prior_s)
        self.arrivals = ArrivalModel() if opts.arrivals else None
        if opts.method not in ("timeline", "runs"):
            raise ValueError(f"unknown forecasting method {opts.method!r} (timeline or runs)")
        self.forecaster: Forecaster | Timeline = (
            Timeline(sc.cluster, sc.cycle_interval_s, opts.levels, opts.spread) if opts.method == "timeline"
            else Forecaster(sc.cluster, sc.cycle_interval_s, opts.runs))
        self.fresh: dict[str, dict[str, Any]] = {}      # id -> its submit event, not yet forecast
        self.ran: dict[str, float] = {}                 # earlier runs that count (checkpointed)
        self.wall_s = 0.0
        self.forecasts = 0


class _Sim:
    def __init__(self, sc: Scenario, schedule_fn: Callable[[Snapshot, float], Decisions],
                 eta: EtaOptions | None = None) -> None:
        self.sc = sc
        self.schedule_fn = schedule_fn
        self.cluster = sc.cluster
        self.events: list[dict[str, Any]] = []
        self.pending: dict[str, Workload] = {}
        # what the last snapshot's pending was, and what left and joined it since (in that order)
        self.last_pending: tuple[Workload, ...] | None = None
        self.removed: list[Workload] = []
        self.added: list[Workload] = []
        self.running: dict[str, Running] = {}
        self.ends: dict[str, tuple[float, int]] = {}
        self.heap: list[tuple[float, int, str]] = []
        self.left: dict[str, float] = {}           # running time still needed
        self.seq = 0
        self.next_submit = 0
        self.expiry: list[tuple[float, str]] = []   # (submit + preemption delay, id)
        # (start + its queue's min_runtime_s, id): when running work may first be a victim
        self.protected: list[tuple[float, str]] = []
        self.min_runtime = {q: c.min_runtime_s for q, c in sc.cluster.config.queues.items() if c.min_runtime_s > 0}
        # the occupancy as last computed, and what stopped and started since (see settle)
        self.occ: Occupancy = occupancy_of(sc.cluster, ())
        self.stopped: list[Running] = []
        self.started: list[Running] = []
        self.started_ids: set[str] = set()
        self.stats = {q: QueueStats() for q in sorted(sc.cluster.config.leaves())}
        self.first_admit: dict[str, float] = {}
        self.cycles = 0
        self.core_s = 0.0
        self.gpu_seconds = 0.0
        self.last_t = 0.0
        self.eta = _Eta(sc, eta) if eta is not None else None
        # fixed load (only touched when the scenario has some): the next to start, those held now
        # (id -> (entry, its running record)) with their ends in a heap, and what was held or not
        self.next_fixed = 0
        self.holding: dict[str, tuple[Fixed, Running]] = {}
        self.fixed_ends: list[tuple[float, int, str]] = []
        self.held: list[HeldLoad] = []
        self.displaced: list[str] = []
        self.devices = Devices(sc.cluster)
        # fair share over time (scheduler.usage_half_life_s > 0): each queue's decayed usage, fed by
        # every start and stop below; None when off (the snapshots then carry no usage)
        h = sc.settings.usage_half_life_s
        self.decayed = DecayedUsage(h) if h > 0 else None

    def emit(self, t: float, event: str, w: Workload, **extra: Any) -> None:
        self.events.append(make_event(t, event, w.id, w.queue, **extra))
        self.last_t = max(self.last_t, t)

    def advance(self, until: float) -> None:
        """Apply finishes, fixed load and submits up to ``until``, in time order (on a tie: finishes,
        fixed load, submits)."""
        subs = self.sc.workloads
        fixed = bool(self.sc.fixed)
        while True:
            self._drop_stale()
            tf = self.heap[0][0] if self.heap else math.inf
            ts = subs[self.next_submit].submit_s if self.next_submit < len(subs) else math.inf
            tx = self._next_fixed() if fixed else math.inf
            if min(tf, ts, tx) > until + EPS:
                break
            if tx < tf and tx <= ts:
                self._fixed_step(tx)
            elif tf <= ts:
                _, _, wid = heapq.heappop(self.heap)
                self._stop(wid, tf)
                r = self.stopped[-1]
                self.emit(tf, "finish", r.workload)
                self.stats[r.workload.queue].finished += 1
                if self.eta is not None:
                    self.eta.model.observe(r.workload, self.eta.ran.pop(wid, 0.0) + tf - r.start_s)
            else:
                w = subs[self.next_submit]
                self.next_submit += 1
                self.emit(ts, "submit", w)
                over = refusal(self.cluster.config, w)
                why = f"policy: {over.message}" if over is not None else never_fits(self.cluster, w)
                if why is not None:
                    self.emit(ts, "reject", w, reason=why)
                    self.stats[w.queue].rejected += 1
                else:
                    if self.eta is not None:
                        self.eta.fresh[w.id] = self.events[-1]
                        if self.eta.arrivals is not None:
                            self.eta.arrivals.observe(w)
                    self.pending[w.id] = w
                    self.added.append(w)
                    self.left[w.id] = w.duration_s
                    heapq.heappush(self.expiry, (w.submit_s + self.sc.settings.preemption_delay_s, w.id))

    def _next_fixed(self) -> float:
        """The time of the next end or start of fixed load (``inf``: none left)."""
        te = self.fixed_ends[0][0] if self.fixed_ends else math.inf
        fx = self.sc.fixed
        return min(te, fx[self.next_fixed].start_s if self.next_fixed < len(fx) else math.inf)

    def _fixed_step(self, t: float) -> None:
        """Release the fixed load that ends at ``t``, or else hold the next that starts at ``t``."""
        self.settle()
        fx = self.sc.fixed
        if self.fixed_ends and self.fixed_ends[0][0] <= t:
            _, _, fid = heapq.heappop(self.fixed_ends)
            self._release(fid, t)
            return
        f = fx[self.next_fixed]
        self.next_fixed += 1
        node = self._room(f)
        if node is None:
            self.displaced.append(f.id)
            return
        gpu_type = self.cluster.nodes[self.cluster.node_index[node]].gpu_type
        w = Workload(FIXED_PREFIX + f.id, f.queue or ROOT, 1, f.gpus, (gpu_type,), 0, False, t)
        r = Running(w, Placement(gpu_type, ((node, f.gpus),)), t)
        self.occ = occupancy_after(self.cluster, self.occ, (), (r,))
        self.devices.take(w.id, r.placement)
        if self.decayed is not None and f.queue is not None:
            self.decayed.change(f.queue, float(f.gpus), t)
        self.holding[f.id] = (f, r)
        if f.end_s is not None:
            heapq.heappush(self.fixed_ends, (f.end_s, self.next_fixed, f.id))

    def _room(self, f: Fixed) -> str | None:
        """Where ``f`` is held: its node when it has the GPUs free, else the node of its type with
        the fewest free GPUs that has room (the first in cluster order on a tie), else None."""
        c, free = self.cluster, self.occ.node_free
        i = c.node_index[f.node]
        if free[i] >= f.gpus:
            return f.node
        room = [(free[j], j) for j in c.type_nodes[c.nodes[i].gpu_type] if free[j] >= f.gpus]
        return c.nodes[min(room)[1]].name if room else None

    def _release(self, fid: str, t: float) -> None:
        f, r = self.holding.pop(fid)
        self.occ = occupancy_after(self.cluster, self.occ, (r,), ())
        self.devices.give(r.workload.id)
        if self.decayed is not None and f.queue is not None:
            self.decayed.change(f.queue, -float(f.gpus), t)
        self._log_hold(f, r, t)

    def _log_hold(self, f: Fixed, r: Running, t: float) -> None:
        p = r.placement
        self.held.append(HeldLoad(f.id, f.queue, p.gpu_type, {n: whole(g) for n, g in p.nodes}, r.start_s, t))

    def _drop_stale(self) -> None:
        while self.heap and self.ends.get(self.heap[0][2], (0.0, -1))[1] != self.heap[0][1]:
            heapq.heappop(self.heap)

    def _stop(self, wid: str, t: float) -> None:
        r = self.running.pop(wid)
        del self.ends[wid]
        self.devices.give(wid)
        if wid in self.started_ids:     # its start is not counted yet: count it before its stop
            self.settle()
        self.stopped.append(r)
        self.gpu_seconds_add(r, t)
        if self.decayed is not None:
            self.decayed.change(r.workload.queue, -float(r.workload.gpus), t)

    def gpu_seconds_add(self, r: Running, t: float) -> None:
        gs = float(r.workload.gpus) * (t - r.start_s)
        self.gpu_seconds += gs
        self.stats[r.workload.queue].gpu_seconds += gs

    def settle(self) -> None:
        """Bring the occupancy up to date, in one ``occupancy_after`` for all that stopped and started
        since it was last computed (each call copies every node's free count and every queue's
        usage: on a trickle of arrivals that, twice a cycle, cost as much as half the core).
        ``occupancy_after`` returns stopped GPUs before it takes started ones, which gives the same
        counts as taking each change in its order as long as nothing both started and stopped in
        between; ``_stop`` settles first when that would happen. Nothing changed: the same object."""
        if self.stopped or self.started:
            self.occ = occupancy_after(self.cluster, self.occ, self.stopped, self.started)
            self.stopped, self.started = [], []
            self.started_ids.clear()

    def cycle(self, now: float) -> Decisions:
        self.settle()
        pending = tuple(self.pending.values())
        changes = None
        if self.last_pending is not None:
            changes = PendingChanges(self.last_pending, tuple(self.removed), tuple(self.added))
        self.last_pending, self.removed, self.added = pending, [], []
        running = tuple(self.running.values())
        if self.holding:                    # fixed load runs too: never a victim (not preemptible)
            running += tuple(r for _, r in self.holding.values())
        usage = self.decayed.at(now) if self.decayed is not None else None
        snap = Snapshot(self.cluster, running, pending, self.occ, self.sc.settings, changes, usage)
        t0 = time.perf_counter()
        decisions = self.schedule_fn(snap, now)
        self.core_s += time.perf_counter() - t0
        self.cycles += 1
        if self.eta is not None and self.eta.fresh:
            self.forecast(snap, now, decisions)
        self.apply(decisions, now)
        return decisions

    def forecast(self, snap: Snapshot, now: float, decisions: Decisions) -> None:
        """Forecast the start of the workloads submitted since the last cycle, from ``snap`` and
        this cycle's ``decisions``, and put it on their submit events."""
        eta = self.eta
        assert eta is not None
        t0 = time.perf_counter()
        done = {wid: ran + (now - self.running[wid].start_s if wid in self.running else 0.0)
                for wid, ran in eta.ran.items()}
        sampler = random.Random(eta.opts.seed * 1_000_003 + self.cycles)
        got = eta.forecaster.forecast(snap, now, eta.model, sampler, targets=eta.fresh, done_s=done,
                                      first=decisions, arrivals=eta.arrivals)
        for wid, ev in eta.fresh.items():
            e = got.get(wid)
            if e is not None:
                ev["eta"] = e.as_dict()
        eta.fresh = {}
        eta.forecasts += 1
        eta.wall_s += time.perf_counter() - t0

    def apply(self, d: Decisions, now: float) -> None:
        why = {p.preemptor: p.reason for p in d.preemptions}
        started: list[Running] = []
        for a in d.admissions:
            w = a.workload
            for vid in a.victims:
                self._stop(vid, now)
                v = self.stopped[-1]
                vw = v.workload
                # a workload that checkpoints resumes where it stopped: it loses nothing (issue 21)
                lost = round(lost_gpu_seconds(v, now, now if vw.checkpoint else None), 6) + 0.0
                self.emit(now, "preempt", vw, by=w.id, reason=why[w.id], lost_gpu_seconds=lost)
                self.stats[vw.queue].preempted += 1
                self.stats[vw.queue].lost_gpu_seconds += lost
                self.left[vid] = self.left[vid] - (now - v.start_s) if vw.checkpoint else vw.duration_s
                if self.eta is not None and vw.checkpoint:
                    self.eta.ran[vid] = self.eta.ran.get(vid, 0.0) + now - v.start_s
                self.pending[vid] = vw
                self.added.append(vw)
                heapq.heappush(self.expiry, (vw.submit_s + self.sc.settings.preemption_delay_s, vid))
            del self.pending[w.id]
            self.removed.append(w)
            devices = self.devices.take(w.id, a.placement)
            self.emit(now, "admit", w, gpu_type=a.placement.gpu_type, placement=a.placement.as_output(),
                      devices=devices)
            if w.id not in self.first_admit:
                self.first_admit[w.id] = now
                self.stats[w.queue].admitted += 1
                self.stats[w.queue].waits.append(now - w.submit_s)
            r = Running(w, a.placement, now)
            self.running[w.id] = r
            protect = self.min_runtime.get(w.queue)
            if protect:                  # a cycle when it may first be a victim (issue 21)
                heapq.heappush(self.protected, (now + protect, w.id))
            if self.decayed is not None:
                self.decayed.change(w.queue, float(w.gpus), now)
            started.append(r)
            self.seq += 1
            end = now + self.left[w.id]
            self.ends[w.id] = (end, self.seq)
            heapq.heappush(self.heap, (end, self.seq, w.id))
        self.started += started            # counted at the next settle()
        self.started_ids.update(r.workload.id for r in started)

    def next_event(self, now: float) -> float | None:
        """The earliest time after ``now`` at which a cycle could decide differently."""
        self._drop_stale()
        subs = self.sc.workloads
        times = []
        if self.heap:
            times.append(self.heap[0][0])
        if self.next_submit < len(subs):
            times.append(subs[self.next_submit].submit_s)
        ex = self.expiry
        while ex and (ex[0][0] <= now + EPS or ex[0][1] not in self.pending):
            heapq.heappop(ex)
        if ex and self.sc.settings.preemption:
            times.append(ex[0][0])
        pr = self.protected
        while pr and (pr[0][0] <= now + EPS or pr[0][1] not in self.running):
            heapq.heappop(pr)
        if pr and self.pending and self.sc.settings.preemption:   # a victim its min runtime protected
            times.append(pr[0][0])
        if self.fixed_ends and self.pending:    # GPUs fixed load gives back may start a pending one
            times.append(self.fixed_ends[0][0])
        return min(times) if times else None


def simulate(sc: Scenario, schedule_fn: Callable[[Snapshot, float], Decisions] = schedule,
             progress: Progress | None = None, eta: EtaOptions | None = None) -> SimResult:
    """Replay ``sc``. ``schedule_fn`` is the production :func:`scheduler.cycle.schedule`; the
    benchmarks pass a baseline policy here to measure it on the same clock. ``progress``
    (:class:`scheduler.progress.Progress`) shows simulated time, events and what is left; it never
    changes the replay. ``eta`` puts a start-time forecast on each submit event (module
    docstring); it never changes the replay either."""
    sim = _Sim(sc, schedule_fn, eta)
    # A large replay keeps almost everything it makes (workloads, events, the cycles' memos) and
    # makes no reference cycles, so the collector's full passes over that heap find nothing and
    # land in some cycle's time (a quarter of the core's time on the 50,000-workload backlog).
    # What survives a cycle is frozen out of them (gc.freeze moves lists: no pass) and given back
    # at the end; young collections still run.
    frozen = len(sc.workloads) >= 5_000 and gc.isenabled() and gc.get_freeze_count() == 0
    if frozen:
        gc.collect()
        gc.freeze()
    try:
        return _run(sim, sc, progress, frozen)
    finally:
        if frozen:
            gc.unfreeze()


def _run(sim: _Sim, sc: Scenario, progress: Progress | None, freeze: bool) -> SimResult:
    dt = sc.cycle_interval_s
    until = math.inf if sc.until_s is None else sc.until_s
    k = 0
    while k * dt <= until + EPS:
        now = k * dt
        sim.advance(now)
        d = sim.cycle(now)
        if freeze:
            gc.freeze()
        if progress is not None and progress.due():
            _show(progress, sim, now, until)
        if d.admissions:
            k += 1
            continue
        e = sim.next_event(now)
        if e is None:
            break
        k = max(k + 1, math.ceil(e / dt - EPS))
    if progress is not None:
        progress.close()
    if sc.until_s is not None:
        sim.advance(until)
    end = sim.last_t
    unfinished = bool(sim.running or sim.pending or sim.next_submit < len(sc.workloads))
    if sc.until_s is not None and unfinished:
        end = until
    for r in sim.running.values():
        sim.gpu_seconds_add(r, end)
    for f, h in list(sim.holding.values()):        # fixed load still held: counted to the end
        sim._log_hold(f, h, max(end, h.start_s))
    return summarize(sc, sim.events, sim.stats, end, sim.gpu_seconds, sim.cycles, sim.core_s,
                     held=tuple(sim.held), displaced=tuple(sim.displaced))


def _show(progress: Progress, sim: _Sim, now: float, until: float) -> None:
    """Done = workloads finished or rejected out of all (or the clock's share of ``until``)."""
    total = len(sim.sc.workloads)
    done = sum(q.finished + q.rejected for q in sim.stats.values())
    frac = done / total if total else 1.0
    if until != math.inf and until > 0:
        frac = max(frac, now / until)
    progress.show(frac, 1.0, f"t={now:,.0f} s  events {len(sim.events):,}  pending {len(sim.pending):,}  "
                  f"running {len(sim.running):,}  done {done:,}/{total:,}")
