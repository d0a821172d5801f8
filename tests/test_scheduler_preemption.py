"""One case per preemption rule; each fails if its rule is broken (see scheduler/preemption.py).

Base setup: 2 nodes of 8 A100. Queue ``lo`` (guaranteed 0) holds both nodes with two 8-GPU
workloads started at t=0 and t=10; queue ``hi`` (guaranteed 8) has a pending 8-GPU workload
submitted at t=0. At now=100 (past the 30 s delay) ``hi`` may take one node back.
"""
from __future__ import annotations

from typing import Any

import pytest

from scheduler.model import ReasonCode
from scheduler.testing import admitted, cluster, cycle, run, victims, wl

QUEUES: dict[str, Any] = {"lo": {"max": {"gpu": 16}}, "hi": {"guaranteed": {"gpu": 8}}}


def base(**over: Any) -> dict[str, Any]:
    case: dict[str, Any] = {
        "queues": QUEUES,
        "groups": [("n", "A100", 8, 2)],
        "running": [
            run(wl("old", "lo"), "A100", ("n-0", 8), start_s=0),
            run(wl("young", "lo"), "A100", ("n-1", 8), start_s=10),
        ],
        "pending": [wl("p", "hi")],
        "now": 100.0,
        "kw": {},
    }
    case.update(over)
    return case


def go(case: dict[str, Any]):  # type: ignore[no-untyped-def]
    c = cluster(case["queues"], *case["groups"])
    return cycle(c, case["pending"], case["running"], now=case["now"], **case["kw"])


