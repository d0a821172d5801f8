"""`gpuq demo --story quick` end to end with a real local Ray cluster (a head with two L4 and three
worker nodes of logical GPUs), `gpuq serve` with the ray actuator and the served DCGM page: SIGTERM once
the gang is admitted stops everything the demo started (exit 0, no process left that carries the
run's temp dir), and the store it leaves holds the story: prod got its guarantee back by
preemption, the 2 x 4 GPU gang was admitted across two nodes after waiting for its shape, the
idle notebook's GPUs read 0 % in the DCGM samples, and the books balance: every workload whose run
ended (the gang among them) is billed by ``gpuq usage`` the GPU-seconds its runs held by the
scheduler's events. The shares: a Ray job submitted straight to Ray with two tasks of
``num_gpus=0.5`` and an actor of 0.25 is in the ledger as one ``ray_job`` row of 1.25 GPUs in its
queue, and billed share x time, as its driver recorded it, within a collection interval.

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
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from gpuq.demo.session import marked
from gpuq.demo.story import STORIES, billed_as_run
from tests.conftest import die_with_parent

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.ray, pytest.mark.alone]       # make test runs it by itself (Makefile)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def query(cfg: Path, sql: str) -> list[dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "gpuq.cli", "query", "--config", str(cfg), "--format", "json", sql],
                       capture_output=True, text=True, timeout=120, check=True, env=_env())
    rows: list[dict[str, Any]] = json.loads(r.stdout)
    return rows


def usage(cfg: Path, start_s: float, end_s: float) -> dict[str, float]:
    """GPU-seconds per billed workload over [start_s, end_s), by ``gpuq usage``."""
    iso = lambda t: datetime.fromtimestamp(t, UTC).isoformat()   # noqa: E731
    r = subprocess.run([sys.executable, "-m", "gpuq.cli", "usage", "--config", str(cfg), "--from", iso(start_s),
                        "--to", iso(end_s), "--by", "workload", "--format", "json"],
                       capture_output=True, text=True, timeout=120, check=True, env=_env())
    out: dict[str, float] = {}
    for row in json.loads(r.stdout):
        out[row["workload"]] = out.get(row["workload"], 0.0) + float(row["gpu_seconds"])
    return out


def held(events: list[dict[str, Any]], stop_s: float) -> tuple[dict[str, float], dict[str, int], set[str]]:
    """From the scheduler's events: GPU-seconds per workload (each run, admit to its finish, preempt
    or cancel; a run open at the stop counts to ``stop_s``), the most GPUs a run of it held, and the
    workloads with a run that ended."""
    seconds: dict[str, float] = {}
    gpus: dict[str, int] = {}
    ended: set[str] = set()
    open_: dict[str, tuple[float, int]] = {}
    for e in events:
        w = e["workload"]
        if e["event"] == "admit":
            n = sum(e["placement"].values())
            open_[w] = (e["t"], n)
            gpus[w] = max(gpus.get(w, 0), n)
        elif e["event"] in ("finish", "preempt", "cancel") and w in open_:
            t, n = open_.pop(w)
            seconds[w] = seconds.get(w, 0.0) + n * (e["t"] - t)
            ended.add(w)
    for w, (t, n) in open_.items():
        seconds[w] = seconds.get(w, 0.0) + n * max(0.0, stop_s - t)
    return seconds, gpus, ended


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
    before = time.time()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuq.cli", "demo", "--story", "quick", "--duration", "150", "--no-dashboard",
         "--dir", str(root)], cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=die_with_parent)
    lines: list[str] = []
    gang, gang_done, shares_done = threading.Event(), threading.Event(), threading.Event()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "admitted  gang-1" in line:
                gang.set()
            if "finished  gang-1" in line:
                gang_done.set()
            if "ray job  shares-1 succeeded" in line:
                shares_done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert gang.wait(240), "the gang was not admitted:\n" + "".join(lines[-60:])
        assert gang_done.wait(90), "the gang did not finish:\n" + "".join(lines[-60:])
        assert shares_done.wait(60), "the shares' Ray job did not succeed:\n" + "".join(lines[-60:])
        time.sleep(3)                       # a collector round sees its placement group removed
        stop_s = time.time()
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

    # the books: what each workload held by the scheduler's events is what it is billed. Within a
    # collector interval; and a preempted run holds its GPUs until Ray has stopped it (the stop
    # request, SIGTERM, the JobSupervisor actor's exit: 1.5-2 s here, RAY_JOB_STOP_WAIT_TIME_S = 3 s
    # at most for the SIGTERM) and is billed until then (its ray_job row; the collectors' record of
    # the release wins), so it may be billed up to that much more
    interval_s = float(yaml.safe_load(cfg.read_text())["collector"]["interval_s"])
    seconds, gpus, ended = held(events, stop_s)
    billed = usage(cfg, before, stop_s)
    assert "gang-1" in ended and "serve-1" in ended, events
    preempted = {e["workload"] for e in events if e["event"] == "preempt"}
    stop_s_ray = 3.0

    def off(w: str) -> bool:
        over = billed.get(w, 0.0) - seconds[w]
        slack = max(0.1 * seconds[w], interval_s * gpus[w])
        return over < -slack or over > slack + (stop_s_ray * gpus[w] if w in preempted else 0.0)

    wrong = {w: (round(seconds[w], 1), round(billed.get(w, 0.0), 1)) for w in sorted(ended) if off(w)}
    assert not wrong, f"GPU-seconds (scheduler events, billed) per workload: {wrong}; all billed: {billed}"
    assert re.search(r"gang-1 \d+ / \d+", out), out

    # the shares: Ray tasks of half a GPU and an actor of a quarter, outside gpuq's scheduler, are one
    # ray_job row of 1.25 GPUs at most (rows end and open as the sum changes) in the job's queue, and
    # billed share x time as the driver recorded it: every row's start and end are a collector round's
    # (each late by less than an interval), and Ray frees a task's GPU shortly after it returns
    shares = STORIES["quick"].shares
    assert shares is not None
    rows = query(cfg, "SELECT queue, workload_id, max(milli_gpus) AS milli FROM gpu_allocations FINAL "
                      "WHERE source = 'ray_job' AND pod = 'shares-1' GROUP BY queue, workload_id")
    assert rows == [{"queue": "inference", "workload_id": "", "milli": 1250}], rows
    record = json.loads((root / "shares.json").read_text())
    held_s = billed_as_run(record)
    assert held_s >= 0.5 * 2 * shares.hold_s
    assert abs(billed["shares-1"] - held_s) <= shares.gpus * (interval_s + 1.0), (billed["shares-1"], held_s)
    assert re.search(r"ray job shares-1 \(inference; 2 tasks x 0\.5 \+ 1 actor x 0\.25 GPU\): head-l4\(\w+\) "
                     r"up to 1\.25 GPUs at once, billed as shares: \d+ GPU-seconds", out), out
