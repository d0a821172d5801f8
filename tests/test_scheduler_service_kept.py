"""The live scheduler keeps its snapshot between cycles (scheduler/service/kept.py) and reads back
only the reasons that changed: it must decide and say exactly what the cycle that rebuilt
everything every cycle did.

Each random history drives two services through the same steps: today's, and
:class:`benchmarks._service_baseline.RebuildingService` (today's service with the cycle of before:
the snapshot built from every entry, every reason compared with its entry's). The steps are those
that change entries: submits (resubmits of closed ids among them, the same workload object
included), cancels, finishes, removals, the declared time running out, admissions and preemptions
(with actuator failures and refused evictions), pauses and the preemption brake, queue file
reloads (policy holds, namespaces let go and held, queues made by placement), node changes, idle
flags, foreign work, dry runs, restarts (both rebuilt from their events), and changes that land
while a cycle decides without the lock. After every cycle the decisions (admissions, preemptions,
every reason) and every workload as the API shows it must be the same on both, every snapshot
built (no SnapshotError, no KeyError) and the books balanced (no node overcommitted); meanwhile the
autouse ``checked_snapshots`` fixture (tests/conftest.py) compares each kept snapshot with one
built from all entries.
"""
from __future__ import annotations

import dataclasses
import random
import threading
import time
import zlib
from collections.abc import Callable
from typing import Any

import pytest

import scheduler.service.core as service_core
from accounting.model import Allocation, milli
from accounting.queues import parse_queue_config
from benchmarks._service_baseline import RebuildingService
from scheduler import events as ev
from scheduler.actuators.base import ActionResult, DryRunActuator, Target
from scheduler.model import Node, Placement, Workload
from scheduler.service.brakes import PreemptionBrake
from scheduler.service.core import SchedulerService
from scheduler.service.errors import ServiceError
from scheduler.service.kept import difference, scratch
from scheduler.service.views import as_dict
from scheduler.snapshot import Settings
from scheduler.testing import nodes, wl

NAMESPACES = ("ml", "ops", "dev")
QUEUE_NAMES = ("a", "b", "team.x", "team.y", "tenants")


def config(version: int) -> dict[str, Any]:
    """The queue file, in four versions a history reloads among: priorities above 2 held for the
    policy in odd ones, ``b`` closed to ``ops`` in version 3, guarantees that move."""
    return {
        "policy": {"max_priority": 5 if version % 2 == 0 else 2, "non_preemptible": True},
        "queues": {
            "a": {"guaranteed": {"gpu": 8}, "max": {"gpu": 32}},
            "b": {"guaranteed": {"gpu": 8 if version < 2 else 16}, "max": {"gpu": 32},
                  "namespaces": ["ml", "ops", "dev"] if version != 3 else ["ml", "dev"]},
            "team": {"guaranteed": {"gpu": 8}, "max": {"gpu": 24},
                     "queues": {"x": {"guaranteed": {"gpu": 4 if version != 2 else 0}},
                                "y": {"strict_fifo": True}}},
            "tenants": {"max": {"gpu": 16},
                        "placement": {"namespace_queues": True, "template": {"max": {"gpu": 8}}}},
        },
    }


BASE_NODES = nodes(("h", "H100", 8, 3), ("a", "A100", 8, 2))


