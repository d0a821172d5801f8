"""``gpuq collect``: wires settings, store, writer, sources, metrics and signals together.

This is the I/O shell around :class:`collector.runner.CollectorRunner`. On SIGTERM or Ctrl-C it
stops the rounds and watchers, flushes the writer (spilling to disk if the store is down) and
closes the store, within seconds.
"""
from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from collector.health import CollectorMetrics
from collector.runner import CollectorRunner, spans_tracer
from collector.sources import StoreState, build_sources
from gpuq.errors import StoreError
from gpuq.settings import Settings
from gpuq.store import open_store
from gpuq.store.client import Store
from gpuq.store.writer import BatchWriter

log = logging.getLogger(__name__)


def make_writer(settings: Settings) -> tuple[BatchWriter, Store | None]:
    st = settings.store

    def factory() -> Store:
        return open_store(st.dsn, default_database=st.database, retention=st.retention, cluster=st.cluster)

    store: Store | None
    try:
        store = factory()
    except StoreError as exc:
        log.error("store unavailable at start (%s); collecting anyway, spilling to %s", exc, st.spill_dir)
        store = None
    writer = BatchWriter(store if store is not None else factory, st.spill_dir,
                         batch_rows=st.batch_rows, batch_interval_s=st.batch_interval_s,
                         retry_attempts=st.retry_attempts, retry_backoff_s=st.retry_backoff_s,
                         max_buffered_rows=st.max_buffered_rows)
    return writer, store


def install_stop_handlers(stop: threading.Event) -> dict[int, Any]:
    def handler(signum: int, frame: FrameType | None) -> None:
        log.info("received %s: stopping", signal.Signals(signum).name)
        stop.set()

    previous: dict[int, Any] = {}
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, handler)
    return previous


def run_collect(settings: Settings, once: bool = False, stop: threading.Event | None = None,
                registry: CollectorRegistry | None = None) -> int:
    """Collect until ``stop`` is set (or one round with ``once``). ``stop`` is set on return, so
    the watcher threads end: pass an event of your own. With ``registry`` the health metrics go
    there (``gpuq serve`` puts them on the API's ``/metrics``) and no metrics server is started."""
    stop = stop or threading.Event()
    cs = settings.collector
    writer, store = make_writer(settings)
    own_server = registry is None
    registry = registry or CollectorRegistry()
    metrics = CollectorMetrics(registry, writer)
    tracer, _ = spans_tracer(cs.otel_exporter)
    state = StoreState(lambda: writer.store)

    def on_watch_error(exc: Exception) -> None:
        log.warning("%s", exc)
        metrics.watch_errors.labels(type(exc).__name__).inc()

    targets, discoverers, watchers = build_sources(settings, state, on_watch_error)
    if not (targets or discoverers or watchers):
        log.warning("no sources configured: add collector.ray, collector.dcgm, collector.kubernetes "
                    "or collector.nvml to the config")
    runner = CollectorRunner(writer, metrics, tracer, targets=targets, discoverers=discoverers,
                             watchers=watchers, interval_s=cs.interval_s, timeout_s=cs.timeout_s,
                             jitter_s=0.0 if once else cs.jitter_s,
                             max_series_per_target=cs.max_series_per_target,
                             series_forget_rounds=cs.series_forget_rounds,
                             max_page_bytes=cs.max_page_bytes)
    server = None
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = install_stop_handlers(stop)
    try:
        writer.start()
        if own_server and not once and cs.metrics_port:
            server, _thread = start_http_server(cs.metrics_port, addr=cs.metrics_host, registry=registry)
            log.info("collector metrics on http://%s:%d/metrics", cs.metrics_host, cs.metrics_port)
        reports = runner.run(stop, once=once)
        failed = {k: v for r in reports for k, v in r.failed.items()}
        for name, why in sorted(failed.items()):
            log.error("target %s failed: %s", name, why)
        if once:
            rows = sum(r.rows for r in reports)
            log.info("one round done: %d rows from %d targets, %d failed", rows,
                     sum(len(r.outcomes) for r in reports), len(failed))
        return 1 if once and failed and len(failed) == sum(len(r.outcomes) for r in reports) else 0
    finally:
        stop.set()
        if server is not None:
            server.shutdown()
        writer.close()
        if writer.store is not None:
            writer.store.close()
        for sig, prev in previous.items():
            signal.signal(sig, prev)
        if own_server:                             # gpuq collect: send the spans still held
            from gpuq.tracing import shutdown

            shutdown()
        held = writer.spilled_files()
        if held:
            log.warning("%d batches spilled to %s: they are replayed at the next start", held,
                        settings.store.spill_dir)
