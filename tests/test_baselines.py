"""``gpuq simulate --baseline``: the baseline policies (scheduler.baselines) and the quality metrics
(scheduler.quality) on small scenarios whose figures are worked out by hand below."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.baselines import fifo, per_queue
from scheduler.cli import simulate_main
from scheduler.compare import baselines_run
from scheduler.quality import quality
from scheduler.simulator import parse_scenario, run_scenario
from scheduler.simulator.engine import simulate

REPO = Path(__file__).resolve().parents[1]

# Two nodes of 8 A100. a1, a2 (6 GPUs each, queue a) start at t=0 and leave 2 GPUs free on each
# node; b1 (4 GPUs, queue b, guaranteed 8) arrives at t=10 and fits nowhere.
# gpuq: a holds 12 > its guarantee 4, so after the 30 s delay (t=40) b1 preempts a1 (n-0) and runs
#   40..90 on n-0; a1 waits (6 GPUs; free: n-0 4, n-1 2) until 90, then runs again 90..190.
#   stranded: 10..40 b1 pending, free 2+2 < 4 -> 4 GPUs x 30 s = 120 GPU-s (queue b);
#             40..90 a1 pending, free 4+2 < 6 -> 6 GPUs x 50 s = 300 GPU-s (queue a); 420 in all.
#   guarantee violated: b 10..40 = 30 s; a never (holds 6, +6 = 12 > 4 is above its guarantee).
#   GPU-s: 6x40 + 6x100 (a1) + 6x100 (a2) + 4x50 (b1) = 1640 over 16 x 190 -> 0.539474.
# fifo: a1, a2 at 0; b1 when they finish (100), to 150. stranded 4 x 90 = 360 GPU-s; b violated 90 s.
# per-queue: one admission per queue per cycle: a1 at 0, a2 at 1 (0..1: a2 pending, n-0 has 2 free
#   < 6 -> 2 GPU-s stranded in queue a), b1 at 100. stranded 2 + 360 = 362 GPU-s.
STRAND: dict[str, Any] = {
    "name": "strand",
    "scheduler": {"preemption_delay_s": 30},
    "nodes": [{"name": "n", "gpu_type": "A100", "gpus": 8, "count": 2}],
    "queues": {"a": {"guaranteed": {"gpu": 4}, "max": {"gpu": 16}},
               "b": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}}},
    "workloads": [
        {"id": "a1", "queue": "a", "submit": 0, "duration": 100, "gpus_per_pod": 6},
        {"id": "a2", "queue": "a", "submit": 0, "duration": 100, "gpus_per_pod": 6},
        {"id": "b1", "queue": "b", "submit": 10, "duration": 50, "gpus_per_pod": 4},
    ],
}


def _quality(data: dict[str, Any], policy: Any = None) -> dict[str, dict[str, Any]]:
    sc = parse_scenario(data)
    res = run_scenario(sc) if policy is None else simulate(sc, policy)
    return quality(sc.cluster, sc.workloads, res.events, res.summary)


def test_gpuq_core_metrics_by_hand() -> None:
    q = _quality(STRAND)
    assert q["a"] == {"wait_p50_s": 0.0, "wait_p90_s": 0.0, "wait_p99_s": 0.0, "utilization": 0.473684,
                      "preemptions": 1, "stranded_gpu_hours": round(300 / 3600, 6),
                      "stranded_gpus_avg": round(300 / 190, 6), "guarantee_violation_s": 0.0}
    assert q["b"] == {"wait_p50_s": 30.0, "wait_p90_s": 30.0, "wait_p99_s": 30.0, "utilization": 0.065789,
                      "preemptions": 0, "stranded_gpu_hours": round(120 / 3600, 6),
                      "stranded_gpus_avg": round(120 / 190, 6), "guarantee_violation_s": 30.0}
    total = q["(all)"]
    assert total["utilization"] == round(1640 / (16 * 190), 6)
    assert total["stranded_gpu_hours"] == round(420 / 3600, 6)
    assert total["stranded_gpus_avg"] == round(420 / 190, 6)
    assert (total["preemptions"], total["guarantee_violation_s"]) == (1, 30.0)
    assert (total["wait_p50_s"], total["wait_p90_s"], total["wait_p99_s"]) == (0.0, 24.0, 29.4)


def test_fifo_metrics_by_hand() -> None:
    q = _quality(STRAND, fifo)
    assert q["b"]["wait_p50_s"] == 90.0 and q["b"]["guarantee_violation_s"] == 90.0
    assert q["b"]["stranded_gpu_hours"] == q["(all)"]["stranded_gpu_hours"] == 0.1
    assert q["(all)"]["stranded_gpus_avg"] == 2.4                  # 360 GPU-s over 150 s
    assert q["(all)"]["utilization"] == round(1400 / (16 * 150), 6)
    assert q["(all)"]["preemptions"] == 0 and q["a"]["stranded_gpu_hours"] == 0.0


def test_per_queue_metrics_by_hand() -> None:
    q = _quality(STRAND, per_queue)
    assert (q["a"]["wait_p50_s"], q["a"]["wait_p99_s"]) == (0.5, 0.99)     # a2 waited one cycle
    assert q["a"]["stranded_gpu_hours"] == round(2 / 3600, 6)
    assert q["(all)"]["stranded_gpu_hours"] == round(362 / 3600, 6)
    assert q["(all)"]["stranded_gpus_avg"] == round(362 / 150, 6)
    assert q["b"]["guarantee_violation_s"] == 90.0 and q["(all)"]["preemptions"] == 0


# fifo: the head (8 GPUs, t=0) waits for the 4-GPU job of queue x (t=0..50) to end, and blocks the
# 2-GPU one of queue y behind it, which would fit at once. per-queue lets y start at t=0 (one
# admission per queue per cycle) and keeps x within its max of 4: x's second 4-GPU job waits for
# the first although 4 GPUs are free.
BLOCK: dict[str, Any] = {
    "name": "block",
    "scheduler": {"preemption": False},
    "nodes": [{"name": "n", "gpu_type": "A100", "gpus": 8, "count": 1}],
    "queues": {"x": {"guaranteed": {"gpu": 4}, "max": {"gpu": 8}},
               "y": {"guaranteed": {"gpu": 4}, "max": {"gpu": 8}},
               "z": {"guaranteed": {"gpu": 0}, "max": {"gpu": 4}}},
    "workloads": [
        {"id": "x1", "queue": "x", "submit": 0, "duration": 50, "gpus_per_pod": 4},
        {"id": "x2", "queue": "x", "submit": 0, "duration": 10, "gpus_per_pod": 8},
        {"id": "y1", "queue": "y", "submit": 0, "duration": 10, "gpus_per_pod": 2},
        {"id": "z1", "queue": "z", "submit": 100, "duration": 10, "gpus_per_pod": 4},
        {"id": "z2", "queue": "z", "submit": 100, "duration": 10, "gpus_per_pod": 4},
    ],
}


def _admits(policy: Any) -> dict[str, float]:
    res = simulate(parse_scenario(BLOCK), policy)
    return {e["workload"]: e["t"] for e in res.events if e["event"] == "admit"}


def test_fifo_head_blocks_the_line_and_ignores_queues() -> None:
    # x2 (8 GPUs) waits for x1 (t=50) and y1 waits behind it until x2 ends (t=60); z ignores its max 4
    assert _admits(fifo) == {"x1": 0.0, "x2": 50.0, "y1": 60.0, "z1": 100.0, "z2": 100.0}


def test_per_queue_admits_one_head_per_queue_within_max() -> None:
    # cycle 0: x1 (x's first in order), y1; x2 waits for room (t=50); z2 waits for z's max (t=110)
    assert _admits(per_queue) == {"x1": 0.0, "y1": 0.0, "x2": 50.0, "z1": 100.0, "z2": 110.0}


def test_cli_prints_the_table_and_writes_the_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "strand.yaml"
    path.write_text(yaml.safe_dump(STRAND, sort_keys=False))
    out = tmp_path / "out"
    assert simulate_main([str(path), "--baseline", "all", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "lower bound on Kueue" in text
    header = text.splitlines()[1].split()
    assert header == ["queue", "metric", "gpuq", "fifo", "per-queue"]
    stranded = [ln.split()[-3:] for ln in text.splitlines() if "stranded GPU-h" in ln]   # a, b, (all)
    assert stranded == [["0.083333", "0", "0.000556"], ["0.033333", "0.1", "0.1"], ["0.116667", "0.1", "0.100556"]]
    report = json.loads((out / "quality.json").read_text())
    assert report["policies"] == ["gpuq", "fifo", "per-queue"]
    assert report["queues"]["b"]["guarantee_violation_s"] == {"gpuq": 30.0, "fifo": 90.0, "per-queue": 90.0}
    # gpuq's own outputs are those of a plain simulate, byte for byte
    plain = run_scenario(str(path))
    assert (out / "events.jsonl").read_text() == plain.events_jsonl()
    for policy in ("fifo", "per-queue"):
        events = (out / f"baseline-{policy}" / "events.jsonl").read_text().splitlines()
        assert not any(json.loads(e)["event"] == "preempt" for e in events)
        assert json.loads((out / f"baseline-{policy}" / "summary.json").read_text())["preemptions"] == 0
    assert simulate_main([str(path), "--baseline", "per-queue", "--totals"]) == 0
    rows = capsys.readouterr().out.splitlines()[3:]
    assert rows[0].split()[:4] == ["(all)", "wait", "p50", "s"] and len(rows) == 9   # 8 metrics + count
    assert simulate_main([str(path), "--baseline", "fifo", "-f", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["policies"] == ["gpuq", "fifo"]


def test_cli_bad_policy_and_bad_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "strand.yaml"
    path.write_text(yaml.safe_dump(STRAND, sort_keys=False))
    assert simulate_main([str(path), "--baseline", "lifo"]) == 2
    assert "unknown policy lifo" in capsys.readouterr().err
    bad = dict(STRAND, workloads=[{"id": "w", "queue": "nope", "duration": 1}])
    path.write_text(yaml.safe_dump(bad, sort_keys=False))
    assert simulate_main([str(path), "--baseline", "fifo"]) == 2
    err = capsys.readouterr().err
    assert "workloads[0].queue" in err and str(path) in err


@pytest.mark.parametrize("name", ["classic-60-40", "gang-and-fallback", "hierarchy-max"])
def test_repository_scenarios_run_under_every_policy(name: str) -> None:
    from scheduler.simulator import load_scenario

    sc = load_scenario(REPO / "tests" / "scenarios" / f"{name}.yaml")
    report, results = baselines_run(sc, ["fifo", "per-queue"])
    assert list(results) == ["gpuq", "fifo", "per-queue"]
    assert results["gpuq"].events_jsonl() == run_scenario(REPO / "tests" / "scenarios" / f"{name}.yaml").events_jsonl()
    for policy in ("fifo", "per-queue"):
        admitted = {e["workload"] for e in results[policy].events if e["event"] == "admit"}
        submitted = {e["workload"] for e in results[policy].events if e["event"] == "submit"}
        rejected = {e["workload"] for e in results[policy].events if e["event"] == "reject"}
        assert admitted == submitted - rejected           # every workload runs in the end
        assert report["queues"]["(all)"]["preemptions"][policy] == 0


@pytest.mark.parametrize("policy", [fifo, per_queue], ids=["fifo", "per-queue"])
def test_baselines_see_the_devices_shares_hold(policy: Any) -> None:
    """A share placed by a baseline goes where the device has room: w1's 0.5 holds device 0, so
    w2's 0.75 opens device 1 (before the baselines passed the devices shares hold to their
    FreeIndex, w2 went onto device 0 too and the replay stopped: 'would hold 5/4 of one GPU')."""
    from tests.replay_rules import check_devices

    sc = {"name": "shares", "nodes": [{"name": "n", "gpu_type": "T4", "gpus": 2, "count": 1}],
          "queues": {"a": {"guaranteed": {"gpu": 2}}},
          "workloads": [{"id": "w1", "queue": "a", "submit": 0, "duration": 10, "gpus_per_pod": 0.5},
                        {"id": "w2", "queue": "a", "submit": 1, "duration": 10, "gpus_per_pod": 0.75},
                        {"id": "w3", "queue": "a", "submit": 2, "duration": 10, "gpus_per_pod": 0.5}]}
    events = simulate(parse_scenario(sc), policy).events
    assert [e["devices"] for e in events if e["event"] == "admit"] == \
           [{"n-0": {"0": 0.5}}, {"n-0": {"1": 0.75}}, {"n-0": {"0": 0.5}}]
    assert check_devices(sc, events).problems == []


def test_gpu_equivalents_side_by_side_only_where_set() -> None:
    """STRAND with its A100 worth 0.5 and an idle H100 node (worth 1) none of its work accepts: the
    same decisions; raw utilization over 24 GPUs, utilization_eq over 8 x 0.5 x 2 + 8 = 16 GPU-eq;
    the stranded A100s weigh half. STRAND itself (no equivalents) has no eq key (the test above)."""
    import copy

    data = copy.deepcopy(STRAND)
    data["gpu_types"] = {"A100": {"equivalent": 0.5}, "H100": {}}
    data["nodes"].append({"name": "h", "gpu_type": "H100", "gpus": 8})
    for w in data["workloads"]:
        w["gpu_types"] = ["A100"]
    q = _quality(data)
    plain = _quality(STRAND)
    assert [k for k in plain["a"]] == list(_METRICS)
    for name in ("a", "b", "(all)"):
        assert {k: q[name][k] for k in _METRICS if k != "utilization"} == \
            {k: plain[name][k] for k in _METRICS if k != "utilization"}, name        # same decisions
    total = q["(all)"]
    assert total["utilization"] == round(1640 / (24 * 190), 6)
    assert total["utilization_eq"] == round(1640 * 0.5 / (16 * 190), 6)
    assert (q["a"]["utilization_eq"], q["b"]["utilization_eq"]) == (round(1440 * 0.5 / (16 * 190), 6),
                                                                    round(200 * 0.5 / (16 * 190), 6))
    assert total["stranded_gpu_eq_hours"] == round(420 * 0.5 / 3600, 6)
    assert total["stranded_gpus_eq_avg"] == round(420 * 0.5 / 190, 6)
    assert q["b"]["stranded_gpu_eq_hours"] == round(120 * 0.5 / 3600, 6)
    report, _ = baselines_run(parse_scenario(data), ["fifo"])
    assert report["queues"]["(all)"]["utilization_eq"]["gpuq"] == total["utilization_eq"]
    report, _ = baselines_run(parse_scenario(STRAND), ["fifo"])
    assert "utilization_eq" not in report["queues"]["(all)"]


_METRICS = ("wait_p50_s", "wait_p90_s", "wait_p99_s", "utilization", "preemptions", "stranded_gpu_hours",
            "stranded_gpus_avg", "guarantee_violation_s")
