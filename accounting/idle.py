"""Idle allocated GPUs, from DCGM activity per GPU and pod.

Definitions (the SQL in :mod:`accounting.store_adapter` computes the same, and a test checks it):

* **activity** of a GPU in a bucket (``bucket_s``, 60 s) is the highest sample there of
  ``DCGM_FI_PROF_GR_ENGINE_ACTIVE`` (a 0..1 ratio, times 100) when the bucket has one, else of
  ``DCGM_FI_DEV_GPU_UTIL`` (0..100 %). A bucket without samples has no activity: *unknown*.
* a bucket is **quiet** when its activity is under ``threshold_pct``.
* a **quiet run** is a maximal sequence of quiet buckets of one (GPU, pod) in which consecutive
  buckets are at most ``bucket_s + max_gap_s`` apart (a short collector gap is bridged) and no
  busy bucket comes between. Its span is ``[first bucket, last bucket + bucket_s)``.
* a run whose span lasts at least ``window_s`` (default 30 min) is **idle**, all of it: the GPU
  sat idle from the run's first bucket. Shorter runs, busy buckets and unknown time are not idle,
  so missing DCGM data never makes a GPU idle.
* an idle run is **open** when it reaches the last bucket seen for its (GPU, pod); a GPU is
  **idle now** when it has an open idle run ending at most ``max_gap_s`` before now.

Shared devices (:func:`idle_method`, :func:`attribute_idle`): an idle run is one device (a GPU,
or a MIG instance) idle; an allocation holding it counts ``device share x seconds`` idle, its share
of that device (:func:`gpuq.gpu_share.device_share_milli`): 1 for a whole GPU, a MIG slice's
fraction of its GPU, a time-sliced replica's or a KAI fraction's share. How its activity is known
is its ``idle_method``:

* ``device``: it holds whole devices (whole GPUs, MIG instances), and a device's activity is its;
* ``per_process``: it shares a GPU, and dcgm-exporter's per-process fields (``--kubernetes-virtual-gpus``
  with per-process metrics, dcgm-exporter #594; stored with source ``dcgm-process``) gave its own
  activity: idle when its own processes are quiet;
* ``device_split_by_share``: it shares a GPU and only the device's activity is known (dcgm-exporter
  gives every pod sharing a GPU the device's value, #587): a quiet device is idle for each of its
  holders, split by their shares; a busy one is busy for all of them.

Counters (energy in mJ) reset when the exporter or the GPU restarts: :func:`counter_increase`
counts a drop as a restart from zero, as Prometheus' ``increase()`` does.
"""
from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from accounting.intervals import effective_ends
from accounting.ledger import slot
from accounting.model import MILLI, ActivityPoint, Allocation, IdleRun, UsageAgg, Window
from gpuq.gpu_share import device_share_milli, shares_a_device

PROF_ACTIVE = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
GPU_UTIL = "DCGM_FI_DEV_GPU_UTIL"
ACTIVITY_METRICS = (PROF_ACTIVE, GPU_UTIL)
PER_PROCESS_SOURCE = "dcgm-process"      # collector.dcgm: samples from dcgm-exporter's per-process fields
IDLE_METHODS = ("device", "per_process", "device_split_by_share")
PodKey = tuple[str, str, str]            # (cluster, namespace, pod)


@dataclass(frozen=True, slots=True)
class IdleParams:
    threshold_pct: float = 5.0
    window_s: float = 1800.0
    bucket_s: float = 60.0
    max_gap_s: float = 300.0


DEFAULT_PARAMS = IdleParams()


def activity_points(samples: Iterable[tuple[str, str, str, str, str, str, float, str, float]],
                    bucket_s: float = 60.0) -> tuple[ActivityPoint, ...]:
    """Samples ``(cluster, node, gpu_uuid, mig_instance, namespace, pod, ts_s, metric, value)`` to
    one activity point per (GPU, pod, bucket), preferring the profiling metric."""
    best: dict[tuple[str, str, str, str, str, str, float], tuple[int, float]] = {}
    for cluster, node, gpu, mig, ns, pod, ts, metric, value in samples:
        if metric == PROF_ACTIVE:
            rank, pct = 1, value * 100.0
        elif metric == GPU_UTIL:
            rank, pct = 0, value
        else:
            continue
        key = (cluster, node, gpu, mig, ns, pod, ts - ts % bucket_s)
        old = best.get(key)
        if old is None or rank > old[0] or (rank == old[0] and pct > old[1]):
            best[key] = (rank, pct)
    return tuple(ActivityPoint(k[0], k[1], k[2], k[4], k[5], k[6], v[1], mig_instance=k[3])
                 for k, v in sorted(best.items()))


def _by_gpu(points: Iterable[ActivityPoint]) -> dict[tuple[str, ...], list[ActivityPoint]]:
    out: dict[tuple[str, ...], list[ActivityPoint]] = {}
    for p in points:
        out.setdefault((p.cluster, p.node, p.gpu_uuid, p.mig_instance, p.namespace, p.pod), []).append(p)
    for series in out.values():
        series.sort(key=lambda p: p.bucket_s)
    return out


