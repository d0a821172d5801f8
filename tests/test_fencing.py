"""Fencing (issue 17, finding 5): a replica that lost the Lease carries out nothing more.

* the fence itself (:meth:`LeaderElector.holds_lease`) on a fake monotonic clock: open from the
  take until the renew deadline, closed before anyone else may take the Lease, no API call per
  check, closed for good once lost (a late renewal does not reopen it), the loss counted once and a
  release not counted, how each leadership began counted;
* :func:`with_retries` asks it before every attempt: a retry loop stops at its next attempt;
* the real ``kubernetes`` client on tests/k8s_api_server.py, one actuator lane: four preemptions
  queued behind a suspend the API server holds unanswered; the Lease is lost while it hangs; once
  it is answered, the server gets **no** write after the loss (the PATCHes and Events it recorded),
  the dropped actions are counted and the scheduler decides nothing more;
* the next leader takes the expired Lease, restores from the events the first one wrote, and
  carries out exactly what was dropped: nothing twice, nothing lost;
* without leader election (no fence) nothing is ever fenced.
"""
from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from accounting.queues import parse_queue_config
from gpuq.settings import CollectorSettings, KubernetesTarget, Settings as GpuqSettings
from scheduler import events as ev
from scheduler.actuators.base import FENCED, ActionResult, DryRunActuator, Target, with_retries
from scheduler.actuators.kubernetes import KubernetesActuator
from scheduler.model import Placement
from scheduler.service import SchedulerService
from scheduler.service.leader import LeaderCollector, LeaderElector, LeaseConfig, coordination_api
from scheduler.service.metrics import SchedulerCollector
from scheduler.snapshot import Settings
from scheduler.testing import nodes, wl
from tests.k8s_api_server import ApiServer, Recorded
from tests.test_acting_serve import NS, path, rayjob
from tests.test_leader import Clock
from tests.test_scheduler_service import Sink

LEASE_NS, LEASE_NAME = "gpuq-system", "gpuq"
T0 = 1_700_000_000.0
# queue a borrows all four nodes; b is owed them and takes them back by preemption
QUEUES = {"a": {"max": {"gpu": 32}}, "b": {"guaranteed": {"gpu": 32}, "max": {"gpu": 32}}}
A, B = ["a1", "a2", "a3", "a4"], ["b1", "b2", "b3", "b4"]
H100_ON_H0 = Placement("H100", (("h-0", 8),))


@pytest.fixture
def k8s() -> Any:
    with ApiServer([rayjob(n) for n in (*A, *B)]) as server:
        yield server


def elector(server: ApiServer, tmp_path: Path, who: str, clock: Clock) -> LeaderElector:
    api = coordination_api(kubeconfig=str(server.kubeconfig(tmp_path / f"kube-{who}.json")))
    return LeaderElector(api, LeaseConfig(LEASE_NAME, LEASE_NS, who, 15, 10, 2), clock=clock)


def scrape(*collectors: Any) -> str:
    reg = CollectorRegistry()
    for c in collectors:
        reg.register(c)
    return generate_latest(reg).decode()


def writes(server: ApiServer, since: int = 0) -> list[Recorded]:
    return [r for r in list(server.requests)[since:] if r.method in ("PATCH", "POST", "PUT", "DELETE")
            and "/leases" not in r.path]


