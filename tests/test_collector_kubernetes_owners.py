"""Issue 8: a pod's queue and top owner through its KubeRay owners (pure index and tracker, then
the real client against the replay server, then the accounting's "now" view)."""
from __future__ import annotations

import copy
import datetime as dt
import io
import json
import logging
import threading
from pathlib import Path
from typing import Any

import pytest

from accounting.cli import queues_main
from collector.k8s_alloc import ENDED, OPEN, Allocation, version_of
from collector.k8s_extract import QueueKeys, pod_info
from collector.k8s_owners import OwnerIndex, owner_of
from collector.k8s_state import ClusterTracker
from collector.kubernetes import KubernetesWatcher
from gpuq.settings import KubernetesTarget, load_settings
from gpuq.store import COLUMNS
from gpuq.store.writer import BatchWriter
from tests.k8s_replay import ReplayServer, load
from tests.test_collector_kubernetes import LIST_RV, LOOKUP, POD_EVENTS, T0, Clock, Sink, wait_until, watching

UTC = dt.UTC
KUBERAY = load("kuberay.json")
RAYJOB, RAYCLUSTER = KUBERAY["rayjobs"][0], KUBERAY["rayclusters"][0]
HEAD, WORKER_1, WORKER_2 = KUBERAY["pods"]
WORKERS = {WORKER_1["metadata"]["uid"], WORKER_2["metadata"]["uid"]}
START = dt.datetime(2026, 11, 21, 9, 10, 7, tzinfo=UTC)


def obj(o: dict[str, Any], **labels: str) -> dict[str, Any]:
    out = copy.deepcopy(o)
    out["metadata"].setdefault("labels", {}).update(labels)
    return out


def allocs(rows: dict[str, list[tuple[Any, ...]]]) -> list[dict[str, Any]]:
    return [dict(zip(COLUMNS["gpu_allocations"], r)) for r in rows.get("gpu_allocations", [])]


# ================================================================================================
# pure: the queue precedence and the index
# ================================================================================================
KUEUE_POD = {"kueue.x-k8s.io/local-queue-name": "lq", "kueue.x-k8s.io/cluster-queue-name": "cq"}


@pytest.mark.parametrize("pod_labels, job_labels, job_annotations, lookup, expected", [
    ({}, {"kueue.x-k8s.io/queue-name": "llm"}, {}, LOOKUP, ("llm", "RayJob", "pretrain-7b")),
    ({"queue": "own"}, {"kueue.x-k8s.io/queue-name": "llm"}, {}, LOOKUP, ("own", "RayJob", "pretrain-7b")),
    (KUEUE_POD, {"kueue.x-k8s.io/queue-name": "llm"}, {}, LOOKUP, ("lq", "RayJob", "pretrain-7b")),
    ({"kueue.x-k8s.io/cluster-queue-name": "cq"}, {}, {}, LOOKUP, ("cq", "RayJob", "pretrain-7b")),
    ({"kueue.x-k8s.io/cluster-queue-name": "cq", "queue": "own"}, {}, {}, LOOKUP,
     ("own", "RayJob", "pretrain-7b")),
    ({}, {}, {"yunikorn.apache.org/queue": "root.y"}, LOOKUP, ("root.y", "RayJob", "pretrain-7b")),
    ({}, {}, {}, LOOKUP, ("unassigned", "RayJob", "pretrain-7b")),
    (KUEUE_POD, {"team": "t"}, {}, QueueKeys(labels=("team",), annotations=()), ("t", "RayJob", "pretrain-7b")),
], ids=["rayjob-kueue-label", "pod-label-first", "kueue-pod-local-queue", "kueue-pod-cluster-queue",
        "cluster-queue-after-configured-keys", "owner-annotation", "namespace-then-default",
        "custom-keys-no-kueue-aliases"])
def test_queue_precedence(pod_labels: dict[str, str], job_labels: dict[str, str],
                          job_annotations: dict[str, str], lookup: QueueKeys,
                          expected: tuple[str, str, str]) -> None:
    job = copy.deepcopy(RAYJOB)
    job["metadata"]["labels"] = job_labels
    job["metadata"]["annotations"] = job_annotations
    index = OwnerIndex()
    index.put(owner_of("RayJob", job))
    index.put(owner_of("RayCluster", RAYCLUSTER))
    pod = pod_info(obj(WORKER_1, **pod_labels))
    att = index.attribute(pod.namespace, pod.labels, pod.annotations, pod.owner_refs, pod.ray_cluster, lookup)
    assert (att.queue, att.owner_kind, att.owner) == expected


