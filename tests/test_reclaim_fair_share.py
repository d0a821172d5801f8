"""``scheduler.reclaim: fair_share`` (issue 21): the entitlement (the GPUs beyond the guarantees
divided by weight, :func:`accounting.fairshare.entitlements`), reclaiming toward it, the victim
floor at it, the reasons, the scenario key, and the entitlement in the accounting's now view (what
``/queues`` and ``gpuq queues`` show), and the mode beside ``within_queue`` and
``usage_half_life_s`` (each replay held to every rule by tests/replay_rules.py). KAI-Scheduler's own
fair-share cases: tests/test_kai_cases.py; the mode's invariants over random scenarios:
tests/test_scheduler_properties.py."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from accounting.fairshare import Division, Want, entitlements
from accounting.now import NowSnapshot, compute_now
from accounting.queues import ROOT, parse_queue_config
from gpuq.settings import SchedulerSettings
from scheduler.errors import ScenarioError
from scheduler.model import ReasonCode
from scheduler.simulator import run_scenario
from scheduler.testing import cluster, cycle, run, victims, wl
from tests.accounting_helpers import T0, alloc, node, pending, resolver
from tests.replay_rules import Checker


def _flat(pool: int, **wants: Want) -> dict[str, Any]:
    got = entitlements(pool, {ROOT: tuple(wants)}, wants, ROOT)
    del got[ROOT]
    return got


def test_entitlement_divides_beyond_the_guarantees_by_weight_in_whole_gpus() -> None:
    # 8 GPUs, guarantees 1 + 1, weights 1:1: the 6 beyond split 3 and 3 (KAI reclaim_test/10)
    assert _flat(8, a=Want(1, 8, None, 1), b=Want(1, 8, None, 1)) == {"a": 4, "b": 4}
    # weights 2:1 on the 4 beyond: 2.67 and 1.33 rounded down, the GPU left to the larger fraction
    assert _flat(7, a=Want(2, 5, None, 2), b=Want(1, 3, None, 1)) == {"a": 5, "b": 2}
    # weights 4:2 on 2 beyond: 1.33 and 0.67 -> 1 and 0, the GPU left to b's larger fraction cut off
    # (KAI's "bigger remaining", reclaim_test/19), not to a's larger weight
    assert _flat(8, a=Want(4, 7, None, 4), b=Want(2, 3, None, 2)) == {"a": 5, "b": 3}
    # equal fractions: the larger weight, then queue-file order
    assert _flat(1, a=Want(0, 5, None, 1), b=Want(0, 5, None, 1), c=Want(0, 5, None, 1)) == {"a": 1, "b": 0, "c": 0}
    assert _flat(2, a=Want(0, 5, None, 1), b=Want(0, 5, None, 2), c=Want(0, 5, None, 1)) == {"a": 1, "b": 1, "c": 0}


def test_entitlement_is_capped_by_demand_and_max_and_what_one_leaves_goes_round_again() -> None:
    # a wants 2 only: it is satisfied in the first round, and b takes the rest in a second
    assert _flat(10, a=Want(0, 2, None, 1), b=Want(0, 20, None, 1)) == {"a": 2, "b": 8}
    # a max of 3 caps a the same way
    assert _flat(10, a=Want(0, 20, 3, 1), b=Want(0, 20, None, 1)) == {"a": 3, "b": 7}
    # nobody wants the rest: it stays undivided
    assert _flat(10, a=Want(1, 2, None, 1), b=Want(0, 3, None, 1)) == {"a": 2, "b": 3}
    # a demand of shares caps exactly: 2.5, not 2 or 3
    assert _flat(4, a=Want(1, 2, None, 3), b=Want(2, Decimal("2.5"), None, 1)) == {"a": 2, "b": 2}
    assert _flat(6, a=Want(0, Decimal("2.5"), None, 1), b=Want(0, 9, None, 1)) == {"a": Decimal("2.5"), "b": Decimal("3.5")}


def test_weight_zero_means_no_share_beyond_the_guarantee() -> None:
    assert _flat(8, a=Want(2, 8, None, 0), b=Want(1, 8, None, 1)) == {"a": 2, "b": 6}
    assert _flat(8, a=Want(2, 8, None, 0), b=Want(1, 1, None, 0)) == {"a": 2, "b": 1}
    cfg = parse_queue_config({"queues": {"a": {"weight": 0}}})
    assert cfg.queues["a"].weight == 0.0


def test_guarantees_above_the_pool_are_each_queue_s_floor() -> None:
    assert _flat(4, a=Want(3, 5, None, 1), b=Want(3, 5, None, 1)) == {"a": 3, "b": 3}


def test_entitlement_goes_level_by_level_down_the_tree() -> None:
    kids = {ROOT: ("d1", "d2"), "d1": ("q0",), "d2": ("q1", "q2")}
    wants = {"d1": Want(1, 5, None, 1), "q0": Want(1, 5, None, 1), "d2": Want(1, 8, None, 1),
             "q1": Want(0, 4, None, 3), "q2": Want(0, 4, None, 1)}
    got = entitlements(8, kids, wants, ROOT)
    assert (got["d1"], got["d2"]) == (4, 4)           # KAI reclaim_test/15's departments
    assert (got["q1"], got["q2"]) == (3, 1)            # d2's 4 by weight 3:1
    assert got["q0"] == 4


def test_an_incremental_division_is_the_full_one_after_every_change() -> None:
    # the forecasts' timeline divides again only the levels a changed demand reaches
    # (accounting.fairshare.Division): after each change, the full division's amounts and only
    # the queues whose amount moved reported; random trees of three levels, shares of one GPU,
    # weights not whole, maxes, weight 0, queues with no demand
    import random

    rng = random.Random(3)
    for _ in range(30):
        kids: dict[str, tuple[str, ...]] = {ROOT: tuple(f"d{i}" for i in range(rng.randint(1, 4)))}
        for d in kids[ROOT]:
            kids[d] = tuple(f"{d}q{j}" for j in range(rng.randint(0, 5)))
        names = [q for q in kids if q != ROOT] + [q for d in kids[ROOT] for q in kids[d]]

        def want() -> Want | None:
            if rng.random() < 0.2:
                return None
            return Want(rng.choice((0, 0, 1, 2)), rng.choice((rng.randint(1, 40), Decimal(rng.randint(1, 80)) / 4)),
                        rng.choice((None, None, rng.randint(1, 30))), rng.choice((1.0, 2.0, 0.5, 0.0)))

        wants = {q: w for q in names if (w := want()) is not None}
        pool = rng.randint(0, 60)
        div = Division(pool, kids, wants, ROOT)
        assert div.of == entitlements(pool, kids, wants, ROOT)
        for _ in range(20):
            change = {q: want() for q in rng.sample(names, min(len(names), rng.randint(1, 3)))}
            before = dict(div.of)
            moved = div.update(change)
            for q, w in change.items():
                if w is None:
                    wants.pop(q, None)
                else:
                    wants[q] = w
            full = entitlements(pool, kids, wants, ROOT)
            assert div.of == full
            assert moved == {q for q in full if full[q] != before[q]}


QUEUES = {"a": {"guaranteed": {"gpu": 1}, "weight": 1}, "b": {"guaranteed": {"gpu": 1}, "weight": 1}}


def test_a_queue_below_its_entitlement_reclaims_and_the_reason_says_entitlement() -> None:
    c = cluster(QUEUES, ("n", "H100", 8, 1))
    b1, b2 = wl("b1", "b", 4), wl("b2", "b", 4)
    running = [run(b1, "H100", ("n-0", 4), start_s=0), run(b2, "H100", ("n-0", 4), start_s=1)]
    pend = [wl("a1", "a", 4, submit_s=2), wl("a2", "a", 4, submit_s=2)]
    # guarantee: a holds 0 of guaranteed 1, a gang of 4 would take it above: no preemption
    d = cycle(c, pend, running, now=100)
    assert not d.preemptions
    assert "above its guaranteed 1" in d.reason("a1").message
    d = cycle(c, pend, running, now=100, reclaim="fair_share")
    assert victims(d) == {"a1": ("b2",)}               # the youngest of b, b stays at its entitlement 4
    assert d.preemptions[0].reason == "reclaim entitlement for a: holds 0 of entitlement 4 gpu (guaranteed 1), needs 4"
    r = d.reason("a2")                                 # a would hold 8 of its entitlement 4
    assert r.code is ReasonCode.NO_FIT
    assert r.message.endswith("no preemption: queue a would hold 8 gpu, above its guaranteed 1 and its entitlement 4")


def test_a_preemption_within_the_guarantee_says_guarantee_under_fair_share_too() -> None:
    c = cluster({"a": {"guaranteed": {"gpu": 4}}, "b": {}}, ("n", "H100", 8, 1))
    running = [run(wl("b1", "b", 4), "H100", ("n-0", 4)), run(wl("b2", "b", 4), "H100", ("n-0", 4), start_s=1)]
    d = cycle(c, [wl("a1", "a", 4)], running, reclaim="fair_share")
    assert victims(d) == {"a1": ("b2",)}
    assert d.preemptions[0].reason.startswith("reclaim guaranteed for a: holds 0 of guaranteed 4 gpu")


def test_no_victim_s_queue_goes_below_its_entitlement() -> None:
    # b's one job holds 8; a (guaranteed 4) would take it under guarantee, and leave b at 0, below
    # its entitlement of 4 (b wants 8, a 4: the 4 beyond a's guarantee are b's)
    c = cluster({"a": {"guaranteed": {"gpu": 4}}, "b": {}}, ("n", "H100", 8, 1))
    running = [run(wl("b1", "b", 8), "H100", ("n-0", 8))]
    assert victims(cycle(c, [wl("a1", "a", 4)], running)) == {"a1": ("b1",)}
    d = cycle(c, [wl("a1", "a", 4)], running, reclaim="fair_share")
    assert not d.preemptions
    assert d.reason("a1").code is ReasonCode.NO_VICTIMS


def _scenario(reclaim: str | None) -> dict[str, Any]:
    sched: dict[str, Any] = {"preemption": True, "preemption_delay_s": 0}
    if reclaim is not None:
        sched["reclaim"] = reclaim
    return {"name": "floor", "scheduler": sched, "nodes": [{"name": "n", "gpu_type": "H100", "gpus": 8}],
            "queues": {"a": {"guaranteed": {"gpu": 4}}, "b": {}},
            "workloads": [{"id": "b1", "queue": "b", "submit": 0, "duration": 100, "gpus_per_pod": 8},
                          {"id": "a1", "queue": "a", "submit": 1, "duration": 100, "gpus_per_pod": 4}]}


def test_the_checker_holds_each_mode_to_its_own_floor() -> None:
    """The guarantee mode's replay (b1 preempted to 0) keeps every rule of its own mode, and breaks
    fair_share's: the property checker tells the two apart."""
    events = list(run_scenario(_scenario(None)).events)
    assert any(e["event"] == "preempt" for e in events)
    Checker(_scenario(None)).check(events)
    Checker(_scenario("guarantee")).check(events)
    with pytest.raises(AssertionError, match=r"b below its entitlement \(4 GPUs\)"):
        Checker(_scenario("fair_share")).check(events)
    fair = list(run_scenario(_scenario("fair_share")).events)
    assert not any(e["event"] == "preempt" for e in fair)
    Checker(_scenario("fair_share")).check(fair)


