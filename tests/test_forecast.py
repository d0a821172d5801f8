"""The start-time forecasts' pure core (scheduler.forecast): hand-checkable forward runs, declared
durations, the duration model's back-off and conditional draws, the arrival bootstrap, seeded
determinism, and that a workload's true duration is never read."""
from __future__ import annotations

import random
from dataclasses import fields, replace

import pytest

from scheduler.forecast import ArrivalModel, DurationModel, Eta, Forecaster, quantile, tail_index
from scheduler.model import Workload
from scheduler.snapshot import Settings, snapshot
from scheduler.testing import cluster, run, wl

ONE_NODE = ({"q": {"guaranteed": {"gpu": 8}}, "r": {"guaranteed": {"gpu": 0}}}, ("h", "H100", 8, 1))


def one_node():  # type: ignore[no-untyped-def]
    return cluster(*ONE_NODE)


def test_one_busy_node_declared_durations_hand_checked() -> None:
    """One 8-GPU node, busy until t=100 (declared 100 s, started at 0); two 8-GPU workloads wait,
    declaring 50 and 30 s. Nothing has finished, so declared durations are taken as they are: the
    first starts when the node frees at 100, the second at 150."""
    c = one_node()
    busy = run(wl("busy", "q", expected_duration_s=100.0), "H100", ("h-0", 8), start_s=0.0)
    a = wl("a", "q", submit_s=10.0, expected_duration_s=50.0)
    b = wl("b", "q", submit_s=11.0, expected_duration_s=30.0)
    snap = snapshot(c, [busy], [a, b], Settings(preemption=False))
    got = Forecaster(c, 1.0, runs=8).forecast(snap, 20.0, DurationModel(), random.Random(1))
    assert got["a"] == Eta(100.0, 100.0, 100.0)
    assert got["b"] == Eta(150.0, 150.0, 150.0)


def test_true_duration_never_read() -> None:
    """The same workloads with absurd ``duration_s`` values give the same forecasts."""
    c = one_node()
    model = DurationModel(min_samples=2)
    for d in (40.0, 60.0, 80.0, 120.0):
        model.observe(wl(f"f{d}", "q"), d)

    def fc(scale: float) -> dict[str, Eta]:
        busy = run(wl("busy", "q", duration_s=1e9 * scale), "H100", ("h-0", 8), start_s=0.0)
        pend = [wl(f"p{i}", "q", submit_s=float(i), duration_s=scale * (i + 1)) for i in range(3)]
        snap = snapshot(c, [busy], pend, Settings(preemption=False))
        return Forecaster(c, 1.0, runs=16).forecast(snap, 5.0, model, random.Random(7))

    assert fc(1.0) == fc(1e6)


def test_first_cycle_admissions_get_that_cycles_time() -> None:
    c = cluster({"q": {"guaranteed": {"gpu": 8}}}, ("h", "H100", 8, 2))
    busy = run(wl("busy", "q"), "H100", ("h-0", 8), start_s=0.0)
    now_fits, waits = wl("fits", "q", submit_s=1.0), wl("waits", "q", submit_s=2.0)
    snap = snapshot(c, [busy], [now_fits, waits], Settings(preemption=False))
    got = Forecaster(c, 1.0, runs=4).forecast(snap, 3.0, DurationModel(), random.Random(0))
    assert got["fits"] == Eta(3.0, 3.0, 3.0)
    assert got["waits"].p10 > 3.0 and got["waits"].p10 <= got["waits"].p50 <= got["waits"].p90


def test_targets_restrict_and_caller_cluster_memo_untouched() -> None:
    c = one_node()
    busy = run(wl("busy", "q", expected_duration_s=10.0), "H100", ("h-0", 8), start_s=0.0)
    pend = [wl("a", "q", submit_s=1.0, expected_duration_s=5.0), wl("b", "q", submit_s=2.0, expected_duration_s=5.0)]
    memo = c.memo
    before = {f.name: repr(getattr(memo, f.name)) for f in fields(memo)}
    got = Forecaster(c, 1.0, runs=2).forecast(snapshot(c, [busy], pend), 3.0, DurationModel(), random.Random(0),
                                               targets=["b"])
    assert set(got) == {"b"} and got["b"].p50 == 15.0
    assert c.memo is memo and {f.name: repr(getattr(memo, f.name)) for f in fields(memo)} == before


