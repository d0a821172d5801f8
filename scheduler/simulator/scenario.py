"""Read a scenario (docs/SCENARIOS.md) into frozen values, naming the YAML path of
the first problem (``workloads[3].gpus_per_pod: expected a positive integer``).

Workloads come from the YAML ``workloads:`` list, from the JSON-lines file that
``workloads_file:`` names (one workload object a line, streamed; a problem is named
``FILE:LINE: field: reason``), or both: inline ones first, then the file's, in file order.

``fixed:`` (optional, issue 18) lists fixed load: GPUs held on a node from ``start`` to ``end`` by
work the scheduler does not schedule (what ``gpuq whatif`` makes of the foreign pods the accounting
saw); the engine places and releases it on its clock (:class:`Fixed`).
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from operator import attrgetter
from pathlib import Path
from typing import Any

from accounting.errors import QueueConfigError
from accounting.queue_names import nearest
from accounting.queues import OPEN_POLICY, parse_queue_config
from gpuq.errors import shown
from gpuq.gcpause import collector_paused
from scheduler.errors import ScenarioError, SnapshotError
from scheduler.model import Gpus, Node, Workload, share_of_gpus
from scheduler.snapshot import GUARANTEE, RECLAIM_MODES, Cluster, Settings, build_cluster

TOP = frozenset({"name", "until", "scheduler", "gpu_types", "nodes", "queues", "policy", "workloads",
                 "workloads_file", "fixed"})
SCHED = frozenset({"preemption", "preemption_delay_s", "cycle_interval_s", "reclaim", "usage_half_life_s"})
NODE = frozenset({"name", "gpu_type", "gpus", "count", "cpu", "memory"})
WORK = frozenset({"id", "queue", "submit", "duration", "pods", "gpus_per_pod", "gpu_types", "priority",
                  "preemptible", "checkpoint", "count", "originator", "expected_duration"})

FIXED = frozenset({"id", "node", "gpus", "start", "end", "queue"})

_FIELDS = {k: k for k in WORK}
_PLAIN_KEYS = WORK - {"count"}


@dataclass(frozen=True, slots=True)
class Fixed:
    """Fixed load: ``gpus`` GPUs of ``node`` held from ``start_s`` to ``end_s`` (``None``: to the end
    of the replay) by work the scheduler does not schedule and never preempts. With a (leaf)
    ``queue`` they also count for that queue (its guarantee, max and fair share), as the live
    service counts the foreign work it sees in a leaf queue; without one they hold the node only."""

    id: str
    node: str
    gpus: int
    start_s: float = 0.0
    end_s: float | None = None
    queue: str | None = None


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    until_s: float | None
    cycle_interval_s: float
    settings: Settings
    cluster: Cluster
    workloads: tuple[Workload, ...]      # by submit time, then file order
    fixed: tuple[Fixed, ...] = ()        # by start time, then file order


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source

    def fail(self, where: str, reason: str) -> ScenarioError:
        return ScenarioError(where, reason, self.source)

    def mapping(self, v: Any, where: str, allowed: frozenset[str]) -> Mapping[str, Any]:
        if not isinstance(v, Mapping):
            raise self.fail(where or "(top)", f"expected a mapping, got {type(v).__name__}")
        for k in v:
            if k not in allowed:
                raise self.fail(f"{where}.{k}" if where else str(k),
                                f"unknown field (expected one of {', '.join(sorted(allowed))})")
        return v

    def int(self, v: Any, where: str, minimum: int = 1) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
            raise self.fail(where, f"expected {kind}, got {shown(v)}")
        return v

    def gpus(self, v: Any, where: str) -> Gpus:
        """GPUs per pod: a whole number of 1 or more, or a share of one GPU below 1 in thousandths
        (``0.5``, ``0.125``; issue 19)."""
        got = share_of_gpus(v)
        if got is None:
            raise self.fail(where, "expected a positive integer, or a share of one GPU below 1 in "
                                   f"thousandths (0.5), got {shown(v)}")
        return got

    def num(self, v: Any, where: str, positive: bool = False) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (positive and v == 0):
            raise self.fail(where, f"expected a {'positive' if positive else 'non-negative'} number, got {shown(v)}")
        return float(v)

    def flag(self, v: Any, where: str) -> bool:
        if not isinstance(v, bool):
            raise self.fail(where, f"expected true or false, got {shown(v)}")
        return v

    def text(self, v: Any, where: str) -> str:
        if isinstance(v, bool) or not isinstance(v, (str, int)) or str(v) == "":
            raise self.fail(where, f"expected a non-empty string, got {shown(v)}")
        return str(v)

    def items(self, v: Any, where: str) -> list[Any]:
        if v is None:
            return []
        if not isinstance(v, list):
            raise self.fail(where, f"expected a list, got {type(v).__name__}")
        return v


def load_yaml(path: str | Path, what: str = "scenario") -> Any:
    """A YAML file's content; ScenarioError names the file and the line of a syntax error."""
    import yaml

    from gpuq.yamlsafe import safe_load

    p = Path(path)
    try:
        return safe_load(p.read_text())         # libyaml where installed; aliases bounded (gpuq.yamlsafe)
    except OSError as exc:
        raise ScenarioError("(file)", f"cannot read {what}: {exc.strerror or exc}", str(p)) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(file)"
        raise ScenarioError(where, f"invalid YAML: {getattr(exc, 'problem', None) or exc}", str(p)) from exc


