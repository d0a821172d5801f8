"""The Alibaba GPU trace v2023 replayed under ``scheduler.reclaim: guarantee`` and ``fair_share``
side by side (issue 21).

    .venv/bin/python -m benchmarks.bench_trace_reclaim [--quick] [--limit N] [--time-scale X]
        [--shrink K] [--queues hash:8] [--pods-file F] [--no-check]

The same cut of the trace as benchmarks/bench_trace_shares.py (shares kept, arrivals compressed by
``--time-scale``, 1/``--shrink`` of each node group and of each queue's guarantee, every max the
cut cluster), replayed twice with the production core (``run_scenario``): the scenario as imported
(``reclaim: guarantee``, the default) and the same with ``scheduler.reclaim: fair_share``, nothing
else changed. The importer's queues have no ``weight``, so every queue weighs 1 and the GPUs beyond
the guarantees (those of queues wanting less than their guarantee, and those the cut's rounding
leaves over) are divided evenly among the queues that want more. Each replay is checked with the
independent checker of tests/replay_rules.py under its own mode's rules (``rule_violations``) and
measured against the same yardstick (``entitlement_shortfall``: the entitlements of that checker,
which do not depend on the mode).

``RESULT <mode>.<name> <value>`` lines, mode ``guarantee`` or ``fair_share``:

* ``preemptions``, ``preemptions_for_entitlement`` (reasons that restore an entitlement above the
  guarantee; 0 under ``guarantee``), ``lost_gpu_hours`` (the summary's ``lost_gpu_seconds``: the
  trace has no checkpoints, so each preemption throws away its whole run);
* ``wait_p50_s`` / ``wait_p90_s`` in all and ``<queue>.wait_p50_s`` / ``<queue>.wait_p90_s`` per
  leaf queue (submit to first admit, scheduler/quality.py);
* ``util_share``: GPU-seconds held by share from the first submit to the last admission over the
  cluster's GPUs x that time (as bench_trace_shares); ``gpu_utilization``: to the makespan;
* ``shortfall_gpu_hours``: GPU-hours the queues held below their entitlement; ``entitled_wait_s``:
  queue-seconds with a workload waiting that would fit within its queue's entitlement and could
  have preempted (tests/replay_rules.py :class:`Shortfall`);
* ``rule_violations`` (0), ``sim_wall_s``, ``core_wall_s``, ``cycles``.

Then ``RESULT peak_rss_mib``: the process's peak resident set (both replays and checks). Exit 1
when a rule is broken. ``--no-check`` skips the checker and the yardstick (the replays alone).
"""
from __future__ import annotations

import copy
import resource
import time
from fractions import Fraction
from typing import Any

from benchmarks.bench_trace_shares import cut, cut_parser, held_seconds, parse_cut_args, result

MODES = ("guarantee", "fair_share")


def with_reclaim(sc: dict[str, Any], mode: str) -> dict[str, Any]:
    """``sc`` with ``scheduler.reclaim: mode``, nothing else changed."""
    out = copy.deepcopy(sc)
    out["scheduler"] = {**(out.get("scheduler") or {}), "reclaim": mode}
    return out


def replay(mode: str, sc: dict[str, Any], check: bool = True) -> dict[str, Any]:
    from scheduler.quality import quality
    from scheduler.simulate import run_scenario
    from scheduler.simulator import parse_scenario
    from tests.replay_rules import entitlement_shortfall, milli, rule_violations

    t0 = time.perf_counter()
    res = run_scenario(sc)
    wall = time.perf_counter() - t0
    events = list(res.events)
    s = res.summary
    parsed = parse_scenario(sc)
    qual = quality(parsed.cluster, parsed.workloads, events, s)
    gpus = sum(n["gpus"] * n["count"] for n in sc["nodes"])
    first = min(w["submit"] for w in sc["workloads"])
    last = max(e["t"] for e in events if e["event"] == "admit")
    share = {w["id"]: Fraction(milli(w["gpus_per_pod"]) * w.get("pods", 1), 1000) for w in sc["workloads"]}
    out: dict[str, Any] = {
        "workloads": len(sc["workloads"]), "preemptions": s["preemptions"],
        "preemptions_for_entitlement": sum(1 for e in events if e["event"] == "preempt"
                                           and e["reason"].startswith("reclaim entitlement")),
        "lost_gpu_hours": float(s.get("lost_gpu_seconds", 0.0)) / 3600,
        "wait_p50_s": float(qual["(all)"]["wait_p50_s"] or 0.0),
        "wait_p90_s": float(qual["(all)"]["wait_p90_s"] or 0.0),
        "util_share": held_seconds(events, share, first, last) / (gpus * (last - first)) if last > first else 0.0,
        "gpu_utilization": s["gpu_utilization"],
    }
    for q, row in qual.items():
        if q != "(all)":
            out[f"{q}.wait_p50_s"] = float(row["wait_p50_s"] or 0.0)
            out[f"{q}.wait_p90_s"] = float(row["wait_p90_s"] or 0.0)
            out[f"{q}.preemptions"] = row["preemptions"]
    if check:
        rules = rule_violations(sc, events)
        short = entitlement_shortfall(sc, events) if not rules else None
        out["rule_violations"] = len(rules)
        for r in rules:
            print(f"# {mode}: {r}", flush=True)
        if short is not None:
            out["shortfall_gpu_hours"] = short.total_gpu_s / 3600
            out["entitled_wait_s"] = short.total_waiting_s
    out.update(sim_wall_s=wall, core_wall_s=s["scheduler"]["wall_s"], cycles=s["scheduler"]["cycles"])
    for k, v in out.items():
        result(f"{mode}.{k}", v)
    return out


def main(argv: list[str] | None = None) -> int:
    p = cut_parser(__doc__)
    p.add_argument("--no-check", action="store_true", help="skip the rule checker and the shortfall")
    args = parse_cut_args(p, argv)

    from scheduler.traces import load_alibaba_v2023

    imp = load_alibaba_v2023(args.trace_dir, pods_file=args.pods_file, limit=args.limit,
                             assignment=args.queues, time_scale=args.time_scale)
    sc = cut(imp.scenario, args.shrink)
    gpus = sum(n["gpus"] * n["count"] for n in sc["nodes"])
    guaranteed = sum(v["guaranteed"]["gpu"] for v in sc["queues"].values())
    print(f"# {args.pods_file}, queues {args.queues}, time scale {args.time_scale}, 1/{args.shrink} of the "
          f"cluster ({gpus} GPUs, {guaranteed} guaranteed): {imp.stats.imported} workloads", flush=True)
    got = {mode: replay(mode, with_reclaim(sc, mode), check=not args.no_check) for mode in MODES}
    result("peak_rss_mib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return 0 if all(g.get("rule_violations", 0) == 0 for g in got.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
