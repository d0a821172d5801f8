"""Fixtures of the collector tests: a local HTTP server that replays recorded answers, and one
real Ray head for the whole session, and :func:`local_cluster` (a head plus worker nodes, from
``scheduler.ray_local``) for module-scoped fixtures. Import the fixture functions you use into the test module
(``http_server_fixture``, ``ray_head_fixture``); the tests ask for them as ``http_server``, ``ray_head``.

The Ray head is started with ``ray start --head --block`` in a session of its own, on free ports
and its own temp dir, and is stopped by signalling that process group: ``ray stop`` would stop
every Ray on the machine, other people's included.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import die_with_parent, free_port

# -- a local HTTP server with canned answers ----------------------------------------------------

@dataclass
class Canned:
    """Answers by path (query string included, else the bare path): (status, content type, body)."""

    routes: dict[str, tuple[int, str, bytes]] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    base: str = ""

    def set(self, path: str, body: str | bytes, *, status: int = 200,
            content_type: str = "text/plain; version=0.0.4") -> str:
        self.routes[path] = (status, content_type, body.encode() if isinstance(body, str) else body)
        return self.base + path


@pytest.fixture(name="http_server")
def http_server_fixture() -> Iterator[Canned]:
    canned = Canned()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            canned.requests.append(self.path)
            hit = canned.routes.get(self.path) or canned.routes.get(self.path.split("?", 1)[0])
            status, ctype, body = hit or (404, "text/plain", b"404: Not Found")
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    canned.base = f"http://127.0.0.1:{server.server_address[1]}"
    th = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    th.start()
    try:
        yield canned
    finally:
        server.shutdown()
        server.server_close()
        th.join(timeout=5)


# -- one real Ray head --------------------------------------------------------------------------

@dataclass(frozen=True)
class RayHead:
    address: str          # GCS address for ray.init
    dashboard_url: str
    metrics_url: str
    metrics_port: int
    node_ip: str


def _wait_alive(dashboard_url: str, proc: subprocess.Popen[bytes], log: Path, deadline_s: float) -> str:
    """Wait for the head to be ALIVE in the State API; return its node IP."""
    end = time.monotonic() + deadline_s
    last = ""
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            r = httpx.get(f"{dashboard_url}/api/v0/nodes?limit=10", timeout=2)
            alive = [n for n in r.json()["data"]["result"]["result"] if n["state"] == "ALIVE"] \
                if r.status_code == 200 else []
            if alive:
                return str(alive[0]["node_ip"])
            last = f"HTTP {r.status_code}"
        except httpx.HTTPError as exc:
            last = str(exc)
        time.sleep(0.5)
    raise RuntimeError(f"Ray dashboard not up after {deadline_s}s ({last}):\n{log.read_text()[-3000:]}")


def _wait_gpu_metrics(url: str, proc: subprocess.Popen[bytes], log: Path, deadline_s: float) -> None:
    """Ray's metrics agent publishes ``ray_resources`` some seconds after the node is ALIVE:
    hand out the head only once its page carries the GPU resource."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"ray start exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            text = httpx.get(url, timeout=2).text
            if any(line.startswith("ray_resources{") and 'Name="GPU"' in line for line in text.splitlines()):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} showed no ray_resources for GPU after {deadline_s}s")


def _stop_group(proc: subprocess.Popen[bytes], grace_s: float = 3.0) -> None:
    """SIGTERM the process group we started, SIGKILL what is left after ``grace_s`` (gcs_server
    ignores TERM). Workers run in groups of their own and exit with their raylet."""
    pgid = proc.pid                       # start_new_session=True: the group is ours
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + grace_s
        while time.monotonic() < end:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            proc.poll()
            time.sleep(0.1)
    proc.wait(timeout=10)


@pytest.fixture(scope="session", name="ray_head")
def ray_head_fixture() -> Iterator[RayHead]:
    pytest.importorskip("ray")
    ray_cli = Path(sys.executable).with_name("ray")
    if not ray_cli.exists():
        pytest.skip(f"no ray command next to {sys.executable}")
    for attempt in (1, 2):
        tmp = Path(tempfile.mkdtemp(prefix="gpuq-ray-", dir="/tmp"))   # short: Ray's socket paths
        try:
            proc, head = _start_head(ray_cli, tmp)
            break
        except RuntimeError:
            # `ray start` on two busy cores can miss its own startup timeout ("The current node
            # timed out during startup"): once more from scratch, then the error
            shutil.rmtree(tmp, ignore_errors=True)
            if attempt == 2:
                raise
    try:
        yield head
    finally:
        try:
            import ray

            ray.shutdown()
        finally:
            _stop_group(proc)
            shutil.rmtree(tmp, ignore_errors=True)


def _start_head(ray_cli: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], RayHead]:
    """A head on fresh ports, up with its GPUs on its metrics page; stopped again on failure."""
    ports: list[int] = []
    while len(ports) < 5:
        if (p := free_port()) not in ports:
            ports.append(p)
    gcs, dash, metrics, agent, client_port = ports
    cmd = [
        str(ray_cli), "start", "--head", "--block", "--disable-usage-stats",
        f"--port={gcs}", "--num-cpus=2", "--num-gpus=4",
        '--resources={"accelerator_type:H100": 4}', f"--metrics-export-port={metrics}",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}",
        f"--dashboard-agent-listen-port={agent}", f"--ray-client-server-port={client_port}",
        f"--temp-dir={tmp}",
    ]
    log = tmp / "ray-start.log"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                preexec_fn=die_with_parent)
    dashboard_url = f"http://127.0.0.1:{dash}"
    try:
        ip = _wait_alive(dashboard_url, proc, log, deadline_s=90)    # the address Ray picked
        _wait_gpu_metrics(f"http://{ip}:{metrics}/metrics", proc, log, deadline_s=90)
    except BaseException:
        _stop_group(proc)
        raise
    return proc, RayHead(f"{ip}:{gcs}", dashboard_url, f"http://{ip}:{metrics}/metrics", metrics, ip)


# -- a local multi-node cluster (scheduler.ray_local), one per test module ------------------------

def local_cluster(nodes: list[Any]) -> Iterator[Any]:
    """Start ``scheduler.ray_local.start_local_cluster(nodes)``, yield it, stop it (its own
    process groups only). Use it from a module-scoped fixture."""
    pytest.importorskip("ray")
    from scheduler.ray_local import start_local_cluster

    if not Path(sys.executable).with_name("ray").exists():
        pytest.skip(f"no ray command next to {sys.executable}")
    try:
        cluster = start_local_cluster(nodes, preexec_fn=die_with_parent)
    except RuntimeError:       # a raylet missing Ray's startup timeout on busy cores: once more
        cluster = start_local_cluster(nodes, preexec_fn=die_with_parent)
    try:
        yield cluster
    finally:
        try:
            import ray

            ray.shutdown()
        finally:
            cluster.stop()
