"""Tenants (issue 21): viewer tokens scoped to queues read only their queues' rows (``/queues``,
``/workloads``, ``/accounting/usage``) and are refused every other read; the tenant page of a
queue (``GET /queues/{queue}/tenant``: guarantee, decayed usage and score, forecasts, preemptions);
and the live decayed usage read from the hourly rollups in the store."""
from __future__ import annotations

import time
from typing import Any

import pytest

from accounting.decay import HOUR, decayed_hours, score
from accounting.model import NodeCapacity
from accounting.queues import parse_queue_config
from accounting.rollup import COLUMNS, _utc
from gpuq.errors import ConfigError
from gpuq.settings import load_settings
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.api import create_app
from scheduler.api.auth import SCOPED_READS
from scheduler.model import Workload
from scheduler.service import SchedulerService
from scheduler.snapshot import Settings
from scheduler.testing import nodes
from tests.test_api_security import Api, problem

WEEK = 7 * 86400.0
QUEUES = {"a": {"guaranteed": {"gpu": 8}, "queues": {"x": {"guaranteed": {"gpu": 4}}, "y": {"weight": 2}}},
          "b": {"guaranteed": {"gpu": 8}}}
TOKENS = [{"token": "view-t", "role": "viewer", "name": "vera"},
          {"token": "team-x", "role": "viewer", "name": "xena", "queues": ["a.x"]},
          {"token": "team-a", "role": "viewer", "name": "anna", "queues": ["a"]},
          {"token": "team-xb", "role": "viewer", "name": "both", "queues": ["a.x", "b"]}]


@pytest.fixture
def live(store: Any) -> tuple[Api, SchedulerService, Any]:
    from scheduler.service.accounting import LiveAccounting

    config = parse_queue_config({"queues": QUEUES})
    acc = LiveAccounting(store, config=config, declared=[NodeCapacity("c", "h-0", "H100", 8000)])
    svc = SchedulerService(config, DryRunActuator(), nodes=nodes(("h", "H100", 8, 1)),
                           settings=Settings(True, 30.0, usage_half_life_s=WEEK))
    now = time.time()
    for wid, q, g in (("x-run", "a.x", 4), ("b-run", "b", 4), ("x-wait", "a.x", 8), ("y-wait", "a.y", 2),
                      ("b-wait", "b", 8)):
        svc.submit(Workload(wid, q, gpus_per_pod=g, submit_s=now), Target(), now)
        svc.cycle(now)
    acc.follow(svc)
    acc.refresh(now)
    return Api(create_app(svc, acc, load_settings(None, api={"tokens": TOKENS}), clock=time.time)), svc, acc


def ids(r: Any) -> set[str]:
    assert r.status_code == 200, r.text
    return {w["id"] for w in r.json()}


def test_a_tenant_token_reads_only_its_queues(live: tuple[Api, SchedulerService, Any]) -> None:
    api, _, acc = live
    everyone = {"x-run", "b-run", "x-wait", "y-wait", "b-wait"}
    assert ids(api("GET", "/workloads", "view-t")) == everyone
    assert ids(api("GET", "/workloads", "team-x")) == {"x-run", "x-wait"}
    assert ids(api("GET", "/workloads", "team-a")) == {"x-run", "x-wait", "y-wait"}
    assert ids(api("GET", "/workloads", "team-xb")) == {"x-run", "x-wait", "b-run", "b-wait"}
    assert ids(api("GET", "/workloads?state=pending&limit=1", "team-xb")) == {"x-wait"}
    assert ids(api("GET", "/workloads?queue=a.x", "team-a")) == {"x-run", "x-wait"}
    # another queue's workloads: refused by queue, and by id as if it did not exist
    assert "may not read" in problem(api("GET", "/workloads?queue=b", "team-x"), 403)["detail"]
    assert "may not read" in problem(api("GET", "/workloads?queue=a", "team-x"), 403)["detail"]
    unknown = problem(api("GET", "/workloads/nothing-here", "team-x"), 404)
    hidden = problem(api("GET", "/workloads/b-run", "team-x"), 404)
    assert hidden["detail"].replace("b-run", "?") == unknown["detail"].replace("nothing-here", "?")
    assert api("GET", "/workloads/x-run", "team-x").json()["queue"] == "a.x"
    # the now view: its queues' rows only, paged by queue
    rows = api("GET", "/queues", "team-a")
    assert {r["queue"] for r in rows.json()} == {"a", "a.x", "a.y"} and rows.headers["x-total-count"] == "3"
    assert {r["queue"] for r in api("GET", "/queues?limit=1&offset=1", "team-a").json()} == {"a.x"}
    assert {r["queue"] for r in api("GET", "/queues", "view-t").json()} >= {"root", "a", "a.x", "a.y", "b"}
    # usage by queue, its queues' rows; any other grouping would sum over others' queues
    got = api("GET", "/accounting/usage?by=queue&rollup=true", "team-x")
    assert got.status_code == 200 and {r["queue"] for r in got.json()} <= {"a.x"}
    assert "by queue" in problem(api("GET", "/accounting/usage?by=gpu_type", "team-x"), 403)["detail"]
    # every other read is refused, naming what the token may read
    for url in ("/nodes", "/preemptions", "/books", "/forecasts/accuracy", "/accounting/series",
                "/accounting/capacity", "/accounting/idle", "/scheduler/events", "/collector/health"):
        assert problem(api("GET", url, "team-x"), 403)["detail"] == SCOPED_READS, url
        assert api("GET", url, "view-t").status_code != 403, url
    # and it never acts
    assert problem(api("POST", "/workloads", "team-x", json={"id": "z", "queue": "a.x"}), 403)


