"""A scenario's optional ``fixed:`` load (docs/SCENARIOS.md, "Fixed load"): GPUs held on a node
from a start to an end by work the scheduler does not schedule. It keeps its node's GPUs from
gpuq's work, counts for its queue's max and guarantee when it has one, is never preempted, moves
to another node of its type when its own is busy and is displaced when none has room; its fields
are checked like any other; a scenario without it has no ``fixed`` in its summary."""
from __future__ import annotations

from typing import Any

import pytest

from scheduler.errors import ScenarioError
from scheduler.quality import quality
from scheduler.simulator import parse_scenario, run_scenario


def scenario(fixed: list[dict[str, Any]], workloads: list[dict[str, Any]], **queues: Any) -> dict[str, Any]:
    return {"nodes": [{"name": "n", "gpu_type": "A100", "gpus": 8, "count": 2}, {"name": "h", "gpu_type": "H100", "gpus": 8}],
            "queues": queues or {"a": {"guaranteed": {"gpu": 8}}, "b": {"guaranteed": {"gpu": 8}, "max": {"gpu": 8}}},
            "fixed": fixed, "workloads": workloads}


def admits(result: Any) -> dict[str, tuple[float, dict[str, int]]]:
    return {e["workload"]: (e["t"], e["placement"]) for e in result.events if e["event"] == "admit"}


def test_fixed_load_holds_its_node_until_its_end() -> None:
    r = run_scenario(scenario(
        [{"id": "x", "node": "n-0", "gpus": 6, "start": 10, "end": 500}, {"id": "y", "node": "n-1", "gpus": 8, "start": 0, "end": 300}],
        [{"id": "w", "queue": "a", "submit": 20, "duration": 100, "gpus_per_pod": 4, "gpu_types": ["A100"]}]))
    assert admits(r)["w"] == (300.0, {"n-1": 4})             # 2 free on n-0, none on n-1 until y ends
    # the replay ends with its last event (w's finish at 400): x is counted up to there
    assert r.summary["fixed"] == {"held": 2, "displaced": [], "gpu_seconds": 6 * 390 + 8 * 300}
    assert [e["workload"] for e in r.events] == ["w", "w", "w"]   # fixed load makes no event


def test_fixed_load_counts_for_its_queue_and_is_never_a_victim() -> None:
    r = run_scenario(scenario(
        [{"id": "b-pods", "node": "h", "gpus": 4, "start": 0, "end": 1000, "queue": "b"}],
        [{"id": "bw", "queue": "b", "submit": 0, "duration": 100, "gpus_per_pod": 8},
         {"id": "aw", "queue": "a", "submit": 0, "duration": 2000, "gpus_per_pod": 8, "count": 2},
         {"id": "bx", "queue": "b", "submit": 10, "duration": 100, "gpus_per_pod": 4}]))
    got = admits(r)
    assert got["bw"][0] == 1000.0          # b's max is 8: its fixed 4 leave room for 4 until it ends
    assert got["bx"][0] == 10.0 and got["bx"][1] == {"h": 4}
    assert all(e["event"] != "preempt" for e in r.events)
    sc = parse_scenario(scenario(
        [{"id": "b-pods", "node": "h", "gpus": 4, "start": 0, "end": 1000, "queue": "b"}],
        [{"id": "bw", "queue": "b", "submit": 0, "duration": 100, "gpus_per_pod": 8}]))
    res = run_scenario(sc)
    # b holds 4 of its guaranteed 8 (the fixed load): an 8-GPU gang would take it over, so no violation
    assert quality(sc.cluster, sc.workloads, res.events, res.summary, res.held)["b"]["guarantee_violation_s"] == 0.0
    assert quality(sc.cluster, sc.workloads, res.events, res.summary)["b"]["guarantee_violation_s"] == 1000.0


def test_busy_node_moves_fixed_load_or_displaces_it() -> None:
    r = run_scenario(scenario(
        [{"id": "moved", "node": "n-0", "gpus": 4, "start": 5, "end": 50},
         {"id": "gone", "node": "n-0", "gpus": 8, "start": 6, "end": 50}],
        [{"id": "w", "queue": "a", "submit": 0, "duration": 100, "gpus_per_pod": 8, "gpu_types": ["A100"]}]))
    assert admits(r)["w"] == (0.0, {"n-0": 8})
    assert [(h.id, h.placement) for h in r.held] == [("moved", {"n-1": 4})]
    assert r.summary["fixed"]["displaced"] == ["gone"]


def test_without_fixed_load_the_summary_is_as_before() -> None:
    r = run_scenario({"nodes": [{"name": "n", "gpu_type": "A100", "gpus": 8}], "queues": {"a": {}},
                      "workloads": [{"id": "w", "queue": "a", "duration": 10}]})
    assert "fixed" not in r.summary and r.held == ()


@pytest.mark.parametrize("entry, message", [
    ({"id": "x", "node": "m-0", "gpus": 1}, "fixed[0].node: unknown node 'm-0'; nodes: n-0, n-1, h"),
    ({"id": "x", "node": "h", "gpus": 9}, "fixed[0].gpus: 9 GPUs, but node h has 8"),
    ({"id": "x", "node": "h", "gpus": 0}, "fixed[0].gpus: expected a positive integer"),
    ({"id": "x", "node": "h", "gpus": 1, "start": 5, "end": 5}, "fixed[0].end: expected a time after start (5)"),
    ({"id": "x", "node": "h", "gpus": 1, "queue": "root"}, "fixed[0].queue: not a leaf queue: 'root'"),
    ({"node": "h", "gpus": 1}, "fixed[0].id: required field missing"),
    ({"id": "x", "node": "h", "gpus": 1, "until": 3}, "fixed[0].until: unknown field"),
])
def test_fixed_load_fields_are_checked(entry: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as exc:
        parse_scenario(scenario([entry], []), source="s.yaml")
    assert message in str(exc.value) and str(exc.value).startswith("s.yaml: ")
