"""The API against hostile callers (issue 9): operator scopes on submit and cancel with the actor
recorded in ``scheduler_events`` (real chDB store), Kubernetes target names, finite and bounded
numbers and times (422 naming the field, never a 500), the body cap and auth before the body (in
process, and against a real uvicorn server whose memory must not grow), /readyz and 403s that leak
nothing, and ``gpuq serve`` refusing a non-loopback address without tokens."""
from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from accounting.queues import parse_queue_config
from gpuq.errors import ConfigError
from gpuq.settings import load_settings
from scheduler.actuators.base import DryRunActuator
from scheduler.api import create_app
from scheduler.api.auth import check_exposure, is_loopback
from scheduler.service import SchedulerService
from scheduler.snapshot import Settings
from scheduler.testing import nodes
from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
QUEUES = {"a": {"guaranteed": {"gpu": 8}, "queues": {"x": {"guaranteed": {"gpu": 4}}, "y": {"guaranteed": {"gpu": 4}}}},
          "b": {"guaranteed": {"gpu": 8}}}
TOKENS = [{"token": "view-t", "role": "viewer", "name": "vera"},
          {"token": "op-a", "role": "operator", "name": "alice", "namespaces": ["team-a"], "queues": ["a"]},
          {"token": "admin-t", "role": "admin", "name": "ada"}]


class Api:
    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, method: str, url: str, token: str | None = None, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://localhost") as c:
                headers = {**kw.pop("headers", {}), **({"Authorization": f"Bearer {token}"} if token else {})}
                return await c.request(method, url, headers=headers, **kw)
        return asyncio.run(go())


def make_service(sink: Any = None) -> SchedulerService:
    return SchedulerService(parse_queue_config({"queues": QUEUES}), DryRunActuator(),
                            nodes=nodes(("h", "H100", 8, 2)), settings=Settings(True, 30.0), sink=sink)


def make_api(svc: SchedulerService, accounting: Any = None, **api: Any) -> Api:
    return Api(create_app(svc, accounting, load_settings(None, api={"tokens": TOKENS, **api}), clock=time.time))


@pytest.fixture
def svc() -> SchedulerService:
    return make_service()


@pytest.fixture
def api(svc: SchedulerService) -> Api:
    return make_api(svc)


def job(wid: str, queue: str, namespace: str = "team-a", kind: str = "RayJob", **kw: Any) -> dict[str, Any]:
    target = {"kind": kind, "name": wid} | ({"namespace": namespace} if namespace else {})
    if kind == "RaySubmission":
        target = {"kind": kind, "entrypoint": "python train.py"}
    return {"id": wid, "queue": queue, "gpus_per_pod": 4, "target": target, **kw}


def problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    return r.json()


# -- scopes -------------------------------------------------------------------------------------------
def test_scoped_operator_submits_only_in_its_namespaces_and_queue_subtrees(api: Api, svc: SchedulerService) -> None:
    assert api("POST", "/workloads", "op-a", json=job("j1", "a.x")).status_code == 201        # a.x below a
    assert api("POST", "/workloads", "op-a", json=job("r1", "a.y", kind="RaySubmission")).status_code == 201
    assert api("POST", "/workloads", "op-a", json={"id": "n1", "queue": "a.x"}).status_code == 201   # no target
    for payload in (job("j2", "b"),                                  # other queue, own namespace
                    job("j3", "a.x", namespace="team-b"),            # own queue, other namespace
                    job("j4", "a.x", namespace="kube-system", kind="Pod"),
                    job("r2", "b", kind="RaySubmission")):           # a Ray target: its queue decides
        p = problem(api("POST", "/workloads", "op-a", json=payload), 403)
        assert p["type"] == "urn:gpuq:problem:forbidden" and "may not act in this" in p["detail"]
        text = json.dumps(p)
        assert "alice" not in text and "op-a" not in text and "ada" not in text
    assert sorted(w.id for w in svc.workloads()) == ["j1", "n1", "r1"]
    # the admin is unscoped
    assert api("POST", "/workloads", "admin-t", json=job("j5", "b", namespace="team-b")).status_code == 201


