"""The alert rules, checked and unit-tested by Prometheus' own promtool (Debian's prometheus)."""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

ALERTS = REPO / "alerts"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool not installed: `make test` installs Debian's prometheus package (needs root)")


@needs_promtool
def test_rules_are_valid() -> None:
    r = subprocess.run([PROMTOOL, "check", "rules", str(ALERTS / "gpuq.rules.yml")],  # type: ignore[list-item]
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_rule_unit_tests_pass() -> None:
    r = subprocess.run([PROMTOOL, "test", "rules", "tests.yml"], cwd=ALERTS,  # type: ignore[list-item]
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_has_a_unit_test_and_a_description() -> None:
    rules = yaml.safe_load((ALERTS / "gpuq.rules.yml").read_text())
    alerts = {r["alert"]: r for g in rules["groups"] for r in g["rules"] if "alert" in r}
    tested = set(re.findall(r"alertname: (\w+)", (ALERTS / "tests.yml").read_text()))
    assert set(alerts) <= tested, f"alerts without a promtool test: {set(alerts) - tested}"
    for name, rule in alerts.items():
        assert rule["annotations"].get("description"), name
        assert rule["labels"].get("severity") in {"critical", "warning", "info"}, name


def test_alerts_use_metrics_gpuq_exports() -> None:
    """A renamed gauge would silently disable an alert: every gpuq_* name in the rules must be
    exported by the collector or the accounting."""
    text = (ALERTS / "gpuq.rules.yml").read_text()
    used = set(re.findall(r"\b(gpuq_[a-z_]+)", text))
    sources = "".join(p.read_text() for p in [*REPO.glob("collector/*.py"), *REPO.glob("accounting/*.py")])
    for name in used:
        base = name.removesuffix("_total")
        assert f'"{base}"' in sources or f'"{name}"' in sources, f"{name} is not exported anywhere"
