"""NVML collector: the mapping through a fake NVML, the clear error without a driver, and the
real thing where an NVIDIA GPU is present."""
from __future__ import annotations

import asyncio
import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import pytest

from collector.base import ScrapeResult
from collector.errors import CollectorError
from collector.http import HttpClient
from collector.nvml import METRICS, GpuReading, NvmlTarget, read_gpus, reading_rows
from gpuq.store import COLUMNS

NOW = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
MIB = 1 << 20


def scrape(target: NvmlTarget) -> ScrapeResult:
    async def go() -> ScrapeResult:
        async with HttpClient() as client:
            return await target.scrape(client, NOW)
    return asyncio.run(go())


# -- a tiny fake NVML -------------------------------------------------------------------------

class FakeNVMLError(Exception):
    pass


@dataclass
class Util:
    gpu: int
    memory: int


@dataclass
class Mem:
    total: int
    free: int
    used: int


@dataclass
class Handle:
    uuid: str
    name: str
    util: Util | None = None
    mem: Mem | None = None
    power_mw: int | None = None
    temp_c: int | None = None
    clocks: dict[int, int] = field(default_factory=dict)
    energy_mj: int | None = None
    mig_mode: tuple[int, int] | None = None
    migs: list[Handle | None] = field(default_factory=list)
    gpu_instance: int | None = None
    lost: bool = False


def _get(value: Any) -> Any:
    if value is None:
        raise FakeNVMLError("Not Supported")
    return value


class FakeNvml:
    """The pynvml functions read_gpus calls, over Handle objects."""

    NVMLError = FakeNVMLError
    NVML_TEMPERATURE_GPU, NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_DEVICE_MIG_ENABLE = 0, 1, 2, 1

    def __init__(self, handles: list[Handle]) -> None:
        self.handles = handles

    def nvmlDeviceGetCount(self) -> int:
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Handle:
        return self.handles[i]

    def nvmlDeviceGetUUID(self, h: Handle) -> str:
        if h.lost:
            raise FakeNVMLError("GPU is lost")
        return h.uuid

    def nvmlDeviceGetName(self, h: Handle) -> bytes:
        return h.name.encode()

    def nvmlDeviceGetUtilizationRates(self, h: Handle) -> Util:
        return _get(h.util)

    def nvmlDeviceGetMemoryInfo(self, h: Handle) -> Mem:
        return _get(h.mem)

    def nvmlDeviceGetPowerUsage(self, h: Handle) -> int:
        return _get(h.power_mw)

    def nvmlDeviceGetTemperature(self, h: Handle, sensor: int) -> int:
        assert sensor == self.NVML_TEMPERATURE_GPU
        return _get(h.temp_c)

    def nvmlDeviceGetClockInfo(self, h: Handle, kind: int) -> int:
        return _get(h.clocks.get(kind))

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Handle) -> int:
        return _get(h.energy_mj)

    def nvmlDeviceGetMigMode(self, h: Handle) -> tuple[int, int]:
        return _get(h.mig_mode)

    def nvmlDeviceGetMaxMigDeviceCount(self, h: Handle) -> int:
        return len(h.migs)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h: Handle, j: int) -> Handle:
        return _get(h.migs[j])

    def nvmlDeviceGetGpuInstanceId(self, h: Handle) -> int:
        return _get(h.gpu_instance)


H100 = Handle("GPU-h100-0", "NVIDIA H100 80GB HBM3", util=Util(93, 41),
              mem=Mem(total=81559 * MIB, free=1559 * MIB, used=80000 * MIB), power_mw=612_500, temp_c=67,
              clocks={1: 1980, 2: 2619}, energy_mj=9_876_543, mig_mode=(0, 0))
A100_MIG = Handle("GPU-a100-1", "NVIDIA A100-SXM4-40GB", util=None,
                  mem=Mem(total=40960 * MIB, free=30720 * MIB, used=10240 * MIB), power_mw=None, temp_c=40,
                  mig_mode=(1, 1), migs=[
                      Handle("MIG-aaa", "NVIDIA A100-SXM4-40GB MIG 1g.5gb",
                             mem=Mem(4864 * MIB, 864 * MIB, 4000 * MIB), gpu_instance=7),
                      None,                                # an empty MIG slot
                      Handle("MIG-bbb", "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
                             mem=Mem(19968 * MIB, 19968 * MIB, 0), gpu_instance=2)])
LOST = Handle("GPU-lost", "NVIDIA H100", lost=True)


