"""The frozen input of a cycle: the static cluster, the settings, and what runs and waits now.

:class:`Cluster` holds what changes rarely (nodes, queue tree) with tables precomputed once.
:class:`Occupancy` holds the derived "who holds what" (free GPUs per node, usage per queue with
ancestors included, and the nodes of each GPU type grouped by free count); it is computed from the
running workloads by :func:`occupancy_of`, or kept up to date cheaply between cycles by
:func:`occupancy_after` so a cycle need not re-read the whole cluster.
"""
from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from accounting.queues import GPU_EQ, QueueConfig
from scheduler.errors import SnapshotError
from scheduler.memo import CycleMemo
from scheduler.model import Gpus, Node, Running, Workload, exact

_NONE: Mapping[str, Gpus] = MappingProxyType({})
# node index -> device slot -> the share of that device in use (0 < used <= 1): the devices that
# gangs of shares hold part of (scheduler.model.Placement.shares); empty while nobody asks a share
Partial = Mapping[int, Mapping[int, Decimal]]
NO_PARTIAL: Partial = MappingProxyType({})


GUARANTEE, FAIR_SHARE = "guarantee", "fair_share"
RECLAIM_MODES = (GUARANTEE, FAIR_SHARE)


@dataclass(frozen=True, slots=True)
class Settings:
    """The cycle's settings. ``reclaim`` (issue 21): what a preemption may restore, ``guarantee``
    (a queue reclaims only up to its guarantee: YuniKorn's rule, the default) or ``fair_share``
    (also up to its entitlement, :func:`scheduler.quota.cycle_entitlements`, and no victim's queue
    goes below its own); docs/SCENARIOS.md states the rules of each."""

    preemption: bool = True
    preemption_delay_s: float = 30.0
    reclaim: str = GUARANTEE
    # fair share over time (issue 21; 0: off): the half-life of the decayed usage that the caller
    # puts on each snapshot (Snapshot.usage); the core reads only that usage, never this number
    usage_half_life_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Cluster:
    config: QueueConfig
    nodes: tuple[Node, ...]
    node_index: Mapping[str, int]
    types: tuple[str, ...]                       # GPU types in order of first appearance
    type_nodes: Mapping[str, tuple[int, ...]]    # node indices per type
    type_cap: Mapping[str, int]                  # most GPUs on one node of the type
    type_sizes: Mapping[str, tuple[tuple[int, int], ...]]   # (GPUs per node, nodes) per type
    chains: Mapping[str, tuple[str, ...]]        # queue -> (queue, parent, ..., root)
    guarantee: Mapping[str, Mapping[str, Gpus]]  # effective guarantees (gpu defaults to 0, unless gpu_eq given)
    fences: Mapping[str, frozenset[str]]         # fenced queues on each queue's chain
    # the raw gpu guarantee the cycle's quick checks read: the ``gpu`` guarantee, or UNBOUNDED for a
    # queue guaranteed in ``gpu_eq`` only (its raw GPUs are bounded by gpu_eq, checked in full)
    gpu_guarantee: Mapping[str, int]
    # GPU type -> equivalent, only when some queue sets gpu_eq (then demand() carries gpu_eq)
    equivalents: Mapping[str, Decimal] | None = None
    # what cycles keep across cycles (scheduler.cycle; every field named in scheduler.memo): pure
    # functions of the fields above (static fits per queue and gang shape), of the last snapshots
    # (updated from what changed) and each pending workload's last reason, reused only while
    # equal; never anything a decision depends on
    memo: CycleMemo = field(default_factory=CycleMemo, compare=False, repr=False)


