"""The "now" view: per queue and GPU type, rolled up the hierarchy.

Rows come in pre-order of the queue tree (root first, children in file order, the pseudo-queue
``(unassigned)`` last), and per queue ``gpu_type="*"`` (the ``gpu`` resource, any type) then each
type in name order. A parent's ``allocated`` and ``pending`` are the sums of its subtree.
``guaranteed`` is None where the queue sets no guarantee for a typed resource (and for the root);
``max`` is the queue's own ``max`` (None: unlimited here), ``effective_max`` the smallest along its
ancestry. ``borrowed = max(0, allocated - guaranteed)``, ``lent = max(0, guaranteed - allocated)``.
``fair_share`` is the queue's dominant share (same on each of its rows), ``over_quota_share`` its
water-filled share of that resource (see :mod:`accounting.fairshare`). ``entitlement`` (the ``*``
row only; None on the typed rows) is what ``scheduler.reclaim: fair_share`` reclaims toward
(issue 21): the cluster's GPUs divided by weight in whole GPUs, each queue's demand being its
``allocated`` plus ``pending`` (:func:`accounting.fairshare.entitlements`, the scheduler's own
division, here of the accounting's view); shown whatever the mode, as what the queue would be
entitled to.

GPU-equivalents (issue 19): where equivalents are set (:attr:`QueueConfig.has_equivalents`: a
queue sets ``gpu_eq``, or a type's ``equivalent`` is not 1),
each row also carries ``allocated_eq`` (its allocated GPUs times their type's ``equivalent``,
summed exactly in thousandths), and the ``*`` row ``guaranteed_eq`` and ``max_eq`` (the queue's
``gpu_eq``, None where not set), beside the raw GPUs; without ``gpu_eq`` the rows carry none of them.
A queue guaranteed in ``gpu_eq`` (and not in ``gpu``) has its fair share measured in equivalents:
``allocated_eq / guaranteed_eq`` stands for the ``gpu`` resource's share.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from accounting.capacity import CapacityView, TypeShare, capacity_view, distribution
from decimal import Decimal

from accounting.fairshare import Claim, dominant_share, entitlements, want_of, water_fill
from accounting.idle import DEFAULT_PARAMS, IdleParams, current
from accounting.intervals import running
from accounting.ledger import ADMISSION, by_slot, holder
from accounting.model import MILLI, Allocation, IdleRun, NodeCapacity, PendingDemand, as_gpus
from accounting.queues import GPU_EQ, ONE, ROOT, Amount, QueueConfig
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
    entitlement: float | None = None   # the "*" row: what reclaim: fair_share reclaims toward (module docstring)
    # GPU-equivalents beside the raw GPUs, only where equivalents are set (module docstring)
    allocated_eq: float | None = None
    guaranteed_eq: float | None = None
    max_eq: float | None = None

    def as_dict(self) -> dict[str, object]:
        out = {s: getattr(self, s) for s in self.__slots__}
        if self.allocated_eq is None:
            for k in _EQ_KEYS:
                del out[k]
        return out


_EQ_KEYS = ("allocated_eq", "guaranteed_eq", "max_eq")


def _whole(x: Amount | None) -> int | None:
    """A gpu or gpu/<TYPE> amount (always whole; only gpu_eq may hold thousandths)."""
    return None if x is None else int(x)


def _eq_out(x: Amount | None) -> float | None:
    return None if x is None else as_gpus(int(x * MILLI))


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
    eqs = resolver.config.equivalents() if resolver.config.has_equivalents else None
    eq_m: dict[str, dict[str, int]] = {}           # milli-equivalents (each type's equivalent: thousandths)
    for al in live:
        key = (resolver.queue(al.queue, al.namespace), resolver.gpu_type(al.gpu_model, al.gpu_resource))
        _add(alloc_m, *key, al.counted_milli)
        if eqs is not None:
            _add(eq_m, *key, int(al.counted_milli * eqs.get(key[1], ONE)))
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
    for m in (alloc_m, pend_m, resv_m, eq_m):
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
    entitled = _entitlements(config, kids, alloc_m, pend_m, round(cap.total.capacity * MILLI))
    rows = []
    for q in _preorder(kids):
        cfg = config.queues.get(q) if q != ROOT else None
        a, p = alloc.get(q, {}), pend.get(q, {})
        denominators = {r: _denominator(cfg, q, r, resolver, capacity) for r in resources}
        in_eq = cfg is not None and GPU_EQ in cfg.guaranteed and "gpu" not in cfg.guaranteed
        if in_eq and cfg is not None and cfg.guaranteed[GPU_EQ] > 0:     # fair share in equivalents
            fair = max(dominant_share({r: a.get(r, 0.0) for r in resources[1:]}, denominators),
                       eq_m.get(q, {}).get("gpu", 0) / MILLI / float(cfg.guaranteed[GPU_EQ]))
        else:
            fair = dominant_share({r: a.get(r, 0.0) for r in resources}, denominators)
        for r in resources:
            g = None if cfg is None else _whole(cfg.guaranteed.get(r, None if in_eq or r != "gpu" else 0))
            if q == UNASSIGNED and r == "gpu":
                g = 0
            used = a.get(r, 0)
            eq = {} if eqs is None else {
                "allocated_eq": as_gpus(eq_m.get(q, {}).get(r, 0)),
                "guaranteed_eq": _eq_out(cfg.guaranteed.get(GPU_EQ)) if cfg is not None and r == "gpu" else None,
                "max_eq": _eq_out(cfg.max.get(GPU_EQ)) if cfg is not None and r == "gpu" else None}
            rows.append(QueueRow(
                queue=q, gpu_type="*" if r == "gpu" else r[4:], allocated=used, guaranteed=g,
                max=None if cfg is None else _whole(cfg.max.get(r)), effective_max=_effective_max(q, r, resolver),
                pending=p.get(r, 0), borrowed=None if g is None else max(0, used - g),
                lent=None if g is None else max(0, g - used), fair_share=fair,
                over_quota_share=oq.get(q, {}).get(r, capacity.get(r, 0.0) if q == ROOT else 0.0),
                idle=idle_roll.get(q, {}).get(r, 0), reserved=resv.get(q, {}).get(r, 0),
                entitlement=_out(entitled.get(q, 0)) if r == "gpu" else None, **eq))
    dist = distribution(cap, live, {k: as_gpus(v) for k, v in idle_q.items()}, resolver)
    return NowView(now, tuple(rows), cap, dist, starving(rows, snap.pending, resolver, now, starvation_s))


def _entitlements(config: QueueConfig, kids: Mapping[str, tuple[str, ...]], alloc_m: dict[str, dict[str, int]],
                  pend_m: dict[str, dict[str, int]], capacity_milli: int) -> dict[str, Amount]:
    """Each queue's entitlement (:func:`accounting.fairshare.entitlements`) from the view's
    allocated and pending milli-GPUs (rolled up) and the cluster's capacity; the pseudo-queue
    ``(unassigned)`` is entitled to nothing."""
    wants = {q: want_of(cfg, Decimal(alloc_m.get(q, {}).get("gpu", 0) + pend_m.get(q, {}).get("gpu", 0)) / MILLI)
             for q, cfg in config.queues.items() if q != ROOT}
    return entitlements(Decimal(capacity_milli) / MILLI, kids, wants, ROOT)


def _out(x: Amount) -> int | float:
    return int(x) if x == int(x) else round(float(x), 3)


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
    return _whole(min(limits)) if limits else None


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
