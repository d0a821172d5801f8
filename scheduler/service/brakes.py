"""The brakes on the scheduler's acting: the preemption limit and the admin pause.

* :class:`PreemptionBrake`: at most ``per_queue`` workloads of one queue (the victim's) and
  ``cluster`` workloads in all preempted in any sliding ``window_s`` (an hour). An admission
  whose victims would pass either limit is not carried out: its workload stays pending with the
  reason ``preemption_limited`` saying which limit, how many and when the next preemption is
  possible. The window is filled at start from the ``preempt`` events of the last hour
  (:func:`recent_preemptions`), so a restart does not release the brake.
* :class:`Pause`: while set (``POST /admin/pause``), every cycle still decides but no actuator is
  called; each decision shows as the workload's reason (``paused``: "would admit on ..." /
  "would preempt ..."). Pausing and resuming are ``pause``/``resume`` rows in
  ``scheduler_events`` (``by`` who, ``reason`` why), and the last one is read at start
  (:func:`last_pause`), so a restart stays paused.

What the preemptions of the last day cost (issue 21, ``preemption_cost`` in the status) is read
at start the same way (:func:`recent_losses`).
"""
from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.events import TABLE, round_t
from scheduler.service.replay import read_pause

WINDOW_S = 3600.0
COST_WINDOW_S = 86400.0     # the window of what preemptions cost in GET /scheduler/status (issue 21)
PAUSE_KINDS = ("pause", "resume")
LIMITED, PAUSED, REFUSED = "preemption_limited", "paused", "preemption_refused"


@dataclass(frozen=True, slots=True)
class Pause:
    since_s: float
    by: str = ""
    reason: str = ""


class PreemptionBrake:
    def __init__(self, per_queue: int | None = None, cluster: int | None = None, window_s: float = WINDOW_S) -> None:
        self.per_queue, self.cluster, self.window_s = per_queue, cluster, window_s
        self._times: deque[tuple[float, str]] = deque()      # (t, victim queue), oldest first
        self.limited: dict[str, int] = {}                     # admissions deferred, by the preemptor's queue

    def load(self, preempts: Iterable[tuple[float, str]]) -> None:
        for t, q in sorted(preempts):
            self._times.append((float(t), q))

    def record(self, t: float, queue: str) -> None:
        self._times.append((t, queue))

    def forget(self, t: float, queue: str) -> None:
        """Take back one :meth:`record` (the preemption did not happen)."""
        for i in range(len(self._times) - 1, -1, -1):
            if self._times[i] == (t, queue):
                del self._times[i]
                return

    def _prune(self, now: float) -> None:
        while self._times and self._times[0][0] <= now - self.window_s:
            self._times.popleft()

    def counts(self, now: float) -> dict[str, int]:
        """Preemptions in the window ending at ``now``, by the victim's queue."""
        self._prune(now)
        out: dict[str, int] = {}
        for t, q in self._times:
            if t <= now:
                out[q] = out.get(q, 0) + 1
        return out

    def check(self, now: float, victims: Sequence[tuple[str, str]]) -> str | None:
        """None when preempting ``victims`` ((id, queue) pairs) now stays within the limits, else why not."""
        if not victims or (self.per_queue is None and self.cluster is None):
            return None
        counts = self.counts(now)
        names = ", ".join(v for v, _ in victims)
        if self.cluster is not None and sum(counts.values()) + len(victims) > self.cluster:
            return (f"would preempt {names}, but the preemption limit holds: {sum(counts.values())} workloads "
                    f"preempted in the last {self.window_s / 3600:g} h (scheduler.preemption_limit."
                    f"cluster_per_hour {self.cluster}); next possible at t={self._next(now, None)}")
        if self.per_queue is not None:
            want: dict[str, int] = {}
            for _, q in victims:
                want[q] = want.get(q, 0) + 1
            for q, k in sorted(want.items()):
                if counts.get(q, 0) + k > self.per_queue:
                    return (f"would preempt {names}, but the preemption limit holds: {counts.get(q, 0)} "
                            f"workloads of queue {q} preempted in the last {self.window_s / 3600:g} h "
                            f"(scheduler.preemption_limit.per_queue_per_hour {self.per_queue}); next possible "
                            f"at t={self._next(now, q)}")
        return None

    def _next(self, now: float, queue: str | None) -> float:
        times = [t for t, q in self._times if queue is None or q == queue]
        return round_t(times[0] + self.window_s) if times else round_t(now)


def recent_preemptions(store: Any, cluster: str, since_s: float) -> list[tuple[float, str]]:
    """``(t, victim queue)`` of the cluster's ``preempt`` events since ``since_s``."""
    sql = (f"SELECT t, queue FROM {store.database}.{TABLE} WHERE cluster = {{c:String}} "
           f"AND event = 'preempt' AND t >= {{s:Float64}} ORDER BY t")
    return [(float(r[0]), str(r[1])) for r in store.query(sql, {"c": cluster, "s": since_s}).rows]


def recent_losses(store: Any, cluster: str, since_s: float) -> list[tuple[float, str, float]]:
    """``(t, victim queue, lost GPU-seconds)`` of the cluster's ``preempt`` events after ``since_s``,
    oldest first (issue 21: what they cost, for :meth:`SchedulerService.preemption_cost`)."""
    sql = (f"SELECT t, queue, lost_gpu_seconds FROM {store.database}.{TABLE} WHERE cluster = {{c:String}} "
           f"AND event = 'preempt' AND t > {{s:Float64}} ORDER BY t, seq")
    return [(float(r[0]), str(r[1]), float(r[2])) for r in store.query(sql, {"c": cluster, "s": since_s}).rows]


def last_pause(store: Any, cluster: str) -> Pause | None:
    """The pause in force (None: not paused), from ``scheduler_state``, which no TTL drops: a pause
    older than the events' retention still holds after a restart."""
    event = read_pause(store, cluster)
    if event is None:
        return None
    return Pause(float(event["t"]), str(event.get("by") or ""), str(event.get("reason") or ""))
