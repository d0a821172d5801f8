"""The guaranteed / max / allocated series per queue at a chosen step (the admins' chart).

``allocated`` of a step is the average number of GPUs the queue's subtree held over
``[t, t + step_s)`` (GPU-seconds in the step over ``step_s``); the last step may be shorter and
is averaged over its own length. ``guaranteed`` and ``max`` are the configuration's ``gpu``
values (``max`` None when unlimited): the store keeps no history of the queue file.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from accounting.intervals import clip
from accounting.model import Allocation, Window
from accounting.resolve import Resolver


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    queue: str
    t_s: float
    allocated: float
    guaranteed: int
    max: int | None


def queue_series(allocs: Iterable[Allocation], resolver: Resolver, window: Window, step_s: float,
                 now_s: float) -> tuple[SeriesPoint, ...]:
    """Points ordered by (queue, t_s); every configured queue (root excluded) has every step."""
    if step_s <= 0:
        raise ValueError(f"step must be positive, got {step_s}")
    n = max(1, math.ceil(window.length_s / step_s))
    sums: dict[str, list[float]] = {}
    for iv in clip(allocs, window, now_s):
        queue = resolver.queue(iv.alloc.queue, iv.alloc.namespace)
        first = int((iv.start_s - window.start_s) // step_s)
        last = min(n - 1, int((iv.end_s - window.start_s) // step_s))
        for i in range(first, last + 1):
            b0 = window.start_s + i * step_s
            overlap = min(iv.end_s, b0 + step_s) - max(iv.start_s, b0)
            if overlap > 0:
                for q in resolver.chain(queue):
                    sums.setdefault(q, [0.0] * n)[i] += iv.alloc.gpus * overlap
    queues = [p for p in resolver.config.queues if p != "root"] + sorted(set(sums) - set(resolver.config.queues))
    out = []
    for q in sorted(queues):
        cfg = resolver.config.queues.get(q)
        g = int(cfg.guaranteed.get("gpu", 0)) if cfg else 0      # gpu amounts are whole (gpu_eq may not be)
        m = int(cfg.max["gpu"]) if cfg and "gpu" in cfg.max else None
        row = sums.get(q, [0.0] * n)
        for i in range(n):
            b0 = window.start_s + i * step_s
            length = min(step_s, window.end_s - b0) or step_s
            out.append(SeriesPoint(q, b0, row[i] / length, g, m))
    return tuple(out)
