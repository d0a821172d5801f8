"""The victim search's overlay of the free index (scheduler.placement.Trial) and its skip of
searches that would fail and leave nothing behind (scheduler.preemption.Pool.quiet): the same
fits, the same index afterwards (down to the stacks that break ties between equal nodes), and the
same decisions and reasons, cycle by cycle, as the search that changed the index at once."""
from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest

from benchmarks.same_decisions import random_scenario
from scheduler import preemption
from scheduler.cycle import schedule
from scheduler.model import Decisions, Placement
from scheduler.placement import FreeIndex, Trial
from scheduler.simulator import parse_scenario, simulate
from scheduler.snapshot import Snapshot

SHARES = (0.25, 0.5, 0.375, 0.7)


def share_scenario(seed: int) -> dict[str, Any]:
    """benchmarks/same_decisions.py's random scenario (preemption on) with most of its one- and
    two-GPU work asking shares of one GPU instead (the flood keeps whole nodes)."""
    rng = random.Random(seed)
    sc = random_scenario(rng, seed)
    for w in sc["workloads"]:
        if w["gpus_per_pod"] in (1, 2) and rng.random() < 0.6:
            w["gpus_per_pod"] = rng.choice(SHARES)
    sc["scheduler"]["preemption"] = True
    return sc


def rules_scenario(seed: int) -> dict[str, Any]:
    """:func:`share_scenario` under issue 21's rules too, drawn per scenario: ``reclaim: fair_share``
    (with weights, so entitlements differ from the guarantees), ``within_queue: lower_priority`` on
    some leaves (and priorities spread, so there is lower-priority work to take), ``min_runtime_s``
    on some queues (protected work is no candidate), queue priorities (the victim order's queue
    rank) and ``usage_half_life_s`` (the order of the queues by their past usage)."""
    sc = share_scenario(seed)
    rng = random.Random(10_000 + seed)
    sched = sc["scheduler"]
    if rng.random() < 0.6:
        sched["reclaim"] = "fair_share"
    if rng.random() < 0.3:
        sched["usage_half_life_s"] = rng.choice((60, 600))
    for parent in sc["queues"].values():
        if rng.random() < 0.3:
            parent["priority"] = rng.randint(0, 2)
        if rng.random() < 0.2:
            parent["min_runtime_s"] = rng.choice((20, 100))
        for leaf in parent["queues"].values():
            leaf["weight"] = rng.choice((0, 1, 1, 2, 3))
            if rng.random() < 0.5:
                leaf["within_queue"] = "lower_priority"
            if rng.random() < 0.2:
                leaf["min_runtime_s"] = rng.choice((0, 30, 150))
            if rng.random() < 0.2:
                leaf["priority"] = rng.randint(0, 2)
    for w in sc["workloads"]:
        if rng.random() < 0.3:
            w["priority"] = rng.randint(0, 5)
    return sc


def snapshots(seeds: range) -> list[Snapshot]:
    """The snapshots of replays whose running work holds shares."""
    out: list[Snapshot] = []

    def keep(snap: Snapshot, now: float) -> Decisions:
        if any(r.placement.shares for r in snap.running):
            out.append(snap)
        return schedule(snap, now)

    for seed in seeds:
        simulate(parse_scenario(share_scenario(seed)), keep)
    return out


def fresh(snap: Snapshot) -> FreeIndex:
    occ = snap.occupancy
    return FreeIndex(snap.cluster, occ.node_free, occ.levels, occ.partial)


def state(ix: FreeIndex, types: tuple[str, ...]) -> tuple[Any, ...]:
    part = {i: dict(d) for i, d in ix.partial().items() if d}
    return (list(ix.free), {t: list(c) for t, c in ix._counts.items()}, part,
            {t: list(ix._plist(t)) for t in types}, dict(ix._stacks), dict(ix._arrived))


def test_a_trial_counts_the_fit_and_settles_as_the_index_would() -> None:
    rng = random.Random(19)
    snaps = snapshots(range(12))
    assert len(snaps) > 30
    tried = settled = moved = 0
    for snap in rng.sample(snaps, 40):
        types = snap.cluster.types
        direct, over = fresh(snap), fresh(snap)
        for t in types:                              # build some stacks first: their order is state
            for k0 in (1, Decimal("0.25")):
                assert direct.place(t, k0, 1) == over.place(t, k0, 1)
        untouched = state(over, types)
        t = rng.choice(types)
        k: int | Decimal = rng.choice((1, 2, 4, 8, Decimal("0.25"), Decimal("0.5"), Decimal("0.7")))
        pods = rng.choice((1, 2, 3, 6))
        trial = Trial(over, t, k, pods)
        running = [r.placement for r in snap.running]
        rng.shuffle(running)
        ops: list[tuple[Placement, int]] = []
        out: list[Placement] = []
        frees = [list(direct.free)]                  # moved(): some node's whole free count changed
        for p in running[:rng.randint(1, len(running))]:
            direct.release(p)
            frees.append(list(direct.free))
            trial.release(p)
            ops.append((p, 1))
            out.append(p)
            assert trial.fits() == direct.fits(t, k, pods)
            tried += 1
            if out and rng.random() < 0.3:           # give one back, as the search's minimizing does
                q = out.pop(rng.randrange(len(out)))
                direct.take(q)
                frees.append(list(direct.free))
                trial.take(q)
                ops.append((q, -1))
                assert trial.fits() == direct.fits(t, k, pods)
        assert state(over, types) == untouched        # the index is untouched until settled
        assert trial.moved() == any(a != b for a, b in zip(frees, frees[1:]))
        moved += trial.moved()
        if rng.random() < 0.5:
            trial.commit()
        else:
            for p, sign in reversed(ops):            # the search's undo, on the index
                (direct.take if sign > 0 else direct.release)(p)
            trial.abandon()
        settled += 1
        assert state(over, types) == state(direct, types)
        for _ in range(6):                           # and they place alike from here on
            t2 = rng.choice(types)
            k2 = rng.choice((1, 2, Decimal("0.25"), Decimal("0.5")))
            assert over.place(t2, k2, 1) == direct.place(t2, k2, 1)
    assert tried > 100 and settled == 40 and 0 < moved < 40


