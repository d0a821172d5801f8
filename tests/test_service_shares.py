"""Shares of one GPU in the live service and its API (issue 19): ``gpus_per_pod: 0.5`` accepted on
submit and dry-run, placed on devices by the core, shown as decimals, billed in milli-GPUs, kept in
``scheduler_events`` (placement_milli, shares) and rebuilt by a restart onto the same device slots;
an older store's rows read the same after the migration."""
from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

import pytest

from accounting.queues import parse_queue_config
from scheduler import events as ev
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.api import create_app
from scheduler.model import Workload
from scheduler.service import SchedulerService
from scheduler.service.views import as_dict
from scheduler.snapshot import Settings
from scheduler.testing import nodes
from tests.conftest import store_before

QUEUES = {"a": {"guaranteed": {"gpu": 2}, "max": {"gpu": 4}}, "b": {"guaranteed": {"gpu": 2}, "max": {"gpu": 4}}}
T0 = float(int(time.time()) // 3600 * 3600)     # stored rows need recent times: the TTL drops old ones


def make(sink: Any = None) -> SchedulerService:
    return SchedulerService(parse_queue_config({"queues": QUEUES}), DryRunActuator(),
                            nodes=nodes(("a10", "A10", 2, 2)), settings=Settings(True, 30.0), sink=sink,
                            cluster="c1", sleep=lambda s: None)


def share(wid: str, queue: str, k: str, pods: int = 1, now: float = T0) -> Workload:
    return Workload(wid, queue, pods=pods, gpus_per_pod=Decimal(k), submit_s=now)


def history(svc: SchedulerService) -> None:
    svc.submit(share("s1", "a", "0.5"), Target(), T0)
    svc.submit(share("s2", "a", "0.25", pods=3), Target(), T0)
    svc.submit(Workload("w1", "b", gpus_per_pod=2, submit_s=T0), Target(), T0)
    svc.cycle(T0 + 1)
    svc.submit(share("s3", "b", "0.5", pods=2, now=T0 + 2), Target(), T0 + 2)
    svc.cycle(T0 + 3)


def test_the_service_places_shows_and_bills_shares() -> None:
    from tests.test_scheduler_service import Sink

    sink = Sink()
    svc = make(sink)
    history(svc)
    views = {w.id: as_dict(w) for w in svc.workloads()}
    assert views["s1"]["placement"] == {"a10-0": 0.5} and views["s1"]["gpus_per_pod"] == 0.5
    assert views["s2"]["placement"] == {"a10-0": 0.75} and views["s2"]["gpus"] == 0.75
    assert views["w1"]["placement"] == {"a10-1": 2}
    assert views["s3"]["state"] == "pending"             # 0.75 free on one device: one pod of 0.5, not two
    used = {n.name: (n.used, n.free) for n in svc.nodes()}
    assert used == {"a10-0": (1.25, 0.75), "a10-1": (2, 0)}
    # the ledger bills each admission its share, in milli-GPUs: 500 + 750 + 2000
    from gpuq.store.schema import COLUMNS
    col = COLUMNS["gpu_allocations"].index("gpus")
    assert sorted(float(r[col]) for r in sink.ledger) == [0.5, 0.75, 2.0]
    # the events table keeps shares exactly and their device slots
    admits = [r for r in sink.rows if r[4] == "admit"]
    rows = {r[5]: dict(zip(ev.COLUMNS, r)) for r in admits}
    assert rows["s2"]["placement"] == {} and rows["s2"]["placement_milli"] == {"a10-0": 750}
    assert rows["w1"]["placement"] == {"a10-1": 2} and rows["w1"]["placement_milli"] == {"a10-1": 2000}
    assert rows["s2"]["shares"] == '[["a10-0",0,0.5],["a10-0",1,0.25]]' and rows["w1"]["shares"] == ""


def test_a_restart_gives_each_share_back_its_device(store: Any, tmp_path: Any) -> None:
    from gpuq.store.writer import BatchWriter

    writer = BatchWriter(store, tmp_path / "spill")
    first = make(writer)
    history(first)
    writer.flush()
    stored = ev.read_events(store, "c1")
    s2 = next(e.event for e in stored if e.event["workload"] == "s2" and e.event["event"] == "admit")
    assert s2["placement"] == {"a10-0": 0.75} and s2["shares"] == [["a10-0", 0, 0.5], ["a10-0", 1, 0.25]]
    second = make(writer)
    assert second.restore(stored) == len(stored)
    strip = ("reason_code", "message", "actuator_message", "eta")

    def view(s: SchedulerService) -> list[dict[str, Any]]:
        return [{k: v for k, v in as_dict(w).items() if k not in strip} for w in s.workloads()]

    assert view(second) == view(first)
    # the same devices are partly held: the next cycles decide alike, and s3 fits once s2 ends
    first.finish("s2", T0 + 10)
    second.finish("s2", T0 + 10)
    d1, d2 = first.cycle(T0 + 11), second.cycle(T0 + 11)
    assert [a.placement for a in d1.admissions] == [a.placement for a in d2.admissions]
    assert [a.workload.id for a in d2.admissions] == ["s3"]
    # one pod on s1's device (0.5 free: the partly used first), one on the device s2 gave back
    assert d2.admissions[0].placement.shares == (("a10-0", 0, Decimal("0.5")), ("a10-0", 1, Decimal("0.5")))


def test_rows_written_before_read_the_same_after_the_migration(store_dsn: str) -> None:
    """0009 derives placement_milli from placement for the rows already there."""
    import datetime as dt

    with store_before(store_dsn, 9) as old:
        old.insert(ev.TABLE, [(dt.datetime.fromtimestamp(T0, dt.UTC), "c1", 5.0, 1, "admit", "w", "a", "H100",
                               {"h-0": 8, "h-1": 4}, "", "", "")], ev.COLUMNS[:12])
        from gpuq.store import migrate
        migrate(old)
        got = ev.read_events(old, "c1")
    assert [e.event for e in got] == [{"t": 5.0, "event": "admit", "workload": "w", "queue": "a",
                                       "gpu_type": "H100", "placement": {"h-0": 8, "h-1": 4}}]


@pytest.mark.parametrize(("value", "ok"), [(0.5, True), (0.125, True), (2, True), (2.0, True),
                                          (0.0005, False), (1.5, False), (0, False), (-0.5, False)])
def test_the_api_takes_whole_gpus_or_a_share(value: float, ok: bool) -> None:
    from gpuq.settings import load_settings
    from tests.test_api import Api

    api = Api(create_app(make(), None, load_settings(None), clock=lambda: T0))
    r = api("POST", "/workloads", json={"id": "x", "queue": "a", "gpus_per_pod": value})
    assert (r.status_code == 201) is ok, r.text
    if not ok:
        assert r.status_code == 422 and "gpus_per_pod" in r.text
        return
    assert r.json()["gpus_per_pod"] == value
    dry = api("POST", "/dry-run", json={"queue": "b", "gpus_per_pod": 0.25, "pods": 2})
    assert dry.status_code == 200, dry.text
    assert dry.json()["outcome"] == "admit" and sum(dry.json()["placement"].values()) == 0.5


def test_every_view_of_the_service_answers_with_shares_running() -> None:
    """A share running and shares pending: the service's routes answer (nothing there chokes on an
    exact decimal), with fractions as fractions."""
    from gpuq.settings import load_settings
    from tests.test_api import Api

    svc = make()
    api = Api(create_app(svc, None, load_settings(None), clock=lambda: T0 + 5))
    history(svc)
    svc.submit(share("s4", "a", "0.75"), Target(), T0 + 4)
    svc.cycle(T0 + 5)
    for path in ("/workloads", "/workloads/s2", "/nodes", "/preemptions", "/scheduler/status", "/metrics",
                 "/forecasts/accuracy", "/healthz"):
        r = api("GET", path)
        assert r.status_code == 200, (path, r.text)
    nodes = {n["name"]: n for n in api("GET", "/nodes").json()}
    assert nodes["a10-0"]["used"] + nodes["a10-1"]["used"] == 0.5 + 0.75 + 2 + 0.75
    assert "gpuq_" in api("GET", "/metrics").text
    dry = api("POST", "/dry-run", json={"queue": "b", "gpus_per_pod": 0.5}).json()
    assert dry["outcome"] in ("admit", "pending", "preempt") and "24.00" not in str(dry)
