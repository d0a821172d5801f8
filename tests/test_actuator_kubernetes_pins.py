"""The ``kubernetes`` actuator pins the chosen nodes, restores the templates exactly, annotates the
workload and tells the owners with Events: real client, tests/k8s_api_server."""
from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import ApiClient
from kubernetes.client.models import CoreV1Event, V1PodTemplateSpec

from scheduler.actuators.k8s_templates import ObjectError, kube_node_names
from scheduler.actuators.kubernetes import (
    ADMISSION_ANNOTATION,
    WORKLOAD_ANNOTATION,
    KubernetesActuator,
)
from scheduler.model import Placement, Workload
from tests.k8s_api_server import ApiServer, load
from tests.test_actuator_kubernetes import (
    CLUSTER_T,
    GPU_HEAD,
    HEAD_RES,
    JOB,
    JOB_T,
    LABELS,
    POD_T,
    W,
    job_worker,
    settings_for,
    templates,
    with_,
)

REQ = "requiredDuringSchedulingIgnoredDuringExecution"
HOST = "kubernetes.io/hostname"
NOW = 1741092000.0                                  # 2025-03-04T12:40:00Z
EVENTS_A = "/api/v1/namespaces/team-a/events"
H100 = Placement("H100", (("h-0", 8), ("h-1", 8)))
CL_W = Workload("raycluster/team-vision/vision-dev", "research.vision", 2, 4)
JOB_UID = "5b0f6a0e-2d4c-4a8e-9a51-0c7f3d2e9b11"


def pin(*nodes: str) -> dict[str, Any]:
    return {"key": HOST, "operator": "In", "values": list(nodes)}


def pinned(*nodes: str) -> dict[str, Any]:
    return {"nodeAffinity": {REQ: {"nodeSelectorTerms": [{"matchExpressions": [pin(*nodes)]}]}}}


# A worker template with affinity of its own: two ORed terms, preferences, pod anti-affinity.
OWN_AFFINITY = {
    "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 50, "podAffinityTerm": {
        "topologyKey": HOST, "labelSelector": {"matchLabels": {"ray.io/group": "gpu-workers"}}}}]},
    "nodeAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": {"matchExpressions": [
            {"key": "example.com/fast-nic", "operator": "Exists"}]}}],
        REQ: {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In",
                                   "values": ["us-central1-a"]}]},
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["h-bad"]}]}]}},
}


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer([load("rayjob-train-llm.json"), load("raycluster-vision.json")],
                   pods=[("team-nlp", "bert-finetune-0")], priority_classes={"research-high": 1000}) as server:
        yield server


@pytest.fixture
def actuator(api: ApiServer, tmp_path: Path) -> Iterator[KubernetesActuator]:
    act = KubernetesActuator(settings_for(api, tmp_path), node_labels=LABELS, sleep=lambda _s: None,
                             clock=lambda: NOW, instance="gpuq-0")
    yield act
    act.close()


def job(api: ApiServer) -> dict[str, Any]:
    obj = api.get("RayJob", "team-a", "train-llm")
    assert obj is not None
    return obj


def affinity(tmpl: dict[str, Any]) -> Any:
    return tmpl["spec"].get("affinity")


# -- pinning --------------------------------------------------------------------------------------
def test_only_gpu_pod_sets_are_pinned(api: ApiServer, actuator: KubernetesActuator) -> None:
    cluster = load("raycluster-vision.json")           # plus a CPU-only worker group
    cpu_group = copy.deepcopy(cluster["spec"]["workerGroupSpecs"][0])
    cpu_group["groupName"] = "cpu"
    del cpu_group["template"]["spec"]["nodeSelector"]
    for amounts in cpu_group["template"]["spec"]["containers"][0]["resources"].values():
        del amounts["nvidia.com/gpu"]
    cluster["spec"]["workerGroupSpecs"].append(cpu_group)
    api.put(cluster)
    res = actuator.admit(CL_W, CLUSTER_T, Placement("A100", (("a-0", 4), ("a-1", 4))))
    assert res.ok and "on a-0, a-1" in res.message, res.message
    obj = api.get("RayCluster", "team-vision", "vision-dev")
    assert obj is not None
    head, a100, cpu = templates("RayCluster", obj)
    assert a100["spec"]["affinity"] == pinned("a-0", "a-1")
    assert affinity(head) is None and affinity(cpu) is None     # CPU pods: no hostname pin
    patch = api.calls("PATCH")[0].body
    assert "affinity" not in patch["spec"]["headGroupSpec"]["template"]["spec"]


