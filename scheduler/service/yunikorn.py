"""``gpuq serve`` with ``queues_from: yunikorn``: gpuq advises, YuniKorn acts (docs/YUNIKORN.md, "Live
mode").

The Kubernetes collector stores YuniKorn's ``yunikorn-configs`` and ``yunikorn-defaults`` ConfigMaps
and its pending pods as they change (``kueue_objects``, kinds ``ConfigMap`` and ``Pod``:
:mod:`collector.k8s_yunikorn`); this module reads them back from the store:

* :class:`YuniKornQueues` is the queue tree's source in place of the queue file, through the same
  reload path as Kueue's (:class:`scheduler.service.kueue.KueueQueues`: offered to the scheduler, the
  last good tree kept on an error, which names the ConfigMap and the field). The ``queues.yaml`` of
  ``yunikorn-configs``, else of ``yunikorn-defaults`` (YuniKorn's shim merges the two, the first
  winning key by key), is imported with :func:`accounting.queue_import.yunikorn.from_yunikorn` (the
  rules of ``gpuq import-queues yunikorn``), the partition ``yunikorn.partition``. Neither holding
  one: the root alone (YuniKorn then runs its built-in default, a root queue that takes everything).
* :class:`YuniKornApplications` shows YuniKorn's pending applications as pending workloads in
  ``/workloads`` and ``gpuq explain`` (after gpuq's own) (their GPUs are their queue's ``pending``
  in ``/queues`` already: the accounting counts pending GPU pods): one workload per application (``yunikorn/<namespace>/<applicationId>``; a
  pod naming no application is one alone, ``yunikorn/<namespace>/<pod>``), its pods the pending ones
  stored, its queue the one its pods name (YuniKorn's queue label, annotation or ``queue`` label)
  as the accounting resolves it (the namespace's own queue where none is named), its reason
  YuniKorn's own: the ``PodScheduled`` condition YuniKorn sets (``reason_code``
  ``yunikorn_SchedulingSkipped`` when its queue's quota is used up, ``yunikorn_Unschedulable``
  when no node fits; ``yunikorn_NotAttempted`` before it tried), and a position among the pending
  applications of its queue (priority, then the oldest pod's creation). Running applications are
  not listed here: their pods count in the ledger as one workload each (the collector gives them the
  application's id). Each pending application also gets gpuq's advice and forecast, as Kueue's
  Workloads do (:meth:`KueueWorkloads.advise`): one gang of its pending pods asking GPUs
  (:func:`gang`), on whole-GPU node types; the running applications that are one foreign group
  each are the victims it may name (:meth:`YuniKornApplications.running`).
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from accounting.queue_import.report import Imported
from gpuq.k8sobj import k8s_seconds
from scheduler.model import Workload, gpus_out
from scheduler.service.kueue import GPU, KueueQueues, KueueWorkloads, Reader, _exact, _gpus_of
from scheduler.service.views import PENDING, WorkloadView

log = logging.getLogger(__name__)

CONFIGMAPS = ("yunikorn-configs", "yunikorn-defaults")      # the first one holding queues.yaml wins
QUEUES_KEY = "queues.yaml"
PREFIX = "yunikorn/"
APP_ID_KEYS = (("label", "yunikorn.apache.org/app-id"), ("annotation", "yunikorn.apache.org/app-id"),
               ("label", "applicationId"), ("label", "spark-app-selector"))       # the shim's order
QUEUE_KEYS = (("label", "yunikorn.apache.org/queue"), ("annotation", "yunikorn.apache.org/queue"),
              ("label", "queue"))


class YuniKornQueues(KueueQueues):
    """The queue tree from YuniKorn's stored ConfigMaps (the module's first point)."""

    kinds = ("ConfigMap",)
    scheduler = "yunikorn"

    def __init__(self, read: Reader, namespace: str = "yunikorn", partition: str = "default") -> None:
        super().__init__(read)
        self.namespace = namespace
        self.partition = partition
        self.path = f"YuniKorn's ConfigMaps {' / '.join(CONFIGMAPS)} (namespace {namespace}, kueue_objects)"

    def _import(self, objects: list[dict[str, Any]]) -> Any:
        from accounting.queue_import.yunikorn import from_yunikorn

        by_name = {str((o.get("metadata") or {}).get("name") or ""): o for o in objects
                   if (o.get("metadata") or {}).get("namespace") == self.namespace}
        for name in CONFIGMAPS:
            cm = by_name.get(name)
            if cm is not None and QUEUES_KEY in (cm.get("data") or {}):
                return from_yunikorn(cm, partition=self.partition, source=f"namespace {self.namespace}")
        log.warning("yunikorn: no %s in ConfigMap %s of namespace %s: the queue tree is the root alone",
                    QUEUES_KEY, " nor ".join(CONFIGMAPS), self.namespace)
        return Imported(data={}, origins={}, findings=())


# -- the pending applications -----------------------------------------------------------------------
def _first(meta: Mapping[str, Any], keys: Iterable[tuple[str, str]]) -> str:
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    for where, key in keys:
        got = (labels if where == "label" else notes).get(key)
        if got:
            return str(got)
    return ""


def pod_gpus(pod: Mapping[str, Any]) -> float:
    """GPUs a pod asks for: its containers' ``nvidia.com/gpu`` (requests, else limits) summed, or
    the largest init container's when more."""
    def of(c: Mapping[str, Any]) -> float:
        res = c.get("resources") or {}
        return _gpus_of((res.get("requests") or {}).get(GPU, (res.get("limits") or {}).get(GPU, 0)))

    spec = pod.get("spec") or {}
    return max(sum(of(c) for c in spec.get("containers") or ()),
               max((of(c) for c in spec.get("initContainers") or ()), default=0.0))


