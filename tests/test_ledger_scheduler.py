"""The scheduler reads the ledger: foreign allocations occupy their nodes and count for their
queue; the queue view and the workloads agree at every moment; reconciliation names mismatches."""
from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounting.model import Allocation, milli
from accounting.queues import parse_queue_config
from accounting.resolve import Resolver
from scheduler.actuators.base import Target
from scheduler.actuators.base import DryRunActuator
from scheduler.service import SchedulerService
from scheduler.service.accounting import LiveAccounting
from scheduler.snapshot import Settings
from scheduler.testing import nodes, wl

QUEUES = {"queues": {"a": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}},
                     "b": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}},
                     "team": {"queues": {"x": {"max": {"gpu": 8}}, "y": {}}}}}
CONFIG = parse_queue_config(QUEUES)


def make(n: int = 3) -> SchedulerService:
    return SchedulerService(CONFIG, DryRunActuator(), nodes=nodes(("h", "H100", 8, n)), settings=Settings(True, 30.0),
                            cluster="c1", sleep=lambda s: None)


def pod(name: str, queue: str, node: str, gpus: float, ns: str = "ml", **kw: Any) -> Allocation:
    return Allocation("k", ns, name, f"uid-{name}", queue, node, "H100", milli(gpus), 0.0, None, **kw)


def observe(svc: SchedulerService, rows: list[Allocation], now: float = 5.0, grace: float | None = None) -> None:
    resolver = Resolver(CONFIG)
    svc.set_observed(rows, lambda a: resolver.queue(a.queue, a.namespace), lambda a: a.node, now, grace)


def test_foreign_pods_occupy_their_gpus_and_count_for_their_queue() -> None:
    svc = make(n=2)                                   # h0, h1: 8 GPUs each
    observe(svc, [pod("other-1", "team.x", "h-0", 6), pod("sys", "", "h-1", 2)])   # "" -> (unassigned)
    svc.submit(wl("x1", "team.x", 4), Target(), 0.0)  # x's max is 8: 6 foreign + 4 > 8
    svc.submit(wl("a1", "a", 8), Target(), 0.0)      # no node has 8 free: h0 has 2, h1 has 6
    svc.submit(wl("a2", "a", 6), Target(), 0.0)
    svc.cycle(1.0)
    views = {w.id: w for w in svc.workloads()}
    assert views["x1"].state == "pending" and views["x1"].reason_code == "quota_max"
    assert views["a1"].state == "pending"
    assert views["a2"].state == "running" and views["a2"].placement == {"h-1": 6}
    free = {n.name: n.free for n in svc.nodes()}
    assert free == {"h-0": 2, "h-1": 0}               # the foreign GPUs are not free
    (f,) = svc.foreign_running()
    assert (f.workload.queue, f.workload.gpus, f.workload.preemptible) == ("team.x", 6, False)


def test_foreign_work_is_never_a_victim() -> None:
    svc = make(n=1)
    observe(svc, [pod("big", "a", "h-0", 8)])          # queue a far over nothing; b below its guarantee
    svc.submit(wl("b1", "b", 8), Target(), 0.0)
    d = svc.cycle(1.0)
    assert not d.admissions and not d.preemptions
    assert svc.explain("b1").state == "pending"


def test_own_pods_are_recognised_by_workload_id_or_top_owner() -> None:
    svc = make(n=1)
    svc.submit(wl("w1", "a", 8), Target("RayJob", "ml", "train"), 0.0)
    svc.cycle(1.0)
    observe(svc, [pod("train-raycluster-abc-worker-1", "", "h-0", 8, owner_kind="RayJob", owner="train")])
    assert svc.foreign_running() == ()
    observe(svc, [pod("p", "", "h-0", 8, workload_id="w1")])
    assert svc.foreign_running() == ()