def test_an_unsettled_trial_leaves_the_index_alone() -> None:
    snap = snapshots(range(3))[-1]
    ix = fresh(snap)
    before = state(ix, snap.cluster.types)
    trial = ix.trial(snap.cluster.types[0], 1, 1)
    for r in snap.running:
        trial.release(r.placement)
    assert state(ix, snap.cluster.types) == before
    with pytest.raises(ValueError, match="holds no share to give back"):
        trial.release(next(r.placement for r in snap.running if r.placement.shares))


class _AtOnce:
    """The search's changes made on the index at once (the search before the trial): the reference."""

    def __init__(self, index: FreeIndex, gpu_type: str, k: Any, pods: int) -> None:
        self.index, self.shape, self.done = index, (gpu_type, k, pods), []

    def fits(self) -> bool:
        return self.index.fits(*self.shape)

    def release(self, p: Placement) -> None:
        self.index.release(p)
        self.done.append((p, 1))

    def take(self, p: Placement) -> None:
        self.index.take(p)
        self.done.append((p, -1))

    def commit(self) -> None:
        pass

    def abandon(self) -> None:
        for p, sign in reversed(self.done):
            (self.index.take if sign > 0 else self.index.release)(p)


def replay(sc: dict[str, Any]) -> list[tuple[Any, ...]]:
    """Every cycle's admissions, preemptions and reasons (read right away), then the events."""
    cycles: list[tuple[Any, ...]] = []

    def reading(snap: Snapshot, now: float) -> Decisions:
        d = schedule(snap, now)
        cycles.append((now, d.admissions, d.preemptions, tuple(d.pending)))
        return d

    res = simulate(parse_scenario(sc), reading)
    cycles.append((res.events_jsonl(),))
    return cycles


def against_the_index(monkeypatch: pytest.MonkeyPatch, scenarios: list[dict[str, Any]]) -> tuple[
        list[list[tuple[Any, ...]]], int, int]:
    """Each scenario replayed with the search as it is and with the reference (every change on the
    index at once, no search skipped): the same decisions and reasons every cycle. Returns the
    replays, and how many searches between queues were skipped of those asked."""
    skipped = searched = 0
    quiet = preemption.Pool.quiet

    def counting(self: preemption.Pool, *a: Any) -> bool:
        nonlocal skipped, searched
        q = quiet(self, *a)
        skipped += q
        searched += 1
        return q

    with monkeypatch.context() as m:
        m.setattr(preemption.Pool, "quiet", counting)
        now = [replay(sc) for sc in scenarios]
    with monkeypatch.context() as m:
        m.setattr(FreeIndex, "trial", lambda self, t, k, pods: _AtOnce(self, t, k, pods))
        m.setattr(preemption.Pool, "quiet", lambda self, *a: False)
        before = [replay(sc) for sc in scenarios]
    for sc, a, b in zip(scenarios, now, before):
        assert a == b, sc["name"]
    return now, skipped, searched


def test_the_search_decides_and_says_what_it_did_on_the_index(monkeypatch: pytest.MonkeyPatch) -> None:
    now, skipped, searched = against_the_index(monkeypatch, [share_scenario(s) for s in range(40)])
    assert sum(e.count('"preempt"') for c in now for e in c[-1]) > 20      # it preempts, with shares
    assert 0 < skipped < searched                     # some searches skipped, some made


