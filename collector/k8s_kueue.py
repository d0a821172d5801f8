"""Kueue's objects as the Kubernetes watcher keeps them (``queues_from: kueue``). Pure, not thread-safe
(the watcher calls it under its lock), read only: gpuq never writes a Kueue object.

Streams (``kueue.x-k8s.io``, ``v1beta2`` where served, else ``v1beta1``; Cohort also ``v1alpha1``):
``resourceflavors``, ``cohorts``, ``clusterqueues`` (cluster-scoped), ``localqueues`` and
``workloads`` (namespaced). Each object seen is stored as it is now, one ``kueue_objects`` row
(ReplacingMergeTree keyed by cluster, kind, namespace, name; ``deleted = 1`` once it is gone), so
that ``gpuq serve`` builds the queue tree and the Workloads' views from the store
(``scheduler.service.kueue``), as it reads everything else the collectors write. The object is kept
whole but for ``metadata.managedFields`` and the ``last-applied-configuration`` annotation.

Workloads are also a **ledger source** (``source = 'kueue'``, docs/ACCOUNTING.md): a Workload holding
quota (``status.admission`` set and the ``QuotaReserved`` condition true) is one ``gpu_allocations``
row: id ``kueue/<namespace>/<name>``, uid ``<id>@<ms of the reservation>``, no node (Kueue assigns
flavors, not nodes), the GPUs of its ``podSetAssignments[].resourceUsage`` (``nvidia.com/gpu``),
the GPU model the flavor of that resource names (its ``nvidia.com/gpu.product`` node label, else
its first node label, else the flavor's name), its LocalQueue (``spec.queueName``) as the raw
queue. The row ends when the reservation does (``Finished`` or ``Evicted`` true, the admission
gone, or the Workload deleted), at that condition's ``lastTransitionTime`` (else when it was seen).
Versions as :mod:`collector.k8s_alloc` (start ``* 10 + 1``, end ``* 10 + 8``). The ledger counts
the row until the Workload's pods are seen (:mod:`accounting.ledger`).

Pods join their Workload through owners (:meth:`KueueIndex.workload_of`): a Workload's
``ownerReferences`` name the job it stands for (a RayJob, a RayCluster, a batch Job, or the pod
itself for plain pods); a pod whose own uid, owner references or owner chain holds that uid gets
the Workload's id as its ``workload_id``, so the ledger counts the pods (ranked first) and not the
Workload's row beside them.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from collector.k8s_alloc import ENDED, OPEN, Allocation, version_of
from collector.k8s_extract import parse_quantity
from gpuq.k8sobj import condition, is_true, k8s_time

KUEUE_KINDS = {"resourceflavors": "ResourceFlavor", "cohorts": "Cohort", "clusterqueues": "ClusterQueue",
               "localqueues": "LocalQueue", "workloads": "Workload"}          # stream kind -> object kind
SOURCE = "kueue"                       # the ledger's source of a Workload's row
GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
_DROP_ANNOTATION = "kubectl.kubernetes.io/last-applied-configuration"

Key = tuple[str, str, str]             # (kind, namespace, name)
Rows = dict[str, list[tuple[Any, ...]]]


def workload_id(namespace: str, name: str) -> str:
    return f"kueue/{namespace}/{name}"


def key_of(kind: str, obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return (kind, str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def kept(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object as stored: without managedFields and kubectl's last-applied copy of itself."""
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("managedFields", None)
    if _DROP_ANNOTATION in (meta.get("annotations") or {}):
        meta["annotations"] = {k: v for k, v in meta["annotations"].items() if k != _DROP_ANNOTATION}
    out["metadata"] = meta
    return out


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a Workload holds now (None when it holds nothing)."""

    start: dt.datetime
    gpus: float
    flavor: str
    cluster_queue: str


def reservation(obj: Mapping[str, Any]) -> Reservation | None:
    """The quota a Workload holds: its admission while ``QuotaReserved`` is true and it has not
    finished or been evicted."""
    admission = (obj.get("status") or {}).get("admission")
    if not isinstance(admission, Mapping) or not is_true(obj, "QuotaReserved"):
        return None
    if is_true(obj, "Finished") or is_true(obj, "Evicted"):
        return None
    reserved = condition(obj, "QuotaReserved") or {}
    meta = obj.get("metadata") or {}
    start = k8s_time(reserved.get("lastTransitionTime")) or k8s_time(meta.get("creationTimestamp"))
    if start is None:
        return None
    gpus, flavor = 0.0, ""
    for ps in admission.get("podSetAssignments") or ():
        usage = (ps or {}).get("resourceUsage") or {}
        if GPU_RESOURCE in usage:
            gpus += parse_quantity(usage[GPU_RESOURCE])
            flavor = flavor or str(((ps or {}).get("flavors") or {}).get(GPU_RESOURCE) or "")
    return Reservation(start, gpus, flavor, str(admission.get("clusterQueue") or ""))


def ended_at(obj: Mapping[str, Any], seen: dt.datetime) -> dt.datetime:
    """When a Workload's reservation ended: its Finished, Evicted or QuotaReserved-false condition's
    time, else its deletion, else when it was seen."""
    for kind, status in (("Finished", "True"), ("Evicted", "True"), ("QuotaReserved", "False")):
        c = condition(obj, kind)
        if c is not None and str(c.get("status")) == status:
            t = k8s_time(c.get("lastTransitionTime"))
            if t is not None:
                return t
    return k8s_time((obj.get("metadata") or {}).get("deletionTimestamp")) or seen


class KueueIndex:
    """Kueue's objects of one cluster, the Workloads by the uids of their owners, and the ledger row
    each Workload holds open."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self.objects: dict[Key, dict[str, Any]] = {}
        self._owned: dict[str, str] = {}          # owner uid -> Workload id
        self._open: dict[str, Allocation] = {}    # Workload id -> its open ledger row
        self._stored: set[Key] = set()            # live in the store (a restart): closed if not listed

    # -- the pods' side -------------------------------------------------------------------------
    def workload_of(self, uids: Iterable[str]) -> str:
        """The id of the first Workload owned by one of ``uids`` (top owner first), else ''."""
        for uid in uids:
            wid = self._owned.get(uid)
            if wid:
                return wid
        return ""

    # -- events ----------------------------------------------------------------------------------
    def remember_stored(self, keys: Iterable[Key], open_rows: Iterable[Allocation]) -> None:
        """What the store holds from before a restart: live objects (marked deleted when a list no
        longer shows them) and the open Workload rows (ended when their Workload no longer holds)."""
        self._stored.update(keys)
        for a in open_rows:
            if a.source == SOURCE and a.open and a.workload_id not in self._open:
                self._open[a.workload_id] = a

    def stored_names(self, okind: str) -> list[str]:
        """The names of the objects of that kind the store held live at start (cluster-scoped kinds)."""
        return sorted(k[2] for k in self._stored if k[0] == okind)

    def cluster_queues(self) -> list[str]:
        """The names of the ClusterQueues known now."""
        return sorted(k[2] for k in self.objects if k[0] == "ClusterQueue")

    def prime(self, kind: str, items: Iterable[Mapping[str, Any]]) -> None:
        """Fill the index without rows (a restart that resumes the watch)."""
        for obj in items:
            self._put(KUEUE_KINDS[kind], obj)

    def on_object(self, kind: str, event: str, obj: Mapping[str, Any], now: dt.datetime) -> tuple[Rows, bool]:
        """The rows of one event, and whether the owner index changed (pods to re-attribute)."""
        okind = KUEUE_KINDS[kind]
        key = key_of(okind, obj)
        rows: Rows = {}
        meta = obj.get("metadata") or {}
        deleted = event == "DELETED"
        if deleted:
            self.objects.pop(key, None)
            self._stored.discard(key)
            changed = self._drop_owned(key)
        else:
            changed = self._put(okind, obj)
        _add(rows, "kueue_objects", (now, self.cluster, okind, key[1], key[2], str(meta.get("uid") or ""),
                                     str(meta.get("resourceVersion") or ""), int(deleted),
                                     json.dumps(kept(obj), separators=(",", ":"), sort_keys=True)))
        if okind == "Workload":
            self._ledger(obj, deleted, now, rows)
        return rows, changed

    def relisted(self, kind: str, namespace: str | None, listed: set[Key], now: dt.datetime) -> tuple[Rows, bool]:
        """After a list: the objects of that kind (and namespace) known here or in the store and not
        listed were deleted meanwhile."""
        okind = KUEUE_KINDS[kind]
        rows: Rows = {}
        changed = False
        gone = {k for k in (*self.objects, *self._stored)
                if k[0] == okind and (namespace is None or k[1] == namespace) and k not in listed}
        for key in sorted(gone):
            obj = self.objects.get(key) or {"metadata": {"namespace": key[1], "name": key[2]}}
            more, moved = self.on_object(kind, "DELETED", obj, now)
            changed |= moved
            for table, rs in more.items():
                rows.setdefault(table, []).extend(rs)
        if okind == "Workload":                   # a stored open row whose Workload is gone
            for wid in sorted(w for w, a in self._open.items()
                              if (namespace is None or a.namespace == namespace)
                              and (okind, a.namespace, a.pod) not in listed):
                _add(rows, "gpu_allocations", self._close(wid, now).row())
        return rows, changed

    # -- helpers ---------------------------------------------------------------------------------
    def _put(self, okind: str, obj: Mapping[str, Any]) -> bool:
        key = key_of(okind, obj)
        self.objects[key] = kept(obj)
        if okind != "Workload":
            return False
        wid = workload_id(key[1], key[2])
        before = {u for u, w in self._owned.items() if w == wid}
        refs = {str(r.get("uid") or "") for r in (obj.get("metadata") or {}).get("ownerReferences") or ()}
        refs.discard("")
        for uid in before - refs:
            del self._owned[uid]
        for uid in refs:
            self._owned[uid] = wid
        return before != refs

    def _drop_owned(self, key: Key) -> bool:
        if key[0] != "Workload":
            return False
        wid = workload_id(key[1], key[2])
        gone = [u for u, w in self._owned.items() if w == wid]
        for uid in gone:
            del self._owned[uid]
        return bool(gone)

    def _ledger(self, obj: Mapping[str, Any], deleted: bool, now: dt.datetime, rows: Rows) -> None:
        meta = obj.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        wid = workload_id(ns, name)
        held = None if deleted else reservation(obj)
        prev = self._open.get(wid)
        if held is not None and held.gpus > 0:
            uid = f"{wid}@{round(held.start.timestamp() * 1000)}"
            if prev is not None and prev.uid != uid:                  # evicted and admitted again
                _add(rows, "gpu_allocations", self._close(wid, held.start).row())
                prev = None
            row = self._row(obj, uid, held)
            if prev is None or (prev.queue, prev.gpus, prev.gpu_model, prev.owner) != (row.queue, row.gpus,
                                                                                       row.gpu_model, row.owner):
                if prev is not None:
                    row = replace(row, version=prev.version + 1)
                self._open[wid] = row
                _add(rows, "gpu_allocations", row.row())
            return
        if prev is not None:
            _add(rows, "gpu_allocations", self._close(wid, ended_at(obj, now)).row())

    def _row(self, obj: Mapping[str, Any], uid: str, held: Reservation) -> Allocation:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        refs = sorted(meta.get("ownerReferences") or (), key=lambda r: not r.get("controller"))
        owner = refs[0] if refs else {}
        return Allocation(
            cluster=self.cluster, namespace=ns, pod=name, uid=uid, queue=str(spec.get("queueName") or ""),
            node="", gpu_model=self._model(held.flavor), gpu_resource=GPU_RESOURCE, gpus=held.gpus,
            priority=int(spec.get("priority") or 0), ray_cluster="", start=held.start, end=None,
            version=version_of(held.start, OPEN), source=SOURCE, workload_id=workload_id(ns, name),
            owner_kind=str(owner.get("kind") or ""), owner=str(owner.get("name") or ""))

    def _model(self, flavor: str) -> str:
        rf = self.objects.get(("ResourceFlavor", "", flavor))
        labels = ((rf or {}).get("spec") or {}).get("nodeLabels") or {}
        if PRODUCT_LABEL in labels:
            return str(labels[PRODUCT_LABEL])
        return str(next(iter(labels.values()))) if labels else flavor

    def _close(self, wid: str, at: dt.datetime) -> Allocation:
        a = self._open.pop(wid)
        end = max(at, a.start)
        return replace(a, end=end, version=max(version_of(end, ENDED), a.version + 1))


def _add(rows: Rows, table: str, row: tuple[Any, ...]) -> None:
    rows.setdefault(table, []).append(row)
