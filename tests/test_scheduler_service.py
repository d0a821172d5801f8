"""The live scheduler service with the dry-run actuator: submit, cycle, admit, preempt, explain,
cancel, actuator failures, dry runs that change nothing, and the restart that rebuilds the state
from scheduler_events in chDB."""
from __future__ import annotations

import time
from typing import Any

import pytest

from accounting.queues import parse_queue_config
from scheduler import events as ev
from scheduler.actuators.base import ActionResult, DryRunActuator, Target
from scheduler.model import Placement, Workload
from scheduler.service import SchedulerService
from scheduler.service.errors import (
    ActuatorFailed,
    ConfigRejected,
    DuplicateWorkload,
    InvalidWorkload,
    NotActive,
    UnknownWorkload,
)
from scheduler.service.views import as_dict
from scheduler.snapshot import Settings
from scheduler.testing import nodes, wl
from tests.conftest import SCENARIOS

QUEUES = {"a": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}},
          "b": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}},
          "team": {"queues": {"x": {}, "y": {}}}}
POLICY = {"max_priority": 10}           # the priorities these tests submit (the queue policy, issue 17)


class Sink:
    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []
        self.ledger: list[tuple[Any, ...]] = []       # the admissions' gpu_allocations rows
        self.state: list[tuple[Any, ...]] = []        # scheduler_state (the open workloads, for restarts)

    def write(self, table: str, rows: Any) -> None:
        assert table in (ev.TABLE, "gpu_allocations", "scheduler_state")
        {ev.TABLE: self.rows, "gpu_allocations": self.ledger, "scheduler_state": self.state}[table].extend(rows)

    def events(self) -> list[tuple[str, str]]:
        return [(r[4], r[5]) for r in self.rows]


class Flaky(DryRunActuator):
    """Fails ``verb`` for the ids in ``failing`` (retryable when asked)."""

    def __init__(self, verb: str, failing: set[str], retryable: bool = False) -> None:
        super().__init__()
        self.verb, self.failing, self.retryable, self.calls = verb, failing, retryable, 0

    def _fail(self, verb: str, w: Workload) -> ActionResult | None:
        if verb == self.verb and w.id in self.failing:
            self.calls += 1
            return ActionResult(False, f"test: {verb} {w.id} refused", retryable=self.retryable)
        return None

    def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        return self._fail("admit", workload) or super().admit(workload, target, placement)

    def preempt(self, workload: Workload, target: Target, reason: str) -> ActionResult:
        return self._fail("preempt", workload) or super().preempt(workload, target, reason)

    def cancel(self, workload: Workload, target: Target) -> ActionResult:
        return self._fail("cancel", workload) or super().cancel(workload, target)


def make(actuator: Any = None, sink: Any = None, n: int = 2, **kw: Any) -> SchedulerService:
    return SchedulerService(parse_queue_config({"queues": QUEUES, "policy": POLICY}), actuator or DryRunActuator(),
                            nodes=nodes(("h", "H100", 8, n)), settings=Settings(True, 30.0), sink=sink,
                            cluster="c1", sleep=lambda s: None, **kw)


NO_TARGET = Target()


def add(svc: SchedulerService, wid: str, queue: str, gpus: int = 8, pods: int = 1, now: float = 0.0,
        target: Target = NO_TARGET, **kw: Any) -> Any:
    return svc.submit(wl(wid, queue, gpus, pods, submit_s=now, **kw), target, now)


def fill_a_then_b(svc: SchedulerService, t0: float = 0.0) -> None:
    """Queue a borrows the whole cluster (a2 the younger); b (below its guarantee) arrives at t=10."""
    add(svc, "a1", "a", now=t0)
    svc.cycle(t0 + 1.0)
    add(svc, "a2", "a", now=t0 + 1.5)
    svc.cycle(t0 + 2.0)
    add(svc, "b1", "b", now=t0 + 10.0)


def test_submit_then_cycle_admits_and_records_events() -> None:
    sink = Sink()
    svc = make(sink=sink)
    view = add(svc, "w1", "a", gpus=4, pods=2, target=Target("RayJob", "ml", "train"))
    assert (view.state, view.reason_code, view.position) == ("pending", "queued", 1)
    d = svc.cycle(1.0)
    assert [a.workload.id for a in d.admissions] == ["w1"]
    w = svc.explain("w1")
    assert (w.state, w.gpu_type, w.start_s, w.reason_code, w.position) == ("running", "H100", 1.0, None, None)
    assert sum(w.placement.values()) == 8
    assert sink.events() == [("submit", "w1"), ("admit", "w1")]
    submit, admit = sink.rows
    assert ev.parse_spec(submit[11]) == (wl("w1", "a", 4, 2, submit_s=0.0), Target("RayJob", "ml", "train"))
    assert [r[3] for r in sink.rows] == [1, 2]                   # seq
    assert admit[1] == "c1" and admit[8] == w.placement and admit[11] == ""
    assert svc.stats.admissions == {"a": 1} and svc.stats.cycles == 1