def test_chain_by_label_and_ray_cluster_name_when_owner_references_are_missing() -> None:
    cluster = copy.deepcopy(RAYCLUSTER)
    del cluster["metadata"]["ownerReferences"]             # found through status.rayClusterName
    pod = copy.deepcopy(WORKER_1)
    del pod["metadata"]["ownerReferences"]                 # found through the ray.io/cluster label
    index = OwnerIndex()
    index.put(owner_of("RayCluster", cluster))
    index.put(owner_of("RayJob", RAYJOB))
    info = pod_info(pod)
    assert [o.kind for o in index.chain(info.namespace, info.owner_refs, info.ray_cluster)] == [
        "RayCluster", "RayJob"]
    att = index.attribute(info.namespace, info.labels, info.annotations, info.owner_refs, info.ray_cluster,
                          LOOKUP)
    assert (att.queue, att.owner_kind, att.owner) == ("llm", "RayJob", "pretrain-7b")


@pytest.mark.parametrize("name, owner", [
    ("asr-train-0", ("", "")),
    ("bert-finetune-7d9c5-qk2mx", ("ReplicaSet", "bert-finetune-7d9c5")),
    ("raycluster-vision-gpu-group-worker-9fz4q", ("RayCluster", "raycluster-vision")),
], ids=["bare-pod", "unwatched-owner-kind", "raycluster-not-seen"])
def test_top_owner_without_kuberay_objects(name: str, owner: tuple[str, str]) -> None:
    pod = pod_info(next(p for p in load("pods.json")["items"] if p["metadata"]["name"] == name), LOOKUP)
    att = OwnerIndex().attribute(pod.namespace, pod.labels, pod.annotations, pod.owner_refs,
                                 pod.ray_cluster, LOOKUP)
    assert (att.owner_kind, att.owner) == owner and att.queue == pod.queue


# ================================================================================================
# the tracker: a pod seen before its owners is re-attributed
# ================================================================================================
def test_pod_first_is_reattributed_and_its_end_still_wins() -> None:
    tr = ClusterTracker("prod", LOOKUP)
    (first,) = allocs(tr.on_pod("ADDED", WORKER_1, T0))
    assert (first["queue"], first["owner_kind"], first["owner"]) == ("unassigned", "RayCluster", RAYCLUSTER["metadata"]["name"])
    assert first["version"] == version_of(START, OPEN)
    (second,) = allocs(tr.on_owner("rayclusters", "ADDED", RAYCLUSTER, T0))   # names its RayJob
    assert (second["queue"], second["owner_kind"], second["owner"]) == ("unassigned", "RayJob", "pretrain-7b")
    assert second["version"] == first["version"] + 1
    (third,) = allocs(tr.on_owner("rayjobs", "ADDED", RAYJOB, T0))
    assert (third["queue"], third["owner_kind"], third["owner"]) == ("llm", "RayJob", "pretrain-7b")
    assert third["version"] == first["version"] + 2
    assert tr.on_owner("rayjobs", "MODIFIED", RAYJOB, T0) == {}            # status churn: nothing
    relabelled = obj(RAYJOB, **{"kueue.x-k8s.io/queue-name": "llm-2"})
    relabelled["metadata"]["annotations"] = {"gpuq.io/workload": "wl-42"}
    (third,) = allocs(tr.on_owner("rayjobs", "MODIFIED", relabelled, T0))
    assert (third["queue"], third["workload_id"], third["version"]) == ("llm-2", "wl-42", first["version"] + 3)
    assert "gpu_allocations" not in tr.on_pod("MODIFIED", WORKER_1, T0)   # re-read pod: same row
    # the RayJob goes, then its pod: the end keeps the RayJob's queue and outranks every open row
    assert tr.on_owner("rayjobs", "DELETED", relabelled, T0) == {}
    gone = copy.deepcopy(WORKER_1)
    gone["metadata"]["deletionTimestamp"] = "2026-11-21T09:10:07Z"            # ends at its start
    (end,) = allocs(tr.on_pod("DELETED", gone, T0))
    assert (end["queue"], end["owner_kind"], end["end"]) == ("llm-2", "RayJob", START)
    assert end["version"] == version_of(START, ENDED) > third["version"]


