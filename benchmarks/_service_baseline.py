"""The live scheduler's cycle as it was before it kept its snapshot (issue 18), frozen.

:class:`RebuildingService` is today's :class:`~scheduler.service.core.SchedulerService` (its
mutations, its decisions' application, today's core) with the cycle of ``87fad02``: every cycle
it scans every entry for workloads whose time is up, builds the snapshot from every entry
(``_snapshot``, which dry runs use too), copies the entries, reads the reasons into one tuple and
compares every one of them with its entry's. ``benchmarks/bench_scheduler.py --service`` times it
against today's cycle in the same run, and ``tests/test_scheduler_service_kept.py`` drives both
through the same histories and asks for the same decisions and reasons every cycle.

Not maintained as the service moves on: it overrides only the cycle path, and calls ``schedule``
through :mod:`scheduler.service.core` (the benchmark times the core by replacing it there).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

import scheduler.service.core as service_core
from scheduler.actuators.base import may_act
from scheduler.model import Decisions, ReasonCode, Running, Workload
from scheduler.service.core import SchedulerService, _due
from scheduler.service.kept import fixed as _fixed
from scheduler.service.kept import now_of
from scheduler.service.views import ADMITTING, PENDING, PREEMPTING, Entry, Reason
from scheduler.snapshot import snapshot

log = logging.getLogger(__name__)
_CODES = {c: c.value for c in ReasonCode}


class RebuildingService(SchedulerService):
    def cycle(self, now: float, wait: bool = True) -> Decisions:
        with self._deciding:
            if not may_act(self._fence):                # lost the Lease: decide nothing, act on nothing
                if self._fenced_at is None:
                    self._fenced_at = now
                    log.error("fenced: this replica no longer holds the Lease: the scheduler stops deciding "
                              "and drops the %d actions not carried out yet", self._lanes.in_flight())
                return Decisions(now, (), (), ())
            t0 = time.perf_counter()
            with self._lock:
                # (today's bookkeeping for the kept snapshot, unused here: kept from growing)
                self._dirty.clear()
                self._retold.clear()
                self._ends.clear()
                for e in [e for e in self._entries.values() if _due(e, now)]:
                    self._finish(e, now)
                snap = self._snapshot()
                entries = dict(self._entries)
            decisions = service_core.schedule(snap, now)
            tuple(decisions.pending)        # the reasons are built on first read: here, not under the lock
            with self._lock:
                if self._cluster is snap.cluster:
                    jobs, held = self._plan(decisions, now, entries)
                    self._explain_all(decisions, held, entries)
                else:                                   # nodes, foreign work or queues changed
                    jobs = []
                self.stats.observe_cycle(time.perf_counter() - t0, now)
        started = [self._lanes.submit(keys, fn) for keys, fn in jobs]
        if wait:
            for job in started:
                job.done.wait()
        return decisions

    def _snapshot(self, extra: Iterable[Workload] = (), core: bool = False) -> Any:
        """The world as decided: running workloads (those with an action in flight cannot be
        victims), admissions in flight on their placement, victims being preempted gone.
        (``core``: today's signature; unused.)"""
        cluster = self._cluster_now()
        running: list[Running] = []
        pending: list[Workload] = []
        for e in self._entries.values():
            r = e.running
            if e.acting == ADMITTING and e.plan is not None:
                running.append(Running(_fixed(e.workload), e.plan, now_of(e)))
            elif r is not None and e.acting != PREEMPTING:
                w = _fixed(r.workload) if (e.acting or e.cancelling) else r.workload
                running.append(Running(w, r.placement, r.start_s, w.id in self._idle))
            elif e.state == PENDING and not e.acting and not e.cancelling and not e.not_allowed and not e.policy:
                pending.append(e.workload)
        running.extend(self._foreign.running)
        return snapshot(cluster, running, [*pending, *extra], self.settings)

    def _explain_all(self, d: Decisions, held: dict[str, Reason], entries: dict[str, Entry]) -> None:
        """Each waiting workload's reason from the cycle (a brake's hold first); a reason equal to
        the one it has is left as it is (10,000 of them a cycle)."""
        live = self._entries
        for p in d.pending:
            wid = p.workload
            e = live.get(wid)
            if e is None or e is not entries.get(wid) or e.state != PENDING or e.acting or e.cancelling \
                    or e.not_allowed or wid in held:
                continue
            r, code = e.reason, _CODES[p.code]
            if r is None or r.code != code or r.message != p.message:
                e.reason = Reason(code, p.message)
        for wid, hold in held.items():
            e = live.get(wid)
            if e is not None and e.state == PENDING and not e.acting and not e.cancelling:
                e.reason = hold
