"""The Alibaba GPU trace v2023 replayed with shares of one GPU and again rounded up (issue 19).

    .venv/bin/python -m benchmarks.bench_trace_shares [--quick] [--limit N] [--time-scale X]
        [--shrink K] [--queues hash:8] [--pods-file F]

The trace is imported keeping shares (``gpu_milli`` 460 -> ``gpus_per_pod: 0.46``), arrivals
compressed by ``--time-scale``, on 1/``--shrink`` of the cluster (each node group and each queue's
guarantee cut to 1/K, every max the cut cluster, as benchmarks/bench_eta.py cuts it: the whole
trace asks fewer GPUs at once than its 6,212, so without a cut nothing waits). The other side is
the same scenario with every share rounded up to a whole GPU (``scheduler.traces.round_up_shares``:
the same pods, times, queues and quotas; an import with ``--round-fractions`` would also move the
default quotas, which follow the demand). Both are replayed with the production core
(``run_scenario``), then checked with the independent checkers of tests/replay_rules.py: every
admit's ``devices`` (no device above its whole at any event) and every rule of docs/SCENARIOS.md.

``RESULT <side>.<name> <value>`` lines, side ``shares`` or ``rounded``:

* ``peak_pods``: pods running at once, at the most; ``peak_devices``: devices with any share held;
  ``peak_shared_devices``: devices held in part; ``peak_gpus``: GPUs held by share;
* ``admitted``: workloads admitted at least once; ``preemptions``; ``wait_p50_s`` ... (submit to
  first admit, all workloads admitted);
* ``util_alloc`` / ``util_share``: GPU-seconds held as the replay allocates them (a rounded share
  holds a whole GPU) / as the trace's shares use them, over the cluster's GPUs x the time from the
  first submit to the last admission (while work arrives or waits: after it, the replay only
  drains the trace's weeks-long pods); ``*_makespan`` over the whole replay, as ``gpuq simulate``'s
  ``gpu_utilization`` (which equals ``util_alloc_makespan``);
* ``device_problems`` and ``rule_violations``: what the checkers found (0 and 0);
* ``sim_wall_s``, ``core_wall_s``, ``cycles``.

``RESULT more_pods_at_peak`` is shares' peak minus rounded's.
"""
from __future__ import annotations

import argparse
import copy
import time
from fractions import Fraction
from typing import Any

from benchmarks.bench_trace_replay import trace_arguments


def result(name: str, value: float | int | str, unit: str = "") -> None:
    v = f"{value:.6g}" if isinstance(value, float) else str(value)
    print(f"RESULT {name} {v} {unit}".rstrip(), flush=True)


