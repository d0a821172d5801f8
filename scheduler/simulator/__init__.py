"""The simulator: replay a scenario (docs/SCENARIOS.md) through the production core.

``run_scenario(scenario) -> SimResult`` takes a path, a parsed mapping or a :class:`Scenario`;
``write_outputs(result, out_dir)`` writes ``events.jsonl`` and ``summary.json``.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler.progress import Progress
from scheduler.simulator.engine import EtaOptions, simulate
from scheduler.simulator.report import SimResult, write_outputs
from scheduler.simulator.scenario import Scenario, load_scenario, parse_scenario

__all__ = ["EtaOptions", "Scenario", "SimResult", "load_scenario", "parse_scenario", "run_scenario", "write_outputs"]


def run_scenario(scenario: str | Path | Mapping[str, Any] | Scenario, progress: Progress | None = None,
                 eta: EtaOptions | None = None) -> SimResult:
    """``progress``: a :class:`scheduler.progress.Progress` to show how far the replay is; ``eta``:
    put start-time forecasts on the submit events (``gpuq simulate --eta``)."""
    if isinstance(scenario, Scenario):
        sc = scenario
    elif isinstance(scenario, Mapping):
        sc = parse_scenario(scenario)
    else:
        sc = load_scenario(scenario)
    return simulate(sc, progress=progress, eta=eta)