def test_the_tenant_page(live: tuple[Api, SchedulerService, Any]) -> None:
    api, svc, _ = live
    page = api("GET", "/queues/a.x/tenant", "team-x").json()
    assert page["queue"] == "a.x" and page["guaranteed"] == {"gpu": 4} and page["weight"] == 1.0
    assert page["usage"] == {"half_life_s": WEEK}                       # not read from the accounting yet
    assert [p["id"] for p in page["pending"]] == ["x-wait"] and page["pending"][0]["position"] == 1
    assert "eta" in page["pending"][0] and page["running"] == {"workloads": 1, "gpus": 4}
    assert {r["gpu_type"] for r in page["now"]} >= {"*"}
    assert next(r for r in page["now"] if r["gpu_type"] == "*")["allocated"] == 4
    now = time.time()
    svc.set_usage({"a.x": 10 * HOUR, "a.y": 10 * HOUR, "b": 30 * HOUR}, now)
    usage = api("GET", "/queues/a.x/tenant", "team-x").json()["usage"]
    assert usage["decayed_gpu_hours"] == 10 and usage["score"] == score(10 * HOUR, 1.0) == 10
    # a.y's weight 2 halves its score: it is first, a.x second, b (30) last
    assert usage["rank"] == 2 and usage["queues_ranked"] == 3
    assert api("GET", "/queues/a.y/tenant", "team-a").json()["usage"]["rank"] == 1
    assert api("GET", "/queues/a/tenant", "team-a").json()["usage"]["decayed_gpu_hours"] == 20
    assert "may not read" in problem(api("GET", "/queues/b/tenant", "team-x"), 403)["detail"]
    assert "may not read" in problem(api("GET", "/queues/a/tenant", "team-x"), 403)["detail"]
    assert problem(api("GET", "/queues/nope/tenant", "view-t"), 404)
    # the snapshots the cycles decide on carry it
    assert svc._snapshot().usage == {"a.x": 10 * HOUR, "a.y": 10 * HOUR, "b": 30 * HOUR}


def test_usage_is_not_carried_while_the_half_life_is_0() -> None:
    svc = SchedulerService(parse_queue_config({"queues": QUEUES}), DryRunActuator(), nodes=nodes(("h", "H100", 8, 1)))
    svc.set_usage({"b": 1.0}, 0.0)
    assert svc.usage_now() is None and svc._snapshot().usage is None


def test_viewer_scopes_are_checked_at_load() -> None:
    load_settings(None, api={"tokens": [{"token": "t", "queues": ["a.x"]}]})
    with pytest.raises(ConfigError, match=r"api.tokens.0: .*viewer token takes queues .*not namespaces"):
        load_settings(None, api={"tokens": [{"token": "t", "namespaces": ["team-a"]}]})
    with pytest.raises(ConfigError, match=r"api.tokens.0: .*not empty"):
        load_settings(None, api={"tokens": [{"token": "t", "queues": []}]})


