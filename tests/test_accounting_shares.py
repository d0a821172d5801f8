"""The accounting of shared GPUs, pure: idle by share and its method, MIG slices counted as slices
against capacity, quotas and the audit, and capacity that balances per node and type."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accounting.audit import Placed, audit
from accounting.capacity import capacity_view
from accounting.idle import attribute_idle, idle_method
from accounting.intervals import running
from accounting.model import IdleRun, Window
from accounting.now import NowSnapshot, compute_now
from tests.accounting_helpers import T0, alloc, node, resolver

MIG = "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
T4 = "Tesla-T4-SHARED"
W = Window(T0, T0 + 3600)


def run(pod: str, gpu: str = "G0", mig: str = "", start: float = 0, end: float = 3600, nd: str = "n1") -> IdleRun:
    return IdleRun("c", nd, gpu, "ns", pod, T0 + start, T0 + end, mig_instance=mig, open=True)


def test_a_quiet_shared_device_is_idle_for_each_holder_by_its_share() -> None:
    a, b = (alloc(p, queue="prod", gpus=0.333, model=T4, end=None) for p in ("a", "b"))
    # dcgm-exporter copies the device's activity to both pods: each pod's series is the device's
    aggs = {x.workload: x for x in attribute_idle([run("a"), run("b")], [a, b], W, T0 + 3600)}
    assert aggs["a"].idle_gpu_seconds == aggs["b"].idle_gpu_seconds == pytest.approx(0.333 * 3600)
    assert aggs["a"].idle_method == "device_split_by_share"
    per = {x.workload: x.idle_method for x in attribute_idle([run("a")], [a, b], W, T0 + 3600, {("c", "ns", "a")})}
    assert per == {"a": "per_process"}
    assert idle_method(b, {("c", "ns", "a")}) == "device_split_by_share"


def test_a_mig_slice_is_idle_for_its_fraction_and_a_whole_gpu_for_one() -> None:
    slice_, whole = alloc("m", gpus=0.142, model=MIG, end=None), alloc("w", gpus=2, model="H100", end=None)
    aggs = {x.workload: x for x in attribute_idle([run("m", mig="9"), run("w", "G1"), run("w", "G2")],
                                                  [slice_, whole], W, T0 + 3600)}
    assert aggs["m"].idle_gpu_seconds == pytest.approx(0.142 * 3600) and aggs["m"].idle_method == "device"
    assert aggs["w"].idle_gpu_seconds == 2 * 3600 and aggs["w"].idle_method == "device"


def test_idle_is_never_more_than_the_share_held() -> None:
    """A pod of two replicas that the device plugin put on two GPUs: two devices quiet, still its share."""
    a = alloc("a", gpus=0.5, model=T4, end=None)
    (agg,) = attribute_idle([run("a", "G0"), run("a", "G1")], [a], W, T0 + 3600)
    assert agg.idle_gpu_seconds == pytest.approx(0.5 * 3600)


def test_mig_slices_count_as_slices_and_balance_the_nodes_rows() -> None:
    """A node with whole GPUs and MIG slices has a row per type: each allocation counts on its own
    row (slices as slices), never on the other."""
    nodes = [node("n1", 4, "NVIDIA-A100-SXM4-80GB"), node("n1", 21, MIG)]
    allocs = [alloc("m1", gpus=0.142, model=MIG, end=None), alloc("m2", gpus=0.285, model=MIG, end=None),
              alloc("w", gpus=3, model="NVIDIA-A100-SXM4-80GB", end=None)]
    view = capacity_view(nodes, running(allocs, T0 + 10), resolver())
    rows = {n.gpu_type: (n.capacity, n.allocated, n.free, n.overcommitted) for n in view.nodes}
    assert rows == {"A100": (4, 3, 1, 0), MIG: (21, 3, 18, 0)}
    now = compute_now(NowSnapshot(T0 + 10, tuple(allocs), tuple(nodes)), resolver())
    vision = {r.gpu_type: r.allocated for r in now.rows if r.queue == "research.vision"}
    assert vision["*"] == 6 and vision[MIG] == 3 and vision["A100"] == 3


def test_an_allocation_counts_slices_and_bills_their_fraction() -> None:
    """``gpus`` (what the scheduler and the views count) is slices; ``billed_gpus`` the fraction."""
    a = alloc("m", gpus=0.285, model=MIG, start=0, end=100)
    assert (a.milli_gpus, a.counted_milli, a.gpus, a.billed_gpus) == (285, 2000, 2.0, 0.285)
    share = alloc("s", gpus=0.333, model=T4)
    assert share.gpus == share.billed_gpus == 0.333


def test_the_audit_counts_slices_as_the_scheduler_places_them() -> None:
    allocs = [alloc("m", gpus=0.285, model=MIG, end=None)]
    placed = [Placed("research.vision", MIG, "n1", 2)]
    assert audit(allocs, placed, resolver(), lambda a: a.node, lambda n, a: a.gpu_model) == ()


SHARES = st.sampled_from([(0.25, "NVIDIA-A100-SXM4-80GB"), (0.333, T4), (0.142, MIG), (0.285, MIG), (1, "H100"),
                          (2, "H100"), (0.5, T4)])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(SHARES, st.integers(0, 3)), max_size=30))
def test_placed_shares_never_overcommit_a_node(placed: list) -> None:
    """Shares placed as a device plugin would (never more than a node's replicas, slices or GPUs)
    never count above the node's capacity of their type, per node and in total."""
    caps = {"NVIDIA-A100-SXM4-80GB": 4000, T4: 1000, MIG: 7000, "H100": 8000}
    room = {(n, m): c for n in range(4) for m, c in caps.items()}
    allocs = []
    for i, ((gpus, model), n) in enumerate(placed):
        counted = round(gpus * 7) * 1000 if model == MIG else round(gpus * 1000)
        if room[(n, model)] >= counted:
            room[(n, model)] -= counted
            allocs.append(alloc(f"p{i}", gpus=gpus, model=model, node=f"n{n}", end=None))
    nodes = [node(f"n{n}", c / 1000, m) for n in range(4) for m, c in caps.items()]
    view = capacity_view(nodes, running(allocs, T0 + 1), resolver())
    for part in view.nodes:
        assert part.overcommitted == 0 and 0 <= part.allocated <= part.capacity
    assert view.total.allocated <= view.total.capacity
