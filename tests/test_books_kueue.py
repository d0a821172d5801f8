"""Books that balance under Kueue (``queues_from: kueue``): a Workload's reservation (the ledger's
``kueue`` row, no node) and its pods, seen on several nodes one after another, are billed the
reservation from Kueue's admit on, never less (a gang on two nodes billed for one) and never
twice (the pods beside the whole reservation). Random gangs across nodes, readmissions after an
eviction, placement groups beside the pods, pods of other workloads: the pure rule
(:func:`accounting.ledger.dedup`), the SQL rule (:data:`accounting.sql.LEDGER_KUEUE`, read back
through chDB) and an independent integral from the generated events agree."""
from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounting import sql as q
from accounting.intervals import clip
from accounting.ledger import combine, dedup, kueue_segments, reservation_of
from accounting.model import Allocation, Window
from accounting.store_adapter import _alloc, _allocation, _q, _window, ledger_sql, read_allocations, read_usage
from gpuq.store.schema import COLUMNS
from tests.accounting_helpers import T0, alloc

NODES = ("n1", "n2", "n3")
_clusters = itertools.count()


def led(pod: str, source: str, wid: str, node: str, gpus: float, start: float, end: float | None,
        cluster: str = "c", uid: str | None = None) -> Allocation:
    a = alloc(pod, "llm", gpus, start, end, node=node, uid=uid or f"{pod}/{node}/{start}", cluster=cluster)
    return dataclasses.replace(a, source=source, workload_id=wid)


def row(a: Allocation) -> tuple[Any, ...]:
    t = lambda s: dt.datetime.fromtimestamp(s, dt.UTC)   # noqa: E731
    return (a.cluster, a.namespace, a.pod, a.uid, a.queue, a.node, a.gpu_model, a.gpu_resource, a.gpus,
            a.priority, a.ray_cluster, t(a.start_s), None if a.end_s is None else t(a.end_s),
            round(a.start_s * 1000) * 10 + 1, a.source, a.workload_id, a.owner_kind, a.owner)


def billed_at(allocs: list[Allocation], wid: str, t: float) -> float:
    """GPUs the ledger bills ``wid`` at ``t`` (the rows it keeps, each over its own span)."""
    return sum(a.gpus for a in allocs if a.workload_id == wid and a.start_s <= t
               and (a.end_s is None or t < a.end_s))


# -- one case by hand -------------------------------------------------------------------------------
def test_a_gang_whose_pods_start_on_two_nodes_one_after_the_other_is_billed_its_reservation() -> None:
    """8 GPUs reserved at 0; 4 pods of 2 GPUs: two on n1 at 30 s, one on n2 at 50 s, one on n2 at
    90 s; all end at 200 s, the reservation too. Billed 8 GPUs from 0 to 200 s: 1,600 GPU-seconds,
    where cutting the reservation at the first pod billed 4 GPUs from 30 s to 50 s, 6 to 90 s."""
    w = "kueue/ml/gang"
    rows = [led("wl", "kueue", w, "", 8, 0, 200, uid="kueue/ml/gang@0"),
            led("p0", "pod", w, "n1", 2, 30, 200), led("p1", "pod", w, "n1", 2, 30, 200),
            led("p2", "pod", w, "n2", 2, 50, 200), led("p3", "pod", w, "n2", 2, 90, 200),
            led("pg", "placement_group", w, "n1", 4, 25, 200)]     # beside the pods on n1: not counted
    kept = dedup(rows)
    pieces = sorted((a.start_s - T0, a.end_s - T0, a.gpus, a.uid) for a in kept if a.source == "kueue")
    assert pieces == [(0, 30, 8, "kueue/ml/gang@0"), (30, 50, 4, "kueue/ml/gang@0#" + str(round((T0 + 30) * 1000))),
                      (50, 90, 2, "kueue/ml/gang@0#" + str(round((T0 + 50) * 1000)))]
    assert {reservation_of(a.uid) for a in kept if a.source == "kueue"} == {"kueue/ml/gang@0"}
    for t in range(0, 200, 5):
        assert billed_at(kept, w, T0 + t) == 8, t
    spans = clip(kept, Window(T0, T0 + 400), T0 + 400)
    assert sum(i.gpu_seconds for i in spans) == pytest.approx(1600)


