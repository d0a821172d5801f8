"""Free capacity, request shapes that still fit, fragmentation, and the GPU-type distribution.

Per node and GPU type: ``allocated`` is what running pods hold there (counted as
:attr:`accounting.model.Allocation.counted_milli`: MIG slices as slices), capped at the node's
capacity of that type (``overcommitted`` keeps what is above, which only inconsistent data
produces), and ``free`` is ``capacity - allocated`` on a schedulable node (ready, not cordoned)
and 0 on any other. A node split into MIG slices has a row per type (its whole GPUs, each
profile): an allocation counts on the row of its own type there, else on the node's first row.

**Fits**: for a shape of ``k`` GPUs on one node, ``sum over nodes of floor(free / k)``: how many
such requests could still be placed at once, per type and over all types.

**Fragmentation ratio**: a *whole-node request* asks for all of a node's GPUs. Free GPUs on a
node that is partly allocated (``0 < free < capacity``) cannot serve one; those on a fully free
node can. The ratio is ``free GPUs on partly allocated nodes / all free GPUs`` (0 when nothing is
free): 0 means every free GPU sits on an empty node, 1 that no whole node is free.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from accounting.model import MILLI, Allocation, NodeCapacity, as_gpus
from accounting.resolve import Resolver

SHAPES = (1, 2, 4, 8)


@dataclass(frozen=True, slots=True)
class NodeFree:
    cluster: str
    node: str
    gpu_type: str
    capacity: float
    allocated: float
    free: float
    schedulable: bool
    overcommitted: float = 0.0
    milli: tuple[int, int, int] = (0, 0, 0)    # (capacity, allocated, free) in milli-GPUs, for exact sums


@dataclass(frozen=True, slots=True)
class TypeCapacity:
    """One GPU type (``gpu_type="*"``: all types together)."""

    gpu_type: str
    capacity: float
    allocated: float
    free: float
    fragmented_free: float
    fits: Mapping[int, int] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def fragmentation_ratio(self) -> float:
        return self.fragmented_free / self.free if self.free > 0 else 0.0


@dataclass(frozen=True, slots=True)
class CapacityView:
    nodes: tuple[NodeFree, ...]
    types: tuple[TypeCapacity, ...]          # sorted by type, then the "*" total
    total: TypeCapacity


def node_free(nodes: Iterable[NodeCapacity], running: Iterable[Allocation], resolver: Resolver) -> tuple[NodeFree, ...]:
    """Per node and type, counted in milli-GPUs and shown in GPUs."""
    nodes = sorted(nodes, key=lambda n: (n.cluster, n.node))
    types: dict[tuple[str, str], list[str]] = {}
    for n in nodes:
        types.setdefault((n.cluster, n.node), []).append(resolver.gpu_type(n.gpu_model))
    held: dict[tuple[str, str, str], int] = {}
    for a in running:
        here = types.get((a.cluster, a.node), [])
        t = resolver.gpu_type(a.gpu_model, a.gpu_resource)
        k = (a.cluster, a.node, t if t in here or not here else here[0])
        held[k] = held.get(k, 0) + a.counted_milli
    out = []
    for n in nodes:
        h = held.get((n.cluster, n.node, resolver.gpu_type(n.gpu_model)), 0)
        alloc = min(h, n.milli_gpus)
        free = n.milli_gpus - alloc if n.schedulable else 0
        out.append(NodeFree(n.cluster, n.node, resolver.gpu_type(n.gpu_model), as_gpus(n.milli_gpus), as_gpus(alloc),
                            as_gpus(free), n.schedulable, as_gpus(max(0, h - n.milli_gpus)),
                            (n.milli_gpus, alloc, free)))
    return tuple(out)


def _summary(gpu_type: str, nodes: Sequence[NodeFree], shapes: Sequence[int]) -> TypeCapacity:
    ms = [n.milli for n in nodes]
    fits = {k: sum(f // (k * MILLI) for _, _, f in ms) for k in shapes}
    return TypeCapacity(
        gpu_type=gpu_type,
        capacity=as_gpus(sum(c for c, _, _ in ms)),
        allocated=as_gpus(sum(a for _, a, _ in ms)),
        free=as_gpus(sum(f for _, _, f in ms)),
        fragmented_free=as_gpus(sum(f for c, _, f in ms if 0 < f < c)),
        fits=MappingProxyType(fits),
    )


def capacity_view(nodes: Iterable[NodeCapacity], running: Iterable[Allocation], resolver: Resolver,
                  shapes: Sequence[int] = SHAPES) -> CapacityView:
    per_node = node_free(nodes, running, resolver)
    by_type: dict[str, list[NodeFree]] = {}
    for n in per_node:
        by_type.setdefault(n.gpu_type, []).append(n)
    types = tuple(_summary(t, ns, shapes) for t, ns in sorted(by_type.items()))
    return CapacityView(per_node, types, _summary("*", per_node, shapes))


@dataclass(frozen=True, slots=True)
class TypeShare:
    """The distribution table: ``queue`` is ``"*"`` for the whole type."""

    gpu_type: str
    queue: str
    capacity: float
    allocated: float
    idle: float
    free: float


def distribution(view: CapacityView, running: Iterable[Allocation], idle_gpus: Mapping[tuple[str, str], float],
                 resolver: Resolver) -> tuple[TypeShare, ...]:
    """Capacity, allocated, idle and free by type, then by type and queue (leaf queues).

    ``idle_gpus`` maps (queue, gpu_type) to the GPUs idle now."""
    held_m: dict[tuple[str, str], int] = {}
    for a in running:
        k = (resolver.gpu_type(a.gpu_model, a.gpu_resource), resolver.queue(a.queue, a.namespace))
        held_m[k] = held_m.get(k, 0) + a.counted_milli
    held = {k: as_gpus(v) for k, v in held_m.items()}
    rows = []
    for t in view.types:
        idle_t = sum(v for (q, gt), v in idle_gpus.items() if gt == t.gpu_type)
        rows.append(TypeShare(t.gpu_type, "*", t.capacity, t.allocated, idle_t, t.free))
        for (gt, q), v in sorted(held.items()):
            if gt == t.gpu_type:
                rows.append(TypeShare(gt, q, 0.0, v, idle_gpus.get((q, gt), 0.0), 0.0))
    return tuple(rows)
