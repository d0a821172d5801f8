"""The dashboards in a real browser: `gpuq serve` on a seeded chDB store (the fleet of
tests/test_dashboards_apptest.py, seeded by a process of its own since chDB lets one process open a
path) and `gpuq dashboard` as subprocesses, every page loaded in headless Chromium (Playwright,
the system's /usr/bin/chromium; `make test` installs it). A page fails on an exception box or an
error message; screenshots go to the test's tmp_path. A share of one GPU (0.75 of an A100) is
admitted too: the idle page shows its decimals and names the partly filled cell of its node map.
The queue file sets an A100 worth 0.5 GPU-equivalents: the Queues page draws each queue's series in
GPUs and in GPU-equivalents side by side.
"""
from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import REPO, die_with_parent, free_port, stop_processes

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
PAGES = {"overview": "Overview", "queues": "Queues", "gpu-types": "GPU types", "idle": "Idle GPUs",
         "scheduler": "Scheduler", "cost": "Cost"}
DRAWN = """[...document.querySelectorAll('.vega-embed')].every(e => e.querySelector('canvas, svg'))
  && [...document.querySelectorAll('[data-testid="stDataFrame"]')].every(e => e.querySelector('canvas'))
  && !document.querySelector('[data-testid="stSkeleton"]')"""
VIEWER, OPERATOR = "view-secret", "op-secret"
_ports: list[int] = []          # the API's and the dashboard's, once the fixture has them
SEED = """
import sys
from gpuq.store import open_store
from tests.test_dashboards_apptest import seed
store = open_store(sys.argv[1])
seed(store)
store.close()
"""


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _wait(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        assert proc.poll() is None, f"exited ({proc.returncode}):\n{log.read_text()}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not up after {timeout} s:\n{log.read_text()}")


@pytest.fixture(scope="module")
def dashboard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if not Path(CHROMIUM).exists() and not shutil.which("chromium"):
        pytest.fail(f"{CHROMIUM} is missing: the browser test needs Debian's chromium (`make test` installs it; "
                    "or apt-get install -y chromium)")
    tmp = tmp_path_factory.mktemp("browser")
    from tests.accounting_helpers import BASE_QUEUES

    queues = copy.deepcopy(BASE_QUEUES)
    queues["gpu_types"]["A100"]["equivalent"] = 0.5          # GPU-equivalents beside GPUs (issue 19)
    (tmp / "queues.yaml").write_text(yaml.safe_dump(queues))
    api_port, ui_port = free_port(), free_port()
    _ports[:] = [api_port, ui_port]
    cfg = tmp / "gpuq.yaml"
    cfg.write_text(yaml.safe_dump({
        "store": {"dsn": f"chdb://{tmp / 'data'}", "spill_dir": str(tmp / "spill"), "batch_interval_s": 0.5},
        "queues_file": "queues.yaml",
        "scheduler": {"actuator": "dry-run", "cycle_interval_s": 0.5},
        "accounting": {"interval_s": 1},
        "collector": {"metrics_port": 0},
        "api": {"host": "127.0.0.1", "port": api_port, "tokens": [
            {"token": VIEWER, "role": "viewer", "name": "dashboards"},
            {"token": OPERATOR, "role": "operator", "name": "ci", "namespaces": ["*"], "queues": ["*"]}]},
        "dashboard": {"api_url": f"http://127.0.0.1:{api_port}", "token": VIEWER, "port": ui_port,
                      "refresh_s": 60, "cache_ttl_s": 2},
    }))
    seeded = subprocess.run([sys.executable, "-c", SEED, f"chdb://{tmp / 'data'}"], cwd=REPO, env=_env(),
                            capture_output=True, text=True, timeout=60, check=False)
    assert seeded.returncode == 0, seeded.stderr
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, argv in (("serve", ["serve"]), ("dashboard", ["dashboard"])):
            log = tmp / f"{name}.log"
            with open(log, "ab") as out:
                procs.append(subprocess.Popen([sys.executable, "-m", "gpuq.cli", *argv, "--config", str(cfg)],
                                              cwd=tmp, env=_env(), stdout=out, stderr=subprocess.STDOUT,
                                              preexec_fn=die_with_parent))
            if name == "serve":
                _wait(f"http://127.0.0.1:{api_port}/readyz", procs[-1], log)
                _submit(f"http://127.0.0.1:{api_port}")
        _wait(f"http://127.0.0.1:{ui_port}/_stcore/health", procs[-1], tmp / "dashboard.log")
        yield f"http://127.0.0.1:{ui_port}"
    finally:
        stop_processes(procs)


