"""The one ledger of allocations (accounting.ledger, accounting.sql.LEDGER): each workload counted
once from its best source, in Python and in SQL alike; admissions written by the scheduler and
read back by the accounting."""
from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

import pytest

from accounting.ledger import combine, dedup
from accounting.model import Allocation, Window
from accounting.store_adapter import read_allocations, read_usage
from gpuq.store.schema import COLUMNS
from scheduler.service.ledger import admission_store_row
from tests.accounting_helpers import T0, alloc


def led(pod: str, source: str, wid: str = "", queue: str = "research.vision", node: str = "n1",
        gpus: float = 4, start: float = 0.0, end: float | None = None, **kw: Any) -> Allocation:
    a = alloc(pod, queue, gpus, start, end, node=node, uid=f"{pod}/{node}", **kw)
    return dataclasses.replace(a, source=source, workload_id=wid)


@pytest.mark.parametrize("rows, kept", [
    pytest.param([led("p", "pod", "w"), led("pg", "placement_group", "w"), led("a", "admission", "w")],
                 ["p"], id="pod-wins"),
    pytest.param([led("a", "admission", "w"), led("pg", "placement_group", "w", queue="")],
                 ["pg"], id="placement-group-over-admission"),
    pytest.param([led("j", "ray_job", "w"), led("a", "admission", "w")], ["j"], id="ray-job-over-admission"),
    pytest.param([led("a", "admission", "w")], ["a"], id="admission-alone-is-reserved"),
    pytest.param([led("f1", "pod"), led("f2", "pod"), led("a", "admission", "w")],
                 ["f1", "f2", "a"], id="foreign-always-counts"),
    pytest.param([led("p1", "pod", "w", node="n1"), led("p2", "pod", "w", node="n2"),
                  led("pg", "placement_group", "w")], ["p1", "p2"], id="every-pod-of-the-workload"),
])
def test_dedup_keeps_the_best_source(rows: list[Allocation], kept: list[str]) -> None:
    assert [a.pod for a in dedup(rows)] == kept


def test_placement_group_takes_its_workloads_queue() -> None:
    (pg,) = dedup([led("pg", "placement_group", "w", queue=""), led("a", "admission", "w", queue="prod")])
    assert (pg.source, pg.queue) == ("placement_group", "prod")


def test_combine_replaces_stored_admissions_with_live_ones() -> None:
    stored = [led("old", "admission", "gone"), led("f", "pod")]
    live = [led("a", "admission", "w")]
    assert [a.pod for a in combine(stored, live)] == ["f", "a"]


def _row(a: Allocation) -> tuple[Any, ...]:
    if a.source == "admission":
        return admission_store_row(a)
    ts = lambda t: dt.datetime.fromtimestamp(t, dt.UTC)   # noqa: E731
    return (a.cluster, a.namespace, a.pod, a.uid, a.queue, a.node, a.gpu_model, a.gpu_resource, a.gpus,
            a.priority, a.ray_cluster, ts(a.start_s), None if a.end_s is None else ts(a.end_s),
            round(a.start_s * 1000) * 10 + 1, a.source, a.workload_id, a.owner_kind, a.owner)


def test_sql_ledger_agrees_with_the_pure_one(store: Any) -> None:
    rows = [led("p", "pod", "w1", start=0), led("pg1", "placement_group", "w1", start=5),
            led("pg2", "placement_group", "w2", queue="", start=10), led("a2", "admission", "w2", queue="prod"),
            led("a3", "admission", "w3", queue="research.nlp", node="n2"),
            led("f", "pod", queue="", start=20, gpus=2), led("done", "pod", end=50.0)]
    store.insert("gpu_allocations", [_row(a) for a in rows], COLUMNS["gpu_allocations"])
    now = T0 + 3600
    got = read_allocations(store, Window(now, now + 1e-3), now)
    want = [a for a in dedup(rows) if a.end_s is None]
    key = lambda a: (a.pod, a.source, a.queue, a.gpus, a.workload_id)   # noqa: E731
    assert sorted(map(key, got)) == sorted(map(key, want))
    assert {a.pod for a in got} == {"p", "pg2", "a3", "f"}
    # usage over the hour bills each workload once, named by its gpuq id: w2's admission until its
    # placement group appears at 10 s, then the group under the admission's queue (never both at
    # once), w1's pod (not also its placement group)
    usage = {(u.queue, u.workload): u.gpu_seconds for u in read_usage(store, Window(T0, now), now)}
    assert usage[("prod", "w2")] == pytest.approx(4 * 3600)
    assert usage[("research.vision", "w1")] == pytest.approx(4 * 3600)
    assert usage[("", "f")] == pytest.approx(2 * 3580)                         # foreign: by its pod