@pytest.mark.parametrize("wid, queue, error, field", [
    ("w1", "a", DuplicateWorkload, None),
    ("w2", "nope", InvalidWorkload, "queue"),
    ("w2", "team", InvalidWorkload, "queue"),          # a parent queue takes no workloads
], ids=["duplicate", "unknown-queue", "parent-queue"])
def test_submit_refusals(wid: str, queue: str, error: type[Exception], field: str | None) -> None:
    svc = make()
    add(svc, "w1", "a")
    with pytest.raises(error) as info:
        add(svc, wid, queue)
    if field:
        assert info.value.field == field and queue in str(info.value)


def test_never_fitting_workload_is_rejected_at_submit() -> None:
    sink = Sink()
    svc = make(sink=sink)
    view = add(svc, "big", "a", gpus=8, pods=3)                   # 24 > a's max 16
    assert view.state == "rejected" and view.reason_code == "never_fits" and "max is 16" in view.message
    assert sink.events() == [("submit", "big"), ("reject", "big")]
    assert svc.workloads(state="pending") == []
    add(svc, "big", "a", gpus=8, pods=1)                         # a closed id may come again
    assert svc.explain("big").state == "pending"


def test_preemption_after_delay_with_reasons_history_and_event_order() -> None:
    sink = Sink()
    svc = make(sink=sink)
    fill_a_then_b(svc)
    svc.cycle(11.0)
    b1 = svc.explain("b1")
    assert (b1.state, b1.reason_code, b1.position) == ("pending", "waiting_preemption_delay", 1)
    assert "may preempt at t=40" in b1.message
    d = svc.cycle(40.0)
    assert [p.victims for p in d.preemptions] == [("a2",)]         # the youngest, same priority
    assert svc.explain("b1").state == "running"
    a2 = svc.explain("a2")
    assert (a2.state, a2.reason_code, a2.preempted) == ("pending", "preempted", 1)
    assert "preempted by b1" in a2.message
    [rec] = svc.preemptions()
    assert (rec.t, rec.preemptor, rec.queue, rec.victims, rec.victim_queues) == (40.0, "b1", "b", ("a2",), ("a",))
    assert sink.events()[-2:] == [("preempt", "a2"), ("admit", "b1")]
    assert sink.rows[-2][9] == "b1" and "reclaim guaranteed for b" in sink.rows[-2][10]
    assert svc.stats.preemptions == {"a": 1}
    svc.cycle(41.0)                                               # a2 cannot come back: no further preemption
    assert svc.explain("a2").state == "pending" and len(svc.preemptions()) == 1


def test_positions_follow_priority_then_submit_time() -> None:
    svc = make(n=1)
    add(svc, "r", "a")
    svc.cycle(1.0)
    add(svc, "p1", "a", now=2.0)
    add(svc, "p2", "a", now=3.0, priority=5)
    add(svc, "p3", "a", now=4.0)
    svc.cycle(5.0)
    assert {w.id: w.position for w in svc.workloads(state="pending")} == {"p2": 1, "p1": 2, "p3": 3}
    assert svc.explain("p3").reason_code == "no_fit"
    assert [w.id for w in svc.workloads(queue="team")] == []
    assert [w.id for w in svc.workloads(queue="a", state="running")] == ["r"]


def test_cancel_pending_and_running() -> None:
    sink = Sink()
    act = DryRunActuator()
    svc = make(act, sink)
    add(svc, "run", "a")
    svc.cycle(1.0)
    add(svc, "wait", "a", gpus=8, pods=2)
    assert svc.cancel("wait", 2.0, by="alice").state == "cancelled"
    assert svc.cancel("run", 3.0).state == "cancelled"
    assert [(a.verb, a.workload) for a in act.actions][-2:] == [("cancel", "wait"), ("cancel", "run")]
    assert sink.events()[-2:] == [("cancel", "wait"), ("cancel", "run")]
    assert sink.rows[-2][10] == "cancelled by alice"
    assert all(n.used == 0 for n in svc.nodes())
    with pytest.raises(NotActive):
        svc.cancel("run", 4.0)
    with pytest.raises(UnknownWorkload):
        svc.cancel("ghost", 4.0)
    assert svc.explain("run").end_s == 3.0


