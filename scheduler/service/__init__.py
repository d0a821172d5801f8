"""The live service: ``gpuq serve``'s wiring in one place, apart from the scheduler's core.

* :mod:`.core`: :class:`SchedulerService`, the live scheduler (its state, the cycle over the pure
  core in :mod:`scheduler.cycle`, the events it records); :mod:`.views` what it shows,
  :mod:`.positions` pending positions, :mod:`.errors` its errors;
* :mod:`.acting`: actions outside the service lock, on workers; :mod:`.brakes`: pause and the
  preemption limit; :mod:`.dryrun`: what-if cycles;
* :mod:`.ledger`: the scheduler's side of the one ledger of allocations (admission rows,
  reconciliation); :mod:`.replay`: the restart state (``scheduler_state``) and the restore;
* :mod:`.accounting`: the live accounting the API and the scheduler share; :mod:`.dashboard`:
  the dashboards' views; :mod:`.metrics`: the service's Prometheus metrics;
* :mod:`.sources`: the world sync (suspended RayJobs in, ended Ray jobs out);
* :mod:`.leader` and :mod:`.standby`: leader election among replicas on a Lease;
* :mod:`.runtime`: ``gpuq serve`` itself: the store, the loops, the API, clean stops.

The core (:mod:`scheduler.cycle` and the modules it uses), the simulator, the actuators and the
API never import this package's wiring (import-linter contracts in ``pyproject.toml``); the API
takes a :class:`SchedulerService` it is given.
"""
from scheduler.service.core import SchedulerService

__all__ = ["SchedulerService"]