def _series_runs(key: tuple[str, ...], series: Sequence[ActivityPoint], params: IdleParams) -> list[IdleRun]:
    spans: list[tuple[float, float, bool]] = []          # (first, last, reaches the series' end)
    reach = params.bucket_s + params.max_gap_s
    first: float | None = None
    last = 0.0
    for p in series:
        if p.activity_pct >= params.threshold_pct:
            if first is not None:
                spans.append((first, last, False))
            first = None
        elif first is not None and p.bucket_s - last <= reach:
            last = p.bucket_s
        else:
            if first is not None:
                spans.append((first, last, False))
            first = last = p.bucket_s
    if first is not None:
        spans.append((first, last, True))
    return [IdleRun(key[0], key[1], key[2], key[4], key[5], s, e + params.bucket_s, mig_instance=key[3], open=o)
            for s, e, o in spans if e + params.bucket_s - s >= params.window_s]


def idle_runs(points: Iterable[ActivityPoint], params: IdleParams = DEFAULT_PARAMS) -> tuple[IdleRun, ...]:
    """Every idle run, ordered by (cluster, node, gpu_uuid, mig_instance, namespace, pod, start)."""
    runs: list[IdleRun] = []
    for key, series in sorted(_by_gpu(points).items()):
        runs += _series_runs(key, series, params)
    return tuple(runs)


def current(runs: Iterable[IdleRun], now_s: float, params: IdleParams = DEFAULT_PARAMS) -> tuple[IdleRun, ...]:
    """The runs of GPUs idle at ``now_s``: open runs whose last bucket is recent enough."""
    return tuple(r for r in runs if r.open and r.end_s >= now_s - params.max_gap_s)


def idle_method(a: Allocation, per_process: Collection[PodKey] = ()) -> str:
    """How the allocation's activity is known (see the module docstring); ``per_process``: the
    pods dcgm-exporter's per-process fields reported."""
    if not shares_a_device(a.gpu_model, a.milli_gpus):
        return "device"
    return "per_process" if (a.cluster, a.namespace, a.pod) in per_process else "device_split_by_share"


def join_methods(methods: Iterable[str]) -> str:
    """Several allocations' methods as one value: the distinct ones, sorted, joined by ``,``."""
    return ",".join(sorted({m for ms in methods for m in ms.split(",") if m}))


def attribute_idle(runs: Iterable[IdleRun], allocs: Iterable[Allocation], window: Window,
                   now_s: float, per_process: Collection[PodKey] = ()) -> tuple[UsageAgg, ...]:
    """Idle GPU-seconds inside the window, grouped like :func:`accounting.intervals.to_aggs`.

    A run counts where it overlaps an allocation of the same (cluster, namespace, pod): a pod's
    wherever DCGM names its node (its ``Hostname`` need not be the Kubernetes node name), another
    source's on the run's node only (one row per node of a multi-node allocation: a gang's row on
    another node is another GPU), weighted by the allocation's share of the device. A run of a pod
    with no allocation (DCGM saw it, Kubernetes did not) is not counted. Each group carries the
    ``idle_method`` of its allocations overlapping the window."""
    spans: dict[tuple[str, str, str, str], list[tuple[Allocation, float]]] = {}
    methods: dict[tuple[str, str, str, str, str, str], set[str]] = {}
    for a, end in effective_ends(allocs, now_s):
        spans.setdefault(slot(a), []).append((a, end))
        if a.start_s < window.end_s and end > window.start_s:
            k = (a.cluster, a.queue, a.namespace, a.billed_as, a.gpu_model, a.gpu_resource)
            methods.setdefault(k, set()).add(idle_method(a, per_process))
    idle: dict[int, tuple[Allocation, float, float]] = {}       # id -> (allocation, its end, idle seconds)
    for r in runs:
        for a, end in (*spans.get((r.cluster, r.namespace, r.pod, ""), ()),
                       *(spans.get((r.cluster, r.namespace, r.pod, r.node), ()) if r.node else ())):
            s = max(r.start_s, a.start_s, window.start_s)
            e = min(r.end_s, end, window.end_s)
            if e > s:
                held = idle.get(id(a), (a, end, 0.0))
                idle[id(a)] = (a, end, held[2] + (e - s) * device_share_milli(a.gpu_model, a.milli_gpus))
    sums: dict[tuple[str, str, str, str, str, str], float] = {}
    for a, end, device_ms in idle.values():
        # never more than it holds: a share seen on several devices is still its share
        span = max(0.0, min(end, window.end_s) - max(a.start_s, window.start_s))
        k = (a.cluster, a.queue, a.namespace, a.billed_as, a.gpu_model, a.gpu_resource)
        sums[k] = sums.get(k, 0.0) + min(device_ms, span * a.milli_gpus) / MILLI
    return tuple(UsageAgg(*k, idle_gpu_seconds=v, idle_method=join_methods(methods.get(k, ())))
                 for k, v in sorted(sums.items()))


def counter_increase(values: Sequence[float]) -> float:
    """The increase of a counter over consecutive samples; a drop is a reset to zero."""
    total = 0.0
    for prev, cur in itertools.pairwise(values):
        total += cur - prev if cur >= prev else cur
    return total
