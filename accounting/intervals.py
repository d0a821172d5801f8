"""Allocation intervals clipped to a window, and GPU-seconds grouped any way.

Rules (each has a test):

* a pod still running (``end_s`` None) counts up to ``now_s``;
* a restart is a new ``uid`` in the same slot (:func:`accounting.ledger.slot`: a pod's
  ``(cluster, namespace, pod)``; for the rows of other sources, which name one node of a gang
  each, also the node): both rows count, and an earlier row left open or overlapping (the
  collector missed the end, e.g. during a gap) is cut at the next row's start, since Kubernetes
  runs one pod of a name at a time;
* an allocation crossing a window boundary counts only its part inside ``[start_s, end_s)``;
* nothing counts after ``now_s`` (an end in the future is cut there).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from accounting.ledger import slot
from accounting.model import Allocation, UsageAgg, Window

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True, slots=True)
class Interval:
    alloc: Allocation
    start_s: float
    end_s: float

    @property
    def gpu_seconds(self) -> float:
        return self.alloc.billed_gpus * (self.end_s - self.start_s)


def effective_ends(allocs: Iterable[Allocation], now_s: float) -> list[tuple[Allocation, float]]:
    """Each allocation with the end it really had (see the module rules), in a stable order:
    ``(slot, start_s, uid)``."""
    ordered = sorted(allocs, key=lambda a: (slot(a), a.start_s, a.uid))
    out: list[tuple[Allocation, float]] = []
    for i, a in enumerate(ordered):
        end = now_s if a.end_s is None else min(a.end_s, now_s)
        if i + 1 < len(ordered):
            nxt = ordered[i + 1]
            if slot(nxt) == slot(a):
                end = min(end, nxt.start_s)
        out.append((a, max(end, a.start_s)))
    return out


def clip(allocs: Iterable[Allocation], window: Window, now_s: float) -> tuple[Interval, ...]:
    """The parts of the allocations inside the window; empty parts are dropped."""
    out = []
    for a, end in effective_ends(allocs, now_s):
        s, e = max(a.start_s, window.start_s), min(end, window.end_s)
        if e > s:
            out.append(Interval(a, s, e))
    return tuple(out)


def running(allocs: Iterable[Allocation], now_s: float) -> tuple[Allocation, ...]:
    """Allocations holding GPUs at ``now_s``."""
    return tuple(a for a, end in effective_ends(allocs, math.inf) if a.start_s <= now_s < end)


def gpu_seconds_by(intervals: Iterable[Interval], key: Callable[[Interval], K]) -> dict[K, float]:
    out: dict[K, float] = {}
    for iv in intervals:
        k = key(iv)
        out[k] = out.get(k, 0.0) + iv.gpu_seconds
    return out


def to_aggs(intervals: Sequence[Interval]) -> tuple[UsageAgg, ...]:
    """Group intervals like the store's SQL aggregation does (the same UsageAgg keys)."""
    sums = gpu_seconds_by(intervals, lambda iv: (iv.alloc.cluster, iv.alloc.queue, iv.alloc.namespace,
                                                 iv.alloc.billed_as, iv.alloc.gpu_model, iv.alloc.gpu_resource))
    return tuple(UsageAgg(*k, gpu_seconds=v) for k, v in sorted(sums.items()))
