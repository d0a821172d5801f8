"""Issue 20, live: ``queues_from: kueue``. The collector watches Kueue's objects through the replay
server with the real ``kubernetes`` client (v1beta2 not served there: it falls back to v1beta1) and
stores them; ``gpuq serve``'s pieces build the queue tree from the store through the queue file's
reload path (a ClusterQueue edited: ``/queues`` shows the new guarantee; a LocalQueue added: a pod of
its namespace naming it lands in its queue), and show a Workload admitted then evicted in
``/workloads`` and ``explain`` with Kueue's reason, its GPUs counted once (the Workload's ledger row
until its pods are seen, then the pods). Objects: tests/data/kueue/live_*.yaml (live_SOURCE.md)."""
from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import logging
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.ledger import dedup
from accounting.model import Allocation, Window
from accounting.store_adapter import read_allocations
from collector.k8s_kueue import KueueIndex, reservation
from gpuq.errors import ConfigError
from gpuq.settings import load_settings
from gpuq.store import COLUMNS
from gpuq.store.writer import BatchWriter
from tests.accounting_helpers import T0, alloc
from tests.k8s_replay import ReplayServer, load
from tests.test_collector_kubernetes import LIST_RV, Sink, wait_until, watching

DATA = Path(__file__).parent / "data" / "kueue"
UTC = dt.UTC
TREE = list(yaml.safe_load_all((DATA / "live_cluster.yaml").read_text()))
FLAVOR, CQ, LQ = TREE
STATES = yaml.safe_load((DATA / "live_workload.yaml").read_text())
WL = STATES["pending"]
WID = "kueue/team-llm/rayjob-pretrain-7b-3f2a1"
KUBERAY = load("kuberay.json")
WORKERS = {p["metadata"]["uid"] for p in KUBERAY["pods"][1:]}
A100 = "NVIDIA-A100-SXM4-80GB"


def workload(state: str) -> dict[str, Any]:
    out = copy.deepcopy(WL)
    if state != "pending":
        out["status"] = copy.deepcopy(STATES[state]["status"])
    return out


