"""Start-time forecasts in the live service (issue 18, scheduler.service.forecasts): a real service
with the dry-run actuator on a full cluster of two 8-GPU nodes and a small backlog, through the real
API (ASGI, no server): every pending workload gets an ``eta`` (ISO p10 <= p50 <= p90), a FIFO queue
of equal shapes forecasts its later positions no earlier, running ones have none; a declared running
time (the API's ``expected_duration``, the ``gpuq.io/expected-duration`` annotation through the
replaying Kubernetes API server) moves the forecasts of the work behind it; each start is scored
against its forecasts (``GET /forecasts/accuracy``, ``/metrics``); ``gpuq explain``'s text; the dry
run's forecast; a restart (chDB) keeps the declared durations and learns the finished running times
from the stored events.

The clock is driven explicitly. With declared durations and too few finished ones to know how they
compare with what was declared, a forecast draws the declared running time as it is, so the
figures below are exact: the forecast of a workload behind two 600 s runners started at T + 2 is
T + 602."""
from __future__ import annotations

import asyncio
import datetime as dt
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from accounting.queues import parse_queue_config
from gpuq.settings import CollectorSettings, KubernetesTarget, Settings, load_settings
from gpuq.timefmt import iso
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.actuators.k8s_workloads import KubernetesWorkloadSource, submit_seconds
from scheduler.api import create_app
from scheduler.cli import WORKLOAD_COLUMNS, eta_text, explain_text, workload_row
from scheduler.model import Workload
from scheduler.service import SchedulerService
from scheduler.service.replay import read_restart
from scheduler.service.sources import sync_listed
from scheduler.snapshot import Settings as CoreSettings
from scheduler.testing import nodes
from tests.k8s_api_server import ApiServer, load

QUEUES = {"a": {"guaranteed": {"gpu": 16}, "max": {"gpu": 16}}, "b": {"guaranteed": {"gpu": 0}, "max": {"gpu": 16}}}
TOKENS = [{"token": "op-t", "role": "operator", "name": "otto", "namespaces": ["*"], "queues": ["*"]}]
T = 1_800_000_000.0


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Api:
    """The real app through ASGI (no server, no thread), with the operator's token."""

    def __init__(self, svc: SchedulerService, clock: Clock) -> None:
        self.app = create_app(svc, None, load_settings(None, api={"tokens": TOKENS}), clock=clock)
        self.clock = clock

    def __call__(self, method: str, url: str, at: float | None = None, **kw: Any) -> httpx.Response:
        if at is not None:
            self.clock.t = at

        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                headers = {**kw.pop("headers", {}), "Authorization": "Bearer op-t"}
                return await c.request(method, url, headers=headers, **kw)
        return asyncio.run(go())

    def submit(self, wid: str, at: float, **body: Any) -> dict[str, Any]:
        r = self("POST", "/workloads", at, json={"id": wid, "queue": "a", "gpus_per_pod": 8, **body})
        assert r.status_code == 201, r.text
        return dict(r.json())

    def get(self, url: str) -> Any:
        r = self("GET", url)
        assert r.status_code == 200, r.text
        return r.json()


def make(sink: Any = None) -> SchedulerService:
    return SchedulerService(parse_queue_config({"queues": QUEUES}), DryRunActuator(),
                            nodes=nodes(("h", "H100", 8, 2)), settings=CoreSettings(True, 30.0), sink=sink,
                            cluster="c1", sleep=lambda _s: None)


def served() -> tuple[SchedulerService, Api]:
    svc = make()
    return svc, Api(svc, Clock(T))


def seconds(text: str) -> float:
    return dt.datetime.fromisoformat(text).timestamp()


def etas(api: Api) -> dict[str, tuple[float, float, float] | None]:
    return {w["id"]: None if w["eta"] is None else tuple(seconds(w["eta"][k]) for k in ("p10", "p50", "p90"))
            for w in api.get("/workloads")}