def test_pods_that_end_early_do_not_hand_their_gpus_back_to_the_reservation() -> None:
    """The rest only shrinks: a pod that ran 10 s and failed, before the others started, leaves the
    reservation at 6 of 8 GPUs (its workload was seen holding 2), as an admission does not count
    again on a node where its workload was seen."""
    a = led("wl", "kueue", "kueue/ml/w", "", 8, 0, None)
    held = [(T0 + 10, T0 + 20, 2000), (T0 + 40, None, 4000)]
    got = [(p.start_s - T0, None if p.end_s is None else p.end_s - T0, p.milli_gpus) for p in kueue_segments(a, held)]
    assert got == [(0, 10, 8000), (10, 40, 6000), (40, None, 4000)]
    assert kueue_segments(a, [(T0 - 5, None, 8000)]) == []          # all of it running at the admit
    assert kueue_segments(a, [(T0 - 50, T0 - 5, 8000)]) == [a]      # an earlier run: not this reservation's


# -- random worlds ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gang:
    wid: str
    rows: tuple[Allocation, ...]
    reserved: float                                # GPUs of each reservation
    runs: tuple[tuple[float, float | None], ...]   # each reservation's (start, end), epoch seconds
    all_running: tuple[float, ...]                 # when each run's last pod started


@st.composite
def gangs(draw: st.DrawFn, i: int, cluster: str) -> Gang:
    wid = f"kueue/{cluster}/w{i}"                    # unique in the store: the examples share it
    pods, per = draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 4]))
    reserved = float(pods * per)
    rows: list[Allocation] = []
    runs, all_running = [], []
    t = float(draw(st.integers(0, 100)))
    for run in range(draw(st.integers(1, 2))):                      # a second run: readmitted after an eviction
        start = t
        starts = sorted(start + draw(st.integers(0, 120)) for _ in range(pods))
        evicted = run == 0 and draw(st.booleans())
        end: float | None = max(starts) + draw(st.integers(1, 200)) if evicted or draw(st.booleans()) else None
        rows.append(led(f"w{i}", "kueue", wid, "", reserved, start, end, cluster, uid=f"{wid}@{int(start * 1000)}"))
        for k, s in enumerate(starts):
            node = draw(st.sampled_from(NODES))
            rows.append(led(f"w{i}-r{run}-p{k}", "pod", wid, node, per, s, end, cluster))
            if draw(st.integers(0, 3)) == 0:                        # a placement group beside it (not counted)
                rows.append(led(f"w{i}-r{run}-pg{k}", "placement_group", wid, node, per, s, end, cluster,
                                uid=f"pg/{wid}/{run}/{k}"))
        runs.append((T0 + start, None if end is None else T0 + end))       # the rows' times: T0 + offset
        all_running.append(T0 + max(starts))
        if end is None:
            break
        t = end + draw(st.integers(1, 60))
    return Gang(wid, tuple(rows), reserved, tuple(runs), tuple(all_running))


@st.composite
def worlds(draw: st.DrawFn) -> tuple[list[Gang], list[Allocation]]:
    cluster = f"k{next(_clusters)}"
    gs = [draw(gangs(i, cluster)) for i in range(draw(st.integers(1, 3)))]
    foreign = [led(f"f{i}", "pod", "", draw(st.sampled_from(NODES)), 1, draw(st.integers(0, 300)), None, cluster)
               for i in range(draw(st.integers(0, 2)))]
    return gs, foreign


def check_pure(gs: list[Gang], kept: list[Allocation]) -> None:
    """While a reservation holds, its workload is billed exactly the reservation (its pods never
    hold more; pods of the same gang, on however many nodes, are one workload); once all its pods
    run, the pods alone."""
    for g in gs:
        for (s, e), full in zip(g.runs, g.all_running, strict=True):
            for t in sorted({s, full, *(a.start_s for a in g.rows), s + 0.5, full + 0.5}):
                if t < s or (e is not None and t >= e):
                    continue
                assert billed_at(kept, g.wid, t) == pytest.approx(g.reserved), (g.wid, t - T0)
            assert not [a for a in kept if a.workload_id == g.wid and a.source == "kueue" and s <= a.start_s
                        and (e is None or a.start_s < e) and (a.end_s is None or a.end_s > full)], (g.wid, "after all pods ran")


