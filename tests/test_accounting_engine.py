"""The pure accounting engine: intervals, idle, usage, now view, capacity, starvation, series."""
from __future__ import annotations

import math

import pytest

from accounting.capacity import capacity_view
from accounting.fairshare import Claim, dominant_share, water_fill
from accounting.idle import (
    GPU_UTIL,
    PROF_ACTIVE,
    IdleParams,
    activity_points,
    attribute_idle,
    counter_increase,
    current,
    idle_runs,
)
from accounting.intervals import clip, effective_ends, running, to_aggs
from accounting.model import ActivityPoint, Window
from accounting.now import NowSnapshot, compute_now
from accounting.resolve import UNASSIGNED
from accounting.series import queue_series
from accounting.usage import usage_rows
from tests.accounting_helpers import T0, alloc, node, pending, resolver

W = Window(T0, T0 + 1000)

# -- intervals -------------------------------------------------------------------------------

CLIP_CASES = [
    ("inside", [alloc(start=100, end=200, gpus=2)], 2000, 200.0),
    ("running-pod-counts-to-now", [alloc(start=900, end=None, gpus=4)], 950, 200.0),
    ("running-pod-clipped-at-window-end", [alloc(start=900, end=None)], 5000, 100.0),
    ("starts-before-window", [alloc(start=-500, end=100, gpus=8)], 2000, 800.0),
    ("ends-after-window", [alloc(start=990, end=1500)], 2000, 10.0),
    ("spans-whole-window", [alloc(start=-10, end=2000, gpus=1)], 3000, 1000.0),
    ("outside", [alloc(start=-100, end=-1), alloc(start=1000, end=1200)], 3000, 0.0),
    ("restart-new-uid-both-count",
     [alloc(start=0, end=100, uid="u1"), alloc(start=150, end=250, uid="u2")], 2000, 200.0),
    ("restart-open-row-cut-at-next-start",   # the collector missed the end during a gap
     [alloc(start=0, end=None, uid="u1"), alloc(start=300, end=400, uid="u2")], 2000, 400.0),
    ("restart-overlap-cut", [alloc(start=0, end=500, uid="u1"), alloc(start=200, end=400, uid="u2")],
     2000, 400.0),
    ("same-name-other-namespace-not-cut",
     [alloc(start=0, end=None, uid="u1"), alloc(start=300, end=400, uid="u2", namespace="other")], 1000, 1100.0),
    ("end-in-future-cut-at-now", [alloc(start=0, end=900)], 500, 500.0),
    ("started-after-now", [alloc(start=600, end=None)], 500, 0.0),
]


@pytest.mark.parametrize("allocs,now,expected", [c[1:] for c in CLIP_CASES], ids=[c[0] for c in CLIP_CASES])
def test_clip_gpu_seconds(allocs: list, now: float, expected: float) -> None:
    assert sum(iv.gpu_seconds for iv in clip(allocs, W, T0 + now)) == pytest.approx(expected)


def test_running_and_effective_ends() -> None:
    a, b = alloc("p", start=0, end=None, uid="u1"), alloc("p", start=300, end=None, uid="u2")
    assert running([a, b], T0 + 500) == (b,)
    assert [e - T0 for _, e in effective_ends([b, a], T0 + 500)] == [300, 500]


def test_to_aggs_groups_like_sql() -> None:
    ivs = clip([alloc("a", gpus=2), alloc("b", gpus=1), alloc("c", queue="prod", gpus=1, ray_cluster="rc")], W, T0 + 2000)
    aggs = to_aggs(ivs)
    assert [(a.queue, a.workload, a.gpu_seconds) for a in aggs] == [
        ("prod", "rc", 100.0), ("research.vision", "a", 200.0), ("research.vision", "b", 100.0)]


def test_window_must_be_ordered() -> None:
    with pytest.raises(ValueError):
        Window(2, 1)


# -- idle -------------------------------------------------------------------------------------

P = IdleParams(threshold_pct=5, window_s=1800, bucket_s=60, max_gap_s=300)


def series(values: list[float | None], pod: str = "p", start: float = 0.0) -> list[ActivityPoint]:
    """One point per minute from T0+start; None = no DCGM data that minute."""
    return [ActivityPoint("c", "n1", "GPU-1", "ns", pod, T0 + start + 60 * i, v)
            for i, v in enumerate(values) if v is not None]


