"""Quota: queue usage for one cycle, and the max / guaranteed checks over a queue's chain.

A :class:`Ledger` is the cycle's working copy of the snapshot's usage: it copies a queue's
entry on first write and never touches the snapshot. Usage vectors come from
:func:`scheduler.snapshot.demand`. The checks return ``None`` when they pass, or a
:class:`Shortfall` naming the queue and resource that fails, with the numbers for the reason.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING

from accounting.fairshare import Division, Want, entitlements, want_of
from accounting.queues import ROOT
from scheduler.model import Gpus, Workload
from scheduler.snapshot import PINNED, Cluster, dict_copy

if TYPE_CHECKING:
    from scheduler.memo import CycleMemo

Vec = tuple[tuple[str, Gpus], ...]    # resource -> amount (GPUs exact: scheduler.model.Gpus)
_NONE: Mapping[str, Gpus] = MappingProxyType({})
# queue -> (its usage mapping before the first change, whether the ledger owned it): Ledger.restore
Saved = dict[str, tuple[Mapping[str, Gpus] | None, bool]]
_INF = float("inf")


@dataclass(frozen=True, slots=True)
class Shortfall:
    queue: str
    resource: str
    limit: Gpus       # the max (or guarantee) that fails (gpu_eq may hold thousandths)
    used: Gpus        # the queue's usage of ``resource`` now
    needed: Gpus      # the amount asked for (or taken away)

    @property
    def left(self) -> Gpus:
        return max(self.limit - self.used, 0)


class Ledger:
    """Usage per queue (ancestors included), copy-on-write over the snapshot's mapping."""

    __slots__ = ("_own", "_view")

    def __init__(self, base: Mapping[str, Mapping[str, Gpus]]) -> None:
        self._view: dict[str, Mapping[str, Gpus]] = dict_copy(base)   # shallow: entries copied on write
        self._own: set[str] = set()

    def of(self, queue: str) -> Mapping[str, Gpus]:
        return self._view.get(queue, _NONE)

    def used(self, queue: str, resource: str) -> Gpus:
        return self._view.get(queue, _NONE).get(resource, 0)

    def add(self, chain: tuple[str, ...], vec: Vec, sign: int = 1) -> None:
        view, own = self._view, self._own
        for q in chain:
            if q in own:
                d = view[q]
            else:
                d = view[q] = dict_copy(view.get(q, _NONE))
                own.add(q)
            for key, amt in vec:
                d[key] = d.get(key, 0) + sign * amt  # type: ignore[index]

    def remove(self, chain: tuple[str, ...], vec: Vec) -> None:
        self.add(chain, vec, -1)

    def remove_saving(self, chain: tuple[str, ...], vec: Vec, saved: Saved) -> None:
        """:meth:`remove`, noting in ``saved`` each queue's usage as it was before its first change
        through ``saved``, so that :meth:`restore` puts it back in one step (a victim search's undo:
        one copy per queue it touched, not an add per victim it took back)."""
        view, own = self._view, self._own
        for q in chain:
            if q not in saved:
                saved[q] = (dict(view[q]), True) if q in own else (view.get(q), False)
        self.add(chain, vec, -1)

    def restore(self, saved: Saved) -> None:
        """Every queue in ``saved`` (:meth:`remove_saving`) back to its usage then: the same
        mapping, so the numbers and their types (an int stays an int) are what they were."""
        view, own = self._view, self._own
        for q, (was, owned) in saved.items():
            if was is None:
                del view[q]
            else:
                view[q] = was
            if not owned:
                own.discard(q)


def over_max(cluster: Cluster, ledger: Ledger, queue: str, vec: Vec) -> Shortfall | None:
    """The first queue on ``queue``'s chain (itself, then ancestors) whose max ``vec`` breaks."""
    queues = cluster.config.queues
    for q in cluster.chains[queue]:
        limits = queues[q].max
        if not limits:
            continue
        used = ledger.of(q)
        for key, amt in vec:
            m = limits.get(key)
            if m is not None and used.get(key, 0) + amt > m:
                return Shortfall(q, key, m, used.get(key, 0), amt)
    return None


