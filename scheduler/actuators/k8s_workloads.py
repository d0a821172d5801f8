"""Where the ``kubernetes`` actuator's workloads come from: suspended KubeRay objects with a queue.

:class:`KubernetesWorkloadSource` lists ``RayJob`` and ``RayCluster`` objects (``ray.io/v1``,
paged, every namespace or the target's namespaces) and maps each that carries a queue (the first
of ``queue_labels``, then ``queue_annotations``; Kueue's ``kueue.x-k8s.io/queue-name`` and
YuniKorn's ``queue`` / ``yunikorn.apache.org/queue`` by default) to a ``(Workload, Target)`` pair:
:meth:`~KubernetesWorkloadSource.pending` the suspended ones, :meth:`~KubernetesWorkloadSource.admitted`
the ones gpuq admitted (``gpuq.io/admission``), so a restarted service finds its running work.
Objects being deleted, or cancelled by gpuq (``gpuq.io/cancelled``), are left out; objects with a
queue that cannot be mapped are left out with their reason in :attr:`~KubernetesWorkloadSource.skipped`.

The mapping (:func:`workload_of`). The scheduler's Workload is one pod set (``pods`` x
``gpus_per_pod`` of one type); a Ray cluster is a head plus worker groups. So:

* **the gang is the pods that request GPUs**: every worker group and the head when it requests
  GPUs (a head with 0 GPUs, the usual case, is not a GPU pod: it needs no GPU placement and its CPU
  is outside GPU quotas). ``pods`` = sum of their pod counts; a group's count is what KubeRay
  creates at start: ``replicas`` (``minReplicas`` when unset) clamped to
  ``[minReplicas, maxReplicas]``, times ``numOfHosts``; 0 for a suspended group. With the in-tree
  autoscaler, workers it adds later beyond that are not part of the admitted gang (the collector
  and the accounting still see them; Kueue needs workload slices for the same thing).
* **gpus_per_pod** = the largest per-pod GPU request among them (``nvidia.com/gpu`` limits, else
  requests; containers summed, init containers by max). Groups with different counts are
  over-approximated to the largest (a 1-GPU + an 8-GPU group of 2 pods each counts 4 x 8): the
  scheduler then never admits a gang that does not fit, at the price of counting more GPUs
  against quota than the gang holds. cpu/memory per pod come from the same largest template.
* **shares and slices** (issue 19), read per template as the accounting bills the pods
  (:mod:`gpuq.gpu_share`):

  - KAI's ``gpu-fraction`` annotation on a template requesting no ``nvidia.com/gpu``: a share of
    one GPU (:func:`template_share`).
  - **MIG**: a template asking ``nvidia.com/mig-<profile>: N`` (the mixed strategy) is ``N``
    slices of a MIG type, as the scheduler counts the nodes' slices (1 a slice; the accounting
    bills each slice its fraction of the GPU). The type: for each GPU type the gang selects
    (``gpuq.io/gpu-types``, else the templates' ``nvidia.com/gpu.product`` selector), the queue
    file's ``<TYPE>-mig-<profile>`` when declared, else ``<product>-MIG-<profile>`` (what the
    nodes' slices are named when no MIG type is declared); when it selects none, every declared
    MIG type of the profile; none declared either is a mapping error saying what to add. A pod of
    two profiles, or of slices and whole GPUs, or a gang of two profiles, is refused (a gang is one
    type). With the single strategy the slices are ``nvidia.com/gpu`` on nodes labelled
    ``<product>-MIG-<profile>``, which already type them: a selector of that label is a MIG type.
  - **Time-slicing** (and MPS): a template's ``nvidia.com/gpu: k`` is ``k`` replicas of a GPU that
    the device plugin advertises ``R`` times, ``k / R`` of a GPU (rounded down to thousandths, as
    the collector bills the pod; ``R`` replicas are a whole GPU). A template cannot say ``R``: the
    source takes it from the nodes the collector sees (``replicas``: per GPU type the fewest
    ``nvidia.com/gpu.replicas`` among its schedulable nodes, the accounting's last snapshot), over
    the types the gang may run on (all types when it selects none). The fewest, so that where one
    node of the pool is not time-sliced (or a type has no node seen) the request stays whole GPUs:
    the scheduler then counts at least what the pod will hold, never less. ``k / R`` of more than
    one GPU but not whole is refused. ``nvidia.com/gpu.shared: k`` (the device plugin's
    ``renameByDefault: true``, which advertises a time-sliced node's replicas under that name, and
    GFD still labels them ``nvidia.com/gpu.replicas``) is read the same way, as the collector bills
    it; as only time-sliced nodes advertise it, a gang selecting no type may run on the time-sliced
    types alone (those with ``R`` above 1; none seen: refused, naming the annotation). A gang asking both ``nvidia.com/gpu`` and
    ``nvidia.com/gpu.shared`` is refused (different nodes: not one GPU type).
* **originator** = True: the workload holds the Ray head, so it is preempted after plain pods.
* **gpu_types**: the ``gpuq.io/gpu-types`` annotation (``H100,A100``, in preference order), else
  the value of ``nvidia.com/gpu.product`` (``node_label_key``) that the GPU templates already
  select, mapped back to a type through ``node_labels``; else any type.
* **priority**: the ``gpuq.io/priority`` annotation, else the value of the ``priorityClassName``
  of the first template that names one (head first, as Kueue), read from
  ``scheduling.k8s.io/v1`` (a missing class is a mapping error, as pods naming it would be
  refused); else 0. **preemptible**: ``gpuq.io/preemptible`` ("false" -> False; default True).
  **submit_s**: ``metadata.creationTimestamp`` (epoch seconds).
* **expected_duration_s**: the ``gpuq.io/expected-duration`` annotation, the running time its
  submitter expects, in seconds (``9000``) or as a Go duration (``2h30m``, ``90m``, ``1.5h``);
  it changes no decision, only the start-time forecasts (:mod:`scheduler.service.forecasts`).
  A value that is neither, or not positive, does not hold the workload back: it is scheduled
  without a declared duration, and the problem, naming the annotation, is logged and told by a
  ``BadAnnotation`` Event on the object (once per object generation).
* **id**: ``rayjob/<namespace>/<name>`` or ``raycluster/<namespace>/<name>``.

Not mapped (skipped with the reason): a RayJob without ``rayClusterSpec`` (it runs on an existing
cluster), a gang requesting no GPUs, unreadable annotations, MIG requests that are not one type.

An object the scheduler holds because its namespace may not use the queue it names
(``queue_not_allowed``, :mod:`accounting.access`) is told so by a ``QueueNotAllowed`` Event
(:meth:`KubernetesWorkloadSource.refused`, :mod:`scheduler.actuators.k8s_events`).
"""
from __future__ import annotations

