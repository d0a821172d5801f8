"""Scheduler benchmarks (issue 4). ``python -m benchmarks.bench_scheduler [--quick]``

(a) replay: 50,000 workloads over 1,000 leaf queues on 5,000 nodes (40,000 GPUs, 4 types) through
    the simulator; admissions per second of scheduler core time, against a naive Kueue-like
    baseline (one admission per queue per cycle, state rebuilt from the running list each cycle,
    first-fit over all nodes, no preemption, no reasons) measured on the same trace prefix.
(b) one cycle with 10,000 pending workloads on 5,000 nodes (cluster ~90% full): p50/p99 ms, for
    the first cycle (mass admission and preemption), for the steady state after it, for that state
    topped up to exactly 10,000 pending, and for the latter on a cluster without the memos earlier
    cycles leave (a cycle right after a restart).
(c) cycle cost against pending workloads and nodes (not quadratic).
(d) ``--backlog`` (issue 11): 50,000 workloads in 1,000 queues all submitted within a minute on 5,000
    nodes of 8 GPUs, runs of about two minutes, half pinned to one or two GPU types, drained through
    the simulator by today's core and by the frozen pre-issue-11 core
    (:mod:`benchmarks._core_baseline`) in the same run: admissions per second of core time, cycle
    p50/p99 while 50,000 are pending; then the curve of cycle cost from 1,000 to 100,000 pending.
(e) ``--service``: the same backlog submitted to a ``SchedulerService`` (what ``gpuq serve`` runs:
    its snapshot kept between cycles, ``schedule()`` outside the lock, every reason read and kept
    for the API) and to the frozen service cycle of before issue 18 (the snapshot built from every
    entry each cycle, :mod:`benchmarks._service_baseline`), both with today's core, in turn in the
    same run: steady cycles with ~43,000 pending, then busy ones (runs ending, submits, cancels,
    finishes), the whole cycle and the core's share; both must decide and say the same every cycle.
    Each side's peak RSS alone, in a process of its own.
(f) ``--backlog --before PATH``: the drain of (d) with the code of another checkout (``PATH``, e.g.
    ``git worktree add /tmp/before main``) and with this one's, each in a process of its own whose
    ``scheduler`` (and ``accounting``) package is the checkout's, in lockstep: one cycle of each in
    turn, the other process waiting, so that both meet the machine as it is at that moment;
    ``--repeat`` times (3), who goes first alternating. Each side's figures, their medians, the
    ratio of core times per run, and whether every drain wrote the same events. The way to hold a
    change to the core to "within 5 % of the code before" on a shared machine whose speed varies
    more than that from one minute to the next. ``--reclaim fair_share`` (issue 21): this checkout
    drains under ``scheduler.reclaim: fair_share`` (the code before under its only rule), so the
    mode's cost is reported beside the default's; its decisions differ by design (``same_events``).
Peak RSS at the end. Final lines start with ``RESULT``.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import math
import os
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

from accounting.queues import parse_queue_config
from scheduler.cycle import schedule
from scheduler.model import Admission, Decisions, Node, Placement, Running, Workload
from scheduler.ordering import by_queue
from scheduler.placement import FreeIndex
from scheduler.simulator.engine import simulate
from scheduler.simulator.scenario import Scenario
from scheduler.snapshot import Cluster, Settings, Snapshot, build_cluster, demand, snapshot

TYPES = ("H100", "A100", "L40S", "T4")
BACKLOG_POLICY = {"max_priority": 2}      # the workloads' priorities are 0..2 (the queue policy, issue 17)


def backlog_queues(gpus: int, n_parents: int = 20, leaves_per: int = 50) -> dict[str, Any]:
    """The queue tree of the benchmark's clusters: ``n_parents`` orgs of ``leaves_per`` teams, 80%
    of the ``gpus`` guaranteed, each org may grow to a quarter of the cluster, each team to 1/40."""
    leaf_g = gpus * 4 // 5 // (n_parents * leaves_per)
    return {
        f"org{i}": {
            "guaranteed": {"gpu": leaf_g * leaves_per}, "max": {"gpu": gpus // 4},
            "queues": {f"team{j}": {"guaranteed": {"gpu": leaf_g}, "max": {"gpu": gpus // 40}}
                       for j in range(leaves_per)},
        }
        for i in range(n_parents)
    }


def make_cluster(n_nodes: int, n_parents: int = 20, leaves_per: int = 50) -> Cluster:
    queues = backlog_queues(n_nodes * 8, n_parents, leaves_per)
    nodes = [Node(f"{t.lower()}-{i}", t, 8) for t in TYPES for i in range(n_nodes // len(TYPES))]
    return build_cluster(parse_queue_config({"queues": queues, "policy": BACKLOG_POLICY}), nodes)


def make_workload(rng: random.Random, i: int, leaves: tuple[str, ...], submit_s: float) -> Workload:
    pods = rng.choices((1, 2, 4), (7, 2, 1))[0]
    types = rng.choice(((), (), (rng.choice(TYPES),), tuple(rng.sample(TYPES, 2))))
    return Workload(f"w{i}", rng.choice(leaves), pods=pods, gpus_per_pod=rng.choice((1, 2, 4, 8)),
                    gpu_types=types, priority=rng.choice((0, 0, 1, 2)), submit_s=submit_s,
                    duration_s=float(rng.randint(120, 1800)), checkpoint=rng.random() < 0.5)


def make_trace(c: Cluster, n: int, seed: int = 7, load: float = 0.9) -> tuple[Workload, ...]:
    rng = random.Random(seed)
    leaves = c.config.leaves()
    gpus = sum(node.gpus for node in c.nodes)
    rate = load * gpus / (1.5 * 3.75 * 960.0)                 # arrivals/s that keep the load
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        out.append(make_workload(rng, i, leaves, round(t, 3)))
    return tuple(out)


def make_backlog(c: Cluster, n: int, seed: int = 11, within_s: float = 60.0,
                 shares: float = 0.0) -> tuple[Workload, ...]:
    """The backlog shape: ``n`` workloads all submitted within ``within_s``, runs of about two
    minutes (90-150 s), half pinned to one or two GPU types, the rest taking any type. ``shares``:
    that part of the one-GPU workloads ask a share of one GPU instead (0.25 or 0.5, issue 19),
    drawn from a generator of their own, so every other field is the same as without."""
    rng = random.Random(seed)
    frac = random.Random(seed + 1)
    leaves = c.config.leaves()
    subs = sorted(round(rng.uniform(0.0, within_s), 3) for _ in range(n))
    out = []
    for i, t in enumerate(subs):
        pods = rng.choices((1, 2, 4), (7, 2, 1))[0]
        types = (rng.choice(((rng.choice(TYPES),), tuple(rng.sample(TYPES, 2))))
                 if rng.random() < 0.5 else ())
        queue = rng.choice(leaves)                      # drawn in the order they always were
        per_pod: int | Decimal = rng.choice((1, 2, 4, 8))
        if shares and per_pod == 1 and frac.random() < shares:
            per_pod = frac.choice((Decimal("0.25"), Decimal("0.5")))
        out.append(Workload(f"b{i}", queue, pods=pods, gpus_per_pod=per_pod,
                            gpu_types=types, priority=rng.choice((0, 0, 1, 2)), submit_s=t,
                            duration_s=float(rng.randint(90, 150)), checkpoint=rng.random() < 0.5))
    return tuple(out)


class Recorder:
    """A ``schedule_fn`` for the simulator that times each cycle of ``fn`` and notes how many
    were pending and admitted: ``cycles`` is ``(now, pending, admitted, ms)`` per cycle. The
    simulator never reads the reasons; ``read_ms`` is what reading them all (``tuple(d.pending)``,
    as the service does every cycle) cost after each cycle, not counted in ``ms``. ``cpu_s`` is the
    CPU time of the cycles (the thread's): on a shared machine a cycle's wall time also counts the
    time the process waited for a core, its CPU time does not."""

    def __init__(self, fn: Callable[[Snapshot, float], Decisions], gate: Callable[[], None] | None = None) -> None:
        self.fn = fn
        self.gate = gate                   # called before each cycle, outside its timing
        self.cycles: list[tuple[float, int, int, float]] = []
        self.read_ms: list[float] = []
        self.cpu_s = 0.0
        self.result: Any = None            # the simulator's result, once drain() is done

    def __call__(self, snap: Snapshot, now: float) -> Decisions:
        if self.gate is not None:
            self.gate()
        c0 = time.thread_time()
        t0 = time.perf_counter()
        d = self.fn(snap, now)
        t1 = time.perf_counter()
        self.cpu_s += time.thread_time() - c0
        tuple(d.pending)
        self.read_ms.append((time.perf_counter() - t1) * 1000)
        self.cycles.append((now, len(snap.pending), len(d.admissions), (t1 - t0) * 1000))
        return d


def drain(n: int, n_nodes: int, fn: Callable[[Snapshot, float], Decisions],
          until_s: float | None = None, seed: int = 11,
          gate: Callable[[], None] | None = None, shares: float = 0.0,
          reclaim: str | None = None) -> tuple[dict[str, float], Recorder]:
    """Replay the backlog shape of ``n`` workloads on a fresh cluster (fresh memos) with ``fn``;
    ``gate`` is called before each cycle (:class:`Recorder`); ``reclaim``: the mode (issue 21; the
    default settings when ``None``, so a core before it runs this too)."""
    c = make_cluster(n_nodes)
    rec = Recorder(fn, gate)
    settings = Settings() if reclaim is None else Settings(reclaim=reclaim)
    sc = Scenario("backlog", until_s, 1.0, settings, c, make_backlog(c, n, seed, shares=shares))
    gc.collect()
    t0 = time.perf_counter()
    res = simulate(sc, rec)
    wall = time.perf_counter() - t0
    rec.result = res
    admits = sum(1 for e in res.events if e["event"] == "admit")
    core = sum(ms for *_, ms in rec.cycles) / 1000
    return {"admissions": admits, "core_s": core, "wall_s": wall, "cycles": len(rec.cycles),
            "makespan_s": res.summary["makespan_s"], "preemptions": res.summary["preemptions"],
            "util": res.summary["gpu_utilization"]}, rec


def deep_ms(rec: Recorder, depth: int) -> list[float]:
    """Cycle ms (sorted) of the cycles that ran with at least ``depth`` pending."""
    return sorted(ms for _, p, _, ms in rec.cycles if p >= depth)


def backlog_main(quick: bool) -> None:
    from benchmarks._core_baseline.cycle import schedule as schedule_before
    n, n_nodes = (5_000, 500) if quick else (50_000, 5_000)
    print(f"(d) backlog drain: {n} workloads in 1000 leaf queues submitted within 60 s, {n_nodes} nodes "
          f"x 8 GPUs, runs 90-150 s, half pinned to one or two types")
    rows = {}
    for name, fn in (("before", schedule_before), ("now", schedule)):
        r, rec = drain(n, n_nodes, fn)
        deep = deep_ms(rec, int(n * 0.8))
        reads = sorted(x + c[3] for x, c in zip(rec.read_ms, rec.cycles) if c[1] >= int(n * 0.8))
        rows[name] = (r, rec)
        print(f"    {name:<7}", {k: round(v, 3) for k, v in r.items()})
        print(f"RESULT backlog_{name} admissions_per_core_s={r['admissions'] / r['core_s']:.0f} "
              f"cycles={r['cycles']} cycle_mean_ms={r['core_s'] * 1000 / r['cycles']:.1f} "
              f"deep_cycles={len(deep)} deep_p50_ms={pct(deep, 50):.1f} deep_p99_ms={pct(deep, 99):.1f} "
              f"deep_with_reasons_read_p50_ms={pct(reads, 50):.1f} p99_ms={pct(reads, 99):.1f} "
              f"(deep: >= {int(n * 0.8)} pending; goals >= 5000/s, p99 < 50 ms)")
    b_cycles, n_cycles = rows["before"][1].cycles, rows["now"][1].cycles
    same = len(b_cycles) == len(n_cycles) and all(e0[:3] == e1[:3] for e0, e1 in zip(b_cycles, n_cycles))
    print(f"RESULT backlog_same_decisions={same}")
    print("    curve: cycle ms while the backlog is deep (cycles from t=60 s to t=150 s: every queue "
          "submitted, the first runs finishing and freeing capacity)")
    print(f"    {'pending':>8} {'before p50':>11} {'p99':>7} {'now p50':>9} {'p99':>7}")
    depths = (1_000, 5_000, 10_000) if quick else (1_000, 10_000, 50_000, 100_000)
    running = 7_000 * n_nodes // 5_000          # about what the cluster runs at once
    for depth in depths:
        out = []
        for fn in (schedule_before, schedule):
            _, rec = drain(depth + running, n_nodes, fn, until_s=150.0)
            ms = sorted(x for t, _, _, x in rec.cycles if t >= 60.0)
            pend = statistics.median(p for t, p, _, _ in rec.cycles if t >= 60.0)
            out += [pct(ms, 50), pct(ms, 99)]
        print(f"    {pend:>8.0f} {out[0]:>11.1f} {out[1]:>7.1f} {out[2]:>9.1f} {out[3]:>7.1f}")
        print(f"RESULT backlog_curve pending={pend:.0f} before_p50_ms={out[0]:.1f} "
              f"before_p99_ms={out[1]:.1f} now_p50_ms={out[2]:.1f} now_p99_ms={out[3]:.1f}")
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"RESULT peak_rss_mib={rss_mib:.0f}")


def drain_child(quick: bool) -> None:
    """One drain of (d) with this process's core, in lockstep with another (the worker of
    :func:`before_main`): before each cycle it writes ``R`` and waits for ``G`` on its stdin; at
    the end it writes its figures and every cycle's as one ``JSON`` line."""
    def gate() -> None:
        sys.stdout.write("R\n")
        sys.stdout.flush()
        if sys.stdin.readline() != "G\n":
            raise SystemExit("the lockstep parent went away")

    n, n_nodes = (5_000, 500) if quick else (50_000, 5_000)
    r, rec = drain(n, n_nodes, schedule, gate=gate, shares=float(os.environ.get("GPUQ_BENCH_SHARES", "0")),
                   reclaim=os.environ.get("GPUQ_BENCH_RECLAIM") or None)
    res = rec.result
    # the decisions, less each admit's devices (issue 19 added them; the code before has none)
    import scheduler.cycle
    import scheduler.events
    events = res.events_jsonl()
    if hasattr(scheduler.events, "without_devices"):       # this side's code has them
        events = scheduler.events.without_devices(events)
    out = {**r, "core": str(Path(scheduler.cycle.__file__).resolve().parent), "core_cpu_s": rec.cpu_s,
           "cycles_list": rec.cycles, "read_ms": rec.read_ms,
           "events_sha256": hashlib.sha256(events.encode()).hexdigest()}
    sys.stdout.write("JSON " + json.dumps(out) + "\n")
    sys.stdout.flush()


