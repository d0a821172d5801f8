"""The cycle: ordering, many admissions per cycle, backfill vs strict FIFO, reasons with numbers."""
from __future__ import annotations

from typing import Any

import pytest

from scheduler.cycle import schedule
from scheduler.errors import SnapshotError
from scheduler.model import ReasonCode
from scheduler.snapshot import Settings, snapshot
from scheduler.testing import admitted, cluster, cycle, run, wl

TWO: dict[str, Any] = {"a": {"guaranteed": {"gpu": 16}}, "b": {"guaranteed": {"gpu": 16}}}


def order(d: Any) -> list[str]:
    return [a.workload.id for a in d.admissions]


def test_admits_as_many_as_fit_in_one_cycle() -> None:
    c = cluster({"q": {}}, ("n", "A100", 8, 10))
    d = cycle(c, [wl(f"w{i}", "q", gpus=4) for i in range(25)])
    assert len(d.admissions) == 20
    assert [p.position for p in d.pending] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(("pending", "running", "expect"), [
    pytest.param([wl("a1", "a"), wl("b1", "b"), wl("a2", "a"), wl("b2", "b")], [],
                 ["a1", "b1", "a2", "b2"], id="round-robin-by-fair-share"),
    pytest.param([wl("a1", "a"), wl("b1", "b")], [run(wl("x", "a"), "A100", ("n-3", 8))],
                 ["b1", "a1"], id="lower-share-first"),
    pytest.param([wl("lo", "a", submit_s=0), wl("hi", "a", priority=5, submit_s=9)], [],
                 ["hi", "lo"], id="priority-before-age"),
    pytest.param([wl("y", "a", submit_s=2), wl("x", "a", submit_s=1)], [], ["x", "y"], id="older-first"),
    pytest.param([wl("b", "a"), wl("a", "a")], [], ["a", "b"], id="id-breaks-ties"),
])
def test_order(pending: list[Any], running: list[Any], expect: list[str]) -> None:
    c = cluster(TWO, ("n", "A100", 8, 4))
    assert order(cycle(c, pending, running)) == expect


def test_queue_priority_breaks_equal_share() -> None:
    c = cluster({"a": {}, "b": {"priority": 5}}, ("n", "A100", 8, 1))
    assert order(cycle(c, [wl("a1", "a"), wl("b1", "b")], preemption=False)) == ["b1"]


def test_blocked_head_does_not_block_smaller_work() -> None:
    c = cluster({"q": {}}, ("n", "A100", 8, 2))
    busy = [run(wl("x", "q", gpus=4), "A100", ("n-0", 4))]
    d = cycle(c, [wl("big", "q", pods=2, submit_s=0), wl("small", "q", gpus=4, submit_s=1)], busy)
    assert order(d) == ["small"]
    r = d.reason("big")
    assert r is not None and r.position == 1 and r.code is ReasonCode.NO_FIT


@pytest.mark.parametrize(("head_priority", "code"), [
    pytest.param(0, ReasonCode.STRICT_FIFO, id="same-priority"),
    pytest.param(3, ReasonCode.BEHIND_HIGHER_PRIORITY, id="higher-priority-head"),
])
def test_strict_fifo_blocks_behind_head(head_priority: int, code: ReasonCode) -> None:
    c = cluster({"q": {"strict_fifo": True}}, ("n", "A100", 8, 2))
    busy = [run(wl("x", "q", gpus=4), "A100", ("n-0", 4))]
    d = cycle(c, [wl("big", "q", pods=2, priority=head_priority), wl("small", "q", gpus=4, submit_s=1)], busy)
    assert order(d) == []
    r = d.reason("small")
    assert r is not None and (r.code, r.position) == (code, 2)
    assert r.message == f"behind big (priority {head_priority}) in strict FIFO queue q"