def test_the_search_decides_alike_under_fair_share_within_queue_and_min_runtime(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 21's rules drawn in (:func:`rules_scenario`): the skip's floor is the entitlement too
    under fair_share, protected work is no live candidate, and the search within a queue runs on
    the trial as well (and, deciding, ends what the skip knew)."""
    now, skipped, searched = against_the_index(monkeypatch, [rules_scenario(s) for s in range(50)])
    events = "".join(c[-1][0] for c in now)
    reasons = "".join(m for c in now for cyc in c[:-1] for m in map(str, cyc[3]))
    assert events.count('"preempt"') > 20
    assert "preempt within queue" in events           # within_queue: searches within a queue decided
    assert "reclaim entitlement for" in events         # fair_share: preemptions toward an entitlement
    assert "protected by min_runtime_s" in reasons     # min_runtime_s: protected candidates counted
    assert 0 < skipped < searched


def test_a_search_that_kills_is_not_skipped() -> None:
    """Queue a holds 1.5 GPUs in shares of 0.5 over a guarantee of 1, each share on a device that
    d (within its guarantee) shares too, and d holds the rest of both nodes: b's search for a whole
    node fails, but on the way it takes a2 (a down to 1) and kills a1 and a0 (a would go below its
    guarantee). So e's search, in the same cycle, considers a2 alone: b's was not skippable."""
    share = [{"id": f"{q}{i}", "queue": q, "submit": i, "duration": 1000, "gpus_per_pod": 0.5}
             for i in range(3) for q in ("a", "d")]
    sc = {"name": "kills", "scheduler": {"preemption": True, "preemption_delay_s": 0, "cycle_interval_s": 1},
          "nodes": [{"name": "n", "gpu_type": "H100", "gpus": 4, "count": 2}],
          "queues": {"a": {"guaranteed": {"gpu": 1}}, "d": {"guaranteed": {"gpu": 8}},
                     "b": {"guaranteed": {"gpu": 8}}, "e": {"guaranteed": {"gpu": 8}}},
          "workloads": [*share,
                        {"id": "d-one", "queue": "d", "submit": 3, "duration": 1000, "gpus_per_pod": 1},
                        {"id": "d-node", "queue": "d", "submit": 3, "duration": 1000, "gpus_per_pod": 4},
                        {"id": "b0", "queue": "b", "submit": 10, "duration": 10, "gpus_per_pod": 4},
                        {"id": "e0", "queue": "e", "submit": 10, "duration": 10, "gpus_per_pod": 4}]}
    said: dict[str, str] = {}

    def reading(snap: Snapshot, now: float) -> Decisions:
        d = schedule(snap, now)
        if now == 10.0:
            said.update((p.workload, p.message) for p in d.pending)
        return d

    simulate(parse_scenario(sc), reading)
    assert said["b0"].endswith("(3 running workloads considered)"), said
    assert said["e0"].endswith("(1 running workloads considered)"), said


def test_a_preemption_within_a_queue_ends_what_the_skip_knew(monkeypatch: pytest.MonkeyPatch) -> None:
    """b0's search (two shares of 0.5) is skippable: given back, a0's share leaves one slot on a
    device that d0 shares too. Then c-high preempts c-low within its queue (within_queue), a whole
    GPU for a share of 0.5: half a device more is free. e0, the same shape as b0 in the same cycle
    (its queue walked after c's: e's share of its guarantee is the larger, its usage on an L40S),
    fits now with a0 given back: it must search (and take a0), not read b0's skip."""
    def job(i: str, q: str, submit: int, gpus: float, prio: int = 0) -> dict[str, Any]:
        return {"id": i, "queue": q, "submit": submit, "duration": 1000, "gpus_per_pod": gpus, "priority": prio}

    sc = {"name": "within", "scheduler": {"preemption": True, "preemption_delay_s": 0, "cycle_interval_s": 1},
          "nodes": [{"name": "n", "gpu_type": "H100", "gpus": 2}, {"name": "l", "gpu_type": "L40S", "gpus": 1}],
          "queues": {"a": {"guaranteed": {"gpu": 0}}, "d": {"guaranteed": {"gpu": 8}},
                     "b": {"guaranteed": {"gpu": 8}}, "e": {"guaranteed": {"gpu": 8}},
                     "c": {"guaranteed": {"gpu": 100}, "within_queue": "lower_priority"}},
          "workloads": [job("a0", "a", 0, 0.5, 5), job("d0", "d", 1, 0.5), job("c-low", "c", 2, 1),
                        {**job("e-run", "e", 3, 1), "gpu_types": ["L40S"]},
                        {**job("b0", "b", 10, 0.5, 5), "pods": 2, "gpu_types": ["H100"]},
                        {**job("c-high", "c", 10, 0.5, 1), "gpu_types": ["H100"]},
                        {**job("e0", "e", 10, 0.5, 5), "pods": 2, "gpu_types": ["H100"]}]}
    got: dict[str, tuple[str, ...]] = {}

    def reading(snap: Snapshot, now: float) -> Decisions:
        d = schedule(snap, now)
        if now == 10.0:
            got.update((p.preemptor, p.victims) for p in d.preemptions)
        return d

    quiet = preemption.Pool.quiet
    said: list[bool] = []
    monkeypatch.setattr(preemption.Pool, "quiet", lambda self, *a: said.append(quiet(self, *a)) or said[-1])
    simulate(parse_scenario(sc), reading)
    assert got == {"c-high": ("c-low",), "e0": ("a0",)}, got
    assert said[:3] == [True, False, False], said     # b0 skipped; c-high's and e0's searched
