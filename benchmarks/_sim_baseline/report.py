"""The simulator's outputs: events.jsonl and summary.json, exactly as FORMAT.md lays them out.

Both are written with a fixed key order; times are rounded to microseconds and ratios to six
decimals, so the same scenario gives the same bytes (``scheduler.wall_s`` in the summary is real
time and the one value that varies).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks._sim_baseline.scenario import Scenario


@dataclass(slots=True)
class QueueStats:
    admitted: int = 0           # workloads admitted at least once
    finished: int = 0
    preempted: int = 0          # preempt events
    rejected: int = 0
    gpu_seconds: float = 0.0
    waits: list[float] = field(default_factory=list)   # submit to first admit


@dataclass(frozen=True, slots=True)
class SimResult:
    name: str
    events: tuple[dict[str, Any], ...]
    summary: dict[str, Any]

    def events_jsonl(self) -> str:
        return "".join(json.dumps(e) + "\n" for e in self.events)

    def summary_json(self) -> str:
        return json.dumps(self.summary, indent=2) + "\n"


def write_outputs(result: SimResult, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``events.jsonl`` and ``summary.json`` into ``out_dir`` (created if needed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    events, summary = out / "events.jsonl", out / "summary.json"
    events.write_text(result.events_jsonl())
    summary.write_text(result.summary_json())
    return events, summary


def percentile(values: list[float], p: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default); ``None`` when empty."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return round(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo), 6)


def summarize(
    sc: Scenario,
    events: list[dict[str, Any]],
    stats: dict[str, QueueStats],
    makespan_s: float,
    gpu_seconds: float,
    cycles: int,
    core_s: float,
) -> SimResult:
    capacity = sum(n.gpus for n in sc.cluster.nodes) * makespan_s
    summary: dict[str, Any] = {
        "name": sc.name,
        "makespan_s": round(makespan_s, 6) + 0.0,
        "gpu_utilization": round(gpu_seconds / capacity, 6) if capacity > 0 else 0.0,
        "preemptions": sum(s.preempted for s in stats.values()),
        "queues": {
            q: {
                "admitted": s.admitted,
                "finished": s.finished,
                "preempted": s.preempted,
                "rejected": s.rejected,
                "gpu_seconds": round(s.gpu_seconds, 6) + 0.0,
                "wait_p50_s": percentile(s.waits, 50),
                "wait_p95_s": percentile(s.waits, 95),
            }
            for q, s in stats.items()
        },
        "scheduler": {"cycles": cycles, "wall_s": round(core_s, 6)},
    }
    return SimResult(sc.name, tuple(events), summary)