def _check_equivalents(page: Any, dashboard: str) -> None:
    """The API's series carries the equivalents (an A100 worth 0.5: research.nlp holds only A100s,
    research.vision only H100s), and the page draws them: the heading says so and the per-queue
    grid has a "GPU-equivalents" column beside the "GPUs" one."""
    api = dashboard.replace(str(_ports[1]), str(_ports[0]))
    series = httpx.get(f"{api}/accounting/series?from=-24h&step=1h",
                       headers={"Authorization": f"Bearer {VIEWER}"}, timeout=10).json()
    last = {p["queue"]: p for p in series if p["t"] == max(q["t"] for q in series)}
    assert last["research.nlp"]["allocated"] > 0, last
    assert last["research.nlp"]["allocated_eq"] == pytest.approx(last["research.nlp"]["allocated"] * 0.5)
    assert last["research.vision"]["allocated_eq"] == pytest.approx(last["research.vision"]["allocated"])
    page.get_by_text("in GPUs and in GPU-equivalents side by side").wait_for(timeout=5_000)
    # the caption comes before vega-embed has drawn the grid (seen under load): wait for the column
    page.locator(".vega-embed svg text", has_text="GPU-equivalents").first.wait_for(timeout=20_000)
    headers = page.locator(".vega-embed svg text").all_text_contents()
    assert "GPU-equivalents" in headers and "GPUs" in headers, headers


def _submit(api: str) -> None:
    """One workload admitted and one waiting, so the scheduler page has something to show, and a
    share of one A100 (0.75, admitted next to n1's 2 GPUs on a0: a0 holds 2.75)."""
    h = {"Authorization": f"Bearer {OPERATOR}"}
    for body in ({"id": "train-a", "queue": "prod", "gpus_per_pod": 8, "gpu_types": ["H100"]},
                 {"id": "train-b", "queue": "prod", "pods": 3, "gpus_per_pod": 8, "gpu_types": ["H100"]},
                 {"id": "share-a", "queue": "research.nlp", "gpus_per_pod": 0.75, "gpu_types": ["A100"]}):
        assert httpx.post(api + "/workloads", json=body, headers=h, timeout=10).status_code == 201
        time.sleep(1.2)


@pytest.mark.timeout(110)
def test_every_page_in_chromium(dashboard: str, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            for path, title in PAGES.items():
                page.goto(f"{dashboard}/{path}?range=24h", wait_until="domcontentloaded")
                page.get_by_role("heading", name=title, exact=True).wait_for(timeout=20_000)
                page.locator('[data-testid="stMetric"]').first.wait_for(timeout=20_000)
                page.wait_for_function("!document.querySelector('[data-testid=\"stStatusWidget\"]')", timeout=20_000)
                page.wait_for_function(DRAWN, timeout=20_000)      # every chart and table has drawn
                page.wait_for_timeout(500)
                page.screenshot(path=str(tmp_path / f"dashboard-{path}.png"))
                if path == "queues":        # GPU-equivalents: a column of charts beside the GPUs'
                    _check_equivalents(page, dashboard)
                if path == "idle":          # the share: a partly filled cell, and its decimals
                    page.get_by_text("a0 (A100) GPU 2: 0.75 busy").wait_for(timeout=5_000)
                    page.locator(".vega-embed").last.screenshot(path=str(tmp_path / "dashboard-idle-node-map.png"))
                    shown = page.locator('[data-testid="stMetric"]').all_inner_texts()
                    assert any("9.25 GPUs" in m for m in shown), shown       # free: 18 - 8 (train-a) - 0.75
                exceptions = page.locator('[data-testid="stException"]').all_inner_texts()
                errors = page.locator('[data-testid="stAlertContentError"]').all_inner_texts()
                if exceptions or errors:
                    problems.append(f"{path}: {exceptions + errors}")
                assert page.url.endswith(f"/{path}?range=24h"), page.url
            page.goto(f"{dashboard}/?range=7d", wait_until="domcontentloaded")     # the root goes to /overview
            page.get_by_role("heading", name="Overview", exact=True).wait_for(timeout=20_000)
            page.wait_for_url("**/overview?range=7d", timeout=10_000)
            page.get_by_role("link", name="Cost").click()                      # the links keep the range
            page.wait_for_url("**/cost?range=7d", timeout=10_000)
        finally:
            browser.close()
    assert not problems, "\n".join(problems)
