"""Run every benchmark (``benchmarks/bench_*.py``), each in a subprocess of its own, and summarize.

    .venv/bin/python -m benchmarks.run_all [--full] [--only NAME ...] [--timeout S]

``make bench`` runs this. By default each module runs at its reduced size (``--quick`` where the
module has that flag, else the arguments in ``REDUCED``), a few minutes in all; ``--full`` runs the
sizes that docs/PERFORMANCE.md reports. Each module's output is printed as it comes; the summary at
the end gives every module's exit status, time and ``RESULT`` lines. The exit status is 1 when any
module failed (non-zero exit, which includes a missed gate such as bench_parser's 10x ratio, or a
timeout), else 0.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent

# Reduced sizes for modules without a --quick flag.
REDUCED: dict[str, list[str]] = {
    "bench_k8s": ["--pods", "1000", "--seconds", "1"],
    "bench_trace_replay": ["--limit", "2000", "--time-scale", "0.001"],
}


@dataclass(slots=True)
class Outcome:
    name: str
    argv: list[str]
    rc: int | None = None              # None: timed out
    wall_s: float = 0.0
    results: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.rc == 0


def modules() -> list[str]:
    return sorted(p.stem for p in HERE.glob("bench_*.py"))


def reduced_args(name: str) -> list[str]:
    if name in REDUCED:
        return list(REDUCED[name])
    return ["--quick"] if '"--quick"' in (HERE / f"{name}.py").read_text() else []


def run_one(name: str, full: bool, timeout_s: float) -> Outcome:
    argv = [sys.executable, "-m", f"benchmarks.{name}", *([] if full else reduced_args(name))]
    out = Outcome(name, argv[2:])
    print(f"\n=== {' '.join(out.argv)}", flush=True)
    t0 = time.monotonic()
    with subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, bufsize=1) as proc:
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                print(line, end="", flush=True)
                if line.startswith("RESULT"):
                    out.results.append(line.rstrip())
                if time.monotonic() - t0 > timeout_s:
                    raise subprocess.TimeoutExpired(argv, timeout_s)
            out.rc = proc.wait(timeout=max(1.0, timeout_s - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            print(f"--- {name}: stopped after {timeout_s:.0f} s", flush=True)
    out.wall_s = time.monotonic() - t0
    return out


def summary(outcomes: list[Outcome]) -> str:
    lines = ["", "=== summary"]
    for o in outcomes:
        status = "ok" if o.ok else ("TIMEOUT" if o.rc is None else f"FAILED (exit {o.rc})")
        lines.append(f"{o.name:<22} {status:<16} {o.wall_s:8.1f} s   {' '.join(o.argv[1:])}")
        lines += [f"    {r}" for r in o.results]
    failed = [o.name for o in outcomes if not o.ok]
    lines.append(f"{len(outcomes) - len(failed)} of {len(outcomes)} benchmarks ok"
                 + (f"; failed: {', '.join(failed)}" if failed else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="full sizes (default: each module's reduced size)")
    ap.add_argument("--only", nargs="+", metavar="NAME", help="run only these modules (bench_parser ...)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per module (default 1800)")
    args = ap.parse_args(argv)
    names = modules()
    if args.only:
        unknown = sorted(set(args.only) - set(names))
        if unknown:
            ap.error(f"unknown benchmark {', '.join(unknown)}; there are {', '.join(names)}")
        names = [n for n in names if n in args.only]
    outcomes = [run_one(n, args.full, args.timeout) for n in names]
    print(summary(outcomes), flush=True)
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
