"""A cluster's workloads over a window, as the store saw them: :class:`History` (``gpuq whatif``).

:func:`read_history` rebuilds it from the store:

* **gpuq's workloads** from ``scheduler_events`` (:mod:`scheduler.events`): each workload's shape,
  priority, preemptibility and checkpointing from the ``spec`` of its ``submit`` row, and its runs
  (admit to preempt, finish or cancel; still open at the window's end: running then) with where
  they ran. Every workload whose life overlaps the window is taken, with the events before the
  window too, so one submitted before it and still waiting or running at its start is known.
* **foreign work** from the ledger (``gpu_allocations``, :mod:`accounting.ledger`): the
  allocations that belong to no gpuq workload (no workload id, no top owner or Ray cluster that
  is a gpuq workload's target), each one run on one node.
* **nodes** from the accounting's inventory (the same rule as the live scheduler's nodes), at the
  window's end, else at the last instant the collectors saw nodes; plus the declared nodes file,
  and any node a run was placed on that neither knows (as large as what was placed on it at once).

Each :class:`Entry` carries an ``origin`` (who scheduled it: ``gpuq``, ``foreign``) and a ``kind``:
``workload`` (replayed through the scheduler) or ``fixed`` (held as it happened). Another
scheduler's workloads in the ledger (Kueue's Workloads, YuniKorn's applications: workload ids
``kueue/...``, ``yunikorn/...``) are ``kind: workload`` entries of its origin (:func:`_other`), and
the what-if replays them like gpuq's. :meth:`History.to_json` /
:func:`from_json` keep a history in a file (``gpuq whatif --out``; the API's replay gets its input
that way, in a process of its own).

:func:`record_replay` is the other direction: it writes a simulator replay into a store as the live
service would have (``gpuq simulate ... --store``): its events with the submitted specs, its nodes
as node events, admissions and the fixed load as ledger rows; so a store can be filled from a
trace.
"""
from __future__ import annotations

import datetime as dt
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuq.k8sobj import k8s_seconds
from scheduler import events as ev
from scheduler.model import Gpus, from_milli, gpus_in, gpus_out
from scheduler.errors import ScenarioError

VERSION = 1
GPUQ, FOREIGN = "gpuq", "foreign"                   # origins
WORKLOAD, FIXED = "workload", "fixed"               # kinds
KUEUE, YUNIKORN = "kueue", "yunikorn"               # origins of another scheduler's workloads
OTHER_PREFIXES = ("kueue/", "yunikorn/")            # their workload ids in the ledger
FINISHED, RUNNING, PENDING, CANCELLED, REJECTED = "finished", "running", "pending", "cancelled", "rejected"
STATES = (FINISHED, RUNNING, PENDING, CANCELLED, REJECTED)


@dataclass(frozen=True, slots=True)
class Run:
    """One run: from ``start_s`` to ``end_s`` (``None``: still running at the window's end), of
    ``placement`` (node -> GPUs) of one GPU type. Times are Unix seconds."""

    start_s: float
    end_s: float | None
    gpu_type: str
    placement: Mapping[str, Gpus]         # a gang of shares: shares per node (issue 19)

    @property
    def gpus(self) -> Gpus:
        return sum(self.placement.values(), 0)

    def output(self) -> dict[str, int | float]:
        return {k: gpus_out(v) for k, v in self.placement.items()}

    def within(self, start_s: float, end_s: float) -> float:
        """Seconds of this run inside ``[start_s, end_s]``."""
        stop = end_s if self.end_s is None else min(self.end_s, end_s)
        return max(0.0, stop - max(self.start_s, start_s))


@dataclass(frozen=True, slots=True)
class Entry:
    """A workload of the history. ``state`` is where it stood at the window's end (one of
    :data:`STATES`); ``declared_s`` the running time it was submitted with (0: none declared)."""

    id: str
    queue: str
    origin: str
    kind: str
    submit_s: float
    state: str
    runs: tuple[Run, ...] = ()
    pods: int = 1
    gpus_per_pod: Gpus = 1
    gpu_types: tuple[str, ...] = ()
    priority: int = 0
    preemptible: bool = True
    checkpoint: bool = False
    originator: bool = False
    declared_s: float = 0.0
    namespace: str = ""
    preemptions: int = 0          # preempt events inside the window


    @property
    def gpus(self) -> Gpus:
        return self.pods * self.gpus_per_pod


