"""Read a scenario (docs/SCENARIOS.md) into frozen values, naming the YAML path of
the first problem (``workloads[3].gpus_per_pod: expected a positive integer``)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from accounting.errors import QueueConfigError
from accounting.queues import parse_queue_config
from scheduler.errors import ScenarioError, SnapshotError
from scheduler.model import Node, Workload
from scheduler.snapshot import Cluster, Settings, build_cluster

TOP = frozenset({"name", "until", "scheduler", "gpu_types", "nodes", "queues", "workloads"})
SCHED = frozenset({"preemption", "preemption_delay_s", "cycle_interval_s"})
NODE = frozenset({"name", "gpu_type", "gpus", "count", "cpu", "memory"})
WORK = frozenset({"id", "queue", "submit", "duration", "pods", "gpus_per_pod", "gpu_types", "priority",
                  "preemptible", "checkpoint", "count", "originator"})


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    until_s: float | None
    cycle_interval_s: float
    settings: Settings
    cluster: Cluster
    workloads: tuple[Workload, ...]      # by submit time, then file order


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
            raise self.fail(where, f"expected {kind}, got {v!r}")
        return v

    def num(self, v: Any, where: str, positive: bool = False) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (positive and v == 0):
            raise self.fail(where, f"expected a {'positive' if positive else 'non-negative'} number, got {v!r}")
        return float(v)

    def flag(self, v: Any, where: str) -> bool:
        if not isinstance(v, bool):
            raise self.fail(where, f"expected true or false, got {v!r}")
        return v

    def text(self, v: Any, where: str) -> str:
        if isinstance(v, bool) or not isinstance(v, (str, int)) or str(v) == "":
            raise self.fail(where, f"expected a non-empty string, got {v!r}")
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

    p = Path(path)
    try:
        return yaml.safe_load(p.read_text())
    except OSError as exc:
        raise ScenarioError("(file)", f"cannot read {what}: {exc.strerror or exc}", str(p)) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "(file)"
        raise ScenarioError(where, f"invalid YAML: {getattr(exc, 'problem', None) or exc}", str(p)) from exc


def load_scenario(path: str | Path) -> Scenario:
    return parse_scenario(load_yaml(path), source=str(path))


def parse_scenario(data: Any, source: str = "<mapping>") -> Scenario:
    r = _Reader(source)
    top = r.mapping(data, "", TOP)
    sched = r.mapping(top.get("scheduler") or {}, "scheduler", SCHED)
    settings = Settings(
        preemption=r.flag(sched.get("preemption", True), "scheduler.preemption"),
        preemption_delay_s=r.num(sched.get("preemption_delay_s", 30), "scheduler.preemption_delay_s"),
    )
    interval = r.num(sched.get("cycle_interval_s", 1), "scheduler.cycle_interval_s", positive=True)
    until = None if top.get("until") is None else r.num(top["until"], "until")
    try:
        config = parse_queue_config({"queues": top.get("queues") or {}, "gpu_types": top.get("gpu_types")})
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
    workloads = _workloads(r, top, cluster)
    return Scenario(
        name=str(top.get("name") or (Path(source).stem if source != "<mapping>" else "scenario")),
        until_s=until, cycle_interval_s=interval, settings=settings, cluster=cluster,
        workloads=tuple(sorted(workloads, key=lambda w: w.submit_s)),
    )


def _workloads(r: _Reader, top: Mapping[str, Any], cluster: Cluster) -> list[Workload]:
    queues = cluster.config.queues
    out: list[Workload] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(r.items(top.get("workloads"), "workloads")):
        where = f"workloads[{i}]"
        spec = r.mapping(raw, where, WORK)
        for key in ("id", "queue", "duration"):
            if key not in spec:
                raise r.fail(f"{where}.{key}", "required field missing")
        wid = r.text(spec["id"], f"{where}.id")
        queue = r.text(spec["queue"], f"{where}.queue")
        if queue not in queues or queue == "root":
            raise r.fail(f"{where}.queue", f"unknown queue {queue!r}")
        if not queues[queue].is_leaf:
            raise r.fail(f"{where}.queue", f"queue {queue!r} is not a leaf (only leaf queues take workloads)")
        types = r.items(spec.get("gpu_types"), f"{where}.gpu_types")
        base = Workload(
            id=wid, queue=queue,
            pods=r.int(spec.get("pods", 1), f"{where}.pods"),
            gpus_per_pod=r.int(spec.get("gpus_per_pod", 1), f"{where}.gpus_per_pod"),
            gpu_types=tuple(r.text(t, f"{where}.gpu_types[{j}]") for j, t in enumerate(types)),
            priority=r.int(spec.get("priority", 0), f"{where}.priority", minimum=-(2**31)),
            preemptible=r.flag(spec.get("preemptible", True), f"{where}.preemptible"),
            submit_s=r.num(spec.get("submit", 0), f"{where}.submit"),
            duration_s=r.num(spec["duration"], f"{where}.duration", positive=True),
            checkpoint=r.flag(spec.get("checkpoint", False), f"{where}.checkpoint"),
            originator=r.flag(spec.get("originator", False), f"{where}.originator"),
        )
        ids = [wid] if "count" not in spec else [
            f"{wid}-{j}" for j in range(r.int(spec["count"], f"{where}.count"))]
        for one in ids:
            if one in seen:
                raise r.fail(f"{where}.id", f"duplicate workload id {one!r} (first at {seen[one]})")
            seen[one] = where
            out.append(base if one == wid else _with_id(base, one))
    return out


def _with_id(w: Workload, wid: str) -> Workload:
    return Workload(wid, w.queue, w.pods, w.gpus_per_pod, w.gpu_types, w.priority, w.preemptible,
                    w.submit_s, w.duration_s, w.checkpoint, w.originator)
