"""Issue 21 on the dashboards (Streamlit's AppTest against the real API over chDB): the cost page
and the scheduler page show what preemptions threw away, in all and per queue, the numbers the
API's ``/accounting/usage`` gives and a sum of the stored ``preempt`` events computed here.

Two H100 nodes of 8; queue a borrows both (a1, then a2 an hour before NOW), a2 reports a
checkpoint 40 min before NOW; b (8 guaranteed) arrives 10 min before NOW and preempts a2 at once (no preemption delay): 8 GPUs x
30 min = 4 GPU-h lost (without the checkpoint it would have been 6.67)."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from gpuq.settings import load_settings
from gpuq.store import COLUMNS, open_store
from gpuq.store.writer import BatchWriter
from scheduler import events as ev
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.api import create_app
from scheduler.model import Workload
from scheduler.service import SchedulerService
from scheduler.service.accounting import LiveAccounting
from scheduler.snapshot import Settings
from tests.test_dashboards_apptest import H100, NOW, metrics, node_row, render, served, shown_texts

QUEUES = {"gpu_types": {"H100": {"price_per_hour": 4.0, "node_labels": [H100]}},
          "queues": {"a": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}},
                     "b": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}}}}
LOST_H = 8 * 1800 / 3600


@pytest.fixture(scope="module")
def api_url(chdb_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = open_store(f"chdb://{chdb_path}?database=dashcost")
    tmp = tmp_path_factory.mktemp("dashcost")
    try:
        store.insert("node_events", [node_row("h0", H100, 8), node_row("h1", H100, 8)], COLUMNS["node_events"])
        qf = tmp / "queues.yaml"
        qf.write_text(yaml.safe_dump(QUEUES))
        acc = LiveAccounting(store, queues_file=str(qf))
        writer = BatchWriter(store, tmp / "spill")
        svc = SchedulerService(acc.config, DryRunActuator(), sink=writer, settings=Settings(True, 0.0))
        svc.set_nodes(acc.refresh(NOW - 7200).nodes)
        for wid, queue, t in (("a1", "a", NOW - 7200), ("a2", "a", NOW - 3600)):
            svc.submit(Workload(wid, queue, gpus_per_pod=8, submit_s=t), Target(), t)
            svc.cycle(t)
        svc.checkpoint("a2", NOW - 2400, NOW - 2390)
        svc.submit(Workload("b1", "b", gpus_per_pod=8, submit_s=NOW - 600), Target(), NOW - 600)
        svc.cycle(NOW - 600)
        assert svc.explain("a2").lost_gpu_seconds == LOST_H * 3600
        writer.flush()
        acc.refresh(NOW, svc.pending_demand())
        app = create_app(svc, acc, load_settings(None, queues_file=str(qf)), clock=lambda: NOW)
        with served(app) as url:
            yield url
        writer.close()
    finally:
        store.command(f"DROP DATABASE IF EXISTS {store.database}")
        store.close()


def stored_lost_h(url: str) -> dict[str, float]:
    """Queue -> GPU-hours lost, from the preempt events as the API lists them (the stored rows)."""
    out: dict[str, float] = {}
    for e in httpx.get(url + "/scheduler/events", params={"from": "-1d", "event": "preempt"}).json():
        out[e["queue"]] = out.get(e["queue"], 0.0) + e["lost_gpu_seconds"] / 3600
    return out


def test_the_cost_page_shows_what_preemption_cost(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    assert stored_lost_h(api_url) == {"a": LOST_H}
    usage = {r["queue"]: r["lost_gpu_hours"] for r in httpx.get(
        api_url + "/accounting/usage", params={"from": "-1d", "by": "queue"}).json()}
    assert usage == {"a": LOST_H, "b": 0.0}
    at = render(api_url, "cost", monkeypatch)
    assert metrics(at)["Lost to preemption"] == f"{LOST_H:.2f} GPU-h"
    per_queue = at.dataframe[-1].value
    assert dict(zip(per_queue["queue"], per_queue["lost GPU-h"])) == {"a": LOST_H}


def test_the_scheduler_page_shows_what_preemption_cost(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(api_url, "scheduler", monkeypatch)
    m = metrics(at)
    assert m["Preempted (24h)"] == "1" and m["Lost to preemption (24h)"] == f"{LOST_H:.2f} GPU-h"
    events = next(d.value for d in at.dataframe if "lost GPU-h" in d.value.columns and "event" in d.value.columns)
    [(wid, lost)] = [(r["workload"], r["lost GPU-h"]) for _, r in events.iterrows() if r["event"] == "preempt"]
    assert (wid, float(lost)) == ("a2", LOST_H)                # cells shown as text (missing ones "–")
    per_queue = at.dataframe[-1].value
    assert {q: float(h) for q, h in zip(per_queue["queue"], per_queue["lost GPU-h"])} == {"a": LOST_H}
    texts = shown_texts(at)
    assert not [t for t in texts if t in ("None", "nan", "NaN")]


def test_the_stored_events_hold_the_cost() -> None:
    """The event dict a restart reads back carries the cost (the column the pages sum)."""
    row = ev.to_row(ev.event(5.0, "preempt", "a2", "a", by="b1", reason="r", lost_gpu_seconds=14400.0), 3, "c")
    assert ev.from_row(row[2:11], lost_gpu_seconds=row[-1])["lost_gpu_seconds"] == 14400.0