def test_the_scenario_key_and_the_setting() -> None:
    assert run_scenario(_scenario("guarantee")).events_jsonl() == run_scenario(_scenario(None)).events_jsonl()
    with pytest.raises(ScenarioError, match=r"scheduler.reclaim.*expected one of guarantee, fair_share, got 'fair'"):
        run_scenario(_scenario("fair"))
    assert SchedulerSettings().reclaim == "guarantee"
    assert SchedulerSettings(reclaim="fair_share").reclaim == "fair_share"
    with pytest.raises(ValueError, match="reclaim"):
        SchedulerSettings(reclaim="fair")


def test_the_now_view_shows_the_entitlement_beside_the_guarantee() -> None:
    nodes = [node(f"h{i}", 8, "H100") for i in range(4)] + [node(f"a{i}", 8, "A100") for i in range(6)]
    allocs = [alloc("v1", gpus=8, start=0, end=None, node="h0"),
              alloc("v2", gpus=8, start=0, end=None, node="a0", model="A100"),
              alloc("v3", gpus=4, start=0, end=None, node="a1", model="A100"),
              alloc("n1", queue="research.nlp", gpus=2, start=0, end=None, node="a2", model="A100")]
    view = compute_now(NowSnapshot(T0 + 1000, tuple(allocs), tuple(nodes), (pending("research.vision", 8),)), resolver())
    rows = {(r.queue, r.gpu_type): r for r in view.rows}
    # research wants 30 (22 running, 8 pending), prod nothing: research is entitled to all it wants;
    # within it vision (28 wanted) takes the 12 beyond the guarantees that nlp (2) leaves
    got = {q: rows[(q, "*")].entitlement for q in ("root", "research", "research.vision", "research.nlp", "prod")}
    assert got == {"root": 80, "research": 30, "research.vision": 28, "research.nlp": 2, "prod": 0}
    assert rows[("research.vision", "H100")].entitlement is None      # the gpu resource only
    assert list(rows[("prod", "*")].as_dict()).count("entitlement") == 1