def build_cluster(config: QueueConfig, nodes: Iterable[Node]) -> Cluster:
    node_t = tuple(nodes)
    index: dict[str, int] = {}
    type_nodes: dict[str, list[int]] = {}
    for i, n in enumerate(node_t):
        if n.name in index:
            raise SnapshotError(f"node {n.name}", "duplicate node name")
        if n.gpus < 0:
            raise SnapshotError(f"node {n.name}", f"negative GPU count {n.gpus}")
        index[n.name] = i
        type_nodes.setdefault(n.gpu_type, []).append(i)
    chains: dict[str, tuple[str, ...]] = {}
    guarantee: dict[str, Mapping[str, Gpus]] = {}
    gpu_guarantee: dict[str, int] = {}
    fences: dict[str, frozenset[str]] = {}
    for path, q in config.queues.items():
        chain = (path, *config.ancestors(path))
        chains[path] = chain
        in_eq = GPU_EQ in q.guaranteed and "gpu" not in q.guaranteed
        guarantee[path] = MappingProxyType(dict(q.guaranteed) if in_eq else {"gpu": 0, **q.guaranteed})
        gpu_guarantee[path] = UNBOUNDED if in_eq else int(q.guaranteed.get("gpu", 0))
        fences[path] = frozenset(c for c in chain if config.queues[c].preemption_fence)
    return Cluster(
        config=config,
        nodes=node_t,
        node_index=MappingProxyType(index),
        types=tuple(type_nodes),
        type_nodes=MappingProxyType({t: tuple(v) for t, v in type_nodes.items()}),
        type_cap=MappingProxyType({t: max(node_t[i].gpus for i in v) for t, v in type_nodes.items()}),
        type_sizes=MappingProxyType(
            {t: tuple(sorted(Counter(node_t[i].gpus for i in v).items())) for t, v in type_nodes.items()}
        ),
        chains=MappingProxyType(chains),
        guarantee=MappingProxyType(guarantee),
        fences=MappingProxyType(fences),
        gpu_guarantee=MappingProxyType(gpu_guarantee),
        equivalents=config.equivalents() if config.uses_gpu_eq else None,
    )


# The usage of non-preemptible work is kept beside the plain resources, each under its name with
# this prefix (``non-preemptible:gpu``): a queue's non-preemptible work must stay within its
# guarantee (:func:`scheduler.quota.over_guarantee_pinned`), and keeping it in the usage vectors
# lets the ledger, the occupancy and the simulator carry it as they carry any resource. No max
# or guarantee names such a key, so the other checks never see it.
PINNED = "non-preemptible:"
UNBOUNDED = 2**62          # Cluster.gpu_guarantee of a queue guaranteed in gpu_eq only: never binds
_ONE = Decimal(1)


def demand(w: Workload, gpu_type: str, eq: Mapping[str, Decimal] | None = None) -> tuple[tuple[str, Gpus], ...]:
    """The usage vector of ``w`` running on ``gpu_type``: ``gpu``, ``gpu/<type>``, cpu, memory;
    for a non-preemptible ``w`` each again under :data:`PINNED`. A gang of shares counts its
    shares (``4 x 0.25`` is 1 GPU), exactly. ``eq``: :attr:`Cluster.equivalents`, given only
    where some queue sets ``gpu_eq``; then ``gpu_eq`` too, the GPUs times the type's equivalent
    (a type not declared is worth 1), exact."""
    n = w.pods * w.gpus_per_pod
    vec: tuple[tuple[str, Gpus], ...] = (("gpu", n), ("gpu/" + gpu_type, n))
    if eq is not None:
        vec += ((GPU_EQ, exact(n * eq.get(gpu_type, _ONE))),)
    if w.cpu_millicores_per_pod:
        vec += (("cpu", w.cpu_millicores_per_pod * w.pods),)
    if w.memory_per_pod_bytes:
        vec += (("memory", w.memory_per_pod_bytes * w.pods),)
    if not w.preemptible:
        vec += tuple([(PINNED + key, amt) for key, amt in vec])
    return vec


Levels = Mapping[str, tuple[tuple[int, ...], ...]]