def test_failed_cancel_keeps_the_workload() -> None:
    svc = make(Flaky("cancel", {"w"}))
    add(svc, "w", "a")
    with pytest.raises(ActuatorFailed):
        svc.cancel("w", 1.0)
    assert svc.explain("w").state == "pending"


def test_admission_failure_becomes_the_reason_and_is_retried_next_cycle() -> None:
    sink = Sink()
    act = Flaky("admit", {"w"}, retryable=True)
    svc = make(act, sink)
    add(svc, "w", "a")
    add(svc, "ok", "b")
    svc.cycle(1.0)
    w = svc.explain("w")
    assert (w.state, w.reason_code) == ("pending", "actuator_failed")
    assert "test: admit w refused" in w.message and act.calls == 4     # with_retries' attempts
    assert svc.explain("ok").state == "running"
    assert ("admit", "w") not in sink.events() and svc.stats.actuator_failures == {"admit": 1}
    act.failing.clear()
    svc.cycle(2.0)
    assert svc.explain("w").state == "running"


def test_preemption_failure_keeps_victim_running_and_preemptor_pending() -> None:
    act = Flaky("preempt", {"a2"})
    svc = make(act)
    fill_a_then_b(svc)
    svc.cycle(40.0)
    assert svc.explain("a2").state == "running"
    b1 = svc.explain("b1")
    assert b1.reason_code == "actuator_failed" and "preempting a2 failed" in b1.message
    assert svc.preemptions() == []
    act.failing.clear()
    svc.cycle(41.0)
    assert svc.explain("b1").state == "running" and svc.explain("a2").state == "pending"


def test_actuator_exception_is_a_failure_not_a_crash() -> None:
    class Broken(DryRunActuator):
        def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
            raise RuntimeError("boom")

    svc = make(Broken())
    add(svc, "w", "a")
    svc.cycle(1.0)
    assert "RuntimeError: boom" in (svc.explain("w").message or "")


def snapshot_of(svc: SchedulerService) -> list[dict[str, Any]]:
    return [as_dict(w) for w in svc.workloads()] + [as_dict(n) for n in svc.nodes()]


def test_dry_run_changes_nothing_and_names_victims() -> None:
    sink = Sink()
    act = DryRunActuator()
    svc = make(act, sink)
    fill_a_then_b(svc)
    before, rows, actions = snapshot_of(svc), list(sink.rows), list(act.actions)
    now = svc.dry_run(wl("what-if", "b"), 11.0)
    assert now.outcome == "pending" and now.reason_code == "waiting_preemption_delay"
    later = now.after_delay
    assert later is not None and later.at_s == 41.0
    # b1 (older) takes the first victim; the what-if would be second in line
    assert later.also_admitted == ("b1",) and later.outcome == "pending"
    solo = svc.dry_run(wl("b1", "b"), 50.0)                       # id clash: renamed, not refused
    assert solo.workload == "b1~dry-run"
    free = svc.dry_run(wl("x", "team.x", gpus=8), 11.0)           # no guarantee: may not preempt
    assert free.outcome == "pending" and free.reason_code == "no_fit" and "no preemption" in (free.message or "")
    assert svc.dry_run(wl("huge", "a", gpus=8, pods=4), 11.0).outcome == "reject"
    assert snapshot_of(svc) == before and sink.rows == rows and act.actions == actions


def test_dry_run_preempt_outcome_lists_victims() -> None:
    svc = make()
    add(svc, "a1", "a")
    svc.cycle(1.0)
    add(svc, "a2", "a", now=1.5)
    svc.cycle(2.0)
    d = svc.dry_run(wl("q", "b"), 5.0)
    assert d.after_delay is not None and d.after_delay.outcome == "preempt"
    assert [(v.id, v.queue, v.gpus) for v in d.after_delay.victims] == [("a2", "a", 8)]
    assert svc.explain("a2").state == "running"


def test_duration_finishes_by_itself_and_checkpoint_keeps_progress() -> None:
    sink = Sink()
    svc = make(sink=sink)
    add(svc, "a1", "a")
    svc.cycle(1.0)
    add(svc, "a2", "a", now=1.5, duration_s=100.0, checkpoint=True)
    svc.cycle(2.0)
    add(svc, "b1", "b", now=3.0)
    svc.cycle(33.0)                                               # a2 preempted after 31 s of 100
    assert svc.explain("a2").state == "pending"
    svc.cancel("b1", 34.0)
    svc.cycle(35.0)                                               # a2 back at 35: 69 s left
    svc.cycle(103.9)
    assert svc.explain("a2").state == "running"
    svc.cycle(104.0)
    assert svc.explain("a2").state == "finished" and sink.events()[-1] == ("finish", "a2")


