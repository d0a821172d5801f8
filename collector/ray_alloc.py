"""Ledger rows from Ray: ``gpu_allocations`` with ``source='placement_group'`` and ``'ray_job'``.

GPU amounts are Ray's: fractions of a GPU (``num_gpus=0.5``), which Ray keeps in fixed point, in
ten-thousandths of a unit (:data:`RAY_UNITS`). They are summed in that unit, exactly, and each
allocation's sum is rounded once to the ledger's milli-GPUs (:func:`milli_of_units`, half up), so
sixteen tasks of 1/16 GPU make 1 GPU and no float drift reaches the store.

Placement groups

One allocation per placement group per node that holds GPU bundles of it:

* ``pod`` = the group's name, ``uid`` = ``<placement group id>/<node>``, ``namespace`` and
  ``queue`` '' (the accounting resolves the queue through the workload), ``node`` =
  :func:`gpuq.ray_names.ray_node_name` of the bundles' node, ``gpu_model`` = the node's
  ``accelerator_type:<T>`` resource (the first, if several), ``gpu_resource`` ``GPU``, ``gpus`` =
  the GPUs of the group's bundles on that node, ``workload_id`` = the gpuq id of a group named
  ``gpuq-<id>`` (:func:`gpuq.ray_names.workload_of_placement_group`), else ''.
* ``start``: the State API's ``stats.creation_request_received_ns`` when given, else the time the
  group was first seen placed. ``end``: the time it was first seen ``REMOVED``, or the time it was
  missing from a complete list (Ray forgets removed groups after a while).
* ``version`` as in :mod:`collector.k8s_alloc`: ``ms(start)*10+1`` open, ``ms(end)*10+8`` removed,
  ``ms(end)*10+9`` gone from the list; an end outranks its start.

:class:`PlacementGroupLedger` keeps the open allocations of one cluster between rounds (the
scrape targets themselves are rebuilt every round) and emits a row only when something changed.
After a restart it starts from the open ``placement_group`` rows in the store
(``open_allocations``, the loader the Kubernetes watcher uses), so a group removed meanwhile is
closed at the first complete list.

Ray jobs: tasks and actors outside placement groups

What a placement group holds is the group's; what Ray gives a task or an actor of its own
(``@ray.remote(num_gpus=0.5)``, a job's ``entrypoint_num_gpus``) reaches the ledger as
``source='ray_job'``: one allocation per Ray job per node, the sum of the GPUs its running tasks
and alive actors outside placement groups hold there (:func:`gpu_holders`, from the State API's
``/api/v0/tasks`` and ``/api/v0/actors`` with ``detail=true``):

* a task counts while its state is ``RUNNING``, ``RUNNING_IN_RAY_GET`` or ``RUNNING_IN_RAY_WAIT``
  (a task blocked in ``ray.get`` gives back its CPUs, not its GPUs), a normal task or an actor's
  constructor still running (an actor task holds nothing of its own: its actor does); an actor
  counts while ``ALIVE``. Its GPUs are ``required_resources["GPU"]``; one with a
  ``placement_group_id`` is left out (its resources are ``GPU_group_<id>``, the group's bundles).
* the job: a job submitted through the Jobs API is named by its submission id, its tasks (by
  their ``job_id``) and the ``JobSupervisor`` actor Ray starts for it with its
  ``entrypoint_num_gpus`` (named ``_ray_internal_job_actor_<submission id>``, in another job of
  Ray's own) alike; a driver started with ``ray.init`` by its job id (``01000000``).
  ``workload_id`` and ``queue`` are the job's ``gpuq.workload`` and ``gpuq.queue`` metadata (set
  by gpuq's Ray actuator), else ''.
* ``pod`` = the job's name, ``namespace`` '', ``node`` = :func:`gpuq.ray_names.ray_node_name`,
  ``gpu_model`` as for groups, ``gpu_resource`` ``GPU``, ``uid`` =
  ``job:<name>/<node>@<ms(start)>``: each amount a job holds on a node is its own row.
* **When**: tasks come and go between rounds, so an allocation holds one amount: when the sum
  changes, the row ends and the next opens at the round that saw the change (version order 8),
  and a job no longer holding GPUs on a node ends there at the first complete round that misses
  it (order 9). Every boundary is a round's time, starts included (actors carry no start time,
  and a task's end is only seen at the next round): each boundary is late by less than one
  interval, starts and ends alike, so a task is billed about its run on average, and the books
  integrate exactly what the rows say.
* **Incomplete rounds**: when a list is truncated (as many entries as the limit), Ray reports a
  partial failure, or an entry cannot be read, amounts may rise and rows open, but nothing ends
  or falls: what was accepted before is not lost to a missing entry. (Ray's count of dropped task
  events is cumulative over the cluster's life, not about this answer, so it is not taken as
  truncation.)

:class:`RayJobLedger` keeps these open allocations between rounds as the group ledger does, and
after a restart starts from the open ``ray_job`` rows in the store.
"""
from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from collector.errors import CollectorError
from collector.k8s_alloc import CLOSED_BY_RELIST, ENDED, OPEN, Allocation, version_of
from gpuq.ray_names import ray_node_name, workload_of_placement_group

