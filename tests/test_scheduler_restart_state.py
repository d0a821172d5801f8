"""A restart never depends on rows a TTL can drop (issue 9, item 15), on real chDB.

``scheduler_events`` keeps ``store.retention.events_days``; a workload admitted longer ago than
that used to be forgotten at restart (its submit, which carries the spec, was gone). The open
workloads are also kept in ``scheduler_state`` (no TTL) and the restart replays both.
"""
from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuq.store.writer import BatchWriter
from scheduler import events as ev
from tests.test_scheduler_service import Target, add, make

DAY = 86_400.0


@pytest.fixture
def short_events(chdb_path: Path) -> Iterator[Any]:
    """A store whose scheduler events are kept one day (raw series and rollups as usual)."""
    from gpuq.store import Retention, open_store

    s = open_store(f"chdb://{chdb_path}?database=restart_state", retention=Retention(events_days=1))
    yield s
    s.command(f"DROP DATABASE IF EXISTS {s.database}")
    s.close()


def _events_left(store: Any) -> int:
    store.command(f"OPTIMIZE TABLE {store.database}.scheduler_events FINAL")      # TTL on merge
    return int(store.query(f"SELECT count() FROM {store.database}.scheduler_events").rows[0][0])


@pytest.mark.allow_expired_rows("scheduler_events")     # the point: its rows are past their TTL
def test_a_workload_older_than_the_events_retention_survives_a_restart(short_events: Any, tmp_path: Path) -> None:
    from scheduler.service.replay import read_restart

    store = short_events
    t0 = float(int(time.time()) - 5 * DAY)                  # five days ago: past the events' 1-day TTL
    writer = BatchWriter(store, tmp_path / "spill")
    first = make(sink=writer)
    add(first, "long", "a", now=t0, target=Target("RayJob", "ml", "long", entrypoint="python train.py"))
    add(first, "short", "a", now=t0 + 1)
    add(first, "waiting", "a", gpus=8, now=t0 + 2)
    first.cycle(t0 + 3)                                      # long and short run (2 nodes of 8), waiting waits
    first.finish("short", t0 + 60)                           # ended: only a tombstone is left of it
    writer.flush()
    assert _events_left(store) == 0                          # every scheduler_events row has expired

    second = make(sink=writer)
    second.restore(read_restart(store, "c1"))
    got = {w.id: (w.state, w.placement) for w in second.workloads()}
    assert got == {"long": ("running", first.explain("long").placement), "waiting": ("pending", None)}
    assert second.explain("long").target == {"kind": "RayJob", "namespace": "ml", "name": "long"}
    # the restored service goes on: the waiting workload takes the node "short" freed
    second.cycle(time.time())
    assert second.explain("waiting").state == "running"
    writer.flush()
    third = make()
    third.restore(read_restart(store, "c1"))
    assert {w.id: w.state for w in third.workloads()} == {"long": "running", "waiting": "running"}


def test_the_state_row_is_a_tombstone_once_the_workload_ends(store: Any, tmp_path: Path) -> None:
    from scheduler.service.replay import read_state

    writer = BatchWriter(store, tmp_path / "spill")
    svc = make(sink=writer)
    now = time.time()
    add(svc, "a1", "a", now=now)
    svc.cycle(now + 1)
    writer.flush()
    assert [e.event["event"] for e in read_state(store, "c1")] == ["submit", "admit"]
    svc.finish("a1", now + 2)
    writer.flush()
    assert read_state(store, "c1") == []
    rows = store.query(f"SELECT workload, deleted FROM {store.database}.scheduler_state FINAL").rows
    assert rows == []                                       # FINAL drops the tombstone with the row
    # the same restart as before from scheduler_events alone: nothing open, nothing invented
    again = make()
    again.restore(ev.read_events(store, "c1"))
    assert [(w.id, w.state) for w in again.workloads()] == [("a1", "finished")]
