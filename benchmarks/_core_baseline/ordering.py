"""Ordering: which queue is served next, and which of its workloads.

Queue key (lowest first): ``(fair_share, gpus_used, -queue.priority, path)``. ``fair_share`` is
YuniKorn's max over guaranteed resources of used / guaranteed (infinite for a queue that uses a
resource it has no guarantee of), so queues below their guarantee come first; among equal
shares the queue holding fewer GPUs, then the higher queue priority, then the path (stable).
Queues are leaves; the key is recomputed after every admission in the queue.

Workload key (first first): :attr:`scheduler.model.Workload.order_key`,
``(-priority, submit_s, id)``.
"""
from __future__ import annotations

from collections.abc import Iterable
from operator import attrgetter

from scheduler.model import Workload
from benchmarks._core_baseline.quota import Ledger, share_of
from scheduler.snapshot import Cluster

QueueKey = tuple[float, int, int, str]

_ORDER = attrgetter("order_key")


def queue_key(cluster: Cluster, ledger: Ledger, queue: str) -> QueueKey:
    used = ledger.of(queue)
    priority = cluster.config.queues[queue].priority
    return (share_of(cluster.guarantee[queue], used), used.get("gpu", 0), -priority, queue)


def by_queue(pending: Iterable[Workload]) -> dict[str, list[Workload]]:
    """Pending workloads grouped by queue, each list in workload order; queues sorted by path."""
    groups: dict[str, list[Workload]] = {}
    for w in pending:
        lst = groups.get(w.queue)
        if lst is None:
            groups[w.queue] = [w]
        else:
            lst.append(w)
    for lst in groups.values():
        if len(lst) > 1:
            lst.sort(key=_ORDER)
    return {q: groups[q] for q in sorted(groups)}
