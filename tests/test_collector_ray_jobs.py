"""Ray's fractional GPUs in the ledger: tasks and actors outside placement groups -> ``ray_job``
rows per job and node, groups' bundles -> ``placement_group`` rows, in milli-GPUs.

Recorded Ray 2.60 State API answers over local HTTP (tests/data/ray/ray-2.60-gpu-holders, see
SOURCES.md: a submitted job, its entrypoint's GPUs, a ``ray.init`` driver), then the session's
real Ray head running a driver with ``num_gpus=0.5`` tasks, billed through the store and the
accounting's SQL.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from accounting.model import Window
from accounting.store_adapter import read_allocations, read_usage
from collector.base import ScrapeResult
from collector.errors import ScrapeError
from collector.http import HttpClient
from collector.k8s_alloc import Allocation
from collector.ray import RayDiscoverer, RayStateTarget, state_api_items
from collector.ray_alloc import PlacementGroupLedger, RayJobLedger, gpu_holders
from collector.sources import ray_job_allocations
from gpuq.ray_names import ray_node_name
from gpuq.settings import KubernetesTarget, RayTarget, Settings
from gpuq.store import COLUMNS
from tests.conftest import data_path, die_with_parent
from tests.ray_fixtures import Canned, RayHead, http_server_fixture, ray_head_fixture  # noqa: F401 - fixtures

T0 = dt.datetime(2026, 11, 27, 13, 41, 40, tzinfo=dt.UTC)
RECORDED = "ray-2.60-gpu-holders"
NODE = "1fa8f7c309efd14098861925a264cd43b284fd55998894ce8f14228b"
SUBMISSION = "gpuq-team-w1-0a1b2c3d-a0"
FILES = {"ray_nodes": "nodes.json", "ray_placement_groups": "placement-groups.json", "ray_jobs": "jobs.json"}


def recorded(name: str) -> Any:
    return json.loads(data_path("ray", RECORDED, name).read_text())


def target(base: str, **kw: Any) -> RayStateTarget:
    return RayStateTarget("c", base, ledger=PlacementGroupLedger("c"), job_ledger=RayJobLedger("c"), **kw)


def serve(http_server: Canned, t: RayStateTarget, **override: Any) -> None:
    """Every answer the target asks for, from the recording (``override``: file name -> body)."""
    tasks, actors = t.holder_urls()
    files = {**{u: FILES[k] for k, u in t.urls().items()}, actors: "actors-alive.json",
             **{u: f"tasks-{u.rsplit('=', 1)[1].lower().replace('_', '-')}.json" for u in tasks}}
    for url, name in files.items():
        body = override.get(name, recorded(name))
        http_server.set(url.removeprefix(http_server.base), body if isinstance(body, (str, bytes)) else json.dumps(body),
                        content_type="application/json")


def scrape(t: RayStateTarget, now: dt.datetime = T0) -> ScrapeResult:
    async def go() -> ScrapeResult:
        async with HttpClient(timeout_s=10) as client:
            return await t.scrape(client, now)
    return asyncio.run(go())


def allocations(result: ScrapeResult, source: str) -> dict[str, Allocation]:
    rows = [Allocation.from_row(r) for r in result.rows.get("gpu_allocations", [])]
    return {a.pod: a for a in rows if a.source == source}


# -- recorded answers -------------------------------------------------------------------------

def test_recorded_fractions_per_job_and_node(http_server: Canned, store: Any) -> None:
    t = target(http_server.base)
    serve(http_server, t)
    result = scrape(t)
    assert not result.errors
    assert sum("/api/v0/tasks?" in r for r in http_server.requests) == 3
    assert sum("/api/v0/actors?" in r and "filter_values=ALIVE" in r for r in http_server.requests) == 1
    jobs = allocations(result, "ray_job")
    node = ray_node_name(NODE)
    # the submitted job: its tasks 0.5 + 0.5, its actor 0.25 and its entrypoint's 0.25 (the
    # JobSupervisor actor, in Ray's own job 02000000); its task in the group is the group's
    sub = jobs[SUBMISSION]
    assert (sub.node, sub.gpus, sub.workload_id, sub.queue, sub.gpu_model) == (node, 1.5, "team/w1", "research.vision", "H100")
    # the ray.init driver 01000000: 0.5 + 0.5 (one blocked in ray.get) + 2 x 1/16 = 1.125, not 1.126
    assert (jobs["01000000"].gpus, jobs["01000000"].workload_id) == (1.125, "")
    assert set(jobs) == {SUBMISSION, "01000000"}
    [group] = allocations(result, "placement_group").values()
    assert (group.pod, group.gpus, group.workload_id) == ("gpuq-team/pg", 0.3, "team/pg")   # 0.1 + 0.2 bundles
    [pg_row] = result.rows["ray_placement_groups"]
    assert pg_row[8] == 0.3
    assert store.insert("gpu_allocations", result.rows["gpu_allocations"], COLUMNS["gpu_allocations"]) == 3
    now_s = (T0 + dt.timedelta(minutes=1)).timestamp()
    held = {a.pod: (a.source, a.milli_gpus) for a in read_allocations(store, Window(T0.timestamp(), now_s), now_s)}
    assert held == {SUBMISSION: ("ray_job", 1500), "01000000": ("ray_job", 1125), "gpuq-team/pg": ("placement_group", 300)}


def test_recorded_holders_each_at_their_share() -> None:
    tasks = [(n, state_api_items(recorded(n), n)[0]) for n in ("tasks-running.json", "tasks-running-in-ray-get.json")]
    actors = ("actors-alive.json", state_api_items(recorded("actors-alive.json"), "a")[0])
    found, errors = gpu_holders(tasks, actors, recorded("jobs.json"))
    assert not errors
    shares = sorted((h.job.name, h.what.split()[0], h.units) for h in found)
    assert shares == [("01000000", "task", 625), ("01000000", "task", 625), ("01000000", "task", 5000),
                      ("01000000", "task", 5000), (SUBMISSION, "actor", 2500), (SUBMISSION, "actor", 2500),
                      (SUBMISSION, "task", 5000), (SUBMISSION, "task", 5000)]
    twice = gpu_holders([*tasks, tasks[0]], actors, recorded("jobs.json"))[0]    # a task in two lists counts once
    assert len(twice) == len(found)


def test_malformed_task_list_names_its_url_and_loses_nothing(http_server: Canned) -> None:
    t = target(http_server.base)
    serve(http_server, t)
    first = allocations(scrape(t), "ray_job")
    serve(http_server, t, **{"tasks-running.json": {"hello": 1}})
    result = scrape(t, T0 + dt.timedelta(seconds=15))
    [err] = result.errors
    running_url = t.holder_urls()[0][0]
    assert isinstance(err, ScrapeError) and str(err).startswith(f"{running_url}: not a Ray State API answer")
    assert set(result.rows) == {"ray_nodes", "ray_placement_groups", "ray_jobs"}   # no ray_job row ends
    assert [a.pod for a in t.job_ledger.open] == sorted(first)                      # type: ignore[union-attr]
    serve(http_server, t)
    assert not scrape(t, T0 + dt.timedelta(seconds=30)).rows.get("gpu_allocations")    # unchanged: nothing new


def test_malformed_entry_is_named_and_the_round_only_rises(http_server: Canned) -> None:
    t = target(http_server.base)
    serve(http_server, t)
    scrape(t)
    answer = recorded("tasks-running.json")
    entries = answer["data"]["result"]["result"]
    at = next(i for i, e in enumerate(entries) if e["job_id"] == "01000000" and e["name"] == "half")
    entries[at]["required_resources"]["GPU"] = "half"
    extra = next(e for e in entries if e["job_id"] == "03000000" and not e["placement_group_id"])
    entries.append({**extra, "task_id": "f" * 48})                 # the submitted job gains a task
    serve(http_server, t, **{"tasks-running.json": answer})
    result = scrape(t, T0 + dt.timedelta(seconds=15))
    [err] = result.errors
    url = t.holder_urls()[0][0]
    assert str(err) == f"{url}: result[{at}] (task {entries[at]['task_id']}): required_resources.GPU is 'half', not an amount"
    changed = [(a.pod, a.gpus, a.end is None) for a in map(Allocation.from_row, result.rows["gpu_allocations"])]
    assert changed == [(SUBMISSION, 1.5, False), (SUBMISSION, 2.0, True)]      # 01000000 keeps its 1.125


def test_truncated_task_list_ends_nothing(http_server: Canned) -> None:
    t = target(http_server.base, limit=7)                  # the recorded RUNNING list has 7 entries
    serve(http_server, t)
    first = scrape(t)
    assert [str(e) for e in first.errors] == [f"{t.holder_urls()[0][0]}: truncated: 7 entries, the limit"]
    answer = recorded("tasks-running.json")
    answer["data"]["result"]["result"] = [e for e in answer["data"]["result"]["result"] if e["job_id"] != "01000000"]
    answer["data"]["result"]["result"] *= 3                              # 9 entries, 01000000 not among them
    serve(http_server, t, **{"tasks-running.json": answer})
    assert not scrape(t, T0 + dt.timedelta(seconds=15)).rows.get("gpu_allocations")
    assert {a.pod for a in t.job_ledger.open} == {SUBMISSION, "01000000"}   # type: ignore[union-attr]


def test_jobs_list_down_skips_the_job_round(http_server: Canned) -> None:
    t = target(http_server.base)
    serve(http_server, t)
    http_server.set("/api/jobs/", "Internal Server Error", status=500)
    result = scrape(t)
    [err] = result.errors
    assert "/api/jobs/: HTTP 500" in str(err)
    assert set(allocations(result, "placement_group")) == {"gpuq-team/pg"} and not allocations(result, "ray_job")


def test_ray_job_allocations_setting() -> None:
    ray_only = RayTarget(cluster="lab", dashboard_url="http://d:8265")
    kube = Settings(collector={"kubernetes": [KubernetesTarget(cluster="prod")]})
    assert ray_job_allocations(ray_only, kube) is True
    on_pods = RayTarget(cluster="prod", dashboard_url="http://d:8265")
    assert ray_job_allocations(on_pods, kube) is False                      # its nodes are pods, billed as pods
    forced = RayTarget(cluster="prod", dashboard_url="http://d:8265", ray_job_allocations=True)
    assert ray_job_allocations(forced, kube) is True
    assert RayDiscoverer(on_pods, job_allocations=False).job_ledger is None


# -- a real Ray ---------------------------------------------------------------------------------

# A Ray driver (a job of its own): two tasks of half a GPU and an actor of a quarter, outside any
# group, and a task of half a GPU inside a group of one {"GPU": 0.5} bundle. It prints its job id.
DRIVER = """
import sys, time, ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print(ray.get_runtime_context().get_job_id(), flush=True)
@ray.remote(num_gpus=0.5, num_cpus=0)
def half():
    time.sleep(600)
