"""GPU allocations from pod lifecycles, and the rows of the Kubernetes tables. Pure.

When an allocation starts
    When the pod is bound to a node (``spec.nodeName`` set) and asks for GPUs: from then on the
    device plugin holds the devices for it and nobody else can be scheduled on them, whether the
    containers already run or still pull their images. ``start`` is, first found: the
    ``PodScheduled=True`` condition's ``lastTransitionTime``, ``status.startTime``,
    ``metadata.creationTimestamp``. All three come from the object itself, so re-reading the same
    pod (a relist, a replayed event after a restart) gives the same row.

When it ends
    When the pod reaches ``Succeeded``/``Failed`` or is ``DELETED``. ``end`` is, first found: the
    last container ``finishedAt`` once every container has terminated, the
    ``deletionTimestamp``, the time the event was seen. An allocation still open in the store
    whose pod a relist no longer shows (deleted while the collector was away) ends at the relist
    time. ``end`` is never before ``start``.

Versions (``gpu_allocations`` is a ReplacingMergeTree(version) keyed by (cluster, uid))
    ``version = milliseconds(t) * 10 + order`` with ``t, order`` = ``start, 1`` for an open row,
    ``end, 2`` for an end seen on the pod, ``end, 3`` for a close by relist. The same transition
    always gives the same version (idempotent), and an end always outranks its start.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from collector.k8s_extract import NodeInfo, PodInfo

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)

OPEN, ENDED, CLOSED_BY_RELIST = 1, 2, 3


def version_of(t: dt.datetime, order: int) -> int:
    return ((t - _EPOCH) // _MS) * 10 + order


@dataclass(frozen=True, slots=True)
class Allocation:
    cluster: str
    namespace: str
    pod: str
    uid: str
    queue: str
    node: str
    gpu_model: str
    gpu_resource: str
    gpus: float
    priority: int
    ray_cluster: str
    start: dt.datetime
    end: dt.datetime | None
    version: int
    source: str = "pod"          # the ledger's source (0004_ledger.sql)
    workload_id: str = ""        # the gpuq workload id, from the top owner's gpuq.io/workload annotation
    owner_kind: str = ""         # the pod's top owner (RayJob, RayCluster, ...), "" for a bare pod
    owner: str = ""

    @property
    def open(self) -> bool:
        return self.end is None

    def row(self) -> tuple[Any, ...]:
        """In ``COLUMNS["gpu_allocations"]`` order."""
        return (self.cluster, self.namespace, self.pod, self.uid, self.queue, self.node,
                self.gpu_model, self.gpu_resource, self.gpus, self.priority, self.ray_cluster,
                self.start, self.end, self.version, self.source, self.workload_id, self.owner_kind,
                self.owner)

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> Allocation:
        """From a ``COLUMNS["gpu_allocations"]``-ordered row (what the store returns)."""
        (cluster, namespace, pod, uid, queue, node, model, resource, gpus, priority, ray_cluster,
         start, end, version, source, workload_id, owner_kind, owner) = row
        return cls(str(cluster), str(namespace), str(pod), str(uid), str(queue), str(node),
                   str(model), str(resource), float(gpus), int(priority), str(ray_cluster),
                   _utc(start), _utc(end) if end is not None else None, int(version), str(source),
                   str(workload_id), str(owner_kind), str(owner))


def _utc(t: dt.datetime) -> dt.datetime:
    return t.replace(tzinfo=dt.UTC) if t.tzinfo is None else t.astimezone(dt.UTC)


def allocation_start(pod: PodInfo) -> dt.datetime | None:
    return pod.scheduled_at or pod.started_at or pod.created_at


def allocation_for(pod: PodInfo, gpu_model: str, cluster: str, event: str,
                   seen_at: dt.datetime) -> Allocation | None:
    """The allocation row this pod state implies, or None when the pod holds no GPU."""
    if pod.gpus <= 0 or not pod.node:
        return None
    start = allocation_start(pod) or seen_at
    end: dt.datetime | None = None
    version = version_of(start, OPEN)
    if event == "DELETED" or pod.terminal:
        end = max(pod.finished_at or pod.deleted_at or seen_at, start)
        version = version_of(end, ENDED)
    return Allocation(cluster, pod.namespace, pod.name, pod.uid, pod.queue, pod.node, gpu_model,
                      pod.gpu_resource, pod.gpus, pod.priority, pod.ray_cluster, start, end, version)


def close_by_relist(alloc: Allocation, at: dt.datetime) -> Allocation:
    end = max(at, alloc.start)
    return replace(alloc, end=end, version=version_of(end, CLOSED_BY_RELIST))


def pod_event_row(ts: dt.datetime, cluster: str, event: str, pod: PodInfo,
                  gpu_model: str) -> tuple[Any, ...]:
    """In ``COLUMNS["pod_events"]`` order."""
    return (ts, cluster, pod.namespace, pod.name, pod.uid, event, pod.phase, pod.node, pod.gpus,
            pod.gpu_resource, gpu_model, pod.queue, pod.priority, pod.ray_cluster,
            pod.ray_node_type, pod.resource_version)


def node_event_row(ts: dt.datetime, cluster: str, event: str, node: NodeInfo) -> tuple[Any, ...]:
    """In ``COLUMNS["node_events"]`` order."""
    return (ts, cluster, node.name, node.uid, event, int(node.ready), int(node.unschedulable),
            node.gpu_model, node.gpu_capacity, node.gpu_allocatable, dict(node.mig_resources),
            dict(node.labels), node.resource_version)
