"""Builders shared by the accounting tests."""
from __future__ import annotations

import time
from typing import Any

from accounting.model import Allocation, NodeCapacity, PendingDemand, milli
from accounting.queues import QueueConfig, parse_queue_config
from accounting.resolve import Resolver

# The tests' "epoch": 21:00 UTC ten days ago, hour-aligned. Relative to now, so rows the store
# tests insert at T0 + offset are never older than the store's retention, whatever today's date.
T0 = float(int(time.time()) // 86_400 * 86_400 - 10 * 86_400 + 21 * 3_600)

BASE_QUEUES: dict[str, Any] = {
    "gpu_types": {"H100": {"price_per_hour": 4.0, "node_labels": ["NVIDIA-H100-80GB-HBM3"]},
                  "A100": {"price_per_hour": 2.0, "node_labels": ["NVIDIA-A100-SXM4-80GB"]}},
    "queues": {
        "research": {"guaranteed": {"gpu": 24}, "max": {"gpu": 80}, "weight": 1,
                     "queues": {"vision": {"guaranteed": {"gpu": 16}, "max": {"gpu/H100": 8, "gpu": 40}},
                                "nlp": {"guaranteed": {"gpu": 8}}}},
        "prod": {"guaranteed": {"gpu": 56}, "max": {"gpu": 80}, "weight": 3},
    },
}


def config(data: dict[str, Any] | None = None) -> QueueConfig:
    return parse_queue_config(BASE_QUEUES if data is None else data)


def resolver(data: dict[str, Any] | None = None) -> Resolver:
    return Resolver(config(data))


def alloc(pod: str = "p", queue: str = "research.vision", gpus: float = 1, start: float = 0.0,
          end: float | None = 100.0, *, uid: str | None = None, node: str = "n1", model: str = "H100",
          namespace: str = "ns", cluster: str = "c", ray_cluster: str = "") -> Allocation:
    """Times are offsets from T0."""
    return Allocation(cluster=cluster, namespace=namespace, pod=pod, uid=uid or f"{pod}-{start}", queue=queue,
                      node=node, gpu_model=model, milli_gpus=milli(gpus), start_s=T0 + start,
                      end_s=None if end is None else T0 + end, ray_cluster=ray_cluster)


def node(name: str = "n1", gpus: float = 8, model: str = "H100", cluster: str = "c",
         schedulable: bool = True) -> NodeCapacity:
    return NodeCapacity(cluster, name, model, milli(gpus), schedulable)


def pending(queue: str = "research.vision", gpus: float = 8, since: float = 0.0, model: str = "",
            workload: str = "w", namespace: str = "ns") -> PendingDemand:
    return PendingDemand("c", namespace, workload, queue, milli(gpus), T0 + since, model)
