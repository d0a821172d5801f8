"""Kubernetes Events telling a workload's owners what gpuq did to it.

One ``core/v1`` Event (``POST /api/v1/namespaces/<ns>/events`` through the real client's
``CoreV1Api.create_namespaced_event``) per action that changed the object, on the object itself
(``kubectl describe rayjob ...`` and ``kubectl get events`` show it):

============  =========  ===========================================================================
reason        type       when; message
============  =========  ===========================================================================
Admitted      Normal     admitted; ``admitted to queue <q> on <nodes> (<n> x <type>)``
Preempted     Warning    preempted (suspended, or a pod evicted); the preemption reason the scheduler
                         gives, as ``gpuq explain`` shows it
Suspended     Warning    suspended by a preempt call that gives no reason
Cancelled     Normal     cancelled (suspended and marked ``gpuq.io/cancelled``); ``cancelled by gpuq``
QueueNot-     Warning    the workload source holds it: its namespace may not use the queue it names
Allowed                  (:mod:`accounting.access`); the reason as ``gpuq explain`` shows it (posted by
                         :class:`~scheduler.actuators.k8s_workloads.KubernetesWorkloadSource`, once per
                         object generation and queue)
PolicyRefused Warning    not admitted: the object asks more than its queue's policy allows (its
                         priority or ``gpuq.io/preemptible: "false"``, :mod:`scheduler.policy`);
                         ``not admitted: priority 2147483647 above team-x's max_priority 0``
BadAnnotation Warning    an annotation the workload source could not read and left out, the workload
                         being scheduled without it (``gpuq.io/expected-duration``); the message
                         names the annotation (once per object generation and problem)
============  =========  ===========================================================================

``involvedObject``: apiVersion, kind, name, namespace and uid (when the actuator read the object);
``source.component: gpuq-scheduler``, ``reportingComponent: gpuq``, ``reportingInstance`` (the
host), ``action`` (Admit/Preempt/Suspend/Cancel/Refuse/Read), ``count: 1``, first/last timestamps.

**Idempotent-ish.** The Event's name is deterministic: ``<object>.gpuq-<action>-<12 hex>`` of
sha256(object uid or namespace/name, action, a token). For a RayJob/RayCluster the token is the
object's ``metadata.generation`` after the change (each admission or suspension changes ``spec``,
so bumps it), so a repeated call that finds the work already done posts the same name and the
server's 409 AlreadyExists means "already told"; for a pod, the minute of the eviction; for a
refusal, its message (the same refusal is told once). A
transient failure is retried (same name, so never two Events); no failure fails the action: it
is logged and counted in :attr:`EventRecorder.failures` (by reason) and named in the action's
``detail["event_error"]``.
"""
from __future__ import annotations

import collections
import datetime as dt
import hashlib
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client import CoreV1Api
from kubernetes.client.exceptions import ApiException

from scheduler.actuators.base import ActionResult, with_retries

log = logging.getLogger(__name__)

SOURCE_COMPONENT = "gpuq-scheduler"
REPORTING_COMPONENT = "gpuq"
#: verb -> (reason, type, action)
KINDS = {"admit": ("Admitted", "Normal", "Admit"), "preempt": ("Preempted", "Warning", "Preempt"),
         "suspend": ("Suspended", "Warning", "Suspend"), "cancel": ("Cancelled", "Normal", "Cancel"),
         "not-allowed": ("QueueNotAllowed", "Warning", "Refuse"),
         "refuse": ("PolicyRefused", "Warning", "Refuse"),
         "bad-annotation": ("BadAnnotation", "Warning", "Read")}
MESSAGE_LIMIT = 1024                   # events.k8s.io caps a note at 1 kB; keep core events the same


