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

GPUs
    ``gpus`` is the pod's share of its node's GPUs in GPUs (whole thousandths: the store derives
    ``milli_gpus`` from it): :func:`collector.k8s_extract.pod_share_milli`, from the pod and its
    node (a MIG slice its fraction of the GPU, a time-sliced replica ``1/replicas``, a KAI pod its
    fraction). A pod whose node is not known yet is re-emitted when the node arrives (see
    :mod:`collector.k8s_state`), with the share the node gives.

Queue, owner, workload id
    From :meth:`collector.k8s_owners.OwnerIndex.attribute` (the pod, then its top owner), passed
    in as an ``Attribution``; without one, the pod's own queue and no owner.

Versions (``gpu_allocations`` is a ReplacingMergeTree(version) keyed by (cluster, uid))
    ``version = milliseconds(t) * 10 + order`` with ``t, order`` = ``start, 1`` for an open row,
    ``end, 8`` for an end seen on the pod, ``end, 9`` for a close by relist. The same transition
    always gives the same version (idempotent), and an end always outranks its start.

    Re-attribution: an open allocation whose queue, owner or workload id changes while it stays
    open (its RayJob arrived after the pod, or the owner's labels changed) is emitted again with
    ``start, order + 1`` (orders 2..7, :func:`reattributed`): it outranks every earlier open row
    of the allocation and never an end (``end >= start``, and ends use 8 and 9). Six changes in
    a row reach order 7; later ones keep 7 and rely on ReplacingMergeTree keeping the last insert
    on equal versions (as a GPU model filled in later does). Not derived from the owner's
    resourceVersion: that would not fit in the version beside the milliseconds, and a pod's
    attribution depends on several objects. Across a restart the watcher starts from the open
    rows in the store (:meth:`collector.k8s_state.ClusterTracker.remember_stored`), so a changed
    attribution found then still outranks what was written before.

    (Before re-attribution, ends used orders 2 and 3. A stored end of that scheme is never
    outranked by a re-attributed row: only allocations the watcher holds open are re-attributed,
    and it never holds open an allocation whose end is stored.)
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from collector.k8s_extract import NodeInfo, PodInfo, pod_share_milli
from gpuq.gpu_share import MILLI
from collector.k8s_owners import Attribution

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_MS = dt.timedelta(milliseconds=1)

OPEN, REATTRIBUTED_MAX, ENDED, CLOSED_BY_RELIST = 1, 7, 8, 9


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
                   seen_at: dt.datetime, attribution: Attribution | None = None,
                   node: NodeInfo | None = None) -> Allocation | None:
    """The allocation row this pod state implies, or None when the pod holds no GPU. ``node``:
    the pod's node as last seen (None: not seen yet), for the pod's share."""
    if not pod.asks_gpus or not pod.node:
        return None
    share = pod_share_milli(pod, node)
    if share <= 0:
        return None
    start = allocation_start(pod) or seen_at
    end: dt.datetime | None = None
    version = version_of(start, OPEN)
    if event == "DELETED" or pod.terminal:
        end = max(pod.finished_at or pod.deleted_at or seen_at, start)
        version = version_of(end, ENDED)
    att = attribution or Attribution(pod.queue)
    return Allocation(cluster, pod.namespace, pod.name, pod.uid, att.queue, pod.node, gpu_model,
                      pod.gpu_resource, share / MILLI, pod.priority, pod.ray_cluster, start, end, version,
                      "pod", att.workload_id, att.owner_kind, att.owner)


def attribution_of(alloc: Allocation) -> Attribution:
    return Attribution(alloc.queue, alloc.owner_kind, alloc.owner, alloc.workload_id)


def reattributed(prev: Allocation, new: Allocation) -> Allocation:
    """``new`` (open) following ``prev`` (open, same allocation): at least ``prev``'s version,
    one order up when the attribution changed (see the module docstring)."""
    if not (prev.open and new.open) or prev.start != new.start:
        return new
    version = max(prev.version, new.version)
    if attribution_of(prev) != attribution_of(new) and version % 10 < REATTRIBUTED_MAX:
        version += 1
    return new if version == new.version else replace(new, version=version)


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
