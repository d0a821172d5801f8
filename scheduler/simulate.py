"""``scheduler.simulate``: the simulator's public entry points (see :mod:`scheduler.simulator`)."""
from scheduler.simulator import (
    Scenario,
    SimResult,
    load_scenario,
    parse_scenario,
    run_scenario,
    write_outputs,
)

__all__ = ["Scenario", "SimResult", "load_scenario", "parse_scenario", "run_scenario", "write_outputs"]