IDLE_CASES = [
    ("quiet-30-min-is-idle", [0.0] * 30, [(0, 1800)]),
    ("quiet-29-min-is-not", [0.0] * 29, []),
    ("busy-breaks-run", [0.0] * 20 + [50.0] + [0.0] * 20, []),
    ("at-threshold-is-busy", [5.0] * 40, []),
    ("just-under-threshold", [4.99] * 40, [(0, 2400)]),
    ("busy-then-idle-hour", [80.0] * 10 + [1.0] * 60, [(600, 4200)]),
    ("short-gap-bridged", [0.0] * 15 + [None] * 4 + [0.0] * 15, [(0, 2040)]),
    ("long-gap-breaks", [0.0] * 20 + [None] * 6 + [0.0] * 20, []),
    ("no-dcgm-data-is-unknown-not-idle", [None] * 60, []),
    ("two-runs", [0.0] * 30 + [90.0] + [0.0] * 31, [(0, 1800), (1860, 3720)]),
]


@pytest.mark.parametrize("values,expected", [c[1:] for c in IDLE_CASES], ids=[c[0] for c in IDLE_CASES])
def test_idle_runs(values: list[float | None], expected: list[tuple[float, float]]) -> None:
    runs = idle_runs(series(values), P)
    assert [(r.start_s - T0, r.end_s - T0) for r in runs] == expected


def test_activity_prefers_profiling_metric_and_scales_ratio() -> None:
    rows = [("c", "n1", "G", "", "ns", "p", T0 + 1, GPU_UTIL, 90.0),
            ("c", "n1", "G", "", "ns", "p", T0 + 2, PROF_ACTIVE, 0.02),
            ("c", "n1", "G", "", "ns", "p", T0 + 30, PROF_ACTIVE, 0.03),
            ("c", "n1", "G", "", "ns", "p", T0 + 61, GPU_UTIL, 40.0),
            ("c", "n1", "G", "", "ns", "p", T0 + 62, "DCGM_FI_DEV_POWER_USAGE", 300.0)]
    pts = activity_points(rows)
    assert [(p.bucket_s - T0, p.activity_pct) for p in pts] == [(0.0, 3.0), (60.0, 40.0)]


def test_idle_now_needs_an_open_recent_run() -> None:
    pts = series([0.0] * 40)                                  # quiet from T0 to T0+2400
    runs = idle_runs(pts, P)
    assert len(current(runs, T0 + 2400, P)) == 1
    assert current(runs, T0 + 2400 + 301, P) == ()          # data stopped too long ago
    closed = idle_runs(series([0.0] * 40 + [70.0]), P)
    assert current(closed, T0 + 2460, P) == ()               # busy again in the last minute


def test_idle_attributed_to_overlapping_allocation() -> None:
    runs = idle_runs(series([0.0] * 60), P)                   # idle 0..3600
    allocs = [alloc("p", start=-100, end=1200, uid="u1"), alloc("p", start=1200, end=None, uid="u2", queue="prod")]
    aggs = attribute_idle(runs, allocs, Window(T0, T0 + 3000), T0 + 4000)
    assert {(a.queue, a.idle_gpu_seconds) for a in aggs} == {("research.vision", 1200.0), ("prod", 1800.0)}
    assert attribute_idle(runs, [alloc("other")], W, T0 + 4000) == ()


COUNTERS = [
    ("monotonic", [10.0, 20.0, 35.0], 25.0),
    ("reset-to-zero", [100.0, 150.0, 5.0, 25.0], 75.0),
    ("two-resets", [50.0, 0.0, 10.0, 3.0], 13.0),
    ("single", [7.0], 0.0),
    ("empty", [], 0.0),
]


@pytest.mark.parametrize("values,expected", [c[1:] for c in COUNTERS], ids=[c[0] for c in COUNTERS])
def test_counter_increase_handles_resets(values: list[float], expected: float) -> None:
    assert counter_increase(values) == expected


# -- usage and cost --------------------------------------------------------------------------

