"""The simulator's outputs: events.jsonl and summary.json, exactly as FORMAT.md lays them out.

Both are written with a fixed key order; times are rounded to microseconds and ratios to six
decimals, so the same scenario gives the same bytes (``scheduler.wall_s`` in the summary is real
time and the one value that varies).
"""
from __future__ import annotations

import json
import json.encoder
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from scheduler.simulator.scenario import Scenario


@dataclass(slots=True)
class QueueStats:
    admitted: int = 0           # workloads admitted at least once
    finished: int = 0
    preempted: int = 0          # preempt events
    rejected: int = 0
    gpu_seconds: float = 0.0
    lost_gpu_seconds: float = 0.0   # work its preemptions threw away (issue 21)
    waits: list[float] = field(default_factory=list)   # submit to first admit


@dataclass(frozen=True, slots=True)
class HeldLoad:
    """Where and when a scenario's fixed load was held (``queue`` None: outside every leaf queue);
    :func:`scheduler.quality.quality` counts it as it counts running workloads."""

    id: str
    queue: str | None
    gpu_type: str
    placement: dict[str, int]        # fixed load holds whole GPUs
    start_s: float
    end_s: float

    @property
    def gpu_seconds(self) -> float:
        return sum(self.placement.values()) * (self.end_s - self.start_s)


@dataclass(frozen=True, slots=True)
class SimResult:
    name: str
    events: tuple[dict[str, Any], ...]
    summary: dict[str, Any]
    held: tuple[HeldLoad, ...] = ()        # the fixed load, as held (scenarios with ``fixed:`` only)

    def events_jsonl(self) -> str:
        dumps = _dumps()
        return "".join([dumps(e) + "\n" for e in self.events])

    def summary_json(self) -> str:
        return json.dumps(self.summary, indent=2) + "\n"


def _dumps() -> Callable[[Any], str]:
    """``json.dumps`` with its defaults, for many small objects: the C encoder that ``json.dumps``
    makes anew for every call (about half its time on an event), made once and called per object
    with the same arguments, so the same bytes; ``json.dumps`` itself where there is no C encoder."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return json.dumps
    plain = json.JSONEncoder()
    encode = make({}, plain.default, json.encoder.encode_basestring_ascii, None, plain.key_separator,
                  plain.item_separator, plain.sort_keys, plain.skipkeys, plain.allow_nan)
    join = "".join

    def dumps(obj: Any) -> str:
        if obj.__class__ is str:            # JSONEncoder.encode's own shortcut
            return json.encoder.encode_basestring_ascii(obj)
        return join(encode(obj, 0))

    return dumps


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
    held: tuple[HeldLoad, ...] = (),
    displaced: tuple[str, ...] = (),
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
    if summary["preemptions"]:      # issue 21: only then, so a run without preemptions keeps its bytes
        summary["lost_gpu_seconds"] = round(sum(s.lost_gpu_seconds for s in stats.values()), 6) + 0.0
    if sc.fixed:            # only then: a scenario without fixed load keeps its bytes
        summary["fixed"] = {
            "held": len(held),
            "displaced": sorted(displaced),
            "gpu_seconds": round(sum(h.gpu_seconds for h in held), 6) + 0.0,
        }
    return SimResult(sc.name, tuple(events), summary, held)
