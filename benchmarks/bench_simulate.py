"""``gpuq simulate`` of a scenario written inline in YAML, phase by phase (issue 18): today's loader and
simulator shell against the same before issue 18 (:mod:`benchmarks._sim_baseline`), in the same run.

    .venv/bin/python -m benchmarks.bench_simulate [--quick] [--workloads N] [--nodes N] [--style block|flow]
        [--rounds R] [--out DIR] [--peer-tree DIR]

The scenario: ``--workloads`` (50,000) workloads arriving as a Poisson stream at 90 % load on ``--nodes``
(1,300) nodes of 8 GPUs in 4 types, so over about 8 hours (the rate is the nodes'), in 1,000 leaf
queues (20 parents x 50 teams, 80 % of the GPUs guaranteed); the workloads of ``bench_scheduler``'s
replay (``make_trace``: 1/2/4 pods x 1/2/4/8 GPUs, half pinned to one or two types, runs of 2 to 30
minutes). It is written once, inline as a user writes it: ``--style block`` one field a line (8 MB),
``flow`` one ``{...}`` a line. ``--quick``: 5,000 workloads on 130 nodes (the same rate per node).

Each round runs in fresh interpreters, in alternating order: ``before`` and ``now``, each the pipeline
of ``gpuq simulate`` (read and parse the YAML; check it and build the ``Scenario``; replay; write
``events.jsonl`` and ``summary.json``) with its phases timed in the process, around today's scheduler
core in both; then ``gpuq simulate FILE --out DIR`` of this tree as a command (``cli``); with
``--peer-tree DIR`` the same command of another checkout too (``peer``, e.g. ``git worktree add DIR
<commit before the issue>``: the whole command before, core included). Each figure is its
variant's least over the rounds, phase by phase (the least disturbed, as timeit advises: the
machine is shared, and the core's time alone varies by a third between rounds). Wall times include
interpreter start; peak RSS is each process's. The fast YAML path must read the file to exactly PyYAML's data, and before and now must write the
same ``events.jsonl``, byte for byte, and the same summary but for ``scheduler.wall_s``; the exit
status is 3 when not. The last lines start with ``RESULT``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]


def trickle_text(n: int = 50_000, n_nodes: int = 1_300, seed: int = 7, style: str = "block") -> str:
    """The scenario as YAML text: ``bench_scheduler.make_trace`` on ``make_cluster(n_nodes)``."""
    from benchmarks.bench_scheduler import TYPES, backlog_queues, make_cluster, make_trace

    c = make_cluster(n_nodes)
    trace = make_trace(c, n, seed)
    head = {
        "name": f"trickle-{n}",
        "nodes": [{"name": t.lower(), "gpu_type": t, "gpus": 8, "count": n_nodes // len(TYPES)} for t in TYPES],
        "queues": backlog_queues(n_nodes * 8),
    }
    rows = []
    for w in trace:
        fields = [("id", w.id), ("queue", w.queue), ("submit", repr(w.submit_s)),
                  ("duration", str(int(w.duration_s))), ("pods", str(w.pods)), ("gpus_per_pod", str(w.gpus_per_pod))]
        if w.gpu_types:
            fields.append(("gpu_types", f"[{', '.join(w.gpu_types)}]"))
        fields += [("priority", str(w.priority)), ("checkpoint", "true" if w.checkpoint else "false")]
        if style == "flow":
            rows.append("  - {" + ", ".join(f"{k}: {v}" for k, v in fields) + "}\n")
        else:
            rows.append("  - " + "    ".join(f"{k}: {v}\n" for k, v in fields))
    return (f"# {n:,} workloads arriving over {trace[-1].submit_s / 3600:.1f} hours (benchmarks/bench_simulate.py)\n"
            + yaml.safe_dump(head, sort_keys=False) + "workloads:\n" + "".join(rows))


# -- one variant in a fresh interpreter ---------------------------------------------------------------
def child(variant: str, scenario: Path, out: Path) -> dict[str, float]:
    """The phases of ``gpuq simulate``'s pipeline with ``variant``'s shell (seconds)."""
    t0 = time.perf_counter()
    if variant == "before":
        from benchmarks._sim_baseline.engine import simulate
        from benchmarks._sim_baseline.report import write_outputs
        from benchmarks._sim_baseline.scenario import load_yaml, parse_scenario
    else:
        from scheduler.simulator.engine import simulate
        from scheduler.simulator.report import write_outputs
        from scheduler.simulator.scenario import load_yaml, parse_scenario
    t1 = time.perf_counter()
    data = load_yaml(scenario)
    t2 = time.perf_counter()
    sc = parse_scenario(data, source=str(scenario))
    del data
    t3 = time.perf_counter()
    result = simulate(sc)
    t4 = time.perf_counter()
    write_outputs(result, out)                    # type: ignore[arg-type]
    t5 = time.perf_counter()
    core = float(result.summary["scheduler"]["wall_s"])
    return {"import": t1 - t0, "load": t2 - t1, "build": t3 - t2, "replay": t4 - t3, "core": core,
            "shell": t4 - t3 - core, "write": t5 - t4, "in_process": t5 - t0}


def run_variant(variant: str, scenario: Path, out: Path, peer_tree: Path | None) -> dict[str, float]:
    """Run one variant as a process: its phases (``before``/``now``), wall and peak RSS (MiB)."""
    env = dict(os.environ)
    if variant in ("before", "now"):
        argv = [sys.executable, "-m", "benchmarks.bench_simulate", "--child", variant, "--scenario", str(scenario),
                "--out", str(out)]
        cwd = REPO
    else:
        argv = [sys.executable, "-m", "gpuq.cli", "simulate", str(scenario), "--out", str(out)]
        cwd = peer_tree if variant == "peer" and peer_tree else REPO
        env["PYTHONPATH"] = str(cwd)
    env.setdefault("PYTHONPATH", str(REPO))
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        stdout = proc.stdout.read()
        _, status, usage = os.wait4(proc.pid, 0)         # this process's own peak RSS
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)
        proc.stdout.close()
        if proc.returncode != 0:
            err.seek(0)
            raise SystemExit(f"{variant}: exit {proc.returncode}\n{err.read()[-2000:]}")
    rec: dict[str, float] = json.loads(stdout.strip().splitlines()[-1]) if variant in ("before", "now") else {}
    rec["wall"] = wall
    rec["rss_mib"] = usage.ru_maxrss / 1024        # KiB on Linux
    return rec


def same(a: Any, b: Any) -> bool:
    """Equal, of the same types all the way down, dict keys in the same order (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return (len(a) == len(b) and all(same(k, j) for k, j in zip(a, b))
                and all(same(a[k], b[k]) for k in a))
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def same_data(text: str) -> bool:
    """The fast path reads the file (not refused) to exactly what PyYAML's C loader reads."""
    from gpuq import yamlfast

    return same(yamlfast.load(text), yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)))


