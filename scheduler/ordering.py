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

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Sequence
from itertools import compress
from operator import attrgetter

from scheduler.model import Workload
from scheduler.quota import Ledger, share_of
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


_Grouped = tuple[set[int], dict[int, Workload], dict[str, list[Workload]]]


def grouped(memo: dict[object, object], pending: Sequence[Workload]) -> dict[str, list[Workload]]:
    """:func:`by_queue` of ``pending``, kept up to date in ``memo`` (the cluster's) from one call to
    the next: when most of the pending workloads are the same objects as last time, only the queues
    that gained or lost one are rebuilt, each as a new list (a list handed out is never changed
    afterwards, so a queue whose list is the same object has the same pending). The same result as
    :func:`by_queue`, at a cost that follows what changed (the set differences run at C speed)."""
    prev: _Grouped | None = memo.get(("grouped",))  # type: ignore[assignment]
    ids = set(map(id, pending))
    if prev is None or len(ids) != len(pending):
        return _regroup(memo, pending, ids)
    old_ids, by_id, groups = prev
    gone, came = old_ids - ids, ids - old_ids
    if len(gone) + len(came) > len(pending) // 4 + 64:
        return _regroup(memo, pending, ids)
    fresh: dict[str, list[Workload]] = {}
    for i in gone:                 # the old objects are still held here, so their ids are not reused
        w = by_id.pop(i)
        lst = fresh.get(w.queue)
        if lst is None:
            lst = fresh[w.queue] = list(groups[w.queue])
        k = bisect_left(lst, w.order_key, key=_ORDER)
        while lst[k] is not w:
            k += 1
        del lst[k]
    for w in compress(pending, map(came.__contains__, map(id, pending))):
        lst = fresh.get(w.queue)
        if lst is None:
            lst = fresh[w.queue] = list(groups.get(w.queue, ()))
        k = bisect_right(lst, w.order_key, key=_ORDER)
        if k and lst[k - 1].order_key == w.order_key:      # equal keys: keep by_queue's input order
            return _regroup(memo, pending, ids)
        lst.insert(k, w)
        by_id[id(w)] = w
    if fresh:
        out = dict(groups)
        for q, lst in fresh.items():
            if lst:
                out[q] = lst
            else:
                del out[q]
        if any(q not in groups for q in fresh):
            out = {q: out[q] for q in sorted(out)}
        groups = out
    memo[("grouped",)] = (ids, by_id, groups)
    return groups


def _regroup(memo: dict[object, object], pending: Sequence[Workload],
             ids: set[int]) -> dict[str, list[Workload]]:
    groups = by_queue(pending)
    if len(ids) == len(pending):
        memo[("grouped",)] = (ids, {id(w): w for w in pending}, groups)
    else:
        memo.pop(("grouped",), None)
    return groups
