"""Quota: usage with ancestors, max over the chain, guarantees, floors, fair share, occupancy."""
from __future__ import annotations

import math
from typing import Any

import pytest

from scheduler.quota import (
    Ledger,
    below_floor,
    fair_share,
    never_within_max,
    over_guarantee,
    over_max,
)
from scheduler.snapshot import demand, occupancy_after, occupancy_of
from scheduler.testing import cluster, run, wl

TREE: dict[str, Any] = {
    "research": {
        "guaranteed": {"gpu": 16}, "max": {"gpu": 32},
        "queues": {
            "vision": {"guaranteed": {"gpu": 8}, "max": {"gpu/H100": 8, "gpu": 32}},
            "nlp": {"guaranteed": {"gpu": 8}},
        },
    },
    "prod": {"guaranteed": {"gpu": 32}, "max": {"gpu": 64}},
}
C = cluster(TREE, ("h", "H100", 8, 4), ("a", "A100", 8, 4))


def ledger(*running: tuple[str, str, int]) -> Ledger:
    rs = [run(wl(f"r{i}", q, gpus=n), t, (f"{t[0].lower()}-{i}", n)) for i, (q, t, n) in enumerate(running)]
    return Ledger(occupancy_of(C, rs).usage)


@pytest.mark.parametrize(("usage", "queue", "gpu_type", "n", "expect"), [
    pytest.param([], "research.vision", "H100", 8, None, id="fits-empty"),
    pytest.param([("research.vision", "H100", 8)], "research.vision", "H100", 8,
                 ("research.vision", "gpu/H100", 8, 8), id="typed-max-of-leaf"),
    pytest.param([("research.vision", "H100", 8)], "research.vision", "A100", 8, None, id="typed-max-other-type"),
    pytest.param([("research.nlp", "A100", 8)] * 3, "research.vision", "A100", 16,
                 ("research", "gpu", 32, 24), id="parent-max-caps-children-together"),
    pytest.param([("prod", "A100", 8)] * 4, "research.nlp", "A100", 8, None, id="other-subtree-irrelevant"),
])
def test_over_max_walks_the_chain(usage: list[tuple[str, str, int]], queue: str, gpu_type: str, n: int,
                                  expect: tuple[str, str, int, int] | None) -> None:
    s = over_max(C, ledger(*usage), queue, demand(wl("w", queue, gpus=n), gpu_type))
    assert (None if s is None else (s.queue, s.resource, s.limit, s.used)) == expect


def test_usage_includes_ancestors_and_types() -> None:
    led = ledger(("research.vision", "H100", 8), ("research.nlp", "A100", 8))
    assert dict(led.of("research")) == {"gpu": 16, "gpu/H100": 8, "gpu/A100": 8}
    assert dict(led.of("root")) == {"gpu": 16, "gpu/H100": 8, "gpu/A100": 8}
    assert led.used("prod", "gpu") == 0


def test_ledger_copies_on_write_and_never_changes_the_snapshot() -> None:
    occ = occupancy_of(C, [run(wl("x", "prod"), "A100", ("a-0", 8))])
    led = Ledger(occ.usage)
    led.add(C.chains["prod"], (("gpu", 8),))
    assert led.used("prod", "gpu") == 16 and occ.usage["prod"]["gpu"] == 8


def test_never_within_max() -> None:
    s = never_within_max(C, "research.vision", demand(wl("w", "research.vision", gpus=8, pods=2), "H100"))
    assert s is not None and (s.queue, s.resource, s.limit) == ("research.vision", "gpu/H100", 8)
    assert never_within_max(C, "research.vision", demand(wl("w", "research.vision", gpus=8, pods=2), "A100")) is None


