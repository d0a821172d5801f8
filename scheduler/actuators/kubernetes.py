"""The ``kubernetes`` actuator: admit and stop KubeRay workloads the way Kueue does.

Requests, mirroring Kueue's job framework (``jobframework.JobReconciler.startJob``/``stopJob``
with ``clientutil.Patch(..., strict=true)``, ``rayjob.RunWithPodSetsInfo``/``Suspend``/
``RestorePodSetsInfo``, ``podset.Merge``/``RestorePodSpec``):

* **admit** a ``RayJob``/``RayCluster`` (``ray.io/v1``): GET the object, then one
  ``PATCH /apis/ray.io/v1/namespaces/<ns>/<rayjobs|rayclusters>/<name>`` with
  ``Content-Type: application/merge-patch+json`` (an RFC 7386 diff of the object before and after,
  as controller-runtime's ``client.MergeFrom`` computes it) carrying ``spec.suspend: false``, the
  node selector ``nvidia.com/gpu.product=<label of the chosen type>`` merged into every pod
  template (RayJob: ``spec.rayClusterSpec.headGroupSpec.template`` and each
  ``workerGroupSpecs[*].template``, and ``spec.submitterPodTemplate`` when the RayJob has one;
  RayCluster: ``spec.headGroupSpec``/``spec.workerGroupSpecs``; a merge patch replaces lists
  whole, so ``workerGroupSpecs`` goes complete), **the chosen nodes**: required node affinity
  ``kubernetes.io/hostname In [<the placement's nodes>]`` on every template that requests GPUs
  (the GPU worker groups; the head or submitter only when they request GPUs, a CPU head stays
  unpinned), ANDed into the template's own required terms, so the kube-scheduler places the gang
  where gpuq placed it (Kueue's topology-aware scheduling pins a pod set to its domain the same
  way; details and node-name mapping in :mod:`scheduler.actuators.k8s_templates`), the annotation
  ``gpuq.io/workload: <workload id>`` (the collector joins pods to the workload through their top
  owner's), and ``metadata.resourceVersion`` (Kueue's *strict* patch: a concurrent change answers
  409, and the next attempt re-GETs and re-applies). A template that already selects another
  value for the key, or whose hostname terms exclude the chosen nodes, is a conflict (Kueue's
  ``podset.Merge``): not retryable. Kueue keeps the templates' originals in its Workload object
  to restore them on suspension; gpuq has no such object, so the same patch stores them in the
  annotation ``gpuq.io/admission`` (JSON: workload, gpuType, key/value, nodes, and the
  ``nodeSelectors`` and ``affinities`` in template order, ``null`` where there was none).
* **preempt** / **cancel** a RayJob/RayCluster: one merge patch with ``spec.suspend: true``, the
  original node selectors and affinity restored exactly from ``gpuq.io/admission`` (which is removed), the
  resourceVersion, and a mark: ``gpuq.io/preempted: <reason>`` or ``gpuq.io/cancelled: "true"``.
  Cancel means "stop scheduling it": suspended and marked, never deleted (the user's object,
  status and logs stay; :mod:`scheduler.actuators.k8s_workloads` skips cancelled objects; a user
  requeues by removing the annotation). Admission clears both marks.
* **preempt** / **cancel** a plain ``Pod``: ``POST /api/v1/namespaces/<ns>/pods/<name>/eviction``
  with a ``policy/v1`` ``Eviction`` (Kueue deletes plain pods after a status patch; the Eviction
  API respects PodDisruptionBudgets and sets the pod's DisruptionTarget condition itself).
  429 with a ``DisruptionBudget`` cause (a PodDisruptionBudget forbids it now) is a *refusal*, not
  retried within the call (``detail["refused"]``): the service keeps the victim running, shows the
  budget's message on both workloads and tries again after a backoff; any other 429 (API
  throttling) is retried. 404 means the pod is already gone: ok.

**Events**: each action that happened gets one Kubernetes Event on the object (``Admitted``,
``Preempted``, ``Suspended``, ``Cancelled``; :mod:`scheduler.actuators.k8s_events`), with a
deterministic name so a repeated call does not tell twice; an object held for its queue's policy
gets ``PolicyRefused`` (:meth:`KubernetesActuator.refuse`, called by the workload sync). An Event that cannot be created is
logged and counted (``actuator.events.failures``), never a failed action.

**RBAC** (a Role in each namespace the target names, or a ClusterRole when it names none):
``ray.io`` ``rayjobs``, ``rayclusters``: get, list, patch (list for the workload source);
``""`` ``pods/eviction``: create; ``""`` ``events``: create; ``scheduling.k8s.io``
``priorityclasses``: get (cluster-wide, the workload source); docs/ARCHITECTURE.md has the Role.

Idempotent: admitting an unsuspended object that already selects the type, or suspending a
suspended object with nothing to restore, answers ok without a PATCH (``detail["patched"]``).
Every call goes through :func:`with_retries`: 5xx, 429, 409 and connection errors are retried
(each attempt GETs afresh); 400/401/403/404/405/422 are not. Failures name the verb, the API
path, the status and the API's message.

**Fencing**: with a ``fence`` (leader election), every attempt (Events' included) and, after its
GET, every PATCH and eviction asks it right before the request is sent: a replica that no longer
holds the Lease sends no write at all (:func:`~scheduler.actuators.base.fenced`). So the Event of an
action that was in flight at the loss is not created (the object's ``gpuq.io/*`` marks tell it).
"""
from __future__ import annotations

