"""``gpuq pause`` / ``gpuq resume`` / ``gpuq status`` against a real ``gpuq serve``: pausing needs
an admin token, a paused scheduler decides but does not admit (the reason says what it would do),
and resuming admits."""
from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.test_serve import TOKEN, Server, gpuq, servers, setup  # noqa: F401 - setup, servers: fixtures

ADMIN = "admin-secret"


@pytest.fixture
def admin_cfg(setup: tuple[Path, str]) -> tuple[Path, str]:  # noqa: F811
    cfg, url = setup
    conf = yaml.safe_load(cfg.read_text())
    conf["api"]["tokens"].append({"token": ADMIN, "role": "admin", "name": "oncall"})
    cfg.write_text(yaml.safe_dump(conf))
    return cfg, url


@pytest.fixture
def server(admin_cfg: tuple[Path, str]) -> Iterator[Server]:
    srv = Server(*admin_cfg)
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait()


@pytest.mark.timeout(120)
def test_pause_status_resume_from_the_command_line(admin_cfg: tuple[Path, str], server: Server) -> None:
    cfg, _ = admin_cfg
    refused = gpuq("pause", "--reason", "incident 42", cfg=cfg)          # the config's first token: operator
    assert refused.returncode == 1
    assert "admin role" in refused.stderr and "HTTP 403" in refused.stderr

    paused = gpuq("pause", "--reason", "incident 42", "--token", ADMIN, cfg=cfg)
    assert paused.returncode == 0, paused.stderr
    assert "acting: PAUSED" in paused.stdout and "oncall" in paused.stdout and "incident 42" in paused.stdout

    r = server.client.post("/workloads", json={"id": "a1", "queue": "a", "gpus_per_pod": 8})
    assert r.status_code == 201, r.text
    server.wait_until(lambda: server.get("/workloads/a1").json()["reason_code"] == "paused", 10, "held by the pause")
    held = server.get("/workloads/a1").json()
    assert held["state"] == "pending" and "would admit" in held["message"], held

    st = gpuq("status", "--format", "json", cfg=cfg)
    assert st.returncode == 0, st.stderr
    status = json.loads(st.stdout)
    assert status["paused"] is True and status["pause_reason"] == "incident 42"

    resumed = gpuq("resume", "--token", ADMIN, cfg=cfg)
    assert resumed.returncode == 0, resumed.stderr
    assert "acting: on" in resumed.stdout
    server.wait_until(lambda: server.state("a1") == "running", 10, "admitted after resume")

    rc, _ = server.stop()
    assert rc == 0, server.log.read_text()
    q = gpuq("query", "SELECT event FROM scheduler_events WHERE event IN ('pause', 'resume', 'admit') ORDER BY t, seq",
             "--format", "json", cfg=cfg)
    assert q.returncode == 0, q.stderr
    assert [e["event"] for e in json.loads(q.stdout)] == ["pause", "resume", "admit"]


@pytest.mark.timeout(150)
def test_an_acknowledged_pause_survives_sigkill(tmp_path: Path, servers: list[Server]) -> None:  # noqa: F811
    """Issue 17: the pause is durable before the 200. The scheduler's writer flushes once an hour
    here, so only the pause's own flush can have stored it: SIGKILL right after the answer, restart,
    still paused (and the same for a resume)."""
    from tests.test_serve import serve_config
    cfg, url = serve_config(tmp_path, batch_interval_s=3600)
    conf = yaml.safe_load(cfg.read_text())
    conf["api"]["tokens"].append({"token": ADMIN, "role": "admin", "name": "oncall"})
    cfg.write_text(yaml.safe_dump(conf))
    admin = {"Authorization": f"Bearer {ADMIN}"}
    for action, want in (("pause", True), ("resume", False)):
        srv = Server(cfg, url)
        servers.append(srv)
        r = srv.client.post(f"/admin/{action}", headers=admin, json={"reason": "incident 42"} if want else None)
        assert r.status_code == 200 and r.json()["paused"] is want, r.text
        srv.proc.send_signal(signal.SIGKILL)
        srv.proc.wait(timeout=10)
        srv.client.close()
        again = Server(cfg, url)
        servers.append(again)
        status = again.get("/scheduler/status").json()
        assert status["paused"] is want, (action, status)
        if want:
            assert status["pause_reason"] == "incident 42" and status["paused_by"].startswith("oncall"), status
        again.proc.send_signal(signal.SIGKILL)
        again.proc.wait(timeout=10)
        again.client.close()
