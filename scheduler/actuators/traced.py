"""An actuator whose every call is a span (``actuator.admit``, ``actuator.preempt``,
``actuator.cancel``) with the workload, its queue, the target and the outcome; everything else
goes to the wrapped actuator unchanged. ``gpuq serve`` wraps its actuator in one when spans go
somewhere (``collector.otel_exporter``)."""
from __future__ import annotations

from typing import Any

from opentelemetry.trace import Status, StatusCode

from scheduler.actuators.base import ActionResult, Target
from scheduler.model import Placement, Workload


class TracedActuator:
    def __init__(self, inner: Any, tracer: Any) -> None:
        self.inner, self.tracer = inner, tracer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def name(self) -> str:
        return str(self.inner.name)

    def _traced(self, verb: str, workload: Workload, target: Target, call: Any, **attrs: Any) -> ActionResult:
        target_name = f"{target.kind}/{target.namespace}/{target.name}".strip("/") if target.kind else ""
        with self.tracer.start_as_current_span(f"actuator.{verb}", attributes={
                "gpuq.actuator": self.name, "gpuq.workload": workload.id, "gpuq.queue": workload.queue,
                "gpuq.target": target_name, **attrs}) as span:
            try:
                result: ActionResult = call()
            except Exception as exc:
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
                raise
            span.set_attribute("gpuq.ok", result.ok)
            if not result.ok:
                span.set_attribute("gpuq.retryable", result.retryable)
                span.set_status(Status(StatusCode.ERROR, result.message[:200]))
            return result

    def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        nodes = ",".join(f"{n}:{g}" for n, g in placement.as_dict().items())
        return self._traced("admit", workload, target, lambda: self.inner.admit(workload, target, placement),
                            **{"gpuq.gpu_type": placement.gpu_type, "gpuq.nodes": nodes})

    def preempt(self, workload: Workload, target: Target, reason: str) -> ActionResult:
        return self._traced("preempt", workload, target, lambda: self.inner.preempt(workload, target, reason),
                            **{"gpuq.reason": reason[:200]})

    def cancel(self, workload: Workload, target: Target) -> ActionResult:
        return self._traced("cancel", workload, target, lambda: self.inner.cancel(workload, target))