def load_nodes(path: str) -> list[Node]:
    """A node list file (``scheduler.nodes_file``): ``[{name, gpu_type, gpus, count}, ...]`` or
    ``{nodes: [...]}``, checked as a scenario's ``nodes:``."""
    import yaml

    from gpuq.yamlsafe import safe_load

    try:
        data = safe_load(Path(path).read_text())
    except OSError as exc:
        raise ScenarioError("(file)", f"cannot read: {exc.strerror or exc}", path) from exc
    except yaml.YAMLError as exc:
        raise ScenarioError("(file)", f"invalid YAML: {exc}", path) from exc
    nodes = data.get("nodes") if isinstance(data, dict) else data
    return list(parse_scenario({"nodes": nodes}, source=path).cluster.nodes)


def _reclaim(r: _Reader, v: Any) -> str:
    """``scheduler.reclaim`` (issue 21): ``guarantee`` (the default) or ``fair_share``."""
    if v not in RECLAIM_MODES:
        raise r.fail("scheduler.reclaim", f"expected one of {', '.join(RECLAIM_MODES)}, got {shown(v)}")
    return str(v)


def _half_life(r: _Reader, v: Any) -> float:
    """``scheduler.usage_half_life_s``: 0 (off) or a finite positive number of seconds."""
    h = r.num(v, "scheduler.usage_half_life_s")
    if not math.isfinite(h):
        raise r.fail("scheduler.usage_half_life_s", f"expected a finite number of seconds (0: off), got {shown(v)}")
    return h


def load_scenario(path: str | Path) -> Scenario:
    return parse_scenario(load_yaml(path), source=str(path))


def parse_scenario(data: Any, source: str = "<mapping>", base_dir: str | Path | None = None) -> Scenario:
    """``base_dir`` resolves a relative ``workloads_file:``; default: the directory of ``source``
    when it names a file, else the current directory."""
    r = _Reader(source)
    top = r.mapping(data, "", TOP)
    sched = r.mapping(top.get("scheduler") or {}, "scheduler", SCHED)
    settings = Settings(
        preemption=r.flag(sched.get("preemption", True), "scheduler.preemption"),
        preemption_delay_s=r.num(sched.get("preemption_delay_s", 30), "scheduler.preemption_delay_s"),
        reclaim=_reclaim(r, sched.get("reclaim", GUARANTEE)),
        usage_half_life_s=_half_life(r, sched.get("usage_half_life_s", 0)),
    )
    interval = r.num(sched.get("cycle_interval_s", 1), "scheduler.cycle_interval_s", positive=True)
    until = None if top.get("until") is None else r.num(top["until"], "until")
    try:
        config = parse_queue_config({"queues": top.get("queues") or {}, "gpu_types": top.get("gpu_types"),
                                     "policy": top.get("policy")}, default_policy=OPEN_POLICY)
    except QueueConfigError as exc:
        raise r.fail(exc.where, exc.reason) from exc
    nodes: list[Node] = []
    for i, raw in enumerate(r.items(top.get("nodes"), "nodes")):
        where = f"nodes[{i}]"
        spec = r.mapping(raw, where, NODE)
        if "name" not in spec or "gpu_type" not in spec:
            raise r.fail(where, "needs name and gpu_type")
        name = r.text(spec["name"], f"{where}.name")
        gpu_type = r.text(spec["gpu_type"], f"{where}.gpu_type")
        gpus = r.int(spec.get("gpus", 0), f"{where}.gpus", minimum=0)
        cpu = r.int(spec.get("cpu", 0), f"{where}.cpu", minimum=0) * 1000
        mem = r.int(spec.get("memory", 0), f"{where}.memory", minimum=0)
        names = [name] if "count" not in spec else [
            f"{name}-{j}" for j in range(r.int(spec["count"], f"{where}.count"))]
        nodes.extend(Node(n, gpu_type, gpus, cpu, mem) for n in names)
    try:
        cluster = build_cluster(config, nodes)
    except SnapshotError as exc:
        raise r.fail("nodes", str(exc)) from exc
    if base_dir is None:
        base_dir = Path(source).parent if source != "<mapping>" else Path(".")
    with collector_paused():                # 50,000 workloads make no reference cycles
        workloads = _workloads(r, top, cluster, Path(base_dir))
    fixed = _fixed(r, top.get("fixed"), cluster)
    return Scenario(
        name=str(top.get("name") or (Path(source).stem if source != "<mapping>" else "scenario")),
        until_s=until, cycle_interval_s=interval, settings=settings, cluster=cluster,
        workloads=tuple(sorted(workloads, key=attrgetter("submit_s"))),
        fixed=tuple(sorted(fixed, key=attrgetter("start_s"))),
    )


