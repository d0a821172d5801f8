"""The operator API with httpx against the ASGI app: roles enforced, problem JSON for every error
(422 naming the field, 401/403/404/409), the scheduler's endpoints, the accounting windows on a
real chDB store, the admin reload, probes, metrics and the OpenAPI document."""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from accounting.queues import parse_queue_config
from gpuq.settings import load_settings
from scheduler.actuators.base import DryRunActuator
from scheduler.api import create_app
from scheduler.service import SchedulerService
from scheduler.snapshot import Settings
from scheduler.testing import nodes

QUEUES = {"a": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}}, "b": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}}}
TOKENS = [{"token": "view-t", "role": "viewer", "name": "vera"},
          {"token": "op-t", "role": "operator", "name": "otto", "namespaces": ["*"], "queues": ["*"]},
          {"token": "admin-t", "role": "admin", "name": "ada"}]


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Api:
    """A synchronous face on httpx.AsyncClient + ASGITransport (no server, no thread)."""

    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, method: str, url: str, token: str | None = None, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                headers = {**kw.pop("headers", {}), **({"Authorization": f"Bearer {token}"} if token else {})}
                return await c.request(method, url, headers=headers, **kw)
        return asyncio.run(go())


def make_service(queues: dict[str, Any] = QUEUES) -> SchedulerService:
    return SchedulerService(parse_queue_config({"queues": queues}), DryRunActuator(),
                            nodes=nodes(("h", "H100", 8, 2)), settings=Settings(True, 30.0))


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def svc() -> SchedulerService:
    return make_service()


@pytest.fixture
def api(svc: SchedulerService, clock: Clock) -> Api:
    return Api(create_app(svc, None, load_settings(None, api={"tokens": TOKENS}), clock=clock))


def body(wid: str = "w1", queue: str = "a", **kw: Any) -> dict[str, Any]:
    return {"id": wid, "queue": queue, "gpus_per_pod": 8, **kw}


def is_problem(r: httpx.Response, status: int, slug: str) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    p = r.json()
    assert p["status"] == status and p["type"] == f"urn:gpuq:problem:{slug}" and p["title"] and p["detail"]
    assert p["instance"] == r.request.url.path
    return p


# -- roles ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method, url, payload, role_needed", [
    ("GET", "/workloads", None, "viewer"),
    ("GET", "/nodes", None, "viewer"),
    ("GET", "/preemptions", None, "viewer"),
    ("POST", "/workloads", body(), "operator"),
    ("POST", "/dry-run", {"queue": "a"}, "operator"),
    ("DELETE", "/workloads/w1", None, "operator"),
    ("POST", "/admin/reload-queues", None, "admin"),
], ids=["list", "nodes", "preemptions", "submit", "dry-run", "cancel", "reload"])
def test_roles(api: Api, method: str, url: str, payload: Any, role_needed: str) -> None:
    kw = {"json": payload} if payload is not None else {}
    p = is_problem(api(method, url, **kw), 401, "unauthorized")
    assert "bearer token is required" in p["detail"]
    bad = api(method, url, token="nope", **kw)
    is_problem(bad, 401, "unauthorized")
    assert bad.headers["www-authenticate"] == "Bearer"
    order = ["viewer", "operator", "admin"]
    for role, token in zip(order, ("view-t", "op-t", "admin-t")):
        r = api(method, url, token=token, **kw)
        if order.index(role) < order.index(role_needed):
            p = is_problem(r, 403, "forbidden")
            assert f"needs the {role_needed} role" in p["detail"] and role in p["detail"]
            assert "vera" not in p["detail"] and "otto" not in p["detail"]   # never the token's owner
        else:
            assert r.status_code not in (401, 403), r.text


def test_viewer_cannot_submit(api: Api, svc: SchedulerService) -> None:
    is_problem(api("POST", "/workloads", token="view-t", json=body()), 403, "forbidden")
    assert svc.workloads() == []


def test_auth_off_without_tokens_warns(svc: SchedulerService, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="scheduler.api.auth"):
        api = Api(create_app(svc, None, load_settings(None), clock=Clock()))
    assert "authentication is OFF" in caplog.text
    assert api("POST", "/workloads", json=body()).status_code == 201


