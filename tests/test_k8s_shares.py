"""Issue 19's done-when for Kubernetes: a pod with KAI's ``gpu-fraction: "0.25"``, a time-sliced
replica and a MIG slice are each billed their share, from recorded objects (tests/data/k8s/
shares.json) served by the replay server to the collector's watcher, through chDB into `gpuq usage`
and `gpuq queues`; idle time by share from dcgm-exporter pages served over HTTP (tests/data/dcgm).
The expected numbers are computed here from the objects with a few lines of arithmetic."""
from __future__ import annotations

import asyncio
import datetime as dt
import io
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from accounting.cli import queues_main, usage_main
from collector.dcgm import DcgmTarget
from collector.http import HttpClient
from collector.kubernetes import KubernetesWatcher
from gpuq.settings import KubernetesTarget, load_settings
from gpuq.store import open_store
from gpuq.store.writer import BatchWriter
from tests.conftest import LONG_RETENTION, data_path
from tests.k8s_replay import ReplayServer, load
from tests.ray_fixtures import Canned, http_server_fixture  # noqa: F401

UTC = dt.UTC
FROM = dt.datetime(2026, 11, 21, 9, 0, tzinfo=UTC)
TO = dt.datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
HOUR = 3600.0
QUEUES = """
mapping:
  namespaces: {team-serve: serve}
queues:
  serve: {guaranteed: {gpu: 2}}
  nlp:
    guaranteed: {gpu: 4}
    queues:
      interactive: {guaranteed: {gpu: 2}}
      batch: {guaranteed: {gpu: 2}}
"""
# shares: KAI's fraction; one replica of a GPU the device plugin advertises 3 times (1000 // 3);
# a 1g.10gb slice of an A100 80GB (1/7 of its compute slices, rounded down: 1000 // 7)
BILLED = {"frac-1-0-0": 250, "infer-a-0": 333, "infer-b-0": 333, "notebook-bob-0": 142}
MIG_PAGE_LINE = ('DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="3",UUID="GPU-4b1f0c3e-7f2a-4a8e-9d61-2c5e8b7a9f03",'
                 'device="nvidia3",modelName="NVIDIA A100-SXM4-80GB",GPU_I_PROFILE="1g.10gb",GPU_I_ID="9",'
                 'Hostname="gpu-a100-mig-0",DCGM_FI_DRIVER_VERSION="550.127.05",container="notebook",'
                 'namespace="team-nlp",pod="notebook-bob-0"}} {value}\n')


def shares() -> dict[str, Any]:
    return load("shares.json")  # type: ignore[no-any-return]


def run_json(main: Any, argv: list[str], settings: Any) -> list[dict[str, Any]]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(argv + ["--format", "json"], settings, now_s=TO.timestamp(), out=out, err=err)
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())  # type: ignore[no-any-return]


@pytest.fixture
def collected(long_store: Any, store_dsn: str, tmp_path: Path, http_server: Canned) -> Any:
    """The shares' objects watched once, and an hour of DCGM pages scraped every minute from 09:00."""
    writer = BatchWriter(long_store, tmp_path / "spill")
    nodes = [*load("nodes.json")["items"], *shares()["nodes"]]
    with ReplayServer(shares()["pods"], nodes, resource_version=48213000) as api:
        target = KubernetesTarget(cluster="prod", kubeconfig=str(api.kubeconfig(tmp_path / "kubeconfig")))
        # seen at 09:05 (node events are stamped when seen: the view at 10:00 reads them whatever the date)
        KubernetesWatcher(target, clock=lambda: FROM + dt.timedelta(minutes=5)).run(writer.write, threading.Event(),
                                                                                     once=True)
    urls = [http_server.set("/per-process", data_path("dcgm", "hand-time-slicing-per-process.prom").read_text()),
            http_server.set("/fraction", data_path("dcgm", "fake-gpu-operator-fraction-1-workload.ini").read_text()),
            # built by hand with the labels of the recorded MIG page: the notebook's slice, quiet
            http_server.set("/mig", MIG_PAGE_LINE.format(value="0.000062"))]

    async def scrape_hour() -> None:
        async with HttpClient(timeout_s=5) as client:
            for i in range(61):
                for url in urls:
                    result = await DcgmTarget("prod", url).scrape(client, FROM + dt.timedelta(minutes=i))
                    for table, rows in result.rows.items():
                        writer.write(table, rows)
    asyncio.run(scrape_hour())
    writer.flush()
    (tmp_path / "queues.yaml").write_text(QUEUES)
    return load_settings(None, store={"dsn": store_dsn, "retention": LONG_RETENTION},
                         queues_file=str(tmp_path / "queues.yaml"))