def test_seeded_determinism() -> None:
    c = cluster({"q": {"guaranteed": {"gpu": 16}}}, ("h", "H100", 8, 2))
    model = DurationModel(min_samples=3)
    rng = random.Random(3)
    for i in range(30):
        model.observe(wl(f"f{i}", "q"), rng.lognormvariate(5.0, 1.0))
    running = [run(wl("r0", "q"), "H100", ("h-0", 8), start_s=0.0), run(wl("r1", "q"), "H100", ("h-1", 8), start_s=50.0)]
    pend = [wl(f"p{i}", "q", submit_s=60.0 + i) for i in range(6)]
    snap = snapshot(c, running, pend, Settings(preemption=False))
    fc = Forecaster(c, 1.0, runs=16)
    first = fc.forecast(snap, 100.0, model, random.Random(42))
    assert fc.forecast(snap, 100.0, model, random.Random(42)) == first
    assert Forecaster(c, 1.0, runs=16).forecast(snap, 100.0, model, random.Random(42)) == first
    assert fc.forecast(snap, 100.0, model, random.Random(43)) != first
    # deeper in the queue, later and wider
    p50s = [first[f"p{i}"].p50 for i in range(6)]
    assert p50s == sorted(p50s) and p50s[0] < p50s[-1]
    assert all(first[w].p10 <= first[w].p50 <= first[w].p90 for w in first)


def test_back_off_to_coarser_groups() -> None:
    """Fewer than ``min_samples`` of the same queue and shape: the queue's samples count; once
    the shape has enough, its own."""
    model = DurationModel(min_samples=3)
    big = wl("big", "q", gpus=8)
    for i in range(5):
        model.observe(wl(f"s{i}", "q", gpus=1), 10.0)
    model.observe(wl("b0", "q", gpus=8), 1000.0)
    model.observe(wl("b1", "q", gpus=8), 1000.0)
    d = model.present()
    draws = [d.total(big, 0.0, u / 20) for u in range(20)]
    assert 10.0 in draws and 1000.0 in draws        # the queue's 7 samples, shapes mixed
    model.observe(wl("b2", "q", gpus=8), 1000.0)
    d = model.present()
    assert {d.total(big, 0.0, u / 20) for u in range(20)} == {1000.0}
    # another queue with no history of its own: all finished workloads
    other = model.present().total(wl("o", "r", gpus=8), 0.0, 0.0)
    assert other == 10.0


def test_remaining_time_conditional_on_elapsed() -> None:
    model = DurationModel(min_samples=3)
    for i in range(1, 11):
        model.observe(wl(f"f{i}", "q"), 10.0 * i)          # 10, 20, ..., 100
    d = model.present()
    w = wl("x", "q")
    draws = [d.total(w, 55.0, (u + 0.5) / 50) for u in range(50)]
    assert min(draws) == 60.0 and max(draws) == 100.0     # only those that outlast 55 s
    assert [d.total(w, 55.0, (u + 0.5) / 5) for u in range(5)] == [60.0, 70.0, 80.0, 90.0, 100.0]
    assert [d.total(w, 0.0, (u + 0.5) / 10) for u in range(10)] == [10.0 * i for i in range(1, 11)]
    # past every sample: a Pareto tail from what it has done, of the samples' own tail index
    alpha = tail_index([10.0 * i for i in range(1, 11)])
    assert 3 < alpha < 5
    tail = [d.total(w, 500.0, u / 10) for u in range(10)]
    assert all(t >= 500.0 for t in tail) and tail == sorted(tail)
    assert tail[5] == pytest.approx(500.0 * 2 ** (1 / alpha))


def test_unfinished_work_corrects_the_short_bias() -> None:
    """Ten finished at 10 s while ten others have run 500 s and go on: the finished alone say
    every run takes 10 s; counting the unfinished (Kaplan-Meier), half of the runs take longer
    than 500 s."""
    model = DurationModel(min_samples=3)
    for i in range(10):
        model.observe(wl(f"f{i}", "q"), 10.0)
    w = wl("x", "q")
    assert model.present().total(w, 0.0, 0.9) == 10.0
    d = model.present([(wl(f"r{i}", "q"), 500.0) for i in range(10)])
    assert d.total(w, 0.0, 0.4) == 10.0 and d.total(w, 0.0, 0.6) > 500.0
    # past 500 the tail: S = 0.5 x (500 / x) ** alpha, alpha 5 (the finished ones do not spread)
    assert d.total(w, 0.0, 0.75) == pytest.approx(500.0 * 2 ** (1 / 5))


