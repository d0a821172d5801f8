"""End to end on chDB: rows in the public tables give the expected usage, idle and fragmentation
numbers through the CLI functions, and the SQL agrees with the pure engine on the same rows."""
from __future__ import annotations

import datetime as dt
import io
import itertools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest

from accounting import store_adapter as sa
from accounting.cli import queues_main, usage_main
from accounting.idle import GPU_UTIL, PROF_ACTIVE, IdleParams, activity_points, attribute_idle, idle_runs
from accounting.intervals import clip, to_aggs
from accounting.metrics import AccountingCollector
from accounting.model import Window
from accounting.service import load_config, now_view
from gpuq.settings import Settings
from gpuq.store import COLUMNS, open_store
from tests.accounting_helpers import BASE_QUEUES, T0

_ids = itertools.count()
NOW = T0 + 7200
P = IdleParams()


def ts(offset: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(T0 + offset, dt.UTC)


def alloc_row(pod: str, uid: str, queue: str, node: str, model: str, gpus: float, start: float,
              end: float | None, version: int) -> tuple[Any, ...]:
    return ("c", "ml", pod, uid, queue, node, model, "nvidia.com/gpu", gpus, 0, "", ts(start),
            None if end is None else ts(end), version, "pod", "", "", "")


def node_row(node: str, model: str, gpus: float, ready: int = 1, cordoned: int = 0, event: str = "SYNC") -> tuple:
    return (ts(0), "c", node, f"uid-{node}", event, ready, cordoned, model, gpus, gpus, {}, {}, "1")


def samples(node: str, gpu: str, pod: str, metric: str, value: float, start: float, end: float) -> list[tuple]:
    return [(ts(t), "c", node, gpu, 0, "H100", "", "", pod, "ml", "main", metric, value, "dcgm")
            for t in range(int(start), int(end), 15)]


@pytest.fixture
def filled(chdb_path: Path) -> Iterator[str]:
    """A small fleet two hours after T0; yields the DSN."""
    dsn = f"chdb://{chdb_path}?database=acc{next(_ids)}"
    store = open_store(dsn)                     # T0 is ten days ago: inside every default retention
    try:
        store.insert("node_events", [node_row("h0", "NVIDIA-H100-80GB-HBM3", 8), node_row("h1", "NVIDIA-H100-80GB-HBM3", 8),
                                     node_row("h2", "NVIDIA-H100-80GB-HBM3", 8), node_row("a0", "NVIDIA-A100-SXM4-80GB", 8),
                                     node_row("a1", "NVIDIA-A100-SXM4-80GB", 8, cordoned=1),
                                     node_row("gone", "NVIDIA-A100-SXM4-80GB", 8, event="DELETED")],
                     COLUMNS["node_events"])
        h100, a100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
        store.insert("gpu_allocations", [
            alloc_row("v1", "u1", "vision", "h0", h100, 8, 0, None, 1),
            alloc_row("v1", "u1", "vision", "h0", h100, 8, 0, 3600, 2),           # the end replaces the open row
            alloc_row("v1", "u2", "vision", "h0", h100, 8, 3600, None, 3),        # restarted: a new uid
            alloc_row("n1", "u3", "research.nlp", "a0", a100, 2, 1800, None, 1),
            alloc_row("p1", "u4", "prod", "h1", h100, 4, 0, None, 1),
            alloc_row("old", "u5", "prod", "h2", h100, 8, -7200, -3600, 2),      # before the window
        ], COLUMNS["gpu_allocations"])
        rows = samples("h0", "GPU-h0-0", "v1", GPU_UTIL, 0.0, 0, 7200)           # idle all along
        for i in range(1, 8):
            rows += samples("h0", f"GPU-h0-{i}", "v1", GPU_UTIL, 80.0, 0, 7200)
        for i in range(2):                                                        # 1 % busy: idle
            rows += samples("a0", f"GPU-a0-{i}", "n1", PROF_ACTIVE, 0.01, 1800, 7200)
            rows += samples("a0", f"GPU-a0-{i}", "n1", GPU_UTIL, 60.0, 1800, 7200)   # ignored: PROF wins
        store.insert("gpu_samples", rows, COLUMNS["gpu_samples"])                # p1: no DCGM data at all
        store.insert("pod_events", [
            (ts(1000), "c", "ml", "n2", "u9", "ADDED", "Pending", "", 4.0, "nvidia.com/gpu", "", "research.nlp",
             0, "", "", "7"),
            (ts(900), "c", "ml", "done", "u8", "ADDED", "Pending", "", 4.0, "nvidia.com/gpu", "", "prod", 0, "", "", "5"),
            (ts(950), "c", "ml", "done", "u8", "MODIFIED", "Running", "h1", 4.0, "nvidia.com/gpu", "", "prod", 0,
             "", "", "6"),
        ], COLUMNS["pod_events"])
        store.close()
        yield dsn
    finally:
        s = open_store(dsn)
        s.command(f"DROP DATABASE IF EXISTS {s.database}")
        s.close()


def settings_for(dsn: str, tmp_path: Path, queues: dict[str, Any] | None = None) -> Settings:
    qf = tmp_path / "queues.yaml"
    qf.write_text(yaml.safe_dump(BASE_QUEUES if queues is None else queues))
    return Settings(store={"dsn": dsn}, queues_file=str(qf))


def run_json(fn: Any, argv: list[str], settings: Settings) -> list[dict[str, Any]]:
    out, err = io.StringIO(), io.StringIO()
    assert fn(argv, settings, now_s=NOW, out=out, err=err) == 0, err.getvalue()
    return json.loads(out.getvalue())


FROM_TO = ["--from", dt.datetime.fromtimestamp(T0, dt.UTC).isoformat(), "--to", "now"]


@pytest.mark.parametrize("source", ["raw", "1m"])
def test_usage_cli_by_queue(filled: str, tmp_path: Path, source: str) -> None:
    rows = run_json(usage_main, [*FROM_TO, "--by", "queue", "--format", "json", "--idle-source", source],
                    settings_for(filled, tmp_path))
    got = {r["queue"]: (r["gpu_seconds"], r["idle_gpu_seconds"], r["cost"]) for r in rows}
    assert got == {
        "research.vision": (57600.0, 7200.0, 64.0),      # 8 H100 for 2 h across a restart; one GPU idle
        "research.nlp": (10800.0, 10800.0, 6.0),         # 2 A100 for 1.5 h, idle by the profiling metric
        "prod": (28800.0, 0.0, 32.0),                    # no DCGM data: unknown, not idle
    }


def test_usage_cli_by_type_rollup_and_hourly_lower_bound(filled: str, tmp_path: Path) -> None:
    s = settings_for(filled, tmp_path)
    rows = run_json(usage_main, [*FROM_TO, "--by", "queue,gpu_type", "--rollup", "--format", "json",
                                 "--idle-source", "1h"], s)
    got = {(r["queue"], r["gpu_type"]): (r["gpu_seconds"], r["idle_gpu_seconds"]) for r in rows}
    assert got[("research", "H100")] == (57600.0, 7200.0)
    assert got[("research", "A100")] == (10800.0, 7200.0)   # the half-covered first hour is unknown
    assert got[("prod", "H100")] == (28800.0, 0.0)


def test_sql_agrees_with_the_pure_engine(filled: str) -> None:
    store = open_store(filled)
    try:
        window = Window(T0 + 600, T0 + 6000)
        allocs = sa.read_allocations(store, window, NOW)
        pure = {(a.queue, a.workload): a.gpu_seconds for a in to_aggs(clip(allocs, window, NOW))}
        assert {(a.queue, a.workload): a.gpu_seconds for a in sa.read_usage(store, window, NOW)} == pure
        raw = store.query(f"SELECT cluster, node, gpu_uuid, mig_instance, namespace, pod, "
                          f"toUnixTimestamp64Milli(ts)/1000, metric, value FROM {store.database}.gpu_samples").rows
        runs = idle_runs(activity_points(raw), P)
        pure_idle = {(a.queue, a.workload): a.idle_gpu_seconds for a in attribute_idle(runs, allocs, window, NOW)}
        for source in ("raw", "1m"):
            got = {(a.queue, a.workload): a.idle_gpu_seconds for a in sa.read_idle(store, window, NOW, P, source)}
            assert got == pure_idle, source
        assert sa.read_idle_runs(store, Window(T0, NOW), NOW, P, "raw") == list(idle_runs(activity_points(raw), P))
    finally:
        store.close()


def test_queues_cli_now_view(filled: str, tmp_path: Path) -> None:
    rows = run_json(queues_main, ["--format", "json"], settings_for(filled, tmp_path))
    by = {(r["queue"], r["gpu_type"]): r for r in rows}
    assert set(rows[0]) >= {"queue", "gpu_type", "allocated", "guaranteed", "max", "pending", "fair_share"}
    v = by[("research.vision", "*")]
    assert (v["allocated"], v["guaranteed"], v["max"], v["pending"], v["idle"]) == (8.0, 16, 40, 0.0, 1.0)
    # dominant share: gpu 8/16 = 0.5, but gpu/H100 has no guarantee, so its max (8) is the denominator
    assert v["fair_share"] == pytest.approx(1.0)
    assert by[("research.vision", "H100")]["max"] == 8
    nlp = by[("research.nlp", "*")]
    assert (nlp["allocated"], nlp["pending"], nlp["idle"]) == (2.0, 4.0, 2.0)
    assert by[("research", "*")]["allocated"] == 10.0 and by[("root", "*")]["allocated"] == 14.0
    assert by[("prod", "*")]["lent"] == 52.0


def test_queues_cli_capacity_and_starving(filled: str, tmp_path: Path) -> None:
    s = settings_for(filled, tmp_path)
    cap = {r["gpu_type"]: r for r in run_json(queues_main, ["--show", "capacity", "--format", "json"], s)}
    total = cap["*"]
    # free: h1 4 + h2 8 + a0 6 (a1 cordoned, h0 full); whole-node-capable: h2 only
    assert (total["capacity"], total["allocated"], total["free"]) == (40.0, 14.0, 18.0)
    assert total["fragmentation_ratio"] == pytest.approx(10 / 18)
    assert (total["fits_1"], total["fits_4"], total["fits_8"]) == (18, 4, 1)
    assert cap["H100"]["fragmentation_ratio"] == pytest.approx(4 / 12)
    starving = run_json(queues_main, ["--show", "starving", "--format", "json"], s)
    assert [(r["queue"], r["waiting_s"]) for r in starving] == [("research", 6200.0), ("research.nlp", 6200.0)]


def test_metrics_collector_exposes_the_view(filled: str, tmp_path: Path) -> None:
    store = open_store(filled)
    try:
        view = now_view(store, load_config(settings_for(filled, tmp_path).queues_file), NOW, P)
    finally:
        store.close()
    registry = CollectorRegistry()
    collector = AccountingCollector()
    registry.register(collector)
    collector.update(view)
    text = generate_latest(registry).decode()
    for line in ['gpuq_queue_allocated_gpus{gpu_type="*",queue="research.vision"} 8.0',
                 'gpuq_queue_guaranteed_gpus{gpu_type="*",queue="prod"} 56.0',
                 'gpuq_queue_max_gpus{gpu_type="H100",queue="research.vision"} 8.0',
                 'gpuq_queue_pending_gpus{gpu_type="*",queue="research.nlp"} 4.0',
                 'gpuq_queue_fair_share{queue="research.nlp"} 0.25',
                 'gpuq_idle_allocated_gpus{queue="research.nlp"} 2.0',
                 'gpuq_free_gpus{gpu_type="*"} 18.0',
                 'gpuq_queue_starving{queue="research.nlp"} 1.0',
                 'gpuq_fitting_requests{gpu_type="*",gpus="8"} 1.0']:
        assert line in text, line
    assert 'gpuq_fragmentation_ratio{gpu_type="*"} 0.5555' in text


def test_ray_resources_give_capacity_without_node_events(chdb_path: Path) -> None:
    dsn = f"chdb://{chdb_path}?database=acc{next(_ids)}"
    store = open_store(dsn)
    try:
        store.insert("ray_resources", [(ts(0), "ray", "n1", "GPU", "USED", 1.0), (ts(0), "ray", "n1", "GPU", "AVAILABLE", 3.0),
                                       (ts(0), "ray", "n1", "accelerator_type:A100", "AVAILABLE", 1.0)],
                     COLUMNS["ray_resources"])
        nodes = sa.read_nodes(store, T0 + 60)
        assert [(n.cluster, n.node, n.gpu_model, n.gpus) for n in nodes] == [("ray", "n1", "A100", 4.0)]
    finally:
        store.command(f"DROP DATABASE IF EXISTS {store.database}")
        store.close()


ERRORS = [
    ("bad-from", ["--from", "yesterday"], "cannot read time 'yesterday'"),
    ("bad-by", ["--by", "team"], "--by takes"),
    ("bad-format", ["--format", "xml"], "invalid choice"),
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in ERRORS], ids=[c[0] for c in ERRORS])
def test_usage_cli_bad_arguments(argv: list[str], message: str, tmp_path: Path) -> None:
    err = io.StringIO()
    s = Settings(store={"dsn": f"chdb://{tmp_path}/never"})
    assert usage_main(argv, s, now_s=NOW, out=io.StringIO(), err=err) == 2
    assert message in err.getvalue()