import copy
import json
import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import urllib3
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from gpuq.gpu_share import mig_type_parts
from gpuq.kube import load_configuration
from gpuq.settings import KubernetesTarget, Settings
from scheduler.actuators.base import ActionResult, Fence, Target, fenced, may_act, with_retries
from scheduler.actuators.k8s_events import EventRecorder, Involved
from scheduler.actuators.k8s_templates import (
    ADMISSION_ANNOTATION,
    CANCELLED_ANNOTATION,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCES,
    HOSTNAME_LABEL,
    PREEMPTED_ANNOTATION,
    WORKLOAD_ANNOTATION,
    ObjectError,
    admission_record,
    admitted_object,
    is_admitted,
    kube_node_names,
    merge_patch,
    pod_templates,
    restore_templates,
    suspended_object,
)
from scheduler.model import Placement, Workload

__all__ = ["ADMISSION_ANNOTATION", "CANCELLED_ANNOTATION", "GPU_PRODUCT_LABEL", "HOSTNAME_LABEL",
           "PREEMPTED_ANNOTATION", "WORKLOAD_ANNOTATION", "KubernetesActuator", "ObjectError",
           "admission_record", "gpu_mig_types", "gpu_node_labels", "kubernetes_target", "make_api_client", "merge_patch",
           "pod_templates", "restore_templates"]

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
RAY_GROUP, RAY_VERSION = "ray.io", "v1"
PLURALS = {"RayJob": "rayjobs", "RayCluster": "rayclusters"}
NOT_RETRYABLE = frozenset({400, 401, 403, 404, 405, 415, 422})


# -- configuration ------------------------------------------------------------------------------
def kubernetes_target(settings: Settings) -> KubernetesTarget:
    """The first ``collector.kubernetes`` target, else the default kubeconfig."""
    targets = settings.collector.kubernetes
    return targets[0] if targets else KubernetesTarget(cluster="default")


def make_api_client(target: KubernetesTarget) -> ApiClient:
    """A client for the target (kubeconfig + context, or in-cluster); ConfigError names it.
    The client does not retry: with_retries does, with backoff."""
    return ApiClient(load_configuration(target))


def gpu_node_labels(settings: Settings) -> dict[str, str]:
    """GPU type -> node label value: the first ``node_labels`` entry of each type in the queue file.
    A type not listed is its own label value (the collector names types by label when the queue
    file declares none)."""
    if not settings.queues_file:
        return {}
    from accounting.queues import load_queue_config

    types = load_queue_config(settings.queues_file).gpu_types
    return {name: t.node_labels[0] for name, t in types.items() if t.node_labels}


