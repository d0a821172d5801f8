"""The Alibaba GPU trace v2023 replayed end to end through the simulator.

    .venv/bin/python -m benchmarks.bench_trace_replay [--limit N] [--time-scale X] [--queues hash:8]
        [--round-fractions]

Steps, each timed: import the trace (``scheduler.traces``), replay it with ``run_scenario`` (the
production core on a simulated clock), and replay it again with preemption disabled. A peer is
measured in the same run: a naive FIFO scheduler written here (one workload at a time in submit
order, first-fit on the nodes of the first acceptable type that has room, no quotas, the head
blocks the line), fed the same workloads; then the baselines of ``gpuq simulate --baseline``
(``scheduler.baselines``) replay it on the simulator's clock and ``quality.<policy>.<metric>``
lines give the quality metrics (``scheduler.quality``, "(all)") of each and of the core. Lines
starting ``RESULT`` are the figures:
``RESULT <name> <value> [unit]``.

``--time-scale`` compresses arrivals (0.01 = 100x the load; the real trace keeps a 6,212-GPU
cluster about 0.3% busy, so at 1.0 every pod starts at once). The import keeps the trace's shares
of one GPU (``gpus_per_pod: 0.46``); ``--round-fractions`` rounds them up to whole GPUs as the
import did before issue 19. The FIFO peer knows whole GPUs only: a share takes a whole GPU there.
benchmarks/bench_trace_shares.py sets the two side by side on a cluster where GPUs run short.
"""
from __future__ import annotations

import argparse
import heapq
import resource
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "tests" / "data" / "traces" / "alibaba-gpu-v2023"


def result(name: str, value: float | str, unit: str = "") -> None:
    v = f"{value:.6g}" if isinstance(value, float) else str(value)
    print(f"RESULT {name} {v} {unit}".rstrip(), flush=True)