def test_a_fifo_backlog_gets_ordered_forecasts_and_running_work_none() -> None:
    """Eight 8-GPU workloads in one queue on 16 GPUs, nothing finished yet (the forecasts' prior):
    two run, six wait; each waiting one has a forecast, later positions no earlier."""
    svc, api = served()
    for i in range(8):
        api.submit(f"w{i}", T + i)
    assert all(w["eta"] is None for w in api.get("/workloads"))       # not forecast yet
    svc.cycle(T + 10)
    assert svc.forecasts.refresh(T + 11) == 6
    got = etas(api)
    views = {w["id"]: w for w in api.get("/workloads")}
    assert {wid for wid, v in views.items() if v["state"] == "running"} == {"w0", "w1"}
    assert got["w0"] is None and got["w1"] is None
    by_position = sorted((views[wid]["position"], e) for wid, e in got.items() if e is not None)
    assert [p for p, _ in by_position] == [1, 2, 3, 4, 5, 6]
    for _, (p10, p50, p90) in by_position:
        assert T + 10 <= p10 <= p50 <= p90
    p50s = [e[1] for _, e in by_position]
    assert p50s == sorted(p50s) and p50s[-1] > p50s[0]
    one = api.get("/workloads/w5")
    assert one["eta"] == views["w5"]["eta"] and one["eta"]["at"] == iso(T + 11)
    status = api.get("/forecasts/accuracy")
    assert (status["refreshed_at"], status["forecasts"], status["queues"]) == (iso(T + 11), 6, [])


def behind(expected: float | None) -> tuple[SchedulerService, Api]:
    """Two 8-GPU runners declared to run ``expected`` seconds, started at T + 2 (the first for 900 s,
    the second for 600 s, finishing by themselves), p1 and p2 waiting behind them since T + 1."""
    svc, api = served()
    declared = {} if expected is None else {"expected_duration": expected}
    api.submit("r1", T, duration=900, **declared)
    api.submit("r2", T, duration=600, **declared)
    api.submit("p1", T + 1)
    api.submit("p2", T + 1.5)
    svc.cycle(T + 2)
    svc.forecasts.refresh(T + 3)
    return svc, api


def test_a_declared_running_time_moves_the_forecasts_behind_it() -> None:
    short, long = behind(600.0)[1], behind(36_000.0)[1]
    assert etas(short)["p1"] == (T + 602, T + 602, T + 602)          # the declared time, as it is
    assert etas(long)["p1"] == (T + 36_002, T + 36_002, T + 36_002)
    assert long.get("/workloads/r1")["expected_duration_s"] == 36_000.0
    for bad in ("0", "-5", '"1h"', "NaN", "1e30"):
        r = long("POST", "/workloads", content=f'{{"id": "x", "queue": "a", "expected_duration": {bad}}}',
                 headers={"Content-Type": "application/json"})
        assert r.status_code == 422 and "body.expected_duration" in r.text, r.text


def test_a_start_is_scored_against_its_forecasts() -> None:
    """p1 starts when r2 ends, at T + 602 as forecast; p2 when r1 ends, at T + 902, 300 s after its
    forecast (r1 ran 900 s, declared 600)."""
    svc, api = behind(600.0)
    assert etas(api)["p2"] == (T + 602, T + 602, T + 602)
    svc.cycle(T + 602)
    assert api.get("/workloads/p1")["state"] == "running" and api.get("/workloads/p1")["eta"] is None
    svc.cycle(T + 902)
    assert api.get("/workloads/p2")["start_s"] == T + 902
    status = api.get("/forecasts/accuracy")
    assert status["learnt"] == 2                                      # r1 and r2 finished
    rel_p2 = 300 / (902 - 1.5)
    want = {"starts": 2, "inside_interval": 0.5, "median_error_s": 150.0, "scored_since_start": 2}
    assert [r["queue"] for r in status["queues"]] == ["a", "a"]
    for row in status["queues"]:
        assert {k: row[k] for k in want} == want, row
        assert row["median_relative_error"] == pytest.approx(rel_p2 / 2)
    assert {r["forecast"] for r in status["queues"]} == {"latest", "submit"}
    text = api("GET", "/metrics").text
    for line in ('gpuq_forecast_starts_total{forecast="latest",queue="a"} 2.0',
                 'gpuq_forecast_interval_hits_total{forecast="latest",queue="a"} 1.0',
                 'gpuq_forecast_start_error_seconds_bucket{forecast="latest",le="30.0"} 1.0',
                 'gpuq_forecast_start_error_seconds_bucket{forecast="latest",le="60.0"} 1.0',
                 'gpuq_forecast_start_error_seconds_bucket{forecast="latest",le="300.0"} 2.0',
                 'gpuq_forecast_start_error_seconds_sum{forecast="latest"} 300.0',
                 'gpuq_forecast_error_seconds_total{forecast="latest",queue="a"} 300.0',
                 'gpuq_forecast_starts_total{forecast="submit",queue="a"} 2.0'):
        assert line in text, line
    (last,) = [x for x in text.splitlines() if x.startswith("gpuq_forecast_last_refresh_timestamp_seconds ")]
    assert float(last.split()[1]) == T + 3