def pending_reason(pods: Iterable[Mapping[str, Any]]) -> tuple[str, str]:
    """YuniKorn's reason an application waits: the ``PodScheduled`` condition it set on its pods
    (``SchedulingSkipped``: its queue's quota is used up; ``Unschedulable``: no node fits), the
    first pod's that has one; ``yunikorn_NotAttempted`` when none has."""
    for pod in pods:
        for c in (pod.get("status") or {}).get("conditions") or ():
            if (c or {}).get("type") == "PodScheduled" and str(c.get("status")) == "False":
                reason = str(c.get("reason") or "Unschedulable")
                return f"yunikorn_{reason}", f"YuniKorn: {c.get('message') or reason}"
    return "yunikorn_NotAttempted", "YuniKorn: not tried yet (no PodScheduled condition on its pods)"


def build(pods: Iterable[Mapping[str, Any]], queue_of: Callable[[str, str, str], str],
          ) -> tuple[dict[str, WorkloadView], dict[str, Workload | str]]:
    """Views (by id) of the pending applications, and each as the advisor's pending workload (or why
    it cannot be one): pure, the module's rules."""
    groups: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for pod in pods:
        meta = pod.get("metadata") or {}
        ns, app = str(meta.get("namespace") or ""), _first(meta, APP_ID_KEYS)
        if app == f"yunikorn-{ns}-autogen" or app.endswith("-uniqueautogen"):     # generated: no application
            app = ""
        groups.setdefault((ns, app or f"pod/{meta.get('name', '?')}"), []).append(pod)
    rows = []
    for (ns, app), members in groups.items():
        members.sort(key=lambda p: (k8s_seconds((p.get("metadata") or {}).get("creationTimestamp")) or 0.0,
                                    str((p.get("metadata") or {}).get("name"))))
        first = members[0].get("metadata") or {}
        raw = next((q for q in (_first(p.get("metadata") or {}, QUEUE_KEYS) for p in members) if q), "")
        queue = queue_of(ns, raw, "")
        created = k8s_seconds(first.get("creationTimestamp")) or 0.0
        priority = max(int((p.get("spec") or {}).get("priority") or 0) for p in members)
        rows.append((ns, app, members, raw, queue, created, priority))
    order: dict[str, list[tuple[int, float, str]]] = {}
    for ns, app, _, _, queue, created, priority in rows:
        order.setdefault(queue, []).append((-priority, created, f"{ns}/{app}"))
    position = {key: i for lst in order.values() for i, (_, _, key) in enumerate(sorted(lst), 1)}
    views: dict[str, WorkloadView] = {}
    asks: dict[str, Workload | str] = {}
    for ns, app, members, raw, queue, created, priority in rows:
        wid = f"{PREFIX}{ns}/{app.removeprefix('pod/')}"
        gpus = sum(pod_gpus(p) for p in members)
        shape = gang(members)
        if not isinstance(shape, str) or shape != NO_GPUS:
            asks[wid] = shape if isinstance(shape, str) else Workload(
                wid, queue, pods=shape[0], gpus_per_pod=_exact(shape[1]), priority=priority, submit_s=created)
        first = members[0].get("metadata") or {}
        refs = sorted(first.get("ownerReferences") or (), key=lambda r: not r.get("controller"))
        owner = refs[0] if refs else {}
        code, message = pending_reason(members)
        names = ", ".join(str((p.get("metadata") or {}).get("name")) for p in members[:5])
        views[wid] = WorkloadView(
            id=wid, queue=queue, state=PENDING, pods=len(members),
            gpus_per_pod=gpus_out(gpus / len(members)), gpus=gpus_out(gpus), gpu_types=(), priority=priority,
            preemptible=True, submit_s=created, duration_s=None, start_s=None, end_s=None, gpu_type=None,
            placement=None, reason_code=code, message=message, position=position[f"{ns}/{app}"], preempted=0,
            idle=False, position_source="computed",      # YuniKorn's REST API is not read
            target={"kind": str(owner.get("kind") or "Pod"), "namespace": ns,
                    "name": str(owner.get("name") or first.get("name") or ""),
                    "application": "" if app.startswith("pod/") else app, "scheduler": "yunikorn"},
            actuator_message=f"YuniKorn queue {raw or '(its placement rules)'}: {len(members)} pods pending "
                             f"({names}{', ...' if len(members) > 5 else ''})")
    return views, asks


