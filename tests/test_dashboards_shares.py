"""Shares of one GPU in the dashboards (issue 19): amounts shown as the decimals they are, never
rounded to 0 or 1 nor cut to an int; the node map draws a GPU held in part as a partly filled cell
and a MIG slice as a sub-cell of its GPU's cell.

The pure geometry (:mod:`dashboards.nodemap`) is checked cell by cell; the pages with Streamlit's
AppTest against the real API over a chDB store seeded with shares (times from NOW - 7200):
  A100 a0: 8 GPUs; w1 (research.nlp) holds 2 of them, the Ray job r1 two tasks of 0.5 and r2 an
  actor of 0.25 (research.vision): 2.75 allocated, 5.25 free
  A100 m0: split into 14 MIG 1g.10gb slices, 3 of them held by mig1 (research.nlp)
The scheduler (DryRunActuator): s-1 (prod) asks 0.5 of an A100 and is admitted on a0, device slot
0; the accounting follows the scheduler as in `gpuq serve`, so a0 holds 3.25.
"""
from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pyarrow as pa
import pytest
import yaml
from streamlit.testing.v1 import AppTest

from dashboards import nodemap
from dashboards.common import amount, gpus
from gpuq.settings import load_settings
from gpuq.store import COLUMNS, open_store
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.api import create_app
from scheduler.model import Workload
from scheduler.service import SchedulerService
from scheduler.service.accounting import LiveAccounting
from tests.accounting_helpers import BASE_QUEUES
from tests.test_dashboards_apptest import A100, ALLOC_COLUMNS, NOW, EventSink, alloc_row, metrics, render, served, ts

MIG = "nvidia.com/mig-1g.10gb"


# -- the geometry ------------------------------------------------------------------------------------------
def node(name: str, gpu_type: str, capacity: float, allocated: float, free: float) -> dict[str, Any]:
    return {"cluster": "c", "node": name, "gpu_type": gpu_type, "capacity": capacity, "allocated": allocated,
            "free": free, "schedulable": True}


def spans(segments: list[dict[str, Any]], row: str) -> list[tuple[float, float, str]]:
    return [(round(s["x"], 4), round(s["x2"], 4), s["state"]) for s in segments if s["node"] == row]


def test_whole_gpus_are_whole_cells() -> None:
    segments, outlines = nodemap.cells([node("h0", "H100", 4, 2, 2)], {("c", "h0"): 1})
    assert spans(segments, "h0 (H100)") == [(0, 1, "busy"), (1, 2, "idle"), (2, 3, "free"), (3, 4, "free")]
    assert [(o["x"], o["x2"], o["kind"]) for o in outlines] == [(i, i + 1, "GPU") for i in range(4)]
    assert nodemap.partial(segments) == []


def test_a_share_is_a_partly_filled_cell() -> None:
    """Whole GPUs first, what is left of the shares one partly filled cell: 2.75 allocated of 4
    with 2 idle is two idle cells and one three quarters busy; 1.5 busy and 0.75 idle of 4 is a
    busy cell, then the shares' 0.5 + 0.75 over two cells; a cordoned node's leftover is
    unavailable."""
    segments, _ = nodemap.cells([node("a0", "A100", 4, 2.75, 1.25), node("a1", "A100", 4, 2.25, 1.75),
                                 node("a2", "A100", 2, 0.5, 0)], {("c", "a0"): 2, ("c", "a1"): 0.75})
    assert spans(segments, "a0 (A100)") == [(0, 1, "idle"), (1, 2, "idle"), (2, 2.75, "busy"), (2.75, 3, "free"),
                                            (3, 4, "free")]
    assert spans(segments, "a1 (A100)") == [(0, 1, "busy"), (1, 1.5, "busy"), (1.5, 2, "idle"), (2, 2.25, "idle"),
                                            (2.25, 3, "free"), (3, 4, "free")]
    assert spans(segments, "a2 (A100)") == [(0, 0.5, "busy"), (0.5, 1, "unavailable"), (1, 2, "unavailable")]
    held = {(s["node"], s["unit"], s["state"], s["share"]) for s in nodemap.partial(segments)}
    assert held == {("a0 (A100)", "GPU 2", "busy", 0.75), ("a1 (A100)", "GPU 1", "busy", 0.5),
                    ("a1 (A100)", "GPU 1", "idle", 0.5), ("a1 (A100)", "GPU 2", "idle", 0.25),
                    ("a2 (A100)", "GPU 0", "busy", 0.5)}


