"""The Kubernetes collector: pure extraction, then the real client against a replay server."""
from __future__ import annotations

import contextlib
import copy
import datetime as dt
import random
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.errors import CollectorError, WatchError
from collector.k8s_alloc import (
    CLOSED_BY_RELIST,
    ENDED,
    OPEN,
    Allocation,
    allocation_for,
    close_by_relist,
    version_of,
)
from collector.k8s_extract import (
    QueueKeys,
    base_gpu_model,
    effective_gpus,
    node_info,
    parse_quantity,
    parse_time,
    pod_gpu_model,
    pod_info,
    pod_queue,
)
from collector.k8s_state import ClusterTracker
from collector.k8s_stream import StreamOptions, backoff_delay
from collector.kubernetes import KubernetesWatcher, open_allocations_loader, state_loader
from gpuq.settings import KubernetesTarget
from gpuq.store import COLUMNS
from tests.conftest import closed_port
from tests.k8s_replay import ReplayServer, load

UTC = dt.UTC
T0 = dt.datetime(2026, 11, 21, 10, 0, tzinfo=UTC)
LIST_RV = "48213000"


def t(s: str) -> dt.datetime:
    return dt.datetime.fromisoformat(s)


# ================================================================================================
# builders
# ================================================================================================
def ctr(gpu: Any = None, *, request: Any = None, mig: dict[str, Any] | None = None,
        restart: str | None = None) -> dict[str, Any]:
    limits: dict[str, Any] = {"cpu": "1"}
    requests: dict[str, Any] = {"cpu": "1"}
    if gpu is not None:
        limits["nvidia.com/gpu"] = gpu
    if request is not None:
        requests["nvidia.com/gpu"] = request
    for r, n in (mig or {}).items():
        limits[f"nvidia.com/mig-{r}"] = n
    c: dict[str, Any] = {"name": "c", "image": "x", "resources": {"limits": limits, "requests": requests}}
    if restart:
        c["restartPolicy"] = restart
    return c


def pod_obj(containers: list[dict[str, Any]] = (), init: list[dict[str, Any]] = (), *,  # type: ignore[assignment]
            name: str = "p", ns: str = "ns", uid: str = "u1", node: str = "n1", phase: str = "Running",
            labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
            scheduled: str | None = "2026-11-21T09:00:00Z", start: str | None = "2026-11-21T09:00:01Z",
            created: str = "2026-11-21T08:59:00Z", finished: list[str | None] | None = None,
            deletion: str | None = None, priority: int | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": uid, "resourceVersion": "7",
                            "creationTimestamp": created, "labels": labels or {}}
    if annotations:
        meta["annotations"] = annotations
    if deletion:
        meta["deletionTimestamp"] = deletion
    spec: dict[str, Any] = {"containers": list(containers) or [ctr(1)]}
    if init:
        spec["initContainers"] = list(init)
    if node:
        spec["nodeName"] = node
    if priority is not None:
        spec["priority"] = priority
    status: dict[str, Any] = {"phase": phase}
    if scheduled:
        status["conditions"] = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": scheduled}]
    if start:
        status["startTime"] = start
    if finished is not None:
        status["containerStatuses"] = [
            {"name": f"c{i}", "state": {"terminated": {"finishedAt": f}} if f else {"running": {}}}
            for i, f in enumerate(finished)]
    return {"metadata": meta, "spec": spec, "status": status}


def recorded(kind: str, name: str) -> dict[str, Any]:
    items = load(f"{kind}.json")["items"]
    return copy.deepcopy(next(o for o in items if o["metadata"]["name"] == name))


# ================================================================================================
# extraction
# ================================================================================================
@pytest.mark.parametrize("value, expected", [
    ("2", 2.0), (4, 4.0), ("500m", 0.5), ("1k", 1000.0), ("1Ki", 1024.0), ("1e3", 1000.0), ("1E", 1e18),
], ids=["int-str", "int", "milli", "kilo", "kibi", "exponent", "exa"])
def test_parse_quantity(value: Any, expected: float) -> None:
    assert parse_quantity(value) == expected


@pytest.mark.parametrize("value, error", [
    ("", ValueError), ("two", ValueError), ("1Xi", ValueError), (True, TypeError),
], ids=["empty", "word", "bad-suffix", "bool"])
def test_parse_quantity_rejects(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match="invalid quantity"):
        parse_quantity(value)


@pytest.mark.parametrize("value, expected", [
    ("2026-11-21T10:00:00Z", T0),
    ("2026-11-21T10:00:00.250000Z", T0 + dt.timedelta(milliseconds=250)),
    ("2026-11-21T11:00:00+01:00", T0),
    (None, None),
], ids=["zulu", "micro", "offset", "absent"])
def test_parse_time_is_utc(value: str | None, expected: dt.datetime | None) -> None:
    got = parse_time(value)
    assert got == expected
    assert got is None or got.tzinfo == UTC


@pytest.mark.parametrize("spec, expected", [
    ({"containers": [ctr(2)]}, {"nvidia.com/gpu": 2}),
    ({"containers": [ctr(request="1")]}, {"nvidia.com/gpu": 1}),
    ({"containers": [ctr("2", request="2"), ctr(1)]}, {"nvidia.com/gpu": 3}),
    ({"containers": [ctr(1)], "initContainers": [ctr(4)]}, {"nvidia.com/gpu": 4}),
    ({"containers": [ctr(3)], "initContainers": [ctr(1), ctr(2)]}, {"nvidia.com/gpu": 3}),
    ({"containers": [ctr(1)], "initContainers": [ctr(1, restart="Always"), ctr(2)]}, {"nvidia.com/gpu": 3}),
    ({"containers": [ctr(mig={"1g.10gb": "2"})]}, {"nvidia.com/mig-1g.10gb": 2}),
    ({"containers": [ctr(1, mig={"3g.40gb": 1})]}, {"nvidia.com/gpu": 1, "nvidia.com/mig-3g.40gb": 1}),
    ({"containers": [ctr()]}, {}),
    ({"containers": [ctr("0")]}, {}),
], ids=["limit-only", "request-only", "containers-sum", "init-max-wins", "app-sum-wins",
        "sidecar-adds", "mig", "gpu-and-mig", "no-gpu", "zero"])
