"""Prometheus gauges for the "now" view, as a custom collector a serving process registers::

    collector = AccountingCollector()
    registry.register(collector)
    collector.update(view)            # after each accounting cycle (accounting.service.now_view)

Gauges (the queue label is the dotted path; ``gpu_type="*"`` is any type):

    gpuq_queue_allocated_gpus{queue,gpu_type}     GPUs held now (subtree sum)
    gpuq_queue_guaranteed_gpus{queue,gpu_type}    guaranteed (only where configured)
    gpuq_queue_max_gpus{queue,gpu_type}           own max (only where configured)
    gpuq_queue_pending_gpus{queue,gpu_type}       GPUs asked for and waiting
    gpuq_queue_borrowed_gpus / gpuq_queue_lent_gpus{queue,gpu_type}
    gpuq_queue_fair_share{queue}                  dominant allocated/guaranteed ratio
    gpuq_queue_over_quota_share_gpus{queue,gpu_type}
    gpuq_queue_starving{queue}                    1 while starving, with
    gpuq_queue_starving_seconds{queue}            how long its oldest demand has waited
    gpuq_idle_allocated_gpus{queue}               allocated GPUs idle now (leaf queues)
    gpuq_free_gpus{gpu_type}                      free GPUs on schedulable nodes
    gpuq_fitting_requests{gpu_type,gpus}          requests of that shape that still fit on one node
    gpuq_fragmentation_ratio{gpu_type}            see accounting.capacity (gpu_type="*": all)
    gpuq_accounting_view_timestamp_seconds        when the view was computed
    gpuq_accounting_queue_config_rejected         1 while the queue file's last change was refused and the
                                                  last good configuration stays (only with a queue file)

The collector only reads the last view it was given (swapped atomically): scraping never queries
the store.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from accounting.now import NowView


def _g(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class AccountingCollector(Collector):
    def __init__(self) -> None:
        self._view: NowView | None = None
        self._config_rejected: Callable[[], bool] | None = None

    def update(self, view: NowView) -> None:
        self._view = view

    def watch_config(self, rejected: Callable[[], bool]) -> None:
        """Export ``gpuq_accounting_queue_config_rejected`` from ``rejected()``, asked at scrape time
        (the owner of the queue file passes it: :class:`scheduler.service.accounting.LiveAccounting`)."""
        self._config_rejected = rejected

    def describe(self) -> Iterator[Any]:
        return iter(self._families(None))

    def collect(self) -> Iterator[Any]:
        return iter(self._families(self._view))

    def _families(self, view: NowView | None) -> list[GaugeMetricFamily]:
        qt = ["queue", "gpu_type"]
        fams = {
            "alloc": _g("gpuq_queue_allocated_gpus", "GPUs allocated to the queue's subtree now.", qt),
            "guar": _g("gpuq_queue_guaranteed_gpus", "GPUs guaranteed to the queue.", qt),
            "max": _g("gpuq_queue_max_gpus", "The queue's own max GPUs.", qt),
            "pend": _g("gpuq_queue_pending_gpus", "GPUs pending in the queue's subtree.", qt),
            "borrow": _g("gpuq_queue_borrowed_gpus", "GPUs allocated above the guarantee.", qt),
            "lent": _g("gpuq_queue_lent_gpus", "Guaranteed GPUs left unused.", qt),
            "fair": _g("gpuq_queue_fair_share", "Dominant allocated/guaranteed ratio (YuniKorn).", ["queue"]),
            "oq": _g("gpuq_queue_over_quota_share_gpus", "Guaranteed plus weighted share of unused GPUs.", qt),
            "starve": _g("gpuq_queue_starving", "1 while the queue is below guaranteed with old pending demand.",
                         ["queue"]),
            "starve_s": _g("gpuq_queue_starving_seconds", "Age of the starving queue's oldest pending demand.",
                           ["queue"]),
            "idle": _g("gpuq_idle_allocated_gpus", "Allocated GPUs idle now.", ["queue"]),
            "free": _g("gpuq_free_gpus", "Free GPUs on schedulable nodes.", ["gpu_type"]),
            "fits": _g("gpuq_fitting_requests", "Requests of this many GPUs on one node that still fit.",
                       ["gpu_type", "gpus"]),
            "frag": _g("gpuq_fragmentation_ratio", "Free GPUs that cannot serve a whole-node request, over all free.",
                       ["gpu_type"]),
            "ts": _g("gpuq_accounting_view_timestamp_seconds", "When the accounting view was computed.", []),
        }
        if view is not None:
            self._fill(view, fams)
        if self._config_rejected is not None:
            fams["rejected"] = GaugeMetricFamily(
                "gpuq_accounting_queue_config_rejected",
                "1 while the queue file's last change was refused (the last good configuration stays).",
                value=1.0 if self._config_rejected() else 0.0)
        return list(fams.values())

    @staticmethod
    def _fill(view: NowView, f: dict[str, GaugeMetricFamily]) -> None:
        leaf_idle: dict[str, float] = {}
        for r in view.rows:
            lv = [r.queue, r.gpu_type]
            f["alloc"].add_metric(lv, r.allocated)
            f["pend"].add_metric(lv, r.pending)
            f["oq"].add_metric(lv, r.over_quota_share)
            if r.guaranteed is not None:
                f["guar"].add_metric(lv, r.guaranteed)
                f["borrow"].add_metric(lv, r.borrowed or 0.0)
                f["lent"].add_metric(lv, r.lent or 0.0)
            if r.max is not None:
                f["max"].add_metric(lv, r.max)
            if r.gpu_type == "*":
                f["fair"].add_metric([r.queue], r.fair_share)
                leaf_idle[r.queue] = r.idle
        starving = {s.queue: s for s in view.starving}
        for q, idle in leaf_idle.items():
            f["idle"].add_metric([q], idle)
            f["starve"].add_metric([q], 1.0 if q in starving else 0.0)
        for q, s in starving.items():
            f["starve_s"].add_metric([q], s.waiting_s)
        for t in (*view.capacity.types, view.capacity.total):
            f["free"].add_metric([t.gpu_type], t.free)
            f["frag"].add_metric([t.gpu_type], t.fragmentation_ratio)
            for k, n in sorted(t.fits.items()):
                f["fits"].add_metric([t.gpu_type, str(k)], n)
        f["ts"].add_metric([], view.at_s)
