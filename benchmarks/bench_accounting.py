"""Accounting at fleet scale: a month of per-queue usage, the "now" view, and a raw idle scan.

    .venv/bin/python -m benchmarks.bench_accounting [--quick] [--raw-rows N] [--repeat N] [--data DIR]

A 10,000-GPU fleet (1,250 nodes of 8: H100, A100, L40S, T4), 300 leaf queues under 30 parents,
and a month of pod churn is generated inside ClickHouse (``INSERT ... SELECT FROM numbers()``):
every node is cut into lanes of 1, 2, 4 or 8 GPUs, and each lane runs pods back to back with a
period of 1, 2, 4 or 8 hours (busy 50..90 % of it), about 1.57 M pods a month, 15 % of them idle.
The month's closed hours go straight into ``accounting_usage_1h`` as ``accounting.rollup`` would
have materialised them (a month of raw samples would be billions of rows), and the last 40
minutes as raw samples (every 15 s) through the real views. ``gpu_allocations_open`` is pruned
once, as the serving process's rollup cycle does every few minutes.

The raw scan uses the same lanes and pods (with the gaps between pods, where DCGM still reports
the GPU but no pod), both activity metrics every 15 s per GPU, and values that vary like real
ones: busy pods at 30..95 % engine activity with a 1 % chance of a dip under the threshold, idle
ones under 2 %. It is written in inserts of 10 M rows (about a dozen parts, as background merges
would leave a live table; merges are then stopped so that they do not compete with the timed
scans), with the per-minute views dropped (raw rows only).

Measured ``--repeat`` times each (best, median and worst printed), against a naive peer measured
once in the same run:
  * month usage per queue (materialised hours + the ragged edges and open hours live)
    vs. a Python loop over the month's allocations (GPU-seconds only);
  * the "now" view (running pods, nodes, pending, idle runs of the last 35 min)
    vs. the same computed in Python from the raw samples and the month's allocations;
  * idle detection scanning N raw gpu_samples rows (10 M with --quick, 100 M by default)
    vs. the pure Python idle_runs over a 1 M-row slice, as rows/s.
"""
from __future__ import annotations

import argparse
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from accounting import store_adapter as sa
from accounting.idle import IdleParams, activity_points, idle_runs
from accounting.intervals import clip, to_aggs
from accounting.model import Window
from accounting.now import NowSnapshot, compute_now
from accounting.queues import parse_queue_config
from accounting.resolve import Resolver
from accounting.rollup import closed_until, prune_open_allocations
from accounting.service import now_view, usage_report
from accounting.usage import usage_rows
from gpuq.store import open_store
from gpuq.store.schema import COLUMNS

NODES, PARENTS, LEAVES_PER = 1250, 30, 10
GPUS = NODES * 8
DAY = 86400
NODE_TYPE = "multiIf(n < 500, 'H100', n < 950, 'A100', n < 1150, 'L40S', 'T4')"
IDLE_POD = "cityHash64(pod) % 100 < 15"


def queue_config() -> Any:
    queues = {f"team{p}": {"guaranteed": {"gpu": 300}, "max": {"gpu": 2000}, "weight": 1 + p % 3,
                           "queues": {f"q{p * LEAVES_PER + i}": {"guaranteed": {"gpu": 30}, "max": {"gpu": 400}}
                                      for i in range(LEAVES_PER)}} for p in range(PARENTS)}
    types = {"H100": {"price_per_hour": 4.0}, "A100": {"price_per_hour": 2.0},
             "L40S": {"price_per_hour": 1.2}, "T4": {"price_per_hour": 0.35}}
    return parse_queue_config({"gpu_types": types, "queues": queues})


def timed(fn: Callable[[], Any], repeat: int = 3) -> tuple[list[float], Any]:
    times, out = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return sorted(times), out


def spread(times: list[float]) -> str:
    """Best, then median and worst: the machine is shared, so the best is the cleanest figure."""
    return f"{times[0]:7.3f} s (median {statistics.median(times):.3f}, worst {times[-1]:.3f}, n={len(times)})"