def test_effective_gpus(spec: dict[str, Any], expected: dict[str, float]) -> None:
    assert effective_gpus(spec) == expected


LOOKUP = QueueKeys(namespaces={"team-speech": "speech"}, default="unassigned")


@pytest.mark.parametrize("labels, annotations, namespace, lookup, expected", [
    ({"kueue.x-k8s.io/queue-name": "vision", "queue": "other"}, {}, "ns", LOOKUP, "vision"),
    ({"queue": "root.nlp"}, {}, "ns", LOOKUP, "root.nlp"),
    ({"yunikorn.apache.org/queue": "root.a"}, {}, "ns", LOOKUP, "root.a"),
    ({}, {"yunikorn.apache.org/queue": "root.b"}, "team-speech", LOOKUP, "root.b"),
    ({}, {}, "team-speech", LOOKUP, "speech"),
    ({}, {}, "elsewhere", LOOKUP, "unassigned"),
    ({}, {}, "elsewhere", QueueKeys(), ""),
    ({"queue": ""}, {}, "team-speech", LOOKUP, "speech"),
    ({"team": "x"}, {}, "ns", QueueKeys(labels=("team",), annotations=()), "x"),
], ids=["kueue-first", "queue-label", "yunikorn-label", "annotation-before-namespace", "namespace-map",
        "default", "no-default", "empty-label-skipped", "custom-keys"])
def test_pod_queue(labels: dict[str, str], annotations: dict[str, str], namespace: str,
                   lookup: QueueKeys, expected: str) -> None:
    assert pod_queue(labels, annotations, namespace, lookup) == expected


@pytest.mark.parametrize("name, gpus, resource, queue, priority, ray, node, scheduled", [
    ("raycluster-vision-head-x7k2p", 0, "", "vision", 0, ("raycluster-vision", "head", "headgroup"),
     "cpu-0", "2026-11-21T08:59:41Z"),
    ("raycluster-vision-gpu-group-worker-9fz4q", 4, "nvidia.com/gpu", "vision", 1000,
     ("raycluster-vision", "worker", "gpu-group"), "gpu-a100-0", "2026-11-21T09:00:05Z"),
    ("notebook-alice-0", 2, "nvidia.com/mig-1g.10gb", "root.nlp.interactive", 0, ("", "", ""),
     "gpu-a100-mig-0", "2026-11-21T07:30:01Z"),
    ("bert-finetune-7d9c5-qk2mx", 1, "nvidia.com/gpu", "root.nlp.batch", 0, ("", "", ""),
     "gpu-h100-mig-1", "2026-11-21T08:10:02Z"),
    ("train-resnet-0", 8, "nvidia.com/gpu", "vision", 500, ("", "", ""), "", None),
    ("asr-train-0", 2, "nvidia.com/gpu", "speech", 0, ("", "", ""), "gpu-a100-0", "2026-11-21T09:20:03Z"),
    ("coredns-789f8477df-4xw9z", 0, "", "unassigned", 2000000000, ("", "", ""), "cpu-0",
     "2026-09-30T22:07:03Z"),
], ids=["ray-head", "ray-worker-kueue", "mig-yunikorn-annotation", "single-mig-queue-label",
        "pending-unscheduled", "init-container-namespace-queue", "system-default-queue"])
def test_pod_info_recorded(name: str, gpus: float, resource: str, queue: str, priority: int,
                           ray: tuple[str, str, str], node: str, scheduled: str | None) -> None:
    info = pod_info(recorded("pods", name), LOOKUP)
    assert (info.gpus, info.gpu_resource, info.queue, info.priority) == (gpus, resource, queue, priority)
    assert (info.ray_cluster, info.ray_node_type, info.ray_group) == ray
    assert info.node == node
    assert info.scheduled_at == (t(scheduled) if scheduled else None)


def test_pod_info_finished_only_when_every_container_ended() -> None:
    done = pod_info(recorded("pods", "eval-job-xyz12"))
    assert done.phase == "Succeeded" and done.terminal
    assert done.finished_at == t("2026-11-21T08:41:27Z")
    half = pod_info(pod_obj([ctr(1), ctr(1)], finished=["2026-11-21T10:00:00Z", None]))
    assert half.finished_at is None


@pytest.mark.parametrize("name, model, strategy, config, capacity, allocatable, migs, ready, cordoned", [
    ("gpu-a100-0", "NVIDIA-A100-SXM4-80GB", "mixed", "all-disabled", 8, 8, {}, True, False),
    ("gpu-a100-mig-0", "NVIDIA-A100-SXM4-80GB", "mixed", "all-1g.10gb", 0, 0,
     {"nvidia.com/mig-1g.10gb": 56}, True, False),
    ("gpu-h100-mig-1", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "single", "all-1g.10gb", 56, 56, {}, True, True),
    ("cpu-0", "", "none", "", 0, 0, {}, True, False),
], ids=["full-gpus", "mig-mixed", "mig-single-cordoned", "cpu-only"])
def test_node_info_recorded(name: str, model: str, strategy: str, config: str, capacity: float,
                            allocatable: float, migs: dict[str, float], ready: bool, cordoned: bool) -> None:
    info = node_info(recorded("nodes", name))
    assert (info.gpu_model, info.mig_strategy, info.mig_config) == (model, strategy, config)
    assert (info.gpu_capacity, info.gpu_allocatable, dict(info.mig_resources)) == (capacity, allocatable, migs)
    assert (info.ready, info.unschedulable) == (ready, cordoned)
    assert info.labels["kubernetes.io/hostname"] == name


