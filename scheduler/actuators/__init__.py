"""Actuators: carry the scheduler's decisions out (see :mod:`scheduler.actuators.base`)."""
from scheduler.actuators.base import (FENCED, Action, ActionResult, Actuator, DryRunActuator, Fence, Target, fenced,
                                      with_retries)

__all__ = ["FENCED", "Action", "ActionResult", "Actuator", "DryRunActuator", "Fence", "Target", "fenced",
           "with_retries"]
