"""A pod's share of its node's GPUs (collector.k8s_extract.pod_share_milli), and the allocation
rows the watcher's tracker emits for shares: pure, on the recorded objects of tests/data/k8s and
variants of them."""
from __future__ import annotations

import copy
import datetime as dt
from typing import Any

import pytest

from collector.k8s_alloc import allocation_for
from collector.k8s_extract import is_reservation_pod, node_info, pod_gpu_model, pod_info, pod_share_milli
from collector.k8s_state import ClusterTracker
from tests.k8s_replay import load
from tests.test_collector_kubernetes import ctr, pod_obj

SEEN = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)


def shares(group: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(next(o for o in load("shares.json")[group] if o["metadata"]["name"] == name))


def node(name: str) -> dict[str, Any]:
    items = [*load("nodes.json")["items"], *load("shares.json")["nodes"]]
    return copy.deepcopy(next(o for o in items if o["metadata"]["name"] == name))


def with_labels(obj: dict[str, Any], **labels: str) -> dict[str, Any]:
    obj["metadata"]["labels"].update({k.replace("__", "/").replace("_", "."): v for k, v in labels.items()})
    return obj


@pytest.mark.parametrize("pod, node_name, milli", [
    (pod_obj([ctr(1)]), "gpu-t4-ts-0", 333),                                   # 1 of 3 replicas
    (pod_obj([ctr(2)]), "gpu-t4-ts-0", 666),                                   # 2 of 3: 2/3 rounded down
    (pod_obj([ctr(1)]), "gpu-a100-0", 1000),
    (pod_obj([ctr(mig={"1g.10gb": 1})]), "gpu-a100-mig-0", 142),               # mixed strategy: 1/7
    (pod_obj([ctr(mig={"1g.10gb": 2})]), "gpu-a100-mig-0", 285),               # 2/7, not 2 x 142
    (pod_obj([ctr(1)]), "gpu-h100-mig-1", 142),                                # single strategy: a 1g.10gb
    (pod_obj([ctr(7)]), "gpu-h100-mig-1", 1000),
    (pod_obj([ctr(mig={"1g.10gb": 1})]), None, 142),                           # node not seen yet: S = 7
    (pod_obj([ctr(1)]), None, 1000),
], ids=["replica", "two-replicas", "whole", "mig-mixed", "two-slices", "mig-single", "seven-slices",
        "mig-no-node", "no-node"])
def test_pod_share(pod: dict[str, Any], node_name: str | None, milli: int) -> None:
    info = node_info(node(node_name)) if node_name else None
    assert pod_share_milli(pod_info(pod), info) == milli


def test_the_renamed_shared_resource_and_a_shared_mig_device() -> None:
    """``renameByDefault``: ``nvidia.com/gpu.shared``, labelled ``nvidia.com/gpu.replicas``; a MIG
    device time-sliced: ``nvidia.com/mig-<profile>.replicas``."""
    n = node("gpu-t4-ts-0")
    n["status"]["allocatable"] = {"nvidia.com/gpu": "0", "nvidia.com/gpu.shared": "3"}
    n["status"]["capacity"] = dict(n["status"]["allocatable"])
    info = node_info(n)
    assert info.gpu_allocatable == 3
    shared = {"resources": {"limits": {"nvidia.com/gpu.shared": "1"}}, "name": "c", "image": "x"}
    pod = pod_info(pod_obj([shared]))
    assert (pod.gpus, pod.gpu_resource, pod_share_milli(pod, info)) == (1, "nvidia.com/gpu.shared", 333)
    mig = with_labels(node("gpu-a100-mig-0"), **{"nvidia.com/mig-1g.10gb.replicas": "2"})
    assert pod_share_milli(pod_info(pod_obj([ctr(mig={"1g.10gb": 1})])), node_info(mig)) == 71   # 1/7 / 2


def test_a_kai_fraction_pod_and_its_reservation_pod() -> None:
    frac = pod_info(shares("pods", "frac-1-0-0"))
    assert (frac.gpus, frac.gpu_resource, frac.asks_gpus) == (0.25, "gpu-fraction", True)
    assert pod_share_milli(frac, node_info(node("gpu-a100-0"))) == 250
    resv_obj = shares("pods", "runai-reservation-gpu-i-0b498db53280b86a6-fzdhl")
    assert is_reservation_pod(resv_obj["metadata"]["labels"])
    resv = pod_info(resv_obj)
    assert (resv.gpus, resv.gpu_resource, resv.asks_gpus) == (0, "", False)      # holds nothing of its own
    assert allocation_for(resv, "M", "prod", "SYNC", SEEN, node=node_info(node("gpu-a100-0"))) is None
    # KAI's own reservation pods carry app: kai-resource-reservation
    resv_obj["metadata"]["labels"]["app"] = "kai-resource-reservation"
    assert pod_info(resv_obj).gpus == 0
    # without the GPU-group label it is an ordinary pod holding a GPU
    del resv_obj["metadata"]["labels"]["runai-gpu-group"]
    assert pod_info(resv_obj).gpus == 1


def test_a_kai_gpu_memory_pod_takes_its_share_from_the_node() -> None:
    obj = shares("pods", "frac-1-0-0")
    del obj["metadata"]["annotations"]["gpu-fraction"]
    obj["metadata"]["annotations"]["gpu-memory"] = "20480"
    pod = pod_info(obj)
    assert (pod.gpus, pod.gpu_resource, pod.asks_gpus) == (0, "gpu-memory", True)
    assert pod_share_milli(pod, None) == 0                       # unknown until the node says its memory
    a100 = node_info(node("gpu-a100-0"))                          # nvidia.com/gpu.memory 81920 MiB
    assert pod_share_milli(pod, a100) == 260                      # ceil(20480 / 81900 x 100) / 100
    assert pod_gpu_model(pod, a100.gpu_model) == "NVIDIA-A100-SXM4-80GB"
    alloc = allocation_for(pod, "NVIDIA-A100-SXM4-80GB", "prod", "SYNC", SEEN, node=a100)
    assert alloc is not None and alloc.gpus == 0.26


def test_the_tracker_bills_a_pod_seen_before_its_node_by_the_node_once_it_arrives() -> None:
    tracker = ClusterTracker("prod")
    pod = shares("pods", "infer-a-0")
    first = tracker.on_pod("ADDED", pod, SEEN)["gpu_allocations"]
    assert [r[8] for r in first] == [1.0]                         # a replica, its node unknown: one device
    rows = tracker.on_node("ADDED", node("gpu-t4-ts-0"), SEEN)["gpu_allocations"]
    assert [(r[2], r[6], r[8]) for r in rows] == [("infer-a-0", "Tesla-T4-SHARED", 0.333)]
    assert rows[0][13] == first[0][13]                            # the same version: the later insert wins


def test_the_time_sliced_nodes_events_keep_what_the_plugin_advertises() -> None:
    info = node_info(node("gpu-t4-ts-0"))
    assert (info.gpu_model, info.gpu_capacity, info.gpu_allocatable) == ("Tesla-T4-SHARED", 3, 3)
    assert info.labels["nvidia.com/gpu.replicas"] == "3"
