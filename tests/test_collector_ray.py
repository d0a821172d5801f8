"""Ray collector: recorded Ray 2.60 answers over local HTTP (fast), then a real Ray head."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from collector.base import ScrapeResult
from collector.errors import ConfigurationError, ScrapeError
from collector.http import HttpClient
from collector.prometheus import parse
from collector.ray import (
    STATE_LIMIT,
    RayDiscoverer,
    RayNodeMetricsTarget,
    RayStateTarget,
    job_rows,
    keep_metric,
    metrics_ports,
    node_rows,
    page_rows,
    placement_group_rows,
    state_api_items,
)
from gpuq.settings import RayTarget
from gpuq.store import COLUMNS
from tests.conftest import closed_port, data_path
from tests.ray_fixtures import Canned, RayHead, http_server_fixture, ray_head_fixture  # noqa: F401 - fixtures

NOW = dt.datetime.now(dt.UTC).replace(hour=23, minute=5, second=0, microsecond=0) - dt.timedelta(days=1)
NODE_ID = "0b36bf516a5df43549fee10ef36da6f3d15011f62719cb2ab5f4ebe5"

# Answers of a real Ray 2.60.0 dashboard (one head, an actor holding 2 GPUs, a placement group of
# one {"CPU": 0.5, "GPU": 1} bundle), recorded while writing this collector.
PG_DETAIL = {"result": True, "msg": "", "data": {"result": {
    "total": 1, "num_after_truncation": 1, "num_filtered": 1, "partial_failure_warning": "",
    "warnings": None, "result": [{
        "placement_group_id": "6378982a9e707b45492b64d19c3601000000", "name": "mypg",
        "creator_job_id": "01000000", "state": "CREATED",
        "bundles": [{"bundle_id": {"placement_group_id": "6378982a9e707b45492b64d19c3601000000",
                                   "bundle_index": 0},
                     "unit_resources": {"CPU": 0.5, "GPU": 1.0}, "node_id": NODE_ID, "label_selector": {}}],
        "is_detached": False, "stats": {"scheduling_state": "FINISHED", "scheduling_attempt": 1},
        "topology_strategy": {}, "topology_assignments": {}}]}}}
JOBS = [
    {"type": "DRIVER", "job_id": "01000000", "submission_id": None,
     "driver_info": {"id": "01000000", "node_ip_address": "192.0.2.2", "pid": "5485"},
     "status": "RUNNING", "entrypoint": "python driver.py", "message": None, "error_type": None,
     "start_time": 1795304803362, "end_time": 0, "metadata": {}, "runtime_env": {},
     "driver_agent_http_address": None, "driver_node_id": None, "driver_exit_code": None},
    {"type": "SUBMISSION", "job_id": "02000000", "submission_id": "raysubmit_1", "status": "SUCCEEDED",
     "entrypoint": "python train.py", "start_time": 1795304803000, "end_time": 1795304809500,
     "metadata": {"team": "vision"}, "runtime_env": {}},
]
REFUSED = (b'{"result": false, "msg": "invalid literal for int() with base 10: \'abc\'", '
           b'"data": {"result": null}}')
SUMMARY = {"result": True, "msg": "Node summary fetched.", "data": {"summary": [
    {"ip": "192.0.2.2", "raylet": {"nodeId": NODE_ID, "metricsExportPort": 38123, "nodeManagerPort": 46015}},
]}}


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def scrape(target: Any) -> ScrapeResult:
    async with HttpClient(timeout_s=5) as client:
        result: ScrapeResult = await target.scrape(client, NOW)
        return result


async def discover(disc: RayDiscoverer) -> list[Any]:
    async with HttpClient(timeout_s=5) as client:
        return await disc.targets(client)


def resources(result: ScrapeResult) -> dict[tuple[str, str, str], float]:
    rows = result.rows.get("ray_resources", [])
    table = {(r[2], r[3], r[4]): r[5] for r in rows}
    assert len(table) == len(rows), "one row per (node, resource, state)"
    return table


@pytest.fixture
def fixture_page() -> str:
    return data_path("ray", "ray-2.60-head-idle-4gpu.prom").read_text()


@pytest.fixture
def nodes_json() -> str:
    return data_path("ray", "ray-2.60-nodes-idle.json").read_text()


# -- node pages -------------------------------------------------------------------------------

def test_recorded_page_over_http(http_server: Canned, fixture_page: str) -> None:
    url = http_server.set("/metrics", fixture_page)
    result = run(scrape(RayNodeMetricsTarget("demo", url)))
    got = resources(result)
    assert got[("192.0.2.2", "GPU", "USED")] == 0.0
    assert got[("192.0.2.2", "GPU", "AVAILABLE")] == 4.0
    assert got[("192.0.2.2", "accelerator_type:H100", "AVAILABLE")] == 4.0
    assert got[("192.0.2.2", "CPU", "AVAILABLE")] == 2.0
    assert len(got) == 10 and result.samples == 10 and not result.errors
    assert "gpu_samples" not in result.rows            # logical GPUs only: no ray_node_gpus_*
    assert all(r[0] == NOW and r[1] == "demo" for r in result.rows["ray_resources"])


def test_keep_drops_everything_else(fixture_page: str) -> None:
    names = {s.name for s in parse(fixture_page, keep=keep_metric)}
    assert names == {"ray_resources"}
    assert len(parse(fixture_page)) > 500                # what is not paid for


GPU_LINES = """\
# TYPE ray_node_gpus_utilization gauge
ray_node_gpus_utilization{GpuDeviceName="NVIDIA H100 80GB HBM3",GpuIndex="0",GpuUuid="GPU-aaa",IsHeadNode="false",ip="10.0.0.7"} 87.0
ray_node_gpus_utilization{GpuDeviceName="NVIDIA H100 80GB HBM3",GpuIndex="1",GpuUuid="GPU-bbb",IsHeadNode="false",ip="10.0.0.7"} 3.0
ray_node_gram_used{GpuDeviceName="NVIDIA H100 80GB HBM3",GpuIndex="0",GpuUuid="GPU-aaa",ip="10.0.0.7"} 40960.0
ray_node_gram_available{GpuDeviceName="NVIDIA H100 80GB HBM3",GpuIndex="0",GpuUuid="GPU-aaa",ip="10.0.0.7"} 40960.0
ray_node_gpus_available{GpuDeviceName="NVIDIA H100 80GB HBM3",GpuIndex="0",GpuUuid="GPU-aaa",ip="10.0.0.7"} 1.0
ray_node_gpu_power_milliwatts{GpuIndex="0",GpuUuid="GPU-aaa",ip="10.0.0.7"} 350000
ray_node_mem_used{ip="10.0.0.7"} 1e9
"""


def test_physical_gpu_series_become_gpu_samples() -> None:
    rows = page_rows(parse(GPU_LINES, keep=keep_metric), cluster="c", default_node="x", now=NOW)
    gpu = {(r[3], r[11]): r for r in rows["gpu_samples"]}
    assert len(gpu) == 6                                 # ray_node_mem_used is not kept
    r = gpu[("GPU-aaa", "ray_node_gpus_utilization")]
    assert r == (NOW, "c", "10.0.0.7", "GPU-aaa", 0, "NVIDIA H100 80GB HBM3", "", "", "", "", "",
                 "ray_node_gpus_utilization", 87.0, "ray")
    assert gpu[("GPU-bbb", "ray_node_gpus_utilization")][4] == 1
    assert gpu[("GPU-aaa", "ray_node_gram_used")][12] == 40960.0
    assert gpu[("GPU-aaa", "ray_node_gpu_power_milliwatts")][5] == ""   # no GpuDeviceName label
    assert all(len(r) == len(COLUMNS["gpu_samples"]) for r in rows["gpu_samples"])


@pytest.mark.parametrize("labels, target_node, node", [
    ('Name="GPU",State="USED",NodeAddress="10.0.0.1",instance="10.9.9.9:8080"', "", "10.0.0.1"),
    ('Name="GPU",State="USED",instance="10.0.0.2:8080"', "", "10.0.0.2"),
    ('Name="GPU",State="USED",instance="[fd00::2]:8080"', "", "fd00::2"),
    ('Name="GPU",State="USED"', "worker-3", "worker-3"),
    ('Name="GPU",State="USED"', "", "127.0.0.1"),
], ids=["NodeAddress", "instance", "instance-ipv6", "target-node", "url-host"])
def test_node_name_sources(http_server: Canned, labels: str, target_node: str, node: str) -> None:
    url = http_server.set("/metrics", f"ray_resources{{{labels}}} 2\n")
    result = run(scrape(RayNodeMetricsTarget("c", url, node=target_node)))
    assert resources(result) == {(node, "GPU", "USED"): 2.0}


def test_sample_timestamp_wins_over_now() -> None:
    rows = page_rows(parse('ray_resources{Name="GPU",State="USED",NodeAddress="n"} 1 1795304803362\n'),
                     cluster="c", default_node="x", now=NOW)
    assert rows["ray_resources"][0][0] == dt.datetime(2026, 11, 21, 23, 46, 43, 362000, tzinfo=dt.UTC)


def test_repeated_series_keep_one_row_last_wins() -> None:
    text = ('ray_resources{Name="GPU",State="USED",NodeAddress="n",Component="a"} 1\n'
            'ray_resources{Name="GPU",State="USED",NodeAddress="n",Component="b"} 3\n')
    rows = page_rows(parse(text), cluster="c", default_node="x", now=NOW)["ray_resources"]
    assert [r[5] for r in rows] == [3.0]


def test_malformed_line_keeps_the_rest(http_server: Canned, fixture_page: str) -> None:
    lines = fixture_page.split("\n")
    at = next(i for i, line in enumerate(lines) if 'Name="CPU"' in line and "USED" in line)
    lines[at] = lines[at].replace("} 0.0", "} zero")
    url = http_server.set("/metrics", "\n".join(lines))
    result = run(scrape(RayNodeMetricsTarget("c", url)))
    assert len(resources(result)) == 9
    assert ("192.0.2.2", "CPU", "USED") not in resources(result)
    [err] = result.errors
    assert err.lineno == at + 1 and err.source == url


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        page_rows([], cluster="c", default_node="x", now=dt.datetime(2026, 1, 1))


# -- State API ------------------------------------------------------------------------------

def serve_state(http_server: Canned, nodes_json: str, *, jobs: Any = JOBS) -> str:
    http_server.set(f"/api/v0/nodes?limit={STATE_LIMIT}", nodes_json, content_type="application/json")
    http_server.set(f"/api/v0/placement_groups?limit={STATE_LIMIT}&detail=true", json.dumps(PG_DETAIL),
                    content_type="application/json")
    http_server.set("/api/jobs/", json.dumps(jobs), content_type="application/json")
    return http_server.base


def test_state_api_over_http(http_server: Canned, nodes_json: str) -> None:
    result = run(scrape(RayStateTarget("demo", serve_state(http_server, nodes_json))))
    assert not result.errors and result.samples == 4
    [node] = result.rows["ray_nodes"]
    assert node[:7] == (NOW, "demo", NODE_ID, "192.0.2.2", "192.0.2.2", 1, "ALIVE")
    assert node[7]["GPU"] == 4.0 and node[7]["accelerator_type:H100"] == 4.0
    assert node[8] == {"ray.io/node-id": NODE_ID}
    [pg] = result.rows["ray_placement_groups"]
    assert pg[:9] == (NOW, "demo", "6378982a9e707b45492b64d19c3601000000", "mypg", "01000000", "CREATED",
                      "", 1, 1.0)
    assert json.loads(pg[9])[0]["unit_resources"] == {"CPU": 0.5, "GPU": 1.0}
    jobs = {r[2]: r for r in result.rows["ray_jobs"]}
    assert jobs["01000000"][3:8] == ("", "RUNNING", "python driver.py",
                                     dt.datetime(2026, 11, 21, 23, 46, 43, 362000, tzinfo=dt.UTC), None)
    done = jobs["02000000"]
    assert done[3] == "raysubmit_1" and done[4] == "SUCCEEDED" and done[8] == {"team": "vision"}
    assert done[7] - done[6] == dt.timedelta(seconds=6.5)
    for table, rows in result.rows.items():
        assert all(len(r) == len(COLUMNS[table]) for r in rows), table


def test_state_api_refusal_names_url_and_rays_message(http_server: Canned, nodes_json: str) -> None:
    base = serve_state(http_server, nodes_json)
    http_server.set(f"/api/v0/nodes?limit={STATE_LIMIT}", REFUSED, status=400,
                    content_type="application/json")
    result = run(scrape(RayStateTarget("c", base)))
    [err] = result.errors                                # the other two endpoints still count
    assert isinstance(err, ScrapeError) and err.status == 400 and not err.retryable
    assert f"{base}/api/v0/nodes" in str(err) and "invalid literal" in str(err)
    assert "ray_nodes" not in result.rows and len(result.rows["ray_placement_groups"]) == 1


@pytest.mark.parametrize("payload, match", [
    ({"result": False, "msg": "GCS timed out", "data": {"result": None}}, "refused: GCS timed out"),
    ({"hello": 1}, "not a Ray State API answer"),
    ({"result": True, "data": {"result": {"result": {}}}}, "unexpected State API data"),
    ({"result": True, "data": ["x"]}, "unexpected State API data"),
    ([1, 2], "not a Ray State API answer"),
], ids=["result-false-200", "no-envelope", "wrong-shape", "data-list", "list"])
def test_state_api_envelope_errors(payload: Any, match: str) -> None:
    with pytest.raises(ScrapeError, match=match) as info:
        state_api_items(payload, "http://dash/api/v0/nodes")
    assert info.value.url == "http://dash/api/v0/nodes"


def test_state_api_truncation_and_partial_failure_are_warnings() -> None:
    payload = {"result": True, "data": {"result": {"total": 12000, "num_after_truncation": 10000,
                                                   "partial_failure_warning": "2 nodes timed out",
                                                   "result": [{"node_id": "n"}]}}}
    items, warnings = state_api_items(payload, "u")
    assert items == [{"node_id": "n"}]
    assert ["truncated" in str(w) for w in warnings] == [True, False]
    assert "2 nodes timed out" in str(warnings[1])


def test_jobs_endpoint_down_keeps_nodes(http_server: Canned, nodes_json: str) -> None:
    base = serve_state(http_server, nodes_json)
    http_server.set("/api/jobs/", "Internal Server Error", status=500)
    result = run(scrape(RayStateTarget("c", base)))
    [err] = result.errors
    assert isinstance(err, ScrapeError) and err.status == 500 and err.retryable
    assert f"{base}/api/jobs/: HTTP 500" in str(err)
    assert set(result.rows) == {"ray_nodes", "ray_placement_groups"}


def test_jobs_answer_not_json(http_server: Canned, nodes_json: str) -> None:
    base = serve_state(http_server, nodes_json)
    http_server.set("/api/jobs/", "<html>login</html>", content_type="text/html")
    [err] = run(scrape(RayStateTarget("c", base))).errors
    assert "not JSON" in str(err) and not err.retryable


def test_dashboard_unreachable_raises() -> None:
    base = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(ScrapeError, match="cannot connect") as info:
        run(scrape(RayStateTarget("c", base)))
    assert info.value.url.startswith(base) and info.value.retryable


def test_state_rows_pure_edge_cases() -> None:
    assert job_rows([{"status": "PENDING", "entrypoint": "x", "start_time": 0, "end_time": None,
                      "metadata": None}], cluster="c", now=NOW) == \
        [(NOW, "c", "", "", "PENDING", "x", None, None, {})]
    [pg] = placement_group_rows([{"placement_group_id": "p", "state": "PENDING"}], cluster="c", now=NOW)
    assert pg[7:] == (0, 0.0, "[]")                       # listed without detail: no bundles
    [n] = node_rows([{"node_id": "n", "state": "DEAD", "resources_total": {"GPU": 8}, "labels": {"k": 1}}],
                    cluster="c", now=NOW)
    assert n[5:] == (0, "DEAD", {"GPU": 8.0}, {"k": "1"})


# -- discovery --------------------------------------------------------------------------------

def test_discover_configured_metrics_urls() -> None:
    t = RayTarget(cluster="c", dashboard_url="http://dash:8265", metrics_urls=["http://a:8080/metrics"])
    found = run(discover(RayDiscoverer(t)))
    assert [(x.source, x.name) for x in found] == [("ray-state", "http://dash:8265"),
                                                   ("ray", "http://a:8080/metrics")]


def test_discover_nodes_with_configured_port(http_server: Canned) -> None:
    nodes = {"result": True, "msg": "", "data": {"result": {"total": 2, "num_after_truncation": 2, "result": [
        {"node_id": "a", "node_ip": "10.0.0.1", "state": "ALIVE"},
        {"node_id": "b", "node_ip": "10.0.0.2", "state": "DEAD"},
        {"node_id": "c", "node_ip": "fd00::3", "state": "ALIVE"}]}}}
    http_server.set(f"/api/v0/nodes?limit={STATE_LIMIT}", json.dumps(nodes), content_type="application/json")
    settings = RayTarget(cluster="c", dashboard_url=http_server.base, metrics_port=8080)
    found = run(discover(RayDiscoverer(settings)))
    assert [x.name for x in found] == [http_server.base, "http://10.0.0.1:8080/metrics",
                                       "http://[fd00::3]:8080/metrics"]
    assert found[1].node == "10.0.0.1"
    assert not any("view=summary" in r for r in http_server.requests)


def test_discover_port_from_node_summary(http_server: Canned, nodes_json: str) -> None:
    http_server.set(f"/api/v0/nodes?limit={STATE_LIMIT}", nodes_json, content_type="application/json")
    http_server.set("/nodes?view=summary", json.dumps(SUMMARY), content_type="application/json")
    disc = RayDiscoverer(RayTarget(cluster="c", dashboard_url=http_server.base))
    found = run(discover(disc))
    assert [x.name for x in found][1:] == ["http://192.0.2.2:38123/metrics"]
    run(discover(disc))                                  # port known: the summary is not asked again
    assert sum("view=summary" in r for r in http_server.requests) == 1


def test_metrics_ports_ignores_odd_entries() -> None:
    assert metrics_ports({"data": {"summary": [{"raylet": {}}, {"ip": "x"}, "junk"]}}) == {}
    assert metrics_ports(None) == {}
    assert metrics_ports(SUMMARY) == {NODE_ID: 38123}


def test_discover_keeps_known_nodes_when_dashboard_goes_away(http_server: Canned, nodes_json: str) -> None:
    http_server.set(f"/api/v0/nodes?limit={STATE_LIMIT}", nodes_json, content_type="application/json")
    disc = RayDiscoverer(RayTarget(cluster="c", dashboard_url=http_server.base, metrics_port=9999))
    first = run(discover(disc))
    http_server.routes.clear()                          # the dashboard now answers 404
    assert [x.name for x in run(discover(disc))] == [x.name for x in first]
    fresh = RayDiscoverer(RayTarget(cluster="c", dashboard_url=f"http://127.0.0.1:{closed_port()}"))
    assert [x.source for x in run(discover(fresh))] == ["ray-state"]   # its scrape reports the failure


def test_discover_needs_some_url() -> None:
    with pytest.raises(ConfigurationError, match=r"collector.ray\[cluster=c\]"):
        run(discover(RayDiscoverer(RayTarget(cluster="c"))))


# -- into chDB --------------------------------------------------------------------------------

def test_rows_insert_into_store(store: Any, http_server: Canned, fixture_page: str, nodes_json: str) -> None:
    page = run(scrape(RayNodeMetricsTarget("demo", http_server.set("/metrics", fixture_page))))
    state = run(scrape(RayStateTarget("demo", serve_state(http_server, nodes_json))))
    gpus = page_rows(parse(GPU_LINES, keep=keep_metric), cluster="demo", default_node="x", now=NOW)
    tables = {**page.rows, **state.rows, "gpu_samples": gpus["gpu_samples"]}
    for table, rows in tables.items():
        assert store.insert(table, rows, COLUMNS[table]) == len(rows)
    db = store.database
    q = store.query(f"SELECT value FROM {db}.ray_resources WHERE resource='GPU' AND state='AVAILABLE'")
    assert q.rows == [(4.0,)]
    q = store.query(f"SELECT resources_total['GPU'], labels['ray.io/node-id'] FROM {db}.ray_nodes FINAL")
    assert q.rows == [(4.0, NODE_ID)]
    q = store.query(f"SELECT job_id, end_time, metadata['team'] FROM {db}.ray_jobs FINAL ORDER BY job_id")
    assert q.rows[0][1] is None and q.rows[1][2] == "vision"
    q = store.query(f"SELECT gpus, bundles FROM {db}.ray_placement_groups FINAL")
    assert q.rows == [(1.0, 1)]
    q = store.query(f"SELECT count(), any(source) FROM {db}.gpu_samples")
    assert q.rows == [(6, "ray")]


# -- a real Ray -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Busy:
    head: RayHead
    job_id: str
    pg_id: str
    submission_id: str


@pytest.fixture(scope="module")
def ray_busy(ray_head: RayHead) -> Iterator[Busy]:
    """The head with an actor holding 2 GPUs, a placement group reserving 1, and a finished job."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    ray.init(address=ray_head.address, log_to_driver=False, logging_level="ERROR")

    @ray.remote(num_gpus=2, num_cpus=0)
    class Holder:
        def gpus(self) -> list[int]:
            return list(ray.get_gpu_ids())

    holder = Holder.remote()                              # type: ignore[attr-defined]
    assert len(ray.get(holder.gpus.remote(), timeout=120)) == 2
    pg = placement_group([{"GPU": 1}], strategy="PACK", name="gpuq-pg")
    ray.get(pg.ready(), timeout=60)
    submission_id = submit_job(ray_head.dashboard_url)
    try:
        yield Busy(ray_head, ray.get_runtime_context().get_job_id(), pg.id.hex(), submission_id)
    finally:
        remove_placement_group(pg)
        ray.kill(holder)


