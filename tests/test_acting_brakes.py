"""The brakes on acting (issue 9, item 16): the admin pause (decisions shown, nothing acted,
recorded so a restart stays paused), the preemption limit (the admission waits with its reason;
the window refilled from scheduler_events at start) and PodDisruptionBudget refusals (the victim
keeps running, both workloads say why, retried after a backoff; the real ``kubernetes`` client
against tests/k8s_api_server.py's 429 Status with the DisruptionBudget cause). The cluster-wide
limit across victim queues, and both limits taken from the config file by a real `gpuq serve`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from accounting.queues import parse_queue_config
from gpuq.settings import CollectorSettings, KubernetesTarget, Settings as GpuqSettings
from scheduler import events as ev
from scheduler.actuators.base import ActionResult, DryRunActuator, Target
from scheduler.actuators.kubernetes import KubernetesActuator
from scheduler.model import Placement, Workload
from scheduler.service import SchedulerService
from scheduler.service.brakes import PreemptionBrake
from scheduler.service.metrics import SchedulerCollector
from scheduler.snapshot import Settings
from scheduler.testing import nodes, wl
from tests.k8s_api_server import ApiServer
from tests.test_scheduler_service import QUEUES, T0
from tests.test_serve import Server, serve_config, servers  # noqa: F401 - servers is a fixture

POD = Target("Pod", "team-nlp", "bert-finetune-0")
EVICTION = "/api/v1/namespaces/team-nlp/pods/bert-finetune-0/eviction"


def make(actuator: Any = None, sink: Any = None, **kw: Any) -> SchedulerService:
    return SchedulerService(parse_queue_config({"queues": QUEUES}), actuator or DryRunActuator(),
                            nodes=nodes(("h", "H100", 8, 2)), settings=Settings(True, 30.0), sink=sink,
                            cluster="c1", sleep=lambda s: None, **kw)


def fill_a_then_b(svc: SchedulerService, victim_target: Target = Target()) -> None:
    """a1, a2 fill the cluster for queue a; b1 (b below its guarantee) arrives at T0+10 and may
    preempt a2 (the younger) from T0+40 (the preemption delay is 30 s)."""
    svc.submit(wl("a1", "a", 8, 1, submit_s=T0), Target(), T0)
    svc.cycle(T0 + 1)
    svc.submit(wl("a2", "a", 8, 1, submit_s=T0 + 1.5), victim_target, T0 + 1.5)
    svc.cycle(T0 + 2)
    svc.submit(wl("b1", "b", 8, 1, submit_s=T0 + 10), Target(), T0 + 10)


def metrics(svc: SchedulerService) -> str:
    reg = CollectorRegistry()
    reg.register(SchedulerCollector(svc))
    return generate_latest(reg).decode()


def test_pause_decides_but_does_not_act_and_a_restart_stays_paused(store: Any, tmp_path: Path) -> None:
    from gpuq.store.writer import BatchWriter

    writer = BatchWriter(store, tmp_path / "spill")
    act = DryRunActuator()
    svc = make(act, sink=writer)
    fill_a_then_b(svc)
    done = len(act.actions)
    svc.pause(T0 + 20, by="oncall (admin)", reason="incident 42")
    svc.cycle(T0 + 41)
    assert len(act.actions) == done                           # nothing acted
    b1, a2 = svc.explain("b1"), svc.explain("a2")
    assert (b1.state, b1.reason_code, a2.state) == ("pending", "paused", "running")
    assert "would admit on H100 (h-1:8) after preempting a2" in b1.message
    assert "by oncall (admin)" in b1.message and "incident 42" in b1.message
    assert svc.status(T0 + 41)["paused"] is True
    assert "gpuq_scheduler_paused 1.0" in metrics(svc)
    writer.flush()

    again = make(act, sink=writer)                            # a restart on the same store
    again.restore(ev.read_events(store, "c1"))
    again.load_brakes(store, T0 + 50)
    assert again.paused is not None and again.paused.by == "oncall (admin)"
    again.cycle(T0 + 51)
    assert len(act.actions) == done and again.explain("b1").reason_code == "paused"

    assert again.resume(T0 + 60, by="oncall (admin)") is True
    again.cycle(T0 + 61)
    assert [(a.verb, a.workload) for a in act.actions[done:]] == [("preempt", "a2"), ("admit", "b1")]
    assert again.explain("b1").state == "running" and again.explain("a2").state == "pending"
    writer.flush()
    kinds = [e.event["event"] for e in ev.read_events(store, "c1") if e.event["event"] in ("pause", "resume")]
    assert kinds == ["pause", "resume"]
    third = make(act)
    third.load_brakes(store, T0 + 70)
    assert third.paused is None                               # resumed stays resumed
    writer.close()


def test_a_pause_outlives_the_events_retention(store: Any, tmp_path: Path) -> None:
    """The pause is restart state: kept in scheduler_state (no TTL), so a restart after the pause's
    scheduler_events rows expired is still paused, and after a resume it is not."""
    from gpuq.store.writer import BatchWriter

    writer = BatchWriter(store, tmp_path / "spill")
    svc = make(DryRunActuator(), sink=writer)
    svc.pause(T0, by="oncall (admin)", reason="incident 43")
    writer.flush()
    store.command(f"ALTER TABLE {store.database}.{ev.TABLE} DELETE WHERE 1 SETTINGS mutations_sync = 1")
    assert not ev.read_events(store, "c1")                      # what a TTL leaves

    again = make(DryRunActuator(), sink=writer)
    again.load_brakes(store, T0 + 50)
    assert again.paused is not None and (again.paused.by, again.paused.reason) == ("oncall (admin)", "incident 43")
    again.resume(T0 + 60, by="oncall (admin)")
    writer.flush()
    store.command(f"ALTER TABLE {store.database}.{ev.TABLE} DELETE WHERE 1 SETTINGS mutations_sync = 1")
    third = make(DryRunActuator())
    third.load_brakes(store, T0 + 70)
    assert third.paused is None
    writer.close()


def test_preemption_limit_holds_the_admission_with_its_reason() -> None:
    act = DryRunActuator()
    svc = make(act, brake=PreemptionBrake(per_queue=1, cluster=None))
    svc.brake.load([(T0 - 100, "a")])                        # one preemption of queue a in the hour
    fill_a_then_b(svc)
    svc.cycle(T0 + 41)
    b1 = svc.explain("b1")
    assert (b1.state, b1.reason_code) == ("pending", "preemption_limited")
    assert "would preempt a2" in b1.message and "1 workloads of queue a" in b1.message
    assert "per_queue_per_hour 1" in b1.message and f"t={T0 - 100 + 3600}" in b1.message
    assert svc.explain("a2").state == "running" and "preempt" not in [a.verb for a in act.actions]
    text = metrics(svc)
    assert 'gpuq_scheduler_preemptions_limited_total{queue="b"} 1.0' in text
    assert 'gpuq_scheduler_preemptions_window{queue="a"} 1.0' in text
    assert 'gpuq_scheduler_preemption_limit{scope="queue"} 1.0' in text
    svc.cycle(T0 - 100 + 3600.5)                              # the hour has passed
    assert svc.explain("b1").state == "running" and svc.explain("a2").state == "pending"
    assert svc.status(T0 + 3600)["preemptions_last_hour"] == {"a": 1}


def test_the_preemption_window_is_refilled_from_the_store(store: Any, tmp_path: Path) -> None:
    from gpuq.store.writer import BatchWriter

    writer = BatchWriter(store, tmp_path / "spill")
    svc = make(sink=writer)
    fill_a_then_b(svc)
    svc.cycle(T0 + 41)
    assert svc.explain("a2").state == "pending"               # preempted: one in queue a's window
    writer.flush()
    again = make(brake=PreemptionBrake(per_queue=1))
    again.restore(ev.read_events(store, "c1"))
    again.load_brakes(store, T0 + 60)
    assert again.brake.counts(T0 + 60) == {"a": 1}
    assert again.brake.check(T0 + 60, [("a1", "a")]) is not None      # a restart does not release the brake
    assert again.brake.check(T0 + 41 + 3600.5, [("a1", "a")]) is None
    writer.close()


class EvictingActuator(KubernetesActuator):
    """The real kubernetes actuator for preempt (a Pod: the Eviction API); admissions of the
    target-less workloads are the dry-run's."""

    def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        return DryRunActuator().admit(workload, target, placement)