@dataclass(frozen=True, slots=True)
class HistNode:
    """A node: ``source`` says where it is known from (``inventory``, ``declared``, ``placements``)."""

    name: str
    gpu_type: str
    gpus: int
    source: str = "inventory"


@dataclass(frozen=True, slots=True)
class History:
    cluster: str
    start_s: float
    end_s: float
    nodes: tuple[HistNode, ...]
    entries: tuple[Entry, ...]
    notes: tuple[str, ...] = field(default=())      # what was left out while reading, for people

    def to_json(self) -> dict[str, Any]:
        return {
            "version": VERSION, "cluster": self.cluster, "start_s": self.start_s, "end_s": self.end_s,
            "nodes": [{"name": n.name, "gpu_type": n.gpu_type, "gpus": n.gpus, "source": n.source} for n in self.nodes],
            "entries": [_entry_json(e) for e in self.entries],
            "notes": list(self.notes),
        }


def _entry_json(e: Entry) -> dict[str, Any]:
    return {
        "id": e.id, "queue": e.queue, "origin": e.origin, "kind": e.kind, "submit_s": e.submit_s,
        "state": e.state, "pods": e.pods, "gpus_per_pod": gpus_out(e.gpus_per_pod), "gpu_types": list(e.gpu_types),
        "priority": e.priority, "preemptible": e.preemptible, "checkpoint": e.checkpoint,
        "originator": e.originator, "declared_s": e.declared_s, "namespace": e.namespace,
        "preemptions": e.preemptions,
        "runs": [{"start_s": r.start_s, "end_s": r.end_s, "gpu_type": r.gpu_type, "placement": r.output()}
                 for r in e.runs],
    }


def from_json(data: Any, source: str = "<history>") -> History:
    """A :class:`History` from :meth:`History.to_json`'s mapping; a ScenarioError names the field."""
    def fail(where: str, reason: str) -> ScenarioError:
        return ScenarioError(where, reason, source)

    if not isinstance(data, Mapping):
        raise fail("(top)", f"expected a mapping, got {type(data).__name__}")
    if data.get("version") != VERSION:
        raise fail("version", f"expected {VERSION}, got {data.get('version')!r}")
    try:
        nodes = tuple(HistNode(str(n["name"]), str(n["gpu_type"]), int(n["gpus"]), str(n.get("source", "inventory")))
                      for n in data["nodes"])
        entries = []
        for i, e in enumerate(data["entries"]):
            if e.get("kind") not in (WORKLOAD, FIXED) or e.get("state") not in STATES:
                raise fail(f"entries[{i}]", f"kind must be {WORKLOAD} or {FIXED} and state one of {', '.join(STATES)}")
            runs = tuple(Run(float(r["start_s"]), None if r.get("end_s") is None else float(r["end_s"]),
                             str(r["gpu_type"]), {str(k): gpus_in(v) for k, v in dict(r["placement"]).items()})
                         for r in e.get("runs") or ())
            entries.append(Entry(
                str(e["id"]), str(e["queue"]), str(e["origin"]), str(e["kind"]), float(e["submit_s"]), str(e["state"]),
                runs, int(e.get("pods", 1)), gpus_in(e.get("gpus_per_pod", 1)), tuple(map(str, e.get("gpu_types") or ())),
                int(e.get("priority", 0)), bool(e.get("preemptible", True)), bool(e.get("checkpoint", False)),
                bool(e.get("originator", False)), float(e.get("declared_s", 0.0)), str(e.get("namespace", "")),
                int(e.get("preemptions", 0))))
        return History(str(data["cluster"]), float(data["start_s"]), float(data["end_s"]), nodes, tuple(entries),
                       tuple(map(str, data.get("notes") or ())))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise fail("(history)", f"not a history written by gpuq whatif: {type(exc).__name__}: {exc}") from None


def load_json(path: str) -> History:
    from pathlib import Path

    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise ScenarioError("(file)", f"cannot read history: {exc.strerror or exc}", path) from exc
    except ValueError as exc:
        raise ScenarioError("(file)", f"invalid JSON: {exc}", path) from exc
    return from_json(data, path)


