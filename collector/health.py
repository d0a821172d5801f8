"""The collector's own health: Prometheus metrics and OpenTelemetry spans.

Metrics (all prefixed ``gpuq_collector_``), registered on a registry passed in (never the
global one, so tests and several collectors in one process do not collide):

* ``scrape_duration_seconds{source,cluster,target}``  last scrape's wall time
* ``scrapes_total{source,cluster,target,result}``     result = ok | error | timeout
* ``scrape_samples{source,cluster,target}``           samples parsed in the last scrape
* ``parse_errors_total{source,cluster,target}``       malformed lines skipped
* ``rows_written_total{table}`` / ``rows_spilled_total{table}`` / ``rows_replayed_total{table}``
* ``rows_buffered{table}`` and ``spill_files``           what the writer holds now
* ``store_write_errors_total``, ``watch_errors_total{kind}``
* ``rows_refused_total{table}``                       rows the database refused for a cause outside them (a
                                                       missing table, a permission): kept waiting in the spill
                                                       directory; rows refused for their values are quarantined
* ``rows_dropped_total{table,reason}``                rows lost on purpose: ``spill_failed`` = store down,
                                                       spill failing and the memory bound reached
* ``spill_errors_total``                              failed spill attempts (disk full, read-only ...)
* ``spill_files_quarantined_total{table}``            spill files moved to ``quarantine/`` (refused for their
                                                       values, or unreadable): a counter of arrivals
* ``spill_quarantined_files{table}``                  files in ``quarantine/`` now (the collectors' and the
                                                       scheduler's spill directory): what alert
                                                       GpuqSpillFileQuarantined watches
* ``series_refused_total{source,cluster,target}``     series over ``collector.max_series_per_target``
* ``series{source,cluster,target}``                   distinct series known for the target (capped)
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gpuq.store.schema import COLUMNS

if TYPE_CHECKING:
    from gpuq.store.writer import BatchWriter


class _WriterCollector(Collector):
    """Reads the writer's counters at scrape time (no double bookkeeping)."""

    def __init__(self, writer: BatchWriter) -> None:
        self._writer = writer

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        st = self._writer.stats
        for name, data, doc in (
            ("gpuq_collector_rows_written", st.rows_written, "Rows written to the store"),
            ("gpuq_collector_rows_spilled", st.rows_spilled, "Rows spilled to disk while the store was down"),
            ("gpuq_collector_rows_replayed", st.rows_replayed, "Spilled rows replayed into the store"),
            # every table from the start at 0: an alert's increase() sees the first refusal
            ("gpuq_collector_rows_refused", {t: 0 for t in COLUMNS} | st.rows_refused,
             "Rows the database refused for a cause outside them (they wait in the spill directory)"),
        ):
            fam = CounterMetricFamily(name, doc, labels=["table"])
            for table, n in sorted(data.items()):
                fam.add_metric([table], n)
            yield fam
        # every table from the start at 0, so increase() sees the first drop or quarantine
        dropped = CounterMetricFamily("gpuq_collector_rows_dropped",
                                      "Rows dropped: the store was down, the spill failed and the "
                                      "memory bound (store.max_buffered_rows) was reached",
                                      labels=["table", "reason"])
        for (table, reason), n in sorted(({(t, "spill_failed"): 0 for t in COLUMNS}
                                          | st.rows_dropped).items()):
            dropped.add_metric([table, reason], n)
        yield dropped
        quarantined = CounterMetricFamily("gpuq_collector_spill_files_quarantined",
                                          "Spill files moved to <spill_dir>/quarantine (refused for "
                                          "their values, or unreadable)",
                                          labels=["table"])
        for table, n in sorted(({t: 0 for t in COLUMNS} | st.files_quarantined).items()):
            quarantined.add_metric([table], n)
        yield quarantined
        # what is there now (files leave it by gpuq spill replay or by hand), every table at 0
        in_quarantine = GaugeMetricFamily("gpuq_collector_spill_quarantined_files",
                                          "Spill files in <spill_dir>/quarantine now: refused for their "
                                          "values or unreadable, their rows not in the store",
                                          labels=["table"])
        for table, n in sorted(({t: 0 for t in COLUMNS} | self._writer.quarantined_by_table()).items()):
            in_quarantine.add_metric([table], n)
        yield in_quarantine
        spill_err = CounterMetricFamily("gpuq_collector_spill_errors", "Failed spill attempts")
        spill_err.add_metric([], st.spill_errors)
        yield spill_err
        buf = GaugeMetricFamily("gpuq_collector_rows_buffered", "Rows held in memory, not yet written",
                                labels=["table"])
        for table, n in sorted(self._writer.buffered().items()):
            buf.add_metric([table], n)
        yield buf
        yield GaugeMetricFamily("gpuq_collector_spill_files", "Spilled batches waiting for the store",
                                value=self._writer.spilled_files())
        err = CounterMetricFamily("gpuq_collector_store_write_errors", "Failed insert attempts")
        err.add_metric([], st.write_errors)
        yield err


class CollectorMetrics:
    def __init__(self, registry: CollectorRegistry, writer: BatchWriter | None = None) -> None:
        labels = ["source", "cluster", "target"]
        self.registry = registry
        self.duration = Gauge("gpuq_collector_scrape_duration_seconds", "Wall time of the last scrape",
                              labels, registry=registry)
        self.scrapes = Counter("gpuq_collector_scrapes", "Scrapes by result", labels + ["result"],
                               registry=registry)
        self.samples = Gauge("gpuq_collector_scrape_samples", "Samples parsed in the last scrape", labels,
                             registry=registry)
        self.parse_errors = Counter("gpuq_collector_parse_errors", "Malformed lines skipped", labels,
                                    registry=registry)
        self.series = Gauge("gpuq_collector_series", "Distinct series known for the target (at most "
                            "collector.max_series_per_target)", labels, registry=registry)
        self.series_refused = Counter("gpuq_collector_series_refused", "Rows of new series refused: the "
                                      "target is over collector.max_series_per_target", labels,
                                      registry=registry)
        self.watch_errors = Counter("gpuq_collector_watch_errors", "Errors reported by watchers "
                                    "(dropped streams, 410 Gone, unreadable objects)", ["kind"],
                                    registry=registry)
        if writer is not None:
            registry.register(_WriterCollector(writer))
