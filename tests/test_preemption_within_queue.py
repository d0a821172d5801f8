"""Issue 21: preemption within a queue (``within_queue: lower_priority``), the minimum runtime
(``min_runtime_s``) and what a preemption throws away (``lost_gpu_seconds``), one rule a case
(scheduler/preemption.py states the rules).

Base setup: one node of 8 A100; queue ``team`` (guaranteed 4) runs two 4-GPU workloads at
priority 0 (``old`` from t=0, ``young`` from t=10), and a 4-GPU workload of priority 5 is pending
in it. At now=100 (past the 30 s delay) the queue would go above its guarantee with it: only the
search within the queue may start it.
"""
from __future__ import annotations

from typing import Any

import pytest

from scheduler.errors import ScenarioError
from scheduler.model import ReasonCode, Running, lost_gpu_seconds
from scheduler.simulator import run_scenario
from scheduler.testing import cluster, cycle, run, victims, wl


def team(**spec: Any) -> dict[str, Any]:
    return {"team": {"guaranteed": {"gpu": 4}, **spec}, "other": {"guaranteed": {"gpu": 4}}}


def base_running(team_q: str = "team") -> list[Running]:
    return [run(wl("old", team_q, gpus=4), "A100", ("n-0", 4), start_s=0),
            run(wl("young", team_q, gpus=4), "A100", ("n-0", 4), start_s=10)]


def go(queues: dict[str, Any], pending_priority: int = 5, now: float = 100.0,
       running: list[Running] | None = None, pending: Any = None):  # type: ignore[no-untyped-def]
    c = cluster(queues, ("n", "A100", 8, 1))
    p = pending if pending is not None else [wl("p", "team", gpus=4, priority=pending_priority)]
    return cycle(c, p, base_running() if running is None else running, now=now)


def test_within_queue_takes_its_own_youngest_lower_priority_work() -> None:
    d = go(team(within_queue="lower_priority"))
    assert victims(d) == {"p": ("young",)}
    assert d.preemptions[0].reason == ("preempt within queue team (within_queue: lower_priority): priority 5 over "
                                       "work of priority 0 and below")


def test_without_within_queue_its_own_work_is_no_victim() -> None:
    d = go(team())
    assert victims(d) == {}
    (r,) = d.pending
    assert r.code is ReasonCode.NO_FIT and "above its guaranteed 4" in r.message


@pytest.mark.parametrize("priority", [0, -1])
def test_within_queue_takes_only_strictly_lower_priority(priority: int) -> None:
    d = go(team(within_queue="lower_priority"), pending_priority=priority)
    assert victims(d) == {}
    (r,) = d.pending
    assert r.code is ReasonCode.NO_VICTIMS
    assert (f"no lower-priority work of its queue team makes it fit (within_queue: 0 running workloads below "
            f"priority {priority} considered)") in r.message


def test_within_queue_is_inherited_and_may_be_set_back() -> None:
    queues = {"dept": {"within_queue": "lower_priority", "queues": team()}}
    running = base_running("dept.team")
    pending = [wl("p", "dept.team", gpus=4, priority=5)]
    assert victims(go(queues, running=running, pending=pending)) == {"p": ("young",)}
    queues["dept"]["queues"]["team"]["within_queue"] = "never"
    assert victims(go(queues, running=running, pending=pending)) == {}


def test_another_queue_above_its_guarantee_gives_first() -> None:
    """Between queues first (KAI's reclaim before its preempt); a set never mixes the two."""
    queues = {"team": {"guaranteed": {"gpu": 8}, "within_queue": "lower_priority"}, "other": {}}
    running = [run(wl("mine", "team", gpus=4), "A100", ("n-0", 4), start_s=50),
               run(wl("theirs", "other", gpus=4), "A100", ("n-0", 4), start_s=0)]
    d = go(queues, running=running)
    assert victims(d) == {"p": ("theirs",)}
    assert d.preemptions[0].reason.startswith("reclaim guaranteed for team")


def test_within_queue_keeps_every_max() -> None:
    """The guarantee does not bound a search within the queue, its chain's max does: a gang larger
    than what the max leaves after the victims waits."""
    queues = team(within_queue="lower_priority", max={"gpu": 8})
    d = go(queues, pending=[wl("p", "team", gpus=4, pods=3, priority=5)])
    assert victims(d) == {}


