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
scaled down in proportion. The shares of the children never exceed the parent's share. A queue
of ``weight`` 0 gets nothing beyond ``min(guaranteed, demand, max)``.

**Entitlement** (issue 21; what ``scheduler.reclaim: fair_share`` reclaims toward, in whole GPUs:
:func:`entitlements`): the same division as KAI-Scheduler's fair share, of the ``gpu`` resource
only. Per level from the root (whose pool is the cluster's GPUs), each child first gets
``min(guaranteed, demand)``; what is left of the parent's entitlement is divided among the children
that still want more (demand and max not reached, ``weight`` above 0) in rounds: each gets
``left x weight / (sum of their weights)`` rounded down to whole GPUs, or all it still wants when
that is less (then another round divides what that one left); when a round leaves nobody
satisfied, the GPUs the rounding left go one each to the children with the largest fraction cut
off by the rounding (ties: the larger weight, then queue-file order), each capped by what it still
wants. A child's entitlement is the pool its children divide. When the guarantees alone exceed
the pool (capacity down) each child is entitled to ``min(guaranteed, demand)`` and no more.
Amounts are exact: whole GPUs, but where a demand or max of shares (thousandths) caps a queue.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from math import floor
from typing import NamedTuple

from accounting.queues import GPU_EQ, Amount, Queue

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
        active = [c for c in claims if want[c.name] > _EPS and c.weight > 0]   # weight 0: nothing beyond
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


class Want(NamedTuple):
    """What one queue brings to :func:`entitlements`, in GPUs of any type: its ``gpu`` guarantee,
    its demand (running plus pending, its subtree's), its own ``gpu`` max (``None``: none) and its
    ``weight``."""

    guaranteed: Amount
    demand: Amount
    cap: Amount | None = None
    weight: float = 1.0


def entitlements(pool: Amount, children: Mapping[str, Sequence[str]], wants: Mapping[str, Want],
                 root: str) -> dict[str, Amount]:
    """Each queue's entitlement below ``root`` (the module docstring's division), ``pool`` the GPUs
    ``root`` divides, ``children`` each queue's children in queue-file order (a queue absent from
    ``wants`` wants nothing). Pure and exact: amounts are counted in integer thousandths of a GPU
    and weights as exact integers (each float weight times the common power of two that makes all
    of them whole), so the division is integer arithmetic (the scheduler runs it every cycle of the
    ``fair_share`` mode, over every queue). The root itself maps to ``pool``."""
    out: dict[str, Amount] = {root: pool}
    stack = [(root, _milli(pool))]
    while stack:
        parent, got = stack.pop()
        kids = children.get(parent, ())
        if not kids:
            continue
        shares = _divide(got, [wants.get(k, _NOTHING) for k in kids])
        for k, share in zip(kids, shares):
            out[k] = _amount(share)
            stack.append((k, share))
    return out


_NOTHING = Want(0, 0, None, 0.0)


class Division:
    """:func:`entitlements` kept as a few queues' wants change (the forecasts' timeline: a finish
    changes the demand of one leaf and its ancestors, and the rest of the tree is as it was).

    Each level is a pure function of its parent's entitlement and its children's wants, so only
    the levels where either changed are divided again (:meth:`update`), from the root down; the
    result is the full division's for the wants now, amount for amount. :attr:`of` is the live
    mapping (queue -> entitlement, as :func:`entitlements` returns), changed in place."""

    __slots__ = ("children", "wants", "of", "_milli", "_parent", "_depth", "_index", "_claims", "_weights")

    def __init__(self, pool: Amount, children: Mapping[str, Sequence[str]], wants: Mapping[str, Want],
                 root: str) -> None:
        self.children = children
        self.wants = dict(wants)
        self.of: dict[str, Amount] = {root: pool}
        self._milli: dict[str, int] = {root: _milli(pool)}      # each divided queue's share, as divided
        self._parent: dict[str, str] = {}
        self._depth: dict[str, int] = {root: 0}
        self._index: dict[str, int] = {}          # a queue's place among its parent's children
        # per parent divided: its children's claims in thousandths (:func:`_claim`: what each
        # wants, what each gets first), and their weights (:func:`_weights`; found again when a
        # child's weight changes, as when it comes or goes: one absent weighs nothing)
        self._claims: dict[str, tuple[list[int], list[int]]] = {}
        self._weights: dict[str, list[int]] = {}
        stack = [root]
        while stack:
            parent = stack.pop()
            for i, k in enumerate(children.get(parent, ())):
                self._parent[k] = parent
                self._index[k] = i
                self._depth[k] = self._depth[parent] + 1
                stack.append(k)
        self._divide_from({root})

    def update(self, wants: Mapping[str, Want | None]) -> set[str]:
        """Set these queues' wants (``None``: the queue wants nothing, as one absent from
        :func:`entitlements`' ``wants``) and divide again the levels they change: the queues
        whose entitlement changed."""
        dirty: set[str] = set()
        for q, want in wants.items():
            old = self.wants.get(q)
            if old == want:
                continue
            if want is None:
                del self.wants[q]
            else:
                self.wants[q] = want
            parent = self._parent.get(q)
            if parent is not None:
                dirty.add(parent)
                level = self._claims.get(parent)
                if level is not None:
                    i = self._index[q]
                    level[0][i], level[1][i] = _claim(want or _NOTHING)
                if (old or _NOTHING).weight != (want or _NOTHING).weight:
                    self._weights.pop(parent, None)
        return self._divide_from(dirty) if dirty else set()

    def _divide_from(self, dirty: set[str]) -> set[str]:
        """Divide each level under ``dirty``'s queues again, shallowest first, and every level
        below a queue whose entitlement changed: the queues whose entitlement changed."""
        changed: set[str] = set()
        depth, children, wants, of, milli = self._depth, self.children, self.wants, self.of, self._milli
        levels: dict[int, set[str]] = {}
        for q in dirty:
            levels.setdefault(depth[q], set()).add(q)
        d = 0
        while levels:
            for parent in levels.pop(d, ()):
                kids = children.get(parent, ())
                if not kids:
                    continue
                level = self._claims.get(parent)
                if level is None:
                    claims = [_claim(wants.get(k, _NOTHING)) for k in kids]
                    level = self._claims[parent] = ([w for w, _ in claims], [g for _, g in claims])
                weights = self._weights.get(parent)
                if weights is None:
                    weights = self._weights[parent] = _weights([wants.get(k, _NOTHING) for k in kids])
                shares = _pour(milli[parent], level[0], level[1], weights)
                for k, share in zip(kids, shares):
                    if milli.get(k) == share:
                        continue
                    milli[k] = share
                    of[k] = _amount(share)
                    changed.add(k)
                    if children.get(k):
                        levels.setdefault(d + 1, set()).add(k)
            d += 1
        return changed


def want_of(queue: Queue, demand: Amount) -> Want:
    """What ``queue`` brings to :func:`entitlements` with ``demand`` GPUs (its subtree's running and
    pending): its ``gpu`` guarantee (a queue guaranteed in ``gpu_eq`` only brings that, rounded down
    to whole GPUs: the division is of raw GPUs), its ``gpu`` max and its weight. The one reading of
    a queue for the division, the scheduler's and the accounting's alike."""
    g = queue.guaranteed.get("gpu")
    if g is None:
        g = floor(queue.guaranteed.get(GPU_EQ, 0))
    return Want(g, demand, queue.max.get("gpu"), queue.weight)


def _milli(x: Amount) -> int:
    """GPUs as integer thousandths (rounded down below a thousandth, which GPU amounts never hold)."""
    return int(x * _MILLI) if type(x) is int else floor(Fraction(x) * _MILLI)


def _amount(m: int) -> Amount:
    whole, rest = divmod(m, _MILLI)
    return whole if rest == 0 else Decimal(m) / _MILLI


_MILLI = 1000


def _divide(pool: int, claims: Sequence[Want]) -> list[int]:
    """One level of :func:`entitlements`: ``pool`` thousandths among ``claims`` (in queue-file
    order), each one's share in thousandths."""
    milli = [_claim(c) for c in claims]
    return _pour(pool, [w for w, _ in milli], [g for _, g in milli], _weights(claims))


def _claim(c: Want) -> tuple[int, int]:
    """One claim of :func:`_divide` in thousandths: what it wants in all (its demand, capped by its
    max) and what it gets first (its guarantee, up to that)."""
    w = _milli(c.demand)
    if c.cap is not None:
        w = min(w, _milli(c.cap))
    w = max(w, 0)
    return w, min(_milli(c.guaranteed), w)


def _weights(claims: Sequence[Want]) -> list[int]:
    """The claims' weights as exact integers (each times the common power of two that makes all
    of them whole)."""
    weight = [int(c.weight) for c in claims]
    if any(w != c.weight for w, c in zip(weight, claims)):    # a weight not whole: exact integers of them all
        ws = [Fraction(c.weight) for c in claims]
        scale = max(w.denominator for w in ws)                # powers of two: the largest makes all whole
        weight = [int(w * scale) for w in ws]
    return weight


def _pour(pool: int, want: Sequence[int], first: Sequence[int], weight: Sequence[int]) -> list[int]:
    """:func:`_divide` of claims already in thousandths (:func:`_claim`'s ``want`` and ``first``)
    and integer weights (:func:`_weights`)."""
    n = len(want)
    share = list(first)
    left = pool - sum(share)
    cut: dict[int, int] = {}      # the last round's fraction cut off by the rounding, over its total weight
    while left > 0:
        asking = [i for i in range(n) if weight[i] > 0 and share[i] < want[i]]
        if not asking:
            break
        total = sum(weight[i] for i in asking)
        pot, satisfied, cut = left, False, {}
        whole = total * _MILLI
        for i in asking:
            fair = pot * weight[i]            # this one's part of the pot, times ``total``
            rest = want[i] - share[i]
            if rest * total <= fair:          # all it still wants: another round divides the rest
                give, satisfied = rest, True
            else:
                give = fair // whole * _MILLI
                if fair > give * total:
                    cut[i] = fair - give * total
            give = min(give, left)
            share[i] += give
            left -= give
        if not satisfied:
            break
    for i in sorted(cut, key=lambda i: (-cut[i], -weight[i], i)):
        if left <= 0:
            break
        give = min(_MILLI, left, want[i] - share[i])
        if give > 0:
            share[i] += give
            left -= give
    return share
