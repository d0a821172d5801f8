"""Fair share over time (issue 21): a queue's recent GPU use, decayed, and the score it orders by.

A queue's *decayed usage* at ``now`` is its GPU use integrated over the past with every instant
weighted by ``2 ** -((now - t) / half_life_s)``: a GPU-second used now counts 1, one used a
half-life ago counts 1/2, two half-lives ago 1/4 (Kueue's admission fair sharing, its
``usageHalfLifeTime``; KAI-Scheduler v0.10's usage-based fair share decays the same way). For a
queue holding ``g`` GPUs from ``a`` to ``b`` (``b <= now``) that is, exactly::

    g * H / ln 2 * (2 ** -((now - b) / H) - 2 ** -((now - a) / H))        (H = half_life_s)

so use that never stops (``a`` far back, ``b = now``) tends to ``g * H / ln 2`` GPU-seconds.

The *score* is the decayed usage in GPU-hours divided by the queue's ``weight`` (the queue file's
key, default 1): a queue twice as heavy may use twice as much for the same place in the order; a
weight of 0 makes any use an infinite score (never ahead of a queue with a finite one) and none
a score of 0, as Kueue treats a weight of 0. :mod:`scheduler.ordering` states where the score goes
in the order of queues; this module only computes it.

Two sources feed it, with the same arithmetic: the simulator's replay (:class:`DecayedUsage`, a
pure function of its admits, finishes and preemptions so far) and the live accounting's hourly
rollups (:func:`decayed_hours`: a stored hour is taken as used evenly over the hour).
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

LN2 = math.log(2.0)
HOUR = 3600.0


def factor(age_s: float, half_life_s: float) -> float:
    """The weight of a GPU-second used ``age_s`` ago: ``2 ** -(age_s / half_life_s)``."""
    return math.pow(2.0, -age_s / half_life_s)


def decayed_interval(gpus: float, start_s: float, end_s: float, now_s: float, half_life_s: float) -> float:
    """The decayed GPU-seconds of ``gpus`` GPUs held from ``start_s`` to ``end_s`` (at or before
    ``now_s``), seen at ``now_s`` (the closed form in the module docstring)."""
    if end_s <= start_s:
        return 0.0
    return gpus * half_life_s / LN2 * (factor(now_s - end_s, half_life_s) - factor(now_s - start_s, half_life_s))


def even_factor(length_s: float, half_life_s: float) -> float:
    """What a GPU-second used evenly over a period of ``length_s`` counts, relative to one used at
    the period's end: ``decayed_interval(1 / length_s, 0, length_s, length_s, H)``."""
    return half_life_s / (LN2 * length_s) * (1.0 - factor(length_s, half_life_s))


def decayed_hours(hours: Iterable[tuple[float, str, float]], now_s: float, half_life_s: float,
                  length_s: float = HOUR) -> dict[str, float]:
    """Decayed GPU-seconds per queue from rollup rows ``(start of the period, queue, GPU-seconds)``,
    each period ``length_s`` long and ending at or before ``now_s``, its GPU-seconds taken as used
    evenly over it: a period worth ``s`` GPU-seconds counts
    ``decayed_interval(s / length_s, start, start + length_s, now_s, half_life_s)``."""
    out: dict[str, float] = {}
    for start, queue, gpu_s in hours:
        end = min(start + length_s, now_s)
        v = decayed_interval(gpu_s / (end - start), start, end, now_s, half_life_s) if end > start else 0.0
        out[queue] = out.get(queue, 0.0) + v
    return out


def score(decayed_gpu_s: float, weight: float) -> float:
    """A queue's score (lower is served first): decayed GPU-hours per unit of ``weight``; a weight
    of 0 gives ``inf`` to any use and 0 to none."""
    hours = decayed_gpu_s / HOUR
    if weight <= 0:
        return math.inf if hours > 0 else 0.0
    return hours / weight


class DecayedUsage:
    """Decayed usage per queue, kept up to date from the changes of the GPUs each queue holds: at
    each change the queue's sum is carried forward to the change's time in closed form (its old
    sum decays; the GPUs it held add :func:`decayed_interval` over the gap) and its GPUs change.
    Times must not go back. The same events give the same values, to the last bit."""

    __slots__ = ("_at", "_held", "_sum", "half_life_s")

    def __init__(self, half_life_s: float) -> None:
        if not half_life_s > 0:
            raise ValueError(f"half_life_s must be positive, got {half_life_s!r}")
        self.half_life_s = float(half_life_s)
        self._at: dict[str, float] = {}      # queue -> when its sum was last carried forward
        self._sum: dict[str, float] = {}     # queue -> its decayed GPU-seconds at _at
        self._held: dict[str, float] = {}    # queue -> GPUs it holds since _at

    def change(self, queue: str, gpus: float, t: float) -> None:
        """``queue`` holds ``gpus`` more (fewer, when negative) GPUs from ``t`` on."""
        at = self._at.get(queue)
        if at is None:
            self._at[queue], self._sum[queue], self._held[queue] = t, 0.0, 0.0
        elif t > at:
            self._sum[queue] = self._carried(queue, t)
            self._at[queue] = t
        held = self._held[queue] + gpus
        self._held[queue] = 0.0 if abs(held) < 1e-12 else held

    def _carried(self, queue: str, t: float) -> float:
        at, h = self._at[queue], self.half_life_s
        f = factor(t - at, h)
        return self._sum[queue] * f + self._held[queue] * h / LN2 * (1.0 - f)

    def at(self, t: float) -> dict[str, float]:
        """Every queue's decayed GPU-seconds at ``t`` (at or after the last change); changes nothing."""
        return {q: self._carried(q, t) if t > self._at[q] else self._sum[q] for q in self._at}

    def held(self) -> Mapping[str, float]:
        """The GPUs each queue holds now, as counted from the changes."""
        return self._held
