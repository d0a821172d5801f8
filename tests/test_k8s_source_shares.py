"""Time-sliced replicas in a RayJob's templates, end to end: the collector's watcher sees the
recorded nodes (tests/data/k8s, a Tesla T4 advertised 3 times) through the replay server into
chDB; the live accounting reads them (``LiveAccounting.replicas_by_type``); the Kubernetes workload
source, listing a RayJob from the actuator's API server, takes one replica of a T4 as 0.333 of a GPU,
the share the collector bills such a pod (tests/test_k8s_shares.py). The same for
``nvidia.com/gpu.shared`` (the device plugin's ``renameByDefault: true``) on a variant of the
recorded node advertising its replicas under that name: billed 1/R by the collector, scheduled as
1/R on the time-sliced type."""
from __future__ import annotations

import copy
import datetime as dt
import threading
from pathlib import Path
from typing import Any

from collector.k8s_extract import node_info, pod_info, pod_share_milli
from collector.kubernetes import KubernetesWatcher
from gpuq.settings import KubernetesTarget
from gpuq.store.writer import BatchWriter
from scheduler.actuators.k8s_workloads import KubernetesWorkloadSource
from scheduler.service.accounting import LiveAccounting
from tests.k8s_api_server import ApiServer
from tests.k8s_replay import ReplayServer, load
from tests.test_actuator_kubernetes import settings_for, worker_asks
from tests.test_collector_kubernetes import ctr, pod_obj

SEEN = dt.datetime(2026, 11, 21, 9, 5, tzinfo=dt.UTC)


def test_a_replica_of_a_time_sliced_gpu_is_scheduled_as_its_billed_share(long_store: Any, tmp_path: Path) -> None:
    nodes = [*load("nodes.json")["items"], *load("shares.json")["nodes"]]
    writer = BatchWriter(long_store, tmp_path / "spill")
    with ReplayServer([], nodes, resource_version=1) as cluster:
        target = KubernetesTarget(cluster="prod", kubeconfig=str(cluster.kubeconfig(tmp_path / "collector")))
        KubernetesWatcher(target, clock=lambda: SEEN).run(writer.write, threading.Event(), once=True)
    writer.close()
    live = LiveAccounting(long_store)
    live.refresh(SEEN.timestamp() + 60)
    pools = live.replicas_by_type()
    assert pools["Tesla-T4-SHARED"] == 3                       # nvidia.com/gpu.replicas on the T4 node
    assert all(r == 1 for t, r in pools.items() if t != "Tesla-T4-SHARED") and len(pools) > 1

    t4 = {"metadata__annotations": {"gpuq.io/gpu-types": "Tesla-T4-SHARED"}}
    with ApiServer([worker_asks({"nvidia.com/gpu": "1"}, **t4),
                    worker_asks({"nvidia.com/gpu": "1"}, metadata__name="anywhere", metadata__annotations={})]) as api:
        source = KubernetesWorkloadSource(settings_for(api, tmp_path), node_labels={}, mig_types={},
                                          replicas=live.replicas_by_type)
        try:
            got = {w.id: w for w, _ in source.pending()}
        finally:
            source.close()
    shared = got["rayjob/team-a/train-llm"]
    billed = pod_share_milli(pod_info(pod_obj([ctr(1)])), node_info(next(
        n for n in nodes if n["metadata"]["name"] == "gpu-t4-ts-0")))
    assert (shared.gpus_per_pod * 1000, shared.gpu_types) == (billed, ("Tesla-T4-SHARED",)) == (333, ("Tesla-T4-SHARED",))
    # a RayJob that may land on any type keeps whole GPUs: some nodes are not time-sliced
    assert got["rayjob/team-a/anywhere"].gpus_per_pod == 1


