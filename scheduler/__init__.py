"""gpuq's embedded preemption scheduler.

Pure core (no clock, ids or I/O inside): :func:`scheduler.cycle.schedule` maps a frozen
:class:`scheduler.snapshot.Snapshot` and ``now`` to :class:`scheduler.model.Decisions`.
Modules: ``model`` (values), ``snapshot`` (cluster tables, occupancy), ``quota`` (usage, max and
guarantee checks), ``ordering`` (fair share), ``placement`` (best-fit gangs), ``preemption``
(victims), ``reasons`` (messages), ``cycle`` (the script). ``simulator`` replays a scenario
through the same core; ``cli.simulate_main`` is ``gpuq simulate``.
"""
