"""Prometheus text parser: collector.prometheus.parse against prometheus_client, in the same run.

    .venv/bin/python -m benchmarks.bench_parser [--quick] [--rounds N] [--fixtures DIR]

Pages: the recorded Ray node page and the dcgm-exporter page from tests/data. Each round
calls prometheus_client's ``text_string_to_metric_families`` (fully consumed) and ours once per
page, interleaved so both see the same machine load; each contender's fastest call counts (the
least disturbed one, as timeit advises; the machine is shared). samples/s = samples per page /
that time. Also times ``keep`` with five metric names against prometheus_client plus a filter.

The last line is ``RESULT parser ratio=...``; the exit status is 1 when the ratio is under 10.
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from collector.prometheus import FAMILY_SUFFIXES, parse

GATE = 10.0
DEFAULT_FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "data"
PAGES = ("ray/ray-2.60-head-idle-4gpu.prom", "dcgm/datadog-integrations-core-metrics.txt")
KEEP = frozenset(
    {"ray_resources", "ray_node_mem_used", "ray_grpc_server_req_process_time_ms", "DCGM_FI_DEV_GPU_UTIL",
     "DCGM_FI_DEV_FB_USED"}
)


def reference(text: str) -> int:
    return sum(len(family.samples) for family in text_string_to_metric_families(text))


def reference_keep(text: str) -> int:
    wanted = KEEP | {n + s for n in KEEP for s in FAMILY_SUFFIXES}
    return sum(1 for f in text_string_to_metric_families(text) for s in f.samples if s.name in wanted)


def seconds(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def measure(text: str, rounds: int) -> dict[str, float]:
    """Best seconds per page for each contender: one call each per round, interleaved, so both get
    as many tries at an undisturbed moment on a shared machine."""
    contenders: dict[str, Callable[[], object]] = {
        "theirs": lambda: reference(text),
        "ours": lambda: parse(text),
        "theirs_keep": lambda: reference_keep(text),
        "ours_keep": lambda: parse(text, keep=KEEP),
    }
    best = dict.fromkeys(contenders, float("inf"))
    for _ in range(rounds):
        for name, fn in contenders.items():
            best[name] = min(best[name], seconds(fn))
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a short run (8 rounds)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 40, --quick 8)")
    ap.add_argument("--fixtures", type=Path, default=DEFAULT_FIXTURES)
    args = ap.parse_args(argv)
    rounds = args.rounds or (8 if args.quick else 40)

    texts = {}
    for rel in PAGES:
        path = args.fixtures / rel
        if not path.is_file():
            print(f"missing fixture {path} (tests/data, part of the repository); nothing measured", file=sys.stderr)
            return 2
        texts[rel] = path.read_text()

    print(
        f"python {platform.python_version()}, prometheus_client {version('prometheus_client')}, "
        f"{platform.machine()}, {rounds} rounds"
    )
    total = {"samples": 0.0, "kept": 0.0, "theirs": 0.0, "ours": 0.0, "theirs_keep": 0.0, "ours_keep": 0.0}
    for rel, text in texts.items():
        page = parse(text)
        n, kept = len(page), len(parse(text, keep=KEEP))
        if page.errors or n != reference(text) or kept != reference_keep(text):
            print(f"{rel}: disagreement with prometheus_client; not measured", file=sys.stderr)
            return 3
        t = measure(text, rounds)
        total["samples"] += n
        total["kept"] += kept
        for name, seconds in t.items():
            total[name] += seconds
        print(
            f"{rel}: {len(text.splitlines())} lines, {n} samples | "
            f"prometheus_client {n / t['theirs']:,.0f} samples/s ({t['theirs'] * 1e3:.2f} ms) | "
            f"ours {n / t['ours']:,.0f} samples/s ({t['ours'] * 1e3:.3f} ms) | "
            f"ratio {t['theirs'] / t['ours']:.1f}x | keep {len(KEEP)} names ({kept} samples): "
            f"{t['ours_keep'] * 1e3:.3f} ms, ratio {t['theirs_keep'] / t['ours_keep']:.1f}x"
        )

    ratio = total["theirs"] / total["ours"]
    keep_ratio = total["theirs_keep"] / total["ours_keep"]
    ours = total["samples"] / total["ours"]
    theirs = total["samples"] / total["theirs"]
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"both pages: keep ratio {keep_ratio:.1f}x (ours with keep vs prometheus_client + filter)")
    print(
        f"RESULT parser ratio={ratio:.1f}x ours={ours:.0f} samples/s prometheus_client={theirs:.0f} "
        f"samples/s keep_ratio={keep_ratio:.1f}x peak_rss_mib={peak_rss_mib:.0f}"
    )
    if ratio < GATE:
        print(f"FAIL: ratio {ratio:.1f}x is under the {GATE:.0f}x gate", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