def never_within_max(cluster: Cluster, queue: str, vec: Vec) -> Shortfall | None:
    """The max on ``queue``'s chain that ``vec`` exceeds even with every queue empty."""
    queues = cluster.config.queues
    for q in cluster.chains[queue]:
        for key, amt in vec:
            m = queues[q].max.get(key)
            if m is not None and amt > m:
                return Shortfall(q, key, m, 0, amt)
    return None


def over_guarantee(cluster: Cluster, ledger: Ledger, queue: str, vec: Vec) -> Shortfall | None:
    """Would ``queue`` (the leaf only) go above its guarantee by taking ``vec``?"""
    g = cluster.guarantee[queue]
    used = ledger.of(queue)
    for key, amt in vec:
        limit = g.get(key)
        if limit is not None and used.get(key, 0) + amt > limit:
            return Shortfall(queue, key, limit, used.get(key, 0), amt)
    return None


def over_guarantee_pinned(cluster: Cluster, ledger: Ledger, queue: str, vec: Vec) -> Shortfall | None:
    """Would the non-preemptible work of ``queue`` (the leaf) go above its guarantee by taking
    ``vec`` (a non-preemptible workload's demand)? ``used`` in the shortfall is that work's usage.

    The rule (KAI's: non-preemptible work only within the queue's quota): what a queue holds
    above its guarantee must be reclaimable, so its non-preemptible work stays within the
    guarantee, on every guaranteed resource; what it borrows beyond is preemptible."""
    g = cluster.guarantee[queue]
    used = ledger.of(queue)
    for key, amt in vec:
        limit = g.get(key)
        if limit is not None:
            held = used.get(PINNED + key, 0)
            if held + amt > limit:
                return Shortfall(queue, key, limit, held, amt)
    return None


def below_floor(
    cluster: Cluster, ledger: Ledger, queue: str, vec: Vec, shared: frozenset[str] | set[str]
) -> Shortfall | None:
    """Would taking ``vec`` away drop ``queue`` or an ancestor not in ``shared`` below its guarantee?"""
    for q in cluster.chains[queue]:
        if q in shared:
            break                      # every queue above a shared one is shared too
        g = cluster.guarantee[q]
        used = ledger.of(q)
        for key, amt in vec:
            limit = g.get(key)
            if limit is not None and used.get(key, 0) - amt < limit:
                return Shortfall(q, key, limit, used.get(key, 0), amt)
    return None


def below_entitlement(
    cluster: Cluster, ledger: Ledger, queue: str, vec: Vec, shared: frozenset[str] | set[str],
    entitled: Mapping[str, Gpus],
) -> Shortfall | None:
    """``reclaim: fair_share``'s victim floor beside :func:`below_floor`: would taking ``vec`` away
    drop ``queue`` or an ancestor not in ``shared`` below its entitlement (``entitled``:
    :func:`cycle_entitlements`), in GPUs of any type? (``vec`` is a :func:`scheduler.snapshot.demand`
    vector: its ``gpu`` comes first.)"""
    amt = vec[0][1]
    for q in cluster.chains[queue]:
        if q in shared:
            break
        limit = entitled.get(q, 0)
        used = ledger.used(q, "gpu")
        if used - amt < limit:
            return Shortfall(q, "gpu", limit, used, amt)
    return None


def within_entitlement(ledger: Ledger, queue: str, gpus: Gpus, entitled: Mapping[str, Gpus] | None) -> bool:
    """``reclaim: fair_share``'s second way to be a preemptor: ``queue`` (the leaf) stays within its
    entitlement with ``gpus`` more (``entitled``: :func:`cycle_entitlements`; ``None`` in the
    ``guarantee`` mode, where there is no such way)."""
    return entitled is not None and ledger.used(queue, "gpu") + gpus <= entitled.get(queue, 0)


