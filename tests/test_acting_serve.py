"""`gpuq serve` (a real process) acting through the real ``kubernetes`` client on
tests/k8s_api_server.py:

* a Kubernetes API that hangs on one object's PATCH while a cancel suspends it: every other API
  route still answers within a second, the cycle keeps running, another workload is admitted
  meanwhile, and the cancel completes once the server answers (issue 9, item 7);
* a restart after admitting and preempting issues no actuator call twice: the server's
  mutating requests are counted per object before and after (issue 9, item 11).
"""
from __future__ import annotations

import copy
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.k8s_api_server import ApiServer, Recorded, load
from tests.test_serve import TOKEN, Server, two_queues_two_nodes

NS = "team-a"


def rayjob(name: str) -> dict[str, Any]:
    """KubeRay's RayJob sample as recorded, renamed, suspended, with no queue label (workloads
    come in over the API here, not through the workload source)."""
    obj = copy.deepcopy(load("rayjob-train-llm.json"))
    meta = obj["metadata"]
    meta.update(name=name, namespace=NS, uid=f"00000000-0000-4000-8000-{abs(hash(name)) % 10**12:012d}")
    meta.pop("labels", None)
    meta.pop("annotations", None)
    obj["spec"]["suspend"] = True
    return obj


def path(name: str) -> str:
    return f"/apis/ray.io/v1/namespaces/{NS}/rayjobs/{name}"


@pytest.fixture
def k8s() -> Iterator[ApiServer]:
    with ApiServer([rayjob(n) for n in ("b1", "b2", "a1", "w1", "w2")]) as server:
        yield server


@pytest.fixture
def serve_cfg(tmp_path: Path, k8s: ApiServer) -> tuple[Path, str]:
    from tests.conftest import free_port

    two_queues_two_nodes(tmp_path)
    port = free_port()
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text(yaml.safe_dump({
        "store": {"dsn": f"chdb://{tmp_path / 'data'}", "spill_dir": str(tmp_path / "spill"),
                  "batch_interval_s": 0.3},
        "queues_file": "queues.yaml",
        "scheduler": {"actuator": "kubernetes", "cycle_interval_s": 0.2, "preemption_delay_s": 0.5},
        "accounting": {"interval_s": 1},
        "collector": {"metrics_port": 0, "kubernetes": [
            {"cluster": "test", "kubeconfig": str(k8s.kubeconfig(tmp_path / "kubeconfig"))}]},
        "api": {"host": "127.0.0.1", "port": port, "tokens": [{"token": TOKEN, "role": "admin", "name": "ci"}]},
    }))
    return cfg, f"http://127.0.0.1:{port}"


class Serve(Server):
    """tests/test_serve.py's Server with ``--no-collect`` (the test server serves no pods)."""

    def __init__(self, cfg: Path, url: str) -> None:
        import subprocess
        import sys

        from tests.conftest import die_with_parent
        from tests.test_serve import _env

        self.url = url
        self.log = cfg.parent / "serve.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuq.cli", "serve", "--config", str(cfg), "--nodes", "nodes.yaml",
                 "--no-collect"], cwd=cfg.parent, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=die_with_parent)
        self.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        self.wait_until(lambda: self.get("/readyz").status_code == 200, 40, "ready")

    def submit(self, wid: str, queue: str, pods: int = 1, **extra: Any) -> httpx.Response:
        return self.client.post("/workloads", json={
            "id": wid, "queue": queue, "pods": pods, "gpus_per_pod": 8, **extra,
            "target": {"kind": "RayJob", "namespace": NS, "name": wid, "api_version": "ray.io/v1"}})

    def cycles(self) -> float:
        text = self.get("/metrics").text
        m = re.search(r"^gpuq_scheduler_cycles_total (\S+)$", text, re.M)
        return float(m.group(1)) if m else -1.0


@pytest.fixture
def procs() -> Iterator[list[Serve]]:
    started: list[Serve] = []
    yield started
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


def mutations(api: ApiServer) -> list[Recorded]:
    return [r for r in list(api.requests) if r.method in ("PATCH", "POST", "DELETE", "PUT")]


def key(r: Recorded) -> tuple[str, str, str]:
    """A request as "the same call": method, path and body without the resourceVersion read."""
    body = copy.deepcopy(r.body) if isinstance(r.body, dict) else r.body
    if isinstance(body, dict):
        body.get("metadata", {}).pop("resourceVersion", None)
        for k in ("firstTimestamp", "lastTimestamp", "eventTime"):
            body.pop(k, None)
    return r.method, r.path, repr(body)