def test_a_pdb_refusal_keeps_the_victim_and_retries_after_a_backoff(tmp_path: Path) -> None:
    with ApiServer(pods=[("team-nlp", "bert-finetune-0")]) as api:
        settings = GpuqSettings(collector=CollectorSettings(kubernetes=[
            KubernetesTarget(cluster="test", kubeconfig=str(api.kubeconfig(tmp_path / "kubeconfig")))]))
        act = EvictingActuator(settings, sleep=lambda _s: None, events=False)
        try:
            svc = make(act, refused_backoff_s=30.0)
            fill_a_then_b(svc, victim_target=POD)
            api.block_eviction("team-nlp", "bert-finetune-0", "bert-pdb")
            svc.cycle(T0 + 41)
            assert len(api.calls("POST", "/eviction")) == 1        # a refusal is not hammered
            a2, b1 = svc.explain("a2"), svc.explain("b1")
            assert (a2.state, a2.reason_code) == ("running", "preemption_refused")
            assert "refused by PodDisruptionBudget" in a2.message and "bert-pdb" in a2.message
            assert (b1.state, b1.reason_code) == ("pending", "preemption_refused")
            assert "preempting a2" in b1.message and f"will retry at t={T0 + 71}" in b1.message
            assert api.has_pod("team-nlp", "bert-finetune-0")
            assert svc.stats.actuator_failures.get("preempt") == 1

            svc.cycle(T0 + 50)                                      # within the backoff: no call
            assert len(api.calls("POST", "/eviction")) == 1
            b1 = svc.explain("b1")
            assert b1.reason_code == "preemption_refused" and "will retry at t=" in b1.message
            assert svc.brake.counts(T0 + 50) == {}                  # a refusal is no preemption

            with api._lock:
                api._state.blocked.clear()                          # the budget allows it now
            svc.cycle(T0 + 72)
            assert len(api.calls("POST", "/eviction")) == 2
            assert svc.explain("a2").state == "pending" and svc.explain("b1").state == "running"
            assert not api.has_pod("team-nlp", "bert-finetune-0")
        finally:
            act.close()