class Sink:
    """The events and state rows a service writes, read back as a store would for a restart."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def write(self, table: str, rows: Any) -> None:
        if table == ev.TABLE:
            self.rows.extend(rows)

    def stored(self) -> list[ev.StoredEvent]:
        rows = sorted(self.rows, key=lambda r: (r[2], r[3]))
        return [ev.StoredEvent(int(r[3]), ev.from_row(r[2:]), str(r[11])) for r in rows]


class Moody(DryRunActuator):
    """Answers by a hash of (verb, workload, how many times it was asked): some admissions and
    preemptions fail, some evictions are refused (a PodDisruptionBudget). The same calls get the
    same answers in both services of a pair. While ``gate`` is closed no call answers: the actions
    a cycle started stay in flight (the service's one worker waits in the first) until it opens."""

    def __init__(self) -> None:
        super().__init__()
        self.asked: dict[tuple[str, str], int] = {}
        self.gate = threading.Event()
        self.gate.set()
        self.waiting = 0                  # calls waiting at the gate

    def _answer(self, verb: str, w: Workload) -> ActionResult | None:
        self.waiting += 1
        try:
            assert self.gate.wait(60), "the gate stayed closed"
        finally:
            self.waiting -= 1
        n = self.asked[(verb, w.id)] = self.asked.get((verb, w.id), 0) + 1
        h = zlib.crc32(f"{verb}/{w.id}/{n}".encode()) % 12
        if h == 0:
            return ActionResult(False, f"test: {verb} of {w.id} failed")
        if h <= 3 and verb == "preempt":
            return ActionResult(False, "test: the disruption budget refuses", detail={"refused": True})
        return None

    def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        return self._answer("admit", workload) or super().admit(workload, target, placement)

    def preempt(self, workload: Workload, target: Target, reason: str) -> ActionResult:
        return self._answer("preempt", workload) or super().preempt(workload, target, reason)

    def cancel(self, workload: Workload, target: Target) -> ActionResult:
        return self._answer("cancel", workload) or super().cancel(workload, target)


def make(cls: type[SchedulerService], version: int = 0, sink: Sink | None = None) -> SchedulerService:
    return cls(parse_queue_config(config(version)), Moody(), nodes=BASE_NODES, settings=Settings(True, 5.0),
               sink=sink, cluster="c1", sleep=lambda s: None, retry_attempts=1, workers=1,
               brake=PreemptionBrake(per_queue=3, window_s=20.0), refused_backoff_s=4.0)


@pytest.fixture
def during_decisions(monkeypatch: pytest.MonkeyPatch) -> list[Callable[[], None] | None]:
    """A step to run while the cycle decides without the lock (set before a cycle, run once)."""
    hook: list[Callable[[], None] | None] = [None]
    schedule = service_core.schedule

    def deciding(snap: Any, now: float) -> Any:
        step, hook[0] = hook[0], None
        if step is not None:
            step()
        return schedule(snap, now)

    monkeypatch.setattr(service_core, "schedule", deciding)
    return hook


def shown(svc: SchedulerService, now: float) -> dict[str, Any]:
    """Everything the API shows that a cycle's decisions and reasons reach."""
    status = svc.status(now)
    return {"workloads": [as_dict(v) for v in svc.workloads()],
            "preemptions": [as_dict(p) for p in svc.preemptions()],
            "nodes": [as_dict(n) for n in svc.nodes()],
            "in_flight": status["in_flight"], "limited": status["preemptions_limited"]}


def balanced(svc: SchedulerService) -> None:
    """The books balance after a cycle: on every node the GPUs its running workloads (and foreign
    work) hold are what it shows used, never more than it has; gpuq's own never more than the
    node has at all."""
    own: dict[str, int] = {}
    for e in svc._entries.values():
        for node, n in e.running.placement.nodes if e.running is not None else ():
            own[node] = own.get(node, 0) + n
    held = dict(own)
    for r in svc.foreign_running():
        for node, n in r.placement.nodes:
            held[node] = held.get(node, 0) + n
    shown = {n.name: n for n in svc.nodes()}
    assert set(held) <= set(shown), (held, shown)
    for name, n in shown.items():
        assert n.used == held.get(name, 0) and 0 <= n.used <= n.gpus, (n, held)
    for node in svc._nodes:
        assert own.get(node.name, 0) <= node.gpus, (node, own)


class History:
    """One random history, applied step by step to a pair of services."""

    def __init__(self, seed: int, hook: list[Callable[[], None] | None]) -> None:
        self.rng = random.Random(seed)
        self.hook = hook
        self.sinks = [Sink(), Sink()]
        self.pair = [make(SchedulerService, sink=self.sinks[0]), make(RebuildingService, sink=self.sinks[1])]
        self.now = 100.0
        self.version = 0
        self.workloads: dict[str, Workload] = {}      # the last workload submitted under each id
        self.nodes = list(BASE_NODES)
        self.foreign: list[Allocation] = []
        self.cycles = self.decided = 0
        # every cycle builds its snapshot (SnapshotError, KeyError fail the history): no admission
        # starts where victims that were not stopped still run, and a node that leaves stays while
        # an admission in flight holds it (tests/test_scheduler_service_conservation.py)
        self.codes: set[str | None] = set()          # the reasons the workloads had after cycles
        self.held = False                             # actions kept in flight (the actuators' gates closed)
        self.acting: set[str] = set()                 # the in-flight states seen meanwhile

    def both(self, step: Callable[[SchedulerService], Any]) -> list[Any]:
        """``step`` on each service: the same result, or the same error."""
        out = []
        for svc in self.pair:
            try:
                out.append(step(svc))
            except ServiceError as exc:
                out.append((type(exc).__name__, str(exc)))
        assert out[0] == out[1], out
        return out

    def ids(self, state: str | None = None) -> list[str]:
        return sorted(v.id for v in self.pair[1].workloads(state=state) if v.state in ("pending", "running"))

    def workload(self) -> Workload:
        rng = self.rng
        wid = f"w{rng.randrange(90)}"
        old = self.workloads.get(wid)
        if old is not None and rng.random() < 0.5:
            return old                                # the same object again, once its first is closed
        w = wl(wid, rng.choice(QUEUE_NAMES), gpus=rng.choice((1, 2, 4, 8)), pods=rng.choice((1, 1, 2)),
               types=rng.choice(((), ("H100",), ("A100", "H100"))), priority=rng.choice((0, 0, 1, 3, 5)),
               preemptible=rng.random() < 0.85, submit_s=self.now, checkpoint=rng.random() < 0.5,
               duration_s=rng.choice((0.0, 10.0, 30.0, 90.0)))
        self.workloads[wid] = w
        return w

    def change(self, deciding: bool = False) -> Callable[[SchedulerService], Any]:
        """One random step that changes entries (not a cycle); ``deciding``: one that lands while a
        cycle decides (not a dry run: it waits for the cycle)."""
        rng, now = self.rng, self.now
        roll = rng.random() * (0.92 if deciding else 1.0)
        if roll < 0.55:
            w, ns = self.workload(), rng.choice(NAMESPACES)
            hold = rng.random() < 0.3
            return lambda s: s.submit(w, Target("RayJob", ns, w.id), now, actor="alice (admin)",
                                      hold_not_allowed=hold)
        active = self.ids()
        if roll < 0.62 and active and not self.held:          # (a cancel waits for the actions before it)
            wid = rng.choice(active)
            return lambda s: s.cancel(wid, now, by="bob")
        running = self.ids("running")
        if roll < 0.67 and running:
            wid = rng.choice(running)
            return lambda s: s.finish(wid, now)
        if roll < 0.69 and active:
            wid = rng.choice(active)
            return lambda s: s.remove(wid, now, "its object was deleted")
        if roll < 0.74:
            idle = rng.sample(running, len(running) // 2)
            return lambda s: s.set_idle(idle)
        if roll < 0.76:
            keys = [("ml", wid) for wid in rng.sample(running, len(running) // 3)]
            return lambda s: s.set_idle_targets(keys)
        if roll < 0.80:
            self.version = rng.randrange(4)
            cfg = parse_queue_config(config(self.version))
            return lambda s: s.set_config(cfg)
        if roll < 0.84:
            self.nodes = list(BASE_NODES) + rng.choice(([], [Node("l-0", "L40S", 8)], [Node("h-9", "H100", 4)]))
            if rng.random() < 0.3:
                self.nodes = self.nodes[1:]           # one leaves (kept while work runs there)
            ns = list(self.nodes)
            return lambda s: s.set_nodes(ns)
        if roll < 0.86:
            self.foreign = [Allocation("k", "ext", f"p{i}", f"u{i}", rng.choice(("a", "team.x", "")),
                                       rng.choice(("h-0", "a-1")), "H100", milli(rng.choice((1, 2))), 0.0, None)
                            for i in range(rng.randrange(3))]
            rows = list(self.foreign)
            return lambda s: s.set_observed(rows, lambda a: a.queue, lambda a: a.node, now, None)
        if roll < 0.89:                 # a snapshot for someone else (the forecasts' refresh)
            return lambda s: len(s._snapshot().pending)
        if roll < 0.92:
            return (lambda s: s.pause(now, "carol", "test")) if rng.random() < 0.5 else (lambda s: s.resume(now))
        w = dataclasses.replace(self.workload(), id="probe")
        ns = rng.choice(NAMESPACES)
        return lambda s: s.dry_run(w, now, ns)

    def hold(self, held: bool) -> None:
        """Keep the actions cycles start in flight (their answers wait), or let them all answer."""
        for svc in self.pair:
            gate = svc.actuator.gate       # type: ignore[attr-defined]
            gate.clear() if held else gate.set()
        if not held:
            for svc in self.pair:
                assert svc.wait_acting(30)
        self.held = held

    @staticmethod
    def settle(svc: SchedulerService) -> None:
        """Wait until the service's worker has nothing to do or waits at the gate: the actions that
        need no answer (their workload ended) have run, the others wait, whatever the threads'
        timing (the history then goes on the same way in both services)."""
        deadline = time.monotonic() + 30
        while svc._lanes.in_flight() and not svc.actuator.waiting:     # type: ignore[attr-defined]
            assert time.monotonic() < deadline, "the worker neither finished nor reached the gate"
            time.sleep(0.0005)

    def cycle(self) -> None:
        """A cycle on each (maybe with a step landing while it decides); the same decisions."""
        self.now += self.rng.choice((1.0, 1.0, 3.0, 8.0))
        if not self.held and self.rng.random() < 0.2:
            self.hold(True)
        mid = self.change(deciding=True) if self.rng.random() < 0.25 else None
        got: list[Any] = []
        for svc in self.pair:
            if mid is not None:
                self.hook[0] = lambda svc=svc: self._quiet(mid, svc)
            got.append(svc.cycle(self.now, wait=not self.held))
            if self.held:
                self.settle(svc)
            assert self.hook[0] is None                 # the step ran while the cycle decided
        a, b = got
        assert (a.admissions, a.preemptions) == (b.admissions, b.preemptions), self.now
        assert a.pending == b.pending, self.now
        self.cycles += 1
        self.decided += len(a.admissions) + len(a.pending)
        views = self.pair[0].workloads()
        self.codes.update(v.reason_code for v in views)
        for svc in self.pair:
            balanced(svc)
        self.acting.update(v.acting for v in views if v.acting)

    @staticmethod
    def _quiet(step: Callable[[SchedulerService], Any], svc: SchedulerService) -> None:
        try:
            step(svc)
        except ServiceError:            # (as in ``both``: alike in both services)
            pass

    def restart(self) -> None:
        """Both rebuilt from their events, as after a restart."""
        self.hold(False)
        for i, cls in enumerate((SchedulerService, RebuildingService)):
            fresh = make(cls, self.version, sink=self.sinks[i])
            fresh.set_nodes(self.nodes)
            fresh.restore(self.sinks[i].stored())
            self.pair[i] = fresh

    def run(self, steps: int) -> None:
        for k in range(steps):
            if self.held and self.rng.random() < 0.2:
                self.hold(False)
            roll = self.rng.random()
            if roll < 0.3:
                self.cycle()
            elif roll < 0.31 and k > 10:
                self.restart()
            else:
                self.both(self.change())
            self.both(lambda s: shown(s, self.now))
        self.hold(False)


def test_random_histories_decide_and_say_the_same_as_the_cycle_that_rebuilt_everything(
        during_decisions: list[Callable[[], None] | None]) -> None:
    assert SchedulerService.check_snapshots        # (tests/conftest.py) each kept snapshot checked too
    kinds: set[str] = set()
    codes: set[str | None] = set()
    for seed in range(6):
        h = History(seed, during_decisions)
        try:
            h.run(300)
        except AssertionError as exc:
            raise AssertionError(f"history {seed}: {exc}") from exc
        assert h.cycles > 60 and h.decided > 250, (seed, h.cycles, h.decided)     # they do decide things
        kinds.update(e.event["event"] for e in h.sinks[0].stored())
        codes |= h.codes
    # what they went through
    assert {"submit", "admit", "preempt", "finish", "cancel", "reject", "pause", "resume"} <= kinds, kinds
    assert {"policy", "queue_not_allowed", "paused", "no_fit", "quota_max", "strict_fifo", "actuator_failed",
            "preempted", "preemption_refused", "waiting_preemption_delay", "no_victims",
            "preemption_incomplete"} <= codes, codes      # (the last: not started where a victim ran on)


def test_a_change_that_is_not_touched_is_caught() -> None:
    """A mutation path that forgot to touch what it changed: the kept snapshot would go on deciding
    on the old entry; the check fails the cycle instead, and says where."""
    svc = make(SchedulerService)
    for i in range(5):                                          # the five nodes full
        svc.submit(wl(f"p{i}", "a" if i < 4 else "b", 8, submit_s=1.0), Target(), 1.0)
    svc.cycle(2.0)
    assert len(svc.workloads(state="running")) == 5
    svc.submit(wl("q", "team.x", 8, submit_s=3.0), Target(), 3.0)
    svc.cycle(4.0)
    assert svc.explain("q").reason_code == "no_fit"
    svc._entries["q"].policy = "held without a touch"          # what a forgotten _touch would leave
    with pytest.raises(AssertionError, match=r"pending: kept has \['q'\] that it should not"):
        svc.cycle(5.0)
    svc.check_snapshots = False                                 # the kept one was dropped: rebuilt
    svc.cycle(6.0)
    assert svc.explain("q").reason_code == "no_fit"           # (not read again: held, not decided on)


def test_difference_names_what_differs() -> None:
    c = make(SchedulerService)._cluster_now()
    w1, w2 = wl("w1", "a", 8), wl("w2", "a", 4)
    from scheduler.model import Running

    r = Running(w1, Placement("H100", (("h-0", 8),)), 0.0)
    base = scratch(c, (), (), (r,), Settings(), (w2,))
    assert difference(base, scratch(c, (), (), (r,), Settings(), (w2,))) is None
    assert "lacks ['w1']" in (difference(base, scratch(c, (), (), (r,), Settings(), (w2, w1))) or "")
    assert "running" in (difference(base, scratch(c, (), (), (), Settings(), (w2,))) or "")
    assert "settings" in (difference(base, scratch(c, (), (), (r,), Settings(False), (w2,))) or "")
