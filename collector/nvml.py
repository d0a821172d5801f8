"""NVML (nvidia-ml-py) -> ``gpu_samples`` rows (source ``nvml``), for nodes without dcgm-exporter.

Metric names and units are DCGM's, so accounting treats both sources alike:

===================================  ==========================================  ======
metric                               NVML call                                   unit
===================================  ==========================================  ======
DCGM_FI_DEV_GPU_UTIL                 nvmlDeviceGetUtilizationRates().gpu         %
DCGM_FI_DEV_MEM_COPY_UTIL            nvmlDeviceGetUtilizationRates().memory      %
DCGM_FI_DEV_FB_USED / _FREE / _TOTAL nvmlDeviceGetMemoryInfo() (bytes / 2**20)    MiB
DCGM_FI_DEV_POWER_USAGE              nvmlDeviceGetPowerUsage() (mW / 1000)       W
DCGM_FI_DEV_GPU_TEMP                 nvmlDeviceGetTemperature(GPU)               C
DCGM_FI_DEV_SM_CLOCK / _MEM_CLOCK    nvmlDeviceGetClockInfo(SM / MEM)            MHz
DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION nvmlDeviceGetTotalEnergyConsumption()       mJ
===================================  ==========================================  ======

A reading the device does not support is left out (no row), not written as 0. With MIG on, each
MIG device adds rows with DCGM's labelling: ``gpu_uuid``/``gpu_index`` of the parent GPU,
``mig_instance`` the GPU instance id, ``mig_profile`` from the MIG device name ("1g.10gb").
Pods are not attributed (NVML knows processes, not pods): ``pod``/``namespace``/``container``
stay empty. Rows carry the ``now`` of the scrape.

Layers: :func:`read_gpus` is the thin NVML layer (it gets the ``pynvml`` module as an argument,
so tests pass a fake); :func:`reading_rows` is the pure mapping; :class:`NvmlTarget` runs the
blocking calls in a thread (init, read, shutdown on every scrape).
"""
from __future__ import annotations

import asyncio
import datetime as dt
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from collector.base import ScrapeResult
from collector.errors import CollectorError
from collector.http import HttpClient, utc

__all__ = ["METRICS", "GpuReading", "NvmlTarget", "read_gpus", "reading_rows"]

SOURCE = "nvml"
_MIB = float(1 << 20)
_MIG_PROFILE = re.compile(r"MIG\s+(\S+)\s*$")

