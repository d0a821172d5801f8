"""Pure extraction from Kubernetes Pod and Node objects (the API's JSON, as dicts).

No I/O, no clock: every function here takes the raw object (``metadata``/``spec``/``status``
exactly as the API server sends them) and returns frozen values.

GPU count of a pod
    Kubernetes' *effective request* rule, per GPU resource (``nvidia.com/gpu`` and every MIG
    resource ``nvidia.com/mig-<profile>``): ``max(sum(app containers) + sum(sidecars),
    max over init containers i of (init_i + sidecars started before i))``, where a sidecar is an
    init container with ``restartPolicy: Always``. A container's amount is its request, or its
    limit when no request is given (for extended resources the two must be equal). ``gpus`` is
    the sum over the GPU resources, as Kubernetes counts them (devices, time-sliced replicas, MIG
    slices); ``gpu_resource`` names the resource, or the sorted resources joined by ``,`` when a
    pod asks for several. ``nvidia.com/gpu.shared`` (time-slicing with ``renameByDefault``) is a
    GPU resource too. A pod of KAI-Scheduler asks through annotations instead (``gpu-fraction``,
    ``gpu-memory``): its ``gpu_resource`` is the annotation's name and its ``gpus`` the fraction
    (0 for ``gpu-memory`` until a node says how much memory its GPUs have).

GPU share of a pod (:func:`pod_share_milli`)
    What the pod holds of its node's GPUs, in milli-GPUs, rounded down (:mod:`gpuq.gpu_share`):
    each resource's count times what one unit of it is (a GPU; a MIG slice's fraction of its GPU,
    for ``nvidia.com/mig-<profile>`` and for ``nvidia.com/gpu`` on a single-strategy node) over the
    node's replicas of it (time-slicing or MPS); a KAI pod its fraction. This is what the pod is
    billed. KAI's reservation pods (label ``app: kai-resource-reservation``, or run:ai's
    ``runai-reservation``, with a ``runai-gpu-group``) hold a whole GPU through the device plugin
    for the fractional pods that share it: they hold nothing of their own (``gpus`` 0), so the GPU
    is billed once, by share.

GPU model of a node
    The ``nvidia.com/gpu.product`` label as gpu-feature-discovery publishes it. With the MIG
    *single* strategy GFD already appends ``-MIG-<profile>`` (``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb``)
    and with time-slicing ``-SHARED``; the value is kept as published (it is what
    ``GpuType.node_labels`` lists). :func:`base_gpu_model` strips the suffixes.

GPU model of a pod
    Its node's model. A pod holding MIG slices of the *mixed* strategy (``nvidia.com/mig-1g.10gb``)
    gets ``<node model>-MIG-1g.10gb``: the same name the single strategy would publish, so a MIG
    slice reads the same whichever strategy the node runs. A pod without GPUs has no model.
"""
from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from types import MappingProxyType
from typing import Any, Protocol

from gpuq import gpu_share
from gpuq.k8sobj import parse_quantity

GPU_RESOURCE = "nvidia.com/gpu"
SHARED_GPU_RESOURCE = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"
PRODUCT_LABEL = "nvidia.com/gpu.product"
MIG_STRATEGY_LABEL = "nvidia.com/mig.strategy"
MIG_CONFIG_LABEL = "nvidia.com/mig.config"
RAY_CLUSTER_LABEL = "ray.io/cluster"
RAY_NODE_TYPE_LABEL = "ray.io/node-type"
RAY_GROUP_LABEL = "ray.io/group"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_LOCAL_QUEUE_LABEL = "kueue.x-k8s.io/local-queue-name"      # Kueue's pod labels
KUEUE_CLUSTER_QUEUE_LABEL = "kueue.x-k8s.io/cluster-queue-name"
TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
RESERVATION_APPS = frozenset({"kai-resource-reservation", "runai-reservation"})   # label app
GPU_GROUP_LABEL = "runai-gpu-group"

_EMPTY: Mapping[str, Any] = MappingProxyType({})
_MIG_SUFFIX = re.compile(r"-MIG-(\d+g\.\d+gb(?:\+me)?)$")

