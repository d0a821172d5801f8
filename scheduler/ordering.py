"""Ordering: which queue is served next, and which of its workloads.

Queue key (lowest first): ``(fair_share, gpus_used, -queue.priority, path)``. ``fair_share`` is
YuniKorn's max over guaranteed resources of used / guaranteed (infinite for a queue that uses a
resource it has no guarantee of), so queues below their guarantee come first; among equal
shares the queue holding fewer GPUs, then the higher queue priority, then the path (stable).
Queues are leaves; the key is recomputed after every admission in the queue.

Workload key (first first): :attr:`scheduler.model.Workload.order_key`,
``(-priority, submit_s, id)``.

Fair share over time (issue 21; ``scheduler.usage_half_life_s`` > 0, off by default). The
snapshot then carries each leaf queue's decayed GPU-seconds (:attr:`scheduler.snapshot.Snapshot.usage`:
its GPU use with every instant weighted ``2 ** -(age / half_life_s)``, :mod:`accounting.decay`)
and the queue key is :func:`scored_key`, ``(owed, score, fair_share, gpus_used, -queue.priority,
path)``:

* ``owed`` is 0 while the queue holds less than a positive guarantee (``fair_share < 1`` and some
  guaranteed amount above 0), else 1: GPUs a queue is guaranteed go to it whatever it used
  before, so past usage never sends free GPUs to a queue above its guarantee while one below
  waits for them (it would take them back by preemption a delay later);
* ``score`` (:func:`accounting.decay.score`) is the decayed usage in GPU-hours divided by the
  queue's ``weight`` (a weight of 0: infinite for any use); among the queues owed GPUs, and among
  the rest, the one with less weighted recent use is served first;
* then today's key, unchanged.

As before, the key is recomputed after each admission in the queue; the score itself is the
snapshot's for the whole cycle. The same key decides who reclaims first: a preemptor's victim
search runs when its queue's walk reaches it (:mod:`scheduler.cycle`), so among queues below their
guarantee that wait for the preemption delay the one with the lower score searches first and
takes the victims it needs before the others look. Without ``Snapshot.usage`` nothing of this runs:
:func:`queue_key` alone, the same decisions as before.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping, Sequence
from itertools import compress
from operator import attrgetter

from accounting.decay import score
from scheduler.memo import CycleMemo, GroupedPending, QueueChanges
from scheduler.model import Gpus, Workload
from scheduler.quota import Ledger, share_of
from scheduler.snapshot import Cluster, PendingChanges

QueueKey = tuple[float, Gpus, int, str]
ScoredKey = tuple[int, float, float, Gpus, int, str]      # fair share over time (module docstring)

_ORDER = attrgetter("order_key")


def queue_key(cluster: Cluster, ledger: Ledger, queue: str) -> QueueKey:
    used = ledger.of(queue)
    priority = cluster.config.queues[queue].priority
    return (share_of(cluster.guarantee[queue], used), used.get("gpu", 0), -priority, queue)


def scored_key(cluster: Cluster, ledger: Ledger, queue: str, scores: Mapping[str, float]) -> ScoredKey:
    """The queue key with fair share over time (module docstring); ``scores``: queue ->
    :func:`accounting.decay.score` (a queue not named scores 0)."""
    used = ledger.of(queue)
    guarantee = cluster.guarantee[queue]
    share = share_of(guarantee, used)
    owed = 0 if share < 1.0 and any(g > 0 for g in guarantee.values()) else 1
    return (owed, scores.get(queue, 0.0), share, used.get("gpu", 0), -cluster.config.queues[queue].priority, queue)


def queue_scores(cluster: Cluster, usage: Mapping[str, float]) -> dict[str, float]:
    """Each queue's score from its decayed GPU-seconds (``usage``, as a snapshot carries it)."""
    queues = cluster.config.queues
    return {q: score(u, queues[q].weight) for q, u in usage.items() if q in queues}


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