CASES = [
    # rule: the baseline is allowed; the youngest is taken (least work lost), exactly one victim
    pytest.param(base(), {"p": ("young",)}, None, id="baseline-youngest-single-victim"),
    # rule: preemptor's queue must stay <= guaranteed after admission (needs 16 > 8)
    pytest.param(base(pending=[wl("p", "hi", pods=2)]), {}, ReasonCode.NO_FIT, id="preemptor-over-guarantee"),
    # rule: a queue without guaranteed never preempts
    pytest.param(base(queues={"lo": {}, "hi": {}}), {}, ReasonCode.NO_FIT, id="no-guarantee-no-preemption"),
    # rule: victim queue never taken below its guaranteed (lo guaranteed 16 = what it holds)
    pytest.param(base(queues={"lo": {"guaranteed": {"gpu": 16}}, "hi": {"guaranteed": {"gpu": 8}}}),
                 {}, ReasonCode.NO_VICTIMS, id="victim-floor-leaf"),
    # rule: floor holds for a victim's ancestor that is not shared with the preemptor
    pytest.param(base(
        queues={"org": {"guaranteed": {"gpu": 16}, "queues": {"lo": {}}}, "hi": {"guaranteed": {"gpu": 8}}},
        running=[run(wl("old", "org.lo"), "A100", ("n-0", 8)), run(wl("young", "org.lo"), "A100", ("n-1", 8))]),
        {}, ReasonCode.NO_VICTIMS, id="victim-floor-unshared-ancestor"),
    # rule: a shared ancestor's guarantee does not protect the victim (both under org)
    pytest.param(base(
        queues={"org": {"guaranteed": {"gpu": 16}, "queues": {"lo": {}, "hi": {"guaranteed": {"gpu": 8}}}}},
        running=[run(wl("old", "org.lo"), "A100", ("n-0", 8)),
                 run(wl("young", "org.lo"), "A100", ("n-1", 8), start_s=10)],
        pending=[wl("p", "org.hi")]),
        {"p": ("young",)}, None, id="shared-ancestor-not-a-floor"),
    # rule: victim priority <= preemptor priority
    pytest.param(base(running=[run(wl("old", "lo", priority=1), "A100", ("n-0", 8)),
                               run(wl("young", "lo", priority=1), "A100", ("n-1", 8))]),
                 {}, ReasonCode.NO_VICTIMS, id="victim-priority-higher"),
    pytest.param(base(running=[run(wl("old", "lo", priority=1), "A100", ("n-0", 8)),
                               run(wl("young", "lo", priority=1), "A100", ("n-1", 8), start_s=10)],
                      pending=[wl("p", "hi", priority=1)]),
                 {"p": ("young",)}, None, id="victim-priority-equal-ok"),
    # rule: non-preemptible work is never a victim
    pytest.param(base(running=[run(wl("old", "lo", preemptible=False), "A100", ("n-0", 8)),
                               run(wl("young", "lo", preemptible=False), "A100", ("n-1", 8))]),
                 {}, ReasonCode.NO_VICTIMS, id="non-preemptible"),
    # rule: fenced subtrees neither lose nor take by preemption
    pytest.param(base(queues={"lo": {"preemption": {"fence": True}}, "hi": {"guaranteed": {"gpu": 8}}}),
                 {}, ReasonCode.FENCED, id="fenced-victim"),
    pytest.param(base(queues={"lo": {}, "hi": {"guaranteed": {"gpu": 8}, "preemption": {"fence": True}}}),
                 {}, ReasonCode.FENCED, id="fenced-preemptor"),
    # rule: the preemption delay since submit (30 s by default)
    pytest.param(base(now=29.0), {}, ReasonCode.WAITING_PREEMPTION_DELAY, id="delay-not-passed"),
    pytest.param(base(now=30.0), {"p": ("young",)}, None, id="delay-just-passed"),
    # rule: preemption can be switched off
    pytest.param(base(kw={"preemption": False}), {}, ReasonCode.NO_FIT, id="preemption-off"),
    # rule: no preemption while free capacity would do
    pytest.param(base(groups=[("n", "A100", 8, 3)]), {}, None, id="free-capacity-no-preemption"),
    # candidate order: originators last
    pytest.param(base(running=[run(wl("old", "lo"), "A100", ("n-0", 8)),
                               run(wl("young", "lo", originator=True), "A100", ("n-1", 8), start_s=10)]),
                 {"p": ("old",)}, None, id="originator-last"),
    # candidate order: lower priority before younger
    pytest.param(base(running=[run(wl("old", "lo", priority=-1), "A100", ("n-0", 8)),
                               run(wl("young", "lo"), "A100", ("n-1", 8), start_s=10)]),
                 {"p": ("old",)}, None, id="lower-priority-first"),
    # candidate order: idle GPUs before busy ones of the same age
    pytest.param(base(running=[run(wl("a", "lo"), "A100", ("n-0", 8)),
                               run(wl("b", "lo"), "A100", ("n-1", 8), idle=True)]),
                 {"p": ("b",)}, None, id="idle-first"),
    # victims must make it fit on a real node: x and y free 8 GPUs but on two nodes; the gang
    # victim goes whole (both its pods), and y is given back as not needed
    pytest.param(base(running=[run(wl("gang", "lo", gpus=4, pods=2), "A100", ("n-0", 4), ("n-1", 4)),
                               run(wl("x", "lo", gpus=4), "A100", ("n-0", 4), start_s=5),
                               run(wl("y", "lo", gpus=4), "A100", ("n-1", 4), start_s=5)]),
                 {"p": ("x", "gang")}, None, id="must-fit-on-a-real-node"),
    # minimal set: greedy adds v1 (youngest; frees only half of n-0) then v2; v1 is given back
    pytest.param(base(running=[run(wl("keep", "lo", gpus=4, preemptible=False), "A100", ("n-0", 4)),
                               run(wl("v1", "lo", gpus=4), "A100", ("n-0", 4), start_s=10),
                               run(wl("v2", "lo"), "A100", ("n-1", 8), start_s=0)]),
                 {"p": ("v2",)}, None, id="minimal-set"),
    # quota: a shared parent's max is full; preempting the sibling frees it (capacity is free)
    pytest.param(base(queues={"r": {"max": {"gpu": 8}, "queues": {"lo": {}, "hi": {"guaranteed": {"gpu": 8}}}}},
                      groups=[("n", "A100", 8, 2)],
                      running=[run(wl("sib", "r.lo"), "A100", ("n-0", 8))],
                      pending=[wl("p", "r.hi")]),
                 {"p": ("sib",)}, None, id="quota-parent-max"),
]


@pytest.mark.parametrize(("case", "expect_victims", "code"), CASES)
def test_preemption_rule(case: dict[str, Any], expect_victims: dict[str, tuple[str, ...]],
                         code: ReasonCode | None) -> None:
    d = go(case)
    assert victims(d) == expect_victims
    if code is None:
        assert "p" in admitted(d)
    else:
        assert "p" not in admitted(d)
        reason = d.reason("p")
        assert reason is not None and reason.code is code, reason


def test_victim_gang_goes_whole_and_preemptor_gets_the_freed_gpus() -> None:
    c = cluster(QUEUES, ("n", "A100", 8, 2))
    gang = run(wl("gang", "lo", gpus=8, pods=2), "A100", ("n-0", 8), ("n-1", 8))
    d = cycle(c, [wl("p", "hi")], [gang], now=100)
    assert victims(d) == {"p": ("gang",)}
    assert admitted(d) == {"p": {"n-0": 8}}
    # the other half of the gang is not handed to anyone else in the same cycle by mistake:
    # the rest is free capacity and its own queue's workload may use it only within its max
    assert d.admissions[0].victims == ("gang",)