def test_usage_by_queue_and_type_with_cost_and_rollup() -> None:
    r = resolver()
    ivs = clip([alloc("a", gpus=8, start=0, end=900, model="NVIDIA-H100-80GB-HBM3"),
                alloc("b", queue="nlp", gpus=2, start=0, end=1800, model="NVIDIA-A100-SXM4-80GB"),
                alloc("c", queue="", namespace="stray", gpus=1, start=0, end=3600, model="")],
               Window(T0, T0 + 3600), T0 + 3600)
    rows = {tuple(v for _, v in row.keys): row for row in usage_rows(to_aggs(ivs), r, ["queue", "gpu_type"])}
    assert rows[("research.vision", "H100")].gpu_seconds == 7200 and rows[("research.vision", "H100")].cost == 8.0
    assert rows[("research.nlp", "A100")].cost == pytest.approx(2.0)           # leaf name resolves
    assert rows[(UNASSIGNED, "unknown")].cost == 0.0
    rolled = {row.keys[0][1]: row.gpu_seconds for row in usage_rows(to_aggs(ivs), r, ["queue"], rollup=True)}
    assert rolled["research"] == rolled["research.vision"] + rolled["research.nlp"] == 10800
    with pytest.raises(ValueError, match="--by"):
        usage_rows([], r, ["team"])


def test_series_average_per_step() -> None:
    r = resolver()
    pts = queue_series([alloc("a", gpus=4, start=0, end=90), alloc("b", queue="prod", gpus=2, start=30, end=None)],
                       r, Window(T0, T0 + 120), 60, T0 + 120)
    got = {(p.queue, p.t_s - T0): p.allocated for p in pts}
    assert got[("research.vision", 0)] == 4 and got[("research.vision", 60)] == 2
    assert got[("research", 60)] == 2 and got[("prod", 0)] == 1 and got[("prod", 60)] == 2
    assert {p.guaranteed for p in pts if p.queue == "prod"} == {56}


# -- now view --------------------------------------------------------------------------------

def now_view(allocs: list, nodes: list, pend: list | None = None, runs: tuple = (), at: float = 1000):
    return compute_now(NowSnapshot(T0 + at, tuple(allocs), tuple(nodes), tuple(pend or ()), runs),
                       resolver(), P, starvation_s=600)


def test_now_rows_rollup_borrowed_lent_and_shares() -> None:
    nodes = [node(f"h{i}", 8, "H100") for i in range(4)] + [node(f"a{i}", 8, "A100") for i in range(6)]
    allocs = [alloc("v1", gpus=8, start=0, end=None, node="h0"),
              alloc("v2", gpus=8, start=0, end=None, node="a0", model="A100"),
              alloc("v3", gpus=4, start=0, end=None, node="a1", model="A100"),
              alloc("n1", queue="research.nlp", gpus=2, start=0, end=None, node="a2", model="A100"),
              alloc("old", queue="prod", gpus=8, start=0, end=10, node="h1")]
    view = now_view(allocs, nodes, [pending("research.vision", 8, since=0, model="H100")])
    rows = {(r.queue, r.gpu_type): r for r in view.rows}
    v = rows[("research.vision", "*")]
    assert (v.allocated, v.guaranteed, v.max, v.pending, v.borrowed, v.lent) == (20, 16, 40, 8, 4, 0)
    assert v.fair_share == pytest.approx(20 / 16)
    assert rows[("research.vision", "H100")].max == 8 and rows[("research.vision", "H100")].pending == 8
    assert rows[("research", "*")].allocated == 22 and rows[("research", "*")].lent == 2
    assert rows[("root", "*")].allocated == 22 and rows[("prod", "*")].lent == 56
    assert rows[("research.nlp", "*")].fair_share == pytest.approx(2 / 8)
    assert rows[("prod", "*")].over_quota_share == 0.0           # no demand: its guarantee is lent
    assert rows[("research", "*")].over_quota_share == pytest.approx(30)
    assert view.capacity.total.capacity == 80 and view.capacity.total.allocated == 22
    # vision is above its guarantee, but research (22 of 24) has had demand pending for 1000 s
    assert [s.queue for s in view.starving] == ["research"]


def test_starvation_after_threshold() -> None:
    nodes = [node("h0", 8)]
    pend = [pending("research.nlp", 4, since=0)]
    assert [s.queue for s in now_view([], nodes, pend, at=599).starving] == []
    got = now_view([], nodes, pend, at=600).starving
    assert [(s.queue, s.waiting_s) for s in got] == [("research", 600.0), ("research.nlp", 600.0)]


