"""The live scheduler never overcommits a node, and a cycle never raises, whatever the actuator
answers and whenever nodes leave.

Two cases the random histories of tests/test_scheduler_service_kept.py found:

* an admission placed on GPUs that the same cycle's (or an earlier cycle's, still in flight)
  preemption frees must not start until those victims are stopped: when their eviction fails or
  is refused it stays pending (``preemption_incomplete``) instead of overcommitting the node, and
  while the eviction is still in flight it waits for the answer;
* a node that leaves while an admission to it is in flight stays in the cluster while the
  admission holds it (and while what it started runs there), then goes; an admission whose
  actuator call had not started yet when its node left is dropped, not carried out.

After every cycle the books must balance: on each node the GPUs that running workloads hold are
what :meth:`SchedulerService.nodes` says is used, and never more than the node has.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Collection
from typing import Any

import pytest

from accounting.queues import parse_queue_config
from scheduler.actuators.base import ActionResult, DryRunActuator, Target
from scheduler.model import Node, Placement, Workload
from scheduler.service import SchedulerService
from scheduler.snapshot import Settings
from scheduler.testing import nodes, wl

# b reclaims its guarantee from a, which borrows; team.x has no guarantee (it never preempts)
QUEUES = {"a": {"max": {"gpu": 16}}, "b": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}},
          "team": {"queues": {"x": {}}}}
NODES = nodes(("h", "H100", 8, 1))


class Gated(DryRunActuator):
    """The dry-run actuator whose answers to the verbs in ``held`` wait until :meth:`answer`; an
    eviction of an id in ``failing`` fails (``refused``: a PodDisruptionBudget refuses it)."""

    def __init__(self, failing: Collection[str] = (), refused: bool = False, held: Collection[str] = ()) -> None:
        super().__init__()
        self.failing, self.refused, self.held = set(failing), refused, set(held)
        self.gate = threading.Event()
        self.waiting: list[tuple[str, str]] = []

    def _wait(self, verb: str, w: Workload) -> None:
        if verb in self.held:
            self.waiting.append((verb, w.id))
            assert self.gate.wait(30), "the gate stayed closed"
            self.waiting.remove((verb, w.id))

    def answer(self) -> None:
        self.gate.set()

    def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        self._wait("admit", workload)
        return super().admit(workload, target, placement)

    def preempt(self, workload: Workload, target: Target, reason: str) -> ActionResult:
        self._wait("preempt", workload)
        if workload.id in self.failing:
            if self.refused:
                return ActionResult(False, "test: the disruption budget refuses", detail={"refused": True})
            return ActionResult(False, f"test: evicting {workload.id} failed")
        return super().preempt(workload, target, reason)

    def admitted(self) -> list[str]:
        return [a.workload for a in self.actions if a.verb == "admit"]


def make(act: DryRunActuator, node_list: list[Node] = NODES, workers: int = 4) -> SchedulerService:
    return SchedulerService(parse_queue_config({"queues": QUEUES}), act, nodes=node_list,
                            settings=Settings(True, 5.0), cluster="c1", sleep=lambda s: None,
                            retry_attempts=1, workers=workers)


def add(svc: SchedulerService, wid: str, queue: str, gpus: int, now: float) -> None:
    svc.submit(wl(wid, queue, gpus, submit_s=now), Target(), now)


def balanced(svc: SchedulerService, capacity: dict[str, int]) -> None:
    """The books balance: what runs on each node is what it shows used, within what it has (a node
    that left: what still runs there)."""
    held: dict[str, int] = {}
    for v in svc.workloads(state="running"):
        for node, n in (v.placement or {}).items():
            held[node] = held.get(node, 0) + n
    shown = {n.name: n for n in svc.nodes()}
    for node, n in held.items():
        assert node in shown, (node, held)
        assert shown[node].used == n, (node, shown[node], held)
        assert n <= capacity.get(node, shown[node].gpus), (node, n, capacity)
    for node, view in shown.items():
        assert 0 <= view.used <= view.gpus and view.free >= 0, view
        assert view.used == held.get(node, 0), (view, held)


def wait_for(cond: Any, what: str) -> None:
    deadline = time.monotonic() + 10
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def borrowed_then_reclaimed(svc: SchedulerService) -> None:
    """a1 borrows the whole node; b1 and b2 (4 GPUs each, b under its guarantee) arrive."""
    add(svc, "a1", "a", 8, 0.0)
    svc.cycle(1.0)
    add(svc, "b1", "b", 4, 2.0)
    add(svc, "b2", "b", 4, 2.0)
    svc.cycle(3.0)                                  # within the preemption delay: nothing yet


CAP = {"h-0": 8}


@pytest.mark.parametrize("refused", [False, True])
def test_an_admission_on_gpus_another_preemption_frees_waits_for_it_and_stays_pending_when_it_fails(
        refused: bool) -> None:
    act = Gated(failing={"a1"}, refused=refused, held={"preempt"})
    svc = make(act)
    borrowed_then_reclaimed(svc)
    d = svc.cycle(10.0, wait=False)
    # the cycle decided b1 (evicting a1) and b2 on the other half a1 frees
    assert [(a.workload.id, a.victims) for a in d.admissions] == [("b1", ("a1",)), ("b2", ())]
    wait_for(lambda: act.waiting == [("preempt", "a1")], "a1's eviction never started")
    time.sleep(0.05)                                 # (b2's job would run now if it did not wait for a1)
    assert act.admitted() == ["a1"] and svc.explain("b2").acting == "admitting"
    act.answer()
    assert svc.wait_acting(10)
    assert act.admitted() == ["a1"]                  # neither b1 nor b2: a1 still runs there
    assert svc.explain("a1").state == "running"
    b1, b2 = svc.explain("b1"), svc.explain("b2")
    assert (b1.state, b1.reason_code) == ("pending", "preemption_refused" if refused else "actuator_failed")
    assert (b2.state, b2.reason_code, b2.acting) == ("pending", "preemption_incomplete", None)
    assert "a1" in (b2.message or "") and "h-0" in (b2.message or "")
    balanced(svc, CAP)
    for t in (11.0, 12.0, 20.0, 40.0):               # every later cycle builds its snapshot
        svc.cycle(t)
        balanced(svc, CAP)
    if not refused:                                  # a1 is evicted at last: both start
        act.failing.clear()
        svc.cycle(41.0)
        balanced(svc, CAP)
        assert {v.id for v in svc.workloads(state="running")} == {"b1", "b2"}


def test_an_admission_on_gpus_a_preemption_frees_starts_once_it_succeeds() -> None:
    act = Gated(held={"preempt"})
    svc = make(act)
    borrowed_then_reclaimed(svc)
    svc.cycle(10.0, wait=False)
    wait_for(lambda: act.waiting == [("preempt", "a1")], "a1's eviction never started")
    time.sleep(0.05)
    assert act.admitted() == ["a1"]                  # b2 waits for a1's eviction
    act.answer()
    assert svc.wait_acting(10)
    assert act.admitted() == ["a1", "b1", "b2"]
    assert {v.id for v in svc.workloads(state="running")} == {"b1", "b2"}
    balanced(svc, CAP)


def test_a_later_cycle_placing_work_where_a_preemption_in_flight_frees_gpus_waits_for_it() -> None:
    """Cycle 1 evicts a1 (8 GPUs) for b1 (4); while the eviction is in flight cycle 2 places x1 on
    the other 4 (a1 is gone from its snapshot). The eviction fails: x1 does not start."""
    act = Gated(failing={"a1"}, held={"preempt"})
    svc = make(act)
    add(svc, "a1", "a", 8, 0.0)
    svc.cycle(1.0)
    add(svc, "b1", "b", 4, 2.0)
    svc.cycle(3.0)
    svc.cycle(10.0, wait=False)
    wait_for(lambda: act.waiting == [("preempt", "a1")], "a1's eviction never started")
    add(svc, "x1", "team.x", 4, 11.0)
    d = svc.cycle(12.0, wait=False)
    assert [(a.workload.id, a.placement.nodes) for a in d.admissions] == [("x1", (("h-0", 4),))]
    time.sleep(0.05)
    assert act.admitted() == ["a1"]
    act.answer()
    assert svc.wait_acting(10)
    assert act.admitted() == ["a1"]
    x1 = svc.explain("x1")
    assert (x1.state, x1.reason_code) == ("pending", "preemption_incomplete")
    balanced(svc, CAP)
    svc.cycle(13.0)
    balanced(svc, CAP)


def test_a_node_that_leaves_while_an_admission_to_it_is_in_flight_stays_until_the_work_is_gone() -> None:
    act = Gated(held={"admit"})
    two = nodes(("h", "H100", 8, 2))
    svc = make(act, two)
    add(svc, "w", "a", 8, 0.0)
    d = svc.cycle(1.0, wait=False)
    [(node, _)] = d.admissions[0].placement.nodes
    wait_for(lambda: act.waiting == [("admit", "w")], "w's admission never started")
    svc.set_nodes([n for n in two if n.name != node])           # it leaves, the admission in flight
    for t in (2.0, 3.0):                                         # the cycles go on (no KeyError)
        svc.cycle(t, wait=False)
        assert {n.name: n.used for n in svc.nodes()}.get(node) == 0
    act.answer()
    assert svc.wait_acting(10)
    assert svc.explain("w").state == "running"
    svc.cycle(4.0)
    balanced(svc, {n.name: n.gpus for n in two})
    assert {n.name: n.used for n in svc.nodes()}[node] == 8     # kept while w runs there
    svc.finish("w", 5.0)
    svc.cycle(6.0)
    assert node not in {n.name for n in svc.nodes()}            # gone with the work
    add(svc, "v", "a", 8, 7.0)
    add(svc, "u", "a", 8, 7.0)
    svc.cycle(8.0)
    assert len(svc.workloads(state="running")) == 1                # one node left, not two
    balanced(svc, {n.name: n.gpus for n in two})


def test_an_admission_not_carried_out_yet_when_its_node_leaves_is_dropped() -> None:
    """workers=1: w's admission waits behind another's answer; its node leaves meanwhile."""
    act = Gated(held={"admit"})
    two = nodes(("h", "H100", 8, 2))
    svc = make(act, two, workers=1)
    add(svc, "first", "a", 8, 0.0)
    add(svc, "w", "a", 8, 0.0)
    d = svc.cycle(1.0, wait=False)
    where = {a.workload.id: a.placement.nodes[0][0] for a in d.admissions}
    wait_for(lambda: act.waiting == [("admit", "first")], "the first admission never started")
    svc.set_nodes([n for n in two if n.name != where["w"]])
    svc.cycle(2.0, wait=False)                                   # no KeyError
    act.answer()
    assert svc.wait_acting(10)
    assert act.admitted() == ["first"]
    w = svc.explain("w")
    assert (w.state, w.acting) == ("pending", None) and where["w"] in (w.message or "")
    svc.cycle(3.0)
    assert where["w"] not in {n.name for n in svc.nodes()}
    assert svc.explain("w").state == "pending"                  # the one node left is full
    balanced(svc, {n.name: n.gpus for n in two})
