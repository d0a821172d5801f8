"""Answers that no longer grow with the queue file (issue 17): ``GET /queues`` pages by queue
(``limit``, ``offset``, ``X-Total-Count``), and an unknown queue named anywhere (API submit and
dry run, the accounting's ``queue`` parameter, the queue file's mapping, a scenario, the traces
CLI) gets at most ten near matches, not every leaf. The sizes at 10,000 queues are
``benchmarks/bench_api_sizes.py`` (docs/SECURITY.md)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.errors import QueueConfigError
from accounting.model import NodeCapacity
from accounting.queue_names import NEAR, near
from accounting.queues import MAX_QUEUES, parse_queue_config
from gpuq.settings import load_settings
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.api import create_app
from scheduler.errors import ScenarioError, SchedulerError
from scheduler.model import Workload
from scheduler.service import SchedulerService
from tests.test_api_security import Api, problem

TOKENS = [{"token": "view-t", "role": "viewer", "name": "vera"},
          {"token": "op-t", "role": "operator", "name": "otto", "namespaces": ["*"], "queues": ["*"]}]


def tree(parents: int, leaves: int, types: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"gpu_types": {t: {} for t in types} or None,
            "queues": {f"org{p:02d}": {"queues": {f"team{t:03d}": {} for t in range(leaves)}} for p in range(parents)}}


# -- GET /queues pages -----------------------------------------------------------------------------------
@pytest.fixture
def paged(store: Any) -> tuple[Api, Any]:
    from scheduler.service.accounting import LiveAccounting

    config = parse_queue_config(tree(6, 4, ("H100", "A100")))          # 30 queues, rows of *, A100, H100
    nodes = [NodeCapacity("c", f"{t}-{i}", t, 8000) for t in ("H100", "A100") for i in range(2)]
    acc = LiveAccounting(store, config=config, declared=nodes)
    svc = SchedulerService(config, DryRunActuator())
    svc.submit(Workload("w", "org02.team001", gpus_per_pod=8), Target(), time.time())
    acc.pending = svc.pending_demand
    acc.refresh(time.time())
    return Api(create_app(svc, acc, load_settings(None, api={"tokens": TOKENS}), clock=time.time)), acc


def test_queues_pages_by_queue_and_says_the_total(paged: tuple[Api, Any]) -> None:
    api, acc = paged
    everything = acc.rows()
    queues = list(dict.fromkeys(r["queue"] for r in everything))
    assert queues[0] == "root" and len(queues) == 31 and len(everything) == 31 * 3
    r = api("GET", "/queues", "view-t")
    assert r.status_code == 200 and r.json() == everything and r.headers["x-total-count"] == "31"
    pages = []
    for offset in range(0, 31, 7):
        page = api("GET", f"/queues?limit=7&offset={offset}", "view-t")
        assert page.headers["x-total-count"] == "31"
        names = list(dict.fromkeys(row["queue"] for row in page.json()))
        assert names == queues[offset:offset + 7]                  # whole queues: all their rows together
        pages += page.json()
    assert pages == everything
    assert [row["gpu_type"] for row in pages if row["queue"] == "org02.team001"] == ["*", "A100", "H100"]
    assert next(row for row in pages if row["queue"] == "org02.team001" and row["gpu_type"] == "*")["pending"] == 8
    assert api("GET", "/queues?offset=31", "view-t").json() == []
    for bad in ("limit=0", "limit=10001", "offset=-1", "limit=x"):
        assert problem(api("GET", f"/queues?{bad}", "view-t"), 422)["errors"][0]["field"] == f"query.{bad.split('=')[0]}"
    doc = api("GET", "/openapi.json").json()["paths"]["/queues"]["get"]
    assert {p["name"] for p in doc["parameters"]} == {"limit", "offset"}
    assert "X-Total-Count" in doc["responses"]["200"]["headers"]


def test_the_accounting_queue_parameter_names_near_matches(paged: tuple[Api, Any]) -> None:
    api, _ = paged
    ok = api("GET", "/accounting/series?queue=org02.team001&from=-2h&step=1h", "view-t")
    assert ok.status_code == 200 and {p["queue"] for p in ok.json()} == {"org02.team001"}
    p = problem(api("GET", "/accounting/series?queue=org02.taem001&from=-2h&step=1h", "view-t"), 422)
    assert p["errors"][0]["field"] == "query.queue"
    assert "unknown queue 'org02.taem001'; near: org02.team001" in p["detail"] and "(30 queues in all)" in p["detail"]


# -- the unknown-queue error at 10,000 queues ---------------------------------------------------------------
@pytest.fixture(scope="module")
def big() -> Api:
    config = parse_queue_config(tree(100, 99))                # 100 + 9,900 = MAX_QUEUES exactly
    assert len(config.queues) - 1 == MAX_QUEUES
    svc = SchedulerService(config, DryRunActuator())
    return Api(create_app(svc, None, load_settings(None, api={"tokens": TOKENS}), clock=time.time))


def names_in(detail: str, after: str) -> list[str]:
    listed = detail.split(after, 1)[1].split(" (", 1)[0]
    return [n.strip() for n in listed.split(",")]


@pytest.mark.parametrize("path", ["/workloads", "/dry-run"])
def test_an_unknown_queue_gets_at_most_ten_near_matches(big: Api, path: str) -> None:
    t0 = time.perf_counter()
    p = problem(big("POST", path, "op-t", json={"id": "w", "queue": "org42.taem017"}), 422)
    took = time.perf_counter() - t0
    detail = p["detail"]
    assert p["errors"][0]["field"] == "body.queue"
    assert detail.startswith("body.queue: unknown queue 'org42.taem017'; near: org42.team017, ")
    found = names_in(detail, "near: ")
    assert 1 <= len(found) <= NEAR and "(9,900 leaf queues in all)" in detail
    assert len(detail) < 600, len(detail)                       # every leaf was about 150 KB
    assert took < 2.0, took
    far = problem(big("POST", path, "op-t", json={"id": "w", "queue": "x" * 200}), 422)["detail"]
    assert far.endswith("none of the 9,900 leaf queues is near it")
    parent = problem(big("POST", path, "op-t", json={"id": "w", "queue": "org07"}), 422)["detail"]
    assert "queue 'org07' is not a leaf (only leaf queues take workloads); leaves under it: org07.team000, " in parent
    assert len(names_in(parent, "leaves under it: ")) == NEAR and "(99 leaf queues in all)" in parent


def test_more_than_max_queues_are_refused_exactly_past_the_bound() -> None:
    with pytest.raises(QueueConfigError) as err:
        parse_queue_config({"queues": {**tree(100, 99)["queues"], "one-more": {}}})
    assert err.value.where == "queues.one-more" and "more than 10,000 queues" in str(err.value)


def test_near_is_difflib_nearest_first() -> None:
    names = ["research.vision", "research.nlp", "prod.serving", "prod.batch", "research.visions"]
    assert near("research.visoin", names)[:2] == ["research.vision", "research.visions"]
    assert near("zzz", names) == [] and near("", names) == []
    assert len(near("team", [f"team{i}" for i in range(500)])) == NEAR


# -- the same message elsewhere: the queue file, a scenario, the traces CLI ----------------------------------
def test_the_queue_file_scenarios_and_traces_name_near_matches_only(tmp_path: Path) -> None:
    data = tree(3, 5)                                            # 15 leaves: more than ten
    with pytest.raises(QueueConfigError) as err:
        parse_queue_config({**data, "mapping": {"default": "org01.tem002"}})
    assert str(err.value).startswith("mapping.default: unknown queue 'org01.tem002'; near: org01.team002")
    assert "(15 leaf queues in all)" in str(err.value)

    from scheduler.simulator.scenario import load_scenario

    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump({**data, "nodes": [{"name": "n", "gpu_type": "H100", "gpus": 8}],
                                        "workloads": [{"id": "x", "queue": "org1.team002", "duration": 10}]}))
    with pytest.raises(ScenarioError) as s_err:
        load_scenario(scenario)
    assert "unknown queue 'org1.team002'; near: org01.team002" in str(s_err.value)

    from scheduler.traces_queues import parse_assignment

    with pytest.raises(SchedulerError) as t_err:
        parse_assignment("qos:LS=org00.teem001", data)
    assert "'org00.teem001' is not a leaf queue of the queue file (near: org00.team001" in str(t_err.value)
    assert "org02.team004" not in str(t_err.value)