def test_cli_bad_queue_file_says_where(tmp_path: Path) -> None:
    bad = {"queues": {"a": {"guaranteed": {"gpu": 8}, "max": {"gpu": 4}}}}
    err = io.StringIO()
    s = settings_for(f"chdb://{tmp_path}/never", tmp_path, bad)
    assert queues_main([], s, now_s=NOW, out=io.StringIO(), err=err) == 2
    assert err.getvalue() == f"error: queue file: {tmp_path}/queues.yaml:5: queues.a.max: gpu 4 is below guaranteed 8\n"


def test_usage_table_and_csv(filled: str, tmp_path: Path) -> None:
    s = settings_for(filled, tmp_path)
    for fmt, first in (("csv", "queue,gpu_type,gpu_seconds"), ("table", "queue")):
        out = io.StringIO()
        assert usage_main([*FROM_TO, "--by", "queue,gpu_type", "--format", fmt], s, now_s=NOW, out=out) == 0
        assert out.getvalue().startswith(first)
        assert "research.vision" in out.getvalue()


def test_materialized_hours_give_the_same_usage(filled: str, tmp_path: Path) -> None:
    from accounting.rollup import done_hours, materialize_hours

    s = settings_for(filled, tmp_path)
    live = run_json(usage_main, [*FROM_TO, "--by", "queue,gpu_type", "--format", "json", "--idle-source", "1m"], s)
    store = open_store(filled)
    try:
        assert materialize_hours(store, NOW, P, since_s=T0 - 3600) == [T0 - 3600, T0]   # T0+3600 is not closed yet
        assert materialize_hours(store, NOW, P, since_s=T0 - 3600) == []                # idempotent
        assert done_hours(store, Window(T0 - 7200, NOW)) == [T0 - 3600, T0]
        stored = store.query(f"SELECT count() FROM {store.database}.accounting_usage_1h").rows[0][0]
        assert stored == 3          # vision, nlp and prod in the first hour; nothing the hour before
    finally:
        store.close()
    mixed = run_json(usage_main, [*FROM_TO, "--by", "queue,gpu_type", "--format", "json"], s)
    assert mixed == live


