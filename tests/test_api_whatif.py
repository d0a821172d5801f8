"""``POST /admin/whatif`` and ``GET /admin/whatif/{id}``: admins only; the history is read and the
change checked in the API (a bad field is a 422 naming it), the replays run in a process of their
own (the report is the CLI's, byte for byte as JSON), one at a time (409), and one running past
its limit is stopped."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.queues import parse_queue_config
from gpuq.settings import load_settings
from scheduler.actuators.base import DryRunActuator
from scheduler.api import create_app
from scheduler.service import SchedulerService
from scheduler.whatif import Jobs, job_input, scheduler_settings, whatif
from tests.test_api_security import Api
from tests.test_whatif import CLUSTER, NOW, SCENARIOS, fill

TOKENS = [{"token": "view-t", "role": "viewer", "name": "vera"},
          {"token": "op-t", "role": "operator", "name": "otto", "namespaces": ["*"], "queues": ["*"]},
          {"token": "adm-t", "role": "admin", "name": "ada"}]
QUEUES = yaml.safe_load((SCENARIOS / "classic-60-40.yaml").read_text())["queues"]


@pytest.fixture
def api(store: Any, tmp_path: Path) -> tuple[Api, Any, Jobs]:
    from scheduler.service.accounting import LiveAccounting

    fill(store, SCENARIOS / "classic-60-40.yaml")
    qf = tmp_path / "queues.yaml"
    qf.write_text(yaml.safe_dump({"queues": QUEUES}))
    settings = load_settings(None, api={"tokens": TOKENS}, queues_file=str(qf), scheduler={"cluster": CLUSTER})
    config = parse_queue_config({"queues": QUEUES})
    svc = SchedulerService(config, DryRunActuator(), cluster=CLUSTER)
    jobs = Jobs()
    app = create_app(svc, LiveAccounting(store, config=config), settings, clock=lambda: NOW, whatif_jobs=jobs)
    yield Api(app), settings, jobs
    jobs.close()


def wait(api: Api, job_id: str) -> dict[str, Any]:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        r = api("GET", f"/admin/whatif/{job_id}", "adm-t")
        assert r.status_code == 200, r.text
        if r.json()["state"] != "running":
            return dict(r.json())
        time.sleep(0.2)
    raise AssertionError("the what-if did not end within 60 s")


def test_admins_start_a_replay_in_its_own_process(api: tuple[Api, Any, Jobs], store: Any) -> None:
    client, settings, _ = api
    body = {"from": "-1d", "add_nodes": ["A100:8x4"]}
    for token in (None, "view-t", "op-t"):
        assert client("POST", "/admin/whatif", token, json=body).status_code in (401, 403)
    r = client("POST", "/admin/whatif", "adm-t", json=body)
    assert r.status_code == 202, r.text
    job = r.json()
    assert job["state"] == "running" and job["by"] == "ada (admin)" and r.headers["location"] == f"/admin/whatif/{job['id']}"
    assert job["change"] == {"queues": None, "add_nodes": ["A100:8x4"], "remove_nodes": []}
    assert client("GET", f"/admin/whatif/{job['id']}", "view-t").status_code == 403
    done = wait(client, job["id"])
    assert done["state"] == "done", done
    # the report is what gpuq whatif computes from the same history
    from scheduler.whatif import Change, read

    h = read(settings, store, CLUSTER, NOW - 86400, NOW)
    expected = whatif(h, {"queues": QUEUES, "policy": {"max_priority": 0, "non_preemptible": False}},
                      scheduler_settings(settings), Change(add_nodes=(("A100", 8, 4),))).report
    assert done["report"] == json.loads(json.dumps(expected))
    assert done["report"]["queues"]["(all)"]["preemptions"] == {"before": 4, "after": 0, "delta": -4}
    assert client("GET", "/admin/whatif/nope", "adm-t").status_code == 404


def test_a_queue_file_as_text_and_one_at_a_time(api: tuple[Api, Any, Jobs]) -> None:
    client, _, _ = api
    queues = yaml.safe_dump({"queues": {"first": {"guaranteed": {"gpu": 40}}, "second": {"guaranteed": {"gpu": 40}}}})
    first = client("POST", "/admin/whatif", "adm-t", json={"from": "-1d", "queues": queues})
    assert first.status_code == 202, first.text
    second = client("POST", "/admin/whatif", "adm-t", json={"from": "-1d"})
    assert second.status_code == 409 and "is still running" in second.json()["detail"]
    done = wait(client, first.json()["id"])
    assert done["state"] == "done" and done["report"]["change"]["queues"] == "the queues given"
    assert client("POST", "/admin/whatif", "adm-t", json={"from": "-1d"}).status_code == 202   # free again


@pytest.mark.parametrize("body, field, text", [
    ({"add_nodes": ["H100"]}, "body.add_nodes", "expected TYPE:GPUSxCOUNT"),
    ({"remove_nodes": ["gpu-99"]}, "body.remove_nodes", "unknown node 'gpu-99'"),
    ({"queues": "queues: [a"}, "body.queues", "invalid YAML"),
    ({"queues": "queues: {first: {}}"}, "body.queues", "not leaves here: second"),
    ({"from": "-3d", "to": "-2d"}, "body.from", "no workload of cluster 'sim' to replay"),
    ({"from": "soon"}, "body.from", "expected ISO 8601"),
    ({"from": "-1h", "to": "-2h"}, "body.to", "is not after"),
])
def test_bad_fields_are_named(api: tuple[Api, Any, Jobs], body: dict[str, Any], field: str, text: str) -> None:
    client, _, _ = api
    r = client("POST", "/admin/whatif", "adm-t", json={"from": "-1d", **body})
    assert r.status_code == 422, r.text
    errors = r.json()["errors"]
    assert any(e["field"] == field and text in e["message"] for e in errors), errors


def test_a_replay_past_its_limit_is_stopped(store: Any, tmp_path: Path) -> None:
    from scheduler.history import read_history

    fill(store, SCENARIOS / "classic-60-40.yaml")
    h = read_history(store, CLUSTER, NOW - 86400, NOW, parse_queue_config({"queues": QUEUES}))
    jobs = Jobs(limit_s=5.0)
    from scheduler.whatif import Change

    job = jobs.start(job_input(h, {"queues": QUEUES}, {"preemption": True}, Change()), "ada", 1000.0, {})
    try:
        again = jobs.get(job.id, 1000.0 + 6.0)                   # its limit has passed: killed
        assert again is not None and again.state == "failed" and "still running after 5 s" in (again.error or "")
        assert again.proc.poll() is not None and not again.dir.exists()
    finally:
        jobs.close()