@ray.remote(num_gpus=0.25, num_cpus=0)
class Quarter:
    def ok(self):
        return True
q = Quarter.remote()
tasks = [half.remote() for _ in range(2)]
pg = placement_group([{"GPU": 0.5}], name="frac-pg")
ray.get(pg.ready())
inside = half.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg)).remote()
ray.get(q.ok.remote())
time.sleep(600)
"""


@dataclass(frozen=True)
class Running:
    head: RayHead
    proc: subprocess.Popen[str]
    job_id: str
    node_id: str


def holding(head: RayHead, job_id: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The job's running normal tasks and alive actors, from the State API."""
    by_state = "limit=1000&detail=true&filter_keys=state&filter_predicates=%3D&filter_values="
    lists = [state_api_items(httpx.get(f"{head.dashboard_url}{path}", timeout=30).json(), path)[0]
             for path in (f"/api/v0/tasks?{by_state}RUNNING", f"/api/v0/actors?{by_state}ALIVE")]
    return ([x for x in lists[0] if x["job_id"] == job_id and x["type"] == "NORMAL_TASK"],
            [a for a in lists[1] if a["job_id"] == job_id])


@pytest.fixture(scope="module")
def running(ray_head: RayHead) -> Iterator[Running]:
    """The driver, once its tasks and its actor all run."""
    proc = subprocess.Popen([sys.executable, "-c", DRIVER, ray_head.address], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True, preexec_fn=die_with_parent)
    try:
        assert proc.stdout is not None
        job_id = proc.stdout.readline().strip()
        assert job_id, f"the driver exited with {proc.wait()} before it connected"
        end = time.monotonic() + 90
        while len((got := holding(ray_head, job_id))[0]) < 3 or not got[1]:
            assert proc.poll() is None, f"the driver exited with {proc.returncode}"
            assert time.monotonic() < end, f"job {job_id}: {got} after 90 s"
            time.sleep(0.2)
        yield Running(ray_head, proc, job_id, got[0][0]["node_id"])
    finally:
        proc.kill()
        proc.wait(timeout=30)