def cycle_entitlements(cluster: Cluster, ledger: Ledger, pending: Mapping[str, list[Workload]],
                       memo: CycleMemo) -> Mapping[str, Gpus]:
    """Each queue's entitlement this cycle (:func:`accounting.fairshare.entitlements`): the cluster's
    GPUs divided by ``weight`` down the tree, each queue's demand being its subtree's running GPUs
    (``ledger``, at the cycle's start) plus its pending GPUs (``pending``: the leaf queues' pending
    lists, as grouped). Computed once per cycle, and kept in ``memo`` while the demands are equal
    (the result is then the same); each leaf's pending sum is kept while its list is the same object.
    A queue reads as :func:`accounting.fairshare.want_of` says (the accounting's ``/queues`` too)."""
    sums = memo.pending_gpus
    if len(sums) > len(pending):         # a queue no longer waiting: its old list is let go
        for q in [q for q in sums if q not in pending]:
            del sums[q]
    pend: dict[str, Gpus] = {}
    for q, lst in pending.items():
        kept = sums.get(q)
        if kept is None or kept[0] is not lst:
            kept = sums[q] = (lst, sum([w.pods * w.gpus_per_pod for w in lst]))
        pend[q] = kept[1]
    return divide_entitlements(cluster, queue_demand(cluster, ledger, pend), memo)


def queue_demand(cluster: Cluster, ledger: Ledger, pending: Mapping[str, Gpus]) -> dict[str, Gpus]:
    """What :func:`divide_entitlements` divides by: each queue's demand (the root left out, and
    queues of none), its subtree's running GPUs (``ledger``) plus its pending GPUs (``pending``:
    per leaf queue). The forecasts' timeline keeps it from one event to the next
    (``scheduler.timeline``): only a finish changes it (a start or a preemption moves GPUs between
    running and pending)."""
    demand: dict[str, Gpus] = {}
    for q, n in pending.items():
        if n:
            for a in cluster.chains[q][:-1]:             # the root left out
                demand[a] = demand.get(a, 0) + n
    for q in cluster.chains:
        if q != ROOT:
            running = ledger.used(q, "gpu")
            if running:
                demand[q] = demand.get(q, 0) + running
    return demand


def divide_entitlements(cluster: Cluster, demand: dict[str, Gpus], memo: CycleMemo) -> Mapping[str, Gpus]:
    """Each queue's entitlement for ``demand`` (:func:`queue_demand`; kept in ``memo``, so the
    caller must not change it afterwards), divided again only when the demands differ from the
    last ones."""
    last = memo.entitlement
    if last is not None and last[0] == demand:
        return last[1]
    queues = cluster.config.queues
    wants = {q: want_of(queues[q], d) for q, d in demand.items()}
    got = MappingProxyType(entitlements(_pool(cluster, memo), {q: c.children for q, c in queues.items()},
                                        wants, ROOT))
    memo.entitlement = (demand, got)
    return got


def entitlement_division(cluster: Cluster, demand: Mapping[str, Gpus], memo: CycleMemo) -> Division:
    """:func:`divide_entitlements` for a caller whose demand changes a few queues at a time (the
    forecasts' timeline): the same division, kept by :class:`accounting.fairshare.Division`, which
    divides again only the levels a change reaches; :func:`demand_want` gives its ``update`` the
    changed queues' wants."""
    queues = cluster.config.queues
    return Division(_pool(cluster, memo), {q: c.children for q, c in queues.items()},
                    {q: want_of(queues[q], d) for q, d in demand.items()}, ROOT)


def demand_want(cluster: Cluster, queue: str, demand: Gpus) -> Want | None:
    """What ``queue`` brings to the division with ``demand`` (:func:`queue_demand`'s): ``None`` for
    none, as a queue absent from the demand."""
    return want_of(cluster.config.queues[queue], demand) if demand else None


def _pool(cluster: Cluster, memo: CycleMemo) -> Gpus:
    """The GPUs the division shares out: every node's (kept in ``memo``)."""
    pool = memo.gpus_total
    if pool is None:
        pool = memo.gpus_total = sum(n.gpus for n in cluster.nodes)
    return pool


def fair_share(cluster: Cluster, ledger: Ledger, queue: str) -> float:
    """YuniKorn's share: the max over guaranteed resources of used / guaranteed.

    A resource used with a guarantee of 0 makes the share infinite (the queue only borrows)."""
    return share_of(cluster.guarantee[queue], ledger.of(queue))


def share_of(guarantee: Mapping[str, Gpus], used: Mapping[str, Gpus]) -> float:
    """:func:`fair_share` of a queue with this guarantee and usage."""
    share = 0.0
    for key, g in guarantee.items():
        u = used.get(key, 0)
        if u > 0:
            share = max(share, float(u) / (g if type(g) is int else float(g)) if g > 0 else _INF)
    return share
