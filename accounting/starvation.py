"""Starvation: a queue below its guarantee with demand pending for longer than a threshold.

A queue (leaf or parent, on the ``gpu`` resource) starves at ``now_s`` when its ``allocated`` is
below its ``guaranteed``, something in its subtree is pending, and the oldest pending demand of
its subtree has waited at least ``threshold_s``. The waiting time is that demand's age (the
store keeps no history of the queue's allocation, so the queue may have dropped below its
guarantee later than the demand arrived; the age is an upper bound of the starvation time).
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from accounting.model import PendingDemand
from accounting.resolve import Resolver


@dataclass(frozen=True, slots=True)
class Starvation:
    queue: str
    allocated: float
    guaranteed: int
    pending: float
    waiting_s: float


def oldest_pending(pending: Iterable[PendingDemand], resolver: Resolver) -> dict[str, float]:
    """The oldest ``since_s`` of pending demand per queue, rolled up to the ancestors."""
    out: dict[str, float] = {}
    for p in pending:
        for q in resolver.chain(resolver.queue(p.queue, p.namespace)):
            out[q] = min(out.get(q, p.since_s), p.since_s)
    return out


def starving(rows: Sequence[Any], pending: Iterable[PendingDemand], resolver: Resolver, now_s: float,
             threshold_s: float) -> tuple[Starvation, ...]:
    """From the now view's rows (``gpu_type == "*"``), in the rows' order."""
    oldest = oldest_pending(pending, resolver)
    out = []
    for row in rows:
        if row.gpu_type != "*" or not row.guaranteed or row.pending <= 0 or row.queue not in oldest:
            continue
        waited = now_s - oldest[row.queue]
        if row.allocated < row.guaranteed and waited >= threshold_s:
            out.append(Starvation(row.queue, row.allocated, row.guaranteed, row.pending, waited))
    return tuple(out)
