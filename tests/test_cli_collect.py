"""`gpuq collect`, `gpuq query` and `gpuq migrate` as a user runs them: real subprocesses,
a config file, an embedded chDB store of their own."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import REPO, closed_port, data_path, die_with_parent, free_port
from tests.held_rows import quiesce
from tests.ray_fixtures import Canned, RayHead, http_server_fixture, ray_head_fixture  # noqa: F401


def gpuq(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuq.cli", *args], capture_output=True, text=True,
                          cwd=REPO, timeout=timeout, env={**os.environ, **(env or {})})


def query_json(config: Path, sql: str) -> list[dict[str, Any]]:
    r = gpuq("query", sql, "--format", "json", "--config", str(config))
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def write_config(tmp_path: Path, body: str) -> Path:
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text(f"store:\n  dsn: chdb://{tmp_path}/data\n  spill_dir: {tmp_path}/spill\n{body}")
    return cfg


def test_collect_once_isolates_bad_targets(tmp_path: Path, http_server: Canned) -> None:
    page = data_path("dcgm", "datadog-integrations-core-metrics.txt").read_text()
    good = http_server.set("/good/metrics", page)
    lines = page.splitlines()
    lines.insert(20, 'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-x" 17')       # unterminated labels
    broken = http_server.set("/broken/metrics", "\n".join(lines))
    dead = f"http://127.0.0.1:{closed_port()}/metrics"
    cfg = write_config(tmp_path, f"collector:\n  dcgm:\n    - cluster: lab\n      urls: [{good}, {broken}, {dead}]\n")

    r = gpuq("collect", "--once", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    assert dead in r.stderr and "cannot connect" in r.stderr          # the failed target, named
    assert "line 21" in r.stderr                                         # the malformed line, numbered

    rows = query_json(cfg, "SELECT node, count() AS n FROM gpu_samples GROUP BY node ORDER BY node")
    counts = {row["node"]: row["n"] for row in rows}
    # both readable pages landed: every host of the page, each row twice (good and broken page);
    # the dead target added nothing, the broken page lost only its malformed line
    assert counts == {"424773df46e0": 32, "551bdf382151": 14, "ip-11111": 2}


def test_query_is_read_only_and_names_the_error(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "")
    r = gpuq("query", "INSERT INTO ray_resources (cluster) VALUES ('x')", "--config", str(cfg))
    assert r.returncode == 2 and "refused at line 1, column 1: 'INSERT' is not a read" in r.stderr
    r = gpuq("query", "SELECT * FROM no_such_table", "--config", str(cfg))
    assert r.returncode == 2 and "no_such_table" in r.stderr


def test_query_formats(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "")
    r = gpuq("query", "SELECT 1 AS a, 'x' AS b", "--format", "csv", "--config", str(cfg))
    assert r.stdout == "a,b\n1,x\n"
    r = gpuq("query", "SELECT 1 AS a, 'x' AS b", "--config", str(cfg))
    assert r.stdout.splitlines()[0].split() == ["a", "b"] and "(1 row)" in r.stdout


def test_broken_config_names_the_key(tmp_path: Path) -> None:
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text("collector:\n  dcgm:\n    - cluster: lab\n      urls: notalist\n")
    r = gpuq("collect", "--once", "--config", str(cfg))
    assert r.returncode == 2
    assert f"{cfg}: collector.dcgm.0.urls" in r.stderr


def test_migrate_twice(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "")
    first = gpuq("migrate", "--config", str(cfg))
    second = gpuq("migrate", "--config", str(cfg))
    assert "applied now: [1" in first.stdout and "applied now: none" in second.stdout


def test_sigterm_flushes_and_exits_promptly(tmp_path: Path, http_server: Canned) -> None:
    """The rows the collector had accepted when SIGTERM came (held in memory: the flush interval
    is an hour) are the rows in the store after it exited."""
    page = data_path("dcgm", "datadog-integrations-core-metrics.txt").read_text()
    url = http_server.set("/metrics", page)
    port = free_port()
    cfg = write_config(tmp_path, f"  batch_interval_s: 3600\ncollector:\n  interval_s: 0.3\n  jitter_s: 0\n"
                                 f"  metrics_port: {port}\n  dcgm:\n    - cluster: lab\n      urls: [{url}]\n")
    proc = subprocess.Popen([sys.executable, "-m", "gpuq.cli", "collect", "--config", str(cfg)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=die_with_parent)

    def metrics() -> str:
        assert proc.poll() is None, f"gpuq collect exited ({proc.returncode}): {proc.communicate()[1]}"
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.HTTPError:
            return ""

    try:
        held = quiesce(metrics, http_server, "/metrics", "lab")
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
        assert proc.returncode == 0, err
        assert time.monotonic() - t0 < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "spilled" not in err, err
    stored = {t: query_json(cfg, f"SELECT count() AS n FROM {t}")[0]["n"] for t in held}
    assert stored == held                         # every accepted row, and only those, flushed on SIGTERM


@pytest.mark.ray
def test_collect_once_against_real_ray(tmp_path: Path, ray_head: RayHead) -> None:
    cfg = write_config(tmp_path, f"collector:\n  ray:\n    - cluster: demo\n      dashboard_url: {ray_head.dashboard_url}\n"
                                 f"      metrics_urls: [{ray_head.metrics_url}]\n")
    r = gpuq("collect", "--once", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    rows = query_json(cfg, "SELECT state, argMax(value, ts) AS v FROM ray_resources WHERE resource = 'GPU' "
                           "GROUP BY state ORDER BY state")
    got = {row["state"]: row["v"] for row in rows}
    assert set(got) == {"AVAILABLE", "USED"}
    assert got["AVAILABLE"] + got["USED"] == 4.0      # the head has 4 logical GPUs
    nodes = query_json(cfg, "SELECT node_ip, is_head FROM ray_nodes FINAL")
    assert nodes and nodes[0]["is_head"] == 1


def test_collect_once_kubernetes_with_queue_mapping(tmp_path: Path) -> None:
    """The Kubernetes watcher as `gpuq collect` wires it: kubeconfig, queue mapping from the
    queue file, rows in pod_events / node_events / gpu_allocations."""
    from tests.k8s_replay import ReplayServer

    queues = tmp_path / "queues.yaml"
    queues.write_text("mapping:\n  namespaces: {team-speech: speech}\n  default: unassigned\n"
                      "queues:\n  speech: {}\n  unassigned: {}\n")
    with ReplayServer.recorded() as api:
        kubeconfig = api.kubeconfig(tmp_path / "kubeconfig")
        cfg = write_config(tmp_path, f"queues_file: {queues}\ncollector:\n  kubernetes:\n"
                                     f"    - cluster: prod\n      kubeconfig: {kubeconfig}\n")
        r = gpuq("collect", "--once", "--config", str(cfg))
    assert r.returncode == 0, r.stderr
    pods = query_json(cfg, "SELECT namespace, pod, queue, gpus FROM pod_events FINAL WHERE gpus > 0")
    queue_of = {p["pod"]: p["queue"] for p in pods}
    assert queue_of["asr-train-0"] == "speech"                 # namespace mapping from the queue file
    assert queue_of["train-resnet-0"] == "vision"              # Kueue label
    assert queue_of["notebook-alice-0"] == "root.nlp.interactive"   # YuniKorn annotation
    allocs = query_json(cfg, "SELECT count() AS n FROM gpu_allocations FINAL")[0]["n"]
    nodes = query_json(cfg, "SELECT count() AS n FROM node_events FINAL")[0]["n"]
    assert allocs > 0 and nodes > 0
    state = query_json(cfg, "SELECT key FROM collector_state FINAL WHERE source = 'kubernetes' ORDER BY key")
    assert {s["key"] for s in state} >= {"nodes", "pods"}