def dict_copy(m: Mapping[str, Any]) -> dict[str, Any]:
    """A shallow ``dict`` copy; a read-only view is copied at C speed (``dict(view)`` goes key by
    key, ten times slower)."""
    c = m.copy() if isinstance(m, MappingProxyType) else None
    return c if type(c) is dict else dict(m)


@dataclass(frozen=True, slots=True)
class Occupancy:
    """``levels[type][f]``: the indices (ascending) of the type's nodes with ``f`` GPUs free, so a
    cycle's free index starts without a pass over every node; ``None`` when not known (the
    cycle then derives it from ``node_free``)."""

    node_free: tuple[int, ...]                      # whole free GPUs per node, cluster node order
    usage: Mapping[str, Mapping[str, Gpus]]         # queue -> resource -> amount, ancestors included
    levels: Levels | None = field(default=None, compare=False, repr=False)
    # devices partly held by shares (:data:`Partial`); such a device is not free in ``node_free``
    partial: Partial = field(default_factory=lambda: NO_PARTIAL)


def occupancy_of(cluster: Cluster, running: Iterable[Running]) -> Occupancy:
    return occupancy_after(
        cluster, Occupancy(tuple(n.gpus for n in cluster.nodes), MappingProxyType({})), (), running
    )


def levels_of(cluster: Cluster, node_free: Sequence[int]) -> Levels:
    out = {}
    for t, idxs in cluster.type_nodes.items():
        lv: list[list[int]] = [[] for _ in range(cluster.type_cap[t] + 1)]
        for i in idxs:
            lv[node_free[i]].append(i)
        out[t] = tuple(map(tuple, lv))
    return MappingProxyType(out)


def _levels_after(cluster: Cluster, occ: Occupancy, free: list[int], before: dict[int, int]) -> Levels:
    """``occ.levels`` with the nodes in ``before`` (node -> its old free count) moved to their
    level in ``free``; rebuilt from scratch when unknown or when many nodes moved."""
    if occ.levels is None or len(before) * 8 > len(free):
        return levels_of(cluster, free)
    moves: dict[tuple[str, int], tuple[list[int], list[int]]] = {}
    for i, old in before.items():
        if free[i] != old:
            t = cluster.nodes[i].gpu_type
            moves.setdefault((t, old), ([], []))[0].append(i)
            moves.setdefault((t, free[i]), ([], []))[1].append(i)
    if not moves:
        return occ.levels
    out = dict_copy(occ.levels)
    touched: dict[str, list[tuple[int, ...]]] = {}
    for (t, f), (gone, came) in moves.items():
        lv = touched.get(t)
        if lv is None:
            lv = touched[t] = list(out[t])
        nodes = list(lv[f])
        for i in gone:
            del nodes[bisect_left(nodes, i)]
        for i in came:
            insort(nodes, i)
        lv[f] = tuple(nodes)
    for t, lv in touched.items():
        out[t] = tuple(lv)
    return MappingProxyType(out)