def test_live_decayed_usage_from_the_hourly_rollups(store: Any) -> None:
    from scheduler.service.accounting import LiveAccounting

    acc = LiveAccounting(store, config=parse_queue_config({"queues": QUEUES}))
    now = time.time()                       # the rows must be within the store's retention
    h0 = (now // HOUR) * HOUR
    stored = [(h0 - 5 * HOUR, "a.x", "ns", 3600.0 * 2), (h0 - 4 * HOUR, "a.x", "ns", 1800.0),
              (h0 - 30 * 24 * HOUR, "b", "ns", 3600.0 * 8), (h0 - 2 * HOUR, "b", "other", 7200.0),
              (h0 - 400 * 24 * HOUR, "b", "ns", 3600.0 * 8)]          # over 20 half-lives back: left out
    store.insert("accounting_usage_1h", [(_utc(h), "c", q, ns, "H100", "nvidia.com/gpu", g, 0.0, 5, 300, _utc(now))
                                         for h, q, ns, g in stored], COLUMNS)
    got = acc.decayed_usage(now, WEEK)
    want = decayed_hours([(h, q, g) for h, q, _, g in stored[:4]], now, WEEK)
    assert got.keys() == want.keys() == {"a.x", "b"}
    for q in want:
        assert got[q] == pytest.approx(want[q], rel=1e-9)
    assert acc.decayed_usage(now + 1, WEEK) is got            # kept for a minute



# -- fair share on and a preemption: the page agrees with /queues and /accounting/usage -------------

T0 = 1_764_000_000.0            # 2025-11-24T16:00:00Z: a fixed time (the long store keeps 100 years)
SHARED = {"a": {"guaranteed": {"gpu": 2}}, "b": {"guaranteed": {"gpu": 2}}}
LOST_EACH = 1 * (T0 + 131 - (T0 + 1))       # one GPU run from T0+1 to the preemption at T0+131


def test_the_tenant_page_under_fair_share_agrees_with_queues_and_usage(long_store: Any, store_dsn: str,
                                                                         tmp_path: Any) -> None:
    """``reclaim: fair_share`` on 8 GPUs, a and b guaranteed 2 each, weight 1: a runs eight 1-GPU
    workloads; b's 4-GPU gang (over its guarantee of 2, so ``guarantee`` would never preempt for
    it) is entitled to 4 (2 + half of the 4 beyond the guarantees) and takes 4 of a's, leaving a
    its own entitlement of 4. The tenant pages show the entitlement of /queues' ``*`` rows and the
    lost GPU-seconds that /accounting/usage sums from the stored preempt events."""
    import datetime as dt

    from gpuq.store.writer import BatchWriter
    from scheduler.service.accounting import LiveAccounting
    from tests.test_api import Clock

    config = parse_queue_config({"queues": SHARED})
    writer = BatchWriter(long_store, tmp_path / "spill")
    svc = SchedulerService(config, DryRunActuator(), nodes=nodes(("h", "H100", 8, 1)),
                           settings=Settings(True, 30.0, reclaim="fair_share"), sink=writer, cluster="c",
                           sleep=lambda _s: None)
    for i in range(8):
        svc.submit(Workload(f"a{i}", "a", submit_s=T0), Target(kind="None"), T0)
    svc.cycle(T0 + 1)
    svc.submit(Workload("b1", "b", gpus_per_pod=4, submit_s=T0 + 100), Target(kind="None"), T0 + 100)
    svc.cycle(T0 + 101)
    assert svc.explain("b1").state == "pending"                   # its preemption delay (30 s) first
    svc.cycle(T0 + 131)
    assert svc.explain("b1").state == "running"
    (rec,) = svc.preemptions()
    assert rec.queue == "b" and len(rec.victims) == 4 and rec.reason.startswith("reclaim entitlement")
    assert rec.lost_gpu_seconds == pytest.approx(4 * LOST_EACH)
    writer.flush()

    tokens = [*TOKENS, {"token": "team-b", "role": "viewer", "name": "bo", "queues": ["b"]}]
    settings = load_settings(None, store={"dsn": store_dsn, "retention": {"raw_days": 36_500, "rollup_days": 36_500,
                                                                          "events_days": 36_500}},
                             api={"tokens": tokens})
    acc = LiveAccounting(long_store, config=config, declared=[NodeCapacity("c", "h-0", "H100", 8000)])
    acc.follow(svc)
    acc.refresh(T0 + 140)
    api = Api(create_app(svc, acc, settings, clock=Clock(T0 + 140)))
    star = {r["queue"]: r for r in api("GET", "/queues", "view-t").json() if r["gpu_type"] == "*"}
    assert (star["a"]["allocated"], star["a"]["pending"], star["b"]["allocated"]) == (4, 4, 4)
    assert (star["a"]["entitlement"], star["b"]["entitlement"]) == (4, 4)   # 2 + 2 each; a wants 8, b 4

    def iso(t: float) -> str:
        return dt.datetime.fromtimestamp(t, dt.UTC).isoformat().replace("+00:00", "Z")

    usage = {r["queue"]: r for r in api("GET", f"/accounting/usage?from={iso(T0)}&to={iso(T0 + 3600)}&by=queue",
                                        "view-t").json()}
    assert usage["a"]["lost_gpu_seconds"] == pytest.approx(4 * LOST_EACH) and usage["b"]["lost_gpu_seconds"] == 0
    a_page = api("GET", "/queues/a/tenant", "team-a").json()
    b_page = api("GET", "/queues/b/tenant", "team-b").json()
    assert a_page["entitlement"] == star["a"]["entitlement"] and b_page["entitlement"] == star["b"]["entitlement"]
    assert a_page["guaranteed"] == {"gpu": 2}
    assert a_page["preemptions"]["suffered"] == 1 and a_page["preemptions"]["made"] == 0
    assert a_page["preemptions"]["lost_gpu_seconds"] == pytest.approx(usage["a"]["lost_gpu_seconds"], abs=1e-3)
    assert b_page["preemptions"] == {"suffered": 0, "made": 1, "recent": []}    # b lost nothing
    assert len(a_page["pending"]) == 4 and a_page["running"] == {"workloads": 4, "gpus": 4}
