"""The live scheduler: an I/O shell around :func:`scheduler.cycle.schedule`.

It holds the workloads (pending with their reasons, running, and the last finished ones), the
nodes (a static list, or the accounting's view of capacity through :meth:`set_nodes`), the queue
configuration (:meth:`set_config`) and the accounting's idle flags (:meth:`set_idle`). The clock
is passed in (``now``: Unix seconds in ``gpuq serve``); nothing here reads the time.

* :meth:`submit` / :meth:`cancel` / :meth:`finish` change the set of workloads;
* :meth:`cycle` brings its kept snapshot up to date under the lock (:mod:`scheduler.service.kept`:
  only the entries touched since, :meth:`_touch`), runs ``schedule()`` on it without the lock (the
  API answers meanwhile; decisions whose workloads changed in between are dropped), then hands each
  decision to the actuator **outside the lock** (:mod:`scheduler.service.acting`: a few worker threads, one
  action at a time per workload, each call bounded by the actuator's request timeout and the
  action by ``budget_s``); each answer is recorded under the lock with its event. While an action
  is in flight its workloads say so (``admitting``, ``preempting``, ``cancelling``): the preemptor
  holds its placement in the next snapshots and its victims are gone from them, so no later cycle
  decides on them twice. An actuator failure becomes the workload's reason (``actuator_failed``):
  the decision is dropped and the next cycle decides again. An admission placed where victims are
  being preempted waits for those preemptions and does not start while one of them runs on
  (``preemption_incomplete``): no node is ever overcommitted. A node that leaves stays in the
  cluster while work or an admission in flight holds it (:meth:`_held`);
* the brakes (:mod:`scheduler.service.brakes`): :meth:`pause` stops all acting (the cycle still
  decides and shows it), the preemption limit holds back admissions that would preempt too much,
  and a victim whose eviction a PodDisruptionBudget refused is not preempted again before its
  backoff;
* the **fence** (``fence``, leader election; :data:`~scheduler.actuators.base.Fence`): once this
  replica no longer holds the Lease, :meth:`cycle` decides nothing and every action not yet carried
  out is dropped: a queued one finds the fence closed when its turn comes and calls no actuator,
  one retrying stops before its next attempt (the actuators ask again before each mutating
  request). The dropped actions are counted (``stats.actions_fenced``) and recorded as nothing:
  no event is written for them, so whoever leads next replays a store in which they never
  happened and decides them again from there (:meth:`restore`, then the observed world);
* the queue policy (:mod:`scheduler.policy`): a pending workload that asks more than its queue's
  policy allows (priority, non-preemptible) is held out of the cycle with the reason ``policy``
  (:meth:`_police`, at submit, preemption, reload and restore);
* :meth:`dry_run` answers "what would you do if this arrived now" on a copy, with a start-time
  forecast;
* :attr:`forecasts` (:mod:`scheduler.service.forecasts`): start-time forecasts of the pending
  workloads, fed every event the service emits, refreshed off the scheduling path;
* :meth:`explain`, :meth:`workloads`, :meth:`nodes`, :meth:`preemptions` read.

Every change is an event (:mod:`scheduler.events`) written to ``sink`` (a
:class:`~gpuq.store.writer.BatchWriter`); the state lives in memory and :meth:`restore` rebuilds
it from the stored events after a restart (see :mod:`scheduler.service.replay`). All public
methods take one lock, so the API and the scheduling loop may call them from different threads;
no actuator call is made with it held.
"""
from __future__ import annotations

import dataclasses
import heapq
import itertools
import logging
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, ClassVar, Protocol

from accounting.access import NamespaceQueues
from accounting.access import refusal as access_refusal
from accounting.audit import OTHER, Difference, Placed
from accounting.errors import QueueNotCreated
from accounting.ledger import admission_rows
from accounting.model import Allocation, PendingDemand, milli
from accounting.queue_names import leaf_problem
from accounting.queues import ROOT, QueueConfig
from accounting.resolve import local_queue
from scheduler import events as ev
from scheduler.actuators.base import FENCED, ActionResult, Actuator, Fence, Target, may_act, with_retries
from scheduler.service.acting import Lanes
from scheduler.service.brakes import COST_WINDOW_S, LIMITED, PAUSE_KINDS, PAUSED, REFUSED, Pause, PreemptionBrake
from scheduler.cycle import never_fits, schedule
from scheduler.model import (
    Decisions,
    Gpus,
    Node,
    PendingReason,
    PendingReasons,
    Placement,
    Running,
    Workload,
    gpus_out,
    lost_gpu_seconds,
    placement_event,
    placement_of_event,
)
from scheduler.ordering import by_queue
from scheduler.policy import POLICY, refusal
from scheduler.service.errors import (
    ActuatorFailed,
    ConfigRejected,
    DuplicateWorkload,
    InvalidWorkload,
    NotActive,
    QueueNotAllowed,
    ServiceError,
    TakenWorkload,
    UnknownWorkload,
)
from scheduler.service.views import (
    ACTUATOR_FAILED,
    ADMITTING,
    CANCELLED,
    CANCELLING,
    FINISHED,
    PENDING,
    PREEMPTED,
    PREEMPTING,
    PREEMPTION_INCOMPLETE,
    QUEUED,
    QUEUE_NOT_ALLOWED,
    REJECTED,
    RUNNING,
    Entry,
    NodeView,
    PreemptionRecord,
    Reason,
    ServiceStats,
    WorkloadView,
    bump,
)
from scheduler.service.positions import Positions
from scheduler.service.ledger import (DRIFT, MISPLACED, Foreign, Mismatch, admission_store_row, foreign, owner_of_name,
                                      reconcile)
from scheduler.service.dryrun import dry_run
from scheduler.service.forecasts import Forecasts
from scheduler.service.kept import KeptSnapshot, difference, scratch
from scheduler.service.replay import CHECKPOINT, STATE_TABLE, Journal
from scheduler.snapshot import Cluster, Settings, Snapshot, build_cluster

log = logging.getLogger(__name__)


class EventSink(Protocol):
    def write(self, table: str, rows: Any) -> None: ...