def test_scoped_operator_cannot_cancel_other_tenants_workloads(api: Api, svc: SchedulerService) -> None:
    assert api("POST", "/workloads", "admin-t", json=job("b1", "b", namespace="secret-team")).status_code == 201
    assert api("POST", "/workloads", "admin-t", json=job("y1", "a.y", namespace="secret-team")).status_code == 201
    assert api("POST", "/workloads", "admin-t", json=job("rb", "b", kind="RaySubmission")).status_code == 201
    for wid in ("b1", "y1", "rb"):
        p = problem(api("DELETE", f"/workloads/{wid}", "op-a"), 403)
        text = json.dumps({k: v for k, v in p.items() if k != "instance"})
        assert "secret-team" not in text and '"b"' not in text and "ada" not in text and "alice" not in text
        assert svc.explain(wid).state == "pending"
    assert api("DELETE", "/workloads/b1", "admin-t").json()["state"] == "cancelled"
    assert api("POST", "/workloads", "op-a", json=job("mine", "a.x")).status_code == 201
    assert api("DELETE", "/workloads/mine", "op-a").json()["state"] == "cancelled"


def test_events_record_who_submitted_and_cancelled(store: Any, tmp_path: Path) -> None:
    from gpuq.store.writer import BatchWriter
    from scheduler.events import read_events

    writer = BatchWriter(store, tmp_path / "spill")
    svc = make_service(sink=writer)
    api = make_api(svc)
    assert api("POST", "/workloads", "op-a", json=job("j1", "a.x")).status_code == 201
    assert api("POST", "/workloads", "admin-t", json=job("j2", "b")).status_code == 201
    assert api("DELETE", "/workloads/j1", "admin-t").status_code == 200
    assert api("DELETE", "/workloads/j2", "admin-t").status_code == 200
    writer.flush()
    got = [(e.event["event"], e.event["workload"], e.event.get("by"), e.event.get("reason"))
           for e in read_events(store, svc.cluster_name)]
    assert got == [("submit", "j1", "alice (operator)", None), ("submit", "j2", "ada (admin)", None),
                   ("cancel", "j1", "ada (admin)", "cancelled by ada (admin)"),
                   ("cancel", "j2", "ada (admin)", "cancelled by ada (admin)")]


def test_reload_records_the_admin_not_the_file(store: Any, tmp_path: Path) -> None:
    from gpuq.store.writer import BatchWriter
    from scheduler.service.accounting import LiveAccounting

    qf = tmp_path / "queues.yaml"
    qf.write_text(yaml.safe_dump({"queues": QUEUES}))
    acc = LiveAccounting(store, queues_file=str(qf))
    writer = BatchWriter(store, tmp_path / "spill")
    svc = SchedulerService(acc.config, DryRunActuator(), nodes=nodes(("h", "H100", 8, 2)), sink=writer)
    api = make_api(svc, acc)
    assert api("POST", "/admin/reload-queues", "admin-t").json()["result"] == "unchanged"
    qf.write_text("queues: {a: {max: {gpu: secret-words}}}\n")
    assert problem(api("POST", "/admin/reload-queues", "admin-t"), 409)
    writer.flush()
    rows = store.query(f"SELECT event, workload, by, reason FROM {store.database}.scheduler_events "
                       f"WHERE event = 'reload' ORDER BY seq").rows
    assert [tuple(r) for r in rows] == [("reload", "", "ada (admin)", "unchanged"), ("reload", "", "ada (admin)", "rejected")]
    events = api("GET", "/scheduler/events?from=-1h", "view-t")
    assert "secret-words" not in events.text


def test_scope_settings_are_checked_at_load() -> None:
    with pytest.raises(ConfigError, match=r"api.tokens.0: .*operator token needs both namespaces and queues"):
        load_settings(None, api={"tokens": [{"token": "t", "role": "operator"}]})
    with pytest.raises(ConfigError, match=r"api.tokens.0: .*operator token needs both"):
        load_settings(None, api={"tokens": [{"token": "t", "role": "operator", "namespaces": ["*"]}]})
    with pytest.raises(ConfigError, match=r"api.tokens.1: .*admin tokens take none"):
        load_settings(None, api={"tokens": [{"token": "v"}, {"token": "t", "role": "admin", "queues": ["a"]}]})
    with pytest.raises(ConfigError, match=r"api: .*same token") as exc:
        load_settings(None, api={"tokens": [{"token": "same-secret"}, {"token": "same-secret", "role": "admin"}]})
    assert "same-secret" not in str(exc.value)
    with pytest.raises(ConfigError, match=r"api.tokens.0.token"):
        load_settings(None, api={"tokens": [{"token": ""}]})


