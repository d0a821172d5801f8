"""dcgm-exporter pages of shared GPUs: a MIG page and a fractional GPU recorded by run:ai, and two
hand-built time-slicing pages with and without dcgm-exporter's per-process fields (sources:
tests/data/dcgm/SOURCES.md), parsed by the collector's own path, served over local HTTP."""
from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest

from collector.base import ScrapeResult
from collector.dcgm import DcgmTarget, gpu_sample_rows, per_process_devices
from collector.http import HttpClient
from collector.prometheus import parse
from gpuq.gpu_share import mig_fraction, milli_floor
from gpuq.store import COLUMNS
from tests.conftest import data_path
from tests.ray_fixtures import Canned, http_server_fixture  # noqa: F401 - fixtures

NOW = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)
COL = {c: i for i, c in enumerate(COLUMNS["gpu_samples"])}
MIG_PAGE = "fake-gpu-operator-mig-active-2x1g.5gb-2g.10gb.ini"
FRACTION_PAGE = "fake-gpu-operator-fraction-1-workload.ini"
PER_PROCESS_PAGE = "hand-time-slicing-per-process.prom"
COPIES_PAGE = "hand-time-slicing-device-copies.prom"
T4 = "GPU-7a2e92f2-be71-d37e-a744-541600ffc722"


def text(name: str) -> str:
    return data_path("dcgm", name).read_text()


def scrape(url: str) -> ScrapeResult:
    async def go() -> ScrapeResult:
        async with HttpClient(timeout_s=5) as client:
            return await DcgmTarget("prod", url).scrape(client, NOW)
    return asyncio.run(go())


def rows_of(name: str) -> list[dict[str, Any]]:
    mapped = gpu_sample_rows(parse(text(name), source=name), cluster="prod", default_node="n", now=NOW)
    return [{c: r[i] for c, i in COL.items()} for r in mapped.rows]


def series_lines(page: str) -> list[str]:
    """Independent of the parser: the sample lines of a page."""
    return [line for line in page.splitlines() if line.startswith("DCGM_")]


