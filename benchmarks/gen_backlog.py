"""Write the backlog scenario of issue 11 as files, and time loading and replaying it.

    python -m benchmarks.gen_backlog --out DIR [--workloads 50000] [--nodes 5000] [--seed 11]
        [--format jsonl|yaml|both] [--time]

The shape and the workloads are those of ``benchmarks.bench_scheduler.make_backlog`` (same seed, same
draws; ``tests/test_scenario_jsonl.py`` checks it): ``--workloads`` workloads in
1,000 leaf queues (20 parents x 50 teams, 80 % of the GPUs guaranteed) all submitted within a
minute, on ``--nodes`` nodes of 8 GPUs in 4 types, runs of 90-150 s, half pinned to one or two
GPU types. ``jsonl`` writes ``DIR/backlog.yaml`` with ``workloads_file: backlog.workloads.jsonl``;
``yaml`` writes ``DIR/backlog-inline.yaml`` with the workloads inline; ``both`` writes both.
``--time`` then loads each file written (``load_scenario``) and replays the JSONL one with
``gpuq simulate``'s code path, printing ``RESULT`` lines (seconds of wall time).
"""
from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import yaml

from accounting.queues import parse_queue_config
from benchmarks.bench_scheduler import backlog_queues

TYPES = ("H100", "A100", "L40S", "T4")


def backlog(n: int = 50_000, n_nodes: int = 5_000, seed: int = 11, within_s: float = 60.0,
            n_parents: int = 20, leaves_per: int = 50) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(scenario head without workloads, workloads) of the backlog shape."""
    gpus = n_nodes // len(TYPES) * len(TYPES) * 8
    queues = backlog_queues(gpus, n_parents, leaves_per)
    leaves = parse_queue_config({"queues": queues}).leaves()      # the order bench_scheduler draws from
    head: dict[str, Any] = {
        "name": f"backlog-{n}",
        "nodes": [{"name": t.lower(), "gpu_type": t, "gpus": 8, "count": n_nodes // len(TYPES)} for t in TYPES],
        "queues": queues,
    }
    rng = random.Random(seed)
    subs = sorted(round(rng.uniform(0.0, within_s), 3) for _ in range(n))
    work: list[dict[str, Any]] = []
    for i, t in enumerate(subs):
        pods = rng.choices((1, 2, 4), (7, 2, 1))[0]
        types = (rng.choice(((rng.choice(TYPES),), tuple(rng.sample(TYPES, 2))))
                 if rng.random() < 0.5 else ())
        queue, per_pod, priority = rng.choice(leaves), rng.choice((1, 2, 4, 8)), rng.choice((0, 0, 1, 2))
        w: dict[str, Any] = {"id": f"b{i}", "queue": queue, "submit": t, "duration": rng.randint(90, 150),
                             "pods": pods, "gpus_per_pod": per_pod}
        if types:
            w["gpu_types"] = list(types)
        w["priority"] = priority
        w["checkpoint"] = rng.random() < 0.5
        work.append(w)
    return head, work


def write(out: Path, head: dict[str, Any], work: list[dict[str, Any]], fmt: str) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if fmt in ("jsonl", "both"):
        jl = out / "backlog.workloads.jsonl"
        with jl.open("w") as f:
            for w in work:
                f.write(json.dumps(w, separators=(",", ":")) + "\n")
        p = out / "backlog.yaml"
        p.write_text(yaml.safe_dump({**head, "workloads_file": jl.name}, sort_keys=False))
        written.append(p)
    if fmt in ("yaml", "both"):
        p = out / "backlog-inline.yaml"
        rows = "".join(f"  - {json.dumps(w, separators=(', ', ': '))}\n" for w in work)   # JSON is flow YAML
        p.write_text(yaml.safe_dump(head, sort_keys=False) + "workloads:\n" + rows)
        written.append(p)
    return written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--workloads", type=int, default=50_000)
    ap.add_argument("--nodes", type=int, default=5_000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--format", choices=["jsonl", "yaml", "both"], default="both")
    ap.add_argument("--time", action="store_true", help="time loading each file and replaying the JSONL one")
    args = ap.parse_args()
    head, work = backlog(args.workloads, args.nodes, args.seed)
    paths = write(args.out, head, work, args.format)
    for p in paths:
        print(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")
    if not args.time:
        return
    from scheduler.simulator import run_scenario, write_outputs
    from scheduler.simulator.scenario import load_scenario

    for p in paths:
        t0 = time.perf_counter()
        sc = load_scenario(p)
        print(f"RESULT load file={p.name} workloads={len(sc.workloads)} wall_s={time.perf_counter() - t0:.2f}")
    if args.format in ("jsonl", "both"):
        t0 = time.perf_counter()
        result = run_scenario(args.out / "backlog.yaml")
        write_outputs(result, args.out / "run")
        s = result.summary
        print(f"RESULT simulate wall_s={time.perf_counter() - t0:.2f} cycles={s['scheduler']['cycles']} "
              f"core_s={s['scheduler']['wall_s']:.2f} makespan_s={s['makespan_s']}")


if __name__ == "__main__":
    main()