# -- the cluster-wide limit ------------------------------------------------------------------------

# p is owed 16 GPUs; x and y borrow 8 each (no guarantee): p's two workloads preempt one of x's
# and one of y's, two preemptions in two different victim queues
SPREAD = {"p": {"guaranteed": {"gpu": 16}, "max": {"gpu": 16}},
          "x": {"max": {"gpu": 16}}, "y": {"max": {"gpu": 16}}}


def spread(brake: PreemptionBrake) -> tuple[SchedulerService, DryRunActuator]:
    """x1 and y1 fill the two nodes; p1 and p2 arrive at T0+10 and may preempt from T0+40."""
    act = DryRunActuator()
    svc = SchedulerService(parse_queue_config({"queues": SPREAD}), act, nodes=nodes(("h", "H100", 8, 2)),
                           settings=Settings(True, 30.0), cluster="c1", sleep=lambda s: None, brake=brake)
    for i, (wid, q) in enumerate((("x1", "x"), ("y1", "y"))):
        svc.submit(wl(wid, q, 8, 1, submit_s=T0 + i), Target(), T0 + i)
        svc.cycle(T0 + i + 0.5)
    for wid in ("p1", "p2"):
        svc.submit(wl(wid, "p", 8, 1, submit_s=T0 + 10), Target(), T0 + 10)
    for k in range(3):
        svc.cycle(T0 + 41 + k)
    return svc, act