def grouped(memo: CycleMemo, pending: Sequence[Workload],
            changes: PendingChanges | None = None) -> dict[str, list[Workload]]:
    """:func:`by_queue` of ``pending``, kept up to date in ``memo`` (the cluster's) from one call to
    the next: only the queues that gained or lost a workload are rebuilt, each as a new list (a
    list handed out is never changed afterwards, so a queue whose list is the same object has the
    same pending). With ``changes`` (:class:`scheduler.snapshot.PendingChanges`) whose base is the
    sequence grouped last, what changed is read from it, at a cost that follows the changes alone;
    otherwise it is found by comparing the ids of ``pending`` with the last ones (at C speed, but
    over every pending workload). The same result as :func:`by_queue` either way."""
    prev = memo.grouped
    if changes is not None and prev is not None and prev.pending is changes.base:
        if (len(changes.removed) + len(changes.added) > len(pending) // 4 + 64
                or len(changes.base) - len(changes.removed) + len(changes.added) != len(pending)):
            return _regroup(memo, pending, None)
        out = _apply(prev.groups, changes.removed, changes.added, memo)
        if out is None:
            return _regroup(memo, pending, None)
        memo.grouped = GroupedPending(pending, None, None, out)
        return out
    ids = set(map(id, pending))
    if prev is None or prev.ids is None or prev.by_id is None or len(ids) != len(pending):
        return _regroup(memo, pending, ids)
    old_ids, by_id, groups = prev.ids, prev.by_id, prev.groups
    gone, came = old_ids - ids, ids - old_ids
    if len(gone) + len(came) > len(pending) // 4 + 64:
        return _regroup(memo, pending, ids)
    added = list(compress(pending, map(came.__contains__, map(id, pending))))
    removed = [by_id.pop(i) for i in gone]
    for w in added:
        by_id[id(w)] = w
    out = _apply(groups, removed, added, memo)
    if out is None:
        return _regroup(memo, pending, ids)
    memo.grouped = GroupedPending(pending, ids, by_id, out)
    return out


def _apply(groups: dict[str, list[Workload]], removed: Iterable[Workload],
           added: Iterable[Workload], memo: CycleMemo) -> dict[str, list[Workload]] | None:
    """``groups`` less ``removed`` plus ``added``, as new lists for the queues that changed (the
    others are the same objects), noting in ``memo.grouped_changes`` per queue whose list it
    rebuilt its list before, the workloads that left and those that joined; ``None`` when two
    workloads have equal keys (only :func:`by_queue` knows their input order)."""
    fresh: dict[str, list[Workload]] = {}
    changed: QueueChanges = {}
    for w in removed:
        lst = fresh.get(w.queue)
        if lst is None:
            if w.queue not in groups:
                return None
            lst = fresh[w.queue] = list(groups[w.queue])
            changed[w.queue] = (groups[w.queue], [], [])
        changed[w.queue][1].append(w)
        k, n = bisect_left(lst, w.order_key, key=_ORDER), len(lst)
        while k < n and lst[k] is not w:
            k += 1
        if k == n:                 # not there: the caller's changes are wrong; regroup
            return None
        del lst[k]
    for w in added:
        lst = fresh.get(w.queue)
        if lst is None:
            lst = fresh[w.queue] = list(groups.get(w.queue, ()))
            changed[w.queue] = (groups.get(w.queue, []), [], [])
        changed[w.queue][2].append(w)
        k = bisect_right(lst, w.order_key, key=_ORDER)
        if k and lst[k - 1].order_key == w.order_key:      # equal keys: keep by_queue's input order
            return None
        lst.insert(k, w)
    memo.grouped_changes = changed
    if not fresh:
        return groups
    out = dict(groups)
    for q, lst in fresh.items():
        if lst:
            out[q] = lst
        else:
            del out[q]
    if any(q not in groups for q in fresh):
        out = {q: out[q] for q in sorted(out)}
    return out


def _regroup(memo: CycleMemo, pending: Sequence[Workload],
             ids: set[int] | None) -> dict[str, list[Workload]]:
    groups = by_queue(pending)
    memo.grouped_changes = {}                 # every list new: nothing to update from
    if ids is None:
        ids = set(map(id, pending))
    if len(ids) == len(pending):
        memo.grouped = GroupedPending(pending, ids, {id(w): w for w in pending}, groups)
    else:                                     # the same object twice: ids cannot follow it
        memo.grouped = None
    return groups