SEGMENTS = [
    ("all-live", (0, 7200), [], [], [(0, 7200)]),
    ("stored-middle-ragged-edges", (600, 10000), [0, 3600, 7200], [(3600, 7200)], [(600, 3600), (7200, 10000)]),
    ("hole-in-the-middle", (0, 14400), [0, 7200, 10800], [(0, 3600), (7200, 14400)], [(3600, 7200)]),
]


@pytest.mark.parametrize("window,done,stored,live", [c[1:] for c in SEGMENTS], ids=[c[0] for c in SEGMENTS])
def test_live_segments(window: tuple[int, int], done: list[int], stored: list, live: list) -> None:
    from accounting.rollup import live_segments

    s, lv = live_segments(Window(*window), [float(h) for h in done])
    assert [(w.start_s, w.end_s) for w in s] == stored and [(w.start_s, w.end_s) for w in lv] == live


def test_queues_cli_shows_equivalents_beside_gpus(filled: str, tmp_path: Path) -> None:
    """gpuq queues with gpu_eq set (issue 19): allocated_eq, guaranteed_eq and max_eq right after max."""
    import copy

    q = copy.deepcopy(BASE_QUEUES)
    q["gpu_types"]["A100"]["equivalent"] = 0.5
    q["queues"]["prod"] = {"guaranteed": {"gpu_eq": 28}, "max": {"gpu_eq": 40}, "weight": 3}
    rows = run_json(queues_main, ["--format", "json"], settings_for(filled, tmp_path, q))
    keys = list(rows[0])
    assert keys[keys.index("max") + 1:keys.index("max") + 4] == ["allocated_eq", "guaranteed_eq", "max_eq"]
    by = {(r["queue"], r["gpu_type"]): r for r in rows}
    assert (by[("prod", "*")]["guaranteed_eq"], by[("prod", "*")]["max_eq"]) == (28, 40)
    v = by[("research.vision", "*")]
    assert v["allocated_eq"] == 8 and v["guaranteed_eq"] is None      # 8 H100, each worth 1
