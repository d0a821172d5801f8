"""The Kubernetes objects the tests serve come from published upstream objects, every change
recorded with its reason (tests/k8s_upstream.py; sources in tests/data/k8s/SOURCES.md)."""
from __future__ import annotations

import json

import pytest

from tests.k8s_upstream import (
    DATA,
    DERIVED_DIRS,
    UPSTREAM,
    apply_ops,
    blob_sha,
    derivations,
    derive,
    render,
    upstream_index,
)

DERIVED = [(d, name) for d in DERIVED_DIRS for name in derivations(d)]


def test_every_upstream_file_is_the_published_one() -> None:
    """Byte for byte the blob of the recorded commit (``git rev-parse <commit>:<path>``)."""
    index = upstream_index()
    on_disk = {p.relative_to(UPSTREAM).as_posix() for p in UPSTREAM.rglob("*")
               if p.is_file() and p.name != "UPSTREAM.json"}
    assert on_disk == set(index)
    for name, src in index.items():
        assert blob_sha((UPSTREAM / name).read_bytes()) == src["blob"], name
        assert src["licence"] and src["repository"].startswith("https://github.com/") and len(src["commit"]) == 40


@pytest.mark.parametrize("directory, name", DERIVED, ids=[f"{d}/{n}" for d, n in DERIVED])
def test_each_data_file_is_its_upstream_object_with_the_recorded_changes(directory: str, name: str) -> None:
    spec = derivations(directory)[name]
    if "events" in spec:
        specs = [e["object"] for e in spec["events"]]
    elif "compose" in spec:
        specs = [one for group in spec["compose"].values() for one in group]
    else:
        specs = [spec]
    assert all(one["upstream"] in upstream_index() for one in specs if "like" not in one)
    assert (DATA / directory / name).read_text() == render(derive(directory, name)), (
        f"tests/data/{directory}/{name} differs from its derivation: edit DERIVED.json (with a 'why') "
        f"and run python -m tests.k8s_upstream")
    assert all(op["why"].strip() for one in specs for op in one["ops"])


@pytest.mark.parametrize("ops, message", [
    ([{"op": "add", "path": "/a", "value": 1}], r"ops\[0\] add /a: no 'why'"),
    ([{"op": "add", "path": "/a", "value": 1, "why": "w"}], r"ops\[0\] add /a: already there; say 'replace'"),
    ([{"op": "replace", "path": "/b", "value": 1, "why": "w"}], r"ops\[0\] replace /b: no such member"),
    ([{"op": "remove", "path": "/l/0", "why": "w"}, {"op": "move", "path": "/a", "why": "w"}],
     r"ops\[1\] move /a: unknown op"),
], ids=["no-reason", "add-over-a-value", "replace-nothing", "unknown-op"])
def test_a_change_without_reason_or_that_would_hide_an_upstream_value_is_refused(
        ops: list[dict[str, object]], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        apply_ops({"a": 0, "l": [1]}, ops, "x: ")


def test_ops_follow_rfc_6902_pointers() -> None:
    doc = {"m": {"a/b": 1, "c~d": 2}, "l": [1, 3]}
    got = apply_ops(doc, [
        {"op": "replace", "path": "/m/a~1b", "value": 5, "why": "escaped slash"},
        {"op": "remove", "path": "/m/c~0d", "why": "escaped tilde"},
        {"op": "add", "path": "/l/1", "value": 2, "why": "insert"},
        {"op": "add", "path": "/l/-", "value": 4, "why": "append"},
    ])
    assert got == {"m": {"a/b": 5}, "l": [1, 2, 3, 4]}
    assert doc == {"m": {"a/b": 1, "c~d": 2}, "l": [1, 3]}      # the upstream document is not edited


def test_the_changes_are_few_and_the_rest_is_upstream() -> None:
    """What the derivation keeps from upstream (a sample of fields no op touches)."""
    job = json.loads((DATA / "k8s_actuator" / "rayjob-train-llm.json").read_text())
    assert job["metadata"]["generateName"] == "rayjob-sample-"
    assert job["spec"]["ttlSecondsAfterFinished"] == 10 and job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["groupName"] == "small-group"
    cluster = json.loads((DATA / "k8s_actuator" / "raycluster-vision.json").read_text())
    assert cluster["metadata"]["labels"]["ray.io/gang-scheduling-enabled"] == "true"
    assert cluster["spec"]["workerGroupSpecs"][0]["minReplicas"] == 2
    kuberay = json.loads((DATA / "k8s" / "kuberay.json").read_text())
    head, worker, _ = kuberay["pods"]
    assert worker["status"]["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"
    assert [c["name"] for c in head["spec"]["containers"]] == ["ray-head", "autoscaler"]
    assert worker["status"]["conditions"][3] == {           # the recorded spacing, moved to the tests' day
        "lastProbeTime": None, "lastTransitionTime": "2026-11-21T09:10:07Z", "status": "True", "type": "PodScheduled"}
    assert worker["status"]["conditions"][1]["lastTransitionTime"] == "2026-11-21T09:10:10Z"


def test_shift_times_moves_every_timestamp_by_the_same_amount() -> None:
    doc = {"a": "2022-11-14T23:13:47Z", "b": ["2022-11-14T23:13:50Z", "not a time"], "c": 1}
    got = apply_ops(doc, [{"op": "x-shift-times", "path": "/a", "value": "2026-11-21T09:10:07Z", "why": "w"}])
    assert got == {"a": "2026-11-21T09:10:07Z", "b": ["2026-11-21T09:10:10Z", "not a time"], "c": 1}