def test_declared_durations_scaled_by_observed_ratios() -> None:
    model = DurationModel(min_samples=3)
    w = wl("x", "q", expected_duration_s=100.0)
    assert model.present().total(w, 0.0, 0.3) == 100.0         # no ratios yet: as declared
    assert model.present().total(w, 40.0, 0.3) == 100.0
    for i in range(4):                                         # they run half what they declare
        model.observe(wl(f"f{i}", "q", expected_duration_s=200.0), 100.0)
    assert model.present().total(w, 0.0, 0.3) == 50.0
    # overran its declared duration past every ratio seen: the ratios' tail, from what it has done
    late = [model.present().total(wl("y", "q", expected_duration_s=10.0), 20.0, u / 4) for u in range(4)]
    assert late[0] == 20.0 and late == sorted(late) and late[-1] > 20.0
    # overran with no ratios at all: as one that declared nothing
    plain = DurationModel(min_samples=3)
    for i in range(4):
        plain.observe(wl(f"g{i}", "q"), 100.0)
    assert plain.present().total(wl("y", "q", expected_duration_s=10.0), 20.0, 0.0) == 100.0


def test_prior_before_anything_finished() -> None:
    d = DurationModel(prior_s=600.0).present()
    w = wl("x", "q")
    assert d.total(w, 0.0, 0.5) == pytest.approx(600.0)
    assert d.total(w, 0.0, 0.1) < 600.0 < d.total(w, 0.0, 0.9)


def test_arrivals_bootstrap_the_recent_past() -> None:
    arr = ArrivalModel(window=50, blocks=5)
    for i in range(100):
        arr.observe(wl(f"a{i}", "q", submit_s=float(i), priority=i % 3))
    got = list(arr.stream(100.0, random.Random(1), "t/"))
    assert got and all(100.0 <= w.submit_s <= 150.0 + 1e-9 for w in got)
    assert [w.submit_s for w in got] == sorted(w.submit_s for w in got)
    assert len({w.id for w in got}) == len(got) and all(w.id.startswith("t/") for w in got)
    assert all(w.duration_s == 0.0 for w in got)
    assert 40 <= len(got) <= 60                           # the window's rate, about one a second
    assert list(ArrivalModel().stream(5.0, random.Random(1), "t/")) == []


def test_arrivals_ahead_make_a_forecast_later() -> None:
    """Queue r is below its guarantee, q above: work arriving in r goes first when a node frees."""
    c = cluster({"q": {"guaranteed": {"gpu": 0}}, "r": {"guaranteed": {"gpu": 8}}}, ("h", "H100", 8, 2))
    busy = run(wl("busy", "q", expected_duration_s=10.0), "H100", ("h-0", 8), start_s=0.0)
    long = run(wl("long", "q", expected_duration_s=1000.0), "H100", ("h-1", 8), start_s=0.0)
    target = wl("t", "q", submit_s=1.0, expected_duration_s=10.0)
    snap = snapshot(c, [busy, long], [target], Settings(preemption=False))
    arr = ArrivalModel(window=20, blocks=2)
    for i in range(20):
        arr.observe(wl(f"r{i}", "r", submit_s=-20.0 + i, expected_duration_s=5.0))
    fc = Forecaster(c, 1.0, runs=8)
    alone = fc.forecast(snap, 2.0, DurationModel(), random.Random(0))["t"]
    crowded = fc.forecast(snap, 2.0, DurationModel(), random.Random(0), arrivals=arr)["t"]
    assert alone.p50 == 10.0 and crowded.p50 > 10.0


def test_preemption_in_forward_runs() -> None:
    """q is below its guarantee and may preempt r's borrowed GPUs after the delay (30 s from its
    submit at 0): the forecast says 30, not when r's work ends (1000)."""
    c = cluster({"q": {"guaranteed": {"gpu": 8}}, "r": {"guaranteed": {"gpu": 0}}}, ("h", "H100", 8, 1))
    borrower = run(wl("borrow", "r", expected_duration_s=1000.0), "H100", ("h-0", 8), start_s=0.0)
    w = wl("w", "q", submit_s=0.0, expected_duration_s=10.0)
    got = Forecaster(c, 1.0, runs=2).forecast(snapshot(c, [borrower], [w], Settings(True, 30.0)), 1.0,
                                              DurationModel(), random.Random(0))
    assert got["w"] == Eta(30.0, 30.0, 30.0)


