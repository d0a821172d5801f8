"""A small local Ray cluster for the demo: a head (without GPUs unless asked: the demo's has two L4
that Ray tasks share) and worker nodes with logical GPUs of a type (``--num-gpus 4 --resources
'{"accelerator_type:H100": 4}'``), all on this machine.

Each worker gets a loopback address of its own (``127.0.0.2``, ``127.0.0.3``, ...): Ray names a
node by its IP on its metrics page (``NodeAddress``), so distinct addresses give the collector, the
accounting and the scheduler distinct nodes, and a gang can span two of them. Every ``ray start
--block`` runs in a session of its own (its process group is ours to signal: ``ray stop`` would
stop every Ray on the machine) and dies with this process (PR_SET_PDEATHSIG). Ports are free ports
picked here, the temp dir is ours.

The Ray nodes get the virtualenv's ``bin`` first on their PATH, so the jobs' ``python`` is this
one (with Ray and gpuq) however ``gpuq demo`` was started. gpuq names a Ray node by the first 12
hex characters of its node id (:meth:`LocalCluster.node_name`).

This is the demo's own minimal starter, with the interface of ``scheduler.ray_local`` (being
written) so that one can replace it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and never handed out before by this process: the kernel may give a port
    just released again, and one ``ray start`` given the same port for two of its components
    fails ("trying to use a port number ... used by other components")."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def die_with_parent() -> None:
    """``preexec_fn``: SIGTERM the child when this process dies (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


@dataclass(frozen=True, slots=True)
class LocalNode:
    name: str               # the demo's label for it (h100-a)
    gpus: int = 0
    gpu_type: str = ""


@dataclass
class LocalCluster:
    address: str            # GCS address
    dashboard_url: str
    temp_dir: Path
    node_ids: dict[str, str] = field(default_factory=dict)        # local name -> Ray node id (hex)
    metrics_urls: dict[str, str] = field(default_factory=dict)    # local name -> /metrics URL
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def node_name(self, local: str) -> str:
        return self.node_ids[local][:12].lower()

    def stop(self, grace_s: float = 3.0) -> None:
        """TERM each node's process group, KILL what is left after ``grace_s`` (workers first)."""
        for proc in reversed(self.procs):
            stop_group(proc, grace_s)
        self.procs.clear()


def stop_group(proc: subprocess.Popen[bytes], grace_s: float) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        end = time.monotonic() + grace_s
        while time.monotonic() < end:
            proc.poll()
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def _ray(temp_dir: Path, name: str, args: list[str]) -> subprocess.Popen[bytes]:
    ray_cli = Path(sys.executable).with_name("ray")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "PATH": path}
    with open(temp_dir / f"{name}.log", "wb") as out:
        return subprocess.Popen([str(ray_cli), "start", "--block", "--disable-usage-stats",
                                 "--object-store-memory=100000000", *args],
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, env=env,
                                preexec_fn=die_with_parent)


def _ports(*flags: str) -> list[str]:
    return [f"--{flag}={free_port()}" for flag in flags]


def _gpus(node: LocalNode) -> list[str]:
    resources = {f"accelerator_type:{node.gpu_type}": node.gpus} if node.gpu_type else {}
    return [f"--num-gpus={node.gpus}", f"--resources={json.dumps(resources)}"]


def start_local_cluster(nodes: list[LocalNode], temp_dir: Path, timeout_s: float = 120.0,
                        head: LocalNode = LocalNode("head")) -> LocalCluster:
    """Start the head and ``nodes`` as workers, one at a time (raylets started together on two busy
    cores miss Ray's 30 s registration); return once each is ALIVE and its metrics page shows its
    GPUs. A head with GPUs (``head.gpus``) is a node of the cluster like the workers (its node id
    and metrics page recorded under ``head.name``); it costs no start of its own. On failure what
    was started is stopped and RuntimeError says why."""
    temp_dir.mkdir(parents=True, exist_ok=True)
    gcs, dash, head_metrics = free_port(), free_port(), free_port()
    cluster = LocalCluster(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}", temp_dir)
    node_ports = ("node-manager-port", "object-manager-port", "dashboard-agent-listen-port",
                  "dashboard-agent-grpc-port", "runtime-env-agent-port")
    try:
        cluster.procs.append(_ray(temp_dir, "head", [
            "--head", f"--port={gcs}", "--num-cpus=1", *_gpus(head), "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--temp-dir={temp_dir}",
            f"--metrics-export-port={head_metrics}", *_ports("ray-client-server-port", *node_ports)]))
        _wait(lambda: _alive(cluster.dashboard_url), cluster, "the head", timeout_s)
        if head.gpus:
            [(address, node_id)] = _alive(cluster.dashboard_url).items()
            cluster.node_ids[head.name] = node_id
            cluster.metrics_urls[head.name] = url = f"http://{address}:{head_metrics}/metrics"
            _wait(lambda: _shows_gpus(url), cluster, url, timeout_s)
        for i, node in enumerate(nodes):
            address, metrics = f"127.0.0.{i + 2}", free_port()
            cluster.procs.append(_ray(temp_dir, node.name, [
                f"--address={cluster.address}", f"--node-ip-address={address}", "--num-cpus=1", *_gpus(node),
                f"--metrics-export-port={metrics}", *_ports(*node_ports)]))
            _wait(lambda a=address: _alive(cluster.dashboard_url).get(a), cluster, node.name, timeout_s)  # type: ignore[misc]
            cluster.node_ids[node.name] = _alive(cluster.dashboard_url)[address]
            cluster.metrics_urls[node.name] = url = f"http://{address}:{metrics}/metrics"
            _wait(lambda u=url: _shows_gpus(u), cluster, url, timeout_s)   # type: ignore[misc]
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _wait(cond: object, cluster: LocalCluster, what: str, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        dead = [p for p in cluster.procs if p.poll() is not None]
        if dead:
            logs = "\n".join(f.read_text()[-1500:] for f in sorted(cluster.temp_dir.glob("*.log")))
            raise RuntimeError(f"ray start exited with {dead[0].returncode} while waiting for {what}:\n{logs}")
        if cond():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise RuntimeError(f"Ray: {what} not up after {timeout_s:.0f} s (logs in {cluster.temp_dir})")


def _alive(dashboard_url: str) -> dict[str, str]:
    """node IP -> node id of the ALIVE nodes."""
    try:
        r = httpx.get(f"{dashboard_url}/api/v0/nodes?limit=50", timeout=3)
        nodes = r.json()["data"]["result"]["result"] if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return {}
    return {str(n["node_ip"]): str(n["node_id"]) for n in nodes if n.get("state") == "ALIVE"}


def _shows_gpus(url: str) -> bool:
    try:
        text = httpx.get(url, timeout=3).text
    except httpx.HTTPError:
        return False
    return any(line.startswith("ray_resources{") and 'Name="GPU"' in line for line in text.splitlines())