def occupancy_after(
    cluster: Cluster, occ: Occupancy, stopped: Iterable[Running], started: Iterable[Running]
) -> Occupancy:
    """``occ`` with ``stopped`` workloads' GPUs returned and ``started`` ones' taken."""
    free = list(occ.node_free)
    before: dict[int, int] = {}
    usage: dict[str, Mapping[str, Gpus]] = dict_copy(occ.usage)
    copied: dict[str, dict[str, Gpus]] = {}
    partial: dict[int, dict[int, Decimal]] | None = None
    for sign, items in ((1, stopped), (-1, started)):
        for r in items:
            w = r.workload
            if r.placement.shares:
                if partial is None:
                    partial = {i: dict(d) for i, d in occ.partial.items()}
                for name, slot, share in r.placement.shares:
                    i = cluster.node_index[name]
                    before.setdefault(i, free[i])
                    shift_share(partial, free, i, slot, -sign * share, f"node {name}", w.id)
                    if free[i] < 0:
                        raise SnapshotError(f"node {name}", f"GPU count out of range after {w.id}")
            else:
                for name, n in r.placement.nodes:
                    i = cluster.node_index[name]
                    before.setdefault(i, free[i])
                    free[i] += sign * n  # type: ignore[assignment]   # whole gangs hold ints
                    if free[i] < 0 or free[i] > cluster.nodes[i].gpus:
                        raise SnapshotError(f"node {name}", f"GPU count out of range after {w.id}")
            chain = cluster.chains.get(w.queue)
            if chain is None:
                raise SnapshotError(f"workload {w.id}", f"unknown queue {w.queue}")
            vec = demand(w, r.placement.gpu_type, cluster.equivalents)
            for q in chain:
                d = copied.get(q)
                if d is None:
                    d = copied[q] = dict_copy(usage.get(q, _NONE))
                    usage[q] = d
                for key, amt in vec:
                    v = d.get(key, 0) - sign * amt
                    d[key] = v if type(v) is int else exact(v)
    for q, d in copied.items():
        usage[q] = MappingProxyType(d)
    kept = occ.partial if partial is None else MappingProxyType(
        {i: MappingProxyType(d) for i, d in partial.items() if d})
    return Occupancy(tuple(free), MappingProxyType(usage), _levels_after(cluster, occ, free, before), kept)


def shift_share(partial: dict[int, dict[int, Decimal]], free: list[int], i: int, slot: int,
                amt: Decimal, where: str, wid: str) -> None:
    """Take (``amt`` > 0) or give back (``amt`` < 0) a share of device ``slot`` of node ``i``: a
    device first taken leaves the node's whole free devices (``free[i]``), one given back whole
    returns to them. Raises :class:`SnapshotError` when the device would hold more than its whole
    or less than nothing."""
    d = partial.get(i)
    if d is None:
        d = partial[i] = {}
    used = d.get(slot)
    if used is None:
        if amt <= 0:
            raise SnapshotError(where, f"device slot {slot} holds no share to give back ({wid})")
        free[i] -= 1                      # a whole free device becomes a shared one
        used = Decimal(0)
    used += amt
    if used > 1 or used < 0:
        raise SnapshotError(where, f"device slot {slot} would hold {used} of one GPU after {wid}")
    if used == 0:
        del d[slot]
        free[i] += 1
    else:
        d[slot] = used


@dataclass(frozen=True, slots=True)
class PendingChanges:
    """How a snapshot's ``pending`` differs from an earlier snapshot's: ``base`` is that earlier
    ``pending`` (the same object), and ``pending`` holds exactly its workloads less ``removed``
    plus ``added`` (the same objects; one removed and added again is in both). A caller that
    keeps its pending workloads between cycles (the simulator) passes it so the cycle regroups
    only what changed (:func:`scheduler.ordering.grouped`); without it the cycle compares the
    whole pending list with the last one it saw."""

    base: tuple[Workload, ...]
    removed: tuple[Workload, ...]
    added: tuple[Workload, ...]


@dataclass(frozen=True, slots=True)
class Snapshot:
    cluster: Cluster
    running: tuple[Running, ...]
    pending: tuple[Workload, ...]
    occupancy: Occupancy
    settings: Settings = field(default_factory=Settings)
    changes: PendingChanges | None = field(default=None, compare=False, repr=False)
    # fair share over time (issue 21): each leaf queue's decayed GPU-seconds now (accounting.decay;
    # a queue not named used none); None, the default, orders queues as without it
    # (scheduler.ordering: "Fair share over time")
    usage: Mapping[str, float] | None = None


def snapshot(
    cluster: Cluster,
    running: Iterable[Running],
    pending: Iterable[Workload],
    settings: Settings | None = None,
) -> Snapshot:
    """Build a snapshot, computing the occupancy from ``running``."""
    run = tuple(running)
    return Snapshot(cluster, run, tuple(pending), occupancy_of(cluster, run), settings or Settings())