@pytest.mark.parametrize(("usage", "n", "over"), [
    pytest.param([], 8, False, id="to-exactly-guaranteed"),
    pytest.param([], 16, True, id="above-guaranteed"),
    pytest.param([("research.nlp", "A100", 8)], 8, True, id="already-at-guaranteed"),
])
def test_over_guarantee_is_the_leaf(usage: list[tuple[str, str, int]], n: int, over: bool) -> None:
    s = over_guarantee(C, ledger(*usage), "research.nlp", demand(wl("w", "research.nlp", gpus=n), "A100"))
    assert (s is not None) is over


@pytest.mark.parametrize(("take", "shared", "blocked_by"), [
    # nlp holds 24 (guaranteed 8); research holds 24 (guaranteed 16)
    pytest.param(8, {"root"}, None, id="both-stay-at-or-above"),
    pytest.param(16, {"root"}, "research", id="unshared-parent-floor"),
    pytest.param(16, {"research", "root"}, None, id="shared-parent-no-floor"),
    pytest.param(24, {"research", "root"}, "research.nlp", id="leaf-floor"),
])
def test_below_floor(take: int, shared: set[str], blocked_by: str | None) -> None:
    led = ledger(*[("research.nlp", "A100", 8)] * 3)
    s = below_floor(C, led, "research.nlp", (("gpu", take),), frozenset(shared))
    assert (None if s is None else s.queue) == blocked_by


@pytest.mark.parametrize(("usage", "queue", "share"), [
    pytest.param([], "prod", 0.0, id="idle"),
    pytest.param([("prod", "A100", 8)] * 2, "prod", 0.5, id="half"),
    pytest.param([("research.nlp", "A100", 8)] * 3, "research.nlp", 3.0, id="borrowing"),
])
def test_fair_share(usage: list[tuple[str, str, int]], queue: str, share: float) -> None:
    assert fair_share(C, ledger(*usage), queue) == share


def test_fair_share_without_guarantee_is_infinite_once_used() -> None:
    c = cluster({"free": {}}, ("a", "A100", 8, 1))
    led = Ledger(occupancy_of(c, [run(wl("x", "free"), "A100", ("a-0", 8))]).usage)
    assert math.isinf(fair_share(c, led, "free"))


def test_occupancy_after_matches_recomputation() -> None:
    rs = [run(wl("x", "prod"), "A100", ("a-0", 8)), run(wl("y", "research.vision"), "H100", ("h-0", 4))]
    z = run(wl("z", "research.nlp", gpus=4, pods=2), "H100", ("h-0", 4), ("h-1", 4))
    inc = occupancy_after(C, occupancy_of(C, rs), [rs[0]], [z])
    full = occupancy_of(C, [rs[1], z])
    assert inc.node_free == full.node_free
    def strip(u):
        return {q: {k: v for k, v in d.items() if v} for q, d in u.items() if any(d.values())}

    assert strip(inc.usage) == strip(full.usage)


@pytest.mark.parametrize("many", [False, True], ids=["incremental", "rebuilt"])
def test_occupancy_levels_follow_the_free_counts(many: bool) -> None:
    """``Occupancy.levels`` (each type's nodes by free count) kept up to date by occupancy_after
    equals the levels recomputed from the free counts, whether updated in place or rebuilt."""
    from scheduler.snapshot import levels_of

    c = cluster(TREE, ("h", "H100", 8, 20), ("a", "A100", 8, 20))
    rs = [run(wl(f"x{i}", "prod", gpus=4), "A100", (f"a-{i}", 4)) for i in range(12 if many else 2)]
    z = run(wl("z", "research.nlp", gpus=4, pods=2), "H100", ("h-0", 4), ("h-3", 4))
    occ = occupancy_of(c, rs[:1])
    assert occ.levels == levels_of(c, occ.node_free)
    inc = occupancy_after(c, occ, rs[:1], [*rs[1:], z])
    assert inc.levels == levels_of(c, inc.node_free)
    assert inc.levels["H100"][4] == (0, 3) and inc.levels["H100"][8] == tuple(i for i in range(1, 20) if i != 3)
