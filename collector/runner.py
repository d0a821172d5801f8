"""Runs every configured source concurrently, round after round, into the BatchWriter.

Scrape targets (Ray pages, Ray State API, DCGM pages, NVML) run on one asyncio loop: each round
every target starts after a random jitter, runs under its own timeout, and its failure is
recorded (log line naming the target, metrics, span) without touching the others. Watchers
(Kubernetes) run in their own threads for the life of the process. ``stop`` (set by SIGTERM or
Ctrl-C) ends the loop between scrapes; the caller then closes the writer, which flushes.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.trace import Status, StatusCode, Tracer

from collector.base import Discoverer, ScrapeResult, ScrapeTarget, Watcher
from collector.cardinality import SeriesCap
from collector.errors import CollectorError
from collector.health import CollectorMetrics
from collector.http import HttpClient
from gpuq.store.writer import BatchWriter

log = logging.getLogger(__name__)


@dataclass(slots=True)
class RoundReport:
    """What one round did, per target name: ``ok``, ``timeout`` or the error text."""

    outcomes: dict[str, str] = field(default_factory=dict)
    rows: int = 0

    @property
    def failed(self) -> dict[str, str]:
        return {k: v for k, v in self.outcomes.items() if v != "ok"}


class CollectorRunner:
    def __init__(
        self,
        writer: BatchWriter,
        metrics: CollectorMetrics,
        tracer: Tracer,
        *,
        targets: Sequence[ScrapeTarget] = (),
        discoverers: Sequence[Discoverer] = (),
        watchers: Sequence[Watcher] = (),
        interval_s: float = 15.0,
        timeout_s: float = 5.0,
        jitter_s: float = 1.0,
        max_connections: int = 256,
        max_series_per_target: int = 20_000,
        max_page_bytes: int = 64 * 2**20,
        series_forget_rounds: int = 20,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.timezone.utc),
        rng: random.Random | None = None,
    ) -> None:
        self.writer = writer
        self.metrics = metrics
        self.tracer = tracer
        self.targets = list(targets)
        self.discoverers = list(discoverers)
        self.watchers = list(watchers)
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.jitter_s = jitter_s
        self.max_connections = max_connections
        self.clock = clock
        self.rng = rng or random.Random()
        self.series_cap = SeriesCap(max_series_per_target, series_forget_rounds)
        self.max_page_bytes = max_page_bytes
        self._threads: list[threading.Thread] = []

    # -- scrape targets ------------------------------------------------------------------
    async def _current_targets(self, client: HttpClient, report: RoundReport) -> list[ScrapeTarget]:
        found: list[ScrapeTarget] = list(self.targets)
        for disc in self.discoverers:
            name = getattr(disc, "name", type(disc).__name__)
            try:
                found.extend(await asyncio.wait_for(disc.targets(client), self.timeout_s))
            except Exception as exc:  # noqa: BLE001 - one discoverer failing must not stop the round
                report.outcomes[f"discover:{name}"] = _describe(exc)
                log.warning("discovery %s failed: %s", name, _describe(exc))
        seen: set[tuple[str, str]] = set()
        unique = []
        for t in found:
            key = (t.source, t.name)
            if key not in seen:
                seen.add(key)
                unique.append(t)
        return unique

    async def _scrape_one(self, target: ScrapeTarget, client: HttpClient, report: RoundReport,
                          stop: threading.Event) -> None:
        if self.jitter_s:
            await asyncio.sleep(self.rng.uniform(0, self.jitter_s))
        if stop.is_set():
            return
        labels = (target.source, target.cluster, target.name)
        with self.tracer.start_as_current_span(
            f"scrape {target.source}",
            attributes={"gpuq.source": target.source, "gpuq.cluster": target.cluster,
                        "gpuq.target": target.name},
        ) as span:
            t0 = time.perf_counter()
            outcome = "ok"
            try:
                result: ScrapeResult = await asyncio.wait_for(target.scrape(client, self.clock()),
                                                              self.timeout_s)
            except asyncio.TimeoutError:
                outcome = "timeout"
                span.set_status(Status(StatusCode.ERROR, "timeout"))
                log.warning("%s target %s (cluster %s): timed out after %.1fs", *labels[:1], target.name,
                            target.cluster, self.timeout_s)
            except Exception as exc:  # noqa: BLE001 - isolate every target
                outcome = _describe(exc)
                span.record_exception(exc)
                span.set_status(Status(StatusCode.ERROR, outcome))
                log.warning("%s target %s (cluster %s): %s", target.source, target.name, target.cluster, outcome)
            else:
                refused = self.series_cap.admit(labels, result.rows)
                self.metrics.series.labels(*labels).set(self.series_cap.known(labels))
                if refused:
                    self.metrics.series_refused.labels(*labels).inc(refused)
                    span.set_attribute("gpuq.series_refused", refused)
                for table, rows in result.rows.items():
                    self.writer.write(table, rows)
                    report.rows += len(rows)
                self.metrics.samples.labels(*labels).set(result.samples)
                if result.errors:
                    self.metrics.parse_errors.labels(*labels).inc(len(result.errors))
                    for err in result.errors[:5]:
                        log.warning("%s target %s: %s", target.source, target.name, err)
                span.set_attribute("gpuq.samples", result.samples)
                span.set_attribute("gpuq.parse_errors", len(result.errors))
            self.metrics.duration.labels(*labels).set(time.perf_counter() - t0)
            self.metrics.scrapes.labels(*labels, "ok" if outcome == "ok" else
                                        ("timeout" if outcome == "timeout" else "error")).inc()
            report.outcomes[target.name] = outcome

    async def run_round(self, client: HttpClient, stop: threading.Event | None = None) -> RoundReport:
        stop = stop or threading.Event()
        report = RoundReport()
        self.series_cap.new_round()
        targets = await self._current_targets(client, report)
        await asyncio.gather(*(self._scrape_one(t, client, report, stop) for t in targets))
        return report

    async def _loop(self, stop: threading.Event, once: bool) -> list[RoundReport]:
        reports = []
        async with HttpClient(timeout_s=self.timeout_s, max_connections=self.max_connections,
                              max_body_bytes=self.max_page_bytes) as client:
            while not stop.is_set():
                started = time.monotonic()
                reports.append(await self.run_round(client, stop))
                if once:
                    break
                remaining = self.interval_s - (time.monotonic() - started)
                # wake up promptly on stop
                while remaining > 0 and not stop.is_set():
                    await asyncio.sleep(min(remaining, 0.2))
                    remaining = self.interval_s - (time.monotonic() - started)
        return reports

    # -- watchers --------------------------------------------------------------------------
    def _start_watchers(self, stop: threading.Event, once: bool) -> None:
        for w in self.watchers:
            def body(w: Watcher = w) -> None:
                try:
                    w.run(self.writer.write, stop, once)
                except Exception:  # noqa: BLE001 - report, never take the process down
                    log.exception("%s watcher %s (cluster %s) died", w.source, w.name, w.cluster)
            th = threading.Thread(target=body, name=f"watch-{w.source}-{w.cluster}", daemon=True)
            th.start()
            self._threads.append(th)

    def run(self, stop: threading.Event, once: bool = False) -> list[RoundReport]:
        """Run until ``stop`` is set (or one round with ``once``); watchers are joined on return."""
        self._start_watchers(stop, once)
        reports: list[RoundReport] = []
        if self.targets or self.discoverers:
            reports = asyncio.run(self._loop(stop, once))
        if once:
            for th in self._threads:
                th.join()
        else:
            stop.wait()
            for th in self._threads:
                th.join(timeout=5)
        return reports


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CollectorError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def spans_tracer(kind: str) -> tuple[Tracer, Any]:
    """A tracer with the configured exporter: ``none``, ``console``, ``memory`` (tests) or ``otlp``
    (:mod:`gpuq.tracing`)."""
    from gpuq.tracing import tracer

    return tracer(kind, "gpuq.collector")  # type: ignore[no-any-return]
