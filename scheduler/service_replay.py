"""Rebuild the live scheduler's state from its ``scheduler_events`` after a restart.

Events are replayed in the order they took effect ``(t, seq)``: ``submit`` (its ``spec`` holds the
workload and its target) makes a workload pending, ``admit`` running on the recorded placement,
``preempt`` pending again (what it ran is kept when it checkpoints, as in the simulator),
``finish``/``cancel``/``reject`` close it. The actuator is not called: the world already did what
the events say. Preemption history is rebuilt from the ``preempt`` events (one record per
preemptor and instant). Events of a workload whose ``submit`` is no longer stored (TTL) are
skipped. Reasons start as ``queued`` until the first cycle.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from scheduler.events import StoredEvent, parse_spec
from scheduler.model import Placement
from scheduler.service_views import CANCELLED, PENDING, QUEUED, REJECTED, Entry, PreemptionRecord, Reason

if TYPE_CHECKING:
    from scheduler.service import SchedulerService

log = logging.getLogger(__name__)


def restore(svc: SchedulerService, stored: Iterable[StoredEvent]) -> int:
    """Call with the service's lock held (``SchedulerService.restore`` does)."""
    n = skipped = 0
    group: list[tuple[Entry, float, str, str]] = []      # preempt events of one (t, preemptor)

    def close_group() -> None:
        if group:
            _, t, by, reason = group[0]
            by_entry = svc._entries.get(by)
            queue = by_entry.workload.queue if by_entry else ""
            svc._history.append(PreemptionRecord(t, by, queue, tuple(e.workload.id for e, *_ in group),
                                                 tuple(e.workload.queue for e, *_ in group), reason))
            group.clear()

    for se in stored:
        e, kind = se.event, se.event["event"]
        wid, t = e["workload"], float(e["t"])
        svc._seq = max(svc._seq, se.seq)
        svc._last_t = max(svc._last_t, t)
        if kind != "preempt" or (group and (group[0][1], group[0][2]) != (t, e.get("by", ""))):
            close_group()
        if kind == "submit":
            if not se.spec:
                skipped += 1
                continue
            w, target = parse_spec(se.spec)
            svc._done.pop(wid, None)
            svc._entries[wid] = Entry(w, target, PENDING, w.duration_s,
                                      Reason(QUEUED, "restored after a restart; waiting for the next cycle"))
            n += 1
            continue
        entry = svc._entries.get(wid)
        if entry is None:
            skipped += 1
            continue
        if kind == "admit":
            placement = Placement(e["gpu_type"], tuple(e["placement"].items()))
            svc._start(entry, placement, t, "restored", record=False)
        elif kind == "preempt" and entry.running is not None:
            svc._preempt(entry, e.get("by", ""), e.get("reason", ""), t, record=False)
            group.append((entry, t, e.get("by", ""), e.get("reason", "")))
        elif kind == "finish":
            svc._finish(entry, t, record=False)
        elif kind in ("cancel", "reject"):
            svc._close(entry, CANCELLED if kind == "cancel" else REJECTED, t,
                       Reason(CANCELLED if kind == "cancel" else "never_fits", e.get("reason", "")))
        n += 1
    close_group()
    if skipped:
        log.warning("restore: %d events skipped (their workload's submit is no longer stored)", skipped)
    log.info("restored %d events: %d workloads pending or running", n, len(svc._entries))
    return n