def test_min_runtime_protects_a_victim_until_it_has_run_that_long() -> None:
    queues = team(within_queue="lower_priority", min_runtime_s=120)
    d = go(queues, now=100.0)                # old ran 100 s, young 90 s: both protected
    assert victims(d) == {}
    (r,) = d.pending
    assert r.code is ReasonCode.NO_VICTIMS
    assert "2 more candidates are protected by min_runtime_s, the first until t=120 (in 20 s)" in r.message
    assert victims(go(queues, now=120.0)) == {"p": ("old",)}    # old is past it first
    assert victims(go(queues, now=130.0)) == {"p": ("young",)}  # then the youngest, as always


def test_min_runtime_holds_between_queues_too() -> None:
    queues = {"lo": {"min_runtime_s": 60}, "hi": {"guaranteed": {"gpu": 4}}}
    running = [run(wl("v", "lo", gpus=8), "A100", ("n-0", 8), start_s=50)]
    pending = [wl("p", "hi", gpus=4)]
    d = go(queues, running=running, pending=pending, now=100.0)
    (r,) = d.pending
    assert r.code is ReasonCode.NO_VICTIMS and "(0 running workloads considered)" in r.message
    assert "1 more candidate is protected by min_runtime_s, the first until t=110 (in 10 s)" in r.message
    assert victims(go(queues, running=running, pending=pending, now=110.0)) == {"p": ("v",)}


def scenario(**team_spec: Any) -> dict[str, Any]:
    return {
        "name": "within", "scheduler": {"preemption_delay_s": 0, "cycle_interval_s": 1},
        "nodes": [{"name": "n", "gpu_type": "A100", "gpus": 8}],
        "queues": {"team": {"guaranteed": {"gpu": 4}, **team_spec}},
        "workloads": [
            {"id": "a", "queue": "team", "submit": 0, "duration": 1000, "gpus_per_pod": 4},
            {"id": "b", "queue": "team", "submit": 0, "duration": 1000, "gpus_per_pod": 4, "checkpoint": True},
            {"id": "p", "queue": "team", "submit": 7, "duration": 10, "gpus_per_pod": 8, "priority": 1},
        ]}


def test_the_simulator_wakes_when_protection_ends_and_counts_the_loss() -> None:
    r = run_scenario(scenario(within_queue="lower_priority", min_runtime_s=50))
    pre = [e for e in r.events if e["event"] == "preempt"]
    # no cycle would run between t=7 and a's end at 1000 but for the end of protection at t=50
    assert [(e["t"], e["workload"], e["lost_gpu_seconds"]) for e in pre] == [(50.0, "a", 200.0), (50.0, "b", 0.0)]
    assert r.summary["lost_gpu_seconds"] == 200.0 and r.summary["preemptions"] == 2
    assert not [e for e in run_scenario(scenario()).events if e["event"] == "preempt"]
    assert "lost_gpu_seconds" not in run_scenario(scenario()).summary       # nothing preempted: as before


@pytest.mark.parametrize(("key", "value", "message"), [
    ("within_queue", "yes", "queues.team.within_queue: expected one of never, lower_priority, got 'yes'"),
    ("min_runtime_s", -1, "queues.team.min_runtime_s: must be a non-negative number of seconds, got -1"),
])
def test_a_bad_key_in_a_scenario_names_its_place(key: str, value: Any, message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        run_scenario(scenario(**{key: value}))
    assert message in str(err.value)


def test_lost_gpu_seconds_counts_from_the_last_checkpoint_in_this_run() -> None:
    r = run(wl("v", "q", gpus=4, pods=2), "A100", ("n-0", 8), start_s=100)
    assert lost_gpu_seconds(r, 400) == 8 * 300
    assert lost_gpu_seconds(r, 400, 350) == 8 * 50
    assert lost_gpu_seconds(r, 400, 40) == 8 * 300        # a checkpoint of an earlier run saves nothing of this
    assert lost_gpu_seconds(r, 400, 900) == 0.0           # a clock ahead: nothing lost, never negative
