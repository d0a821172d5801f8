"""`gpuq serve` as a real process on its own chDB path: submit over HTTP, see it admitted,
`gpuq explain` and `gpuq workloads` against it, SIGTERM stops it cleanly within 10 s, the events
are in scheduler_events afterwards, and a second start rebuilds the state from them; with an hour's
flush interval the store holds after SIGTERM exactly the rows accepted before it (collector rows
and scheduler events); `gpuq queues` and `gpuq usage` show what a running serve's API shows.

chDB lets one process open a path, so the store is read after the server exits, by `gpuq query`
in a process of its own (this test process keeps the session's chDB path)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import data_path, die_with_parent, free_port
from tests.held_rows import quiesce
from tests.ray_fixtures import Canned, http_server_fixture  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
TOKEN = "op-secret"


def gpuq(*args: str, cfg: Path, late: bool = False, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """``gpuq CMD --config CFG ARGS`` (``late``: ``gpuq CMD ARGS --config CFG``)."""
    argv = [*args, "--config", str(cfg)] if late else [*args[:1], "--config", str(cfg), *args[1:]]
    return subprocess.run([sys.executable, "-m", "gpuq.cli", *argv],
                          check=False, capture_output=True, text=True, timeout=timeout, cwd=cfg.parent, env=_env())


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def two_queues_two_nodes(tmp_path: Path) -> None:
    """queues.yaml (a and b, each guaranteed 8 and max 16) and nodes.yaml (2 x 8 H100) in tmp_path."""
    (tmp_path / "queues.yaml").write_text(yaml.safe_dump({"queues": {
        "a": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}},
        "b": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}}}}))
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump([{"name": "h", "gpu_type": "H100", "gpus": 8, "count": 2}]))


def serve_config(tmp_path: Path, batch_interval_s: float = 0.5, collector: dict[str, Any] | None = None,
                 scheduler: dict[str, Any] | None = None) -> tuple[Path, str]:
    """gpuq.yaml for `gpuq serve` in tmp_path (two queues, two nodes, dry-run actuator, an operator
    token); ``collector``, ``scheduler``: more settings of those sections."""
    two_queues_two_nodes(tmp_path)
    port = free_port()
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text(yaml.safe_dump({
        "store": {"dsn": f"chdb://{tmp_path / 'data'}", "spill_dir": str(tmp_path / "spill"),
                  "batch_interval_s": batch_interval_s},
        "queues_file": "queues.yaml",
        "scheduler": {"actuator": "dry-run", "cycle_interval_s": 0.2, "preemption_delay_s": 1, **(scheduler or {})},
        "accounting": {"interval_s": 1},
        "collector": {"metrics_port": 0, **(collector or {})},
        "api": {"host": "127.0.0.1", "port": port, "tokens": [{"token": TOKEN, "role": "operator", "name": "ci",
                                                                "namespaces": ["*"], "queues": ["*"]}]},
    }))
    return cfg, f"http://127.0.0.1:{port}"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, str]:
    return serve_config(tmp_path)


class Server:
    def __init__(self, cfg: Path, url: str) -> None:
        self.url = url
        self.log = cfg.parent / "serve.log"
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "gpuq.cli", "serve", "--config", str(cfg), "--nodes", "nodes.yaml"],
                cwd=cfg.parent, env=_env(), stdout=out, stderr=subprocess.STDOUT, preexec_fn=die_with_parent)
        self.client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=5)
        self.wait_until(lambda: self.get("/readyz").status_code == 200, 40, "ready")

    def get(self, path: str) -> httpx.Response:
        try:
            return self.client.get(path)
        except httpx.TransportError:
            return httpx.Response(599)

    def wait_until(self, cond: Any, timeout: float, what: str) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            assert self.proc.poll() is None, f"gpuq serve exited ({self.proc.returncode}):\n{self.log.read_text()}"
            if cond():
                return
            time.sleep(0.1)
        raise AssertionError(f"not {what} after {timeout} s:\n{self.log.read_text()}")

    def state(self, wid: str) -> str:
        return str(self.get(f"/workloads/{wid}").json()["state"])

    def stop(self) -> tuple[int, float]:
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=15)
        self.client.close()
        return rc, time.monotonic() - t0


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for s in started:
        if s.proc.poll() is None:
            s.proc.kill()
            s.proc.wait()


@pytest.mark.timeout(120)
def test_serve_end_to_end(setup: tuple[Path, str], servers: list[Server]) -> None:
    cfg, url = setup
    srv = Server(cfg, url)
    servers.append(srv)
    # a1 declares an hour: b1's forecast waits for it, whatever the speed of the machine (with no
    # history and nothing declared, the prior is short, and a slow run could pass its p50)
    r = srv.client.post("/workloads", json={"id": "a1", "queue": "a", "pods": 2, "gpus_per_pod": 8,
                                            "expected_duration": 3600})
    assert r.status_code == 201, r.text
    srv.wait_until(lambda: srv.state("a1") == "running", 10, "admitted")
    assert srv.client.post("/workloads", json={"id": "b1", "queue": "b", "gpus_per_pod": 8}).status_code == 201
    srv.wait_until(lambda: srv.get("/workloads/b1").json()["reason_code"] == "no_victims", 10, "explained")
    srv.wait_until(lambda: srv.get("/workloads/b1").json()["eta"] is not None, 10, "forecast")   # its own thread

    out = gpuq("explain", "b1", cfg=cfg, late=True)
    assert out.returncode == 0, out.stderr
    assert "workload b1 in queue b: pending" in out.stdout
    assert "reason: no_victims" in out.stdout and "no allowed victim set" in out.stdout
    said = re.search(r"expected to start in about (\d+) min, position 1 in b\n", out.stdout)
    assert said and 55 <= int(said[1]) <= 60, out.stdout    # a1's declared hour, less what it has run
    listed = gpuq("workloads", "--format", "json", cfg=cfg)
    assert listed.returncode == 0, listed.stderr
    assert {w["id"]: w["state"] for w in json.loads(listed.stdout)} == {"a1": "running", "b1": "pending"}
    missing = gpuq("explain", "ghost", cfg=cfg)
    assert missing.returncode == 1 and "no workload 'ghost' (HTTP 404)" in missing.stderr

    rc, took = srv.stop()
    assert rc == 0, srv.log.read_text()
    assert took < 10, f"took {took:.1f} s to stop"

    q = gpuq("query", "SELECT event, workload, queue, placement FROM scheduler_events ORDER BY t, seq",
             "--format", "json", cfg=cfg)
    assert q.returncode == 0, q.stderr
    rows = [(e["event"], e["workload"]) for e in json.loads(q.stdout)]
    assert rows == [("submit", "a1"), ("admit", "a1"), ("submit", "b1")]
    assert sum(json.loads(q.stdout)[1]["placement"].values()) == 16

    again = Server(cfg, url)                  # a restart rebuilds the state from scheduler_events
    servers.append(again)
    assert again.state("a1") == "running" and again.state("b1") == "pending"
    assert again.get("/nodes").json()[0]["workloads"] == ["a1"]
    assert again.stop()[0] == 0


@pytest.mark.timeout(120)
def test_store_commands_while_serve_holds_the_store(setup: tuple[Path, str], servers: list[Server]) -> None:
    """chDB allows one process per data directory: while `gpuq serve` runs, `gpuq queues` and
    `gpuq usage` ask its API; `gpuq query` says plainly why it cannot open the store."""
    cfg, url = setup
    servers.append(Server(cfg, url))
    q = gpuq("queues", "--format", "json", cfg=cfg)
    assert q.returncode == 0, q.stderr
    rows = json.loads(q.stdout)
    assert {r["queue"] for r in rows} >= {"a", "b"}
    assert all({"queue", "gpu_type", "allocated", "guaranteed", "max", "pending", "fair_share"} <= set(r) for r in rows)
    u = gpuq("usage", "--from", "-1h", "--to", "now", "--format", "json", cfg=cfg)
    assert u.returncode == 0 and isinstance(json.loads(u.stdout), list), u.stderr
    sql = gpuq("query", "SELECT 1", cfg=cfg)
    assert sql.returncode == 2
    assert "open in another process" in sql.stderr and "Error initializing" not in sql.stderr
    forced = gpuq("queues", "--local", cfg=cfg)
    assert forced.returncode == 2 and "open in another process" in forced.stderr


def _config_beside(cfg: Path, name: str, **api: Any) -> Path:
    """``cfg`` with a store of its own (nothing holds it, like a ClickHouse server's DSN) and ``api``
    settings over the original's."""
    data = yaml.safe_load(cfg.read_text())
    data["store"] |= {"dsn": f"chdb://{cfg.parent / name}", "spill_dir": str(cfg.parent / f"{name}-spill")}
    data["api"] |= api
    other = cfg.parent / f"{name}.yaml"
    other.write_text(yaml.safe_dump(data))
    return other


@pytest.mark.timeout(180)
def test_queues_and_usage_ask_the_running_serve(setup: tuple[Path, str], servers: list[Server]) -> None:
    """With a `gpuq serve` answering at api.host:api.port, `gpuq queues` and `gpuq usage` show
    what its API shows (the scheduler's live admissions and pending) even when they could open
    their store; `--local` (or an option the API lacks) computes from the store, and so does a
    config whose API does not answer /healthz in time."""
    import socket

    cfg, url = setup
    srv = Server(cfg, url)
    servers.append(srv)
    assert srv.client.post("/workloads", json={"id": "a1", "queue": "a", "pods": 2, "gpus_per_pod": 8}).status_code == 201
    assert srv.client.post("/workloads", json={"id": "b1", "queue": "b", "gpus_per_pod": 8}).status_code == 201
    srv.wait_until(lambda: srv.state("a1") == "running", 10, "admitted")
    srv.wait_until(lambda: any(r["queue"] == "a" and r["allocated"] == 16 for r in srv.get("/queues").json()),
                   20, "a1 in /queues")
    other = _config_beside(cfg, "other")
    for _ in range(3):                          # the API's view is live: compare while it holds still
        before = srv.get("/queues").json()
        q = gpuq("queues", "--format", "json", cfg=other)
        assert q.returncode == 0, q.stderr
        if srv.get("/queues").json() == before:
            break
    assert json.loads(q.stdout) == before
    assert {(r["queue"], r["allocated"], r["pending"]) for r in before} >= {("a", 16, 0), ("b", 0, 8)}

    local = gpuq("queues", "--local", "--format", "json", cfg=other)
    assert local.returncode == 0, local.stderr
    mine = {r["queue"]: r["allocated"] for r in json.loads(local.stdout)}       # its own store: empty
    assert {"a", "b"} <= set(mine) and set(mine.values()) == {0}
    shown = gpuq("queues", "--show", "nodes", "--format", "json", cfg=other)      # not in the API: the store
    assert shown.returncode == 0 and json.loads(shown.stdout) == [], shown.stderr

    srv.wait_until(lambda: any(u["queue"] == "a" for u in srv.get("/accounting/usage?from=-1h").json()),
                   20, "a1's admission in the store")
    u = gpuq("usage", "--from", "-1h", "--format", "json", cfg=other)
    assert u.returncode == 0, u.stderr
    assert {r["queue"] for r in json.loads(u.stdout) if r["gpu_seconds"] > 0} == {"a"}
    lu = gpuq("usage", "--from", "-1h", "--format", "json", "--local", cfg=other)
    assert lu.returncode == 0 and json.loads(lu.stdout) == [], lu.stderr

    with socket.socket() as silent:             # listens, never answers: the store after ~0.5 s
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        mute = _config_beside(cfg, "mute", port=silent.getsockname()[1])
        q = gpuq("queues", "--format", "json", cfg=mute)
    assert q.returncode == 0, q.stderr
    assert {r["queue"]: r["allocated"] for r in json.loads(q.stdout)} == mine


@pytest.mark.timeout(120)
def test_sigterm_flushes_what_was_accepted(tmp_path: Path, servers: list[Server], http_server: Canned) -> None:
    """With an hour's flush interval everything accepted is in memory when SIGTERM comes: the
    scheduler's events (the API's answers say which) and the collector's rows (its metrics on
    /metrics say how many). After the exit the store holds exactly those."""
    page = data_path("dcgm", "datadog-integrations-core-metrics.txt").read_text()
    target = http_server.set("/metrics", page)
    cfg, url = serve_config(tmp_path, batch_interval_s=3600, collector={
        "interval_s": 0.3, "jitter_s": 0, "dcgm": [{"cluster": "lab", "urls": [target]}]})
    srv = Server(cfg, url)
    servers.append(srv)
    assert srv.client.post("/workloads", json={"id": "a1", "queue": "a", "pods": 2, "gpus_per_pod": 8}).status_code == 201
    assert srv.client.post("/workloads", json={"id": "b1", "queue": "b", "gpus_per_pod": 8}).status_code == 201
    srv.wait_until(lambda: srv.state("a1") == "running", 10, "admitted")
    held = quiesce(lambda: srv.get("/metrics").text, http_server, "/metrics", "lab")
    # the scheduler's events are held too: the store has none of them yet
    assert srv.get("/scheduler/events").json() == []
    workloads = {w["id"]: w["state"] for w in srv.get("/workloads").json()}
    assert workloads == {"a1": "running", "b1": "pending"}

    rc, took = srv.stop()
    assert rc == 0 and took < 10, srv.log.read_text()
    assert "spilled" not in srv.log.read_text()
    stored = {t: query_rows(cfg, f"SELECT count() AS n FROM {t}")[0]["n"] for t in held}
    assert stored == held
    events = query_rows(cfg, "SELECT event, workload FROM scheduler_events ORDER BY t, seq")
    expected = [("submit", w) for w in sorted(workloads)] + [("admit", w) for w, s in workloads.items() if s == "running"]
    assert sorted((e["event"], e["workload"]) for e in events) == sorted(expected)


def query_rows(cfg: Path, sql: str) -> list[dict[str, Any]]:
    """``gpuq query SQL --format json`` in a process of its own (after the server exited)."""
    q = gpuq("query", sql, "--format", "json", cfg=cfg)
    assert q.returncode == 0, q.stderr
    return list(json.loads(q.stdout))
