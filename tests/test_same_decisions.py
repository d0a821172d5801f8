"""benchmarks/same_decisions.py, the check that two checkouts' cores decide and say the same: its
random scenarios are valid and reach the corners it names, and a difference is reported."""
from __future__ import annotations

import json
import random
from pathlib import Path

from benchmarks.same_decisions import differences, random_scenario
from scheduler.cycle import schedule
from scheduler.model import Decisions, ReasonCode
from scheduler.simulator import parse_scenario, simulate
from scheduler.snapshot import Snapshot


def test_random_scenarios_are_valid_and_reach_the_corners() -> None:
    rng = random.Random(18)
    codes: set[ReasonCode] = set()
    events: set[str] = set()
    for k in range(60):
        sc = random_scenario(rng, k)

        def reading(snap: Snapshot, now: float) -> Decisions:
            d = schedule(snap, now)
            codes.update(p.code for p in d.pending)
            return d

        events.update(e["event"] for e in simulate(parse_scenario(sc), reading).events)
    assert {"admit", "preempt", "finish", "reject"} <= events
    assert {ReasonCode.NO_FIT, ReasonCode.QUOTA_MAX, ReasonCode.STRICT_FIFO, ReasonCode.FENCED,
            ReasonCode.NON_PREEMPTIBLE_OVER_GUARANTEE, ReasonCode.WAITING_PREEMPTION_DELAY} <= codes, codes


def test_a_difference_is_named(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        (d / "files" / "x").mkdir(parents=True)
        (d / "files" / "x" / "events.jsonl").write_text(json.dumps({"t": 0.0}) + "\n")
        (d / "random-000.reasons").write_text("t=0.0 pending=1 aaa\nt=1.0 pending=0 bbb\n")
    assert differences(a, b) == []
    (b / "random-000.reasons").write_text("t=0.0 pending=1 aaa\nt=1.0 pending=0 ccc\n")
    (b / "random-001.reasons").write_text("")
    diff = differences(a, b)
    assert diff[0].startswith("random-000.reasons: line 2 differs") and "ccc" in diff[0]
    assert diff[1] == "random-001.reasons: only on one side"