import datetime as dt
import json
import socket
import time
import logging
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from types import MappingProxyType
from typing import Any

import urllib3
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi, SchedulingV1Api
from kubernetes.client.exceptions import ApiException

from accounting.quantity import cpu_millicores, memory_bytes
from gpuq.gpu_share import (
    GPU_RESOURCE,
    SHARED_GPU_RESOURCE,
    KAI_DEVICES,
    KAI_FRACTION,
    MIG_PREFIX,
    SHARED_SUFFIX,
    kai_fraction_milli,
    mig_type_parts,
    milli_floor,
)
from gpuq.settings import KubernetesTarget, Settings
from scheduler.actuators.base import Target
from scheduler.actuators.k8s_events import EventRecorder, Involved
from scheduler.actuators.kubernetes import (
    CANCELLED_ANNOTATION,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCES,
    PLURALS,
    RAY_GROUP,
    RAY_VERSION,
    ObjectError,
    admission_record,
    gpu_mig_types,
    gpu_node_labels,
    kubernetes_target,
    make_api_client,
    pod_templates,
    restore_templates,
)
from scheduler.errors import SchedulerError
from scheduler.model import Gpus, Workload

GPU_TYPES_ANNOTATION = "gpuq.io/gpu-types"
PRIORITY_ANNOTATION = "gpuq.io/priority"
PREEMPTIBLE_ANNOTATION = "gpuq.io/preemptible"
EXPECTED_DURATION_ANNOTATION = "gpuq.io/expected-duration"
LAST_CHECKPOINT_ANNOTATION = "gpuq.io/last-checkpoint"     # RFC 3339 or Unix seconds (issue 21)
_FALSE = ("false", "0", "no")
MAX_EXPECTED_S = 10 * 366 * 86400.0         # the API's bound on a declared running time
# Go's time.ParseDuration units (a duration is one or more of <number><unit>, "2h30m")
_GO_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")

log = logging.getLogger(__name__)