def _fixed(r: _Reader, raw: Any, cluster: Cluster) -> list[Fixed]:
    """The ``fixed:`` list, each entry checked against the cluster's nodes and leaf queues."""
    out: list[Fixed] = []
    seen: set[str] = set()
    leaves = cluster.config.leaves()
    for i, item in enumerate(r.items(raw, "fixed")):
        where = f"fixed[{i}]"
        spec = r.mapping(item, where, FIXED)
        for key in ("id", "node", "gpus"):
            if key not in spec:
                raise r.fail(f"{where}.{key}", "required field missing")
        fid = r.text(spec["id"], f"{where}.id")
        if fid in seen:
            raise r.fail(f"{where}.id", f"duplicate fixed load id {shown(fid)}")
        seen.add(fid)
        node = r.text(spec["node"], f"{where}.node")
        index = cluster.node_index.get(node)
        if index is None:
            raise r.fail(f"{where}.node", f"unknown node {shown(node)}; {nearest(node, list(cluster.node_index), 'nodes')}")
        gpus = r.int(spec["gpus"], f"{where}.gpus")
        if gpus > cluster.nodes[index].gpus:
            raise r.fail(f"{where}.gpus", f"{gpus} GPUs, but node {node} has {cluster.nodes[index].gpus}")
        start = r.num(spec.get("start", 0), f"{where}.start")
        end = None if spec.get("end") is None else r.num(spec["end"], f"{where}.end")
        if end is not None and end <= start:
            raise r.fail(f"{where}.end", f"expected a time after start ({start:g}), got {end:g}")
        queue = None if spec.get("queue") is None else r.text(spec["queue"], f"{where}.queue")
        if queue is not None and queue not in leaves:
            raise r.fail(f"{where}.queue", f"not a leaf queue: {shown(queue)}; {nearest(queue, sorted(leaves))}")
        out.append(Fixed(fid, node, gpus, start, end, queue))
    return out


def _workloads(r: _Reader, top: Mapping[str, Any], cluster: Cluster, base_dir: Path) -> list[Workload]:
    queues = cluster.config.queues
    leaves = frozenset(cluster.config.leaves())
    out: list[Workload] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(r.items(top.get("workloads"), "workloads")):
        where = f"workloads[{i}]"
        if not _plain_workload(raw, leaves, seen, out, where):
            _workload(r, raw, where, where + ".", queues, seen, out)
    if top.get("workloads_file") is not None:
        name = r.text(top["workloads_file"], "workloads_file")
        path = Path(name) if Path(name).is_absolute() else base_dir / name
        for line, raw in _json_lines(path):
            origin = f"{path}:{line}"
            if _plain_workload(raw, leaves, seen, out, origin):
                continue
            try:
                _workload(r, raw, "(line)", "", queues, seen, out, origin)
            except ScenarioError as exc:
                raise ScenarioError(exc.where, exc.reason, origin) from None
    return out