def submit_job(dashboard_url: str, deadline_s: float = 90) -> str:
    """Submit a tiny job through the Jobs REST API and wait for it to finish."""
    sid = "gpuq-test-job"
    r = httpx.post(f"{dashboard_url}/api/jobs/", timeout=30, json={
        "entrypoint": f"{sys.executable} -c \"print('gpuq')\"", "submission_id": sid,
        "metadata": {"team": "vision"}})
    assert r.status_code == 200, r.text
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        status = httpx.get(f"{dashboard_url}/api/jobs/{sid}", timeout=10).json()["status"]
        if status in ("SUCCEEDED", "FAILED", "STOPPED"):
            assert status == "SUCCEEDED"
            return sid
        time.sleep(0.5)
    raise AssertionError(f"job {sid} not finished after {deadline_s}s")


def wait_for_page(url: str, want_used: float, deadline_s: float = 60) -> ScrapeResult:
    """Ray's metrics agent publishes every few seconds: scrape until the GPU USED value shows."""
    end = time.monotonic() + deadline_s
    seen: Any = None
    while time.monotonic() < end:
        try:
            result = run(scrape(RayNodeMetricsTarget("local", url)))
        except ScrapeError as exc:
            seen = exc
        else:
            seen = resources(result)
            if any(k[1:] == ("GPU", "USED") and v == want_used for k, v in seen.items()):
                return result
        time.sleep(1)
    raise AssertionError(f"{url} never showed GPU USED={want_used} in {deadline_s}s; last: {seen}")