# -- reading the store -----------------------------------------------------------------------------
def _ms(t: float) -> int:
    return round(t * 1000)


_EVENTS = """
SELECT toUnixTimestamp64Milli(ts) / 1000, event, workload, queue, gpu_type, placement_milli, spec
FROM {db}.scheduler_events
WHERE cluster = {c:String} AND ts <= fromUnixTimestamp64Milli({t1:Int64}, 'UTC') AND workload != ''
  AND event IN ('submit', 'admit', 'preempt', 'finish', 'reject', 'cancel')
  AND workload IN (
    SELECT workload FROM {db}.scheduler_events
    WHERE cluster = {c:String} AND ts <= fromUnixTimestamp64Milli({t1:Int64}, 'UTC') AND workload != ''
      AND event IN ('submit', 'admit', 'preempt', 'finish', 'reject', 'cancel')
    GROUP BY workload
    HAVING max(ts) >= fromUnixTimestamp64Milli({t0:Int64}, 'UTC')
        OR argMax(event, (ts, t, seq)) IN ('submit', 'admit', 'preempt'))
ORDER BY ts, t, seq"""


class _Life:
    """One workload's life as its events tell it (a submit opens a new one)."""

    def __init__(self, wid: str, queue: str, submit_s: float, spec: str) -> None:
        self.id, self.queue, self.submit_s, self.spec = wid, queue, submit_s, spec
        self.runs: list[Run] = []
        self.open: Run | None = None
        self.state = PENDING
        self.ended: float | None = None         # when it finished, was cancelled or rejected
        self.preempted_at: list[float] = []

    def close(self, t: float) -> None:
        if self.open is not None:
            r = self.open
            self.runs.append(Run(r.start_s, t, r.gpu_type, r.placement))
            self.open = None


def _lives(rows: Iterable[Sequence[Any]], start_s: float) -> tuple[list[_Life], int]:
    """The lives overlapping the window; and how many workloads had events but no submit row
    (their submit is older than the table keeps)."""
    current: dict[str, _Life] = {}
    out: list[_Life] = []
    orphans: set[str] = set()
    life: _Life | None
    for ts, kind, wid, queue, gpu_type, placement, spec in rows:
        t, wid = float(ts), str(wid)
        if kind == "submit":
            life = _Life(wid, str(queue), t, str(spec))
            current[wid] = life
            out.append(life)
            continue
        life = current.get(wid)
        if life is None:
            orphans.add(wid)
            continue
        if kind == "admit":
            life.close(t)
            life.open = Run(t, None, str(gpu_type), {str(k): from_milli(int(v)) for k, v in dict(placement).items()})
            life.state = RUNNING
        elif kind == "preempt":
            life.close(t)
            life.preempted_at.append(t)
            life.state = PENDING
        elif kind in ("finish", "cancel"):
            ran = life.open is not None or bool(life.runs)
            life.close(t)
            life.state = FINISHED if kind == "finish" or ran else CANCELLED
            life.ended = t
        elif kind == "reject":
            life.state = REJECTED
            life.ended = t
    keep = [life for life in out if life.ended is None or life.ended >= start_s]
    for life in keep:
        if life.open is not None:
            life.runs.append(life.open)
            life.open = None
    return keep, len(orphans)


def _spec(life: _Life) -> dict[str, Any]:
    try:
        data = json.loads(life.spec) if life.spec else {}
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _entry(life: _Life, wid: str, start_s: float) -> Entry:
    data = _spec(life)
    target = data.get("target") or {}
    return Entry(
        id=wid, queue=life.queue, origin=GPUQ, kind=WORKLOAD, submit_s=life.submit_s, state=life.state,
        runs=tuple(life.runs), pods=int(data.get("pods", 1)), gpus_per_pod=gpus_in(data.get("gpus_per_pod", 1)),
        gpu_types=tuple(map(str, data.get("gpu_types") or ())), priority=int(data.get("priority", 0)),
        preemptible=bool(data.get("preemptible", True)), checkpoint=bool(data.get("checkpoint", False)),
        originator=bool(data.get("originator", False)), declared_s=float(data.get("duration_s") or 0.0),
        namespace=str(target.get("namespace", "")), preemptions=sum(t >= start_s for t in life.preempted_at))


