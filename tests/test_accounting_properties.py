"""Invariants of the accounting engine, checked with hypothesis."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.capacity import capacity_view
from accounting.fairshare import Claim, water_fill
from accounting.idle import IdleParams, attribute_idle, idle_runs
from accounting.intervals import clip, running, to_aggs
from accounting.model import ActivityPoint, Window
from accounting.now import NowSnapshot, compute_now
from accounting.queues import ROOT
from accounting.usage import usage_rows
from tests.accounting_helpers import T0, alloc, node, pending, resolver

RAW_QUEUES = ["research.vision", "vision", "research.nlp", "prod", "", "nope"]
MODELS = ["H100", "A100", "NVIDIA-H100-80GB-HBM3", "", "T4"]
FAST = settings(max_examples=60, deadline=None)


@st.composite
def allocations(draw: st.DrawFn, max_size: int = 25) -> list:
    out = []
    for i in range(draw(st.integers(0, max_size))):
        start = draw(st.integers(-500, 1500))
        end = draw(st.one_of(st.none(), st.integers(start, 2500)))
        out.append(alloc(f"p{draw(st.integers(0, 8))}", queue=draw(st.sampled_from(RAW_QUEUES)),
                         gpus=draw(st.integers(1, 8)), start=start, end=end, uid=f"u{i}",
                         node=f"n{draw(st.integers(0, 5))}", model=draw(st.sampled_from(MODELS)),
                         namespace=draw(st.sampled_from(["ns", "ml"]))))
    return out


@FAST
@given(allocations(), st.lists(st.integers(0, 8), min_size=6, max_size=6), st.lists(st.booleans(), min_size=6, max_size=6),
       st.integers(0, 3000))
def test_allocated_never_exceeds_capacity(allocs: list, caps: list[int], sched: list[bool], now: int) -> None:
    nodes = [node(f"n{i}", c, "H100" if i % 2 else "A100", schedulable=s) for i, (c, s) in enumerate(zip(caps, sched))]
    view = capacity_view(nodes, running(allocs, T0 + now), resolver())
    for part in (*view.nodes,):
        assert 0 <= part.allocated <= part.capacity and 0 <= part.free <= part.capacity - part.allocated
    for t in (*view.types, view.total):
        assert t.allocated <= t.capacity and 0 <= t.fragmented_free <= t.free <= t.capacity
        assert 0.0 <= t.fragmentation_ratio <= 1.0
        assert t.fits[1] == int(t.free)


@FAST
@given(allocations(), st.integers(-200, 1200), st.integers(0, 1500), st.integers(0, 3000))
def test_queue_gpu_seconds_add_up_to_the_cluster(allocs: list, start: int, length: int, now: int) -> None:
    window = Window(T0 + start, T0 + start + length)
    ivs = clip(allocs, window, T0 + now)
    total = sum(iv.gpu_seconds for iv in ivs)
    r = resolver()
    by_queue = usage_rows(to_aggs(ivs), r, ["queue"])
    by_type = usage_rows(to_aggs(ivs), r, ["gpu_type", "namespace"])
    assert abs(sum(row.gpu_seconds for row in by_queue) - total) < 1e-6
    assert abs(sum(row.gpu_seconds for row in by_type) - total) < 1e-6
    assert total <= sum(a.gpus for a in allocs) * length + 1e-6
    rolled = {row.keys[0][1]: row.gpu_seconds for row in usage_rows(to_aggs(ivs), r, ["queue"], rollup=True)}
    for path, q in r.config.queues.items():
        if path != ROOT and q.children and path in rolled:
            assert abs(rolled[path] - sum(rolled.get(c, 0.0) for c in q.children)) < 1e-6


@FAST
@given(allocations(), st.lists(st.tuples(st.sampled_from(RAW_QUEUES), st.integers(1, 16), st.sampled_from(["", "H100"])),
                               max_size=6), st.integers(0, 3000))
def test_parents_equal_the_sum_of_their_children(allocs: list, pend: list, now: int) -> None:
    nodes = [node(f"n{i}", 8, "H100" if i % 2 else "A100") for i in range(6)]
    demands = tuple(pending(q, g, since=0, model=m) for q, g, m in pend)
    view = compute_now(NowSnapshot(T0 + now, tuple(allocs), tuple(nodes), demands), resolver())
    rows = {(r.queue, r.gpu_type): r for r in view.rows}
    kids = {p: q.children for p, q in resolver().config.queues.items()}
    kids[ROOT] = (*kids[ROOT], *(["(unassigned)"] if ("(unassigned)", "*") in rows else []))
    for (q, t), row in rows.items():
        if kids.get(q):
            children = [rows[(c, t)] for c in kids[q]]
            assert abs(row.allocated - sum(c.allocated for c in children)) < 1e-6
            assert abs(row.pending - sum(c.pending for c in children)) < 1e-6
            assert sum(c.over_quota_share for c in children) <= row.over_quota_share + 1e-6
    assert rows[(ROOT, "*")].allocated == sum(a.gpus for a in running(allocs, T0 + now))


@FAST
@given(st.floats(0, 1000), st.lists(st.tuples(st.floats(0, 100), st.floats(0, 200), st.floats(0, 200), st.floats(0.1, 5)),
                                    max_size=6))
def test_water_fill_never_exceeds_pool_or_caps(pool: float, raw: list) -> None:
    claims = [Claim(f"q{i}", g, d, c, w) for i, (g, d, c, w) in enumerate(raw)]
    share = water_fill(pool, claims)
    assert sum(share.values()) <= pool + 1e-6
    for c in claims:
        assert -1e-9 <= share[c.name] <= max(min(c.demand, c.cap), min(c.guaranteed, c.demand, c.cap)) + 1e-6


@FAST
@given(allocations(max_size=6), st.lists(st.one_of(st.none(), st.floats(0, 10)), max_size=120))
def test_idle_never_exceeds_allocated(allocs: list, activity: list) -> None:
    points = [ActivityPoint("c", "n", "G", "ns", a.pod, T0 - 600 + 60 * i, v)
              for a in allocs[:2] for i, v in enumerate(activity) if v is not None]
    window, now = Window(T0, T0 + 2000), T0 + 3000
    idle = {(a.queue, a.workload): a.idle_gpu_seconds
            for a in attribute_idle(idle_runs(points, IdleParams(window_s=600)), allocs, window, now)}
    used = {(a.queue, a.workload): a.gpu_seconds for a in to_aggs(clip(allocs, window, now))}
    for k, v in idle.items():
        assert v <= used[k] + 1e-6
