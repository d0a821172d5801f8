"""``gpuq simulate SCENARIO.yaml --out DIR``: self-contained, argparse-based; the lead wires
:func:`simulate_main` into the ``gpuq`` console script."""
from __future__ import annotations

import argparse
import sys

from scheduler.errors import ScenarioError


def simulate_parser(prog: str = "gpuq simulate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Replay a scenario (see scenarios/FORMAT.md) through the scheduler on a simulated "
        "clock; write DIR/events.jsonl and DIR/summary.json.",
    )
    p.add_argument("scenario", help="scenario YAML file")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    return p


def simulate_main(argv: list[str]) -> int:
    """Exit status: 0 done, 2 bad arguments or an invalid scenario (the message names the YAML path)."""
    from scheduler.simulator import run_scenario, write_outputs

    args = simulate_parser().parse_args(argv)
    try:
        result = run_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    events, summary = write_outputs(result, args.out)
    s = result.summary
    print(f"{s['name']}: makespan {s['makespan_s']} s, utilization {s['gpu_utilization']:.3f}, "
          f"{s['preemptions']} preemptions, {s['scheduler']['cycles']} cycles in "
          f"{s['scheduler']['wall_s']:.3f} s; wrote {events} and {summary}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(simulate_main(sys.argv[1:]))
