"""Do two checkouts' cores decide the same? ``python -m benchmarks.same_decisions --before PATH``

For a change to the scheduler's core that must not change what it decides or says (issue 18's
typed verdicts were one). ``PATH`` is a checkout of the code before (``git worktree add /tmp/before
main``); each side runs in processes of its own whose ``scheduler`` package is its checkout's:

* every scenario in this checkout's ``tests/scenarios/`` through ``gpuq simulate`` (the command):
  ``events.jsonl`` byte for byte (less the keys later issues added: :func:`scheduler.events.without_devices`),
  ``summary.json`` less ``scheduler.wall_s`` (the core's time) and ``lost_gpu_seconds`` (issue 21);
* ``--random`` scenarios (300; ``--seed``): hierarchies, maxes (typed ones too), guarantees,
  strict-FIFO leaves, preemption fences, queue policies and non-preemptible work, priorities,
  originators, floods, preemption on and off, delays, cycle intervals;
* the benchmarks' shapes at a reduced size: ``bench_scheduler``'s trace (5,000 workloads on 500
  nodes, preemption on and off) and its backlog (5,000; preemption delays 30 and 0 s);

for all but the files also every cycle's reasons, read right after the cycle (each pending
workload's queue, code, position and message), as one sha256 per cycle. Prints what differs and
``RESULT same_decisions=True|False``; exits 1 when anything differs.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]
TYPES = ("H100", "A100", "L40S")


def random_scenario(rng: random.Random, k: int) -> dict[str, Any]:
    """A small scenario that reaches the core's corners: some queues strict FIFO, fenced, with a
    policy that allows non-preemptible work, under a parent with a max; a flood that fills the
    cluster first, so that later work preempts or waits."""
    groups = [(t, rng.choice((2, 4, 8, 8)), rng.randint(0 if i else 1, 3)) for i, t in enumerate(TYPES)]
    groups = [g for g in groups if g[2]]
    nodes = [{"name": f"g{i}", "gpu_type": t, "gpus": n, "count": c} for i, (t, n, c) in enumerate(groups)]
    total = sum(n * c for _, n, c in groups)
    leaves: list[str] = []
    queues: dict[str, Any] = {}
    for p in range(rng.randint(1, 3)):
        parent: dict[str, Any] = {"queues": {}}
        for j in range(rng.randint(1, 3)):
            g = rng.randint(0, total // 4)
            leaf: dict[str, Any] = {"guaranteed": {"gpu": g}}
            if rng.random() < 0.3:
                typed = rng.random() < 0.5
                leaf["max"] = {f"gpu/{rng.choice(TYPES)}": rng.randint(0, total)} if typed \
                    else {"gpu": rng.randint(max(g, 1), total)}
            if rng.random() < 0.25:
                leaf["strict_fifo"] = True
            if rng.random() < 0.5:
                leaf["policy"] = {"max_priority": 2, "non_preemptible": True}
            parent["queues"][f"l{j}"] = leaf
            leaves.append(f"p{p}.l{j}")
        g = sum(q["guaranteed"]["gpu"] for q in parent["queues"].values()) + rng.randint(0, total // 4)
        parent["guaranteed"] = {"gpu": g}
        if rng.random() < 0.4:
            cap = parent["max"] = {"gpu": rng.randint(max(g, 1), max(g, 1) + total)}
            for leaf in parent["queues"].values():       # a child's max within its parent's
                if "gpu" in leaf.get("max", {}):
                    leaf["max"]["gpu"] = min(leaf["max"]["gpu"], cap["gpu"])
        if rng.random() < 0.3:
            parent["preemption"] = {"fence": True}
        queues[f"p{p}"] = parent
    allows = {q for q in leaves if queues[q.split(".")[0]]["queues"][q.split(".")[1]].get("policy")}
    workloads = []
    for i in range(rng.randint(3, 40)):
        q = rng.choice(leaves)
        workloads.append({
            "id": f"w{i}", "queue": q, "submit": rng.randint(0, 120), "duration": rng.randint(1, 400),
            "pods": rng.choice((1, 1, 2, 3)), "gpus_per_pod": rng.choice((1, 2, 4, 8)),
            "gpu_types": rng.choice(([], [], ["H100"], ["A100", "H100"], ["L40S"])),
            "priority": rng.randint(0, 2), "checkpoint": rng.random() < 0.5,
            "preemptible": q not in allows or rng.random() < 0.6})
    if rng.random() < 0.5:
        small = min(n for _, n, _ in groups)
        flood = rng.choice(leaves)
        for j in range(total // small):
            workloads.append({"id": f"f{j}", "queue": flood, "submit": 0, "duration": rng.randint(50, 400),
                              "gpus_per_pod": small, "priority": rng.randint(0, 1), "originator": j == 0})
    sched = {"preemption": rng.random() < 0.8, "preemption_delay_s": rng.choice((0, 5, 30)),
             "cycle_interval_s": rng.choice((1, 2.5, 10))}
    return {"name": f"random-{k}", "scheduler": sched, "nodes": nodes, "queues": queues, "workloads": workloads}


def child(out: Path, n_random: int, seed: int) -> None:
    """Replay every scenario but the files with this process's core, writing its events, its
    summary and one line per cycle (t, pending, sha256 of the reasons) under ``out``."""
    from benchmarks.bench_scheduler import make_backlog, make_cluster, make_trace
    from scheduler.cycle import schedule
    from scheduler.model import Decisions
    from scheduler.simulator import parse_scenario, simulate
    from scheduler.simulator.scenario import Scenario
    from scheduler.snapshot import Settings, Snapshot

    def run(name: str, sc: Scenario) -> None:
        lines: list[str] = []

        def reading(snap: Snapshot, now: float) -> Decisions:
            d = schedule(snap, now)
            text = "\n".join(f"{p.workload}\t{p.queue}\t{p.code.value}\t{p.position}\t{p.message}"
                             for p in d.pending)
            lines.append(f"t={now} pending={len(d.pending)} {hashlib.sha256(text.encode()).hexdigest()}")
            return d

        res = simulate(sc, reading)
        (out / f"{name}.events.jsonl").write_text(res.events_jsonl())
        (out / f"{name}.reasons").write_text("\n".join(lines) + "\n")

    rng = random.Random(seed)
    for k in range(n_random):
        run(f"random-{k:03d}", parse_scenario(random_scenario(rng, k)))
    for nodes, n, label in ((500, 5_000, "5000"),):
        c = make_cluster(nodes)
        run(f"trace-{label}", Scenario("bench", None, 1.0, Settings(), c, make_trace(c, n)))
        run(f"trace-{label}-nopreemption", Scenario("bench", None, 1.0, Settings(preemption=False), c, make_trace(c, n)))
        for delay in (30.0, 0.0):
            c = make_cluster(nodes)
            run(f"backlog-{label}-delay{delay:g}",
                Scenario("backlog", None, 1.0, Settings(True, delay), c, make_backlog(c, n)))
    import scheduler.cycle
    (out / "core").write_text(str(Path(scheduler.cycle.__file__).resolve().parent))


def side(tree: Path, out: Path, n_random: int, seed: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}
    files = out / "files"
    for f in sorted((HERE / "tests" / "scenarios").glob("*.yaml")):
        d = files / f.stem
        subprocess.run([sys.executable, "-m", "gpuq.cli", "simulate", str(f), "--out", str(d)],
                       env=env, cwd=tree, check=True, capture_output=True)
        summary = json.loads((d / "summary.json").read_text())
        summary["scheduler"].pop("wall_s", None)
        summary.pop("lost_gpu_seconds", None)       # issue 21 added it (what the preemptions threw away)
        (d / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", str(out), "--random", str(n_random),
                    "--seed", str(seed)], env=env, cwd=tree, check=True)
    core = (out / "core").read_text()
    if core != str(tree / "scheduler"):
        raise SystemExit(f"the side at {tree} ran the core at {core}")


def differences(a: Path, b: Path) -> list[str]:
    from scheduler.events import without_devices      # this checkout's (a side's child runs the other's code)

    names = sorted({p.relative_to(a) for p in a.rglob("*") if p.is_file()} |
                   {p.relative_to(b) for p in b.rglob("*") if p.is_file()})
    out = []
    for name in names:
        if str(name) == "core":
            continue
        fa, fb = a / name, b / name
        if not fa.exists() or not fb.exists():
            out.append(f"{name}: only on one side")
            continue
        ta, tb = fa.read_text(), fb.read_text()
        if name.name.endswith("events.jsonl"):          # decisions only: issue 19 added each admit's devices
            ta, tb = without_devices(ta), without_devices(tb)
        la, lb = ta.splitlines(), tb.splitlines()
        if la != lb:
            first = next((i for i, (x, y) in enumerate(zip(la, lb)) if x != y), min(len(la), len(lb)))
            out.append(f"{name}: line {first + 1} differs\n    before: {la[first] if first < len(la) else '(end)'}"
                       f"\n    now:    {lb[first] if first < len(lb) else '(end)'}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="a checkout of the code before")
    ap.add_argument("--random", type=int, default=300, help="random scenarios (default 300)")
    ap.add_argument("--seed", type=int, default=18)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        child(args.child, args.random, args.seed)
        return
    if args.before is None:
        ap.error("--before PATH is needed")
    before = args.before.resolve()
    if not (before / "scheduler" / "cycle.py").is_file():
        raise SystemExit(f"--before: {before} holds no scheduler/cycle.py (a checkout of gpuq is expected)")
    with tempfile.TemporaryDirectory(prefix="same-decisions-") as tmp:
        a, b = Path(tmp) / "before", Path(tmp) / "now"
        side(before, a, args.random, args.seed)
        side(HERE, b, args.random, args.seed)
        n = len(list(a.rglob("events.jsonl"))) + len(list(a.glob("*.events.jsonl")))
        cycles = sum(len(p.read_text().splitlines()) for p in a.glob("*.reasons"))
        diff = differences(a, b)
    for d in diff:
        print(d)
    print(f"RESULT same_decisions={not diff} scenarios={n} cycles_with_reasons={cycles} "
          f"before={before} now={HERE}")
    if diff:
        sys.exit(1)


if __name__ == "__main__":
    main()
