"""A pod's top owner and its queue, as KAI finds them: through the objects that own the pod. Pure.

KubeRay does not copy a RayJob's labels to its pods, so with Kueue the queue label sits on the
RayJob alone. The watcher keeps the KubeRay objects (``ray.io/v1`` RayCluster and RayJob) of
each cluster in an :class:`OwnerIndex` and follows, for every pod:

    pod --(ownerReferences by uid, else the ray.io/cluster label)--> RayCluster
        --(its ownerReferences of kind RayJob by uid, else the RayJob whose
           status.rayClusterName names it)--> RayJob

The chain stops at the first object not in the index. The **top owner** is the last object of
the chain; when that object (or the pod, if the chain is empty) has a controller
ownerReference gpuq does not watch (ReplicaSet, Job, StatefulSet, a RayJob not seen yet), the
top owner is that reference's kind and name. A pod without owners (and no ``ray.io/cluster``
label) is a bare pod: owner ``("", "")``.

How a pod finds its queue (:func:`resolve_queue`), first value found wins:

1. the pod, then the top owner, then the owners below it (top down). On each object:
   a. its labels, with the configured keys in order (default ``kueue.x-k8s.io/queue-name``,
      ``queue``, ``yunikorn.apache.org/queue``); where ``kueue.x-k8s.io/queue-name`` is one of
      them, Kueue's pod label ``kueue.x-k8s.io/local-queue-name`` (the LocalQueue that admitted
      the workload: the same name) is tried right after it, and Kueue's
      ``kueue.x-k8s.io/cluster-queue-name`` (the ClusterQueue) after every configured label key;
   b. its annotations, with the configured keys (default ``yunikorn.apache.org/queue``);
2. the namespace map, then the default (as before).

Kueue (v0.14+, feature gate ``AssignQueueLabelsForPods``, on by default) puts
``kueue.x-k8s.io/local-queue-name`` and ``kueue.x-k8s.io/cluster-queue-name`` on the pods of
the workloads it admits (``pkg/constants`` in kubernetes-sigs/kueue); older Kueue leaves them
off, and then the RayJob's ``kueue.x-k8s.io/queue-name`` is found through step 1.

Workload id: the ``gpuq.io/workload`` annotation (set by gpuq's Kubernetes actuator at
admission) of the top owner, else of the owners below it, else of the pod; else the Kueue Workload
that owns it (``queues_from: kueue``), else its YuniKorn application (``queues_from: yunikorn``,
``yunikorn/<namespace>/<applicationId>``); ``""`` if none.

A deleted owner stays readable for ``deleted_memory_s`` (its pods are deleted after it, and
their last rows must keep their queue).
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from collector.k8s_extract import OwnerRef, QueueLookup, owner_refs, resolve_queue

WORKLOAD_ANNOTATION = "gpuq.io/workload"
OWNER_KINDS = {"rayclusters": "RayCluster", "rayjobs": "RayJob"}   # stream kind -> object kind
_MAX_DEPTH = 8


@dataclass(frozen=True, slots=True)
class Owner:
    kind: str
    namespace: str
    name: str
    uid: str
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner_refs: tuple[OwnerRef, ...]
    ray_cluster: str = ""        # a RayJob's status.rayClusterName

    def content(self) -> tuple[Any, ...]:
        """What attribution reads (not the resourceVersion, not the status churn)."""
        return (self.kind, self.namespace, self.name, self.uid, tuple(sorted(self.labels.items())),
                tuple(sorted(self.annotations.items())), self.owner_refs, self.ray_cluster)


@dataclass(frozen=True, slots=True)
class Attribution:
    queue: str
    owner_kind: str = ""
    owner: str = ""
    workload_id: str = ""


def owner_of(kind: str, obj: Mapping[str, Any]) -> Owner:
    """A RayCluster or RayJob (``kind`` as in :data:`OWNER_KINDS` values) from the API's JSON."""
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    return Owner(kind=kind, namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
                 uid=str(meta.get("uid") or ""),
                 labels=MappingProxyType({str(k): str(v) for k, v in (meta.get("labels") or {}).items()}),
                 annotations=MappingProxyType({str(k): str(v)
                                               for k, v in (meta.get("annotations") or {}).items()}),
                 owner_refs=owner_refs(meta),
                 ray_cluster=str(status.get("rayClusterName") or "") if kind == "RayJob" else "")


