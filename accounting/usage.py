"""GPU-seconds, idle GPU-seconds and cost over a window, grouped by any of :data:`BY_KEYS`.

Input is :class:`UsageAgg` rows (GPU-seconds from the store's aggregation or from
:func:`accounting.intervals.to_aggs`, idle GPU-seconds from :mod:`accounting.idle` or the store).
Cost is GPU-hours times the type's ``price_per_hour`` (0 for a type without a price).
``idle_method`` names how the row's idle was measured (:func:`accounting.idle.idle_method`; the
distinct methods of its allocations, ``,``-joined; empty for rows read from materialised hours,
which do not keep it).

With ``rollup`` and ``queue`` among the keys, every parent queue gets a row carrying the sum of
its subtree (its own rows and its children's); the root is not shown.
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

    def as_dict(self) -> dict[str, Any]:
        return {**dict(self.keys), "gpu_seconds": round(self.gpu_seconds, 3),
                "gpu_hours": round(self.gpu_seconds / 3600.0, 6),
                "idle_gpu_seconds": round(self.idle_gpu_seconds, 3),
                "idle_ratio": round(self.idle_gpu_seconds / self.gpu_seconds, 6) if self.gpu_seconds else 0.0,
                "cost": round(self.cost, 6), "idle_cost": round(self.idle_cost, 6),
                "idle_method": self.idle_method}


def check_by(by: Sequence[str]) -> tuple[str, ...]:
    bad = [k for k in by if k not in BY_KEYS]
    if bad or not by:
        raise ValueError(f"--by takes a comma-separated list of {', '.join(BY_KEYS)}; got {','.join(by)!r}")
    return tuple(dict.fromkeys(by))


def usage_rows(aggs: Iterable[UsageAgg], resolver: Resolver, by: Sequence[str],
               rollup: bool = False) -> tuple[UsageRow, ...]:
    """Rows sorted by their key values."""
    by = check_by(by)
    sums: dict[tuple[str, ...], list[float]] = {}
    methods: dict[tuple[str, ...], list[str]] = {}
    for a in aggs:
        gtype = resolver.gpu_type(a.gpu_model, a.gpu_resource)
        queue = resolver.queue(a.queue, a.namespace)
        price = resolver.price_per_hour(gtype) / 3600.0
        values = {"cluster": a.cluster, "gpu_type": gtype, "namespace": a.namespace, "workload": a.workload}
        queues = resolver.chain(queue) if rollup else (queue,)
        for q in queues:
            values["queue"] = q
            key = tuple(values[k] for k in by)
            acc = sums.setdefault(key, [0.0, 0.0, 0.0, 0.0])
            acc[0] += a.gpu_seconds
            acc[1] += a.idle_gpu_seconds
            acc[2] += a.gpu_seconds * price
            acc[3] += a.idle_gpu_seconds * price
            methods.setdefault(key, []).append(a.idle_method)
            if "queue" not in by:
                break
    return tuple(UsageRow(tuple(zip(by, k)), gpu_seconds=g, idle_gpu_seconds=i, cost=c, idle_cost=ic,
                          idle_method=join_methods(methods[k]))
                 for k, (g, i, c, ic) in sorted(sums.items()))