@pytest.mark.parametrize("target, field", [
    ({"kind": "RayJob", "namespace": "team-a"}, "body.target.name"),
    ({"kind": "RayJob", "name": "j"}, "body.target.namespace"),
    ({"kind": "Pod", "namespace": "", "name": ""}, "body.target.namespace"),
    ({"kind": "RayCluster", "namespace": "Team_A", "name": "c"}, "body.target.namespace"),
    ({"kind": "Pod", "namespace": "team-a", "name": "Bad Name"}, "body.target.name"),
    ({"kind": "RaySubmission", "namespace": "team-a", "entrypoint": "x"}, "body.target.namespace"),
    ({"namespace": "x" * 64}, "body.target.namespace"),
    ({"runtime_env": {"env_vars": {"N": float("inf")}}}, "body.target.runtime_env"),
], ids=["no-name", "no-namespace", "empty", "bad-namespace", "bad-name", "ray-with-namespace", "long-namespace",
        "infinite-runtime-env"])
def test_target_names_are_kubernetes_names(api: Api, svc: SchedulerService, target: dict[str, Any], field: str) -> None:
    body = json.dumps({"id": "w", "queue": "a.x", "target": target})      # Infinity as Python writes it
    r = api("POST", "/workloads", "admin-t", content=body, headers={"content-type": "application/json"})
    p = problem(r, 422)
    assert p["detail"].startswith(field + ":") and p["errors"][0]["field"] == field
    assert svc.workloads() == []


# -- numbers and times ------------------------------------------------------------------------------------
@pytest.mark.parametrize("raw, field", [
    ('"duration": 1e999', "body.duration"),
    ('"duration": NaN', "body.duration"),
    ('"duration": 1e12', "body.duration"),
    ('"gpu_types": ["H100", "' + "x" * 65 + '"]', "body.gpu_types.1"),
    ('"queue": "' + "q" * 254 + '"', "body.queue"),
], ids=["infinite", "nan", "too-long", "long-type", "long-queue"])
def test_numbers_are_finite_and_bounded(api: Api, svc: SchedulerService, raw: str, field: str) -> None:
    body = '{"id": "w", "queue": "a.x", ' + raw + "}"
    for url in ("/workloads", "/dry-run"):
        p = problem(api("POST", url, "admin-t", content=body, headers={"content-type": "application/json"}), 422)
        assert p["detail"].startswith(field), p
    assert svc.workloads() == []


@pytest.fixture
def live(store: Any, tmp_path: Path) -> tuple[Api, Any, Path]:
    from scheduler.service.accounting import LiveAccounting

    qf = tmp_path / "queues.yaml"
    qf.write_text(yaml.safe_dump({"queues": QUEUES}))
    acc = LiveAccounting(store, queues_file=str(qf))
    svc = SchedulerService(acc.config, DryRunActuator(), nodes=nodes(("h", "H100", 8, 2)))
    return make_api(svc, acc), acc, qf


NINES = "9" * 400


@pytest.mark.parametrize("url, field", [
    (f"/accounting/usage?from=-{NINES}w", "query.from"),
    (f"/accounting/usage?to=%2B{NINES}w", "query.to"),
    ("/accounting/usage?from=-99999999999w", "query.from"),
    ("/accounting/usage?from=0001-01-01", "query.from"),
    ("/accounting/series?from=-1d&to=9999-12-31T23:59:59.999999-12:00", "query.to"),
    (f"/accounting/series?step={NINES}", "query.step"),
    (f"/accounting/series?step={NINES}w", "query.step"),
    (f"/scheduler/events?from=-{NINES}d", "query.from"),
], ids=["from-overflow", "to-overflow", "from-before-1970", "year-1", "after-9999", "step-overflow",
        "step-weeks-overflow", "events-overflow"])
def test_times_out_of_range_are_422_naming_the_parameter(live: tuple[Api, Any, Path], url: str, field: str) -> None:
    api, _, _ = live
    p = problem(api("GET", url, "view-t"), 422)
    assert p["detail"].startswith(field), p
    assert len(p["detail"]) < 400                       # the 400 nines are not echoed back whole