class WorkloadSourceError(SchedulerError):
    """Listing failed; ``path`` is the API path, ``retryable`` whether trying again can help."""

    def __init__(self, path: str, message: str, retryable: bool, status: int = 0) -> None:
        self.path = path
        self.retryable = retryable
        self.status = status                  # the HTTP status; 0 when the server was not reached
        super().__init__(f"kubernetes: GET {path} failed: {message}")


@dataclass(frozen=True, slots=True)
class SourceKeys:
    """Which labels/annotations name the queue, which resources are GPUs, which node label types them."""

    queue_labels: tuple[str, ...] = ("kueue.x-k8s.io/queue-name", "queue", "yunikorn.apache.org/queue")
    queue_annotations: tuple[str, ...] = ("yunikorn.apache.org/queue",)
    gpu_resources: tuple[str, ...] = GPU_RESOURCES     # nvidia.com/gpu and nvidia.com/gpu.shared
    node_label_key: str = GPU_PRODUCT_LABEL


# -- the mapping (pure) -----------------------------------------------------------------------------
def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def group_pods(group: Mapping[str, Any]) -> int:
    """Pods KubeRay creates at start for a worker group."""
    if group.get("suspend") is True:
        return 0
    low = _int(group.get("minReplicas"), 0)
    high = _int(group.get("maxReplicas"), 2**31 - 1)
    want = _int(group.get("replicas"), low)
    return max(low, min(want, high)) * max(1, _int(group.get("numOfHosts"), 1))


def pod_gpus(spec: Mapping[str, Any], resources: Iterable[str]) -> int:
    """GPUs one pod of this spec holds: containers summed, init containers by max."""
    names = tuple(resources)

    def of(container: Mapping[str, Any]) -> int:
        res = container.get("resources") or {}
        amounts = res.get("limits") or {}
        total = 0
        for name in names:
            raw = amounts.get(name, (res.get("requests") or {}).get(name, 0))
            try:
                total += int(str(raw))
            except ValueError as exc:
                raise ObjectError(f"{name}: not a whole number of GPUs: {raw!r}") from exc
        return total

    main = sum(of(c) for c in spec.get("containers") or ())
    return max([main, *(of(c) for c in spec.get("initContainers") or ())])


def template_share(template: Mapping[str, Any]) -> Gpus:
    """A template's pod asking a share of one GPU through KAI-Scheduler's ``gpu-fraction``
    annotation (its pods request no ``nvidia.com/gpu``; issue 19): the share in thousandths, rounded
    down as the accounting bills it (:func:`gpuq.gpu_share.kai_fraction_milli`); 0 when it asks
    none. ``gpu-memory`` needs the node's GPU memory, which a template has not: not read here (such a
    gang requests no GPUs for gpuq). A fraction on several devices cannot be one share of one device:
    an error naming it."""
    notes = (template.get("metadata") or {}).get("annotations") or {}
    if not notes.get(KAI_FRACTION):
        return 0
    milli = kai_fraction_milli({k: str(v) for k, v in notes.items()})
    if milli is None or milli <= 0:
        raise ObjectError(f"{KAI_FRACTION}: not a share of one GPU: {notes[KAI_FRACTION]!r}")
    if milli >= 1000:
        raise ObjectError(f"{KAI_FRACTION} {notes[KAI_FRACTION]!r} on {notes.get(KAI_DEVICES)} devices: gpuq "
                          "schedules a share of one device, or whole GPUs")
    return Decimal(milli) / 1000


def template_mig(spec: Mapping[str, Any]) -> tuple[str, int]:
    """``(profile, slices)`` a pod of this spec asks through MIG resources
    (``nvidia.com/mig-1g.10gb: 2`` -> ``("1g.10gb", 2)``; the mixed strategy's, ``.shared`` too);
    ``("", 0)`` when none. One pod set is one GPU type: two profiles in one pod are an error."""
    names = sorted({name for c in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]
                    if isinstance(c, dict)
                    for amounts in ((c.get("resources") or {}).get("limits") or {},
                                    (c.get("resources") or {}).get("requests") or {})
                    for name, amount in amounts.items()
                    if name.startswith(MIG_PREFIX) and str(amount) not in ("0", "")})
    profiles = sorted({n[len(MIG_PREFIX):].removesuffix(SHARED_SUFFIX) for n in names})
    if not profiles:
        return "", 0
    if len(profiles) > 1:
        raise ObjectError(f"{', '.join(names)}: a pod of several MIG profiles is not one GPU type")
    return profiles[0], pod_gpus(spec, names)