def test_finish_reported_by_the_world() -> None:
    svc = make()
    add(svc, "w", "a")
    with pytest.raises(NotActive):
        svc.finish("w", 1.0)                                      # pending: nothing to finish
    svc.cycle(1.0)
    assert svc.finish("w", 2.0).state == "finished"


def test_config_that_orphans_live_workloads_is_refused() -> None:
    svc = make()
    add(svc, "w", "team.x")
    with pytest.raises(ConfigRejected, match="team.x"):
        svc.set_config(parse_queue_config({"queues": {"a": {}, "b": {}}}))
    svc.set_config(parse_queue_config({"queues": {**QUEUES, "c": {}}}))
    assert "c" in svc.config.leaves()


def test_a_node_that_leaves_stays_while_work_runs_there() -> None:
    svc = make()
    add(svc, "w", "a")
    svc.cycle(1.0)
    [held] = [n.name for n in svc.nodes() if n.used]
    svc.set_nodes([n for n in nodes(("h", "H100", 8, 2)) if n.name != held])
    assert {n.name: n.used for n in svc.nodes()}[held] == 8
    add(svc, "v", "a")
    svc.cycle(2.0)                                                # placed on the node still there
    assert svc.explain("v").state == "running" and held not in (svc.explain("v").placement or {})


def test_idle_targets_mark_running_workloads() -> None:
    svc = make()
    add(svc, "job", "a", target=Target("RayJob", "ml", "train"))
    add(svc, "pod", "b", target=Target("Pod", "ml", "p"))
    svc.cycle(1.0)
    svc.set_idle_targets({("ml", "train-raycluster-x7k2"), ("other", "p")})
    assert svc.explain("job").idle and not svc.explain("pod").idle


def test_pending_demand_for_the_accounting() -> None:
    svc = make()
    add(svc, "w", "a", gpus=4, pods=2, types=("H100",), target=Target("RayJob", "ml", "t"))
    [d] = svc.pending_demand()
    assert (d.cluster, d.namespace, d.workload, d.queue, d.gpus, d.gpu_model) == ("c1", "ml", "w", "a", 8.0, "H100")


def test_simulator_events_round_trip_through_table_rows() -> None:
    from scheduler.simulator import run_scenario

    result = run_scenario(SCENARIOS / "gang-and-fallback.yaml")
    rows = [ev.to_row(e, i, "sim", epoch_s=1.7e9) for i, e in enumerate(result.events)]
    # the table keeps no ``devices`` (which device a gang holds is the replay's, issue 19)
    assert [ev.from_row(r[2:11]) for r in rows] == [{k: v for k, v in e.items() if k != "devices"}
                                                   for e in result.events]


