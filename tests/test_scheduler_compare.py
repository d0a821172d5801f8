"""``gpuq simulate SCENARIO --compare QUEUES_B``: one workload under two queue configurations."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.compare import compare, compare_main, diff, with_queues
from scheduler.errors import ScenarioError

# 32 GPUs. "first" fills them at t=0; "second" arrives at t=100 with two 8-GPU workloads.
# A: second is guaranteed 8 -> it reclaims 8 GPUs once (t=130), its other workload waits for the
#    first to finish (t=230). B: second is guaranteed 16 -> both reclaim at t=130.
SCENARIO = {
    "name": "reclaim",
    "nodes": [{"name": "n", "gpu_type": "A100", "gpus": 8, "count": 4}],
    "queues": {"first": {"guaranteed": {"gpu": 24}, "max": {"gpu": 32}},
               "second": {"guaranteed": {"gpu": 8}, "max": {"gpu": 32}}},
    "workloads": [
        {"id": "f", "queue": "first", "submit": 0, "duration": 1000, "gpus_per_pod": 8, "count": 4},
        {"id": "s", "queue": "second", "submit": 100, "duration": 100, "gpus_per_pod": 8, "count": 2},
    ],
}
QUEUES_B = {"queues": {"first": {"guaranteed": {"gpu": 16}, "max": {"gpu": 32}},
                       "second": {"guaranteed": {"gpu": 16}, "max": {"gpu": 32}}}}


def _files(tmp_path: Path, queues_b: dict[str, Any] = QUEUES_B) -> tuple[str, str]:
    sc, qb = tmp_path / "sc.yaml", tmp_path / "b.yaml"
    sc.write_text(yaml.safe_dump(SCENARIO, sort_keys=False))
    qb.write_text(yaml.safe_dump(queues_b, sort_keys=False))
    return str(sc), str(qb)


def test_more_guaranteed_lowers_that_queues_wait(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sc, qb = _files(tmp_path)
    assert compare_main([sc, "--compare", qb, "--format", "json"], None) == 0
    report = json.loads(capsys.readouterr().out)
    second = report["queues"]["second"]
    assert second["guaranteed_gpu"] == {"a": 8, "b": 16, "delta": 8}
    assert second["wait_p95_s"]["b"] < second["wait_p95_s"]["a"]
    assert second["wait_p95_s"]["delta"] == second["wait_p95_s"]["b"] - second["wait_p95_s"]["a"] < 0
    assert second["wait_p50_s"]["delta"] < 0
    assert second["admitted"] == {"a": 2, "b": 2, "delta": 0}
    assert report["queues"]["first"]["preempted"] == {"a": 1, "b": 2, "delta": 1}
    assert report["totals"]["preemptions"] == {"a": 1, "b": 2, "delta": 1}
    assert report["totals"]["makespan_s"]["delta"] < 0
    util = report["totals"]["gpu_utilization"]
    for side in ("a", "b"):   # the queues' utilizations add up to the run's
        assert sum(q["utilization"][side] for q in report["queues"].values()) == pytest.approx(util[side], abs=1e-5)


def test_out_dir_holds_both_runs_and_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.simulate import run_scenario

    sc, qb = _files(tmp_path)
    out = tmp_path / "out"
    assert compare_main([sc, "--compare", qb, "--out", str(out)], None) == 0
    table = capsys.readouterr().out
    assert "reclaim: A = queues of" in table and "delta (B-A)" in table and "wait p95 s" in table
    assert (out / "a" / "events.jsonl").read_text() == run_scenario(SCENARIO).events_jsonl()
    b_events = (out / "b" / "events.jsonl").read_text()
    assert b_events == run_scenario(with_queues(SCENARIO, QUEUES_B)).events_jsonl()
    assert b_events.count('"event": "preempt"') == 2
    assert json.loads((out / "compare.json").read_text())["queues_b"] == qb


def test_same_queues_give_zero_deltas() -> None:
    report, _, _ = compare(SCENARIO, {"queues": SCENARIO["queues"]})
    deltas = [t["delta"] for q in report["queues"].values() for t in q.values()]
    deltas += [t["delta"] for t in report["totals"].values()]
    assert all(d in (0, None) for d in deltas)


def test_gpu_types_of_b_replace_the_scenarios() -> None:
    b = {"queues": SCENARIO["queues"], "gpu_types": {"A100": {"price_per_hour": 2.0}}}
    assert with_queues(SCENARIO, b)["gpu_types"] == {"A100": {"price_per_hour": 2.0}}
    assert "gpu_types" not in with_queues(SCENARIO, {"queues": SCENARIO["queues"]})


def test_queue_only_on_one_side_has_null_deltas() -> None:
    view = {"queues": {"x": {"admitted": 1}}, "totals": {}}
    other = {"queues": {"y": {"admitted": 2}}, "totals": {}}
    d = diff(view, other)
    assert d["queues"]["x"]["admitted"] == {"a": 1, "b": None, "delta": None}
    assert d["queues"]["y"]["admitted"] == {"a": None, "b": 2, "delta": None}


@pytest.mark.parametrize(("queues_b", "needle"), [
    ({"queues": {"first": {}}}, "not leaves here: second"),
    ({"queues": {"first": {}, "second": {"guaranteed": {"gpu": 9}, "max": {"gpu": 8}}}}, "below guaranteed"),
    ({"gpu_types": {}}, "expected a 'queues:' mapping"),
], ids=["missing-leaf", "bad-quota", "no-queues"])
def test_bad_queue_file_b(tmp_path: Path, capsys: pytest.CaptureFixture[str], queues_b: dict[str, Any],
                          needle: str) -> None:
    sc, qb = _files(tmp_path, queues_b)
    assert compare_main([sc, "--compare", qb], None) == 2
    err = capsys.readouterr().err
    assert needle in err and qb in err
    with pytest.raises(ScenarioError, match=needle):
        with_queues(SCENARIO, queues_b, qb)


def test_unreadable_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, qb = _files(tmp_path)
    assert compare_main([str(tmp_path / "nope.yaml"), "--compare", qb], None) == 2
    assert "cannot read scenario" in capsys.readouterr().err
