"""Issue 20, Kueue's visibility API: the collector asks ``visibility.kueue.x-k8s.io``
``clusterqueues/<name>/pendingworkloads`` for each ClusterQueue (the real ``kubernetes`` client
against the replay server), stores the answers in ``kueue_objects``, and ``gpuq serve`` shows
Kueue's own position (1-based) where a fresh answer names the Workload, gpuq's computed one
otherwise, saying which (``position_source``). Not served or forbidden: logged once, computed
positions, asked again slowly.

Data: tests/data/kueue/live_pendingworkloads.json (hand-built, live_SOURCE.md): Kueue's order puts
team-speech's Workload, queued last, first (as its admission fair sharing would: that LocalQueue
uses nothing), so it differs from the order computed from the Workloads (priority, then queued)."""
from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import logging
import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.k8s_kueue_visibility import KIND
from collector.k8s_stream import StreamOptions
from collector.kubernetes import KubernetesWatcher, stored_kueue_loader
from gpuq.settings import KubernetesTarget, load_settings
from gpuq.store.writer import BatchWriter
from scheduler.cli import explain_text
from scheduler.service.kueue import build, kueue_positions
from tests.k8s_replay import ReplayServer, load
from tests.test_collector_kubernetes import LIST_RV, Sink, wait_until
from tests.test_kueue_live import CQ, DATA, FLAVOR, KUBERAY, LQ, WL

UTC = dt.UTC
SUMMARY = json.loads((DATA / "live_pendingworkloads.json").read_text())
PRETRAIN, FINETUNE, ASR = ("kueue/team-llm/rayjob-pretrain-7b-3f2a1", "kueue/team-llm/rayjob-finetune-13b-8c0d2",
                           "kueue/team-speech/rayjob-asr-1b-77e1a")
OPTIONS = StreamOptions(watch_timeout_s=30, page_size=500, connect_timeout_s=1.0, backoff_base_s=0.02,
                        backoff_cap_s=0.1, min_watch_s=0.0, absent_retry_s=0.3)


def pending(namespace: str, name: str, queue: str, created: str, owner: str, uid: str) -> dict[str, Any]:
    """The recorded pending Workload (live_workload.yaml) as another one of the same shape."""
    out = copy.deepcopy(WL)
    meta = out["metadata"]
    meta.update(namespace=namespace, name=name, creationTimestamp=created, uid=f"{uid}-wl")
    meta["ownerReferences"][0].update(name=owner, uid=uid)
    out["spec"]["queueName"] = queue
    return out


WORKLOADS = [copy.deepcopy(WL),
             pending("team-llm", "rayjob-finetune-13b-8c0d2", "llm", "2026-11-21T09:14:00Z", "finetune-13b",
                     "7c1e2d3f-4a5b-4c6d-8e9f-0a1b2c3d4e02"),
             pending("team-speech", "rayjob-asr-1b-77e1a", "speech-lq", "2026-11-21T09:20:00Z", "asr-1b",
                     "7c1e2d3f-4a5b-4c6d-8e9f-0a1b2c3d4e03")]
SPEECH_LQ = copy.deepcopy(LQ)
SPEECH_LQ["metadata"].update(namespace="team-speech", name="speech-lq", uid="5a0f0000-0000-4000-8000-00000000l002")
LOCAL = {("team-llm", "llm"): "llm", ("team-speech", "speech-lq"): "llm"}
COMPUTED = {PRETRAIN: 1, FINETUNE: 2, ASR: 3}       # priority 0 each: the order they were created in
KUEUES = {ASR: 1, PRETRAIN: 2, FINETUNE: 3}         # positionInClusterQueue 0, 1, 2


def stored(summary: dict[str, Any], cq: str, fetched: float, interval_s: float = 30.0) -> dict[str, Any]:
    """A summary as the collector stores it (collector.k8s_kueue_visibility.summary_row)."""
    return {**summary, "metadata": {"name": cq},
            "gpuq": {"fetched": dt.datetime.fromtimestamp(fetched, UTC).isoformat(), "interval_s": interval_s}}


