"""Queue positions of pending workloads, kept up to date instead of recomputed per request.

A pending workload's ``position`` (``GET /workloads/{id}``, ``gpuq explain``) is its 1-based rank
in its queue by :attr:`scheduler.model.Workload.order_key` (the order ``schedule()`` serves a
queue in, :func:`scheduler.ordering.by_queue`). Sorting every pending workload for each answer
cost milliseconds per request with 10,000 pending, under the service lock (issue 9: the API under
load). :class:`Positions` keeps one sorted list of keys per queue: a workload enters when it
becomes pending (submitted, preempted), leaves when it stops being pending (admitted, closed), and
its position is a binary search. The service calls it at each of those transitions under its
lock, and rebuilds it after a restore.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

from scheduler.model import Workload

Key = tuple[int, float, str]


class Positions:
    __slots__ = ("_queues", "_keys")

    def __init__(self) -> None:
        self._queues: dict[str, list[Key]] = {}
        self._keys: dict[str, tuple[str, Key]] = {}

    def add(self, w: Workload) -> None:
        """``w`` is pending (again); nothing when it already is."""
        if w.id in self._keys:
            return
        key: Key = w.order_key
        insort(self._queues.setdefault(w.queue, []), key)
        self._keys[w.id] = (w.queue, key)

    def discard(self, workload_id: str) -> None:
        """It is no longer pending; nothing when it was not."""
        found = self._keys.pop(workload_id, None)
        if found is None:
            return
        queue, key = found
        lst = self._queues[queue]
        del lst[bisect_left(lst, key)]
        if not lst:
            del self._queues[queue]

    def of(self, workload_id: str) -> int | None:
        """1-based position in its queue, None for a workload that is not pending."""
        found = self._keys.get(workload_id)
        if found is None:
            return None
        queue, key = found
        return bisect_left(self._queues[queue], key) + 1

    def rebuild(self, pending: Iterable[Workload]) -> None:
        self._queues.clear()
        self._keys.clear()
        for w in pending:
            self._keys[w.id] = (w.queue, w.order_key)
        for queue, key in self._keys.values():
            self._queues.setdefault(queue, []).append(key)
        for lst in self._queues.values():
            lst.sort()

    def __len__(self) -> int:
        return len(self._keys)
