"""DCGM collector: the recorded dcgm-exporter page and variants of it, served over local HTTP."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import re
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pytest

from collector.base import ScrapeResult
from collector.dcgm import DcgmDiscoverer, DcgmTarget, gpu_sample_rows, targets_from_pods
from collector.errors import ConfigurationError, ParseError, ScrapeError
from collector.http import HttpClient
from collector.prometheus import parse
from gpuq.settings import DcgmTarget as DcgmSettings
from gpuq.settings import KubernetesTarget
from gpuq.store import COLUMNS
from tests.conftest import closed_port, data_path
from tests.ray_fixtures import Canned, http_server_fixture  # noqa: F401 - fixtures

NOW = dt.datetime.now(dt.UTC).replace(hour=12, minute=0, second=0, microsecond=0) - dt.timedelta(days=1)
COL = {c: i for i, c in enumerate(COLUMNS["gpu_samples"])}
A10G_POD = 'container="ray-worker",namespace="ray-llm",pod="ray-1111111"'


@pytest.fixture
def page() -> str:
    return data_path("dcgm", "datadog-integrations-core-metrics.txt").read_text()


def scrape(url: str, node: str = "") -> ScrapeResult:
    async def go() -> ScrapeResult:
        async with HttpClient(timeout_s=5) as client:
            return await DcgmTarget("prod", url, node=node).scrape(client, NOW)
    return asyncio.run(go())


def col(row: tuple[Any, ...], name: str) -> Any:
    return row[COL[name]]


def by_metric(result: ScrapeResult) -> dict[tuple[str, str], tuple[Any, ...]]:
    rows = result.rows["gpu_samples"]
    out = {(col(r, "gpu_uuid"), col(r, "metric")): r for r in rows}
    assert len(out) == len(rows)
    return out


def labelled_series(text: str) -> int:
    """Independent count: DCGM series lines that carry a label block."""
    return sum(1 for line in text.splitlines() if line.startswith("DCGM_") and "{" in line)


def test_recorded_page(http_server: Canned, page: str) -> None:
    result = scrape(http_server.set("/metrics", page))
    rows = result.rows["gpu_samples"]
    assert not result.errors
    assert result.samples == 38 and len(rows) == labelled_series(page) == 24   # 14 label-less skipped
    assert {col(r, "node") for r in rows} == {"424773df46e0", "551bdf382151", "ip-11111"}
    assert {col(r, "source") for r in rows} == {"dcgm"} and {col(r, "ts") for r in rows} == {NOW}
    got = by_metric(result)
    t4 = got[("GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "DCGM_FI_DEV_FB_FREE")]
    assert t4 == (NOW, "prod", "424773df46e0", "GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", 0, "Tesla T4",
                  "", "", "", "", "", "DCGM_FI_DEV_FB_FREE", 15109.0, "dcgm")
    counter = got[("GPU-20c56d28-0da5-6d26-a36a-e7af1ce2586e", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")]
    assert col(counter, "value") == 128996013.0
    a10g = got[("GPU-abc", "DCGM_FI_PROF_DRAM_ACTIVE")]
    assert (col(a10g, "pod"), col(a10g, "namespace"), col(a10g, "container")) == \
        ("ray-1111111", "ray-llm", "ray-worker")
    assert col(a10g, "gpu_model") == "NVIDIA A10G" and col(a10g, "mig_instance") == ""
    assert "DCGM_FI_DEV_FAN_SPEED" not in {col(r, "metric") for r in rows}     # label-less dummy


def test_lowercase_hostname(http_server: Canned, page: str) -> None:
    variant = page.replace('Hostname="', 'hostname="')
    assert variant != page
    rows = scrape(http_server.set("/metrics", variant)).rows["gpu_samples"]
    assert {col(r, "node") for r in rows} == {"424773df46e0", "551bdf382151", "ip-11111"}


@pytest.mark.parametrize("node, want", [("", "127.0.0.1"), ("gpu-node-7", "gpu-node-7")],
                         ids=["url-host", "target-node"])
def test_no_host_label_falls_back(http_server: Canned, page: str, node: str, want: str) -> None:
    variant = re.sub(r',Hostname="[^"]*"', "", page)
    rows = scrape(http_server.set("/metrics", variant), node=node).rows["gpu_samples"]
    assert {col(r, "node") for r in rows} == {want}


def test_pod_name_and_pod_namespace(http_server: Canned, page: str) -> None:
    old_style = 'container_name="ray-worker",pod_namespace="ray-llm",pod_name="ray-1111111"'
    variant = page.replace(A10G_POD, old_style)
    assert variant != page
    a10g = by_metric(scrape(http_server.set("/metrics", variant)))[("GPU-abc", "DCGM_FI_PROF_DRAM_ACTIVE")]
    assert (col(a10g, "pod"), col(a10g, "namespace"), col(a10g, "container")) == \
        ("ray-1111111", "ray-llm", "ray-worker")


def test_mig_labels(http_server: Canned, page: str) -> None:
    a10g_line = next(line for line in page.splitlines() if A10G_POD in line)
    mig = [a10g_line.replace('gpu="0",', f'gpu="2",GPU_I_ID="{gi}",GPU_I_PROFILE="{prof}",')
                    .replace("} ", f"}} {v} ").rsplit(" ", 1)[0]
           for gi, prof, v in (("3", "1g.6gb", 0.25), ("5", "2g.12gb", 0.5))]
    rows = scrape(http_server.set("/metrics", "\n".join(mig) + "\n")).rows["gpu_samples"]
    got = {(col(r, "mig_instance"), col(r, "mig_profile"), col(r, "gpu_index"), col(r, "value"))
           for r in rows}
    assert got == {("3", "1g.6gb", 2, 0.25), ("5", "2g.12gb", 2, 0.5)}
    assert {col(r, "gpu_uuid") for r in rows} == {"GPU-abc"}   # the parent GPU, as dcgm-exporter labels it


def test_malformed_line_keeps_the_rest(http_server: Canned, page: str) -> None:
    lines = page.split("\n")
    at = next(i for i, line in enumerate(lines) if line.startswith("DCGM_FI_DEV_GPU_UTIL{"))
    lines[at] = lines[at].replace('modelName="Tesla T4"', 'modelName="Tesla T4')   # unterminated value
    url = http_server.set("/metrics", "\n".join(lines))
    result = scrape(url)
    [err] = result.errors
    assert isinstance(err, ParseError) and err.lineno == at + 1 and err.source == url
    assert f"line {at + 1}" in str(err) and url in str(err)
    metrics = {col(r, "metric") for r in result.rows["gpu_samples"]}
    assert len(result.rows["gpu_samples"]) == 23 and "DCGM_FI_DEV_GPU_UTIL" not in metrics
    assert {"DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_PROF_DRAM_ACTIVE"} <= metrics   # after the bad line


def test_unreachable_target() -> None:
    url = f"http://127.0.0.1:{closed_port()}/metrics"
    with pytest.raises(ScrapeError, match="cannot connect") as info:
        scrape(url)
    assert info.value.url == url and url in str(info.value) and info.value.retryable
    assert info.value.status is None


def test_http_500(http_server: Canned) -> None:
    url = http_server.set("/metrics", "dcgm: failed to read fields", status=500)
    with pytest.raises(ScrapeError) as info:
        scrape(url)
    err = info.value
    assert err.status == 500 and err.retryable and err.url == url
    assert str(err) == f"{url}: HTTP 500 Internal Server Error: dcgm: failed to read fields"


def test_http_404_is_not_retryable(http_server: Canned) -> None:
    with pytest.raises(ScrapeError) as info:
        scrape(http_server.base + "/nope")
    assert info.value.status == 404 and not info.value.retryable


def test_bad_url_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="ftp://x/metrics"):
        scrape("ftp://x/metrics")


def test_pure_mapping_edge_cases() -> None:
    text = ('DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-1"} NaN\n'
            'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-2"} +Inf\n'
            'DCGM_FI_DEV_GPU_UTIL{gpu="x",UUID="GPU-3",Hostname="h"} 7 1795304803362\n'
            'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-4"} 9\n'
            'DCGM_FI_DEV_FAN_SPEED 0\n')
    mapped = gpu_sample_rows(parse(text), cluster="c", default_node="d", now=NOW)
    assert mapped.skipped == 3                            # NaN, Inf, label-less
    ts = dt.datetime(2026, 11, 21, 23, 46, 43, 362000, tzinfo=dt.UTC)
    assert [(r[0], r[2], r[3], r[4], r[12]) for r in mapped.rows] == [
        (ts, "h", "GPU-3", 0, 7.0), (NOW, "d", "GPU-4", 0, 9.0)]


def test_non_dcgm_series_are_not_kept(http_server: Canned, page: str) -> None:
    extra = "go_goroutines 12\npromhttp_metric_handler_requests_total{code=\"200\"} 3\n"
    result = scrape(http_server.set("/metrics", extra + page))
    assert result.samples == 38 and len(result.rows["gpu_samples"]) == 24


def test_rows_insert_into_store(store: Any, http_server: Canned, page: str) -> None:
    mig_page = page.replace('gpu="0",UUID="GPU-abc"',
                            'gpu="0",UUID="GPU-abc",GPU_I_ID="1",GPU_I_PROFILE="1g.6gb"')
    result = scrape(http_server.set("/metrics", mig_page))
    rows = result.rows["gpu_samples"]
    assert store.insert("gpu_samples", rows, COLUMNS["gpu_samples"]) == 24
    db = store.database
    q = store.query(f"SELECT count(), uniqExact(node), toUnixTimestamp64Milli(min(ts)) FROM {db}.gpu_samples")
    assert q.rows == [(24, 3, int(NOW.timestamp() * 1000))]
    q = store.query(f"SELECT pod, namespace, container, mig_instance, mig_profile, gpu_index, value "
                    f"FROM {db}.gpu_samples WHERE metric = 'DCGM_FI_PROF_DRAM_ACTIVE'")
    assert q.rows == [("ray-1111111", "ray-llm", "ray-worker", "1", "1g.6gb", 0, 3e-06)]


# -- discovery --------------------------------------------------------------------------------

def discover(disc: DcgmDiscoverer) -> list[Any]:
    async def go() -> list[Any]:
        async with HttpClient() as client:
            return await disc.targets(client)
    return asyncio.run(go())


def test_discover_listed_urls() -> None:
    found = discover(DcgmDiscoverer(DcgmSettings(cluster="c", urls=["http://n1:9400/metrics",
                                                                     "http://n2:9400/metrics"])))
    assert [(t.source, t.cluster, t.name) for t in found] == [
        ("dcgm", "c", "http://n1:9400/metrics"), ("dcgm", "c", "http://n2:9400/metrics")]


@pytest.mark.parametrize("settings, kube, match", [
    (DcgmSettings(cluster="c"), None, "no urls and discover_kubernetes is off"),
    (DcgmSettings(cluster="c", discover_kubernetes=True), None, "no collector.kubernetes entry"),
], ids=["nothing", "no-kubernetes"])
def test_discover_misconfigured(settings: DcgmSettings, kube: Any, match: str) -> None:
    with pytest.raises(ConfigurationError, match=match):
        discover(DcgmDiscoverer(settings, kube))


POD_LIST = {"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "42"}, "items": [
    {"metadata": {"name": "dcgm-exporter-b", "namespace": "gpu-operator"},
     "spec": {"nodeName": "gpu-node-2"}, "status": {"phase": "Running", "podIP": "10.1.2.4"}},
    {"metadata": {"name": "dcgm-exporter-a", "namespace": "gpu-operator"},
     "spec": {"nodeName": "gpu-node-1"}, "status": {"phase": "Running", "podIP": "10.1.2.3"}},
    {"metadata": {"name": "dcgm-exporter-c", "namespace": "gpu-operator"},
     "spec": {"nodeName": "gpu-node-3"}, "status": {"phase": "Pending"}},
    {"metadata": {"name": "dcgm-exporter-d", "namespace": "gpu-operator"},
     "spec": {"nodeName": "gpu-node-4"}, "status": {"phase": "Running", "podIP": "fd00::4"}},
]}


def test_targets_from_pods() -> None:
    got = [(t.url, t.node) for t in targets_from_pods(POD_LIST, cluster="c", port=9400)]
    assert got == [("http://10.1.2.3:9400/metrics", "gpu-node-1"),
                   ("http://10.1.2.4:9400/metrics", "gpu-node-2"),
                   ("http://[fd00::4]:9400/metrics", "gpu-node-4")]


def test_discover_through_kubernetes(http_server: Canned, tmp_path: Path) -> None:
    http_server.set("/api/v1/pods", json.dumps(POD_LIST), content_type="application/json")
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": http_server.base}}],
        "users": [{"name": "t", "user": {"token": "x"}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    settings = DcgmSettings(cluster="prod", urls=["http://extra:9400/metrics"], discover_kubernetes=True)
    found = discover(DcgmDiscoverer(settings, KubernetesTarget(cluster="prod", kubeconfig=str(kubeconfig))))
    assert [t.name for t in found] == ["http://extra:9400/metrics", "http://10.1.2.3:9400/metrics",
                                       "http://10.1.2.4:9400/metrics", "http://[fd00::4]:9400/metrics"]
    [req] = [r for r in http_server.requests if r.startswith("/api/v1/pods")]
    assert unquote(req).endswith("?labelSelector=app.kubernetes.io/name=dcgm-exporter")


def test_kubernetes_unreachable_names_the_server(tmp_path: Path) -> None:
    server = f"http://127.0.0.1:{closed_port()}"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": server}}],
        "users": [{"name": "t", "user": {}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "t"}}]}))
    settings = DcgmSettings(cluster="prod", discover_kubernetes=True)
    with pytest.raises(ScrapeError, match="listing dcgm-exporter pods") as info:
        discover(DcgmDiscoverer(settings, KubernetesTarget(cluster="prod", kubeconfig=str(kubeconfig))))
    assert info.value.url == server


def test_missing_kubeconfig_is_a_configuration_error(tmp_path: Path) -> None:
    settings = DcgmSettings(cluster="prod", discover_kubernetes=True)
    kube = KubernetesTarget(cluster="prod", kubeconfig=str(tmp_path / "nope"))
    with pytest.raises(ConfigurationError, match=r"collector.kubernetes\[cluster=prod\]: cannot load .*nope"):
        discover(DcgmDiscoverer(settings, kube))
