"""The dashboards with Streamlit's AppTest against the real API (uvicorn in a thread) over a chDB
store seeded with known rows: every page renders without an exception, and its numbers are the
seed's (capacity, allocated, idle, free, fragmentation, pending; idle GPUs per workload; the cost
CSV's GPU-hours and dollars). An API that does not answer gives a clear message, not a traceback.

The fleet, two hours before NOW (times in seconds from NOW - 7200):
  H100 h0, h1, h2 and A100 a0: 8 GPUs each; A100 a1: 8 GPUs, cordoned
  v1 research.vision 8 H100 on h0 (restarted at 3600 as a new uid), one GPU idle throughout
  n1 research.nlp    2 A100 on a0 from 1800, both idle (profiling metric)
  p1 prod            4 H100 on h1, no DCGM data
  old prod           8 H100 on h2, ended an hour before the others started
The scheduler (its events only; no allocation rows): probe (1 A100) admitted 10 min before NOW and
finished after 30 s; train-a (8 H100) forecast at its submission to start then, admitted at NOW
(a start 60 s off its forecast, outside its interval); train-b (3 x 8 H100) waits, forecast.

Every headline number (the st.metric row) of every page is checked against the API's answer of the
same moment, from the endpoints the page reads; no page shows "None".
"""
from __future__ import annotations

from contextlib import contextmanager

import datetime as dt
import io
import itertools
import math
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest
import uvicorn
import yaml
from streamlit.testing.v1 import AppTest

from accounting.idle import GPU_UTIL, PROF_ACTIVE
from dashboards.common import duration
from dashboards.views.cost import COLUMNS as CSV_COLUMNS
from gpuq.settings import load_settings
from gpuq.store import COLUMNS, open_store
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.api import create_app
from scheduler.model import Workload
from scheduler.service import SchedulerService
from scheduler.service.accounting import LiveAccounting
from tests.accounting_helpers import BASE_QUEUES
from tests.conftest import REPO, closed_port, free_port

