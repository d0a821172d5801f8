"""Errors of the scheduler package.

Hierarchy::

    SchedulerError                  base; ``retryable`` says whether trying again can help
    ├── SnapshotError               a snapshot is inconsistent (duplicate node, unknown queue,
    │                               a workload in a non-leaf queue); fix the input, do not retry
    ├── ScenarioError               a simulator scenario is invalid; ``source`` names the file,
    │                               ``where`` the YAML path (``workloads[3].gpus_per_pod``)
    └── WhatifError                 a ``gpuq whatif`` argument is wrong (``argument`` names it:
                                    ``--add-nodes``) or its window holds nothing to replay

The core never raises for a workload that cannot run: that is a pending reason
(:class:`scheduler.model.ReasonCode`), not an error.
"""
from __future__ import annotations


class SchedulerError(Exception):
    retryable: bool = False


class SnapshotError(SchedulerError):
    """``where`` names the offending item (``workload v-1``, ``node h-0``)."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: {reason}")


class ScenarioError(SchedulerError):
    """``source`` is the scenario file (or ``<mapping>``), ``where`` the YAML path of the problem."""

    def __init__(self, where: str, reason: str, source: str = "<mapping>") -> None:
        self.source = source
        self.where = where
        self.reason = reason
        super().__init__(f"{source}: {where}: {reason}")


class WhatifError(SchedulerError):
    """``argument`` is the command-line argument at fault (``--remove-nodes``, ``--from``)."""

    def __init__(self, argument: str, reason: str) -> None:
        self.argument = argument
        self.reason = reason
        super().__init__(f"{argument}: {reason}")