# -- the fence itself ------------------------------------------------------------------------------
def test_the_fence_closes_at_the_renew_deadline_before_anyone_may_take_the_lease(
        k8s: ApiServer, tmp_path: Path) -> None:
    clock = Clock()
    a, b = elector(k8s, tmp_path, "pod-a", clock), elector(k8s, tmp_path, "pod-b", clock)
    assert not a.holds_lease()                                    # not leading yet: fenced
    assert a.try_once() and not b.try_once()                      # a takes it at t=1000
    assert a.acquired["created"] == 1
    asked = len(k8s.requests)
    clock.t = 1009.999
    assert all(a.holds_lease() for _ in range(1000))
    assert len(k8s.requests) == asked                             # a clock check, no API call
    clock.t = 1008.0
    assert a.try_once()                                           # renewed at 1008: open until 1018
    assert not b.try_once()                                       # b observes the renewal at 1008
    clock.t = 1017.999
    assert a.holds_lease()
    clock.t = 1018.0
    assert not a.holds_lease() and a.lost == 1                    # the renew deadline: fenced
    assert not a.holds_lease() and a.lost == 1                    # counted once
    # b saw a's last renewal at 1008 and may take the Lease at 1023: 5 s after a was fenced
    clock.t = 1022.9
    assert not b.try_once()
    # a renewal that would succeed now does not reopen the fence: a is deposed, and sends nothing
    asked = len(k8s.requests)
    assert a.try_once() is False and not a.holds_lease() and len(k8s.requests) == asked
    clock.t = 1023.1
    assert b.try_once() and b.holds_lease()
    assert b.acquired == {"created": 0, "released": 0, "expired": 1, "earlier": 0}
    text = scrape(LeaderCollector(a))
    assert "gpuq_leader 0.0" in text and "gpuq_scheduler_lease_lost_total 1.0" in text
    text = scrape(LeaderCollector(b))
    assert "gpuq_leader 1.0" in text and 'gpuq_scheduler_lease_acquired_total{how="expired"} 1.0' in text
    assert "gpuq_scheduler_lease_lost_total 0.0" in text


def test_a_release_is_not_a_loss_and_the_lease_records_its_duration_rounded_up(
        k8s: ApiServer, tmp_path: Path) -> None:
    clock = Clock()
    api = coordination_api(kubeconfig=str(k8s.kubeconfig(tmp_path / "kube.json")))

    def candidate(who: str) -> LeaderElector:
        return LeaderElector(api, LeaseConfig(LEASE_NAME, LEASE_NS, who, 2.5, 2.2, 0.5), clock=clock)

    a = candidate("pod-a")
    assert a.try_once() and a.acquired["created"] == 1
    # the others wait the recorded duration: 3 s, never less than the 2.5 s this replica's fence assumes
    assert k8s.lease(LEASE_NS, LEASE_NAME)["spec"]["leaseDurationSeconds"] == 3
    restarted = candidate("pod-a")                                # pod-a's container restarted
    assert restarted.try_once() and restarted.acquired["earlier"] == 1
    assert restarted.release() and not restarted.holds_lease() and restarted.lost == 0
    b = candidate("pod-b")
    assert b.try_once() and b.acquired["released"] == 1 and b.lost == 0


def test_another_holder_seen_closes_the_fence_at_once(k8s: ApiServer, tmp_path: Path) -> None:
    clock = Clock()
    a = elector(k8s, tmp_path, "pod-a", clock)
    assert a.try_once()
    lease = k8s.lease(LEASE_NS, LEASE_NAME)                       # someone else holds it now
    lease["spec"]["holderIdentity"] = "intruder"
    with k8s._lock:
        k8s._rv += 1
        lease["metadata"]["resourceVersion"] = str(k8s._rv)
        k8s._state.leases[(LEASE_NS, LEASE_NAME)] = lease
    clock.t += 2
    assert a.try_once() is False and not a.holds_lease() and a.lost == 1


def test_retries_stop_at_their_next_attempt_once_fenced() -> None:
    holds = {"lease": True}
    calls: list[int] = []

    def flaky() -> ActionResult:
        calls.append(1)
        if len(calls) == 2:
            holds["lease"] = False                                # lost while the second attempt ran
        return ActionResult(False, "HTTP 503 etcd is slow", retryable=True)

    result = with_retries(flaky, attempts=6, sleep=lambda _s: None, fence=lambda: holds["lease"])
    assert len(calls) == 2                                        # no third attempt
    assert not result.ok and not result.retryable and result.detail[FENCED] is True
    assert "stopped after 2 attempts: this replica no longer holds the Lease" in result.message
    calls.clear()
    result = with_retries(flaky, attempts=6, sleep=lambda _s: None, fence=lambda: False)
    assert calls == [] and result.detail[FENCED] is True          # fenced before the first attempt


def test_without_leader_election_nothing_is_fenced() -> None:
    act = DryRunActuator()
    svc = SchedulerService(parse_queue_config({"queues": QUEUES}), act, nodes=nodes(("h", "H100", 8, 1)),
                           settings=Settings(True, 30.0), sleep=lambda s: None)
    svc.submit(wl("a1", "a", 8, 1, submit_s=T0), Target(), T0)
    svc.cycle(T0 + 1)
    assert not svc.fenced and [a.verb for a in act.actions] == ["admit"]
    assert svc.stats.actions_fenced == {}


