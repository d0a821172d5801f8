"""JSON merge patches (RFC 7386) checked against an independent implementation, not our own.

``json-merge-patch`` (PyPI, Open Data Services, BSD) is the reference here:

* it is first checked against the RFC's own test vectors (Appendix A), so it is a fair judge;
* the test API server's merge (tests/k8s_api_server.py ``apply_merge_patch``) must give what it
  gives on those vectors and on random documents;
* every PATCH the ``kubernetes`` actuator sends (admit, preempt, cancel, a 409 re-apply, a template
  with affinity of its own), applied by the reference to the object the server held before, must
  give exactly the object the server holds after, apart from what the API server itself moves
  (``metadata.resourceVersion``, and ``metadata.generation`` when ``spec`` changed).

The last check fails if the server's merge is wrong: with ``null`` stored instead of deleting the
key (the mutation in :func:`test_the_cross_check_catches_a_server_that_keeps_nulls`), preempting an
admitted workload leaves ``nodeSelector: null`` behind and the check names it.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import json_merge_patch
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tests.k8s_api_server as k8s_api_server
from scheduler.actuators.base import Target
from scheduler.actuators.kubernetes import ADMISSION_ANNOTATION, CANCELLED_ANNOTATION, KubernetesActuator
from scheduler.model import Placement, Workload
from tests.k8s_api_server import ApiServer, Patched, apply_merge_patch, load
from tests.test_actuator_kubernetes import (
    CLUSTER_T,
    JOB,
    JOB_T,
    LABELS,
    W,
    job_worker,
    settings_for,
    templates,
)


def reference(target: Any, patch: Any) -> Any:
    """RFC 7386 MergePatch(target, patch) by ``json-merge-patch`` (it edits its first argument)."""
    return json_merge_patch.merge(copy.deepcopy(target), copy.deepcopy(patch))


# RFC 7386, Appendix A "Example Test Cases": (original, patch, result), verbatim.
RFC7386_APPENDIX_A = [
    ({"a": "b"}, {"a": "c"}, {"a": "c"}),
    ({"a": "b"}, {"b": "c"}, {"a": "b", "b": "c"}),
    ({"a": "b"}, {"a": None}, {}),
    ({"a": "b", "b": "c"}, {"a": None}, {"b": "c"}),
    ({"a": ["b"]}, {"a": "c"}, {"a": "c"}),
    ({"a": "c"}, {"a": ["b"]}, {"a": ["b"]}),
    ({"a": {"b": "c"}}, {"a": {"b": "d", "c": None}}, {"a": {"b": "d"}}),
    ({"a": [{"b": "c"}]}, {"a": [1]}, {"a": [1]}),
    (["a", "b"], ["c", "d"], ["c", "d"]),
    ({"a": "b"}, ["c"], ["c"]),
    ({"a": "foo"}, None, None),
    ({"a": "foo"}, "bar", "bar"),
    ({"e": None}, {"a": 1}, {"e": None, "a": 1}),
    ([1, 2], {"a": "b", "c": None}, {"a": "b"}),
    ({}, {"a": {"bb": {"ccc": None}}}, {"a": {"bb": {}}}),
]
VECTOR_IDS = [f"A{i + 1}" for i in range(len(RFC7386_APPENDIX_A))]


@pytest.mark.parametrize("original, patch, result", RFC7386_APPENDIX_A, ids=VECTOR_IDS)
def test_the_reference_passes_the_rfc_vectors(original: Any, patch: Any, result: Any) -> None:
    assert reference(original, patch) == result


@pytest.mark.parametrize("original, patch, result", RFC7386_APPENDIX_A, ids=VECTOR_IDS)
def test_the_test_server_passes_the_rfc_vectors(original: Any, patch: Any, result: Any) -> None:
    before = copy.deepcopy(original)
    assert apply_merge_patch(original, patch) == result
    assert original == before                       # the stored object is not edited in place


_scalars = st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "a", "b"])
_keys = st.sampled_from(["a", "b", "c", "spec", "metadata"])
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=3)
                     | st.dictionaries(_keys, inner, max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(target=_json, patch=_json)
def test_the_test_server_agrees_with_the_reference_on_random_documents(target: Any, patch: Any) -> None:
    assert apply_merge_patch(target, patch) == reference(target, patch)


# -- the patches the actuator sends ----------------------------------------------------------------
SERVER_MOVED = ("resourceVersion", "generation")


def mismatches(patched: list[Patched]) -> list[str]:
    """What the server's result differs in from the reference's, one line per PATCH that differs."""
    problems = []
    for i, p in enumerate(patched):
        want = reference(p.before, p.patch)
        got = copy.deepcopy(p.after)
        rv_before, rv_after = int(p.before["metadata"]["resourceVersion"]), int(got["metadata"]["resourceVersion"])
        gen_before = int(p.before["metadata"].get("generation") or 1)
        gen_want = gen_before + 1 if want.get("spec") != p.before.get("spec") else gen_before
        if rv_after <= rv_before:
            problems.append(f"patch {i} {p.key}: resourceVersion {rv_after} did not move on from {rv_before}")
        if int(got["metadata"].get("generation") or 1) != gen_want:
            problems.append(f"patch {i} {p.key}: generation {got['metadata'].get('generation')} != {gen_want}")
        for field in SERVER_MOVED:
            want["metadata"].pop(field, None)
            got["metadata"].pop(field, None)
        if got != want:
            problems.append(f"patch {i} {p.key}: server {json.dumps(got, sort_keys=True)} "
                            f"!= RFC 7386 {json.dumps(want, sort_keys=True)}")
    return problems


@pytest.fixture
def api() -> Iterator[ApiServer]:
    with ApiServer([load("rayjob-train-llm.json"), load("raycluster-vision.json")],
                   pods=[("team-nlp", "bert-finetune-0")], priority_classes={"research-high": 1000}) as server:
        yield server


@pytest.fixture
def actuator(api: ApiServer, tmp_path: Path) -> Iterator[KubernetesActuator]:
    act = KubernetesActuator(settings_for(api, tmp_path), node_labels=LABELS, sleep=lambda _s: None)
    yield act
    act.close()


H100 = Placement("H100", (("h-0", 8), ("h-1", 8)))
CL_W = Workload("raycluster/team-vision/vision-dev", "research.vision", 2, 4)
OWN_AFFINITY = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
    {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["zone-a"]}]}]}}}


def lifecycle(api: ApiServer, actuator: KubernetesActuator) -> None:
    """Admit, preempt, re-admit (after a concurrent write: 409, re-get, re-apply) and cancel a RayJob
    whose worker template has affinity of its own; admit and preempt a RayCluster."""
    job = load("rayjob-train-llm.json")
    job_worker(job)["template"]["spec"]["affinity"] = copy.deepcopy(OWN_AFFINITY)
    api.put(job)
    assert actuator.admit(W, JOB_T, H100).ok
    assert actuator.preempt(W, JOB_T, "queue research.vision below its guarantee").ok

    def other_writer(obj: dict[str, Any]) -> None:
        obj["metadata"].setdefault("labels", {})["team"] = "a"
    api.after_next_get(JOB, other_writer)
    assert actuator.admit(W, JOB_T, Placement("A100", (("a-0", 8), ("a-1", 8)))).ok
    assert actuator.cancel(W, JOB_T).ok
    assert actuator.admit(CL_W, CLUSTER_T, Placement("A100", (("a-0", 8),))).ok
    assert actuator.preempt(CL_W, CLUSTER_T, "").ok


def test_every_patch_the_actuator_sends_gives_what_rfc_7386_gives(api: ApiServer,
                                                                  actuator: KubernetesActuator) -> None:
    original_job = load("rayjob-train-llm.json")
    original_cluster = api.get("RayCluster", "team-vision", "vision-dev")
    assert original_cluster is not None
    lifecycle(api, actuator)
    # 4 RayJob patches applied (the first re-admit met a 409 and was not applied) and 2 RayCluster ones
    assert [p.key[0] for p in api.patches] == ["rayjobs"] * 4 + ["rayclusters"] * 2
    assert len(api.calls("PATCH")) == 7
    assert mismatches(api.patches) == []
    # and the expected fields: the admit un-suspends and selects the type, preempt/cancel suspend
    # and give back the templates as the user wrote them, the other writer's label survives
    admitted = api.patches[0].after
    assert admitted["spec"]["suspend"] is False
    assert all(t["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": LABELS["H100"]}
               for t in templates("RayJob", admitted))
    job = api.get("RayJob", "team-a", "train-llm")
    assert job is not None and job["spec"]["suspend"] is True
    assert job["metadata"]["labels"]["team"] == "a"
    assert job["metadata"]["annotations"][CANCELLED_ANNOTATION] == "true"
    assert ADMISSION_ANNOTATION not in job["metadata"]["annotations"]
    original_worker = job_worker(original_job)["template"]["spec"]
    original_worker["affinity"] = OWN_AFFINITY
    assert job_worker(job)["template"]["spec"] == original_worker
    cluster = api.get("RayCluster", "team-vision", "vision-dev")
    assert cluster is not None and cluster["spec"] == original_cluster["spec"]


def test_the_cross_check_catches_a_server_that_keeps_nulls(api: ApiServer, actuator: KubernetesActuator,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutation of the server's merge (``null`` stored, not deleted) is found by the check."""
    def keeps_nulls(target: Any, patch: Any) -> Any:
        if not isinstance(patch, dict):
            return copy.deepcopy(patch)
        out = copy.deepcopy(target) if isinstance(target, dict) else {}
        for key, value in patch.items():
            out[key] = keeps_nulls(out.get(key), value) if isinstance(value, dict) else copy.deepcopy(value)
        return out
    monkeypatch.setattr(k8s_api_server, "apply_merge_patch", keeps_nulls)
    assert actuator.admit(CL_W, CLUSTER_T, Placement("A100", (("a-0", 8),))).ok
    assert actuator.preempt(CL_W, CLUSTER_T, "").ok
    problems = mismatches(api.patches)
    assert len(problems) == 1 and problems[0].startswith("patch 1 ('rayclusters', 'team-vision', 'vision-dev')")
    assert '"nodeSelector": null' in problems[0]


def test_preempt_sends_nulls_that_delete(api: ApiServer, actuator: KubernetesActuator) -> None:
    """The restore relies on ``null`` deleting a key: the patch carries them, the reference deletes them."""
    assert actuator.admit(CL_W, CLUSTER_T, Placement("A100", (("a-0", 8),))).ok
    assert actuator.preempt(CL_W, CLUSTER_T, "").ok
    restore = api.patches[1]
    assert restore.patch["spec"]["headGroupSpec"] == {"template": {"spec": {"nodeSelector": None}}}
    head = reference(restore.before, restore.patch)["spec"]["headGroupSpec"]["template"]["spec"]
    assert "nodeSelector" not in head
    assert mismatches(api.patches) == []


def test_target_pod_is_not_patched(api: ApiServer, actuator: KubernetesActuator) -> None:
    """Plain pods are evicted, never merge-patched: nothing to cross-check, and nothing applied."""
    assert actuator.preempt(W, Target("Pod", "team-nlp", "bert-finetune-0"), "r").ok
    assert api.patches == [] and api.calls("PATCH") == []
