"""Rebuild the live scheduler's state from its ``scheduler_events`` after a restart.

Events are replayed in the order they took effect ``(t, seq)``: ``submit`` (its ``spec`` holds the
workload and its target) makes a workload pending, ``admit`` running on the recorded placement,
``preempt`` pending again (what it ran is kept when it checkpoints, as in the simulator),
``finish``/``cancel``/``reject`` close it. The actuator is not called: the world already did what
the events say. Preemption history is rebuilt from the ``preempt`` events (one record per
preemptor and instant). Events of a workload whose ``submit`` is no longer stored are skipped.
Reasons start as ``queued`` until the first cycle.

A restart must not depend on rows a TTL can drop (``scheduler_events`` keeps
``store.retention.events_days``): :class:`Journal` keeps every open workload's events since its
submit in ``scheduler_state`` (no TTL; one row per workload, replaced at each of its events, a
tombstone when it ends), and :func:`read_restart` replays the union of both tables, so a workload
running longer than the events' retention is still known. The cluster's pause is kept there too
(workload ``""``, a tombstone at resume; :func:`read_pause`), so no retention lifts a pause. The restore writes the open
workloads' rows again (a store from before ``scheduler_state`` gets them at its first restart).
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from scheduler.events import StoredEvent, parse_spec, read_events
from scheduler.model import Placement
from scheduler.service_views import CANCELLED, PENDING, QUEUED, REJECTED, Entry, PreemptionRecord, Reason

if TYPE_CHECKING:
    from scheduler.service import SchedulerService

log = logging.getLogger(__name__)


STATE_TABLE = "scheduler_state"
CLOSING = ("finish", "cancel", "reject")
PAUSE_KEY = ""          # the cluster's pause in scheduler_state: workload ids are never empty


class Journal:
    """The open workloads' events, as ``scheduler_state`` rows (:data:`gpuq.store.schema.COLUMNS`)."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self._open: dict[str, list[list[Any]]] = {}     # workload -> [[seq, event, spec], ...]

    def record(self, event: Mapping[str, Any], seq: int, spec: str = "") -> list[tuple[Any, ...]]:
        """Note one event; return the row(s) to write (none for events of no open workload)."""
        wid, kind = str(event["workload"]), str(event["event"])
        if not wid:                                         # cluster-wide rows: the pause is kept, not reloads
            if kind not in ("pause", "resume"):
                return []
            ts = dt.datetime.fromtimestamp(max(0.0, float(event["t"])), dt.UTC)
            body = json.dumps([[int(seq), dict(event), ""]], separators=(",", ":"), sort_keys=True)
            return [(self.cluster, PAUSE_KEY, int(seq), int(kind == "resume"), ts, body)]
        if kind == "submit":
            self._open[wid] = [[int(seq), dict(event), spec]]
        elif kind in CLOSING:
            known = self._open.pop(wid, None) is not None
            return [self._row(wid, seq, event, deleted=True)] if known else []
        elif wid in self._open:
            self._open[wid].append([int(seq), dict(event), ""])
        else:
            return []
        return [self._row(wid, seq, event)]

    def write(self, sink: Any, event: Mapping[str, Any], seq: int, spec: str = "") -> None:
        rows = self.record(event, seq, spec)
        if sink is not None and rows:
            sink.write(STATE_TABLE, rows)

    def rows(self) -> list[tuple[Any, ...]]:
        """Every open workload's row as it stands (version: its last event's seq)."""
        return [self._row(wid, evs[-1][0], evs[-1][1]) for wid, evs in self._open.items()]

    def _row(self, wid: str, seq: int, event: Mapping[str, Any], deleted: bool = False) -> tuple[Any, ...]:
        ts = dt.datetime.fromtimestamp(max(0.0, float(event["t"])), dt.UTC)
        body = "" if deleted else json.dumps(self._open[wid], separators=(",", ":"), sort_keys=True)
        return (self.cluster, wid, int(seq), int(deleted), ts, body)


def read_state(store: Any, cluster: str) -> list[StoredEvent]:
    """The events ``scheduler_state`` holds for the cluster's open workloads."""
    sql = (f"SELECT events FROM {store.database}.{STATE_TABLE} FINAL "
           f"WHERE cluster = {{c:String}} AND deleted = 0")
    out = []
    for (text,) in store.query(sql, {"c": cluster}).rows:
        for seq, event, spec in json.loads(text):
            out.append(StoredEvent(int(seq), dict(event), str(spec)))
    return out


def read_pause(store: Any, cluster: str) -> dict[str, Any] | None:
    """The ``pause`` event in force (from ``scheduler_state``, never TTL'd), None when not paused."""
    sql = (f"SELECT events FROM {store.database}.{STATE_TABLE} FINAL "
           f"WHERE cluster = {{c:String}} AND workload = {{k:String}} AND deleted = 0")
    rows = store.query(sql, {"c": cluster, "k": PAUSE_KEY}).rows
    if not rows:
        return None
    (_, event, _), = json.loads(rows[0][0])
    return dict(event) if event.get("event") == "pause" else None


def read_restart(store: Any, cluster: str) -> list[StoredEvent]:
    """What a restarted service replays: ``scheduler_events`` (TTL'd: history, closed workloads,
    preemption records) and ``scheduler_state`` (never TTL'd: every open workload from its submit),
    each event once, in the order they took effect ``(t, seq)``."""
    events = read_events(store, cluster)
    seen = {e.seq for e in events}
    for e in read_state(store, cluster):
        if not e.event.get("workload"):
            continue                                        # the pause row: read_pause
        if e.seq not in seen:
            seen.add(e.seq)
            events.append(e)
    events.sort(key=lambda e: (float(e.event["t"]), e.seq))
    return events


def restore(svc: SchedulerService, stored: Iterable[StoredEvent]) -> int:
    """Call with the service's lock held (``SchedulerService.restore`` does)."""
    n = skipped = 0
    journal = Journal(svc.cluster_name)
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
        if not wid:
            continue                                        # cluster-wide rows (pause, resume)
        if kind == "submit":
            if not se.spec:
                skipped += 1
                continue
            w, target = parse_spec(se.spec)
            journal.record(e, se.seq, se.spec)
            svc._done.pop(wid, None)
            svc._entries[wid] = Entry(w, target, PENDING, w.duration_s,
                                      Reason(QUEUED, "restored after a restart; waiting for the next cycle"))
            n += 1
            continue
        entry = svc._entries.get(wid)
        if entry is None:
            skipped += 1
            continue
        journal.record(e, se.seq)
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
    svc._journal = journal
    if svc._sink is not None and journal.rows():           # a store from before scheduler_state
        svc._sink.write(STATE_TABLE, journal.rows())
    if skipped:
        log.warning("restore: %d events skipped (their workload's submit is no longer stored)", skipped)
    log.info("restored %d events: %d workloads pending or running", n, len(svc._entries))
    return n
