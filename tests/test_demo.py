"""`gpuq demo --story quick` end to end with a real local Ray cluster (a head and three worker
nodes of logical GPUs), `gpuq serve` with the ray actuator and the served DCGM page: SIGTERM once
the gang is admitted stops everything the demo started (exit 0, no process left that carries the
run's temp dir), and the store it leaves holds the story: prod got its guarantee back by
preemption, the 2 x 4 GPU gang was admitted across two nodes after waiting for its shape, and the
idle notebook's GPUs read 0 % in the DCGM samples.

chDB lets one process open a path, so the store is read by `gpuq query` in processes of its own."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpuq.demo.session import marked
from tests.conftest import die_with_parent

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.ray


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def query(cfg: Path, sql: str) -> list[dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "gpuq.cli", "query", "--config", str(cfg), "--format", "json", sql],
                       capture_output=True, text=True, timeout=120, check=True, env=_env())
    rows: list[dict[str, Any]] = json.loads(r.stdout)
    return rows


def holding(needle: str) -> list[str]:
    """Processes whose argv or open files name ``needle`` (Ray's processes log into their temp dir)."""
    out = []
    for pid in marked(needle):
        try:
            out.append(f"{pid}: {Path(f'/proc/{pid}/cmdline').read_bytes()[:200]!r}")
        except OSError:              # gone since: not holding anything
            pass
    return out


def test_demo_tells_the_story_and_sigterm_stops_everything(tmp_path: Path) -> None:
    if not Path(sys.executable).with_name("ray").exists():
        pytest.skip(f"no ray command next to {sys.executable}")
    root = tmp_path / "demo"
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli", "demo", "--story", "quick", "--duration", "150", "--no-dashboard",
         "--dir", str(root)], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=die_with_parent)
    lines: list[str] = []
    gang = threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "admitted  gang-1" in line:
                gang.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert gang.wait(240), "the gang was not admitted:\n" + "".join(lines[-60:])
        time.sleep(2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=90) == 0, "".join(lines[-60:])
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(timeout=10)
    assert proc.stdout is not None
    proc.stdout.close()
    out = "".join(lines)
    temp = re.search(r"temp dir (/tmp/gpuq-demo-\w+)", out)
    assert temp, out
    assert "stopped: gpuq serve, the Ray jobs and nodes" in out
    time.sleep(1)
    assert holding(Path(temp.group(1)).name) == []          # Ray nodes, workers, agents, job drivers
    assert holding(str(root)) == []                          # gpuq serve (its config, store, log)

    cfg = root / "gpuq.yaml"
    events = query(cfg, "SELECT t, event, workload, queue, placement, by, reason FROM scheduler_events "
                        "ORDER BY t, seq")
    preempts = [e for e in events if e["event"] == "preempt" and e["by"] == "serve-1"]
    assert preempts and preempts[0]["queue"] == "research.llm", events
    assert "reclaim guaranteed for prod" in preempts[0]["reason"]
    serve = [e for e in events if e["event"] == "admit" and e["workload"] == "serve-1"]
    assert serve and sum(serve[0]["placement"].values()) == 4          # prod's guarantee, back
    admits = [e for e in events if e["event"] == "admit" and e["workload"] == "gang-1"]
    assert admits and len(admits[0]["placement"]) == 2 and set(admits[0]["placement"].values()) == {4}, events
    submit = next(e["t"] for e in events if e["event"] == "submit" and e["workload"] == "gang-1")
    assert admits[0]["t"] > submit + 3                                   # it waited for its shape
    first = next(e["t"] for e in events if e["event"] == "admit" and e["workload"] == "serve-1")
    assert admits[0]["t"] >= first
    idle = query(cfg, "SELECT count() AS n, max(value) AS top FROM gpu_samples "
                      "WHERE metric = 'DCGM_FI_DEV_GPU_UTIL' AND pod = 'gpuq-nb-1'")
    assert int(idle[0]["n"]) > 0 and float(idle[0]["top"]) == 0.0
    busy = query(cfg, "SELECT min(value) AS low FROM gpu_samples "
                      "WHERE metric = 'DCGM_FI_DEV_GPU_UTIL' AND pod = 'gpuq-llm-3'")
    assert float(busy[0]["low"]) >= 70
    assert "summary (from the store" in out and "gang gang-1: submitted" in out
