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
  it is taken again as new. An object whose labels ask more than its queue's policy allows
  (``gpuq.io/priority`` above ``max_priority``, ``gpuq.io/preemptible: "false"`` where
  non-preemptible work is not allowed: :mod:`scheduler.policy`) is submitted but held pending with
  the reason ``policy``, and told so by a ``PolicyRefused`` Event on the object; fixed, it is taken
  again as it is. A listed object's ``gpuq.io/last-checkpoint`` annotation (the source's
  ``checkpoints``; issue 21) is its workload's last checkpoint, as ``POST /workloads/{id}/checkpoint``
  reports one: the ``Workload`` is immutable and the annotation moves as the job saves, so it is fed
  to the service's entry (:meth:`SchedulerService.checkpoint`: only a later one moves it), and a
  preemption then throws away only the work since it.
* **ray**: :func:`sync_ray` asks the Ray actuator for the status of each running
  ``RaySubmission`` workload; a job that ended (SUCCEEDED, FAILED, or STOPPED by someone else)
  finishes the workload.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
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
    held: tuple[str, ...] = ()            # pending, held for their queue's policy


Tell = Callable[[Workload, Target, str], Any]


def sync_listed(service: SchedulerService, source: WorkloadLister, now: float, tell: Tell | None = None,
                told: dict[str, str] | None = None) -> SyncReport:
    """One sync (the module's rules). A listed object the service holds for its queue's policy
    (:mod:`scheduler.policy`: the priority or non-preemptibility its labels ask is over its queue's
    bound) is told so by ``tell`` (the actuator's :meth:`refuse`: an Event on the object), once per
    refusal: ``told`` (id -> message told) remembers across syncs. Such an object that changed since
    (its labels fixed) is taken again as it is now."""
    pending, admitted = source.pending(), source.admitted()
    listed = {w.id for w, _ in pending} | {w.id for w, _, _ in admitted}
    submitted, removed, unknown, held, not_allowed = [], [], [], [], []
    refused = getattr(source, "refused", None)
    for w, t in pending:
        hold = service.policy_hold(w.id)
        if hold is not None and hold[0] != service.as_held(w, t.namespace):
            service.remove(w.id, now, "its object changed while held for its queue's policy")
        state = service.state_of(w.id)
        held_in = service.not_allowed_queue(w.id) if state == "pending" else None
        if held_in is not None and held_in != service.as_held(w, t.namespace, placed=False).queue:   # relabelled
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
                not_allowed.append(w.id)
                log.warning("%s not admitted: %s", w.id, view.message)
                if refused is not None:
                    refused(w, t, NOT_ALLOWED, view.message or "")
                continue
        hold = service.policy_hold(w.id)
        if hold is not None:
            held.append(w.id)
            if told is None or told.get(w.id) != hold[1]:
                log.warning("%s not admitted: %s", w.id, hold[1])
                if tell is not None:
                    tell(w, t, hold[1])
                if told is not None:
                    told[w.id] = hold[1]
    known = service.checkpoints()
    for wid, at in (getattr(source, "checkpoints", None) or {}).items():
        if (wid not in known or at > known[wid]) and service.state_of(wid) in ("running", "pending"):
            service.checkpoint(wid, at, now)
    for w, _, _ in admitted:
        if service.state_of(w.id) not in ("running", "pending"):
            unknown.append(w.id)
            log.warning("%s was admitted by gpuq but is unknown to the scheduler (its events are lost)", w.id)
    for wid in service.active_ids():
        if wid.startswith(SOURCE_ID_PREFIXES) and wid not in listed:
            service.remove(wid, now, "its object was deleted")
            removed.append(wid)
    if told is not None:
        for wid in [wid for wid in told if wid not in held]:
            del told[wid]
    return SyncReport(tuple(submitted), tuple(removed), tuple(unknown), tuple(not_allowed), tuple(held))


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


def world_sync(settings: Any, service: SchedulerService, actuator: Actuator,
               replicas: Callable[[], Mapping[str, int]] = lambda: {}) -> Callable[[float], Any] | None:
    """The sync for the configured actuator, or None (dry-run: workloads come from the API only).
    ``replicas``: the time-sliced GPU types now (``LiveAccounting.replicas_by_type``)."""
    if actuator.name == "kubernetes":
        from scheduler.actuators.k8s_workloads import KubernetesWorkloadSource

        source = KubernetesWorkloadSource(settings, replicas=replicas)
        told: dict[str, str] = {}
        return lambda now: sync_listed(service, source, now, tell=getattr(actuator, "refuse", None), told=told)
    if actuator.name == "ray":
        return lambda now: sync_ray(service, actuator, now)
    return None