# -- restart: rebuild from scheduler_events in chDB ---------------------------------------------------
T0 = float(int(time.time()) // 3600 * 3600)     # stored rows need recent times: the TTL drops old ones


def run_history(svc: SchedulerService) -> None:
    fill_a_then_b(svc, T0)
    add(svc, "b2", "b", now=T0 + 12, target=Target("RayJob", "ml", "b2", entrypoint="python t.py",
                                                   metadata={"k": "v"}))
    add(svc, "gone", "team.x", now=T0 + 13)
    svc.cancel("gone", T0 + 14)
    svc.cycle(T0 + 40)
    add(svc, "never", "a", gpus=8, pods=4, now=T0 + 41)


def test_restart_rebuilds_state_from_scheduler_events(store: Any, tmp_path: Any) -> None:
    from gpuq.store.writer import BatchWriter

    writer = BatchWriter(store, tmp_path / "spill")
    first = make(sink=writer)
    run_history(first)
    writer.flush()
    stored = ev.read_events(store, "c1")
    assert [e.event["event"] for e in stored] == ["submit", "admit", "submit", "admit", "submit", "submit",
                                                  "submit", "cancel", "preempt", "admit", "submit", "reject"]
    assert ev.read_events(store, "other-cluster") == []

    second = make(sink=writer)
    assert second.restore(stored) == len(stored)
    strip = ("reason_code", "message", "actuator_message")

    def view(s: SchedulerService) -> list[dict[str, Any]]:
        return [{k: v for k, v in as_dict(w).items() if k not in strip} for w in s.workloads()]

    assert view(second) == view(first)
    assert [as_dict(p) for p in second.preemptions()] == [as_dict(p) for p in first.preemptions()]
    assert second.explain("b2").target == {"kind": "RayJob", "namespace": "ml", "name": "b2"}
    assert second.explain("a2").reason_code == "preempted" and second.explain("b2").reason_code == "queued"
    # the restored service goes on where the first stopped: same decisions, seq continues
    d1, d2 = first.cycle(T0 + 50), second.cycle(T0 + 50)
    assert (d1.admissions, d1.pending) == (d2.admissions, d2.pending)
    add(second, "next", "b", now=T0 + 51)
    writer.flush()
    seqs = [e.seq for e in ev.read_events(store, "c1")]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_restore_skips_events_whose_submit_expired() -> None:
    svc = make()
    admit = ev.StoredEvent(5, ev.event(3.0, "admit", "old", "a", gpu_type="H100", placement={"h-0": 8}), "")
    assert svc.restore([admit]) == 0 and svc.workloads() == []
    add(svc, "new", "a", now=4.0)                                  # seq continues after 5
    assert svc._seq == 6



# -- in step with the world (scheduler.service.sources) ------------------------------------------------
class FakeSource:
    def __init__(self) -> None:
        self.pending_: list[tuple[Workload, Target]] = []
        self.admitted_: list[tuple[Workload, Target, str]] = []

    def pending(self) -> list[tuple[Workload, Target]]:
        return list(self.pending_)

    def admitted(self) -> list[tuple[Workload, Target, str]]:
        return list(self.admitted_)


def test_sync_listed_submits_new_objects_and_removes_deleted_ones() -> None:
    from scheduler.service.sources import sync_listed

    svc = make()
    src = FakeSource()
    job = wl("rayjob/ml/train", "a", 8, 1)
    big = wl("rayjob/ml/huge", "a", 8, 4)
    src.pending_ = [(job, Target("RayJob", "ml", "train")), (big, Target("RayJob", "ml", "huge"))]
    add(svc, "api-made", "b")                                      # not the source's: never removed
    r = sync_listed(svc, src, 1.0)
    assert r.submitted == ("rayjob/ml/train", "rayjob/ml/huge") and r.removed == ()
    assert svc.state_of("rayjob/ml/huge") == "rejected"
    svc.cycle(2.0)
    src.pending_ = [(big, Target("RayJob", "ml", "huge"))]          # still suspended: not submitted again
    src.admitted_ = [(job, Target("RayJob", "ml", "train"), "H100")]
    assert sync_listed(svc, src, 3.0) == type(r)()
    src.admitted_ = []                                              # the RayJob was deleted
    assert sync_listed(svc, src, 4.0).removed == ("rayjob/ml/train",)
    assert svc.state_of("rayjob/ml/train") == "finished" and svc.state_of("api-made") == "running"
    src.admitted_ = [(wl("rayjob/ml/lost", "a"), Target("RayJob", "ml", "lost"), "H100")]
    assert sync_listed(svc, src, 5.0).unknown_admitted == ("rayjob/ml/lost",)


def test_sync_ray_finishes_workloads_whose_job_ended() -> None:
    from scheduler.actuators.ray import RayJobState
    from scheduler.service.sources import sync_ray

    class Jobs(DryRunActuator):
        def __init__(self) -> None:
            super().__init__()
            self.status_of: dict[str, str] = {}

        def status(self, w: Workload) -> RayJobState | None:
            s = self.status_of.get(w.id)
            return None if s is None else RayJobState("sub", 0, s)

    act = Jobs()
    svc = make(act)
    add(svc, "r1", "a", target=Target("RaySubmission", entrypoint="python a.py"))
    add(svc, "r2", "a", target=Target("RaySubmission", entrypoint="python b.py"))
    svc.cycle(1.0)
    act.status_of = {"r1": "SUCCEEDED", "r2": "RUNNING"}
    assert sync_ray(svc, act, 2.0) == ["r1"]
    assert svc.state_of("r1") == "finished" and svc.state_of("r2") == "running"


def test_make_actuator_from_settings() -> None:
    from gpuq.errors import ConfigError
    from gpuq.settings import load_settings
    from scheduler.actuators.factory import make_actuator

    assert make_actuator(load_settings(None)).name == "dry-run"
    with pytest.raises(ConfigError, match="dashboard"):
        make_actuator(load_settings(None, scheduler={"actuator": "ray"}))
    ray = make_actuator(load_settings(None, scheduler={"actuator": "ray"},
                                      collector={"ray": [{"cluster": "c", "dashboard_url": "http://127.0.0.1:1"}]}))
    assert ray.name == "ray"
    ray.close()  # type: ignore[attr-defined]
