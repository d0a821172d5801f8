"""Keeping the live scheduler in step with the world (``gpuq serve`` calls :func:`world_sync`'s
function every ``accounting.interval_s``).

* **kubernetes**: :class:`scheduler.actuators.k8s_workloads.KubernetesWorkloadSource` lists the
  suspended RayJobs/RayClusters that carry a queue (``pending``) and those gpuq admitted
  (``admitted``). :func:`sync_listed` submits the pending ones the service does not hold (ids
  ``rayjob/<ns>/<name>``, ``raycluster/<ns>/<name>``; one it rejected is not submitted again),
  and removes the source's workloads whose object is gone (deleted: a running one finishes, a
  pending one is cancelled). An admitted object the service does not hold (its events are lost)
  is only logged: the service cannot know its placement. An object whose namespace may not use
  the queue it names (:mod:`accounting.access`) is held pending with ``queue_not_allowed`` and
  gets one Kubernetes Event saying so (the source's ``refused``); relabelled to another queue,
  it is taken again as new.
* **ray**: :func:`sync_ray` asks the Ray actuator for the status of each running
  ``RaySubmission`` workload; a job that ended (SUCCEEDED, FAILED, or STOPPED by someone else)
  finishes the workload.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from scheduler.actuators.base import Actuator, Target
from scheduler.errors import SchedulerError
from scheduler.model import SOURCE_ID_PREFIXES, ReasonCode, Workload
from scheduler.service.core import SchedulerService
from scheduler.service.errors import ServiceError

log = logging.getLogger(__name__)
NOT_ALLOWED = ReasonCode.QUEUE_NOT_ALLOWED.value

class WorkloadLister(Protocol):
    def pending(self) -> list[tuple[Workload, Target]]: ...

    def admitted(self) -> list[tuple[Workload, Target, str]]: ...


@dataclass(frozen=True, slots=True)
class SyncReport:
    submitted: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    unknown_admitted: tuple[str, ...] = ()
    not_allowed: tuple[str, ...] = ()          # submitted now and held: the namespace may not use the queue


def sync_listed(service: SchedulerService, source: WorkloadLister, now: float) -> SyncReport:
    pending, admitted = source.pending(), source.admitted()
    listed = {w.id for w, _ in pending} | {w.id for w, _, _ in admitted}
    submitted, removed, unknown, held = [], [], [], []
    refused = getattr(source, "refused", None)
    for w, t in pending:
        state = service.state_of(w.id)
        if state == "pending":
            view = service.explain(w.id)
            if view.reason_code == NOT_ALLOWED and view.queue != w.queue:     # relabelled: taken again
                service.remove(w.id, now, f"its object now names queue {w.queue}")
                state = "cancelled"
        if state in (None, "finished", "cancelled"):
            try:
                view = service.submit(w, t, now, hold_not_allowed=True)
                submitted.append(w.id)
            except ServiceError as exc:
                log.warning("cannot submit %s: %s", w.id, exc)
                continue
            if view.reason_code == NOT_ALLOWED:
                held.append(w.id)
                log.warning("%s not admitted: %s", w.id, view.message)
                if refused is not None:
                    refused(w, t, NOT_ALLOWED, view.message or "")
    for w, _, _ in admitted:
        if service.state_of(w.id) not in ("running", "pending"):
            unknown.append(w.id)
            log.warning("%s was admitted by gpuq but is unknown to the scheduler (its events are lost)", w.id)
    for wid in service.active_ids():
        if wid.startswith(SOURCE_ID_PREFIXES) and wid not in listed:
            service.remove(wid, now, "its object was deleted")
            removed.append(wid)
    return SyncReport(tuple(submitted), tuple(removed), tuple(unknown), tuple(held))


def sync_ray(service: SchedulerService, actuator: Any, now: float) -> list[str]:
    """Finish the running RaySubmission workloads whose Ray job ended; return their ids."""
    done = []
    for w, t in service.running_targets():
        if t.kind != "RaySubmission":
            continue
        try:
            state = actuator.status(w)
        except SchedulerError as exc:  # RayJobError: a job we cannot read now is read again next time
            log.warning("cannot read the Ray job of %s: %s", w.id, exc)
            continue
        if state is not None and state.finished and service.state_of(w.id) == "running":
            service.finish(w.id, now)
            done.append(w.id)
    return done


def world_sync(settings: Any, service: SchedulerService, actuator: Actuator) -> Callable[[float], Any] | None:
    """The sync for the configured actuator, or None (dry-run: workloads come from the API only)."""
    if actuator.name == "kubernetes":
        from scheduler.actuators.k8s_workloads import KubernetesWorkloadSource

        source = KubernetesWorkloadSource(settings)
        return lambda now: sync_listed(service, source, now)
    if actuator.name == "ray":
        return lambda now: sync_ray(service, actuator, now)
    return None

