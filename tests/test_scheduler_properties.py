"""Property test: random small scenarios replayed through the simulator; an independent checker
(tests/replay_rules.py; it shares no code with the scheduler beyond the queue-config parser) walks
the events and checks every rule of docs/SCENARIOS.md and what each device holds, and a second
run must give the same bytes."""
from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.simulator import run_scenario
from tests.replay_rules import Checker

TYPES = ("H100", "A100")


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    groups = [(t, draw(st.sampled_from([2, 4, 8, 8])), draw(st.integers(0 if t == "A100" else 1, 2)))
              for t in TYPES]
    groups = [g for g in groups if g[2]]
    nodes = [{"name": f"g{i}", "gpu_type": t, "gpus": g, "count": c} for i, (t, g, c) in enumerate(groups)]
    total = sum(g * c for _, g, c in groups)
    ga = draw(st.integers(0, total))
    gb = draw(st.integers(0, total - ga))
    a: dict[str, Any] = {"guaranteed": {"gpu": ga}}
    if draw(st.booleans()):
        a["max"] = {"gpu": draw(st.integers(max(ga, 1), total))}
    queues: dict[str, Any] = {"a": a, "b": {"guaranteed": {"gpu": gb}}}
    leaves = ["a", "b"]
    if draw(st.booleans()):
        gx = draw(st.integers(0, ga))
        x: dict[str, Any] = {"guaranteed": {"gpu": gx}}
        if draw(st.booleans()):
            x["max"] = {"gpu/H100": draw(st.integers(0, 16))}
        a["queues"] = {"x": x, "y": {"guaranteed": {"gpu": draw(st.integers(0, ga - gx))}}}
        leaves = ["a.x", "a.y", "b"]
    if draw(st.integers(0, 3)):
        queues["c"] = {}                                   # no guarantee: borrows early, gets preempted
        leaves.append("c")
    if draw(st.booleans()):                                # a queue policy: what a's workloads may ask
        a["policy"] = {"max_priority": draw(st.integers(0, 2)), "non_preemptible": draw(st.booleans())}
        if "queues" in a and draw(st.booleans()):
            a["queues"]["x"]["policy"] = {"max_priority": draw(st.integers(0, a["policy"]["max_priority"]))}
    for leaf in ("a", "b"):                                # issue 21: within a queue, a minimum runtime
        if draw(st.integers(0, 2)) == 0:
            queues[leaf]["within_queue"] = "lower_priority"
        if draw(st.integers(0, 2)) == 0:
            queues[leaf]["min_runtime_s"] = draw(st.sampled_from([5, 40, 120]))
    workloads = []
    for i in range(draw(st.integers(2, 10))):
        types = draw(st.sampled_from([[], ["H100"], ["A100"], ["H100", "A100"], ["A100", "H100"]]))
        queue = draw(st.sampled_from(leaves))
        workloads.append({
            "id": f"w{i}", "queue": queue,
            "submit": draw(st.integers(0, 10 if queue == "c" else 80)), "duration": draw(st.integers(1, 300)),
            "pods": draw(st.sampled_from([1, 1, 2, 3])),
            "gpus_per_pod": draw(st.sampled_from([1, 2, 4, 4, 8, 0.5, 0.25, 0.375, 0.7])),   # shares: issue 19
            "gpu_types": types, "priority": draw(st.integers(0, 2)),
            "preemptible": draw(st.booleans()) or draw(st.booleans()),
            "checkpoint": draw(st.booleans()),
        })
    if draw(st.booleans()):                                # flood: one queue fills the cluster first
        small = min(g for _, g, _ in groups)
        flood = draw(st.sampled_from(leaves))
        for j in range(total // small):
            workloads.append({"id": f"f{j}", "queue": flood, "submit": 0, "duration": draw(st.integers(50, 400)),
                              "gpus_per_pod": small, "priority": draw(st.integers(0, 1)),
                              "originator": j == 0, "checkpoint": j % 2 == 1})
    sched = {"preemption": draw(st.booleans()) or draw(st.booleans()),
             "preemption_delay_s": draw(st.sampled_from([0, 5, 5, 30])),
             "cycle_interval_s": draw(st.sampled_from([1, 2.5, 10]))}
    if draw(st.booleans()):                                # issue 21: reclaim toward the entitlement
        sched["reclaim"] = "fair_share"
        for spec in (queues["a"], queues["b"], *queues["a"].get("queues", {}).values()):
            spec["weight"] = draw(st.sampled_from([0, 1, 1, 2, 3, 0.5]))
    if draw(st.integers(0, 3)) == 0:                      # issue 21: fair share over time, beside the rest
        sched["usage_half_life_s"] = draw(st.sampled_from([30, 600, 86400]))
    return {"name": "random", "scheduler": sched, "nodes": nodes, "queues": queues, "workloads": workloads}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_scenarios_keep_every_rule(sc: dict[str, Any]) -> None:
    first = run_scenario(sc)
    Checker(sc).check(list(first.events))
    assert run_scenario(sc).events_jsonl() == first.events_jsonl()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_cross_cycle_memos_never_change_a_decision(sc: dict[str, Any]) -> None:
    """Every cycle of a replay decides the same (admissions, preemptions, each reason and its
    position) with the memos the cluster keeps across cycles as on a cluster with none."""
    import dataclasses

    from scheduler.cycle import schedule
    from scheduler.memo import CycleMemo
    from scheduler.simulator import parse_scenario
    from scheduler.simulator.engine import simulate

    def checked(snap: Any, now: float) -> Any:
        warm = schedule(snap, now)
        cold = dataclasses.replace(snap, cluster=dataclasses.replace(snap.cluster, memo=CycleMemo()))
        assert schedule(cold, now) == warm
        return warm

    simulate(parse_scenario(sc), checked)
