"""The scheduler at depth (issue 11): the cycle that replays unchanged queues and keeps the pending
grouping between cycles decides exactly as the core before it (the frozen copy in
benchmarks/_core_baseline), reasons and positions included, on random scenarios and on a reduced
backlog drain (benchmarks/bench_scheduler.py --backlog)."""
from __future__ import annotations

import dataclasses
import random
from typing import Any

import pytest

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks._core_baseline.cycle import schedule as schedule_before
from benchmarks.bench_scheduler import TYPES, drain, make_backlog
from scheduler.cycle import schedule
from scheduler.memo import CycleMemo
from scheduler.model import Decisions, PendingReasons, Workload
from scheduler.ordering import by_queue, grouped
from scheduler.simulator.engine import simulate
from scheduler.simulator.scenario import Scenario
from accounting.queues import parse_queue_config
from scheduler.model import Node
from scheduler.snapshot import Cluster, PendingChanges, Settings, build_cluster


def small_cluster(n_nodes: int, strict: bool) -> Cluster:
    """Two parents of three leaves, guarantees over 80% of the GPUs, a leaf max of a quarter and a
    parent max of half the cluster; ``strict``: the first leaf is strict FIFO."""
    gpus = n_nodes * 8
    leaf_g = gpus * 4 // 5 // 6
    queues = {f"org{i}": {"guaranteed": {"gpu": leaf_g * 3}, "max": {"gpu": gpus // 2},
                          "queues": {f"team{j}": {"guaranteed": {"gpu": leaf_g}, "max": {"gpu": gpus // 4},
                                                  **({"strict_fifo": True} if strict and i == j == 0 else {})}
                                     for j in range(3)}}
              for i in range(2)}
    nodes = [Node(f"{t.lower()}-{i}", t, 8) for t in TYPES for i in range(n_nodes // len(TYPES))]
    return build_cluster(parse_queue_config({"queues": queues}), nodes)


class Keep:
    """A schedule_fn that keeps every cycle's Decisions (their reasons read only at the end)."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.decisions = fn, []

    def __call__(self, snap: Any, now: float) -> Decisions:
        d = self.fn(snap, now)
        self.decisions.append(d)
        return d


def run_both(n: int, nodes: int, seed: int, preemption: bool, delay: float,
             strict: bool = False) -> tuple[Keep, Keep, str, str]:
    out = []
    for fn in (schedule_before, schedule):
        c = small_cluster(nodes, strict)                          # a fresh cluster each: memos apart
        keep = Keep(fn)
        sc = Scenario("depth", None, 1.0, Settings(preemption, delay), c,
                      make_backlog(c, n, seed, within_s=20.0))
        res = simulate(sc, keep)
        out.append((keep, res.events_jsonl()))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def same_cycles(a: Keep, b: Keep) -> int:
    """Assert every cycle decided the same; the reasons of the new core's cycles are read only now,
    after all cycles ran (a lazily built list must not see later cycles). Returns how many cycles
    replayed a queue."""
    assert len(a.decisions) == len(b.decisions)
    lazy = 0
    for da, db in zip(a.decisions, b.decisions):
        assert (da.now_s, da.admissions, da.preemptions) == (db.now_s, db.admissions, db.preemptions)
        lazy += isinstance(db.pending, PendingReasons)
        assert len(db.pending) == len(da.pending)
        assert tuple(db.pending) == tuple(da.pending)
        assert db.pending == da.pending and da.pending == db.pending
    return lazy


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(20, 300), nodes=st.sampled_from([20, 40, 80]), seed=st.integers(0, 10**6),
       preemption=st.booleans(), delay=st.sampled_from([0.0, 5.0, 30.0]), strict=st.booleans())
def test_random_backlogs_decide_as_the_core_before(n: int, nodes: int, seed: int, preemption: bool,
                                                   delay: float, strict: bool) -> None:
    a, b, ea, eb = run_both(n, nodes, seed, preemption, delay, strict)
    assert eb == ea                                   # the same events, byte for byte
    same_cycles(a, b)


def test_reduced_backlog_drain_same_decisions_and_replays() -> None:
    """The benchmark's backlog shape at a reduced size (1,500 workloads, 100 nodes, 1,000 queues,
    the first 200 simulated seconds): the same cycle by cycle, and the replay path is taken (the
    test would pass vacuously otherwise)."""
    replays = _count_replays()
    ra, reca = drain(1_500, 100, Keep(schedule_before), until_s=200.0)
    rb, recb = drain(1_500, 100, Keep(schedule), until_s=200.0)
    assert ra["admissions"] == rb["admissions"] > 300
    lazy = same_cycles(reca.fn, recb.fn)
    assert lazy == len(recb.cycles)                   # every cycle's reasons are built when read
    assert replays["queues"] > 1_000 * len(recb.cycles) // 4, replays


class ReadNow(Keep):
    """Keep, reading every reason right after each cycle (as the service does): a quiet queue whose
    reasons are as last built gets that same list back."""

    def __call__(self, snap: Any, now: float) -> Decisions:
        d = super().__call__(snap, now)
        tuple(d.pending)
        return d


def test_reasons_read_every_cycle_equal_the_core_before() -> None:
    """The reduced drain with every reason read after each cycle, as the service does (the reuse
    of a quiet queue's last built reasons is then taken): the same reasons, cycle by cycle."""
    import scheduler.cycle as cy
    hits = {"n": 0}
    build = cy._Part._build

    def counting(self, segments, vs):  # type: ignore[no-untyped-def]
        hits["n"] += 1
        return build(self, segments, vs)

    cy._Part._build = counting  # type: ignore[method-assign]
    _UNDO.append(lambda: setattr(cy._Part, "_build", build))
    parts = _count_replays()
    _, reca = drain(1_500, 100, Keep(schedule_before), until_s=120.0)
    _, recb = drain(1_500, 100, ReadNow(schedule), until_s=120.0)
    same_cycles(reca.fn, recb.fn)
    assert hits["n"] < parts["queues"] // 2, (hits, parts)     # most quiet parts were not rebuilt


def _count_replays() -> dict[str, int]:
    """Counts the queues cycles skip (quiet: a part built without a walk) from now until the test
    ends (the patch is undone by the autouse fixture below)."""
    import scheduler.cycle as cy
    counts = {"queues": 0}
    init = cy._Quiet.__init__

    def counting(self, *args):  # type: ignore[no-untyped-def]
        counts["queues"] += 1
        init(self, *args)

    cy._Quiet.__init__ = counting  # type: ignore[method-assign]
    _UNDO.append(lambda: setattr(cy._Quiet, "__init__", init))
    return counts


_UNDO: list[Any] = []


@pytest.fixture(autouse=True)
def _undo_patches() -> Any:
    yield
    while _UNDO:
        _UNDO.pop()()


def test_grouped_follows_the_callers_changes() -> None:
    """With PendingChanges from the caller (what the simulator passes), the grouping is by_queue's,
    call after call, without comparing the whole pending list; changes that do not match (a removed
    workload not there, a count that does not add up, another base) fall back to the full path."""
    c = small_cluster(40, False)
    rng = random.Random(11)
    pool = list(make_backlog(c, 400, seed=9))
    memo = CycleMemo()
    pending = tuple(pool[:200])
    grouped(memo, pending)
    for step in range(80):
        gone = rng.sample(pending, min(len(pending), rng.randint(0, 12)))
        left = [w for w in pending if w not in set(gone)]
        came = [w for w in rng.sample(pool, rng.randint(0, 10)) if w not in set(left)]
        new = tuple(left + came)
        changes = PendingChanges(pending, tuple(gone), tuple(came))
        if step % 19 == 18:                               # a wrong account of the changes
            changes = PendingChanges(pending, tuple(gone[:-1]) + (pool[-1],), tuple(came))
        if step % 23 == 22:
            changes = PendingChanges(tuple(pending), tuple(gone), tuple(came))   # not the base seen
        got = grouped(memo, new, changes)
        want = by_queue(new)
        assert list(got) == list(want), step
        assert all(got[q] == want[q] for q in want), step
        pending = new


def test_candidates_kept_in_order_equal_a_full_sort() -> None:
    """The victim candidates kept between cycles (started and stopped ones placed by bisection)
    are the list a full sort gives, as the running set changes."""
    from scheduler.model import Placement, Running
    from scheduler.preemption import candidates
    from scheduler.quota import Ledger
    c = small_cluster(40, False)
    rng = random.Random(4)
    ws = make_backlog(c, 600, seed=2)
    runs = [Running(w, Placement(rng.choice(TYPES), ()), float(rng.randint(0, 50)), rng.random() < 0.3)
            for w in ws]
    runs = [r if i % 7 else Running(dataclasses.replace(r.workload, preemptible=False), r.placement,
                                    r.start_s) for i, r in enumerate(runs)]
    ledger = Ledger({q: {"gpu": 10**6} for q in c.chains})      # every queue above its guarantee
    memo = CycleMemo()
    running = runs[:300]
    for step in range(40):
        assert candidates(c, ledger, tuple(running), memo) == candidates(c, ledger, tuple(running))
        for _ in range(rng.randint(0, 15)):
            running.pop(rng.randrange(len(running)))
        running += [r for r in rng.sample(runs, rng.randint(0, 15)) if r not in running]


def test_large_replay_freezes_and_gives_back_the_heap() -> None:
    """A replay of 5,000 workloads or more keeps what survives each cycle out of the collector's
    full passes and gives it back at the end (no object stays frozen); the events are the same as
    with the collector left alone."""
    import gc
    c = small_cluster(40, False)
    sc = Scenario("freeze", 120.0, 1.0, Settings(), c, make_backlog(c, 5_000, seed=3, within_s=20.0))
    gc.unfreeze()                    # a test before may have frozen its heap (gpuq serve in process)
    frozen = simulate(sc).events_jsonl()
    assert gc.get_freeze_count() == 0
    gc.freeze()                                            # someone froze already: left alone
    try:
        plain = simulate(sc).events_jsonl()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert frozen == plain


def test_grouped_equals_by_queue_as_pending_changes() -> None:
    """The pending grouping kept between cycles is by_queue's, call after call, as workloads come
    and go (and when objects are replaced by equal ones, or a queue empties or appears)."""
    c = small_cluster(40, False)
    rng = random.Random(3)
    pool = list(make_backlog(c, 400, seed=5))
    memo = CycleMemo()
    pending: list[Workload] = pool[:200]
    for step in range(60):
        got = grouped(memo, tuple(pending))
        want = by_queue(pending)
        assert list(got) == list(want)
        assert all(got[q] == want[q] for q in want)
        k = rng.randint(0, 12)
        for _ in range(k):
            if pending:
                pending.pop(rng.randrange(len(pending)))
        pending += rng.sample(pool, rng.randint(0, 10))
        pending = list(dict.fromkeys(pending))           # no object twice
        if step % 17 == 16:
            pending = [Workload(w.id, w.queue, w.pods, w.gpus_per_pod, w.gpu_types, w.priority,
                                submit_s=w.submit_s) for w in pending]
    dup = pending[:3] + pending[:1]                      # one object twice: by_queue keeps both
    assert grouped(memo, tuple(dup)) == by_queue(dup)
    assert len(TYPES) == 4