def read_history(store: Any, cluster: str, start_s: float, end_s: float, config: Any,
                 declared: Sequence[tuple[str, str, int]] = ()) -> History:
    """The history of ``cluster``'s scheduler (``scheduler_events.cluster``) over ``[start_s,
    end_s]``; ``config`` (a QueueConfig) resolves the foreign work's queues and the nodes' GPU
    types as the accounting does; ``declared``: the nodes file's ``(name, gpu_type, gpus)``."""
    from accounting.resolve import Resolver

    resolver = Resolver(config)
    sql = _EVENTS.replace("{db}", store.database)
    rows = store.query(sql, {"c": cluster, "t0": _ms(start_s), "t1": _ms(end_s)}).rows
    lives, orphans = _lives(rows, start_s)
    notes = []
    if orphans:
        notes.append(f"{orphans} workload(s) with events but no submit (older than the store keeps): left out")
    count: dict[str, int] = {}
    entries: list[Entry] = []
    for life in lives:
        n = count[life.id] = count.get(life.id, 0) + 1
        entries.append(_entry(life, life.id if n == 1 else f"{life.id}#{n}", start_s))
    targets = {(e.namespace, str((_spec(life).get("target") or {}).get("name", ""))): e.id
               for e, life in zip(entries, lives) if e.namespace}
    nodes = _nodes(store, start_s, end_s, resolver, declared)
    from accounting.model import Window
    from accounting.store_adapter import read_ledger

    ledger, _ = read_ledger(store, Window(start_s, end_s), end_s)
    many = len({c for c, _ in nodes}) > 1
    foreign, fnotes = _foreign(ledger, end_s, resolver, targets, many)
    notes += fnotes
    other, onotes = _other(ledger, end_s, resolver, many, _workload_objects(store))
    foreign += other
    notes += onotes
    names = {name for _, name in nodes}
    out_nodes = [HistNode(name, t, g, src) for (_, name), (t, g, src) in sorted(nodes.items(), key=lambda kv: kv[0][1])]
    # nodes only the placements name: as large as what was placed on them at once
    for name, (t, g) in sorted(_placed_peaks([*entries, *foreign]).items()):
        if name not in names:
            out_nodes.append(HistNode(name, t, math.ceil(g), "placements"))
            notes.append(f"node {name} is in no inventory: taken as {g} {t} GPUs, the most placed on it at once")
    return History(cluster, start_s, end_s, tuple(out_nodes), (*entries, *foreign), tuple(notes))


def _nodes(store: Any, start_s: float, end_s: float, resolver: Any,
           declared: Sequence[tuple[str, str, int]]) -> dict[tuple[str, str], tuple[str, int, str]]:
    """(cluster, scheduler name) -> (GPU type, GPUs, source): the inventory as the live scheduler
    builds its nodes (schedulable, at least one whole GPU; ``cluster/node`` with several clusters)."""
    from accounting.store_adapter import read_nodes

    observed = read_nodes(store, end_s)
    if not observed:               # Ray's nodes age out after 10 minutes: the last instant they were seen
        last = store.query(
            f"SELECT toUnixTimestamp64Milli(max(ts)) / 1000, count() FROM (SELECT ts FROM {store.database}.ray_nodes "
            f"WHERE ts <= fromUnixTimestamp64Milli({{t1:Int64}}, 'UTC') UNION ALL SELECT ts FROM "
            f"{store.database}.ray_resources WHERE ts <= fromUnixTimestamp64Milli({{t1:Int64}}, 'UTC'))",
            {"t1": _ms(end_s)}).rows
        if last and last[0][1]:
            observed = read_nodes(store, float(last[0][0]))
    usable = [n for n in observed if n.schedulable and n.gpus >= 1]
    many = len({n.cluster for n in usable}) > 1
    out: dict[tuple[str, str], tuple[str, int, str]] = {}
    for n in sorted(usable, key=lambda n: (n.cluster, n.node, n.gpu_model)):
        name = f"{n.cluster}/{n.node}" if many else n.node
        t = resolver.gpu_type(n.gpu_model)
        if (n.cluster, name) in out:
            name = f"{name}:{t}"
        out[(n.cluster, name)] = (t, int(n.gpus), "inventory")
    names = {name for _, name in out}
    for name, t, g in declared:
        if name not in names:
            out[("", name)] = (t, int(g), "declared")
    return out