# -- 422, 404, 409 ------------------------------------------------------------------------------------
@pytest.mark.parametrize("payload, field", [
    ({"id": "w1"}, "body.queue"),
    (body(gpus_per_pod=0), "body.gpus_per_pod"),
    (body(gpus_per_pod="8"), "body.gpus_per_pod"),
    (body(pods=-1), "body.pods"),
    (body(wid="bad id!"), "body.id"),
    (body(colour="red"), "body.colour"),
    (body(target={"kind": "Deployment"}), "body.target.kind"),
    (body(duration=0), "body.duration"),
    (body(queue="nope"), "body.queue"),                    # not a leaf of the configuration
], ids=["missing-queue", "zero-gpus", "string-gpus", "negative-pods", "bad-id", "unknown-field",
        "bad-target-kind", "zero-duration", "unknown-queue"])
def test_bad_bodies_are_422_naming_the_field(api: Api, payload: dict[str, Any], field: str) -> None:
    p = is_problem(api("POST", "/workloads", token="op-t", json=payload), 422, "invalid")
    assert p["detail"].startswith(field + ":")
    assert field in [e["field"] for e in p["errors"]]
    assert all({"field", "message", "type"} <= e.keys() for e in p["errors"])


def test_not_json_is_422(api: Api) -> None:
    r = api("POST", "/workloads", token="op-t", content=b"{not json", headers={"content-type": "application/json"})
    is_problem(r, 422, "invalid")


def test_404_and_409(api: Api) -> None:
    is_problem(api("GET", "/workloads/ghost", token="view-t"), 404, "not-found")
    is_problem(api("DELETE", "/workloads/ghost", token="op-t"), 404, "not-found")
    is_problem(api("GET", "/no/such/route", token="view-t"), 404, "not-found")
    assert api("POST", "/workloads", token="op-t", json=body()).status_code == 201
    p = is_problem(api("POST", "/workloads", token="op-t", json=body()), 409, "conflict")
    assert "already exists" in p["detail"]
    assert api("DELETE", "/workloads/w1", token="op-t").json()["state"] == "cancelled"
    is_problem(api("DELETE", "/workloads/w1", token="op-t"), 409, "conflict")
    is_problem(api("GET", "/workloads?state=lost", token="view-t"), 422, "invalid")


# -- the scheduler's endpoints -------------------------------------------------------------------------
def test_submit_explain_list_and_cancel(api: Api, svc: SchedulerService, clock: Clock) -> None:
    r = api("POST", "/workloads", token="op-t",
            json=body("ns/w1", pods=2, gpu_types=["H100"], target={"kind": "RayJob", "namespace": "ns", "name": "w1"}))
    assert r.status_code == 201 and r.headers["location"] == "/workloads/ns/w1"
    w = r.json()
    assert (w["state"], w["reason_code"], w["position"], w["submit_s"]) == ("pending", "queued", 1, 1000.0)
    assert w["target"] == {"kind": "RayJob", "namespace": "ns", "name": "w1"}
    api("POST", "/workloads", token="op-t", json=body("b1", "b"))
    svc.cycle(1001.0)
    got = api("GET", "/workloads/ns/w1", token="view-t").json()
    assert got["state"] == "running" and sum(got["placement"].values()) == 16
    b1 = api("GET", "/workloads/b1", token="view-t").json()
    assert b1["state"] == "pending" and b1["reason_code"] == "waiting_preemption_delay"
    # the core's "t=1030" reaches people as an ISO time (gpuq.timefmt.readable at the API's edge)
    assert "may preempt at 1970-01-01T00:17:10Z (in 29 s" in b1["message"] and b1["position"] == 1
    assert "t=" not in b1["message"]
    assert [w["id"] for w in api("GET", "/workloads?state=pending", token="view-t").json()] == ["b1"]
    assert [w["id"] for w in api("GET", "/workloads?queue=a", token="view-t").json()] == ["ns/w1"]
    nodes_ = api("GET", "/nodes", token="view-t").json()
    assert [(n["name"], n["used"], n["free"]) for n in nodes_] == [("h-0", 8, 0), ("h-1", 8, 0)]
    assert api("DELETE", "/workloads/ns/w1", token="op-t").json()["state"] == "cancelled"


