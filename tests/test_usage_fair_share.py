"""Fair share over time (issue 21, ``scheduler.usage_half_life_s``): the decay checked numerically
against an independent computation, the order of queues that differ only in their past usage
(who gets free GPUs first, who reclaims first), and off by default: the same decisions."""
from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import pytest

from accounting.decay import DecayedUsage, decayed_hours, decayed_interval, score
from scheduler.cycle import schedule
from scheduler.errors import ScenarioError
from scheduler.model import Decisions
from scheduler.simulator import parse_scenario, run_scenario
from scheduler.simulator.engine import simulate
from scheduler.snapshot import Snapshot

DAY = 86400.0


def integral(segments: list[tuple[float, float, float]], now: float, half_life: float, steps: int = 2000) -> float:
    """An independent computation: Simpson's rule over each (gpus, start, end) of the GPUs held,
    each instant weighted by 0.5 ** ((now - t) / half_life), up to ``now``."""
    total = []
    for g, a, b in segments:
        b = min(b, now)
        if b <= a:
            continue
        dt = (b - a) / steps
        w = [0.5 ** ((now - (a + i * dt)) / half_life) for i in range(steps + 1)]
        total.append(g * dt / 3 * (w[0] + w[-1] + 4 * math.fsum(w[1:-1:2]) + 2 * math.fsum(w[2:-1:2])))
    return math.fsum(total)


def test_decay_against_an_independent_integral() -> None:
    h = 2 * DAY
    segs = [(4.0, 0.0, 3 * DAY), (2.0, DAY, 1.5 * DAY), (8.0, 4 * DAY, 4.25 * DAY)]
    d = DecayedUsage(h)
    changes = sorted([(a, g) for g, a, _ in segs] + [(b, -g) for g, _, b in segs])
    for t, g in changes:
        d.change("q", g, t)
    for now in (4.25 * DAY, 5 * DAY, 9 * DAY):
        want = integral(segs, now, h)
        assert d.at(now)["q"] == pytest.approx(want, rel=1e-9)
        # and the closed form per interval agrees
        assert math.fsum(decayed_interval(g, a, min(b, now), now, h) for g, a, b in segs) == pytest.approx(want, rel=1e-9)
    # a half-life later, what there was counts half (nothing held since 4.25 days)
    assert d.at(4.25 * DAY + h)["q"] == pytest.approx(d.at(4.25 * DAY)["q"] / 2, rel=1e-12)
    # use that never stops tends to gpus * H / ln 2
    e = DecayedUsage(h)
    e.change("q", 3.0, 0.0)
    assert e.at(60 * h)["q"] == pytest.approx(3.0 * h / math.log(2), rel=1e-12)


def test_hourly_rollups_decay_as_the_even_use_they_stand_for() -> None:
    h = 7 * DAY
    now = 30 * 3600.0 + 1200
    rows = [(0.0, "a", 3600.0 * 2), (3600.0, "a", 1800.0), (7200.0, "b", 3600.0 * 8)]
    got = decayed_hours(rows, now, h)
    segs_a = [(2.0, 0.0, 3600.0), (0.5, 3600.0, 7200.0)]
    assert got["a"] == pytest.approx(integral(segs_a, now, h), rel=1e-9)
    assert got["b"] == pytest.approx(integral([(8.0, 7200.0, 10800.0)], now, h), rel=1e-9)


def test_the_score_is_decayed_gpu_hours_per_weight() -> None:
    assert score(7200.0, 1.0) == 2.0
    assert score(7200.0, 4.0) == 0.5
    assert score(7200.0, 0.0) == math.inf and score(0.0, 0.0) == 0.0


def two_queues(half_life: float | None, guarantee: int = 0) -> dict[str, Any]:
    """``a`` used the 4 GPUs for a day; ``b`` nothing. At its end each has a 4-GPU job waiting."""
    sched: dict[str, Any] = {"preemption": False}
    if half_life is not None:
        sched["usage_half_life_s"] = half_life
    q = {"guaranteed": {"gpu": guarantee}} if guarantee else {}
    return {
        "scheduler": sched,
        "nodes": [{"name": "n", "gpu_type": "H100", "gpus": 4}],
        "queues": {"a": dict(q), "b": dict(q)},
        "workloads": [
            {"id": "a-past", "queue": "a", "submit": 0, "duration": DAY, "gpus_per_pod": 4},
            {"id": "a-next", "queue": "a", "submit": 100, "duration": 600, "gpus_per_pod": 4},
            {"id": "b-next", "queue": "b", "submit": 100, "duration": 600, "gpus_per_pod": 4},
        ],
    }


def admits(result: Any) -> list[tuple[float, str]]:
    return [(e["t"], e["workload"]) for e in result.events if e["event"] == "admit"]


@pytest.mark.parametrize("guarantee", [0, 4])
def test_less_recent_usage_gets_the_free_gpus_first(guarantee: int) -> None:
    # today's order: equal shares and GPUs, so the path decides: a first
    off = run_scenario(two_queues(None, guarantee))
    assert admits(off)[1:] == [(DAY, "a-next"), (DAY + 600, "b-next")]
    # with the half-life, a's day of use puts b first (both owed their guarantee, or neither)
    on = run_scenario(two_queues(7 * DAY, guarantee))
    assert admits(on)[1:] == [(DAY, "b-next"), (DAY + 600, "a-next")]


def test_a_guarantee_is_served_before_a_lower_score() -> None:
    sc = two_queues(7 * DAY)
    sc["queues"]["a"] = {"guaranteed": {"gpu": 4}}          # a is owed its 4 GPUs; b is owed nothing
    assert admits(run_scenario(sc))[1:] == [(DAY, "a-next"), (DAY + 600, "b-next")]