def _foreign(rows: Sequence[Any], end_s: float, resolver: Any,
             targets: Mapping[tuple[str, str], str], many: bool) -> tuple[list[Entry], list[str]]:
    """The ledger's allocations over the window that are no workload's: fixed load."""
    from accounting.ledger import ADMISSION

    leaves = set(resolver.config.leaves())
    out: list[Entry] = []
    fractional = 0
    seen: dict[str, int] = {}
    for a in rows:
        if a.source == ADMISSION or a.workload_id or _owned(a, targets):     # gpuq's (accounting.ledger)
            continue
        gpus = int(round(a.gpus))
        if gpus < 1:
            fractional += 1
            continue
        queue = resolver.queue(a.queue, a.namespace)
        node = f"{a.cluster}/{a.node}" if many else a.node
        base = f"{a.namespace}/{a.pod}" if a.namespace else a.pod
        k = seen[base] = seen.get(base, 0) + 1
        end = None if a.end_s is None or a.end_s > end_s else a.end_s
        gpu_type = resolver.gpu_type(a.gpu_model, a.gpu_resource)
        out.append(Entry(base if k == 1 else f"{base}#{k}", queue if queue in leaves else "", FOREIGN, FIXED,
                         a.start_s, RUNNING if end is None else FINISHED,
                         (Run(a.start_s, end, gpu_type, {node: gpus}),), 1, gpus, (gpu_type,), a.priority,
                         False, namespace=a.namespace))
    notes = [f"{fractional} foreign allocation(s) of less than one GPU: left out"] if fractional else []
    return out, notes


def _workload_objects(store: Any) -> dict[tuple[str, str], dict[str, Any]]:
    """Kueue's Workloads as the store last saw them (``kueue_objects``, deleted ones included: their
    last state), by (namespace, name); {} where the store has none."""
    try:
        rows = store.query(f"SELECT namespace, name, object FROM {store.database}.kueue_objects FINAL "
                           "WHERE kind = 'Workload' ORDER BY cluster, namespace, name").rows
    except Exception:  # noqa: BLE001 - a store from before the table: no Workload is known
        return {}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for ns, name, text in rows:
        try:
            obj = json.loads(text)
        except ValueError:
            continue
        if isinstance(obj, dict):
            out[(str(ns), str(name))] = obj
    return out


def _reservations(rows: Iterable[Any]) -> list[Any]:
    """Kueue's rows as its reservations, by start: the ledger's pieces of one (what of it was not
    seen yet, :func:`accounting.ledger.kueue_segments`) joined again, to the last one's end, at
    the first piece's GPUs, from the reservation's own start: the collector's uid
    ``kueue/<ns>/<name>@<ms of the reservation>`` holds it (a window may have left out the pieces
    before it), else the first piece's start."""
    from accounting.ledger import reservation_of

    by: dict[str, list[Any]] = {}
    for a in rows:
        by.setdefault(reservation_of(a.uid), []).append(a)
    out = []
    for uid, pieces in by.items():
        pieces.sort(key=lambda a: a.start_s)
        first, last = pieces[0], pieces[-1]
        _, _, ms = uid.rpartition("@")
        start = int(ms) / 1000 if ms.isdigit() and int(ms) / 1000 <= first.start_s else first.start_s
        out.append(replace(first, uid=uid, start_s=start, end_s=last.end_s))
    return sorted(out, key=lambda a: a.start_s)


