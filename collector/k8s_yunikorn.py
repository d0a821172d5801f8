"""YuniKorn as the Kubernetes watcher follows it (``queues_from: yunikorn``). Pure, not thread-safe
(the watcher calls it under its lock), read only: gpuq never writes YuniKorn's objects.

* **The queue configuration**: the ``yunikorn-configs`` and ``yunikorn-defaults`` ConfigMaps of
  YuniKorn's namespace (``yunikorn.namespace``, default ``yunikorn``), each watched alone (a field
  selector on its name, so the collector's Role can name them). YuniKorn's shim reads the two merged,
  ``yunikorn-configs`` winning key by key (``FlattenConfigMaps`` in apache/yunikorn-k8shim); each is
  stored as it is now, one ``kueue_objects`` row (``kind = 'ConfigMap'``; the table holds the objects
  of the scheduler gpuq follows), and ``gpuq serve`` builds the queue tree from their
  ``queues.yaml`` (:mod:`scheduler.service.yunikorn`).
* **Applications**: a YuniKorn pod (``spec.schedulerName: yunikorn``) belongs to the application its
  ``yunikorn.apache.org/app-id`` label, its ``yunikorn.apache.org/app-id`` annotation, its
  ``applicationId`` label or its ``spark-app-selector`` label names, in that order (the shim's
  ``GetApplicationIDFromPod``). Its workload id is ``yunikorn/<namespace>/<application>`` (where no
  ``gpuq.io/workload`` annotation names one), so the ledger counts the pods of one application as one
  workload. The ids YuniKorn's admission controller generates (``yunikorn-<namespace>-autogen``: every
  pod of the namespace without an id; ``...-uniqueautogen``: the pod alone) name no application: such
  pods keep their own identity.
* **Pending pods**: a YuniKorn pod that is ``Pending`` and not bound to a node is stored (``kind =
  'Pod'``, only what the views read: labels, YuniKorn's annotations, owners, GPU requests, priority,
  the ``PodScheduled`` condition with YuniKorn's reason) and marked deleted once it is bound, ends or
  goes, so that ``gpuq serve`` shows YuniKorn's pending applications as pending workloads with its
  reason (:class:`scheduler.service.yunikorn.YuniKornApplications`).
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterable, Mapping
from typing import Any

from collector.k8s_extract import PodInfo
from collector.k8s_kueue import Key, kept, key_of

SCHEDULER_NAME = "yunikorn"
CONFIGMAPS = ("yunikorn-configs", "yunikorn-defaults")       # the shim's ConfigMapName, DefaultConfigMapName
APP_ID_LABEL = "yunikorn.apache.org/app-id"
APP_ID_ANNOTATION = "yunikorn.apache.org/app-id"
APP_ID_LABELS_AFTER = ("applicationId", "spark-app-selector")
PREFIX = "yunikorn/"
Rows = dict[str, list[tuple[Any, ...]]]
_KEEP_ANNOTATIONS = ("yunikorn.apache.org/", "gpuq.io/")


def application_of(pod: PodInfo) -> str:
    """The YuniKorn application a pod belongs to ('' when it is not YuniKorn's or names none; the
    generated ids name none: the module docstring)."""
    if pod.scheduler_name != SCHEDULER_NAME:
        return ""
    app = pod.labels.get(APP_ID_LABEL) or pod.annotations.get(APP_ID_ANNOTATION) or ""
    for key in APP_ID_LABELS_AFTER:
        app = app or pod.labels.get(key, "")
    if app == f"yunikorn-{pod.namespace}-autogen" or app.endswith("-uniqueautogen"):
        return ""
    return app


def workload_id(namespace: str, application: str) -> str:
    return f"{PREFIX}{namespace}/{application}"


def pending_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What is stored of a pending pod (the views read nothing else)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}

    def resources(cs: Any) -> list[dict[str, Any]]:
        return [{"resources": (c or {}).get("resources") or {}} for c in cs or ()]

    return {
        "kind": "Pod",
        "metadata": {k: meta[k] for k in ("name", "namespace", "uid", "creationTimestamp", "labels",
                                          "ownerReferences") if meta.get(k)}
                    | ({"annotations": notes} if (notes := {k: v for k, v in (meta.get("annotations") or {}).items()
                                                             if k.startswith(_KEEP_ANNOTATIONS)}) else {}),
        "spec": {"schedulerName": spec.get("schedulerName"), "priority": spec.get("priority"),
                 "containers": resources(spec.get("containers")),
                 "initContainers": resources(spec.get("initContainers"))},
        "status": {"phase": status.get("phase"),
                   "conditions": [c for c in status.get("conditions") or () if (c or {}).get("type") == "PodScheduled"]},
    }


def is_pending(pod: PodInfo) -> bool:
    return (pod.scheduler_name == SCHEDULER_NAME and pod.phase == "Pending" and not pod.node
            and pod.deleted_at is None)


class YuniKornIndex:
    """YuniKorn's ConfigMaps and pending pods of one cluster as stored (the module's rules)."""

    def __init__(self, cluster: str, namespace: str = "yunikorn") -> None:
        self.cluster = cluster
        self.namespace = namespace
        self._live: dict[Key, str] = {}          # stored live: key -> the JSON stored (unchanged: no row)

    def remember_stored(self, keys: Iterable[Key]) -> None:
        """What the store holds live from before a restart (marked deleted when a list no longer
        shows it)."""
        for key in keys:
            if key[0] in ("ConfigMap", "Pod"):
                self._live.setdefault(key, "")

    # -- ConfigMaps ------------------------------------------------------------------------------
    def on_configmap(self, event: str, obj: Mapping[str, Any], now: dt.datetime) -> Rows:
        return self._put(key_of("ConfigMap", obj), None if event == "DELETED" else kept(obj), obj, now)

    def configmaps_relisted(self, name: str, listed: set[Key], now: dt.datetime) -> Rows:
        key = ("ConfigMap", self.namespace, name)
        if key in listed or key not in self._live:
            return {}
        return self._put(key, None, {"metadata": {"namespace": key[1], "name": key[2]}}, now)

    # -- pods --------------------------------------------------------------------------------------
    def on_pod(self, event: str, obj: Mapping[str, Any], pod: PodInfo, now: dt.datetime) -> Rows:
        key = ("Pod", pod.namespace, pod.name)
        if event != "DELETED" and is_pending(pod):
            return self._put(key, pending_view(obj), obj, now)
        return self._put(key, None, obj, now) if key in self._live else {}

    def pods_relisted(self, namespace: str | None, listed: set[Key], now: dt.datetime) -> Rows:
        rows: Rows = {}
        for key in sorted(k for k in self._live if k[0] == "Pod" and (namespace is None or k[1] == namespace)
                          and k not in listed):
            for table, rs in self._put(key, None, {"metadata": {"namespace": key[1], "name": key[2]}}, now).items():
                rows.setdefault(table, []).extend(rs)
        return rows

    # -- helpers -----------------------------------------------------------------------------------
    def _put(self, key: Key, stored: dict[str, Any] | None, obj: Mapping[str, Any], now: dt.datetime) -> Rows:
        meta = obj.get("metadata") or {}
        text = json.dumps(stored, separators=(",", ":"), sort_keys=True) if stored is not None else ""
        if stored is None:
            if self._live.pop(key, None) is None and key[0] == "Pod":
                return {}
        elif self._live.get(key) == text:
            return {}
        else:
            self._live[key] = text
        return {"kueue_objects": [(now, self.cluster, key[0], key[1], key[2], str(meta.get("uid") or ""),
                                   str(meta.get("resourceVersion") or ""), int(stored is None),
                                   text or json.dumps(kept(obj) if key[0] == "ConfigMap" else pending_view(obj),
                                                      separators=(",", ":"), sort_keys=True))]}