def ts(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


# ================================================================================================
# pure
# ================================================================================================
def test_the_settings_refuse_kueue_with_an_acting_actuator_or_a_queue_file() -> None:
    assert load_settings(None, queues_from="kueue").queues_from == "kueue"
    assert load_settings(None).queues_from == "file"
    with pytest.raises(ConfigError, match=r"queues_from: kueue needs scheduler.actuator: dry-run \(gpuq advises; "
                                          r"Kueue acts\), got scheduler.actuator: kubernetes"):
        load_settings(None, queues_from="kueue", scheduler={"actuator": "kubernetes"})
    with pytest.raises(ConfigError, match="queues_file .* would be ignored"):
        load_settings(None, queues_from="yunikorn", queues_file="q.yaml")


def test_a_workload_holds_quota_while_reserved_and_not_evicted() -> None:
    assert reservation(workload("pending")) is None
    held = reservation(workload("admitted"))
    assert held is not None and (held.gpus, held.flavor, held.cluster_queue, held.start) == (
        4.0, "a100", "llm", ts("2026-11-21T09:10:05Z"))
    assert reservation(workload("evicted")) is None


def test_the_workload_row_counts_what_of_it_is_not_seen_yet_on_any_node(store: Any) -> None:
    """The Kueue row (no node) counts its GPUs less those of its workload's pods already running,
    on whichever nodes, in Python and in SQL alike: a gang of two 2-GPU pods starting at 5 on n2
    and at 8 on n3 is billed 4 GPUs from the admit on; another workload's pods do not cut it."""
    def led(pod: str, source: str, wid: str, node: str, start: float, end: float | None = None) -> Allocation:
        a = alloc(pod, "llm", 4 if source == "kueue" else 2, start, end, node=node, uid=f"{pod}/{node}")
        return dataclasses.replace(a, source=source, workload_id=wid)

    rows = [led("wl-a", "kueue", "kueue/ns/a", "", 0), led("p1", "pod", "kueue/ns/a", "n2", 5),
            led("p2", "pod", "kueue/ns/a", "n3", 8), led("wl-b", "kueue", "kueue/ns/b", "", 0),
            led("q1", "pod", "kueue/ns/c", "n1", 1)]

    def pieces(allocs: list[Allocation]) -> list[tuple[Any, ...]]:
        return sorted((a.workload_id, a.source, a.node, a.start_s - T0, None if a.end_s is None else a.end_s - T0,
                       a.milli_gpus) for a in allocs)

    kept = pieces(dedup(rows))
    assert [k[3:] for k in kept if k[:2] == ("kueue/ns/a", "kueue")] == [(0, 5, 4000), (5, 8, 2000)]
    assert [k[3:] for k in kept if k[:2] == ("kueue/ns/b", "kueue")] == [(0, None, 4000)]   # never seen: whole
    assert ("kueue/ns/a", "pod", "n3", 8, None, 2000) in kept

    def row(a: Allocation) -> tuple[Any, ...]:
        t = lambda s: dt.datetime.fromtimestamp(s, UTC)   # noqa: E731
        return (a.cluster, a.namespace, a.pod, a.uid, a.queue, a.node, a.gpu_model, a.gpu_resource, a.gpus,
                a.priority, a.ray_cluster, t(a.start_s), None if a.end_s is None else t(a.end_s),
                round(a.start_s * 1000) * 10 + 1, a.source, a.workload_id, a.owner_kind, a.owner)

    store.insert("gpu_allocations", [row(a) for a in rows], COLUMNS["gpu_allocations"])
    from accounting import sql as q
    from accounting.store_adapter import _alloc, _allocation, _q, _window
    window = Window(T0, T0 + 60)
    ledger = [_allocation(r) for r in _q(store, _alloc(store, q.ALLOCATIONS, window),
                                         {**_window(window, T0 + 60), "sources": ""})]
    assert pieces(ledger) == kept
    assert {a.uid for a in ledger} == {a.uid for a in dedup(rows)}
    assert {(a.workload_id, a.source) for a in read_allocations(store, window, T0 + 60)} >= {
        ("kueue/ns/a", "kueue"), ("kueue/ns/b", "kueue")}


def test_index_joins_pods_through_the_workloads_owner() -> None:
    index = KueueIndex("prod")
    rows, changed = index.on_object("workloads", "ADDED", workload("pending"), T0_DT)
    assert changed and [r[2] for r in rows["kueue_objects"]] == ["Workload"] and "gpu_allocations" not in rows
    assert index.workload_of(["other", "7c1e2d3f-4a5b-4c6d-8e9f-0a1b2c3d4e01"]) == WID
    rows, _ = index.on_object("workloads", "MODIFIED", workload("admitted"), T0_DT)
    (opened,) = [dict(zip(COLUMNS["gpu_allocations"], r)) for r in rows["gpu_allocations"]]
    assert (opened["workload_id"], opened["source"], opened["gpus"], opened["node"], opened["queue"],
            opened["owner_kind"], opened["end"]) == (WID, "kueue", 4.0, "", "llm", "RayJob", None)
    assert opened["gpu_model"] == "a100"                      # flavor not seen: its name
    rows, _ = index.on_object("workloads", "MODIFIED", workload("evicted"), T0_DT)
    (closed,) = [dict(zip(COLUMNS["gpu_allocations"], r)) for r in rows["gpu_allocations"]]
    assert closed["uid"] == opened["uid"] and closed["end"] == ts("2026-11-21T09:40:00Z")
    assert closed["version"] > opened["version"]


T0_DT = dt.datetime(2026, 11, 21, 10, 0, tzinfo=UTC)


# ================================================================================================
# the collector through the replay server
# ================================================================================================
def kueue_server(**kw: Any) -> ReplayServer:
    pods, nodes = load("pods.json")["items"], load("nodes.json")["items"]
    return ReplayServer([*pods, *KUBERAY["pods"]], nodes, resource_version=int(LIST_RV),
                        rayclusters=KUBERAY["rayclusters"], rayjobs=KUBERAY["rayjobs"], **kw)


def kueue_rows(sink: Sink) -> list[dict[str, Any]]:
    return [r for r in sink.table("gpu_allocations") if r["source"] == "kueue"]


def test_the_collector_follows_kueue_objects_and_a_workload_admitted_then_evicted(tmp_path: Path) -> None:
    objects = {"resourceflavors": [FLAVOR], "clusterqueues": [CQ], "localqueues": [LQ],
               "workloads": [workload("pending")]}
    with kueue_server(kueue=objects) as server, watching(server.kubeconfig(tmp_path / "kc"), kueue=True) as (_, sink):
        wait_until(lambda: sink.checkpoint("pods") == LIST_RV and sink.checkpoint("workloads") == LIST_RV)
        paths = [r.path for r in server.requests if r.resource == "" or r.resource == "workloads"]
        assert "/apis/kueue.x-k8s.io/v1beta2/workloads" in paths           # asked first, 404
        assert "/apis/kueue.x-k8s.io/v1beta1/workloads" in paths           # then the version served
        stored = {(r["kind"], r["namespace"], r["name"]) for r in sink.table("kueue_objects")}
        assert stored == {("ResourceFlavor", "", "a100"), ("ClusterQueue", "", "llm"),
                          ("LocalQueue", "team-llm", "llm"), ("Workload", "team-llm", "rayjob-pretrain-7b-3f2a1")}
        pods = {r["uid"]: r for r in sink.final_allocations().values() if r["uid"] in WORKERS}
        assert {r["workload_id"] for r in pods.values()} == {WID}        # joined through the RayJob
        assert not kueue_rows(sink)                                       # pending: holds nothing
        rv = server.modify("workloads", workload("admitted"))
        wait_until(lambda: sink.checkpoint("workloads") == str(rv))
        (opened,) = kueue_rows(sink)
        assert (opened["gpus"], opened["gpu_model"], opened["queue"], opened["start"], opened["end"]) == (
            4.0, A100, "llm", ts("2026-11-21T09:10:05Z"), None)
        rv = server.modify("workloads", workload("evicted"))
        wait_until(lambda: sink.checkpoint("workloads") == str(rv))
        assert kueue_rows(sink)[-1]["end"] == ts("2026-11-21T09:40:00Z")
        rv = server.delete("workloads", workload("evicted"))
        wait_until(lambda: sink.checkpoint("workloads") == str(rv))
    assert sink.table("kueue_objects")[-1]["deleted"] == 1


def test_kueue_not_installed_is_logged_once_and_the_pods_go_on(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    with kueue_server(kueue_versions=()) as server, caplog.at_level(logging.WARNING, "collector.k8s_stream"), \
            watching(server.kubeconfig(tmp_path / "kc"), kueue=True) as (_, sink):
        wait_until(lambda: sink.checkpoint("pods") == LIST_RV)
        # a stream counts as synced before it logs the 404 (the pods may be listed in between)
        wait_until(lambda: sum("not served" in r.getMessage() for r in caplog.records) >= 5)
    absent = [r.getMessage() for r in caplog.records if "not served" in r.getMessage()]
    assert len(absent) == 5 and any("workloads.kueue.x-k8s.io/v1beta2 nor v1beta1" in m for m in absent)
    asked = [r.path for r in server.requests if r.path.startswith("/apis/kueue.x-k8s.io/")]
    assert len(asked) == 11            # v1beta2 then v1beta1 (Cohort: v1alpha1 too) once; again only after 300 s
    assert sink.final_allocations()


# ================================================================================================
# serve: the tree and the workloads from the store
# ================================================================================================
class Collecting:
    """The collector in a thread writing to the store (as gpuq serve runs it)."""

    def __init__(self, server: ReplayServer, store: Any, tmp_path: Path, **kw: Any) -> None:
        from collector.kubernetes import KubernetesWatcher, stored_kueue_loader
        from gpuq.settings import KubernetesTarget

        self.writer = BatchWriter(store, tmp_path / "spill")
        target = KubernetesTarget(cluster="prod", kubeconfig=str(server.kubeconfig(tmp_path / "kc")))
        from tests.test_collector_kubernetes import FAST
        self.sink = Sink()

        def emit(table: str, rows: Any) -> None:
            self.sink(table, rows)
            self.writer.write(table, rows)

        self.watcher = KubernetesWatcher(target, **{"kueue": True, **kw}, options=FAST, checkpoint_interval_s=0.0,
                                         stored_kueue=stored_kueue_loader(store))
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.watcher.run, args=(emit, self.stop), daemon=True)

    def __enter__(self) -> Collecting:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join(5)
        self.writer.close()

    def settle(self, key: str, rv: int | str) -> None:
        wait_until(lambda: self.sink.checkpoint(key) == str(rv))
        self.writer.flush()


@pytest.fixture
def served(store: Any) -> Any:
    from scheduler.actuators.base import DryRunActuator
    from scheduler.api import create_app
    from scheduler.service import SchedulerService
    from scheduler.service.accounting import LiveAccounting
    from scheduler.service.kueue import KueueQueues, store_reader
    from scheduler.service.runtime import kueue_workloads
    from tests.test_api_security import Api

    def make() -> tuple[Any, Any, Any, Any]:
        tree = KueueQueues(store_reader(store))
        acc = LiveAccounting(store, watcher=tree)
        svc = SchedulerService(acc.config, DryRunActuator())
        acc.follow(svc)
        kueue = kueue_workloads(store, acc, svc)
        api = Api(create_app(svc, acc, load_settings(None, api={"tokens": TOKENS}), clock=time.time))
        return api, acc, svc, kueue
    return make


TOKENS = [{"token": "view-t", "role": "viewer", "name": "vera"}]


def queue_rows(api: Any) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["queue"], r["gpu_type"]): r for r in api("GET", "/queues?limit=1000", "view-t").json()}