def test_node_strategy_inferred_without_strategy_label() -> None:
    node = recorded("nodes", "gpu-h100-mig-1")
    del node["metadata"]["labels"]["nvidia.com/mig.strategy"]
    assert node_info(node).mig_strategy == "single"
    node = recorded("nodes", "gpu-a100-mig-0")
    del node["metadata"]["labels"]["nvidia.com/mig.strategy"]
    assert node_info(node).mig_strategy == "mixed"


@pytest.mark.parametrize("product, expected", [
    ("NVIDIA-A100-SXM4-40GB", "NVIDIA-A100-SXM4-40GB"),
    ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "NVIDIA-A100-SXM4-40GB"),
    ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb+me", "NVIDIA-H100-80GB-HBM3"),
    ("Tesla-T4-SHARED", "Tesla-T4"),
    ("", ""),
], ids=["plain", "mig-single", "mig-media-ext", "time-sliced", "none"])
def test_base_gpu_model(product: str, expected: str) -> None:
    assert base_gpu_model(product) == expected


@pytest.mark.parametrize("containers, node_model, expected", [
    ([ctr(2)], "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
    ([ctr(mig={"1g.10gb": 2})], "NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"),
    ([ctr(1)], "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"),
    ([ctr()], "NVIDIA-A100-SXM4-80GB", ""),
    ([ctr(1)], "", ""),
], ids=["full-gpu", "mig-mixed-named-like-single", "mig-single", "no-gpu", "unknown-node"])
def test_pod_gpu_model(containers: list[dict[str, Any]], node_model: str, expected: str) -> None:
    assert pod_gpu_model(pod_info(pod_obj(containers)), node_model) == expected


SEEN = t("2026-11-21T11:00:00Z")


@pytest.mark.parametrize("obj, event, start, end, order", [
    (pod_obj(node=""), "ADDED", None, None, None),
    (pod_obj([ctr()]), "ADDED", None, None, None),
    (pod_obj(phase="Pending"), "MODIFIED", "2026-11-21T09:00:00Z", None, OPEN),
    (pod_obj(scheduled=None), "MODIFIED", "2026-11-21T09:00:01Z", None, OPEN),
    (pod_obj(scheduled=None, start=None), "SYNC", "2026-11-21T08:59:00Z", None, OPEN),
    (pod_obj(phase="Succeeded", finished=["2026-11-21T10:00:00Z"]), "MODIFIED",
     "2026-11-21T09:00:00Z", "2026-11-21T10:00:00Z", ENDED),
    (pod_obj(phase="Failed", finished=["2026-11-21T09:30:00Z", "2026-11-21T09:40:00Z"]), "MODIFIED",
     "2026-11-21T09:00:00Z", "2026-11-21T09:40:00Z", ENDED),
    (pod_obj(deletion="2026-11-21T10:30:00Z"), "DELETED", "2026-11-21T09:00:00Z", "2026-11-21T10:30:00Z", ENDED),
    (pod_obj(), "DELETED", "2026-11-21T09:00:00Z", "2026-11-21T11:00:00Z", ENDED),
    (pod_obj(phase="Failed", finished=["2026-11-21T08:00:00Z"]), "MODIFIED",
     "2026-11-21T09:00:00Z", "2026-11-21T09:00:00Z", ENDED),
], ids=["unbound", "no-gpu", "bound-pending-opens", "start-from-startTime", "start-from-creation",
        "succeeded-finishedAt", "failed-last-container", "deleted-deletionTimestamp", "deleted-seen-time",
        "end-clamped-to-start"])
def test_allocation_for(obj: dict[str, Any], event: str, start: str | None, end: str | None,
                        order: int | None) -> None:
    alloc = allocation_for(pod_info(obj), "M", "prod", event, SEEN)
    if start is None:
        assert alloc is None
        return
    assert alloc is not None
    assert (alloc.start, alloc.end) == (t(start), t(end) if end else None)
    assert alloc.version == version_of(t(end) if end else t(start), order or 0)
    again = allocation_for(pod_info(copy.deepcopy(obj)), "M", "prod", event, SEEN + dt.timedelta(hours=1))
    if end is None or event != "DELETED" or "deletionTimestamp" in obj["metadata"]:
        assert again == alloc                       # derived from the object: idempotent


def test_allocation_versions_order_transitions() -> None:
    open_ = allocation_for(pod_info(pod_obj()), "M", "prod", "MODIFIED", SEEN)
    ended = allocation_for(pod_info(pod_obj(phase="Succeeded", finished=["2026-11-21T09:00:00Z"])),
                           "M", "prod", "MODIFIED", SEEN)
    assert open_ is not None and ended is not None
    assert ended.end == open_.start and ended.version > open_.version     # same instant: end still wins
    closed = close_by_relist(open_, t("2026-11-21T08:00:00Z"))          # a relist clock behind start
    assert closed.end == open_.start and closed.version > ended.version
    assert Allocation.from_row(closed.row()) == closed
    naive = closed.row()[:11] + (closed.start.replace(tzinfo=None), None, closed.version) + closed.row()[14:]
    assert Allocation.from_row(naive).start.tzinfo == UTC


def test_backoff_is_exponential_jittered_and_capped() -> None:
    rng = random.Random(7)
    delays = [backoff_delay(a, 0.5, 8.0, rng) for a in range(8)]
    for attempt, d in enumerate(delays):
        ceiling = min(8.0, 0.5 * 2 ** attempt)
        assert ceiling / 2 <= d <= ceiling
    assert max(delays) <= 8.0 and delays[4] > delays[0]
    assert backoff_delay(10_000, 0.5, 8.0, rng) <= 8.0


# ================================================================================================
# the tracker (pure state between events)
# ================================================================================================
def test_node_heartbeat_is_skipped_but_changes_are_kept() -> None:
    tr = ClusterTracker("prod")
    node = recorded("nodes", "gpu-a100-0")
    assert len(tr.on_node("SYNC", node, T0)["node_events"]) == 1
    beat = copy.deepcopy(node)
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-11-21T10:05:00Z"
    beat["metadata"]["resourceVersion"] = "99"
    assert tr.on_node("MODIFIED", beat, T0) == {}
    beat["spec"]["unschedulable"] = True
    (row,) = tr.on_node("MODIFIED", beat, T0)["node_events"]
    assert dict(zip(COLUMNS["node_events"], row))["unschedulable"] == 1


def test_gpu_model_filled_in_when_the_node_arrives() -> None:
    tr = ClusterTracker("prod")
    first = tr.on_pod("ADDED", pod_obj([ctr(2)], node="late-node"), T0)
    assert first["pod_events"][0][10] == "" and first["gpu_allocations"][0][6] == ""
    node = recorded("nodes", "gpu-a100-0")
    node["metadata"]["name"] = "late-node"
    rows = tr.on_node("ADDED", node, T0)
    (pod_row,) = rows["pod_events"]
    assert pod_row[:10] == first["pod_events"][0][:10] and pod_row[10] == "NVIDIA-A100-SXM4-80GB"
    (alloc_row,) = rows["gpu_allocations"]
    assert alloc_row[6] == "NVIDIA-A100-SXM4-80GB" and alloc_row[13] == first["gpu_allocations"][0][13]


def test_relist_closes_vanished_allocations_and_keeps_the_rest() -> None:
    tr = ClusterTracker("prod")
    stored_open = [
        Allocation("prod", "ns", "gone", "u-gone", "q", "n1", "M", "nvidia.com/gpu", 1, 0, "",
                   t("2026-11-21T08:00:00Z"), None, version_of(t("2026-11-21T08:00:00Z"), OPEN)),
        Allocation("other", "ns", "x", "u-other-cluster", "q", "n1", "M", "nvidia.com/gpu", 1, 0, "",
                   t("2026-11-21T08:00:00Z"), None, 1),
    ]
    kept = tr.on_pod("SYNC", pod_obj(uid="u-kept"), T0)["gpu_allocations"]
    rows = tr.pods_relisted(None, {"u-kept"}, stored_open, T0)
    (closed,) = rows["gpu_allocations"]
    c = dict(zip(COLUMNS["gpu_allocations"], closed))
    assert (c["uid"], c["end"], c["version"]) == ("u-gone", T0, version_of(T0, CLOSED_BY_RELIST))
    assert [a.uid for a in tr.open_allocations()] == ["u-kept"]
    assert "gpu_allocations" not in tr.on_pod("SYNC", pod_obj(uid="u-kept"), T0)   # unchanged: no row
    assert kept[0][13] == version_of(t("2026-11-21T09:00:00Z"), OPEN)
    # a later relist does not close it again, nor reopen a deleted pod's allocation
    assert tr.pods_relisted(None, {"u-kept"}, stored_open, T0 + dt.timedelta(hours=1)) == {}
    tr.on_pod("DELETED", pod_obj(uid="u-kept", deletion="2026-11-21T10:10:00Z"), T0)
    assert tr.pods_relisted(None, set(), [], T0) == {}
    assert "gpu_allocations" not in tr.on_pod("MODIFIED", pod_obj(uid="u-kept"), T0)


def test_closed_uids_are_remembered_for_a_while_only() -> None:
    tr = ClusterTracker("prod", closed_memory_s=60)
    alloc = tr.on_pod("SYNC", pod_obj(), T0)["gpu_allocations"][0]
    tr.on_pod("DELETED", pod_obj(deletion="2026-11-21T10:00:00Z"), T0)
    stale = [Allocation.from_row(alloc)]                  # the store has not seen the close yet
    assert tr.pods_relisted(None, set(), stale, T0 + dt.timedelta(seconds=30)) == {}
    later = T0 + dt.timedelta(hours=1)                    # long after: the store is the truth again
    (row,) = tr.pods_relisted(None, set(), stale, later)["gpu_allocations"]
    assert row[12] == later


def test_closed_allocation_is_not_moved_by_a_later_event() -> None:
    tr = ClusterTracker("prod")
    tr.on_pod("MODIFIED", pod_obj(phase="Succeeded", finished=["2026-11-21T10:00:00Z"]), T0)
    later = tr.on_pod("DELETED", pod_obj(phase="Succeeded", finished=None,
                                         deletion="2026-11-21T12:00:00Z"), T0)
    assert "gpu_allocations" not in later


# ================================================================================================
# the watcher against the replay server
# ================================================================================================
class Clock:
    """A settable clock; with ``tick`` it moves on at every reading."""

    def __init__(self, now: dt.datetime = T0, tick_ms: int = 0) -> None:
        self.now = now
        self.tick = dt.timedelta(milliseconds=tick_ms)
        self._lock = threading.Lock()

    def __call__(self) -> dt.datetime:
        with self._lock:
            now, self.now = self.now, self.now + self.tick
            return now


class Sink:
    """What the watcher emitted, in order; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.rows: list[tuple[str, tuple[Any, ...]]] = []

    def __call__(self, table: str, rows: Any) -> None:
        assert all(len(r) == len(COLUMNS[table]) for r in rows), table
        with self._lock:
            self.rows.extend((table, tuple(r)) for r in rows)

    def table(self, table: str) -> list[dict[str, Any]]:
        with self._lock:
            return [dict(zip(COLUMNS[table], r)) for tb, r in self.rows if tb == table]

    def raw(self, table: str) -> list[tuple[Any, ...]]:
        with self._lock:
            return [r for tb, r in self.rows if tb == table]

    def checkpoint(self, key: str) -> str | None:
        got = [r["value"] for r in self.table("collector_state") if r["key"] == key]
        return got[-1] if got else None

    def final_allocations(self) -> dict[str, dict[str, Any]]:
        """What ``gpu_allocations FINAL`` reads: per uid the highest version, the last one on ties."""
        out: dict[str, dict[str, Any]] = {}
        for r in self.table("gpu_allocations"):
            if r["uid"] not in out or r["version"] >= out[r["uid"]]["version"]:
                out[r["uid"]] = r
        return out


def wait_until(predicate: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.01)


@pytest.fixture
def server() -> Iterator[ReplayServer]:
    with ReplayServer.recorded() as srv:
        yield srv


FAST = StreamOptions(watch_timeout_s=30, page_size=500, connect_timeout_s=1.0,
                     backoff_base_s=0.02, backoff_cap_s=0.1, min_watch_s=0.0)


@contextlib.contextmanager
def watching(kubeconfig: Path, *, sink: Sink | None = None, errors: list[CollectorError] | None = None,
             options: StreamOptions = FAST, namespaces: tuple[str, ...] = (),
             **kw: Any) -> Iterator[tuple[KubernetesWatcher, Sink]]:
    """Run a watcher in a thread; on exit stop it and check it returned within 2 s."""
    sink = sink if sink is not None else Sink()
    target = KubernetesTarget(cluster="prod", kubeconfig=str(kubeconfig), namespaces=list(namespaces))
    watcher = KubernetesWatcher(target, queues=LOOKUP, options=options, checkpoint_interval_s=0.0,
                                clock=kw.pop("clock", Clock()), rng=random.Random(1),
                                on_error=(errors if errors is not None else []).append, **kw)
    stop = threading.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            watcher.run(sink, stop)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            failure.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield watcher, sink
    finally:
        began = time.monotonic()
        stop.set()
        thread.join(5)
        took = time.monotonic() - began
    assert not failure, failure
    assert not thread.is_alive() and took < 2.0, f"stop took {took:.2f}s"


def synced(sink: Sink, rv: str = LIST_RV) -> Callable[[], bool]:
    return lambda: sink.checkpoint("pods") == rv and sink.checkpoint("nodes") is not None


POD_EVENTS = load("watch_pods.json")
NODE_EVENTS = load("watch_nodes.json")
ALL_GPU_PODS = {"a1f3c1de-0002-4b7e-9c55-6f1b2d3e4a02", "a1f3c1de-0003-4b7e-9c55-6f1b2d3e4a03",
                "a1f3c1de-0004-4b7e-9c55-6f1b2d3e4a04", "a1f3c1de-0006-4b7e-9c55-6f1b2d3e4a06",
                "a1f3c1de-0008-4b7e-9c55-6f1b2d3e4a08"}


def test_initial_list_is_paged_and_emits_every_object(server: ReplayServer, tmp_path: Path) -> None:
    opts = StreamOptions(watch_timeout_s=30, page_size=3, backoff_base_s=0.02, backoff_cap_s=0.1)
    with watching(server.kubeconfig(tmp_path / "kc"), options=opts) as (watcher, sink):
        wait_until(synced(sink))
        wait_until(lambda: len(server.watch_requests("pods")) == 1)
    assert watcher.name == server.url
    pods = server.list_requests("pods")
    assert [bool(r.query.get("continue")) for r in pods] == [False, True, True]      # 8 pods, 3 a page
    assert server.watch_requests("pods") == [LIST_RV] and server.watch_requests("nodes") == [LIST_RV]
    assert {r.query["allowWatchBookmarks"] for r in server.requests if r.watch} == {"true"}
    assert len(sink.table("pod_events")) == 8 and {r["event"] for r in sink.table("pod_events")} == {"SYNC"}
    assert len(sink.table("node_events")) == 4
    allocs = sink.final_allocations()
    assert set(allocs) == ALL_GPU_PODS
    worker = allocs["a1f3c1de-0002-4b7e-9c55-6f1b2d3e4a02"]
    assert (worker["gpus"], worker["queue"], worker["priority"], worker["ray_cluster"], worker["node"],
            worker["gpu_model"], worker["start"], worker["end"]) == (
        4, "vision", 1000, "raycluster-vision", "gpu-a100-0", "NVIDIA-A100-SXM4-80GB",
        t("2026-11-21T09:00:05Z"), None)
    assert allocs["a1f3c1de-0006-4b7e-9c55-6f1b2d3e4a06"]["end"] == t("2026-11-21T08:41:27Z")
    assert allocs["a1f3c1de-0003-4b7e-9c55-6f1b2d3e4a03"]["gpu_model"] == "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"
    head = next(r for r in sink.table("pod_events") if r["pod"] == "raycluster-vision-head-x7k2p")
    assert (head["ray_cluster"], head["ray_node_type"], head["gpus"], head["gpu_model"]) == (
        "raycluster-vision", "head", 0, "")
    mig = next(r for r in sink.table("node_events") if r["node"] == "gpu-a100-mig-0")
    assert mig["mig_resources"] == {"nvidia.com/mig-1g.10gb": 56.0} and mig["ready"] == 1


def test_watch_events_bookmark_and_late_node(server: ReplayServer, tmp_path: Path) -> None:
    with watching(server.kubeconfig(tmp_path / "kc")) as (_, sink):
        wait_until(synced(sink))
        for ev in POD_EVENTS[:2]:                     # train-resnet-0 bound to gpu-h100-1, then runs
            rv = server.event("pods", ev)
        wait_until(lambda: sink.checkpoint("pods") == str(rv))
        before = len(sink.rows)
        bm = server.bookmark("pods")
        wait_until(lambda: sink.checkpoint("pods") == str(bm))
        assert [tb for tb, _ in sink.rows[before:]] == ["collector_state"]    # a bookmark: only the RV
        node_rv = server.event("nodes", NODE_EVENTS[0])                       # gpu-h100-1 appears
        wait_until(lambda: sink.checkpoint("nodes") == str(node_rv))
        for ev in NODE_EVENTS[1:]:                    # a heartbeat, then a cordon
            node_rv = server.event("nodes", ev)
        wait_until(lambda: sink.checkpoint("nodes") == str(node_rv))
    resnet = [r for r in sink.table("pod_events") if r["pod"] == "train-resnet-0"]
    assert [(r["event"], r["phase"], r["node"], r["gpu_model"]) for r in resnet] == [
        ("SYNC", "Pending", "", ""),
        ("MODIFIED", "Pending", "gpu-h100-1", ""),
        ("MODIFIED", "Running", "gpu-h100-1", ""),
        ("MODIFIED", "Running", "gpu-h100-1", "NVIDIA-H100-80GB-HBM3"),      # filled in: same key
    ]
    assert resnet[-1]["resource_version"] == resnet[-2]["resource_version"]
    alloc = sink.final_allocations()["a1f3c1de-0005-4b7e-9c55-6f1b2d3e4a05"]
    assert (alloc["gpu_model"], alloc["start"], alloc["end"], alloc["gpus"]) == (
        "NVIDIA-H100-80GB-HBM3", t("2026-11-21T10:01:09Z"), None, 8)
    nodes = [(r["node"], r["event"], r["unschedulable"]) for r in sink.table("node_events")][4:]
    assert nodes == [("gpu-h100-1", "ADDED", 0), ("gpu-a100-0", "MODIFIED", 1)]   # heartbeat skipped


@pytest.mark.parametrize("how", ["error-event-mid-stream", "error-event-at-start", "http-410"])
def test_410_gone_relists_and_carries_on(server: ReplayServer, tmp_path: Path, how: str) -> None:
    errors: list[CollectorError] = []
    with watching(server.kubeconfig(tmp_path / "kc"), errors=errors) as (_, sink):
        wait_until(synced(sink))
        rv = server.event("pods", POD_EVENTS[2])                              # llm-serve-0 ADDED
        wait_until(lambda: sink.checkpoint("pods") == str(rv))
        if how == "error-event-mid-stream":
            server.interrupt_watches("pods", "expire")
        else:
            server.expire("pods", rv, http=how == "http-410")
            server.interrupt_watches("pods", "end")                           # the watch times out
        wait_until(lambda: len(server.list_requests("pods")) == 2)
        wait_until(lambda: len(server.watch_requests("pods")) == 3 if how != "error-event-mid-stream"
                   else len(server.watch_requests("pods")) == 2)
        rv2 = server.event("pods", POD_EVENTS[3])                             # ... bound to gpu-a100-0
        wait_until(lambda: sink.checkpoint("pods") == str(rv2))
    assert not errors                                                         # a 410 is routine
    watches = server.watch_requests("pods")
    assert watches[0] == LIST_RV and watches[-1] == str(rv)                   # relisted at rv
    relisted = [r for r in sink.table("pod_events") if r["event"] == "SYNC"][8:]
    assert len(relisted) == 9                                                 # llm-serve-0 included
    llm = sink.final_allocations()["a1f3c1de-0009-4b7e-9c55-6f1b2d3e4a09"]
    assert (llm["queue"], llm["gpus"], llm["start"], llm["end"]) == (
        "root.nlp.serving", 2, t("2026-11-21T10:03:02Z"), None)
    assert set(sink.final_allocations()) == ALL_GPU_PODS | {"a1f3c1de-0009-4b7e-9c55-6f1b2d3e4a09"}


def test_a_watch_refused_again_after_relisting_backs_off(server: ReplayServer, tmp_path: Path) -> None:
    server.compact("pods", server.resource_version + 1)                     # every watch: 410
    with watching(server.kubeconfig(tmp_path / "kc")) as (_, sink):
        wait_until(lambda: len(server.list_requests("pods")) >= 4)
        time.sleep(0.3)
        lists = len(server.list_requests("pods"))
    assert lists < 20                                   # backed off (0.02 s doubling, capped at 0.1 s)
    assert sink.checkpoint("pods") == LIST_RV and len(sink.table("node_events")) == 4


def test_dropped_connection_rewatches_from_last_resource_version(server: ReplayServer, tmp_path: Path) -> None:
    errors: list[CollectorError] = []
    with watching(server.kubeconfig(tmp_path / "kc"), errors=errors) as (_, sink):
        wait_until(lambda: synced(sink)() and server.open_watches("pods") == 1)
        server.drop_next_watch("pods", after_events=2)
        server.interrupt_watches("pods", "end")
        wait_until(lambda: len(server.watch_requests("pods")) == 2 and server.open_watches("pods") == 1)
        rvs = [server.event("pods", ev) for ev in POD_EVENTS[:4]]
        wait_until(lambda: sink.checkpoint("pods") == str(rvs[-1]))
        server.interrupt_watches("pods", "drop")                              # the socket just closes
        wait_until(lambda: len(server.watch_requests("pods")) == 4)
        rv = server.event("pods", POD_EVENTS[4])
        wait_until(lambda: sink.checkpoint("pods") == str(rv))
    assert server.watch_requests("pods") == [LIST_RV, LIST_RV, str(rvs[1]), str(rvs[3])]
    assert len(server.list_requests("pods")) == 1                             # no relist needed
    assert len(errors) == 2 and all(isinstance(e, WatchError) and e.retryable for e in errors)
    assert "dropped" in errors[0].message and server.url in errors[0].message
    watched = [(r["pod"], r["resource_version"]) for r in sink.table("pod_events") if r["event"] != "SYNC"]
    assert watched == [(ev["object"]["metadata"]["name"], str(v))
                       for ev, v in zip(POD_EVENTS[:5], [*rvs, rv])]          # each once, in order


def store_rows(store: Any, sink: Sink) -> None:
    for table in ("node_events", "pod_events", "gpu_allocations", "collector_state"):
        rows = sink.raw(table)
        if rows:
            store.insert(table, rows, COLUMNS[table])


def test_restart_resumes_without_loss_or_doubles(server: ReplayServer, tmp_path: Path, long_store: Any) -> None:
    store = long_store                    # the recorded objects' fixed times, kept whatever the date
    kc = server.kubeconfig(tmp_path / "kc")
    db = store.database
    loaders: dict[str, Any] = {"load_state": state_loader(store), "open_allocations": open_allocations_loader(store)}
    # run 1: list, the late node, four pod events
    with watching(kc, clock=Clock(T0, tick_ms=1), **loaders) as (_, sink1):
        wait_until(synced(sink1))
        node_rv = server.event("nodes", NODE_EVENTS[0])
        wait_until(lambda: sink1.checkpoint("nodes") == str(node_rv))
        rvs = [server.event("pods", ev) for ev in POD_EVENTS[:4]]
        wait_until(lambda: sink1.checkpoint("pods") == str(rvs[-1]))
    store_rows(store, sink1)
    # while the collector is down: the ray worker is deleted
    down = [server.event("pods", ev) for ev in POD_EVENTS[4:6]]
    # run 2: resumes from the stored resourceVersion, sees what happened meanwhile, then more
    sink2 = Sink()
    with watching(kc, sink=sink2, clock=Clock(T0 + dt.timedelta(minutes=5), tick_ms=1), **loaders):
        wait_until(lambda: sink2.checkpoint("pods") == str(down[-1]))
        last = [server.event("pods", ev) for ev in POD_EVENTS[6:]]
        wait_until(lambda: sink2.checkpoint("pods") == str(last[-1]))
    store_rows(store, sink2)
    assert server.watch_requests("pods") == [LIST_RV, str(rvs[-1])]
    assert len(server.list_requests("pods")) == 1                            # no relist at restart
    assert len(server.list_requests("nodes")) == 2 and not sink2.table("node_events")  # cache only

    def q(sql: str) -> list[tuple[Any, ...]]:
        """Rows of a query, datetimes as aware UTC (chDB hands them back naive)."""
        return [tuple(v.replace(tzinfo=UTC) if isinstance(v, dt.datetime) and v.tzinfo is None else v
                      for v in row) for row in store.query(sql.format(db=db)).rows]

    assert q("SELECT event, count() FROM {db}.pod_events FINAL GROUP BY event ORDER BY event") == [
        ("ADDED", 1), ("DELETED", 2), ("MODIFIED", 5), ("SYNC", 8)]
    # each watch event was written exactly once, even before merging
    assert q("SELECT count(), uniqExact(uid, resource_version) FROM {db}.pod_events "
             "WHERE event != 'SYNC'") == [(8, 8)]
    allocs = {r[0]: r[1:] for r in q(
        "SELECT pod, gpu_model, start, `end` FROM {db}.gpu_allocations FINAL ORDER BY pod")}
    assert {p: (m, s, e) for p, (m, s, e) in allocs.items()} == {
        "asr-train-0": ("NVIDIA-A100-SXM4-80GB", t("2026-11-21T09:20:03Z"), None),
        "bert-finetune-7d9c5-qk2mx": ("NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", t("2026-11-21T08:10:02Z"), None),
        "eval-job-xyz12": ("NVIDIA-A100-SXM4-80GB", t("2026-11-21T08:00:01Z"), t("2026-11-21T08:41:27Z")),
        "llm-serve-0": ("NVIDIA-A100-SXM4-80GB", t("2026-11-21T10:03:02Z"), None),
        "notebook-alice-0": ("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", t("2026-11-21T07:30:01Z"),
                             t("2026-11-21T10:29:41Z")),
        "raycluster-vision-gpu-group-worker-9fz4q": ("NVIDIA-A100-SXM4-80GB", t("2026-11-21T09:00:05Z"),
                                                     t("2026-11-21T10:05:04Z")),
        "train-resnet-0": ("NVIDIA-H100-80GB-HBM3", t("2026-11-21T10:01:09Z"), t("2026-11-21T10:20:45Z")),
    }

    # run 3: while down, llm-serve-0 goes and history is compacted: 410, relist, close at relist time
    llm = next(e for e in POD_EVENTS if e["object"]["metadata"]["name"] == "llm-serve-0")
    server.delete("pods", llm["object"])
    server.compact("pods", server.resource_version)
    relist_at = t("2026-11-21T11:00:00Z")
    bert_version = q("SELECT version FROM {db}.gpu_allocations FINAL WHERE pod = 'bert-finetune-7d9c5-qk2mx'")
    sink3 = Sink()
    with watching(kc, sink=sink3, clock=Clock(relist_at), **loaders):
        wait_until(lambda: len(server.list_requests("pods")) == 2 and sink3.checkpoint("pods") is not None)
    store_rows(store, sink3)
    closed = q("SELECT `end`, version FROM {db}.gpu_allocations FINAL WHERE pod = 'llm-serve-0'")
    assert closed == [(relist_at, version_of(relist_at, CLOSED_BY_RELIST))]
    assert q("SELECT version FROM {db}.gpu_allocations FINAL WHERE pod = 'bert-finetune-7d9c5-qk2mx'") == bert_version
    assert [r[13] for r in sink3.raw("gpu_allocations") if r[2] == "bert-finetune-7d9c5-qk2mx"] == [
        bert_version[0][0]]                                                  # re-emitted, same version
    assert q("SELECT count() FROM {db}.gpu_allocations FINAL WHERE `end` IS NULL") == [(2,)]
    assert q("SELECT value FROM {db}.collector_state FINAL WHERE key = 'pods'") == [(sink3.checkpoint("pods"),)]


def test_unreachable_server_retries_with_backoff(tmp_path: Path) -> None:
    port = closed_port()
    url = f"http://127.0.0.1:{port}"
    kc = tmp_path / "kc"
    kc.write_text(f'{{"apiVersion": "v1", "kind": "Config", "current-context": "c", '
                  f'"clusters": [{{"name": "c", "cluster": {{"server": "{url}"}}}}], '
                  f'"users": [{{"name": "u", "user": {{}}}}], '
                  f'"contexts": [{{"name": "c", "context": {{"cluster": "c", "user": "u"}}}}]}}')
    errors: list[CollectorError] = []
    with watching(kc, errors=errors) as (_, sink):
        wait_until(lambda: len(errors) >= 8)
    assert not sink.rows
    first = errors[0]
    assert isinstance(first, WatchError) and first.retryable and first.status is None
    assert url in str(first) and "'prod'" in str(first) and first.source == url
    assert {e.resource for e in errors if isinstance(e, WatchError)} == {"nodes", "pods", "rayclusters", "rayjobs"}


def test_watches_that_end_at_once_back_off(tmp_path: Path) -> None:
    errors: list[CollectorError] = []
    opts = StreamOptions(watch_timeout_s=30, backoff_base_s=0.05, backoff_cap_s=0.2, min_watch_s=1.0)
    server = ReplayServer.recorded(max_watch_s=0.0)
    with server, watching(server.kubeconfig(tmp_path / "kc"), errors=errors, options=opts) as (_, sink):
        wait_until(lambda: len([e for e in errors if isinstance(e, WatchError) and e.resource == "pods"]) >= 4)
        began = [r for r in server.requests if r.resource == "pods" and r.watch]
    assert all("ended at once" in e.message and e.retryable for e in errors)
    assert len(began) < 12                                  # no hot loop: backed off between tries
    assert set(server.watch_requests("pods")) == {LIST_RV} and sink.checkpoint("pods") == LIST_RV


def test_stop_is_prompt_during_an_idle_watch(server: ReplayServer, tmp_path: Path) -> None:
    slow = StreamOptions(watch_timeout_s=300)
    with watching(server.kubeconfig(tmp_path / "kc"), options=slow) as (_, sink):
        wait_until(synced(sink))
        wait_until(lambda: server.open_watches("pods") == 1 and server.open_watches("nodes") == 1)
    # `watching` asserted that run() returned within 2 s


def test_once_lists_and_returns(server: ReplayServer, tmp_path: Path) -> None:
    target = KubernetesTarget(cluster="prod", kubeconfig=str(server.kubeconfig(tmp_path / "kc")))
    sink = Sink()
    KubernetesWatcher(target, clock=Clock()).run(sink, threading.Event(), once=True)
    assert not server.watch_requests("pods") and not server.watch_requests("nodes")
    assert len(sink.table("pod_events")) == 8 and len(sink.table("node_events")) == 4
    assert sink.checkpoint("pods") == LIST_RV and sink.checkpoint("nodes") == LIST_RV


def test_namespaced_streams(server: ReplayServer, tmp_path: Path) -> None:
    with watching(server.kubeconfig(tmp_path / "kc"), namespaces=("team-nlp",)) as (_, sink):
        wait_until(lambda: sink.checkpoint("pods/team-nlp") == LIST_RV)
        rv = server.event("pods", POD_EVENTS[2])                  # team-nlp
        server.event("pods", POD_EVENTS[0])                       # team-vision: not ours
        wait_until(lambda: sink.checkpoint("pods/team-nlp") == str(rv))
    assert {r.path for r in server.requests if r.resource == "pods"} == {"/api/v1/namespaces/team-nlp/pods"}
    assert {r["namespace"] for r in sink.table("pod_events")} == {"team-nlp"}
    assert len(sink.table("pod_events")) == 3


def test_unreadable_object_is_reported_and_skipped(server: ReplayServer, tmp_path: Path) -> None:
    errors: list[CollectorError] = []
    bad = copy.deepcopy(POD_EVENTS[2])
    for part in ("limits", "requests"):
        bad["object"]["spec"]["containers"][0]["resources"][part]["nvidia.com/gpu"] = "lots"
    with watching(server.kubeconfig(tmp_path / "kc"), errors=errors) as (_, sink):
        wait_until(synced(sink))
        server.event("pods", bad)
        rv = server.event("pods", POD_EVENTS[0])
        wait_until(lambda: sink.checkpoint("pods") == str(rv))
    (err,) = errors
    assert isinstance(err, WatchError) and not err.retryable
    assert "team-nlp/llm-serve-0" in err.message and "invalid quantity" in err.message
    assert [r["pod"] for r in sink.table("pod_events") if r["event"] != "SYNC"] == ["train-resnet-0"]


def test_a_failing_emit_is_reported_and_the_stream_relists(server: ReplayServer, tmp_path: Path) -> None:
    class Flaky(Sink):
        armed = False

        def __call__(self, table: str, rows: Any) -> None:
            if self.armed and table == "pod_events":
                self.armed = False
                raise RuntimeError("writer refused")
            super().__call__(table, rows)

    sink, errors = Flaky(), []
    with watching(server.kubeconfig(tmp_path / "kc"), sink=sink, errors=errors):
        wait_until(synced(sink))
        sink.armed = True
        server.event("pods", POD_EVENTS[2])                 # llm-serve-0: its rows fail once
        wait_until(lambda: len(server.list_requests("pods")) == 2 and len(sink.table("pod_events")) == 17)
    (err,) = errors
    assert isinstance(err, WatchError) and "writer refused" in err.message and not err.retryable
    assert [r["event"] for r in sink.table("pod_events") if r["pod"] == "llm-serve-0"] == ["SYNC"]


def test_bad_kubeconfig_names_the_file_and_cluster(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    watcher = KubernetesWatcher(KubernetesTarget(cluster="prod", kubeconfig=str(missing)))
    with pytest.raises(WatchError) as info:
        watcher.run(Sink(), threading.Event())
    assert str(missing) in str(info.value) and "'prod'" in str(info.value)
    assert not info.value.retryable