def test_restart_outranks_a_stored_reattributed_row() -> None:
    tr = ClusterTracker("prod", LOOKUP)
    tr.on_pod("ADDED", WORKER_1, T0)
    tr.on_owner("rayclusters", "ADDED", RAYCLUSTER, T0)
    (stored,) = allocs(tr.on_owner("rayjobs", "ADDED", RAYJOB, T0))
    again = ClusterTracker("prod", LOOKUP)                   # a restart; the RayJob was relabelled meanwhile
    again.remember_stored([Allocation.from_row(tuple(stored.values()))])
    again.prime_owners("rayclusters", [RAYCLUSTER])
    again.prime_owners("rayjobs", [obj(RAYJOB, **{"kueue.x-k8s.io/queue-name": "llm-2"})])
    (row,) = allocs(again.on_pod("SYNC", WORKER_1, T0))
    assert row["queue"] == "llm-2" and row["version"] == stored["version"] + 1
    same = ClusterTracker("prod", LOOKUP)                    # unchanged: re-emitted with the stored version
    same.remember_stored([Allocation.from_row(tuple(stored.values()))])
    same.prime_owners("rayclusters", [RAYCLUSTER])
    same.prime_owners("rayjobs", [RAYJOB])
    (row,) = allocs(same.on_pod("SYNC", WORKER_1, T0))
    assert row == stored


# ================================================================================================
# the watcher against the replay server
# ================================================================================================
BARE = copy.deepcopy(POD_EVENTS[3]["object"])               # llm-serve-0, bound, without Ray labels
BARE["metadata"].update(name="bare-0", uid="b4e0-bare-0")
BARE["metadata"]["labels"] = {"queue": "root.nlp.serving"}


def kuberay_server(**kw: Any) -> ReplayServer:
    """The recorded pods and nodes, and the RayJob's pods."""
    pods, nodes = load("pods.json")["items"], load("nodes.json")["items"]
    return ReplayServer([*pods, *KUBERAY["pods"]], nodes, resource_version=int(LIST_RV), **kw)


def kuberay_rows(sink: Sink) -> dict[str, dict[str, Any]]:
    return {u: r for u, r in sink.final_allocations().items() if r["namespace"] == "team-llm"}


def test_owners_listed_before_pods_give_the_rayjob_queue(tmp_path: Path) -> None:
    with kuberay_server(rayclusters=[RAYCLUSTER], rayjobs=[RAYJOB]) as server:
        with watching(server.kubeconfig(tmp_path / "kc")) as (_, sink):
            wait_until(lambda: sink.checkpoint("pods") == LIST_RV)
            rv = server.add("pods", BARE)
            wait_until(lambda: sink.checkpoint("pods") == str(rv))
        assert {r.path for r in server.requests if r.resource == "rayjobs"} == {"/apis/ray.io/v1/rayjobs"}
    rows = kuberay_rows(sink)
    assert set(rows) == WORKERS
    for r in rows.values():
        assert (r["queue"], r["owner_kind"], r["owner"], r["gpus"], r["source"]) == (
            "llm", "RayJob", "pretrain-7b", 2, "pod")
        assert r["version"] == version_of(START, OPEN)                    # right the first time
    assert [r["queue"] for r in sink.table("pod_events") if r["namespace"] == "team-llm"] == ["llm"] * 3
    final = {r["pod"]: r for r in sink.final_allocations().values()}
    assert (final["bare-0"]["queue"], final["bare-0"]["owner_kind"], final["bare-0"]["owner"]) == (
        "root.nlp.serving", "", "")
    assert (final["asr-train-0"]["queue"], final["asr-train-0"]["owner"]) == ("speech", "")
    assert (final["bert-finetune-7d9c5-qk2mx"]["owner_kind"], final["bert-finetune-7d9c5-qk2mx"]["queue"]) == (
        "ReplicaSet", "root.nlp.batch")