def _other(rows: Sequence[Any], end_s: float, resolver: Any, many: bool,
           objects: Mapping[tuple[str, str], Mapping[str, Any]]) -> tuple[list[Entry], list[str]]:
    """Another scheduler's workloads as workloads of their queues (origin ``kueue``, ``yunikorn``),
    not fixed load: the ledger's rows whose workload id is ``kueue/<ns>/<name>`` (the Workload's
    own rows, source ``kueue``: one per quota reservation, and its pods) or ``yunikorn/<ns>/<app>``
    (an application's pods). Each reservation (Kueue) is one run: from the reservation to the end
    of its last pod (its own end when no pod was seen), on its pods' nodes; the pods of a YuniKorn
    application make one run. The shape is the stored Workload's gang (its pod sets that ask GPUs,
    :func:`scheduler.service.kueue.gang`), else its pods' (as many pods as the largest run had,
    each the most GPUs one held); its priority Kueue's; submitted at the Workload's creation where
    the store has it, else at its first run (no wait is known)."""
    from scheduler.service.kueue import gang

    leaves = set(resolver.config.leaves())
    groups: dict[str, list[Any]] = {}
    for a in rows:
        if a.workload_id.startswith(OTHER_PREFIXES):
            groups.setdefault(a.workload_id, []).append(a)
    out: list[Entry] = []
    odd = 0
    for wid, members in sorted(groups.items()):
        origin, _, rest = wid.partition("/")
        ns, _, name = rest.partition("/")
        holds = _reservations(a for a in members if a.source == KUEUE)
        pods = sorted((a for a in members if a.source != KUEUE and a.node), key=lambda a: a.start_s)
        starts = [h.start_s for h in holds] or ([pods[0].start_s] if pods else [])
        if not starts:
            continue
        by_run: list[list[Any]] = [[] for _ in starts]
        for a in pods:                       # a pod belongs to the last reservation before it started
            k = max((i for i, t in enumerate(starts) if t <= a.start_s + 1e-3), default=0)
            by_run[k].append(a)
        runs = []
        for k, t0 in enumerate(starts):
            got = by_run[k]
            ends = [a.end_s for a in got] if got else ([holds[k].end_s] if holds else [None])
            end = None if any(e is None or e > end_s for e in ends) else max(e for e in ends if e is not None)
            placement: dict[str, Gpus] = {}
            for a in got:
                node = f"{a.cluster}/{a.node}" if many else a.node
                placement[node] = placement.get(node, 0) + from_milli(a.counted_milli)
            first = got[0] if got else holds[k]
            runs.append(Run(t0, end, resolver.gpu_type(first.gpu_model, first.gpu_resource), placement))
        obj = objects.get((ns, name)) if origin == "kueue" else None
        shape = gang(obj) if obj is not None else "no Workload stored"
        per: Gpus
        if isinstance(shape, tuple):
            n, per = shape[0], gpus_in(shape[1])
        else:
            biggest = max(by_run, key=len)
            n = max(len(biggest), 1)
            per = max((from_milli(a.counted_milli) for a in biggest), default=from_milli(holds[0].counted_milli)
                      if holds else 1)
        if holds and sum(1 for a in pods if a.gpus != float(per)):
            odd += 1
        raw = holds[0] if holds else pods[0]
        queue = resolver.queue(raw.queue, raw.namespace)
        created = _created(obj)
        submit = min(created, starts[0]) if created is not None else starts[0]
        priority = int(((obj or {}).get("spec") or {}).get("priority") or raw.priority)
        state = RUNNING if runs[-1].end_s is None else FINISHED
        types = tuple(dict.fromkeys(r.gpu_type for r in runs if r.placement))
        out.append(Entry(wid, queue if queue in leaves else "", origin, WORKLOAD, submit, state, tuple(runs), n, per,
                         types, priority, True, namespace=ns, preemptions=len(runs) - 1))
    notes = [f"{odd} workload(s) of another scheduler whose pods held other GPUs than its gang's: replayed as its gang"
             ] if odd else []
    return out, notes


def _created(obj: Mapping[str, Any] | None) -> float | None:
    return k8s_seconds(((obj or {}).get("metadata") or {}).get("creationTimestamp"))


def _owned(a: Any, targets: Mapping[tuple[str, str], str]) -> bool:
    """Whether the row's top owner, or the Ray cluster it belongs to, is a gpuq workload's target
    (the live service's rule, :func:`scheduler.service.ledger.owner_of_name`)."""
    for name in (a.owner, a.ray_cluster):
        if name and ((a.namespace, name) in targets or (a.namespace, name.rsplit("-", 1)[0]) in targets):
            return True
    return False


