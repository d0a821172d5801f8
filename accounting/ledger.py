"""The one ledger of allocations: who holds which GPUs, each workload counted once. Pure.

Sources, in order of precedence (:data:`SOURCES`):

``pod``
    a Kubernetes pod bound to a node with GPUs (the collector's watcher);
``placement_group``
    a Ray placement group's bundles on a node (the collector's State API target);
``ray_job``
    the GPUs (fractions included) of a Ray job's running tasks and alive actors outside placement
    groups on a node, its ``entrypoint_num_gpus`` among them (:mod:`collector.ray_alloc`);
``kueue``
    a Kueue Workload holding quota (``queues_from: kueue``; :mod:`collector.k8s_kueue`): one row
    with no node (Kueue assigns flavors, not nodes), counted for **what of it is not seen yet**:
    its GPUs less the most GPUs of its workload seen running at once on any nodes since its
    admission, by the best source on each node (:func:`kueue_segments`). So a gang whose pods start
    on one node, then another, is billed its whole reservation throughout: the reservation's rest
    beside the pods already running, and nothing more once all of them run. Decision: the rest never
    grows back (pods that end before the others start do not hand their GPUs back to the
    reservation), as an admission does not count again on a node where its workload was seen;
``admission``
    what gpuq admitted and has not been seen yet by any of the above (the scheduler).

The ledger counts per **(workload, node)**: a workload on several nodes (a gang) is counted on
each of them, and the precedence of sources is applied per workload and node. On each node a
workload holds, its observed rows count from the best source seen there (an admitted RayJob's
pods, not also a placement group inside them), and its admission counts from the admit until the
workload is seen there: cut at the earliest start of its observed rows on that node that end
after the admit (:func:`dedup`). So a gang whose pods are seen on one node and not yet on the
other counts the pods on the first and the admission on the second, and a Ray gang is billed from
its admit, not from when its job created its placement group seconds later. Decision: once the
workload has been seen on a node, the admission does not count there again (after its pods are
gone and before gpuq saw it end): the collectors' record of the release wins, and a workload that
gpuq still holds but no collector sees is what the audit (:mod:`accounting.audit`) and the
reconciler report. A row with no queue of its own (a placement group) takes the queue of its
workload's rows on that node (the admission's). Rows without a workload id (work gpuq did not
admit: pods of other schedulers, jobs started before gpuq) always count: they are *foreign*.

Restarts (:func:`slot`): a Kubernetes pod runs on one node at a time, so a pod's rows are one
*slot* per ``(cluster, namespace, pod)`` and a later row of the same pod ends an earlier one left
open; the rows of the other sources name one node of a multi-node allocation each, so their slot
also holds the node (a gang's two nodes are two slots, never one cutting the other).

``accounting.sql.LEDGER`` is the same rule in SQL; ``tests/test_ledger.py`` checks the two agree.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import replace
from fractions import Fraction

from accounting.model import Allocation, milli
from gpuq.gpu_share import base_model, mig_fraction, mig_profile_of, milli_floor

SOURCES = ("pod", "placement_group", "ray_job", "kueue", "admission")
_RANK = {s: i for i, s in enumerate(SOURCES)}
ADMISSION = "admission"
KUEUE = "kueue"
RESERVATIONS = (KUEUE, ADMISSION)  # rows that hold quota before (or without) anything is seen on a node
_ADMIT = len(SOURCES) - 1          # the admission's rank (and any unknown source's)
_KUEUE = _RANK[KUEUE]              # below it: observed rows


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


def dedup(allocations: Iterable[Allocation], since_s: float | None = None) -> list[Allocation]:
    """The allocations that count, in their input order (:data:`accounting.sql.LEDGER` is the same
    rule): every foreign row; per (workload, node), the observed rows of the best source there, and
    the admission until the workload is seen there (cut at the earliest start of its observed rows
    there that end after the admit; whole when there is none). A row with no queue takes the queue
    of its workload's rows on that node (a placement group's is the admission's).

    ``since_s`` (a window's start): observed rows that ended by then only cut admissions (they are
    the history a window needs, not part of it), and rows that end by then are left out."""
    allocs = list(allocations)
    best: dict[tuple[str, str], int] = {}
    seen: dict[tuple[str, str], list[tuple[float, float | None]]] = {}
    queue: dict[tuple[str, str], str] = {}
    kueue: set[str] = set()
    for a in allocs:
        if a.workload_id:
            r, k = rank(a.source), (a.workload_id, a.node)
            if r < _KUEUE:
                seen.setdefault(k, []).append((a.start_s, a.end_s))
                if since_s is None or a.end_s is None or a.end_s > since_s:
                    best[k] = min(r, best.get(k, r))
            elif r == _KUEUE:
                kueue.add(a.workload_id)
            if a.queue > queue.get(k, ""):
                queue[k] = a.queue
    held = _kueue_held(allocs, kueue) if kueue else {}
    out: list[Allocation] = []
    for a in allocs:
        if a.workload_id:
            r, k = rank(a.source), (a.workload_id, a.node)
            if r < _KUEUE and r != best.get(k):
                continue
            if not a.queue:
                a = replace(a, queue=queue.get(k, ""))
            if r == _KUEUE:
                out += (b for b in kueue_segments(a, held.get((a.cluster, a.workload_id), ()))
                        if since_s is None or b.end_s is None or b.end_s > since_s)
                continue
            if r > _KUEUE:
                cut = min((s for s, e in seen.get(k, ()) if e is None or e > a.start_s), default=None)
                if cut is not None:
                    if cut <= a.start_s:
                        continue
                    if a.end_s is None or cut < a.end_s:
                        a = replace(a, end_s=cut)
        if since_s is None or a.end_s is None or a.end_s > since_s:
            out.append(a)
    return out


def _kueue_held(allocs: list[Allocation], kueue: set[str]) -> dict[tuple[str, str], list[tuple[float, float | None, int]]]:
    """The observed rows that count against each Kueue workload's reservation, per (cluster,
    workload) (Kueue's ids repeat across clusters): on each node the best source over all rows."""
    rows = [a for a in allocs if a.workload_id in kueue and rank(a.source) < _KUEUE]
    best: dict[tuple[str, str], int] = {}
    for a in rows:
        k = (a.workload_id, a.node)
        best[k] = min(rank(a.source), best.get(k, _KUEUE))
    held: dict[tuple[str, str], list[tuple[float, float | None, int]]] = {}
    for a in rows:
        if rank(a.source) == best[(a.workload_id, a.node)]:
            held.setdefault((a.cluster, a.workload_id), []).append((a.start_s, a.end_s, a.milli_gpus))
    return held


def kueue_segments(a: Allocation, held: Iterable[tuple[float, float | None, int]]) -> list[Allocation]:
    """A Kueue Workload's row as it counts (see the module's ``kueue``): its milli-GPUs less the
    most that ``held`` (its workload's counted observed rows on any nodes: start, end, milli-GPUs)
    held at once since the row's start, in constant pieces; none once all of it is seen. Pieces
    after the first are ``<uid>#<start ms>`` (:func:`reservation_of`). The same rule in SQL:
    :data:`accounting.sql.LEDGER_KUEUE`."""
    end = math.inf if a.end_s is None else a.end_s
    events: list[tuple[float, int]] = []
    for s, e, m in held:
        if e is None or e > a.start_s:
            events.append((max(s, a.start_s), m))
            if e is not None:
                events.append((e, -m))
    events.sort()
    out: list[Allocation] = []
    at, left, now, most, i = a.start_s, a.milli_gpus, 0, 0, 0
    while i < len(events) and events[i][0] < end and left > 0:
        t = events[i][0]
        while i < len(events) and events[i][0] == t:
            now += events[i][1]
            i += 1
        most = max(most, now)
        rest = max(0, a.milli_gpus - most)
        if rest != left:
            if t > at:
                out.append(_piece(a, at, t, left))
            at, left = t, rest
    if left > 0:
        out.append(_piece(a, at, a.end_s, left))
    return out


def _piece(a: Allocation, start_s: float, end_s: float | None, milli: int) -> Allocation:
    if start_s == a.start_s:
        return replace(a, end_s=end_s, milli_gpus=milli)
    return replace(a, uid=f"{a.uid}#{round(start_s * 1000)}", start_s=start_s, end_s=end_s, milli_gpus=milli)


def reservation_of(uid: str) -> str:
    """The uid of the Kueue row a piece of it (:func:`kueue_segments`) came from."""
    return uid.split("#", 1)[0]


def combine(observed: Iterable[Allocation], admitted: Iterable[Allocation], since_s: float | None = None,
            history: Iterable[Allocation] = ()) -> list[Allocation]:
    """The ledger now: what the collectors observed, as the ledger gave it (any stored
    ``admission`` rows dropped: the scheduler's live ``admitted`` rows replace them) plus what gpuq
    admitted, deduplicated; ``history``: gpuq's observed rows that ended before ``since_s`` (they
    cut admissions). Kueue's rows in ``observed`` are already the pieces :func:`kueue_segments`
    made and are kept as they are: the rule again would take the running pods off them twice (and
    nothing gpuq admits is a Kueue workload)."""
    kueue = [a for a in observed if a.source == KUEUE]
    rest = dedup([*(a for a in history if a.source != KUEUE),
                  *(a for a in observed if a.source not in RESERVATIONS), *admitted], since_s)
    return [*rest, *kueue]


def node_of(name: str, cluster: str) -> tuple[str, str]:
    """A scheduler node name (``node``, ``cluster/node``, ``node:type`` for a node's MIG slices;
    see ``scheduler.service.accounting._nodes``) as the collectors name it: (cluster, node).
    Kubernetes and Ray node names hold neither ``/`` nor ``:``."""
    name = name.split(":", 1)[0]
    c, _, node = name.rpartition("/")
    return (c or cluster, node)


def admission_rows(workload_id: str, queue: str, *, cluster: str, namespace: str, gpu_type: str,
                   placement: Mapping[str, float] | Iterable[tuple[str, float]], start_s: float,
                   end_s: float | None = None, priority: int = 0, mig_model: str = "") -> list[Allocation]:
    """The ledger rows of one admission: one per node of its placement. The uid holds the start, so
    a workload admitted again on the same node after a preemption is a new row, not a new version
    of the one that billed its first run.

    ``mig_model``: the type is a MIG type whose slices the nodes name so
    (:meth:`accounting.queues.QueueConfig.mig_model`). Its rows are then billed as its pods will be:
    ``k`` slices are ``floor(k x N/S x 1000)`` milli-GPUs of that model (:func:`admission_share`),
    which count ``k`` slices against capacity and quotas as the scheduler placed them
    (:attr:`Allocation.counted_milli`), so a slice is not billed a whole GPU until its pod is seen."""
    nodes = placement.items() if isinstance(placement, Mapping) else placement
    out = []
    for name, n in nodes:
        if n > 0:
            c, node = node_of(name, cluster)
            model, billed = admission_share(gpu_type, n, mig_model)
            out.append(Allocation(c, namespace, workload_id, f"{workload_id}/{name}@{round(start_s * 1000)}", queue,
                                  node, model, billed, start_s, end_s, "nvidia.com/gpu", priority, "",
                                  ADMISSION, workload_id))
    return out


def admission_share(gpu_type: str, gpus: float, mig_model: str = "") -> tuple[str, int]:
    """``(gpu_model, milli_gpus)`` of an admission row holding ``gpus`` of ``gpu_type`` on a node:
    the type and its milli-GPUs; for a MIG type (``mig_model`` given) the slices' model and their
    fraction of the GPU, rounded down as a pod holding them is billed
    (``collector.k8s_extract.pod_share_milli``: ``2`` 1g slices of an A100 are 285)."""
    if not mig_model:
        return gpu_type, milli(gpus)
    return mig_model, milli_floor(Fraction(str(gpus)) * Fraction(mig_slice_fraction(mig_model)))


def mig_slice_fraction(model: str) -> Fraction:
    """One slice of a MIG model (``<product>-MIG-<profile>``) as a fraction of its GPU."""
    return mig_fraction(base_model(model), mig_profile_of(model))


def reserved(allocations: Iterable[Allocation]) -> list[Allocation]:
    """Of the ledger's rows, those only the scheduler knows (admitted, not seen yet)."""
    return [a for a in allocations if a.source == ADMISSION]