def test_unassigned_pods_are_counted_under_root() -> None:
    view = now_view([alloc("x", queue="nope", namespace="ghost", gpus=3, end=None)], [node()])
    rows = {(r.queue, r.gpu_type): r for r in view.rows}
    assert rows[(UNASSIGNED, "*")].allocated == 3 and rows[("root", "*")].allocated == 3


def test_idle_now_counted_per_queue() -> None:
    runs = idle_runs(series([0.0] * 40, pod="v1"), P)
    view = now_view([alloc("v1", gpus=1, end=None)], [node()], runs=runs, at=2400)
    rows = {(r.queue, r.gpu_type): r for r in view.rows}
    assert rows[("research.vision", "*")].idle == 1 and rows[("research", "H100")].idle == 1
    assert [(d.gpu_type, d.queue, d.idle) for d in view.distribution] == [
        ("H100", "*", 1.0), ("H100", "research.vision", 1.0)]


# -- capacity and fragmentation ---------------------------------------------------------------

FRAG_CASES = [
    ("all-free", [8, 8], [0, 0], 0.0, {1: 16, 2: 8, 4: 4, 8: 2}),
    ("one-node-partly-used", [8, 8], [3, 0], 5 / 13, {1: 13, 2: 6, 4: 3, 8: 1}),
    ("every-node-partly-used", [8, 8], [1, 7], 1.0, {1: 8, 2: 3, 4: 1, 8: 0}),
    ("full", [8], [8], 0.0, {1: 0, 2: 0, 4: 0, 8: 0}),
    ("small-nodes", [2, 4], [0, 1], 3 / 5, {1: 5, 2: 2, 4: 0, 8: 0}),
]


@pytest.mark.parametrize("caps,used,ratio,fits", [c[1:] for c in FRAG_CASES], ids=[c[0] for c in FRAG_CASES])
def test_fragmentation(caps: list[int], used: list[int], ratio: float, fits: dict[int, int]) -> None:
    nodes = [node(f"n{i}", c) for i, c in enumerate(caps)]
    allocs = [alloc(f"p{i}", gpus=u, node=f"n{i}", end=None) for i, u in enumerate(used) if u]
    view = capacity_view(nodes, running(allocs, T0 + 10), resolver())
    assert view.total.fragmentation_ratio == pytest.approx(ratio)
    assert dict(view.total.fits) == fits


def test_cordoned_node_has_no_free_gpus_and_overcommit_is_capped() -> None:
    view = capacity_view([node("n0", 8, schedulable=False), node("n1", 4)],
                         [alloc("p", gpus=6, node="n1", end=None)], resolver())
    assert [(n.free, n.allocated, n.overcommitted) for n in view.nodes] == [(0, 0, 0), (0, 4, 2)]
    assert view.types[0].gpu_type == "H100"


# -- fair share ------------------------------------------------------------------------------

WATER = [
    ("guarantees-then-weights", 100, [Claim("a", 20, 100, math.inf, 1), Claim("b", 20, 100, math.inf, 3)],
     {"a": 35, "b": 65}),
    ("capped-by-demand", 100, [Claim("a", 20, 30, math.inf, 1), Claim("b", 20, 100, math.inf, 1)],
     {"a": 30, "b": 70}),
    ("capped-by-max", 100, [Claim("a", 0, 100, 10, 1), Claim("b", 0, 100, math.inf, 1)], {"a": 10, "b": 90}),
    ("guarantee-lent-when-no-demand", 10, [Claim("a", 8, 0, math.inf), Claim("b", 2, 10, math.inf)],
     {"a": 0, "b": 10}),
    ("overcommitted-guarantees-scaled", 10, [Claim("a", 10, 10, math.inf), Claim("b", 10, 10, math.inf)],
     {"a": 5, "b": 5}),
]


@pytest.mark.parametrize("pool,claims,expected", [c[1:] for c in WATER], ids=[c[0] for c in WATER])
def test_water_fill(pool: float, claims: list[Claim], expected: dict[str, float]) -> None:
    got = water_fill(pool, claims)
    assert got == pytest.approx(expected)


def test_dominant_share_skips_missing_denominators() -> None:
    assert dominant_share({"gpu": 4, "gpu/H100": 4}, {"gpu": 8, "gpu/H100": 2}) == 2.0
    assert dominant_share({"gpu": 4}, {"gpu": None}) == 0.0