def test_only_sources_filter(store: Any) -> None:
    store.insert("gpu_allocations", [_row(led("a", "admission", "w")), _row(led("f", "pod"))],
                 COLUMNS["gpu_allocations"])
    now = T0 + 60
    got = read_allocations(store, Window(now, now + 1e-3), now, sources=("pod",))
    assert [a.pod for a in got] == ["f"]


# -- per (workload, node): a gang on two nodes is counted on both (issue 16) ------------------------

def _gang(source: str, wid: str = "g", gpus: float = 4, start: float = 0.0, end: float | None = None,
          nodes: tuple[str, ...] = ("n1", "n2"), pod: str = "gpuq-g") -> list[Allocation]:
    """One multi-node allocation as the placement-group and admission sources write it: the same
    pod name (the group's, the workload's) on every node."""
    return [led(pod, source, wid, node=n, gpus=gpus, start=start, end=end) for n in nodes]


@pytest.mark.parametrize("rows, want", [
    pytest.param(_gang("placement_group"), {"n1": 4, "n2": 4}, id="placement-group-on-two-nodes"),
    pytest.param(_gang("admission"), {"n1": 4, "n2": 4}, id="admission-on-two-nodes"),
    pytest.param([*_gang("admission"), led("p1", "pod", "g", node="n1")], {"n1": 4, "n2": 4},
                 id="pod-seen-on-one-node-admission-on-the-other"),
    pytest.param([*_gang("admission"), *_gang("placement_group", pod="pg")], {"n1": 4, "n2": 4},
                 id="placement-group-over-admission-per-node"),
])
def test_a_gang_is_counted_on_every_node(rows: list[Allocation], want: dict[str, float]) -> None:
    from accounting.intervals import running
    live = running(dedup(rows), T0 + 10)
    got: dict[str, float] = {}
    for a in live:
        got[a.node] = got.get(a.node, 0.0) + a.gpus
    assert got == want


def test_a_gang_is_billed_for_every_node_in_sql_and_python(store: Any) -> None:
    from accounting.intervals import clip, to_aggs
    rows = [*_gang("placement_group", "g1", start=0, end=100.0, pod="gpuq-g1"),
            *_gang("admission", "g1", start=0, end=100.0, pod="g1"),
            *_gang("admission", "g2", gpus=2, start=50, end=None, pod="g2")]
    store.insert("gpu_allocations", [_row(a) for a in rows], COLUMNS["gpu_allocations"])
    now = T0 + 200
    window = Window(T0, now)
    sql = {u.workload: u.gpu_seconds for u in read_usage(store, window, now)}
    py = {u.workload: u.gpu_seconds for u in to_aggs(clip(dedup(rows), window, now))}
    # g1: 2 nodes x 4 GPUs x 100 s, billed from its placement group; g2: 2 x 2 x 150 s, still open
    assert sql == pytest.approx({"g1": 800.0, "g2": 600.0})
    assert py == pytest.approx(sql)


