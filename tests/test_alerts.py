"""The alert rules, checked and unit-tested by Prometheus' own promtool (Debian's prometheus), the
example Alertmanager route checked by amtool (Debian's prometheus-alertmanager), the runbooks, and
the PrometheusRule rendering kept in step with the rules. A missing promtool or amtool fails these
tests: `make test` installs both (as root)."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import DATA, REPO

ALERTS = REPO / "alerts"
RULES = ALERTS / "gpuq.rules.yml"
ROUTE = ALERTS / "alertmanager.example.yml"
RUNBOOKS = REPO / "docs" / "runbooks"
RUNBOOK_BASE = "https://github.com/gpuq/gpuq/blob/main/docs/runbooks/"
TEST_FILES = sorted(ALERTS.glob("tests*.yml"))
DCGM_PAGE = DATA / "dcgm" / "datadog-integrations-core-metrics.txt"     # a real dcgm-exporter page


def tool(name: str, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: the alert checks need it. Install Debian's {package} "
                    f"(`apt-get install {package}` as root; `make test` does it when run as root)",
                    pytrace=False)
    return path


def run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=120)


def alerts() -> dict[str, dict[str, Any]]:
    rules = yaml.safe_load(RULES.read_text())
    return {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}


# -- promtool ------------------------------------------------------------------------------------
def test_rules_are_valid() -> None:
    r = run(tool("promtool", "prometheus"), "check", "rules", str(RULES))
    assert r.returncode == 0, r.stdout + r.stderr


def test_rule_unit_tests_pass() -> None:
    assert len(TEST_FILES) >= 3
    r = run(tool("promtool", "prometheus"), "test", "rules", *(p.name for p in TEST_FILES), cwd=ALERTS)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_is_tested_firing_and_not_firing() -> None:
    """Each alert has a promtool case expecting it and one expecting nothing at some time."""
    firing: set[str] = set()
    silent: set[str] = set()
    for path in TEST_FILES:
        for group in yaml.safe_load(path.read_text())["tests"]:
            for case in group.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else silent).add(case["alertname"])
    names = set(alerts())
    assert names <= firing, f"alerts never tested firing: {sorted(names - firing)}"
    assert names <= silent, f"alerts never tested not firing: {sorted(names - silent)}"


def test_every_alert_has_severity_summary_description_and_a_runbook() -> None:
    for name, rule in alerts().items():
        ann = rule["annotations"]
        assert rule["labels"].get("severity") in {"critical", "warning", "info"}, name
        assert ann.get("summary") and ann.get("description"), name
        assert ann.get("runbook_url") == f"{RUNBOOK_BASE}{name}.md", name
        book = RUNBOOKS / f"{name}.md"
        assert book.exists(), f"{name}: no runbook at {book.relative_to(REPO)}"
        text = book.read_text()
        for heading in ("## What it means", "## How to check", "## What to do"):
            assert heading in text, f"{book.relative_to(REPO)} lacks {heading!r}"
    books = {p.stem for p in RUNBOOKS.glob("*.md")} - {"README"}
    assert books <= set(alerts()), f"runbooks for no alert: {sorted(books - set(alerts()))}"


def test_alerts_table_lists_every_alert() -> None:
    table = (REPO / "docs" / "ALERTS.md").read_text()
    for name, rule in alerts().items():
        row = next((line for line in table.splitlines() if line.startswith(f"| {name} ")), None)
        assert row is not None, f"docs/ALERTS.md has no row for {name}"
        assert rule["labels"]["severity"] in row and f"runbooks/{name}.md" in row, row


def test_alerts_use_metrics_gpuq_exports() -> None:
    """A renamed metric would silently disable an alert: every gpuq_* name in the rules is exported
    by the collector, the writer, the accounting or the scheduler (recording rules aside), and every
    DCGM field is one dcgm-exporter knows."""
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    recorded = {r["record"] for r in rules if "record" in r}
    text = "\n".join([r["expr"] for r in rules] + [v for r in rules for v in r.get("annotations", {}).values()])
    for name in recorded:
        text = text.replace(name, "")
    used = set(re.findall(r"\b(gpuq_[a-z_]+)", text))
    assert {"gpuq_scheduler_wait_seconds_bucket", "gpuq_accounting_queue_config_rejected"} <= used
    sources = "".join(p.read_text() for d in ("collector", "accounting", "scheduler", "gpuq/store")
                      for p in REPO.glob(f"{d}/**/*.py"))
    for name in used:
        base = re.sub(r"_(total|bucket|count|sum)$", "", name)
        assert f'"{base}"' in sources or f'"{name}"' in sources, f"{name} is not exported anywhere"
    page = DCGM_PAGE.read_text()
    for name in set(re.findall(r"\b(DCGM_FI_[A-Z_]+)", text)):
        # the newer name of the clock reasons field (DCGM 3.3+) is not on the recorded page
        assert f"# TYPE {name} " in page or name == "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", name


# -- amtool -----------------------------------------------------------------------------------------
def test_alertmanager_example_is_valid() -> None:
    r = run(tool("amtool", "prometheus-alertmanager"), "check-config", str(ROUTE))
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("labels,receiver", [
    (["severity=critical", "alertname=GpuqSchedulerStalled"], "gpuq-pager"),
    (["severity=warning", "alertname=GpuqQueueStarving", "queue=research.vision"], "gpuq-chat"),
    (["severity=info", "alertname=GpuqIdleAllocatedGpus"], "gpuq-info"),
], ids=["critical-pages", "warning-chat", "info"])
def test_alertmanager_routes_by_severity(labels: list[str], receiver: str) -> None:
    r = run(tool("amtool", "prometheus-alertmanager"), "config", "routes", "test", f"--config.file={ROUTE}",
            f"--verify.receivers={receiver}", *labels)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_severity_of_the_rules_has_a_route() -> None:
    route = yaml.safe_load(ROUTE.read_text())["route"]
    routed = {m.split("=", 1)[1].strip('"') for r in route["routes"] for m in r["matchers"]}
    assert {r["labels"]["severity"] for r in alerts().values()} <= routed
    assert {"alertname", "queue", "cluster"} <= set(route["group_by"])


# -- the PrometheusRule --------------------------------------------------------------------------------
def test_prometheusrule_rendering_is_current() -> None:
    r = run(sys.executable, "alerts/render.py", "--check")
    assert r.returncode == 0, r.stderr


def test_prometheusrule_holds_the_same_valid_rules(tmp_path: Path) -> None:
    doc = yaml.safe_load((REPO / "deploy/helm/gpuq/files/prometheusrule.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert doc["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]
    (tmp_path / "rules.yml").write_text(yaml.safe_dump({"groups": doc["spec"]["groups"]}))
    r = run(tool("promtool", "prometheus"), "check", "rules", str(tmp_path / "rules.yml"))
    assert r.returncode == 0, r.stdout + r.stderr