class QueueLookup(Protocol):
    """How a pod finds its queue. ``accounting.queues.QueueMapping`` has this shape; the collector
    does not import accounting, so the runner passes that object (or a :class:`QueueKeys`)."""

    @property
    def labels(self) -> tuple[str, ...]: ...
    @property
    def annotations(self) -> tuple[str, ...]: ...
    @property
    def namespaces(self) -> Mapping[str, str]: ...
    @property
    def default(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """The default queue lookup (the same defaults as ``accounting.queues.QueueMapping``)."""

    labels: tuple[str, ...] = ("kueue.x-k8s.io/queue-name", "queue", "yunikorn.apache.org/queue")
    annotations: tuple[str, ...] = ("yunikorn.apache.org/queue",)
    namespaces: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    default: str | None = None


@dataclass(frozen=True, slots=True)
class OwnerRef:
    kind: str
    name: str
    uid: str
    controller: bool = False


@dataclass(frozen=True, slots=True)
class GpuRequest:
    gpus: float = 0.0
    resource: str = ""                    # "" when the pod holds no GPU
    per_resource: tuple[tuple[str, float], ...] = ()    # effective request per GPU resource, sorted


@dataclass(frozen=True, slots=True)
class PodInfo:
    namespace: str
    name: str
    uid: str
    resource_version: str
    phase: str
    node: str                             # spec.nodeName, "" while unscheduled
    gpus: float
    gpu_resource: str
    queue: str
    priority: int
    ray_cluster: str
    ray_node_type: str
    ray_group: str
    created_at: dt.datetime | None
    scheduled_at: dt.datetime | None      # PodScheduled=True lastTransitionTime
    started_at: dt.datetime | None        # status.startTime
    finished_at: dt.datetime | None       # last finishedAt once every container terminated
    deleted_at: dt.datetime | None        # metadata.deletionTimestamp
    labels: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    annotations: Mapping[str, str] = field(default_factory=lambda: _EMPTY)
    owner_refs: tuple[OwnerRef, ...] = ()  # controller first
    gpu_requests: tuple[tuple[str, float], ...] = ()    # effective request per GPU resource
    scheduler_name: str = ""              # spec.schedulerName ("yunikorn": YuniKorn's pod)

    @property
    def terminal(self) -> bool:
        return self.phase in TERMINAL_PHASES

    @property
    def asks_gpus(self) -> bool:
        """Holds GPUs once bound: GPU resources, or a KAI fraction (``gpu-memory`` included)."""
        return self.gpus > 0 or self.gpu_resource in (gpu_share.KAI_FRACTION, gpu_share.KAI_MEMORY)


@dataclass(frozen=True, slots=True)
class NodeInfo:
    name: str
    uid: str
    resource_version: str
    ready: bool
    unschedulable: bool
    gpu_model: str                        # nvidia.com/gpu.product as published, "" if absent
    mig_strategy: str                     # "single", "mixed" or "none"
    mig_config: str                       # nvidia.com/mig.config, "" if absent
    gpu_capacity: float
    gpu_allocatable: float
    mig_resources: Mapping[str, float]    # allocatable nvidia.com/mig-* by resource name
    labels: Mapping[str, str]

    def content(self) -> tuple[Any, ...]:
        """What a node event records, without the resource version (to skip heartbeats)."""
        return (self.uid, self.ready, self.unschedulable, self.gpu_model, self.gpu_capacity,
                self.gpu_allocatable, tuple(sorted(self.mig_resources.items())),
                tuple(sorted(self.labels.items())))


# -- scalars --------------------------------------------------------------------------------
def parse_time(value: Any) -> dt.datetime | None:
    """An RFC 3339 API timestamp as an aware UTC datetime (None when absent)."""
    if not value:
        return None
    t = dt.datetime.fromisoformat(str(value))
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.astimezone(dt.UTC)


def is_gpu_resource(name: str) -> bool:
    return name in (GPU_RESOURCE, SHARED_GPU_RESOURCE) or name.startswith(MIG_PREFIX)


# -- pods -----------------------------------------------------------------------------------
def _container_gpus(container: Mapping[str, Any]) -> dict[str, float]:
    res = container.get("resources") or {}
    requests = res.get("requests") or {}
    limits = res.get("limits") or {}
    out: dict[str, float] = {}
    for name in set(requests) | set(limits):
        if is_gpu_resource(name):
            raw = requests[name] if name in requests else limits[name]
            out[name] = parse_quantity(raw)
    return out


def effective_gpus(spec: Mapping[str, Any]) -> dict[str, float]:
    """Effective GPU requests of a pod spec, per resource (see the module docstring)."""
    app: dict[str, float] = {}
    for c in spec.get("containers") or ():
        for r, n in _container_gpus(c).items():
            app[r] = app.get(r, 0.0) + n
    sidecars: dict[str, float] = {}
    init_peak: dict[str, float] = {}
    for c in spec.get("initContainers") or ():
        amounts = _container_gpus(c)
        if c.get("restartPolicy") == "Always":       # a sidecar keeps running
            for r, n in amounts.items():
                sidecars[r] = sidecars.get(r, 0.0) + n
                init_peak[r] = max(init_peak.get(r, 0.0), sidecars[r])
        else:
            for r in set(amounts) | set(sidecars):
                peak = amounts.get(r, 0.0) + sidecars.get(r, 0.0)
                init_peak[r] = max(init_peak.get(r, 0.0), peak)
    out: dict[str, float] = {}
    for r in set(app) | set(sidecars) | set(init_peak):
        n = max(app.get(r, 0.0) + sidecars.get(r, 0.0), init_peak.get(r, 0.0))
        if n > 0:
            out[r] = n
    return out


def pod_gpu_request(spec: Mapping[str, Any], annotations: Mapping[str, str] | None = None,
                    labels: Mapping[str, str] | None = None) -> GpuRequest:
    """The pod's GPU resources; else its KAI annotations; nothing for a KAI reservation pod."""
    if labels is not None and is_reservation_pod(labels):
        return GpuRequest()
    per = effective_gpus(spec)
    if per:
        return GpuRequest(gpus=sum(per.values()), resource=",".join(sorted(per)),
                          per_resource=tuple(sorted(per.items())))
    ann = annotations or {}
    for key in (gpu_share.KAI_FRACTION, gpu_share.KAI_MEMORY):
        if ann.get(key):
            milli = gpu_share.kai_fraction_milli(ann) if key == gpu_share.KAI_FRACTION else None
            return GpuRequest(gpus=(milli or 0) / gpu_share.MILLI, resource=key)
    return GpuRequest()


def is_reservation_pod(labels: Mapping[str, str]) -> bool:
    """KAI's (or run:ai's) pod that holds a GPU for the fractional pods sharing it."""
    return labels.get("app", "") in RESERVATION_APPS and GPU_GROUP_LABEL in labels


def pod_share_milli(pod: PodInfo, node: NodeInfo | None) -> int:
    """Milli-GPUs the pod holds of its node's GPUs (see the module docstring); ``node`` None (not
    seen yet): MIG slices of a GPU of 7 compute slices, no replicas, no ``gpu-memory`` share."""
    labels: Mapping[str, str] = node.labels if node is not None else _EMPTY
    if pod.gpu_resource in (gpu_share.KAI_FRACTION, gpu_share.KAI_MEMORY):
        return gpu_share.kai_fraction_milli(pod.annotations, labels) or 0
    model = node.gpu_model if node is not None else ""
    total = Fraction(0)
    for resource, count in pod.gpu_requests:
        unit = Fraction(1)
        if resource.startswith(MIG_PREFIX):
            profile = resource[len(MIG_PREFIX):].removesuffix(gpu_share.SHARED_SUFFIX)
        else:
            profile = gpu_share.mig_profile_of(model)        # a single-strategy node's slices
        if profile:
            try:
                unit = gpu_share.mig_fraction(gpu_share.base_model(model), profile)
            except ValueError:
                unit = Fraction(1)                           # not a profile gpuq can read: a GPU
        total += Fraction(count) * unit / gpu_share.replicas(labels, resource)
    return gpu_share.milli_floor(total)


def pod_queue(labels: Mapping[str, str], annotations: Mapping[str, str], namespace: str,
              lookup: QueueLookup) -> str:
    """The pod's own queue: label keys, then annotation keys, then the namespace map, then the
    default (:func:`resolve_queue` over the pod alone)."""
    return resolve_queue([(labels, annotations)], namespace, lookup)


def owner_refs(meta: Mapping[str, Any]) -> tuple[OwnerRef, ...]:
    """``metadata.ownerReferences``, the controller first."""
    refs = [OwnerRef(str(r.get("kind") or ""), str(r.get("name") or ""), str(r.get("uid") or ""),
                     bool(r.get("controller"))) for r in meta.get("ownerReferences") or ()]
    return tuple(sorted(refs, key=lambda r: not r.controller))


def queue_label_keys(lookup: QueueLookup) -> tuple[str, ...]:
    """The label keys tried on each object, in order (Kueue's pod labels added, see above)."""
    keys: list[str] = []
    for key in lookup.labels:
        keys.append(key)
        if key == KUEUE_QUEUE_LABEL:
            keys.append(KUEUE_LOCAL_QUEUE_LABEL)
    if KUEUE_QUEUE_LABEL in lookup.labels:
        keys.append(KUEUE_CLUSTER_QUEUE_LABEL)
    return tuple(dict.fromkeys(keys))


def resolve_queue(objects: Iterable[tuple[Mapping[str, str], Mapping[str, str]]], namespace: str,
                  lookup: QueueLookup) -> str:
    """The first queue named by ``(labels, annotations)`` of ``objects`` in order, then the
    namespace map, then the default."""
    label_keys = queue_label_keys(lookup)
    for labels, annots in objects:
        for key in label_keys:
            if labels.get(key):
                return labels[key]
        for key in lookup.annotations:
            if annots.get(key):
                return annots[key]
    if namespace in lookup.namespaces:
        return lookup.namespaces[namespace]
    return lookup.default or ""


def _condition_time(status: Mapping[str, Any], kind: str) -> dt.datetime | None:
    for cond in status.get("conditions") or ():
        if cond.get("type") == kind and cond.get("status") == "True":
            return parse_time(cond.get("lastTransitionTime"))
    return None


def _finished_at(status: Mapping[str, Any]) -> dt.datetime | None:
    statuses = list(status.get("containerStatuses") or ())
    if not statuses:
        return None
    ends: list[dt.datetime] = []
    for cs in statuses:
        term = (cs.get("state") or {}).get("terminated")
        t = parse_time(term.get("finishedAt")) if term else None
        if t is None:
            return None                               # a container still runs (or never ran)
        ends.append(t)
    return max(ends)


def pod_info(obj: Mapping[str, Any], lookup: QueueLookup | None = None) -> PodInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    namespace = meta.get("namespace") or ""
    req = pod_gpu_request(spec, annotations, labels)
    return PodInfo(
        namespace=namespace,
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        resource_version=str(meta.get("resourceVersion") or ""),
        phase=status.get("phase") or "",
        node=spec.get("nodeName") or "",
        gpus=req.gpus,
        gpu_resource=req.resource,
        queue=pod_queue(labels, annotations, namespace, lookup or QueueKeys()),
        priority=int(spec.get("priority") or 0),
        ray_cluster=labels.get(RAY_CLUSTER_LABEL, ""),
        ray_node_type=labels.get(RAY_NODE_TYPE_LABEL, ""),
        ray_group=labels.get(RAY_GROUP_LABEL, ""),
        created_at=parse_time(meta.get("creationTimestamp")),
        scheduled_at=_condition_time(status, "PodScheduled"),
        started_at=parse_time(status.get("startTime")),
        finished_at=_finished_at(status),
        deleted_at=parse_time(meta.get("deletionTimestamp")),
        labels=MappingProxyType({str(k): str(v) for k, v in labels.items()}),
        annotations=MappingProxyType({str(k): str(v) for k, v in annotations.items()}),
        owner_refs=owner_refs(meta),
        gpu_requests=req.per_resource,
        scheduler_name=str(spec.get("schedulerName") or ""),
    )


def pod_gpu_model(pod: PodInfo, node_model: str) -> str:
    """The model of what the pod holds: its node's, with the MIG profile for mixed-strategy slices."""
    if not pod.asks_gpus or not node_model:
        return ""
    migs = [r for r in pod.gpu_resource.split(",") if r.startswith(MIG_PREFIX)]
    if len(migs) == 1 and pod.gpu_resource == migs[0] and not gpu_share.mig_profile_of(node_model):
        return f"{node_model}-MIG-{migs[0][len(MIG_PREFIX):].removesuffix(gpu_share.SHARED_SUFFIX)}"
    return node_model


# -- nodes ----------------------------------------------------------------------------------
def base_gpu_model(product: str) -> str:
    """``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`` and ``...-SHARED`` -> ``NVIDIA-A100-SXM4-40GB``."""
    product = product.removesuffix("-SHARED")
    return _MIG_SUFFIX.sub("", product)


def mig_strategy(labels: Mapping[str, str], mig_resources: Iterable[str]) -> str:
    declared = labels.get(MIG_STRATEGY_LABEL, "")
    if declared in ("single", "mixed", "none"):
        return declared
    if any(True for _ in mig_resources):
        return "mixed"
    product = labels.get(PRODUCT_LABEL, "")
    return "single" if _MIG_SUFFIX.search(product.removesuffix("-SHARED")) else "none"


def node_info(obj: Mapping[str, Any]) -> NodeInfo:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    capacity = status.get("capacity") or {}
    allocatable = status.get("allocatable") or {}
    migs = {r: parse_quantity(v) for r, v in (allocatable or capacity).items() if r.startswith(MIG_PREFIX)}
    gpus = (GPU_RESOURCE, SHARED_GPU_RESOURCE)
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or ())
    return NodeInfo(
        name=meta.get("name") or "",
        uid=meta.get("uid") or "",
        resource_version=str(meta.get("resourceVersion") or ""),
        ready=ready,
        unschedulable=bool(spec.get("unschedulable", False)),
        gpu_model=labels.get(PRODUCT_LABEL, ""),
        mig_strategy=mig_strategy(labels, migs),
        mig_config=labels.get(MIG_CONFIG_LABEL, ""),
        gpu_capacity=sum(parse_quantity(capacity.get(r, 0)) for r in gpus),
        gpu_allocatable=sum(parse_quantity(allocatable.get(r, 0)) for r in gpus),
        mig_resources=MappingProxyType(dict(sorted(migs.items()))),
        labels=MappingProxyType(labels),
    )