def test_the_recorded_mig_page_keeps_each_instance_and_reports_its_title_line(http_server: Canned) -> None:
    page = text(MIG_PAGE)
    result = scrape(http_server.set("/metrics", page))
    (err,) = result.errors                                   # the sample's title, not exposition text
    assert "/metrics: line 1:" in str(err) and err.line == "Active 2*1g.5gb + 2g.10gb"
    rows = [{c: r[i] for c, i in COL.items()} for r in result.rows["gpu_samples"]]
    assert len(rows) == len(series_lines(page)) == 42       # nothing after the bad line is lost
    instances = {(r["mig_instance"], r["mig_profile"]) for r in rows}
    assert instances == {("7", "1g.5gb"), ("9", "1g.5gb"), ("5", "2g.10gb")}
    assert {r["gpu_uuid"] for r in rows} == {"GPU-7099682b-a20d-2bcc-74ab-b9060454d81e"}
    assert {r["pod"] for r in rows} == {""}                  # run:ai's dynamic MIG: no pod attribution
    active = {r["mig_instance"]: r["value"] for r in rows if r["metric"] == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    assert active == {"7": 0.000062, "9": 0.999917, "5": 0.000036}
    assert not any(r["metric"] == "DCGM_FI_DEV_GPU_UTIL" for r in rows)   # DCGM has none for MIG instances
    assert all(r["source"] == "dcgm" for r in rows)


@pytest.mark.parametrize("profile, milli", [("1g.5gb", 142), ("2g.10gb", 285)])
def test_the_mig_pages_instances_are_their_fraction_of_the_gpu(profile: str, milli: int) -> None:
    """The page's ``modelName`` and ``GPU_I_PROFILE`` name the fraction: N/7 of an A100, rounded down."""
    (model,) = {r["gpu_model"] for r in rows_of(MIG_PAGE)}
    assert model == "NVIDIA A100-SXM4-40GB"
    assert milli_floor(mig_fraction(model, profile)) == milli


def test_the_recorded_fraction_page_names_the_reservation_pod() -> None:
    rows = rows_of(FRACTION_PAGE)
    gpu0 = {r["pod"] for r in rows if r["gpu_index"] == 0}
    assert gpu0 == {"runai-reservation-gpu-qa-mig-worker-gpu-1-kvltw"}
    assert {r["namespace"] for r in rows if r["gpu_index"] == 0} == {"runai-reservation"}
    assert {r["pod"] for r in rows if r["gpu_index"] == 1} == {""}
    assert len(rows) == len(series_lines(text(FRACTION_PAGE)))
    assert per_process_devices(parse(text(FRACTION_PAGE))) == frozenset()


def test_per_process_fields_are_the_pods_own_and_device_copies_are_kept_once() -> None:
    page = text(PER_PROCESS_PAGE)
    assert per_process_devices(parse(page)) == {(T4, "0", "")}
    mapped = gpu_sample_rows(parse(page), cluster="prod", default_node="n", now=NOW)
    rows = [{c: r[i] for c, i in COL.items()} for r in mapped.rows]
    util = {(r["pod"], r["source"]): r["value"] for r in rows if r["metric"] == "DCGM_FI_DEV_GPU_UTIL"}
    assert util == {("", "dcgm"): 37.0, ("infer-a-0", "dcgm-process"): 37.0, ("infer-b-0", "dcgm-process"): 0.0}
    memory = {(r["pod"], r["source"]): r["value"] for r in rows if r["metric"] == "DCGM_FI_DEV_FB_USED"}
    assert memory == {("", "dcgm"): 5301.0, ("infer-a-0", "dcgm-process"): 5173.0, ("infer-b-0", "dcgm-process"): 0.0}
    # the profiling field is the device's, copied to each pod: one device-level row, not the pods'
    prof = [(r["pod"], r["namespace"], r["value"]) for r in rows if r["metric"] == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    assert prof == [("", "", 0.402118)]
    assert mapped.copies == 1
    power = {r["pod"] for r in rows if r["metric"] == "DCGM_FI_DEV_POWER_USAGE"}
    assert power == {"infer-a-0", "infer-b-0"}               # other fields are left as the exporter wrote them
    assert len(rows) + mapped.copies == len(series_lines(page))


def test_without_per_process_fields_each_pod_keeps_the_device_copy() -> None:
    page = text(COPIES_PAGE)
    assert per_process_devices(parse(page)) == frozenset()
    rows = rows_of(COPIES_PAGE)
    assert len(rows) == len(series_lines(page))
    prof = {r["pod"]: r["value"] for r in rows if r["metric"] == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
    assert prof == {"infer-a-0": 0.000041, "infer-b-0": 0.000041}
    assert {r["source"] for r in rows} == {"dcgm"}


def test_per_process_zeros_on_a_mig_instance_are_dropped() -> None:
    """NVML has no per-process utilization on MIG: dcgm-exporter writes 0 for each pod there. Those
    series measure nothing and are dropped; the instance's own fields stay the pods'."""
    labels = 'gpu="0",UUID="GPU-m",modelName="NVIDIA A100-SXM4-80GB",GPU_I_PROFILE="1g.10gb",GPU_I_ID="7"'
    pods = [f'{labels},pod="p{i}",namespace="ns",container="c"' for i in (1, 2)]
    page = "\n".join([f"DCGM_FI_DEV_FB_USED{{{labels}}} 900", *(f"DCGM_FI_DEV_FB_USED{{{p}}} 450" for p in pods),
                      *(f"DCGM_FI_DEV_GPU_UTIL{{{p}}} 0" for p in pods),
                      *(f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{p}}} 0.73" for p in pods)])
    mapped = gpu_sample_rows(parse(page), cluster="prod", default_node="n", now=NOW)
    rows = [{c: r[i] for c, i in COL.items()} for r in mapped.rows]
    assert not any(r["metric"] == "DCGM_FI_DEV_GPU_UTIL" for r in rows) and mapped.copies == 2
    assert {r["pod"] for r in rows if r["metric"] == "DCGM_FI_PROF_GR_ENGINE_ACTIVE"} == {"p1", "p2"}
    assert {(r["pod"], r["source"]) for r in rows if r["metric"] == "DCGM_FI_DEV_FB_USED"} == {
        ("", "dcgm"), ("p1", "dcgm-process"), ("p2", "dcgm-process")}