SOURCE = "placement_group"
JOB_SOURCE = "ray_job"
ACCEL_PREFIX = "accelerator_type:"
PLACED = frozenset({"CREATED", "RESCHEDULING"})
RAY_UNITS = 10_000                 # Ray's fixed point: a resource in ten-thousandths
RUNNING_TASK_STATES = ("RUNNING", "RUNNING_IN_RAY_GET", "RUNNING_IN_RAY_WAIT")
HOLDING_TASK_TYPES = frozenset({"NORMAL_TASK", "ACTOR_CREATION_TASK"})
# Ray's Jobs API runs each submission's entrypoint under an actor of this name and namespace
# (ray.dashboard.modules.job.common: JOB_ACTOR_NAME_TEMPLATE, SUPERVISOR_ACTOR_RAY_NAMESPACE).
SUPERVISOR_PREFIX = "_ray_internal_job_actor_"
SUPERVISOR_NAMESPACE = "SUPERVISOR_ACTOR_RAY_NAMESPACE"
WORKLOAD_KEY, QUEUE_KEY = "gpuq.workload", "gpuq.queue"     # scheduler.actuators.ray's metadata
OpenAllocations = Callable[[str], Iterable["Allocation | Sequence[Any]"]]


def ray_units(value: Any) -> int:
    """A Ray resource amount (JSON number) -> ten-thousandths. Raises ValueError for anything that
    is not a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 \
            or value == float("inf"):
        raise ValueError(f"{value!r} is not a resource amount")
    return round(value * RAY_UNITS)


def milli_of_units(units: int) -> int:
    """Ten-thousandths -> milli-GPUs, half up (0.0625 GPU is 63 milli-GPUs)."""
    return (units + 5) // 10


def gpu_models(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """node id -> GPU type from ``resources_total`` (``accelerator_type:H100`` -> ``H100``)."""
    out = {}
    for n in nodes:
        types = sorted(k[len(ACCEL_PREFIX):] for k in (n.get("resources_total") or {})
                       if str(k).startswith(ACCEL_PREFIX))
        if n.get("node_id") and types:
            out[str(n["node_id"])] = types[0]
    return out


def _created(pg: Mapping[str, Any]) -> dt.datetime | None:
    ns = (pg.get("stats") or {}).get("creation_request_received_ns")
    try:
        value = int(ns)  # type: ignore[arg-type]  # a missing one raises TypeError, caught
    except (TypeError, ValueError):
        return None
    return dt.datetime.fromtimestamp(value / 1e9, dt.UTC) if value > 0 else None


def bundle_units(pg: Mapping[str, Any]) -> dict[str, int]:
    """node id -> GPU of the group's bundles there, in ten-thousandths (bundles not placed and
    amounts that are not numbers are left out)."""
    per_node: dict[str, int] = {}
    for b in pg.get("bundles") or []:
        try:
            units = ray_units((b.get("unit_resources") or {}).get("GPU", 0))
        except ValueError:
            continue
        if b.get("node_id") and units > 0:
            per_node[b["node_id"]] = per_node.get(b["node_id"], 0) + units
    return per_node


def pg_allocations(pg: Mapping[str, Any], *, cluster: str, models: Mapping[str, str],
                   seen_at: dt.datetime) -> list[Allocation]:
    """The open allocations a placed group implies (pure); [] for one holding no GPU."""
    start = _created(pg) or seen_at
    name, pg_id = str(pg.get("name") or ""), str(pg.get("placement_group_id") or "")
    return [Allocation(cluster, "", name, f"{pg_id}/{ray_node_name(node)}", "", ray_node_name(node),
                       models.get(node, ""), "GPU", milli / 1000, 0, "", start, None, version_of(start, OPEN),
                       SOURCE, workload_of_placement_group(name))
            for node, units in sorted(bundle_units(pg).items()) if (milli := milli_of_units(units)) > 0]


def close(alloc: Allocation, at: dt.datetime, order: int) -> Allocation:
    end = max(at, alloc.start)
    return replace(alloc, end=end, version=version_of(end, order))


def _open_rows(load: OpenAllocations | None, cluster: str, source: str) -> list[Allocation]:
    got = load(cluster) if load is not None else []
    rows = [a if isinstance(a, Allocation) else Allocation.from_row(a) for a in got]
    return [a for a in rows if a.source == source and a.open]


class PlacementGroupLedger:
    """Open placement-group allocations of one cluster, across rounds. Thread-safe."""

    def __init__(self, cluster: str, open_allocations: OpenAllocations | None = None) -> None:
        self.cluster = cluster
        self._load = open_allocations
        self._open: dict[str, Allocation] | None = None          # uid -> open allocation
        self._models: dict[str, str] = {}
        self._lock = threading.Lock()

    def _loaded(self) -> dict[str, Allocation]:
        if self._open is None:
            self._open = {a.uid: a for a in _open_rows(self._load, self.cluster, SOURCE)}
        return self._open

    def round(self, pgs: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]] | None,
              now: dt.datetime, complete: bool = True) -> list[Allocation]:
        """This round's changes: new allocations, and ends. ``nodes`` None: the node list could not
        be read (the last models are used); ``complete`` False (a truncated or partial list):
        nothing is closed for missing from it."""
        with self._lock:
            open_ = self._loaded()
            if nodes is not None:
                self._models.update(gpu_models(nodes))
            out: list[Allocation] = []
            placed: set[str] = set()
            for pg in pgs:
                state = pg.get("state")
                if state in PLACED:
                    for a in pg_allocations(pg, cluster=self.cluster, models=self._models, seen_at=now):
                        placed.add(a.uid)
                        if a.uid not in open_:
                            open_[a.uid] = a
                            out.append(a)
                elif state == "REMOVED":
                    prefix = f"{pg.get('placement_group_id') or ''}/"
                    for uid in [u for u in open_ if u.startswith(prefix)]:
                        out.append(close(open_.pop(uid), now, ENDED))
            if complete:
                for uid in [u for u in open_ if u not in placed]:
                    out.append(close(open_.pop(uid), now, CLOSED_BY_RELIST))
            return out

    @property
    def open(self) -> list[Allocation]:
        with self._lock:
            return sorted(self._loaded().values(), key=lambda a: a.uid)


# -- Ray jobs ---------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class RayJob:
    """What the ledger names a Ray job by: ``name`` (its submission id, else its job id) and the
    gpuq workload and queue of its metadata."""

    name: str
    workload_id: str = ""
    queue: str = ""


@dataclass(frozen=True, slots=True)
class GpuHolder:
    """A running task or alive actor outside placement groups that holds GPUs."""

    job: RayJob
    node_id: str
    units: int                   # GPU, ten-thousandths
    what: str                    # "task <id>" / "actor <id>", for messages


def _meta(entry: Mapping[str, Any], key: str) -> str:
    value = (entry.get("metadata") or {}).get(key) if isinstance(entry.get("metadata"), dict) else None
    return value if isinstance(value, str) else ""


def job_index(jobs: Iterable[Mapping[str, Any]]) -> tuple[dict[str, RayJob], dict[str, RayJob]]:
    """The Jobs API's list -> ({job id: job}, {submission id: job})."""
    by_id: dict[str, RayJob] = {}
    by_submission: dict[str, RayJob] = {}
    for j in jobs:
        job_id, sid = j.get("job_id") or "", j.get("submission_id") or ""
        job = RayJob(str(sid or job_id), _meta(j, WORKLOAD_KEY), _meta(j, QUEUE_KEY))
        if job_id:
            by_id[str(job_id)] = job
        if sid:
            by_submission[str(sid)] = job
    return by_id, by_submission


