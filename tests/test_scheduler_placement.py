"""Placement: best fit, all-or-nothing gangs, the free-count index, GPU-type fallback."""
from __future__ import annotations

import pytest

from scheduler.model import Placement
from scheduler.placement import FreeIndex, node_slots
from scheduler.testing import admitted, cluster, cycle, run, wl

Q = {"q": {}}


def index(free: dict[str, int], *groups: tuple[str, str, int, int]) -> FreeIndex:
    c = cluster(Q, *groups)
    return FreeIndex(c, tuple(free.get(n.name, n.gpus) for n in c.nodes))


@pytest.mark.parametrize(("free", "k", "pods", "expect"), [
    pytest.param({}, 8, 1, {"n-0": 8}, id="empty-cluster-lowest-index"),
    pytest.param({"n-0": 8, "n-1": 2, "n-2": 4}, 2, 1, {"n-1": 2}, id="best-fit-exact"),
    pytest.param({"n-0": 8, "n-1": 3, "n-2": 5}, 4, 1, {"n-2": 4}, id="best-fit-smallest-that-fits"),
    pytest.param({"n-0": 8, "n-1": 4, "n-2": 4}, 4, 2, {"n-1": 4, "n-2": 4}, id="gang-on-tight-nodes"),
    pytest.param({"n-0": 8, "n-1": 0, "n-2": 0}, 4, 2, {"n-0": 8}, id="two-pods-one-node"),
    pytest.param({"n-0": 6, "n-1": 6, "n-2": 6}, 4, 4, None, id="gang-all-or-nothing"),
    pytest.param({"n-0": 3, "n-1": 3, "n-2": 3}, 4, 1, None, id="fragmented-9-free-no-4"),
])
def test_place(free: dict[str, int], k: int, pods: int, expect: dict[str, int] | None) -> None:
    ix = index(free, ("n", "A100", 8, 3))
    before = list(ix.free)
    got = ix.place("A100", k, pods)
    if expect is None:
        assert got is None
        assert ix.free == before, "a failed gang takes nothing"
    else:
        assert got is not None and got.as_dict() == expect
        assert sum(before) - sum(ix.free) == k * pods


def test_slots_counts_pods_per_node() -> None:
    ix = index({"n-0": 8, "n-1": 5, "n-2": 3}, ("n", "A100", 8, 3))
    assert ix.slots("A100", 4, 99) == 3        # 2 on n-0, 1 on n-1
    assert ix.slots("A100", 1, 99) == 16
    assert ix.slots("H100", 1, 99) == 0
    assert ix.largest_free("A100") == 8


def test_index_stays_consistent_through_take_and_release() -> None:
    ix = index({}, ("n", "A100", 8, 4))
    a = ix.place("A100", 8, 1)
    b = ix.place("A100", 4, 1)
    assert a is not None and b is not None
    ix.release(a)
    c = ix.place("A100", 8, 2)
    assert c is not None and c.as_dict() == {"n-0": 8, "n-2": 8}
    ix.take(Placement("A100", (("n-3", 8),)))
    assert ix.place("A100", 4, 1) == Placement("A100", (("n-1", 4),))
    assert ix.place("A100", 1, 1) is None


def test_release_beyond_capacity_is_refused() -> None:
    ix = index({}, ("n", "A100", 8, 1))
    with pytest.raises(ValueError, match="n-0"):
        ix.release(Placement("A100", (("n-0", 1),)))


def test_node_slots_on_empty_nodes() -> None:
    c = cluster(Q, ("h", "H100", 8, 2), ("s", "H100", 4, 1))
    assert node_slots(c, "H100", 4) == 5
    assert node_slots(c, "H100", 8) == 2
    assert node_slots(c, "A100", 1) == 0


@pytest.mark.parametrize(("types", "expect_type"), [
    pytest.param(("H100", "A100"), "A100", id="falls-back-to-second-type"),
    pytest.param(("A100", "H100"), "A100", id="first-type-free"),
    pytest.param((), "A100", id="any-type-takes-the-free-one"),
])
def test_type_fallback(types: tuple[str, ...], expect_type: str) -> None:
    c = cluster(Q, ("h", "H100", 8, 1), ("a", "A100", 8, 1))
    busy = run(wl("busy", "q", types=("H100",)), "H100", ("h-0", 8))
    d = cycle(c, [wl("w", "q", types=types)], [busy])
    assert [a.placement.gpu_type for a in d.admissions] == [expect_type]


def test_type_preference_respected_when_both_free() -> None:
    c = cluster(Q, ("h", "H100", 8, 1), ("a", "A100", 8, 1))
    assert admitted(cycle(c, [wl("w", "q", types=("A100", "H100"))])) == {"w": {"a-0": 8}}
    assert admitted(cycle(c, [wl("w", "q", types=("H100", "A100"))])) == {"w": {"h-0": 8}}


def test_never_on_an_unacceptable_type() -> None:
    c = cluster(Q, ("h", "H100", 8, 2))
    d = cycle(c, [wl("w", "q", types=("A100",))])
    assert d.admissions == ()
    r = d.reason("w")
    assert r is not None and r.message == "no node of an acceptable type (A100) in the cluster"


@pytest.mark.parametrize("seed", range(6))
def test_index_from_snapshot_levels_places_like_a_full_scan(seed: int) -> None:
    """A free index started from the snapshot's nodes-by-free-count levels (no pass over every
    node) picks exactly the nodes that one built from the free counts alone picks."""
    import random

    from scheduler.snapshot import levels_of

    rng = random.Random(seed)
    c = cluster(Q, ("n", "A100", 8, 12), ("s", "A100", 4, 5), ("h", "H100", 8, 6))
    free = tuple(rng.randint(0, n.gpus) for n in c.nodes)
    plain, leveled = FreeIndex(c, free), FreeIndex(c, free, levels_of(c, free))
    placed: list[Placement] = []
    for _ in range(60):
        op = rng.random()
        if op < 0.6:
            args = (rng.choice(("A100", "H100")), rng.choice((1, 2, 4, 8)), rng.choice((1, 1, 2, 3)))
            got = plain.place(*args)
            assert leveled.place(*args) == got
            if got is not None:
                placed.append(got)
        elif placed:
            p = placed.pop(rng.randrange(len(placed)))
            plain.release(p)
            leveled.release(p)
        assert plain.free == leveled.free