def lanes(nodes: str) -> str:
    """Node ``n`` split into lanes of 8, 4, 2 or 1 GPUs (by ``n % 4``), each with its period
    (1, 2, 4 or 8 h), phase and queue."""
    return f"""SELECT n, lane, size, {NODE_TYPE} AS model, 3600 * pow(2, cityHash64(n, lane) % 4) AS period,
                cityHash64(n, lane, 'phase') % period AS phase, cityHash64(n, lane, 'q') % {PARENTS * LEAVES_PER} AS q
               FROM (SELECT number AS n, [8, 4, 2, 1][n % 4 + 1] AS size FROM {nodes})
               ARRAY JOIN range(toUInt32(8 / size)) AS lane"""


def pod_name(k: str) -> str:
    return f"concat('job-', toString(q), '-', toString(n), '-', toString(lane), '-', toString({k}))"


def generate_fleet(store: Any, now_s: float) -> None:
    db, start = store.database, int(now_s - 30 * DAY)
    store.command(f"""INSERT INTO {db}.node_events (ts, cluster, node, uid, event, ready, unschedulable, gpu_model,
        gpu_capacity, gpu_allocatable, resource_version)
        SELECT toDateTime64({start}, 3, 'UTC'), 'prod', concat('node-', toString(n)), toString(n), 'SYNC', 1,
               n % 97 = 0, {NODE_TYPE}, 8, 8, '1' FROM (SELECT number AS n FROM numbers({NODES}))""")
    pods = f"""SELECT *, toFloat64({start} - phase + k * period + cityHash64(n, lane, k) % 360) AS s,
                      s + period * (0.5 + (cityHash64(n, lane, k, 'd') % 400) / 1000) AS e, {pod_name('k')} AS pod
               FROM ({lanes(f'numbers({NODES})')}) ARRAY JOIN range(toUInt32(30 * {DAY} / period) + 1) AS k"""
    # the ledger's pod rows (source pod, no gpuq workload id: every one counts, as foreign pods do)
    store.command(f"""INSERT INTO {db}.gpu_allocations ({", ".join(COLUMNS["gpu_allocations"])})
        SELECT 'prod', concat('ns', toString(q % 40)), pod, pod, concat('q', toString(q)), concat('node-', toString(n)),
               model, 'nvidia.com/gpu', size, 0, '', toDateTime64(s, 3, 'UTC'),
               if(e > {now_s}, NULL, toDateTime64(e, 3, 'UTC')), 1, 'pod', '', 'Pod', pod
        FROM ({pods}) WHERE s < {now_s}""", settings={"max_partitions_per_insert_block": 1000})
    # the month's closed hours as accounting.rollup.materialize_hours would have stored them
    closed = int(closed_until(now_s, IdleParams()))
    store.command(f"""INSERT INTO {db}.accounting_usage_1h
        SELECT toDateTime(h, 'UTC'), 'prod', concat('q', toString(q)), concat('ns', toString(q % 40)), model,
               'nvidia.com/gpu', sum(size * (least(e, toFloat64(h + 3600)) - greatest(s, toFloat64(h)))) AS g,
               sum(if({IDLE_POD}, size * (least(e, toFloat64(h + 3600)) - greatest(s, toFloat64(h))), 0)), 5, 1800, now64(3)
        FROM (SELECT *, arrayJoin(range(toUInt32(intDiv(toUInt32(greatest(s, toFloat64({start}))), 3600) * 3600), toUInt32(least(e, toFloat64({closed}))), 3600)) AS h
              FROM ({pods}) WHERE s < {closed})
        GROUP BY h, q, model""")
    store.command(f"""INSERT INTO {db}.accounting_hours SELECT toDateTime(h, 'UTC'), now64(3)
        FROM (SELECT arrayJoin(range(toUInt32(intDiv({start}, 3600) * 3600 + 3600), toUInt32({closed}), 3600)) AS h)""")
    # the last 40 minutes as raw samples (through the 1m and 1h views), for the now view
    recent = f"""SELECT * FROM ({pods}) WHERE s < {now_s} AND e > {now_s} - 2400"""
    store.command(f"""INSERT INTO {db}.gpu_samples
        SELECT toDateTime64(t, 3, 'UTC'), 'prod', concat('node-', toString(n)),
               concat('GPU-', toString(n), '-', toString(lane * size + g)), 0, model, '', '', pod,
               concat('ns', toString(q % 40)), 'main', 'DCGM_FI_DEV_GPU_UTIL', if({IDLE_POD}, 1, 70), 'dcgm'
        FROM ({recent}) ARRAY JOIN range(size) AS g
        ARRAY JOIN range(toUInt32(greatest(s, toFloat64({now_s} - 2400))), toUInt32(least(e, toFloat64({now_s}))), 15) AS t""")
    store.command(f"""INSERT INTO {db}.pod_events (ts, cluster, namespace, pod, uid, event, phase, node, gpus, queue)
        SELECT toDateTime64({now_s} - 60 * number, 3, 'UTC'), 'prod', 'ns1', concat('wait-', toString(number)),
               concat('wait-', toString(number)), 'ADDED', 'Pending', '', 8, concat('q', toString(number % 300))
        FROM numbers(500)""")