def test_a_head_with_gpus_is_pinned_too(api: ApiServer, actuator: KubernetesActuator) -> None:
    api.put(with_("rayjob-train-llm.json", **{HEAD_RES: GPU_HEAD}))
    assert actuator.admit(W, JOB_T, Placement("H100", (("h-0", 8), ("h-1", 8), ("h-2", 8)))).ok
    head, workers = templates("RayJob", job(api))
    assert affinity(head) == affinity(workers) == pinned("h-0", "h-1", "h-2")


@pytest.mark.parametrize("stop", ["preempt", "cancel"])
def test_own_affinity_is_anded_and_restored_byte_for_byte(api: ApiServer, actuator: KubernetesActuator,
                                                          stop: str) -> None:
    obj = load("rayjob-train-llm.json")
    job_worker(obj)["template"]["spec"]["affinity"] = copy.deepcopy(OWN_AFFINITY)
    job_worker(obj)["template"]["spec"]["nodeSelector"] = {"cloud.google.com/gke-nodepool": "h100"}
    api.put(obj)
    original = job(api)
    assert actuator.admit(W, JOB_T, H100).ok
    admitted = job(api)
    got = job_worker(admitted)["template"]["spec"]["affinity"]
    # each ORed term gets the pin ANDed in; preferences and pod (anti-)affinity stay as they were
    assert got["nodeAffinity"][REQ]["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-central1-a"]},
                              pin("h-0", "h-1")]},
        {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["h-bad"]}],
         "matchExpressions": [pin("h-0", "h-1")]}]
    assert got["podAntiAffinity"] == OWN_AFFINITY["podAntiAffinity"]
    assert got["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"] == \
        OWN_AFFINITY["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    record = json.loads(admitted["metadata"]["annotations"][ADMISSION_ANNOTATION])
    assert record["affinities"] == [None, OWN_AFFINITY]
    assert record["nodeSelectors"] == [None, {"cloud.google.com/gke-nodepool": "h100"}]

    assert getattr(actuator, stop)(W, JOB_T, *(["r"] if stop == "preempt" else [])).ok
    restored = job(api)
    assert json.dumps(restored["spec"]) == json.dumps(original["spec"])       # byte for byte
    assert ADMISSION_ANNOTATION not in restored["metadata"]["annotations"]


@pytest.mark.parametrize("theirs, ok", [
    (["other-node"], False),
    (["h-1", "other-node"], True),
], ids=["excludes-the-chosen-nodes", "overlaps"])
def test_a_hostname_term_of_their_own(api: ApiServer, actuator: KubernetesActuator, theirs: list[str],
                                      ok: bool) -> None:
    obj = load("rayjob-train-llm.json")
    job_worker(obj)["template"]["spec"]["affinity"] = {"nodeAffinity": {REQ: {"nodeSelectorTerms": [
        {"matchExpressions": [pin(*theirs)]}]}}}
    api.put(obj)
    res = actuator.admit(W, JOB_T, H100)
    assert res.ok is ok, res.message
    if not ok:
        assert not res.retryable and "nodeAffinity conflict in spec.rayClusterSpec.workerGroupSpecs[0]" in res.message
        assert api.calls("PATCH") == [] and api.events() == []


@pytest.mark.parametrize("names, cluster, want", [
    (["h-0", "h-1"], "test", ("h-0", "h-1")),
    (["test/h-0", "test/h-1"], "test", ("h-0", "h-1")),
    (["h-0:A100-MIG-1g.10gb", "h-0:A100-MIG-3g.40gb", "h-1"], "", ("h-0", "h-1")),
    (["test/h-0:A100-MIG-1g.10gb"], "test", ("h-0",)),
    (["east/h-0"], "", ("h-0",)),
    (["east/h-0"], "test", "in cluster 'east'"),
    ([":MIG"], "", "names no Kubernetes node"),
], ids=["plain", "cluster-prefix", "mig-slices", "both", "no-cluster-known", "other-cluster", "empty"])
def test_kube_node_names(names: list[str], cluster: str, want: tuple[str, ...] | str) -> None:
    if isinstance(want, str):
        with pytest.raises(ObjectError, match=want):
            kube_node_names(names, cluster)
    else:
        assert kube_node_names(names, cluster) == want


def test_scheduler_node_names_become_kubernetes_node_names(api: ApiServer, actuator: KubernetesActuator) -> None:
    where = Placement("H100", (("test/h-0", 8), ("test/h-1:H100-MIG", 4), ("test/h-1:H100", 4)))
    assert actuator.admit(W, JOB_T, where).ok
    assert job_worker(job(api))["template"]["spec"]["affinity"] == pinned("h-0", "h-1")
    assert actuator.preempt(W, JOB_T, "r").ok
    refused = actuator.admit(W, JOB_T, Placement("H100", (("east/h-0", 8),)))
    assert not refused.ok and not refused.retryable and "cluster 'east'" in refused.message
    assert len(api.calls("PATCH")) == 2


def test_templates_changed_since_admission_lose_only_the_pin(api: ApiServer,
                                                             actuator: KubernetesActuator) -> None:
    obj = load("rayjob-train-llm.json")
    job_worker(obj)["template"]["spec"]["affinity"] = copy.deepcopy(OWN_AFFINITY)
    api.put(obj)
    assert actuator.admit(W, JOB_T, H100).ok
    changed = job(api)                   # someone adds a group (a copy of the pinned one)
    groups = changed["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    groups.append({**copy.deepcopy(groups[0]), "groupName": "more"})
    api.put(changed)
    assert actuator.preempt(W, JOB_T, "r").ok
    after = job(api)
    for group in after["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        assert group["template"]["spec"]["affinity"] == OWN_AFFINITY
    assert "affinity" not in after["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]


def test_patched_templates_and_events_fit_the_kubernetes_schema(api: ApiServer,
                                                                actuator: KubernetesActuator) -> None:
    """The client's models are generated from the Kubernetes OpenAPI schema: each patched pod
    template and each Event must parse, and serialize back to the same JSON (no unknown field)."""
    obj = load("rayjob-train-llm.json")
    job_worker(obj)["template"]["spec"]["affinity"] = copy.deepcopy(OWN_AFFINITY)
    api.put(obj)
    assert actuator.admit(W, JOB_T, H100).ok
    client = ApiClient()
    for tmpl in templates("RayJob", job(api)):
        assert client.sanitize_for_serialization(V1PodTemplateSpec.from_dict(tmpl)) == tmpl
    (event,) = api.events()
    sent = api.calls("POST", "/events")[0].body
    assert client.sanitize_for_serialization(CoreV1Event.from_dict(sent)) == sent
    assert event["involvedObject"]["uid"] == JOB_UID


# -- the workload annotation ----------------------------------------------------------------------
def test_the_workload_annotation_is_set_and_stays(api: ApiServer, actuator: KubernetesActuator) -> None:
    assert actuator.admit(W, JOB_T, H100).ok
    assert job(api)["metadata"]["annotations"][WORKLOAD_ANNOTATION] == "rayjob/team-a/train-llm"
    assert actuator.preempt(W, JOB_T, "r").ok          # terminating pods still join to it
    assert job(api)["metadata"]["annotations"][WORKLOAD_ANNOTATION] == "rayjob/team-a/train-llm"


# -- Events ---------------------------------------------------------------------------------------
def test_one_event_per_action(api: ApiServer, actuator: KubernetesActuator) -> None:
    reason = "preempted by rayjob/team-b/urgent: queue research.nlp below its guarantee (8 of 16 GPUs)"
    assert actuator.admit(W, JOB_T, H100).ok
    assert actuator.preempt(W, JOB_T, reason).ok
    assert actuator.admit(W, JOB_T, Placement("A100", (("a-0", 8), ("a-1", 8)))).ok
    assert actuator.cancel(W, JOB_T).ok
    events = api.events("team-a")
    assert [(e["reason"], e["type"], e["action"]) for e in events] == [
        ("Admitted", "Normal", "Admit"), ("Preempted", "Warning", "Preempt"),
        ("Admitted", "Normal", "Admit"), ("Cancelled", "Normal", "Cancel")]
    assert [e["message"] for e in events] == [
        "admitted to queue research.nlp on h-0, h-1 (16 x H100)", reason,
        "admitted to queue research.nlp on a-0, a-1 (16 x A100)", "cancelled by gpuq"]
    first = api.calls("POST", "/events")[0].body
    assert first["involvedObject"] == {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "train-llm",
                                       "namespace": "team-a", "uid": JOB_UID}
    assert first["source"] == {"component": "gpuq-scheduler"}
    assert (first["reportingComponent"], first["reportingInstance"], first["count"]) == ("gpuq", "gpuq-0", 1)
    assert first["metadata"]["namespace"] == "team-a"
    names = [e["metadata"]["name"] for e in events]
    assert len(set(names)) == 4
    assert all(re.fullmatch(r"train-llm\.gpuq-(admit|preempt|cancel)-[0-9a-f]{12}", n) for n in names)


def test_a_repeated_call_does_not_tell_twice(api: ApiServer, actuator: KubernetesActuator) -> None:
    first = actuator.admit(W, JOB_T, H100)
    again = actuator.admit(W, JOB_T, H100)            # already admitted: same Event name, 409
    assert again.ok and again.detail["patched"] is False
    assert again.detail["event"] == first.detail["event"] and "event_error" not in again.detail
    assert actuator.preempt(W, JOB_T, "r").ok and actuator.preempt(W, JOB_T, "r").ok
    assert [e["reason"] for e in api.events()] == ["Admitted", "Preempted"]
    assert len(api.calls("POST", "/events")) == 4
    assert actuator.events is not None and actuator.events.created == 2 and not actuator.events.failures


def test_an_event_not_created_is_told_by_the_next_call(api: ApiServer, actuator: KubernetesActuator) -> None:
    """Admitted, but the Event failed (or the answer to the PATCH was lost and the retry found the
    object admitted): the next admit of the same workload tells it, under the same name, once."""
    api.fail("POST", EVENTS_A, 403, "forbidden", times=1)
    first = actuator.admit(W, JOB_T, H100)
    assert first.ok and "event_error" in first.detail and api.events() == []
    again = actuator.admit(W, JOB_T, H100)
    assert again.detail["event"] == first.detail["event"] and "event_error" not in again.detail
    assert actuator.admit(W, JOB_T, H100).ok
    assert [e["reason"] for e in api.events()] == ["Admitted"]


def test_a_preempt_without_reason_is_a_suspension(api: ApiServer, actuator: KubernetesActuator) -> None:
    assert actuator.admit(W, JOB_T, H100).ok
    assert actuator.preempt(W, JOB_T, "").ok
    assert [(e["reason"], e["type"], e["message"]) for e in api.events()][-1] == (
        "Suspended", "Warning", "suspended by gpuq")


def test_a_cancel_reason_becomes_the_message(api: ApiServer, actuator: KubernetesActuator) -> None:
    assert actuator.cancel(W, JOB_T, "cancelled by alice").ok       # a pending object: only marked
    (event,) = api.events()
    assert (event["reason"], event["message"]) == ("Cancelled", "cancelled by alice")


def test_an_evicted_pod_gets_the_event(api: ApiServer, actuator: KubernetesActuator) -> None:
    assert actuator.preempt(W, POD_T, "queue research.vision over its max").ok
    (event,) = api.events("team-nlp")
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "bert-finetune-0",
                                       "namespace": "team-nlp"}
    assert (event["reason"], event["message"]) == ("Preempted", "queue research.vision over its max")
    assert actuator.cancel(W, POD_T).ok               # already gone: nothing happened, nothing told
    assert len(api.events()) == 1


@pytest.mark.parametrize("status, posts", [(500, 4), (403, 1)], ids=["500-retried", "403-not-retried"])
def test_an_event_failure_never_fails_the_action(api: ApiServer, actuator: KubernetesActuator, status: int,
                                                 posts: int, caplog: pytest.LogCaptureFixture) -> None:
    api.fail("POST", EVENTS_A, status, 'events is forbidden: User "system:serviceaccount:gpuq:gpuq" cannot '
                                       'create resource "events"', times=99)
    res = actuator.admit(W, JOB_T, H100)
    assert res.ok and res.detail["patched"], res.message
    assert f"HTTP {status}" in res.detail["event_error"]
    assert job(api)["spec"]["suspend"] is False
    assert len(api.calls("POST", "/events")) == posts and api.events() == []
    assert actuator.events is not None and actuator.events.failures == {"Admitted": 1}
    assert "not created" in caplog.text


def test_events_can_be_off(api: ApiServer, tmp_path: Path) -> None:
    act = KubernetesActuator(settings_for(api, tmp_path), node_labels=LABELS, events=False)
    try:
        assert act.admit(W, JOB_T, H100).ok
    finally:
        act.close()
    assert [r.method for r in api.requests] == ["GET", "PATCH"] and JOB in api.requests[0].path