def test_read_and_map_through_a_fake_nvml() -> None:
    readings, errors = read_gpus(FakeNvml([H100, LOST, A100_MIG]))
    [err] = errors
    assert isinstance(err, CollectorError) and "GPU 1" in str(err) and "GPU is lost" in str(err)
    rows = reading_rows(readings, cluster="lab", node="gpu-box", now=NOW)
    assert all(len(r) == len(COLUMNS["gpu_samples"]) for r in rows)
    got = {(r[3], r[7], r[11]): r for r in rows}
    h100 = {k[2]: r[12] for k, r in got.items() if k[:2] == ("GPU-h100-0", "")}
    assert h100 == {
        "DCGM_FI_DEV_GPU_UTIL": 93.0, "DCGM_FI_DEV_MEM_COPY_UTIL": 41.0, "DCGM_FI_DEV_FB_USED": 80000.0,
        "DCGM_FI_DEV_FB_FREE": 1559.0, "DCGM_FI_DEV_FB_TOTAL": 81559.0, "DCGM_FI_DEV_POWER_USAGE": 612.5,
        "DCGM_FI_DEV_GPU_TEMP": 67.0, "DCGM_FI_DEV_SM_CLOCK": 1980.0, "DCGM_FI_DEV_MEM_CLOCK": 2619.0,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 9_876_543.0}
    assert got[("GPU-h100-0", "", "DCGM_FI_DEV_GPU_UTIL")] == (
        NOW, "lab", "gpu-box", "GPU-h100-0", 0, "NVIDIA H100 80GB HBM3", "", "", "", "", "",
        "DCGM_FI_DEV_GPU_UTIL", 93.0, "nvml")
    # A100 in MIG mode: unsupported readings are absent, not zero
    a100 = {k[2] for k in got if k[:2] == ("GPU-a100-1", "")}
    assert a100 == {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_TOTAL",
                    "DCGM_FI_DEV_GPU_TEMP"}
    mig = got[("GPU-a100-1", "7", "DCGM_FI_DEV_FB_USED")]
    assert (mig[4], mig[5], mig[6], mig[12]) == (2, "NVIDIA A100-SXM4-40GB", "1g.5gb", 4000.0)
    assert got[("GPU-a100-1", "2", "DCGM_FI_DEV_FB_FREE")][6] == "3g.20gb"
    assert {k[1] for k in got} == {"", "7", "2"}


def test_mapping_is_pure_and_names_dcgm_metrics() -> None:
    r = GpuReading(uuid="GPU-x", index=3, name="T4", gpu_util_pct=5.0)
    assert reading_rows([r], cluster="c", node="n", now=NOW) == [
        (NOW, "c", "n", "GPU-x", 3, "T4", "", "", "", "", "", "DCGM_FI_DEV_GPU_UTIL", 5.0, "nvml")]
    assert set(METRICS.values()) <= {
        "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_FB_TOTAL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"}


# -- the real NVML ----------------------------------------------------------------------------

def nvml_error() -> str | None:
    """None when NVML initialises here, else its error."""
    try:
        import pynvml
    except ImportError as exc:
        return f"nvidia-ml-py not installed: {exc}"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return str(exc)
    pynvml.nvmlShutdown()
    return None


def test_unavailable_nvml_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs everywhere: without a driver the real error is checked; with one, a missing library
    is simulated."""
    pynvml = pytest.importorskip("pynvml")
    real = nvml_error()
    if real is None:
        def missing() -> None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        monkeypatch.setattr(pynvml, "nvmlInit", missing)
        real = str(pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    with pytest.raises(CollectorError) as info:
        scrape(NvmlTarget("lab", "box-1"))
    err = info.value
    assert str(err).startswith(f"NVML unavailable: {real}") and "box-1" in str(err)
    assert err.source == "nvml@box-1" and not err.retryable


@pytest.mark.gpu
def test_real_gpus() -> None:
    reason = nvml_error()
    if reason is not None:
        print(f"skipping: no NVIDIA driver/GPU here: {reason}")
        pytest.skip(f"no NVIDIA driver/GPU here: {reason}")
    import pynvml

    pynvml.nvmlInit()
    try:
        count = pynvml.nvmlDeviceGetCount()
        uuids = {pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)}
    finally:
        pynvml.nvmlShutdown()
    result = scrape(NvmlTarget("lab", "this-node"))
    rows = result.rows.get("gpu_samples", [])
    assert not result.errors and count > 0
    whole = [r for r in rows if r[7] == ""]
    assert {r[3] for r in whole} == {u.decode() if isinstance(u, bytes) else u for u in uuids}
    totals = {r[3]: r[12] for r in whole if r[11] == "DCGM_FI_DEV_FB_TOTAL"}
    assert len(totals) == count and all(v > 0 for v in totals.values())
    for r in whole:
        if r[11] == "DCGM_FI_DEV_GPU_UTIL":
            assert 0 <= r[12] <= 100
    print(f"{count} GPU(s), {len(rows)} rows: {sorted({r[5] for r in rows})}")
