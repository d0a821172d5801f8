"""The accounting API over a store: read the snapshots, run the pure engine. Used by the CLI, the
metrics collector and the benchmark; the scheduler can pass its own pending demand."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from accounting import store_adapter as sa
from accounting.idle import DEFAULT_PARAMS, IdleParams
from accounting.inventory import inventory
from accounting.model import NodeCapacity, PendingDemand, Window
from accounting.now import NowSnapshot, NowView, compute_now
from accounting.queues import QueueConfig, load_queue_config, parse_queue_config
from accounting.resolve import Resolver
from accounting.rollup import usage_aggs
from accounting.usage import UsageRow, counts_losses, usage_rows
from gpuq.store import Store


def load_config(queues_file: str | Path | None) -> QueueConfig:
    """The queue file, or an empty configuration (collected queue names used as they are)."""
    return load_queue_config(queues_file) if queues_file else parse_queue_config({})


def idle_params(settings: object) -> IdleParams:
    acc = getattr(settings, "accounting", None)
    if acc is None:
        return IdleParams()
    return IdleParams(threshold_pct=acc.idle_threshold_pct, window_s=acc.idle_window_s)


_last_resolver: tuple[QueueConfig, Resolver] | None = None


def _resolver(config: QueueConfig) -> Resolver:
    """One memoising Resolver per configuration, kept while the configuration is the same object
    (a reload makes a new one), so each view does not resolve every queue and type again."""
    global _last_resolver
    hit = _last_resolver
    if hit is None or hit[0] is not config:
        hit = _last_resolver = (config, Resolver(config))
    return hit[1]


def usage_report(store: Store, config: QueueConfig, window: Window, now_s: float, by: Sequence[str],
                 params: IdleParams = DEFAULT_PARAMS, *, rollup: bool = False,
                 idle_source: str = "auto") -> tuple[UsageRow, ...]:
    """Materialised hours (accounting_usage_1h) where they exist, the rest live from the public
    tables. ``idle_source``: ``auto`` uses the per-minute rollup for the live part (``raw``, ``1m``
    or ``1h`` force a source and skip the materialised hours). Grouped by queue (and cluster), each
    row also has what preemptions threw away (:func:`accounting.usage.counts_losses`)."""
    by_workload = "workload" in by
    if idle_source == "auto":
        aggs = usage_aggs(store, window, now_s, params, by_workload=by_workload)
    else:
        aggs = sa.read_usage_idle(store, window, now_s, params,
                                  idle_source, by_workload)  # type: ignore[arg-type]
    lost = sa.read_preemption_losses(store, window) if counts_losses(by) else None
    return usage_rows(aggs, _resolver(config), by, rollup=rollup, lost=lost)


def now_snapshot(store: Store, now_s: float, params: IdleParams = DEFAULT_PARAMS,
                 pending: Sequence[PendingDemand] | None = None,
                 declared: Sequence[NodeCapacity] = ()) -> NowSnapshot:
    """``pending``: demand the caller knows (the scheduler's queue); else Pending pods.
    ``declared``: the scheduler's nodes file, merged into the one inventory (:mod:`accounting.inventory`)."""
    trailing = Window(now_s - params.window_s - params.max_gap_s, now_s)
    allocations, history = sa.read_ledger(store, Window(now_s, now_s + 1e-3), now_s)
    return NowSnapshot(
        at_s=now_s,
        allocations=tuple(allocations),
        history=tuple(history),
        nodes=inventory(sa.read_nodes(store, now_s), declared),
        pending=tuple(sa.read_pending(store, now_s) if pending is None else pending),
        idle_runs=tuple(sa.read_idle_runs(store, trailing, now_s, params, "1m")),
    )


def now_view(store: Store, config: QueueConfig, now_s: float, params: IdleParams = DEFAULT_PARAMS,
             starvation_s: float = 600.0, pending: Sequence[PendingDemand] | None = None) -> NowView:
    return compute_now(now_snapshot(store, now_s, params, pending), _resolver(config), params, starvation_s)
