"""Baseline policies for ``gpuq simulate --baseline``: other ``schedule(snapshot, now) -> Decisions``
functions, so the simulator (:func:`scheduler.simulator.engine.simulate`) replays a scenario through
them on the same clock, with the same cluster, the same best-fit placement and the same events as
gpuq's core. Pure: no I/O, no clock.

``fifo`` (plain FIFO, best fit)
    One line over all queues, in submit order (the simulator's pending order: submit time, then
    file order). Each cycle starts the head while it fits, by best fit (:class:`FreeIndex`, the
    core's packing, over the workload's GPU types in its order) and stops at the first head that
    does not fit: the head blocks the line, as in a textbook FIFO. It ignores the queues entirely
    (no guarantees, no max, no borrowing limits): only capacity counts. It never preempts. (A
    workload no queue max could ever admit is still rejected at submit by the simulator, the same
    for every policy, so all of them see the same work.)

``per-queue`` (Kueue's admission shape)
    Each cycle admits at most one workload per queue: the queues are visited in the core's queue
    order (:func:`scheduler.ordering.queue_key`, recomputed after each admission), and each
    admits the first of its pending workloads, in the core's workload order (priority, submit,
    id), that fits within the max of its queue and its ancestors (borrowing stops there) and has
    room. The queue order is taken once at the start of the cycle (each queue admits at most
    once, so its key would only matter again in the next cycle). It never preempts. Kueue's scheduler takes one head per ClusterQueue per cycle; a head
    that does not fit there is set aside and retried later, and reclaiming borrowed quota by
    preemption is optional. Here a queue whose head does not fit admits the next one that does
    in the same cycle, and a cycle runs whenever the simulator's clock does, so this is a lower
    bound on Kueue's waits with preemption off (Kueue does no better in this shape), not a model
    of Kueue.

Neither gives pending reasons: ``Decisions.pending`` is empty (the simulator does not read it).
"""
from __future__ import annotations

import heapq
from collections.abc import Callable

from scheduler.cycle import acceptable_types
from scheduler.model import Admission, Decisions, Gpus, Placement, Workload
from scheduler.ordering import by_queue, queue_key
from scheduler.placement import FreeIndex
from scheduler.quota import Ledger, over_max
from scheduler.snapshot import Cluster, Snapshot, demand

Policy = Callable[[Snapshot, float], Decisions]


def _place(cluster: Cluster, index: FreeIndex, w: Workload) -> Placement | None:
    for t in acceptable_types(cluster, w):
        p = index.place(t, w.gpus_per_pod, w.pods)
        if p is not None:
            return p
    return None


def fifo(snap: Snapshot, now: float) -> Decisions:
    """Plain FIFO over all queues with best-fit packing; the head blocks the line; no preemption."""
    cluster = snap.cluster
    occ = snap.occupancy
    index = FreeIndex(cluster, occ.node_free, occ.levels, occ.partial)
    admissions: list[Admission] = []
    # sorted() is stable: equal submit times keep the simulator's order (file order)
    for w in sorted(snap.pending, key=lambda w: w.submit_s):
        p = _place(cluster, index, w)
        if p is None:
            break
        admissions.append(Admission(w, p))
    return Decisions(now, tuple(admissions), (), ())


def per_queue(snap: Snapshot, now: float) -> Decisions:
    """At most one admission per queue per cycle, within max; no preemption (see the module)."""
    cluster = snap.cluster
    occ = snap.occupancy
    index = FreeIndex(cluster, occ.node_free, occ.levels, occ.partial)
    ledger = Ledger(occ.usage)
    groups = by_queue(snap.pending)
    heap = [(queue_key(cluster, ledger, q), q) for q in groups]
    heapq.heapify(heap)
    admissions: list[Admission] = []
    no_room: set[tuple[str, Gpus, int]] = set()
    while heap:
        _, q = heapq.heappop(heap)
        failed: set[tuple[object, ...]] = set()   # shapes with no admission in q now
        for w in groups[q]:
            shape = (w.gpu_types, w.gpus_per_pod, w.pods, w.cpu_millicores_per_pod, w.memory_per_pod_bytes)
            if shape in failed:
                continue
            p = _admit(cluster, ledger, index, w, no_room)
            if p is not None:
                admissions.append(Admission(w, p))
                break
            failed.add(shape)
    return Decisions(now, tuple(admissions), (), ())


def _admit(cluster: Cluster, ledger: Ledger, index: FreeIndex, w: Workload,
           no_room: set[tuple[str, Gpus, int]]) -> Placement | None:
    """Place ``w`` on the first of its types with room within max. ``no_room``: gang shapes that
    found no room earlier in this cycle (admissions only take GPUs, so they still find none)."""
    for t in acceptable_types(cluster, w):
        room = (t, w.gpus_per_pod, w.pods)
        if room in no_room:
            continue
        vec = demand(w, t)
        if over_max(cluster, ledger, w.queue, vec) is not None:
            continue
        p = index.place(t, w.gpus_per_pod, w.pods)
        if p is None:
            no_room.add(room)
            continue
        ledger.add(cluster.chains[w.queue], vec)
        return p
    return None


POLICIES: dict[str, Policy] = {"fifo": fifo, "per-queue": per_queue}