def _lockstep(trees: dict[str, Path], order: tuple[str, str], quick: bool, log: Any,
              shares: float = 0.0, reclaim: str = "guarantee") -> dict[str, dict[str, Any]]:
    """Drain with both cores at once, one cycle at a time: ``order[0]``'s cycle k (and its
    simulator's work up to cycle k + 1), then ``order[1]``'s, then ``order[0]``'s cycle k + 1; the
    other process waits meanwhile, so each pair of cycles meets the machine as it is then."""
    procs = {}
    for name in order:
        env = {**os.environ, "PYTHONPATH": str(trees[name]), "PYTHONHASHSEED": "0",
               "GPUQ_BENCH_SHARES": str(shares if name == "now" else 0.0),
               "GPUQ_BENCH_RECLAIM": reclaim if name == "now" and reclaim != "guarantee" else ""}
        cmd = [sys.executable, str(Path(__file__).resolve()), "--drain-child", *(["--quick"] if quick else [])]
        procs[name] = subprocess.Popen(cmd, env=env, cwd=trees[name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=log, text=True)
    try:
        line = {name: procs[name].stdout.readline() for name in order}  # type: ignore[union-attr]
        rows: dict[str, dict[str, Any]] = {}
        while len(rows) < len(order):
            for name in order:
                if name in rows:
                    continue
                p = procs[name]
                if line[name].startswith("JSON "):
                    rows[name] = json.loads(line[name][5:])
                    continue
                if line[name] != "R\n":
                    raise SystemExit(f"the {name} drain failed ({p.wait()}): see {log.name}")
                p.stdin.write("G\n")  # type: ignore[union-attr]
                p.stdin.flush()  # type: ignore[union-attr]
                line[name] = p.stdout.readline()  # type: ignore[union-attr]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait()
    for name, row in rows.items():
        if row["core"] != str(trees[name] / "scheduler"):
            raise SystemExit(f"the {name} drain ran the core at {row['core']}, not {trees[name]}")
    return rows


def before_main(quick: bool, before: Path, repeat: int, shares: float = 0.0, reclaim: str = "guarantee") -> None:
    """(f): the drain of (d) with the code at ``before`` and with this checkout's, in lockstep
    (:func:`_lockstep`), ``repeat`` times, who goes first alternating. ``shares`` (issue 19):
    this checkout drains the backlog with that part of its one-GPU workloads asking shares, the
    code before the whole backlog (its throughput is the yardstick)."""
    here = Path(__file__).resolve().parents[1]
    trees = {"before": before.resolve(), "now": here}
    if not (trees["before"] / "scheduler" / "cycle.py").is_file():
        raise SystemExit(f"--before: {trees['before']} holds no scheduler/cycle.py (a checkout of gpuq is expected)")
    n = 5_000 if quick else 50_000
    deep_at = int(n * 0.8)
    print(f"(f) backlog drain ({n} workloads), the code at {trees['before']} against {here}"
          f"{'' if reclaim == 'guarantee' else f' under reclaim: {reclaim}'}, in lockstep "
          f"(one cycle of each in turn, each core in its own process), {repeat} times")
    figs: dict[str, list[dict[str, float]]] = {"before": [], "now": []}
    digests: set[str] = set()
    cycles: set[str] = set()
    with tempfile.NamedTemporaryFile("w", prefix="bench-before-", suffix=".log", delete=False) as log:
        for k in range(repeat):
            order = ("before", "now") if k % 2 == 0 else ("now", "before")
            rows = _lockstep(trees, order, quick, log, shares, reclaim)
            for name in ("before", "now"):
                row = rows[name]
                cyc = row["cycles_list"]
                deep = sorted(c[3] for c in cyc if c[1] >= deep_at)
                reads = sorted(c[3] + x for c, x in zip(cyc, row["read_ms"]) if c[1] >= deep_at)
                f = {"admissions_per_core_s": row["admissions"] / row["core_s"], "core_s": row["core_s"],
                     "core_cpu_s": row["core_cpu_s"], "deep_p50_ms": pct(deep, 50), "deep_p99_ms": pct(deep, 99),
                     "read_p50_ms": pct(reads, 50), "read_p99_ms": pct(reads, 99)}
                figs[name].append(f)
                digests.add(row["events_sha256"])
                cycles.add(repr([c[:3] for c in cyc]))
                print(f"    {k + 1}/{repeat} {name:<7} admissions/core s {f['admissions_per_core_s']:.0f} "
                      f"core {f['core_s']:.2f} s (CPU {f['core_cpu_s']:.2f} s), deep p50 {f['deep_p50_ms']:.1f} "
                      f"p99 {f['deep_p99_ms']:.1f} ms, with reasons read p50 {f['read_p50_ms']:.1f} "
                      f"p99 {f['read_p99_ms']:.1f} ms", flush=True)
            print(f"    {k + 1}/{repeat} now/before core {rows['now']['core_s'] / rows['before']['core_s']:.3f} "
                  f"(CPU {rows['now']['core_cpu_s'] / rows['before']['core_cpu_s']:.3f})", flush=True)
    keys = ("admissions_per_core_s", "core_s", "core_cpu_s", "deep_p50_ms", "deep_p99_ms", "read_p50_ms", "read_p99_ms")
    med = {name: {key: statistics.median(f[key] for f in rows) for key in keys} for name, rows in figs.items()}
    for name, m in med.items():
        print(f"RESULT before_after_{name} median_of={repeat} admissions_per_core_s={m['admissions_per_core_s']:.0f} "
              f"core_s={m['core_s']:.2f} core_cpu_s={m['core_cpu_s']:.2f} deep_p50_ms={m['deep_p50_ms']:.1f} "
              f"deep_p99_ms={m['deep_p99_ms']:.1f} read_p50_ms={m['read_p50_ms']:.1f} read_p99_ms={m['read_p99_ms']:.1f}")
    ratios = [a["core_s"] / b["core_s"] for a, b in zip(figs["now"], figs["before"])]
    print(f"RESULT before_after now/before core_s={med['now']['core_s'] / med['before']['core_s']:.3f} "
          f"core_cpu_s={med['now']['core_cpu_s'] / med['before']['core_cpu_s']:.3f} "
          f"per_run_core_s={','.join(f'{r:.3f}' for r in ratios)} "
          f"same_events={len(digests) == 1} same_cycles={len(cycles) == 1}")
    Path(log.name).unlink()


def service_main(quick: bool, shares: float = 0.0) -> None:
    """(e): a service's cycle at depth, today's service against its frozen cycle from before it kept
    its snapshot (:mod:`benchmarks._service_baseline`), both with today's core, in lockstep."""
    import scheduler.service.core as service_core
    from benchmarks._service_baseline import RebuildingService
    from scheduler.actuators.base import DryRunActuator, Target
    from scheduler.service.core import SchedulerService
    n, n_nodes, reps, busy = (5_000, 500, 10, 10) if quick else (50_000, 5_000, 30, 20)
    print(f"(e) service cycle: {n} workloads submitted (the backlog shape), {n_nodes} nodes; {reps} steady cycles "
          f"after the first, then {busy} busy ones (from t=151 s, a cycle a second: the first runs end, 20 "
          f"submits, 10 cancels, 5 finishes between cycles), each side in turn (the first alternating)")
    config = parse_queue_config({"queues": backlog_queues(n_nodes * 8), "policy": BACKLOG_POLICY})
    c = make_cluster(n_nodes)
    backlog = make_backlog(c, n, shares=shares)          # --shares: part of the one-GPU work asks shares
    if shares:
        print(f"    with {shares:.0%} of the one-GPU workloads asking 0.25 or 0.5 GPU (issue 19)")
    core = [0.0]

    def timed_core(snap: Snapshot, now: float) -> Decisions:
        t0 = time.perf_counter()
        d = schedule(snap, now)
        core[0] += time.perf_counter() - t0
        return d

    sides: dict[str, SchedulerService] = {}
    service_core.schedule = timed_core  # type: ignore[assignment]
    try:
        for name, cls in (("before", RebuildingService), ("now", SchedulerService)):
            svc = sides[name] = cls(config, DryRunActuator(), nodes=list(c.nodes), settings=Settings(True, 30.0))
            for w in backlog:
                svc.submit(w, Target(), w.submit_s)
            svc.cycle(61.0)
        times: dict[str, dict[str, list[float]]] = {s: {"steady": [], "busy": [], "core": []} for s in sides}
        same, differ = True, []
        rng = random.Random(13)
        for k in range(reps + busy):
            series = "steady" if k < reps else "busy"
            now = 62.0 + k if k < reps else 151.0 + (k - reps)
            if series == "busy":              # the same changes to both, then the cycle
                pend = sorted(v.id for v in sides["before"].workloads(state="pending"))
                run = sorted(v.id for v in sides["before"].workloads(state="running"))
                cancels, finishes = rng.sample(pend, 10), rng.sample(run, 5)
                fresh = [dataclasses.replace(w, id=f"k{k}-{j}", submit_s=now - 0.5)
                         for j, w in enumerate(rng.sample(backlog, 20))]
                for svc in sides.values():
                    for wid in cancels:
                        svc.cancel(wid, now - 0.5)
                    for wid in finishes:
                        svc.finish(wid, now - 0.5)
                    for w in fresh:
                        svc.submit(w, Target(), now - 0.5)
            order = list(sides) if k % 2 == 0 else list(reversed(sides))
            got = {}
            for name in order:
                gc.collect()
                core[0] = 0.0
                t0 = time.perf_counter()
                got[name] = sides[name].cycle(now, wait=False)     # as gpuq serve: the actions run meanwhile
                times[name][series].append((time.perf_counter() - t0) * 1000)
                times[name]["core"].append(core[0] * 1000)
                sides[name].wait_acting()
            a, b = got["before"], got["now"]
            if (a.admissions, a.preemptions, a.pending) != (b.admissions, b.preemptions, b.pending):
                same = False
                differ.append(f"t={now}: decisions")
            told = [{wid: (e.state, e.reason, e.acting) for wid, e in s._entries.items()} for s in sides.values()]
            if told[0] != told[1]:
                same = False
                differ.append(f"t={now}: {sum(told[0].get(w) != v for w, v in told[1].items())} entries' reasons")
    finally:
        service_core.schedule = schedule  # type: ignore[assignment]
    pending = {name: len(svc.workloads(state="pending", limit=2 * n)) for name, svc in sides.items()}
    for name, t in times.items():
        st, bu, co = sorted(t["steady"]), sorted(t["busy"]), sorted(t["core"][:reps])
        print(f"RESULT service_{name} steady_cycle_p50_ms={pct(st, 50):.1f} steady_cycle_max_ms={st[-1]:.1f} "
              f"steady_core_p50_ms={pct(co, 50):.1f} busy_cycle_p50_ms={pct(bu, 50):.1f} "
              f"busy_cycle_max_ms={bu[-1]:.1f} pending_at_end={pending[name]}")
    ratio = {s: pct(sorted(times["before"][s]), 50) / pct(sorted(times["now"][s]), 50) for s in ("steady", "busy")}
    print(f"RESULT service_ratio before/now steady_p50={ratio['steady']:.2f}x busy_p50={ratio['busy']:.2f}x")
    print(f"RESULT service_same decisions_and_reasons={same}" + (f" ({'; '.join(differ[:5])})" if differ else ""))
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    alone = {}
    for name in sides:                    # each side alone, in a process of its own, for its peak RSS
        cmd = [sys.executable, "-m", "benchmarks.bench_scheduler", "--service-child", name,
               *(["--quick"] if quick else []), "--shares", str(shares)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parents[1]).stdout
        alone[name] = float(out.split("peak_rss_mib=")[1].split()[0])
    print(f"RESULT peak_rss_mib={rss_mib:.0f} (this process, both services) alone: before={alone['before']:.0f} "
          f"now={alone['now']:.0f} (each side's backlog, first cycle and {reps} steady cycles, in a process of its own)")


def service_child(quick: bool, name: str, shares: float = 0.0) -> None:
    """One side of (e) alone: its backlog, its first cycle and the steady cycles; its peak RSS."""
    from benchmarks._service_baseline import RebuildingService
    from scheduler.actuators.base import DryRunActuator, Target
    from scheduler.service.core import SchedulerService
    n, n_nodes, reps = (5_000, 500, 10) if quick else (50_000, 5_000, 30)
    c = make_cluster(n_nodes)
    cls = RebuildingService if name == "before" else SchedulerService
    svc = cls(parse_queue_config({"queues": backlog_queues(n_nodes * 8), "policy": BACKLOG_POLICY}),
              DryRunActuator(), nodes=list(c.nodes), settings=Settings(True, 30.0))
    for w in make_backlog(c, n, shares=shares):
        svc.submit(w, Target(), w.submit_s)
    for k in range(reps + 1):
        svc.cycle(61.0 + k)
    # VmHWM, not ru_maxrss: Linux carries ru_maxrss over from the parent across fork and exec
    with open("/proc/self/status") as f:
        hwm_kib = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    print(f"peak_rss_mib={hwm_kib / 1024:.1f}")


def naive_schedule(snap: Snapshot, now: float) -> Decisions:
    """Kueue-like baseline: rebuild usage from the running list, one head per queue per cycle,
    first fit over every node of a type."""
    c = snap.cluster
    free = [n.gpus for n in c.nodes]
    usage: dict[str, dict[str, int]] = {}
    for r in snap.running:
        for name, n in r.placement.nodes:
            free[c.node_index[name]] -= n
        for q in c.chains[r.workload.queue]:
            d = usage.setdefault(q, {})
            for key, amt in demand(r.workload, r.placement.gpu_type):
                d[key] = d.get(key, 0) + amt
    admissions = []
    groups = by_queue(snap.pending)
    share = {q: usage.get(q, {}).get("gpu", 0) / max(c.guarantee[q]["gpu"], 1) for q in groups}
    for q in sorted(groups, key=lambda q: (share[q], q)):
        w = groups[q][0]
        for t in w.gpu_types or c.types:
            vec = demand(w, t)
            if any(key in c.config.queues[a].max and usage.get(a, {}).get(key, 0) + amt > c.config.queues[a].max[key]
                   for a in c.chains[q] for key, amt in vec):
                continue
            taken: dict[int, int] = {}
            for _ in range(w.pods):
                for i in c.type_nodes[t]:
                    if free[i] - taken.get(i, 0) >= w.gpus_per_pod:
                        taken[i] = taken.get(i, 0) + w.gpus_per_pod
                        break
                else:
                    break
            if sum(taken.values()) < w.gpus:
                continue
            for i, n in taken.items():
                free[i] -= n
            for a in c.chains[q]:
                d = usage.setdefault(a, {})
                for key, amt in vec:
                    d[key] = d.get(key, 0) + amt
            admissions.append(Admission(w, Placement(t, tuple((c.nodes[i].name, n) for i, n in sorted(taken.items())))))
            break
    return Decisions(now, tuple(admissions), (), ())


def replay(c: Cluster, trace: tuple[Workload, ...], fn: Callable[[Snapshot, float], Decisions],
           preemption: bool = True) -> dict[str, float]:
    sc = Scenario("bench", None, 1.0, Settings(preemption=preemption), c, trace)
    t0 = time.perf_counter()
    res = simulate(sc, fn)
    wall = time.perf_counter() - t0
    admits = sum(1 for e in res.events if e["event"] == "admit")
    waits = [w for q in res.summary["queues"].values() for w in [q["wait_p50_s"]] if w is not None]
    return {"admissions": admits, "core_s": res.summary["scheduler"]["wall_s"], "wall_s": wall,
            "cycles": res.summary["scheduler"]["cycles"], "makespan_s": res.summary["makespan_s"],
            "preemptions": res.summary["preemptions"], "util": res.summary["gpu_utilization"],
            "median_queue_wait_p50_s": statistics.median(waits) if waits else 0.0}


def loaded_snapshot(c: Cluster, n_pending: int, seed: int = 3, fill: float = 0.9) -> Snapshot:
    rng = random.Random(seed)
    leaves = c.config.leaves()
    ix = FreeIndex(c, tuple(n.gpus for n in c.nodes))
    target = fill * sum(n.gpus for n in c.nodes)
    running, used, i = [], 0, 0
    while used < target and i < 10 * len(c.nodes):
        w = make_workload(rng, i, leaves, 0.0)
        i += 1
        p = ix.place(w.gpu_types[0] if w.gpu_types else rng.choice(TYPES), w.gpus_per_pod, w.pods)
        if p is not None:
            running.append(Running(w, p, float(rng.randint(0, 90))))
            used += w.gpus
    pending = [make_workload(rng, i + j, leaves, 50.0 + j * 1e-3) for j in range(n_pending)]
    return snapshot(c, running, pending, Settings())


def after(snap: Snapshot, d: Decisions, now: float) -> Snapshot:
    gone = {v for p in d.preemptions for v in p.victims}
    started = {a.workload.id for a in d.admissions}
    running = [r for r in snap.running if r.workload.id not in gone]
    running += [Running(a.workload, a.placement, now) for a in d.admissions]
    pending = [w for w in snap.pending if w.id not in started]
    pending += [r.workload for r in snap.running if r.workload.id in gone]
    return snapshot(snap.cluster, running, pending, snap.settings)


def settled(snap: Snapshot, n_pending: int, now: float, seed: int = 5) -> Snapshot:
    """``snap`` topped up with new arrivals to ``n_pending`` pending workloads, cycle after cycle at
    ``now``, until a cycle starts nothing: a steady state at that many pending."""
    rng = random.Random(seed)
    leaves = snap.cluster.config.leaves()
    for k in range(20):
        top = [make_workload(rng, 10**6 * (k + 1) + j, leaves, 60.0 + j * 1e-3)
               for j in range(n_pending - len(snap.pending))]
        snap = snapshot(snap.cluster, snap.running, (*snap.pending, *top), snap.settings)
        d = schedule(snap, now)
        if not d.admissions:
            break
        snap = after(snap, d, now)
    return snap


def cold(snap: Snapshot) -> Snapshot:
    """The same snapshot on a copy of its cluster without the memos earlier cycles left (static
    fits, the last reason of each workload): a cycle right after a restart."""
    return dataclasses.replace(snap, cluster=dataclasses.replace(snap.cluster, memo=type(snap.cluster.memo)()))


def timed(snap: Snapshot, now: float, reps: int, fresh: bool = False) -> list[float]:
    """Wall ms of ``reps`` cycles on ``snap``, sorted; ``fresh``: each on a :func:`cold` copy. The
    garbage of what ran before (building snapshots, other series) is collected first, so a full
    collection it would trigger is not charged to these cycles; their own garbage is."""
    gc.collect()
    out = []
    for _ in range(reps):
        s = cold(snap) if fresh else snap
        t0 = time.perf_counter()
        schedule(s, now)
        out.append((time.perf_counter() - t0) * 1000)
    return sorted(out)


def pct(xs: list[float], p: float) -> float:
    """The ``p``-th percentile of sorted ``xs`` (nan when empty: a drain with shares may never be
    that deep)."""
    if not xs:
        return math.nan
    return xs[min(len(xs) - 1, round((len(xs) - 1) * p / 100))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (about a tenth)")
    ap.add_argument("--backlog", action="store_true", help="only (d): the backlog drain and the depth curve")
    ap.add_argument("--service", action="store_true", help="only (e): a service's cycle at the backlog's depth")
    ap.add_argument("--before", type=Path, metavar="PATH",
                    help="with --backlog, (f): the drain in lockstep with the gpuq checkout at PATH and with this one")
    ap.add_argument("--repeat", type=int, default=3, help="(f): lockstep drains (default 3)")
    ap.add_argument("--shares", type=float, default=0.0, metavar="P",
                    help="(f): this checkout's backlog has part P of its one-GPU workloads ask shares (the code before: "
                         "none); (e): both services' backlog (issue 19)")
    ap.add_argument("--reclaim", choices=("guarantee", "fair_share"), default="guarantee",
                    help="(f): the mode this checkout drains under (issue 21; the code before: its only rule)")
    ap.add_argument("--drain-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--service-child", choices=("before", "now"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.drain_child:
        drain_child(args.quick)
        return
    if args.service_child:
        service_child(args.quick, args.service_child, args.shares)
        return
    if args.before is not None:
        if not args.backlog:
            ap.error("--before goes with --backlog")
        before_main(args.quick, args.before, args.repeat, args.shares, args.reclaim)
        return
    if args.backlog:
        backlog_main(args.quick)
        return
    if args.service:
        service_main(args.quick, args.shares)
        return
    n_work, n_nodes, n_pending, reps = (5_000, 500, 1_000, 10) if args.quick else (50_000, 5_000, 10_000, 30)
    n_base = n_work // 5
    c = make_cluster(n_nodes)
    trace = make_trace(c, n_work)
    print(f"(a) replay {n_work} workloads, {len(c.config.leaves())} leaf queues, {n_nodes} nodes "
          f"({sum(n.gpus for n in c.nodes)} GPUs, {len(TYPES)} types)")
    ours = replay(c, trace, schedule)
    print("    gpuq     ", {k: round(v, 3) for k, v in ours.items()})
    ours_p = replay(c, trace[:n_base], schedule)
    base = replay(c, trace[:n_base], naive_schedule, preemption=False)
    print(f"    first {n_base} workloads: gpuq", {k: round(v, 3) for k, v in ours_p.items()})
    print(f"    first {n_base} workloads: naive", {k: round(v, 3) for k, v in base.items()})
    rate, rate_p, rate_b = (r["admissions"] / r["core_s"] for r in (ours, ours_p, base))
    print(f"RESULT replay_admissions_per_core_s={rate:.0f} (goal >= 5000) workloads={n_work} "
          f"core_s={ours['core_s']:.2f} sim_wall_s={ours['wall_s']:.2f}")
    print(f"RESULT replay_vs_naive ratio={rate_p / rate_b:.1f}x (gpuq {rate_p:.0f}/s vs naive {rate_b:.0f}/s "
          f"on the first {n_base}; makespan {ours_p['makespan_s']:.0f} s vs {base['makespan_s']:.0f} s)")

    c = make_cluster(n_nodes)
    snap = loaded_snapshot(c, n_pending)
    first = timed(snap, 100.0, max(3, reps // 3))
    d = schedule(snap, 100.0)
    steady_snap = after(snap, d, 100.0)
    steady = timed(steady_snap, 101.0, reps)
    print(f"(b) one cycle: {len(snap.pending)} pending, {len(snap.running)} running, {n_nodes} nodes; first cycle "
          f"admits {len(d.admissions)} and preempts for {len(d.preemptions)}")
    print(f"RESULT cycle_first_ms p50={pct(first, 50):.1f} p99={pct(first, 99):.1f}")
    print(f"RESULT cycle_steady_ms p50={pct(steady, 50):.1f} p99={pct(steady, 99):.1f} "
          f"pending={len(steady_snap.pending)} (goal p99 < 50)")
    full = settled(steady_snap, n_pending, 101.0)
    full_t = timed(full, 101.0, reps)
    full_cold = timed(full, 101.0, max(3, reps // 3), fresh=True)
    print(f"RESULT cycle_steady_full_ms p50={pct(full_t, 50):.1f} p99={pct(full_t, 99):.1f} "
          f"pending={len(full.pending)} running={len(full.running)} (goal p99 < 50)")
    print(f"RESULT cycle_steady_full_cold_ms p50={pct(full_cold, 50):.1f} p99={pct(full_cold, 99):.1f} "
          f"(each cycle on a cluster without memos: every fit and reason rebuilt)")

    print("(c) steady cycle ms (median of 5) by pending workloads x nodes")
    sizes = (100, 250, 500) if args.quick else (1_000, 2_500, 5_000)
    pendings = (100, 200, 500, 1_000) if args.quick else (1_000, 2_000, 5_000, 10_000)
    print("    pending " + "".join(f"{n:>10} nodes" for n in sizes))
    for p in pendings:
        row = []
        for n in sizes:
            s = loaded_snapshot(make_cluster(n), p)
            s = after(s, schedule(s, 100.0), 100.0)
            row.append(statistics.median(timed(s, 101.0, 5)))
        print(f"    {p:>7} " + "".join(f"{ms:>13.1f} ms" for ms in row) + f"   ({row[-1] / p * 1000:.1f} us/pending)")
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"RESULT peak_rss_mib={rss_mib:.0f} (goal < 2048)")


if __name__ == "__main__":
    main()
