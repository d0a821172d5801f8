"""Two ``gpuq serve`` processes with ``leader.enabled`` against the local Kubernetes API test server
(real ``kubernetes`` client, a Lease, the ``kubernetes`` actuator on RayJobs) and one store:

* exactly one acts at any time: sampled every 0.1 s, never two replicas say ``role: leader`` nor
  two are ready; the standby's ``/readyz`` is 503 and its ``/healthz`` names the leader;
* the leader killed (SIGKILL): the standby holds the Lease within the lease duration plus two
  retry periods, restores the scheduler from the store and acts on nothing already done;
* the leader stopped (SIGTERM): it releases the Lease after closing the store, and the standby
  takes it within one retry period;
* no action with a duplicate effect: the RayJobs' mutating requests are counted across both
  processes and leaderships;
* the lease metrics: the standby shows them at 0, the replica that takes an expired Lease counts it
  (``how="expired"``: the killed leader lost it), the one that takes a released Lease does not.

The store is chDB: the standby opens it only once it leads (chDB allows one process per path; with
a ClickHouse server both could), which this test relies on as the chart's scaled shape does not.
"""
from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import die_with_parent, free_port
from tests.k8s_api_server import ApiServer
from tests.test_acting_serve import NS, key, path, rayjob
from tests.test_serve import TOKEN, _env, two_queues_two_nodes

LEASE_S, RENEW_S, RETRY_S = 3.0, 2.0, 0.5
LEASE = "/apis/coordination.k8s.io/v1/namespaces/gpuq-system/leases/gpuq-test"


class Replica:
    def __init__(self, tmp: Path, k8s: ApiServer, name: str) -> None:
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = tmp / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump({
            "store": {"dsn": f"chdb://{tmp / 'data'}", "spill_dir": str(tmp / f"spill-{name}"),
                      "batch_interval_s": 0.2},
            "queues_file": "queues.yaml",
            "scheduler": {"actuator": "kubernetes", "cycle_interval_s": 0.2, "preemption_delay_s": 0.5},
            "accounting": {"interval_s": 1},
            "collector": {"metrics_port": 0, "kubernetes": [
                {"cluster": "test", "kubeconfig": str(tmp / "kubeconfig")}]},
            "api": {"host": "127.0.0.1", "port": self.port,
                    "tokens": [{"token": TOKEN, "role": "admin", "name": "ci"}]},
            "leader": {"enabled": True, "lease_name": "gpuq-test", "namespace": "gpuq-system", "identity": name,
                       "kubeconfig": str(tmp / "kubeconfig"), "lease_duration_s": LEASE_S,
                       "renew_deadline_s": RENEW_S, "retry_period_s": RETRY_S},
        }))
        self.log = tmp / f"{name}.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuq.cli", "serve", "--config", str(cfg), "--nodes", "nodes.yaml",
                 "--no-collect"], cwd=tmp, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent)
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)

    def health(self) -> dict[str, Any]:
        try:
            r = self.client.get("/healthz", timeout=1)
            return dict(r.json()) if r.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def ready(self) -> bool:
        try:
            return self.client.get("/readyz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def state(self, wid: str) -> str:
        return str(self.client.get(f"/workloads/{wid}").json()["state"])

    def submit(self, wid: str, queue: str) -> httpx.Response:
        return self.client.post("/workloads", json={
            "id": wid, "queue": queue, "gpus_per_pod": 8,
            "target": {"kind": "RayJob", "namespace": NS, "name": wid, "api_version": "ray.io/v1"}})


def wait(cond: Any, timeout: float, what: str, logs: list[Replica]) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if cond():
            return time.monotonic() - t0
        time.sleep(0.05)
    raise AssertionError(f"not {what} after {timeout} s:\n" + "\n".join(
        f"--- {r.name}:\n{r.log.read_text()[-3000:]}" for r in logs))


class Watch:
    """Samples every replica's role and readiness every 0.1 s: never two leaders, never two ready."""

    def __init__(self) -> None:
        self.replicas: list[Replica] = []
        self.stop = threading.Event()
        self.bad: list[str] = []
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            alive = [r for r in list(self.replicas) if r.proc.poll() is None]
            leaders = [r.name for r in alive if r.health().get("role") == "leader"]
            ready = [r.name for r in alive if r.ready()]
            if len(leaders) > 1 or len(ready) > 1:
                self.bad.append(f"leaders {leaders}, ready {ready}")
            self.stop.wait(0.1)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[Path, ApiServer, list[Replica]]]:
    two_queues_two_nodes(tmp_path)
    started: list[Replica] = []
    with ApiServer([rayjob(n) for n in ("b1", "b2", "a1")]) as k8s:
        k8s.kubeconfig(tmp_path / "kubeconfig")
        yield tmp_path, k8s, started
        for r in started:
            if r.proc.poll() is None:
                r.proc.kill()
                r.proc.wait()


def rayjob_mutations(k8s: ApiServer) -> list[Any]:
    return [r for r in list(k8s.requests) if r.method in ("PATCH", "POST", "PUT") and "/rayjobs/" in r.path]