def test_a_pod_seen_before_its_owners_is_corrected(tmp_path: Path) -> None:
    with ReplayServer.recorded() as server, watching(server.kubeconfig(tmp_path / "kc")) as (_, sink):
        wait_until(lambda: sink.checkpoint("pods") == LIST_RV and sink.checkpoint("rayjobs") == LIST_RV)
        server.add("pods", WORKER_1)
        rv = server.add("pods", WORKER_2)
        wait_until(lambda: sink.checkpoint("pods") == str(rv))
        assert {r["queue"] for r in kuberay_rows(sink).values()} == {"unassigned"}
        rv = server.add("rayclusters", RAYCLUSTER)
        wait_until(lambda: sink.checkpoint("rayclusters") == str(rv))
        rv = server.add("rayjobs", RAYJOB)
        wait_until(lambda: sink.checkpoint("rayjobs") == str(rv))
    rows = kuberay_rows(sink)
    assert {(r["queue"], r["owner_kind"], r["owner"]) for r in rows.values()} == {("llm", "RayJob", "pretrain-7b")}
    assert {r["version"] for r in rows.values()} == {version_of(START, OPEN) + 2}
    assert len([r for r in sink.table("gpu_allocations") if r["namespace"] == "team-llm"]) == 6


def test_missing_crds_do_not_stop_the_pods(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    errors: list[Any] = []
    with kuberay_server(absent=("rayjobs", "rayclusters")) as server:
        with caplog.at_level(logging.WARNING, "collector.k8s_stream"), \
                watching(server.kubeconfig(tmp_path / "kc"), errors=errors) as (_, sink):
            wait_until(lambda: sink.checkpoint("pods") == LIST_RV)
            server.event("pods", POD_EVENTS[2])
            rv = server.event("pods", POD_EVENTS[3])
            wait_until(lambda: sink.checkpoint("pods") == str(rv))
        assert len(server.list_requests("rayjobs")) == 1                    # asked again only after 300 s
    assert not errors
    absent = [r.getMessage() for r in caplog.records if "not served" in r.getMessage()]
    assert len(absent) == 2 and any("rayjobs.ray.io/v1" in m for m in absent)
    rows = kuberay_rows(sink)
    assert {(r["queue"], r["owner_kind"]) for r in rows.values()} == {("unassigned", "RayCluster")}
    assert len(sink.final_allocations()) == 8                           # 5 recorded + 2 workers + llm-serve-0
    with kuberay_server(absent=("rayjobs",)) as server:                  # once: a missing CRD is skipped too
        target = KubernetesTarget(cluster="prod", kubeconfig=str(server.kubeconfig(tmp_path / "kc1")))
        once = Sink()
        KubernetesWatcher(target, queues=LOOKUP, clock=Clock()).run(once, threading.Event(), once=True)
    assert {r["owner_kind"] for r in kuberay_rows(once).values()} == {"RayCluster"}


# ================================================================================================
# end to end: the accounting counts the RayJob's GPUs for its Kueue queue
# ================================================================================================
QUEUES = """
mapping:
  namespaces: {team-speech: speech}
queues:
  vision: {guaranteed: {gpu: 8}}
  speech: {guaranteed: {gpu: 4}}
  llm: {guaranteed: {gpu: 8}, max: {gpu: 16}}
  nlp:
    queues:
      interactive: {}
      batch: {}
"""


def test_accounting_counts_the_rayjob_for_its_kueue_queue(store: Any, store_dsn: str, tmp_path: Path) -> None:
    writer = BatchWriter(store, tmp_path / "spill")
    with kuberay_server(rayclusters=[RAYCLUSTER], rayjobs=[RAYJOB]) as api:
        target = KubernetesTarget(cluster="prod", kubeconfig=str(api.kubeconfig(tmp_path / "kubeconfig")))
        KubernetesWatcher(target).run(writer.write, threading.Event(), once=True)
    writer.flush()
    (tmp_path / "queues.yaml").write_text(QUEUES)
    settings = load_settings(None, store={"dsn": store_dsn}, queues_file=str(tmp_path / "queues.yaml"))
    out, err = io.StringIO(), io.StringIO()
    now_s = dt.datetime(2026, 11, 21, 10, 0, tzinfo=UTC).timestamp()
    assert queues_main(["--format", "json"], settings, now_s=now_s, out=out, err=err) == 0, err.getvalue()
    now = {(r["queue"], r["gpu_type"]): r for r in json.loads(out.getvalue())}
    assert now[("llm", "*")]["allocated"] == 4                          # 2 workers x 2 GPUs
    assert now[("vision", "*")]["allocated"] == 4 and now[("speech", "*")]["allocated"] == 2
    rows = store.query(f"SELECT owner_kind, owner, queue, sum(gpus) FROM {store.database}.gpu_allocations FINAL "
                       f"WHERE namespace = 'team-llm' GROUP BY owner_kind, owner, queue").rows
    assert [tuple(r) for r in rows] == [("RayJob", "pretrain-7b", "llm", 4.0)]