def test_preemptions_endpoint(svc: SchedulerService, api: Api) -> None:
    for wid, t in (("a1", 1.0), ("a2", 2.0)):
        api("POST", "/workloads", token="op-t", json=body(wid))
        svc.cycle(t)
    api("POST", "/workloads", token="op-t", json=body("b1", "b"))
    svc.cycle(1031.0)
    [p] = api("GET", "/preemptions?limit=5", token="view-t").json()
    assert (p["preemptor"], p["queue"], p["victims"], p["victim_queues"]) == ("b1", "b", ["a2"], ["a"])
    assert "reclaim guaranteed for b" in p["reason"]
    is_problem(api("GET", "/preemptions?limit=0", token="view-t"), 422, "invalid")


def test_dry_run_does_not_change_the_workloads(svc: SchedulerService, api: Api) -> None:
    api("POST", "/workloads", token="op-t", json=body("a1", pods=2))
    svc.cycle(1.0)
    before = api("GET", "/workloads", token="view-t").json()
    r = api("POST", "/dry-run", token="op-t", json={"queue": "b", "gpus_per_pod": 8})
    d = r.json()
    assert r.status_code == 200 and d["outcome"] == "pending" and d["reason_code"] == "waiting_preemption_delay"
    assert d["after_delay"]["reason_code"] == "no_victims"      # a1 is one gang of 16: a would drop to 0 < 8
    assert api("GET", "/workloads", token="view-t").json() == before
    fits = api("POST", "/dry-run", token="op-t", json={"queue": "a", "gpus_per_pod": 1}).json()
    assert fits["outcome"] == "pending" and fits["reason_code"] == "quota_max"
    is_problem(api("POST", "/dry-run", token="op-t", json={"queue": "zz"}), 422, "invalid")


# -- probes, metrics, OpenAPI ----------------------------------------------------------------------------
def test_probes_and_metrics(api: Api, svc: SchedulerService, clock: Clock) -> None:
    assert api("GET", "/healthz").json() == {"status": "ok", "role": "single"}
    p = is_problem(api("GET", "/readyz", token="view-t"), 503, "unavailable")
    assert p["checks"] == {"store": True, "config": True, "cycle": False}
    api("POST", "/workloads", token="op-t", json=body("a1"))
    api("POST", "/workloads", token="op-t", json=body("b1", "b", pods=2))
    svc.cycle(clock.t)
    assert api("GET", "/readyz", token="view-t").json()["status"] == "ready"
    clock.t += 60
    assert api("GET", "/readyz").status_code == 503
    text = api("GET", "/metrics").text
    for line in ('gpuq_scheduler_cycles_total 1.0', 'gpuq_scheduler_admissions_total{queue="a"} 1.0',
                 'gpuq_scheduler_pending_workloads{queue="b"} 1.0', 'gpuq_scheduler_submitted_total{queue="b"} 1.0',
                 'gpuq_scheduler_cycle_duration_seconds_count 1.0'):
        assert line in text


def test_openapi_and_docs(api: Api) -> None:
    doc = api("GET", "/openapi.json").json()
    assert {"/workloads", "/workloads/{workload_id}", "/dry-run", "/queues", "/nodes", "/preemptions",
            "/accounting/usage", "/accounting/series", "/admin/reload-queues", "/healthz", "/readyz"} <= set(doc["paths"])
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    assert "WorkloadIn" in doc["components"]["schemas"]
    assert api("GET", "/docs").status_code == 200


def test_accounting_endpoints_answer_503_without_accounting(api: Api) -> None:
    is_problem(api("GET", "/queues", token="view-t"), 503, "unavailable")


# -- the accounting, on a real store ----------------------------------------------------------------------
@pytest.fixture
def queue_file(tmp_path: Path) -> Path:
    f = tmp_path / "queues.yaml"
    f.write_text(yaml.safe_dump({"queues": QUEUES}))
    return f


@pytest.fixture
def live(store: Any, queue_file: Path, clock: Clock) -> tuple[Api, SchedulerService, Any]:
    from scheduler.service.accounting import LiveAccounting

    acc = LiveAccounting(store, queues_file=str(queue_file))
    svc = SchedulerService(acc.config, DryRunActuator(), nodes=nodes(("h", "H100", 8, 2)))
    app = create_app(svc, acc, load_settings(None, api={"tokens": TOKENS}), clock=clock)
    return Api(app), svc, acc