def test_serve_follows_kueue(store: Any, served: Any, tmp_path: Path) -> None:
    objects = {"resourceflavors": [FLAVOR], "clusterqueues": [CQ], "localqueues": [LQ],
               "workloads": [workload("pending")]}
    api, acc, svc, kueue = served()
    with kueue_server(kueue=objects) as server, Collecting(server, store, tmp_path) as col:
        col.settle("pods", LIST_RV)
        col.settle("workloads", LIST_RV)
        now = T0_DT.timestamp()

        def account() -> None:
            acc.reload(accept=svc.set_config)
            kueue.refresh()
            acc.refresh(now)

        account()
        rows = queue_rows(api)
        assert (rows[("llm", "*")]["guaranteed"], rows[("llm", "*")]["max"]) == (8, 8)
        # the workers' pods run (the recording) and are joined to the Workload: counted for llm once
        assert rows[("llm", "*")]["allocated"] == 4 and rows[("llm", "*")]["pending"] == 4
        view = api("GET", f"/workloads/{WID}", "view-t").json()
        # the GPU pods of the gang: 2 workers x 2 GPUs (the head asks none)
        assert (view["state"], view["queue"], view["pods"], view["gpus_per_pod"], view["gpus"], view["position"]) == (
            "pending", "llm", 2, 2, 4, 1)
        assert view["reason_code"] == "kueue_Pending"
        assert "insufficient unused quota for nvidia.com/gpu in flavor a100" in view["message"]

        # a ClusterQueue edited: the new guarantee
        edited = copy.deepcopy(CQ)
        edited["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = 12
        col.settle("clusterqueues", server.modify("clusterqueues", edited))
        account()
        assert queue_rows(api)[("llm", "*")]["guaranteed"] == 12

        # admitted, then evicted
        col.settle("workloads", server.modify("workloads", workload("admitted")))
        account()
        view = api("GET", f"/workloads/{WID}", "view-t").json()
        assert (view["state"], view["reason_code"], view["start_s"]) == (
            "running", None, ts("2026-11-21T09:10:05Z").timestamp())
        assert "gpu-workers: 2 pods on flavor a100" in view["actuator_message"]
        assert queue_rows(api)[("llm", "*")]["allocated"] == 4 and queue_rows(api)[("llm", "*")]["pending"] == 0
        assert [w["id"] for w in api("GET", "/workloads?state=running", "view-t").json()] == [WID]
        col.settle("workloads", server.modify("workloads", workload("evicted")))
        account()
        view = api("GET", f"/workloads/{WID}", "view-t").json()
        assert view["state"] == "pending" and view["message"].startswith(
            "Kueue: evicted (Preempted): Preempted to accommodate a higher priority Workload; couldn't assign")

        # a LocalQueue added: a pod of its namespace naming it lands in its ClusterQueue's queue
        lq = copy.deepcopy(LQ)
        lq["metadata"].update(namespace="team-speech", name="speech-lq", uid="5a0f0000-0000-4000-8000-00000000l002")
        col.settle("localqueues", server.add("localqueues", lq))
        account()
        assert acc.resolver().queue("speech-lq", "team-speech") == "llm"

        # an edit that breaks the tree keeps the last good one, and the error names the object
        bad = copy.deepcopy(edited)
        bad["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = "lots"
        col.settle("clusterqueues", server.modify("clusterqueues", bad))
        account()
        assert queue_rows(api)[("llm", "*")]["guaranteed"] == 12
        assert acc.error and "ClusterQueue llm (kueue): spec.resourceGroups[0].flavors[0].resources[2].nominalQuota" in acc.error
