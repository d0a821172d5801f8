"""The one ledger of allocations: who holds which GPUs, each workload counted once. Pure.

Sources, in order of precedence (:data:`SOURCES`):

``pod``
    a Kubernetes pod bound to a node with GPUs (the collector's watcher);
``placement_group``
    a Ray placement group's bundles on a node (the collector's State API target);
``ray_job``
    a Ray job's driver that asked for GPUs (``entrypoint_num_gpus``);
``admission``
    what gpuq admitted and has not been seen yet by any of the above (the scheduler).

The ledger counts per **(workload, node) and moment**: a workload on several nodes (a gang) is
counted on each of them, and the precedence of sources is applied per workload and node, at each
moment. On each node a workload holds, a row counts where no row of a better source of the same
workload on that node is open (an admitted RayJob's pods, not also its admission; a Ray gang's
placement group, not also its admission), so a gang whose pods are seen on one node and not yet on
the other counts the pods on the first and the admission on the second, and an admission counts
from the moment gpuq admitted the workload until its placement group (or pods) appear, and again
from when they are gone until gpuq saw the workload end: gpuq held those GPUs for it all along
(:func:`uncovered`; a row cut so keeps its uid for its first piece, ``<uid>#<start ms>`` for
later ones). A row with no queue of its own (a placement group) takes its workload's queue from
the other rows (the admission). Rows without a workload id (work gpuq did not admit: pods of
other schedulers, jobs started before gpuq) always count: they are *foreign*.

Restarts (:func:`slot`): a Kubernetes pod runs on one node at a time, so a pod's rows are one
*slot* per ``(cluster, namespace, pod)`` and a later row of the same pod ends an earlier one left
open; the rows of the other sources name one node of a multi-node allocation each, so their slot
also holds the node (a gang's two nodes are two slots, never one cutting the other).

``accounting.sql.LEDGER`` is the same rule in SQL; ``tests/test_ledger.py`` checks the two agree.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from accounting.model import Allocation, milli

SOURCES = ("pod", "placement_group", "ray_job", "admission")
_RANK = {s: i for i, s in enumerate(SOURCES)}
ADMISSION = "admission"


def rank(source: str) -> int:
    return _RANK.get(source, len(SOURCES) - 1)


Slot = tuple[str, str, str, str]


def slot(a: Allocation) -> Slot:
    """The rows of one slot run one at a time (see the module's *Restarts*); the same rule in SQL
    is :data:`accounting.sql.SLOT`."""
    return (a.cluster, a.namespace, a.pod, "" if a.source == "pod" else a.node)


def by_slot(allocations: Iterable[Allocation]) -> dict[Slot, Allocation]:
    """The allocations by slot, for :func:`holder` (the last of a slot wins)."""
    return {slot(a): a for a in allocations}


def holder(index: Mapping[Slot, Allocation], cluster: str, namespace: str, pod: str, node: str) -> Allocation | None:
    """The allocation holding a GPU that DCGM saw used by ``pod`` on ``node``: the pod's wherever
    DCGM names its node (its ``Hostname`` need not be the Kubernetes node name); a multi-node
    allocation's row on that node only."""
    return index.get((cluster, namespace, pod, "")) or (index.get((cluster, namespace, pod, node)) if node else None)


def uncovered(start_s: float, end_s: float | None,
              covers: Iterable[tuple[float, float | None]]) -> list[tuple[float, float | None]]:
    """The pieces of [start_s, end_s) outside every one of ``covers`` (None: open), in order: each
    starts at ``start_s`` or where a cover ends, and runs to the next cover's start or ``end_s``.
    The same rule in SQL is in :data:`accounting.sql.LEDGER`."""
    spans = list(covers)
    inf = float("inf")
    end = inf if end_s is None else end_s
    starts = sorted({start_s, *(e for _, e in spans if e is not None and start_s < e < end)})
    out: list[tuple[float, float | None]] = []
    for c in starts:
        if any(s <= c < (inf if e is None else e) for s, e in spans):
            continue
        stop = min([end, *(s for s, _ in spans if s > c)])
        if stop > c:
            out.append((c, None if stop == inf else stop))
    return out


def dedup(allocations: Iterable[Allocation]) -> list[Allocation]:
    """The allocations that count, in their input order: per (workload, node), each row where no
    row of a better source there is open (a row cut in pieces: its pieces); every foreign row."""
    allocs = list(allocations)
    spans: dict[tuple[str, str], list[tuple[int, float, float | None]]] = {}
    best: dict[tuple[str, str], int] = {}
    queue: dict[str, str] = {}
    for a in allocs:
        if a.workload_id:
            r, k = rank(a.source), (a.workload_id, a.node)
            spans.setdefault(k, []).append((r, a.start_s, a.end_s))
            best[k] = min(r, best.get(k, r))
            if a.queue > queue.get(a.workload_id, ""):
                queue[a.workload_id] = a.queue
    out = []
    for a in allocs:
        if not a.workload_id:
            out.append(a)
            continue
        a = a if a.queue else replace(a, queue=queue.get(a.workload_id, ""))
        r, k = rank(a.source), (a.workload_id, a.node)
        covers = [(s, e) for rr, s, e in spans[k] if rr < r] if r > best[k] else []
        if not covers:
            out.append(a)
            continue
        for s, e in uncovered(a.start_s, a.end_s, covers):
            uid = a.uid if s == a.start_s else f"{a.uid}#{round(s * 1000)}"
            out.append(a if (s, e) == (a.start_s, a.end_s) else replace(a, uid=uid, start_s=s, end_s=e))
    return out


def combine(observed: Iterable[Allocation], admitted: Iterable[Allocation]) -> list[Allocation]:
    """The ledger now: what the collectors observed (any stored ``admission`` rows dropped: the
    scheduler's live ``admitted`` rows replace them) plus what gpuq admitted, deduplicated."""
    return dedup([*(a for a in observed if a.source != ADMISSION), *admitted])


def node_of(name: str, cluster: str) -> tuple[str, str]:
    """A scheduler node name (``node``, ``cluster/node``, ``node:type`` for a node's MIG slices;
    see ``scheduler.service.accounting._nodes``) as the collectors name it: (cluster, node).
    Kubernetes and Ray node names hold neither ``/`` nor ``:``."""
    name = name.split(":", 1)[0]
    c, _, node = name.rpartition("/")
    return (c or cluster, node)


def admission_rows(workload_id: str, queue: str, *, cluster: str, namespace: str, gpu_type: str,
                   placement: Mapping[str, int] | Iterable[tuple[str, int]], start_s: float,
                   end_s: float | None = None, priority: int = 0) -> list[Allocation]:
    """The ledger rows of one admission: one per node of its placement. The uid holds the start, so
    a workload admitted again on the same node after a preemption is a new row, not a new version
    of the one that billed its first run."""
    nodes = placement.items() if isinstance(placement, Mapping) else placement
    out = []
    for name, n in nodes:
        if n > 0:
            c, node = node_of(name, cluster)
            out.append(Allocation(c, namespace, workload_id, f"{workload_id}/{name}@{round(start_s * 1000)}", queue,
                                  node, gpu_type, milli(n), start_s, end_s, "nvidia.com/gpu", priority, "",
                                  ADMISSION, workload_id))
    return out


def reserved(allocations: Iterable[Allocation]) -> list[Allocation]:
    """Of the ledger's rows, those only the scheduler knows (admitted, not seen yet)."""
    return [a for a in allocations if a.source == ADMISSION]