def test_mig_slices_are_sub_cells() -> None:
    """14 slices of 1g.10gb on an A100 (1/7 of a GPU each): two GPU cells of seven sub-cells; 3g
    slices two to a GPU (3/7 each); an A30's 1g slices a quarter of a GPU (gpuq.gpu_share's table)."""
    segments, outlines = nodemap.cells([node("m0", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", 14, 3, 11)], {})
    row = spans(segments, "m0 (NVIDIA-A100-SXM4-80GB-MIG-1g.10gb)")
    assert len(row) == 14 and [r[2] for r in row] == ["busy"] * 3 + ["free"] * 11
    assert row[2] == (round(2 / 7, 4), round(3 / 7, 4), "busy") and row[7] == (1, round(8 / 7, 4), "free")
    assert sum(o["kind"] == "GPU" for o in outlines) == 2 and sum(o["kind"] == "slice" for o in outlines) == 14
    assert nodemap.unit_of("A100-MIG-3g.40gb") == nodemap.Unit("slice", 3 / 7, 2)
    assert nodemap.unit_of("NVIDIA-A30-MIG-1g.6gb") == nodemap.Unit("slice", 1 / 4, 4)
    assert nodemap.unit_of("A100-mig-1g.10gb") == nodemap.Unit("slice", 1 / 7, 7)   # a quota's spelling
    assert nodemap.unit_of("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb+me-SHARED") == nodemap.Unit("slice", 1 / 7, 7)
    assert nodemap.unit_of("A100-MIG-9g.99gb") == nodemap.Unit("GPU", 1.0, 1)           # no such profile
    assert nodemap.unit_of("H100") == nodemap.Unit("GPU", 1.0, 1)


def test_shares_on_known_devices_are_cells_of_their_own() -> None:
    """gpuq's placements name the devices of its shares (0.5 and 0.25 on two devices): each is a cell
    of its own, filled to its share ("device"); the node's other shares (0.25 of 1.5 - 0.75 - 1 whole)
    are estimated as before, and the idle GPU stays a whole cell. Where the placements claim more
    than the accounting holds (one is behind), the whole node is estimated."""
    nodes = [node("a0", "A100", 4, 2, 2), node("a1", "A100", 2, 0.25, 1.75)]
    known = nodemap.known_devices(nodes, [{"name": "c/a0", "devices": {"1": 0.25, "0": 0.5}},
                                          {"name": "a1", "devices": {"0": 0.75}}, {"name": "zz", "devices": {}}])
    assert known == {("c", "a0"): [0.5, 0.25], ("c", "a1"): [0.75]}
    segments, _ = nodemap.cells(nodes, {("c", "a0"): 1}, known)
    a0 = [(x, x2, state, s["placed"]) for s in segments if s["node"] == "a0 (A100)"
          for x, x2, state in [(round(s["x"], 4), round(s["x2"], 4), s["state"])]]
    assert a0 == [(0, 1, "idle", ""), (1, 1.25, "busy", "estimate"), (1.25, 2, "free", ""),
                  (2, 2.5, "busy", "device"), (2.5, 3, "free", ""), (3, 3.25, "busy", "device"), (3.25, 4, "free", "")]
    a1 = [(s["x"], s["x2"], s["placed"]) for s in segments if s["node"] == "a1 (A100)" and s["state"] == "busy"]
    assert a1 == [(0, 0.25, "estimate")]                              # 0.75 claimed, 0.25 held: estimated
    assert {s["placed"] for s in nodemap.cells(nodes, {}, {})[0]} == {"", "estimate"}


@pytest.mark.parametrize(("value", "shown"), [(12, "12"), (12.0, "12"), (0.5, "0.5"), (1.25, "1.25"),
                                              (0.125, "0.125"), (0.9996, "0.9996"), (0.0004, "0.0004"),
                                              (0.1 + 0.2, "0.3"), (1234.75, "1,234.75")])
def test_amounts_are_never_rounded_to_a_whole(value: float, shown: str) -> None:
    assert amount(value) == shown
    assert gpus(value) == f"{shown} GPUs"


# -- the pages -----------------------------------------------------------------------------------------------
def seed(store: Any) -> None:
    store.insert("node_events", [
        (ts(-7200), "c", "a0", "uid-a0", "SYNC", 1, 0, A100, 8, 8, {}, {}, "1"),
        (ts(-7200), "c", "m0", "uid-m0", "SYNC", 1, 0, A100, 0, 0, {MIG: 14}, {}, "1")], COLUMNS["node_events"])
    mig = alloc_row("mig1", "u4", "research.nlp", "m0", A100, 3, 0, None, 1)
    store.insert("gpu_allocations", [
        alloc_row("w1", "u1", "research.nlp", "a0", A100, 2, 0, None, 1),
        alloc_row("r1", "u2", "research.vision", "a0", A100, 0.5, 0, None, 1),
        alloc_row("r2", "u3", "research.vision", "a0", A100, 0.25, 0, None, 1),
        (*mig[:7], MIG, *mig[8:])], ALLOC_COLUMNS)


@pytest.fixture(scope="module")
def shares_url(chdb_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = open_store(f"chdb://{chdb_path}?database=shares{int(time.time() * 1000) % 100000}")
    try:
        seed(store)
        qf = tmp_path_factory.mktemp("shares") / "queues.yaml"
        qf.write_text(yaml.safe_dump(BASE_QUEUES))
        acc = LiveAccounting(store, queues_file=str(qf))
        svc = SchedulerService(acc.config, DryRunActuator(), sink=EventSink(store))
        acc.follow(svc)                      # as gpuq serve: the views add what the scheduler admitted
        svc.set_nodes(acc.refresh(NOW).nodes)
        svc.submit(Workload("s-1", "prod", gpus_per_pod=Decimal("0.5"), gpu_types=("A100",), submit_s=NOW - 60),
                   Target(), NOW - 60)
        svc.cycle(NOW)
        acc.refresh(NOW, svc.pending_demand())
        app = create_app(svc, acc, load_settings(None, queues_file=str(qf)), clock=lambda: NOW)
        with served(app) as url:
            yield url
    finally:
        store.command(f"DROP DATABASE IF EXISTS {store.database}")
        store.close()


def chart_rows(at: AppTest) -> list[dict[str, Any]]:
    """Every row of every dataset of the page's Vega-Lite charts (Streamlit sends them as Arrow)."""
    rows: list[dict[str, Any]] = []
    for chart in at.get("vega_lite_chart"):
        for ds in chart.proto.datasets:
            rows += pa.ipc.open_stream(io.BytesIO(ds.data.data)).read_all().to_pylist()
        spec = json.loads(chart.proto.spec)
        for ds in (spec.get("datasets") or {}).values():
            rows += ds
    return rows


def test_idle_page_draws_shares_as_partly_filled_cells(shares_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cap = httpx.get(shares_url + "/accounting/capacity").json()
    a0 = next(n for n in cap["nodes"] if n["node"] == "a0")
    assert (a0["allocated"], a0["free"]) == (3.25, 4.75)            # the API's decimals
    [a0_placed] = [n for n in httpx.get(shares_url + "/nodes").json() if n["name"] == "a0"]
    assert a0_placed["devices"] == {"0": 0.5}                         # s-1's share, on the scheduler's slot 0
    at = render(shares_url, "idle", monkeypatch)
    m = metrics(at)
    assert m["Free"] == gpus(cap["total"]["free"]) and ".75 GPUs" in m["Free"]
    # the map: the Ray shares (0.75, devices unknown) estimated on a0's third GPU, the rest of it free;
    # s-1's 0.5 on a cell of its own (its device known), half of it free; m0's slices sevenths of a GPU
    cells = [r for r in chart_rows(at) if "state" in r and "x2" in r and "mark" not in r]
    a0_row = sorted((round(r["x"], 3), round(r["x2"], 3), r["state"], r["placed"])
                    for r in cells if r["node"] == "a0 (A100)")
    assert a0_row[:6] == [(0, 1, "busy", ""), (1, 2, "busy", ""), (2, 2.75, "busy", "estimate"),
                          (2.75, 3, "free", ""), (3, 3.5, "busy", "device"), (3.5, 4, "free", "")]
    marks = [r for r in chart_rows(at) if r.get("mark") == "≈"]
    assert [(r["node"], r["unit"]) for r in marks] == [("a0 (A100)", "GPU 2")]      # the estimate is marked
    m0 = [r for r in cells if r["node"].startswith("m0 ")]
    assert len(m0) == 14 and {round(r["x2"] - r["x"], 4) for r in m0} == {round(1 / 7, 4)}
    assert sum(r["state"] == "busy" for r in m0) == 3
    caption = " ".join(c.value for c in at.caption)
    assert "a0 (A100) GPU 2: 0.75 busy ≈" in caption and "a0 (A100) GPU 3: 0.5 busy." in caption
    assert "not which device holds which share, so they are estimated, marked ≈" in caption
    free = next(df.value for df in at.dataframe if "free (GPUs)" in df.value.columns)
    assert dict(zip(free["node"], free["free (GPUs)"]))["a0"] == 4.75


def test_scheduler_and_queue_pages_show_a_share(shares_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    [s1] = [w for w in httpx.get(shares_url + "/workloads").json() if w["id"] == "s-1"]
    assert s1["state"] == "running" and s1["gpus"] == 0.5
    at = render(shares_url, "scheduler", monkeypatch)
    running = next(m for m in at.metric if m.label == "Running workloads")
    assert running.proto.help == "0.5 GPUs held"
    at = render(shares_url, "queues", monkeypatch)
    drill = at.dataframe[-1].value
    row = drill[drill["id"] == "s-1"].iloc[0]
    assert row["GPUs"] == 0.5 and row["placement"] == f"{next(iter(s1['placement']))}: 0.5"