def test_reconciliation_names_drift_misplacement_and_foreign() -> None:
    svc = make(n=2)
    svc.submit(wl("w1", "a", 8), Target("RayJob", "ml", "one"), 0.0)
    svc.submit(wl("w2", "b", 8), Target("RayJob", "ml", "two"), 0.0)
    svc.cycle(1.0)
    chosen = svc.explain("w2").placement
    elsewhere = "h-1" if "h-0" in chosen else "h-0"
    rows = [pod("two-w", "", elsewhere, 8, owner="two", owner_kind="RayJob"), pod("stray", "b", "h9", 1)]
    observe(svc, rows, now=60.0, grace=120.0)
    assert {m.kind for m in svc.mismatches} == {"misplaced", "foreign"}
    observe(svc, rows, now=200.0, grace=120.0)
    kinds = {(m.kind, m.workload) for m in svc.mismatches}
    assert ("actuator_drift", "w1") in kinds and ("misplaced", "w2") in kinds and ("foreign", "ml/stray") in kinds
    assert svc.explain("w1").reason_code == "actuator_drift"
    observe(svc, [pod("one-x", "", n, g, owner="one") for n, g in svc.explain("w1").placement.items()],
            now=300.0, grace=120.0)
    assert svc.explain("w1").reason_code is None      # seen now: the reason goes


ops = st.lists(st.tuples(st.sampled_from(["submit", "finish", "cancel", "cycle"]),
                         st.sampled_from(["a", "b", "team.x", "team.y"]), st.integers(1, 8), st.integers(0, 30)),
               min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=ops)
def test_queues_agree_with_workloads_at_every_decision(seq: list[tuple[str, str, int, int]], store: Any) -> None:
    svc = make(n=3)
    acc = LiveAccounting(store, config=CONFIG)
    acc.admitted = svc.admitted_allocations
    acc.refresh(0.0, [])
    t = 0.0
    for i, (op, queue, gpus, k) in enumerate(seq):
        t += 1.0
        ids = [w.id for w in svc.workloads() if w.state in ("pending", "running")]
        if op == "submit":
            svc.submit(wl(f"w{i}", queue, gpus), Target(), t)
        elif op == "cycle":
            svc.cycle(t)
        elif ids:
            wid = ids[k % len(ids)]
            if op == "finish" and svc.state_of(wid) == "running":
                svc.finish(wid, t)
            elif op == "cancel":
                svc.cancel(wid, t)
        running: dict[str, float] = {}
        for w in svc.workloads(state="running"):
            running[w.queue] = running.get(w.queue, 0.0) + w.gpus
        rows = {r["queue"]: r for r in acc.rows() if r["gpu_type"] == "*"}
        for q in ("a", "b", "team.x", "team.y"):
            assert rows[q]["allocated"] == running.get(q, 0.0), (op, q)
            assert rows[q]["reserved"] == running.get(q, 0.0)
        assert rows["team"]["allocated"] == running.get("team.x", 0.0) + running.get("team.y", 0.0)


def test_admissions_are_written_to_the_ledger_and_closed() -> None:
    class Sink:
        def __init__(self) -> None:
            self.ledger: list[tuple[Any, ...]] = []

        def write(self, table: str, rows: Any) -> None:
            if table == "gpu_allocations":
                self.ledger.extend(rows)

    sink = Sink()
    svc = SchedulerService(CONFIG, DryRunActuator(), nodes=nodes(("h", "H100", 8, 2)), settings=Settings(True, 30.0),
                           cluster="c1", sleep=lambda s: None, sink=sink)
    svc.submit(wl("g", "a", 8, pods=2), Target(), 0.0)
    svc.cycle(1.0)
    opened = list(sink.ledger)
    assert len(opened) == 2 and {r[14] for r in opened} == {"admission"} and {r[15] for r in opened} == {"g"}
    assert all(r[12] is None for r in opened) and sum(r[8] for r in opened) == 16
    svc.finish("g", 9.0)
    closed = sink.ledger[2:]
    assert len(closed) == 2 and all(r[12] is not None for r in closed)
    assert all(c[13] > o[13] for o, c in zip(opened, closed))      # the end outranks the start