def fifo_replay(scenario: dict[str, Any]) -> dict[str, float]:
    """The naive peer: a global FIFO by (submit, file order); at each event time it starts the
    head while it fits (first-fit over nodes in file order, type by type in preference order)
    and stops at the first head that does not. Returns admissions, makespan, mean wait, wall."""
    t0 = time.perf_counter()
    free: list[int] = []
    types: list[str] = []
    for n in scenario["nodes"]:
        for _ in range(n.get("count", 1)):
            free.append(n["gpus"])
            types.append(n["gpu_type"])
    by_type: dict[str, list[int]] = {}
    for i, t in enumerate(types):
        by_type.setdefault(t, []).append(i)
    order = list(by_type)
    work = sorted(enumerate(scenario["workloads"]), key=lambda x: (x[1]["submit"], x[0]))
    ends: list[tuple[float, int, list[tuple[int, int]]]] = []
    queue: list[dict[str, Any]] = []
    nxt, now, admitted, wait_sum, seq, makespan = 0, 0.0, 0, 0.0, 0, 0.0

    def place(w: dict[str, Any]) -> list[tuple[int, int]] | None:
        per_pod, pods = max(w.get("gpus_per_pod", 1), 1), w.get("pods", 1)     # a share: a whole GPU
        for t in w.get("gpu_types") or order:
            taken: list[tuple[int, int]] = []
            left = pods
            for i in by_type.get(t, ()):
                k = min(left, free[i] // per_pod)
                if k > 0:
                    taken.append((i, k * per_pod))
                    left -= k
                if left == 0:
                    return taken
        return None

    while nxt < len(work) or queue or ends:
        t_sub = work[nxt][1]["submit"] if nxt < len(work) else float("inf")
        t_end = ends[0][0] if ends else float("inf")
        now = min(t_sub, t_end)
        while ends and ends[0][0] <= now:
            _, _, held = heapq.heappop(ends)
            for i, g in held:
                free[i] += g
        while nxt < len(work) and work[nxt][1]["submit"] <= now:
            queue.append(work[nxt][1])
            nxt += 1
        while queue:
            taken = place(queue[0])
            if taken is None:
                break
            w = queue.pop(0)
            for i, g in taken:
                free[i] -= g
            admitted += 1
            wait_sum += now - w["submit"]
            seq += 1
            heapq.heappush(ends, (now + w["duration"], seq, taken))
            makespan = max(makespan, now + w["duration"])
        if queue and not ends and nxt >= len(work):
            break   # the head can never fit: stop (the scheduler would have rejected it)
    return {"admitted": admitted, "makespan_s": makespan, "mean_wait_s": wait_sum / max(admitted, 1),
            "wall_s": time.perf_counter() - t0}


def _mean_wait(events: tuple[dict[str, Any], ...]) -> float:
    sub: dict[str, float] = {}
    waits: list[float] = []
    for e in events:
        if e["event"] == "submit":
            sub[e["workload"]] = e["t"]
        elif e["event"] == "admit" and e["workload"] in sub:
            waits.append(e["t"] - sub.pop(e["workload"]))
    return sum(waits) / max(len(waits), 1)


def trace_arguments(p: argparse.ArgumentParser) -> None:
    """The options every replay of the trace takes (this one, bench_trace_shares, bench_trace_reclaim):
    where the trace is, which pod list, how many of its pods, how they are assigned to queues."""
    p.add_argument("--trace-dir", default=str(TRACE))
    p.add_argument("--pods-file", default="openb_pod_list_default.csv")
    p.add_argument("--limit", type=int)
    p.add_argument("--queues", default="hash:8")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    trace_arguments(p)
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply submit times")
    p.add_argument("--duration-scale", type=float, default=1.0, help="multiply running times")
    p.add_argument("--round-fractions", action="store_true", help="round shares of one GPU up to whole GPUs")
    args = p.parse_args(argv)

    from scheduler.simulate import run_scenario
    from scheduler.traces import load_alibaba_v2023

    t0 = time.perf_counter()
    imp = load_alibaba_v2023(args.trace_dir, pods_file=args.pods_file, limit=args.limit,
                             assignment=args.queues, time_scale=args.time_scale,
                             duration_scale=args.duration_scale, round_fractions=args.round_fractions)
    import_s = time.perf_counter() - t0
    sc = imp.scenario
    print(f"# {args.pods_file}, queues {args.queues}, time scale {args.time_scale}, duration scale {args.duration_scale}, "
          f"shares {'rounded up' if args.round_fractions else 'kept'}: {imp.stats.imported} workloads, {sum(n['count'] for n in sc['nodes'])} nodes, "
          f"{sum(n['gpus'] * n['count'] for n in sc['nodes'])} GPUs", flush=True)
    result("workloads", imp.stats.imported)
    result("import_wall_s", import_s, "s")

    runs: dict[str, Any] = {}
    for label, preemption in (("preemption_on", True), ("preemption_off", False)):
        scenario = dict(sc, scheduler={"preemption": preemption})
        t0 = time.perf_counter()
        res = run_scenario(scenario)
        wall = time.perf_counter() - t0
        runs[label] = (res, wall)
        s = res.summary
        admits = sum(1 for e in res.events if e["event"] == "admit")
        core = s["scheduler"]["wall_s"]
        result(f"{label}.sim_wall_s", wall, "s")
        result(f"{label}.scheduler_wall_s", core, "s")
        result(f"{label}.cycles", s["scheduler"]["cycles"])
        result(f"{label}.admissions", admits)
        result(f"{label}.admissions_per_s_core", admits / core if core else 0.0, "1/s")
        result(f"{label}.admissions_per_s_sim", admits / wall if wall else 0.0, "1/s")
        result(f"{label}.preemptions", s["preemptions"])
        result(f"{label}.gpu_utilization", s["gpu_utilization"])
        result(f"{label}.makespan_s", s["makespan_s"], "s")
        result(f"{label}.mean_wait_s", _mean_wait(res.events), "s")

    fifo = fifo_replay(sc)
    result("fifo.wall_s", fifo["wall_s"], "s")
    result("fifo.admissions", int(fifo["admitted"]))
    result("fifo.admissions_per_s", fifo["admitted"] / fifo["wall_s"] if fifo["wall_s"] else 0.0, "1/s")
    result("fifo.makespan_s", fifo["makespan_s"], "s")
    result("fifo.mean_wait_s", fifo["mean_wait_s"], "s")

    # the baselines of `gpuq simulate --baseline` (scheduler.baselines) on the simulator's clock,
    # with the quality metrics of scheduler.quality, next to the core's
    from scheduler.baselines import POLICIES
    from scheduler.quality import quality
    from scheduler.simulator import parse_scenario
    from scheduler.simulator.engine import simulate

    parsed = parse_scenario(dict(sc, scheduler={"preemption": True}))
    core_res = runs["preemption_on"][0]
    for label, res in (("core", core_res), *((n, simulate(parsed, f)) for n, f in POLICIES.items())):
        q = quality(parsed.cluster, parsed.workloads, res.events, res.summary)["(all)"]
        for m in ("wait_p50_s", "wait_p90_s", "wait_p99_s", "stranded_gpu_hours", "guarantee_violation_s"):
            result(f"quality.{label}.{m}", float(q[m] or 0.0))
        result(f"quality.{label}.preemptions", int(q["preemptions"]))

    on, off = runs["preemption_on"][1], runs["preemption_off"][1]
    result("ratio.sim_wall_preemption_on_over_off", on / off if off else 0.0)
    result("ratio.sim_wall_over_fifo_wall", on / fifo["wall_s"] if fifo["wall_s"] else 0.0)
    result("peak_rss_mib", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
