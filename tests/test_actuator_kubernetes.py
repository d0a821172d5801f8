"""The ``kubernetes`` actuator and workload source, with the real client against tests/k8s_api_server.

The requests asserted are Kueue's (jobframework startJob/stopJob through ``clientutil.Patch``
strict, i.e. a JSON merge patch carrying the resourceVersion; RayJob RunWithPodSetsInfo /
Suspend / RestorePodSetsInfo), plus the policy/v1 Eviction for plain pods.
"""
from __future__ import annotations

import copy
from decimal import Decimal
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import json_merge_patch
import pytest

from gpuq.settings import CollectorSettings, KubernetesTarget, Settings
from scheduler.actuators.base import Target
from scheduler.actuators.k8s_workloads import KubernetesWorkloadSource, SourceKeys, workload_of
from scheduler.actuators.kubernetes import (
    ADMISSION_ANNOTATION,
    CANCELLED_ANNOTATION,
    PREEMPTED_ANNOTATION,
    WORKLOAD_ANNOTATION,
    KubernetesActuator,
    ObjectError,
    merge_patch,
)
from scheduler.model import Placement, Workload
from tests.conftest import closed_port
from tests.k8s_api_server import MERGE_PATCH, ApiServer, load

LABELS = {"H100": "NVIDIA-H100-80GB-HBM3", "A100": "NVIDIA-A100-SXM4-80GB"}
KEY = "nvidia.com/gpu.product"
JOB = "/apis/ray.io/v1/namespaces/team-a/rayjobs/train-llm"
CLUSTER = "/apis/ray.io/v1/namespaces/team-vision/rayclusters/vision-dev"
EVENTS_A = "/api/v1/namespaces/team-a/events"
JOB_T = Target("RayJob", "team-a", "train-llm", "ray.io/v1")
CLUSTER_T = Target("RayCluster", "team-vision", "vision-dev", "ray.io/v1")
POD_T = Target("Pod", "team-nlp", "bert-finetune-0")
W = Workload("rayjob/team-a/train-llm", "research.nlp", pods=2, gpus_per_pod=8)
H100 = Placement("H100", (("h-0", 8), ("h-1", 8)))


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer([load("rayjob-train-llm.json"), load("raycluster-vision.json")],
                   pods=[("team-nlp", "bert-finetune-0")],
                   priority_classes={"research-high": 1000}) as server:
        yield server


def settings_for(server: ApiServer, tmp: Path, **target: Any) -> Settings:
    kubeconfig = server.kubeconfig(tmp / "kubeconfig")
    return Settings(collector=CollectorSettings(
        kubernetes=[KubernetesTarget(cluster="test", kubeconfig=str(kubeconfig), **target)]))


@pytest.fixture
def actuator(api: ApiServer, tmp_path: Path) -> Iterator[KubernetesActuator]:
    act = KubernetesActuator(settings_for(api, tmp_path), node_labels=LABELS, sleep=lambda _s: None)
    yield act
    act.close()


def templates(kind: str, obj: dict[str, Any]) -> list[dict[str, Any]]:
    spec = obj["spec"]["rayClusterSpec"] if kind == "RayJob" else obj["spec"]
    return [spec["headGroupSpec"]["template"], *(g["template"] for g in spec["workerGroupSpecs"])]


