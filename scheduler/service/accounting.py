"""The accounting as a serving process holds it: the store, the queue configuration (reloaded by
:class:`accounting.watcher.QueueConfigWatcher` when ``queues_file`` is set), the last "now" view
(fed to :class:`accounting.metrics.AccountingCollector`), and the windows the API serves.

Every number comes from :mod:`accounting.service` and the pure engine; this adapter only calls
them and reshapes their values for the scheduler (nodes, idle workloads) and the API (dicts).
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from accounting import service as acc
from accounting.audit import Difference, Placed, audit
from accounting.intervals import running
from accounting.idle import IdleParams, current
from accounting.ledger import KUEUE, RESERVATIONS, by_slot, combine, holder
from accounting.metrics import AccountingCollector
from accounting.model import Allocation, NodeCapacity, PendingDemand, Window
from accounting.now import NowSnapshot, NowView, compute_now
from accounting.queues import QueueConfig
from accounting.resolve import Resolver
from accounting.decay import HOUR, decayed_interval
from accounting.rollup import decayed_materialized, materialize_hours
from accounting.series import queue_series
from accounting.store_adapter import read_allocations, read_usage
from accounting.watcher import QueueConfigWatcher, Reload
from scheduler.model import Node

log = logging.getLogger(__name__)

DECAY_REFRESH_S = 60.0        # LiveAccounting.decayed_usage reads the store at most this often
TAIL_MAX_S = 48 * 3600.0      # and reads live at most this far back (materialize_hours' own reach)


@dataclass(frozen=True, slots=True)
class Refresh:
    view: NowView
    nodes: tuple[Node, ...]                       # schedulable nodes with GPUs, as the scheduler sees them
    idle: frozenset[tuple[str, str]]              # (namespace, workload) holding an idle GPU now
    observed: tuple[Allocation, ...] = ()         # the ledger's observed allocations running now
    node_name: Callable[[Allocation], str] = lambda a: a.node   # an allocation's node, as in ``nodes``


class LiveAccounting:
    def __init__(self, store: Any, *, queues_file: str | None = None, params: IdleParams | None = None,
                 starvation_s: float = 600.0, config: QueueConfig | None = None,
                 collector: AccountingCollector | None = None, declared: Sequence[NodeCapacity] = (),
                 watcher: Any = None) -> None:
        self.store = store
        self.declared = tuple(declared)           # scheduler.nodes_file, in the one inventory
        self.params = params or IdleParams()
        self.starvation_s = starvation_s
        self.collector = collector or AccountingCollector()
        # the queue tree's source: the queue file, or ``watcher`` (the same poll(); queues_from: kueue's
        # scheduler.service.kueue.KueueQueues), which may have nothing to give yet at start
        self.watcher: Any = QueueConfigWatcher(queues_file) if queues_file else watcher
        self._config = config if config is not None else acc.load_config(None)
        self._lock = threading.Lock()
        self.view: NowView | None = None
        self._snap: NowSnapshot | None = None
        # the last live view and what it was computed from (snapshot, configuration, admissions)
        self._live: tuple[NowSnapshot, QueueConfig, tuple[Allocation, ...], Sequence[PendingDemand] | None,
                          NowView] | None = None
        # what gpuq admitted now, as ledger rows (SchedulerService.admitted_allocations): every view
        # adds them to what the collectors observed (accounting.ledger.combine)
        self.admitted: Callable[[], Sequence[Allocation]] = lambda: ()
        # the scheduler's pending work now (SchedulerService.pending_demand: the same tuple while it
        # is unchanged) and which observed pending pods are its own (SchedulerService.owns): every
        # view counts the scheduler's pending plus the observed pending pods that are not gpuq's
        self.pending: Callable[[], Sequence[PendingDemand]] | None = None
        self.owns: Callable[[str, str], bool] = lambda namespace, name: False
        self.error: str | None = None             # the last reload's problem, while the old config stays
        # the configuration views resolve against: the file's, or once following a scheduler its
        # configuration (the file's with the queues placement rules made: accounting.access)
        self._current: Callable[[], QueueConfig] = lambda: self._config
        self._resolver: tuple[QueueConfig, Resolver] | None = None
        # the last decayed usage (half-life, when, queue -> decayed GPU-seconds): decayed_usage
        self._decayed: tuple[float, float, dict[str, float]] | None = None
        if self.watcher is not None:
            self.collector.watch_config(lambda: self.error is not None)
        if self.watcher is not None and config is None:
            self.reload()
            if self.watcher.config is None and getattr(self.watcher, "required_at_start", True):
                raise self.watcher.error or RuntimeError(f"cannot load {queues_file}")

    def follow(self, service: Any) -> None:
        """Every view from now on adds ``service``'s live state (a ``SchedulerService``): what it
        admitted, what it has pending, and which observed pending pods are its own."""
        self.admitted, self.pending, self.owns = service.admitted_allocations, service.pending_demand, service.owns
        self._current = lambda: service.config

    @property
    def config(self) -> QueueConfig:
        """The configuration in force: the file's, with the queues the scheduler's placement rules
        made once :meth:`follow` is called."""
        return self._current()

    def resolver(self) -> Resolver:
        """One memoising resolver per configuration in force (a made queue or a reload is a new one)."""
        config = self._current()
        hit = self._resolver
        if hit is None or hit[0] is not config:
            hit = self._resolver = (config, Resolver(config))
        return hit[1]

    @property
    def config_loaded(self) -> bool:
        return self.watcher is None or self.watcher.config is not None

    def reload(self, accept: Callable[[QueueConfig], None] | None = None) -> Reload | None:
        """Poll the queue file; a new valid configuration is offered to ``accept`` (the scheduler's
        ``set_config``), which may refuse it by raising; it is in :attr:`config` once LOADED. A
        refused one is offered again at every poll until it is taken or the file changes."""
        if self.watcher is None:
            return None
        result = self.watcher.poll()
        if result is Reload.REJECTED:
            self.error = str(self.watcher.error)
            log.error("queue configuration from %s rejected, the last good one stays: %s", self.watcher.path,
                      self.error)
            return result
        new = self.watcher.config
        if new is None or new is self._config:
            return result
        try:
            if accept is not None:
                accept(new)
        except Exception as exc:  # noqa: BLE001 - the caller's refusal, reported like a bad file
            if result is Reload.LOADED or self.error != str(exc):
                log.error("queue configuration from %s not taken: %s", self.watcher.path, exc)
            self.error = str(exc)
            return Reload.REJECTED
        self._config, self.error = new, None
        log.info("queue configuration loaded from %s (generation %d)", self.watcher.path, self.watcher.generation)
        return Reload.LOADED

    def refresh(self, now_s: float, pending: Sequence[PendingDemand] | None = None) -> Refresh:
        """Compute the "now" view and update the gauges. Pending is the observed pending pods that
        are not gpuq's plus the scheduler's pending (:attr:`pending`, else ``pending`` when given)."""
        snap = acc.now_snapshot(self.store, now_s, self.params, None, self.declared)
        if pending is not None and self.pending is None:
            fixed = tuple(pending)
            self.pending = lambda: fixed
        # observed on a node: not gpuq's admissions, nor Kueue's reservations (no node; they count for
        # their queue in the view until their pods are seen, which the scheduler then sees)
        observed = tuple(a for a in snap.allocations if a.source not in RESERVATIONS)
        view = self._compute(snap)
        with self._lock:
            self.view, self._snap = view, snap
        self.collector.update(view)
        nodes = _nodes(view)
        many = len({n.cluster for n in view.capacity.nodes if n.schedulable and n.capacity >= 1}) > 1
        return Refresh(view, nodes, _idle(snap, now_s, self.params), observed,
                       (lambda a: f"{a.cluster}/{a.node}") if many else (lambda a: a.node))

    def _demand(self, snap: NowSnapshot, scheduled: Sequence[PendingDemand] | None) -> tuple[PendingDemand, ...]:
        """Observed pending pods that are not gpuq's, then the scheduler's pending: each once."""
        if scheduled is None:
            return snap.pending
        return (*(d for d in snap.pending if not self.owns(d.namespace, d.workload)), *scheduled)

    def _compute(self, snap: NowSnapshot, admitted: tuple[Allocation, ...] | None = None,
                 scheduled: Sequence[PendingDemand] | None = None) -> NowView:
        if admitted is None:
            admitted = _on_capacity_nodes(self.admitted(), snap.nodes)
        if scheduled is None and self.pending is not None:
            scheduled = self.pending()
        at = max([snap.at_s, *(a.start_s for a in admitted)])    # an admission after the snapshot is now
        live = replace(snap, at_s=at, allocations=tuple(combine(snap.allocations, admitted, snap.at_s, snap.history)),
                       pending=self._demand(snap, scheduled))
        return compute_now(live, self.resolver(), self.params, self.starvation_s)

    def audit(self, admitted: Sequence[Allocation], placed: Sequence[Placed], nodes: Sequence[Node],
              node_name: Callable[[Allocation], str]) -> tuple[Difference, ...]:
        """The books against the scheduler's record (:func:`accounting.audit.audit`): the last
        observed snapshot with ``admitted`` (read with ``placed`` at one moment), the ledger's
        rows running now, against ``placed``; nodes named and typed as the scheduler's ``nodes``."""
        with self._lock:
            snap = self._snap
        if snap is None:
            return ()
        on_nodes = _on_capacity_nodes(admitted, snap.nodes)
        at = max([snap.at_s, *(a.start_s for a in on_nodes)])
        live = [a for a in running(combine(snap.allocations, on_nodes, snap.at_s, snap.history), at)
                if a.source != KUEUE]                  # on no node: Kueue's to place, not in gpuq's books
        resolver = self.resolver()
        types = {n.name: n.gpu_type for n in nodes}
        return audit(live, placed, resolver, node_name,
                     lambda node, a: types.get(node) or resolver.gpu_type(a.gpu_model, a.gpu_resource))

    def replicas_by_type(self) -> dict[str, int]:
        """GPU type -> the fewest replicas the device plugin makes of each GPU on the schedulable
        nodes of that type in the last snapshot (``nvidia.com/gpu.replicas`` as the collector saw
        the nodes; 1: not time-sliced), every type with GPUs. The Kubernetes workload source reads a
        template's ``nvidia.com/gpu`` request as replicas of these (the fewest: a share never less
        than the pod holds on any node it may land on)."""
        with self._lock:
            snap = self._snap
        if snap is None:
            return {}
        resolver = self.resolver()
        out: dict[str, int] = {}
        for n in snap.nodes:
            if n.schedulable and n.milli_gpus > 0:
                t = resolver.gpu_type(n.gpu_model)
                out[t] = min(out.get(t, n.replicas), n.replicas)
        return out

    def queue_of(self, a: Allocation) -> str:
        return self.resolver().queue(a.queue, a.namespace)

    def materialize(self, now_s: float) -> list[float]:
        return materialize_hours(self.store, now_s, self.params)

    def decayed_usage(self, now_s: float, half_life_s: float) -> dict[str, float]:
        """Fair share over time (issue 21): each queue's decayed GPU-seconds at ``now_s``
        (:mod:`accounting.decay`), as the accounting has it: the materialised hours
        (:func:`accounting.rollup.decayed_materialized`, one aggregation in the store) and, after
        the newest of them (or over the last :data:`TAIL_MAX_S` when there is none), the rest read
        live from the allocations an hour at a time, each hour taken as used evenly. Raw queues and
        namespaces resolve to the configuration's queues as every view does. Kept for
        :data:`DECAY_REFRESH_S` (the scores move by hours, a cycle comes every second): the store
        is read at most that often."""
        hit = self._decayed
        if hit is not None and hit[0] == half_life_s and 0 <= now_s - hit[1] < DECAY_REFRESH_S:
            return hit[2]
        resolver = self.resolver()
        out: dict[str, float] = {}
        rows, tail = decayed_materialized(self.store, now_s, half_life_s)
        for raw, ns, v in rows:
            q = resolver.queue(raw, ns)
            out[q] = out.get(q, 0.0) + v
        t = max(tail if tail is not None else now_s - TAIL_MAX_S, now_s - TAIL_MAX_S)
        while t < now_s:
            end = min(t + HOUR, now_s)
            for a in read_usage(self.store, Window(t, end), now_s, by_workload=False):
                if a.gpu_seconds > 0:
                    q = resolver.queue(a.queue, a.namespace)
                    out[q] = out.get(q, 0.0) + decayed_interval(a.gpu_seconds / (end - t), t, end, now_s, half_life_s)
            t = end
        self._decayed = (half_life_s, now_s, out)
        return out

    # -- what the API serves ------------------------------------------------------------------
    def rows(self) -> list[dict[str, Any]]:
        """The "now" view with gpuq's admissions as they are at this moment (so that it agrees with
        the scheduler's workloads whenever asked), over the last observed snapshot."""
        view = self.live_view()
        return [r.as_dict() for r in view.rows] if view is not None else []

    def queue_page(self, limit: int, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
        """The "now" view's rows of ``limit`` queues from the ``offset``-th (in the view's order: the
        root, then each parent before its children; each queue's rows together, one per GPU type and
        ``*``), and how many queues the view has. Only the page's rows are turned into dicts."""
        view = self.live_view()
        if view is None:
            return [], 0
        rows = view.rows
        starts = [i for i, r in enumerate(rows) if i == 0 or r.queue != rows[i - 1].queue]
        if offset >= len(starts):
            return [], len(starts)
        end = starts[offset + limit] if offset + limit < len(starts) else len(rows)
        return [r.as_dict() for r in rows[starts[offset]:end]], len(starts)

    def live_view(self) -> NowView | None:
        """The last observed snapshot with gpuq's admissions as they are now (None before the
        first refresh): what the API's "now" routes serve. Computed again only when the snapshot,
        the configuration or the admissions changed: the view is a function of those three, and
        with 10,000 pending workloads in the snapshot each computation took milliseconds of the
        one interpreter that every API request shares (issue 9: the API under load). The
        scheduler's pending is live too, compared by identity (the service hands back the same
        tuple while it is unchanged)."""
        with self._lock:
            snap, live = self._snap, self._live
        config = self._current()
        if snap is None:
            return None
        admitted = _on_capacity_nodes(self.admitted(), snap.nodes)
        scheduled = self.pending() if self.pending is not None else None
        if live is not None and live[0] is snap and live[1] is config and live[2] == admitted \
                and live[3] is scheduled:
            return live[4]
        view = self._compute(snap, admitted, scheduled)
        with self._lock:
            if self._snap is snap:
                self._live = (snap, config, admitted, scheduled, view)
        return view

    def usage(self, start_s: float, end_s: float, by: Sequence[str], now_s: float,
              rollup: bool = False) -> list[dict[str, Any]]:
        rows = acc.usage_report(self.store, self._current(), Window(start_s, end_s), now_s, by, self.params,
                                rollup=rollup)
        return [r.as_dict() for r in rows]

    def series(self, start_s: float, end_s: float, step_s: float, now_s: float,
               queue: str | None = None) -> list[dict[str, Any]]:
        window = Window(start_s, end_s)
        points = queue_series(read_allocations(self.store, window, now_s), self.resolver(), window,
                              step_s, now_s)
        return [p.as_dict() for p in points if queue is None or p.queue == queue]

    def ping(self) -> bool:
        try:
            return bool(self.store.ping())
        except Exception:  # noqa: BLE001 - any failure means "not reachable"
            return False


def check_books(live: LiveAccounting, service: Any, refresh: Refresh, now_s: float) -> tuple[Difference, ...]:
    """Audit the books after a refresh (serve does it every accounting interval): the scheduler's
    record read at one moment, against the accounting; kept on the service for ``/books``,
    ``gpuq check`` and the ``gpuq_books_*`` gauges."""
    admitted, placed = service.record()
    service.books = live.audit(admitted, placed, refresh.nodes, refresh.node_name)
    service.books_at_s = now_s
    return service.books


def _nodes(view: NowView) -> tuple[Node, ...]:
    """Schedulable nodes with at least one whole GPU. Names are the node names; with several
    clusters in the store they become ``cluster/node``, and the MIG slices of a node that also
    shows another type ``node:type``."""
    nodes = [n for n in view.capacity.nodes if n.schedulable and n.capacity >= 1]
    many = len({n.cluster for n in nodes}) > 1
    out: dict[str, Node] = {}
    for n in sorted(nodes, key=lambda n: (n.cluster, n.node, n.gpu_type)):
        name = f"{n.cluster}/{n.node}" if many else n.node
        if name in out:                       # a node split into MIG slices: one entry per type
            name = f"{name}:{n.gpu_type}"
        out[name] = Node(name, n.gpu_type, int(n.capacity))
    return tuple(out.values())


def _on_capacity_nodes(admitted: Sequence[Allocation], capacity: Sequence[Any]) -> tuple[Allocation, ...]:
    """Admission rows carry the node names the collectors use (:func:`accounting.ledger.node_of`)
    and the scheduler's cluster name: a node the inventory knows in one cluster only is put there."""
    clusters: dict[str, set[str]] = {}
    for n in capacity:
        clusters.setdefault(n.node, set()).add(n.cluster)
    out = []
    for a in admitted:
        known = clusters.get(a.node, set())
        cluster = next(iter(known)) if len(known) == 1 else a.cluster
        out.append(a if cluster == a.cluster else replace(a, cluster=cluster))
    return tuple(out)


def _idle(snap: NowSnapshot, now_s: float, params: IdleParams) -> frozenset[tuple[str, str]]:
    owner = by_slot(snap.allocations)
    out = set()
    for r in current(snap.idle_runs, now_s, params):
        a = holder(owner, r.cluster, r.namespace, r.pod, r.node)
        if a is not None:
            out.add((r.namespace, a.workload))
    return frozenset(out)
