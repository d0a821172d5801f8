"""A gang admitted on Ray is a placement group: a real local cluster (head + H100 and A100 workers)."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from collector.http import HttpClient
from collector.k8s_alloc import ENDED, OPEN, version_of
from collector.ray import RayDiscoverer, RayStateTarget
from gpuq.ray_names import placement_group_name, ray_node_name, workload_of_placement_group
from gpuq.settings import RayTarget, Settings
from scheduler.actuators.base import Target
from scheduler.actuators.ray import RayActuator, submission_id
from scheduler.actuators.ray_gang import parse_args, resolve_nodes
from scheduler.model import Placement, Workload
from scheduler.ray_local import LocalCluster, LocalNode
from tests.ray_fixtures import local_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    yield from local_cluster([LocalNode("w1", 4, "H100"), LocalNode("w2", 4, "A100")])


def waiting_target(flag: Path) -> Target:
    """Prints the placement group env, then runs until ``flag`` exists (the test's 'finish')."""
    code = ("import os, time; print('PG=' + os.environ['GPUQ_PLACEMENT_GROUP'] + ' ID=' + "
            "os.environ['GPUQ_PLACEMENT_GROUP_ID'] + ' NS=' + os.environ['GPUQ_PLACEMENT_GROUP_NAMESPACE'], "
            f"flush=True)\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.2)")
    return Target("RaySubmission", entrypoint=f"{shlex.quote(sys.executable)} -c {shlex.quote(code)}")


def pgs(cluster: LocalCluster) -> dict[str, dict[str, Any]]:
    r = httpx.get(f"{cluster.dashboard_url}/api/v0/placement_groups?limit=100&detail=true", timeout=10)
    return {p["placement_group_id"]: p for p in r.json()["data"]["result"]["result"]}


def wait_until(check: Callable[[], Any], what: str, timeout_s: float = 60.0) -> Any:
    end, got = time.monotonic() + timeout_s, None
    while time.monotonic() < end:
        if got := check():
            return got
        time.sleep(0.3)
    raise AssertionError(f"not {what} after {timeout_s}s")


def scrape(target: RayStateTarget, now: dt.datetime) -> Any:
    async def go() -> Any:
        async with HttpClient(timeout_s=10) as client:
            return await target.scrape(client, now)
    return asyncio.run(go())


def job_logs(cluster: LocalCluster, sid: str) -> str:
    return str(httpx.get(f"{cluster.dashboard_url}/api/jobs/{sid}/logs", timeout=10).json().get("logs", ""))


@pytest.mark.ray
def test_gang_is_a_pinned_placement_group_held_while_the_job_runs(cluster: LocalCluster, tmp_path: Path) -> None:
    w1, w2 = cluster.node_name("w1"), cluster.node_name("w2")
    wl = Workload(f"test/gang-{uuid.uuid4().hex[:6]}", "research.nlp", pods=2, gpus_per_pod=2)
    name = placement_group_name(wl.id)
    target, flag = waiting_target(tmp_path / "done"), tmp_path / "done"
    act = RayActuator(Settings(), dashboard=cluster.dashboard_url, python=sys.executable, attempts=8,
                      backoff_s=0.5, pin_accelerator_type=False, placement_timeout_s=30)
    ledger_disc = RayDiscoverer(RayTarget(cluster="local", dashboard_url=cluster.dashboard_url))
    state = RayStateTarget("local", cluster.dashboard_url, ledger=ledger_disc.ledger)
    try:
        placement = Placement("H100", ((w1, 2), (w2, 2)))     # PACK alone would put both on one node
        res = act.admit(wl, target, placement)
        assert res.ok and res.detail["submitted"] and res.detail["placement_group"] == name, res.message
        sid = submission_id(wl.id, 0)

        def created() -> dict[str, Any] | None:
            return next((p for p in pgs(cluster).values() if p["name"] == name and p["state"] == "CREATED"), None)
        pg = wait_until(created, "placed")
        assert sorted((ray_node_name(b["node_id"]), b["unit_resources"]) for b in pg["bundles"]) == \
            sorted([(w1, {"GPU": 2.0}), (w2, {"GPU": 2.0})])
        # the whole line: a log read while the job writes it may end halfway (seen under load)
        logs = wait_until(lambda: "\n" in (text := job_logs(cluster, sid)).partition("PG=")[2] and text, "printed")
        # each part on its own: under load Ray's job log may interleave the wrapper's stderr (with
        # its colour codes) into the child's line
        for part in (f"PG={name} ", f"ID={pg['placement_group_id']}", "NS=gpuq"):
            assert part in logs, (part, logs)

        again = act.admit(wl, target, placement)               # retried admit: nothing new
        assert again.ok and again.detail["submitted"] is False
        assert [p["name"] for p in pgs(cluster).values()].count(name) == 1

        t1 = dt.datetime.now(dt.UTC)                           # the collector's ledger rows
        rows = scrape(state, t1).rows["gpu_allocations"]
        by_node = {r[5]: r for r in rows}
        assert sorted(by_node) == sorted([w1, w2])
        for node, model in ((w1, "H100"), (w2, "A100")):
            r = by_node[node]
            assert (r[0], r[2], r[3], r[6], r[8], r[12], r[14], r[15]) == \
                ("local", name, f"{pg['placement_group_id']}/{node}", model, 2.0, None, "placement_group", wl.id)
            assert r[13] == version_of(r[11], OPEN) and r[11] <= t1
        assert not scrape(state, t1).rows.get("gpu_allocations")   # nothing changed: nothing written

        stop = act.preempt(wl, target, "queue research.cv below its guarantee")
        assert stop.ok and stop.detail["stopped"], stop.message
        wait_until(lambda: pgs(cluster)[pg["placement_group_id"]]["state"] == "REMOVED", "removed on stop")
        t2 = dt.datetime.now(dt.UTC)
        ended = scrape(state, t2).rows["gpu_allocations"]
        assert sorted((r[5], r[12], r[13]) for r in ended) == sorted(
            (n, t2, version_of(t2, ENDED)) for n in (w1, w2))
        assert ledger_disc.ledger.open == []

        wait_until(lambda: (s := act.status(wl)) and s.finished, "stopped")
        readmit = act.admit(wl, target, placement)             # attempt 1: a new group, same name
        assert readmit.ok and readmit.detail["submission_id"] == submission_id(wl.id, 1), readmit.message
        pg2 = wait_until(created, "placed again")
        assert pg2["placement_group_id"] != pg["placement_group_id"]
        assert len(scrape(state, dt.datetime.now(dt.UTC)).rows["gpu_allocations"]) == 2
        flag.touch()                                           # the job finishes: its group goes
        wait_until(lambda: pgs(cluster)[pg2["placement_group_id"]]["state"] == "REMOVED", "removed on finish")
        assert wait_until(lambda: (s := act.status(wl)) and s.finished and s, "finished").status == "SUCCEEDED"
    finally:
        act.cancel(wl, target)
        act.close()


@pytest.mark.ray
def test_a_gang_of_shares_is_a_placement_group_of_fractional_bundles(cluster: LocalCluster, tmp_path: Path) -> None:
    """Three pods of 0.25 GPU placed on one node (issue 19): three bundles of GPU 0.25 pinned there,
    billed by the collector at 0.75 GPU on that node."""
    w1 = cluster.node_name("w1")
    wl = Workload(f"test/shares-{uuid.uuid4().hex[:6]}", "research.nlp", pods=3, gpus_per_pod=Decimal("0.25"))
    name = placement_group_name(wl.id)
    target, flag = waiting_target(tmp_path / "done"), tmp_path / "done"
    act = RayActuator(Settings(), dashboard=cluster.dashboard_url, python=sys.executable, attempts=8,
                      backoff_s=0.5, pin_accelerator_type=False, placement_timeout_s=30)
    state = RayStateTarget("local", cluster.dashboard_url,
                           ledger=RayDiscoverer(RayTarget(cluster="local", dashboard_url=cluster.dashboard_url)).ledger)
    try:
        res = act.admit(wl, target, Placement("H100", ((w1, Decimal("0.75")),), ((w1, 0, Decimal("0.75")),)))
        assert res.ok and res.detail["submitted"], res.message

        def created() -> dict[str, Any] | None:
            return next((p for p in pgs(cluster).values() if p["name"] == name and p["state"] == "CREATED"), None)
        pg = wait_until(created, "placed")
        assert sorted((ray_node_name(b["node_id"]), b["unit_resources"]) for b in pg["bundles"]) == \
            [(w1, {"GPU": 0.25})] * 3
        rows = scrape(state, dt.datetime.now(dt.UTC)).rows["gpu_allocations"]
        assert [(r[5], r[8]) for r in rows] == [(w1, 0.75)]
        flag.touch()
        wait_until(lambda: pgs(cluster)[pg["placement_group_id"]]["state"] == "REMOVED", "removed on finish")
    finally:
        act.cancel(wl, target)
        act.close()


@pytest.mark.ray
def test_a_one_pod_workload_runs_on_the_node_gpuq_placed_it(cluster: LocalCluster, tmp_path: Path) -> None:
    """A one-pod workload's entrypoint holds its GPUs (entrypoint_num_gpus) on the placement's node,
    pinned by Ray's node-id label: without it Ray chose any node, and the GPUs were held on one node
    and counted busy on another (the demo billed such a run twice). Both workers are asked in turn,
    so a choice of Ray's own cannot pass by chance."""
    act = RayActuator(Settings(), dashboard=cluster.dashboard_url, python=sys.executable, attempts=8,
                      backoff_s=0.5, pin_accelerator_type=False)
    flag = tmp_path / "done"
    try:
        for worker in ("w1", "w2"):
            node = cluster.node_name(worker)
            wl = Workload(f"test/one-{worker}-{uuid.uuid4().hex[:6]}", "q", pods=1, gpus_per_pod=Decimal("0.5"))
            wait = f"{shlex.quote(sys.executable)} -c " + shlex.quote(
                f"import os, time\nwhile not os.path.exists({str(flag)!r}): time.sleep(0.2)")
            res = act.admit(wl, Target("RaySubmission", entrypoint=wait), Placement("H100", ((node, Decimal("0.5")),)))
            assert res.ok, res.message
            sid = submission_id(wl.id, 0)

            def driver() -> str:
                info = httpx.get(f"{cluster.dashboard_url}/api/jobs/{sid}", timeout=10).json()
                return str(info.get("driver_node_id") or "") if info.get("status") == "RUNNING" else ""
            assert ray_node_name(wait_until(driver, f"{worker}'s job running")) == node
    finally:
        flag.touch()
        act.close()


@pytest.mark.ray
def test_unknown_node_fails_the_job_with_a_reason(cluster: LocalCluster) -> None:
    wl = Workload(f"test/bad-{uuid.uuid4().hex[:6]}", "q", pods=2, gpus_per_pod=1)
    act = RayActuator(Settings(), dashboard=cluster.dashboard_url, python=sys.executable, attempts=8,
                      backoff_s=0.5, pin_accelerator_type=False)
    try:
        assert act.admit(wl, Target("RaySubmission", entrypoint="true"), Placement("H100", (("ffffffffffff", 2),))).ok
        state = wait_until(lambda: (s := act.status(wl)) and s.finished and s, "finished")
        assert state.status == "FAILED"
        assert "node 'ffffffffffff' matches 0 alive Ray nodes" in job_logs(cluster, state.submission_id)
    finally:
        act.close()


# -- pure parts ------------------------------------------------------------------------------------

def test_gang_entrypoint_bundles_nodes_and_quoting() -> None:
    act = RayActuator(Settings(), dashboard="http://127.0.0.1:1", python="/opt/py")
    try:
        wl = Workload("rayjob/a b", "q", pods=3, gpus_per_pod=2, cpu_millicores_per_pod=1500)
        placement = Placement("H100", (("aaaaaaaaaaaa", 4), ("bbbbbbbbbbbb", 2)))
        bundles, nodes = act.gang_bundles(wl, placement)
        assert bundles == [{"GPU": 2.0, "CPU": 1.5, "accelerator_type:H100": 0.001}] * 3
        assert nodes == ["aaaaaaaaaaaa", "aaaaaaaaaaaa", "bbbbbbbbbbbb"]
        ep = act.gang_entrypoint(wl, Target("RaySubmission", entrypoint="python train.py --x 'y z'"), placement)
        words = shlex.split(ep)
        assert words[:3] == ["/opt/py", "-m", "scheduler.actuators.ray_gang"]
        args = parse_args(words[3:])
        assert args.name == "gpuq-rayjob/a b" and args.strategy == "PACK" and args.bundles == bundles
        assert args.nodes == nodes and args.entrypoint == ["python train.py --x 'y z'"]
        odd = act.gang_bundles(wl, Placement("H100", (("aaaaaaaaaaaa", 3),)))[1]
        assert odd == []                                      # does not split into pods: Ray chooses
    finally:
        act.close()


def test_names_round_trip_and_node_prefixes() -> None:
    assert workload_of_placement_group(placement_group_name("rayjob/team-a/x")) == "rayjob/team-a/x"
    assert workload_of_placement_group("mypg") == ""
    assert ray_node_name("0B36BF516A5DF43549FE") == "0b36bf516a5d"
    assert resolve_nodes(["0b36bf516a5d"], ["0b36bf516a5df435", "1c"]) == ["0b36bf516a5df435"]
    with pytest.raises(ValueError, match="matches 2"):
        resolve_nodes(["0b"], ["0b36", "0b47"])


def test_wrapper_refuses_bad_arguments() -> None:
    for argv in (["--name", "n", "--bundles", "[]", "--", "x"],
                 ["--name", "n", "--bundles", '[{"GPU": 1}]', "--nodes", "a,b", "--", "x"],
                 ["--name", "n", "--bundles", '[{"GPU": 1}]']):
        with pytest.raises(SystemExit) as exc:
            parse_args(argv)
        assert exc.value.code == 2
    assert json.loads(json.dumps(parse_args(["--name", "n", "--bundles", '[{"GPU": 1}]', "--", "a", "b"]).bundles))
