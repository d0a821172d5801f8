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
  whole, so ``workerGroupSpecs`` goes complete) and
  ``metadata.resourceVersion`` (Kueue's *strict* patch: a concurrent change answers 409, and the
  next attempt re-GETs and re-applies). A template that already selects another value for the key
  is a conflict (Kueue's ``podset.Merge``): not retryable. Kueue keeps the templates' original
  node selectors in its Workload object to restore them on suspension; gpuq has no such object,
  so the same patch stores them in the annotation ``gpuq.io/admission`` (JSON: workload, gpuType,
  nodeSelectors in template order, ``null`` where there was none).
* **preempt** / **cancel** a RayJob/RayCluster: one merge patch with ``spec.suspend: true``, the
  original node selectors restored from ``gpuq.io/admission`` (which is removed), the
  resourceVersion, and a mark: ``gpuq.io/preempted: <reason>`` or ``gpuq.io/cancelled: "true"``.
  Cancel means "stop scheduling it": suspended and marked, never deleted (the user's object,
  status and logs stay; :mod:`scheduler.actuators.k8s_workloads` skips cancelled objects; a user
  requeues by removing the annotation). Admission clears both marks.
* **preempt** / **cancel** a plain ``Pod``: ``POST /api/v1/namespaces/<ns>/pods/<name>/eviction``
  with a ``policy/v1`` ``Eviction`` (Kueue deletes plain pods after a status patch; the Eviction
  API respects PodDisruptionBudgets and sets the pod's DisruptionTarget condition itself).
  429 (a PodDisruptionBudget forbids it now) is a retryable failure carrying the API's message;
  404 means the pod is already gone: ok.

Idempotent: admitting an unsuspended object that already selects the type, or suspending a
suspended object with nothing to restore, answers ok without a PATCH (``detail["patched"]``).
Every call goes through :func:`with_retries`: 5xx, 429, 409 and connection errors are retried
(each attempt GETs afresh); 400/401/403/404/405/422 are not. Failures name the verb, the API
path, the status and the API's message.
"""
from __future__ import annotations

import copy
import json
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import urllib3
from kubernetes.client import ApiClient, CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException

from gpuq.kube import load_configuration
from gpuq.settings import KubernetesTarget, Settings
from scheduler.actuators.base import ActionResult, Target, with_retries
from scheduler.model import Placement, Workload

log = logging.getLogger(__name__)

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
ADMISSION_ANNOTATION = "gpuq.io/admission"
PREEMPTED_ANNOTATION = "gpuq.io/preempted"
CANCELLED_ANNOTATION = "gpuq.io/cancelled"
MERGE_PATCH = "application/merge-patch+json"
RAY_GROUP, RAY_VERSION = "ray.io", "v1"
PLURALS = {"RayJob": "rayjobs", "RayCluster": "rayclusters"}
NOT_RETRYABLE = frozenset({400, 401, 403, 404, 405, 415, 422})


class ObjectError(ValueError):
    """The object cannot be handled as asked (no pod templates, a node selector conflict)."""


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


# -- the object's shape (pure) --------------------------------------------------------------------
def pod_templates(kind: str, obj: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(where, template)`` for the head, each worker group and a RayJob's explicit
    ``submitterPodTemplate``, in that order (the dicts of ``obj`` itself, for editing a copy)."""
    spec = obj.get("spec") or {}
    cluster = spec.get("rayClusterSpec") if kind == "RayJob" else spec
    prefix = "spec.rayClusterSpec" if kind == "RayJob" else "spec"
    if not isinstance(cluster, dict):
        raise ObjectError(f"{prefix} is missing (a RayJob on an existing cluster has no pods to admit)")
    out: list[tuple[str, dict[str, Any]]] = []
    head = (cluster.get("headGroupSpec") or {}).get("template")
    if not isinstance(head, dict):
        raise ObjectError(f"{prefix}.headGroupSpec.template is missing")
    out.append((f"{prefix}.headGroupSpec.template", head))
    for i, group in enumerate(cluster.get("workerGroupSpecs") or ()):
        tmpl = group.get("template") if isinstance(group, dict) else None
        if not isinstance(tmpl, dict):
            raise ObjectError(f"{prefix}.workerGroupSpecs[{i}].template is missing")
        out.append((f"{prefix}.workerGroupSpecs[{i}].template", tmpl))
    if kind == "RayJob" and isinstance(spec.get("submitterPodTemplate"), dict):
        out.append(("spec.submitterPodTemplate", spec["submitterPodTemplate"]))
    return out


def merge_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch turning ``before`` into ``after`` (removed keys -> ``null``;
    a changed list is sent whole), as ``jsonpatch.CreateMergePatch`` computes it."""
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        old = before.get(key, _MISSING)
        if isinstance(value, dict) and isinstance(old, dict):
            sub = merge_patch(old, value)
            if sub:
                patch[key] = sub
        elif old is _MISSING or old != value:
            patch[key] = value
    return patch


_MISSING = object()


def _annotations(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta.get("annotations"), dict):
        meta["annotations"] = {}
    return meta["annotations"]  # type: ignore[no-any-return]


def admission_record(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(ADMISSION_ANNOTATION)
    try:
        rec = json.loads(raw) if raw else None
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def restore_node_selectors(kind: str, obj: dict[str, Any]) -> None:
    """Put back the node selectors recorded at admission (in place; Kueue's RestorePodSpec). When
    the templates changed in number since, only the injected key=value pairs are removed."""
    rec = admission_record(obj)
    if rec is None:
        return
    templates = pod_templates(kind, obj)
    saved = rec.get("nodeSelectors")
    if isinstance(saved, list) and len(saved) == len(templates):
        for (_, tmpl), sel in zip(templates, saved):
            _set_selector(tmpl, dict(sel) if isinstance(sel, dict) else None)
        return
    key, value = rec.get("key") or GPU_PRODUCT_LABEL, rec.get("value")
    for _, tmpl in templates:
        sel = dict((tmpl.get("spec") or {}).get("nodeSelector") or {})
        if sel.get(key) == value:
            del sel[key]
            _set_selector(tmpl, sel or None)


def _set_selector(tmpl: dict[str, Any], selector: dict[str, str] | None) -> None:
    spec = tmpl.setdefault("spec", {})
    if selector:
        spec["nodeSelector"] = selector
    else:
        spec.pop("nodeSelector", None)


def _selector(tmpl: Mapping[str, Any]) -> dict[str, str]:
    return dict((tmpl.get("spec") or {}).get("nodeSelector") or {})


def is_admitted(kind: str, obj: Mapping[str, Any], key: str, value: str | None) -> bool:
    """Unsuspended, and every template selects ``key=value`` (any selector when ``value`` is None)."""
    if (obj.get("spec") or {}).get("suspend") is True:
        return False
    return value is None or all(_selector(t).get(key) == value for _, t in pod_templates(kind, obj))


def admitted_object(kind: str, obj: Mapping[str, Any], workload_id: str, gpu_type: str,
                    key: str, value: str | None) -> dict[str, Any]:
    """A copy of ``obj`` unsuspended with ``key=value`` merged into every pod template (Kueue's
    RunWithPodSetsInfo), the originals recorded, the stop marks cleared. ObjectError on conflict."""
    after = copy.deepcopy(dict(obj))
    restore_node_selectors(kind, after)               # a stale record: start from the originals
    templates = pod_templates(kind, after)
    originals = [(_selector(t) or None) for _, t in templates]
    if value is not None:
        for where, tmpl in templates:
            sel = _selector(tmpl)
            if sel.get(key, value) != value:
                raise ObjectError(f"nodeSelector conflict in {where}: {key}={sel[key]!r}, "
                                  f"admission wants {value!r}")
            _set_selector(tmpl, {**sel, key: value})
    after.setdefault("spec", {})["suspend"] = False
    notes = _annotations(after)
    notes[ADMISSION_ANNOTATION] = json.dumps(
        {"workload": workload_id, "gpuType": gpu_type, "key": key, "value": value,
         "nodeSelectors": originals}, separators=(",", ":"), sort_keys=True)
    notes.pop(PREEMPTED_ANNOTATION, None)
    notes.pop(CANCELLED_ANNOTATION, None)
    return after


def suspended_object(kind: str, obj: Mapping[str, Any], mark: tuple[str, str]) -> dict[str, Any]:
    """A copy of ``obj`` suspended, its node selectors restored and ``mark`` annotated."""
    after = copy.deepcopy(dict(obj))
    restore_node_selectors(kind, after)
    after.setdefault("spec", {})["suspend"] = True
    notes = _annotations(after)
    notes.pop(ADMISSION_ANNOTATION, None)
    notes[mark[0]] = mark[1]
    return after


# -- the actuator ---------------------------------------------------------------------------------
class _Failed(Exception):
    def __init__(self, result: ActionResult) -> None:
        super().__init__(result.message)
        self.result = result


class KubernetesActuator:
    """Kueue-style actuator over the real ``kubernetes`` client.

    ``target``: the cluster (default: the first ``collector.kubernetes`` target); ``node_labels``:
    GPU type -> value of ``node_label_key`` (default: the queue file's ``gpu_types.*.node_labels``;
    an unlisted type is its own value); ``attempts``/``backoff_s``: :func:`with_retries`.
    """

    name = "kubernetes"

    def __init__(self, settings: Settings, *, target: KubernetesTarget | None = None,
                 api_client: ApiClient | None = None, node_labels: Mapping[str, str] | None = None,
                 node_label_key: str = GPU_PRODUCT_LABEL, attempts: int = 4, backoff_s: float = 0.2,
                 timeout_s: float = 10.0, sleep: Callable[[float], None] = time.sleep) -> None:
        self.target = target or kubernetes_target(settings)
        self._client = api_client or make_api_client(self.target)
        self._custom = CustomObjectsApi(self._client)
        self._core = CoreV1Api(self._client)
        self.node_labels = dict(node_labels) if node_labels is not None else gpu_node_labels(settings)
        self.node_label_key = node_label_key
        self.attempts, self.backoff_s, self.timeout_s, self._sleep = attempts, backoff_s, timeout_s, sleep
        self.server = str(self._client.configuration.host)

    def close(self) -> None:
        self._client.close()  # type: ignore[no-untyped-call]

    def label_value(self, gpu_type: str) -> str | None:
        """The node label value selecting ``gpu_type`` (None for "any type")."""
        return self.node_labels.get(gpu_type, gpu_type) if gpu_type else None

    # -- the protocol ---------------------------------------------------------------------------
    def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        if target.kind not in PLURALS:
            return ActionResult(False, f"kubernetes: cannot admit a {target.kind or 'target-less'} workload "
                                       f"{_ref(target)}: only RayJob and RayCluster are admitted")
        return self._retry(lambda: self._admit_once(workload, target, placement.gpu_type))

    def preempt(self, workload: Workload, target: Target, reason: str) -> ActionResult:
        return self._stop(target, (PREEMPTED_ANNOTATION, reason[:250] or "preempted"))

    def cancel(self, workload: Workload, target: Target) -> ActionResult:
        return self._stop(target, (CANCELLED_ANNOTATION, "true"))

    def _stop(self, target: Target, mark: tuple[str, str]) -> ActionResult:
        if target.kind == "Pod":
            return self._retry(lambda: self._evict_once(target))
        if target.kind not in PLURALS:
            return ActionResult(False, f"kubernetes: cannot stop a {target.kind or 'target-less'} workload "
                                       f"{_ref(target)}: only RayJob, RayCluster and Pod")
        return self._retry(lambda: self._suspend_once(target, mark))

    # -- one attempt each -------------------------------------------------------------------------
    def _admit_once(self, workload: Workload, target: Target, gpu_type: str) -> ActionResult:
        path = _path(target)
        key, value = self.node_label_key, self.label_value(gpu_type)
        try:
            obj = self._get(target)
            if is_admitted(target.kind, obj, key, value):
                return ActionResult(True, f"kubernetes: {target.kind} {_ref(target)} already admitted"
                                          f"{_on(key, value)}", detail={"path": path, "patched": False})
            if (obj.get("spec") or {}).get("suspend") is not True:
                return ActionResult(False, f"kubernetes: {target.kind} {_ref(target)} is running unsuspended "
                                           f"without {key}={value}: preempt it before admitting it again",
                                    detail={"path": path})
            after = admitted_object(target.kind, obj, workload.id, gpu_type, key, value)
            self._patch(target, obj, after)
        except ObjectError as exc:
            return ActionResult(False, f"kubernetes: cannot admit {target.kind} {_ref(target)}: {exc}",
                                detail={"path": path})
        except _Failed as failed:
            return failed.result
        return ActionResult(True, f"kubernetes: admitted {target.kind} {_ref(target)}{_on(key, value)}",
                            detail={"path": path, "patched": True})

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
                return ActionResult(True, f"kubernetes: {target.kind} {_ref(target)} already suspended",
                                    detail={"path": path, "patched": False})
            self._patch(target, obj, suspended_object(target.kind, obj, mark))
        except ObjectError as exc:
            return ActionResult(False, f"kubernetes: cannot suspend {target.kind} {_ref(target)}: {exc}",
                                detail={"path": path})
        except _Failed as failed:
            return failed.result
        return ActionResult(True, f"kubernetes: {verb} {target.kind} {_ref(target)}",
                            detail={"path": path, "patched": True})

    def _evict_once(self, target: Target) -> ActionResult:
        path = f"/api/v1/namespaces/{target.namespace}/pods/{target.name}/eviction"
        body = {"apiVersion": "policy/v1", "kind": "Eviction",
                "metadata": {"name": target.name, "namespace": target.namespace}}
        try:
            # the generated client sets no Content-Type for this call (nor honours _content_type)
            resp: Any = self._core.create_namespaced_pod_eviction(
                target.name, target.namespace, body,  # type: ignore[arg-type]
                _headers={"Content-Type": "application/json"}, _preload_content=False,
                _request_timeout=(self.timeout_s, self.timeout_s))
            resp.release_conn()
        except ApiException as exc:
            if exc.status == 404:
                return ActionResult(True, f"kubernetes: pod {_ref(target)} is already gone",
                                    detail={"path": path, "status": 404})
            return self._api_failure("POST", path, exc)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return self._unreachable("POST", path, exc)
        return ActionResult(True, f"kubernetes: evicted pod {_ref(target)}", detail={"path": path})

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

    def _patch(self, target: Target, before: Mapping[str, Any], after: Mapping[str, Any]) -> None:
        """Kueue's strict merge patch: the diff plus the resourceVersion read (409 if it moved)."""
        path = _path(target)
        base = copy.deepcopy(dict(before))
        base.setdefault("metadata", {}).pop("resourceVersion", None)
        body = merge_patch(base, after)
        try:
            resp: Any = self._custom.patch_namespaced_custom_object(
                RAY_GROUP, RAY_VERSION, target.namespace, PLURALS[target.kind], target.name, body,
                _content_type=MERGE_PATCH, _preload_content=False,
                _request_timeout=(self.timeout_s, self.timeout_s))
            resp.release_conn()
        except ApiException as exc:
            raise _Failed(self._api_failure("PATCH", path, exc)) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise _Failed(self._unreachable("PATCH", path, exc)) from exc

    def _retry(self, call: Callable[[], ActionResult]) -> ActionResult:
        return with_retries(call, attempts=self.attempts, backoff_s=self.backoff_s, sleep=self._sleep)

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


def _on(key: str, value: str | None) -> str:
    return f" (nodeSelector {key}={value})" if value is not None else ""
