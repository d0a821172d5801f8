"""``make_actuator(settings) -> Actuator``: the actuator named by ``scheduler.actuator``.

``dry-run`` needs nothing; ``kubernetes`` and ``ray`` are imported only when chosen (their
clients are heavy), as ``scheduler.actuators.kubernetes.KubernetesActuator(settings)`` and
``scheduler.actuators.ray.RayActuator(settings)``.
"""
from __future__ import annotations

import importlib
from typing import Any

from gpuq.errors import ConfigError
from scheduler.actuators.base import Actuator, DryRunActuator

_LAZY = {"kubernetes": ("scheduler.actuators.kubernetes", "KubernetesActuator"),
         "ray": ("scheduler.actuators.ray", "RayActuator")}


def make_actuator(settings: Any) -> Actuator:
    """``settings``: the gpuq settings tree. Raises ConfigError for an unknown or unavailable one."""
    name = settings.scheduler.actuator
    if name == "dry-run":
        return DryRunActuator()
    if name not in _LAZY:
        raise ConfigError("scheduler.actuator", f"unknown actuator {name!r} (expected dry-run, kubernetes or ray)")
    module, cls = _LAZY[name]
    try:
        factory = getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as exc:
        raise ConfigError("scheduler.actuator", f"the {name} actuator is not available: {exc}") from exc
    actuator: Actuator = factory(settings)
    return actuator
