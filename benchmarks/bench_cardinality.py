"""The per-target series cap (collector.cardinality.SeriesCap) on an exploding target, in one run:

    .venv/bin/python -m benchmarks.bench_cardinality [--quick] [--series N] [--rounds R]

A dcgm-exporter page whose every line carries a new label value (``pod="req-<i>"``), ``N`` new
series per round for ``R`` rounds, parsed and mapped to rows as the collector does, then admitted
by a cap of 20,000 (the default) and by an uncapped peer (a cap larger than every series) kept
side by side. Reports the memory the cap's state holds after the last round (tracemalloc, each
contender alone), the rows each let through, the cap's time per row against the parse + mapping
time of the same page (its overhead), and the process's peak RSS.

The last line is ``RESULT cardinality ...``; the exit status is 1 when the capped state is not at
least 5x smaller than the uncapped one or the cap costs more than the parse and mapping.
"""
from __future__ import annotations

import argparse
import datetime as dt
import gc
import resource
import sys
import time
import tracemalloc

from collector.cardinality import SeriesCap
from collector.dcgm import gpu_sample_rows, keep_metric
from collector.prometheus import parse

CAP = 20_000


def page(first: int, n: int) -> str:
    return "".join(f'DCGM_FI_DEV_FB_USED{{gpu="{i % 8}",UUID="GPU-{i % 8}",Hostname="n1",'
                   f'pod="req-{i}",namespace="ml"}} {i}\n' for i in range(first, first + n))


def rows_of(text: str) -> list[tuple]:
    now = dt.datetime.now(dt.timezone.utc)
    return gpu_sample_rows(parse(text, keep=keep_metric), cluster="c", default_node="n1", now=now).rows


def run(cap: int, pages: list[list[tuple]], trace: bool) -> tuple[int, int, float]:
    """(state bytes after the last round (with ``trace``), rows let through, admit seconds); times
    are taken untraced (tracemalloc slows allocation)."""
    gc.collect()
    if trace:
        tracemalloc.start()
    sc = SeriesCap(cap, forget_rounds=1_000)
    kept = 0
    admit_s = 0.0
    for page_rows in pages:
        sc.new_round()
        rows = {"gpu_samples": list(page_rows)}
        t0 = time.perf_counter()
        sc.admit("t", rows)
        admit_s += time.perf_counter() - t0
        kept += len(rows["gpu_samples"])
        del rows
    gc.collect()
    state = 0
    if trace:
        state, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    del sc
    return state, kept, admit_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="50,000 series a round, 2 rounds")
    ap.add_argument("--series", type=int, default=None, help="new series per round (default 200,000)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 5)")
    args = ap.parse_args(argv)
    n = args.series or (50_000 if args.quick else 200_000)
    rounds = args.rounds or (2 if args.quick else 5)
    texts = [page(r * n, n) for r in range(rounds)]
    t0 = time.perf_counter()
    pages = [rows_of(t) for t in texts]
    parse_s = time.perf_counter() - t0
    del texts
    total = n * rounds
    capped = run(CAP, pages, trace=True)[:2] + run(CAP, pages, trace=False)[2:]
    uncapped = run(total + 1, pages, trace=True)
    ratio = uncapped[0] / max(capped[0], 1)
    overhead = capped[2] / parse_s
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{rounds} rounds x {n} new series: capped state {capped[0] / 2**20:.1f} MiB, {capped[1]} rows "
          f"let through; uncapped {uncapped[0] / 2**20:.1f} MiB, {uncapped[1]} rows")
    print(f"cap time {capped[2]:.2f}s vs parse+map {parse_s:.2f}s ({1e9 * capped[2] / total:.0f} ns/row)")
    print(f"RESULT cardinality memory_ratio={ratio:.1f}x capped_mib={capped[0] / 2**20:.1f} "
          f"uncapped_mib={uncapped[0] / 2**20:.1f} kept={capped[1]} of {total} "
          f"cap_overhead={overhead:.2f} peak_rss_mib={rss:.0f}")
    assert capped[1] == CAP and uncapped[1] == total
    return 0 if ratio >= 5 and overhead < 1.0 else 1


if __name__ == "__main__":
    sys.exit(main())