def renamed_node() -> dict[str, Any]:
    """The recorded time-sliced T4 node as the device plugin shows it with ``renameByDefault: true``:
    its replicas (four here) advertised as ``nvidia.com/gpu.shared``, none as ``nvidia.com/gpu``;
    GFD labels them ``nvidia.com/gpu.replicas`` all the same."""
    n = copy.deepcopy(next(o for o in load("shares.json")["nodes"] if o["metadata"]["name"] == "gpu-t4-ts-0"))
    n["metadata"]["name"] = "gpu-t4-rn-0"
    n["metadata"]["uid"] = "uid-gpu-t4-rn-0"
    n["metadata"]["labels"]["nvidia.com/gpu.replicas"] = "4"
    n["metadata"]["labels"]["kubernetes.io/hostname"] = "gpu-t4-rn-0"
    for part in ("capacity", "allocatable"):
        n["status"][part]["nvidia.com/gpu"] = "0"
        n["status"][part]["nvidia.com/gpu.shared"] = "4"
    return n


def renamed_pod() -> dict[str, Any]:
    """The recorded replica pod, asking ``nvidia.com/gpu.shared: 1`` on the renamed node."""
    p = copy.deepcopy(next(o for o in load("shares.json")["pods"] if o["metadata"]["name"] == "infer-a-0"))
    p["spec"]["nodeName"] = "gpu-t4-rn-0"
    res = p["spec"]["containers"][0]["resources"]
    for part in ("limits", "requests"):
        res[part]["nvidia.com/gpu.shared"] = res[part].pop("nvidia.com/gpu")
    return p


def test_a_renamed_shared_replica_is_billed_and_scheduled_as_its_share(long_store: Any, tmp_path: Path) -> None:
    """``nvidia.com/gpu.shared: 1`` on a node of 4 replicas: the collector bills the pod 1/4 of a GPU
    (through the replay server into chDB), and the workload source takes a RayJob's template asking
    the same as the same 0.25 on the time-sliced type, whether the RayJob names the type or not."""
    nodes = [*load("nodes.json")["items"], renamed_node()]
    writer = BatchWriter(long_store, tmp_path / "spill")
    with ReplayServer([renamed_pod()], nodes, resource_version=1) as cluster:
        target = KubernetesTarget(cluster="prod", kubeconfig=str(cluster.kubeconfig(tmp_path / "collector")))
        KubernetesWatcher(target, clock=lambda: SEEN).run(writer.write, threading.Event(), once=True)
    writer.close()
    [(pod, milli, resource, model)] = long_store.query(
        f"SELECT pod, milli_gpus, gpu_resource, gpu_model FROM {long_store.database}.gpu_allocations FINAL").rows
    assert (pod, resource, model) == ("infer-a-0", "nvidia.com/gpu.shared", "Tesla-T4-SHARED")
    assert milli == 1000 // 4                                   # one of 4 replicas: a quarter of a GPU
    live = LiveAccounting(long_store)
    view = live.refresh(SEEN.timestamp() + 60).view
    pools = live.replicas_by_type()
    assert pools["Tesla-T4-SHARED"] == 4
    t4 = next(n for n in view.capacity.nodes if n.node == "gpu-t4-rn-0")
    assert (t4.capacity, t4.allocated) == (1, 0.25)            # 4 replicas of one T4, one of them held

    named_t4 = {"metadata__annotations": {"gpuq.io/gpu-types": "Tesla-T4-SHARED"}}
    with ApiServer([worker_asks({"nvidia.com/gpu.shared": "1"}, **named_t4),
                    worker_asks({"nvidia.com/gpu.shared": "1"}, metadata__name="anywhere", metadata__annotations={}),
                    worker_asks({"nvidia.com/gpu.shared": "1", "nvidia.com/gpu": "1"}, metadata__name="both",
                                metadata__annotations={})]) as api:
        source = KubernetesWorkloadSource(settings_for(api, tmp_path), node_labels={}, mig_types={},
                                          replicas=live.replicas_by_type)
        try:
            got = {w.id: w for w, _ in source.pending()}
            skipped = source.skipped
        finally:
            source.close()
    named, anywhere = got["rayjob/team-a/train-llm"], got["rayjob/team-a/anywhere"]
    assert named.gpus_per_pod * 1000 == anywhere.gpus_per_pod * 1000 == milli
    assert named.gpu_types == anywhere.gpu_types == ("Tesla-T4-SHARED",)    # only time-sliced nodes have it
    assert "rayjob/team-a/both" not in got
    assert any("both" in s and "nvidia.com/gpu.shared and nvidia.com/gpu in one gang" in s for s in skipped), skipped
