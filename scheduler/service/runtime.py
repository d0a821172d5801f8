"""``gpuq serve``: one process, one embedded store, five loops.

* the **collectors** (:func:`collector.service.run_collect` in a thread, when sources are
  configured), writing through their own :class:`~gpuq.store.writer.BatchWriter`;
* the **accounting loop** (every ``accounting.interval_s``): reload the queue file (the scheduler
  takes the new configuration or refuses it), compute the "now" view with the scheduler's
  pending demand, update the gauges, hand the scheduler its nodes (unless a static list was
  given) and idle flags; materialise closed hours every five minutes;
* the **scheduler loop** (every ``scheduler.cycle_interval_s``): one :meth:`SchedulerService.cycle`;
* the **forecasts** (:mod:`scheduler.service.forecasts`): every pending workload's start-time
  forecast, refreshed at least every ``accounting.interval_s`` and soon after a submit, in a
  thread of its own: forecasting takes seconds at thousands pending, which no cycle waits for;
* the **world sync** (every ``accounting.interval_s``, :mod:`scheduler.service.sources`): with the
  ``kubernetes`` actuator, suspended RayJobs/RayClusters come in and deleted ones go; with ``ray``,
  jobs that ended finish their workloads;
* the **API** (uvicorn in a thread) on ``api.host:api.port``.

At start the scheduler's state is rebuilt from ``scheduler_events``. SIGTERM or Ctrl-C set one
stop event: the loops return, uvicorn shuts down, the writers flush (spilling what the store
will not take) and the stores close, within seconds.
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from accounting.service import idle_params
from gpuq.timefmt import iso
from scheduler.model import Node
from scheduler.service.brakes import PreemptionBrake
from scheduler.snapshot import Settings as CoreSettings

log = logging.getLogger(__name__)

MATERIALIZE_EVERY_S = 300.0


def _loop(name: str, stop: threading.Event, interval_s: float, body: Callable[[], None]) -> threading.Thread:
    def run() -> None:
        while not stop.is_set():
            try:
                body()
            except Exception:  # a loop logs and carries on
                log.exception("%s failed", name)
            stop.wait(interval_s)
    t = threading.Thread(target=run, name=f"gpuq-{name}", daemon=True)
    t.start()
    return t


def kueue_workloads(store: Any, accounting: Any, service: Any) -> Any:
    """Kueue's Workloads (:class:`scheduler.service.kueue.KueueWorkloads`) in ``service``'s
    ``/workloads`` and ``explain``, and their pending GPUs in the accounting's pending demand; their
    queue is the one the accounting resolves their LocalQueue to (``mapping.local_queues``), else the
    leaf named after their ClusterQueue."""
    from accounting.resolve import UNASSIGNED
    from scheduler.service.kueue import KueueWorkloads, store_reader

    def queue_of(namespace: str, local_queue: str, cluster_queue: str) -> str:
        resolver = accounting.resolver()
        got = resolver.queue(local_queue, namespace) if local_queue else UNASSIGNED
        if got == UNASSIGNED and cluster_queue:
            got = resolver.queue(cluster_queue, namespace)
        return str(got)

    kueue = KueueWorkloads(store_reader(store), queue_of)
    service.external = kueue
    scheduled = service.pending_demand
    accounting.pending = lambda: kueue.demand(scheduled())
    return kueue


def yunikorn_applications(store: Any, accounting: Any, service: Any) -> Any:
    """YuniKorn's pending applications (:class:`scheduler.service.yunikorn.YuniKornApplications`) in
    ``service``'s ``/workloads`` and ``explain`` (their GPUs are pending pods, which the accounting
    counts already); their queue is the one the accounting resolves the queue their pods name to (the
    namespace's own where they name none)."""
    from scheduler.service.kueue import store_reader
    from scheduler.service.yunikorn import YuniKornApplications

    def queue_of(namespace: str, queue: str, _: str) -> str:
        return str(accounting.resolver().queue(queue, namespace))

    apps = YuniKornApplications(store_reader(store), queue_of)
    service.external = apps
    return apps


def _has_sources(settings: Any) -> bool:
    c = settings.collector
    return bool(c.ray or c.dcgm or c.kubernetes or c.nvml.enabled)


def serve(settings: Any, stop: threading.Event, *, nodes: Sequence[Node] | None = None, cluster: str = "default",
          collect: bool = True, clock: Callable[[], float] = time.time, leader: Any = None) -> int:
    """Run until ``stop`` is set; 0 on a clean stop, 1 when the API could not start. ``leader``: the
    :class:`~scheduler.service.leader.LeaderElector` whose Lease this replica holds (``gpuq serve`` with
    ``leader.enabled``), shown in ``/healthz`` and its metrics (``gpuq_leader``, lease lost and
    acquired), and the fence of every action: once it no longer holds the Lease the scheduler
    decides nothing and the actions not carried out yet are dropped
    (:meth:`~scheduler.service.leader.LeaderElector.holds_lease`)."""
    import uvicorn
    from prometheus_client import CollectorRegistry

    from collector.service import make_writer, run_collect
    from gpuq.store import open_store
    from gpuq.store.spillfile import SCHEDULER
    from scheduler.actuators.factory import make_actuator
    from scheduler.api import create_app
    from scheduler.api.server import server_config
    from scheduler.service.replay import read_restart
    from scheduler.service.core import SchedulerService
    from scheduler.service.accounting import LiveAccounting, check_books
    from accounting.audit import unbalanced
    from accounting.inventory import declared
    from scheduler.service.sources import world_sync

    st = settings.store
    from gpuq.tracing import shutdown as shutdown_spans
    from gpuq.tracing import tracer as make_tracer

    store = open_store(st.dsn, default_database=st.database, retention=st.retention, cluster=st.cluster)
    spill = str(Path(st.spill_dir) / SCHEDULER)        # apart from the collector's spill files
    writer, wstore = make_writer(settings.model_copy(update={"store": st.model_copy(update={"spill_dir": spill})}))
    threads: list[threading.Thread] = []
    server: Any = None
    api: threading.Thread | None = None
    collector_stop = threading.Event()
    registry = CollectorRegistry()                   # one /metrics: API, scheduler, accounting, collectors
    actuator: Any = None
    service: Any = None
    sc: Any = None
    kueue: Any = None
    try:
        tree: Any = None
        if settings.queues_from == "kueue":
            from scheduler.service.kueue import KueueQueues, store_reader

            log.warning("queues_from: kueue: gpuq advises; Kueue acts (the %s actuator acts on nothing); the "
                        "queue tree follows Kueue's objects", settings.scheduler.actuator)
            tree = KueueQueues(store_reader(store))
        elif settings.queues_from == "yunikorn":
            from scheduler.service.kueue import store_reader
            from scheduler.service.yunikorn import YuniKornQueues

            yk = settings.yunikorn
            log.warning("queues_from: yunikorn: gpuq advises; YuniKorn acts (the %s actuator acts on nothing); the "
                        "queue tree follows the queues.yaml of the ConfigMap yunikorn-configs (else yunikorn-defaults) "
                        "of namespace %s, partition %s", settings.scheduler.actuator, yk.namespace, yk.partition)
            tree = YuniKornQueues(store_reader(store), yk.namespace, yk.partition)
        accounting = LiveAccounting(store, queues_file=settings.queues_file, params=idle_params(settings),
                                    starvation_s=settings.accounting.starvation_s,
                                    declared=declared([(n.name, n.gpu_type, n.gpus) for n in nodes or ()],
                                                      cluster), watcher=tree)
        sc = settings.scheduler
        fence = leader.holds_lease if leader is not None else None    # no election: never fenced
        actuator = make_actuator(settings, fence=fence)
        spans, _ = make_tracer(settings.collector.otel_exporter, "gpuq.scheduler")
        if settings.collector.otel_exporter != "none":    # every actuator call is a span
            from scheduler.actuators.traced import TracedActuator

            actuator = TracedActuator(actuator, spans)
        # the actuators retry with backoff themselves, and the next cycle is the retry after that
        limit = sc.preemption_limit
        service = SchedulerService(accounting.config, actuator, nodes=nodes or (),
                                   settings=CoreSettings(sc.preemption, sc.preemption_delay_s, sc.reclaim,
                                                         sc.usage_half_life_s), sink=writer,
                                   cluster=cluster, retry_attempts=1, workers=sc.actuator_workers,
                                   budget_s=sc.actuator_budget_s, refused_backoff_s=sc.refused_backoff_s,
                                   brake=PreemptionBrake(limit.per_queue_per_hour, limit.cluster_per_hour),
                                   fence=fence, cycle_interval_s=sc.cycle_interval_s)
        writer.start()                               # replays spilled events first, so the restore sees them
        service.restore(read_restart(store, cluster))   # scheduler_events + scheduler_state (no TTL)
        service.load_brakes(store, clock())          # a restart neither lifts a pause nor resets the brake
        if service.paused is not None:
            log.warning("acting is PAUSED since %s by %s (%s): POST /admin/resume to act again",
                        iso(service.paused.since_s), service.paused.by or "?", service.paused.reason or "no reason")
        accounting.follow(service)
        if settings.queues_from == "kueue":
            kueue = kueue_workloads(store, accounting, service)
        elif settings.queues_from == "yunikorn":
            kueue = yunikorn_applications(store, accounting, service)
        # admitted but unseen for this long is actuator drift; the dry-run actuator acts on nothing
        grace = None if sc.actuator == "dry-run" else max(120.0, 4 * settings.accounting.interval_s)
        log.info("nodes: the accounting's inventory (%s)", "the collectors' nodes and %d declared in the nodes file"
                 % len(nodes) if nodes else "the collectors' nodes")
        state = {"materialized": clock()}             # first after MATERIALIZE_EVERY_S: a quick start

        def account() -> None:
            now = clock()
            accounting.reload(accept=service.set_config)
            if kueue is not None:
                kueue.refresh()                     # Kueue's Workloads (YuniKorn's pending applications): views, demand
            r = accounting.refresh(now)
            service.set_nodes(r.nodes)              # the one inventory (nodes file included)
            service.set_idle_targets(r.idle)
            if sc.usage_half_life_s > 0:            # fair share over time: the queues' decayed usage
                service.set_usage(accounting.decayed_usage(now, sc.usage_half_life_s), now)
            service.set_observed(r.observed, accounting.queue_of, r.node_name, now, grace)
            if kueue is not None:
                kueue.advise(service, now)          # gpuq's advice beside Kueue's reasons (advisor)
            if check_books(accounting, service, r, now):    # the books against the scheduler's record
                log.warning("the books do not balance: %d cells, %g GPUs (gpuq check)", len(service.books),
                            unbalanced(service.books))
            if now - state["materialized"] >= MATERIALIZE_EVERY_S:
                state["materialized"] = now
                accounting.materialize(now)

        try:
            account()                               # nodes and configuration before the first cycle
        except Exception:  # the loop below retries
            log.exception("accounting failed at start; retrying every %s s", settings.accounting.interval_s)
        threads.append(_loop("accounting", stop, settings.accounting.interval_s, account))
        def cycle() -> None:
            with spans.start_as_current_span("scheduler.cycle") as span:
                d = service.cycle(clock(), wait=False)  # actions run on the service's workers, outside its lock
                span.set_attributes({"gpuq.admissions": len(d.admissions), "gpuq.preemptions": len(d.preemptions),
                                     "gpuq.pending": len(d.pending)})

        threads.append(_loop("scheduler", stop, sc.cycle_interval_s, cycle))
        forecasts = threading.Thread(target=service.forecasts.serve, name="gpuq-forecasts", daemon=True,
                                     args=(stop, clock, settings.accounting.interval_s, sc.cycle_interval_s))
        forecasts.start()
        threads.append(forecasts)
        sync = world_sync(settings, service, actuator, accounting.replicas_by_type)
        if sync is not None:
            threads.append(_loop("world-sync", stop, settings.accounting.interval_s, lambda: sync(clock())))
        if collect and _has_sources(settings):
            def collect_run() -> None:
                try:
                    run_collect(settings, once=False, stop=collector_stop, registry=registry)
                except Exception:  # the collectors failing must not stop the scheduler
                    log.exception("collectors stopped")
            t = threading.Thread(target=collect_run, name="gpuq-collect", daemon=True)
            t.start()
            threads.append(t)
        elif collect:
            log.info("no collector sources configured: not collecting (see collector.* in the config)")

        if leader is not None:
            from scheduler.service.leader import LeaderCollector

            registry.register(LeaderCollector(leader))   # the standby's series, continued
        app = create_app(service, accounting, settings, clock=clock, registry=registry,
                         leader=leader.cfg.identity if leader is not None else None)
        # what is alive now (the imported modules, the restored state) lives as long as the
        # process: out of the collector's sight, so that a full collection, which stops every
        # thread while it walks the heap, walks only what came since (issue 9: the API under load)
        gc.collect()
        gc.freeze()
        server = uvicorn.Server(server_config(app, settings, registry))
        api = threading.Thread(target=server.run, name="gpuq-api", daemon=True)
        api.start()
        while not server.started and api.is_alive() and not stop.is_set():
            time.sleep(0.05)
        if not server.started and not stop.is_set():
            log.error("the API could not start on %s:%s", settings.api.host, settings.api.port)
            return 1
        log.info("gpuq serve: API on http://%s:%s (docs at /docs), cluster %r, actuator %s",
                 settings.api.host, settings.api.port, cluster, service.actuator.name)
        stop.wait()
        log.info("stopping")
        return 0
    finally:
        stop.set()
        collector_stop.set()
        if service is not None:
            service.forecasts.wake()                 # its loop sees the stop now, not at its next refresh
        if server is not None:
            server.should_exit = True
        for t in [*threads, *([api] if api is not None else [])]:
            t.join(timeout=10)
        if service is not None and not service.close(timeout=sc.actuator_budget_s if sc else 10.0):
            log.warning("actions still in flight at stop: their answers are not recorded; the next "
                        "start decides again (the actuators are idempotent)")
        writer.close()
        if actuator is not None and hasattr(actuator, "close"):
            actuator.close()
        for s in (wstore, writer.store, store):
            if s is not None:
                s.close()
        if writer.spilled_files():
            log.warning("%d scheduler event batches spilled to %s: replayed at the next start",
                        writer.spilled_files(), spill)
        shutdown_spans()                             # the spans still batched go out (otlp)
        log.info("stopped")
