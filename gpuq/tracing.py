"""Spans: where they go (``collector.otel_exporter``) and the tracers that make them.

``none`` (default) keeps no spans; ``console`` prints them; ``memory`` keeps them for tests; ``otlp``
sends them over OTLP/HTTP (protobuf) in batches. The OTLP exporter is configured by the standard
``OTEL_EXPORTER_OTLP_*`` variables (``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``..._TRACES_ENDPOINT``,
``..._HEADERS``, ``..._TIMEOUT``, ``..._CERTIFICATE``, ...) and the resource by ``OTEL_SERVICE_NAME``
and ``OTEL_RESOURCE_ATTRIBUTES``, all read by the OpenTelemetry SDK itself: the one place where
something other than :mod:`gpuq.settings` reads the environment, so that gpuq is configured like
every other OpenTelemetry program. Without ``OTEL_SERVICE_NAME`` the service is ``gpuq``.

The ``otlp`` provider is one per process (collectors, scheduler cycles and actuator calls share its
batches); :func:`shutdown` flushes it, and ``gpuq serve`` / ``gpuq collect`` call it when they stop.
"""
from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()
_shared: dict[str, Any] = {}          # kind -> TracerProvider (otlp only: one per process)


def _resource() -> Any:
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource

    resource = Resource.create()                       # OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: "gpuq"}))
    return resource


def provider(kind: str) -> tuple[Any, Any]:
    """``(TracerProvider, exporter)`` for ``kind``; the exporter is None for ``none``."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    if kind == "otlp":
        with _lock:
            if "otlp" not in _shared:
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                otlp = OTLPSpanExporter()                         # OTEL_EXPORTER_OTLP_* from the SDK
                p = TracerProvider(resource=_resource())
                p.add_span_processor(BatchSpanProcessor(otlp))
                _shared["otlp"] = (p, otlp)
            return _shared["otlp"]  # type: ignore[no-any-return]
    p = TracerProvider(resource=_resource())
    exporter: Any = None
    if kind == "console":
        exporter = ConsoleSpanExporter()
    elif kind == "memory":
        exporter = InMemorySpanExporter()
    elif kind != "none":
        raise ValueError(f"unknown span exporter {kind!r} (none, console, memory, otlp)")
    if exporter is not None:
        p.add_span_processor(SimpleSpanProcessor(exporter))
    return p, exporter


def tracer(kind: str, name: str) -> tuple[Any, Any]:
    """``(Tracer, exporter)`` named ``name`` (``gpuq.collector``, ``gpuq.scheduler``)."""
    p, exporter = provider(kind)
    return p.get_tracer(name), exporter


def shutdown(timeout_s: float = 5.0) -> None:
    """Send what the shared provider still holds and stop it (at process stop)."""
    with _lock:
        shared = _shared.pop("otlp", None)
    if shared is not None:
        p, _ = shared
        p.force_flush(int(timeout_s * 1000))
        p.shutdown()