NO_GPUS = "it asks no GPUs"


def gang(pods: Iterable[Mapping[str, Any]]) -> tuple[int, float] | str:
    """A pending application as one of gpuq's gangs: (pods, GPUs per pod) of its pending pods that
    ask GPUs, or why it cannot be one (pods asking different GPUs are not one uniform gang). Only
    the pods still pending count: the application's pods YuniKorn placed already run (the ledger's
    work of its workload id), and what waits is the rest."""
    sizes: dict[float, int] = {}
    for p in pods:
        g = pod_gpus(p)
        if g > 0:
            sizes[g] = sizes.get(g, 0) + 1
    if len(sizes) > 1:
        return ("its pending pods ask different GPUs (" + ", ".join(f"{n} x {g:g}" for g, n in sorted(sizes.items()))
                + "); gpuq's gangs are uniform")
    if not sizes:
        return NO_GPUS
    (per, n), = sizes.items()
    return n, per


class YuniKornApplications(KueueWorkloads):
    """The stored pending pods as pending applications (the module's second point); the interface
    of :class:`~scheduler.service.kueue.KueueWorkloads` (``service.external``); no pending demand of its
    own: the pods are pending pods, which the accounting counts already."""

    def refresh(self) -> None:
        try:
            pods = self._read(("Pod",))
        except Exception as exc:  # noqa: BLE001 - keep the last views
            log.warning("cannot read YuniKorn's pending pods from the store: %s", exc)
            return
        views, asks = build(pods, self._queue_of)
        with self._lock:
            self._views, self._asks = views, asks
            self._advice = {wid: a for wid, a in self._advice.items() if wid in asks}
            self._eta = {wid: e for wid, e in self._eta.items() if wid in asks}

    scheduler = "YuniKorn"

    def running(self, service: Any) -> dict[str, int]:
        """The running applications the advice may name as victims (YuniKorn preempts too): each
        foreign running group that is exactly one application's pods (workload id
        ``yunikorn/<namespace>/<application>``), with its pods' priority."""
        snap, ids = service.advice_input()
        out: dict[str, int] = {}
        for r in snap.running:
            names = ids.get(r.workload.id, ())
            if len(names) == 1 and names[0].startswith(PREFIX):
                out[names[0]] = r.workload.priority
        return out

    def shaped(self, service: Any, asks: Mapping[str, Workload | str]) -> Mapping[str, Workload | str]:
        """Pods asking ``nvidia.com/gpu`` run on whole GPUs: the advice places them on the node
        types that are not MIG slices (a MIG node offers its slices under other resource names)."""
        from gpuq.gpu_share import mig_slice_milli

        snap, _ = service.advice_input()
        whole = tuple(sorted({n.gpu_type for n in snap.cluster.nodes if not mig_slice_milli(n.gpu_type)}))
        return {wid: a if isinstance(a, str) or a.gpu_types else dataclasses.replace(a, gpu_types=whole)
                for wid, a in asks.items()}

    def finished(self) -> list[tuple[Workload, float]]:
        return []               # running applications are not followed here: nothing learnt of their times
