"""The "now" view: per queue and GPU type, rolled up the hierarchy.

Rows come in pre-order of the queue tree (root first, children in file order, the pseudo-queue
``(unassigned)`` last), and per queue ``gpu_type="*"`` (the ``gpu`` resource, any type) then each
type in name order. A parent's ``allocated`` and ``pending`` are the sums of its subtree.
``guaranteed`` is None where the queue sets no guarantee for a typed resource (and for the root);
``max`` is the queue's own ``max`` (None: unlimited here), ``effective_max`` the smallest along its
ancestry. ``borrowed = max(0, allocated - guaranteed)``, ``lent = max(0, guaranteed - allocated)``.
``fair_share`` is the queue's dominant share (same on each of its rows), ``over_quota_share`` its
water-filled share of that resource (see :mod:`accounting.fairshare`).
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from accounting.capacity import CapacityView, TypeShare, capacity_view, distribution
from accounting.fairshare import Claim, dominant_share, water_fill
from accounting.idle import DEFAULT_PARAMS, IdleParams, current
from accounting.intervals import running
from accounting.ledger import ADMISSION, by_slot, holder
from accounting.model import MILLI, Allocation, IdleRun, NodeCapacity, PendingDemand, as_gpus
from accounting.queues import ROOT
from accounting.resolve import UNASSIGNED, Resolver
from accounting.starvation import Starvation, starving


N = TypeVar("N", int, float)


@dataclass(frozen=True, slots=True)
class NowSnapshot:
    at_s: float
    allocations: tuple[Allocation, ...]      # those not running at at_s are ignored
    nodes: tuple[NodeCapacity, ...]
    pending: tuple[PendingDemand, ...] = ()
    idle_runs: tuple[IdleRun, ...] = ()      # idle runs over the trailing idle window
    history: tuple[Allocation, ...] = ()     # gpuq's observed rows that ended before at_s (accounting.ledger.combine)


@dataclass(frozen=True, slots=True)
class QueueRow:
    queue: str
    gpu_type: str
    allocated: float
    guaranteed: int | None
    max: int | None
    effective_max: int | None
    pending: float
    borrowed: float | None
    lent: float | None
    fair_share: float
    over_quota_share: float
    idle: float
    reserved: float = 0.0      # of allocated: admitted by gpuq, not seen yet (accounting.ledger)

    def as_dict(self) -> dict[str, object]:
        return {s: getattr(self, s) for s in self.__slots__}


@dataclass(frozen=True, slots=True)
class NowView:
    at_s: float
    rows: tuple[QueueRow, ...]
    capacity: CapacityView
    distribution: tuple[TypeShare, ...]
    starving: tuple[Starvation, ...]


def _tree(resolver: Resolver, extra: bool) -> dict[str, tuple[str, ...]]:
    kids = {p: q.children for p, q in resolver.config.queues.items()}
    if extra:
        kids[ROOT] = (*kids[ROOT], UNASSIGNED)
        kids[UNASSIGNED] = ()
    return kids


def compute_now(snap: NowSnapshot, resolver: Resolver, idle: IdleParams = DEFAULT_PARAMS,
                starvation_s: float = 600.0) -> NowView:
    now = snap.at_s
    live = running(snap.allocations, now)
    cap = capacity_view(snap.nodes, live, resolver)
    alloc_m: dict[str, dict[str, int]] = {}       # milli-GPUs: exact sums, GPUs once rolled up
    pend_m: dict[str, dict[str, int]] = {}
    resv_m: dict[str, dict[str, int]] = {}
    idle_q: dict[tuple[str, str], int] = {}        # milli-GPUs idle now: a device each, or its share
    owner = by_slot(live)
    for al in live:
        key = (resolver.queue(al.queue, al.namespace), resolver.gpu_type(al.gpu_model, al.gpu_resource))
        _add(alloc_m, *key, al.counted_milli)
        if al.source == ADMISSION:
            _add(resv_m, *key, al.counted_milli)
    for dem in snap.pending:
        _add(pend_m, resolver.queue(dem.queue, dem.namespace),
             resolver.gpu_type(dem.gpu_model) if dem.gpu_model else None, dem.milli_gpus)
    for run in current(snap.idle_runs, now, idle):
        held = holder(owner, run.cluster, run.namespace, run.pod, run.node)
        if held is not None:
            k = (resolver.queue(held.queue, held.namespace), resolver.gpu_type(held.gpu_model, held.gpu_resource))
            idle_q[k] = idle_q.get(k, 0) + min(held.counted_milli, MILLI)
    config = resolver.config          # read after resolving: with the queues placement rules made
    kids = _tree(resolver, UNASSIGNED in alloc_m or UNASSIGNED in pend_m)
    for m in (alloc_m, pend_m, resv_m):
        _roll(m, kids, ROOT)
    alloc, pend, resv = _as_gpus(alloc_m), _as_gpus(pend_m), _as_gpus(resv_m)
    idle_m: dict[str, dict[str, int]] = {}
    for (iq, it), v in idle_q.items():
        _add(idle_m, iq, it, v)
    _roll(idle_m, kids, ROOT)
    idle_roll = _as_gpus(idle_m)
    types = sorted(set(config.gpu_types) | {t.gpu_type for t in cap.types}
                   | {r[4:] for d in (*alloc.values(), *pend.values()) for r in d if r != "gpu"})
    resources = ["gpu", *[f"gpu/{t}" for t in types]]
    capacity = {"gpu": cap.total.capacity, **{f"gpu/{t.gpu_type}": t.capacity for t in cap.types}}
    oq: dict[str, dict[str, float]] = {}
    for res in resources:
        _fill(res, ROOT, capacity.get(res, 0.0), kids, resolver, alloc, pend, oq)
    rows = []
    for q in _preorder(kids):
        cfg = config.queues.get(q) if q != ROOT else None
        a, p = alloc.get(q, {}), pend.get(q, {})
        denominators = {r: _denominator(cfg, q, r, resolver, capacity) for r in resources}
        fair = dominant_share({r: a.get(r, 0.0) for r in resources}, denominators)
        for r in resources:
            g = None if cfg is None else cfg.guaranteed.get(r, 0 if r == "gpu" else None)
            if q == UNASSIGNED and r == "gpu":
                g = 0
            used = a.get(r, 0)
            rows.append(QueueRow(
                queue=q, gpu_type="*" if r == "gpu" else r[4:], allocated=used, guaranteed=g,
                max=None if cfg is None else cfg.max.get(r), effective_max=_effective_max(q, r, resolver),
                pending=p.get(r, 0), borrowed=None if g is None else max(0, used - g),
                lent=None if g is None else max(0, g - used), fair_share=fair,
                over_quota_share=oq.get(q, {}).get(r, capacity.get(r, 0.0) if q == ROOT else 0.0),
                idle=idle_roll.get(q, {}).get(r, 0), reserved=resv.get(q, {}).get(r, 0)))
    dist = distribution(cap, live, {k: as_gpus(v) for k, v in idle_q.items()}, resolver)
    return NowView(now, tuple(rows), cap, dist, starving(rows, snap.pending, resolver, now, starvation_s))


def _add(acc: dict[str, dict[str, N]], queue: str, gpu_type: str | None, amount: N) -> None:
    d = acc.setdefault(queue, {})
    d["gpu"] = d.get("gpu", 0) + amount
    if gpu_type is not None:
        d[f"gpu/{gpu_type}"] = d.get(f"gpu/{gpu_type}", 0) + amount


def _roll(acc: dict[str, dict[str, N]], kids: Mapping[str, tuple[str, ...]], q: str) -> dict[str, N]:
    total = dict(acc.get(q, {}))
    for c in kids.get(q, ()):
        for r, v in _roll(acc, kids, c).items():
            total[r] = total.get(r, 0) + v
    if total:
        acc[q] = total
    return total


def _as_gpus(acc: dict[str, dict[str, int]]) -> dict[str, dict[str, float]]:
    """Milli-GPU sums as GPUs (whole ones as ints)."""
    return {q: {r: as_gpus(v) for r, v in d.items()} for q, d in acc.items()}


def _preorder(kids: Mapping[str, tuple[str, ...]]) -> list[str]:
    out, stack = [], [ROOT]
    while stack:
        q = stack.pop()
        out.append(q)
        stack.extend(reversed(kids.get(q, ())))
    return out


def _effective_max(q: str, r: str, resolver: Resolver) -> int | None:
    limits = [resolver.config.queues[c].max[r] for c in resolver.chain(q)
              if c in resolver.config.queues and r in resolver.config.queues[c].max]
    return min(limits) if limits else None


def _denominator(cfg: object, q: str, r: str, resolver: Resolver, capacity: Mapping[str, float]) -> float | None:
    g = getattr(cfg, "guaranteed", {}).get(r, 0) if cfg is not None else 0
    if g > 0:
        return float(g)
    m = _effective_max(q, r, resolver) if q != ROOT else None
    return float(m) if m else capacity.get(r) or None


def _fill(r: str, parent: str, pool: float, kids: Mapping[str, tuple[str, ...]], resolver: Resolver,
          alloc: dict[str, dict[str, float]], pend: dict[str, dict[str, float]],
          out: dict[str, dict[str, float]]) -> None:
    claims = []
    for c in kids.get(parent, ()):
        cfg = resolver.config.queues.get(c)
        g = cfg.guaranteed.get(r, 0) if cfg else 0
        cap = cfg.max.get(r, math.inf) if cfg else math.inf
        demand = alloc.get(c, {}).get(r, 0.0) + pend.get(c, {}).get(r, 0.0)
        claims.append(Claim(c, float(g), demand, float(cap), cfg.weight if cfg else 1.0))
    for c, share in water_fill(pool, claims).items():
        out.setdefault(c, {})[r] = share
        _fill(r, c, share, kids, resolver, alloc, pend, out)
