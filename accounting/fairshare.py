"""Fair shares: YuniKorn's dominant usage ratio and the over-quota (weighted water-filling) share.

**Dominant share** (YuniKorn's ``fair`` sort): the largest ``allocated / denominator`` over the
queue's resources, where the denominator is the queue's guarantee for that resource when above 0,
else its effective max (the smallest ``max`` along its ancestry), else the cluster capacity of the
resource; a resource with none of these is skipped. Below 1.0 the queue is within its guarantee.

**Over-quota share** (Run:ai / KAI's deserved quota plus over-quota weight), per resource and
level by level from the root, whose pool is the cluster capacity: each child first gets
``min(guaranteed, demand, max)``, where demand is allocated plus pending; what is left of the
parent's pool (the GPUs nobody is guaranteed, and the guarantees their owners leave unused) is
poured into the children that want more, in proportion to ``weight``, each capped at
``min(demand, max)``. When the guarantees alone exceed the pool (capacity is down), they are
scaled down in proportion. The shares of the children never exceed the parent's share.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Claim:
    name: str
    guaranteed: float
    demand: float
    cap: float          # math.inf when unlimited
    weight: float = 1.0


def water_fill(pool: float, claims: Sequence[Claim]) -> dict[str, float]:
    """Each claim's share of ``pool``; deterministic (claims in the order given)."""
    share = {c.name: max(0.0, min(c.guaranteed, c.demand, c.cap)) for c in claims}
    base = sum(share.values())
    if base > pool:
        scale = pool / base if base > 0 else 0.0
        return {n: v * scale for n, v in share.items()}
    left = pool - base
    want = {c.name: max(0.0, min(c.demand, c.cap) - share[c.name]) for c in claims}
    while left > _EPS:
        active = [c for c in claims if want[c.name] > _EPS]
        if not active:
            break
        total_w = sum(c.weight for c in active)
        pour = left
        for c in active:
            give = min(want[c.name], pour * c.weight / total_w)
            share[c.name] += give
            want[c.name] -= give
            left -= give
    return share


def dominant_share(allocated: dict[str, float], denominators: dict[str, float | None]) -> float:
    """``max(allocated[r] / denominators[r])`` over resources with a positive denominator."""
    best = 0.0
    for r, amount in allocated.items():
        d = denominators.get(r)
        if d is not None and d > 0:
            best = max(best, amount / d)
    return best
