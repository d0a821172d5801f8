"""Time-sliced replicas in a RayJob's templates, end to end: the collector's watcher sees the
recorded nodes (tests/data/k8s, a Tesla T4 advertised 3 times) through the replay server into
chDB; the live accounting reads them (``LiveAccounting.replicas_by_type``); the Kubernetes workload
source, listing a RayJob from the actuator's API server, takes one replica of a T4 as 0.333 of a GPU,
the share the collector bills such a pod (tests/test_k8s_shares.py)."""
from __future__ import annotations

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
