"""Small builders for tests and benchmarks: a cluster from a queue mapping and node groups,
workloads and running entries with short keyword arguments, one cycle in one call."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from accounting.queues import parse_queue_config
from scheduler.cycle import schedule
from scheduler.model import Decisions, Gpus, Node, Placement, Running, Workload
from scheduler.snapshot import Cluster, Settings, build_cluster, snapshot


def nodes(*groups: tuple[str, str, int, int]) -> list[Node]:
    """``("h", "H100", 8, 2)`` gives nodes h-0 and h-1 with 8 H100 each."""
    return [Node(f"{name}-{i}", t, gpus) for name, t, gpus, count in groups for i in range(count)]


def cluster(queues: Mapping[str, Any], *groups: tuple[str, str, int, int]) -> Cluster:
    return build_cluster(parse_queue_config({"queues": queues}), nodes(*groups))


def wl(wid: str, queue: str, gpus: int = 8, pods: int = 1, types: tuple[str, ...] = (), **kw: Any) -> Workload:
    """A workload of ``pods`` x ``gpus`` GPUs; other fields by keyword (``priority=1``, ``submit_s=0``)."""
    return Workload(wid, queue, pods=pods, gpus_per_pod=gpus, gpu_types=types, **kw)


def run(w: Workload, gpu_type: str, *where: tuple[str, int], start_s: float = 0.0, idle: bool = False) -> Running:
    """A running entry: ``run(wl("a", "q"), "H100", ("h-0", 8))``."""
    return Running(w, Placement(gpu_type, tuple(where)), start_s, idle)


def cycle(
    c: Cluster,
    pending: Iterable[Workload] = (),
    running: Iterable[Running] = (),
    now: float = 100.0,
    preemption: bool = True,
    delay_s: float = 30.0,
    reclaim: str = "guarantee",
) -> Decisions:
    return schedule(snapshot(c, running, pending, Settings(preemption, delay_s, reclaim)), now)


def admitted(d: Decisions) -> dict[str, dict[str, Gpus]]:
    return {a.workload.id: a.placement.as_dict() for a in d.admissions}


def victims(d: Decisions) -> dict[str, tuple[str, ...]]:
    return {p.preemptor: p.victims for p in d.preemptions}