# -- the actuators ask right before each write -------------------------------------------------------
def test_the_kubernetes_actuator_asks_again_between_its_get_and_its_patch(k8s: ApiServer, tmp_path: Path) -> None:
    holds = {"lease": True}
    settings = GpuqSettings(collector=CollectorSettings(kubernetes=[
        KubernetesTarget(cluster="test", kubeconfig=str(k8s.kubeconfig(tmp_path / "kubeconfig")))]))
    act = KubernetesActuator(settings, sleep=lambda _s: None, fence=lambda: holds["lease"])
    try:
        assert act.admit(wl("a1", "a"), Target("RayJob", NS, "a1", "ray.io/v1"), H100_ON_H0).ok
        k8s.after_next_get(path("a1"), lambda _obj: holds.update(lease=False))   # lost during the GET
        result = act.preempt(wl("a1", "a"), Target("RayJob", NS, "a1", "ray.io/v1"), "test")
        assert not result.ok and result.detail[FENCED] is True
        assert f"kubernetes: PATCH {path('a1')}: not sent" in result.message
        assert [r.method for r in k8s.calls(path_suffix=path("a1"))] == ["GET", "PATCH", "GET"]
        assert k8s.get("RayJob", NS, "a1")["spec"]["suspend"] is False
        evicted = act.preempt(wl("p", "a"), Target("Pod", NS, "p-0"), "test")     # fenced before the POST
        assert evicted.detail[FENCED] is True and k8s.calls("POST", "/eviction") == []
    finally:
        act.close()


def test_make_actuator_hands_the_fence_to_the_actuators_that_send_requests(k8s: ApiServer, tmp_path: Path) -> None:
    from gpuq.settings import RayTarget, SchedulerSettings
    from scheduler.actuators.factory import make_actuator
    from tests.conftest import closed_port

    def fence() -> bool:
        return False

    ray: Any = make_actuator(GpuqSettings(scheduler=SchedulerSettings(actuator="ray"), collector=CollectorSettings(
        ray=[RayTarget(cluster="c", dashboard_url=f"http://127.0.0.1:{closed_port()}")])), fence=fence)
    try:
        assert ray.fence is fence
        result = ray.admit(wl("r1", "a"), Target("RaySubmission", entrypoint="true"), H100_ON_H0)
        assert result.detail[FENCED] is True and "cannot reach" not in result.message   # nothing sent
    finally:
        ray.close()
    kube: Any = make_actuator(GpuqSettings(scheduler=SchedulerSettings(actuator="kubernetes"), collector=CollectorSettings(
        kubernetes=[KubernetesTarget(cluster="test", kubeconfig=str(k8s.kubeconfig(tmp_path / "k.json")))])),
        fence=fence)
    try:
        assert kube.fence is fence
        assert kube.preempt(wl("a1", "a"), Target("RayJob", NS, "a1", "ray.io/v1"), "x").detail[FENCED] is True
        assert k8s.requests == []                                  # not even the GET
    finally:
        kube.close()


# -- the service on the real kubernetes client ---------------------------------------------------------
def make(k8s: ApiServer, tmp_path: Path, who: LeaderElector, sink: Sink) -> tuple[SchedulerService, Any]:
    settings = GpuqSettings(collector=CollectorSettings(kubernetes=[
        KubernetesTarget(cluster="test", kubeconfig=str(k8s.kubeconfig(tmp_path / "kubeconfig")))]))
    act = KubernetesActuator(settings, sleep=lambda _s: None, timeout_s=5.0, fence=who.holds_lease)
    svc = SchedulerService(parse_queue_config({"queues": QUEUES}), act, nodes=nodes(("h", "H100", 8, 4)),
                           settings=Settings(True, 30.0), sink=sink, cluster="c1", sleep=lambda s: None,
                           workers=1, fence=who.holds_lease)      # one lane: the actions queue up
    return svc, act