@pytest.mark.parametrize(("queues", "groups", "running", "w", "code", "message"), [
    pytest.param({"research": {"queues": {"vision": {"max": {"gpu/H100": 8}}}}}, [("h", "H100", 8, 2)],
                 [run(wl("x", "research.vision", types=("H100",)), "H100", ("h-0", 8))],
                 wl("w", "research.vision", gpus=8, types=("H100",)), ReasonCode.QUOTA_MAX,
                 "needs 8 gpu/H100, queue research.vision has 0 left of max 8", id="quota-max-typed"),
    pytest.param({"r": {"max": {"gpu": 8}, "queues": {"l": {}}}}, [("h", "H100", 8, 2)],
                 [run(wl("x", "r.l", gpus=4), "H100", ("h-0", 4))],
                 wl("w", "r.l", gpus=8), ReasonCode.QUOTA_MAX,
                 "needs 8 gpu, queue r has 4 left of max 8", id="quota-max-ancestor"),
    pytest.param({"q": {}}, [("h", "H100", 8, 2)],
                 [run(wl("x", "q", gpus=4), "H100", ("h-0", 4)), run(wl("y", "q"), "H100", ("h-1", 8))],
                 wl("w", "q", gpus=8, types=("H100",)), ReasonCode.NO_FIT,
                 "no node of type H100 with 8 free GPUs (largest free: 4)", id="no-fit"),
    pytest.param({"q": {}}, [("h", "H100", 8, 2)], [run(wl("y", "q"), "H100", ("h-1", 8))],
                 wl("w", "q", gpus=8, pods=2), ReasonCode.NO_FIT,
                 "only 1 of 2 pods of 8 GPUs fit on free H100 nodes (largest free: 8)", id="no-fit-gang"),
    pytest.param({"q": {"max": {"gpu": 8}}}, [("h", "H100", 8, 2)], [],
                 wl("w", "q", gpus=8, pods=2), ReasonCode.NEVER_FITS,
                 "needs 16 gpu, queue q max is 8", id="never-fits-max"),
    pytest.param({"q": {}}, [("h", "H100", 4, 2)], [],
                 wl("w", "q", gpus=8), ReasonCode.NEVER_FITS,
                 "needs 8 GPUs of type H100; all its nodes together hold 0 such pods", id="never-fits-nodes"),
])
def test_reason_messages(queues: dict[str, Any], groups: list[Any], running: list[Any], w: Any,
                         code: ReasonCode, message: str) -> None:
    d = cycle(cluster(queues, *groups), [w], running, preemption=False)
    r = d.reason("w")
    assert r is not None and (r.code, r.message, r.position) == (code, message, 1)


def test_every_pending_workload_has_a_reason_and_position() -> None:
    c = cluster(TWO, ("n", "A100", 8, 2))
    pend = [wl(f"{q}{i}", q, submit_s=i) for q in "ab" for i in range(4)]
    d = cycle(c, pend)
    assert len(d.admissions) + len(d.pending) == len(pend)
    for q in "ab":
        assert [p.position for p in d.pending if p.queue == q] == [1, 2, 3]


def test_deterministic_and_snapshot_untouched() -> None:
    c = cluster(TWO, ("n", "A100", 8, 3))
    running = [run(wl("x", "a", gpus=4), "A100", ("n-0", 4))]
    pend = [wl(f"w{i}", "ab"[i % 2], gpus=2 + i % 3) for i in range(9)]
    snap = snapshot(c, running, pend, Settings())
    free = snap.occupancy.node_free
    assert schedule(snap, 5.0) == schedule(snap, 5.0)
    assert snap.occupancy.node_free == free and snap.occupancy.usage["a"]["gpu"] == 4


def test_workload_in_non_leaf_queue_is_an_error() -> None:
    c = cluster({"r": {"queues": {"l": {}}}}, ("n", "A100", 8, 1))
    with pytest.raises(SnapshotError, match="queue r is not a leaf"):
        cycle(c, [wl("w", "r")])


def test_admission_respects_max_across_cycle() -> None:
    c = cluster({"r": {"max": {"gpu": 16}, "queues": {"x": {}, "y": {}}}}, ("n", "A100", 8, 4))
    d = cycle(c, [wl("x1", "r.x"), wl("y1", "r.y"), wl("x2", "r.x"), wl("y2", "r.y")])
    assert admitted(d) == {"x1": {"n-0": 8}, "y1": {"n-1": 8}}


def test_fast_pending_reason_is_the_same_value() -> None:
    from dataclasses import FrozenInstanceError

    from scheduler.model import PendingReason, pending_reason

    r = pending_reason("w", "q", ReasonCode.NO_FIT, "m", 3)
    assert type(r) is PendingReason and r == PendingReason("w", "q", ReasonCode.NO_FIT, "m", 3)
    assert hash(r) == hash(PendingReason("w", "q", ReasonCode.NO_FIT, "m", 3))
    with pytest.raises(FrozenInstanceError):
        r.message = "x"  # type: ignore[misc]


def test_reasons_follow_the_state_across_cycles() -> None:
    """A reason kept from the last cycle is only reused while it is still right: positions and
    numbers follow the new snapshot."""
    c = cluster({"q": {"guaranteed": {"gpu": 8}}}, ("n", "A100", 8, 2))
    big = [wl(f"b{i}", "q", pods=2, submit_s=i) for i in range(3)]
    busy = run(wl("x", "q", gpus=4), "A100", ("n-0", 4))
    first = schedule(snapshot(c, [busy], big, Settings()), 100.0)
    assert schedule(snapshot(c, [busy], big, Settings()), 100.0) == first
    r = first.reason("b2")
    assert r is not None and r.position == 3 and "would hold 20 gpu" in r.message
    assert r.message.startswith("only 1 of 2 pods of 8 GPUs fit on free A100 nodes (largest free: 8)")
    busier = [busy, run(wl("y", "q", gpus=2), "A100", ("n-1", 2))]
    later = schedule(snapshot(c, busier, big[1:], Settings()), 101.0)
    r = later.reason("b2")
    assert r is not None and r.position == 2 and "would hold 22 gpu" in r.message
    assert r.message.startswith("no node of type A100 with 8 free GPUs (largest free: 6)")