def gpu_mig_types(settings: Settings) -> dict[str, tuple[str, str]]:
    """The queue file's MIG types: name -> (the GPU type it slices, its profile)."""
    if not settings.queues_file:
        return {}
    from accounting.queues import load_queue_config

    types = load_queue_config(settings.queues_file).gpu_types
    return {name: (t.mig_of, t.mig_profile) for name, t in types.items() if t.mig_of}


# -- the actuator ---------------------------------------------------------------------------------
class _Failed(Exception):
    def __init__(self, result: ActionResult) -> None:
        super().__init__(result.message)
        self.result = result


class KubernetesActuator:
    """Kueue-style actuator over the real ``kubernetes`` client.

    ``target``: the cluster (default: the first ``collector.kubernetes`` target); ``node_labels``:
    GPU type -> value of ``node_label_key`` (default: the queue file's ``gpu_types.*.node_labels``;
    an unlisted type is its own value); ``gpu_resources``: what makes a template a GPU pod set
    (MIG slices always do); ``attempts``/``backoff_s``: :func:`with_retries`; ``events``: create
    Kubernetes Events (:mod:`scheduler.actuators.k8s_events`), ``clock``/``instance`` for them;
    ``fence``: asked right before each attempt and each mutating request (None: never fenced).
    """

    name = "kubernetes"

    def __init__(self, settings: Settings, *, target: KubernetesTarget | None = None,
                 api_client: ApiClient | None = None, node_labels: Mapping[str, str] | None = None,
                 node_label_key: str = GPU_PRODUCT_LABEL, gpu_resources: Sequence[str] = GPU_RESOURCES,
                 attempts: int = 4, backoff_s: float = 0.2, timeout_s: float = 10.0,
                 sleep: Callable[[float], None] = time.sleep, events: bool = True,
                 clock: Callable[[], float] = time.time, instance: str | None = None,
                 fence: Fence | None = None) -> None:
        self.target = target or kubernetes_target(settings)
        self.fence = fence
        self._client = api_client or make_api_client(self.target)
        self._custom = CustomObjectsApi(self._client)
        self._core = CoreV1Api(self._client)
        self.node_labels = dict(node_labels) if node_labels is not None else gpu_node_labels(settings)
        self.node_label_key, self.gpu_resources = node_label_key, tuple(gpu_resources)
        self.attempts, self.backoff_s, self.timeout_s, self._sleep = attempts, backoff_s, timeout_s, sleep
        self.server = str(self._client.configuration.host)
        self.events = EventRecorder(self._core, clock=clock, instance=instance or socket.gethostname(),
                                    timeout_s=timeout_s, retry=self._retry) if events else None

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    def label_value(self, gpu_type: str) -> str | None:
        """The node label value selecting ``gpu_type`` (None for "any type"). None for a MIG type
        too (``A100-mig-1g.10gb``, ``<product>-MIG-<profile>``): the pods' own
        ``nvidia.com/mig-<profile>`` request and the pin to the placement's nodes select its nodes,
        and a mixed-strategy node's product label names the whole GPU, not the slice."""
        if not gpu_type or mig_type_parts(gpu_type) is not None:
            return None
        return self.node_labels.get(gpu_type, gpu_type)

    # -- the protocol ---------------------------------------------------------------------------
    def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        if target.kind not in PLURALS:
            return ActionResult(False, f"kubernetes: cannot admit a {target.kind or 'target-less'} workload "
                                       f"{_ref(target)}: only RayJob and RayCluster are admitted")
        result = self._retry(lambda: self._admit_once(workload, target, placement))
        gpus = sum(g for _, g in placement.nodes)
        where = ", ".join(n for n, _ in placement.nodes) or "any node"
        return self._tell(target, result, "admit", f"admitted to queue {workload.queue} on {where} "
                                                   f"({gpus} x {placement.gpu_type or 'any type'})")

    def preempt(self, workload: Workload, target: Target, reason: str) -> ActionResult:
        result = self._stop(target, (PREEMPTED_ANNOTATION, reason[:250] or "preempted"))
        return self._tell(target, result, "preempt" if reason else "suspend", reason or "suspended by gpuq")

    def cancel(self, workload: Workload, target: Target, reason: str = "") -> ActionResult:
        """``reason``: the Event's message (default ``cancelled by gpuq``)."""
        return self._tell(target, self._stop(target, (CANCELLED_ANNOTATION, "true")), "cancel",
                          reason or "cancelled by gpuq")

    def refuse(self, workload: Workload, target: Target, message: str) -> dict[str, str]:
        """Tell the owners of an object gpuq will not admit as it stands: a Warning Event
        ``PolicyRefused`` with ``message`` (its priority or non-preemptibility is over its queue's
        policy, :mod:`scheduler.policy`). Named by the message, so telling the same again posts
        the same name (409: already told). Answers the recorder's ``event``/``event_error``."""
        if self.events is None:
            return {}
        api_version = target.api_version or f"{RAY_GROUP}/{RAY_VERSION}"
        obj = Involved(api_version, target.kind, target.namespace, target.name)
        return self.events.record(obj, "refuse", f"not admitted: {message}", token=message)

    def _stop(self, target: Target, mark: tuple[str, str]) -> ActionResult:
        if target.kind == "Pod":
            return self._retry(lambda: self._evict_once(target))
        if target.kind not in PLURALS:
            return ActionResult(False, f"kubernetes: cannot stop a {target.kind or 'target-less'} workload "
                                       f"{_ref(target)}: only RayJob, RayCluster and Pod")
        return self._retry(lambda: self._suspend_once(target, mark))

    def _tell(self, target: Target, result: ActionResult, verb: str, message: str) -> ActionResult:
        """The Event for an action that happened (``detail["tell"]`` holds its token); the result
        itself whatever becomes of the Event."""
        token = result.detail.get("tell")
        if not result.ok or token is None or self.events is None:
            return result
        api_version = target.api_version or ("v1" if target.kind == "Pod" else f"{RAY_GROUP}/{RAY_VERSION}")
        obj = Involved(api_version, target.kind, target.namespace, target.name, str(result.detail.get("uid") or ""))
        told = self.events.record(obj, verb, message, token or None)
        detail = {k: v for k, v in result.detail.items() if k not in ("tell", "uid")}
        return ActionResult(result.ok, result.message, result.retryable, {**detail, **told})

    # -- one attempt each -------------------------------------------------------------------------
    def _admit_once(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        path = _path(target)
        key, value = self.node_label_key, self.label_value(placement.gpu_type)
        try:
            nodes = kube_node_names((n for n, _ in placement.nodes), self.target.cluster)
            obj = self._get(target)
            if is_admitted(target.kind, obj, key, value):
                ours = (admission_record(obj) or {}).get("workload") == workload.id
                return ActionResult(True, f"kubernetes: {target.kind} {_ref(target)} already admitted"
                                          f"{_on(key, value)}",
                                    detail={"path": path, "patched": False, **(_tell_keys(obj) if ours else {})})
            if (obj.get("spec") or {}).get("suspend") is not True:
                return ActionResult(False, f"kubernetes: {target.kind} {_ref(target)} is running unsuspended "
                                           f"without {key}={value}: preempt it before admitting it again",
                                    detail={"path": path})
            after = admitted_object(target.kind, obj, workload.id, placement.gpu_type, key, value, nodes,
                                    self.gpu_resources)
            done = self._patch(target, obj, after)
        except ObjectError as exc:
            return ActionResult(False, f"kubernetes: cannot admit {target.kind} {_ref(target)}: {exc}",
                                detail={"path": path})
        except _Failed as failed:
            return failed.result
        pinned = f" on {', '.join(nodes)}" if nodes else ""
        return ActionResult(True, f"kubernetes: admitted {target.kind} {_ref(target)}{_on(key, value)}{pinned}",
                            detail={"path": path, "patched": True, **_tell_keys(done, obj)})

    def _suspend_once(self, target: Target, mark: tuple[str, str]) -> ActionResult:
        path = _path(target)
        verb = "cancelled" if mark[0] == CANCELLED_ANNOTATION else "suspended"
        try:
            obj = self._get(target, missing_ok=True)
            if obj is None:
                return ActionResult(True, f"kubernetes: {target.kind} {_ref(target)} is gone",
                                    detail={"path": path, "patched": False})
            notes = (obj.get("metadata") or {}).get("annotations") or {}
            done = (obj.get("spec") or {}).get("suspend") is True and ADMISSION_ANNOTATION not in notes
            if done and (mark[0] != CANCELLED_ANNOTATION or notes.get(CANCELLED_ANNOTATION) == "true"):
                ours = mark[0] in notes             # gpuq's own earlier stop: its Event has this name
                return ActionResult(True, f"kubernetes: {target.kind} {_ref(target)} already suspended",
                                    detail={"path": path, "patched": False, **(_tell_keys(obj) if ours else {})})
            patched = self._patch(target, obj, suspended_object(target.kind, obj, mark))
        except ObjectError as exc:
            return ActionResult(False, f"kubernetes: cannot suspend {target.kind} {_ref(target)}: {exc}",
                                detail={"path": path})
        except _Failed as failed:
            return failed.result
        return ActionResult(True, f"kubernetes: {verb} {target.kind} {_ref(target)}",
                            detail={"path": path, "patched": True, **_tell_keys(patched, obj)})

    def _evict_once(self, target: Target) -> ActionResult:
        path = f"/api/v1/namespaces/{target.namespace}/pods/{target.name}/eviction"
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": target.name, "namespace": target.namespace}}
        if not may_act(self.fence):
            return fenced(f"kubernetes: POST {path}")
        try:
            # the generated client sets no Content-Type for this call (nor honours _content_type)
            resp: Any = self._core.create_namespaced_pod_eviction(
                target.name, target.namespace, body,  # type: ignore[arg-type]
                _headers={"Content-Type": "application/json"}, _preload_content=False,
                _request_timeout=(self.timeout_s, self.timeout_s))
            _drain(resp)
        except ApiException as exc:
            if exc.status == 404:
                return ActionResult(True, f"kubernetes: pod {_ref(target)} is already gone",
                                    detail={"path": path, "status": 404})
            refusal = _budget_refusal(exc)
            if refusal is not None:           # not a failure: the budget allows it later
                return ActionResult(False, f"kubernetes: eviction of pod {_ref(target)} refused by "
                                           f"PodDisruptionBudget (POST {path}: HTTP 429): {refusal}: "
                                           "will retry", False,
                                    {"path": path, "verb": "POST", "status": 429, "refused": True})
            return self._api_failure("POST", path, exc)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return self._unreachable("POST", path, exc)
        return ActionResult(True, f"kubernetes: evicted pod {_ref(target)}", detail={"path": path, "tell": ""})

    # -- I/O --------------------------------------------------------------------------------------
    def _get(self, target: Target, missing_ok: bool = False) -> Any:
        path = _path(target)
        try:
            resp: Any = self._custom.get_namespaced_custom_object(
                RAY_GROUP, RAY_VERSION, target.namespace, PLURALS[target.kind], target.name,
                _preload_content=False, _request_timeout=(self.timeout_s, self.timeout_s))
            try:
                obj = json.loads(resp.data)
            finally:
                resp.release_conn()
        except ApiException as exc:
            if exc.status == 404 and missing_ok:
                return None
            raise _Failed(self._api_failure("GET", path, exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _Failed(self._unreachable("GET", path, exc)) from exc
        except ValueError as exc:
            raise _Failed(ActionResult(False, f"kubernetes: GET {path}: the answer is not JSON: {exc}",
                                       retryable=True, detail={"path": path})) from exc
        if not isinstance(obj, dict):
            raise _Failed(ActionResult(False, f"kubernetes: GET {path}: not an object",
                                       detail={"path": path}))
        return obj

    def _patch(self, target: Target, before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any] | None:
        """Kueue's strict merge patch: the diff plus the resourceVersion read (409 if it moved).
        Answers the object as patched (None when the answer is not a JSON object)."""
        path = _path(target)
        base = copy.deepcopy(dict(before))
        base.setdefault("metadata", {}).pop("resourceVersion", None)
        body = merge_patch(base, after)
        if not may_act(self.fence):               # the GET may have taken a while: ask again
            raise _Failed(fenced(f"kubernetes: PATCH {path}"))
        try:
            resp: Any = self._custom.patch_namespaced_custom_object(
                RAY_GROUP, RAY_VERSION, target.namespace, PLURALS[target.kind], target.name, body,
                _content_type=MERGE_PATCH, _preload_content=False,
                _request_timeout=(self.timeout_s, self.timeout_s))
            try:
                raw = resp.data
            finally:
                resp.release_conn()
        except ApiException as exc:
            raise _Failed(self._api_failure("PATCH", path, exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _Failed(self._unreachable("PATCH", path, exc)) from exc
        try:
            obj = json.loads(raw)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) else None

    def _retry(self, call: Callable[[], ActionResult]) -> ActionResult:
        return with_retries(call, attempts=self.attempts, backoff_s=self.backoff_s, sleep=self._sleep,
                            fence=self.fence)

    def _api_failure(self, verb: str, path: str, exc: ApiException) -> ActionResult:
        status = int(exc.status) if exc.status else 0
        if not status:
            return self._unreachable(verb, path, exc)
        message = exc.reason or ""
        try:
            body = json.loads(exc.body) if exc.body else {}
            message = f"{body.get('reason') or exc.reason}: {body.get('message') or ''}".rstrip(": ")
        except (ValueError, AttributeError):
            pass
        retryable = status not in NOT_RETRYABLE and (status >= 500 or status in (408, 409, 429))
        return ActionResult(False, f"kubernetes: {verb} {path} failed: HTTP {status} {message}", retryable,
                            {"path": path, "verb": verb, "status": status})

    def _unreachable(self, verb: str, path: str, exc: BaseException) -> ActionResult:
        inner = getattr(exc, "reason", None)
        text = str(inner if isinstance(inner, BaseException) else exc).splitlines()[0][:300]
        return ActionResult(False, f"kubernetes: {verb} {path} failed: cannot reach the API server at "
                                   f"{self.server}: {text}", True, {"path": path, "verb": verb})


def _path(target: Target) -> str:
    plural = PLURALS[target.kind]
    return f"/apis/{RAY_GROUP}/{RAY_VERSION}/namespaces/{target.namespace}/{plural}/{target.name}"


def _ref(target: Target) -> str:
    return f"{target.namespace}/{target.name}" if target.namespace else target.name


def _budget_refusal(exc: ApiException) -> str | None:
    """The cause's message when a 429 is the Eviction API's PodDisruptionBudget refusal
    (``details.causes[].reason == "DisruptionBudget"``), else None."""
    if exc.status != 429:
        return None
    try:
        body = json.loads(exc.body) if exc.body else {}
    except (ValueError, TypeError):
        return None
    causes = [c for c in ((body.get("details") or {}).get("causes") or []) if isinstance(c, dict)]
    budget = [c for c in causes if c.get("reason") == "DisruptionBudget"]
    if not budget:
        return None
    return str(budget[0].get("message") or body.get("message") or "")


def _drain(resp: Any) -> None:
    """Read the answer before giving the connection back: an unread body would be read as the
    next answer on the same pooled connection."""
    try:
        resp.data  # noqa: B018 - reading is the point
    finally:
        resp.release_conn()


def _tell_keys(obj: Mapping[str, Any] | None, read: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``detail`` keys asking :meth:`KubernetesActuator._tell` for an Event: the uid and the
    object's generation after the change (its Event's token; ``read``'s + 1 when the PATCH
    answer had none, the next generation a spec change gives)."""
    meta = (obj or {}).get("metadata") or {}
    gen = meta.get("generation")
    if gen is None and read is not None:
        before = ((read.get("metadata") or {}).get("generation"))
        gen = int(before) + 1 if isinstance(before, int) else None
    uid = meta.get("uid") or ((read or {}).get("metadata") or {}).get("uid") or ""
    return {"tell": f"generation {gen}" if gen is not None else "", "uid": uid}


def _on(key: str, value: str | None) -> str:
    return f" (nodeSelector {key}={value})" if value is not None else ""
