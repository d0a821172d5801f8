"""Issue 20, a full run: ``gpuq serve`` (a subprocess, ``queues_from: kueue``, the dry-run actuator)
collects from the Kubernetes replay server (tests/k8s_api_server.py's recording, with Kueue's
objects of tests/data/kueue/live_*.yaml: one Workload pending, one admitted), builds its queue
tree from Kueue's objects, and shows Kueue's Workloads with Kueue's reason and gpuq's advice in
``/queues``, ``/workloads``, ``gpuq explain`` (a subprocess) and the dashboards (``gpuq dashboard``
in headless Chromium, as tests/test_dashboards_browser.py); then Kueue admits the pending one and
its advice goes. gpuq acts on nothing: no RayJob or pod is ever written to."""
from __future__ import annotations

import copy
import csv
import io
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import die_with_parent, free_port, stop_processes
from tests.k8s_replay import ReplayServer, load
from tests.test_collector_kubernetes import LIST_RV
from tests.test_dashboards_browser import ARGS, CHROMIUM, DRAWN, _env, _wait

DATA = Path(__file__).parent / "data" / "kueue"
FLAVOR, CQ, LQ = yaml.safe_load_all((DATA / "live_cluster.yaml").read_text())
STATES = yaml.safe_load((DATA / "live_workload.yaml").read_text())
WID = "kueue/team-llm/rayjob-pretrain-7b-3f2a1"
ADMITTED = "kueue/team-llm/rayjob-finetune-1b-7c0d2"
VIEWER = "view-secret"


def workloads() -> tuple[dict[str, Any], dict[str, Any]]:
    """The recorded RayJob's Workload, pending; another RayJob's, admitted (its pods not seen yet)."""
    pending = copy.deepcopy(STATES["pending"])
    admitted = copy.deepcopy(STATES["pending"])
    admitted["metadata"].update(name="rayjob-finetune-1b-7c0d2", uid="5a0f0000-0000-4000-8000-00000000w002")
    admitted["metadata"]["ownerReferences"][0].update(name="finetune-1b", uid="7c1e2d3f-4a5b-4c6d-8e9f-0a1b2c3d4e02")
    admitted["status"] = copy.deepcopy(STATES["admitted"]["status"])
    return pending, admitted


def until(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except (httpx.HTTPError, KeyError, TypeError, StopIteration):
            got = None
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"not {what} after {timeout} s")
        time.sleep(0.2)


class Run:
    def __init__(self, server: ReplayServer, api: str, ui: str, cfg: Path, log: Path) -> None:
        self.server, self.api, self.ui, self.cfg, self.log = server, api, ui, cfg, log
        self.client = httpx.Client(base_url=api, headers={"Authorization": f"Bearer {VIEWER}"}, timeout=5)

    def get(self, path: str) -> Any:
        r = self.client.get(path)
        r.raise_for_status()
        return r.json()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    tmp = tmp_path_factory.mktemp("kueue-serve")
    pods, nodes, kuberay = load("pods.json")["items"], load("nodes.json")["items"], load("kuberay.json")
    objects = {"resourceflavors": [FLAVOR], "clusterqueues": [CQ], "localqueues": [LQ], "workloads": [*workloads()]}
    api_port, ui_port = free_port(), free_port()
    with ReplayServer([*pods, *kuberay["pods"]], nodes, resource_version=int(LIST_RV), rayclusters=kuberay["rayclusters"],
                      rayjobs=kuberay["rayjobs"], kueue=objects) as server:
        cfg = tmp / "gpuq.yaml"
        cfg.write_text(yaml.safe_dump({
            "store": {"dsn": f"chdb://{tmp / 'data'}", "spill_dir": str(tmp / "spill"), "batch_interval_s": 0.3},
            "queues_from": "kueue",
            "scheduler": {"actuator": "dry-run", "cycle_interval_s": 0.5},
            "accounting": {"interval_s": 1},
            "collector": {"metrics_port": 0, "kubernetes": [
                {"cluster": "prod", "kubeconfig": str(server.kubeconfig(tmp / "kubeconfig"))}]},
            "api": {"host": "127.0.0.1", "port": api_port, "tokens": [
                {"token": VIEWER, "role": "viewer", "name": "dashboards"}]},
            "dashboard": {"api_url": f"http://127.0.0.1:{api_port}", "token": VIEWER, "port": ui_port,
                          "refresh_s": 60, "cache_ttl_s": 1},
        }))
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for name in ("serve", "dashboard"):
                with open(tmp / f"{name}.log", "ab") as out:
                    procs.append(subprocess.Popen([sys.executable, "-m", "gpuq.cli", name, "--config", str(cfg)],
                                                  cwd=tmp, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                                  preexec_fn=die_with_parent))
            _wait(f"http://127.0.0.1:{api_port}/readyz", procs[0], tmp / "serve.log")
            yield Run(server, f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{ui_port}", cfg, tmp / "serve.log")
        finally:
            stop_processes(procs)
    assert procs[0].returncode == 0, (tmp / "serve.log").read_text()[-3000:]    # a clean stop on SIGTERM


def table(page: Any, frame: Any) -> list[dict[str, str]]:
    """A dashboard table's rows as the page's "Download as CSV" gives them (the cells are drawn on
    a canvas; the download is what the page holds)."""
    page.evaluate("() => { window.showSaveFilePicker = undefined; }")      # the plain download, no dialog
    frame.scroll_into_view_if_needed()
    frame.hover()
    with page.expect_download(timeout=10_000) as dl:
        # the click as an event on the button: a pointer click at its place can land on the grid's
        # scroller, drawn over the toolbar while the table settles (seen once in a full run)
        frame.get_by_role("button", name="Download as CSV").dispatch_event("click")
    text = Path(dl.value.path()).read_text(encoding="utf-8-sig")
    return list(csv.DictReader(io.StringIO(text)))


def drawn(page: Any, path: str, title: str) -> None:
    page.get_by_role("heading", name=title, exact=True).wait_for(timeout=20_000)
    page.locator('[data-testid="stDataFrame"]').first.wait_for(timeout=20_000)
    page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=20_000)
    page.wait_for_function(DRAWN, timeout=20_000)
    assert not page.locator('[data-testid="stException"]').all_inner_texts(), path
    assert not page.locator('[data-testid="stAlertContentError"]').all_inner_texts(), path