def same_outputs(a: Path, b: Path) -> str | None:
    """``None`` when both runs wrote the same events and summary (but its wall time), else why not."""
    if (a / "events.jsonl").read_bytes() != (b / "events.jsonl").read_bytes():
        return "events.jsonl differs"
    sa, sb = (json.loads((d / "summary.json").read_text()) for d in (a, b))
    sa["scheduler"].pop("wall_s")
    sb["scheduler"].pop("wall_s")
    return None if sa == sb else "summary.json differs"


PHASES = ("import", "load", "build", "replay", "core", "shell", "write", "in_process", "wall", "rss_mib")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5,000 workloads on 130 nodes, 2 rounds")
    ap.add_argument("--workloads", type=int, default=None, help="workloads (default 50,000; --quick 5,000)")
    ap.add_argument("--nodes", type=int, default=None, help="nodes (default 1,300; --quick 130)")
    ap.add_argument("--style", choices=["block", "flow"], default="block")
    ap.add_argument("--rounds", type=int, default=None, help="rounds (default 3, --quick 2)")
    ap.add_argument("--out", type=Path, default=None, help="where the scenario and outputs go (default: a "
                    "temporary directory, removed)")
    ap.add_argument("--peer-tree", type=Path, default=None, metavar="DIR",
                    help="also time `gpuq simulate` of the checkout in DIR (the code before)")
    ap.add_argument("--child", choices=["before", "now", "write", "check"], help=argparse.SUPPRESS)
    ap.add_argument("--scenario", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    n = args.workloads or (5_000 if args.quick else 50_000)
    nodes = args.nodes or (130 if args.quick else 1_300)
    if args.child in ("before", "now"):
        print(json.dumps(child(args.child, args.scenario, args.out)))
        return 0
    if args.child == "write":
        args.scenario.write_text(trickle_text(n, nodes, style=args.style))
        return 0
    if args.child == "check":
        return 0 if same_data(args.scenario.read_text()) else 3
    rounds = args.rounds or (2 if args.quick else 3)
    with tempfile.TemporaryDirectory(prefix="bench_simulate.") as tmp:
        base = args.out or Path(tmp)
        base.mkdir(parents=True, exist_ok=True)
        scenario = base / f"trickle-{n}-{args.style}.yaml"
        # Written and checked in processes of their own: Linux keeps a process's peak RSS across
        # exec, so every child would start from this one's
        t0 = time.perf_counter()
        own = [sys.executable, "-m", "benchmarks.bench_simulate", "--workloads", str(n), "--nodes", str(nodes),
               "--style", args.style, "--scenario", str(scenario), "--child"]
        subprocess.run([*own, "write"], cwd=REPO, check=True)
        print(f"wrote {scenario} ({scenario.stat().st_size / 1e6:.1f} MB, {n:,} workloads, {nodes:,} nodes, "
              f"{args.style} style) in {time.perf_counter() - t0:.1f} s; python {sys.version.split()[0]}, "
              f"PyYAML {yaml.__version__} (libyaml {'yes' if yaml.__with_libyaml__ else 'no'}), {rounds} rounds")
        if subprocess.run([*own, "check"], cwd=REPO).returncode != 0:
            print("FAIL: gpuq.yamlfast and PyYAML's C loader read the scenario differently", file=sys.stderr)
            return 3
        variants = ["before", "now", "cli"] + (["peer"] if args.peer_tree else [])
        best: dict[str, dict[str, float]] = {}
        for r in range(rounds):
            order = variants if r % 2 == 0 else variants[::-1]
            for v in order:
                rec = run_variant(v, scenario, base / v, args.peer_tree)
                shown = " ".join(f"{k}={rec[k]:.2f}" for k in PHASES if k in rec)
                print(f"round {r + 1} {v:<6} {shown}", flush=True)
                best[v] = {k: min(x, best[v][k]) for k, x in rec.items()} if v in best else rec
        why = same_outputs(base / "before", base / "now") or same_outputs(base / "now", base / "cli")
        if args.peer_tree and why is None:
            peer_why = same_outputs(base / "now", base / "peer")
            if peer_why:
                print(f"note: the peer tree's outputs differ from this tree's ({peer_why})")
        b, w = best["before"], best["now"]
        print(f"{'phase (s)':<12}{'before':>10}{'now':>10}{'ratio':>8}")
        for k in PHASES:
            print(f"{k:<12}{b[k]:>10.2f}{w[k]:>10.2f}{b[k] / w[k] if w[k] > 0 else float('inf'):>7.1f}x")
        if why:
            print(f"FAIL: before and now disagree: {why}", file=sys.stderr)
            return 3
        cli = best["cli"]
        print(f"RESULT simulate_shell ratio={b['wall'] / w['wall']:.2f}x before_wall_s={b['wall']:.2f} "
              f"now_wall_s={w['wall']:.2f} (same core: core_s {b['core']:.2f} / {w['core']:.2f}) "
              f"workloads={n} style={args.style}")
        print(f"RESULT simulate_load ratio={b['load'] / w['load']:.1f}x before_s={b['load']:.2f} now_s={w['load']:.2f} "
              f"build before_s={b['build']:.2f} now_s={w['build']:.2f} shell before_s={b['shell']:.2f} "
              f"now_s={w['shell']:.2f} write before_s={b['write']:.2f} now_s={w['write']:.2f}")
        peer = best.get("peer")
        print(f"RESULT gpuq_simulate_cli wall_s={cli['wall']:.2f} peak_rss_mib={cli['rss_mib']:.0f}"
              + (f" peer_wall_s={peer['wall']:.2f} peer_peak_rss_mib={peer['rss_mib']:.0f} "
                 f"ratio={peer['wall'] / cli['wall']:.2f}x" if peer else "")
              + f" before_peak_rss_mib={b['rss_mib']:.0f} now_peak_rss_mib={w['rss_mib']:.0f}"
              + (" (goal: 50,000 workloads under 10 s wall)" if n == 50_000 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
