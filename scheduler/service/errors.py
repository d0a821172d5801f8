"""Errors of the live scheduler service (:mod:`scheduler.service`); the API maps each to a status.

Hierarchy (all :class:`scheduler.errors.SchedulerError`)::

    ServiceError                    base; ``retryable`` says whether trying again can help
    ├── UnknownWorkload             no workload with this id (404)
    ├── DuplicateWorkload           a pending or running workload has this id (409)
    ├── TakenWorkload               a closed workload of another caller has this id (409)
    ├── NotActive                   the workload has already finished, was cancelled or rejected (409)
    ├── InvalidWorkload             a field is invalid for this configuration; ``field`` names it (422)
    ├── QueueNotAllowed             the target's namespace may not use the queue (403)
    ├── ActuatorFailed              the actuator could not carry the action out (502, retryable)
    └── ConfigRejected              a new queue configuration would orphan live workloads
"""
from __future__ import annotations

from scheduler.errors import SchedulerError


class ServiceError(SchedulerError):
    def __init__(self, message: str) -> None:
        self.message = message
        super().__init__(message)


class UnknownWorkload(ServiceError):
    def __init__(self, workload: str) -> None:
        self.workload = workload
        super().__init__(f"no workload {workload!r}")


class DuplicateWorkload(ServiceError):
    def __init__(self, workload: str, state: str) -> None:
        self.workload = workload
        super().__init__(f"workload {workload!r} already exists and is {state}")


class TakenWorkload(ServiceError):
    """The id is a finished, cancelled or rejected workload that another caller submitted: ids are
    not handed over (its events, bills and history stay its submitter's)."""

    def __init__(self, workload: str, state: str) -> None:
        self.workload = workload
        super().__init__(f"workload id {workload!r} belongs to another caller (its workload is {state}); "
                         "choose another id")


class NotActive(ServiceError):
    def __init__(self, workload: str, state: str) -> None:
        self.workload = workload
        self.state = state
        super().__init__(f"workload {workload!r} is {state}: nothing to cancel")


class InvalidWorkload(ServiceError):
    """``field`` is the body field at fault (``queue``)."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class QueueNotAllowed(ServiceError):
    """The workload's target namespace may not use its queue (the queue file's ``namespaces``:
    :mod:`accounting.access`); the message names the rule, not the namespaces it lists."""

    slug = "queue-not-allowed"

    def __init__(self, queue: str, namespace: str, message: str) -> None:
        self.queue = queue
        self.namespace = namespace
        super().__init__(message)


class ActuatorFailed(ServiceError):
    retryable = True

    def __init__(self, workload: str, verb: str, message: str) -> None:
        self.workload = workload
        self.verb = verb
        super().__init__(f"{verb} {workload}: {message}")


class ConfigRejected(ServiceError):
    pass