@given(case=worlds())
@settings(max_examples=60, deadline=None)
def test_random_gangs_are_billed_their_reservation_in_python(case: tuple[list[Gang], list[Allocation]]) -> None:
    gs, foreign = case
    rows = [*foreign, *(a for g in gs for a in g.rows)]
    kept = dedup(rows)
    check_pure(gs, kept)
    assert [a for a in kept if not a.workload_id] == foreign                 # foreign rows as they are
    now = T0 + 2000
    for since in (T0 + 40, T0 + 150):                                       # a window's start cuts nothing it counts
        late = dedup(rows, since)
        assert {(a.uid, a.end_s) for a in late} == {(a.uid, a.end_s) for a in kept
                                                    if a.end_s is None or a.end_s > since}
    assert now > max(a.start_s for a in rows)


@given(case=worlds())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_random_gangs_in_sql_agree_with_python_and_the_integral(case: tuple[list[Gang], list[Allocation]],
                                                               store: Any) -> None:
    gs, foreign = case
    rows = [*foreign, *(a for g in gs for a in g.rows)]
    cluster = rows[0].cluster
    store.insert("gpu_allocations", [row(a) for a in rows], COLUMNS["gpu_allocations"])
    assert ledger_sql(store) == q.LEDGER_KUEUE
    now = T0 + 2000
    for window in (Window(T0, now), Window(T0 + 70, T0 + 260)):
        got = [a for a in (_allocation(r) for r in _q(store, _alloc(store, q.ALLOCATIONS, window),
                                                      {**_window(window, now), "sources": ""}))
               if a.cluster == cluster]
        # the pure rule on the rows the Python path reads (those starting before the window's end)
        key = lambda a: (a.uid, a.source, a.node, a.workload_id, a.milli_gpus, a.start_s, a.end_s)   # noqa: E731
        want = [a for a in read_allocations(store, window, now) if a.cluster == cluster]
        assert sorted(map(key, want)) == sorted(map(key, (
            a for a in dedup([a for a in rows if a.start_s < window.end_s], window.start_s)
            if a.start_s < window.end_s and (a.workload_id or a.end_s is None or a.end_s > window.start_s))))
        assert sorted(map(key, got)) == sorted(map(key, want)), window
        # usage in SQL = the integral of what each gang was billed, from the generated events
        usage: dict[str, float] = {}
        for u in read_usage(store, window, now):
            if u.cluster == cluster:
                usage[u.workload] = usage.get(u.workload, 0.0) + u.gpu_seconds
        for g in gs:
            assert usage.get(g.wid, 0.0) == pytest.approx(integral(g, window, now), abs=1e-3), (g.wid, window)


def integral(g: Gang, window: Window, now: float) -> float:
    """GPU-seconds of one gang in the window from its events alone: the reservation from each
    admit until its last pod starts, then its pods from there (no placement group, no ledger)."""
    total = 0.0
    for (s, e), full in zip(g.runs, g.all_running, strict=True):
        end = now if e is None else e
        total += g.reserved * overlap(s, min(full, end), window)
        for a in g.rows:                      # then this run's pods (never more than it reserved)
            if a.source == "pod" and s <= a.start_s < end:
                total += a.gpus * overlap(full, min(end, now if a.end_s is None else a.end_s), window)
    return total


def overlap(s: float, e: float, window: Window) -> float:
    return max(0.0, min(e, window.end_s) - max(s, window.start_s))


def test_the_same_workload_id_in_two_clusters_is_two_reservations(store: Any) -> None:
    """Kueue's ids (kueue/<ns>/<name>) repeat across clusters: cluster b's pods do not shrink
    cluster a's reservation, in Python and in SQL."""
    w = "kueue/ml/same-name"
    rows = [led("wl", "kueue", w, "", 4, 0, None, cluster="a", uid=f"{w}@0"),
            led("wl", "kueue", w, "", 4, 0, None, cluster="b", uid=f"{w}@0"),
            led("p0", "pod", w, "n1", 4, 10, None, cluster="b")]
    kept = sorted((a.cluster, a.source, a.start_s - T0, a.end_s and a.end_s - T0, a.gpus) for a in dedup(rows))
    assert kept == [("a", "kueue", 0, None, 4), ("b", "kueue", 0, 10, 4), ("b", "pod", 10, None, 4)]
    store.insert("gpu_allocations", [row(a) for a in rows], COLUMNS["gpu_allocations"])
    now = T0 + 100
    usage = {(u.cluster, u.workload): u.gpu_seconds for u in read_usage(store, Window(T0, now), now)}
    assert usage == {("a", w): pytest.approx(400), ("b", w): pytest.approx(400)}


