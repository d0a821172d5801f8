"""The snapshot the live cycle decides on, kept from one cycle to the next (issue 18).

Between two cycles a few of the service's workloads change (a submit, a cancel, a finish, an
actuator's answer), while a snapshot built from every entry costs a pass over all of them: with
50,000 pending that pass was 30 ms of a 78 ms cycle, and the core then compared the 50,000 ids
with the last ones to find what changed in its grouping. :class:`KeptSnapshot` keeps what the last
snapshot held (the pending workloads and the running ones by id, the occupancy) and brings it up
to date from the entries the service names as changed since (every write to a live entry outside
the reasons a cycle hands back goes through ``SchedulerService._touch``). It hands the core a
:class:`~scheduler.snapshot.PendingChanges` from the pending the core was given last (so the
grouping reads only what changed, whoever else asked for a snapshot in between), updates the
occupancy with :func:`~scheduler.snapshot.occupancy_after` from what started and stopped, and hands
back the same pending and running tuples while nothing changed.

What it holds is what :func:`scratch` builds from all entries, the order of the workloads aside
(no decision depends on it: pending workloads are ordered by their keys, victims by theirs, and
ids are unique): :func:`difference` says where two snapshots differ, the service compares each
kept snapshot with one built from scratch when ``SchedulerService.check_snapshots`` is set (the
tests set it, ``tests/conftest.py``), and ``tests/test_scheduler_service_kept.py`` drives services
through random histories comparing every cycle with the service code before this.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence

from scheduler.model import Gpus, Running, Workload
from scheduler.service.views import ADMITTING, PENDING, PREEMPTING, Entry
from scheduler.snapshot import (Cluster, Occupancy, PendingChanges, Settings, Snapshot, occupancy_after, occupancy_of,
                                snapshot)


def fixed(w: Workload) -> Workload:
    """``w`` as the core must see it while an action is in flight for it: not a victim. For that
    cycle its GPUs also count as its queue's non-preemptible usage, which can only hold a
    non-preemptible admission of that queue back a cycle, never let one over its guarantee."""
    return w if not w.preemptible else dataclasses.replace(w, preemptible=False)


def now_of(e: Entry) -> float:
    return e.planned_s if e.planned_s is not None else e.workload.submit_s


def seen(e: Entry, idle: Collection[str]) -> Workload | Running | None:
    """What a cycle sees of ``e``: a workload it decides on (pending, no action in flight, not
    held), a running one (one with an action in flight cannot be a victim; an admission in flight
    runs on its placement), or nothing (a victim being preempted, a held or cancelled one)."""
    r = e.running
    if e.acting == ADMITTING and e.plan is not None:
        return Running(fixed(e.workload), e.plan, now_of(e))
    if r is not None and e.acting != PREEMPTING:
        w = fixed(r.workload) if (e.acting or e.cancelling) else r.workload
        return Running(w, r.placement, r.start_s, w.id in idle)
    if e.state == PENDING and not e.acting and not e.cancelling and not e.not_allowed and not e.policy:
        return e.workload
    return None


def scratch(cluster: Cluster, entries: Iterable[Entry], idle: Collection[str], foreign: Sequence[Running],
            settings: Settings, extra: Iterable[Workload] = ()) -> Snapshot:
    """The snapshot built from every entry (what the service did every cycle before it kept one)."""
    running: list[Running] = []
    pending: list[Workload] = []
    for e in entries:
        s = seen(e, idle)
        if isinstance(s, Running):
            running.append(s)
        elif s is not None:
            pending.append(s)
    running.extend(foreign)
    return snapshot(cluster, running, [*pending, *extra], settings)


class KeptSnapshot:
    """The last snapshot's parts, updated from the entries that changed (:meth:`snapshot`)."""

    __slots__ = ("base", "came", "cluster", "foreign", "gone", "occupancy", "pending", "pending_t", "running",
                 "running_t")

    def __init__(self) -> None:
        self.cluster: Cluster | None = None          # the cluster they are for (None: rebuild)
        self.pending: dict[str, Workload] = {}       # the workloads the cycle decides on, by id
        self.running: dict[str, Running] = {}        # the service's running ones as the cycle sees them
        self.foreign: tuple[Running, ...] = ()       # the observed work gpuq did not admit
        self.occupancy: Occupancy | None = None      # of running and foreign
        self.pending_t: tuple[Workload, ...] | None = None   # pending's values, until it changes
        self.running_t: tuple[Running, ...] | None = None    # running's and foreign's, until they change
        # the pending handed to the core last (``core``: what the cluster's memo grouped), and how the
        # pending now differs from it: its workloads gone since, those come since (by id(), kept
        # alive by base and pending); None: not known (built from every entry)
        self.base: tuple[Workload, ...] | None = None
        self.gone: dict[int, Workload] = {}
        self.came: dict[int, Workload] = {}

    def drop(self) -> None:
        """Forget it all: the next snapshot is built from every entry."""
        self.cluster, self.base, self.pending_t, self.running_t = None, None, None, None

    def snapshot(self, cluster: Cluster, entries: Mapping[str, Entry], changed: Iterable[str],
                 idle: Collection[str], foreign: tuple[Running, ...], settings: Settings,
                 extra: Sequence[Workload] = (), core: bool = False) -> Snapshot:
        """The snapshot of ``entries`` (with ``extra`` pending too), ``changed`` naming every id
        whose entry may look different to the cycle since the last call (a new, changed or closed
        entry, or its idle flag); built from every entry when the cluster is not the one kept.
        ``core``: it goes to ``schedule()`` on the cluster's memo (a cycle, a dry run), so the next
        snapshots' :class:`PendingChanges` are given from its pending; others (a forecast's, which
        runs on a memo of its own) leave that base as it is. The changes are right from their base
        whoever asks, so a snapshot taken for someone else in between costs the cycle nothing."""
        try:
            if self.cluster is not cluster or self.occupancy is None:
                self._rebuild(cluster, entries, idle, foreign)
            else:
                self._update(cluster, entries, changed, idle, foreign)
        except BaseException:
            self.drop()            # half brought up to date (an occupancy out of range): never reused
            raise
        assert self.occupancy is not None
        running = self.running_t
        if running is None:
            running = self.running_t = (*self.running.values(), *self.foreign)
        pending = self.pending_t
        if pending is None:
            pending = self.pending_t = tuple(self.pending.values())
        extra = tuple(extra)
        if extra:
            pending = (*pending, *extra)
        changes = None
        if self.base is not None:
            changes = PendingChanges(self.base, tuple(self.gone.values()), (*self.came.values(), *extra))
        if core:
            self.base, self.gone, self.came = pending, {id(w): w for w in extra}, {}
        return Snapshot(cluster, running, pending, self.occupancy, settings, changes)

    def _rebuild(self, cluster: Cluster, entries: Mapping[str, Entry], idle: Collection[str],
                 foreign: tuple[Running, ...]) -> None:
        self.drop()
        pending: dict[str, Workload] = {}
        running: dict[str, Running] = {}
        for wid, e in entries.items():
            s = seen(e, idle)
            if isinstance(s, Running):
                running[wid] = s
            elif s is not None:
                pending[wid] = s
        self.pending, self.running, self.foreign = pending, running, foreign
        self.occupancy = occupancy_of(cluster, (*running.values(), *foreign))
        self.cluster = cluster

    def _update(self, cluster: Cluster, entries: Mapping[str, Entry], changed: Iterable[str],
                idle: Collection[str], foreign: tuple[Running, ...]) -> None:
        pend, run, gone, came = self.pending, self.running, self.gone, self.came
        stopped: list[Running] = []
        started: list[Running] = []
        for wid in changed:
            e = entries.get(wid)
            s = seen(e, idle) if e is not None else None
            w = pend.get(wid)
            if w is not None and w is not s:
                del pend[wid]
                self.pending_t = None
                if came.pop(id(w), None) is None:
                    gone[id(w)] = w
            r = run.get(wid)
            if isinstance(s, Running):
                if r is not None and r == s:
                    continue                              # the same to the cycle: keep the object
                self.running_t = None
                if r is not None:
                    del run[wid]                          # (re-inserted below: it moves to the end)
                    if r.workload != s.workload or r.placement != s.placement:   # (not the idle flag alone)
                        stopped.append(r)
                        started.append(s)
                else:
                    started.append(s)
                run[wid] = s
                continue
            if r is not None:
                del run[wid]
                stopped.append(r)
                self.running_t = None
            if s is not None and w is not s:
                pend[wid] = s
                self.pending_t = None
                if gone.pop(id(s), None) is None:
                    came[id(s)] = s
        if foreign is not self.foreign:          # (equal: the running tuple stays, with its equal objects)
            if foreign != self.foreign:
                stopped.extend(self.foreign)
                started.extend(foreign)
                self.running_t = None
            self.foreign = foreign
        if stopped or started:
            assert self.occupancy is not None
            self.occupancy = occupancy_after(cluster, self.occupancy, stopped, started)