# -- leaks ------------------------------------------------------------------------------------------------
def test_readyz_shows_details_only_to_token_holders(live: tuple[Api, Any, Path]) -> None:
    api, acc, qf = live
    qf.write_text("queues: {a: {max: {gpu: lots-of-secret-gpus}}}\n")
    acc.reload(accept=lambda c: None)
    assert acc.error and "lots-of-secret-gpus" in acc.error
    anonymous = problem(api("GET", "/readyz"), 503)             # no cycle yet: not ready
    assert anonymous["detail"] == "not ready" and "checks" not in anonymous
    assert "lots-of-secret-gpus" not in api("GET", "/readyz").text and "queues" not in api("GET", "/readyz").text
    bad_token = api("GET", "/readyz", "forged")
    assert "lots-of-secret-gpus" not in bad_token.text and "checks" not in bad_token.json()
    detailed = problem(api("GET", "/readyz", "view-t"), 503)
    assert detailed["checks"]["cycle"] is False and "lots-of-secret-gpus" in detailed["config_error"]


def test_store_errors_do_not_show_the_store(live: tuple[Api, Any, Path], store: Any, store_dsn: str,
                                            caplog: pytest.LogCaptureFixture) -> None:
    api, _, _ = live
    store.command(f"DROP DATABASE {store.database}")          # every query fails from here on
    path = store_dsn.removeprefix("chdb://").split("?")[0]
    with caplog.at_level("WARNING", logger="scheduler.api.app"):
        for url in ("/accounting/usage", "/accounting/idle", "/scheduler/events", "/collector/health"):
            p = problem(api("GET", url, "view-t"), 503)
            assert "details in the server's log" in p["detail"], p
            text = json.dumps(p)
            assert path not in text and store.database not in text and "DB::Exception" not in text
    assert store.database in caplog.text                      # the operator finds it in the log


def test_403_for_a_low_role_names_the_role_not_the_owner(api: Api) -> None:
    p = problem(api("POST", "/admin/reload-queues", "op-a"), 403)
    assert p["detail"] == "this needs the admin role; the token has the operator role"
    p = problem(api("POST", "/workloads", "view-t", json=job("j", "a.x")), 403)
    assert "vera" not in json.dumps(p)


# -- body size and auth before the body (in process) -------------------------------------------------------
def test_body_cap_and_auth_before_the_body(svc: SchedulerService) -> None:
    api = make_api(svc, max_body_bytes=4096, max_spec_bytes=2048)
    big = b'{"id": "w", "queue": "a.x", "target": {"metadata": {"k": "' + b"v" * 10_000 + b'"}}}'
    # no token: 401 before the size or the body matter; a viewer: 403 before the body is read
    assert problem(api("POST", "/workloads", content=big), 401)["detail"].startswith("a bearer token")
    assert problem(api("POST", "/workloads", "view-t", content=big), 403)["detail"].startswith("this needs")
    p = problem(api("POST", "/workloads", "op-a", content=big, headers={"content-type": "application/json"}), 413)
    assert p["type"] == "urn:gpuq:problem:too-large" and "4096 bytes (api.max_body_bytes)" in p["detail"]

    async def chunks() -> AsyncIterator[bytes]:                 # no Content-Length: counted as it comes
        yield b'{"id": "w", "queue": "a.x", "target": {"metadata": {"k": "'
        for _ in range(100):
            yield b"v" * 1000
        yield b'"}}}'
    r = api("POST", "/workloads", "op-a", content=chunks(), headers={"content-type": "application/json"})
    assert "content-length" not in r.request.headers
    assert problem(r, 413)["detail"].endswith("(api.max_body_bytes)")
    # under the body cap but over the spec cap: 422 naming the biggest field
    spec = {"id": "w", "queue": "a.x", "target": {"runtime_env": {"env_vars": {"K": "v" * 3000}}}}
    p = problem(api("POST", "/workloads", "op-a", json=spec), 422)
    assert p["detail"].startswith("body.target.runtime_env: the workload's spec is") and "api.max_spec_bytes" in p["detail"]
    assert svc.workloads() == []
    ok = {"id": "w", "queue": "a.x", "target": {"metadata": {"k": "v" * 500}}}
    assert api("POST", "/workloads", "op-a", json=ok).status_code == 201
    # unknown paths need a token too (an anonymous caller cannot map the API)
    assert problem(api("GET", "/no/such/path"), 401)
    assert problem(api("GET", "/no/such/path", "view-t"), 404)