def positions(views: dict[str, Any]) -> dict[str, tuple[int | None, str | None]]:
    return {wid: (v.position, v.position_source) for wid, v in views.items()}


# ================================================================================================
# pure: build() prefers Kueue's fresh positions
# ================================================================================================
def test_a_fresh_answer_gives_kueues_positions_one_based_and_says_so() -> None:
    now = 1_800_000_000.0
    queue_of = lambda ns, lq, cq: cq            # noqa: E731
    views, _, _ = build(WORKLOADS, LOCAL, queue_of)
    assert positions(views) == {w: (p, "computed") for w, p in COMPUTED.items()}
    fresh = kueue_positions([stored(SUMMARY, "llm", now - 60)], now)
    assert fresh == {("llm", "team-speech", "rayjob-asr-1b-77e1a"): 0,
                     ("llm", "team-llm", "rayjob-pretrain-7b-3f2a1"): 1,
                     ("llm", "team-llm", "rayjob-finetune-13b-8c0d2"): 2}
    views, _, _ = build(WORKLOADS, LOCAL, queue_of, fresh)
    assert positions(views) == {w: (p, "kueue") for w, p in KUEUES.items()}
    assert KUEUES != COMPUTED

    # older than 3 of its polling intervals and a minute: a collector that stopped; not trusted
    assert kueue_positions([stored(SUMMARY, "llm", now - 149)], now) == fresh
    assert kueue_positions([stored(SUMMARY, "llm", now - 151)], now) == {}
    # another ClusterQueue's answer says nothing of llm's Workloads
    views, _, _ = build(WORKLOADS, LOCAL, queue_of, kueue_positions([stored(SUMMARY, "other", now)], now))
    assert positions(views) == {w: (p, "computed") for w, p in COMPUTED.items()}
    # a Workload the answer does not name (queued after it was fetched): computed, and said so
    short = {**SUMMARY, "items": SUMMARY["items"][:2]}
    views, _, _ = build(WORKLOADS, LOCAL, queue_of, kueue_positions([stored(short, "llm", now)], now))
    assert positions(views) == {ASR: (1, "kueue"), PRETRAIN: (2, "kueue"), FINETUNE: (2, "computed")}
    # admitted: no position at all
    admitted = copy.deepcopy(WORKLOADS)
    admitted[0]["status"] = {"admission": {"clusterQueue": "llm", "podSetAssignments": []},
                             "conditions": [{"type": "QuotaReserved", "status": "True",
                                             "lastTransitionTime": "2026-11-21T09:30:00Z"}]}
    views, _, _ = build(admitted, LOCAL, queue_of, kueue_positions([stored(SUMMARY, "llm", now)], now))
    assert positions(views)[PRETRAIN] == (None, None)


# ================================================================================================
# the collector through the replay server
# ================================================================================================
def server_with(**kw: Any) -> ReplayServer:
    pods, nodes = load("pods.json")["items"], load("nodes.json")["items"]
    objects = {"resourceflavors": [FLAVOR], "clusterqueues": [CQ], "localqueues": [LQ, SPEECH_LQ],
               "workloads": copy.deepcopy(WORKLOADS)}
    return ReplayServer([*pods, *KUBERAY["pods"]], nodes, resource_version=int(LIST_RV),
                        rayclusters=KUBERAY["rayclusters"], rayjobs=KUBERAY["rayjobs"], kueue=objects, **kw)


@contextlib.contextmanager
def collecting(server: ReplayServer, tmp_path: Path, *, interval_s: float = 0.1, store: Any = None,
               ) -> Iterator[tuple[Sink, BatchWriter | None]]:
    """The watcher with Kueue (its visibility API every ``interval_s``) in a thread, writing to a sink
    (and through a writer to the store, when given)."""
    sink = Sink()
    writer = BatchWriter(store, tmp_path / "spill") if store is not None else None

    def emit(table: str, rows: Any) -> None:
        sink(table, rows)
        if writer is not None:
            writer.write(table, rows)

    target = KubernetesTarget(cluster="prod", kubeconfig=str(server.kubeconfig(tmp_path / "kc")),
                              kueue_visibility_interval_s=interval_s)
    watcher = KubernetesWatcher(target, kueue=True, options=OPTIONS, checkpoint_interval_s=0.0,
                                rng=random.Random(1), stored_kueue=stored_kueue_loader(store) if store else None)
    stop = threading.Event()
    thread = threading.Thread(target=watcher.run, args=(emit, stop), daemon=True)
    thread.start()
    try:
        yield sink, writer
    finally:
        stop.set()
        thread.join(5)
        assert not thread.is_alive()
        if writer is not None:
            writer.close()


