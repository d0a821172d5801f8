"""Actuators: carry the scheduler's decisions out (see :mod:`scheduler.actuators.base`)."""
from scheduler.actuators.base import Action, ActionResult, Actuator, DryRunActuator, Target, with_retries

__all__ = ["Action", "ActionResult", "Actuator", "DryRunActuator", "Target", "with_retries"]