def test_queues_usage_and_series(live: tuple[Api, SchedulerService, Any], clock: Clock) -> None:
    api, svc, acc = live
    clock.t = 1_750_000_000.0
    api("POST", "/workloads", token="op-t", json=body("w1", "b", pods=2))
    acc.refresh(clock.t, svc.pending_demand())
    rows = api("GET", "/queues", token="view-t").json()
    b = next(r for r in rows if r["queue"] == "b" and r["gpu_type"] == "*")
    assert (b["pending"], b["guaranteed"], b["max"]) == (16.0, 8, 16)
    assert "gpuq_queue_pending_gpus" in api("GET", "/metrics").text
    usage = api("GET", "/accounting/usage?from=-2h&to=now&by=queue,gpu_type", token="view-t")
    assert usage.status_code == 200 and usage.json() == []
    series = api("GET", "/accounting/series?queue=a&from=-2h&step=30m", token="view-t").json()
    assert [p["queue"] for p in series] == ["a"] * 4 and series[0]["guaranteed"] == 8
    for url, field in (("/accounting/usage?from=yesterday", "query.from"),
                       ("/accounting/usage?by=colour", "query.by"),
                       ("/accounting/usage?from=now&to=-1h", "query.to"),
                       ("/accounting/series?step=0", "query.step"),
                       ("/accounting/series?step=fast", "query.step"),
                       ("/accounting/series?from=-30d&step=1s", "query.step")):
        assert is_problem(api("GET", url, token="view-t"), 422, "invalid")["detail"].startswith(field), url


def test_admin_reload_takes_a_new_file_and_refuses_orphans(live: tuple[Api, SchedulerService, Any],
                                                           queue_file: Path) -> None:
    api, svc, acc = live
    assert api("POST", "/admin/reload-queues", token="admin-t").json()["result"] == "unchanged"
    queue_file.write_text(yaml.safe_dump({"queues": {**QUEUES, "c": {"guaranteed": {"gpu": 4}}}}))
    r = api("POST", "/admin/reload-queues", token="admin-t").json()
    assert r["result"] == "loaded" and r["queues"] == ["a", "b", "c"] and "c" in svc.config.leaves()
    api("POST", "/workloads", token="op-t", json=body("c1", "c"))
    queue_file.write_text(yaml.safe_dump({"queues": QUEUES}))       # would orphan c1
    p = is_problem(api("POST", "/admin/reload-queues", token="admin-t"), 409, "conflict")
    assert "c hold" in p["detail"] and "c" in svc.config.leaves() and "c" in acc.config.leaves()
    queue_file.write_text("queues: {a: {max: {gpu: lots}}}\n")
    p = is_problem(api("POST", "/admin/reload-queues", token="admin-t"), 409, "conflict")
    assert "queues.a.max.gpu" in p["detail"]
    api("DELETE", "/workloads/c1", token="op-t")
    queue_file.write_text(yaml.safe_dump({"queues": QUEUES}))
    assert api("POST", "/admin/reload-queues", token="admin-t").json()["result"] == "loaded"
    assert "c" not in svc.config.leaves()


def test_with_auth_off_a_browser_cannot_forge_a_change(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 17: with no tokens (loopback only), a page in a browser could pause, resume and reload
    through a cross-origin text/plain POST, or through a DNS name rebound to 127.0.0.1. A change now
    needs JSON, a Host this API answers as, and (when present) such an Origin; the CLI's requests
    (JSON, Host 127.0.0.1, no Origin) still pass."""
    import httpx
    svc = make_service()
    app = create_app(svc, None, load_settings(None, api={"allowed_hosts": ["gpuq.internal"]}), clock=lambda: 1000.0)

    def post(path: str, host: str, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{host}") as c:
                return await c.post(path, **kw)
        return asyncio.run(go())

    assert post("/admin/pause", "127.0.0.1:8377", content=b'{"reason": "x"}',
                headers={"content-type": "text/plain"}).status_code == 415
    assert post("/admin/pause", "evil.example:8377", json={}).status_code == 403          # a rebound name
    assert post("/admin/pause", "127.0.0.1:8377", json={},
                headers={"origin": "https://evil.example"}).status_code == 403            # cross-origin
    assert svc.paused is None
    assert post("/admin/pause", "gpuq.internal:8377", json={}).status_code == 200        # api.allowed_hosts
    assert post("/admin/resume", "127.0.0.1:8377", json={},
                headers={"origin": "http://localhost:8377"}).status_code == 200
    assert svc.paused is None
    assert post("/workloads", "[::1]:8377", json=body()).status_code == 201
