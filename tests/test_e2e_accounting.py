"""Issue 3 end to end: rows written by the collectors' own code paths (the Kubernetes watcher
against recorded API responses, the DCGM target against pages served over HTTP) into chDB,
then `gpuq usage` / `gpuq queues` through the accounting. The expected numbers are computed
here from the recorded Pod objects with a few lines of independent arithmetic."""
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
from gpuq.store.writer import BatchWriter
from tests.conftest import LONG_RETENTION, REPO
from tests.k8s_replay import ReplayServer
from tests.ray_fixtures import Canned, http_server_fixture  # noqa: F401

UTC = dt.timezone.utc
FROM = dt.datetime(2026, 11, 21, 9, 0, tzinfo=UTC)
TO = dt.datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
QUEUES = """
mapping:
  namespaces: {team-speech: speech}
queues:
  vision: {guaranteed: {gpu: 8}, max: {gpu: 16}}
  speech: {guaranteed: {gpu: 4}, max: {gpu: 8}}
  nlp:
    guaranteed: {gpu: 4}
    queues:
      interactive: {guaranteed: {gpu: 2}}
      batch: {guaranteed: {gpu: 2}}
"""


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def expected_gpu_seconds() -> dict[str, float]:
    """From the recorded pods: GPUs x the part of [FROM, TO) between scheduling and the end. A MIG
    slice ``<N>g.*`` of these A100/H100 nodes is N/7 of a GPU (a pod's slices rounded down to the
    thousandth); on the single-strategy node ``nvidia.com/gpu`` is a slice of its product's profile."""
    queue_of = {"team-vision": "vision", "team-speech": "speech"}
    pods = json.loads((REPO / "tests" / "data" / "k8s" / "pods.json").read_text())["items"]
    nodes = json.loads((REPO / "tests" / "data" / "k8s" / "nodes.json").read_text())["items"]
    product = {n["metadata"]["name"]: n["metadata"].get("labels", {}).get("nvidia.com/gpu.product", "") for n in nodes}
    out: dict[str, float] = {}
    for p in pods:
        sevenths = 0
        for c in p["spec"]["containers"]:
            for k, v in c.get("resources", {}).get("limits", {}).items():
                single = product.get(p["spec"].get("nodeName", ""), "").partition("-MIG-")[2]
                if k.startswith("nvidia.com/mig-"):
                    sevenths += int(v) * int(k.removeprefix("nvidia.com/mig-").split("g.")[0])
                elif k == "nvidia.com/gpu":
                    sevenths += int(v) * (int(single.split("g.")[0]) if single else 7)
        gpus = (sevenths * 1000 // 7) / 1000
        if not gpus or not p["spec"].get("nodeName"):
            continue
        start = ts(next(c["lastTransitionTime"] for c in p["status"]["conditions"] if c["type"] == "PodScheduled"))
        end = TO
        if p["status"]["phase"] in ("Succeeded", "Failed"):
            end = max(ts(c["state"]["terminated"]["finishedAt"]) for c in p["status"]["containerStatuses"])
        ann = (p["metadata"].get("annotations") or {}).get("yunikorn.apache.org/queue")
        lab = (p["metadata"].get("labels") or {})
        queue = (lab.get("kueue.x-k8s.io/queue-name") or (ann or lab.get("queue", "")).removeprefix("root.")
                 or queue_of.get(p["metadata"]["namespace"], ""))
        secs = max(0.0, (min(end, TO) - max(start, FROM)).total_seconds())
        out[queue] = out.get(queue, 0.0) + gpus * secs
    return out


def dcgm_page(pod: str, namespace: str, node: str, gpus: int, util: float) -> str:
    return "".join(
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{pod}-{g}",modelName="NVIDIA A100-SXM4-80GB",'
        f'Hostname="{node}",pod="{pod}",namespace="{namespace}",container="main"}} {util}\n'
        for g in range(gpus))


def run_json(main: Any, argv: list[str], settings: Any) -> list[dict[str, Any]]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(argv + ["--format", "json"], settings, now_s=TO.timestamp(), out=out, err=err)
    assert rc == 0, err.getvalue()
    return json.loads(out.getvalue())


def test_usage_and_idle_from_collector_rows(long_store: Any, store_dsn: str, tmp_path: Path,
                                            http_server: Canned) -> None:
    # the recorded pods (tests/data/k8s) have fixed times: a store that keeps them whatever the date
    writer = BatchWriter(long_store, tmp_path / "spill")
    with ReplayServer.recorded() as api:
        target = KubernetesTarget(cluster="prod", kubeconfig=str(api.kubeconfig(tmp_path / "kubeconfig")))
        KubernetesWatcher(target).run(writer.write, threading.Event(), once=True)
    # DCGM: the speech pod's 2 GPUs sit at 0 % from 09:21 for an hour; the vision worker is busy
    idle_url = http_server.set("/idle", dcgm_page("asr-train-0", "team-speech", "gpu-a100-0", 2, 0.0))
    busy_url = http_server.set("/busy", dcgm_page("raycluster-vision-gpu-group-worker-9fz4q", "team-vision",
                                                  "gpu-a100-0", 4, 80.0))

    async def scrape_hour() -> None:
        async with HttpClient(timeout_s=5) as client:
            for i in range(240):                                   # every 15 s, 09:21 .. 10:21
                now = dt.datetime(2026, 11, 21, 9, 21, tzinfo=UTC) + dt.timedelta(seconds=15 * i)
                for url in (idle_url, busy_url):
                    result = await DcgmTarget("prod", url).scrape(client, now)
                    for table, rows in result.rows.items():
                        writer.write(table, rows)
    asyncio.run(scrape_hour())
    writer.flush()

    (tmp_path / "queues.yaml").write_text(QUEUES)
    settings = load_settings(None, store={"dsn": store_dsn, "retention": LONG_RETENTION},
                             queues_file=str(tmp_path / "queues.yaml"))
    window = ["--from", FROM.isoformat(), "--to", TO.isoformat()]
    rows = {r["queue"]: r for r in run_json(usage_main, window + ["--by", "queue"], settings)}

    want = expected_gpu_seconds()
    assert set(want) == {"vision", "speech", "nlp.interactive", "nlp.batch"}
    for queue, secs in want.items():
        assert rows[queue]["gpu_seconds"] == pytest.approx(secs), queue
    # idle: 2 GPUs quiet from 09:21 (a run of an hour >= the 30 min window) -> 09:21..10:00
    assert rows["speech"]["idle_gpu_seconds"] == pytest.approx(2 * 39 * 60)
    assert rows["vision"]["idle_gpu_seconds"] == 0          # busy
    assert rows["nlp.batch"]["idle_gpu_seconds"] == 0       # no DCGM data: unknown, not idle

    now = {(r["queue"], r["gpu_type"]): r for r in run_json(queues_main, [], settings)}
    speech = now[("speech", "*")]                             # "*": all GPU types of the queue
    assert (speech["allocated"], speech["guaranteed"], speech["max"]) == (2, 4, 8)
    assert (speech["lent"], speech["borrowed"], speech["fair_share"]) == (2, 0, 0.5)
    assert speech["idle"] == 2                                  # both GPUs idle at 10:00
    vision = now[("vision", "*")]
    assert (vision["allocated"], vision["idle"]) == (4, 0)
    assert now[("nlp", "*")]["allocated"] == 3                  # parent = sum of its children (2 MIG + 1)
    # the 3 MIG slices count as slices, and are billed their fraction: 2/7 + 1/7 of a GPU
    assert rows["nlp.interactive"]["gpu_seconds"] == pytest.approx(0.285 * 3600)
