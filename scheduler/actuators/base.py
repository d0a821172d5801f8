"""The contract between the scheduler service and the actuators that carry out its decisions.

The service (the I/O shell around ``schedule()``) calls an actuator for every admission,
preemption and cancellation. Actuators are idempotent (admitting an already admitted
workload, suspending a suspended one, stopping a stopped job all answer ``ok``), do their own
retries with backoff for transient failures (:func:`with_retries`), and never raise for a
failure of the outside world: they answer an :class:`ActionResult` whose message becomes the
workload's reason ("kubernetes: PATCH rayjobs/team-a/train-1 failed: HTTP 403 ...").

Actuators, chosen by ``scheduler.actuator`` in the settings:

* ``dry-run``    :class:`DryRunActuator`: records what it would do; nothing is touched.
* ``kubernetes`` Kueue-style: a RayJob/RayCluster created with ``spec.suspend: true`` is admitted
  by unsuspending it with a node selector for its GPU type and required node affinity on the
  nodes gpuq chose (``kubernetes.io/hostname``), preempted by suspending it again (the original
  selectors and affinity restored); plain pods are preempted through the Eviction API, where a
  PodDisruptionBudget's refusal (429) is a "retry later"; each action is a Kubernetes Event.
* ``ray``        workloads submitted to gpuq are started with the Ray Job Submission API, a gang
  as a placement group pinned to the chosen nodes (:mod:`scheduler.actuators.ray_gang`), and
  stopped on preemption.

``gpuq serve`` calls them on worker threads outside the service's lock, each request bounded by
``scheduler.actuator_timeout_s`` (``kubernetes``) or ``scheduler.ray.timeout_s`` (``ray``) and each
action by ``scheduler.actuator_budget_s``
(:mod:`scheduler.service.acting`); with spans configured each call is a span
(:mod:`scheduler.actuators.traced`).

**Fencing** (issue 17, finding 5): with leader election, a replica that no longer holds the Lease
must not act, although its queued actions and retries would otherwise go on for up to the action
budget. A :data:`Fence` answers whether this replica may still act (``gpuq serve`` passes the
elector's :meth:`~scheduler.service.leader.LeaderElector.holds_lease`: a monotonic-clock check
against the last renewal, no API call). :func:`with_retries` asks it before every attempt, and the
``kubernetes`` and ``ray`` actuators ask it again right before each request that changes the world
(the PATCH, the eviction, the job submission or stop), after the reads that precede it. A fenced
call answers :func:`fenced` (``detail["fenced"]``, not retryable): nothing was sent. Without
election there is no fence (None): never fenced.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from scheduler.model import Placement, Workload

_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Target:
    """What a workload is in the real world.

    ``kind``: ``RayJob`` or ``RayCluster`` (KubeRay custom resources, ``api_version``
    ``ray.io/v1``), ``Pod``, ``RaySubmission`` (a Ray job gpuq submits itself: ``entrypoint``,
    ``runtime_env``, ``metadata``), or ``""`` for a workload known only to the scheduler.
    """

    kind: str = ""
    namespace: str = ""
    name: str = ""
    api_version: str = ""
    entrypoint: str = ""
    runtime_env: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)
    metadata: Mapping[str, str] = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, slots=True)
class ActionResult:
    ok: bool
    message: str = ""
    retryable: bool = False
    detail: Mapping[str, Any] = field(default_factory=lambda: _EMPTY)   # e.g. a Ray submission id


class Actuator(Protocol):
    @property
    def name(self) -> str: ...

    def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult: ...

    def preempt(self, workload: Workload, target: Target, reason: str) -> ActionResult: ...

    def cancel(self, workload: Workload, target: Target) -> ActionResult: ...


Fence = Callable[[], bool]
"""True while this replica may act (it holds the Lease); asked before each attempt and each
mutating request. None where there is no leader election: never fenced."""

FENCED = "fenced"           # detail key of an action the fence stopped


def fenced(what: str = "", after: ActionResult | None = None, tries: int = 0) -> ActionResult:
    """The answer of an action the fence stopped: before ``what`` (a request: not sent) or before
    it started; ``after``: the last answer when it stopped retries (``tries`` attempts made)."""
    why = "this replica no longer holds the Lease (fenced)"
    if after is None:
        return ActionResult(False, f"{what}: not sent: {why}" if what else f"not carried out: {why}", False,
                            {FENCED: True})
    return ActionResult(False, f"{after.message} (stopped after {tries} attempts: {why})", False,
                        {**after.detail, FENCED: True, "attempts": tries})


def may_act(fence: Fence | None) -> bool:
    return fence is None or fence()


@dataclass(frozen=True, slots=True)
class Action:
    verb: str                      # admit | preempt | cancel
    workload: str
    target: Target
    detail: str = ""


class DryRunActuator:
    """Records decisions; touches nothing. ``actions`` is what a real actuator would have done."""

    name = "dry-run"

    def __init__(self) -> None:
        self.actions: list[Action] = []

    def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        where = ", ".join(f"{n}:{g}" for n, g in placement.nodes)
        self.actions.append(Action("admit", workload.id, target, f"{placement.gpu_type} on {where}"))
        return ActionResult(True, f"dry-run: would admit on {placement.gpu_type} ({where})")

    def preempt(self, workload: Workload, target: Target, reason: str) -> ActionResult:
        self.actions.append(Action("preempt", workload.id, target, reason))
        return ActionResult(True, f"dry-run: would preempt ({reason})")

    def cancel(self, workload: Workload, target: Target) -> ActionResult:
        self.actions.append(Action("cancel", workload.id, target))
        return ActionResult(True, "dry-run: would cancel")


def with_retries(call: Callable[[], ActionResult], *, attempts: int = 4, backoff_s: float = 0.2,
                 cap_s: float = 5.0, sleep: Callable[[float], None] = time.sleep,
                 rng: random.Random | None = None, budget_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic, fence: Fence | None = None) -> ActionResult:
    """Retry ``call`` while it answers ``retryable`` failures, with capped, jittered backoff.
    ``budget_s``: no attempt starts after this long since the first (the action's total budget).
    A failure that outlived several attempts says so in its message and ``detail["attempts"]``.
    ``fence``: asked before every attempt, the first included; once it answers False no attempt
    starts (the answer is :func:`fenced`)."""
    rng = rng or random.Random()
    delay = backoff_s
    start = clock()
    if not may_act(fence):
        return fenced()
    result = call()
    tries = 1
    while tries < attempts and not result.ok and result.retryable and not result.detail.get(FENCED):
        pause = min(cap_s, delay) * (0.5 + rng.random() / 2)
        if budget_s is not None and clock() - start + pause >= budget_s:
            return ActionResult(False, f"{result.message} (gave up after {tries} attempts: the "
                                       f"{budget_s:g} s budget is spent)", True, {**result.detail, "attempts": tries})
        sleep(pause)
        if not may_act(fence):                   # lost the Lease while waiting: no further attempt
            return fenced(after=result, tries=tries)
        delay *= 2
        result = call()
        tries += 1
    if not result.ok and result.retryable and tries > 1:
        return ActionResult(False, f"{result.message} (gave up after {tries} attempts)", True,
                            {**result.detail, "attempts": tries})
    return result
