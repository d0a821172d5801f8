"""A local multi-node Ray cluster on this machine: ``start_local_cluster(nodes) -> LocalCluster``.

For ``gpuq demo`` and the tests: a head (no GPUs unless asked) plus worker raylets, each started
with ``ray start ... --block`` in a process group (session) of its own, so that stopping the
cluster signals exactly the processes started here and never another Ray on the machine (``ray
stop`` would stop them all). GPUs are logical (``--num-gpus``): Ray hands out
``CUDA_VISIBLE_DEVICES`` indices without any device behind them.

Every node gets ports of its own (node manager, object manager, dashboard agent HTTP and gRPC,
metrics, runtime-env agent; workers bind random ports), and all share one ``--temp-dir`` (short,
under /tmp: Ray's socket paths have a length limit), which holds each node's ``start`` log.
Ray-only clusters have no node names of their own here: a node is known by its Ray node id
(:attr:`LocalCluster.node_ids`, local name -> hex id); gpuq names it
``gpuq.ray_names.ray_node_name(node_id)``.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpuq.ray_names import ray_node_name


@dataclass(frozen=True, slots=True)
class LocalNode:
    """One raylet: ``name`` is local (log file, :attr:`LocalCluster.node_ids` key)."""

    name: str
    gpus: int = 0
    gpu_type: str = ""               # adds the ``accelerator_type:<type>`` resource, one per GPU
    cpus: int = 1
    object_store_bytes: int = 80_000_000


@dataclass
class LocalCluster:
    address: str                     # GCS address (ray.init / ray start --address)
    dashboard_url: str
    temp_dir: Path
    node_ids: dict[str, str] = field(default_factory=dict)        # local name -> Ray node id (hex)
    metrics_urls: dict[str, str] = field(default_factory=dict)    # local name -> /metrics URL
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def node_name(self, local: str) -> str:
        """gpuq's name of a node (what ``Placement.nodes`` and the ledger use)."""
        return ray_node_name(self.node_ids[local])

    def stop(self, grace_s: float = 3.0) -> None:
        """Stop the workers, then the head; remove the temp dir. Idempotent."""
        _stop_groups(self._procs, grace_s)
        self._procs.clear()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ports(n: int, taken: set[int]) -> list[int]:
    out: list[int] = []
    while len(out) < n:
        p = free_port()
        if p not in taken:
            taken.add(p)
            out.append(p)
    return out


def _node_args(node: LocalNode, taken: set[int]) -> tuple[list[str], int]:
    nm, om, agent, agent_grpc, metrics, renv = _ports(6, taken)
    resources: dict[str, float] = {f"accelerator_type:{node.gpu_type}": node.gpus} \
        if node.gpu_type and node.gpus else {}
    return [f"--num-cpus={node.cpus}", f"--num-gpus={node.gpus}", f"--resources={json.dumps(resources)}",
            f"--object-store-memory={node.object_store_bytes}", f"--node-manager-port={nm}",
            f"--object-manager-port={om}", "--min-worker-port=0", "--max-worker-port=0",
            f"--dashboard-agent-listen-port={agent}", f"--dashboard-agent-grpc-port={agent_grpc}",
            f"--metrics-export-port={metrics}", f"--runtime-env-agent-port={renv}"], metrics


def start_local_cluster(nodes: Sequence[LocalNode], *, head: LocalNode | None = None,
                        ray_cli: str | None = None, timeout_s: float = 120.0,
                        preexec_fn: Callable[[], None] | None = None) -> LocalCluster:
    """Start a head (``head``, default: 1 CPU, no GPU) and ``nodes`` as workers; return when every
    node is ALIVE in the State API with its resources. On failure, stops what it started and
    raises RuntimeError with the end of the failing node's log."""
    head = head or LocalNode("head")
    names = [head.name, *(n.name for n in nodes)]
    if len(set(names)) != len(names):
        raise ValueError(f"local node names must be distinct: {names}")
    cli = ray_cli or str(Path(sys.executable).with_name("ray"))
    tmp = Path(tempfile.mkdtemp(prefix="gpuq-ray-", dir="/tmp"))
    taken: set[int] = set()
    gcs, dash, client = _ports(3, taken)
    cluster = LocalCluster(f"127.0.0.1:{gcs}", f"http://127.0.0.1:{dash}", tmp)
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    try:
        args, metrics = _node_args(head, taken)
        _spawn(cluster, cli, head.name, [
            "--head", f"--port={gcs}", "--include-dashboard=true",
            "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
            f"--temp-dir={tmp}", *args], env, preexec_fn)
        (first,) = _wait_nodes(cluster, set(), timeout_s)
        _record(cluster, head.name, first, metrics)
        known = {first["node_id"]}
        for node in nodes:                    # one at a time: raylets starting together time out
            args, metrics = _node_args(node, taken)
            _spawn(cluster, cli, node.name, [f"--address={cluster.address}", *args], env, preexec_fn)
            (new,) = _wait_nodes(cluster, known, timeout_s)
            _record(cluster, node.name, new, metrics)
            known.add(new["node_id"])
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _record(cluster: LocalCluster, name: str, node: dict[str, Any], metrics_port: int) -> None:
    cluster.node_ids[name] = str(node["node_id"])
    cluster.metrics_urls[name] = f"http://{node['node_ip']}:{metrics_port}/metrics"


def _spawn(cluster: LocalCluster, cli: str, name: str, args: list[str], env: dict[str, str],
           preexec_fn: Callable[[], None] | None) -> None:
    log = cluster.temp_dir / f"ray-start-{name}.log"
    with open(log, "wb") as out:
        cluster._procs.append(subprocess.Popen(
            [cli, "start", "--block", "--disable-usage-stats", *args], stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True, env=env, preexec_fn=preexec_fn))


def _wait_nodes(cluster: LocalCluster, known: set[str], timeout_s: float) -> list[dict[str, Any]]:
    """Wait for one ALIVE node not in ``known``; return the new ones."""
    end, last = time.monotonic() + timeout_s, ""
    while time.monotonic() < end:
        for proc in cluster._procs:
            if proc.poll() is not None:
                logs = sorted(cluster.temp_dir.glob("ray-start-*.log"))
                tail = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in logs)
                raise RuntimeError(f"ray start exited with {proc.returncode}: {proc.args!r}\n{tail}")
        try:
            r = httpx.get(f"{cluster.dashboard_url}/api/v0/nodes?limit=100&detail=true", timeout=3)
            nodes = r.json()["data"]["result"]["result"] if r.status_code == 200 else []
            new = [n for n in nodes if n.get("state") == "ALIVE" and n.get("node_id") not in known]
            if new:
                return new
            last = f"{len(nodes)} nodes, none new and alive"
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            last = repr(exc)
        time.sleep(0.5)
    raise RuntimeError(f"local Ray cluster not up after {timeout_s}s: {last}")


def _stop_groups(procs: Sequence[subprocess.Popen[bytes]], grace_s: float) -> None:
    """SIGTERM the process groups we started, SIGKILL what is left after ``grace_s`` (gcs_server
    may ignore TERM); all at once, so stopping takes one grace period, not one per node."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        live = []
        for proc in procs:
            try:
                os.killpg(proc.pid, sig)
                live.append(proc)
            except ProcessLookupError:
                pass
        end = time.monotonic() + grace_s
        while live and time.monotonic() < end:
            live = [p for p in live if _group_alive(p)]
            time.sleep(0.1)
        if not live:
            break
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def _group_alive(proc: subprocess.Popen[bytes]) -> bool:
    proc.poll()
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    return True