@pytest.mark.ray
def test_real_ray_gpu_used_and_available_match_ray(ray_busy: Busy) -> None:
    import ray

    total, available = ray.cluster_resources()["GPU"], ray.available_resources()["GPU"]
    assert (total, available) == (4.0, 1.0)              # 2 held by the actor, 1 by the group
    result = wait_for_page(ray_busy.head.metrics_url, total - available)
    got = resources(result)
    ip = ray_busy.head.node_ip
    assert got[(ip, "GPU", "USED")] == total - ray.available_resources()["GPU"]
    assert got[(ip, "GPU", "AVAILABLE")] == ray.available_resources()["GPU"]
    h100 = ray.available_resources()["accelerator_type:H100"]
    assert got[(ip, "accelerator_type:H100", "AVAILABLE")] == h100
    assert not result.errors


@pytest.mark.ray
def test_real_ray_state_api(ray_busy: Busy) -> None:
    import ray

    result = run(scrape(RayStateTarget("local", ray_busy.head.dashboard_url)))
    assert not result.errors
    [node] = result.rows["ray_nodes"]
    assert node[3] == ray_busy.head.node_ip and node[5] == 1 and node[6] == "ALIVE"
    assert node[2] == ray.get_runtime_context().get_node_id()
    assert node[7]["GPU"] == 4.0 and node[7]["accelerator_type:H100"] == 4.0
    pgs = {r[2]: r for r in result.rows["ray_placement_groups"]}
    pg = pgs[ray_busy.pg_id]
    assert (pg[3], pg[4], pg[5], pg[7], pg[8]) == ("gpuq-pg", ray_busy.job_id, "CREATED", 1, 1.0)
    jobs = {key: r for r in result.rows["ray_jobs"] for key in (r[2], r[3]) if key}
    driver = jobs[ray_busy.job_id]
    assert driver[4] == "RUNNING" and driver[6] is not None and driver[7] is None
    job = jobs[ray_busy.submission_id]
    assert job[4] == "SUCCEEDED" and job[8] == {"team": "vision"}
    assert job[6] is not None and job[7] is not None and job[7] >= job[6]


@pytest.mark.ray
def test_real_ray_discovery_finds_the_head(ray_busy: Busy) -> None:
    head = ray_busy.head
    via_summary = run(discover(RayDiscoverer(RayTarget(cluster="local", dashboard_url=head.dashboard_url))))
    configured = run(discover(RayDiscoverer(RayTarget(cluster="local", dashboard_url=head.dashboard_url,
                                                      metrics_port=head.metrics_port))))
    want = [head.dashboard_url, head.metrics_url]
    assert [t.name for t in via_summary] == [t.name for t in configured] == want