def test_the_dashboard_s_queues_table_and_gpuq_queues_show_the_entitlement() -> None:
    from accounting.cli import QUEUE_COLUMNS
    from dashboards.views.queues import _now_table

    view = compute_now(NowSnapshot(T0 + 10, (alloc("v1", gpus=8, start=0, end=None, node="h0"),),
                                   (node("h0", 8, "H100"),)), resolver())
    rows = [r.as_dict() for r in view.rows if r.gpu_type == "*"]
    table = _now_table(rows)
    cols = list(table.columns)
    assert cols.index("entitlement (GPUs)") == cols.index("guaranteed (GPUs)") + 1
    assert dict(zip(table["queue"], table["entitlement (GPUs)"]))["research.vision"] == 8
    assert QUEUE_COLUMNS.index("entitlement") == QUEUE_COLUMNS.index("guaranteed") + 1


# --- fair_share beside the other issue-21 features: within_queue, fair share over time -------------

def test_within_queue_searches_its_own_queue_above_its_entitlement() -> None:
    """Under fair_share a queue above its entitlement may not preempt other queues (the quick no at
    the entitlement), but with ``within_queue`` its own lower-priority work is still searched: the
    queue gives up its own work, so no entitlement (nor guarantee) bounds that search."""
    queues = {"a": {"guaranteed": {"gpu": 1}, "weight": 1, "within_queue": "lower_priority"},
              "b": {"guaranteed": {"gpu": 1}, "weight": 1}}
    c = cluster(queues, ("n", "H100", 8, 1))
    running = [run(wl("a-lo", "a", 4), "H100", ("n-0", 4), start_s=0),
               run(wl("b1", "b", 4), "H100", ("n-0", 4), start_s=1)]
    # entitlements 4 and 4 (a wants 8, b 4; the 6 beyond the guarantees split 3:3): a holds 4
    d = cycle(c, [wl("a-hi", "a", 4, priority=5)], running, reclaim="fair_share")
    assert victims(d) == {"a-hi": ("a-lo",)}          # never b1: b is at its entitlement
    assert d.preemptions[0].reason.startswith("preempt within queue a (within_queue: lower_priority)")
    # nothing of lower priority in its queue: the reason names the entitlement and the own search
    d = cycle(c, [wl("a-eq", "a", 4, priority=0)], running, reclaim="fair_share")
    assert not d.preemptions
    r = d.reason("a-eq")
    assert r.code is ReasonCode.NO_VICTIMS
    assert "queue a would hold 8 gpu, above its guaranteed 1 and its entitlement 4" in r.message
    assert "no lower-priority work of its queue a makes it fit" in r.message
    # without within_queue the same pending workload only waits, with the entitlement's reason
    queues["a"].pop("within_queue")
    d = cycle(cluster(queues, ("n", "H100", 8, 1)), [wl("a-hi", "a", 4, priority=5)], running, reclaim="fair_share")
    assert not d.preemptions
    assert d.reason("a-hi").code is ReasonCode.NO_FIT
    assert d.reason("a-hi").message.endswith("above its guaranteed 1 and its entitlement 4")