def end_driver(run: Running, deadline_s: float = 60) -> None:
    """End the driver and wait until Ray no longer lists its tasks and actor."""
    run.proc.terminate()
    run.proc.wait(timeout=30)
    end = time.monotonic() + deadline_s
    while any(holding(run.head, run.job_id)):
        assert time.monotonic() < end, f"job {run.job_id} still holds GPUs {deadline_s} s after its driver ended"
        time.sleep(0.2)


@pytest.mark.ray
def test_real_ray_half_gpu_tasks_are_billed_at_their_share(running: Running, store: Any) -> None:
    t = RayStateTarget("local", running.head.dashboard_url, ledger=PlacementGroupLedger("local"),
                       job_ledger=RayJobLedger("local"))
    t1 = dt.datetime.now(dt.UTC)
    first = scrape(t, t1)
    assert not first.errors
    job = allocations(first, "ray_job")[running.job_id]
    # two tasks of 0.5 and an actor of 0.25, on the head; the task inside the group is the group's
    assert (job.gpus, job.node, job.gpu_model, job.start, job.end) == (1.25, ray_node_name(running.node_id), "H100", t1, None)
    groups = [a for a in allocations(first, "placement_group").values() if a.pod == "frac-pg"]
    assert [(g.gpus, g.node) for g in groups] == [(0.5, job.node)]
    assert not scrape(t, t1 + dt.timedelta(seconds=1)).rows.get("gpu_allocations")     # unchanged: nothing new

    end_driver(running)
    t3 = dt.datetime.now(dt.UTC)
    last = scrape(t, t3)
    ended = allocations(last, "ray_job")[running.job_id]
    assert (ended.uid, ended.end) == (job.uid, t3)
    rows = [*first.rows["gpu_allocations"], *last.rows["gpu_allocations"]]
    assert store.insert("gpu_allocations", rows, COLUMNS["gpu_allocations"]) == len(rows)

    # the books: over a window around the run, the job is billed 1.25 GPU x the time it ran
    now_s = t3.timestamp() + 60
    window = Window(t1.timestamp() - 60, now_s)
    billed = {u.workload: u.gpu_seconds for u in read_usage(store, window, now_s) if u.workload == running.job_id}
    assert billed == {running.job_id: pytest.approx(1.25 * (t3 - t1).total_seconds(), abs=0.002)}
    mid = (t1 + (t3 - t1) / 2).timestamp()
    held = [(a.source, a.milli_gpus) for a in read_allocations(store, Window(mid, mid + 0.001), mid)
            if a.pod in (running.job_id, "frac-pg")]
    assert sorted(held) == [("placement_group", 500), ("ray_job", 1250)]
