"""The ledger with Kueue's reservations (``queues_from: kueue``): a day's usage per workload through
``accounting.sql.LEDGER_KUEUE`` (a reservation counted for what of it is not seen yet, in pieces:
lambdas and ARRAY JOIN) against the plain ``LEDGER`` on the same store (the store without Kueue
rows pays only that), and against the Python path (the rows read, ``accounting.ledger.dedup``,
then clipped and summed), measured in the same run; the GPU-seconds of the SQL and the Python paths
must agree. Peak RSS at the end.

    PYTHONPATH=$PWD .venv/bin/python -m benchmarks.bench_ledger_kueue [--gangs 5000] [--foreign 200000] [--quick]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

from accounting import sql
from accounting import store_adapter as sa
from accounting.intervals import clip
from accounting.model import Window
from benchmarks.bench_accounting import rss_mib, spread, timed
from gpuq.store import open_store
from gpuq.store.schema import COLUMNS

DAY = 86_400


def generate(store: Any, now_s: float, gangs: int, foreign: int) -> None:
    """``gangs`` Kueue Workloads over the last day: a reservation of 4 pods x 2 GPUs, its pods
    started on two of 500 nodes 0 to 5 minutes after it one by one, a placement group beside some;
    ``foreign`` pods with no workload over the same day."""
    db, start = store.database, int(now_s - DAY)
    cols = ", ".join(COLUMNS["gpu_allocations"])
    rows = f"""SELECT number AS n, toFloat64({start} + cityHash64(n) % {DAY - 3600}) AS s,
                      s + 600 + cityHash64(n, 'd') % 7200 AS e, concat('kueue/ns', toString(n % 40), '/w', toString(n)) AS wid
               FROM numbers({gangs})"""
    store.command(f"""INSERT INTO {db}.gpu_allocations ({cols})
        SELECT 'prod', concat('ns', toString(n % 40)), concat('w', toString(n)), concat(wid, '@', toString(toUInt64(s * 1000))),
               concat('lq', toString(n % 20)), '', 'H100', 'nvidia.com/gpu', 8, 0, '', toDateTime64(s, 3, 'UTC'),
               if(e > {now_s}, NULL, toDateTime64(e, 3, 'UTC')), 1, 'kueue', wid, 'RayJob', concat('w', toString(n))
        FROM ({rows})""")
    store.command(f"""INSERT INTO {db}.gpu_allocations ({cols})
        SELECT 'prod', concat('ns', toString(n % 40)), concat('w', toString(n), '-', toString(k)),
               concat('w', toString(n), '-', toString(k)), concat('lq', toString(n % 20)),
               concat('node-', toString((n * 2 + intDiv(k, 2)) % 500)), 'H100', 'nvidia.com/gpu', 2, 0, '',
               toDateTime64(s + 1 + (cityHash64(n, k) % 300), 3, 'UTC'), if(e > {now_s}, NULL, toDateTime64(e, 3, 'UTC')),
               1, 'pod', wid, 'RayJob', concat('w', toString(n))
        FROM ({rows}) ARRAY JOIN range(4) AS k""")
    store.command(f"""INSERT INTO {db}.gpu_allocations ({cols})
        SELECT 'prod', 'other', concat('f', toString(number)), concat('f', toString(number)), 'batch',
               concat('node-', toString(number % 500)), 'H100', 'nvidia.com/gpu', 1, 0, '',
               toDateTime64({start} + cityHash64(number) % {DAY}, 3, 'UTC'),
               toDateTime64({start} + cityHash64(number) % {DAY} + 60 + number % 3600, 3, 'UTC'), 1, 'pod', '', 'Pod', ''
        FROM numbers({foreign})""")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="bench_ledger_kueue")
    ap.add_argument("--gangs", type=int, default=5_000)
    ap.add_argument("--foreign", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="500 gangs and 20,000 foreign pods")
    a = ap.parse_args(argv)
    if a.quick:
        a.gangs, a.foreign = 500, 20_000
    now = float(int(time.time()) // 60 * 60)
    store = open_store(f"chdb://{tempfile.mkdtemp(prefix='bench_lk_')}?database=lk", ttl_days=365)
    generate(store, now, a.gangs, a.foreign)
    n = store.query(f"SELECT count() FROM {store.database}.gpu_allocations").rows[0][0]
    day = Window(now - DAY, now)
    assert sa.ledger_sql(store) == sql.LEDGER_KUEUE
    rows = sa.read_usage(store, day, now)            # what gpuq reads (and a warm-up)

    def usage(ledger: str) -> Any:
        text = sql.USAGE.replace("@LEDGER@", ledger).replace("@ALLOC@", sa.alloc_table(store, day))
        return sa._q(store, text, {**sa._window(day, now), "by_workload": 1})
    kueue, base = [], []
    for _ in range(a.repeat):                        # alternating, the same query but for the ledger
        kueue += timed(lambda: usage(sql.LEDGER_KUEUE), 1)[0]
        base += timed(lambda: usage(sql.LEDGER), 1)[0]
    kueue.sort()
    base.sort()

    def python() -> float:
        return sum(i.gpu_seconds for i in clip(sa.read_allocations(store, day, now), day, now))
    py, py_total = timed(python, 1)
    total = sum(r.gpu_seconds for r in rows)
    assert abs(total - py_total) < 1e-6 * total, (total, py_total)
    reserved = sum(r.gpu_seconds for r in rows if r.workload.startswith("kueue/"))
    print(f"{n:,} allocation rows: {a.gangs:,} Kueue gangs (4 pods x 2 GPUs on two nodes, started one by one) "
          f"and {a.foreign:,} foreign pods; a day's usage per workload, {len(rows):,} rows, "
          f"{total / 3600:,.0f} GPU-h ({reserved / 3600:,.0f} GPU-h Kueue's)")
    print(f"  LEDGER_KUEUE (the store holds Kueue rows): {spread(kueue)}")
    print(f"  LEDGER (plain, same store; pieces not cut): {spread(base)}   Kueue's cost {kueue[0] / base[0]:5.2f}x (best)")
    print(f"  peer: Python path (read rows, dedup, clip): {py[0]:7.3f} s   ratio {py[0] / kueue[0]:5.1f}x (best); "
          f"same GPU-seconds")
    print(f"peak RSS: {rss_mib():,.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
