"""Leader election on a ``coordination.k8s.io/v1`` Lease with the real ``kubernetes`` client against
the local API test server: one leader at a time, takeover after expiry as observed (not by the
holder's clock), release gives the Lease up at once, a 409 race has one winner, and a leader that
cannot renew stops leading at its renew deadline, before anyone else may take the Lease."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest

from scheduler.service.leader import LeaderElector, LeaseConfig, coordination_api
from tests.k8s_api_server import ApiServer

NS, NAME = "gpuq-system", "gpuq"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases/{NAME}"


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def server() -> ApiServer:
    with ApiServer() as s:
        yield s


def elector(server: ApiServer, tmp_path: Path, who: str, clock: Clock, **kw: float) -> LeaderElector:
    api = coordination_api(kubeconfig=str(server.kubeconfig(tmp_path / f"kube-{who}.json")))
    cfg = LeaseConfig(NAME, NS, who, **({"lease_duration_s": 15, "renew_deadline_s": 10, "retry_period_s": 2} | kw))
    return LeaderElector(api, cfg, clock=clock)


def test_one_leader_takeover_after_observed_expiry(server: ApiServer, tmp_path: Path) -> None:
    clock = Clock()
    a, b = elector(server, tmp_path, "pod-a", clock), elector(server, tmp_path, "pod-b", clock)
    assert a.try_once() is True                                   # creates the Lease
    lease = server.lease(NS, NAME)
    assert lease["spec"]["holderIdentity"] == "pod-a" and lease["spec"]["leaseTransitions"] == 0
    assert lease["spec"]["leaseDurationSeconds"] == 15
    assert b.try_once() is False and b.holder() == "pod-a"
    for _ in range(10):                                           # a renews every 2 s: b never takes it
        clock.t += 2
        assert a.try_once() is True and b.try_once() is False
    assert a.is_leader and not b.is_leader
    # a dies: its record stops changing; b may take it lease_duration after it last saw a change
    clock.t += 14.9
    assert b.try_once() is False
    clock.t += 0.2
    assert b.try_once() is True
    lease = server.lease(NS, NAME)
    assert lease["spec"]["holderIdentity"] == "pod-b" and lease["spec"]["leaseTransitions"] == 1
    # a comes back (a paused process): it sees b's record and does not lead
    assert a.try_once() is False and not a.is_leader


def test_release_lets_the_standby_take_over_at_its_next_try(server: ApiServer, tmp_path: Path) -> None:
    clock = Clock()
    a, b = elector(server, tmp_path, "pod-a", clock), elector(server, tmp_path, "pod-b", clock)
    assert a.try_once() and not b.try_once()
    assert a.release() is True
    assert server.lease(NS, NAME)["spec"].get("holderIdentity") in (None, "")
    clock.t += 2
    assert b.try_once() is True
    assert b.release() is True and a.release() is False           # a holds nothing to release


def test_a_race_for_a_free_lease_has_one_winner(server: ApiServer, tmp_path: Path) -> None:
    clock = Clock()
    a = elector(server, tmp_path, "pod-a", clock)
    a.try_once()
    a.release()
    candidates = [elector(server, tmp_path, f"pod-{i}", clock) for i in range(6)]
    for c in candidates:
        c.try_once()                                              # all observe the free Lease
    barrier = threading.Barrier(len(candidates))
    results: dict[str, bool] = {}

    def go(c: LeaderElector) -> None:
        barrier.wait()
        results[c.cfg.identity] = c.try_once()

    threads = [threading.Thread(target=go, args=(c,)) for c in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [k for k, v in results.items() if v]
    held = server.lease(NS, NAME)["spec"]["holderIdentity"]
    assert winners == [held], results


def test_a_leader_that_cannot_renew_stops_before_the_lease_expires(server: ApiServer, tmp_path: Path) -> None:
    clock = Clock()
    a, b = elector(server, tmp_path, "pod-a", clock), elector(server, tmp_path, "pod-b", clock)
    assert a.try_once() and not b.try_once()
    server.fail("GET", LEASE, 503, "etcd is down", times=100)
    clock.t += 2
    assert a.try_once() is True                                   # within the renew deadline
    clock.t += 8.1
    assert a.try_once() is False and not a.is_leader              # 10.1 s without a renewal: stops
    assert "HTTP 503" in a.last_error
    server._state.faults.clear()                                  # the API server is back
    # b, which saw a's last renewal at t=1000, may only take over after 15 s: a stopped 4.9 s earlier
    clock.t += 4.8
    assert b.try_once() is False
    clock.t += 0.2
    assert b.try_once() is True


def test_run_calls_back_and_stops_when_the_lease_is_lost(server: ApiServer, tmp_path: Path) -> None:
    a = LeaderElector(coordination_api(kubeconfig=str(server.kubeconfig(tmp_path / "k.json"))),
                      LeaseConfig(NAME, NS, "pod-a", 3, 2, 0.1))
    started, stopped = threading.Event(), threading.Event()
    thread = a.run(started.set, stopped.set)
    assert started.wait(5)
    lease = server.lease(NS, NAME)                                # someone else takes it
    lease["spec"]["holderIdentity"] = "intruder"
    with server._lock:
        server._rv += 1
        lease["metadata"]["resourceVersion"] = str(server._rv)
        server._state.leases[(NS, NAME)] = lease
    assert stopped.wait(5)
    thread.join(5)
    assert not thread.is_alive() and not a.is_leader


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="lease_duration_s > renew_deadline_s > retry_period_s"):
        LeaseConfig(NAME, NS, "x", lease_duration_s=5, renew_deadline_s=5, retry_period_s=1)