def test_admitted_again_on_the_same_node_bills_both_runs(store: Any) -> None:
    from accounting.ledger import admission_rows
    first = admission_rows("w", "prod", cluster="c", namespace="ns", gpu_type="H100", placement={"n1": 8},
                           start_s=T0, end_s=T0 + 100)
    again = admission_rows("w", "prod", cluster="c", namespace="ns", gpu_type="H100", placement={"n1": 8},
                           start_s=T0 + 300, end_s=T0 + 400)
    assert first[0].uid != again[0].uid
    store.insert("gpu_allocations", [admission_store_row(a) for a in (*first, *again)], COLUMNS["gpu_allocations"])
    now = T0 + 1000
    (u,) = read_usage(store, Window(T0, now), now)
    assert u.gpu_seconds == pytest.approx(8 * 200)


def test_idle_runs_count_on_their_own_node_only() -> None:
    from accounting.idle import attribute_idle
    from accounting.model import IdleRun
    rows = _gang("placement_group", start=0, end=100.0)
    run = IdleRun("c", "n2", "GPU-1", "ns", "gpuq-g", T0 + 10, T0 + 40)
    (agg,) = attribute_idle([run], dedup(rows), Window(T0, T0 + 100), T0 + 100)
    assert agg.idle_gpu_seconds == pytest.approx(30)
    # a pod's run counts whatever node DCGM names (its Hostname may be the exporter's pod name)
    pod = [led("p", "pod", "", node="n1", start=0, end=100.0)]
    elsewhere = IdleRun("c", "dcgm-exporter-x7k2", "GPU-2", "ns", "p", T0 + 10, T0 + 50)
    (agg,) = attribute_idle([elsewhere], pod, Window(T0, T0 + 100), T0 + 100)
    assert agg.idle_gpu_seconds == pytest.approx(40)


def test_migration_0008_forgets_hours_billed_for_one_node_of_a_gang(store_dsn: str) -> None:
    """A store whose materialised hours billed a 2-node placement group for one node (the rule
    before 0008): the migration removes those hours (and only those), and the usage then reads
    both nodes from the ledger."""
    from accounting.idle import IdleParams
    from accounting.rollup import materialize_hours
    from accounting.service import usage_report
    from gpuq.store import migrate
    from tests.accounting_helpers import config
    from tests.conftest import store_before
    with store_before(store_dsn, 8) as s:
        gang = _gang("placement_group", "g", start=0, end=3600.0, pod="gpuq-g")
        lone = [led("solo", "pod", "", node="n3", start=7200, end=10800.0, queue="prod")]
        s.insert("gpu_allocations", [_row(a) for a in (*gang, *lone)], COLUMNS["gpu_allocations"])
        now = T0 + 86400
        stale = materialize_hours(s, now, IdleParams(), since_s=T0, max_hours=4)      # hours T0 .. T0 + 3 h
        assert stale == [T0, T0 + 3600, T0 + 7200, T0 + 10800]
        # as the old rule billed them: the gang's first hour for one node (4 GPUs, not 8)
        s.command(f"ALTER TABLE {s.database}.accounting_usage_1h UPDATE gpu_seconds = gpu_seconds / 2 "
                  f"WHERE hour = toDateTime({int(T0)}, 'UTC') SETTINGS mutations_sync = 2")
        window = Window(T0, T0 + 4 * 3600)
        before = {dict(r.keys)["queue"]: r.gpu_seconds for r in usage_report(s, config(), window, now, ["queue"])}
        assert before["research.vision"] == pytest.approx(4 * 3600)
        assert migrate(s)[:1] == [8]
        hours = [float(r[0]) for r in s.query(f"SELECT toUnixTimestamp(hour) FROM {s.database}.accounting_hours "
                                              "FINAL ORDER BY 1").rows]
        assert hours == [T0 + 7200, T0 + 10800]                  # the pod's hours stay materialised
        after = {dict(r.keys)["queue"]: r.gpu_seconds for r in usage_report(s, config(), window, now, ["queue"])}
        assert after == pytest.approx({"research.vision": 8 * 3600, "prod": 4 * 3600})




# -- an admission counts until the workload is seen on its node (issue 16) ----------------------------