# -- a real server: a 200 MB anonymous body is refused from the headers ------------------------------------
SERVER = """
import sys, uvicorn
from accounting.queues import parse_queue_config
from gpuq.settings import load_settings
from scheduler.actuators.base import DryRunActuator
from scheduler.api import create_app
from scheduler.service import SchedulerService
from scheduler.testing import nodes
svc = SchedulerService(parse_queue_config({"queues": {"a": {}}}), DryRunActuator(), nodes=nodes(("h", "H100", 8, 1)))
app = create_app(svc, None, load_settings(None, api={"tokens": [{"token": "admin-t", "role": "admin"}]}))
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
"""


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


@pytest.fixture
def server() -> Iterator[tuple[int, int]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port)], cwd=ROOT, env=env)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "the API server did not start"
            time.sleep(0.1)
        yield port, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _post_headers(port: int, length: int, token: str | None = None) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    s.sendall(f"POST /workloads HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{auth}"
              f"Content-Length: {length}\r\n\r\n".encode())
    return s


def _status(s: socket.socket) -> int:
    head = s.recv(65536).decode("latin-1")
    return int(head.split(" ", 2)[1])


def test_real_server_refuses_a_200_mb_anonymous_body_from_the_headers(server: tuple[int, int]) -> None:
    port, pid = server
    before = _rss_kib(pid)
    size = 200 * 1024 * 1024
    chunk = b"x" * (1024 * 1024)
    t0 = time.monotonic()
    for token in (None, "admin-t"):               # no token: 401; a valid token: 413 (over the cap)
        s = _post_headers(port, size, token)
        # the answer comes before a byte of the body is sent: nothing is read on the caller's behalf
        assert _status(s) == (401 if token is None else 413)
        sent = 0
        try:                                      # the server has closed: the body goes nowhere
            while sent < size:
                s.sendall(chunk)
                sent += len(chunk)
        except OSError:
            pass
        s.close()
        assert sent < size, "the server kept reading a body it had refused"
    elapsed = time.monotonic() - t0
    grown_mib = (_rss_kib(pid) - before) / 1024
    print(f"200 MB bodies refused in {elapsed:.2f} s; server RSS {before / 1024:.1f} MiB, grew {grown_mib:.1f} MiB")
    assert grown_mib < 8
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=5).status_code == 200


# -- binding ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True),
                                            ("localhost", True), ("0.0.0.0", False), ("::", False),
                                            ("10.0.0.5", False), ("gpuq.example.com", False), ("", False)])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_no_tokens_on_a_public_address_needs_insecure(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError, match=r"api.host: '0.0.0.0' is not a loopback address.*api.insecure: true"):
        check_exposure(load_settings(None, api={"host": "0.0.0.0"}).api)
    with pytest.raises(ConfigError):
        create_app(make_service(), None, load_settings(None, api={"host": "::"}))
    check_exposure(load_settings(None, api={"host": "0.0.0.0", "tokens": [{"token": "t"}]}).api)
    with caplog.at_level("WARNING", logger="scheduler.api.auth"):
        check_exposure(load_settings(None, api={"host": "0.0.0.0", "insecure": True}).api)
    assert "api.insecure is set: authentication is OFF" in caplog.text


def test_gpuq_serve_exits_on_a_public_address_without_tokens(tmp_path: Path) -> None:
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text(yaml.safe_dump({"store": {"dsn": f"chdb://{tmp_path / 'data'}"},
                                   "api": {"host": "0.0.0.0", "port": free_port()}}))
    r = subprocess.run([sys.executable, "-m", "gpuq.cli", "serve", "--config", str(cfg), "--no-collect"],
                       cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "api.host" in r.stderr and "api.insecure" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "data").exists()          # refused before the store was opened


@pytest.mark.parametrize("wid", ["rayjob/prod-ns/nightly", "raycluster/team/x", "RayJob/prod-ns/nightly"])
def test_the_kubernetes_sources_id_forms_are_reserved(api: Api, wid: str) -> None:
    """Issue 17: an operator's workload named like the Kubernetes source's made the real RayJob be
    skipped: such ids are refused (422 naming the field), on submit and on dry-run."""
    for path in ("/workloads", "/dry-run"):
        r = api("POST", path, "admin-t", json={"id": wid, "queue": "a.x", "gpus_per_pod": 8})
        assert r.status_code == 422, r.text
        assert r.json()["detail"].startswith("body.id"), r.json()
    assert api("POST", "/workloads", "admin-t", json=job("rayjobs-are-fine", "a.x")).status_code == 201