# -- admission ----------------------------------------------------------------------------------
def test_admit_rayjob_sends_kueues_strict_merge_patch(api: ApiServer, actuator: KubernetesActuator) -> None:
    before = api.get("RayJob", "team-a", "train-llm")
    assert before is not None
    res = actuator.admit(W, JOB_T, H100)
    assert res.ok and res.detail["patched"], res.message
    assert [(r.method, r.path) for r in api.requests] == [("GET", JOB), ("PATCH", JOB), ("POST", EVENTS_A)]
    patch = api.requests[1]
    assert patch.content_type == MERGE_PATCH
    body = patch.body
    # strict: the resourceVersion read goes along as a precondition
    assert body["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    assert set(body["spec"]) == {"suspend", "rayClusterSpec"} and body["spec"]["suspend"] is False
    cluster = body["spec"]["rayClusterSpec"]
    assert set(cluster) == {"headGroupSpec", "workerGroupSpecs"}
    assert cluster["headGroupSpec"] == {"template": {"spec": {"nodeSelector": {KEY: LABELS["H100"]}}}}
    # a merge patch replaces lists: the worker groups go whole, each with the selector merged in
    # and (GPU groups) pinned to the chosen nodes; the CPU-only head gets no hostname pin
    want = copy.deepcopy(before["spec"]["rayClusterSpec"]["workerGroupSpecs"])
    for group in want:
        group["template"]["spec"]["nodeSelector"] = {KEY: LABELS["H100"]}
        group["template"]["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["h-0", "h-1"]}]}]}}}
    assert cluster["workerGroupSpecs"] == want
    record = json.loads(body["metadata"]["annotations"][ADMISSION_ANNOTATION])
    assert record == {"workload": W.id, "gpuType": "H100", "key": KEY, "value": LABELS["H100"],
                      "nodeSelectors": [None, None], "affinities": [None, None], "nodes": ["h-0", "h-1"]}
    assert body["metadata"]["annotations"][WORKLOAD_ANNOTATION] == W.id
    after = api.get("RayJob", "team-a", "train-llm")
    assert after is not None and after["spec"]["suspend"] is False
    assert all(t["spec"]["nodeSelector"] == {KEY: LABELS["H100"]} for t in templates("RayJob", after))
    assert after["metadata"]["generation"] == 2


def test_admit_raycluster_merges_into_existing_selectors(api: ApiServer,
                                                         actuator: KubernetesActuator) -> None:
    res = actuator.admit(Workload("raycluster/team-vision/vision-dev", "research.vision", 2, 4), CLUSTER_T,
                         Placement("A100", (("a-0", 8),)))
    assert res.ok, res.message
    body = api.calls("PATCH")[0].body
    assert set(body["spec"]) == {"suspend", "headGroupSpec", "workerGroupSpecs"}
    after = api.get("RayCluster", "team-vision", "vision-dev")
    assert after is not None
    head, a100 = templates("RayCluster", after)
    assert a100["spec"]["nodeSelector"] == {"cloud.google.com/gke-nodepool": "gpu-pool", KEY: LABELS["A100"]}
    assert head["spec"]["nodeSelector"] == {KEY: LABELS["A100"]}


def test_admit_twice_patches_once(api: ApiServer, actuator: KubernetesActuator) -> None:
    assert actuator.admit(W, JOB_T, H100).ok
    state = api.get("RayJob", "team-a", "train-llm")
    again = actuator.admit(W, JOB_T, H100)
    assert again.ok and again.detail["patched"] is False and "already admitted" in again.message
    assert len(api.calls("PATCH")) == 1
    assert api.get("RayJob", "team-a", "train-llm") == state


def test_admit_running_on_another_type_is_refused(api: ApiServer, actuator: KubernetesActuator) -> None:
    assert actuator.admit(W, JOB_T, H100).ok
    res = actuator.admit(W, JOB_T, Placement("A100", (("a-0", 8),)))
    assert not res.ok and not res.retryable and "running unsuspended" in res.message
    assert len(api.calls("PATCH")) == 1


def test_admit_refuses_a_conflicting_selector_without_patching(api: ApiServer,
                                                               actuator: KubernetesActuator) -> None:
    obj = load("rayjob-train-llm.json")
    job_worker(obj)["template"]["spec"]["nodeSelector"] = {KEY: "Tesla-T4"}
    api.put(obj)
    res = actuator.admit(W, JOB_T, H100)
    assert not res.ok and not res.retryable
    assert "conflict in spec.rayClusterSpec.workerGroupSpecs[0].template" in res.message
    assert "Tesla-T4" in res.message
    assert api.calls("PATCH") == []


def test_node_labels_come_from_the_queue_file(api: ApiServer, tmp_path: Path) -> None:
    queues = tmp_path / "queues.yaml"
    queues.write_text("gpu_types:\n  H100: {node_labels: [NVIDIA-H100-80GB-HBM3]}\n  L4: {}\n"
                      "queues:\n  research: {guaranteed: {gpu: 8}}\n")
    settings = settings_for(api, tmp_path).model_copy(update={"queues_file": str(queues)})
    act = KubernetesActuator(settings)
    try:
        assert act.node_labels == {"H100": "NVIDIA-H100-80GB-HBM3"}
        assert (act.label_value("H100"), act.label_value("L4"), act.label_value("")) == (
            "NVIDIA-H100-80GB-HBM3", "L4", None)
        assert act.admit(W, JOB_T, H100).ok
    finally:
        act.close()
    after = api.get("RayJob", "team-a", "train-llm")
    assert after is not None and job_worker(after)["template"]["spec"]["nodeSelector"] == {KEY: LABELS["H100"]}


def test_submitter_template_and_a_stale_record(api: ApiServer, actuator: KubernetesActuator) -> None:
    obj = load("rayjob-train-llm.json")
    obj["spec"]["submitterPodTemplate"] = {"spec": {"containers": [{"name": "submit", "image": "ray"}],
                                                    "restartPolicy": "Never"}}
    api.put(obj)
    assert actuator.admit(W, JOB_T, H100).ok
    admitted = api.get("RayJob", "team-a", "train-llm")
    assert admitted is not None
    assert admitted["spec"]["submitterPodTemplate"]["spec"]["nodeSelector"] == {KEY: LABELS["H100"]}
    # someone else suspends it, leaving gpuq's selectors and record: admission starts from the originals
    stale = copy.deepcopy(admitted)
    stale["spec"]["suspend"] = True
    api.put(stale)
    a100 = actuator.admit(W, JOB_T, Placement("A100", (("a-0", 8),)))
    assert a100.ok, a100.message
    again = api.get("RayJob", "team-a", "train-llm")
    assert again is not None and job_worker(again)["template"]["spec"]["nodeSelector"] == {KEY: LABELS["A100"]}
    assert json.loads(again["metadata"]["annotations"][ADMISSION_ANNOTATION])["nodeSelectors"] == [None] * 3
    assert actuator.preempt(W, JOB_T, "r").ok
    restored = api.get("RayJob", "team-a", "train-llm")
    assert restored is not None and restored["spec"] == obj["spec"]


@pytest.mark.parametrize("kind", ["Pod", ""], ids=["pod", "no-kind"])
def test_admit_only_kuberay_objects(actuator: KubernetesActuator, api: ApiServer, kind: str) -> None:
    res = actuator.admit(W, Target(kind, "team-nlp", "x"), H100)
    assert not res.ok and not res.retryable and "only RayJob and RayCluster" in res.message
    assert api.requests == []


# -- preemption and cancel ------------------------------------------------------------------------
def test_preempt_suspends_and_restores_the_original_templates(api: ApiServer,
                                                              actuator: KubernetesActuator) -> None:
    original = api.get("RayCluster", "team-vision", "vision-dev")
    assert original is not None
    wl = Workload("raycluster/team-vision/vision-dev", "research.vision", 2, 4)
    assert actuator.admit(wl, CLUSTER_T, Placement("A100", (("a-0", 8),))).ok
    res = actuator.preempt(wl, CLUSTER_T, "queue research.nlp below its guarantee")
    assert res.ok and res.detail["patched"], res.message
    patch = api.calls("PATCH")[-1]
    assert patch.content_type == MERGE_PATCH and patch.body["spec"]["suspend"] is True
    assert patch.body["spec"]["headGroupSpec"] == {"template": {"spec": {"nodeSelector": None}}}
    assert patch.body["metadata"]["annotations"] == {
        ADMISSION_ANNOTATION: None, PREEMPTED_ANNOTATION: "queue research.nlp below its guarantee"}
    assert "resourceVersion" in patch.body["metadata"]
    after = api.get("RayCluster", "team-vision", "vision-dev")
    assert after is not None and after["spec"] == original["spec"]       # as the user wrote it


def test_preempt_twice_patches_once(api: ApiServer, actuator: KubernetesActuator) -> None:
    assert actuator.admit(W, JOB_T, H100).ok
    assert actuator.preempt(W, JOB_T, "r").ok
    again = actuator.preempt(W, JOB_T, "r")
    assert again.ok and again.detail["patched"] is False
    assert len(api.calls("PATCH")) == 2


def test_preempt_of_a_deleted_object_is_ok(api: ApiServer, actuator: KubernetesActuator) -> None:
    res = actuator.preempt(W, Target("RayJob", "team-a", "gone"), "r")
    assert res.ok and "gone" in res.message and api.calls("PATCH") == []


def test_cancel_suspends_and_marks(api: ApiServer, actuator: KubernetesActuator) -> None:
    assert actuator.admit(W, JOB_T, H100).ok
    assert actuator.cancel(W, JOB_T).ok
    after = api.get("RayJob", "team-a", "train-llm")
    assert after is not None and after["spec"]["suspend"] is True
    assert after["metadata"]["annotations"][CANCELLED_ANNOTATION] == "true"
    assert ADMISSION_ANNOTATION not in after["metadata"]["annotations"]
    assert actuator.cancel(W, JOB_T).detail["patched"] is False


def test_evict_pod_posts_a_policy_v1_eviction(api: ApiServer, actuator: KubernetesActuator) -> None:
    res = actuator.preempt(W, POD_T, "r")
    assert res.ok, res.message
    post, event = api.requests
    assert (event.method, event.path) == ("POST", "/api/v1/namespaces/team-nlp/events")
    assert (post.method, post.path) == ("POST", "/api/v1/namespaces/team-nlp/pods/bert-finetune-0/eviction")
    assert post.content_type == "application/json"
    assert post.body == {"apiVersion": "policy/v1", "kind": "Eviction",
                         "metadata": {"name": "bert-finetune-0", "namespace": "team-nlp"}}
    assert not api.has_pod("team-nlp", "bert-finetune-0")
    gone = actuator.cancel(W, POD_T)                      # 404: already gone
    assert gone.ok and "already gone" in gone.message


def test_eviction_blocked_by_a_pdb_is_a_refusal_retried_later(api: ApiServer,
                                                               actuator: KubernetesActuator) -> None:
    """A PodDisruptionBudget's 429 is not retried within the call (the budget will not change in
    a second): ``refused``, for the service to retry after a backoff (tests/test_acting_brakes.py)."""
    api.block_eviction("team-nlp", "bert-finetune-0", "bert-pdb")
    res = actuator.preempt(W, POD_T, "r")
    assert not res.ok and not res.retryable and res.detail["refused"] is True
    assert "refused by PodDisruptionBudget" in res.message and "HTTP 429" in res.message
    assert "The disruption budget bert-pdb needs 1 healthy pods" in res.message
    assert "/api/v1/namespaces/team-nlp/pods/bert-finetune-0/eviction" in res.message
    assert len(api.calls("POST")) == 1 and api.has_pod("team-nlp", "bert-finetune-0")


# -- retries and failures -------------------------------------------------------------------------
def test_conflict_regets_and_reapplies(api: ApiServer, actuator: KubernetesActuator) -> None:
    def other_writer(obj: dict[str, Any]) -> None:
        obj["metadata"]["labels"]["team"] = "a"
    api.after_next_get(JOB, other_writer)
    res = actuator.admit(W, JOB_T, H100)
    assert res.ok, res.message
    assert [r.method for r in api.requests] == ["GET", "PATCH", "GET", "PATCH", "POST"]
    first, second = api.calls("PATCH")
    assert first.body["metadata"]["resourceVersion"] != second.body["metadata"]["resourceVersion"]
    after = api.get("RayJob", "team-a", "train-llm")
    assert after is not None and after["metadata"]["labels"]["team"] == "a"   # the other write survives
    assert after["spec"]["suspend"] is False


@pytest.mark.parametrize("status", [500, 503, 429], ids=["500", "503", "429"])
def test_transient_errors_are_retried(api: ApiServer, actuator: KubernetesActuator, status: int) -> None:
    api.fail("PATCH", JOB, status, "etcdserver: request timed out", times=2)
    res = actuator.admit(W, JOB_T, H100)
    assert res.ok, res.message
    assert len(api.calls("PATCH")) == 3


@pytest.mark.parametrize("status, message", [
    (403, ('rayjobs.ray.io "train-llm" is forbidden: User "system:serviceaccount:gpuq:gpuq" cannot patch '
          'resource "rayjobs" in API group "ray.io" in the namespace "team-a"')),
    (422, 'RayJob.ray.io "train-llm" is invalid: spec.suspend: Invalid value'),
], ids=["403", "422"])
def test_permanent_errors_are_not_retried(api: ApiServer, actuator: KubernetesActuator, status: int,
                                          message: str) -> None:
    api.fail("PATCH", JOB, status, message, times=10)
    res = actuator.admit(W, JOB_T, H100)
    assert not res.ok and not res.retryable
    assert res.message.startswith(f"kubernetes: PATCH {JOB} failed: HTTP {status} ")
    assert message in res.message and res.detail["status"] == status
    assert len(api.calls("PATCH")) == 1


def test_missing_object_is_not_retried(api: ApiServer, actuator: KubernetesActuator) -> None:
    res = actuator.admit(W, Target("RayJob", "team-a", "nope"), H100)
    assert not res.ok and not res.retryable
    assert "GET /apis/ray.io/v1/namespaces/team-a/rayjobs/nope failed: HTTP 404" in res.message
    assert len(api.requests) == 1


def test_retries_give_up_with_the_last_message(api: ApiServer, actuator: KubernetesActuator) -> None:
    api.fail("PATCH", JOB, 503, "the server is currently unable to handle the request", times=99)
    res = actuator.admit(W, JOB_T, H100)
    assert not res.ok and res.retryable and "gave up after 4 attempts" in res.message
    assert "HTTP 503 ServiceUnavailable: the server is currently unable" in res.message
    assert len(api.calls("PATCH")) == 4


def test_unreachable_api_server_is_retryable(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "x",
           "clusters": [{"name": "x", "cluster": {"server": url}}], "users": [{"name": "u", "user": {}}],
           "contexts": [{"name": "x", "context": {"cluster": "x", "user": "u"}}]}
    (tmp_path / "kc").write_text(json.dumps(cfg))
    settings = Settings(collector=CollectorSettings(
        kubernetes=[KubernetesTarget(cluster="x", kubeconfig=str(tmp_path / "kc"))]))
    act = KubernetesActuator(settings, node_labels=LABELS, sleep=lambda _s: None, attempts=2, timeout_s=2)
    try:
        res = act.admit(W, JOB_T, H100)
    finally:
        act.close()
    assert not res.ok and res.retryable
    assert f"cannot reach the API server at {url}" in res.message and JOB in res.message


# -- the merge patch itself -----------------------------------------------------------------------
@pytest.mark.parametrize("before, after, patch", [
    ({"a": 1, "b": {"c": 1, "d": 2}}, {"a": 1, "b": {"c": 1}}, {"b": {"d": None}}),
    ({"l": [{"x": 1}, {"x": 2}]}, {"l": [{"x": 1}, {"x": 3}]}, {"l": [{"x": 1}, {"x": 3}]}),
    ({"s": True}, {"s": False, "n": {"k": "v"}}, {"s": False, "n": {"k": "v"}}),
    ({"same": {"deep": [1]}}, {"same": {"deep": [1]}}, {}),
], ids=["remove-key", "list-whole", "add", "no-change"])
def test_merge_patch_round_trips(before: dict[str, Any], after: dict[str, Any],
                                 patch: dict[str, Any]) -> None:
    assert merge_patch(before, after) == patch
    # applied by an independent RFC 7386 implementation, not the test server's own
    assert json_merge_patch.merge(copy.deepcopy(before), patch) == after


# -- the workload source --------------------------------------------------------------------------
def edit(name: str, change: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    obj = load(name)
    change(obj)
    return obj


def job_worker(obj: dict[str, Any]) -> dict[str, Any]:
    return obj["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]  # type: ignore[no-any-return]


def set_path(obj: dict[str, Any], path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for p in parents:
        obj = obj[int(p)] if isinstance(obj, list) else obj.setdefault(p, {})
    obj[last] = value


def with_(name: str, **paths: Any) -> dict[str, Any]:
    """``with_("rayjob-train-llm.json", metadata__annotations={...})``: set dotted paths (``__``)."""
    obj = load(name)
    for path, value in paths.items():
        set_path(obj, path.replace("__", "."), value)
    return obj


JOB_F, CL_F = "rayjob-train-llm.json", "raycluster-vision.json"
WORKER = "spec__rayClusterSpec__workerGroupSpecs__0"
GPU_HEAD = {"limits": {"nvidia.com/gpu": "8", "cpu": "32", "memory": "256Gi"}}
PRIORITIES = {"research-high": 1000}

HEAD_RES = "spec__rayClusterSpec__headGroupSpec__template__spec__containers__0__resources"
WORKER_RES = f"{WORKER}__template__spec__containers__0__resources"
SMALL_GROUP = {"groupName": "small", "replicas": 1, "template": {"spec": {"containers": [
    {"name": "w", "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}}
FULL_JOB = {"id": "rayjob/team-a/train-llm", "queue": "research.nlp", "pods": 2, "gpus_per_pod": 8,
            "gpu_types": ("H100", "A100"), "priority": 0, "preemptible": True, "originator": True,
            "submit_s": 1741079702.0, "cpu_millicores_per_pod": 1000, "memory_per_pod_bytes": 2**30}
FULL_CLUSTER = {"id": "raycluster/team-vision/vision-dev", "queue": "research.vision", "pods": 2,
                "gpus_per_pod": 4, "gpu_types": (), "priority": 1000}


def add_group(obj: dict[str, Any]) -> None:
    groups = obj["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    groups.append({**copy.deepcopy(groups[0]), **SMALL_GROUP})


MAPPING = [
    pytest.param("RayJob", load(JOB_F), FULL_JOB, id="rayjob-workers-only"),
    pytest.param("RayCluster", load(CL_F), FULL_CLUSTER, id="raycluster-min-replicas-and-priority-class"),
    pytest.param("RayJob", with_(JOB_F, **{HEAD_RES: GPU_HEAD}), {"pods": 3, "gpus_per_pod": 8},
                 id="head-with-gpus-joins-the-gang"),
    pytest.param("RayJob", with_(JOB_F, **{f"{WORKER}__replicas": 9}), {"pods": 4},
                 id="replicas-clamped-to-max"),
    pytest.param("RayJob", with_(JOB_F, **{f"{WORKER}__numOfHosts": 4}), {"pods": 8}, id="multi-host-groups"),
    pytest.param("RayJob", edit(JOB_F, lambda o: job_worker(o).pop("replicas")), {"pods": 1},
                 id="no-replicas-means-min"),
    pytest.param("RayJob", edit(JOB_F, add_group), {"pods": 3, "gpus_per_pod": 8},
                 id="mixed-gpu-groups-take-the-largest"),
    pytest.param("RayJob", with_(JOB_F, metadata__annotations={},
                                 **{f"{WORKER}__template__spec__nodeSelector": {KEY: LABELS["A100"]}}),
                 {"gpu_types": ("A100",)}, id="gpu-type-from-node-selector"),
    pytest.param("RayJob", with_(JOB_F, metadata__annotations={"gpuq.io/priority": "-3",
                                                               "gpuq.io/preemptible": "false"}),
                 {"priority": -3, "preemptible": False, "gpu_types": ()}, id="annotations"),
    pytest.param("RayJob", with_(JOB_F, metadata__labels={"yunikorn.apache.org/queue": "root.batch"}),
                 {"queue": "root.batch"}, id="yunikorn-queue-label"),
    pytest.param("RayJob", with_(JOB_F, metadata__labels={},
                                 metadata__annotations={"yunikorn.apache.org/queue": "q"}),
                 {"queue": "q"}, id="queue-annotation"),
    pytest.param("RayJob", with_(JOB_F, metadata__labels={}), None, id="no-queue-not-ours"),
    pytest.param("RayJob", with_(JOB_F, metadata__deletionTimestamp="2025-03-04T11:00:00Z"), None,
                 id="deleting"),
    pytest.param("RayJob", with_(JOB_F, metadata__annotations={CANCELLED_ANNOTATION: "true"}), None,
                 id="cancelled"),
    pytest.param("RayJob", with_(JOB_F, **{WORKER_RES: {}, f"{WORKER}__template__metadata__annotations":
                                         {"gpu-fraction": "0.25"}}),
                 {"pods": 2, "gpus_per_pod": Decimal("0.25")}, id="kai-gpu-fraction-is-a-share"),
    pytest.param("RayJob", with_(JOB_F, **{WORKER_RES: {}, f"{WORKER}__template__metadata__annotations":
                                         {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}}),
                 "share of one device, or whole GPUs", id="kai-fraction-on-two-devices"),
    pytest.param("RayJob", with_(JOB_F, **{WORKER_RES: {}, f"{WORKER}__template__metadata__annotations":
                                         {"gpu-fraction": "half"}}),
                 "gpu-fraction: not a share of one GPU", id="kai-fraction-unreadable"),
    pytest.param("RayJob", with_(JOB_F, **{WORKER_RES: {}}), "requests no GPUs", id="cpu-only"),
    pytest.param("RayJob", edit(JOB_F, lambda o: o["spec"].pop("rayClusterSpec")),
                 "rayClusterSpec is missing", id="cluster-selector-job"),
    pytest.param("RayJob", with_(JOB_F, metadata__annotations={"gpuq.io/priority": "high"}),
                 "gpuq.io/priority: not an integer", id="bad-priority"),
    pytest.param("RayCluster", with_(CL_F, spec__headGroupSpec__template__spec__priorityClassName="nope"),
                 "no such PriorityClass", id="unknown-priority-class"),
]


@pytest.mark.parametrize("kind, obj, want", MAPPING)
def test_workload_mapping(kind: str, obj: dict[str, Any], want: dict[str, Any] | str | None) -> None:
    def call() -> Any:
        return workload_of(kind, obj, keys=SourceKeys(), node_labels=LABELS, priority_of=PRIORITIES.get)
    if isinstance(want, str):
        with pytest.raises(ObjectError, match=want):
            call()
        return
    got = call()
    if want is None:
        assert got is None
        return
    workload, target = got
    meta = obj["metadata"]
    assert target == Target(kind, meta["namespace"], meta["name"], "ray.io/v1")
    for field_name, value in want.items():
        assert getattr(workload, field_name) == value, field_name


def test_source_lists_pending_and_admitted(api: ApiServer, actuator: KubernetesActuator,
                                           tmp_path: Path) -> None:
    api.put(with_(JOB_F, metadata__name="cpu-job", **{WORKER_RES: {}}))
    api.put(with_(JOB_F, metadata__name="other", metadata__labels={}))
    source = KubernetesWorkloadSource(settings_for(api, tmp_path), node_labels=LABELS, page_size=1)
    try:
        pending = source.pending()
        assert [w.id for w, _ in pending] == ["raycluster/team-vision/vision-dev", "rayjob/team-a/train-llm"]
        assert pending[0][0].priority == 1000                       # read from scheduling.k8s.io
        assert source.skipped == ("RayJob team-a/cpu-job: requests no GPUs (no template has nvidia.com/gpu, nvidia.com/gpu.shared)",)
        lists = [r for r in api.calls("GET") if r.path.endswith(("/rayjobs", "/rayclusters"))]
        assert {r.query["limit"] for r in lists} == {"1"} and len(lists) == 3 + 1   # paged
        assert source.admitted() == []

        assert actuator.admit(W, JOB_T, H100).ok
        assert [w.id for w, _ in source.pending()] == ["raycluster/team-vision/vision-dev"]
        ((wl, target, gpu_type),) = source.admitted()
        assert (wl.id, target, gpu_type) == (W.id, JOB_T, "H100")
        assert wl.gpu_types == ("H100", "A100")       # from the annotation, not the injected selector

        assert actuator.cancel(W, JOB_T).ok
        assert [w.id for w, _ in source.pending()] == ["raycluster/team-vision/vision-dev"]
    finally:
        source.close()


def test_source_in_the_target_namespaces_only(api: ApiServer, tmp_path: Path) -> None:
    source = KubernetesWorkloadSource(settings_for(api, tmp_path, namespaces=["team-a"]), node_labels=LABELS)
    try:
        assert [w.id for w, _ in source.pending()] == ["rayjob/team-a/train-llm"]
    finally:
        source.close()
    assert {r.path for r in api.requests} == {"/apis/ray.io/v1/namespaces/team-a/rayjobs",
                                              "/apis/ray.io/v1/namespaces/team-a/rayclusters"}


# -- MIG slices and time-sliced replicas in the templates (issue 19) ------------------------------
MIG_TYPES = {"A100-mig-1g.10gb": ("A100", "1g.10gb"), "A100-mig-3g.40gb": ("A100", "3g.40gb")}
REPLICAS = {"T4": 3, "A100": 1, "H100": 1}       # LiveAccounting.replicas_by_type: T4 is time-sliced


def worker_asks(limits: dict[str, Any], **paths: Any) -> dict[str, Any]:
    return with_(JOB_F, **{WORKER_RES: {"limits": {"cpu": "1", "memory": "1Gi", **limits}}}, **paths)


NO_TYPES = {"metadata__annotations": {}}
SHARES = [
    pytest.param(worker_asks({"nvidia.com/mig-1g.10gb": "2"}),
                 {"pods": 2, "gpus_per_pod": 2, "gpu_types": ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "A100-mig-1g.10gb")},
                 id="mig-slices-of-each-selected-type-declared-or-the-nodes-name"),
    pytest.param(worker_asks({"nvidia.com/mig-1g.10gb": "1"}, **NO_TYPES),
                 {"gpus_per_pod": 1, "gpu_types": ("A100-mig-1g.10gb",)}, id="mig-every-declared-type-of-the-profile"),
    pytest.param(worker_asks({"nvidia.com/mig-1g.10gb": "1"}, metadata__annotations={},
                             **{f"{WORKER}__template__spec__nodeSelector": {KEY: LABELS["A100"]}}),
                 {"gpu_types": ("A100-mig-1g.10gb",)}, id="mig-of-the-selected-product"),
    pytest.param(worker_asks({"nvidia.com/mig-1g.10gb": "1"},
                             metadata__annotations={"gpuq.io/gpu-types": "A100-mig-1g.10gb"}),
                 {"gpu_types": ("A100-mig-1g.10gb",)}, id="mig-type-named-itself"),
    pytest.param(worker_asks({"nvidia.com/mig-2g.20gb": "1"}, **NO_TYPES),
                 "which GPU's slices is unknown", id="mig-of-no-known-gpu"),
    pytest.param(worker_asks({"nvidia.com/mig-1g.10gb": "1"},
                             metadata__annotations={"gpuq.io/gpu-types": "A100-mig-3g.40gb"}),
                 "not of MIG profile 1g.10gb", id="mig-type-of-another-profile"),
    pytest.param(worker_asks({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/mig-3g.40gb": "1"}),
                 "several MIG profiles", id="two-profiles-in-a-pod"),
    pytest.param(worker_asks({"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"}),
                 "MIG slices and whole GPUs", id="slices-and-gpus-in-a-pod"),
    pytest.param(worker_asks({"nvidia.com/gpu": "1"}, metadata__annotations={"gpuq.io/gpu-types": "T4"}),
                 {"gpus_per_pod": Decimal("0.333"), "gpu_types": ("T4",)}, id="one-replica-of-three"),
    pytest.param(worker_asks({"nvidia.com/gpu": "2"}, metadata__annotations={"gpuq.io/gpu-types": "T4"}),
                 {"gpus_per_pod": Decimal("0.666")}, id="two-replicas-rounded-down-as-billed"),
    pytest.param(worker_asks({"nvidia.com/gpu": "3"}, metadata__annotations={"gpuq.io/gpu-types": "T4"}),
                 {"gpus_per_pod": 1}, id="all-replicas-a-whole-gpu"),
    pytest.param(worker_asks({"nvidia.com/gpu": "4"}, metadata__annotations={"gpuq.io/gpu-types": "T4"}),
                 "a share of one device, or whole GPUs", id="more-than-one-gpu-not-whole"),
    pytest.param(worker_asks({"nvidia.com/gpu": "1"}, metadata__annotations={"gpuq.io/gpu-types": "T4,A100"}),
                 {"gpus_per_pod": 1}, id="a-pool-with-a-whole-gpu-type-stays-whole"),
    pytest.param(worker_asks({"nvidia.com/gpu": "1"}, **NO_TYPES),
                 {"gpus_per_pod": 1, "gpu_types": ()}, id="any-type-stays-whole"),
    pytest.param(worker_asks({"nvidia.com/gpu": "1"}, metadata__annotations={"gpuq.io/gpu-types": "L4"}),
                 {"gpus_per_pod": 1}, id="a-type-with-no-node-seen-is-whole"),
]


@pytest.mark.parametrize("obj, want", SHARES)
def test_mig_and_time_sliced_templates(obj: dict[str, Any], want: dict[str, Any] | str) -> None:
    def call() -> Any:
        return workload_of("RayJob", obj, node_labels=LABELS, mig_types=MIG_TYPES, replicas=REPLICAS)
    if isinstance(want, str):
        with pytest.raises(ObjectError, match=want):
            call()
        return
    workload, _ = call()
    for field_name, value in want.items():
        assert getattr(workload, field_name) == value, field_name


def test_a_gang_of_two_mig_profiles_is_refused() -> None:
    obj = worker_asks({"nvidia.com/mig-1g.10gb": "1"})
    second = copy.deepcopy(job_worker(obj))
    second["groupName"] = "big"
    second["template"]["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/mig-3g.40gb": "1"}}
    obj["spec"]["rayClusterSpec"]["workerGroupSpecs"].append(second)
    with pytest.raises(ObjectError, match="MIG profiles 1g.10gb, 3g.40gb in one gang"):
        workload_of("RayJob", obj, node_labels=LABELS, mig_types=MIG_TYPES)


def test_a_mig_type_is_admitted_without_a_product_selector(api: ApiServer, actuator: KubernetesActuator) -> None:
    """A mixed-strategy node's product label names the whole GPU: a MIG type's admission pins the
    pods to the placement's nodes and leaves the product selector to the slices' own resource."""
    api.put(worker_asks({"nvidia.com/mig-1g.10gb": "2"}))
    w = Workload(W.id, W.queue, pods=2, gpus_per_pod=2)
    assert actuator.admit(w, JOB_T, Placement("A100-mig-1g.10gb", (("a-0", 4),))).ok
    obj = api.get("RayJob", "team-a", "train-llm")
    assert obj is not None
    worker = job_worker(obj)["template"]["spec"]
    assert KEY not in (worker.get("nodeSelector") or {})
    terms = worker["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [{"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": ["a-0"]}]}]
    assert actuator.label_value("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb") is None
    assert actuator.label_value("A100") == LABELS["A100"]