def time_sliced(count: int, replicas: int) -> Gpus:
    """``count`` replicas of a GPU the device plugin advertises ``replicas`` times (time-slicing or
    MPS) as GPUs: ``count / replicas`` rounded down to thousandths, as the collector bills such a pod
    (:func:`gpuq.gpu_share.milli_floor`); whole GPUs stay whole. A number of replicas that is more
    than one GPU but not whole GPUs is an error (gpuq places a share of one device, or whole GPUs)."""
    if replicas <= 1:
        return count
    milli = milli_floor(Fraction(count, replicas))
    if milli % 1000 == 0:
        return milli // 1000
    if milli > 1000:
        raise ObjectError(f"{GPU_RESOURCE}: {count} replicas of a GPU shared {replicas} ways are "
                          f"{Decimal(milli) / 1000} GPUs: gpuq schedules a share of one device, or whole GPUs")
    return Decimal(milli) / 1000


def _mig_gang_types(profile: str, bases: tuple[str, ...], mig_types: Mapping[str, tuple[str, str]],
                    node_labels: Mapping[str, str], resource: str) -> tuple[str, ...]:
    """The GPU types a gang of ``profile`` slices may run on: for each GPU type it selects (a MIG
    type of that profile as it is), the queue file's MIG type slicing it (``<TYPE>-mig-<profile>``),
    else the nodes' own name for such slices (``<product>-MIG-<profile>``, the type the scheduler
    sees them as when none is declared); when it selects none, every declared MIG type of the
    profile. None declared and no GPU selected: an error saying what to add."""
    declared = {parts: name for name, parts in mig_types.items()}
    out: list[str] = []
    for base in bases:
        parts = mig_types.get(base) or mig_type_parts(base)
        if parts is not None:
            if parts[1] == profile:
                out.append(base)
            continue
        out.append(declared.get((base, profile)) or f"{node_labels.get(base, base)}-MIG-{profile}")
    if bases:
        if not out:
            raise ObjectError(f"{resource}: the GPU types it selects ({', '.join(bases)}) are not of "
                              f"MIG profile {profile}")
        return tuple(dict.fromkeys(out))
    found = tuple(name for name, (_, p) in mig_types.items() if p == profile)
    if not found:
        raise ObjectError(f"{resource}: which GPU's slices is unknown: select the GPU (a "
                          f"{GPU_PRODUCT_LABEL} node selector or the {GPU_TYPES_ANNOTATION} annotation) or "
                          f"declare a <TYPE>-mig-{profile} GPU type in the queue file")
    return found


def _requests(spec: Mapping[str, Any]) -> tuple[int, int]:
    cpu = mem = 0
    for c in spec.get("containers") or ():
        res = c.get("resources") or {}
        req = res.get("requests") or res.get("limits") or {}
        if "cpu" in req:
            cpu += cpu_millicores(req["cpu"])[0] or 0
        if "memory" in req:
            mem += memory_bytes(req["memory"])[0] or 0
    return cpu, mem


def _queue(labels: Mapping[str, str], notes: Mapping[str, str], keys: SourceKeys) -> str:
    for key in keys.queue_labels:
        if labels.get(key):
            return labels[key]
    for key in keys.queue_annotations:
        if notes.get(key):
            return notes[key]
    return ""


def submit_seconds(stamp: Any) -> float:
    if not isinstance(stamp, str) or not stamp:
        return 0.0
    return dt.datetime.fromisoformat(stamp).timestamp()


def duration_seconds(text: str) -> float:
    """Seconds (``9000``, ``9000.5``) or a Go duration (``2h30m``, ``90m``, ``1.5h``, ``45s``);
    ValueError saying what is expected. Positive, at most ten years."""
    s = text.strip()
    try:
        value = float(s)
    except ValueError:
        pos, value = 0, 0.0
        for m in _GO_PART.finditer(s):
            if m.start() != pos:
                break
            value += float(m.group(1)) * _GO_UNITS[m.group(2)]
            pos = m.end()
        if not s or pos != len(s):
            raise ValueError(f"{text!r} is neither seconds nor a Go duration like 2h30m") from None
    if not (math.isfinite(value) and 0 < value <= MAX_EXPECTED_S):
        raise ValueError(f"{text!r} must be a positive duration of at most ten years")
    return value