def _within_and_fair(within: bool) -> dict[str, Any]:
    """b fills 8 GPUs with four 2-GPU jobs; a (guaranteed 1, weight 1 like b) then asks for 2 at
    priority 0, 2 at priority 5 and 2 at priority 9."""
    a: dict[str, Any] = {"guaranteed": {"gpu": 1}, "weight": 1}
    if within:
        a["within_queue"] = "lower_priority"
    return {"name": "within-and-fair", "scheduler": {"preemption": True, "preemption_delay_s": 30, "reclaim": "fair_share"},
            "nodes": [{"name": "n", "gpu_type": "H100", "gpus": 8}],
            "queues": {"a": a, "b": {"guaranteed": {"gpu": 1}, "weight": 1}},
            "workloads": [*({"id": f"b-{i}", "queue": "b", "submit": i, "duration": 1000, "gpus_per_pod": 2}
                            for i in range(1, 5)),
                          {"id": "a-lo", "queue": "a", "submit": 10, "duration": 1000, "gpus_per_pod": 2},
                          {"id": "a-hi", "queue": "a", "submit": 100, "duration": 1000, "gpus_per_pod": 2, "priority": 5},
                          {"id": "a-top", "queue": "a", "submit": 200, "duration": 1000, "gpus_per_pod": 2,
                           "priority": 9}]}