def generate_raw(store: Any, rows: int, now_s: float, block_rows: int = 10_000_000) -> None:
    """``rows`` samples ending at ``now_s``: per 15 s step, both activity metrics for every GPU.
    Row ``number`` is (step, metric, GPU) = (number / 20000, number / 10000 % 2, number % 10000)."""
    db = store.database
    for view in ("gpu_samples_1m_mv", "gpu_activity_1h_mv"):
        store.command(f"DROP VIEW IF EXISTS {db}.{view}")       # a scratch database: raw rows only
    steps = rows // (GPUS * 2)
    t0 = int(now_s) - steps * 15
    # GPU g = number % GPUS of node n, in lane (g % 8) / size (the types match lanes(): the hashes
    # give the same periods, phases, queues and pods); a pod while within its lane's busy share
    sample = f"""SELECT number, n, lane, size, {NODE_TYPE} AS model, 3600 * pow(2, cityHash64(n, lane) % 4) AS period,
                    cityHash64(n, lane, 'phase') % period AS phase, cityHash64(n, lane, 'q') % {PARENTS * LEAVES_PER} AS q,
                    {t0} + intDiv(number, {GPUS * 2}) * 15 AS t, intDiv(number, {GPUS}) % 2 = 1 AS prof,
                    toUInt64(intDiv(t - {t0} + phase, period)) AS k,
                    (t - {t0} + phase) - k * period < period * (0.5 + (cityHash64(n, lane, k, 'd') % 400) / 1000) AS held,
                    if(held, {pod_name('k')}, '') AS pod, cityHash64(number) AS r
                 FROM (SELECT number, intDiv(number % {GPUS}, 8) AS n, [8, 4, 2, 1][n % 4 + 1] AS size,
                              toUInt32(intDiv(number % 8, size)) AS lane FROM numbers({{off}}, {{n}}))"""
    value = f"""multiIf(pod = '', 0, {IDLE_POD}, if(prof, (r % 200) / 10000, r % 4),
                       r % 100 = 0, if(prof, 0.01, 2), if(prof, 0.3 + (r % 650) / 1000, 40 + r % 61))"""
    for off in range(0, rows, block_rows):
        n = min(block_rows, rows - off)
        store.command(f"""INSERT INTO {db}.gpu_samples
            SELECT toDateTime64(t, 3, 'UTC'), 'prod', concat('node-', toString(n)), concat('GPU-', toString(number % {GPUS})),
                   number % 8, model, '', '', pod, if(pod = '', '', concat('ns', toString(q % 40))), 'main',
                   if(prof, 'DCGM_FI_PROF_GR_ENGINE_ACTIVE', 'DCGM_FI_DEV_GPU_UTIL'), {value}, 'dcgm'
            FROM ({sample.format(off=off, n=n)})""",
                      settings={"max_partitions_per_insert_block": 1000, "min_insert_block_size_rows": block_rows,
                                "min_insert_block_size_bytes": 0, "max_insert_block_size": block_rows,
                                "max_block_size": 65536})
    store.command(f"""INSERT INTO {db}.gpu_allocations ({", ".join(COLUMNS["gpu_allocations"])})
        SELECT 'prod', concat('ns', toString(q % 40)), pod, pod, concat('q', toString(q)), concat('node-', toString(n)),
               model, 'nvidia.com/gpu', size, 0, '', toDateTime64(s, 3, 'UTC'), if(e > {now_s}, NULL, toDateTime64(e, 3, 'UTC')), 1,
               'pod', '', 'Pod', pod
        FROM (SELECT *, {t0} - phase + k * period AS s, s + period * (0.5 + (cityHash64(n, lane, k, 'd') % 400) / 1000) AS e,
                     {pod_name('k')} AS pod
              FROM ({lanes(f'numbers({NODES})')}) ARRAY JOIN range(toUInt32({steps * 15} / period) + 2) AS k)
        WHERE s < {now_s}""")


