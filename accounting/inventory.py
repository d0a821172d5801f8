"""One inventory of nodes, read by the accounting and the scheduler alike. Pure.

Sources, merged by :func:`inventory`:

* **observed** nodes, as the store has them (:func:`accounting.store_adapter.read_nodes`):
  Kubernetes nodes (allocatable GPUs, MIG slices as their own model), else Ray's nodes (State
  API, else metrics pages) for clusters without node events;
* **declared** nodes: ``scheduler.nodes_file`` (the scheduler's static node list), as
  :func:`declared` turns them into rows of the scheduler's cluster.

Decision: a node a collector has seen is as seen (its GPUs, its readiness, a cordon), whatever the
nodes file says of it; a declared node no collector has seen (yet) is in the inventory as
declared, schedulable. So with a nodes file and no collectors (``gpuq serve --no-collect``, the
dry-run actuator) capacity, free GPUs and fragmentation show exactly the nodes the scheduler
places on, and once collectors see the real nodes they take over name by name.
The scheduler's nodes are made from this inventory (``scheduler.service.accounting._nodes``),
never from the file apart.
"""
from __future__ import annotations

from collections.abc import Iterable

from accounting.model import NodeCapacity, milli


def declared(nodes: Iterable[tuple[str, str, float]], cluster: str) -> tuple[NodeCapacity, ...]:
    """``(name, gpu_type, gpus)`` of a nodes file as inventory rows; a name ``cluster/node`` names
    its cluster, any other is in ``cluster``."""
    out = []
    for name, gpu_type, gpus in nodes:
        c, _, node = name.rpartition("/")
        out.append(NodeCapacity(c or cluster, node, gpu_type, milli(gpus), True))
    return tuple(out)


def inventory(observed: Iterable[NodeCapacity], declared_nodes: Iterable[NodeCapacity] = ()) -> tuple[NodeCapacity, ...]:
    """The nodes: every observed row, then each declared node whose (cluster, node) no observed row
    has, in (cluster, node, model) order."""
    seen = list(observed)
    names = {(n.cluster, n.node) for n in seen}
    extra = [n for n in declared_nodes if (n.cluster, n.node) not in names]
    return tuple(sorted([*seen, *extra], key=lambda n: (n.cluster, n.node, n.gpu_model)))