def summaries(sink: Sink) -> list[dict[str, Any]]:
    return [r for r in sink.table("kueue_objects") if r["kind"] == KIND]


def visibility_asked(server: ReplayServer) -> list[str]:
    return [r.path for r in list(server.requests) if r.path.startswith("/apis/visibility.kueue.x-k8s.io/")]


def test_the_collector_stores_kueues_answer_per_cluster_queue_falling_back_to_v1beta1(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with server_with(visibility={"llm": SUMMARY}, visibility_versions=("v1beta1",)) as server, \
            caplog.at_level(logging.INFO, "collector.k8s_kueue_visibility"), \
            collecting(server, tmp_path) as (sink, _):
        wait_until(lambda: len(summaries(sink)) >= 2)           # polled again after its interval
        asked = visibility_asked(server)
        # v1beta2 first (404: not served here), then v1beta1, and v1beta1 alone from then on
        assert asked[:3] == ["/apis/visibility.kueue.x-k8s.io/v1beta2/clusterqueues/llm/pendingworkloads",
                             "/apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/llm/pendingworkloads",
                             "/apis/visibility.kueue.x-k8s.io/v1beta1/clusterqueues/llm/pendingworkloads"]
        assert {r.query.get("limit") for r in server.requests if "pendingworkloads" in r.path} == {"1000"}
        row = summaries(sink)[0]
        assert (row["cluster"], row["namespace"], row["name"], row["deleted"]) == ("prod", "", "llm", 0)
        obj = json.loads(row["object"])
        assert [(i["metadata"]["name"], i["positionInClusterQueue"]) for i in obj["items"]] == [
            ("rayjob-asr-1b-77e1a", 0), ("rayjob-pretrain-7b-3f2a1", 1), ("rayjob-finetune-13b-8c0d2", 2)]
        assert obj["gpuq"]["interval_s"] == 0.1
        assert abs(dt.datetime.fromisoformat(obj["gpuq"]["fetched"]).timestamp() - time.time()) < 30

        # forbidden (the ClusterRole lacks the rule): logged once, the answer marked deleted, asked again slowly
        server.visibility_status = 403
        wait_until(lambda: summaries(sink)[-1]["deleted"] == 1)
        n = len(visibility_asked(server))
        wait_until(lambda: len(visibility_asked(server)) >= n + 2, timeout_s=5)   # every absent_retry_s (0.3 s)
        forbidden = [r for r in caplog.records if "forbidden" in r.getMessage()]
        assert len(forbidden) == 1 and forbidden[0].levelno == logging.WARNING
        assert "clusterqueues/pendingworkloads" in forbidden[0].getMessage()
        assert len([r for r in summaries(sink) if r["deleted"]]) == 1       # marked deleted once

        # allowed again: stored again, and said so
        server.visibility_status = None
        wait_until(lambda: summaries(sink)[-1]["deleted"] == 0)
        assert any("answers again" in r.getMessage() for r in caplog.records)


def test_not_served_is_logged_once_and_asked_again_slowly(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with server_with() as server, caplog.at_level(logging.WARNING, "collector.k8s_kueue_visibility"), \
            collecting(server, tmp_path, interval_s=0.05) as (sink, _):
        wait_until(lambda: len(visibility_asked(server)) >= 2)     # a round: v1beta2, then v1beta1
        time.sleep(0.45)
        # asked again every absent_retry_s (0.3 s), not every interval (0.05 s: some 18 more requests)
        assert len(visibility_asked(server)) <= 6
        wait_until(lambda: len(visibility_asked(server)) >= 6)     # three rounds
        gap = [r for r in caplog.records if "not served" in r.getMessage()]
        assert len(gap) == 1
        assert "visibility.kueue.x-k8s.io/v1beta2 nor v1beta1: 404" in gap[0].getMessage()
        assert "computed by gpuq" in gap[0].getMessage()
        assert not summaries(sink)
        assert sink.checkpoint("workloads") == LIST_RV              # Kueue's objects go on as before


def test_a_cluster_queue_kueue_does_not_know_has_no_answer_and_the_others_go_on(tmp_path: Path,
                                                                               caplog: pytest.LogCaptureFixture) -> None:
    other = copy.deepcopy(CQ)
    other["metadata"].update(name="batch", uid="5a0f0000-0000-4000-8000-00000000c002")
    with server_with(visibility={"llm": SUMMARY}, visibility_versions=("v1beta2",)) as server, \
            caplog.at_level(logging.WARNING, "collector.k8s_kueue_visibility"), \
            collecting(server, tmp_path) as (sink, _):
        server.add("clusterqueues", other)
        wait_until(lambda: any(p.endswith("/batch/pendingworkloads") for p in visibility_asked(server)))
        wait_until(lambda: len(summaries(sink)) >= 2)
        assert {r["name"] for r in summaries(sink)} == {"llm"}       # batch: Kueue's NotFound names it
        assert not caplog.records
        # Kueue's visibility server down (503 from the aggregator): logged once over the rounds, asked
        # again at each, the stored answer left to age out
        server.visibility_status = 503
        n = len(visibility_asked(server))
        wait_until(lambda: len(visibility_asked(server)) >= n + 6)
        down = [r.getMessage() for r in caplog.records]
        assert len(down) == 1 and "llm: clusterqueues/llm/pendingworkloads: HTTP 503" in down[0], down
        assert summaries(sink)[-1]["deleted"] == 0
        server.visibility_status = None
        # the ClusterQueue deleted: its stored answer goes too
        server.delete("clusterqueues", CQ)
        wait_until(lambda: summaries(sink)[-1]["deleted"] == 1)
        assert summaries(sink)[-1]["name"] == "llm"


# ================================================================================================
# gpuq serve: /workloads and explain through the store
# ================================================================================================
@pytest.fixture
def served(store: Any) -> Any:
    from scheduler.actuators.base import DryRunActuator
    from scheduler.api import create_app
    from scheduler.service import SchedulerService
    from scheduler.service.accounting import LiveAccounting
    from scheduler.service.kueue import KueueQueues, store_reader
    from scheduler.service.runtime import kueue_workloads
    from tests.test_api_security import Api

    tree = KueueQueues(store_reader(store))
    acc = LiveAccounting(store, watcher=tree)
    svc = SchedulerService(acc.config, DryRunActuator())
    acc.follow(svc)
    kueue = kueue_workloads(store, acc, svc)
    api = Api(create_app(svc, acc, load_settings(None, api={"tokens": [{"token": "view-t", "role": "viewer",
                                                                         "name": "vera"}]}), clock=time.time))

    def account() -> dict[str, dict[str, Any]]:
        acc.reload(accept=svc.set_config)
        kueue.refresh()
        return {w["id"]: w for w in api("GET", "/workloads?state=pending", "view-t").json()}
    return account


def test_serve_shows_kueues_positions_then_computed_ones_when_the_api_goes(store: Any, served: Any,
                                                                         tmp_path: Path) -> None:
    with server_with(visibility={"llm": SUMMARY}, visibility_versions=("v1beta2", "v1beta1")) as server, \
            collecting(server, tmp_path, store=store) as (sink, writer):
        assert writer is not None
        wait_until(lambda: sink.checkpoint("localqueues") == LIST_RV and sink.checkpoint("workloads") == LIST_RV
                   and len(summaries(sink)) >= 1)
        writer.flush()
        views = served()
        assert {w: (v["position"], v["position_source"]) for w, v in views.items()} == {
            w: (p, "kueue") for w, p in KUEUES.items()}
        lines = explain_text(views[PRETRAIN], now=time.time()).splitlines()
        assert "position 2 in llm (from Kueue); no start-time forecast yet" in lines, lines

        # Kueue's visibility API goes (its APIService deleted): computed again, said so
        server.visibility_versions = ()
        wait_until(lambda: summaries(sink)[-1]["deleted"] == 1)
        writer.flush()
        views = served()
        assert {w: (v["position"], v["position_source"]) for w, v in views.items()} == {
            w: (p, "computed") for w, p in COMPUTED.items()}
        lines = explain_text(views[PRETRAIN], now=time.time()).splitlines()
        assert "position 1 in llm; no start-time forecast yet" in lines, lines


@pytest.mark.parametrize("page, most, stored, offsets, truncated", [
    pytest.param(2, 10_000, 3, {None, "2"}, False, id="two-pages-joined"),
    pytest.param(1, 2, 2, {None, "1"}, True, id="stopped-at-max-items"),
])
def test_the_pages_of_a_long_queue_are_joined(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, page: int, most: int,
                                              stored: int, offsets: set[str | None], truncated: bool) -> None:
    """Kueue answers a page at a time (``limit``, ``offset``): the collector asks until a page comes
    back short, up to its most Workloads per ClusterQueue, and stores the pages as one answer in
    Kueue's order (``truncated`` said when it stopped early)."""
    import collector.k8s_kueue_visibility as vis

    monkeypatch.setattr(vis, "LIMIT", page)
    monkeypatch.setattr(vis, "MAX_ITEMS", most)
    with server_with(visibility={"llm": SUMMARY}, visibility_versions=("v1beta2",)) as server, \
            collecting(server, tmp_path) as (sink, _):
        wait_until(lambda: len(summaries(sink)) >= 1)
        obj = json.loads(summaries(sink)[0]["object"])
        asked = [r for r in list(server.requests) if r.path.endswith("/llm/pendingworkloads")]
    assert [(i["metadata"]["name"], i["positionInClusterQueue"]) for i in obj["items"]] == [
        ("rayjob-asr-1b-77e1a", 0), ("rayjob-pretrain-7b-3f2a1", 1), ("rayjob-finetune-13b-8c0d2", 2)][:stored]
    assert {r.query.get("offset") for r in asked} == offsets
    assert {r.query.get("limit") for r in asked} == {str(page)}
    assert obj["gpuq"].get("truncated", False) is truncated


def test_a_workload_seen_on_two_pages_is_kept_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The queue moved between two pages (a Workload of a higher priority arrived at its head): the
    later pages start one earlier than asked, so their first item was already on the page before;
    it is kept once, at its first position, and the pages still end when one comes back short."""
    import collector.k8s_kueue_visibility as vis

    monkeypatch.setattr(vis, "LIMIT", 2)
    names = [i["metadata"]["name"] for i in SUMMARY["items"]]
    asked: list[int] = []

    class Moving(vis.VisibilityPoller):
        def _get(self, path: str, name: str, offset: int = 0) -> tuple[int, Any]:
            asked.append(offset)
            items = copy.deepcopy(SUMMARY["items"])
            if offset:                               # a new Workload at the head meanwhile
                new = {**items[0], "metadata": {**items[0]["metadata"], "name": "urgent"}}
                items = [new, *({**i, "positionInClusterQueue": i["positionInClusterQueue"] + 1} for i in items)]
            return 200, {**SUMMARY, "items": items[offset:offset + vis.LIMIT]}

    poller = Moving(None, cluster="prod", server="test", interval_s=1, absent_retry_s=1, timeout=(1, 1))  # type: ignore[arg-type]
    summary = poller._fetch("llm")
    assert summary is not None
    assert [i["metadata"]["name"] for i in summary["items"]] == names
    assert [i["positionInClusterQueue"] for i in summary["items"]] == [0, 1, 3]
    assert asked == [0, 2, 3]