def test_checkpointed_work_done_counts() -> None:
    c = one_node()
    ck = wl("ck", "q", checkpoint=True, expected_duration_s=100.0)
    busy = run(ck, "H100", ("h-0", 8), start_s=50.0)
    nxt = wl("n", "q", submit_s=0.0)
    snap = snapshot(c, [busy], [nxt], Settings(preemption=False))
    # it ran 70 s before a preemption and 10 s since (started again at 50, now 60): 20 s left
    got = Forecaster(c, 1.0, runs=2).forecast(snap, 60.0, DurationModel(), random.Random(0), done_s={"ck": 80.0})
    assert got["n"].p50 == 80.0


def test_tail_index() -> None:
    rng = random.Random(3)
    heavy = sorted(1.0 / (1.0 - rng.random()) for _ in range(2000))     # Pareto, index 1
    assert 0.7 < tail_index(heavy) < 1.4
    assert tail_index([5.0, 6.0]) == 1.0                   # too few to tell
    assert tail_index([7.0] * 30) == 5.0                   # all alike: the tail ends soon


def test_quantile_and_validation() -> None:
    assert quantile([1.0, 2.0, 3.0, 4.0, 5.0], 0.5) == 3.0
    assert quantile([0.0, 10.0], 0.1) == pytest.approx(1.0)
    assert quantile([1.0, float("inf")], 0.9) == float("inf")
    with pytest.raises(ValueError):
        DurationModel(min_samples=0)
    with pytest.raises(ValueError):
        Forecaster(one_node(), 0.0)
    with pytest.raises(ValueError):
        DurationModel().observe(wl("x", "q"), float("nan"))
    assert replace(Eta(1.0, 2.0, 3.0)).as_dict() == {"p10": 1.0, "p50": 2.0, "p90": 3.0}


def test_workload_declared_duration_default() -> None:
    assert Workload("x", "q").expected_duration_s is None


def _pooled_model() -> DurationModel:
    """Twenty finished 1-GPU runs in q, 10 s to about 10,000 s (log-uniform), of two kinds."""
    model = DurationModel(min_samples=5)
    for i in range(20):
        model.observe(wl(f"f{i}", "q", gpus=1 if i % 2 else 2), 10.0 * 1.44 ** i)
    return model


def test_a_kind_with_few_finished_is_drawn_as_a_whole() -> None:
    """An unseen kind (8-GPU) draws from the queue's runs, but alike within a run: its kind's
    uniform moves every one of them the same way."""
    d = _pooled_model().present()
    a, b = wl("a", "q", gpus=8), wl("b", "q", gpus=8)
    assert d.shared(a) and not d.shared(wl("c", "q", gpus=1))
    median = d.total(a, 0.0, 0.5)                  # no kind: the queue's median
    long_run = [d.total(x, 0.0, 0.5, 0.95) for x in (a, b)]
    short_run = [d.total(x, 0.0, 0.5, 0.05) for x in (a, b)]
    assert all(x > median for x in long_run) and all(x < median for x in short_run)


def test_what_is_known_of_a_kind_moves_its_draws() -> None:
    model = _pooled_model()
    w = wl("x", "q", gpus=8)
    prior = model.present().total(w, 0.0, 0.5, 0.5)
    for i in range(3):                               # three of its kind finished, all long
        model.observe(wl(f"k{i}", "q", gpus=8), 5000.0)
    after = model.present().total(w, 0.0, 0.5, 0.5)
    assert after > 2 * prior
    # unfinished ones of the kind that have run long say as much
    running = model.present([(wl(f"r{i}", "q", gpus=4), 6000.0) for i in range(3)])
    assert running.total(wl("y", "q", gpus=4), 0.0, 0.5, 0.5) > 2 * prior
    assert running.total(wl("y", "q", gpus=4), 6000.0, 0.5, 0.5) > 6000.0    # one of them: longer still


def test_likeness_from_history() -> None:
    model = DurationModel()
    assert model.likeness() == 0.5                   # nothing to tell from yet
    for i in range(10):                              # two kinds, far apart, each tight
        model.observe(wl(f"s{i}", "q", gpus=1), 10.0 + i % 2)
        model.observe(wl(f"l{i}", "q", gpus=8), 1000.0 + i % 2)
    assert model.likeness() > 0.9
    alike = DurationModel()
    for i in range(10):                              # two kinds, the same spread
        alike.observe(wl(f"s{i}", "q", gpus=1), 10.0 * 2 ** (i % 5))
        alike.observe(wl(f"l{i}", "q", gpus=8), 10.0 * 2 ** (i % 5))
    assert alike.likeness() < 0.05