@pytest.mark.timeout(120)
def test_a_hung_kubernetes_api_stalls_neither_the_api_nor_the_cycle(serve_cfg: tuple[Path, str], k8s: ApiServer,
                                                                    procs: list[Serve]) -> None:
    cfg, url = serve_cfg
    srv = Serve(cfg, url)
    procs.append(srv)
    assert srv.submit("w1", "a").status_code == 201
    srv.wait_until(lambda: srv.state("w1") == "running", 15, "w1 admitted")

    k8s.hang("PATCH", path("w1"))                 # the suspend of w1 gets no answer
    answers: dict[str, Any] = {}

    def cancel() -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=90) as c:
            answers["cancel"] = c.delete("/workloads/w1")
    t = threading.Thread(target=cancel, daemon=True)
    t.start()
    end = time.monotonic() + 10
    while not k8s.calls("PATCH", path("w1"))[1:] and time.monotonic() < end:   # the hung PATCH arrived
        time.sleep(0.05)
    assert len(k8s.calls("PATCH", path("w1"))) == 2, "the cancel's PATCH never reached the server"
    before = srv.cycles()

    slowest = 0.0
    for call in (lambda: srv.client.get("/queues"), lambda: srv.client.get("/workloads"),
                 lambda: srv.submit("w2", "b"), lambda: srv.client.get("/workloads/w1"),
                 lambda: srv.client.get("/healthz"), lambda: srv.client.get("/workloads?state=running")):
        t0 = time.monotonic()
        r = call()
        slowest = max(slowest, time.monotonic() - t0)
        assert r.status_code in (200, 201), r.text
    assert slowest < 1.0, f"an API call took {slowest:.2f} s while the cancel hung"
    view = srv.get("/workloads/w1").json()
    assert view["state"] == "running" and view["acting"] == "cancelling", view
    assert view["reason_code"] == "cancelling"
    srv.wait_until(lambda: srv.state("w2") == "running", 10, "w2 admitted while w1's cancel hangs")
    srv.wait_until(lambda: srv.cycles() >= before + 5, 10, "cycling while the cancel hangs")
    assert t.is_alive(), "the cancel should still be waiting on the hung server"

    k8s.release()
    t.join(60)
    assert answers["cancel"].status_code == 200, answers["cancel"].text
    assert srv.state("w1") == "cancelled"
    obj = k8s.get("RayJob", NS, "w1")
    assert obj is not None and obj["spec"]["suspend"] is True
    assert srv.stop()[0] == 0


@pytest.mark.timeout(150)
def test_restart_after_admitting_and_preempting_repeats_no_call(serve_cfg: tuple[Path, str], k8s: ApiServer,
                                                                procs: list[Serve]) -> None:
    cfg, url = serve_cfg
    srv = Serve(cfg, url)
    procs.append(srv)
    for wid in ("b1", "b2"):                                        # b borrows the whole cluster
        assert srv.submit(wid, "b").status_code == 201
    srv.wait_until(lambda: srv.state("b1") == srv.state("b2") == "running", 15, "b1 and b2 admitted")
    assert srv.submit("a1", "a").status_code == 201                  # a wants its guarantee back
    srv.wait_until(lambda: srv.state("a1") == "running", 20, "a1 admitted by preempting b1 or b2")
    views = {w["id"]: w for w in srv.get("/workloads").json()}
    victim = next(w for w in ("b1", "b2") if views[w]["state"] == "pending")
    assert views[victim]["preempted"] == 1 and views[victim]["reason_code"] in ("preempted", "no_victims", "no_fit")
    time.sleep(1.0)                                                 # a few more cycles: nothing to do
    assert srv.stop()[0] == 0
    first = mutations(k8s)
    patches = Counter(r.path for r in first if r.method == "PATCH")
    kept = "b2" if victim == "b1" else "b1"
    assert patches == {path(victim): 2, path(kept): 1, path("a1"): 1}, patches   # 3 admits, 1 suspend
    assert len({key(r) for r in first}) == len(first), "a call repeated before the restart"

    again = Serve(cfg, url)                                         # the same store, a new process
    procs.append(again)
    assert (again.state("a1"), again.state(kept), again.state(victim)) == ("running", "running", "pending")
    start = again.cycles()
    again.wait_until(lambda: again.cycles() >= start + 10, 20, "cycling after the restart")
    assert again.stop()[0] == 0
    after = mutations(k8s)[len(first):]
    repeated = [key(r) for r in after if key(r) in {key(f) for f in first}]
    assert not repeated, f"calls issued again after the restart: {repeated}"
    assert after == [], f"the restarted scheduler acted again: {[(r.method, r.path) for r in after]}"
    assert k8s.get("RayJob", NS, "a1")["spec"]["suspend"] is False
    assert k8s.get("RayJob", NS, victim)["spec"]["suspend"] is True
