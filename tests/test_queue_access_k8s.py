"""Issue 17's attack through Kubernetes, tried again: a RayJob in namespace team-x labelled
``queue: prod``, where prod allows only prod-ns. The workload source (the real client against
tests/k8s_api_server.py) holds it pending ``queue_not_allowed`` with a Kubernetes Event and never
admits it; its pods, which run anyway, are billed to team-x's own queue, never to prod (the
collector against tests/k8s_replay.py, the rows in chDB, the accounting's CLI over them)."""
from __future__ import annotations

import copy
import datetime as dt
import io
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.cli import queues_main, usage_main
from accounting.queues import parse_queue_config
from collector.kubernetes import KubernetesWatcher
from collector.sources import _queue_mapping
from gpuq.settings import KubernetesTarget, load_settings
from gpuq.store.writer import BatchWriter
from scheduler.actuators.base import DryRunActuator
from scheduler.actuators.k8s_workloads import KubernetesWorkloadSource
from scheduler.service import SchedulerService
from scheduler.service.sources import sync_listed
from scheduler.testing import nodes
from tests.k8s_api_server import ApiServer
from tests.k8s_api_server import load as load_object
from tests.test_actuator_kubernetes import LABELS, settings_for
from tests.test_collector_kubernetes_owners import KUBERAY, kuberay_server

QUEUES: dict[str, Any] = {
    "mapping": {"namespaces": {"prod-ns": "prod"}},
    "queues": {
        "prod": {"namespaces": ["prod-ns"], "guaranteed": {"gpu": 16}, "max": {"gpu": 16}},
        "tenants": {"max": {"gpu": 32},
                    "placement": {"namespace_queues": True, "template": {"guaranteed": {"gpu": 0}, "max": {"gpu": 16}}}},
    },
}
WID = "rayjob/team-x/train-llm"


def in_team_x(obj: dict[str, Any], **labels: str) -> dict[str, Any]:
    out = copy.deepcopy(obj)
    out["metadata"]["namespace"] = "team-x"
    if labels:
        out["metadata"]["labels"] = labels
    return out


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer([in_team_x(load_object("rayjob-train-llm.json"), queue="prod")]) as server:
        yield server


def test_the_source_holds_a_rayjob_naming_a_queue_its_namespace_may_not_use(api: ApiServer,
                                                                            tmp_path: Path) -> None:
    svc = SchedulerService(parse_queue_config(QUEUES), DryRunActuator(), nodes=nodes(("h", "H100", 8, 4)))
    source = KubernetesWorkloadSource(settings_for(api, tmp_path), node_labels=LABELS, clock=lambda: 1000.0)
    try:
        report = sync_listed(svc, source, 1.0)
        assert report.submitted == report.not_allowed == (WID,)
        v = svc.explain(WID)
        assert (v.state, v.queue, v.reason_code) == ("pending", "prod", "queue_not_allowed")
        assert v.message == ("namespace team-x may not use queue prod: queues.prod.namespaces does not list it; "
                             "not admitted (what it runs anyway is billed to tenants.team-x)")
        for t in (2.0, 40.0, 80.0):                             # 32 GPUs free, preemption allowed: never admitted
            assert svc.cycle(t).admissions == ()
        (event,) = api.events("team-x")
        assert (event["reason"], event["type"], event["action"], event["message"]) == (
            "QueueNotAllowed", "Warning", "Refuse", v.message)
        assert event["involvedObject"] == {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "train-llm",
                                           "namespace": "team-x", "uid": "5b0f6a0e-2d4c-4a8e-9a51-0c7f3d2e9b11"}
        assert sync_listed(svc, source, 90.0) == type(report)()        # held: not taken again, not told again
        assert len(api.events("team-x")) == 1
        assert api.calls("PATCH") == []                                 # the object was never touched

        # relabelled to its namespace's placement parent: taken again as new, in team-x's own queue
        relabelled = api.get("RayJob", "team-x", "train-llm")
        assert relabelled is not None
        relabelled["metadata"]["labels"] = {"queue": "tenants"}
        api.put(relabelled)
        assert sync_listed(svc, source, 100.0).submitted == (WID,)
        v = svc.explain(WID)
        assert (v.state, v.queue, v.reason_code) == ("pending", "tenants.team-x", "queued")
        assert dict(svc.config.queues["tenants.team-x"].max) == {"gpu": 16}
        assert svc.cycle(101.0).admissions[0].workload.id == WID
    finally:
        source.close()


def test_what_it_runs_anyway_is_billed_to_its_namespaces_queue(store: Any, store_dsn: str, tmp_path: Path) -> None:
    """The RayJob's pods run (someone unsuspended it past gpuq): the collector records the queue
    they name (prod), the accounting bills them to team-x's own queue."""
    job = in_team_x(KUBERAY["rayjobs"][0], queue="prod")
    cluster = in_team_x(KUBERAY["rayclusters"][0])
    pods = [in_team_x(p) for p in KUBERAY["pods"]]
    writer = BatchWriter(store, tmp_path / "spill")
    with kuberay_server(rayclusters=[cluster], rayjobs=[job]) as server:
        for p in pods:
            server.add("pods", p)
        target = KubernetesTarget(cluster="prod", kubeconfig=str(server.kubeconfig(tmp_path / "kubeconfig")))
        KubernetesWatcher(target).run(writer.write, threading.Event(), once=True)
    writer.flush()
    stored = store.query(f"SELECT queue, sum(gpus) FROM {store.database}.gpu_allocations FINAL "
                         f"WHERE namespace = 'team-x' GROUP BY queue").rows
    assert [tuple(r) for r in stored] == [("prod", 4.0)]               # as collected: what the objects name

    (tmp_path / "queues.yaml").write_text(yaml.safe_dump(QUEUES))
    settings = load_settings(None, store={"dsn": store_dsn}, queues_file=str(tmp_path / "queues.yaml"))
    now_s = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC).timestamp()
    out, err = io.StringIO(), io.StringIO()
    assert queues_main(["--format", "json"], settings, now_s=now_s, out=out, err=err) == 0, err.getvalue()
    now = {r["queue"]: r for r in json.loads(out.getvalue()) if r["gpu_type"] == "*"}
    assert now["tenants.team-x"]["allocated"] == 4 and now["tenants.team-x"]["max"] == 16
    assert now["prod"]["allocated"] == 0
    out = io.StringIO()
    assert usage_main(["--format", "json", "--from", "2026-11-21T09:00:00Z", "--to", "2026-11-21T10:00:00Z",
                       "--by", "queue,namespace"], settings, now_s=now_s, out=out, err=err) == 0, err.getvalue()
    usage = json.loads(out.getvalue())
    assert {(u["queue"], u["namespace"]) for u in usage if u["namespace"] == "team-x"} == {("tenants.team-x", "team-x")}
    assert not [u for u in usage if u["queue"] == "prod"]


def test_the_collector_leaves_the_default_to_the_accounting_when_placement_rules_exist(tmp_path: Path) -> None:
    f = tmp_path / "queues.yaml"
    with_default = {**QUEUES, "mapping": {"namespaces": {"prod-ns": "prod"}, "default": "prod"}}
    f.write_text(yaml.safe_dump(with_default))
    got = _queue_mapping(load_settings(None, queues_file=str(f)))
    assert (got.default, dict(got.namespaces)) == (None, {"prod-ns": "prod"})
    without = {"mapping": with_default["mapping"], "queues": {"prod": {}}}
    f.write_text(yaml.safe_dump(without))
    assert _queue_mapping(load_settings(None, queues_file=str(f))).default == "prod"
