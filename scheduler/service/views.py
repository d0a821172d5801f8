"""What the live scheduler shows: frozen views of its workloads, nodes, preemptions and dry runs,
and the counters its metrics read. The API serialises these with :func:`as_dict`.

Reason codes are :class:`scheduler.model.ReasonCode` values, plus three of the service's own:
``queued`` (arrived since the last cycle), ``preempted`` (requeued by a preemption this cycle)
and ``actuator_failed`` (the decision was made but the actuator could not carry it out; it is
tried again next cycle), ``preemption_incomplete`` (placed on GPUs a preemption was to free, which
did not complete: not admitted, decided again next cycle); while the actuator works (outside the service lock,
:mod:`scheduler.service.acting`) ``admitting``, ``preempting`` or ``cancelling``; and the brakes'
(:mod:`scheduler.service.brakes`): ``paused``, ``preemption_limited``, ``preemption_refused``.
``queue_not_allowed`` (a model code the service gives, not the cycle) holds a workload of the
Kubernetes source whose namespace may not use its queue: pending, never admitted. ``policy`` (:data:`scheduler.policy.POLICY`): pending, held out of the cycle, because it asks
more than its queue's policy allows (a Kubernetes object's priority or preemptibility).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from scheduler.actuators.base import Target
from scheduler.model import Placement, Running, Workload

PENDING, RUNNING, FINISHED, CANCELLED, REJECTED = "pending", "running", "finished", "cancelled", "rejected"
STATES = (PENDING, RUNNING, FINISHED, CANCELLED, REJECTED)
ACTIVE = frozenset({PENDING, RUNNING})

QUEUED, PREEMPTED, ACTUATOR_FAILED = "queued", "preempted", "actuator_failed"
PREEMPTION_INCOMPLETE = "preemption_incomplete"    # placed where victims that were not stopped run
QUEUE_NOT_ALLOWED = "queue_not_allowed"    # ReasonCode.QUEUE_NOT_ALLOWED's value
ADMITTING, PREEMPTING, CANCELLING = "admitting", "preempting", "cancelling"


@dataclass(frozen=True, slots=True)
class Reason:
    code: str
    message: str


@dataclass(slots=True)
class Entry:
    """The service's record of one workload (mutable, guarded by the service's lock)."""

    workload: Workload
    target: Target
    state: str
    left_s: float                      # running time still needed; 0: runs until told it finished
    reason: Reason | None = None
    running: Running | None = None
    first_start_s: float | None = None
    end_s: float | None = None
    preempted: int = 0
    message: str = ""                  # the actuator's last answer
    acting: str = ""                   # an action in flight: admitting | preempting | cancelling
    cancelling: bool = False           # a cancel is queued or in flight: not admitted, not a victim
    refused_until: float = float("-inf")   # a PodDisruptionBudget refused its eviction: not a victim before
    refusals: int = 0                  # refusals in a row (the backoff doubles)
    plan: Placement | None = None      # an admission in flight: where
    planned_s: float | None = None     # and when it was decided
    not_allowed: bool = False          # its namespace may not use its queue: held pending, not decided on
    owner: str = ""                    # who submitted it (``name (role)``; "" for the world's own)
    policy: str = ""                   # pending over its queue's policy (why): held out of the cycle
    # issue 21: the last checkpoint its submitter reported (the API, or gpuq.io/last-checkpoint), and
    # the GPU-seconds of work its preemptions threw away (the last one's, and all of them)
    last_checkpoint_s: float | None = None
    lost_last: float = 0.0
    lost_gpu_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class WorkloadView:
    id: str
    queue: str
    state: str
    pods: int
    gpus_per_pod: int | float          # GPUs as output carries them: an int when whole (issue 19)
    gpus: int | float
    gpu_types: tuple[str, ...]
    priority: int
    preemptible: bool
    submit_s: float
    duration_s: float | None
    start_s: float | None
    end_s: float | None
    gpu_type: str | None
    placement: dict[str, int | float] | None
    reason_code: str | None
    message: str | None
    position: int | None               # 1-based among its queue's pending workloads
    preempted: int
    idle: bool
    target: dict[str, Any]
    actuator_message: str
    acting: str | None = None          # admitting | preempting | cancelling while the actuator works
    expected_duration_s: float | None = None   # the running time its submitter declared
    # pending: when it is expected to start, ISO times {p10, p50, p90, at (when forecast)};
    # None while not forecast yet, held, or not pending (scheduler.service.forecasts)
    eta: dict[str, str] | None = None
    # issue 21: its last checkpoint as reported (scheduler clock), and what its preemptions cost
    last_checkpoint_s: float | None = None
    lost_gpu_seconds: float = 0.0
    # another scheduler's pending workload (queues_from: kueue): what gpuq's own scheduler would do
    # with it (scheduler.service.advisor); None for gpuq's own workloads and while not advised yet
    advice: Advice | None = None
    # another scheduler's pending workload: whose ``position`` it is, ``kueue`` (Kueue's visibility
    # API) or ``computed`` (gpuq's rank in that scheduler's order); None for gpuq's own
    position_source: str | None = None


@dataclass(frozen=True, slots=True)
class NodeView:
    name: str
    gpu_type: str
    gpus: int
    used: int | float                  # shares held count as shares (issue 19)
    free: int | float
    workloads: tuple[str, ...]
    # the devices gpuq's gangs of shares hold part of: device slot -> the share in use (issue 19).
    # A slot is one device for as long as shares hold it, not the device's index on the node
    devices: dict[str, int | float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PreemptionRecord:
    t: float
    preemptor: str
    queue: str
    victims: tuple[str, ...]
    victim_queues: tuple[str, ...]
    reason: str
    lost_gpu_seconds: float = 0.0        # the work its victims threw away (issue 21)


@dataclass(frozen=True, slots=True)
class Victim:
    id: str
    queue: str
    gpus: int | float
    priority: int


@dataclass(frozen=True, slots=True)
class DryRun:
    """``outcome``: ``admit`` (fits now), ``preempt`` (admitted now after ``victims`` stop),
    ``pending`` (with ``reason_code``/``message``/``position``) or ``reject`` (can never run).
    ``after_delay``: for a workload that must first wait its preemption delay, what the cycle at
    the end of the delay would do if nothing else changed. ``eta``: the start-time forecast of the
    workload had it arrived now (:mod:`scheduler.service.forecasts`)."""

    workload: str
    queue: str
    at_s: float
    outcome: str
    gpu_type: str | None = None
    placement: dict[str, int | float] | None = None
    victims: tuple[Victim, ...] = ()
    reason_code: str | None = None
    message: str | None = None
    position: int | None = None
    also_admitted: tuple[str, ...] = ()
    after_delay: DryRun | None = None
    eta: dict[str, str] | None = None       # when it would start (as WorkloadView.eta); None: rejected


@dataclass(frozen=True, slots=True)
class Advice:
    """What gpuq's scheduler would do with a workload another scheduler holds pending
    (:mod:`scheduler.service.advisor`), decided by the core on the snapshot of the live cycle with
    that scheduler's pending workloads added. ``outcome``: ``admit`` (fits now, at ``placement``),
    ``preempt`` (admitted after ``victims`` stop), ``wait`` (with gpuq's ``reason_code``,
    ``message`` and ``position`` in its queue), ``reject`` (can never run here) or ``none`` (gpuq
    cannot decide on it: ``message`` says why). ``after_delay``: a ``preempt`` that would come only
    once the workload's preemption delay is over (``at_s``). ``summary``: the one line people read
    (``gpuq explain``, the dashboards)."""

    outcome: str
    at_s: float
    summary: str
    gpu_type: str | None = None
    placement: dict[str, int | float] | None = None
    victims: tuple[Victim, ...] = ()
    reason_code: str | None = None
    message: str | None = None
    position: int | None = None
    after_delay: bool = False


BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# a workload's wait from submission to its first admission: seconds to a day
WAIT_BUCKETS_S = (1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0, 3600.0, 7200.0,
                  14400.0, 28800.0, 86400.0)


@dataclass(slots=True)
class ServiceStats:
    """Counters since the process started (the metrics read them at scrape time)."""

    cycles: int = 0
    cycle_seconds_sum: float = 0.0
    cycle_buckets: list[int] = field(default_factory=lambda: [0] * len(BUCKETS_S))
    last_cycle_s: float | None = None          # the scheduler clock of the last cycle
    last_cycle_duration_s: float = 0.0
    admissions: dict[str, int] = field(default_factory=dict)      # by queue
    preemptions: dict[str, int] = field(default_factory=dict)     # by victim queue
    lost_gpu_seconds: dict[str, float] = field(default_factory=dict)  # by victim queue: what they threw away
    submitted: dict[str, int] = field(default_factory=dict)
    rejected: dict[str, int] = field(default_factory=dict)
    actuator_failures: dict[str, int] = field(default_factory=dict)   # by verb
    actions_fenced: dict[str, int] = field(default_factory=dict)      # by verb: dropped at a lost Lease
    actuator_seconds: dict[str, float] = field(default_factory=dict)  # by verb: time in the actuator
    # by queue: bucket counts (WAIT_BUCKETS_S, cumulative), count and sum of first-admission waits
    wait_buckets: dict[str, list[int]] = field(default_factory=dict)
    wait_count: dict[str, int] = field(default_factory=dict)
    wait_sum_s: dict[str, float] = field(default_factory=dict)

    def observe_wait(self, queue: str, seconds: float) -> None:
        buckets = self.wait_buckets.setdefault(queue, [0] * len(WAIT_BUCKETS_S))
        for i, b in enumerate(WAIT_BUCKETS_S):
            if seconds <= b:
                buckets[i] += 1
        self.wait_count[queue] = self.wait_count.get(queue, 0) + 1
        self.wait_sum_s[queue] = self.wait_sum_s.get(queue, 0.0) + seconds

    def observe_cycle(self, seconds: float, now_s: float) -> None:
        self.cycles += 1
        self.cycle_seconds_sum += seconds
        self.last_cycle_s = now_s
        self.last_cycle_duration_s = seconds
        for i, b in enumerate(BUCKETS_S):
            if seconds <= b:
                self.cycle_buckets[i] += 1

    def copy(self) -> ServiceStats:
        return dataclasses.replace(self, cycle_buckets=list(self.cycle_buckets),
                                   admissions=dict(self.admissions), preemptions=dict(self.preemptions),
                                   submitted=dict(self.submitted), rejected=dict(self.rejected),
                                   actuator_failures=dict(self.actuator_failures),
                                   actions_fenced=dict(self.actions_fenced),
                                   actuator_seconds=dict(self.actuator_seconds),
                                   wait_buckets={q: list(b) for q, b in self.wait_buckets.items()},
                                   wait_count=dict(self.wait_count), wait_sum_s=dict(self.wait_sum_s))


def bump(counter: dict[str, int], key: str, n: int = 1) -> None:
    counter[key] = counter.get(key, 0) + n


def as_dict(value: Any) -> Any:
    """A view as plain JSON-able data (tuples as lists, nested views as dicts)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: as_dict(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (list, tuple)):
        return [as_dict(v) for v in value]
    if isinstance(value, dict):
        return {k: as_dict(v) for k, v in value.items()}
    return value
