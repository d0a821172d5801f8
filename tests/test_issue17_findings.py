"""Issue 17's findings tried again the way the outside probe tried them, against one real
`gpuq serve` (loopback, viewer/operator/admin tokens, the dry-run actuator): each gets a clear
refusal or keeps working, the server's memory stays flat (under 100 MiB of growth over the whole
run) and nothing already accepted is lost.

The findings the other tests already replay the same way are named here, not repeated: finding 3
(`tests/test_spill.py::test_finding_3_tried_again_the_probes_way`), finding 4
(`tests/test_cli_pause.py::test_an_acknowledged_pause_survives_sigkill`), finding 5
(`tests/test_fencing.py`), slow clients (`tests/test_api_slow_clients.py`) and a RayJob naming
another namespace's queue (`tests/test_queue_access_k8s.py`)."""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.test_serve import Server, serve_config
from tests.test_yaml_bounds import laughs

ADMIN, TENANT = "admin-secret", "tenant-secret"
MiB = 1024 * 1024


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Server, Path]]:
    cfg, url = serve_config(tmp_path)
    conf = yaml.safe_load(cfg.read_text())
    conf["api"]["tokens"] += [{"token": ADMIN, "role": "admin", "name": "oncall"},
                              {"token": TENANT, "role": "operator", "name": "tenant-b",
                               "namespaces": ["*"], "queues": ["b"]}]
    cfg.write_text(yaml.safe_dump(conf))
    srv = Server(cfg, url)
    yield srv, tmp_path
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait()


def call(srv: Server, method: str, path: str, token: str, **kw: Any) -> httpx.Response:
    return srv.client.request(method, path, headers={"Authorization": f"Bearer {token}"}, **kw)


@pytest.mark.timeout(120)
def test_the_findings_tried_again_get_refusals_and_memory_stays_flat(served: tuple[Server, Path]) -> None:
    srv, home = served
    queues = home / "queues.yaml"
    good = queues.read_text()
    srv.wait_until(lambda: srv.get("/queues").status_code == 200, 20, "queues served")
    before = rss(srv.proc.pid)

    # an accepted workload, to find again at the end
    assert call(srv, "POST", "/workloads", ADMIN, json={"id": "kept", "queue": "a", "gpus_per_pod": 4}).status_code == 201
    srv.wait_until(lambda: srv.state("kept") == "running", 20, "kept admitted")

    # finding 1: a few hundred bytes of nested aliases swapped into the running serve's queue file
    bomb = laughs()
    assert len(bomb) < 600
    queues.write_text(bomb)
    t = time.monotonic()
    r = call(srv, "POST", "/admin/reload-queues", ADMIN)
    assert time.monotonic() - t < 3, "the refusal is quick"
    assert r.status_code == 409 and "aliases expand" in r.json()["detail"] and "queues.yaml" in r.json()["detail"], r.text
    assert len(r.text) < 2_000
    assert srv.get("/readyz").status_code == 200
    assert {row["queue"] for row in srv.get("/queues").json()} >= {"a", "b"}, "the last good configuration kept"
    # the watcher meets the same file at its next poll: the API answers meanwhile
    for _ in range(10):
        t = time.monotonic()
        assert srv.get("/workloads").status_code == 200
        assert time.monotonic() - t < 1
        time.sleep(0.2)
    queues.write_text(good)

    # finding 2: a tenant over its guarantee asks to be unreclaimable, or above everyone
    for extra in ({"preemptible": False}, {"priority": 1_000_000}):
        r = call(srv, "POST", "/workloads", TENANT, json={"id": "grab", "queue": "b", "gpus_per_pod": 8, **extra})
        assert r.status_code == 422 and r.json()["errors"][0]["type"] == "policy", r.text
        assert "policy" in r.json()["detail"] or "max_priority" in r.json()["detail"], r.text
    for wid, gpus in (("b1", 8), ("b2", 4)):          # what it may ask: preemptible, priority 0
        assert call(srv, "POST", "/workloads", TENANT, json={"id": wid, "queue": "b", "gpus_per_pod": gpus}).status_code == 201
    srv.wait_until(lambda: srv.state("b1") == srv.state("b2") == "running", 20, "b over its guarantee")
    # the admin's workload within a's guarantee gets its GPUs back from b's borrowed ones
    assert call(srv, "POST", "/workloads", ADMIN, json={"id": "a2", "queue": "a", "gpus_per_pod": 4}).status_code == 201
    srv.wait_until(lambda: srv.state("a2") == "running", 30, "a2 admitted by preempting b's borrowed GPUs")
    assert srv.state("b2") == "pending" and srv.state("b1") == "running"

    # finding 6: the Kubernetes source's id forms are reserved
    r = call(srv, "POST", "/workloads", TENANT, json={"id": "rayjob/prod-ns/nightly", "queue": "b", "gpus_per_pod": 1})
    assert r.status_code == 422, r.text
    # a cancelled id cannot be taken over by another caller; its owner may submit it again
    assert call(srv, "POST", "/workloads", TENANT, json={"id": "mine", "queue": "b", "gpus_per_pod": 1}).status_code == 201
    assert call(srv, "DELETE", "/workloads/mine", TENANT).status_code == 200
    srv.wait_until(lambda: srv.state("mine") in ("cancelled", "finished"), 10, "mine closed")
    r = call(srv, "POST", "/workloads", ADMIN, json={"id": "mine", "queue": "a", "gpus_per_pod": 1})
    assert r.status_code == 409 and "another caller" in r.json()["detail"], r.text
    assert call(srv, "POST", "/workloads", TENANT, json={"id": "mine", "queue": "b", "gpus_per_pod": 1}).status_code == 201
    # the unknown-queue error names a few near matches, not every leaf
    r = call(srv, "POST", "/workloads", ADMIN, json={"id": "lost", "queue": "aa", "gpus_per_pod": 1})
    assert r.status_code == 422 and len(r.text) < 2_000, r.text
    # /queues pages
    every = {row["queue"] for row in srv.get("/queues?limit=10000").json()}
    r = srv.get("/queues?limit=1")
    assert r.status_code == 200 and int(r.headers["X-Total-Count"]) == len(every) >= 2
    assert len({row["queue"] for row in r.json()}) == 1

    # nothing accepted was lost, and memory is flat
    assert srv.state("kept") == "running"
    assert rss(srv.proc.pid) - before < 100 * MiB, (before, rss(srv.proc.pid))
    rc, took = srv.stop()
    assert rc == 0 and took < 10, srv.log.read_text()