def test_forecasting_holds_no_service_lock_and_drops_what_changed_meanwhile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle runs while a refresh forecasts (in another thread, so it would wait for a lock the
    refresh held): it admits p1, whose forecast from the refresh's snapshot is then dropped."""
    svc, _ = behind(600.0)
    real = svc.forecasts._refresh.forecast

    def with_a_cycle_meanwhile(*args: Any, **kw: Any) -> Any:
        got = real(*args, **kw)
        cycle = threading.Thread(target=svc.cycle, args=(T + 602,))
        cycle.start()
        cycle.join(10)
        assert not cycle.is_alive(), "the cycle waited for the forecast"
        return got

    monkeypatch.setattr(svc.forecasts._refresh, "forecast", with_a_cycle_meanwhile)
    svc.forecasts.refresh(T + 500)
    assert svc.state_of("p1") == "running" and svc.forecasts.forecast_of("p1") is None
    p2 = svc.forecasts.forecast_of("p2")
    assert p2 is not None and p2.made_s == T + 500


def test_the_loop_refreshes_soon_after_a_submit_and_stops() -> None:
    svc, api = served()
    stop = threading.Event()
    loop = threading.Thread(target=svc.forecasts.serve, args=(stop, api.clock, 3600.0, 0.01))
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while svc.forecasts.refreshes < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        for i in range(3):
            api.submit(f"w{i}", T + i)
        while api.get("/workloads/w2")["eta"] is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert api.get("/workloads/w2")["eta"] is not None        # well before its hour
    finally:
        stop.set()
        svc.forecasts.wake()
        loop.join(10)
    assert not loop.is_alive()


def test_the_forecast_as_people_say_it() -> None:
    """The interval is said when it has one; a forecast already passed says "any moment now"."""
    def eta(p10: float, p50: float, p90: float) -> dict[str, str]:
        return {"p10": iso(T + p10), "p50": iso(T + p50), "p90": iso(T + p90)}

    assert eta_text(eta(300, 720, 1500), now=T) == "expected to start in about 12 min (80 % between 5 min and 25 min)"
    assert eta_text(eta(-60, 600, 600), now=T) == "expected to start in about 10 min (80 % between 0 s and 10 min)"
    assert eta_text(eta(600, 600, 600), now=T) == "expected to start in about 10 min"
    assert eta_text(eta(-60, -5, 40), now=T) == "expected to start any moment now (80 % by 40 s from now)"
    assert eta_text(eta(-60, -30, -5), now=T).startswith("expected to start any moment now (forecast for ")


def test_explain_and_the_workloads_table_say_when() -> None:
    _, api = behind(600.0)
    w = api.get("/workloads/p2")
    text = explain_text(w, now=T + 3)
    assert "expected to start in about 10 min, position 2 in a" in text
    assert workload_row(w)[WORKLOAD_COLUMNS.index("eta")] == iso(T + 602)
    running = api.get("/workloads/r1")
    assert workload_row(running)[WORKLOAD_COLUMNS.index("eta")] is None
    assert "expected to start" not in explain_text(running, now=T + 3)
    assert "no start-time forecast yet" in explain_text({**w, "eta": None}, now=T + 3)


def test_the_dry_run_answers_with_its_forecast() -> None:
    svc, api = behind(600.0)
    before = [w["id"] for w in api.get("/workloads")]
    r = api("POST", "/dry-run", T + 4, json={"queue": "a", "gpus_per_pod": 8, "expected_duration": 60})
    assert r.status_code == 200, r.text
    d = r.json()
    assert d["outcome"] == "pending" and d["position"] == 3
    # behind p1 and p2, which start at T + 602 and run (the prior: nothing of their kind finished)
    p10, p50, p90 = (seconds(d["eta"][k]) for k in ("p10", "p50", "p90"))
    assert T + 602 < p10 <= p50 <= p90 and d["eta"]["at"] == iso(T + 4)
    never = api("POST", "/dry-run", json={"queue": "a", "gpus_per_pod": 8, "pods": 3}).json()
    assert (never["outcome"], never["eta"]) == ("reject", None)
    assert [w["id"] for w in api.get("/workloads")] == before               # nothing submitted


