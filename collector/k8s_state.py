"""What the Kubernetes watcher remembers between events, and the rows each event produces.

Pure (no I/O, no clock: ``now`` is passed in) and not thread-safe: the watcher calls it under
its lock. Rows come back as ``{table: [tuple in COLUMNS[table] order]}``.

* ``pod_events``: one row per pod seen in a list (event ``SYNC``) or a watch event (``ADDED``,
  ``MODIFIED``, ``DELETED``). Keyed by (uid, resourceVersion, event), so a pod re-listed
  unchanged, or an event replayed after a restart, collapses onto the row already written.
* ``node_events``: the same for nodes, except that a ``MODIFIED`` event whose recorded content
  (readiness, GPU labels and counts, labels) did not change is skipped: node status heartbeats
  would otherwise dominate the table.
* ``gpu_allocations``: see :mod:`collector.k8s_alloc`. A row is emitted only when it differs
  from the last one emitted for that uid; a closed allocation is never reopened or moved.

GPU model filled in later: a GPU pod seen before its node (a node the node watch has not
reported yet) is recorded with an empty ``gpu_model`` and remembered. When the node arrives,
the pod's latest ``pod_events`` row is emitted again with the model (same key: it replaces the
first one) and so is its allocation (same version: the later insert wins).

Queue and owner: each pod is attributed through the KubeRay objects in :attr:`ClusterTracker.owners`
(:mod:`collector.k8s_owners`); its ``pod_events`` and ``gpu_allocations`` rows carry the result.
Owner seen after the pod: when a RayCluster or RayJob appears, changes what attribution reads
(labels, annotations, owners, ``status.rayClusterName``) or is found gone by a relist, the open
allocations of its namespace whose attribution changes are emitted again, re-attributed
(:func:`collector.k8s_alloc.reattributed`). ``pod_events`` rows already written are not
rewritten: they keep the queue known when the event was seen. A deleted owner changes nothing
(its pods follow it, and their last rows keep the owner's queue).
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from collector.k8s_alloc import (
    Allocation,
    allocation_for,
    attribution_of,
    close_by_relist,
    node_event_row,
    pod_event_row,
    reattributed,
)
from collector.k8s_extract import (
    NodeInfo,
    PodInfo,
    QueueKeys,
    QueueLookup,
    node_info,
    pod_gpu_model,
    pod_info,
)
from collector.k8s_kueue import KueueIndex
from collector.k8s_owners import OWNER_KINDS, Attribution, OwnerIndex, owner_of
from collector.k8s_yunikorn import YuniKornIndex, application_of
from collector.k8s_yunikorn import workload_id as yunikorn_workload

Rows = dict[str, list[tuple[Any, ...]]]
_MODEL_COL = 10          # index of gpu_model in a pod_events row


@dataclass(slots=True)
class _Awaiting:
    row: tuple[Any, ...]
    pod: PodInfo
    event: str


@dataclass(slots=True)
class ClusterTracker:
    cluster: str
    queues: QueueLookup = field(default_factory=QueueKeys)
    closed_memory_s: float = 3600.0   # how long a closed allocation is remembered (vs. a lagging store)
    nodes: dict[str, NodeInfo] = field(default_factory=dict)
    _node_content: dict[str, tuple[Any, ...]] = field(default_factory=dict, init=False)
    _allocs: dict[str, Allocation] = field(default_factory=dict, init=False)       # last row emitted, per uid
    _closed_at: dict[str, dt.datetime] = field(default_factory=dict, init=False)   # deleted and closed here
    _awaiting: dict[str, _Awaiting] = field(default_factory=dict, init=False)      # GPU pods on unknown nodes
    owners: OwnerIndex = field(default_factory=OwnerIndex)
    kueue: KueueIndex | None = None       # Kueue's objects (queues_from: kueue), else not watched
    yunikorn: YuniKornIndex | None = None  # YuniKorn's ConfigMaps and pending pods (queues_from: yunikorn)
    _pods: dict[str, PodInfo] = field(default_factory=dict, init=False)            # pods of open allocations
    _stored: dict[str, Allocation] = field(default_factory=dict, init=False)       # open in the store at start

    # -- nodes ------------------------------------------------------------------------------
    def prime_nodes(self, objs: Iterable[Mapping[str, Any]]) -> None:
        """Fill the node cache without rows (a restart that resumes the node watch)."""
        for obj in objs:
            info = node_info(obj)
            self.nodes[info.name] = info

    def on_node(self, event: str, obj: Mapping[str, Any], now: dt.datetime) -> Rows:
        info = node_info(obj)
        rows: Rows = {}
        if event == "DELETED":
            self.nodes.pop(info.name, None)
            self._node_content.pop(info.name, None)
            _add(rows, "node_events", node_event_row(now, self.cluster, event, info))
            return rows
        self.nodes[info.name] = info
        content = info.content()
        if event != "MODIFIED" or self._node_content.get(info.name) != content:
            self._node_content[info.name] = content
            _add(rows, "node_events", node_event_row(now, self.cluster, event, info))
        self._fill_models(info, rows)
        return rows

    def nodes_relisted(self, listed: set[str], now: dt.datetime) -> Rows:
        """Nodes known here but absent from a relist were deleted meanwhile."""
        rows: Rows = {}
        for name in sorted(set(self.nodes) - listed):
            info = self.nodes.pop(name)
            self._node_content.pop(name, None)
            _add(rows, "node_events", node_event_row(now, self.cluster, "DELETED", info))
        return rows

    def _fill_models(self, node: NodeInfo, rows: Rows) -> None:
        for uid in [u for u, a in self._awaiting.items() if a.pod.node == node.name]:
            waiting = self._awaiting.pop(uid)
            model = pod_gpu_model(waiting.pod, node.gpu_model)
            if not model:
                continue
            row = waiting.row[:_MODEL_COL] + (model,) + waiting.row[_MODEL_COL + 1:]
            _add(rows, "pod_events", row)
            alloc = allocation_for(waiting.pod, model, self.cluster, waiting.event, row[0],
                                   self._attribute(waiting.pod), node)
            if alloc is not None:
                self._offer(alloc, rows, waiting.pod)

    # -- pods -------------------------------------------------------------------------------
    def on_pod(self, event: str, obj: Mapping[str, Any], now: dt.datetime) -> Rows:
        pod = pod_info(obj, self.queues)
        att = self._attribute(pod)
        rows: Rows = {}
        node = self.nodes.get(pod.node)
        model = pod_gpu_model(pod, node.gpu_model if node else "")
        row = pod_event_row(now, self.cluster, event, replace(pod, queue=att.queue), model)
        _add(rows, "pod_events", row)
        if pod.asks_gpus and pod.node and node is None and event != "DELETED":
            self._awaiting[pod.uid] = _Awaiting(row, pod, event)
        else:
            self._awaiting.pop(pod.uid, None)
        alloc = allocation_for(pod, model, self.cluster, event, now, att, node)
        if alloc is not None:
            self._offer(alloc, rows, pod)
        if self.yunikorn is not None:
            merge(rows, self.yunikorn.on_pod(event, obj, pod, now))
        if event == "DELETED":
            self._pods.pop(pod.uid, None)
            gone = self._allocs.pop(pod.uid, None)
            if gone is not None:
                self._closed_at[pod.uid] = now
                self._forget_closed(now)
        return rows

    def _attribute(self, pod: PodInfo) -> Attribution:
        app = application_of(pod) if self.yunikorn is not None else ""
        return self.owners.attribute(pod.namespace, pod.labels, pod.annotations, pod.owner_refs,
                                     pod.ray_cluster, self.queues, uid=pod.uid,
                                     workload_of=self.kueue.workload_of if self.kueue is not None else None,
                                     application=yunikorn_workload(pod.namespace, app) if app else "")

    def _offer(self, alloc: Allocation, rows: Rows, pod: PodInfo | None = None) -> None:
        stored = self._stored.pop(alloc.uid, None)
        prev = self._allocs.get(alloc.uid)
        if prev is None and alloc.uid in self._closed_at:
            return
        base = prev if prev is not None else stored
        if base is not None:
            alloc = reattributed(base, alloc)
        if prev is not None and (prev == alloc or alloc.version < prev.version
                                 or (not prev.open and alloc.version != prev.version)):
            return
        self._allocs[alloc.uid] = alloc
        if pod is not None and alloc.open:
            self._pods[alloc.uid] = pod
        else:
            self._pods.pop(alloc.uid, None)
        _add(rows, "gpu_allocations", alloc.row())

    def remember_stored(self, stored_open: Iterable[Allocation]) -> None:
        """The allocations the store holds open for this cluster (at start, and at each pod
        relist): a re-read pod's row follows the stored one's version (see k8s_alloc)."""
        for a in stored_open:
            if a.cluster == self.cluster and a.open and a.uid not in self._allocs:
                self._stored[a.uid] = a

    # -- owners (RayCluster, RayJob) --------------------------------------------------------------
    def prime_owners(self, stream_kind: str, objs: Iterable[Mapping[str, Any]]) -> None:
        """Fill the owner index without rows (a restart that resumes the owner watch)."""
        for obj in objs:
            self.owners.put(owner_of(OWNER_KINDS[stream_kind], obj))

    def on_owner(self, stream_kind: str, event: str, obj: Mapping[str, Any], now: dt.datetime) -> Rows:
        owner = owner_of(OWNER_KINDS[stream_kind], obj)
        if event == "DELETED":
            self.owners.remove(owner.uid, now)
            return {}
        if not self.owners.put(owner):
            return {}
        return self._reattribute(owner.namespace)

    # -- Kueue (queues_from: kueue) -----------------------------------------------------------------
    def on_kueue(self, stream_kind: str, event: str, obj: Mapping[str, Any], now: dt.datetime) -> Rows:
        """A Kueue object's rows (:mod:`collector.k8s_kueue`); a Workload whose owners changed
        re-attributes the open allocations of its namespace (its pods get its id)."""
        assert self.kueue is not None
        rows, changed = self.kueue.on_object(stream_kind, event, obj, now)
        if changed:
            merge(rows, self._reattribute(str((obj.get("metadata") or {}).get("namespace") or "")))
        return rows

    def kueue_relisted(self, stream_kind: str, namespace: str | None, listed: set[tuple[str, str, str]],
                       now: dt.datetime) -> Rows:
        assert self.kueue is not None
        rows, changed = self.kueue.relisted(stream_kind, namespace, listed, now)
        if changed:
            for ns in sorted({a.namespace for a in self._allocs.values() if a.open}
                             if namespace is None else {namespace}):
                merge(rows, self._reattribute(ns))
        return rows

    def owners_relisted(self, stream_kind: str, namespace: str | None, listed: set[str],
                        now: dt.datetime) -> Rows:
        self.owners.relisted(OWNER_KINDS[stream_kind], namespace, listed, now)
        return {}

    def _reattribute(self, namespace: str) -> Rows:
        rows: Rows = {}
        for uid in sorted(u for u, a in self._allocs.items() if a.open and a.namespace == namespace):
            alloc, pod = self._allocs[uid], self._pods.get(uid)
            if pod is None:
                continue
            att = self._attribute(pod)
            if att != attribution_of(alloc):
                self._offer(replace(alloc, queue=att.queue, owner_kind=att.owner_kind, owner=att.owner,
                                    workload_id=att.workload_id), rows, pod)
        return rows

    def pods_relisted(self, namespace: str | None, listed: set[str],
                      stored_open: Iterable[Allocation], now: dt.datetime) -> Rows:
        """After a pod list (all namespaces, or ``namespace``): close what is no longer there.

        ``stored_open`` are the allocations the store holds open for this cluster (from before a
        restart); what this tracker emitted since overrides them.
        """
        def in_scope(a: Allocation) -> bool:
            return a.cluster == self.cluster and (namespace is None or a.namespace == namespace)

        self._forget_closed(now)
        candidates = {a.uid: a for a in stored_open if in_scope(a)}
        candidates.update({u: a for u, a in self._allocs.items() if in_scope(a)})
        rows: Rows = {}
        for uid in sorted(candidates):
            alloc = candidates[uid]
            if uid in listed or uid in self._closed_at:
                continue
            self._allocs.pop(uid, None)
            self._pods.pop(uid, None)
            self._stored.pop(uid, None)
            if alloc.open:
                closed = close_by_relist(alloc, now)
                _add(rows, "gpu_allocations", closed.row())
                self._closed_at.pop(uid, None)
                self._closed_at[uid] = now
        for uid in [u for u, a in self._awaiting.items()
                    if u not in listed and (namespace is None or a.pod.namespace == namespace)]:
            del self._awaiting[uid]
        return rows

    def _forget_closed(self, now: dt.datetime) -> None:
        """Drop closed uids older than ``closed_memory_s`` (kept in the order they closed)."""
        horizon = now - dt.timedelta(seconds=self.closed_memory_s)
        while self._closed_at:
            uid, at = next(iter(self._closed_at.items()))
            if at >= horizon:
                break
            del self._closed_at[uid]

    def open_allocations(self) -> list[Allocation]:
        return [a for a in self._allocs.values() if a.open]


def _add(rows: Rows, table: str, row: tuple[Any, ...]) -> None:
    rows.setdefault(table, []).append(row)


def merge(into: Rows, more: Rows) -> Rows:
    for table, rs in more.items():
        into.setdefault(table, []).extend(rs)
    return into
