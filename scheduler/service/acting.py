"""Where the scheduler's actuator calls run: :class:`Lanes`, a small pool of threads outside the
service lock, one action at a time per workload.

The service decides under its lock, marks the workloads concerned as in flight (``admitting``,
``preempting``, ``cancelling``: visible in ``/workloads`` and ``gpuq explain``) and submits one
job per action; a job calls the actuator without the lock and takes the lock again only to record
each answer. A job names the workloads it touches (an admission: its victims and itself); jobs
sharing a workload run in submission order, others in parallel on ``workers`` threads. So a
Kubernetes API that hangs holds one worker for the length of its request timeout, never the API
or the cycle.

The lanes know nothing of leader election: a job's actuator calls ask the fence first
(:meth:`scheduler.service.core.SchedulerService._call`, and the actuators before each write), so a
job still queued when this replica loses the Lease runs only its bookkeeping, calls no actuator
and is counted as dropped; it is never carried out later.
"""
from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Collection
from typing import Any

log = logging.getLogger(__name__)


class Job:
    """One submitted action; :attr:`done` is set when it has run (its answer recorded)."""

    __slots__ = ("keys", "fn", "done", "value", "error")

    def __init__(self, keys: frozenset[str], fn: Callable[[], Any]) -> None:
        self.keys, self.fn = keys, fn
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class Lanes:
    def __init__(self, workers: int = 4, name: str = "gpuq-acting") -> None:
        self._workers, self._name = max(1, workers), name
        self._cv = threading.Condition()
        self._queue: deque[Job] = deque()
        self._busy: set[str] = set()
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._running = 0

    def submit(self, keys: Collection[str], fn: Callable[[], Any]) -> Job:
        job = Job(frozenset(keys), fn)
        with self._cv:
            if self._closed:
                job.error = RuntimeError("the scheduler is stopping: no more actions")
                job.done.set()
                return job
            self._queue.append(job)
            if len(self._threads) < self._workers and len(self._threads) < len(self._queue) + len(self._busy):
                t = threading.Thread(target=self._run, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(t)
                t.start()
            self._cv.notify_all()
        return job

    def in_flight(self) -> int:
        with self._cv:
            return len(self._queue) + self._running

    def _next(self) -> Job | None:
        """The first queued job none of whose workloads is busy or waiting in an earlier job."""
        blocked = set(self._busy)
        for job in self._queue:
            if not (job.keys & blocked):
                self._queue.remove(job)
                self._busy |= job.keys
                self._running += 1
                return job
            blocked |= job.keys
        return None

    def _run(self) -> None:
        while True:
            with self._cv:
                job = self._next()
                while job is None:
                    if self._closed and not self._queue:
                        return
                    self._cv.wait()
                    job = self._next()
            try:
                job.value = job.fn()
            except BaseException as exc:  # noqa: BLE001 - a job's failure is its caller's to see
                log.exception("scheduler action failed")
                job.error = exc
            finally:
                with self._cv:
                    self._busy -= job.keys
                    self._running -= 1
                    self._cv.notify_all()
                job.done.set()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or running; False when ``timeout`` passed first."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._queue and self._running == 0, timeout)

    def close(self, timeout: float = 10.0) -> bool:
        """Take no more jobs, let the queued ones run; False when some were still running at ``timeout``."""
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        idle = self.wait_idle(timeout)
        for t in self._threads:
            t.join(timeout=0.1 if not idle else 1.0)
        return idle
