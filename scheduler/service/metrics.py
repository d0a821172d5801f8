"""The scheduler's own Prometheus metrics, read from the service at scrape time (no double
bookkeeping; register on the serving process's registry next to the accounting's gauges)::

    gpuq_scheduler_cycles_total                      cycles run
    gpuq_scheduler_cycle_duration_seconds            histogram of a cycle's wall time (core + actuator)
    gpuq_scheduler_last_cycle_timestamp_seconds      the scheduler clock of the last cycle
    gpuq_scheduler_submitted_total{queue}            workloads submitted
    gpuq_scheduler_rejected_total{queue}             workloads that can never run
    gpuq_scheduler_admissions_total{queue}           admissions (a preempted workload counts again)
    gpuq_scheduler_preemptions_total{queue}          preempted workloads, by the victim's queue
    gpuq_scheduler_preemption_lost_gpu_seconds_total{queue}  work they threw away (issue 21)
    gpuq_scheduler_actuator_failures_total{verb}     admit / preempt / cancel that failed after retries
    gpuq_scheduler_actions_fenced_total{verb}        actions dropped (not carried out, or retries stopped)
                                                     because this replica no longer holds the Lease
    gpuq_scheduler_pending_workloads{queue}          pending now
    gpuq_scheduler_running_workloads{queue}          running now
    gpuq_scheduler_wait_seconds{queue}               histogram of the wait from submission to first admission
    gpuq_scheduler_oldest_pending_seconds{queue}     the longest such wait still going, at the last cycle
                                                     (workloads never admitted yet; absent before a cycle)
    gpuq_scheduler_paused                            1 while acting is paused (POST /admin/pause)
    gpuq_scheduler_preemptions_window{queue}         preempted in the brake's sliding hour, by victim queue
    gpuq_scheduler_preemption_limit{scope}           the brake's limits per hour (queue, cluster; absent: none)
    gpuq_scheduler_preemptions_limited_total{queue}  admissions the brake held back, by the preemptor's queue
    gpuq_scheduler_actions_in_flight                 actions queued or running on the actuator's workers
    gpuq_books_unbalanced_gpus                       |accounted - placed| summed at the last audit (accounting.audit)
    gpuq_books_difference_gpus{queue,gpu_type,node}  accounted - placed, each cell that differs
    gpuq_books_last_audit_timestamp_seconds          when the books were last audited (absent before)
    gpuq_forecast_start_error_seconds{forecast}      histogram of |p50 - start| of the workloads that
                                                     started with a forecast (forecast: submit, the first
                                                     after submission; latest, the last before the start)
    gpuq_forecast_error_seconds_total{queue,forecast}  the sum of those errors, per queue
    gpuq_forecast_interval_hits_total{queue,forecast}  of those, the starts inside [p10, p90]
    gpuq_forecast_starts_total{queue,forecast}       starts scored against a forecast
    gpuq_forecast_last_refresh_timestamp_seconds     the scheduler clock of the last forecast refresh
    gpuq_forecast_refresh_duration_seconds           its wall time (forecasting runs off the scheduling path)
    gpuq_forecast_pending_forecast                   pending workloads with a forecast after it

The forecasts' counters are by queue (the configured leaf queues: bounded; six series a queue that
has had a scored start) and the two kinds; the error histogram by kind only.

The alert rules (alerts/gpuq.rules.yml) compare the last two: a queue whose oldest pending wait is
far over its 7-day p90 wait.
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from accounting.audit import unbalanced
from scheduler.service.core import SchedulerService
from scheduler.service.forecasts import ERROR_BUCKETS_S
from scheduler.service.views import BUCKETS_S, PENDING, RUNNING, WAIT_BUCKETS_S


class SchedulerCollector(Collector):
    def __init__(self, service: SchedulerService) -> None:
        self._service = service

    def describe(self) -> Iterator[Any]:
        return iter(())          # unchecked collector: families depend on the live queues

    def collect(self) -> Iterator[Any]:
        svc = self._service
        with svc._lock:
            st = svc.stats.copy()
            oldest: dict[str, float] = {}
            for e in svc._entries.values():
                if e.state == PENDING and e.first_start_s is None:
                    q = e.workload.queue
                    oldest[q] = min(oldest.get(q, e.workload.submit_s), e.workload.submit_s)
            mismatches: dict[str, int] = {}
            for m in svc.mismatches:
                mismatches[m.kind] = mismatches.get(m.kind, 0) + 1
            brake = svc.brake
            window = brake.counts(st.last_cycle_s) if st.last_cycle_s is not None else {}
            limited = dict(brake.limited)
            paused = svc.paused is not None
        yield GaugeMetricFamily("gpuq_scheduler_paused", "1 while acting is paused by an admin.", value=int(paused))
        g = GaugeMetricFamily("gpuq_scheduler_preemptions_window",
                              "Workloads preempted in the preemption brake's sliding hour, by the victim's queue.",
                              labels=["queue"])
        for q, n in sorted(window.items()):
            g.add_metric([q], n)
        yield g
        lim = GaugeMetricFamily("gpuq_scheduler_preemption_limit", "Preemptions allowed per hour (the brake).",
                                labels=["scope"])
        for scope, value in (("queue", brake.per_queue), ("cluster", brake.cluster)):
            if value is not None:
                lim.add_metric([scope], value)
        yield lim
        yield _counter("gpuq_scheduler_preemptions_limited", "Admissions the preemption brake held back, by the "
                       "preemptor's queue (each cycle that holds one back counts).", ["queue"],
                       {(q,): n for q, n in limited.items()})
        yield GaugeMetricFamily("gpuq_scheduler_actions_in_flight", "Actuator actions queued or running.",
                                value=svc._lanes.in_flight())
        counts = svc.counts()
        yield _counter("gpuq_scheduler_cycles", "Scheduling cycles run.", [], {(): st.cycles})
        buckets = [(str(b), n) for b, n in zip(BUCKETS_S, st.cycle_buckets)] + [("+Inf", st.cycles)]
        yield HistogramMetricFamily("gpuq_scheduler_cycle_duration_seconds",
                                    "Wall time of a cycle (core and actuator).", buckets=buckets,
                                    sum_value=st.cycle_seconds_sum)
        if st.last_cycle_s is not None:
            yield GaugeMetricFamily("gpuq_scheduler_last_cycle_timestamp_seconds",
                                    "Scheduler clock of the last cycle.", value=st.last_cycle_s)
        for name, doc, data in (
            ("gpuq_scheduler_submitted", "Workloads submitted.", st.submitted),
            ("gpuq_scheduler_rejected", "Workloads rejected: they can never run.", st.rejected),
            ("gpuq_scheduler_admissions", "Admissions (a preempted workload admitted again counts again).",
             st.admissions),
            ("gpuq_scheduler_preemptions", "Workloads preempted, by the victim's queue.", st.preemptions),
        ):
            yield _counter(name, doc, ["queue"], {(q,): n for q, n in data.items()})
        lost = CounterMetricFamily("gpuq_scheduler_preemption_lost_gpu_seconds",
                                   "GPU-seconds of work preemptions threw away (since the last checkpoint "
                                   "where the workload reports one), by the victim's queue.", labels=["queue"])
        for q, x in sorted(st.lost_gpu_seconds.items()):
            lost.add_metric([q], x)
        yield lost
        yield _counter("gpuq_scheduler_actuator_failures", "Actuator calls that failed after their retries.",
                       ["verb"], {(v,): n for v, n in st.actuator_failures.items()})
        yield _counter("gpuq_scheduler_actions_fenced", "Actions dropped because this replica no longer holds "
                       "the Lease (not carried out, or their retries stopped).", ["verb"],
                       {(v,): n for v, n in st.actions_fenced.items()})
        for state in (PENDING, RUNNING):
            g = GaugeMetricFamily(f"gpuq_scheduler_{state}_workloads", f"Workloads {state} now.", labels=["queue"])
            for (q, s), n in sorted(counts.items()):
                if s == state:
                    g.add_metric([q], n)
            yield g
        wait = HistogramMetricFamily("gpuq_scheduler_wait_seconds",
                                     "Wait from submission to first admission.", labels=["queue"])
        for q, per_bucket in sorted(st.wait_buckets.items()):
            wait.add_metric([q], [(str(b), n) for b, n in zip(WAIT_BUCKETS_S, per_bucket)]
                            + [("+Inf", st.wait_count[q])], sum_value=st.wait_sum_s[q])
        yield wait
        age = GaugeMetricFamily("gpuq_scheduler_oldest_pending_seconds",
                                "Longest wait of a workload not admitted yet, at the last cycle.", labels=["queue"])
        if st.last_cycle_s is not None:
            for q, submit_s in sorted(oldest.items()):
                age.add_metric([q], max(0.0, st.last_cycle_s - submit_s))
        yield age
        ledger = GaugeMetricFamily("gpuq_ledger_mismatches",
                                   "Mismatches between the ledger and gpuq's decisions at the last reconciliation "
                                   "(actuator_drift, misplaced, foreign).", labels=["kind"])
        for kind in ("actuator_drift", "misplaced", "foreign"):
            ledger.add_metric([kind], mismatches.get(kind, 0))
        yield ledger
        books, at = self._service.books, self._service.books_at_s
        if at is not None:
            yield GaugeMetricFamily("gpuq_books_unbalanced_gpus",
                                    "GPUs where the accounting and the scheduler's record differ, summed over "
                                    "(queue, GPU type, node) at the last audit (0: the books balance).",
                                    value=unbalanced(books))
            yield GaugeMetricFamily("gpuq_books_last_audit_timestamp_seconds", "When the books were last audited.",
                                    value=at)
        diff = GaugeMetricFamily("gpuq_books_difference_gpus",
                                 "Accounted minus placed GPUs, per (queue, GPU type, node) cell that differs.",
                                 labels=["queue", "gpu_type", "node"])
        for d in books:
            diff.add_metric([d.queue, d.gpu_type, d.node], d.gpus)
        yield diff
        yield from _forecasts(self._service)


def _forecasts(svc: SchedulerService) -> Iterator[Any]:
    f = svc.forecasts
    counters = f.counters()
    # the histogram over all queues (its buckets per queue would be 22 series a queue: at 10,000
    # queues, 220,000); per queue the counters, whose ratios give coverage and the mean error
    err = HistogramMetricFamily("gpuq_forecast_start_error_seconds",
                                "How far the forecast p50 was from the actual start (|p50 - start|), of the "
                                "workloads that started with a forecast, all queues.", labels=["forecast"])
    merged: dict[str, tuple[int, float, list[int]]] = {}
    for (_, kind), (n, _, total, buckets) in sorted(counters.items()):
        m = merged.get(kind)
        merged[kind] = (n, total, list(buckets)) if m is None else (
            m[0] + n, m[1] + total, [a + b for a, b in zip(m[2], buckets)])
    for kind, (n, total, buckets) in sorted(merged.items()):
        err.add_metric([kind], [(str(b), c) for b, c in zip(ERROR_BUCKETS_S, buckets)] + [("+Inf", n)],
                       sum_value=total)
    yield err
    errors = CounterMetricFamily("gpuq_forecast_error_seconds", "Sum of |p50 - start| over the starts scored "
                                 "against a forecast (over gpuq_forecast_starts_total: the mean error).",
                                 labels=["queue", "forecast"])
    for (q, kind), (_, _, total, _) in sorted(counters.items()):
        errors.add_metric([q, kind], total)
    yield errors
    yield _counter("gpuq_forecast_interval_hits", "Starts inside the forecast's [p10, p90].", ["queue", "forecast"],
                   {key: c[1] for key, c in counters.items()})
    yield _counter("gpuq_forecast_starts", "Starts scored against a forecast.", ["queue", "forecast"],
                   {key: c[0] for key, c in counters.items()})
    if f.last_refresh_s is not None:
        yield GaugeMetricFamily("gpuq_forecast_last_refresh_timestamp_seconds",
                                "Scheduler clock of the last forecast refresh.", value=f.last_refresh_s)
        yield GaugeMetricFamily("gpuq_forecast_refresh_duration_seconds",
                                "Wall time of the last forecast refresh (off the scheduling path).",
                                value=f.last_duration_s or 0.0)
        yield GaugeMetricFamily("gpuq_forecast_pending_forecast",
                                "Pending workloads with a start-time forecast after the last refresh.",
                                value=f.forecast_count)


def _counter(name: str, doc: str, labels: list[str], values: dict[tuple[str, ...], int]) -> CounterMetricFamily:
    fam = CounterMetricFamily(name, doc, labels=labels)
    for key, n in sorted(values.items()):
        fam.add_metric(list(key), n)
    return fam