def checkpoint_seconds(value: object) -> float:
    """A checkpoint's time as Unix seconds: an RFC 3339 time with its offset (``2025-06-01T10:00:00Z``)
    or Unix seconds (a number, or its text); ValueError saying what is wrong. The API's
    ``last_checkpoint`` and the ``gpuq.io/last-checkpoint`` annotation both read it."""
    import datetime as dt
    import math

    if isinstance(value, bool):
        raise ValueError(f"expected an RFC 3339 time or Unix seconds, got {value!r}")
    if isinstance(value, (int, float)):
        t = float(value)
    elif isinstance(value, str):
        text = value.strip()
        try:
            t = float(text)
        except ValueError:
            try:
                when = dt.datetime.fromisoformat(text.replace("z", "Z"))
            except ValueError:
                raise ValueError(f"expected an RFC 3339 time or Unix seconds, got {value[:64]!r}") from None
            if when.tzinfo is None:
                raise ValueError(f"an RFC 3339 time needs its offset (Z or +hh:mm), got {value[:64]!r}")
            t = when.timestamp()
    else:
        raise ValueError(f"expected an RFC 3339 time or Unix seconds, got {type(value).__name__}")
    if not math.isfinite(t) or not 0 <= t < 1e11:
        raise ValueError(f"{value!r} is not a time gpuq takes (Unix seconds from 0 to 1e11)")
    return t


def last_checkpoint(notes: Mapping[str, str], warn: Callable[[str], None] | None = None) -> float | None:
    """The ``gpuq.io/last-checkpoint`` annotation as Unix seconds, or None (absent, or unreadable:
    then said through ``warn``, as :func:`_expected` does; a preemption counts all of the run)."""
    raw = notes.get(LAST_CHECKPOINT_ANNOTATION)
    if raw is None:
        return None
    try:
        return checkpoint_seconds(raw)
    except ValueError as exc:
        message = f"annotation {LAST_CHECKPOINT_ANNOTATION}: {exc}; a preemption counts all of its run as lost"
        if warn is not None:
            warn(message)
        else:
            log.warning("%s", message)
        return None


def _expected(notes: Mapping[str, str], warn: Callable[[str], None] | None) -> float | None:
    raw = notes.get(EXPECTED_DURATION_ANNOTATION)
    if raw is None:
        return None
    try:
        return duration_seconds(str(raw))
    except ValueError as exc:
        message = (f"annotation {EXPECTED_DURATION_ANNOTATION}: {exc}; scheduled without a declared "
                   "duration (it only changes the start-time forecasts)")
        if warn is not None:
            warn(message)
        else:
            log.warning("%s", message)
        return None