def test_each_pod_is_billed_its_share(collected: Any, store_dsn: str) -> None:
    store = open_store(store_dsn)
    try:
        rows = store.query(f"SELECT pod, milli_gpus, gpus, gpu_model, gpu_resource "
                           f"FROM {store.database}.gpu_allocations FINAL ORDER BY pod").rows
    finally:
        store.close()
    got = {p: m for p, m, *_ in rows}
    assert got == BILLED                            # the reservation pod holds nothing of its own
    models = {p: (m, r) for p, _, _, m, r in rows}
    assert models["frac-1-0-0"] == ("NVIDIA-A100-SXM4-80GB", "gpu-fraction")
    assert models["infer-a-0"] == ("Tesla-T4-SHARED", "nvidia.com/gpu")
    assert models["notebook-bob-0"] == ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", "nvidia.com/mig-1g.10gb")

    usage = {r["workload"]: r for r in run_json(usage_main, ["--from", FROM.isoformat(), "--to", TO.isoformat(),
                                                              "--by", "workload", "--idle-source", "raw"], collected)}
    for pod, milli in BILLED.items():
        assert usage[pod]["gpu_seconds"] == pytest.approx(milli / 1000 * HOUR), pod


def test_idle_is_billed_by_share_and_names_its_method(collected: Any) -> None:
    usage = {r["workload"]: r for r in run_json(usage_main, ["--from", FROM.isoformat(), "--to", TO.isoformat(),
                                                              "--by", "workload", "--idle-source", "raw"], collected)}
    # infer-b's own processes are quiet (per-process fields) while the device is busy with infer-a's
    assert usage["infer-b-0"]["idle_gpu_seconds"] == pytest.approx(0.333 * HOUR)
    assert usage["infer-b-0"]["idle_ratio"] == pytest.approx(1.0)
    assert usage["infer-a-0"]["idle_gpu_seconds"] == 0
    assert usage["infer-a-0"]["idle_method"] == usage["infer-b-0"]["idle_method"] == "per_process"
    # a quiet MIG slice is idle for its fraction of the GPU, not for a whole GPU
    assert usage["notebook-bob-0"]["idle_gpu_seconds"] == pytest.approx(0.142 * HOUR)
    assert usage["notebook-bob-0"]["idle_method"] == "device"
    # dcgm-exporter names KAI's reservation pod, never the fractional one: not idle (unknown), and
    # the reservation pod's quiet GPU is billed to nobody
    assert usage["frac-1-0-0"]["idle_gpu_seconds"] == 0
    assert usage["frac-1-0-0"]["idle_method"] == "device_split_by_share"
    assert not any(w.startswith("runai-reservation") for w in usage)


def test_capacity_balances_and_counts_slices_as_slices(collected: Any) -> None:
    nodes = {(r["node"], r["gpu_type"]): r for r in run_json(queues_main, ["--show", "nodes"], collected)}
    t4 = nodes[("gpu-t4-ts-0", "Tesla-T4-SHARED")]
    assert (t4["capacity"], t4["allocated"], t4["free"]) == (1, 0.666, 0.334)   # its GPU, not its 3 replicas
    a100 = nodes[("gpu-a100-0", "NVIDIA-A100-SXM4-80GB")]
    assert (a100["capacity"], a100["allocated"]) == (8, 0.25)
    mig = nodes[("gpu-a100-mig-0", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb")]
    assert (mig["capacity"], mig["allocated"]) == (56, 1)                      # one slice of its 56
    for r in nodes.values():
        assert r["overcommitted"] == 0 and r["allocated"] <= r["capacity"], r

    queues = {(r["queue"], r["gpu_type"]): r for r in run_json(queues_main, [], collected)}
    assert queues[("serve", "*")]["allocated"] == 0.916                        # 0.25 + 0.333 + 0.333
    assert queues[("serve", "*")]["idle"] == 0.333                             # infer-b, by its share
    assert queues[("nlp.interactive", "*")]["allocated"] == 1                  # the slice, counted as one