def wait_for(cond: Any, what: str, timeout: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_lost_lease_drops_the_queued_actions_and_the_next_leader_carries_them_out(
        k8s: ApiServer, tmp_path: Path) -> None:
    clock = Clock()
    first = elector(k8s, tmp_path, "pod-a", clock)
    assert first.try_once()
    sink = Sink()
    svc, act = make(k8s, tmp_path, first, sink)
    try:
        for i, wid in enumerate(A):
            svc.submit(wl(wid, "a", 8, 1, submit_s=T0 + i), Target("RayJob", NS, wid, "ray.io/v1"), T0 + i)
        svc.cycle(T0 + 5)
        assert [svc.state_of(w) for w in A] == ["running"] * 4
        for wid in B:
            svc.submit(wl(wid, "b", 8, 1, submit_s=T0 + 10), Target("RayJob", NS, wid, "ray.io/v1"), T0 + 10)
        for wid in A:                                              # the first suspend hangs: the rest queue
            k8s.hang("PATCH", path(wid))
        before = len(writes(k8s))
        d = svc.cycle(T0 + 41, wait=False)
        assert len(d.admissions) == 4 and all(len(a.victims) == 1 for a in d.admissions)
        wait_for(lambda: len(writes(k8s)) == before + 1, "the first suspend reaching the API server")
        first_victim = writes(k8s)[-1].path.rsplit("/", 1)[-1]
        assert svc._lanes.in_flight() == 4                         # one in flight, three queued

        clock.t += 10.0                                            # no renewal for the renew deadline: lost
        lost_at = len(k8s.requests)
        assert not first.holds_lease() and first.lost == 1
        k8s.release()                                              # the suspend in flight is answered
        assert svc.wait_acting(10)

        after = writes(k8s, lost_at)
        assert after == [], [f"{r.method} {r.path}" for r in after]
        # the suspend that was in flight happened (and is recorded); everything after it was dropped
        assert k8s.get("RayJob", NS, first_victim)["spec"]["suspend"] is True
        assert svc.stats.actions_fenced == {"preempt": 3, "admit": 1}
        assert svc.stats.actuator_failures == {}                   # dropped is not failed
        assert svc.state_of(first_victim) == "pending"
        assert sorted(w for w in A if svc.state_of(w) == "running") == sorted(set(A) - {first_victim})
        assert [svc.state_of(w) for w in B] == ["pending"] * 4
        text = scrape(SchedulerCollector(svc))
        assert 'gpuq_scheduler_actions_fenced_total{verb="preempt"} 3.0' in text
        assert 'gpuq_scheduler_actions_fenced_total{verb="admit"} 1.0' in text

        cycles = svc.stats.cycles
        d = svc.cycle(T0 + 60)                                     # the scheduler stops deciding
        assert (d.admissions, d.preemptions, tuple(d.pending)) == ((), (), ())
        assert svc.fenced and svc.stats.cycles == cycles and writes(k8s, lost_at) == []
    finally:
        act.close()

    # the next leader: takes the Lease once expired, restores what the first one recorded, and
    # carries out exactly the dropped actions
    clock.t += 6.0                                                 # 16 s since a's last renewal
    second = elector(k8s, tmp_path, "pod-b", clock)
    assert second.try_once() is False                              # observes the record first
    clock.t += 15.1
    assert second.try_once() and second.acquired["expired"] == 1
    stored = sorted(sink.rows, key=lambda r: (r[2], r[3]))
    again, act2 = make(k8s, tmp_path, second, Sink())
    try:
        again.restore([ev.StoredEvent(int(r[3]), ev.from_row(r[2:11]), str(r[11])) for r in stored])
        assert again.state_of(first_victim) == "pending"
        assert [again.state_of(w) for w in B] == ["pending"] * 4
        again.cycle(T0 + 100)
        again.cycle(T0 + 101)                                      # the victim's queue slot freed: b1 runs
        assert [again.state_of(w) for w in B] == ["running"] * 4
        assert [again.state_of(w) for w in A] == ["pending"] * 4
    finally:
        act2.close()
    patches = Counter(r.path for r in k8s.calls("PATCH"))
    # each a: admitted once, suspended once (the first victim by the first leader, before the loss);
    # each b: admitted once, by the second leader
    assert patches == {**{path(w): 2 for w in A}, **{path(w): 1 for w in B}}, patches
    assert all(k8s.get("RayJob", NS, w)["spec"]["suspend"] is True for w in A)
    assert all(k8s.get("RayJob", NS, w)["spec"]["suspend"] is False for w in B)