def workload_of(kind: str, obj: Mapping[str, Any], *, keys: SourceKeys = SourceKeys(),
                node_labels: Mapping[str, str] | None = None,
                priority_of: Callable[[str], int | None] = lambda _name: None,
                warn: Callable[[str], None] | None = None,
                mig_types: Mapping[str, tuple[str, str]] = MappingProxyType({}),
                replicas: Mapping[str, int] = MappingProxyType({}),
                ) -> tuple[Workload, Target] | None:
    """The ``(Workload, Target)`` of a KubeRay object; None when it is not gpuq's (no queue,
    being deleted, cancelled); ObjectError naming the field when it has a queue but cannot be mapped.
    ``node_labels``: GPU type -> node label value; ``priority_of``: PriorityClass name -> value;
    ``warn``: told what was left out of an object that is mapped anyway (a bad
    ``gpuq.io/expected-duration``; logged when not given); ``mig_types``: the queue file's MIG
    types, name -> (the type it slices, profile); ``replicas``: GPU type -> the fewest replicas the
    device plugin makes of each GPU on the schedulable nodes of that type now (time-slicing; a
    type absent is not time-sliced)."""
    meta = obj.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    queue = _queue(labels, notes, keys)
    if not queue or meta.get("deletionTimestamp") or notes.get(CANCELLED_ANNOTATION) == "true":
        return None
    ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
    original = json.loads(json.dumps(obj))             # the templates as the user wrote them
    if admission_record(original) is not None:
        restore_templates(kind, original)
    templates = pod_templates(kind, original)
    cluster = (original["spec"].get("rayClusterSpec") if kind == "RayJob" else original["spec"]) or {}
    counts = [1] + [group_pods(g) for g in cluster.get("workerGroupSpecs") or ()]
    counts += [1] * (len(templates) - len(counts))        # the submitter pod, when it has a template
    migs = [template_mig(t.get("spec") or {}) for _, t in templates]
    devices = [pod_gpus((t.get("spec") or {}), keys.gpu_resources) for _, t in templates]
    for (where, _), (profile, _), count in zip(templates, migs, devices):
        if profile and count:
            raise ObjectError(f"{where}: a pod of MIG slices and whole GPUs is not one GPU type")
    profiles = {p for (p, n), c in zip(migs, counts) if p and n and c}
    if len(profiles) > 1:
        raise ObjectError(f"MIG profiles {', '.join(sorted(profiles))} in one gang: a gang is one GPU type")
    asked = [n if p else d for (p, n), d in zip(migs, devices)]     # slices, or devices (replicas)
    gpu_templates = [t for n, a, (_, t) in zip(counts, asked, templates)
                     if n > 0 and (a > 0 or ((t.get("metadata") or {}).get("annotations") or {}).get(KAI_FRACTION))]
    labels = node_labels or {}
    types = _gpu_types(notes, gpu_templates, keys, labels)
    if profiles:
        (profile,) = profiles
        types = _mig_gang_types(profile, types, mig_types, labels, f"{MIG_PREFIX}{profile}")
        per_pod: list[Gpus] = list(asked)
    else:
        renamed = [pod_gpus(t.get("spec") or {}, (SHARED_GPU_RESOURCE,)) if SHARED_GPU_RESOURCE in keys.gpu_resources
                   else 0 for _, t in templates]
        asks_renamed = any(r and n for r, n in zip(renamed, counts))
        if asks_renamed and any(d - r and n for d, r, n in zip(devices, renamed, counts)):
            raise ObjectError(f"{SHARED_GPU_RESOURCE} and {GPU_RESOURCE} in one gang: the device plugin advertises "
                              "them on different nodes, and a gang is one GPU type")
        if asks_renamed and not types:      # advertised by time-sliced nodes only: those types
            types = tuple(sorted(t for t, r in replicas.items() if r > 1))
            if not types:
                raise ObjectError(f"{SHARED_GPU_RESOURCE}: no time-sliced GPU type seen (no schedulable node "
                                  "labelled nvidia.com/gpu.replicas above 1); name one in gpuq.io/gpu-types")
        pool = types or tuple(replicas)
        shared = min((replicas.get(t, 1) for t in pool), default=1)     # time-slicing (module docstring)
        per_pod = [time_sliced(d, shared) if d else template_share(t) for d, (_, t) in zip(devices, templates)]
    gang = [(n, g, t) for n, g, (_, t) in zip(counts, per_pod, templates) if g > 0 and n > 0]
    if not gang:
        raise ObjectError("requests no GPUs (no template has " + ", ".join(keys.gpu_resources) + ")")
    gpus = max(g for _, g, _ in gang)
    widest = next(t for _, g, t in gang if g == gpus)
    cpu, mem = _requests(widest.get("spec") or {})
    workload = Workload(
        id=f"{kind.lower()}/{ns}/{name}", queue=queue, pods=sum(n for n, _, _ in gang), gpus_per_pod=gpus,
        gpu_types=types,
        priority=_priority(notes, [t for _, t in templates], priority_of),
        preemptible=str(notes.get(PREEMPTIBLE_ANNOTATION, "true")).strip().lower() not in _FALSE,
        submit_s=submit_seconds(meta.get("creationTimestamp")), originator=True,
        cpu_millicores_per_pod=cpu, memory_per_pod_bytes=mem, expected_duration_s=_expected(notes, warn))
    return workload, Target(kind=kind, namespace=ns, name=name, api_version=f"{RAY_GROUP}/{RAY_VERSION}")


def _gpu_types(notes: Mapping[str, str], gang: list[dict[str, Any]], keys: SourceKeys,
               node_labels: Mapping[str, str]) -> tuple[str, ...]:
    raw = notes.get(GPU_TYPES_ANNOTATION)
    if raw:
        return tuple(dict.fromkeys(t.strip() for t in str(raw).split(",") if t.strip()))
    values = {((t.get("spec") or {}).get("nodeSelector") or {}).get(keys.node_label_key) for t in gang}
    if len(values) == 1 and (value := values.pop()):
        by_label = {v: k for k, v in node_labels.items()}
        return (by_label.get(value, value),)
    return ()