# -- the Kubernetes annotation -------------------------------------------------------------------------
def job(name: str, expected: str | None) -> dict[str, Any]:
    """A suspended RayJob of 2 x 8 GPUs in team-a, queue a, declaring ``expected`` (KubeRay's sample)."""
    obj = load("rayjob-train-llm.json")
    notes = {} if expected is None else {"gpuq.io/expected-duration": expected}
    obj["metadata"].update(name=name, uid=f"uid-{name}", labels={"queue": "a"}, annotations=notes)
    return obj


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[tuple[ApiServer, KubernetesWorkloadSource]]:
    with ApiServer([job("a-long", "10m"), job("b-waits", None), job("c-bad", "soon")]) as server:
        settings = Settings(collector=CollectorSettings(kubernetes=[
            KubernetesTarget(cluster="test", kubeconfig=str(server.kubeconfig(tmp_path / "kubeconfig")))]))
        source = KubernetesWorkloadSource(settings, node_labels={})
        try:
            yield server, source
        finally:
            source.close()


def test_the_expected_duration_annotation(k8s: tuple[ApiServer, KubernetesWorkloadSource]) -> None:
    """``10m`` then ``2h30m`` on the RayJob that runs: the one behind it is forecast to start 600 s,
    then 9000 s after; ``soon`` is no duration: scheduled without one, told by one Event."""
    server, source = k8s
    t0 = submit_seconds(job("a-long", None)["metadata"]["creationTimestamp"]) + 100

    def forecast_behind() -> float:
        svc = make()
        sync_listed(svc, source, t0)
        svc.cycle(t0 + 1)
        assert svc.state_of("rayjob/team-a/a-long") == "running"
        svc.forecasts.refresh(t0 + 2)
        eta = svc.explain("rayjob/team-a/b-waits").eta
        assert eta is not None
        return seconds(eta["p50"])

    assert forecast_behind() == t0 + 1 + 600
    server.put(job("a-long", "2h30m"))
    assert forecast_behind() == t0 + 1 + 9000
    svc = make()
    sync_listed(svc, source, t0)
    bad = svc.explain("rayjob/team-a/c-bad")
    assert (bad.state, bad.expected_duration_s) == ("pending", None)
    assert svc.explain("rayjob/team-a/a-long").expected_duration_s == 9000.0
    events = [e for e in server.events("team-a") if e["reason"] == "BadAnnotation"]
    assert len(events) == 1                                           # told once over three syncs
    (event,) = events
    assert event["involvedObject"]["name"] == "c-bad" and event["type"] == "Warning"
    assert event["message"].startswith("annotation gpuq.io/expected-duration: 'soon' is neither seconds "
                                       "nor a Go duration like 2h30m")


# -- a restart ------------------------------------------------------------------------------------------
def test_a_restart_keeps_declared_durations_and_learns_the_history(store: Any, tmp_path: Path) -> None:
    from gpuq.store.writer import BatchWriter

    t0 = float(int(dt.datetime.now(dt.UTC).timestamp()) // 3600 * 3600)   # stored rows: recent (TTL)
    writer = BatchWriter(store, tmp_path / "spill")
    first = make(sink=writer)
    for i, ran in enumerate((300.0, 500.0, 700.0)):                      # three finish: a history
        first.submit(Workload(f"f{i}", "b", gpus_per_pod=8, submit_s=t0, duration_s=ran), Target(), t0)
    for t in (1, 301, 501):                            # f0, f1 run from t0 + 1; f2 from t0 + 301
        first.cycle(t0 + t)
    first.submit(Workload("r", "a", pods=2, gpus_per_pod=8, submit_s=t0 + 1000, expected_duration_s=1200.0),
                 Target(), t0 + 1000)
    first.submit(Workload("p", "a", gpus_per_pod=8, submit_s=t0 + 1000.5, expected_duration_s=60.0),
                 Target(), t0 + 1000.5)
    first.cycle(t0 + 1001)                             # f2 ends; r starts; p waits behind it
    assert first.state_of("r") == "running" and first.state_of("p") == "pending"
    writer.flush()

    second = make(sink=writer)
    second.restore(read_restart(store, "c1"))
    assert second.explain("r").expected_duration_s == 1200.0 and second.explain("p").expected_duration_s == 60.0
    assert first.forecasts.observed == second.forecasts.observed == 3
    first.forecasts.refresh(t0 + 1002)
    second.forecasts.refresh(t0 + 1002)
    assert second.explain("p").eta == first.explain("p").eta
    assert second.explain("p").eta == {"p10": iso(t0 + 2201), "p50": iso(t0 + 2201), "p90": iso(t0 + 2201),
                                       "at": iso(t0 + 1002)}
    writer.close()
