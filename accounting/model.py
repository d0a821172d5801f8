"""Frozen snapshots the accounting engine computes over. Times are Unix seconds (float, UTC).

GPUs are counted in **milli-GPUs** (integer thousandths, as Kubernetes milli-units): allocations,
nodes and demand hold ``milli_gpus``, sums are exact integers, and GPUs as people read them come
from :func:`as_gpus` (whole GPUs stay integers: ``16``, not ``16.0``; a share is ``0.5``). Each value
also has a ``gpus`` property in GPUs (float); an allocation's is what it counts (below), its
``billed_gpus`` what GPU-seconds are computed with.

An allocation's ``milli_gpus`` is what it is **billed**: its share of the GPUs (a MIG slice its
fraction of the GPU, a time-sliced replica ``1/replicas``, a KAI fraction; :mod:`gpuq.gpu_share`).
What it **counts** against capacity and quotas is :attr:`Allocation.counted_milli`: the same,
except that MIG slices count as slices of their MIG type (1000 a slice), as the nodes'
``<model>-MIG-<profile>`` capacity and the scheduler count them.

The store adapter fills these from the public tables; the scheduler can build them directly
(for example :class:`PendingDemand` for its own pending workloads).
"""
from __future__ import annotations

from dataclasses import dataclass

from gpuq.gpu_share import counted_milli

MILLI = 1000


def milli(gpus: float) -> int:
    """GPUs (at most three decimals are kept) to milli-GPUs."""
    return round(gpus * MILLI)


def as_gpus(milli_gpus: int) -> int | float:
    """Milli-GPUs to GPUs as people read them: an int when whole."""
    whole, rest = divmod(milli_gpus, MILLI)
    return whole if rest == 0 else milli_gpus / MILLI


@dataclass(frozen=True, slots=True)
class Window:
    """The half-open interval ``[start_s, end_s)``."""

    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if self.end_s < self.start_s:
            raise ValueError(f"window ends before it starts: {self.start_s} > {self.end_s}")

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, slots=True)
class Allocation:
    """One pod that held GPUs (a ``gpu_allocations`` row). ``end_s`` is None while it runs;
    ``queue`` is the raw queue name the collector saw (resolved by :mod:`accounting.resolve`)."""

    cluster: str
    namespace: str
    pod: str
    uid: str
    queue: str
    node: str
    gpu_model: str
    milli_gpus: int
    start_s: float
    end_s: float | None
    gpu_resource: str = "nvidia.com/gpu"
    priority: int = 0
    ray_cluster: str = ""
    source: str = "pod"          # pod | placement_group | ray_job | admission (accounting.ledger)
    workload_id: str = ""        # the gpuq workload id, when the allocation belongs to one
    owner_kind: str = ""         # the pod's top owner (RayJob, RayCluster, ...), "" for a bare pod
    owner: str = ""

    @property
    def gpus(self) -> float:
        """GPUs it counts against capacity and quotas (:attr:`counted_milli`: MIG slices as slices),
        as the scheduler counts the work it holds; what it is billed is :attr:`billed_gpus`."""
        return self.counted_milli / MILLI

    @property
    def billed_gpus(self) -> float:
        """Its share in GPUs, for GPU-seconds (``milli_gpus / 1000``)."""
        return self.milli_gpus / MILLI

    @property
    def counted_milli(self) -> int:
        """Milli-GPUs it counts against capacity and quotas: MIG slices as slices (see the module
        docstring). gpuq's own admission rows of a MIG type are billed the slices' fraction too, and
        counted back the same way (``accounting.ledger.admission_rows``)."""
        return counted_milli(self.gpu_model, self.milli_gpus)

    @property
    def workload(self) -> str:
        """The Ray cluster the pod belongs to, else the pod itself."""
        return self.ray_cluster or self.pod

    @property
    def billed_as(self) -> str:
        """The workload a bill names: the gpuq workload id (all its rows, every source and node,
        are one line), else the Ray cluster, else the pod (``accounting.sql.BILLED_AS``)."""
        return self.workload_id or self.ray_cluster or self.pod


@dataclass(frozen=True, slots=True)
class PendingDemand:
    """GPUs someone waits for: a Pending pod, or a workload queued in the scheduler."""

    cluster: str
    namespace: str
    workload: str
    queue: str
    milli_gpus: int
    since_s: float
    gpu_model: str = ""          # empty: any type

    @property
    def gpus(self) -> float:
        return self.milli_gpus / MILLI


@dataclass(frozen=True, slots=True)
class NodeCapacity:
    cluster: str
    node: str
    gpu_model: str
    milli_gpus: int              # allocatable
    schedulable: bool = True     # ready and not cordoned
    replicas: int = 1            # what the device plugin advertises each GPU as (time-slicing, MPS)

    @property
    def gpus(self) -> float:
        return self.milli_gpus / MILLI


@dataclass(frozen=True, slots=True)
class ActivityPoint:
    """The activity of one GPU held by one pod over one bucket: percent busy (0..100)."""

    cluster: str
    node: str
    gpu_uuid: str
    namespace: str
    pod: str
    bucket_s: float              # start of the bucket
    activity_pct: float
    mig_instance: str = ""


@dataclass(frozen=True, slots=True)
class IdleRun:
    """One GPU held by one pod stayed under the threshold over ``[start_s, end_s)``."""

    cluster: str
    node: str
    gpu_uuid: str
    namespace: str
    pod: str
    start_s: float
    end_s: float
    mig_instance: str = ""
    open: bool = False           # the run reaches the last bucket seen for this (GPU, pod)


@dataclass(frozen=True, slots=True)
class UsageAgg:
    """GPU-seconds of one group over a window (aggregated in SQL, or from intervals)."""

    cluster: str
    queue: str                   # raw, as collected
    namespace: str
    workload: str
    gpu_model: str
    gpu_resource: str
    gpu_seconds: float = 0.0
    idle_gpu_seconds: float = 0.0
    idle_method: str = ""        # accounting.idle.idle_method of its allocations, distinct, joined by ","