# GpuReading field -> DCGM metric name
METRICS: dict[str, str] = {
    "gpu_util_pct": "DCGM_FI_DEV_GPU_UTIL",
    "mem_copy_util_pct": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "fb_used_mib": "DCGM_FI_DEV_FB_USED",
    "fb_free_mib": "DCGM_FI_DEV_FB_FREE",
    "fb_total_mib": "DCGM_FI_DEV_FB_TOTAL",
    "power_w": "DCGM_FI_DEV_POWER_USAGE",
    "temp_c": "DCGM_FI_DEV_GPU_TEMP",
    "sm_clock_mhz": "DCGM_FI_DEV_SM_CLOCK",
    "mem_clock_mhz": "DCGM_FI_DEV_MEM_CLOCK",
    "energy_mj": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
}


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU (or MIG device) at one instant; None = not supported / not readable."""

    uuid: str
    index: int
    name: str
    mig_instance: str = ""
    mig_profile: str = ""
    gpu_util_pct: float | None = None
    mem_copy_util_pct: float | None = None
    fb_used_mib: float | None = None
    fb_free_mib: float | None = None
    fb_total_mib: float | None = None
    power_w: float | None = None
    temp_c: float | None = None
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    energy_mj: float | None = None


def reading_rows(readings: Iterable[GpuReading], *, cluster: str, node: str,
                 now: dt.datetime) -> list[tuple[Any, ...]]:
    """Pure: readings -> gpu_samples tuples in ``COLUMNS['gpu_samples']`` order."""
    now = utc(now)
    rows = []
    for r in readings:
        for attr, metric in METRICS.items():
            value = getattr(r, attr)
            if value is not None:
                rows.append((now, cluster, node, r.uuid, r.index, r.name, r.mig_profile,
                             r.mig_instance, "", "", "", metric, float(value), SOURCE))
    return rows


# -- the thin NVML layer --------------------------------------------------------------------

def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def read_gpus(nvml: Any) -> tuple[list[GpuReading], list[CollectorError]]:
    """Read every GPU (and MIG device) through ``nvml`` (the pynvml module, already initialised).
    A device that cannot be read is reported and skipped; the others are kept."""
    readings: list[GpuReading] = []
    errors: list[CollectorError] = []
    for i in range(nvml.nvmlDeviceGetCount()):
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            gpu = _read_one(nvml, h, uuid=_text(nvml.nvmlDeviceGetUUID(h)), index=i,
                            name=_text(nvml.nvmlDeviceGetName(h)))
            readings.append(gpu)
            readings.extend(_read_migs(nvml, h, gpu))
        except nvml.NVMLError as exc:
            errors.append(CollectorError(f"GPU {i}: cannot read: {exc}", source=f"nvml:gpu{i}",
                                         retryable=True))
    return readings, errors


def _opt(nvml: Any, fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except nvml.NVMLError:
        return None


def _read_one(nvml: Any, h: Any, *, uuid: str, index: int, name: str,
              mig_instance: str = "", mig_profile: str = "") -> GpuReading:
    util = _opt(nvml, nvml.nvmlDeviceGetUtilizationRates, h)
    mem = _opt(nvml, nvml.nvmlDeviceGetMemoryInfo, h)
    power_mw = _opt(nvml, nvml.nvmlDeviceGetPowerUsage, h)
    return GpuReading(
        uuid=uuid, index=index, name=name, mig_instance=mig_instance, mig_profile=mig_profile,
        gpu_util_pct=None if util is None else float(util.gpu),
        mem_copy_util_pct=None if util is None else float(util.memory),
        fb_used_mib=None if mem is None else mem.used / _MIB,
        fb_free_mib=None if mem is None else mem.free / _MIB,
        fb_total_mib=None if mem is None else mem.total / _MIB,
        power_w=None if power_mw is None else power_mw / 1000.0,
        temp_c=_opt(nvml, nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU),
        sm_clock_mhz=_opt(nvml, nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_SM),
        mem_clock_mhz=_opt(nvml, nvml.nvmlDeviceGetClockInfo, h, nvml.NVML_CLOCK_MEM),
        energy_mj=_opt(nvml, nvml.nvmlDeviceGetTotalEnergyConsumption, h),
    )


def _read_migs(nvml: Any, h: Any, parent: GpuReading) -> list[GpuReading]:
    mode = _opt(nvml, nvml.nvmlDeviceGetMigMode, h)
    if not mode or mode[0] != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    out = []
    for j in range(_opt(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, h) or 0):
        mig = _opt(nvml, nvml.nvmlDeviceGetMigDeviceHandleByIndex, h, j)
        if mig is None:
            continue                      # an empty slot answers NVML_ERROR_NOT_FOUND
        gi = _opt(nvml, nvml.nvmlDeviceGetGpuInstanceId, mig)
        m = _MIG_PROFILE.search(_text(_opt(nvml, nvml.nvmlDeviceGetName, mig) or ""))
        out.append(_read_one(nvml, mig, uuid=parent.uuid, index=parent.index, name=parent.name,
                             mig_instance="" if gi is None else str(gi),
                             mig_profile=m.group(1) if m else ""))
    return out


def _collect(node: str) -> tuple[list[GpuReading], list[CollectorError]]:
    """Blocking: init NVML, read, shut down."""
    source = f"nvml@{node}"
    try:
        import pynvml as nvml
    except ImportError as exc:
        raise CollectorError(f"NVML unavailable: nvidia-ml-py is not installed ({exc})",
                             source=source, retryable=False) from exc
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        raise CollectorError(f"NVML unavailable: {exc} (no NVIDIA driver on {node}?)",
                             source=source, retryable=False) from exc
    try:
        return read_gpus(nvml)
    except nvml.NVMLError as exc:
        raise CollectorError(f"NVML failed: {exc}", source=source, retryable=True) from exc
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError:
            pass


@dataclass(frozen=True, slots=True)
class NvmlTarget:
    """The GPUs of the machine this collector runs on, reported as node ``node``."""

    cluster: str
    node: str
    source: str = field(default=SOURCE, init=False)

    @property
    def name(self) -> str:
        return f"nvml@{self.node}"

    async def scrape(self, client: HttpClient, now: dt.datetime) -> ScrapeResult:
        readings, errors = await asyncio.to_thread(_collect, self.node)
        result = ScrapeResult(samples=len(readings), errors=list(errors))
        result.add("gpu_samples", reading_rows(readings, cluster=self.cluster, node=self.node, now=now))
        return result