@pytest.mark.timeout(180)
def test_one_replica_acts_takeover_after_kill_and_after_sigterm(cluster: tuple[Path, ApiServer, list[Replica]]) -> None:
    tmp, k8s, started = cluster
    watch = Watch()
    p1 = Replica(tmp, k8s, "pod-1")
    started.append(p1)
    watch.replicas.append(p1)
    wait(p1.ready, 40, "pod-1 leading and ready", started)
    assert p1.health() == {"status": "ok", "role": "leader", "leader": "pod-1"}
    p2 = Replica(tmp, k8s, "pod-2")
    started.append(p2)
    watch.replicas.append(p2)
    wait(lambda: p2.health().get("role") == "standby", 30, "pod-2 standing by", started)
    assert p2.health()["leader"] == "pod-1"
    standby = p2.client.get("/readyz")
    assert standby.status_code == 503 and "pod-1" in standby.json()["detail"]
    assert p2.client.get("/workloads").status_code == 503
    standby_metrics = p2.client.get("/metrics").text                 # the series the leader will go on with
    for line in ("gpuq_leader 0.0", "gpuq_scheduler_lease_lost_total 0.0",
                 'gpuq_scheduler_lease_acquired_total{how="expired"} 0.0'):
        assert line in standby_metrics, line

    for wid in ("b1", "b2"):
        assert p1.submit(wid, "b").status_code == 201
    wait(lambda: p1.state("b1") == p1.state("b2") == "running", 15, "b1 and b2 admitted", started)
    time.sleep(1.0)                                                  # the events reach the store
    before_kill = rayjob_mutations(k8s)
    assert Counter(r.path for r in before_kill) == {path("b1"): 1, path("b2"): 1}

    # the leader dies without a word: the standby takes the Lease once it has expired
    p1.proc.kill()
    p1.proc.wait()
    killed = time.monotonic()
    wait(lambda: (k8s.lease("gpuq-system", "gpuq-test") or {}).get("spec", {}).get("holderIdentity") == "pod-2",
         LEASE_S + 2 * RETRY_S + 5, "pod-2 holding the lease", started)
    took = time.monotonic() - killed
    assert took <= LEASE_S + 2 * RETRY_S + 0.5, f"takeover after a kill took {took:.2f} s"
    wait(p2.ready, 40, "pod-2 ready as leader", started)
    assert p2.health()["role"] == "leader"
    leader_metrics = p2.client.get("/metrics").text                  # pod-1 lost the Lease: seen here
    assert "gpuq_leader 1.0" in leader_metrics
    assert 'gpuq_scheduler_lease_acquired_total{how="expired"} 1.0' in leader_metrics
    assert (p2.state("b1"), p2.state("b2")) == ("running", "running")    # restored from the store
    time.sleep(1.5)                                                  # cycles of the new leader
    assert rayjob_mutations(k8s) == before_kill, "the new leader acted again on what was done"

    assert p2.submit("a1", "a").status_code == 201                   # a wants its guarantee: preempts
    wait(lambda: p2.state("a1") == "running", 20, "a1 admitted by the new leader", started)

    p3 = Replica(tmp, k8s, "pod-3")                                  # the killed pod, restarted: stands by
    started.append(p3)
    watch.replicas.append(p3)
    wait(lambda: p3.health().get("role") == "standby", 30, "pod-3 standing by", started)
    time.sleep(1.0)
    p2.proc.terminate()                                              # SIGTERM: stop, close, release
    assert p2.proc.wait(20) == 0, p2.log.read_text()[-3000:]
    released = time.monotonic()
    wait(lambda: (k8s.lease("gpuq-system", "gpuq-test") or {}).get("spec", {}).get("holderIdentity") == "pod-3",
         RETRY_S + 5, "pod-3 holding the lease", started)
    took = time.monotonic() - released
    assert took <= RETRY_S + 0.5, f"takeover after SIGTERM took {took:.2f} s"
    wait(p3.ready, 40, "pod-3 ready as leader", started)
    assert p3.state("a1") == "running"
    assert 'gpuq_scheduler_lease_acquired_total{how="released"} 1.0' in p3.client.get("/metrics").text
    time.sleep(1.5)
    watch.stop.set()
    watch.thread.join(5)
    assert not watch.bad, watch.bad

    every = rayjob_mutations(k8s)
    assert len({key(r) for r in every}) == len(every), "a call repeated across leaders"
    patches = Counter(r.path for r in every)
    victim = "b1" if k8s.get("RayJob", NS, "b1")["spec"]["suspend"] else "b2"
    assert patches[path("a1")] == 1 and patches[path(victim)] == 2, patches   # admit + suspend, no more
    p3.proc.terminate()
    assert p3.proc.wait(20) == 0
    lease = k8s.lease("gpuq-system", "gpuq-test")
    assert lease["spec"].get("holderIdentity") in (None, "") and lease["spec"]["leaseTransitions"] == 2