def _gpu_units(entry: Mapping[str, Any]) -> int:
    resources = entry.get("required_resources")
    if resources is None:
        return 0
    if not isinstance(resources, dict):
        raise ValueError(f"required_resources is {resources!r}, not an object")
    try:
        return ray_units(resources.get("GPU", 0))
    except ValueError:
        raise ValueError(f"required_resources.GPU is {resources.get('GPU')!r}, not an amount") from None


Listed = tuple[str, Sequence[Mapping[str, Any]]]       # (the URL, its entries)


def gpu_holders(tasks: Iterable[Listed], actors: Listed,
                jobs: Iterable[Mapping[str, Any]]) -> tuple[list[GpuHolder], list[CollectorError]]:
    """The GPU holders outside placement groups (the module's *Ray jobs*), and an error per entry
    that cannot be read (naming its URL, index and id; the other entries are kept). A task listed
    twice (its state changed between two of the lists) counts once; an actor's constructor
    counts unless the actor is in the alive list already."""
    by_id, by_submission = job_index(jobs)
    out: list[GpuHolder] = []
    errors: list[CollectorError] = []

    def job_of(job_id: Any) -> RayJob:
        return by_id.get(str(job_id or "")) or RayJob(str(job_id or ""))

    def holder(url: str, i: int, entry: Mapping[str, Any], kind: str, id_key: str) -> tuple[str, int] | None:
        what = f"{kind} {entry.get(id_key) or '?'}"
        try:
            units = _gpu_units(entry)
            if units and not isinstance(entry.get("node_id"), str):
                raise ValueError(f"node_id is {entry.get('node_id')!r}")
        except ValueError as exc:
            errors.append(CollectorError(f"{url}: result[{i}] ({what}): {exc}", source=url))
            return None
        return (what, units) if units and not entry.get("placement_group_id") else None

    url, entries = actors
    alive: set[str] = set()
    for i, a in enumerate(entries):
        if a.get("state") != "ALIVE":
            continue
        alive.add(str(a.get("actor_id") or ""))
        got = holder(url, i, a, "actor", "actor_id")
        if got is None:
            continue
        name = str(a.get("name") or "")
        if a.get("ray_namespace") == SUPERVISOR_NAMESPACE and name.startswith(SUPERVISOR_PREFIX):
            sid = name[len(SUPERVISOR_PREFIX):]
            job = by_submission.get(sid) or RayJob(sid)
        else:
            job = job_of(a.get("job_id"))
        out.append(GpuHolder(job, a["node_id"], got[1], got[0]))
    seen: set[str] = set()
    for url, entries in tasks:
        for i, t in enumerate(entries):
            task_id = str(t.get("task_id") or "")
            if (t.get("state") not in RUNNING_TASK_STATES or t.get("type") not in HOLDING_TASK_TYPES
                    or task_id in seen or (t.get("type") == "ACTOR_CREATION_TASK" and t.get("actor_id") in alive)):
                continue
            got = holder(url, i, t, "task", "task_id")
            if got is None:
                continue
            seen.add(task_id)
            out.append(GpuHolder(job_of(t.get("job_id")), t["node_id"], got[1], got[0]))
    return out, errors