@dataclass(frozen=True, slots=True)
class Involved:
    """The object an Event is about."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""


def event_name(obj: Involved, verb: str, token: str) -> str:
    """``<object name>.gpuq-<verb>-<12 hex>``: a valid DNS subdomain, the same for the same input."""
    digest = hashlib.sha256(f"{obj.uid or obj.namespace + '/' + obj.name}\0{verb}\0{token}".encode()).hexdigest()
    stem = re.sub(r"[^a-z0-9.-]", "-", obj.name.lower())[:200].strip(".-") or "object"
    return f"{stem}.gpuq-{verb}-{digest[:12]}"


def event_body(obj: Involved, verb: str, message: str, name: str, now_s: float, instance: str) -> dict[str, Any]:
    reason, type_, action = KINDS[verb]
    stamp = dt.datetime.fromtimestamp(now_s, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    involved = {"apiVersion": obj.api_version, "kind": obj.kind, "name": obj.name, "namespace": obj.namespace}
    if obj.uid:
        involved["uid"] = obj.uid
    return {"apiVersion": "v1", "kind": "Event",
            "metadata": {"name": name, "namespace": obj.namespace},
            "involvedObject": involved, "reason": reason, "message": message[:MESSAGE_LIMIT], "type": type_,
            "action": action, "source": {"component": SOURCE_COMPONENT},
            "reportingComponent": REPORTING_COMPONENT, "reportingInstance": instance,
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1}


class EventRecorder:
    """Creates the Events; never raises. ``failures`` counts failed Events by reason."""

    def __init__(self, core: CoreV1Api, *, clock: Callable[[], float], instance: str, timeout_s: float,
                 retry: Callable[[Callable[[], ActionResult]], ActionResult] = with_retries) -> None:
        self._core, self._clock, self.instance, self.timeout_s, self._retry = core, clock, instance, timeout_s, retry
        self.failures: collections.Counter[str] = collections.Counter()
        self.created = 0

    def record(self, obj: Involved, verb: str, message: str, token: str | None = None) -> dict[str, str]:
        """Create the Event; answer what to add to the action's ``detail``: ``event`` (its name)
        and, when it could not be created, ``event_error``. ``token`` defaults to the minute."""
        now = self._clock()
        name = event_name(obj, verb, token if token is not None else str(int(now // 60)))
        body = event_body(obj, verb, message, name, now, self.instance)
        try:
            result = self._retry(lambda: self._post(obj.namespace, body))
        except Exception as exc:  # noqa: BLE001 - an Event must never fail the action
            result = ActionResult(False, f"{type(exc).__name__}: {exc}")
        if result.ok:
            self.created += result.detail.get("created", 0)
            return {"event": name}
        self.failures[KINDS[verb][0]] += 1
        log.warning("kubernetes: Event %s/%s (%s) for %s %s not created: %s", obj.namespace, name,
                    KINDS[verb][0], obj.kind, obj.name, result.message)
        return {"event": name, "event_error": result.message}

    def _post(self, namespace: str, body: dict[str, Any]) -> ActionResult:
        path = f"/api/v1/namespaces/{namespace}/events"
        try:
            # like the Eviction call, the generated client sets no Content-Type here
            resp: Any = self._core.create_namespaced_event(
                namespace, body,  # type: ignore[arg-type]
                _headers={"Content-Type": "application/json"}, _preload_content=False,
                _request_timeout=(self.timeout_s, self.timeout_s))
            try:
                resp.data  # noqa: B018 - read it all, or the pooled connection answers it next time
            finally:
                resp.release_conn()
        except ApiException as exc:
            status = int(exc.status or 0)
            if status == 409:                      # the same name: this action was already told
                return ActionResult(True, "exists", detail={"created": 0})
            try:
                detail = json.loads(exc.body or "").get("message") or exc.reason
            except (ValueError, TypeError, AttributeError):
                detail = exc.reason
            return ActionResult(False, f"POST {path} failed: HTTP {status} {detail or ''}".rstrip(),
                                retryable=status == 0 or status >= 500 or status == 429)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            return ActionResult(False, f"POST {path} failed: {exc}", retryable=True)
        return ActionResult(True, "created", detail={"created": 1})