@pytest.mark.parametrize("within", [True, False])
def test_fair_share_and_within_queue_replay_keeps_every_rule(within: bool) -> None:
    """a reclaims toward its entitlement from b twice (2, then 4 of its 4: b stays at its own 4);
    at its entitlement, a-top may take only a's own lower-priority work, and only with
    ``within_queue``. The property checker finds no broken rule in either replay."""
    sc = _within_and_fair(within)
    events = list(run_scenario(sc).events)
    Checker(sc).check(events)
    got = [(e["t"], e["workload"], e["by"], e["reason"].split(":")[0]) for e in events if e["event"] == "preempt"]
    want = [(40.0, "b-4", "a-lo", "reclaim entitlement for a"), (130.0, "b-3", "a-hi", "reclaim entitlement for a")]
    if within:
        want.append((230.0, "a-lo", "a-top", "preempt within queue a (within_queue"))
    assert got == want


def _scored_reclaim(half_life: float | None, reclaim: str = "fair_share") -> dict[str, Any]:
    """a used all 4 GPUs for a day, b none; then c (weight 0: no entitlement) holds the 4 in two
    jobs, one of them (priority 1) above the preemptors' priority 0. a and b each ask for 2, within
    their entitlement of 2 (no guarantees): only one of them can reclaim, the first in queue order."""
    day = 86400.0
    sched: dict[str, Any] = {"preemption": True, "preemption_delay_s": 30, "reclaim": reclaim}
    if half_life is not None:
        sched["usage_half_life_s"] = half_life
    return {"name": "scored-reclaim", "scheduler": sched, "nodes": [{"name": "n", "gpu_type": "H100", "gpus": 4}],
            "queues": {"a": {"weight": 1}, "b": {"weight": 1}, "c": {"weight": 0}},
            "workloads": [{"id": "a-past", "queue": "a", "submit": 0, "duration": day, "gpus_per_pod": 4},
                          {"id": "c-1", "queue": "c", "submit": day, "duration": day, "gpus_per_pod": 2, "priority": 1},
                          {"id": "c-2", "queue": "c", "submit": day, "duration": day, "gpus_per_pod": 2},
                          {"id": "a-2", "queue": "a", "submit": day + 10, "duration": 600, "gpus_per_pod": 2},
                          {"id": "b-2", "queue": "b", "submit": day + 10, "duration": 600, "gpus_per_pod": 2}]}


def test_with_usage_half_life_the_less_used_queue_reclaims_its_entitlement_first() -> None:
    def preempts(sc: dict[str, Any]) -> list[tuple[str, str, str]]:
        events = list(run_scenario(sc).events)
        Checker(sc).check(events)
        return [(e["workload"], e["by"], e["reason"]) for e in events if e["event"] == "preempt"]

    why = "reclaim entitlement for {}: holds 0 of entitlement 2 gpu (guaranteed 0), needs 2"
    assert preempts(_scored_reclaim(None)) == [("c-2", "a-2", why.format("a"))]        # the queue path: a first
    assert preempts(_scored_reclaim(7 * 86400.0)) == [("c-2", "b-2", why.format("b"))]  # a's past use: b first
    assert preempts(_scored_reclaim(7 * 86400.0, "guarantee")) == []                   # no guarantee to restore