@pytest.mark.parametrize("adm, seen, kept", [
    pytest.param((0, 10), [], (0, 10), id="never-seen"),
    pytest.param((0, 10), [(2, 8)], (0, 2), id="seen-after-2"),
    pytest.param((0, None), [(3, None)], (0, 3), id="open-until-the-group-appears"),
    pytest.param((0, 10), [(-5, None)], None, id="seen-before-the-admit-clocks-apart"),
    pytest.param((0, 10), [(-5, 0)], (0, 10), id="an-earlier-run-that-ended-at-the-admit"),
    pytest.param((0, 10), [(-5, 1), (4, 6)], None, id="the-earliest-of-those-ending-after-the-admit"),
    pytest.param((20, 30), [(2, 8)], (20, 30), id="admitted-again-after-the-first-run-was-seen"),
])
def test_an_admission_counts_until_the_workload_is_seen(adm: tuple[float, float | None],
                                                        seen: list[tuple[float, float | None]],
                                                        kept: tuple[float, float | None] | None) -> None:
    rows = [led("w", "admission", "w", start=adm[0], end=adm[1]),
            *(led(f"p{i}", "pod", "w", start=s, end=e) for i, (s, e) in enumerate(seen))]
    got = [(a.start_s - T0, None if a.end_s is None else a.end_s - T0) for a in dedup(rows) if a.source == "admission"]
    assert got == ([] if kept is None else [kept])


def test_a_gang_is_billed_from_admission_in_sql_and_python(store: Any) -> None:
    """As in the demo on Ray: the gang's job starts its placement group 2.4 s after the admission
    and removes it 0.6 s before the scheduler sees the job end. Billed from the admit to the
    group's end on both nodes, in SQL and in Python, whatever the window (the cut is taken from
    rows before the window too)."""
    from accounting.intervals import clip, to_aggs
    from accounting.store_adapter import read_ledger
    rows = [*_gang("admission", "g", start=0, end=14.0, pod="g"),
            *_gang("placement_group", "g", start=2.4, end=13.4, pod="gpuq-g"),
            *_gang("admission", "h", gpus=2, start=20, end=None, pod="h", nodes=("n3",)),
            *_gang("placement_group", "h", gpus=2, start=23, end=None, pod="gpuq-h", nodes=("n3",))]
    store.insert("gpu_allocations", [_row(a) for a in rows], COLUMNS["gpu_allocations"])
    now = T0 + 50
    for window, want in ((Window(T0, now), {"g": 8 * 13.4, "h": 2 * 30.0}),
                         (Window(T0 + 5, T0 + 22), {"g": 8 * 8.4, "h": 2 * 2.0}),
                         (Window(T0 + 13.5, T0 + 22), {"h": 2 * 2.0})):
        sql = {u.workload: u.gpu_seconds for u in read_usage(store, window, now)}
        py = {u.workload: u.gpu_seconds for u in to_aggs(clip(dedup(rows, window.start_s), window, now))}
        assert sql == pytest.approx(want) and py == pytest.approx(want), window
        # the now view's path (Python over the raw rows) and LEDGER's give the same rows
        got, _ = read_ledger(store, window, now)
        from accounting import sql as q
        from accounting.store_adapter import _allocation, _alloc, _q, _window
        ledger = [_allocation(r) for r in _q(store, _alloc(store, q.ALLOCATIONS, window),
                                             {**_window(window, now), "sources": ""})]
        key = lambda a: (a.uid, a.source, a.queue, a.node, a.milli_gpus, a.start_s, a.end_s)   # noqa: E731
        assert sorted(map(key, got)) == sorted(map(key, ledger)), window
    got = sorted((a.uid, a.source, a.start_s - T0, None if a.end_s is None else a.end_s - T0)
                 for a in read_allocations(store, Window(T0, now), now) if a.node == "n1")
    assert got == [("g/n1", "admission", 0.0, pytest.approx(2.4)), ("gpuq-g/n1", "placement_group",
                                                                      pytest.approx(2.4), pytest.approx(13.4))]
