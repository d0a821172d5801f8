"""Issue 21: what preemptions cost, per queue over time, on a real chDB store. The live service
stores each preemption's lost GPU-seconds on its ``preempt`` event; ``gpuq usage``, the API's
``/accounting/usage`` (a field per queue, parents summed with ``rollup``) and the scheduler status
(``GET /scheduler/status``: the last day, in all and per queue, also after a restart) must agree
with a sum computed here from the stored events themselves. A reported checkpoint is kept in
``scheduler_state`` and a restarted service counts the next preemption from it."""
from __future__ import annotations

import datetime as dt
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.cli import usage_main
from accounting.queues import parse_queue_config
from gpuq.settings import load_settings
from gpuq.store.writer import BatchWriter
from scheduler import events as ev
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.api import create_app
from scheduler.cli import status_text
from scheduler.model import Workload
from scheduler.service import SchedulerService
from scheduler.service.accounting import LiveAccounting
from scheduler.service.replay import read_restart
from scheduler.snapshot import Settings
from scheduler.testing import nodes
from tests.conftest import LONG_RETENTION
from tests.test_api import TOKENS, Api, Clock

T0 = 1_764_000_000.0            # 2025-11-24T16:00:00Z: a fixed time (the store keeps 100 years)
QUEUES = {"lab": {"queues": {"a": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}}, "c": {"max": {"gpu": 16}}}},
          "b": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}}}
A2_LOST = 8 * (1340.0 - 700.0)      # a2 ran from T0+10, checkpointed at T0+700, preempted at T0+1340
C1_LOST = 8 * (3040.0 - 2000.0)     # c1 ran from T0+2000 without a checkpoint, preempted at T0+3040


def iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")


def service(sink: Any) -> SchedulerService:
    return SchedulerService(parse_queue_config({"queues": QUEUES}), DryRunActuator(), nodes=nodes(("h", "H100", 8, 2)),
                            settings=Settings(True, 30.0), sink=sink, cluster="c1", sleep=lambda _s: None)


def add(svc: SchedulerService, wid: str, queue: str, t: float) -> None:
    svc.submit(Workload(wid, queue, gpus_per_pod=8, submit_s=t), Target(kind="None"), t)


def two_preemptions(svc: SchedulerService) -> None:
    """a2 (lab.a, checkpointed) preempted by b1 at T0+1340; c1 (lab.c, none) by b2 at T0+3040."""
    add(svc, "a1", "lab.a", T0)
    svc.cycle(T0 + 1)
    add(svc, "a2", "lab.a", T0 + 5)
    svc.cycle(T0 + 10)
    assert svc.checkpoint("a2", T0 + 700, T0 + 1000).last_checkpoint_s == T0 + 700
    add(svc, "b1", "b", T0 + 1300)
    svc.cycle(T0 + 1340)
    assert svc.explain("a2").lost_gpu_seconds == A2_LOST
    svc.cancel("a2", T0 + 1341)
    svc.finish("b1", T0 + 2000)
    add(svc, "c1", "lab.c", T0 + 2000)
    svc.cycle(T0 + 2000)
    add(svc, "b2", "b", T0 + 3000)
    svc.cycle(T0 + 3040)
    assert svc.explain("c1").lost_gpu_seconds == C1_LOST


def from_events(store: Any, start: float, end: float, rollup: bool) -> dict[str, float]:
    """Lost GPU-seconds per queue, summed here from the stored preempt events (the restart's reader)."""
    out: dict[str, float] = {}
    for se in ev.read_events(store, "c1"):
        e = se.event
        if e["event"] == "preempt" and start <= e["t"] < end:
            parts = e["queue"].split(".")
            for q in (".".join(parts[:i]) for i in range(len(parts), 0, -1)) if rollup else (e["queue"],):
                out[q] = out.get(q, 0.0) + e["lost_gpu_seconds"]
    return out


@pytest.fixture
def world(long_store: Any, store_dsn: str, tmp_path: Path) -> tuple[Any, Any, BatchWriter]:
    f = tmp_path / "queues.yaml"
    f.write_text(yaml.safe_dump({"queues": QUEUES}))
    settings = load_settings(None, store={"dsn": store_dsn, "retention": LONG_RETENTION}, queues_file=str(f),
                             api={"tokens": TOKENS})
    return long_store, settings, BatchWriter(long_store, tmp_path / "spill")