def test_weight_scales_the_score() -> None:
    """b used 1 GPU for an hour, a 4 GPUs for a day: b first, unless a's weight makes its
    GPU-hours per weight the smaller (96 / 1000 against 1 / 1)."""
    sc = two_queues(7 * DAY)
    sc["workloads"].insert(1, {"id": "b-past", "queue": "b", "submit": 0, "duration": 3600, "gpus_per_pod": 1})
    sc["nodes"][0]["gpus"] = 5
    assert admits(run_scenario(sc))[2:] == [(DAY, "b-next"), (DAY + 600, "a-next")]
    sc["queues"]["a"] = {"weight": 1000}
    assert admits(run_scenario(sc))[2:] == [(DAY, "a-next"), (DAY + 600, "b-next")]


def test_who_reclaims_first_follows_the_score() -> None:
    """Both a and b are below their guarantee of 2 and wait for it; c holds all 4 GPUs above its
    guarantee of 0. With the half-life, b (no past use) searches for victims first."""
    def scenario(half_life: float | None) -> dict[str, Any]:
        sched: dict[str, Any] = {"preemption": True, "preemption_delay_s": 30}
        if half_life is not None:
            sched["usage_half_life_s"] = half_life
        return {
            "scheduler": sched,
            "nodes": [{"name": "n", "gpu_type": "H100", "gpus": 4}],
            "queues": {"a": {"guaranteed": {"gpu": 2}}, "b": {"guaranteed": {"gpu": 2}}, "c": {}},
            "workloads": [
                {"id": "a-past", "queue": "a", "submit": 0, "duration": DAY, "gpus_per_pod": 4},
                {"id": "c-1", "queue": "c", "submit": DAY, "duration": DAY, "gpus_per_pod": 2},
                {"id": "c-2", "queue": "c", "submit": DAY, "duration": DAY, "gpus_per_pod": 2},
                # each wants 4 (over its guarantee: may not preempt) then 2 within it
                {"id": "a-2", "queue": "a", "submit": DAY + 10, "duration": 600, "gpus_per_pod": 2},
                {"id": "b-2", "queue": "b", "submit": DAY + 10, "duration": 600, "gpus_per_pod": 2},
            ],
        }
    def first_preemptor(r: Any) -> str:
        return next(e["by"] for e in r.events if e["event"] == "preempt")
    assert first_preemptor(run_scenario(scenario(None))) == "a-2"
    assert first_preemptor(run_scenario(scenario(7 * DAY))) == "b-2"


def test_the_replay_usage_is_a_pure_function_of_its_events() -> None:
    """What each cycle's snapshot carries against the integral of the replay's own admits,
    finishes and preemptions, computed independently from events.jsonl; twice the same."""
    h = 3600.0 * 6
    sc = parse_scenario({
        "scheduler": {"usage_half_life_s": h, "preemption_delay_s": 5},
        "nodes": [{"name": "n", "gpu_type": "H100", "gpus": 4}],
        "queues": {"a": {"guaranteed": {"gpu": 2}}, "b": {"guaranteed": {"gpu": 2}}},
        "workloads": [
            {"id": "a-1", "queue": "a", "submit": 0, "duration": 7200, "gpus_per_pod": 2, "count": 2},
            {"id": "b-1", "queue": "b", "submit": 600, "duration": 3600, "gpus_per_pod": 2},
            {"id": "a-2", "queue": "a", "submit": 900, "duration": 1800, "gpus_per_pod": 1, "count": 3},
        ],
    })
    seen: list[tuple[float, Mapping[str, float]]] = []

    def spy(snap: Snapshot, now: float) -> Decisions:
        assert snap.usage is not None
        seen.append((now, dict(snap.usage)))
        return schedule(snap, now)

    r = simulate(sc, spy)
    assert any(e["event"] == "preempt" for e in r.events)
    starts: dict[str, tuple[str, float, float]] = {}
    segs: dict[str, list[tuple[float, float, float]]] = {"a": [], "b": []}
    for e in r.events:
        if e["event"] == "admit":
            starts[e["workload"]] = (e["queue"], float(sum(e["placement"].values())), e["t"])
        elif e["event"] in ("finish", "preempt"):
            q, g, t0 = starts.pop(e["workload"])
            segs[q].append((g, t0, e["t"]))
    for now, usage in seen[1:]:
        for q in ("a", "b"):
            want = math.fsum(decayed_interval(g, a, min(b, now), now, h) for g, a, b in segs[q] if a < now)
            assert usage.get(q, 0.0) == pytest.approx(want, rel=1e-9, abs=1e-9), (now, q)
    again: list[tuple[float, Mapping[str, float]]] = []
    simulate(sc, lambda s, n: (again.append((n, dict(s.usage or {}))), schedule(s, n))[1])
    assert again == seen


def test_off_by_default_gives_the_same_decisions() -> None:
    base = two_queues(None, 4)
    zero = copy.deepcopy(base)
    zero["scheduler"]["usage_half_life_s"] = 0
    assert run_scenario(base).events_jsonl() == run_scenario(zero).events_jsonl()
    seen: list[Any] = []
    simulate(parse_scenario(zero), lambda s, n: (seen.append(s.usage), schedule(s, n))[1])
    assert seen and all(u is None for u in seen)


@pytest.mark.parametrize("value", [-1, "week", math.inf, True])
def test_a_bad_half_life_is_named(value: Any) -> None:
    sc = two_queues(None)
    sc["scheduler"]["usage_half_life_s"] = value
    with pytest.raises(ScenarioError, match="scheduler.usage_half_life_s"):
        parse_scenario(sc)