def job_allocations(holders: Iterable[GpuHolder]) -> dict[tuple[str, str], tuple[RayJob, int]]:
    """(job name, node id) -> (job, milli-GPUs): each job's holders summed per node in Ray's unit,
    rounded once; sums that round to 0 are left out."""
    units: dict[tuple[str, str], tuple[RayJob, int]] = {}
    for h in holders:
        key = (h.job.name, h.node_id)
        prev = units.get(key)
        units[key] = (h.job if prev is None else prev[0], h.units + (prev[1] if prev else 0))
    return {k: (job, m) for k, (job, u) in units.items() if (m := milli_of_units(u)) > 0}


class RayJobLedger:
    """Open ``ray_job`` allocations of one cluster, across rounds. Thread-safe."""

    def __init__(self, cluster: str, open_allocations: OpenAllocations | None = None) -> None:
        self.cluster = cluster
        self._load = open_allocations
        self._open: dict[tuple[str, str], Allocation] | None = None    # (job name, node) -> open row
        self._stale: list[Allocation] = []      # loaded open rows that a later one of their key replaces
        self._models: dict[str, str] = {}
        self._lock = threading.Lock()

    def _loaded(self) -> dict[tuple[str, str], Allocation]:
        if self._open is None:
            self._open = {}
            for a in sorted(_open_rows(self._load, self.cluster, JOB_SOURCE), key=lambda r: (r.start, r.uid)):
                if (prev := self._open.get((a.pod, a.node))) is not None:
                    self._stale.append(prev)
                self._open[(a.pod, a.node)] = a
        return self._open

    def _row(self, job: RayJob, node_id: str, milli: int, start: dt.datetime) -> Allocation:
        node = ray_node_name(node_id)
        return Allocation(self.cluster, "", job.name, f"job:{job.name}/{node}@{_ms(start)}", job.queue, node,
                          self._models.get(node_id, ""), "GPU", milli / 1000, 0, "", start, None,
                          version_of(start, OPEN), JOB_SOURCE, job.workload_id)

    def round(self, holders: Iterable[GpuHolder], nodes: Iterable[Mapping[str, Any]] | None,
              now: dt.datetime, complete: bool = True) -> list[Allocation]:
        """This round's changes: rows that open, rows that end. ``nodes`` None: the last GPU
        models are used; ``complete`` False: nothing ends or falls (the module's *Incomplete
        rounds*)."""
        with self._lock:
            open_ = self._loaded()
            out = [close(a, now, ENDED) for a in self._stale]
            self._stale.clear()
            if nodes is not None:
                self._models.update(gpu_models(nodes))
            held = job_allocations(holders)
            for (name, node_id), (job, milli) in sorted(held.items()):
                key = (name, ray_node_name(node_id))
                prev = open_.get(key)
                if prev is not None:
                    had = round(prev.gpus * 1000)
                    if (had, prev.workload_id, prev.queue) == (milli, job.workload_id, job.queue) \
                            or (not complete and had > milli):
                        continue
                    out.append(close(prev, now, ENDED))
                open_[key] = self._row(job, node_id, milli, now)
                out.append(open_[key])
            if complete:
                still = {(name, ray_node_name(node_id)) for name, node_id in held}
                for key in [k for k in open_ if k not in still]:
                    out.append(close(open_.pop(key), now, CLOSED_BY_RELIST))
            return out

    @property
    def open(self) -> list[Allocation]:
        with self._lock:
            return sorted(self._loaded().values(), key=lambda a: a.uid)


def _ms(t: dt.datetime) -> int:
    return version_of(t, 0) // 10