def _priority(notes: Mapping[str, str], templates: list[dict[str, Any]],
              priority_of: Callable[[str], int | None]) -> int:
    raw = notes.get(PRIORITY_ANNOTATION)
    if raw is not None:
        try:
            return int(str(raw).strip())
        except ValueError as exc:
            raise ObjectError(f"annotation {PRIORITY_ANNOTATION}: not an integer: {raw!r}") from exc
    for tmpl in templates:
        cls = (tmpl.get("spec") or {}).get("priorityClassName")
        if cls:
            value = priority_of(str(cls))
            if value is None:
                raise ObjectError(f"priorityClassName {cls!r}: no such PriorityClass")
            return value
    return 0


# -- the source (I/O) -------------------------------------------------------------------------------
class KubernetesWorkloadSource:
    """Lists KubeRay objects with the real client; see the module docstring for the mapping."""

    def __init__(self, settings: Settings, *, target: KubernetesTarget | None = None,
                 api_client: ApiClient | None = None, keys: SourceKeys = SourceKeys(),
                 node_labels: Mapping[str, str] | None = None,
                 kinds: tuple[str, ...] = ("RayJob", "RayCluster"), page_size: int = 500,
                 timeout_s: float = 10.0, events: bool = True, clock: Callable[[], float] = time.time,
                 mig_types: Mapping[str, tuple[str, str]] | None = None,
                 replicas: Callable[[], Mapping[str, int]] = lambda: {}) -> None:
        self.target = target or kubernetes_target(settings)
        self._client = api_client or make_api_client(self.target)
        self._custom = CustomObjectsApi(self._client)
        self._scheduling = SchedulingV1Api(self._client)
        self.keys = keys
        self.node_labels = dict(node_labels) if node_labels is not None else gpu_node_labels(settings)
        self.mig_types = dict(mig_types) if mig_types is not None else gpu_mig_types(settings)
        # GPU type -> the fewest replicas of a GPU on its nodes now (time-slicing), as the accounting
        # read the nodes the collector sees (LiveAccounting.replicas_by_type); asked at every listing
        self.replicas = replicas
        self.kinds, self.page_size, self.timeout_s = kinds, page_size, timeout_s
        self.skipped: tuple[str, ...] = ()
        self.events = EventRecorder(CoreV1Api(self._client), clock=clock, instance=socket.gethostname(),
                                    timeout_s=timeout_s) if events else None
        self._seen: dict[str, tuple[str, str]] = {}      # workload id -> (uid, generation) as last listed
        # workload id -> (uid, generation, problem) told by a BadAnnotation Event: told once per generation
        self.warned: dict[str, tuple[str, str, str]] = {}
        # workload id -> its gpuq.io/last-checkpoint as last listed (Unix seconds; issue 21): not part
        # of the Workload, which a checkpoint must not change (a changed Workload is taken again as new)
        self.checkpoints: dict[str, float] = {}

    def refused(self, workload: Workload, target: Target, code: str, message: str) -> dict[str, str]:
        """Tell the object's owners that the scheduler holds it (``code``: ``queue_not_allowed``) with
        a Kubernetes Event on the object; one per object generation and queue (a repeat is the
        server's 409: already told). Never raises; answers what :meth:`EventRecorder.record` does."""
        if self.events is None:
            return {}
        uid, generation = self._seen.get(workload.id, ("", ""))
        obj = Involved(target.api_version or f"{RAY_GROUP}/{RAY_VERSION}", target.kind, target.namespace,
                       target.name, uid)
        return self.events.record(obj, "not-allowed", message, token=f"{code}\0{workload.queue}\0{generation}")

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    def pending(self) -> list[tuple[Workload, Target]]:
        """Suspended objects with a queue, by workload id."""
        return [(w, t) for w, t, obj in self._mapped() if (obj.get("spec") or {}).get("suspend") is True]

    def admitted(self) -> list[tuple[Workload, Target, str]]:
        """Unsuspended objects gpuq admitted, with the GPU type they were admitted on."""
        out = []
        for w, t, obj in self._mapped():
            rec = admission_record(obj)
            if rec is not None and (obj.get("spec") or {}).get("suspend") is not True:
                out.append((w, t, str(rec.get("gpuType") or "")))
        return out

    def _mapped(self) -> list[tuple[Workload, Target, dict[str, Any]]]:
        classes: dict[str, int | None] = {}

        def priority_of(name: str) -> int | None:
            if name not in classes:
                classes[name] = self._priority_class(name)
            return classes[name]

        out, skipped = [], []
        seen: dict[str, tuple[str, str]] = {}
        checkpoints: dict[str, float] = {}
        replicas = dict(self.replicas())
        for kind in self.kinds:
            for obj in self.list_objects(kind):
                meta = obj.get("metadata") or {}
                problems: list[str] = []
                try:
                    got = workload_of(kind, obj, keys=self.keys, node_labels=self.node_labels,
                                      priority_of=priority_of, warn=problems.append,
                                      mig_types=self.mig_types, replicas=replicas)
                except ObjectError as exc:
                    skipped.append(f"{kind} {meta.get('namespace')}/{meta.get('name')}: {exc}")
                    continue
                if got is not None:
                    out.append((*got, obj))
                    seen[got[0].id] = (str(meta.get("uid") or ""), str(meta.get("generation") or ""))
                    at = last_checkpoint(meta.get("annotations") or {}, problems.append)
                    if at is not None:
                        checkpoints[got[0].id] = at
                    if problems:
                        self._tell_problem(*got, seen[got[0].id], "; ".join(problems))
        self.skipped, self._seen, self.checkpoints = tuple(skipped), seen, checkpoints
        self.warned = {wid: told for wid, told in self.warned.items() if wid in seen}
        return sorted(out, key=lambda x: x[0].id)

    def _tell_problem(self, workload: Workload, target: Target, version: tuple[str, str], problem: str) -> None:
        """Log a problem of an object mapped anyway and tell it by a ``BadAnnotation`` Event, once
        per object generation and problem."""
        told = (*version, problem)
        if self.warned.get(workload.id) == told:
            return
        self.warned[workload.id] = told
        log.warning("%s %s/%s: %s", target.kind, target.namespace, target.name, problem)
        if self.events is not None:
            obj = Involved(target.api_version or f"{RAY_GROUP}/{RAY_VERSION}", target.kind, target.namespace,
                           target.name, version[0])
            self.events.record(obj, "bad-annotation", problem, token=f"{version[1]}\0{problem}")

    def list_objects(self, kind: str) -> list[dict[str, Any]]:
        """Every object of ``kind`` in the target's namespaces (all when none), paged."""
        items: list[dict[str, Any]] = []
        namespaces: list[str | None] = [*self.target.namespaces] or [None]
        for ns in namespaces:
            token: str | None = None
            while True:
                body = self._list_page(kind, ns, token)
                items.extend(body.get("items") or ())
                token = (body.get("metadata") or {}).get("continue") or None
                if not token:
                    break
        return items

    def _list_page(self, kind: str, ns: str | None, token: str | None) -> dict[str, Any]:
        plural = PLURALS[kind]
        path = f"/apis/{RAY_GROUP}/{RAY_VERSION}/" + (f"namespaces/{ns}/" if ns else "") + plural
        kw: dict[str, Any] = {"limit": self.page_size, "_preload_content": False,
                              "_request_timeout": (self.timeout_s, self.timeout_s)}
        if token:
            kw["_continue"] = token
        return self._read(path, lambda: (
            self._custom.list_namespaced_custom_object(RAY_GROUP, RAY_VERSION, ns, plural, **kw) if ns
            else self._custom.list_cluster_custom_object(RAY_GROUP, RAY_VERSION, plural, **kw)))

    def _priority_class(self, name: str) -> int | None:
        path = f"/apis/scheduling.k8s.io/v1/priorityclasses/{name}"
        try:
            body = self._read(path, lambda: self._scheduling.read_priority_class(
                name, _preload_content=False, _request_timeout=(self.timeout_s, self.timeout_s)))
        except WorkloadSourceError as exc:
            if exc.status == 404:
                return None
            raise
        value = body.get("value")
        return value if isinstance(value, int) else None

    def _read(self, path: str, call: Callable[[], Any]) -> dict[str, Any]:
        try:
            resp = call()
            try:
                body = json.loads(resp.data)
            finally:
                resp.release_conn()
        except ApiException as exc:
            status = int(exc.status or 0)
            detail = exc.reason or ""
            try:
                detail = json.loads(exc.body or "").get("message") or detail
            except (ValueError, TypeError, AttributeError):
                pass
            raise WorkloadSourceError(path, f"HTTP {status} {detail}".strip(), status=status,
                                      retryable=status == 0 or status >= 500 or status in (409, 429)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            host = self._client.configuration.host
            raise WorkloadSourceError(path, f"cannot reach the API server at {host}: {exc}",
                                      retryable=True) from exc
        except ValueError as exc:
            raise WorkloadSourceError(path, f"the answer is not JSON: {exc}", retryable=True) from exc
        return body if isinstance(body, dict) else {}
