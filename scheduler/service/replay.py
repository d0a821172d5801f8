"""The scheduler's restart state: what ``gpuq serve`` reads at start to rebuild the live
scheduler (:meth:`scheduler.service.core.SchedulerService.restore` replays it by these rules).

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
(workload ``""``, a tombstone at resume; :func:`read_pause`), so no retention lifts a pause. The
restore writes the open workloads' rows again (a store from before ``scheduler_state`` gets them at its first restart).

A checkpoint its submitter reported (issue 21: ``POST /workloads/{id}/checkpoint`` or the
``gpuq.io/last-checkpoint`` annotation) is kept in the same row as a ``checkpoint`` event
(``at_s``: when the checkpoint was taken; ``t``: when it was reported), the last one only: it
matters only while the workload is open (a preemption's cost, stored on its ``preempt`` event,
counts from it), so it is not an audit-trail row in ``scheduler_events`` and needs no table of
its own. Replayed, it gives the workload its ``last_checkpoint_s`` again.
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from scheduler.events import StoredEvent, read_events




STATE_TABLE = "scheduler_state"
CLOSING = ("finish", "cancel", "reject")
PAUSE_KEY = ""          # the cluster's pause in scheduler_state: workload ids are never empty
CHECKPOINT = "checkpoint"   # a reported checkpoint: scheduler_state only (the module docstring)


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
        elif kind == CHECKPOINT and wid in self._open:      # the last one only
            kept = [x for x in self._open[wid] if x[1].get("event") != CHECKPOINT]
            self._open[wid] = [*kept, [int(seq), dict(event), ""]]
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
