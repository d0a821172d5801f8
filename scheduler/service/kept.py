"""The snapshot the live cycle decides on, kept from one cycle to the next (issue 18).

Between two cycles a few of the service's workloads change (a submit, a cancel, a finish, an
actuator's answer), while a snapshot built from every entry costs a pass over all of them: with
50,000 pending that pass was 30 ms of a 78 ms cycle, and the core then compared the 50,000 ids
with the last ones to find what changed in its grouping. :class:`KeptSnapshot` keeps what the last
snapshot held (the pending workloads and the running ones by id, the occupancy) and brings it up
to date from the entries the service names as changed since (every write to a live entry outside
the reasons a cycle hands back goes through ``SchedulerService._touch``). It hands the core a
:class:`~scheduler.snapshot.PendingChanges` (so the grouping reads only what changed), updates the
occupancy with :func:`~scheduler.snapshot.occupancy_after` from what started and stopped, and hands
back the same snapshot while nothing changed.

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

from scheduler.model import Running, Workload
from scheduler.service.views import ADMITTING, PENDING, PREEMPTING, Entry
from scheduler.snapshot import Cluster, Occupancy, PendingChanges, Settings, Snapshot, occupancy_after, snapshot


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

    __slots__ = ("cluster", "extra", "foreign", "occupancy", "passed", "pending", "running", "steady")

    def __init__(self) -> None:
        self.cluster: Cluster | None = None          # the cluster they are for (None: rebuild)
        self.pending: dict[str, Workload] = {}       # the workloads the cycle decides on, by id
        self.running: dict[str, Running] = {}        # the service's running ones as the cycle sees them
        self.foreign: tuple[Running, ...] = ()       # the observed work gpuq did not admit
        self.occupancy: Occupancy | None = None      # of running and foreign
        # the last snapshot handed out without extra workloads, while nothing changed since (its
        # changes say "none": the core's grouping takes the same groups back)
        self.steady: Snapshot | None = None
        self.passed: tuple[Workload, ...] | None = None   # the pending of the last snapshot handed out
        self.extra: tuple[Workload, ...] = ()        # the extra workloads in it (a dry run's)

    def drop(self) -> None:
        """Forget it all: the next snapshot is built from every entry."""
        self.cluster, self.steady, self.passed = None, None, None

    def snapshot(self, cluster: Cluster, entries: Mapping[str, Entry], changed: Iterable[str],
                 idle: Collection[str], foreign: tuple[Running, ...], settings: Settings,
                 extra: Sequence[Workload] = ()) -> Snapshot:
        """The snapshot of ``entries`` (with ``extra`` pending too), ``changed`` naming every id
        whose entry may look different to the cycle since the last call (a new, changed or closed
        entry, or its idle flag); built from every entry when the cluster is not the one kept."""
        if self.cluster is not cluster or self.occupancy is None:
            return self._rebuild(cluster, entries, idle, foreign, settings, tuple(extra))
        try:
            return self._update(cluster, entries, changed, idle, foreign, settings, tuple(extra))
        except BaseException:
            self.drop()            # half brought up to date (an occupancy out of range): never reused
            raise

    def _rebuild(self, cluster: Cluster, entries: Mapping[str, Entry], idle: Collection[str],
                 foreign: tuple[Running, ...], settings: Settings, extra: tuple[Workload, ...]) -> Snapshot:
        self.drop()
        pending: dict[str, Workload] = {}
        running: dict[str, Running] = {}
        for wid, e in entries.items():
            s = seen(e, idle)
            if isinstance(s, Running):
                running[wid] = s
            elif s is not None:
                pending[wid] = s
        snap = snapshot(cluster, (*running.values(), *foreign), (*pending.values(), *extra), settings)
        self.pending, self.running, self.foreign, self.occupancy = pending, running, foreign, snap.occupancy
        self.cluster, self.passed, self.extra = cluster, snap.pending, extra
        return snap

    def _update(self, cluster: Cluster, entries: Mapping[str, Entry], changed: Iterable[str],
                idle: Collection[str], foreign: tuple[Running, ...], settings: Settings,
                extra: tuple[Workload, ...]) -> Snapshot:
        pend, run = self.pending, self.running
        removed: list[Workload] = []
        added: list[Workload] = []
        stopped: list[Running] = []
        started: list[Running] = []
        moved = False                     # the running tuple changes (an idle flag alone included)
        for wid in changed:
            e = entries.get(wid)
            s = seen(e, idle) if e is not None else None
            w = pend.get(wid)
            if w is not None and w is not s:
                del pend[wid]
                removed.append(w)
            r = run.get(wid)
            if isinstance(s, Running):
                if r is not None and r == s:
                    continue                              # the same to the cycle: keep the object
                moved = True
                if r is not None:
                    del run[wid]                          # (re-inserted below: it moves to the end)
                    if r.workload != s.workload or r.placement != s.placement:
                        stopped.append(r)
                        started.append(s)
                else:
                    started.append(s)
                run[wid] = s
                continue
            if r is not None:
                del run[wid]
                stopped.append(r)
                moved = True
            if s is not None and w is not s:
                pend[wid] = s
                added.append(s)
        if foreign is not self.foreign:          # (equal: the running tuple stays, with its equal objects)
            if foreign != self.foreign:
                stopped.extend(self.foreign)
                started.extend(foreign)
                moved = True
            self.foreign = foreign
        occupancy = self.occupancy
        assert occupancy is not None
        if stopped or started:
            occupancy = self.occupancy = occupancy_after(cluster, occupancy, stopped, started)
        steady = self.steady
        if steady is not None and not (moved or removed or added or extra or self.extra) \
                and steady.settings is settings:
            return steady
        running = steady.running if steady is not None and not moved else (*run.values(), *self.foreign)
        base = tuple(pend.values()) if removed or added or steady is None else steady.pending
        pending = (*base, *extra) if extra else base
        changes = None
        if self.passed is not None:
            changes = PendingChanges(self.passed, (*self.extra, *removed), (*added, *extra))
        snap = Snapshot(cluster, running, pending, occupancy, settings, changes)
        self.passed, self.extra = pending, extra
        # the next call, if nothing changes: this one again, with "no changes" since it
        self.steady = None if extra else Snapshot(cluster, running, pending, occupancy, settings,
                                                  PendingChanges(pending, (), ()))
        return snap


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

    def nonzero(u: Mapping[str, Mapping[str, int]]) -> Iterator[tuple[str, str, int]]:
        return ((q, k, v) for q, m in u.items() for k, v in m.items() if v)

    ua, ub = set(nonzero(kept.occupancy.usage)), set(nonzero(fresh.occupancy.usage))
    if ua != ub:
        return f"usage: kept {sorted(ua - ub)[:10]}, fresh {sorted(ub - ua)[:10]}"
    return None