APP = str(REPO / "dashboards" / "app.py")
NOW = float(int(time.time()) // 60 * 60)
T0 = NOW - 7200
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
PAGES = ["overview", "queues", "gpu_types", "idle", "scheduler", "cost"]
ALLOC_COLUMNS = ("cluster", "namespace", "pod", "uid", "queue", "node", "gpu_model", "gpu_resource", "gpus",
                 "priority", "ray_cluster", "start", "end", "version")
_ids = itertools.count()


def ts(offset: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(T0 + offset, dt.UTC)


def alloc_row(pod: str, uid: str, queue: str, node: str, model: str, gpus: float, start: float,
              end: float | None, version: int) -> tuple[Any, ...]:
    return ("c", "ml", pod, uid, queue, node, model, "nvidia.com/gpu", gpus, 0, "", ts(start),
            None if end is None else ts(end), version)


def node_row(node: str, model: str, gpus: float, cordoned: int = 0) -> tuple[Any, ...]:
    return (ts(-7200), "c", node, f"uid-{node}", "SYNC", 1, cordoned, model, gpus, gpus, {}, {}, "1")


def samples(node: str, gpu: str, pod: str, metric: str, value: float, start: float, end: float) -> list[tuple]:
    return [(ts(t), "c", node, gpu, 0, "H100", "", "", pod, "ml", "main", metric, value, "dcgm")
            for t in range(int(start), int(end), 15)]


def seed(store: Any) -> None:
    store.insert("node_events", [node_row("h0", H100, 8), node_row("h1", H100, 8), node_row("h2", H100, 8),
                                 node_row("a0", A100, 8), node_row("a1", A100, 8, cordoned=1)],
                 COLUMNS["node_events"])
    store.insert("gpu_allocations", [
        alloc_row("v1", "u1", "research.vision", "h0", H100, 8, 0, None, 1),
        alloc_row("v1", "u1", "research.vision", "h0", H100, 8, 0, 3600, 2),
        alloc_row("v1", "u2", "research.vision", "h0", H100, 8, 3600, None, 3),
        alloc_row("n1", "u3", "research.nlp", "a0", A100, 2, 1800, None, 1),
        alloc_row("p1", "u4", "prod", "h1", H100, 4, 0, None, 1),
        alloc_row("old", "u5", "prod", "h2", H100, 8, -7200, -3600, 2),
    ], ALLOC_COLUMNS)
    rows = samples("h0", "GPU-h0-0", "v1", GPU_UTIL, 0.0, 0, 7200)
    for i in range(1, 8):
        rows += samples("h0", f"GPU-h0-{i}", "v1", GPU_UTIL, 80.0, 0, 7200)
    for i in range(2):
        rows += samples("a0", f"GPU-a0-{i}", "n1", PROF_ACTIVE, 0.01, 1800, 7200)
    store.insert("gpu_samples", rows, COLUMNS["gpu_samples"])


class EventSink:
    """The scheduler's events into the store; its admissions' own allocation rows are left out, so
    the numbers below are the seed's (train-a, admitted by gpuq, is no pod the collectors saw)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def write(self, table: str, rows: Any) -> None:
        if table == "scheduler_events":
            self.store.insert(table, list(rows), COLUMNS[table])


@pytest.fixture(scope="module")
def api_url(chdb_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    store = open_store(f"chdb://{chdb_path}?database=dash{next(_ids)}")
    try:
        seed(store)
        qf = tmp_path_factory.mktemp("dash") / "queues.yaml"
        qf.write_text(yaml.safe_dump(BASE_QUEUES))
        acc = LiveAccounting(store, queues_file=str(qf))
        svc = SchedulerService(acc.config, DryRunActuator(), sink=EventSink(store))
        svc.set_nodes(acc.refresh(NOW).nodes)
        svc.submit(Workload("probe", "research.nlp", gpus_per_pod=1, gpu_types=("A100",), submit_s=NOW - 600,
                            duration_s=30), Target(), NOW - 600)
        svc.cycle(NOW - 600)                 # admitted, and finished after its 30 s
        svc.cycle(NOW - 560)
        svc.submit(Workload("train-a", "prod", gpus_per_pod=8, gpu_types=("H100",), submit_s=NOW - 60),
                   Target(), NOW - 60)
        svc.forecasts.refresh(NOW - 60)      # forecast to start at once
        svc.cycle(NOW)                       # admitted now: no GPU-seconds yet
        svc.submit(Workload("train-b", "prod", pods=3, gpus_per_pod=8, gpu_types=("H100",), submit_s=NOW - 30),
                   Target(), NOW - 30)
        svc.cycle(NOW)
        svc.forecasts.refresh(NOW)
        acc.refresh(NOW, svc.pending_demand())
        app = create_app(svc, acc, load_settings(None, queues_file=str(qf)), clock=lambda: NOW)
        with served(app) as url:
            yield url
    finally:
        store.command(f"DROP DATABASE IF EXISTS {store.database}")
        store.close()


@contextmanager
def served(app: Any) -> Iterator[str]:
    """``app`` served by uvicorn on a free local port in a thread (the dashboards read the API over
    HTTP, as in production); stopped on exit."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    try:
        while not server.started:
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True


def render(url: str, page: str, monkeypatch: pytest.MonkeyPatch, range_: str = "24h") -> AppTest:
    monkeypatch.setenv("GPUQ_DASHBOARD__API_URL", url)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["range"] = range_
    at.run()                                 # the root page goes to /overview
    at.switch_page(f"views/{page}.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics(at: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in at.metric}


def errors(at: AppTest) -> list[str]:
    return [e.value for e in at.error]


@pytest.mark.parametrize("page", PAGES)
def test_every_page_renders(api_url: str, page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(api_url, page, monkeypatch)
    assert not errors(at)
    assert at.title[0].value and at.metric, "a row of numbers at the top"


def test_overview_numbers_are_the_seed(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    m = metrics(render(api_url, "overview", monkeypatch))
    assert m["Capacity"] == "40 GPUs"                 # 5 nodes x 8, the cordoned one included
    assert m["Allocated"] == "14 GPUs"                # v1 8 + n1 2 + p1 4
    assert m["Idle allocated"] == "3 GPUs"            # one of v1's, both of n1's
    assert m["Free"] == "18 GPUs"                     # h1 4 + h2 8 + a0 6; a1 cordoned
    assert m["Fragmentation"] == "56 %"               # (h1 4 + a0 6) / 18 on partly used nodes
    assert m["Pending demand"] == "24 GPUs"           # train-b: 3 x 8 H100


def test_idle_page_names_the_idle_workloads(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(api_url, "idle", monkeypatch)
    m = metrics(at)
    assert (m["Idle allocated"], m["Idle workloads"], m["Free"]) == ("3 GPUs", "2", "18 GPUs")
    idle = at.dataframe[0].value
    assert dict(zip(idle["workload"], idle["idle (GPUs)"])) == {"ml/n1": 2.0, "ml/v1": 1.0}
    assert set(idle["queue"]) == {"research.nlp", "research.vision"}
    # the range's idle GPU-hours by workload, with how they were measured (whole GPUs: the device)
    hours = at.dataframe[-1].value
    assert dict(zip(hours["workload"], hours["idle (GPU-h)"])) == {"v1": 2.0, "n1": 3.0}
    assert set(hours["idle_method"]) == {"device"}


def test_cost_csv_totals_match_the_seed(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The table is the frame the CSV download writes (AppTest keeps no media files after a run)."""
    at = render(api_url, "cost", monkeypatch)
    [button] = at.get("download_button")
    assert button.proto.label == "Download CSV"
    csv = pd.read_csv(io.StringIO(at.dataframe[0].value.to_csv(index=False)))
    assert list(csv.columns) == CSV_COLUMNS
    got = {(r.queue, r.gpu_type): (r.gpu_hours, r.idle_gpu_hours, r.cost) for r in csv.itertuples()}
    assert got == {("research.vision", "H100"): (16.0, 2.0, 64.0),    # 8 GPUs x 2 h at $4, GPU 0 idle 2 h
                   ("research.nlp", "A100"): (3.0, 3.0, 6.0),        # 2 GPUs x 1.5 h at $2, all idle
                   ("prod", "H100"): (16.0, 0.0, 64.0)}              # p1 4 x 2 h + old 8 x 1 h
    m = metrics(at)
    assert m["GPU-hours (24h)"] == "35.0 GPU-h" and m["Cost"] == "$ 134.00" and m["Idle GPU-hours"] == "5.0 GPU-h"


def test_scheduler_page_shows_pending_and_admissions(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(api_url, "scheduler", monkeypatch)
    m = metrics(at)
    assert (m["Pending workloads"], m["Pending GPUs"], m["Running workloads"]) == ("1", "24 GPUs", "1")
    assert m["Admitted (24h)"] == "2" and m["Preempted (24h)"] == "0"
    pending = at.dataframe[0].value
    assert list(pending["id"]) == ["train-b"] and list(pending["position"]) == [1]
    assert pending["reason"][0] and pending["message"][0]
    eta = httpx.get(api_url + "/workloads/train-b").json()["eta"]
    p10, p50, p90 = (dt.datetime.fromisoformat(eta[k]).timestamp() - NOW for k in ("p10", "p50", "p90"))
    assert 0 <= p10 <= p50 <= p90
    assert pending["expected start"][0] == f"in {duration(p50)} ({duration(p10)} to {duration(p90)})"
    # the forecasts' accuracy per queue: train-a was forecast at NOW - 60 to start at the next cycle
    # (p50 half a 1 s cycle interval later) and started at NOW: 59.5 s off, outside its interval
    accuracy = at.dataframe[1].value
    api = httpx.get(api_url + "/forecasts/accuracy").json()["queues"]
    assert [(r["queue"], r["forecast"], r["starts"], r["inside_interval"], r["median_error_s"],
             r["median_relative_error"]) for r in api] == [("prod", "latest", 1, 0.0, 59.5, 59.5 / 60),
                                                          ("prod", "submit", 1, 0.0, 59.5, 59.5 / 60)]
    assert [tuple(r) for r in accuracy[["queue", "starts", "inside p10-p90", "median error",
                                        "median relative error"]].itertuples(index=False)] == [
        ("prod", 1, "0 %", "60 s", "99 %")] * 2


def test_queues_page_and_range_in_the_url(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(api_url, "queues", monkeypatch, range_="7d")
    assert at.query_params["range"] == "7d" and at.sidebar.selectbox[0].value == "7d"
    m = metrics(at)
    assert m["Allocated"] == "14 GPUs" and m["Guaranteed"] == "80 GPUs"     # research 24 + prod 56
    assert m["Borrowed"] == "0 GPUs" and m["Lent"] == "66 GPUs"             # research 24-10, prod 56-4


def test_api_unreachable_is_a_message_not_a_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    for page in ("overview", "cost"):
        at = render(url, page, monkeypatch)
        [msg] = errors(at)
        assert msg.startswith(f"API unreachable: {url}/") and "gpuq serve" in msg


def test_api_route_answers(api_url: str) -> None:
    cap = httpx.get(api_url + "/accounting/capacity").json()
    assert [(t["gpu_type"], t["capacity"], t["allocated"], t["free"]) for t in cap["types"]] == [
        ("A100", 16.0, 2.0, 6.0), ("H100", 24.0, 12.0, 12.0)]
    health = httpx.get(api_url + "/collector/health").json()
    assert {(s["source"], s["node"]) for s in health["sources"]} == {("dcgm", "a0"), ("dcgm", "h0"),
                                                                     ("kubernetes", "")}
    events = httpx.get(api_url + "/scheduler/events", params={"event": "admit"}).json()
    assert [(e["workload"], e["gpus"]) for e in events] == [("train-a", 8), ("probe", 1)]
    [done] = httpx.get(api_url + "/scheduler/events", params={"event": "finish"}).json()
    assert (done["workload"], done["gpus"], done["gpu_type"], done["placement"]) == ("probe", 1, "A100", {})
    [sub] = httpx.get(api_url + "/scheduler/events", params={"event": "submit", "from": "-45s"}).json()
    assert (sub["workload"], sub["gpus"], sub["gpu_type"]) == ("train-b", 24, "")    # asked for, not placed
    assert health["data_since"] == T0 - 7200                         # the node events, the oldest rows


def test_what_if_form_runs_a_dry_run(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(api_url, "scheduler", monkeypatch)
    form = at.main                                               # the what-if form's widgets
    assert "prod" in form.selectbox[0].options
    form.selectbox[0].set_value("research.nlp")
    form.number_input[1].set_value(2)                            # GPUs per pod
    [submit] = [b for b in at.button if b.label == "Dry run"]    # the form's; the history what-if has its own
    submit.click().run()
    texts = [s.value for s in at.success] + [w.value for w in at.warning]
    assert any(t.startswith(("Admitted now", "Pending", "Admitted once")) for t in texts), texts
    before = httpx.get(api_url + "/workloads").json()
    assert "dry-run" not in {w["id"] for w in before}          # nothing was submitted


def test_history_what_if_form_replays_the_history(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The form posts to /admin/whatif (auth is off here: every caller may), waits for the replay
    process and shows the side-by-side table: three more H100 nodes let train-b (3 x 8 H100, waiting
    behind the foreign pods on h0 and h1 and train-a on h2) run, so prod's GPU-hours grow."""
    at = render(api_url, "scheduler", monkeypatch)
    [add] = [t for t in at.text_input if t.label.startswith("Add nodes")]
    add.set_value("H100:8x3")
    [replay] = [b for b in at.button if b.label == "Replay"]
    replay.click().run()
    assert not at.exception and not errors(at), [e.value for e in at.exception] + errors(at)
    df = at.dataframe[-1].value
    prod = df[(df["queue"] == "prod") & (df["metric"] == "GPU-hours")].iloc[0]
    assert float(prod["after"]) > float(prod["before"]) > 0      # the columns are text: waits may be "–"
    assert set(df["queue"]) >= {"prod", "research.nlp", "(all)"}
    assert metrics(at)["Workloads replayed"] == "3"             # probe, train-a, train-b


# -- every headline number against the API's answer of the same moment ---------------------------------
def api_get(url: str, path: str, **params: str) -> Any:
    r = httpx.get(url + path, params=params, timeout=10)
    assert r.status_code == 200, (path, r.text)
    return r.json()


def api_metrics(url: str, page: str) -> dict[str, float]:
    """What each metric of ``page`` must show, in its unit (GPUs, %, hours, $, a count), read from the
    endpoints the page reads (at the 24h range)."""
    day = {"from": "-86400s", "to": "now"}
    if page == "overview":
        cap = api_get(url, "/accounting/capacity")
        t = cap["total"]
        return {"Capacity": t["capacity"], "Allocated": t["allocated"], "Idle allocated": t["idle"],
                "Free": t["free"], "Fragmentation": 100 * t["fragmentation_ratio"],
                "Pending demand": cap["pending"].get("*", 0.0)}
    if page == "queues":
        now = [r for r in api_get(url, "/queues") if r["gpu_type"] == "*" and r["queue"] != "root"]
        names = [r["queue"] for r in now]
        top = [r for r in now if "." not in r["queue"]]
        return {"Queues": sum(1 for q in names if not any(o.startswith(q + ".") for o in names)),
                **{label: sum(r[key] or 0 for r in top) for label, key in (
                    ("Allocated", "allocated"), ("Guaranteed", "guaranteed"), ("Borrowed", "borrowed"),
                    ("Lent", "lent"), ("Pending", "pending"))}}
    if page == "gpu_types":
        return {t["gpu_type"]: t["capacity"] for t in api_get(url, "/accounting/capacity")["types"]}
    if page == "idle":
        idle, cap = api_get(url, "/accounting/idle"), api_get(url, "/accounting/capacity")
        return {"Idle allocated": idle["idle_gpus"], "Idle workloads": len(idle["workloads"]),
                "Longest idle": max((w["idle_for_s"] for w in idle["workloads"]), default=0.0) / 3600,
                "Free": cap["total"]["free"], "Stranded free": cap["total"]["fragmented_free"]}
    if page == "scheduler":
        work, events = api_get(url, "/workloads"), api_get(url, "/scheduler/events", **day)
        pending = [w for w in work if w["state"] == "pending"]
        return {"Pending workloads": len(pending), "Pending GPUs": sum(w["gpus"] for w in pending),
                "Running workloads": sum(w["state"] == "running" for w in work),
                "Admitted (24h)": sum(e["event"] == "admit" for e in events),
                "Preempted (24h)": sum(e["event"] == "preempt" for e in events),
                "Lost to preemption (24h)": sum(r["lost_gpu_seconds"] for r in api_get(
                    url, "/accounting/usage", by="queue", **day)) / 3600}
    assert page == "cost", page
    rows = api_get(url, "/accounting/usage", by="queue,gpu_type", **day)
    used, idle_s = sum(r["gpu_seconds"] for r in rows), sum(r["idle_gpu_seconds"] for r in rows)
    return {"GPU-hours (24h)": used / 3600, "Idle GPU-hours": idle_s / 3600,
            "Idle share": 100 * idle_s / used if used else 0.0, "Cost": sum(r["cost"] for r in rows),
            "Idle cost": sum(r["idle_cost"] for r in rows),
            "Lost to preemption": sum(r["lost_gpu_seconds"] for r in api_get(url, "/accounting/usage", by="queue",
                                                                             **day)) / 3600}


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.(\d+))?")


def shown_number(text: str) -> tuple[float, float]:
    """The first number of a metric's text, in hours for "d" (days), with half its last digit (the
    rounding the text may hide)."""
    m = _NUMBER.search(text)
    assert m, f"no number in {text!r}"
    value = float(m.group(0).replace(",", ""))
    tol = 0.5 * 10 ** -len(m.group(1) or "")
    if text.endswith(" d"):
        value, tol = value * 24, tol * 24
    return value, tol + 1e-9


@pytest.mark.parametrize("page", PAGES)
def test_every_headline_number_is_the_apis(api_url: str, page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(api_url, page, monkeypatch)
    shown = metrics(at)
    want = api_metrics(api_url, page)
    assert set(shown) == set(want), "every metric of the page is checked"
    for label, value in want.items():
        got, tol = shown_number(shown[label])
        assert abs(got - value) <= tol, f"{page}: {label} shows {shown[label]!r}, the API says {value}"
    assert any(v for v in want.values()), "the seed gives the page something to show"


def shown_texts(at: AppTest) -> list[str]:
    """Everything a person reads on the page: titles, text, alerts, metrics (with their help), the
    table cells and headers, the widgets' labels and options."""
    out: list[str] = []
    for kind in ("title", "header", "subheader", "markdown", "caption", "info", "success", "warning", "error",
                 "text"):
        out += [str(e.value) for e in getattr(at, kind)]
    for m in at.metric:
        out += [m.label, m.value, m.proto.help]
    for df in at.dataframe:
        frame = df.value
        out += [str(c) for c in frame.columns]
        out += ["None" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)
                for v in frame.to_numpy().ravel()]
    for w in [*at.selectbox, *at.multiselect]:
        out += [w.label, *map(str, w.options)]
    return out


@pytest.mark.parametrize("page", PAGES)
def test_no_page_shows_none(api_url: str, page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    texts = shown_texts(render(api_url, page, monkeypatch))
    assert texts
    bad = [t for t in texts if re.search(r"\bNone\b|\bnan\b|\bNaN\b", t)]
    assert not bad, bad
    epoch = [t for t in texts if re.search(r"\bt=\d|\b1[6-9]\d{8}(\.\d+)?\b", t)]
    assert not epoch, f"epoch seconds where people read: {epoch}"


def test_scheduler_events_show_the_workloads_gpus(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    at = render(api_url, "scheduler", monkeypatch)
    events = at.dataframe[2].value
    got = {(r["event"], r["workload"]): (r["GPUs"], r["GPU type"]) for _, r in events.iterrows()}
    assert got[("finish", "probe")] == (1, "A100") and got[("admit", "probe")] == (1, "A100")
    assert got[("admit", "train-a")] == (8, "H100")


def test_a_young_history_fits_the_range(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The history starts 4 h before NOW: at 24h and 7d the charts show those 4 h (plus a margin) at
    a step that gives them points, and the range in the URL stays as chosen; at 1h nothing changes."""
    since = api_get(api_url, "/collector/health")["data_since"]
    assert NOW - since == 4 * 3600
    for key in ("24h", "7d"):
        at = render(api_url, "queues", monkeypatch, range_=key)
        assert at.query_params["range"] == key
        [chart] = [s.value for s in at.subheader if s.value.startswith("All leaf queues")]
        assert chart.endswith(f"last 4.4 h (all the history there is; range {key})"), chart
    at = render(api_url, "queues", monkeypatch, range_="1h")
    assert any(s.value == "All leaf queues against capacity, last 1h" for s in at.subheader)
    at = render(api_url, "scheduler", monkeypatch, range_="7d")
    assert any(s.value.startswith("Admissions and preemptions, last 4.4 h") for s in at.subheader)


def test_a_short_history_gets_points() -> None:
    """The demo's two minutes: a 5-minute window at 15 s (20 points), not one hourly bucket."""
    from dashboards.common import POINTS, step_for

    assert step_for(300) == 15 and 300 / step_for(300) >= 20
    for span in (300, 4 * 3600, 86400, 30 * 86400):
        assert 10 <= span / step_for(span) <= POINTS


def test_my_queue_page_shows_the_tenant_page(api_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tenant's page (issue 21): the queue chosen in the URL, its numbers those of
    GET /queues/{queue}/tenant; fair share over time is off in the seed, and says so."""
    monkeypatch.setenv("GPUQ_DASHBOARD__API_URL", api_url)
    at = AppTest.from_file(APP, default_timeout=60)
    at.query_params["range"] = "24h"
    at.run()
    at.query_params["queue"] = "prod"
    at.switch_page("views/tenant.py").run()
    assert not at.exception and not errors(at)
    assert [s.value for s in at.selectbox if s.label == "Queue"] == ["prod"]
    t = httpx.get(api_url + "/queues/prod/tenant").json()
    m = metrics(at)
    assert m["Guaranteed"] == f"{t['guaranteed']['gpu']} GPUs" == "56 GPUs"
    assert m["Allocated"] == f"{next(r for r in t['now'] if r['gpu_type'] == '*')['allocated']:g} GPUs"
    assert m["Pending"] == f"{len(t['pending'])} workloads"
    assert any("usage_half_life_s: 0" in c.value for c in at.caption)