def cut(sc: dict[str, Any], shrink: int) -> dict[str, Any]:
    """``sc`` on 1/``shrink`` of each node group (at least one node), guarantees cut with it."""
    if shrink == 1:
        return sc
    sc = copy.deepcopy(sc)
    sc["nodes"] = [dict(n, count=max(1, n["count"] // shrink)) for n in sc["nodes"]]
    total = sum(n["gpus"] * n["count"] for n in sc["nodes"])
    sc["queues"] = {q: dict(v, guaranteed={"gpu": v["guaranteed"]["gpu"] // shrink}, max={"gpu": total})
                    for q, v in sc["queues"].items()}
    return sc


def held_seconds(events: Any, gpus: dict[str, Fraction], since: float, until: float) -> float:
    """GPU-seconds held between ``since`` and ``until``, each workload counted at ``gpus`` (its
    gang's GPUs)."""
    start: dict[str, float] = {}
    total = 0.0
    for e in events:
        if e["event"] == "admit":
            start[e["workload"]] = e["t"]
        elif e["event"] in ("finish", "preempt"):
            t0 = start.pop(e["workload"])
            total += float(gpus[e["workload"]]) * max(min(e["t"], until) - max(t0, since), 0.0)
    for wid, t0 in start.items():
        total += float(gpus[wid]) * max(until - max(t0, since), 0.0)
    return total


def replay(label: str, sc: dict[str, Any], share_of: dict[str, Fraction]) -> dict[str, Any]:
    from scheduler.quality import quality
    from scheduler.simulate import run_scenario
    from scheduler.simulator import parse_scenario
    from tests.replay_rules import check_devices, milli, rule_violations

    t0 = time.perf_counter()
    res = run_scenario(sc)
    wall = time.perf_counter() - t0
    events = list(res.events)
    dev = check_devices(sc, events)
    rules = rule_violations(sc, events)
    parsed = parse_scenario(sc)
    q = quality(parsed.cluster, parsed.workloads, events, res.summary)["(all)"]
    s = res.summary
    gpus = sum(n["gpus"] * n["count"] for n in sc["nodes"])
    first = min(w["submit"] for w in sc["workloads"])
    last = max(e["t"] for e in events if e["event"] == "admit")              # the last start
    span = last - first
    alloc = {w["id"]: Fraction(milli(w["gpus_per_pod"]) * w.get("pods", 1), 1000) for w in sc["workloads"]}
    makespan = s["makespan_s"]
    firsts = {e["workload"] for e in events if e["event"] == "admit"}
    out = {
        "workloads": len(sc["workloads"]), "admitted": len(firsts), "peak_pods": dev.peak_pods,
        "peak_devices": dev.peak_devices, "peak_shared_devices": dev.peak_shared_devices,
        "peak_gpus": dev.peak_gpus_milli / 1000, "preemptions": s["preemptions"],
        "wait_p50_s": float(q["wait_p50_s"] or 0.0), "wait_p90_s": float(q["wait_p90_s"] or 0.0),
        "wait_p99_s": float(q["wait_p99_s"] or 0.0),
        "util_alloc": held_seconds(events, alloc, first, last) / (gpus * span) if span else 0.0,
        "util_share": held_seconds(events, share_of, first, last) / (gpus * span) if span else 0.0,
        "util_alloc_makespan": held_seconds(events, alloc, 0.0, makespan) / (gpus * makespan),
        "util_share_makespan": held_seconds(events, share_of, 0.0, makespan) / (gpus * makespan),
        "gpu_utilization": s["gpu_utilization"], "makespan_s": makespan,
        "device_problems": len(dev.problems), "rule_violations": len(rules),
        "sim_wall_s": wall, "core_wall_s": s["scheduler"]["wall_s"], "cycles": s["scheduler"]["cycles"],
    }
    for k, v in out.items():
        result(f"{label}.{k}", v)
    for p in (dev.problems[:5] + rules):
        print(f"# {label}: {p}", flush=True)
    return out


def cut_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options of a replay of the trace's cut (this one, bench_trace_reclaim): the trace's
    (:func:`benchmarks.bench_trace_replay.trace_arguments`), ``--time-scale``, ``--shrink`` and
    ``--quick``; the caller may add its own before :func:`parse_cut_args`."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    trace_arguments(p)
    p.add_argument("--time-scale", type=float, default=0.0001, help="multiply submit times (default 0.0001)")
    p.add_argument("--shrink", type=int, default=2, help="keep 1/K of each node group (default 2)")
    p.add_argument("--quick", action="store_true", help="the first 400 pods on 1/32 of the cluster")
    return p


def parse_cut_args(p: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """``argv`` read by a :func:`cut_parser`: ``--quick`` is ``--limit 400 --shrink 32``; a
    ``--shrink`` below 1 is refused."""
    args = p.parse_args(argv)
    if args.quick:
        args.limit, args.shrink = 400, 32
    if args.shrink < 1:
        p.error("--shrink must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_cut_args(cut_parser(__doc__), argv)

    from scheduler.traces import load_alibaba_v2023, round_up_shares
    from tests.replay_rules import milli

    imp = load_alibaba_v2023(args.trace_dir, pods_file=args.pods_file, limit=args.limit,
                             assignment=args.queues, time_scale=args.time_scale)
    shares = cut(imp.scenario, args.shrink)
    rounded = round_up_shares(shares)
    gpus = sum(n["gpus"] * n["count"] for n in shares["nodes"])
    print(f"# {args.pods_file}, queues {args.queues}, time scale {args.time_scale}, 1/{args.shrink} of the "
          f"cluster ({gpus} GPUs): {imp.stats.imported} workloads, {imp.stats.kept_fractional} of them "
          f"shares ({float(imp.stats.fractional_gpus):.1f} GPUs; rounded up, {imp.stats.kept_fractional})",
          flush=True)
    share_of = {w["id"]: Fraction(milli(w["gpus_per_pod"]) * w.get("pods", 1), 1000) for w in shares["workloads"]}
    got = {label: replay(label, sc, share_of) for label, sc in (("shares", shares), ("rounded", rounded))}
    result("more_pods_at_peak", got["shares"]["peak_pods"] - got["rounded"]["peak_pods"])
    result("ratio.peak_pods_shares_over_rounded", got["shares"]["peak_pods"] / max(got["rounded"]["peak_pods"], 1))
    ok = all(g["device_problems"] == 0 and g["rule_violations"] == 0 for g in got.values())
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