@pytest.mark.parametrize(("start", "rollup"), [(T0, True), (T0 + 1500, False)])
def test_usage_api_and_status_agree_with_the_stored_events(world: tuple[Any, Any, BatchWriter],
                                                           start: float, rollup: bool) -> None:
    store, settings, writer = world
    svc = service(writer)
    two_preemptions(svc)
    writer.flush()
    now, end = T0 + 3100, T0 + 3600
    expected = from_events(store, start, end, rollup)
    assert expected == ({"lab.a": A2_LOST, "lab.c": C1_LOST, "lab": A2_LOST + C1_LOST} if rollup
                        else {"lab.c": C1_LOST})

    out, err = io.StringIO(), io.StringIO()
    argv = ["--format", "json", "--from", iso(start), "--to", iso(end), "--by", "queue", *(["--rollup"] * rollup)]
    assert usage_main(argv, settings, now_s=now, out=out, err=err) == 0, err.getvalue()
    cli = {r["queue"]: r["lost_gpu_hours"] for r in json.loads(out.getvalue())}
    assert {q: h for q, h in cli.items() if h} == {q: round(x / 3600, 6) for q, x in expected.items()}
    assert cli["b"] == 0.0                        # a queue that lost nothing shows 0, not nothing

    acc = LiveAccounting(store, queues_file=settings.queues_file)
    clock = Clock(now)
    api = Api(create_app(svc, acc, settings, clock=clock))
    q = f"/accounting/usage?from={iso(start)}&to={iso(end)}&by=queue&rollup={str(rollup).lower()}"
    rows = api("GET", q.replace("+", "%2B"), token="view-t").json()
    assert {r["queue"]: r["lost_gpu_seconds"] for r in rows if r["lost_gpu_seconds"]} == expected
    assert {r["queue"]: r["lost_gpu_hours"] for r in rows} == cli
    # grouped by something a preempt event does not carry: no such field
    typed = api("GET", f"/accounting/usage?from={iso(start)}&to={iso(end)}&by=queue,gpu_type", token="view-t").json()
    assert typed and all("lost_gpu_seconds" not in r for r in typed)

    # the status: the last day (both preemptions), live and after a restart (read from the store)
    day = from_events(store, now - 86400, now + 1, rollup=False)
    status = api("GET", "/scheduler/status", token="view-t").json()["preemption_cost"]
    assert status == {"window_s": 86400.0, "lost_gpu_seconds": sum(day.values()), "by_queue": day}
    again = service(None)
    again.restore(read_restart(store, "c1"))
    again.load_brakes(store, now)
    assert again.status(now)["preemption_cost"] == status
    assert "lost to preemption in the last 24 h: 3.733 GPU-h (lab.a 1.422, lab.c 2.311)" in status_text(
        again.status(now))
    # a day later, both have left the status's window (the usage over their window still counts them)
    assert again.preemption_cost(T0 + 1340 + 86400)["by_queue"] == {"lab.c": C1_LOST}
    assert again.preemption_cost(T0 + 3040 + 86400) == {"window_s": 86400.0, "lost_gpu_seconds": 0.0,
                                                         "by_queue": {}}


def test_a_reported_checkpoint_survives_a_restart(world: tuple[Any, Any, BatchWriter]) -> None:
    """Kept in scheduler_state (no scheduler_events row), the last one only; a restarted service
    counts the next preemption from it."""
    store, _settings, writer = world
    first = service(writer)
    add(first, "a1", "lab.a", T0)
    first.cycle(T0 + 1)
    add(first, "a2", "lab.a", T0 + 5)
    first.cycle(T0 + 10)
    for at, reported in ((T0 + 300, T0 + 310), (T0 + 700, T0 + 710), (T0 + 650, T0 + 720)):
        first.checkpoint("a2", at, reported)      # the last is older: kept as it was
    writer.flush()
    state = store.query(f"SELECT events FROM {store.database}.scheduler_state FINAL WHERE workload = 'a2'").rows
    marks = [e for _, e, _ in json.loads(state[0][0]) if e["event"] == "checkpoint"]
    assert marks == [{"t": T0 + 710, "event": "checkpoint", "workload": "a2", "queue": "lab.a", "at_s": T0 + 700}]
    assert [e.event["event"] for e in ev.read_events(store, "c1")].count("checkpoint") == 0

    second = service(writer)
    second.restore(read_restart(store, "c1"))
    assert second.explain("a2").last_checkpoint_s == T0 + 700
    add(second, "b1", "b", T0 + 1300)
    second.cycle(T0 + 1340)
    assert second.explain("a2").lost_gpu_seconds == A2_LOST
    # a later report after the restart still moves it, and is kept again
    second.checkpoint("a2", T0 + 1500, T0 + 1500)
    writer.flush()
    third = service(None)
    third.restore(read_restart(store, "c1"))
    assert third.explain("a2").last_checkpoint_s == T0 + 1500
    assert third.explain("a2").lost_gpu_seconds == A2_LOST       # the stored preempt's cost, read back