class SchedulerService:
    # compare every kept snapshot with one built from every entry (AssertionError when they differ):
    # set by the tests (tests/conftest.py), never by gpuq serve: it costs the pass the kept one saves
    check_snapshots: ClassVar[bool] = False

    def __init__(self, config: QueueConfig, actuator: Actuator, *, nodes: Iterable[Node] = (),
                 settings: Settings | None = None, sink: EventSink | None = None, cluster: str = "default",
                 sleep: Callable[[float], None] = time.sleep, history: int = 1000,
                 keep_finished: int = 10_000, retry_attempts: int = 4, workers: int = 4,
                 budget_s: float | None = 60.0, brake: PreemptionBrake | None = None,
                 refused_backoff_s: float = 30.0, fence: Fence | None = None,
                 cycle_interval_s: float = 1.0) -> None:
        """``fence``: True while this replica may act (leader election; None: always).
        ``cycle_interval_s``: the scheduler loop's interval, the grid the forecasts simulate on."""
        self.actuator = actuator
        self._fence = fence
        self._fenced_at: float | None = None          # the first cycle that found the fence closed
        self.settings = settings or Settings()
        # fair share over time (issue 21; settings.usage_half_life_s > 0): each queue's decayed
        # GPU-seconds from the accounting (set_usage) and when; every snapshot carries it
        self._usage: Mapping[str, float] | None = None
        self._usage_at: float | None = None
        self.cluster_name = cluster
        self.stats = ServiceStats()
        self._config = config
        self._nsq = NamespaceQueues(config)           # the queues placement rules made (accounting.access)
        self._nodes: tuple[Node, ...] = tuple(nodes)
        self._node_names = frozenset(n.name for n in self._nodes)
        # nodes that left but stay in the cluster for the work held there (_with_held): name -> GPUs
        # held when the cluster was built; the cluster is built again once that changes
        self._departed: dict[str, int] = {}
        # victims whose preemption is in flight, with what they ran when it was decided: an admission
        # placed on their nodes waits for it, and does not start while one of them runs on (_plan)
        self._freeing: dict[str, tuple[Entry, Running]] = {}
        self._sink = sink
        self._sleep = sleep
        self._retry_attempts = retry_attempts
        self._lock = threading.RLock()
        self._deciding = threading.Lock()                # one cycle (or dry run) deciding at a time
        self._entries: dict[str, Entry] = {}                    # active workloads, arrival order
        self._done: OrderedDict[str, Entry] = OrderedDict()     # finished/cancelled/rejected, newest last
        self._keep_finished = keep_finished
        # the closed ids by their submitter's name, oldest first: past keep_finished the oldest of the
        # caller holding the most goes, so no caller can push another's ids out of memory (and take them)
        self._done_by: dict[str, OrderedDict[str, None]] = {}
        self._history: deque[PreemptionRecord] = deque(maxlen=history)
        self._idle: frozenset[str] = frozenset()
        self._cluster: Cluster | None = None
        self._foreign = Foreign((), {}, ())           # observed allocations gpuq did not admit
        # the workloads another scheduler holds (queues_from: kueue: scheduler.service.kueue.KueueWorkloads):
        # shown after gpuq's own in workloads() and explain(), read only
        self.external: Any = None
        self.mismatches: tuple[Mismatch, ...] = ()     # the last reconciliation's
        self.books: tuple[Difference, ...] = ()        # the last audit's (accounting.audit), set by serve
        self.books_at_s: float | None = None
        self._seq = 0
        self._journal = Journal(cluster)          # scheduler_state: open workloads, for restarts
        self._last_t = float("-inf")
        self._lanes = Lanes(workers)
        self._budget_s = budget_s
        self.brake = brake or PreemptionBrake()
        # (t, victim queue, lost GPU-seconds) of the preemptions of the last COST_WINDOW_S (issue 21:
        # what they cost, in status()); filled at start from the store (load_brakes), as the brake is
        self._lost_recent: deque[tuple[float, str, float]] = deque()
        self._paused: Pause | None = None
        self._refused_backoff_s = refused_backoff_s
        self._pos = Positions()                   # queue positions of the pending, kept at each transition
        # pending_demand's last answer, by (events emitted, active workloads): every change of the
        # pending set is an event (submit, admit, preempt, cancel), so an unchanged key is the same answer
        self._pending_memo: tuple[tuple[int, int], tuple[PendingDemand, ...]] | None = None
        # start-time forecasts: fed every event (_emit), refreshed off the scheduling path (gpuq serve)
        self.forecasts = Forecasts(self, cycle_interval_s)
        # the snapshot kept between snapshots (scheduler.service.kept), brought up to date from the
        # entries touched since the last one (_touch)
        self._kept = KeptSnapshot()
        self._dirty: set[str] = set()
        # while a cycle decides (from its snapshot to its decisions applied): the entries touched
        # meanwhile as they were first touched, that is as the snapshot saw them, and their queues
        self._window: dict[str, Entry] | None = None
        self._window_queues: set[str] = set()
        self._retold: set[str] = set()            # the queues of the entries touched since _explain
        self._told: dict[int, Sequence[PendingReason]] = {}    # the parts of reasons kept last (by id)
        self._ends: list[tuple[float, str]] = []  # (when its declared time is up, id) of running workloads
        self._arrival: dict[str, int] = {}        # active id -> its rank in arrival order (_entries' order)
        self._arrivals = itertools.count()

    # -- inputs from the world ---------------------------------------------------------------
    @property
    def config(self) -> QueueConfig:
        return self._config

    def set_config(self, config: QueueConfig) -> None:
        """Put a new queue configuration in force; refused (ConfigRejected) while live workloads
        sit in queues that it drops or turns into parents, or run in a queue their namespace may
        no longer use. The queues placement rules made are made again under the new rules (one
        they no longer make is dropped); the pending workloads are checked again: one whose
        namespace may no longer use its queue is held (``queue_not_allowed``), a held one that
        now may goes on."""
        with self._lock:
            nsq = NamespaceQueues(config)
            for q in self._nsq.made():
                if nsq.place(q.path, q.made_for) == q.path:
                    try:
                        nsq.make(q.path)
                    except QueueNotCreated:
                        pass                            # refused below if work sits there
            new = nsq.config
            live = [e for e in self._entries.values() if not e.not_allowed]
            lost = sorted({e.workload.queue for e in live} - set(_leaves(new)))
            if lost:
                raise ConfigRejected(f"queues {', '.join(lost)} hold pending or running workloads "
                                     f"but are not leaf queues of the new configuration")
            barred = sorted({f"{e.workload.queue} ({e.target.namespace})" for e in live
                             if e.state == RUNNING and access_refusal(new.queues, e.workload.queue, e.target.namespace)})
            if barred:
                raise ConfigRejected(f"queues run workloads of namespaces the new configuration does not allow "
                                     f"there: {', '.join(barred[:10])}; cancel them or wait until they end")
            self._nsq, self._config, self._cluster = nsq, new, None
            self._review()
            for e in self._entries.values():
                if e.state == PENDING:
                    self._police(e)

    def _police(self, e: Entry) -> None:
        """Hold a pending workload that asks more than its queue's policy allows (priority above
        ``max_priority``, non-preemptible where that is not allowed: :mod:`scheduler.policy`) out
        of the cycle and of the queue positions, with the reason ``policy``; release one that is
        within it again (a queue file that now allows it). The API refuses such a workload with a
        422 before it gets here; this holds the Kubernetes source's objects, the workloads
        restored after a restart and those a reload puts over a narrower bound."""
        if e.not_allowed:           # held for its namespace first (:meth:`_review` polices it once let go)
            return
        over = refusal(self._config, e.workload)
        held = over.message if over is not None else ""
        if held == e.policy:
            return
        self._touch(e)
        e.policy = held
        if held:
            self._pos.discard(e.workload.id)
            e.reason = Reason(POLICY, held)
        else:
            self._pos.add(e.workload)
            e.reason = Reason(QUEUED, "within its queue's policy now; waiting for the next cycle")

    def not_allowed_queue(self, workload_id: str) -> str | None:
        """The queue a pending workload names when it is held because its namespace may not use
        that queue; else None."""
        with self._lock:
            e = self._entries.get(workload_id)
            return e.workload.queue if e is not None and e.not_allowed else None

    def policy_hold(self, workload_id: str) -> tuple[Workload, str] | None:
        """(the workload, why) when it is pending and held for its queue's policy; else None."""
        with self._lock:
            e = self._entries.get(workload_id)
            return (e.workload, e.policy) if e is not None and e.policy else None

    def set_nodes(self, nodes: Iterable[Node]) -> None:
        new = tuple(nodes)
        with self._lock:
            if new != self._nodes:
                self._nodes, self._node_names = new, frozenset(n.name for n in new)
                self._cluster = None

    def set_idle(self, workload_ids: Collection[str]) -> None:
        """Running workloads whose GPUs the accounting sees idle (preferred victims)."""
        with self._lock:
            self._set_idle(frozenset(workload_ids))

    def set_usage(self, usage: Mapping[str, float], at_s: float) -> None:
        """Fair share over time: each queue's decayed GPU-seconds at ``at_s`` (the accounting's,
        :meth:`scheduler.service.accounting.LiveAccounting.decayed_usage`); the snapshots of the
        cycles, dry runs and forecasts from now on carry it (:attr:`scheduler.snapshot.Snapshot.usage`).
        Ignored while ``usage_half_life_s`` is 0: the snapshots then carry none."""
        if self.settings.usage_half_life_s <= 0:
            return
        with self._lock:
            self._usage, self._usage_at = dict(usage), at_s

    def usage_now(self) -> tuple[Mapping[str, float], float] | None:
        """The decayed usage the snapshots carry and when it was read, or None (off, or not yet)."""
        with self._lock:
            if self._usage is None or self._usage_at is None:
                return None
            return self._usage, self._usage_at

    def set_idle_targets(self, keys: Collection[tuple[str, str]]) -> None:
        """Idle flags from the accounting's ``(namespace, workload)`` keys: a running workload is
        idle when its target's name is the key's workload (a pod or Ray cluster) or its prefix
        (the Ray cluster a RayJob creates is named ``<rayjob>-<suffix>``)."""
        names: dict[str, list[str]] = {}
        for ns, name in keys:
            names.setdefault(ns, []).append(name)
        with self._lock:
            ids = [wid for wid, e in self._entries.items() if e.running is not None and e.target.name
                   and any(n == e.target.name or n.startswith(e.target.name + "-")
                           for n in names.get(e.target.namespace, ()))]
            self._set_idle(frozenset(ids))

    def _set_idle(self, idle: frozenset[str]) -> None:
        for wid in idle ^ self._idle:            # their running workloads look different to the cycle
            e = self._entries.get(wid)
            if e is not None:
                self._touch(e)
        self._idle = idle

    # -- mutations -------------------------------------------------------------------------------
    def submit(self, workload: Workload, target: Target, now: float, actor: str = "",
               hold_not_allowed: bool = False) -> WorkloadView:
        """``actor`` (who submitted, ``name (role)`` from the API) goes in the event's ``by`` and
        owns the id: while the service remembers the workload (pending, running, or among the last
        ``keep_finished`` closed ones, a restart included), another caller cannot submit under its
        id (:class:`TakenWorkload`); the same caller may submit it again once it is closed. Past
        ``keep_finished`` the caller with the most closed workloads loses its oldest first, so one
        caller's flood of submissions cannot make the service forget another's ids. The world's own
        submissions (``actor`` empty: the Kubernetes source, whose ids the API refuses) are not
        checked; an id whose owner is not recorded (before owners were) is nobody's to take.

        A workload whose target's namespace may not use its queue (:mod:`accounting.access`) is
        refused (QueueNotAllowed), or with ``hold_not_allowed`` (the Kubernetes source: the object
        is there and waits) held pending with the reason ``queue_not_allowed``, never admitted. A
        queue that the namespace's placement rule makes (the parent named, or
        ``<parent>.<namespace>``) is made now; InvalidWorkload when it cannot be."""
        with self._lock:
            old = self._entries.get(workload.id)
            if old is not None:
                raise DuplicateWorkload(workload.id, old.state)
            closed = self._done.get(workload.id)
            if closed is not None and actor and caller_name(closed.owner) != caller_name(actor):
                raise TakenWorkload(workload.id, closed.state)
            workload = self._named(workload, target.namespace)
            why = self._not_allowed(workload.queue, target.namespace)
            if why is not None:
                if not hold_not_allowed:
                    raise QueueNotAllowed(workload.queue, target.namespace, why)
                return self._submit(workload, target, now, actor, why)
            queue = self._placed(workload.queue, target.namespace)
            config = self._config
            if _is_leaf(config, queue):
                if queue != workload.queue:
                    workload = dataclasses.replace(workload, queue=queue)
                return self._submit(workload, target, now, actor, None)
        # the message (near matches among up to 10,000 leaves) is computed without the lock
        raise InvalidWorkload("queue", leaf_problem(config, queue) or f"queue {queue!r} changed")

    def _submit(self, workload: Workload, target: Target, now: float, actor: str,
                not_allowed: str | None) -> WorkloadView:
        """Record the submit; ``not_allowed`` (why its namespace may not use its queue): held
        pending with the reason ``queue_not_allowed``, never decided on."""
        self._forget_done(workload.id)
        e = Entry(workload, target, PENDING, workload.duration_s, Reason(QUEUED, "waiting for the next cycle"),
                  owner=actor)
        self._entries[workload.id] = e
        self._arrival.setdefault(workload.id, next(self._arrivals))
        self._touch(e)
        if not_allowed is None:
            self._pos.add(workload)
            self._police(e)
        else:
            e.not_allowed, e.reason = True, Reason(QUEUE_NOT_ALLOWED, not_allowed)
        self._emit(now, "submit", workload, spec=ev.spec_json(workload, target), **({"by": actor} if actor else {}))
        bump(self.stats.submitted, workload.queue)
        if not_allowed is not None:
            return self._view(e)
        cluster = self._cluster_now()
        why = never_fits(cluster, workload) if cluster.nodes and not e.policy else None
        if why is not None:
            self._close(e, REJECTED, now, Reason("never_fits", why))
            self._emit(now, "reject", workload, reason=why)
            bump(self.stats.rejected, workload.queue)
        return self._view(e)

    def cancel(self, workload_id: str, now: float, by: str = "") -> WorkloadView:
        """Stop a pending or running workload (the actuator's ``cancel``, outside the lock, after
        any action already in flight for it); ActuatorFailed keeps it. Waits for the answer at most
        the action budget (then ActuatorFailed says it goes on in the background). Cancels are
        carried out while acting is paused: they are an operator's explicit request."""
        with self._lock:
            e = self._active(workload_id)
            self._touch(e)
            e.cancelling = True                     # from now on neither admitted nor a victim
        job = self._lanes.submit({workload_id}, partial(self._carry_cancel, e, now, by))
        wait = None if self._budget_s is None else self._budget_s + 5.0
        if not job.done.wait(wait):
            raise ActuatorFailed(workload_id, "cancel", f"still in flight after {wait:g} s; it goes on in the "
                                 f"background (GET /workloads/{workload_id} shows it)")
        if isinstance(job.value, ServiceError):
            raise job.value
        if job.error is not None:
            raise ActuatorFailed(workload_id, "cancel", f"{type(job.error).__name__}: {job.error}")
        view: WorkloadView = job.value
        return view

    def _carry_cancel(self, e: Entry, now: float, by: str) -> WorkloadView | ServiceError:
        wid = e.workload.id
        with self._lock:
            if self._entries.get(wid) is not e:
                e.cancelling = False
                return NotActive(wid, e.state)
            self._touch(e)
            e.acting, before = CANCELLING, e.reason
            e.reason = Reason(CANCELLING, f"cancel in flight{f' (by {by})' if by else ''}")
        result = self._call("cancel", partial(self.actuator.cancel, e.workload, e.target))
        with self._lock:
            self._touch(e)
            e.acting, e.cancelling = "", False
            if self._entries.get(wid) is not e:        # it ended meanwhile (finished, removed)
                return self._view(e) if result.ok else NotActive(wid, e.state)
            if not result.ok:
                e.reason = before
                return ActuatorFailed(wid, "cancel", result.message)
            reason = f"cancelled by {by}" if by else "cancelled"
            self._close(e, CANCELLED, now, Reason(CANCELLED, reason))
            self._emit(now, "cancel", e.workload, reason=reason, **({"by": by} if by else {}))
            return self._view(e)

    def finish(self, workload_id: str, now: float) -> WorkloadView:
        """The world reports that a running workload has ended."""
        with self._lock:
            e = self._active(workload_id)
            if e.state != RUNNING:
                raise NotActive(workload_id, e.state)
            self._finish(e, now)
            return self._view(e)

    def remove(self, workload_id: str, now: float, reason: str) -> WorkloadView:
        """The world removed a workload (its object was deleted): close it without the actuator; a
        running one is recorded as finished, a pending one as cancelled with ``reason``."""
        with self._lock:
            e = self._active(workload_id)
            if e.state == RUNNING:
                self._finish(e, now)
            else:
                self._close(e, CANCELLED, now, Reason(CANCELLED, reason))
                self._emit(now, "cancel", e.workload, reason=reason)
            return self._view(e)

    # -- which namespace may use which queue (accounting.access) --------------------------------------
    def _not_allowed(self, queue: str, namespace: str) -> str | None:
        """Why work of ``namespace`` may not use ``queue``, with where what it runs is billed; None
        when it may (or the queue is unknown: the caller says so)."""
        why = access_refusal(self._config.queues, queue, namespace)
        if why is None:
            return None
        own = next((q for q in self._nsq.own_queues(namespace) if q != queue), None)
        return f"{why}; not admitted (what it runs anyway is billed to {own or '(unassigned)'})"

    def _named(self, workload: Workload, namespace: str) -> Workload:
        """``workload`` with the queue it names as one of ``namespace``'s LocalQueues
        (``mapping.local_queues``, :func:`accounting.resolve.local_queue`: the accounting's first
        step too), else as it is; the namespace rules and the placement rules then apply to that
        queue."""
        queue = local_queue(self._config, workload.queue, namespace)
        return workload if queue is None or queue == workload.queue else dataclasses.replace(workload, queue=queue)

    def as_held(self, workload: Workload, namespace: str, placed: bool = True) -> Workload:
        """``workload`` as the service holds it once submitted for ``namespace``: its LocalQueue
        resolved and, with ``placed``, the queue the placement rules put it in (not made here). For
        the world's sync to compare what an object asks now with what the service holds."""
        with self._lock:
            w = self._named(workload, namespace)
            path = self._nsq.place(w.queue, namespace) if placed else None
            return w if path is None or path == w.queue else dataclasses.replace(w, queue=path)

    def _placed(self, queue: str, namespace: str) -> str:
        """``queue`` as the placement rules place work of ``namespace`` (made now if need be)."""
        path = self._nsq.place(queue, namespace)
        if path is None:
            return queue
        try:
            self._make(path)
        except QueueNotCreated as exc:
            raise InvalidWorkload("queue", str(exc)) from exc
        return path

    def _make(self, path: str) -> None:
        if path not in self._config.queues:
            self._nsq.make(path)
            self._config, self._cluster = self._nsq.config, None
            log.info("queue %s made by its placement rule", path)

    def _review(self) -> None:
        """Hold the pending workloads whose namespace may not use their queue, let go the held ones
        that now may (after a new configuration or a restore)."""
        for e in self._entries.values():
            if e.state != PENDING or e.acting or e.cancelling:
                continue
            ns = e.target.namespace
            why = self._not_allowed(e.workload.queue, ns)
            if why is not None:
                if not e.not_allowed or e.reason is None or e.reason.message != why:
                    self._touch(e)
                    e.not_allowed, e.reason = True, Reason(QUEUE_NOT_ALLOWED, why)
                    self._pos.discard(e.workload.id)
                continue
            if not e.not_allowed:
                continue
            try:
                queue = self._placed(e.workload.queue, ns)
            except InvalidWorkload as exc:
                self._touch(e)
                e.reason = Reason(QUEUE_NOT_ALLOWED, exc.message)
                continue
            if queue not in _leaves(self._config):
                continue
            self._touch(e)
            if queue != e.workload.queue:
                e.workload = dataclasses.replace(e.workload, queue=queue)
                self._touch(e)                  # (its new queue too)
            e.not_allowed = False
            e.reason = Reason(QUEUED, f"{ns} may use queue {queue} now; waiting for the next cycle")
            self._pos.add(e.workload)
            e.policy = ""                 # policed afresh on its (maybe new) queue
            self._police(e)

    def state_of(self, workload_id: str) -> str | None:
        """``pending``/``running``/..., or None for an id the service does not hold."""
        with self._lock:
            e = self._entries.get(workload_id) or self._done.get(workload_id)
            return e.state if e is not None else None

    def running_targets(self) -> list[tuple[Workload, Target]]:
        with self._lock:
            return [(e.workload, e.target) for e in self._entries.values() if e.state == RUNNING]

    def active_ids(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    # -- the cycle -------------------------------------------------------------------------------
    def cycle(self, now: float, wait: bool = True) -> Decisions:
        """Snapshot under the lock, decide **without it** (``schedule()`` is pure over the
        snapshot: with 10,000 pending it takes tens of milliseconds, during which the API must go
        on answering), then under the lock again keep the decisions whose workloads are as they
        were in the snapshot (submits, cancels, finishes and actions' answers may have come
        meanwhile; a changed cluster drops them all: the next cycle decides again) and start the
        actions outside it. One cycle at a time (``_deciding``). ``wait``: return once the actions
        have run (tests, one-shot callers); ``gpuq serve`` passes False and keeps cycling while
        they run."""
        with self._deciding:
            if not may_act(self._fence):                # lost the Lease: decide nothing, act on nothing
                if self._fenced_at is None:
                    self._fenced_at = now
                    log.error("fenced: this replica no longer holds the Lease: the scheduler stops deciding "
                              "and drops the %d actions not carried out yet", self._lanes.in_flight())
                return Decisions(now, (), (), ())
            t0 = time.perf_counter()
            with self._lock:
                for e in self._due_now(now):
                    self._finish(e, now)
                snap = self._snapshot(core=True)
                self._window, self._window_queues = {}, set()
            try:
                decisions = schedule(snap, now)
                _parts(decisions.pending)   # the reasons are built on first read: here, not under the lock
            except BaseException:
                with self._lock:
                    self._window = None
                raise
            with self._lock:
                then, self._window = self._window or {}, None
                if self._cluster is snap.cluster:
                    entries = _AsSnapshot(then, self._entries)      # the entries as snap saw them
                    jobs, held = self._plan(decisions, now, entries)
                    self._explain(decisions, held, entries)
                else:                                   # nodes, foreign work or queues changed
                    jobs = []
                self.stats.observe_cycle(time.perf_counter() - t0, now)
        started = [self._lanes.submit(keys, fn) for keys, fn in jobs]
        if wait:
            for job in started:
                job.done.wait()
        return decisions

    def _touch(self, e: Entry) -> None:
        """Note that live entry ``e`` changes: called before every write to a live entry (its reason
        included, except the cycle's reasons :meth:`_explain` keeps), and after one that moves it to
        another queue. The next snapshot brings it up to date (:mod:`scheduler.service.kept`), the
        next :meth:`_explain` reads its queue's reasons again, and while a cycle decides
        (``_window``) the entry is kept as the snapshot saw it (the first one touched since)."""
        wid, queue = e.workload.id, e.workload.queue
        if self._entries.get(wid) is e:
            self._dirty.add(wid)
            self._retold.add(queue)
            window = self._window
            if window is not None:
                window.setdefault(wid, e)
                self._window_queues.add(queue)

    def _due_now(self, now: float) -> list[Entry]:
        """The running workloads whose time is up at ``now`` (:func:`_due`), in arrival order: read
        from ``_ends`` (pushed at each start; one whose workload stopped or started again since is
        dropped), not from every entry."""
        ends, due = self._ends, {}
        while ends and ends[0][0] <= now:
            _, wid = heapq.heappop(ends)
            e = self._entries.get(wid)
            if e is not None and _due(e, now):
                due[wid] = e
        return sorted(due.values(), key=lambda e: self._arrival[e.workload.id])

    def _snapshot(self, extra: Iterable[Workload] = (), core: bool = False) -> Snapshot:
        """The world as decided: running workloads (those with an action in flight cannot be
        victims), admissions in flight on their placement, victims being preempted gone
        (:func:`scheduler.service.kept.seen`); the kept snapshot brought up to date from the
        entries touched since the last one. ``core``: ``schedule()`` runs on it with the cluster's
        memo (a cycle, a dry run; :meth:`KeptSnapshot.snapshot`)."""
        extra = tuple(extra)
        cluster = self._cluster_now()
        changed, self._dirty = self._dirty, set()
        foreign = self._foreign.running
        snap = self._kept.snapshot(cluster, self._entries, changed, self._idle, foreign, self.settings, extra, core)
        if self._usage is not None:
            snap = dataclasses.replace(snap, usage=self._usage)
        if self.check_snapshots:
            fresh = scratch(cluster, self._entries.values(), self._idle, foreign, self.settings, extra)
            why = difference(snap, fresh)
            if why is not None:
                self._kept.drop()
                raise AssertionError(f"the kept snapshot differs from the entries: {why}")
        return snap

    def _explain(self, d: Decisions, held: dict[str, Reason], entries: _AsSnapshot) -> None:
        """Each waiting workload's reason from the cycle (a brake's hold first); a reason equal to
        the one it has is left as it is (40,000 of them a cycle). A queue's part of the reasons that
        is the one read last time (the cycle reused the queue's reasons: the same object), none of
        whose workloads was touched since (``_retold``), is skipped whole: its entries hold those
        reasons already, or were passed over for what they still are. Those touched while this
        cycle decided are read again next time (passed over now as not the snapshot's, they may be
        the next one's)."""
        live = self._entries
        queues, self._retold = self._retold, set(self._window_queues)   # (those whose part may hold a touched one)
        parts = _parts(d.pending)
        told, then = self._told, entries.then
        for part in parts if parts is not None else (d.pending,):
            if not part or (parts is not None and told.get(id(part)) is part and part[0].queue not in queues):
                continue
            for p in part:
                wid = p.workload
                e = live.get(wid)
                # (not the entry the snapshot saw: one touched since as first touched is another)
                if e is None or e.state != PENDING or e.acting or e.cancelling or e.not_allowed \
                        or (then and wid in then and then[wid] is not e) or (held and wid in held):
                    continue
                r, msg = e.reason, p.message
                if r is None or r.message != msg or r.code != p.code._value_:
                    e.reason = _reason(p.code._value_, msg)
        self._told = {id(part): part for part in parts} if parts is not None else {}
        for wid, hold in held.items():
            e = live.get(wid)
            if e is not None and e.state == PENDING and not e.acting and not e.cancelling:
                self._touch(e)
                e.reason = hold

    def _current(self, a: Any, entries: Mapping[str, Entry]) -> bool:
        """The admission's workload and victims are as the cycle's snapshot saw them."""
        e = self._entries.get(a.workload.id)
        if e is None or e is not entries.get(a.workload.id) or e.state != PENDING or e.acting or e.cancelling \
                or e.not_allowed:
            return False
        for vid in a.victims:
            v = self._entries.get(vid)
            if v is None or v is not entries.get(vid) or v.state != RUNNING or v.acting or v.cancelling:
                return False
        return True

    def _plan(self, d: Decisions, now: float, entries: Mapping[str, Entry] | None = None,
              ) -> tuple[list[tuple[set[str], Callable[[], None]]], dict[str, Reason]]:
        """Mark the decisions' workloads in flight and make their jobs; the admissions held back by
        a brake get their reason instead (and so do later ones placed where its victims run).
        ``entries``: the workloads as the snapshot saw them; an admission whose workload or a
        victim changed since is dropped (decided again next cycle), and so is a later one placed
        on the nodes of the victims it would have stopped."""
        why = {p.preemptor: p.reason for p in d.preemptions}
        jobs: list[tuple[set[str], Callable[[], None]]] = []
        held: dict[str, Reason] = {}
        kept: dict[str, Reason] = {}          # node -> the hold that kept its victims running
        stale: set[str] = set()               # nodes of the victims of admissions dropped as stale
        for a in d.admissions:
            if entries is not None and not self._current(a, entries):
                for vid in a.victims:
                    v = self._entries.get(vid)
                    stale.update(n for n, _ in (v.running.placement.nodes if v and v.running else ()))
                continue
            if stale and any(n in stale for n, _ in a.placement.nodes):
                continue
            e = self._entries[a.workload.id]
            victims = [self._entries[v] for v in a.victims]
            reason = why.get(e.workload.id, "")
            hold = self._hold(e, a.placement, victims, now)
            if hold is None:
                blocked = [kept[n] for n, _ in a.placement.nodes if n in kept]
                if blocked:
                    hold = Reason(blocked[0].code, f"placed where a preemption held back runs: {blocked[0].message}")
            if hold is not None:
                held[e.workload.id] = hold
                for v in victims:
                    for n, _ in v.running.placement.nodes if v.running else ():
                        kept.setdefault(n, hold)
                continue
            self._touch(e)
            e.acting, e.plan, e.planned_s = ADMITTING, a.placement, now
            e.reason = Reason(ADMITTING, f"admission in flight: {_where(a.placement)}"
                              + (f" after preempting {', '.join(a.victims)}" if victims else ""))
            for v in victims:
                self._touch(v)
                v.acting = PREEMPTING
                v.reason = Reason(PREEMPTING, f"being preempted by {e.workload.id}: {reason}")
                self.brake.record(now, v.workload.queue)
                if v.running is not None:
                    self._freeing[v.workload.id] = (v, v.running)
            # the victims in flight (its own, earlier admissions' of this cycle and of earlier cycles)
            # on its nodes: its job runs after their preemptions (a job naming them), and the admission
            # starts only if they stopped, or it would overcommit the GPUs they still hold
            on = {n for n, _ in a.placement.nodes}
            waits = [(f, r) for f, r in self._freeing.values() if any(n in on for n, _ in r.placement.nodes)]
            keys = {e.workload.id, *a.victims, *(f.workload.id for f, _ in waits)}
            jobs.append((keys, partial(self._carry_out, e, victims, a.placement, reason, now, waits)))
        return jobs, held

    def _hold(self, e: Entry, placement: Placement, victims: list[Entry], now: float) -> Reason | None:
        """Why the brakes hold this admission back now (None: carry it out)."""
        if self._paused is not None:
            p = self._paused
            stops = f" after preempting {', '.join(v.workload.id for v in victims)}" if victims else ""
            return Reason(PAUSED, f"acting is paused (by {p.by or 'an admin'} at t={p.since_s}"
                                  f"{': ' + p.reason if p.reason else ''}): would admit on {_where(placement)}{stops}")
        refused = [v for v in victims if v.refused_until > now]
        if refused:
            v = refused[0]
            return Reason(REFUSED, f"would preempt {v.workload.id}, whose eviction was refused "
                                   f"({v.message}): will retry at t={ev.round_t(v.refused_until)}")
        why = self.brake.check(now, [(v.workload.id, v.workload.queue) for v in victims])
        if why is not None:
            bump(self.brake.limited, e.workload.queue)
            return Reason(LIMITED, why)
        return None

    def _carry_out(self, e: Entry, victims: list[Entry], placement: Placement, reason: str, now: float,
                   waits: Sequence[tuple[Entry, Running]] = ()) -> None:
        """An admission's actions, outside the lock: its victims' preemptions in order, then the
        admission; each answer recorded under the lock as it comes. ``waits``: the victims whose
        preemptions were in flight on its nodes when it was decided (its job runs after theirs),
        with what they ran: one still running it does not start (it would overcommit the node),
        nor on a node that left meanwhile."""
        wid = e.workload.id
        stopped: list[Entry] = []
        for i, v in enumerate(victims):
            res = self._call("preempt", partial(self.actuator.preempt, v.workload, v.target, reason))
            with self._lock:
                self._touch(v)
                v.acting = ""
                self._freeing.pop(v.workload.id, None)
                if res.ok:
                    v.refusals = 0
                    if self._entries.get(v.workload.id) is v and v.state == RUNNING:
                        self._preempt(v, wid, reason, now)
                    stopped.append(v)         # (one that ended meanwhile is stopped all the same)
                    continue
                for rest in victims[i:]:
                    self._touch(rest)
                    rest.acting = ""
                    self._freeing.pop(rest.workload.id, None)
                    self.brake.forget(now, rest.workload.queue)
                    if rest.reason is not None and rest.reason.code == PREEMPTING:
                        rest.reason = None
                if res.detail.get("refused"):     # a PodDisruptionBudget: the victim runs on, retried later
                    v.refusals += 1
                    v.refused_until = now + min(3600.0, self._refused_backoff_s * 2 ** (v.refusals - 1))
                    v.message = res.message
                    at = ev.round_t(v.refused_until)
                    v.reason = Reason(REFUSED, f"{res.message}; not preempted again before t={at}")
                    e.reason = Reason(REFUSED, f"preempting {v.workload.id}: {res.message}; will retry at t={at}")
                else:
                    e.reason = Reason(ACTUATOR_FAILED, f"preempting {v.workload.id} failed: {res.message}; "
                                                       "tried again next cycle")
                self._touch(e)
                e.acting, e.plan = "", None
                self._remember(e, stopped, reason, now)
                return
        with self._lock:
            self._remember(e, stopped, reason, now)
            if self._entries.get(wid) is not e:
                e.acting, e.plan = "", None
                return
            running = [f.workload.id for f, r in waits if f.running is r]
            gone = [n for n, _ in placement.nodes if n not in self._node_names]
            if running or gone:
                self._touch(e)
                e.acting, e.plan = "", None
                where = _where(placement)
                if running:
                    e.reason = Reason(PREEMPTION_INCOMPLETE, f"placed on {where}, where the preemption of "
                                      f"{', '.join(running)} did not complete; decided again next cycle")
                else:
                    e.reason = Reason(QUEUED, f"{', '.join(gone)} left before its admission on {where} was "
                                              "carried out; decided again next cycle")
                return
        res = self._call("admit", partial(self.actuator.admit, e.workload, e.target, placement))
        with self._lock:
            self._touch(e)
            e.acting, e.plan = "", None
            if self._entries.get(wid) is not e or e.state != PENDING:
                log.warning("%s ended while its admission was in flight (%s)", wid, res.message)
                return
            if not res.ok:
                e.reason = Reason(ACTUATOR_FAILED, f"admission failed: {res.message}; tried again next cycle")
                return
            self._start(e, placement, now, res.message)

    def _remember(self, e: Entry, stopped: list[Entry], reason: str, now: float) -> None:
        if stopped:
            self._history.append(PreemptionRecord(
                ev.round_t(now), e.workload.id, e.workload.queue, tuple(v.workload.id for v in stopped),
                tuple(v.workload.queue for v in stopped), reason, round(sum(v.lost_last for v in stopped), 6)))

    def _call(self, verb: str, call: Callable[[], ActionResult]) -> ActionResult:
        """One action through the actuator, with retries, within the budget; never with the lock."""
        def guarded() -> ActionResult:
            try:
                return call()
            except Exception as exc:  # an actuator must not take the loop down
                log.exception("actuator %s raised during %s", self.actuator.name, verb)
                return ActionResult(False, f"{self.actuator.name}: {type(exc).__name__}: {exc}", retryable=True)

        t0 = time.perf_counter()
        result = with_retries(guarded, attempts=self._retry_attempts, sleep=self._sleep, budget_s=self._budget_s,
                              fence=self._fence)
        dropped = bool(result.detail.get(FENCED))        # the fence stopped it: dropped, not failed
        with self._lock:
            self.stats.actuator_seconds[verb] = self.stats.actuator_seconds.get(verb, 0.0) + time.perf_counter() - t0
            if dropped:
                bump(self.stats.actions_fenced, verb)
            elif not result.ok:
                bump(self.stats.actuator_failures, verb)
        if dropped:
            log.warning("%s dropped: %s", verb, result.message)
        elif not result.ok:
            log.warning("%s failed: %s", verb, result.message)
        return result

    @property
    def fenced(self) -> bool:
        """True once this replica may no longer act (it lost the Lease); never without a fence."""
        return not may_act(self._fence)

    def wait_acting(self, timeout: float | None = None) -> bool:
        """Wait until no action is queued or in flight; False at ``timeout``."""
        return self._lanes.wait_idle(timeout)

    def close(self, timeout: float = 10.0) -> bool:
        """Start no more actions and let those in flight record their answers (``gpuq serve``
        calls this before its writer closes); False when some still ran at ``timeout``."""
        return self._lanes.close(timeout)

    # -- the brakes ----------------------------------------------------------------------------------
    @property
    def paused(self) -> Pause | None:
        return self._paused

    def pause(self, now: float, by: str = "", reason: str = "") -> Pause:
        """Stop acting until :meth:`resume`; idempotent. Durable before it returns (the record is
        in the store, or fsynced in the writer's spill files that a restart replays first), so an
        acknowledged pause survives a crash right after it (issue 17)."""
        with self._lock:
            if self._paused is None:
                self._paused = Pause(ev.round_t(now), by, reason)
                self._emit_row(now, "pause", "", "", by=by, reason=reason)
                log.warning("acting paused by %s: %s", by or "?", reason or "no reason given")
            paused = self._paused
        self._persist()
        return paused

    def resume(self, now: float, by: str = "") -> bool:
        """Act again from the next cycle; False when it was not paused. Durable before it returns."""
        with self._lock:
            if self._paused is None:
                return False
            self._paused = None
            self._emit_row(now, "resume", "", "", by=by)
            log.warning("acting resumed by %s", by or "?")
        self._persist()
        return True

    def _persist(self) -> None:
        """Write what the sink holds now (outside the lock: the store may be slow); a sink that
        cannot be flushed (a plain list in tests) holds it already."""
        flush = getattr(self._sink, "flush", None)
        if flush is not None:
            flush()

    def note_reload(self, now: float, by: str, result: str) -> None:
        """Who reloaded the queue file over the API, as a cluster-wide ``reload`` row (``by``, and
        the result word in ``reason``: never the file's error, which viewers could read)."""
        with self._lock:
            self._emit_row(now, "reload", "", "", by=by, reason=result)

    def load_brakes(self, store: Any, now: float) -> None:
        """At start: the pause in force and the preemptions of the brake's window, from the store."""
        from scheduler.service.brakes import last_pause, recent_losses, recent_preemptions

        with self._lock:
            self._paused = last_pause(store, self.cluster_name)
            self.brake.load(recent_preemptions(store, self.cluster_name, now - self.brake.window_s))
            self._lost_recent.extendleft(reversed(recent_losses(store, self.cluster_name, now - COST_WINDOW_S)))

    def preemption_cost(self, now: float) -> dict[str, Any]:
        """What the preemptions of the last ``COST_WINDOW_S`` (a day) up to ``now`` threw away, in
        all and by the victim's queue (GPU-seconds, as their ``preempt`` events store them)."""
        with self._lock:
            recent = self._lost_recent
            while recent and recent[0][0] <= now - COST_WINDOW_S:
                recent.popleft()
            by: dict[str, float] = {}
            for t, q, lost in recent:
                if t <= now:
                    by[q] = by.get(q, 0.0) + lost
            return {"window_s": COST_WINDOW_S, "lost_gpu_seconds": round(sum(by.values()), 6),
                    "by_queue": {q: round(x, 6) for q, x in sorted(by.items())}}

    def status(self, now: float) -> dict[str, Any]:
        """The scheduler's acting status (``GET /scheduler/status``)."""
        with self._lock:
            p, b = self._paused, self.brake
            counts = b.counts(now)
            return {
                "paused": p is not None, "paused_since": p.since_s if p else None,
                "paused_by": p.by if p else None, "pause_reason": p.reason if p else None,
                "actuator": self.actuator.name,
                "in_flight": {wid: e.acting or CANCELLING for wid, e in self._entries.items()
                              if e.acting or e.cancelling},
                "preemption_limit": {"per_queue_per_hour": b.per_queue, "cluster_per_hour": b.cluster},
                "preemptions_last_hour": dict(sorted(counts.items())),
                "preemptions_limited": dict(sorted(b.limited.items())),
                "last_cycle_s": self.stats.last_cycle_s, "cycles": self.stats.cycles,
                "preemption_cost": self.preemption_cost(now),
            }

    # -- state transitions (each records its event) ------------------------------------------------
    def _start(self, e: Entry, placement: Placement, now: float, message: str, record: bool = True) -> None:
        w = e.workload
        self._touch(e)
        e.state, e.running, e.reason, e.message = RUNNING, Running(w, placement, now), None, message
        if e.left_s > 0:
            heapq.heappush(self._ends, (now + e.left_s, w.id))      # what _due_now finds
        self._pos.discard(w.id)
        if e.first_start_s is None:
            e.first_start_s = now
            if record:
                self.stats.observe_wait(w.queue, now - w.submit_s)
        if record:
            self._emit(now, "admit", w, gpu_type=placement.gpu_type, **placement_event(placement))
            self._ledger(e, now, None)
            bump(self.stats.admissions, w.queue)

    def _preempt(self, v: Entry, by: str, reason: str, now: float, record: bool = True,
                 lost: float | None = None) -> None:
        """``lost``: what the preemption threw away as stored (a replay); else from its run and its
        last checkpoint (:func:`scheduler.model.lost_gpu_seconds`)."""
        r = v.running
        assert r is not None
        self._touch(v)
        if lost is None:
            lost = round(lost_gpu_seconds(r, now, v.last_checkpoint_s), 6) + 0.0
        v.lost_last = lost
        v.lost_gpu_seconds += lost
        if record:
            self._ledger(v, r.start_s, now)
        if v.left_s > 0:
            v.left_s = max(0.0, v.left_s - (now - r.start_s)) if v.workload.checkpoint else v.workload.duration_s
        v.state, v.running, v.preempted = PENDING, None, v.preempted + 1
        self._pos.add(v.workload)
        v.reason = Reason(PREEMPTED, f"preempted by {by} at t={ev.round_t(now)}: {reason}")
        self._police(v)
        if record:
            self._emit(now, "preempt", v.workload, by=by, reason=reason, lost_gpu_seconds=lost)
            bump(self.stats.preemptions, v.workload.queue)
            q = v.workload.queue
            self.stats.lost_gpu_seconds[q] = self.stats.lost_gpu_seconds.get(q, 0.0) + lost
            self._lost_recent.append((ev.round_t(now), q, lost))

    def _finish(self, e: Entry, now: float, record: bool = True) -> None:
        self._close(e, FINISHED, now, None)
        if record:
            self._emit(now, "finish", e.workload)

    def _close(self, e: Entry, state: str, now: float, reason: Reason | None) -> None:
        self._touch(e)
        if e.running is not None:
            self._ledger(e, e.running.start_s, now)
        e.state, e.running, e.end_s, e.reason = state, None, now, reason
        self._pos.discard(e.workload.id)
        self._entries.pop(e.workload.id, None)
        wid = e.workload.id
        self._arrival.pop(wid, None)
        self._forget_done(wid)
        self._done[wid] = e
        self._done_by.setdefault(caller_name(e.owner), OrderedDict())[wid] = None
        while len(self._done) > self._keep_finished:
            owner = max(self._done_by, key=lambda o: len(self._done_by[o]))
            self._forget_done(next(iter(self._done_by[owner])))

    def _forget_done(self, wid: str) -> None:
        e = self._done.pop(wid, None)
        if e is not None:
            owner = caller_name(e.owner)
            ids = self._done_by[owner]
            del ids[wid]
            if not ids:
                del self._done_by[owner]

    def _emit(self, now: float, kind: str, w: Workload, spec: str = "", **extra: Any) -> None:
        self._emit_row(now, kind, w.id, w.queue, spec, **extra)
        self.forecasts.note(ev.round_t(now), kind, w)

    def _emit_row(self, now: float, kind: str, wid: str, queue: str, spec: str = "", **extra: Any) -> None:
        event = ev.event(now, kind, wid, queue, **extra)
        self._seq += 1
        self._last_t = max(self._last_t, event["t"])
        if self._sink is not None:
            self._sink.write(ev.TABLE, [ev.to_row(event, self._seq, self.cluster_name, spec)])
            self._journal.write(self._sink, event, self._seq, spec)

    def _ledger(self, e: Entry, start_s: float, end_s: float | None) -> None:
        """The admission's rows in the ledger (``gpu_allocations``, source ``admission``)."""
        if self._sink is not None and e.running is not None:
            self._sink.write("gpu_allocations", [admission_store_row(a) for a in self._admission(e, end_s)])

    def _admission(self, e: Entry, end_s: float | None = None) -> list[Allocation]:
        r = e.running
        assert r is not None
        return admission_rows(e.workload.id, e.workload.queue, cluster=self.cluster_name,
                              namespace=e.target.namespace, gpu_type=r.placement.gpu_type,
                              placement=[(n, float(g)) for n, g in r.placement.nodes], start_s=r.start_s, end_s=end_s,
                              priority=e.workload.priority, mig_model=self._config.mig_model(r.placement.gpu_type))

    # -- the ledger ---------------------------------------------------------------------------------
    def admitted_allocations(self) -> list[Allocation]:
        """What gpuq holds now, as ledger rows (one per node of each running workload)."""
        with self._lock:
            return [a for e in self._entries.values() if e.running is not None for a in self._admission(e)]

    def set_observed(self, observed: Sequence[Allocation], queue_of: Callable[[Allocation], str],
                     node_name: Callable[[Allocation], str], now: float, grace_s: float | None) -> None:
        """The ledger's observed allocations running now (deduplicated, no ``admission`` rows):
        those gpuq did not admit occupy their nodes and count for their queue; with ``grace_s``
        (None: no reconciliation, as with the dry-run actuator) every mismatch gets its reason."""
        with self._lock:
            for a in observed:          # work a placement rule bills to its namespace's queue: made here too
                path = queue_of(a) if a.namespace else ""
                if path and path not in self._config.queues and self._nsq.place(path, a.namespace) == path:
                    try:
                        self._make(path)
                    except QueueNotCreated:
                        pass                            # the accounting logs it and bills elsewhere
            targets = self._targets()
            types = {n.name: n.gpu_type for n in self._nodes}
            leaves = frozenset(_leaves(self._config))
            known = lambda wid: wid in self._entries or wid in self._done   # noqa: E731
            f = foreign(observed, known, targets, queue_of, leaves, node_name,
                        lambda node, a: types.get(node) or a.gpu_model or "unknown")
            if (f.running, dict(f.occupied)) != (self._foreign.running, dict(self._foreign.occupied)):
                self._cluster = None
            self._foreign = f
            if grace_s is None:
                self.mismatches = ()
                return
            running = {wid: (e.running, e.target) for wid, e in self._entries.items() if e.running is not None}
            managed = frozenset(e.target.namespace for e in (*self._entries.values(), *self._done.values())
                                if e.target.namespace)
            self.mismatches = tuple(reconcile(observed, running, targets, node_name, now, grace_s, managed,
                                              f.allocations))
            flagged = {m.workload: m for m in self.mismatches}
            for wid, e in self._entries.items():
                if e.running is None:
                    continue
                m = flagged.get(wid)
                if m is not None:
                    self._touch(e)
                    e.reason = Reason(m.kind, m.message)
                elif e.reason is not None and e.reason.code in (DRIFT, MISPLACED):
                    self._touch(e)
                    e.reason = None

    def record(self) -> tuple[list[Allocation], list[Placed]]:
        """What gpuq holds now, read at one moment: its admissions as ledger rows, and what it
        placed per (queue, GPU type, node), its own work and the foreign work it counts
        (:mod:`accounting.audit`)."""
        with self._lock:
            own = [e.running for e in self._entries.values() if e.running is not None]
            placed = [Placed(r.workload.queue, r.placement.gpu_type, node, float(n))
                      for r in (*own, *self._foreign.running) for node, n in r.placement.nodes]
            placed += [Placed(OTHER, t, node, float(n)) for node, (t, n) in self._foreign.occupied.items()]
            return self.admitted_allocations(), placed

    def foreign_running(self) -> tuple[Running, ...]:
        with self._lock:
            return self._foreign.running

    def _targets(self) -> dict[tuple[str, str], str]:
        return {(e.target.namespace, e.target.name): wid
                for wid, e in (*self._done.items(), *self._entries.items()) if e.target.name}

    # -- reads ------------------------------------------------------------------------------------
    def _active(self, workload_id: str) -> Entry:
        e = self._entries.get(workload_id)
        if e is None:
            done = self._done.get(workload_id)
            if done is not None:
                raise NotActive(workload_id, done.state)
            raise UnknownWorkload(workload_id)
        return e

    def _positions(self) -> dict[str, int]:
        """Every pending workload's position, sorted afresh (what :attr:`_pos` keeps up to date)."""
        pending = [e.workload for e in self._entries.values() if e.state == PENDING and not e.policy]
        return {w.id: i for lst in by_queue(pending).values() for i, w in enumerate(lst, 1)}

    def _view(self, e: Entry) -> WorkloadView:
        w, r, t = e.workload, e.running, e.target
        return WorkloadView(
            id=w.id, queue=w.queue, state=e.state, pods=w.pods, gpus_per_pod=gpus_out(w.gpus_per_pod), gpus=gpus_out(w.gpus),
            gpu_types=w.gpu_types, priority=w.priority, preemptible=w.preemptible, submit_s=w.submit_s,
            duration_s=w.duration_s or None, start_s=r.start_s if r else None, end_s=e.end_s,
            gpu_type=r.placement.gpu_type if r else None, placement=r.placement.as_output() if r else None,
            reason_code=e.reason.code if e.reason else None, message=e.reason.message if e.reason else None,
            position=self._pos.of(w.id) if e.state == PENDING else None,
            preempted=e.preempted, idle=w.id in self._idle and r is not None,
            target={"kind": t.kind, "namespace": t.namespace, "name": t.name},
            actuator_message=e.message, acting=e.acting or (CANCELLING if e.cancelling else None),
            expected_duration_s=w.expected_duration_s,
            eta=self.forecasts.eta(w.id) if e.state == PENDING else None,
            last_checkpoint_s=e.last_checkpoint_s, lost_gpu_seconds=round(e.lost_gpu_seconds, 6))

    def checkpoint(self, workload_id: str, at_s: float, now: float | None = None) -> WorkloadView:
        """Its submitter reports a checkpoint taken at ``at_s`` (issue 21): a preemption from now on
        throws away only the work since then. A report older than the last one is kept as the
        last (a late or repeated report never moves it back, and changes nothing: the Kubernetes
        source reports the annotation at every sync). One that moves it is kept in
        ``scheduler_state`` (reported at ``now``; default: the last event's time), so a restart
        still counts from it (:mod:`scheduler.service.replay`)."""
        with self._lock:
            e = self._active(workload_id)
            if e.last_checkpoint_s is None or at_s > e.last_checkpoint_s:
                self._touch(e)
                e.last_checkpoint_s = at_s
                self._seq += 1          # its own seq: a restart replays it in order (no scheduler_events row)
                t = ev.round_t(self._last_t if now is None else max(now, self._last_t))
                self._journal.write(self._sink, ev.event(t, CHECKPOINT, workload_id, e.workload.queue, at_s=at_s),
                                    self._seq)
            return self._view(e)

    def checkpoints(self) -> dict[str, float]:
        """The open workloads' last reported checkpoints (id -> Unix seconds)."""
        with self._lock:
            return {wid: e.last_checkpoint_s for wid, e in self._entries.items() if e.last_checkpoint_s is not None}

    def explain(self, workload_id: str) -> WorkloadView:
        with self._lock:
            e = self._entries.get(workload_id) or self._done.get(workload_id)
            if e is not None:
                return self._view(e)
        got = self.external.get(workload_id) if self.external is not None else None
        if got is None:
            raise UnknownWorkload(workload_id)
        return got  # type: ignore[no-any-return]

    def workloads(self, queue: str | None = None, state: str | None = None, limit: int | None = None,
                  offset: int = 0) -> list[WorkloadView]:
        """Active workloads in arrival order, then finished ones (oldest first); ``queue`` matches
        the queue or any queue below it; ``offset`` matches skipped, at most ``limit`` returned (a
        view is built only for those: a page of 50 out of 10,000 pending costs 50)."""
        with self._lock:
            done: Iterable[Entry] = () if state in (PENDING, RUNNING) else self._done.values()
            out: list[WorkloadView] = []
            for e in (*self._entries.values(), *done):
                if limit is not None and len(out) >= limit:
                    break
                q = e.workload.queue
                if queue and queue != ROOT and q != queue and not q.startswith(queue + "."):
                    continue
                if state and e.state != state:
                    continue
                if offset > 0:
                    offset -= 1
                    continue
                out.append(self._view(e))
        for v in self.external.views() if self.external is not None else ():    # another scheduler's, after
            if limit is not None and len(out) >= limit:
                break
            if queue and queue != ROOT and v.queue != queue and not v.queue.startswith(queue + "."):
                continue
            if state and v.state != state:
                continue
            if offset > 0:
                offset -= 1
                continue
            out.append(v)
        return out

    def nodes(self) -> list[NodeView]:
        with self._lock:
            cluster = self._cluster_now()
            used: dict[str, Gpus] = {}
            on: dict[str, list[str]] = {}
            own = (e.running for e in self._entries.values() if e.running is not None)
            shared: dict[str, dict[str, Gpus]] = {}
            for r in (*own, *self._foreign.running):       # foreign work holds its GPUs too
                for name, n in r.placement.nodes:
                    used[name] = used.get(name, 0) + n
                    on.setdefault(name, []).append(r.workload.id)
                for name, slot, share in r.placement.shares:      # which device each share is on
                    d = shared.setdefault(name, {})
                    d[str(slot)] = d.get(str(slot), 0) + share
            return [NodeView(n.name, n.gpu_type, n.gpus, gpus_out(used.get(n.name, 0)),
                             gpus_out(n.gpus - used.get(n.name, 0)), tuple(on.get(n.name, ())),
                             {k: gpus_out(v) for k, v in sorted(shared.get(n.name, {}).items(), key=lambda kv: int(kv[0]))})
                    for n in cluster.nodes]

    def preemptions(self, limit: int = 100) -> list[PreemptionRecord]:
        """The most recent preemptions, newest first."""
        with self._lock:
            return list(reversed(self._history))[:limit]

    def pending_demand(self) -> tuple[PendingDemand, ...]:
        """The pending workloads as the accounting's demand (its "now" view's ``pending``): which
        they are is read under the lock, the rows are built after it (10,000 rows took 10 ms of
        lock that every API answer waits for), and the same tuple comes back while nothing changed
        (the live view compares it by identity)."""
        with self._lock:
            key = (self._seq, len(self._entries))
            memo = self._pending_memo
            if memo is not None and memo[0] == key:
                return memo[1]
            pending = [(e.target.namespace, e.workload) for e in self._entries.values()
                       if e.state == PENDING and not e.not_allowed]
        c = self.cluster_name
        rows = tuple(PendingDemand(c, ns, w.id, w.queue, milli(float(w.gpus)), w.submit_s,
                                   w.gpu_types[0] if len(w.gpu_types) == 1 else "") for ns, w in pending)
        with self._lock:
            self._pending_memo = (key, rows)
        return rows

    def owns(self, namespace: str, name: str) -> bool:
        """Whether a pod's workload (its Ray cluster or its own name) is the target of a gpuq
        workload, as :func:`scheduler.service.ledger.owner_of` decides for allocations."""
        with self._lock:
            targets = self._targets()
        return owner_of_name(namespace, name, targets) is not None

    def counts(self) -> dict[tuple[str, str], int]:
        """(queue, state) -> active workloads, for the gauges."""
        with self._lock:
            out: dict[tuple[str, str], int] = {}
            for e in self._entries.values():
                key = (e.workload.queue, e.state)
                out[key] = out.get(key, 0) + 1
            return out

    # -- the cluster the core sees -------------------------------------------------------------------
    def _cluster_now(self) -> Cluster:
        if self._cluster is not None and self._departed:
            # a node that left stays while work holds it: built again once what it holds changed
            held = self._held()
            if any(held.get(name, ("", 0))[1] != h for name, h in self._departed.items()):
                self._cluster = None
        if self._cluster is None:
            self._cluster = build_cluster(self._config, self._with_held(self._nodes))
        return self._cluster

    def _held(self) -> dict[str, tuple[str, int]]:
        """node -> (GPU type, devices held there): the more of what runs there (gpuq's work and
        foreign work: what :meth:`nodes` shows used) and what the snapshots hold there (the same,
        less the victims being preempted, plus the admissions in flight on their placement). A
        device that shares hold part of counts whole (issue 19): devices are what a node has."""
        runs, seen = _Devices(), _Devices()
        for e in self._entries.values():
            r = e.running
            if r is not None:
                runs.add(r.placement)
                if e.acting != PREEMPTING:
                    seen.add(r.placement)
            elif e.acting == ADMITTING and e.plan is not None:
                seen.add(e.plan)
                for name, _ in e.plan.nodes:
                    runs.type.setdefault(name, e.plan.gpu_type)
        for r in self._foreign.running:
            runs.add(r.placement)
            seen.add(r.placement)
        a, b = runs.count(), seen.count()
        return {name: (t, max(a.get(name, 0), b.get(name, 0))) for name, t in runs.type.items()}

    def _with_held(self, nodes: tuple[Node, ...]) -> list[Node]:
        """``nodes``, kept large enough for what runs there and what admissions in flight hold; a
        node that left while work still holds it stays (as large as what it holds) until that
        changes (:meth:`_cluster_now` builds the cluster again), so the books balance and no
        snapshot places work on a node it does not have."""
        held = self._held()
        occupied = self._foreign.occupied
        out: list[Node] = []
        for node in nodes:
            t, h = held.pop(node.name, (node.gpu_type, 0))
            # GPUs held outside any leaf queue are not there for gpuq; what gpuq runs there always is
            gpus = max(h, node.gpus - occupied.get(node.name, ("", 0))[1], 0)
            out.append(node if gpus == node.gpus else dataclasses.replace(node, gpus=gpus))
        out.extend(Node(name, t, h) for name, (t, h) in sorted(held.items()))
        self._departed = {name: h for name, (_, h) in held.items()}
        return out

    # -- dry runs and restarts live in their own modules ------------------------------------------------
    def dry_run(self, workload: Workload, now: float, namespace: str = "") -> Any:
        """``namespace``: the target's; QueueNotAllowed as for :meth:`submit` (a queue the
        namespace's placement rule makes is made: asking counts as its first use)."""
        with self._lock:
            workload = self._named(workload, namespace)
            why = self._not_allowed(workload.queue, namespace)
            if why is not None:
                raise QueueNotAllowed(workload.queue, namespace, why)
            queue = self._placed(workload.queue, namespace)
            config = self._config
        if not _is_leaf(config, queue):
            # the message (near matches among up to 10,000 leaves) is computed without the lock
            raise InvalidWorkload("queue", leaf_problem(config, queue) or "")
        workload = dataclasses.replace(workload, queue=queue)
        seen: list[Any] = []                        # the dry run's snapshot, forecast after the locks

        def with_extra(extra: Sequence[Workload]) -> Any:
            seen.append(self._snapshot(extra=extra, core=True))
            return seen[-1]

        with self._deciding, self._lock:            # the cluster's memos: one schedule() at a time
            if not _is_leaf(self._config, workload.queue):       # the configuration changed meanwhile
                raise InvalidWorkload("queue", f"queue {workload.queue!r} is no longer a leaf queue")
            out = dry_run(workload, now, known=self._entries.keys() | self._done.keys(),
                          cluster=self._cluster_now(), snapshot=with_extra,
                          preemption_delay_s=self.settings.preemption_delay_s)
        return self.forecasts.dry_run(out, seen[0] if seen else None, now)

    def advice_input(self) -> tuple[Snapshot, Mapping[str, tuple[str, ...]]]:
        """What the advisor (:mod:`scheduler.service.advisor`) decides on: the snapshot the next
        cycle would see (not the cycle's: a copy it runs on a memo of its own) and, per foreign
        running workload, the workload ids of its rows (another scheduler's work by its id)."""
        with self._lock:
            return self._snapshot(), self._foreign.workload_ids

    def restore(self, stored: Iterable[ev.StoredEvent]) -> int:
        """Rebuild the state from stored events (before any submit); return the events replayed.
        The forecasts learn the finished workloads' running times from the same events."""
        stored = list(stored)
        with self._lock:
            self._cluster = None
            self._kept.drop()                       # (and the reasons are all read again)
            self._dirty, self._retold, self._told = set(), set(), {}
            n = self._replay(s for s in stored if s.event["event"] not in PAUSE_KINDS)
            self.forecasts.learn(s for s in stored if s.event["event"] != CHECKPOINT)
            for e in self._entries.values():        # the queues placement rules made before the restart
                path, ns = e.workload.queue, e.target.namespace
                if path not in self._config.queues and self._nsq.place(path, ns) == path:
                    try:
                        self._make(path)
                    except QueueNotCreated as exc:
                        log.warning("restore: %s (workload %s)", exc, e.workload.id)
            self._review()
            self._pos.rebuild(e.workload for e in self._entries.values() if e.state == PENDING and not e.not_allowed)
            for e in self._entries.values():
                if e.state == PENDING:
                    self._police(e)
            return n

    def _replay(self, stored: Iterable[ev.StoredEvent]) -> int:
        """Replay stored events into the state (the lock held): :mod:`scheduler.service.replay`'s rules."""
        n = skipped = 0
        journal = Journal(self.cluster_name)
        group: list[tuple[Entry, float, str, str]] = []      # preempt events of one (t, preemptor)

        def close_group() -> None:
            if group:
                _, t, by, reason = group[0]
                by_entry = self._entries.get(by)
                queue = by_entry.workload.queue if by_entry else ""
                self._history.append(PreemptionRecord(t, by, queue, tuple(e.workload.id for e, *_ in group),
                                                     tuple(e.workload.queue for e, *_ in group), reason,
                                                     round(sum(e.lost_last for e, *_ in group), 6)))
                group.clear()

        for se in stored:
            e, kind = se.event, se.event["event"]
            wid, t = e["workload"], float(e["t"])
            self._seq = max(self._seq, se.seq)
            self._last_t = max(self._last_t, t)
            if kind != "preempt" or (group and (group[0][1], group[0][2]) != (t, e.get("by", ""))):
                close_group()
            if not wid:
                continue                                        # cluster-wide rows (pause, resume)
            if kind == "submit":
                if not se.spec:
                    skipped += 1
                    continue
                w, target = ev.parse_spec(se.spec)
                journal.record(e, se.seq, se.spec)
                self._forget_done(wid)
                self._arrival.setdefault(wid, next(self._arrivals))
                self._entries[wid] = Entry(w, target, PENDING, w.duration_s,
                                          Reason(QUEUED, "restored after a restart; waiting for the next cycle"),
                                          owner=str(e.get("by", "")))
                n += 1
                continue
            entry = self._entries.get(wid)
            if entry is None:
                skipped += 1
                continue
            journal.record(e, se.seq)
            if kind == CHECKPOINT:
                at = float(e.get("at_s", 0.0))
                if entry.last_checkpoint_s is None or at > entry.last_checkpoint_s:
                    entry.last_checkpoint_s = at
            elif kind == "admit":
                placement = placement_of_event(e["gpu_type"], e["placement"], e.get("shares"))
                self._start(entry, placement, t, "restored", record=False)
            elif kind == "preempt" and entry.running is not None:
                self._preempt(entry, e.get("by", ""), e.get("reason", ""), t, record=False,
                              lost=float(e.get("lost_gpu_seconds", 0.0)))
                group.append((entry, t, e.get("by", ""), e.get("reason", "")))
            elif kind == "finish":
                self._finish(entry, t, record=False)
            elif kind in ("cancel", "reject"):
                self._close(entry, CANCELLED if kind == "cancel" else REJECTED, t,
                           Reason(CANCELLED if kind == "cancel" else "never_fits", e.get("reason", "")))
            n += 1
        close_group()
        self._journal = journal
        if self._sink is not None and journal.rows():           # a store from before scheduler_state
            self._sink.write(STATE_TABLE, journal.rows())
        if skipped:
            log.warning("restore: %d events skipped (their workload's submit is no longer stored)", skipped)
        log.info("restored %d events: %d workloads pending or running", n, len(self._entries))
        return n


_SET_CODE, _SET_MESSAGE = getattr(Reason, "code").__set__, getattr(Reason, "message").__set__


def _reason(code: str, message: str) -> Reason:
    """``Reason(code, message)``, built about twice as fast (the frozen dataclass's ``__init__``
    sets each field through ``object.__setattr__``): the cycle may give 40,000 new ones."""
    r = object.__new__(Reason)
    _SET_CODE(r, code)
    _SET_MESSAGE(r, message)
    return r


def _leaves(config: QueueConfig) -> tuple[str, ...]:
    return config.leaves()


def _is_leaf(config: QueueConfig, name: str) -> bool:
    queue = config.queues.get(name)
    return queue is not None and queue.is_leaf and name != ROOT


def caller_name(actor: str) -> str:
    """The token's name in an actor ``name (role)`` (the role may change; the caller is the same)."""
    name, sep, role = actor.rpartition(" (")
    return name if sep and role.endswith(")") else actor


def _where(p: Placement) -> str:
    return f"{p.gpu_type or 'any type'} ({', '.join(f'{n}:{g}' for n, g in p.nodes) or 'any node'})"


def _due(e: Entry, now: float) -> bool:
    r = e.running
    return r is not None and e.left_s > 0 and r.start_s + e.left_s <= now


def _parts(pending: Sequence[PendingReason]) -> tuple[Sequence[PendingReason], ...] | None:
    """The cycle's reasons queue by queue (built now), or None when they are a plain tuple."""
    return pending.parts() if isinstance(pending, PendingReasons) else None


class _AsSnapshot(Mapping[str, Entry]):
    """The entries as a cycle's snapshot saw them, for the decisions taken on it: those touched
    since as they were first touched (``then``), the others as they are (``live``). Only ``get``
    is meant; a decision names only workloads of the snapshot."""

    __slots__ = ("live", "then")

    def __init__(self, then: dict[str, Entry], live: dict[str, Entry]) -> None:
        self.then, self.live = then, live

    def get(self, key: str, default: Any = None) -> Any:
        e = self.then.get(key)
        return e if e is not None else self.live.get(key, default)

    def __getitem__(self, key: str) -> Entry:
        e = self.get(key)
        if e is None:
            raise KeyError(key)
        return e  # type: ignore[no-any-return]

    def __iter__(self) -> Iterator[str]:
        return iter(self.live)

    def __len__(self) -> int:
        return len(self.live)


class _Devices:
    """Devices held per node, from placements: a whole gang's GPUs, and each slot shares hold part
    of once (several gangs' shares on one device hold one device)."""

    __slots__ = ("slots", "type", "whole")

    def __init__(self) -> None:
        self.type: dict[str, str] = {}                   # node -> GPU type, in the order first met
        self.whole: dict[str, int] = {}
        self.slots: dict[str, set[int]] = {}

    def add(self, p: Placement) -> None:
        for name, _ in p.nodes:
            self.type.setdefault(name, p.gpu_type)
        if p.shares:
            for name, slot, _ in p.shares:
                self.slots.setdefault(name, set()).add(slot)
        else:
            for name, n in p.nodes:
                self.whole[name] = self.whole.get(name, 0) + int(n)

    def count(self) -> dict[str, int]:
        out = dict(self.whole)
        for name, s in self.slots.items():
            out[name] = out.get(name, 0) + len(s)
        return out
