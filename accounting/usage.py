"""GPU-seconds, idle GPU-seconds and cost over a window, grouped by any of :data:`BY_KEYS`.

Input is :class:`UsageAgg` rows (GPU-seconds from the store's aggregation or from
:func:`accounting.intervals.to_aggs`, idle GPU-seconds from :mod:`accounting.idle` or the store).
Cost is GPU-hours times the type's ``price_per_hour`` (0 for a type without a price). Where
equivalents are set (:attr:`accounting.queues.QueueConfig.has_equivalents`), each row also has
``eq_hours`` (GPU-hours times the type's ``equivalent``) and ``cost_per_eq_hour`` (its cost over
them: what one H100-worth of GPU time cost, whatever the models), so queues on different models
compare; without equivalents the rows are as before.
``idle_method`` names how the row's idle was measured (:func:`accounting.idle.idle_method`; the
distinct methods of its allocations, ``,``-joined; empty for rows read from materialised hours,
which do not keep it).

With ``rollup`` and ``queue`` among the keys, every parent queue gets a row carrying the sum of
its subtree (its own rows and its children's); the root is not shown.

What preemption cost (issue 21): grouped by ``queue`` (and ``cluster``; the keys gpuq's
``preempt`` events carry), each row has ``lost_gpu_seconds``/``lost_gpu_hours``, the work the
preemptions of the window threw away from the queue's workloads (their stored
``lost_gpu_seconds``: since the last checkpoint a workload reported, all of its run without one),
summed over the subtree with ``rollup``; a queue that lost work but used no GPUs in the window
gets a row of its own. Other groupings (a GPU type, a namespace) have no such column: a preempt
event does not carry them.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from accounting.idle import join_methods
from accounting.model import UsageAgg
from accounting.resolve import Resolver

BY_KEYS = ("cluster", "queue", "gpu_type", "namespace", "workload")


@dataclass(frozen=True, slots=True)
class UsageRow:
    keys: tuple[tuple[str, str], ...]      # (by key, value) in the order asked
    gpu_seconds: float
    idle_gpu_seconds: float
    cost: float
    idle_cost: float
    idle_method: str = ""                  # how idle was measured (accounting.idle.idle_method), "," joined
    eq_seconds: float | None = None        # GPU-equivalent-seconds, where equivalents are set
    lost_gpu_seconds: float | None = None  # thrown away by preemptions (grouped by queue: counts_losses)

    def as_dict(self) -> dict[str, Any]:
        return {**dict(self.keys), "gpu_seconds": round(self.gpu_seconds, 3),
                "gpu_hours": round(self.gpu_seconds / 3600.0, 6),
                "idle_gpu_seconds": round(self.idle_gpu_seconds, 3),
                "idle_ratio": round(self.idle_gpu_seconds / self.gpu_seconds, 6) if self.gpu_seconds else 0.0,
                "cost": round(self.cost, 6), "idle_cost": round(self.idle_cost, 6),
                "idle_method": self.idle_method, **self._eq(), **self._lost()}

    def _lost(self) -> dict[str, Any]:
        if self.lost_gpu_seconds is None:
            return {}
        return {"lost_gpu_seconds": round(self.lost_gpu_seconds, 3),
                "lost_gpu_hours": round(self.lost_gpu_seconds / 3600.0, 6)}

    def _eq(self) -> dict[str, Any]:
        if self.eq_seconds is None:
            return {}
        return {"eq_hours": round(self.eq_seconds / 3600.0, 6),
                "cost_per_eq_hour": round(self.cost / (self.eq_seconds / 3600.0), 6) if self.eq_seconds else None}


def check_by(by: Sequence[str]) -> tuple[str, ...]:
    bad = [k for k in by if k not in BY_KEYS]
    if bad or not by:
        raise ValueError(f"--by takes a comma-separated list of {', '.join(BY_KEYS)}; got {','.join(by)!r}")
    return tuple(dict.fromkeys(by))


def counts_losses(by: Sequence[str]) -> bool:
    """Whether rows grouped by ``by`` carry what preemptions threw away: by queue, and at most cluster
    beside it (the module docstring)."""
    return "queue" in by and set(by) <= {"queue", "cluster"}


def usage_rows(aggs: Iterable[UsageAgg], resolver: Resolver, by: Sequence[str],
               rollup: bool = False, lost: Iterable[tuple[str, str, float]] | None = None) -> tuple[UsageRow, ...]:
    """Rows sorted by their key values. ``lost``: ``(cluster, queue, GPU-seconds)`` that preemptions
    threw away (:func:`accounting.store_adapter.read_preemption_losses`), counted where
    :func:`counts_losses` says (the queue as the scheduler names it: resolved as is)."""
    by = check_by(by)
    sums: dict[tuple[str, ...], list[float]] = {}
    methods: dict[tuple[str, ...], list[str]] = {}
    eqs = resolver.config.equivalents() if resolver.config.has_equivalents else None
    for a in aggs:
        gtype = resolver.gpu_type(a.gpu_model, a.gpu_resource)
        queue = resolver.queue(a.queue, a.namespace)
        price = resolver.price_per_hour(gtype) / 3600.0
        worth = float(eqs.get(gtype, 1)) if eqs is not None else 0.0
        values = {"cluster": a.cluster, "gpu_type": gtype, "namespace": a.namespace, "workload": a.workload}
        queues = resolver.chain(queue) if rollup else (queue,)
        for q in queues:
            values["queue"] = q
            key = tuple(values[k] for k in by)
            acc = sums.setdefault(key, [0.0, 0.0, 0.0, 0.0, 0.0])
            acc[0] += a.gpu_seconds
            acc[1] += a.idle_gpu_seconds
            acc[2] += a.gpu_seconds * price
            acc[3] += a.idle_gpu_seconds * price
            acc[4] += a.gpu_seconds * worth
            methods.setdefault(key, []).append(a.idle_method)
            if "queue" not in by:
                break
    losses: dict[tuple[str, ...], float] | None = None
    if lost is not None and counts_losses(by):
        losses = {}
        for cluster, queue, seconds in lost:
            for q in (resolver.chain(queue) if rollup else (queue,)):
                key = tuple({"cluster": cluster, "queue": q}[k] for k in by)
                losses[key] = losses.get(key, 0.0) + seconds
                sums.setdefault(key, [0.0, 0.0, 0.0, 0.0, 0.0])
                methods.setdefault(key, [])
    return tuple(UsageRow(tuple(zip(by, k)), gpu_seconds=g, idle_gpu_seconds=i, cost=c, idle_cost=ic,
                          idle_method=join_methods(methods[k]), eq_seconds=None if eqs is None else e,
                          lost_gpu_seconds=None if losses is None else losses.get(k, 0.0))
                 for k, (g, i, c, ic, e) in sorted(sums.items()))