def difference(kept: Snapshot, fresh: Snapshot) -> str | None:
    """Where ``kept`` and ``fresh`` differ in what a cycle decides on, or None: the same cluster,
    settings, pending workloads (the same objects) and running ones (equal), the same free GPUs per
    node and usage per queue (a resource at 0 and an absent one are the same)."""
    if kept.cluster is not fresh.cluster:
        return "another cluster"
    if kept.settings != fresh.settings:
        return f"settings {kept.settings} != {fresh.settings}"
    a, b = {id(w): w for w in kept.pending}, {id(w): w for w in fresh.pending}
    if len(a) != len(kept.pending) or a.keys() != b.keys():
        gone = sorted(w.id for i, w in a.items() if i not in b)
        came = sorted(w.id for i, w in b.items() if i not in a)
        return f"pending: kept has {gone[:10]} that it should not, lacks {came[:10]} ({len(kept.pending)} vs " \
               f"{len(fresh.pending)})"
    ra, rb = Counter(kept.running), Counter(fresh.running)
    if ra != rb:
        return f"running: kept has {sorted(r.workload.id for r in (ra - rb))[:10]} that it should not, " \
               f"lacks {sorted(r.workload.id for r in (rb - ra))[:10]}"
    if kept.occupancy.node_free != fresh.occupancy.node_free:
        bad = [n.name for n, x, y in zip(kept.cluster.nodes, kept.occupancy.node_free, fresh.occupancy.node_free)
               if x != y]
        return f"free GPUs differ on nodes {bad[:10]}"

    if kept.occupancy.partial != fresh.occupancy.partial:
        return "the devices shares hold differ"

    def nonzero(u: Mapping[str, Mapping[str, Gpus]]) -> Iterator[tuple[str, str, Gpus]]:
        return ((q, k, v) for q, m in u.items() for k, v in m.items() if v)

    ua, ub = set(nonzero(kept.occupancy.usage)), set(nonzero(fresh.occupancy.usage))
    if ua != ub:
        return f"usage: kept {sorted(ua - ub)[:10]}, fresh {sorted(ub - ua)[:10]}"
    return None
