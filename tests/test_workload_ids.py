"""A workload id belongs to the caller that submitted it (issue 17): a finished, cancelled or
rejected workload's id cannot be taken by another token (409 naming the id), while the same
caller may use it again; the owner comes back after a restart from the stored events (real chDB),
and one caller's flood of closed workloads cannot push another's ids out of the service's memory."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from accounting.queues import parse_queue_config
from gpuq.settings import load_settings
from gpuq.store.writer import BatchWriter
from scheduler.actuators.base import DryRunActuator
from scheduler.api import create_app
from scheduler.service import SchedulerService
from scheduler.service.core import caller_name
from scheduler.snapshot import Settings
from scheduler.testing import nodes
from tests.test_api_security import Api, problem

EVERYWHERE = {"namespaces": ["*"], "queues": ["*"]}
TOKENS = [{"token": "alice-t", "role": "operator", "name": "alice", **EVERYWHERE},
          {"token": "bob-t", "role": "operator", "name": "bob", **EVERYWHERE},
          {"token": "admin-t", "role": "admin", "name": "ada"}]


def service(sink: Any = None, **kw: Any) -> SchedulerService:
    return SchedulerService(parse_queue_config({"queues": {"a": {"guaranteed": {"gpu": 8}}}}), DryRunActuator(),
                            nodes=nodes(("h", "H100", 8, 1)), settings=Settings(True, 30.0), sink=sink,
                            cluster="ids", sleep=lambda s: None, **kw)


def api_of(svc: SchedulerService) -> Api:
    return Api(create_app(svc, None, load_settings(None, api={"tokens": TOKENS}), clock=time.time))


def job(wid: str, gpus: int = 4) -> dict[str, Any]:
    return {"id": wid, "queue": "a", "gpus_per_pod": gpus}


def closed_ids(svc: SchedulerService, api: Api) -> None:
    """alice's ``c`` cancelled, ``f`` finished, ``r`` rejected (never fits)."""
    for wid, gpus in (("c", 4), ("f", 4), ("r", 64)):
        assert api("POST", "/workloads", "alice-t", json=job(wid, gpus)).status_code == 201
    assert api("DELETE", "/workloads/c", "alice-t").json()["state"] == "cancelled"
    svc.cycle(time.time())
    assert svc.finish("f", time.time()).state == "finished"
    assert svc.state_of("r") == "rejected"


def taken(r: Any, wid: str) -> None:
    p = problem(r, 409)
    assert f"workload id '{wid}' belongs to another caller" in p["detail"], p


def test_a_closed_id_is_not_taken_by_another_caller_but_its_owner_may_use_it_again() -> None:
    svc = service()
    api = api_of(svc)
    closed_ids(svc, api)
    for wid in ("c", "f", "r"):
        taken(api("POST", "/workloads", "bob-t", json=job(wid)), wid)
        taken(api("POST", "/workloads", "admin-t", json=job(wid)), wid)     # an admin is another caller too
        assert svc.state_of(wid) in ("cancelled", "finished", "rejected")    # nothing changed
    for wid in ("c", "f", "r"):
        r = api("POST", "/workloads", "alice-t", json=job(wid))
        assert r.status_code == 201 and r.json()["state"] == "pending", r.text
    # a live workload's id stays a plain duplicate, whoever asks
    assert "already exists" in problem(api("POST", "/workloads", "alice-t", json=job("c")), 409)["detail"]
    assert "already exists" in problem(api("POST", "/workloads", "bob-t", json=job("c")), 409)["detail"]


def test_the_owner_is_known_after_a_restart(store: Any, tmp_path: Path) -> None:
    from scheduler.service.replay import read_restart

    writer = BatchWriter(store, tmp_path / "spill")
    first = service(sink=writer)
    closed_ids(first, api_of(first))
    writer.flush()

    second = service(sink=writer)
    second.restore(read_restart(store, "ids"))
    assert {w.id: w.state for w in second.workloads()} == {"c": "cancelled", "f": "finished", "r": "rejected"}
    api = api_of(second)
    for wid in ("c", "f", "r"):
        taken(api("POST", "/workloads", "bob-t", json=job(wid)), wid)
    assert api("POST", "/workloads", "alice-t", json=job("c")).status_code == 201


def test_a_flood_of_closed_workloads_does_not_push_another_callers_ids_out() -> None:
    svc = service(keep_finished=5)
    api = api_of(svc)
    assert api("POST", "/workloads", "alice-t", json=job("mine")).status_code == 201
    assert api("DELETE", "/workloads/mine", "alice-t").status_code == 200
    for i in range(20):                                       # bob's never fit: rejected at once
        assert api("POST", "/workloads", "bob-t", json=job(f"bob-{i}", 64)).json()["state"] == "rejected"
    assert len(svc.workloads()) == 5                           # memory stays bounded
    assert svc.state_of("mine") == "cancelled"                 # bob's oldest went, not alice's
    assert svc.state_of("bob-0") is None and svc.state_of("bob-19") == "rejected"
    taken(api("POST", "/workloads", "bob-t", json=job("mine")), "mine")


def test_the_caller_is_the_token_name_whatever_its_role() -> None:
    assert caller_name("alice (operator)") == caller_name("alice (admin)") == "alice"
    assert caller_name("team (a) (viewer)") == "team (a)"
    assert caller_name("") == "" and caller_name("plain") == "plain"
