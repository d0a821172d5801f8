"""The scheduler's side of the one ledger (:mod:`accounting.ledger`). Pure.

* What gpuq admitted, as ledger rows (:func:`admission_store_row` for ``gpu_allocations``).
* Which observed allocations are gpuq's own: the rows carrying an id gpuq knows, and, for pods
  the collector could not tie to a workload id, those whose top owner (or Ray cluster) is the
  target of an admitted workload (:func:`owner_of`).
* The rest is *foreign* (:func:`foreign`): it occupies its nodes in the scheduler's snapshot and,
  when its queue resolves to a leaf, counts for that queue (guarantee, max, fair share) as a
  running workload that is never a victim: no actuator here can stop work gpuq did not start,
  so none is chosen, never silently.
* Reconciliation (:func:`reconcile`): every accounting interval, each mismatch between the
  ledger and what gpuq decided gets a reason on the workload and a count in a gauge.
"""
from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from accounting.ledger import ADMISSION
from accounting.model import Allocation
from scheduler.actuators.base import Target
from scheduler.model import Placement, Running, Workload, gpus_out

FOREIGN_PREFIX = "foreign:"
DRIFT, MISPLACED, FOREIGN = "actuator_drift", "misplaced", "foreign"


def admission_store_row(a: Allocation) -> tuple[Any, ...]:
    """A ledger row in ``COLUMNS["gpu_allocations"]`` order; versions as the collector's
    (``ms * 10 + 1`` open, ``+ 2`` ended) so an end outranks its start."""
    start = dt.datetime.fromtimestamp(a.start_s, dt.UTC)
    end = None if a.end_s is None else dt.datetime.fromtimestamp(max(a.end_s, a.start_s), dt.UTC)
    version = round((a.start_s if a.end_s is None else max(a.end_s, a.start_s)) * 1000) * 10 \
        + (1 if a.end_s is None else 2)
    return (a.cluster, a.namespace, a.pod, a.uid, a.queue, a.node, a.gpu_model, a.gpu_resource, a.billed_gpus,
            a.priority, a.ray_cluster, start, end, version, ADMISSION, a.workload_id, "", "")


def owner_of(a: Allocation, targets: Mapping[tuple[str, str], str]) -> str | None:
    """The gpuq workload an observed row belongs to: its workload id, else the workload whose
    target (namespace, name) is the row's top owner or the Ray cluster it created
    (``<rayjob>-<suffix>``)."""
    if a.workload_id:
        return a.workload_id
    for name in (a.owner, a.ray_cluster):
        wid = owner_of_name(a.namespace, name, targets)
        if wid is not None:
            return wid
    return None


def owner_of_name(namespace: str, name: str, targets: Mapping[tuple[str, str], str]) -> str | None:
    """The gpuq workload whose target is ``name`` in ``namespace``, or the RayJob that created the
    Ray cluster ``name`` (``<rayjob>-<suffix>``)."""
    if not name:
        return None
    wid = targets.get((namespace, name))
    return wid if wid is not None else targets.get((namespace, name.rsplit("-", 1)[0]))