def preempted(act: DryRunActuator) -> list[str]:
    return [a.workload for a in act.actions if a.verb == "preempt"]


def test_without_the_cluster_limit_both_victim_queues_are_preempted() -> None:
    """The control: one preemption per victim queue stays within a per-queue limit of 1."""
    svc, act = spread(PreemptionBrake(per_queue=1, cluster=None))
    assert sorted(preempted(act)) == ["x1", "y1"]
    assert svc.explain("p1").state == "running" and svc.explain("p2").state == "running"
    assert svc.brake.counts(T0 + 45) == {"x": 1, "y": 1}


def test_the_cluster_limit_stops_preemptions_across_victim_queues() -> None:
    svc, act = spread(PreemptionBrake(per_queue=1, cluster=1))
    done = preempted(act)
    assert len(done) == 1                                 # the second, in the other victim queue, is held
    other = "y1" if done == ["x1"] else "x1"
    assert svc.explain(other).state == "running"
    states = {w: svc.explain(w) for w in ("p1", "p2")}
    held = [w for w, v in states.items() if v.state == "pending"]
    assert len(held) == 1, {w: (v.state, v.reason_code) for w, v in states.items()}
    why = states[held[0]]
    assert why.reason_code == "preemption_limited"
    assert f"would preempt {other}" in why.message and "cluster_per_hour 1" in why.message
    assert "1 workloads preempted in the last 1 h" in why.message
    assert 'gpuq_scheduler_preemption_limit{scope="cluster"} 1.0' in metrics(svc)
    svc.cycle(T0 + 41 + 3600.5)                           # the hour has passed: the other queue's turn
    assert sorted(preempted(act)) == ["x1", "y1"]
    assert svc.explain(held[0]).state == "running"


# -- the settings reach `gpuq serve`'s service -------------------------------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("limit, name", [({"per_queue_per_hour": None, "cluster_per_hour": 0}, "cluster_per_hour"),
                                         ({"per_queue_per_hour": 0, "cluster_per_hour": None}, "per_queue_per_hour")])
def test_serve_takes_the_preemption_limit_from_its_settings(tmp_path: Path, servers: list[Server],  # noqa: F811 - the fixture
                                                            limit: dict[str, int | None], name: str) -> None:
    """A real `gpuq serve`: a2 borrows queue b's guarantee, b1 would preempt it, and the limit in
    the config file (each scope on its own, so swapped wiring fails) holds the preemption back."""
    cfg, url = serve_config(tmp_path, scheduler={"preemption_limit": limit})
    srv = Server(cfg, url)
    servers.append(srv)
    assert srv.get("/scheduler/status").json()["preemption_limit"] == limit
    for wid, q in (("a1", "a"), ("a2", "a")):
        assert srv.client.post("/workloads", json={"id": wid, "queue": q, "gpus_per_pod": 8}).status_code == 201
        srv.wait_until(lambda w=wid: srv.state(w) == "running", 10, f"{wid} admitted")
    assert srv.client.post("/workloads", json={"id": "b1", "queue": "b", "gpus_per_pod": 8}).status_code == 201
    srv.wait_until(lambda: srv.get("/workloads/b1").json()["reason_code"] == "preemption_limited", 15, "limited")
    b1 = srv.get("/workloads/b1").json()
    assert f"scheduler.preemption_limit.{name} 0" in b1["message"] and "would preempt a2" in b1["message"]
    assert srv.state("a1") == srv.state("a2") == "running"
    text = srv.get("/metrics").text
    scope = "cluster" if name == "cluster_per_hour" else "queue"
    assert f'gpuq_scheduler_preemption_limit{{scope="{scope}"}} 0.0' in text
    assert 'gpuq_scheduler_preemptions_limited_total{queue="b"}' in text
    assert srv.stop()[0] == 0