def _placed_peaks(entries: Iterable[Entry]) -> dict[str, tuple[str, Gpus]]:
    """node -> (GPU type, the most GPUs placed on it at one instant) over every run."""
    steps: dict[str, list[tuple[float, Gpus]]] = {}
    types: dict[str, str] = {}
    for e in entries:
        for r in e.runs:
            for node, g in r.placement.items():
                types.setdefault(node, r.gpu_type)
                steps.setdefault(node, []).append((r.start_s, g))
                steps[node].append((r.end_s if r.end_s is not None else float("inf"), -g))
    out: dict[str, tuple[str, Gpus]] = {}
    for node, s in steps.items():
        level: Gpus = 0
        peak: Gpus = 0
        for _, d in sorted(s, key=lambda x: (x[0], x[1])):
            level += d
            peak = max(peak, level)
        out[node] = (types[node], peak)
    return out


# -- writing a replay into a store -------------------------------------------------------------------
def record_replay(store: Any, sc: Any, result: Any, cluster: str, epoch_s: float, namespace: str = "replay") -> int:
    """Write the replay ``result`` of the scenario ``sc`` into ``store`` as if ``cluster``'s
    scheduler had run it from ``epoch_s`` (Unix seconds at the scenario's t = 0): its events (the
    submit rows with the workload's spec), its nodes (``node_events``, added at ``epoch_s``), each
    run of each workload as an admission in the ledger, and its fixed load as foreign pods in
    ``namespace`` (queue: its own, or none). Returns the rows written."""
    from accounting.ledger import admission_share
    from accounting.model import Allocation
    from gpuq.gpu_share import mig_slice_milli
    from gpuq.store.schema import COLUMNS
    from scheduler.actuators.base import Target
    from scheduler.service.ledger import admission_store_row

    by_id = {w.id: w for w in sc.workloads}
    rows = [ev.to_row(e, i, cluster, ev.spec_json(by_id[e["workload"]], Target()) if e["event"] == "submit" else "",
                      epoch_s) for i, e in enumerate(result.events)]
    end = float(result.summary["makespan_s"])
    # each node added at the start and seen again at the end, as a collector's resync would: a long
    # trace's start is older than node events are kept (store.retention.raw_days), its end is not
    nodes: list[tuple[Any, ...]] = [
        (dt.datetime.fromtimestamp(epoch_s + at, dt.UTC), cluster, n.name, f"replay-{n.name}", kind, 1, 0, n.gpu_type,
         float(n.gpus), float(n.gpus), {}, {}, version)
        for at, kind, version in ((0.0, "ADDED", "1"), (end, "SYNC", "2")) for n in sc.cluster.nodes]
    allocs: list[Allocation] = []
    open_runs: dict[str, tuple[float, Mapping[str, int], str]] = {}

    def close(wid: str, t: float) -> None:
        start, placement, gpu_type = open_runs.pop(wid)
        w = by_id[wid]
        # a type named as the nodes name MIG slices is billed their fraction, as serve's admissions
        model_of = gpu_type if mig_slice_milli(gpu_type) else ""
        for node, g in placement.items():
            model, billed = admission_share(gpu_type, float(g), model_of)
            allocs.append(Allocation(cluster, namespace, f"gpuq-{wid}", f"{wid}@{start}@{node}", w.queue, node, model,
                                     billed, epoch_s + start, epoch_s + t, priority=w.priority,
                                     source="admission", workload_id=wid))

    for e in result.events:
        if e["event"] == "admit":
            open_runs[e["workload"]] = (float(e["t"]), e["placement"], e["gpu_type"])
        elif e["event"] in ("preempt", "finish") and e["workload"] in open_runs:
            close(e["workload"], float(e["t"]))
    for wid in list(open_runs):
        close(wid, end)
    ledger = [admission_store_row(a) for a in allocs]
    for h in getattr(result, "held", ()):
        for node, g in h.placement.items():
            start, stop = epoch_s + h.start_s, epoch_s + h.end_s
            ledger.append((cluster, namespace, h.id, f"fixed-{h.id}@{node}", h.queue or "", node, h.gpu_type,
                           "nvidia.com/gpu", float(g), 0, "", dt.datetime.fromtimestamp(start, dt.UTC),
                           dt.datetime.fromtimestamp(stop, dt.UTC), round(stop * 1000) * 10 + 2, "pod", "", "", ""))
    store.insert(ev.TABLE, rows, COLUMNS[ev.TABLE])
    store.insert("node_events", nodes, COLUMNS["node_events"])
    store.insert("gpu_allocations", ledger, COLUMNS["gpu_allocations"])
    return len(rows) + len(nodes) + len(ledger)
