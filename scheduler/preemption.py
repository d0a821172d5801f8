"""Preemption: choose a minimal set of victims that lets a pending workload run.

Rules (FORMAT.md and issue 4; each has a test in tests/test_scheduler_preemption.py):

* only for a preemptor whose leaf queue stays at or below its guarantee after admission;
* a victim's leaf queue and each of its ancestors not shared with the preemptor stay at or
  above their guarantee after the victims leave (so victims come only from queues above it);
* victim priority <= preemptor priority; non-preemptible workloads are never victims; no victim
  across a preemption fence (fenced subtrees neither lose nor take by preemption);
* victims are whole gangs; the set is minimal: candidates are added in candidate order until the
  preemptor fits (its quota over its chain and its gang on real nodes of one type), then each
  added victim but the last is given back if the preemptor still fits without it.

Candidate order (first is preempted first): ``(originator, priority, -start_s, not idle, id)``:
non-originators, lower priority, the youngest (least work lost), GPUs the accounting sees idle,
then the stable id. Non-preemptible work is not a candidate at all.

The search runs on the cycle's working ledger and free index and undoes every change it made
unless it succeeds (explicit undo); the snapshot is never touched.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from scheduler.model import Running, Workload
from scheduler.placement import FreeIndex
from scheduler.quota import Ledger, Shortfall, Vec, below_floor, over_guarantee, over_max
from scheduler.snapshot import Cluster, demand


def candidate_key(r: Running) -> tuple[bool, int, float, bool, str]:
    w = r.workload
    return (w.originator, w.priority, -r.start_s, not r.idle, w.id)


class Candidate(NamedTuple):
    id: str
    queue: str
    priority: int
    gpu_type: str
    vec: Vec
    running: Running


def candidates(cluster: Cluster, ledger: Ledger, running: Iterable[Running]) -> list[Candidate]:
    """Running workloads that could ever be victims this cycle (preemptible, in a queue above
    its gpu guarantee), in candidate order."""
    g = cluster.guarantee
    over = {q for q in cluster.chains if ledger.used(q, "gpu") > g[q]["gpu"]}
    rs = [r for r in running if r.workload.preemptible and r.workload.queue in over]
    rs.sort(key=candidate_key)
    return [Candidate(r.workload.id, r.workload.queue, r.workload.priority, r.placement.gpu_type,
                      demand(r.workload, r.placement.gpu_type), r) for r in rs]


@dataclass(frozen=True, slots=True)
class Plan:
    gpu_type: str
    victims: tuple[Running, ...]


@dataclass(frozen=True, slots=True)
class NoPlan:
    not_eligible: Shortfall | None   # the guarantee the preemptor's queue would exceed, if that is why
    considered: int                   # candidates tried
    fenced: int                       # candidates skipped only because of a fence


def plan(
    cluster: Cluster,
    ledger: Ledger,
    index: FreeIndex,
    pool: list[Candidate],
    dead: set[str],
    w: Workload,
    types: tuple[str, ...],
) -> Plan | NoPlan:
    """Find victims for ``w`` on the first of ``types`` where a set exists, and apply its removal
    to ``ledger`` and ``index`` (the caller then places ``w``). ``dead``: ids that can no longer
    be victims this cycle (already preempted, or their own queue is at its floor); the search
    adds to it. On failure nothing is changed."""
    chain = cluster.chains[w.queue]
    shared = frozenset(chain)
    fence = cluster.fences[w.queue]
    k, pods = w.gpus_per_pod, w.pods
    ineligible: Shortfall | None = None
    considered = fenced = 0
    for t in types:
        vec = demand(w, t)
        s = over_guarantee(cluster, ledger, w.queue, vec)
        if s is not None:
            ineligible = ineligible or s
            continue
        ineligible = None
        taken: list[tuple[Running, Vec]] = []
        need_nodes = not index.fits(t, k, pods)
        need_quota = _over_max_all(cluster, ledger, w.queue, vec)
        fences = cluster.fences
        for vid, vq, vprio, vtype, vv, r in pool:
            if vid in dead or vq == w.queue or vprio > w.priority:
                continue
            if fences[vq] != fence:
                fenced += 1
                continue
            considered += 1
            if not ((need_nodes and vtype == t) or (need_quota and _shares(cluster, need_quota, vq, vv))):
                continue
            short = below_floor(cluster, ledger, vq, vv, shared)
            if short is not None:
                if short.queue == vq:
                    dead.add(vid)           # its own queue is at its floor: no preemptor can take it
                continue
            ledger.remove(cluster.chains[vq], vv)
            index.release(r.placement)
            taken.append((r, vv))
            need_nodes = not index.fits(t, k, pods)
            need_quota = _over_max_all(cluster, ledger, w.queue, vec)
            if not need_nodes and not need_quota:
                break
        else:
            for r, vv in reversed(taken):        # undo: no set on this type
                ledger.add(cluster.chains[r.workload.queue], vv)
                index.take(r.placement)
            continue
        for j in range(len(taken) - 2, -1, -1):      # give back what is not needed
            r, vv = taken[j]
            ledger.add(cluster.chains[r.workload.queue], vv)
            index.take(r.placement)
            if index.fits(t, k, pods) and over_max(cluster, ledger, w.queue, vec) is None:
                del taken[j]
            else:
                ledger.remove(cluster.chains[r.workload.queue], vv)
                index.release(r.placement)
        dead.update(r.workload.id for r, _ in taken)
        return Plan(t, tuple(r for r, _ in taken))
    return NoPlan(ineligible, considered, fenced)


def _over_max_all(cluster: Cluster, ledger: Ledger, queue: str, vec: Vec) -> list[tuple[str, str]]:
    """Every (queue, resource) on ``queue``'s chain whose max ``vec`` would break."""
    out = []
    queues = cluster.config.queues
    for q in cluster.chains[queue]:
        limits = queues[q].max
        if limits:
            for key, amt in vec:
                m = limits.get(key)
                if m is not None and ledger.used(q, key) + amt > m:
                    out.append((q, key))
    return out


def _shares(cluster: Cluster, need: list[tuple[str, str]], victim_queue: str, vv: Vec) -> bool:
    """Does taking ``vv`` from ``victim_queue`` relieve one of the maxes in ``need``? Relief only
    grows as victims are added, so a candidate that does not help now never will."""
    if not need:
        return False
    chain = cluster.chains[victim_queue]
    return any(q in chain and any(key == k for k, _ in vv) for q, key in need)