def test_the_ledger_now_takes_the_pieces_as_they_are() -> None:
    """``combine`` (serve's view and audit) gets the ledger's output, pieces included: the rule is
    not applied to them again (that would take the running pods off the rest a second time). At
    60 s, with 4 of the gang's 8 GPUs running, the workload is billed 8: 4 by its pods, 4 by the
    reservation's piece."""
    w = "kueue/ml/gang"
    rows = [led("wl", "kueue", w, "", 8, 0, None, uid=f"{w}@0"),
            led("p0", "pod", w, "n1", 2, 30, None), led("p1", "pod", w, "n2", 2, 50, None)]
    ledger = dedup(rows)
    assert billed_at(ledger, w, T0 + 60) == 8
    live = combine(ledger, [], T0 + 60)
    assert billed_at(live, w, T0 + 60) == 8
    assert sorted((a.uid, a.milli_gpus) for a in live) == sorted((a.uid, a.milli_gpus) for a in ledger)


def test_serves_view_bills_the_queue_the_whole_reservation_while_pods_start(store: Any) -> None:
    """Through the store and serve's own accounting (``LiveAccounting``: the ledger read, then
    ``combine``): while the gang's pods start on two nodes one by one, its queue's allocation is
    the 8 GPUs Kueue reserved, at every step."""
    from accounting.queues import parse_queue_config
    from scheduler.service.accounting import LiveAccounting

    w = "kueue/ml/gang"
    config = parse_queue_config({"gpu_types": {"H100": {"price_per_hour": 1.0}},
                                 "queues": {"llm": {"guaranteed": {"gpu": 8}}}})
    pods = [(30, "n1"), (50, "n1"), (70, "n2"), (90, "n2")]            # seconds after the reservation
    store.insert("gpu_allocations", [row(led("wl", "kueue", w, "", 8, 900, None, uid=f"{w}@900000"))],
                 COLUMNS["gpu_allocations"])
    acc = LiveAccounting(store, config=config)
    for i, (at, node) in enumerate([(0, ""), *pods]):
        if node:
            store.insert("gpu_allocations", [row(led(f"p{i}", "pod", w, node, 2, 900 + at, None))],
                         COLUMNS["gpu_allocations"])
        view = acc.refresh(T0 + 900 + at + 5).view
        (llm,) = [r for r in view.rows if r.queue == "llm" and r.gpu_type == "*"]
        assert llm.allocated == pytest.approx(8), (at, llm.allocated)


def test_history_joins_the_pieces_into_the_reservation_from_its_own_start() -> None:
    """``gpuq simulate --from-store`` and whatif read the ledger: a reservation's pieces are one
    reservation again, from its start (in the collector's uid, ``<id>@<ms>``) even when the window
    left its first piece out, to its last piece's end, at its whole GPUs."""
    from scheduler.history import _reservations

    w = "kueue/ml/gang"
    rows = [led("wl", "kueue", w, "", 8, 0, None, uid=f"{w}@{round(T0 * 1000)}"),
            led("p0", "pod", w, "n1", 2, 30, None), led("p1", "pod", w, "n2", 2, 50, 400)]
    pieces = [a for a in dedup(rows) if a.source == "kueue"]
    assert len(pieces) == 3
    (whole,) = _reservations(pieces)
    assert (whole.uid, whole.start_s, whole.end_s, whole.milli_gpus) == (f"{w}@{round(T0 * 1000)}", T0, None, 8000)
    (late,) = _reservations([a for a in dedup(rows, T0 + 40) if a.source == "kueue"])     # the window from 40 s
    assert (late.start_s, late.end_s) == (T0, None)
