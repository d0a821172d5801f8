"""What the demo shows: live lines as workloads change state (read from the API), the GPUs the
DCGM page shows (who holds which GPU, busy or idle), and the summary read back from the store
(``gpuq query`` in a process of its own, once ``gpuq serve`` has let go of the chDB path).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx

from gpuq.demo.dcgm import Gpu
from gpuq.demo.story import Shares, billed_as_run


class Watcher:
    """Polls ``/workloads`` and prints a line per change of state, with the story clock."""

    def __init__(self, api: str, labels: dict[str, str], out: Callable[[str], None] = print) -> None:
        self.http = httpx.Client(base_url=api, timeout=5)
        self.labels, self.out = labels, out
        self.states: dict[str, str] = {}
        self.running: list[dict[str, Any]] = []
        self.nodes: list[dict[str, Any]] = []

    def poll(self, t_s: float) -> None:
        try:
            rows = self.http.get("/workloads").json()
            self.nodes = self.http.get("/nodes").json()
        except (httpx.HTTPError, ValueError):
            return
        self.running = [w for w in rows if w["state"] == "running"]
        for w in rows:
            old, new = self.states.get(w["id"]), w["state"]
            self.states[w["id"]] = new
            if old == new:
                continue
            what = f"{w['id']} ({w['queue']}, {_shape(w)})"
            if new == "running":
                where = ", ".join(f"{self.labels.get(n, n)}:{g}" for n, g in (w["placement"] or {}).items())
                self.out(f"t={t_s:6.1f}s  admitted  {what} on {where}")
            elif new == "pending" and old is None and w["reason_code"] == "queued":
                self.out(f"t={t_s:6.1f}s  submitted {what}")
            else:
                why = w.get("message") or w.get("reason_code") or ""
                self.out(f"t={t_s:6.1f}s  {new:9} {what}{': ' + why if why else ''}")

    def close(self) -> None:
        self.http.close()


def _shape(w: dict[str, Any]) -> str:
    types = "/".join(w["gpu_types"]) or "any"
    return f"{w['pods']} x {w['gpus_per_pod']} {types}" if w["pods"] > 1 else f"{w['gpus_per_pod']} {types}"


def gpus(nodes: list[dict[str, Any]], running: list[dict[str, Any]], idle: set[str], tick: int,
         shared: Mapping[str, float] | None = None) -> list[Gpu]:
    """Every GPU of ``nodes`` (the API's ``/nodes``): held ones in admission order, busy 70-95 %
    unless their workload is in ``idle``; free ones at 0 %, but for ``shared`` (node -> GPUs that
    Ray work outside gpuq holds there, the story's shares): as many devices as those shares need
    (1.25 GPUs: 2) read busy, with no pod (dcgm-exporter outside Kubernetes names none)."""
    out: list[Gpu] = []
    held: dict[str, list[str]] = {}
    for w in sorted(running, key=lambda w: (w["start_s"] or 0, w["id"])):
        for node, n in (w["placement"] or {}).items():
            held.setdefault(node, []).extend([w["id"]] * math.ceil(n))
    for nd in nodes:
        node, gpu_type, owners = nd["name"], nd["gpu_type"], held.get(nd["name"], [])
        others = math.ceil((shared or {}).get(node, 0.0))
        for i in range(int(nd["gpus"])):
            wid = owners[i] if i < len(owners) else ""
            busy = (wid and wid not in idle) or (not wid and 0 <= i - len(owners) < others)
            util = 70 + zlib.crc32(f"{wid}/{i}/{tick}".encode()) % 26 if busy else 0
            out.append(Gpu(node, i, gpu_type, float(util), wid))
    return out


def query(config: Path, sql: str) -> list[dict[str, Any]]:
    r = subprocess.run([sys.executable, "-m", "gpuq.cli", "query", "--config", str(config), "--format", "json",
                        sql], capture_output=True, text=True, timeout=120, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"gpuq query failed: {r.stderr.strip()[-500:]}")
    rows: list[dict[str, Any]] = json.loads(r.stdout or "[]")
    return rows


def _usage(config: Path) -> list[dict[str, Any]]:
    """The accounting's usage per queue and workload over the last hour (idle GPU-seconds)."""
    r = subprocess.run([sys.executable, "-m", "gpuq.cli", "usage", "--config", str(config), "--from", "-1h",
                        "--to", "now", "--by", "queue,workload", "--format", "json"],
                       capture_output=True, text=True, timeout=120, check=False)
    try:
        rows: list[dict[str, Any]] = json.loads(r.stdout) if r.returncode == 0 else []
    except ValueError:
        rows = []
    return rows


def held_seconds(events: list[dict[str, Any]]) -> dict[str, float]:
    """GPU-seconds each workload held by the scheduler's events (admit to finish, preempt or cancel),
    for the workloads with no run still open at the end."""
    seconds: dict[str, float] = {}
    open_: dict[str, tuple[float, int]] = {}
    for e in events:
        w = e["workload"]
        if e["event"] == "admit":
            open_[w] = (e["t"], sum(e["placement"].values()))
        elif e["event"] in ("finish", "preempt", "cancel") and w in open_:
            t, n = open_.pop(w)
            seconds[w] = seconds.get(w, 0.0) + n * (e["t"] - t)
    return {w: s for w, s in seconds.items() if w not in open_}


def summary(config: Path, t0_s: float, gang: str, idle: tuple[str, ...], labels: dict[str, str],
            shares: Shares | None = None, shares_record: Path | None = None) -> list[str]:
    """The story read back from ``scheduler_events``, ``gpu_samples`` and the ledger (the shares'
    Ray job)."""
    ev = query(config, "SELECT t, event, workload, queue, placement, by, reason FROM scheduler_events "
                       "ORDER BY t, seq")
    counts: dict[str, int] = {}
    for e in ev:
        counts[e["event"]] = counts.get(e["event"], 0) + 1
    lines = ["events: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
             "admitted: " + ", ".join(f"{e['workload']} t={e['t'] - t0_s:.1f}s"
                                      for e in ev if e["event"] == "admit")]
    for e in ev:
        if e["event"] == "preempt":
            lines.append(f"preempt at t={e['t'] - t0_s:.1f}s: {e['by']} preempted {e['workload']} "
                         f"({e['queue']}): {e['reason']}")
    sub = next((e["t"] for e in ev if e["event"] == "submit" and e["workload"] == gang), None)
    adm = next((e for e in ev if e["event"] == "admit" and e["workload"] == gang), None)
    if sub is not None and adm is not None:
        where = ", ".join(f"{labels.get(n, n)}:{g}" for n, g in adm["placement"].items())
        lines.append(f"gang {gang}: submitted t={sub - t0_s:.1f}s, admitted t={adm['t'] - t0_s:.1f}s "
                     f"(waited {adm['t'] - sub:.1f} s) across {where}")
    elif sub is not None:
        lines.append(f"gang {gang}: submitted t={sub - t0_s:.1f}s, not admitted by the end")
    usage = _usage(config)
    billed: dict[str, float] = {}
    for u in usage:
        billed[u["workload"]] = billed.get(u["workload"], 0.0) + float(u["gpu_seconds"])
    done = held_seconds(ev)
    if done:
        lines.append("GPU-seconds of the finished workloads, scheduler events / billed: "
                     + ", ".join(f"{w} {s:.0f} / {billed.get(w, 0.0):.0f}" for w, s in sorted(done.items())))
    for wid in idle:
        for u in usage:
            if u["workload"] in (wid, f"gpuq-{wid}") and u["gpu_seconds"]:
                lines.append(f"idle: {wid} ({u['queue']}) held {u['gpu_seconds']:.0f} GPU-seconds, "
                             f"{u['idle_gpu_seconds']:.0f} of them idle ({100 * u['idle_ratio']:.0f} %, the accounting)")
        rows = query(config, "SELECT count() AS n, avg(value) AS util FROM gpu_samples "
                             f"WHERE metric = 'DCGM_FI_DEV_GPU_UTIL' AND pod = 'gpuq-{wid}'")
        if rows and int(rows[0]["n"]):
            lines.append(f"idle: {wid}'s GPUs read {float(rows[0]['util']):.0f} % DCGM utilization "
                         f"({rows[0]['n']} samples)")
    if shares is not None:
        lines += shares_lines(config, shares, shares_record, usage, labels)
    return lines


def shares_lines(config: Path, shares: Shares, record_path: Path | None, usage: list[dict[str, Any]],
                 labels: dict[str, str]) -> list[str]:
    """What the ledger holds of the shares' Ray job: the most it held at once (its ``ray_job``
    rows, in milli-GPUs), its queue, and the GPU-seconds ``gpuq usage`` bills it, next to what the
    driver's record says its tasks and actors held (share x time)."""
    rows = query(config, "SELECT node, queue, max(milli_gpus) AS milli FROM gpu_allocations FINAL "
                         f"WHERE source = 'ray_job' AND pod = '{shares.id}' GROUP BY node, queue ORDER BY node")
    if not rows:
        return [f"ray job {shares.id}: not in the ledger (did it run?)"]
    where = ", ".join(f"{labels.get(r['node'], r['node'])} up to {int(r['milli']) / 1000:g}" for r in rows)
    billed = sum(float(u["gpu_seconds"]) for u in usage if u["workload"] == shares.id)
    line = (f"ray job {shares.id} ({rows[0]['queue'] or 'no queue'}; {shares.shape}): {where} GPUs at once, "
            f"billed as shares: {billed:.0f} GPU-seconds")
    try:
        record = json.loads(record_path.read_text()) if record_path is not None else None
    except (OSError, ValueError):
        record = None
    if record:
        held = billed_as_run(record)
        line += f" (its tasks and actor held {held:.0f}: share x time by the driver's clock)"
    return [line]
