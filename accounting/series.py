"""The guaranteed / max / allocated series per queue at a chosen step (the admins' chart).

``allocated`` of a step is the average number of GPUs the queue's subtree held over
``[t, t + step_s)`` (GPU-seconds in the step over ``step_s``); the last step may be shorter and
is averaged over its own length. ``guaranteed`` and ``max`` are the configuration's ``gpu``
values (``max`` None when unlimited): the store keeps no history of the queue file.

GPU-equivalents (issue 19), only where the queue file sets them
(:attr:`accounting.queues.QueueConfig.has_equivalents`): each point also carries ``allocated_eq``,
the same average with each allocation's GPUs (as counted: a MIG slice one slice) times its type's
``equivalent`` (a type not declared is worth 1), as the now view's ``allocated_eq``; and
``guaranteed_eq`` / ``max_eq``, the queue's ``gpu_eq`` values (None where it sets none). Without
equivalents the points are as before (those fields None, and left out of the API's output).
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from accounting.intervals import clip
from accounting.model import MILLI, Allocation, Window, as_gpus
from accounting.queues import GPU_EQ, Amount
from accounting.resolve import Resolver


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    queue: str
    t_s: float
    allocated: float
    guaranteed: int
    max: int | None
    allocated_eq: float | None = None       # only where equivalents are set (module docstring)
    guaranteed_eq: float | None = None
    max_eq: float | None = None

    def as_dict(self) -> dict[str, Any]:
        """The API's point: the equivalents' keys only where they are set."""
        out: dict[str, Any] = {"queue": self.queue, "t": self.t_s, "allocated": self.allocated,
                               "guaranteed": self.guaranteed, "max": self.max}
        if self.allocated_eq is not None:
            out.update(allocated_eq=self.allocated_eq, guaranteed_eq=self.guaranteed_eq, max_eq=self.max_eq)
        return out


def queue_series(allocs: Iterable[Allocation], resolver: Resolver, window: Window, step_s: float,
                 now_s: float) -> tuple[SeriesPoint, ...]:
    """Points ordered by (queue, t_s); every configured queue (root excluded) has every step."""
    if step_s <= 0:
        raise ValueError(f"step must be positive, got {step_s}")
    n = max(1, math.ceil(window.length_s / step_s))
    sums: dict[str, list[float]] = {}
    eq_sums: dict[str, list[float]] = {}
    eqs = resolver.config.equivalents() if resolver.config.has_equivalents else None
    for iv in clip(allocs, window, now_s):
        queue = resolver.queue(iv.alloc.queue, iv.alloc.namespace)
        worth = 0.0
        if eqs is not None:
            worth = float(eqs.get(resolver.gpu_type(iv.alloc.gpu_model, iv.alloc.gpu_resource), 1))
        first = int((iv.start_s - window.start_s) // step_s)
        last = min(n - 1, int((iv.end_s - window.start_s) // step_s))
        for i in range(first, last + 1):
            b0 = window.start_s + i * step_s
            overlap = min(iv.end_s, b0 + step_s) - max(iv.start_s, b0)
            if overlap > 0:
                for q in resolver.chain(queue):
                    sums.setdefault(q, [0.0] * n)[i] += iv.alloc.gpus * overlap
                    if eqs is not None:
                        eq_sums.setdefault(q, [0.0] * n)[i] += iv.alloc.gpus * worth * overlap
    queues = [p for p in resolver.config.queues if p != "root"] + sorted(set(sums) - set(resolver.config.queues))
    out = []
    for q in sorted(queues):
        cfg = resolver.config.queues.get(q)
        g = int(cfg.guaranteed.get("gpu", 0)) if cfg else 0      # gpu amounts are whole (gpu_eq may not be)
        m = int(cfg.max["gpu"]) if cfg and "gpu" in cfg.max else None
        row = sums.get(q, [0.0] * n)
        eq_row = eq_sums.get(q, [0.0] * n)
        g_eq = _eq_out(cfg.guaranteed.get(GPU_EQ)) if cfg else None
        m_eq = _eq_out(cfg.max.get(GPU_EQ)) if cfg else None
        for i in range(n):
            b0 = window.start_s + i * step_s
            length = min(step_s, window.end_s - b0) or step_s
            if eqs is None:
                out.append(SeriesPoint(q, b0, row[i] / length, g, m))
            else:
                out.append(SeriesPoint(q, b0, row[i] / length, g, m, eq_row[i] / length, g_eq, m_eq))
    return tuple(out)


def _eq_out(x: Amount | None) -> float | None:
    """A ``gpu_eq`` amount (exact thousandths) as output carries it: an int when whole."""
    return None if x is None else as_gpus(int(x * MILLI))
