"""``gpuq serve`` with ``queues_from: kueue``: gpuq advises, Kueue acts (docs/KUEUE.md, "Live mode").

The Kubernetes collector stores Kueue's objects as they change (``kueue_objects``,
:mod:`collector.k8s_kueue`); this module reads them back from the store, as the accounting reads
everything the collectors write:

* :class:`KueueQueues` is the queue tree's source in place of the queue file: the same
  ``poll() -> Reload`` as :class:`accounting.watcher.QueueConfigWatcher`, so it goes through the same
  reload path (:meth:`scheduler.service.accounting.LiveAccounting.reload`: offered to the scheduler,
  the last good configuration kept when it is refused). At each poll the ResourceFlavors, Cohorts,
  ClusterQueues and LocalQueues stored live are read; when they changed (a digest of their JSON),
  :func:`accounting.queue_import.kueue.from_kueue` builds the tree and
  :func:`accounting.queues.parse_queue_config` checks it. An error keeps the last good tree and is
  logged naming the object it comes from (the importer's origin of the queue the error names). What
  the import could not carry over exactly (its findings) is logged once per change.
* :class:`KueueWorkloads` turns the stored Workloads into what the API shows: one
  :class:`~scheduler.service.views.WorkloadView` each (id ``kueue/<namespace>/<name>``), in
  ``/workloads`` and ``gpuq explain`` after gpuq's own, and the pending ones as pending demand of
  their queue in ``/queues``. Admitted (quota reserved): ``running``, with their ClusterQueue, flavor
  assignment and pod counts; pending: ``pending`` with Kueue's own reason (the ``QuotaReserved``
  condition's reason and message, after an eviction the ``Evicted`` one's too) and a position among the
  pending Workloads of their ClusterQueue: Kueue's own (``positionInClusterQueue`` of its visibility
  API, 0-based there, 1-based here), where the collector stored a fresh answer for that ClusterQueue
  naming the Workload (:mod:`collector.k8s_kueue_visibility`), else computed in Kueue's order as the
  Workloads show it (priority, then the time it was queued: created, or evicted last);
  ``position_source`` says which (``kueue`` | ``computed``); finished: ``finished``.
  Their GPUs held count through the ledger (source ``kueue``, :mod:`accounting.ledger`), not here.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from decimal import Decimal
from typing import Any

from accounting.errors import QueueConfigError
from accounting.model import PendingDemand, milli
from accounting.queues import QueueConfig, parse_queue_config
from accounting.watcher import Reload
from gpuq.k8sobj import condition, is_true, k8s_seconds, parse_quantity
from scheduler.model import Gpus, Workload, exact, gpus_out
from scheduler.service.views import FINISHED, PENDING, RUNNING, Advice, WorkloadView

log = logging.getLogger(__name__)

TREE_KINDS = ("ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue")
SUMMARY = "PendingWorkloadsSummary"     # the collector's stored answers of Kueue's visibility API
# an answer older than this many of its polling intervals, plus the slack, is stale (its collector stopped);
# the slack covers the writer's batching and the store between the collector's poll and serve's read
FRESH_INTERVALS, FRESH_SLACK_S = 3, 60.0
GPU = "nvidia.com/gpu"
PREFIX = "kueue/"
Reader = Callable[[Sequence[str]], list[dict[str, Any]]]


def store_reader(store: Any) -> Reader:
    """The live objects of these kinds in ``kueue_objects`` (all clusters), as parsed JSON."""
    def read(kinds: Sequence[str]) -> list[dict[str, Any]]:
        rows = store.query(
            f"SELECT kind, namespace, name, object FROM {store.database}.kueue_objects FINAL "
            f"WHERE deleted = 0 AND has({{k:Array(String)}}, kind) ORDER BY cluster, kind, namespace, name",
            {"k": list(kinds)}).rows
        out = []
        for kind, ns, name, text in rows:
            try:
                obj = json.loads(text)
            except ValueError as exc:
                log.error("kueue_objects: %s %s/%s is not JSON: %s", kind, ns, name, exc)
                continue
            obj.setdefault("kind", kind)
            out.append(obj)
        return out
    return read


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    ns = meta.get("namespace")
    return f"{obj.get('kind', '?')} {ns + '/' if ns else ''}{meta.get('name', '?')}"


class KueueQueues:
    """The queue tree from Kueue's stored objects (the module's first point); the interface of
    :class:`accounting.watcher.QueueConfigWatcher` that :class:`LiveAccounting` uses."""

    path = "Kueue's objects (kueue_objects)"
    required_at_start = False          # the collector may not have listed them yet: start empty
    kinds: tuple[str, ...] = TREE_KINDS     # what the tree is built from
    scheduler = "kueue"

    def __init__(self, read: Reader) -> None:
        self._read = read
        self._digest: str | None = None
        self.config: QueueConfig | None = None
        self.error: QueueConfigError | None = None
        self.generation = 0
        self.findings: tuple[Any, ...] = ()

    def _import(self, objects: list[dict[str, Any]]) -> Any:
        """The importer's answer (:class:`accounting.queue_import.report.Imported`) for these objects."""
        from accounting.queue_import.kueue import from_kueue

        return from_kueue(objects, source="kueue")

    def poll(self) -> Reload:
        try:
            objects = self._read(self.kinds)
        except Exception as exc:  # noqa: BLE001 - the store is down: keep what is in force
            log.warning("cannot read %s from the store, the queue tree stays: %s", self.path, exc)
            return Reload.UNCHANGED
        digest = hashlib.sha256(json.dumps(objects, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
        if digest == self._digest:
            return Reload.UNCHANGED
        self._digest = digest
        try:
            imported = self._import(objects)
        except Exception as exc:  # noqa: BLE001 - the importer names the object it could not read
            self.error = QueueConfigError(self.path, f"cannot import: {exc}")
            return Reload.REJECTED
        try:
            config = parse_queue_config(imported.data, source="queues", strict_top=True)
        except QueueConfigError as exc:
            origin = _origin(exc.where, imported.origins)
            self.error = QueueConfigError(f"{origin} (as {exc.where})" if origin else exc.where, exc.reason)
            return Reload.REJECTED
        if imported.findings != self.findings:
            for f in imported.findings:
                log.warning("%s, not carried over exactly: %s", self.scheduler, f.line())
            self.findings = imported.findings
        self.config, self.error = config, None
        self.generation += 1
        return Reload.LOADED


def _origin(where: str, origins: Mapping[str, str]) -> str:
    """The object a configuration error comes from: the importer's origin of the longest queue
    path the error's place names (``queues.a.b.max`` -> the origin of ``a.b``)."""
    path = where.removeprefix("queues.")
    parts = path.split(".")
    for n in range(len(parts), 0, -1):
        got = origins.get(".".join(parts[:n]))
        if got:
            return got
    return ""


# -- the Workloads ----------------------------------------------------------------------------------
def _gpus_of(value: Any) -> float:
    """A GPU quantity (``"4"``, ``4``, ``"500m"``) in GPUs; 0 when unreadable."""
    try:
        return parse_quantity(value)
    except (TypeError, ValueError):
        return 0.0


def _requested(obj: Mapping[str, Any]) -> tuple[int, float]:
    """Pods and GPUs a Workload asks for: its admission's pod sets when admitted, else its spec's
    pod sets (count times each container's ``nvidia.com/gpu`` request or limit)."""
    admission = (obj.get("status") or {}).get("admission") or {}
    sets = admission.get("podSetAssignments") or ()
    if sets:
        return (sum(int(s.get("count") or 0) for s in sets),
                sum(_gpus_of((s.get("resourceUsage") or {}).get(GPU, 0)) for s in sets))
    pods, gpus = 0, 0.0
    for count, per_pod in _pod_sets(obj):
        pods += count
        gpus += count * per_pod
    return pods, gpus


def _pod_sets(obj: Mapping[str, Any]) -> Iterator[tuple[int, float]]:
    """(pods, GPUs per pod) of each of a Workload's spec's pod sets: its count, and the sum over
    its pod template's containers and init containers of their ``nvidia.com/gpu`` request, else
    limit."""
    for ps in (obj.get("spec") or {}).get("podSets") or ():
        count = int(ps.get("count") or 0)
        spec = ((ps.get("template") or {}).get("spec")) or {}
        per_pod = 0.0
        for c in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
            res = c.get("resources") or {}
            per_pod += _gpus_of((res.get("requests") or {}).get(GPU, (res.get("limits") or {}).get(GPU, 0)))
        yield count, per_pod


def gang(obj: Mapping[str, Any]) -> tuple[int, float] | str:
    """A pending Workload as one of gpuq's gangs: (pods, GPUs per pod) of its pod sets that ask
    GPUs (a Ray head without GPUs takes none), or why it cannot be one (gpuq's gangs are uniform:
    pod sets asking different GPUs per pod are not)."""
    sizes: dict[float, int] = {}
    for count, per_pod in _pod_sets(obj):
        if per_pod > 0 and count > 0:
            sizes[per_pod] = sizes.get(per_pod, 0) + count
    if len(sizes) > 1:
        return ("its pod sets ask different GPUs per pod (" + ", ".join(
            f"{n} x {g:g}" for g, n in sorted(sizes.items())) + "); gpuq's gangs are uniform")
    if not sizes:
        return "it asks no GPUs"
    (per, pods), = sizes.items()
    return pods, per


def _flavors(obj: Mapping[str, Any]) -> str:
    admission = (obj.get("status") or {}).get("admission") or {}
    parts = []
    for s in admission.get("podSetAssignments") or ():
        flavors = s.get("flavors") or {}
        flavor = flavors.get(GPU) or next(iter(flavors.values()), "")
        parts.append(f"{s.get('name', '?')}: {int(s.get('count') or 0)} pods on flavor {flavor or '?'}"
                     + (f" ({GPU} {(s.get('resourceUsage') or {}).get(GPU)})" if GPU in (s.get("resourceUsage") or {})
                        else ""))
    return "; ".join(parts)


def pending_reason(obj: Mapping[str, Any]) -> tuple[str, str]:
    """Kueue's own reason a Workload is not admitted: (code, message). The code is
    ``kueue_<Reason>`` of the ``QuotaReserved`` condition when false (``Pending``, ``Inadmissible``),
    ``kueue_QuotaReserved`` while admission checks run, ``kueue_NotAttempted`` without conditions
    (Kueue tried only the head of a StrictFIFO queue); an eviction's reason and message come first."""
    parts = []
    evicted = condition(obj, "Evicted")
    if evicted is not None and str(evicted.get("status")) == "True":
        parts.append(f"evicted ({evicted.get('reason') or '?'}): {evicted.get('message') or ''}".rstrip(": "))
    reserved = condition(obj, "QuotaReserved")
    if reserved is not None and str(reserved.get("status")) == "False":
        code = f"kueue_{reserved.get('reason') or 'Pending'}"
        parts.append(str(reserved.get("message") or reserved.get("reason") or ""))
    elif reserved is not None:                     # quota reserved, admission checks pending
        code = "kueue_QuotaReserved"
        admitted = condition(obj, "Admitted")
        parts.append(str((admitted or {}).get("message") or "quota reserved; waiting for admission checks"))
    else:
        code = "kueue_NotAttempted"
        parts.append("Kueue has not tried to admit it yet")
    return code, "Kueue: " + "; ".join(p for p in parts if p)


class KueueWorkloads:
    """The stored Workloads as views and pending demand (the module's second point). :meth:`refresh`
    reads them (every accounting interval); the reads are served from what it built."""

    def __init__(self, read: Reader, queue_of: Callable[[str, str, str], str],
                 clock: Callable[[], float] = time.time) -> None:
        self._read = read
        self._queue_of = queue_of                # (namespace, local queue, cluster queue) -> queue path
        self._clock = clock                      # wall clock: the visibility answers' age
        self._lock = threading.Lock()
        self._views: dict[str, WorkloadView] = {}
        self._demand: tuple[PendingDemand, ...] = ()
        self._asks: dict[str, Workload | str] = {}      # pending, as the advisor's workloads
        self._advice: dict[str, Advice] = {}            # the advisor's last answers, by id
        self._eta: dict[str, dict[str, str]] = {}        # gpuq's start-time forecasts of the pending, by id
        self._combined: tuple[tuple[PendingDemand, ...], tuple[PendingDemand, ...], tuple[PendingDemand, ...]] | None = None

    def refresh(self) -> None:
        try:
            workloads = self._read(("Workload",))
            local = {((o.get("metadata") or {}).get("namespace", ""), (o.get("metadata") or {}).get("name", "")):
                     str((o.get("spec") or {}).get("clusterQueue") or "") for o in self._read(("LocalQueue",))}
            summaries = self._read((SUMMARY,))
        except Exception as exc:  # noqa: BLE001 - keep the last views
            log.warning("cannot read Kueue's Workloads from the store: %s", exc)
            return
        views, demand, asks = build(workloads, local, self._queue_of, kueue_positions(summaries, self._clock()))
        with self._lock:
            self._views, self._demand, self._asks = views, demand, asks
            self._advice = {wid: a for wid, a in self._advice.items() if wid in asks}
            self._eta = {wid: e for wid, e in self._eta.items() if wid in asks}

    def _with(self, v: WorkloadView) -> WorkloadView:
        """``v`` with the advisor's advice and forecast (``_lock`` held)."""
        a, e = self._advice.get(v.id), self._eta.get(v.id)
        return v if a is None and e is None else dataclasses.replace(v, advice=a, eta=e)

    def views(self) -> list[WorkloadView]:
        with self._lock:
            return [self._with(v) for v in self._views.values()]

    def get(self, workload_id: str) -> WorkloadView | None:
        with self._lock:
            v = self._views.get(workload_id)
            return None if v is None else self._with(v)

    def finished(self) -> list[tuple[Workload, float]]:
        """The finished workloads whose running time is known (reservation to finish), as the
        forecasts' duration model learns them (:meth:`Forecasts.external`)."""
        with self._lock:
            views = list(self._views.values())
        return [(Workload(v.id, v.queue, pods=max(v.pods, 1), gpus_per_pod=_exact(float(v.gpus_per_pod) or 1.0),
                          priority=v.priority), v.end_s - v.start_s)
                for v in views if v.state == FINISHED and v.start_s is not None and v.end_s is not None
                and v.end_s >= v.start_s]

    def advise(self, service: Any, now: float) -> None:
        """gpuq's own scheduler's advice on each pending Workload (:mod:`scheduler.service.advisor`):
        one run of the core on the live cycle's snapshot with them all added, the Workloads Kueue
        admitted (those whose pods run) as victims it may choose. Called every accounting interval,
        after :meth:`refresh` and the service's observed allocations."""
        from scheduler.service.advisor import advise

        with self._lock:
            asks = self._asks
        if not asks:
            with self._lock:
                self._advice, self._eta = {}, {}
            return
        got = advise(service, self.shaped(service, asks), self.running(service), now)
        eta: dict[str, dict[str, str]] = {}
        if got.snapshot is not None and got.first is not None:
            try:                            # gpuq's forecast of them, forward from the same run
                eta = service.forecasts.external(got.snapshot, got.first, now, got.targets, self.finished())
            except Exception:  # noqa: BLE001 - the advice stands without a forecast
                log.exception("the start-time forecast of %s's pending workloads failed", self.scheduler)
        with self._lock:
            self._advice, self._eta = got.advice, eta

    scheduler = "Kueue"

    def shaped(self, service: Any, asks: Mapping[str, Workload | str]) -> Mapping[str, Workload | str]:
        """The pending workloads as the advisor takes them (Kueue's: as built; their types are their
        flavors', which the advisor reads from their queue)."""
        return asks

    def running(self, service: Any) -> dict[str, int]:
        """The admitted workloads the advice may name as victims: their priority by id."""
        with self._lock:
            return {wid: v.priority for wid, v in self._views.items() if v.state == RUNNING}

    def demand(self, scheduled: Sequence[PendingDemand]) -> tuple[PendingDemand, ...]:
        """The scheduler's pending demand and Kueue's pending Workloads: the same tuple while both
        are unchanged (the live view is computed again only when its inputs change)."""
        with self._lock:
            mine = self._demand
            hit = self._combined
            if hit is not None and hit[0] is scheduled and hit[1] is mine:
                return hit[2]
            out = (*scheduled, *mine)
            self._combined = (tuple(scheduled) if not isinstance(scheduled, tuple) else scheduled, mine, out)
            return out


def kueue_positions(summaries: Iterable[Mapping[str, Any]], now: float) -> dict[tuple[str, str, str], int]:
    """Kueue's own positions (``positionInClusterQueue``, 0-based) by (ClusterQueue, namespace, name),
    from the stored visibility answers still fresh at ``now``: fetched at most ``FRESH_INTERVALS`` of
    their polling intervals and ``FRESH_SLACK_S`` ago (an answer the collector stopped renewing is not
    trusted)."""
    out: dict[tuple[str, str, str], int] = {}
    for s in summaries:
        stamp = s.get("gpuq") or {}
        fetched = k8s_seconds(stamp.get("fetched"))
        try:
            interval = float(stamp.get("interval_s") or 0)
        except (TypeError, ValueError):
            interval = 0.0
        if fetched is None or interval <= 0 or now - fetched > FRESH_INTERVALS * interval + FRESH_SLACK_S:
            continue
        cq = str((s.get("metadata") or {}).get("name") or "")
        for item in s.get("items") or ():
            meta = (item or {}).get("metadata") or {}
            pos = item.get("positionInClusterQueue")
            if isinstance(pos, int) and not isinstance(pos, bool) and pos >= 0:
                out[(cq, str(meta.get("namespace") or ""), str(meta.get("name") or ""))] = pos
    return out


def build(workloads: Iterable[Mapping[str, Any]], local: Mapping[tuple[str, str], str],
          queue_of: Callable[[str, str, str], str], kueue_position: Mapping[tuple[str, str, str], int] | None = None,
          ) -> tuple[dict[str, WorkloadView], tuple[PendingDemand, ...], dict[str, Workload | str]]:
    """Views (by id), pending demand, and the pending Workloads the advisor decides on: each as one
    of gpuq's workloads (id, queue, gang, Kueue's priority, queued since), or why it cannot be one
    (pure: the module's rules). ``kueue_position``: Kueue's own 0-based positions by (ClusterQueue,
    namespace, name) (:func:`kueue_positions`); a pending Workload it names shows that one."""
    rows = []
    for obj in workloads:
        meta = obj.get("metadata") or {}
        spec = obj.get("spec") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        admission = (obj.get("status") or {}).get("admission") or {}
        lq = str(spec.get("queueName") or "")
        cq = str(admission.get("clusterQueue") or local.get((ns, lq), ""))
        if is_true(obj, "Finished"):
            state = FINISHED
        elif admission and is_true(obj, "QuotaReserved") and not is_true(obj, "Evicted"):
            state = RUNNING
        else:
            state = PENDING
        evicted = condition(obj, "Evicted")
        queued = k8s_seconds((evicted or {}).get("lastTransitionTime")) if state == PENDING and evicted else None
        created = k8s_seconds(meta.get("creationTimestamp")) or 0.0
        rows.append((obj, ns, name, lq, cq, state, queued or created, created))
    order: dict[str, list[tuple[int, float, str]]] = {}
    for obj, ns, name, _, cq, state, queued, _ in rows:
        if state == PENDING:
            order.setdefault(cq, []).append((-int((obj.get("spec") or {}).get("priority") or 0), queued,
                                             f"{ns}/{name}"))
    position = {key: i for lst in order.values() for i, (_, _, key) in enumerate(sorted(lst), 1)}
    kueue_position = kueue_position or {}
    views: dict[str, WorkloadView] = {}
    demand = []
    asks: dict[str, Workload | str] = {}
    for obj, ns, name, lq, cq, state, queued, created in rows:
        meta = obj.get("metadata") or {}
        wid = f"{PREFIX}{ns}/{name}"
        queue = queue_of(ns, lq, cq)
        pods, gpus = _requested(obj)
        shape = gang(obj)
        if isinstance(shape, tuple) and abs(shape[0] * shape[1] - gpus) < 1e-9:
            pods = shape[0]        # the pods that ask GPUs (a Ray head without GPUs is not one of them)
        refs = sorted((meta.get("ownerReferences") or ()), key=lambda r: not r.get("controller"))
        owner = refs[0] if refs else {}
        reserved = condition(obj, "QuotaReserved")
        start = k8s_seconds((reserved or {}).get("lastTransitionTime")) if state == RUNNING else None
        finished = condition(obj, "Finished")
        if state == FINISHED and admission:     # its last reservation, where Kueue still shows it
            admitted = condition(obj, "Admitted") or reserved
            if admitted is not None and str(admitted.get("status")) == "True":
                start = k8s_seconds(admitted.get("lastTransitionTime"))
        code, message = pending_reason(obj) if state == PENDING else (None, None)
        at, source = None, None
        if state == PENDING:
            got = kueue_position.get((cq, ns, name))
            at, source = (got + 1, "kueue") if got is not None else (position.get(f"{ns}/{name}"), "computed")
        actuator = (f"admitted by Kueue to ClusterQueue {cq}: {_flavors(obj)}" if state == RUNNING
                    else f"Kueue ClusterQueue {cq or '?'} (LocalQueue {ns}/{lq or '?'})")
        priority = int((obj.get("spec") or {}).get("priority") or 0)
        views[wid] = WorkloadView(
            id=wid, queue=queue, state=state, pods=pods, gpus_per_pod=gpus_out(gpus / pods) if pods else 0,
            gpus=gpus_out(gpus), gpu_types=(), priority=priority, preemptible=True, submit_s=created,
            duration_s=None, start_s=start,
            end_s=k8s_seconds((finished or {}).get("lastTransitionTime")) if state == FINISHED else None,
            gpu_type=None, placement=None, reason_code=code, message=message,
            position=at, position_source=source, preempted=0, idle=False,
            target={"kind": str(owner.get("kind") or "Workload"), "namespace": ns,
                    "name": str(owner.get("name") or name), "workload": name, "scheduler": "kueue"},
            actuator_message=actuator)
        if state == PENDING and gpus > 0 and (obj.get("spec") or {}).get("active", True) is not False:
            demand.append(PendingDemand("", ns, wid, queue, milli(gpus), queued))
            shape = gang(obj)
            asks[wid] = shape if isinstance(shape, str) else Workload(
                wid, queue, pods=shape[0], gpus_per_pod=_exact(shape[1]), priority=priority, submit_s=queued)
    return views, tuple(demand), asks


def _exact(gpus: float) -> Gpus:
    """GPUs per pod as the core counts them: an int when whole, else exact thousandths."""
    return int(gpus) if gpus == int(gpus) else exact(Decimal(str(round(gpus, 3))))
