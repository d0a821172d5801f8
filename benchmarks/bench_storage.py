"""Storage sizing: rows and bytes a day per 1,000 GPUs at a scrape interval, with gpuq's schema.

    .venv/bin/python -m benchmarks.bench_storage [--gpus 1000] [--interval 15] [--minutes 60] [--json]

Writes --minutes of a fleet of --gpus GPUs (8 a node) into a fresh chDB store migrated with the
real schema and codecs, then merges every table (OPTIMIZE FINAL) and reads ``system.parts``:
rows, compressed and uncompressed bytes per table, extrapolated to a day and to 1,000 GPUs
(``system.columns`` has no per-column sizes for chDB's compact parts, so none are shown).

* gpu_samples: the metric set of the recorded dcgm-exporter page (tests/data/dcgm: the 16
  DCGM_FI_DEV_* series of its fullest GPU) plus DCGM_FI_PROF_GR_ENGINE_ACTIVE (idle detection
  reads it), mapped by the collector's own ``gpu_sample_rows``; values move like a GPU's (random
  walks for utilisation, power, temperature, clocks; a rising energy counter; constants for the
  rest), one pod per node, replaced every two hours. The rollups gpu_samples_1m and
  gpu_activity_1h fill through their materialized views.
* ray_resources: 12 series per node (CPU, GPU, memory, object store, accelerator type, node
  resource; used and available) per scrape.
* pod_events, gpu_allocations (+ gpu_allocations_open), scheduler_events, scheduler_state (a
  whole day of them, the day before; they are small): one 8-GPU workload per node every two hours, four pod events, two ledger rows, five scheduler
  events and three state rows each.

Peer for the compression ratio: the same gpu_samples rows in a table without the CODEC clauses
(ClickHouse's default LZ4), and each table's own uncompressed bytes. Peak RSS is the process's
(the chDB engine runs in it). Short runs underestimate the ratio of the time series a little:
DoubleDelta/Gorilla gain with longer runs of one series in a part.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import random
import re
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DCGM_PAGE = REPO / "tests" / "data" / "dcgm" / "datadog-integrations-core-metrics.txt"
GPUS_PER_NODE = 8
POD_HOURS = 2.0
LEDGER = ("pod_events", "gpu_allocations", "gpu_allocations_open", "scheduler_events", "scheduler_state")
TABLES = ("gpu_samples", "gpu_samples_1m", "gpu_activity_1h", "ray_resources", "ray_resources_1m", "pod_events",
          "gpu_allocations", "gpu_allocations_open", "scheduler_events", "scheduler_state")


def metric_set() -> list[str]:
    """The DCGM series one GPU exports on the recorded page (its fullest GPU), + PROF activity."""
    from collector.dcgm import gpu_sample_rows, keep_metric
    from collector.prometheus import parse

    page = parse(DCGM_PAGE.read_text(), keep=keep_metric, source=str(DCGM_PAGE))
    rows = gpu_sample_rows(page, cluster="c", default_node="n", now=dt.datetime.now(dt.UTC)).rows
    per_gpu: dict[str, set[str]] = {}
    for r in rows:
        per_gpu.setdefault(r[3], set()).add(r[11])
    return sorted(max(per_gpu.values(), key=len) | {"DCGM_FI_PROF_GR_ENGINE_ACTIVE"})


def _kind(metric: str) -> str:
    if re.search(r"UTIL|ACTIVE|POWER|TEMP|SM_CLOCK|NVLINK", metric):
        return "walk"
    return "counter" if "ENERGY" in metric else "constant"


class Fleet:
    """Each GPU's series: a value per metric that moves from one scrape to the next."""

    def __init__(self, gpus: int, metrics: list[str], seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.metrics = metrics
        self.gpus = [(f"node-{g // GPUS_PER_NODE:04d}", f"GPU-{g:08x}-5dd7-b823-c0ec20dcf2d5", g % GPUS_PER_NODE)
                     for g in range(gpus)]
        self.state = [[self._start(m) for m in metrics] for _ in self.gpus]

    def _start(self, metric: str) -> float:
        if "UTIL" in metric or "ACTIVE" in metric:
            return self.rng.uniform(0, 100)
        if "TEMP" in metric:
            return float(self.rng.randint(35, 70))
        if "POWER" in metric:
            return self.rng.uniform(60, 650)
        if "CLOCK" in metric:
            return float(self.rng.choice((1410, 1755, 1980)))
        if "FB_" in metric:
            return float(self.rng.randint(0, 81_559))
        if "ENERGY" in metric:
            return float(self.rng.randint(10**9, 10**10))
        return 0.0

    def step(self) -> None:
        rng = self.rng
        for values in self.state:
            for i, m in enumerate(self.metrics):
                k = _kind(m)
                if k == "walk":
                    v = values[i] + rng.gauss(0, 3)
                    values[i] = round(min(max(v, 0.0), 100.0 if "UTIL" in m else 1e4), 0 if "UTIL" in m else 3)
                elif k == "counter":
                    values[i] += rng.randint(4_000, 10_000)


def pod_of(node: str, t: float) -> tuple[str, str]:
    n = int(node.split("-")[1])
    epoch = int((t + n * 97) // (POD_HOURS * 3600))
    return f"ray-worker-{n:04d}-{epoch:06d}", f"team-{n % 10}"


def gpu_rows(fleet: Fleet, t: float) -> list[tuple[Any, ...]]:
    """One scrape of every GPU, through the collector's mapping (collector.dcgm.gpu_sample_rows)."""
    from collector.dcgm import gpu_sample_rows
    from collector.prometheus import Sample

    now = dt.datetime.fromtimestamp(t, dt.UTC)
    samples = []
    for (node, uuid, idx), values in zip(fleet.gpus, fleet.state):
        pod, ns = pod_of(node, t)
        labels = {"gpu": str(idx), "UUID": uuid, "device": f"nvidia{idx}", "modelName": "NVIDIA H100 80GB HBM3",
                  "Hostname": node, "pod": pod, "namespace": ns, "container": "ray-worker"}
        samples += [Sample(m, labels, v, None) for m, v in zip(fleet.metrics, values)]
    return gpu_sample_rows(samples, cluster="prod", default_node="", now=now).rows


def ray_rows(nodes: int, t: float, rng: random.Random) -> list[tuple[Any, ...]]:
    ts = dt.datetime.fromtimestamp(t, dt.UTC)
    out = []
    for n in range(nodes):
        node = f"10.0.{n // 256}.{n % 256}"
        for res, total in (("CPU", 96.0), ("GPU", 8.0), ("memory", 1.6e12), ("object_store_memory", 2e11),
                           ("accelerator_type:H100", 1.0), (f"node:{node}", 1.0)):
            used = total if res.startswith(("accel", "node")) else round(rng.uniform(0, total), 1)
            out += [(ts, "prod", node, res, "used", used), (ts, "prod", node, res, "available", total - used)]
    return out


def ledger_rows(nodes: int, t0: float, seconds: float) -> dict[str, list[tuple[Any, ...]]]:
    """One 8-GPU workload per node every POD_HOURS: its pod events, ledger and scheduler rows."""
    def ts(x: float) -> dt.datetime:
        return dt.datetime.fromtimestamp(x, dt.UTC)

    out: dict[str, list[tuple[Any, ...]]] = {k: [] for k in ("pod_events", "gpu_allocations", "scheduler_events",
                                                             "scheduler_state")}
    seq = 0
    for n in range(nodes):
        node = f"node-{n:04d}"
        start = t0 - (n * 97) % (POD_HOURS * 3600)
        while start < t0 + seconds:
            pod, ns = pod_of(node, start + 1)
            uid = f"{n:04d}-{int(start):010d}-4a5b-9c8d-0123456789ab"
            end = start + POD_HOURS * 3600
            q, wl = f"research.{ns}", f"wl-{uid[:15]}"
            for i, (ev, phase) in enumerate((("ADDED", "Pending"), ("MODIFIED", "Running"),
                                             ("MODIFIED", "Succeeded"), ("DELETED", "Succeeded"))):
                at = start + (0, 5, POD_HOURS * 3600 - 5, POD_HOURS * 3600)[i]
                out["pod_events"].append((ts(at), "prod", ns, pod, uid, ev, phase, node if i else "", 8.0,
                                          "nvidia.com/gpu", "NVIDIA-H100-80GB-HBM3", q, 0, pod[:-7], "worker",
                                          str(10**6 + seq + i)))
            for v, e in ((1, None), (2, ts(end))):
                out["gpu_allocations"].append(("prod", ns, pod, uid, q, node, "NVIDIA-H100-80GB-HBM3",
                                               "nvidia.com/gpu", 8.0, 0, pod[:-7], ts(start), e, v, "pod", wl,
                                               "RayJob", wl))
            for i, ev in enumerate(("submit", "admit", "finish")):
                seq += 1
                at = start + (0, 1, POD_HOURS * 3600)[i]
                out["scheduler_events"].append((ts(at), "prod", at, seq, ev, wl, q, "H100",
                                                {node: 8} if ev == "admit" else {}, "", "",
                                                '{"gpus": 8, "gpu_type": "H100"}' if ev == "submit" else "",
                                                {node: 8000} if ev == "admit" else {}, "", 0.0))
                out["scheduler_state"].append(("prod", wl, seq, int(ev == "finish"), ts(at),
                                               json.dumps([[seq, ev, ""]])))
            start = end
    return out


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def measure(gpus: int, interval: float, minutes: float, root: Path) -> dict[str, Any]:
    from gpuq.store import COLUMNS, open_store

    store = open_store(f"chdb://{root / 'data'}?database=sizing")
    db = store.database
    metrics = metric_set()
    fleet = Fleet(gpus, metrics)
    nodes = math.ceil(gpus / GPUS_PER_NODE)
    t0 = float(int(time.time()) // 3600 * 3600 - 6 * 3600)      # recent: inside every retention
    scrapes = int(minutes * 60 // interval)
    rng = random.Random(11)
    began = time.perf_counter()
    batch: list[tuple[Any, ...]] = []
    for k in range(scrapes):
        t = t0 + k * interval
        batch += gpu_rows(fleet, t)
        fleet.step()
        store.insert("ray_resources", ray_rows(nodes, t, rng), COLUMNS["ray_resources"])
        if len(batch) >= 200_000 or k == scrapes - 1:
            store.insert("gpu_samples", batch, COLUMNS["gpu_samples"])
            batch = []
    for table, rows in ledger_rows(nodes, t0 - 86_400, 86_400).items():      # a whole day: small
        store.insert(table, rows, COLUMNS[table])
    write_s = time.perf_counter() - began
    # the peer: gpu_samples without its CODEC clauses (default LZ4)
    ddl = store.query(f"SHOW CREATE TABLE {db}.gpu_samples").rows[0][0]
    plain = re.sub(r" CODEC\((?:[^()]|\([^()]*\))*\)", "", ddl).replace(f"{db}.gpu_samples", f"{db}.gpu_samples_lz4", 1)
    store.command(plain)
    store.command(f"INSERT INTO {db}.gpu_samples_lz4 SELECT * FROM {db}.gpu_samples")
    for table in (*TABLES, "gpu_samples_lz4"):
        store.command(f"OPTIMIZE TABLE {db}.{table} FINAL")
    parts = {r[0]: r[1:] for r in store.query(
        "SELECT table, sum(rows), sum(data_compressed_bytes), sum(data_uncompressed_bytes) FROM system.parts "
        "WHERE database = {db:String} AND active GROUP BY table", {"db": db}).rows}
    store.close()
    day = 86_400 / (scrapes * interval)
    per_k = 1000 / gpus
    tables = {}
    for t in (*TABLES, "gpu_samples_lz4"):
        rows, comp, unc = (int(x) for x in parts.get(t, (0, 0, 0)))
        # hourly rollups hold a row per hour: a short run covers some hours partly, so scale by hours
        if t in LEDGER:
            scale = per_k                                      # written for a whole day
        elif t.endswith("_1h"):
            scale = 24 / max(1, math.ceil(scrapes * interval / 3600)) * per_k
        else:
            scale = day * per_k
        tables[t] = {"rows": rows, "compressed_bytes": comp, "uncompressed_bytes": unc,
                     "rows_per_day_per_1000_gpus": round(rows * scale),
                     "compressed_mib_per_day_per_1000_gpus": round(comp * scale / 2**20, 1),
                     "ratio": round(unc / comp, 1) if comp else None,
                     "bytes_per_row": round(comp / rows, 2) if rows else None}
    total = sum(v["compressed_mib_per_day_per_1000_gpus"] for k, v in tables.items() if k != "gpu_samples_lz4")
    return {"gpus": gpus, "interval_s": interval, "minutes": minutes, "metrics_per_gpu": len(metrics),
            "metrics": metrics, "write_s": round(write_s, 1), "peak_rss_mib": round(rss_mib()), "tables": tables,
            "total_compressed_mib_per_day_per_1000_gpus": round(total, 1),
            "codecs_vs_lz4": round(tables["gpu_samples_lz4"]["compressed_bytes"]
                                   / max(1, tables["gpu_samples"]["compressed_bytes"]), 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--interval", type=float, default=15.0)
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.gpus < 1 or a.interval <= 0 or a.minutes * 60 < a.interval:
        ap.error("--gpus >= 1, --interval > 0 and --minutes covering one scrape at least")
    with tempfile.TemporaryDirectory() as tmp:
        r = measure(a.gpus, a.interval, a.minutes, Path(tmp))
    if a.json:
        print(json.dumps(r))
        return 0
    print(f"{r['gpus']} GPUs, {r['metrics_per_gpu']} DCGM series a GPU, every {r['interval_s']:g} s, "
          f"{r['minutes']:g} min written in {r['write_s']} s; peak RSS {r['peak_rss_mib']} MiB")
    print(f"{'table':24} {'rows/day/1k GPUs':>18} {'MiB/day/1k GPUs':>16} {'bytes/row':>10} {'ratio':>6}")
    for t, v in r["tables"].items():
        print(f"{t:24} {v['rows_per_day_per_1000_gpus']:>18,} {v['compressed_mib_per_day_per_1000_gpus']:>16} "
              f"{v['bytes_per_row']!s:>10} {v['ratio']!s:>6}")
    print(f"total (without the LZ4 peer): {r['total_compressed_mib_per_day_per_1000_gpus']} MiB/day per 1,000 GPUs; "
          f"gpu_samples with default LZ4 takes {r['codecs_vs_lz4']}x the bytes of gpuq's codecs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