def settle(store: Any, timeout_s: float = 120.0) -> float:
    """Wait for the background merges of the freshly generated data (they would compete with the
    timed queries for the 2 cores); returns the seconds waited."""
    t = time.perf_counter()
    while time.perf_counter() - t < timeout_s:
        if not store.query("SELECT count() FROM system.merges WHERE database = {d:String}", {"d": store.database}).rows[0][0]:
            break
        time.sleep(0.5)
    return time.perf_counter() - t


def rss_mib(field: str = "VmHWM") -> float:
    """Peak (``VmHWM``, since the last :func:`reset_peak`) or current (``VmRSS``) resident set, MiB
    (chDB runs in this process); the process's lifetime peak where /proc is not there."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_accounting")
    ap.add_argument("--quick", action="store_true", help="10 M raw rows instead of 100 M")
    ap.add_argument("--raw-rows", type=int, default=None)
    ap.add_argument("--repeat", type=int, default=5, help="timed runs of each fast path (3 for the 100 M scan)")
    ap.add_argument("--data", default=None, help="chDB data directory (default: a temporary one)")
    a = ap.parse_args(argv)
    raw_rows = a.raw_rows or (10_000_000 if a.quick else 100_000_000)
    data = a.data or tempfile.mkdtemp(prefix="bench_acc_")
    now = float(int(time.time()) // 60 * 60)
    config, params = queue_config(), IdleParams()
    resolver = Resolver(config)

    store = open_store(f"chdb://{data}?database=fleet", ttl_days=365)
    t = time.perf_counter()
    generate_fleet(store, now)
    db = store.database
    n_alloc = store.query(f"SELECT count() FROM {db}.gpu_allocations").rows[0][0]
    n_hour = store.query(f"SELECT count() FROM {db}.accounting_usage_1h").rows[0][0]
    print(f"fleet: {GPUS} GPUs, {PARENTS * LEAVES_PER} leaf queues, {n_alloc:,} pods in 30 days, "
          f"{n_hour:,} materialised hourly rows; generated in {time.perf_counter() - t:.1f} s")
    t = time.perf_counter()
    pruned = prune_open_allocations(store, now)
    n_open = store.query(f"SELECT count() FROM {db}.gpu_allocations_open").rows[0][0]
    print(f"gpu_allocations_open pruned to {n_open:,} rows ({pruned:,} pods ended over a day ago) in "
          f"{time.perf_counter() - t:.1f} s (once; each later rollup cycle prunes minutes' worth); "
          f"merges settled in {settle(store):.1f} s")

    month = Window(now - 30 * DAY, now)
    fast, rows = timed(lambda: usage_report(store, config, month, now, ["queue"], params), a.repeat)

    def python_month() -> Any:
        allocs = sa.read_allocations(store, month, now)
        return usage_rows(to_aggs(clip(allocs, month, now)), resolver, ["queue"])
    slow, prow = timed(python_month, repeat=1)
    assert abs(sum(r.gpu_seconds for r in rows) - sum(r.gpu_seconds for r in prow)) < 1e-3 * sum(r.gpu_seconds for r in rows)
    print(f"month usage per queue (rollups):  {spread(fast)}   {len(rows)} rows   goal < 0.5 s")
    print(f"  peer: Python loop over allocs:  {slow[0]:7.3f} s   ratio {slow[0] / fast[0]:5.1f}x (best)")

    fast_now, view = timed(lambda: now_view(store, config, now, params), a.repeat)

    def python_now() -> Any:
        allocs = sa.read_allocations(store, month, now)
        raw = store.query(f"""SELECT cluster, node, gpu_uuid, mig_instance, namespace, pod, toUnixTimestamp64Milli(ts)/1000,
                              metric, value FROM {db}.gpu_samples WHERE ts >= fromUnixTimestamp64Milli({{f:Int64}}, 'UTC')""",
                          {"f": int((now - 2160) * 1000)}).rows
        snap = NowSnapshot(now, tuple(allocs), tuple(sa.read_nodes(store, now)), tuple(sa.read_pending(store, now)),
                           idle_runs(activity_points(raw), params))
        return compute_now(snap, resolver, params)
    slow_now, pview = timed(python_now, repeat=1)
    root = next(r for r in view.rows if r.queue == "root" and r.gpu_type == "*")
    proot = next(r for r in pview.rows if r.queue == "root" and r.gpu_type == "*")
    assert (root.allocated, root.idle) == (proot.allocated, proot.idle), (root, proot)
    print(f"now view: {spread(fast_now)}   {len(view.rows)} rows, {root.allocated:.0f} GPUs allocated, "
          f"{root.idle:.0f} idle, free {view.capacity.total.free:.0f}, fragmentation "
          f"{view.capacity.total.fragmentation_ratio:.2f}   goal < 0.2 s")
    print(f"  peer: Python from raw samples:  {slow_now[0]:7.3f} s   ratio {slow_now[0] / fast_now[0]:5.1f}x (best)")
    store.close()
    print(f"peak RSS (fleet, generation included): {rss_mib():,.0f} MiB")

    raw_store = open_store(f"chdb://{data}?database=rawscan", ttl_days=365)
    t = time.perf_counter()
    generate_raw(raw_store, raw_rows, now)
    # background merges of the freshly written parts would compete with the timed scans for the 2
    # cores: stop them (the scans then see the parts as written, a little slower than merged ones)
    raw_store.command(f"SYSTEM STOP MERGES {raw_store.database}.gpu_samples")
    parts = raw_store.query(f"SELECT count() FROM system.parts WHERE database = '{raw_store.database}' "
                            f"AND table = 'gpu_samples' AND active").rows[0][0]
    print(f"raw: {raw_rows:,} gpu_samples rows (10,000 GPUs, 2 metrics, 15 s, {parts} parts) generated in "
          f"{time.perf_counter() - t:.1f} s")
    span = Window(now - raw_rows // (GPUS * 2) * 15, now)
    before = rss_mib("VmRSS")
    reset_peak()
    scan, idle = timed(lambda: sa.read_idle(raw_store, span, now, params, "raw"), 3 if raw_rows > 5e7 else a.repeat)
    print(f"idle scan over raw samples:       {spread(scan)}   {raw_rows / scan[0] / 1e6:6.1f} M rows/s   "
          f"{sum(r.idle_gpu_seconds for r in idle) / 3600:,.0f} idle GPU-hours   goal: 100 M rows < 5 s")
    print(f"  peak RSS during the scans: {rss_mib():,.0f} MiB (resident before them: {before:,.0f} MiB)")
    slice_rows = 1_000_000
    pts = raw_store.query(f"""SELECT cluster, node, gpu_uuid, mig_instance, namespace, pod, toUnixTimestamp64Milli(ts)/1000,
                              metric, value FROM {raw_store.database}.gpu_samples WHERE pod != '' LIMIT {slice_rows}""").rows
    t = time.perf_counter()
    idle_runs(activity_points(pts), params)
    py = time.perf_counter() - t
    print(f"  peer: pure Python idle_runs:    {slice_rows / py / 1e6:6.2f} M rows/s (1 M-row slice, fetch not counted)"
          f"   ratio {(raw_rows / scan[0]) / (slice_rows / py):5.1f}x (best)")
    raw_store.close()
    print(f"peak RSS of the whole run: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
