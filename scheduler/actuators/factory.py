"""``make_actuator(settings) -> Actuator``: the actuator named by ``scheduler.actuator``.

``dry-run`` needs nothing; ``kubernetes`` and ``ray`` are imported only when chosen (their
clients are heavy), as ``scheduler.actuators.kubernetes.KubernetesActuator(settings)`` and
``scheduler.actuators.ray.RayActuator(settings)``. ``fence`` (leader election) goes to the actuators
that send requests; the dry-run actuator sends none (the service's retries ask the fence all the same).
"""
from __future__ import annotations

import importlib
from typing import Any

from gpuq.errors import ConfigError
from scheduler.actuators.base import Actuator, DryRunActuator, Fence

_LAZY = {"kubernetes": ("scheduler.actuators.kubernetes", "KubernetesActuator"),
         "ray": ("scheduler.actuators.ray", "RayActuator")}


def make_actuator(settings: Any, fence: Fence | None = None) -> Actuator:
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
    actuator: Actuator = factory(settings, **_options(name, settings), fence=fence)
    return actuator


def _options(name: str, settings: Any) -> dict[str, Any]:
    """Constructor options from ``scheduler.kubernetes`` / ``scheduler.ray``."""
    sch = settings.scheduler
    common = {"attempts": sch.retry_attempts, "backoff_s": sch.retry_backoff_s}
    if name == "kubernetes":
        k = sch.kubernetes
        opts: dict[str, Any] = {**common, "node_label_key": k.node_label_key, "timeout_s": sch.actuator_timeout_s}
        if k.node_labels:
            opts["node_labels"] = dict(k.node_labels)
        if k.cluster is not None:
            match = [t for t in settings.collector.kubernetes if t.cluster == k.cluster]
            if not match:
                raise ConfigError("scheduler.kubernetes.cluster",
                                  f"no collector.kubernetes target has cluster {k.cluster!r}")
            opts["target"] = match[0]
        return opts
    r = sch.ray
    opts = {**common, "timeout_s": r.timeout_s, "pin_accelerator_type": r.pin_accelerator_type}
    if r.dashboard_url:
        opts["dashboard"] = r.dashboard_url
    if r.accelerator_resources:
        opts["accelerator_resources"] = dict(r.accelerator_resources)
    return opts