def test_preemptions_precede_their_admission_and_are_recorded_with_reason() -> None:
    d = go(base())
    (p,) = d.preemptions
    assert (p.preemptor, p.queue, p.victims) == ("p", "hi", ("young",))
    assert p.reason == "reclaim guaranteed for hi: holds 0 of guaranteed 8 gpu, needs 8"


def test_delay_reason_says_when() -> None:
    d = go(base(now=20.0))
    r = d.reason("p")
    assert r is not None and r.message.endswith("may preempt at t=30 (in 10 s, delay 30 s)")


def test_same_cycle_preemptors_do_not_share_victims() -> None:
    c = cluster({"lo": {}, "hi": {"guaranteed": {"gpu": 16}}}, ("n", "A100", 8, 2))
    running = [run(wl("a", "lo"), "A100", ("n-0", 8)), run(wl("b", "lo"), "A100", ("n-1", 8))]
    d = cycle(c, [wl("p1", "hi"), wl("p2", "hi")], running, now=100)
    got = victims(d)
    assert set(got) == {"p1", "p2"} and set(got["p1"]) | set(got["p2"]) == {"a", "b"}
    assert len(got["p1"]) == len(got["p2"]) == 1


def test_workload_over_guarantee_waits_without_preemption_message() -> None:
    d = go(base(pending=[wl("p", "hi", pods=2)]))
    r = d.reason("p")
    assert r is not None and "no preemption: queue hi would hold 16 gpu, above its guaranteed 8" in r.message


@pytest.mark.parametrize(("fenced_queue", "code", "tail"), [
    pytest.param(False, ReasonCode.NO_VICTIMS, "no allowed victim set makes it fit (2 running workloads considered)",
                 id="counts-candidates-of-every-type"),
    pytest.param(True, ReasonCode.FENCED, "no victim set inside its preemption fence; 1 candidates are across a fence",
                 id="counts-fenced-candidates-of-every-type"),
])
def test_failed_search_counts_candidates_on_other_types(fenced_queue: bool, code: ReasonCode, tail: str) -> None:
    """The search for an H100 preemptor looks only at H100 victims, yet its reason counts every
    candidate it could take by the rules (any type; not higher priority, not its own queue)."""
    c = cluster({"lo": {}, "hi": {"guaranteed": {"gpu": 16}}, "f": {"preemption": {"fence": fenced_queue}}},
                ("h", "H100", 8, 1), ("a", "A100", 8, 2))
    running = [run(wl("x", "lo", priority=5), "H100", ("h-0", 8)), run(wl("y", "lo"), "A100", ("a-0", 8)),
               run(wl("z", "f"), "A100", ("a-1", 8))]
    r = cycle(c, [wl("p", "hi", types=("H100",))], running).reason("p")
    assert r is not None and r.code is code
    assert r.message == f"no node of type H100 with 8 free GPUs (largest free: 0); {tail}"


@pytest.mark.parametrize(("queues", "expect"), [
    # the lower queue priority goes first, though its workload is older than the other's
    ({"a": {"priority": 0}, "b": {"priority": 1}}, "a.w"),
    ({"a": {"priority": 1}, "b": {"priority": 0}}, "b.w"),
    # equal priorities: today's order (the youngest, b's)
    ({"a": {}, "b": {}}, "b.w"),
    # departments first (KAI's order, parent queue first): d1 (priority 0) before d2 (priority 1),
    # though d1's queue is at priority 5 and d2's at -5
    ({"d1": {"priority": 0, "queues": {"a": {"priority": 5}}},
      "d2": {"priority": 1, "queues": {"b": {"priority": -5}}}}, "d1.a.w"),
    # a shallower queue counts as priority 0 at the levels below it: (0, 0) before d2's (0, 1)
    ({"a": {}, "d2": {"queues": {"b": {"priority": 1}}}}, "a.w"),
])
def test_victims_come_from_the_lowest_priority_queue_first(queues: dict[str, Any], expect: str) -> None:
    """The victim order (scheduler/preemption.py's docstring): the victim's queue rank first,
    the queue ``priority`` along its chain from the top, then today's order within it."""
    tree = {**queues, "hi": {"guaranteed": {"gpu": 8}}}
    leaves = [q for q in ("a", "b", "d1.a", "d2.b") if q.split(".")[0] in queues]
    old, young = leaves
    c = cluster(tree, ("n", "A100", 8, 2))
    running = [run(wl(f"{old}.w", old), "A100", ("n-0", 8), start_s=0),
               run(wl(f"{young}.w", young), "A100", ("n-1", 8), start_s=10)]
    d = cycle(c, [wl("p", "hi")], running, now=100.0)
    assert victims(d) == {"p": (expect,)}