def _plain_workload(raw: Any, leaves: frozenset[str], seen: dict[str, str], out: list[Workload],
                    first: str) -> bool:
    """The common workload (a dict of known fields, each of its plain type and in range, no
    ``count``, a new id) appended to ``out`` at once, as :func:`_workload` would build it; False,
    with nothing changed, for anything else, which :func:`_workload` then checks field by field and
    names. The fast path of a large scenario (issue 18); the same rules, asked in one go."""
    if raw.__class__ is not dict or not raw.keys() <= _PLAIN_KEYS:
        return False
    get = raw.get
    wid, queue, duration, submit = get("id"), get("queue"), get("duration"), get("submit", 0)
    pods, per_pod, priority = get("pods", 1), get("gpus_per_pod", 1), get("priority", 0)
    preemptible, checkpoint, originator = get("preemptible", True), get("checkpoint", False), get("originator", False)
    types, expected = get("gpu_types"), get("expected_duration")
    if expected is not None and ((expected.__class__ is not float and expected.__class__ is not int)
                                 or not 0 < expected < math.inf):
        return False
    if (wid.__class__ is not str or not wid or wid in seen or queue.__class__ is not str or queue not in leaves
            or (duration.__class__ is not float and duration.__class__ is not int) or not duration > 0
            or (submit.__class__ is not float and submit.__class__ is not int) or submit < 0
            or pods.__class__ is not int or pods < 1 or per_pod.__class__ is not int or per_pod < 1
            or priority.__class__ is not int or priority < -(2**31)
            or preemptible.__class__ is not bool or checkpoint.__class__ is not bool
            or originator.__class__ is not bool):
        return False
    if types is None:
        gpu_types: tuple[str, ...] = ()
    elif types.__class__ is list and all(t.__class__ is str and t for t in types):
        gpu_types = tuple(types)
    else:
        return False
    seen[wid] = first
    out.append(Workload(wid, queue, pods, per_pod, gpu_types, priority, preemptible, float(submit),
                        float(duration), checkpoint, originator,
                        expected_duration_s=None if expected is None else float(expected)))
    return True


def _json_lines(path: Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) of each non-blank line, read as it goes."""
    try:
        handle = path.open(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError("(file)", f"cannot read workloads_file: {exc.strerror or exc}", str(path)) from exc
    loads = json.loads
    with handle:
        for n, text in enumerate(handle, 1):
            if not text.strip():
                continue
            try:
                yield n, loads(text)
            except ValueError as exc:
                raise ScenarioError("(line)", f"invalid JSON: {exc}", f"{path}:{n}") from None


def _workload(r: _Reader, raw: Any, where: str, at: str, queues: Mapping[str, Any], seen: dict[str, str],
              out: list[Workload], origin: str | None = None) -> None:
    """Check one workload object; ``at`` prefixes field paths (``workloads[3].`` or nothing)."""
    if not at and not isinstance(raw, Mapping):
        raise r.fail(where, f"expected a JSON object (one workload), got {type(raw).__name__}")
    spec = r.mapping(raw, where if at else "", WORK)
    f = _FIELDS if not at else {k: at + k for k in WORK}
    for key in ("id", "queue", "duration"):
        if key not in spec:
            raise r.fail(f"{at}{key}", "required field missing")
    wid = r.text(spec["id"], f["id"])
    queue = r.text(spec["queue"], f["queue"])
    if queue not in queues or queue == "root":
        leaves = [p for p, q in queues.items() if q.is_leaf and p != "root"]
        raise r.fail(f["queue"], f"unknown queue {shown(queue)}; {nearest(queue, leaves)}")
    if not queues[queue].is_leaf:
        raise r.fail(f["queue"], f"queue {shown(queue)} is not a leaf (only leaf queues take workloads)")
    types = r.items(spec.get("gpu_types"), f["gpu_types"])
    base = Workload(
        id=wid, queue=queue,
        pods=r.int(spec.get("pods", 1), f["pods"]),
        gpus_per_pod=r.gpus(spec.get("gpus_per_pod", 1), f["gpus_per_pod"]),
        gpu_types=tuple(r.text(t, f"{at}gpu_types[{j}]") for j, t in enumerate(types)),
        priority=r.int(spec.get("priority", 0), f["priority"], minimum=-(2**31)),
        preemptible=r.flag(spec.get("preemptible", True), f["preemptible"]),
        submit_s=r.num(spec.get("submit", 0), f["submit"]),
        duration_s=r.num(spec["duration"], f["duration"], positive=True),
        checkpoint=r.flag(spec.get("checkpoint", False), f["checkpoint"]),
        originator=r.flag(spec.get("originator", False), f["originator"]),
        expected_duration_s=(None if spec.get("expected_duration") is None
                             else r.num(spec["expected_duration"], f["expected_duration"], positive=True)),
    )
    ids = [wid] if "count" not in spec else [
        f"{wid}-{j}" for j in range(r.int(spec["count"], f["count"]))]
    first = origin or where
    for one in ids:
        if one in seen:
            raise r.fail(f["id"], f"duplicate workload id {shown(one)} (first at {seen[one]})")
        seen[one] = first
        out.append(base if one == wid else _with_id(base, one))


def _with_id(w: Workload, wid: str) -> Workload:
    return Workload(wid, w.queue, w.pods, w.gpus_per_pod, w.gpu_types, w.priority, w.preemptible,
                    w.submit_s, w.duration_s, w.checkpoint, w.originator,
                    expected_duration_s=w.expected_duration_s)