class OwnerIndex:
    """The KubeRay objects of one cluster, by uid and by (kind, namespace, name). Not thread-safe."""

    def __init__(self, deleted_memory_s: float = 3600.0) -> None:
        self.deleted_memory_s = deleted_memory_s
        self._by_uid: dict[str, Owner] = {}
        self._by_name: dict[tuple[str, str, str], str] = {}       # live objects only
        self._job_of_cluster: dict[tuple[str, str], str] = {}     # (ns, rayClusterName) -> RayJob uid
        self._deleted: dict[str, dt.datetime] = {}                # uid -> when, in that order

    def __len__(self) -> int:
        return len(self._by_uid)

    def get(self, uid: str) -> Owner | None:
        return self._by_uid.get(uid)

    def put(self, owner: Owner) -> bool:
        """Add or replace; True when what attribution reads changed."""
        prev = self._by_uid.get(owner.uid)
        self._deleted.pop(owner.uid, None)
        if prev is not None and prev.ray_cluster:
            self._job_of_cluster.pop((prev.namespace, prev.ray_cluster), None)
        self._by_uid[owner.uid] = owner
        self._by_name[(owner.kind, owner.namespace, owner.name)] = owner.uid
        if owner.ray_cluster:
            self._job_of_cluster[(owner.namespace, owner.ray_cluster)] = owner.uid
        return prev is None or prev.content() != owner.content()

    def remove(self, uid: str, now: dt.datetime) -> None:
        """Deleted: no longer found by name, still by uid for ``deleted_memory_s``."""
        owner = self._by_uid.get(uid)
        if owner is None:
            return
        key = (owner.kind, owner.namespace, owner.name)
        if self._by_name.get(key) == uid:
            del self._by_name[key]
        if owner.ray_cluster and self._job_of_cluster.get((owner.namespace, owner.ray_cluster)) == uid:
            del self._job_of_cluster[(owner.namespace, owner.ray_cluster)]
        self._deleted.pop(uid, None)
        self._deleted[uid] = now
        self.forget_deleted(now)

    def relisted(self, kind: str, namespace: str | None, listed: Iterable[str], now: dt.datetime) -> None:
        """After a list of ``kind``: the objects of that kind (and namespace) not listed were deleted."""
        keep = set(listed)
        for uid, o in list(self._by_uid.items()):
            if (o.kind == kind and (namespace is None or o.namespace == namespace)
                    and uid not in keep and uid not in self._deleted):
                self.remove(uid, now)

    def forget_deleted(self, now: dt.datetime) -> None:
        horizon = now - dt.timedelta(seconds=self.deleted_memory_s)
        while self._deleted:
            uid, at = next(iter(self._deleted.items()))
            if at >= horizon:
                break
            del self._deleted[uid]
            self._by_uid.pop(uid, None)

    # -- following a pod --------------------------------------------------------------------
    def chain(self, namespace: str, refs: tuple[OwnerRef, ...], ray_cluster: str = "") -> list[Owner]:
        """The owners above a pod, nearest first (see the module docstring)."""
        out: list[Owner] = []
        link = self._follow(namespace, refs)
        if link is None and ray_cluster:
            uid = self._by_name.get(("RayCluster", namespace, ray_cluster))
            link = self._by_uid.get(uid) if uid else None
        while link is not None and len(out) < _MAX_DEPTH and link not in out:
            out.append(link)
            nxt = self._follow(link.namespace, link.owner_refs)
            if nxt is None and link.kind == "RayCluster":
                uid = self._job_of_cluster.get((link.namespace, link.name))
                nxt = self._by_uid.get(uid) if uid else None
            link = nxt
        return out

    def _follow(self, namespace: str, refs: tuple[OwnerRef, ...]) -> Owner | None:
        for ref in refs:
            got = self._by_uid.get(ref.uid)
            if got is not None and got.namespace == namespace:
                return got
        return None

    def attribute(self, namespace: str, labels: Mapping[str, str], annotations: Mapping[str, str],
                  refs: tuple[OwnerRef, ...], ray_cluster: str, lookup: QueueLookup, *, uid: str = "",
                  workload_of: Callable[[Iterable[str]], str] | None = None,
                  application: str = "") -> Attribution:
        """Queue, top owner and workload id of a pod (see the module docstring). ``workload_of``
        (``queues_from: kueue``: :meth:`collector.k8s_kueue.KueueIndex.workload_of`) names the
        Kueue Workload owned by one of the uids around the pod (top owner first, then each owner's
        references, then the pod's and the pod itself), where no gpuq annotation names one;
        ``application`` (``queues_from: yunikorn``: the workload id of the pod's YuniKorn application,
        :func:`collector.k8s_yunikorn.application_of`) is the id where neither names one."""
        chain = self.chain(namespace, refs, ray_cluster)
        kind, name = top_owner(chain, refs, ray_cluster)
        down = list(reversed(chain))                          # top owner first
        queue = resolve_queue([(labels, annotations), *((o.labels, o.annotations) for o in down)],
                              namespace, lookup)
        workload = next((m[WORKLOAD_ANNOTATION] for m in [*(o.annotations for o in down), annotations]
                         if m.get(WORKLOAD_ANNOTATION)), "")
        if not workload and workload_of is not None:
            workload = workload_of([*(o.uid for o in down), *(r.uid for o in down for r in o.owner_refs),
                                    *(r.uid for r in refs), uid])
        return Attribution(queue, kind, name, workload or application)


def top_owner(chain: list[Owner], refs: tuple[OwnerRef, ...], ray_cluster: str) -> tuple[str, str]:
    if chain:
        top = chain[-1]
        above = [r for r in top.owner_refs if r.controller]
        return (above[0].kind, above[0].name) if above else (top.kind, top.name)
    controllers = [r for r in refs if r.controller] or list(refs)
    if controllers:
        return controllers[0].kind, controllers[0].name
    return ("RayCluster", ray_cluster) if ray_cluster else ("", "")