@pytest.mark.timeout(90)
def test_the_dashboards_show_kueues_workloads_with_its_reason_and_gpuqs_advice(run: Run, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    # (before the tree from Kueue is in, the advice says its queue is no leaf yet: wait past that)
    advice = until("advised", lambda: (a := run.get(f"/workloads/{WID}")["advice"]) and a["outcome"] != "none" and a)
    until("the admitted one shown", lambda: run.get(f"/workloads/{ADMITTED}")["state"] == "running")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1600, "height": 900}, accept_downloads=True)
            page.goto(f"{run.ui}/scheduler?range=24h", wait_until="domcontentloaded")
            drawn(page, "scheduler", "Scheduler")
            page.screenshot(path=str(tmp_path / "kueue-scheduler.png"), full_page=True)
            (row,) = table(page, page.locator('[data-testid="stDataFrame"]').first)     # the pending workloads
            assert (row["id"], row["queue"], row["reason"]) == (WID, "llm", "kueue_Pending")
            assert row["message"].startswith("Kueue: couldn't assign flavors to pod set gpu-workers")
            assert row["gpuq would"] == advice["summary"].removeprefix("gpuq would ") and row["gpuq would"]

            page.goto(f"{run.ui}/queues?range=24h", wait_until="domcontentloaded")
            drawn(page, "queues", "Queues")
            pick = page.locator('[data-testid="stSelectbox"]').filter(has_text="Queue").last    # drill into llm
            pick.click()
            pick.locator("input").fill("llm")
            pick.locator("input").press("Enter")
            page.get_by_text("Workloads in llm and below").wait_for(timeout=20_000)
            page.wait_for_function(DRAWN, timeout=20_000)
            page.screenshot(path=str(tmp_path / "kueue-queues.png"), full_page=True)
            rows = {r["id"]: r for r in table(page, page.locator('[data-testid="stDataFrame"]').last)}
            assert set(rows) == {WID, ADMITTED}
            assert (rows[WID]["state"], rows[WID]["reason"], rows[WID]["gpuq would"]) == (
                "pending", "kueue_Pending", row["gpuq would"])
            assert (rows[ADMITTED]["state"], rows[ADMITTED]["GPUs"], rows[ADMITTED]["gpuq would"]) == ("running", "4", "–")   # (the dashboards' blank)
        finally:
            browser.close()


@pytest.mark.timeout(60)
def test_gpuq_serve_follows_kueue_and_advises_acting_on_nothing(run: Run) -> None:
    log = run.log.read_text()
    assert "queues_from: kueue: gpuq advises; Kueue acts" in log
    llm = until("the tree from Kueue", lambda: next(
        r for r in run.get("/queues") if (r["queue"], r["gpu_type"]) == ("llm", "*")))
    assert (llm["guaranteed"], llm["max"]) == (8, 8)                  # the ClusterQueue's nominalQuota
    view = until("advised", lambda: (v := run.get(f"/workloads/{WID}"))["advice"] and v)
    assert (view["state"], view["reason_code"], view["position"]) == ("pending", "kueue_Pending", 1)
    a = view["advice"]
    # the recorded A100 node is full (the recording's pods) and llm's flavor is a100 only: gpuq waits
    # too, and says why in its own words; it would not put the Workload on the MIG slices
    assert a["outcome"] == "wait" and a["reason_code"] and a["placement"] is None
    assert "a100" in a["message"]
    # gpuq's start-time forecast of it, as gpuq would run it (forward from the advisor's run)
    eta = until("forecast", lambda: run.get(f"/workloads/{WID}")["eta"])
    assert eta["p10"] <= eta["p50"] <= eta["p90"] and eta["p10"] > eta["at"]

    explain = subprocess.run([sys.executable, "-m", "gpuq.cli", "explain", WID, "--config", str(run.cfg)],
                             cwd=run.cfg.parent, env=_env(), capture_output=True, text=True, timeout=30, check=False)
    assert explain.returncode == 0, explain.stderr
    lines = explain.stdout.splitlines()
    assert lines[0].startswith(f"workload {WID} in queue llm: pending (")
    assert "reason: kueue_Pending" in lines
    assert f"gpuq would: wait: {a['reason_code']}: {a['message']} (position 1)" in lines
    assert any(line.startswith("gpuq's forecast (gpuq's policy, Kueue's quotas): expected to start")
               and line.endswith(", position 1 in llm") for line in lines), lines

    # Kueue admits it: running, no advice
    admitted = copy.deepcopy(STATES["pending"])
    admitted["status"] = copy.deepcopy(STATES["admitted"]["status"])
    run.server.modify("workloads", admitted)
    until("admitted", lambda: run.get(f"/workloads/{WID}")["state"] == "running")
    assert run.get(f"/workloads/{WID}")["advice"] is None
    # gpuq acted on nothing: every request to the API server was a read
    assert {r.method for r in list(run.server.requests)} == {"GET"}