@dataclass(frozen=True, slots=True)
class Foreign:
    running: tuple[Running, ...]            # counted for a leaf queue
    occupied: Mapping[str, tuple[str, int]]  # node -> (gpu type, GPUs) held outside any leaf queue
    allocations: tuple[Allocation, ...]
    # running id -> the workload ids its rows carry (another scheduler's: ``kueue/<ns>/<name>``),
    # sorted; what the advisor (scheduler.service.advisor) names another scheduler's work by
    workload_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def foreign(observed: Iterable[Allocation], known: Callable[[str], bool],
            targets: Mapping[tuple[str, str], str], queue_of: Callable[[Allocation], str],
            leaves: frozenset[str], node_name: Callable[[Allocation], str],
            type_of: Callable[[str, Allocation], str]) -> Foreign:
    """The observed allocations that are not gpuq's, grouped by (cluster, namespace, top owner)."""
    groups: dict[tuple[str, str, str, str, str], list[tuple[str, Allocation]]] = {}
    rows = []
    for a in observed:
        wid = owner_of(a, targets)
        if wid is not None and known(wid):
            continue
        rows.append(a)
        node = node_name(a)
        key = (a.cluster, a.namespace, a.owner or a.ray_cluster or a.pod, queue_of(a), type_of(node, a))
        groups.setdefault(key, []).append((node, a))
    running: list[Running] = []
    occupied: dict[str, tuple[str, int]] = {}
    ids: dict[str, tuple[str, ...]] = {}
    for (cluster, ns, owner, queue, gpu_type), members in sorted(groups.items()):
        per_node: dict[str, int] = {}
        for node, a in members:
            # a foreign share holds a device gpuq cannot place whole work on, and gpuq does not
            # know which device: each row counts its GPUs rounded up (0.25 -> 1; issue 19; before,
            # rounded to nearest, a foreign 0.5 counted 0 and its device looked free)
            per_node[node] = per_node.get(node, 0) + -(-a.milli_gpus // 1000)
        if queue not in leaves:
            for node, n in per_node.items():
                t, held = occupied.get(node, (gpu_type, 0))
                occupied[node] = (t, held + n)
            continue
        total = sum(per_node.values())
        if total <= 0:
            continue
        start = min(a.start_s for _, a in members)
        w = Workload(f"{FOREIGN_PREFIX}{cluster}/{ns}/{owner}", queue, pods=1, gpus_per_pod=total,
                     gpu_types=(gpu_type,), priority=max(a.priority for _, a in members), preemptible=False,
                     submit_s=start)
        running.append(Running(w, Placement(gpu_type, tuple(sorted(per_node.items()))), start))
        named = sorted({a.workload_id for _, a in members if a.workload_id})
        if named:
            ids[w.id] = tuple(named)
    return Foreign(tuple(running), occupied, tuple(rows), ids)


@dataclass(frozen=True, slots=True)
class Mismatch:
    kind: str                 # DRIFT | MISPLACED | FOREIGN
    workload: str             # the gpuq id, or the foreign owner
    message: str


def reconcile(observed: Sequence[Allocation], running: Mapping[str, tuple[Running, Target]],
              targets: Mapping[tuple[str, str], str], node_name: Callable[[Allocation], str],
              now_s: float, grace_s: float, managed: frozenset[str], foreign_rows: Iterable[Allocation]
              ) -> list[Mismatch]:
    """Admitted but not seen after ``grace_s`` (drift); seen on other nodes than chosen
    (misplaced); foreign work in a namespace gpuq manages (foreign)."""
    seen: dict[str, dict[str, float]] = {}
    for a in observed:
        wid = owner_of(a, targets)
        if wid is not None and wid in running:
            nodes = seen.setdefault(wid, {})
            nodes[node_name(a)] = nodes.get(node_name(a), 0.0) + a.gpus
    out = []
    for wid, (r, _target) in sorted(running.items()):
        chosen = r.placement.as_output()
        got = seen.get(wid)
        if got is None:
            if now_s - r.start_s >= grace_s:
                out.append(Mismatch(DRIFT, wid, f"admitted {now_s - r.start_s:.0f} s ago on "
                                    f"{_fmt(chosen)} but not seen running by any collector"))
        elif not set(got) <= set(chosen):
            out.append(Mismatch(MISPLACED, wid, f"gpuq chose {_fmt(chosen)}, the cluster placed it on "
                                f"{_fmt({k: gpus_out(v) for k, v in got.items()})}"))
    owners: dict[tuple[str, str], float] = {}
    for a in foreign_rows:
        if a.namespace in managed:
            k = (a.namespace, a.owner or a.ray_cluster or a.pod)
            owners[k] = owners.get(k, 0.0) + a.gpus
    for (ns, owner), gpus in sorted(owners.items()):
        out.append(Mismatch(FOREIGN, f"{ns}/{owner}", f"{ns}/{owner} holds {gpus:g} GPUs in a namespace "
                            "gpuq manages but was not admitted by gpuq"))
    return out


def _fmt(nodes: Mapping[str, int | float]) -> str:
    return ", ".join(f"{n}:{g}" for n, g in sorted(nodes.items())) or "no node"
