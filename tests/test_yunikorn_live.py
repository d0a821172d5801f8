"""Issue 20, live: ``queues_from: yunikorn``. The collector watches YuniKorn's ``yunikorn-configs``
ConfigMap (by name, in YuniKorn's namespace) through the replay server with the real ``kubernetes``
client and stores it; pods of one YuniKorn application are one workload in the ledger; pending
YuniKorn pods are stored. ``gpuq serve``'s pieces build the queue tree from the ConfigMap through the
reload path (edited: ``/queues`` follows; a bad edit keeps the last good tree, the error naming the
ConfigMap and the field) and show the pending applications in ``/workloads`` and ``explain`` with
YuniKorn's reason.

Objects: the ConfigMap is apache/yunikorn-k8shim's ``deployments/scheduler/yunikorn-configs.yaml``
(tests/data/yunikorn, SOURCE.md), its edit the hand-made GPU ``queues.yaml`` there; the pods are the
recorded ones (tests/data/k8s/pods.json: ``notebook-alice-0`` carries YuniKorn's app-id annotation),
and copies of the recorded YuniKorn pod ``bert-finetune-7d9c5-qk2mx`` given an ``applicationId``
label (k8shim's examples' key) as two workers of one application, or left Pending with the
``PodScheduled`` condition YuniKorn sets when a queue's quota is used up (``SchedulingSkipped``,
``HandleContainerStateUpdate`` in k8shim's pkg/cache/context.go)."""
from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from collector.k8s_extract import pod_info
from collector.k8s_yunikorn import application_of
from gpuq.settings import load_settings
from tests.k8s_replay import ReplayServer, load
from tests.test_collector_kubernetes import LIST_RV, Sink, wait_until, watching
from tests.test_kueue_live import TOKENS, queue_rows

YK = Path(__file__).parent / "data" / "yunikorn"
CONFIGMAP = yaml.safe_load((YK / "k8shim-scheduler-configmap.yaml").read_text())
CONFIGMAP["metadata"].update(namespace="yunikorn", uid="c0f1a000-0000-4000-8000-000000000001",
                             resourceVersion="48212000")
GPU_QUEUES = (YK / "handmade-gpu-queues.yaml").read_text()
PODS = load("pods.json")["items"]
BERT = next(p for p in PODS if p["metadata"]["name"] == "bert-finetune-7d9c5-qk2mx")
SKIPPED = ("Task team-nlp/llm-pretrain-worker-0 is skipped from scheduling because the queue quota has been "
           "exceeded")


def bert(name: str, uid: str, app: str, *, pending: bool = False, gpus: int = 4) -> dict[str, Any]:
    pod = copy.deepcopy(BERT)
    meta = pod["metadata"]
    meta.update(name=name, uid=uid, resourceVersion="48212100")
    meta["labels"] = {**meta["labels"], "applicationId": app, "yunikorn.apache.org/queue": "root.research.nlp"}
    meta["labels"].pop("queue", None)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = str(gpus)
    if pending:
        pod["spec"].pop("nodeName")
        pod["status"] = {"phase": "Pending", "qosClass": "Burstable", "conditions": [
            {"type": "PodScheduled", "status": "False", "lastProbeTime": None,
             "lastTransitionTime": "2026-11-21T09:55:00Z", "reason": "SchedulingSkipped", "message": SKIPPED}]}
        meta["creationTimestamp"] = "2026-11-21T09:54:00Z"
    else:
        pod["spec"]["nodeName"] = "gpu-a100-0"
    return pod


SWEEP = [bert(f"bert-sweep-{i}", f"b0000000-0000-4000-8000-00000000000{i}", "bert-sweep") for i in (1, 2)]
WAITING = [bert(f"llm-pretrain-worker-{i}", f"b0000000-0000-4000-8000-00000000001{i}", "llm-pretrain",
                pending=True, gpus=8) for i in (0, 1)]
APP = "yunikorn/team-nlp/llm-pretrain"


def with_queues(text: str) -> dict[str, Any]:
    cm = copy.deepcopy(CONFIGMAP)
    cm["data"] = {**cm["data"], "queues.yaml": text}
    return cm


def yk_server() -> ReplayServer:
    nodes = load("nodes.json")["items"]
    return ReplayServer([*PODS, *SWEEP, *WAITING], nodes, resource_version=int(LIST_RV), configmaps=[CONFIGMAP])


# ================================================================================================
# pure
# ================================================================================================
@pytest.mark.parametrize("labels, annotations, scheduler, expected", [
    ({"applicationId": "a", "yunikorn.apache.org/app-id": "b"}, {}, "yunikorn", "b"),        # canonical first
    ({"applicationId": "a"}, {"yunikorn.apache.org/app-id": "c"}, "yunikorn", "c"),          # then the annotation
    ({"applicationId": "a", "spark-app-selector": "s"}, {}, "yunikorn", "a"),
    ({"spark-app-selector": "s"}, {}, "yunikorn", "s"),
    ({"applicationId": "a"}, {}, "default-scheduler", ""),                                    # not YuniKorn's pod
    ({"applicationId": "yunikorn-team-nlp-autogen"}, {}, "yunikorn", ""),                     # generated: no app
    ({"applicationId": "team-nlp-uniqueautogen"}, {}, "yunikorn", ""),
])
def test_the_application_id_is_read_as_yunikorns_shim_reads_it(labels: dict[str, str], annotations: dict[str, str],
                                                               scheduler: str, expected: str) -> None:
    pod = {"metadata": {"name": "p", "namespace": "team-nlp", "labels": labels, "annotations": annotations},
           "spec": {"schedulerName": scheduler}}
    assert application_of(pod_info(pod)) == expected


def test_the_settings_name_yunikorns_namespace_and_partition() -> None:
    s = load_settings(None, queues_from="yunikorn", yunikorn={"namespace": "yk", "partition": "gpu"})
    assert (s.queues_from, s.yunikorn.namespace, s.yunikorn.partition) == ("yunikorn", "yk", "gpu")
    assert load_settings(None).yunikorn.namespace == "yunikorn"


# ================================================================================================
# the collector through the replay server
# ================================================================================================
def test_the_collector_follows_the_configmap_and_joins_an_applications_pods(tmp_path: Path) -> None:
    with yk_server() as server, watching(server.kubeconfig(tmp_path / "kc"), yunikorn="yunikorn") as (_, sink):
        key = "configmaps/yunikorn/yunikorn-configs"
        wait_until(lambda: sink.checkpoint("pods") == LIST_RV and sink.checkpoint(key) == LIST_RV)
        asked = [r for r in server.requests if r.resource == "configmaps"]
        assert {(r.path, r.query.get("fieldSelector")) for r in asked} >= {
            ("/api/v1/namespaces/yunikorn/configmaps", "metadata.name=yunikorn-configs"),
            ("/api/v1/namespaces/yunikorn/configmaps", "metadata.name=yunikorn-defaults")}
        stored = {(r["kind"], r["namespace"], r["name"]): r for r in sink.table("kueue_objects")}
        assert set(stored) == {("ConfigMap", "yunikorn", "yunikorn-configs"),
                               ("Pod", "team-nlp", "llm-pretrain-worker-0"), ("Pod", "team-nlp", "llm-pretrain-worker-1")}
        assert "placementrules" in yaml.safe_load(stored[("ConfigMap", "yunikorn", "yunikorn-configs")]["object"])[
            "data"]["queues.yaml"]
        allocs = {r["pod"]: r for r in sink.final_allocations().values()}
        assert {allocs[p["metadata"]["name"]]["workload_id"] for p in SWEEP} == {"yunikorn/team-nlp/bert-sweep"}
        assert allocs["notebook-alice-0"]["workload_id"] == "yunikorn/team-nlp/notebook-alice"   # the annotation
        assert allocs["bert-finetune-7d9c5-qk2mx"]["workload_id"] == ""          # YuniKorn's, naming no app
        assert allocs["asr-train-0"]["workload_id"] == ""                           # default-scheduler's

        # the ConfigMap edited: stored again; a pending pod bound: no longer pending
        rv = server.modify("configmaps", with_queues(GPU_QUEUES))
        wait_until(lambda: sink.checkpoint(key) == str(rv))
        assert "research" in sink.table("kueue_objects")[-1]["object"]
        bound = copy.deepcopy(WAITING[0])
        bound["spec"]["nodeName"] = "gpu-a100-0"
        bound["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}
        rv = server.modify("pods", bound)
        wait_until(lambda: sink.checkpoint("pods") == str(rv))
        last = [r for r in sink.table("kueue_objects") if r["name"] == "llm-pretrain-worker-0"][-1]
        assert last["deleted"] == 1
        assert allocs_of(sink, "llm-pretrain-worker-0")["workload_id"] == APP
        # the ConfigMap deleted: marked so
        rv = server.delete("configmaps", with_queues(GPU_QUEUES))
        wait_until(lambda: sink.checkpoint(key) == str(rv))
        assert sink.table("kueue_objects")[-1]["deleted"] == 1


def allocs_of(sink: Sink, pod: str) -> dict[str, Any]:
    return next(r for r in sink.final_allocations().values() if r["pod"] == pod)


# ================================================================================================
# serve: the tree and the pending applications from the store
# ================================================================================================
@pytest.fixture
def served(store: Any) -> Any:
    from scheduler.actuators.base import DryRunActuator
    from scheduler.api import create_app
    from scheduler.service import SchedulerService
    from scheduler.service.accounting import LiveAccounting
    from scheduler.service.kueue import store_reader
    from scheduler.service.runtime import yunikorn_applications
    from scheduler.service.yunikorn import YuniKornQueues
    from tests.test_api_security import Api

    tree = YuniKornQueues(store_reader(store), "yunikorn", "default")
    acc = LiveAccounting(store, watcher=tree)
    svc = SchedulerService(acc.config, DryRunActuator())
    acc.follow(svc)
    apps = yunikorn_applications(store, acc, svc)
    api = Api(create_app(svc, acc, load_settings(None, api={"tokens": TOKENS}), clock=time.time))
    return api, acc, svc, apps


def test_serve_follows_the_configmap_and_shows_pending_applications(store: Any, served: Any, tmp_path: Path) -> None:
    from tests.test_kueue_live import Collecting

    api, acc, svc, apps = served
    key = "configmaps/yunikorn/yunikorn-configs"
    with yk_server() as server, Collecting(server, store, tmp_path, kueue=False, yunikorn="yunikorn") as col:
        col.settle("pods", LIST_RV)
        col.settle(key, LIST_RV)
        now = time.time()

        def account() -> None:              # gpuq serve's accounting interval (scheduler.service.runtime)
            acc.reload(accept=svc.set_config)
            apps.refresh()
            r = acc.refresh(now)
            svc.set_nodes(r.nodes)
            svc.set_observed(r.observed, acc.queue_of, r.node_name, now, None)
            apps.advise(svc, now)

        account()
        assert acc.error is None and acc.config.leaves() == ()       # k8shim's own ConfigMap: root alone

        col.settle(key, server.modify("configmaps", with_queues(GPU_QUEUES)))
        account()
        rows = queue_rows(api)
        assert (rows[("research.vision", "*")]["guaranteed"], rows[("research.vision", "*")]["max"]) == (16, 32)
        assert rows[("research.nlp", "*")]["pending"] == 16           # the pending application's GPUs
        view = api("GET", f"/workloads/{APP}", "view-t").json()
        assert (view["state"], view["queue"], view["pods"], view["gpus"], view["position"], view["reason_code"]) == (
            "pending", "research.nlp", 2, 16, 1, "yunikorn_SchedulingSkipped")
        assert view["message"] == f"YuniKorn: {SKIPPED}"
        assert view["position_source"] == "computed"                   # YuniKorn's REST API is not read
        assert view["target"]["scheduler"] == "yunikorn" and view["target"]["application"] == "llm-pretrain"
        assert svc.explain(APP).reason_code == "yunikorn_SchedulingSkipped"
        assert APP in [w["id"] for w in api("GET", "/workloads?state=pending", "view-t").json()]
        # gpuq's advice beside YuniKorn's reason: the gang of its pending pods (2 x 8 GPUs) on whole
        # GPUs (the MIG nodes' slices are other resources): the recorded cluster's one A100 node has 14
        a = view["advice"]
        assert (a["outcome"], a["reason_code"]) == ("reject", "never_fits"), a
        assert a["message"] == ("needs 2 pods x 8 GPUs of type NVIDIA-A100-SXM4-80GB; all its nodes together "
                                "hold 1 such pods")
        assert view["eta"] is None
        from scheduler.cli import explain_text

        text = explain_text(view, now=now)
        assert "reason: yunikorn_SchedulingSkipped" in text
        assert f"gpuq would: never run it: {a['message']}" in text

        # a bad edit keeps the last good tree; the error names the ConfigMap and the field
        bad = GPU_QUEUES.replace("guaranteed: {nvidia.com/gpu: 16}", "guaranteed: {nvidia.com/gpu: lots}", 1)
        col.settle(key, server.modify("configmaps", with_queues(bad)))
        account()
        assert queue_rows(api)[("research.vision", "*")]["guaranteed"] == 16
        assert acc.error and "ConfigMap yunikorn-configs (namespace yunikorn), data.queues.yaml" in acc.error
        assert "resources.guaranteed.nvidia.com/gpu" in acc.error

        # an edit the queue rules refuse: named by the queue's origin in the ConfigMap
        over = GPU_QUEUES.replace("guaranteed: {nvidia.com/gpu: 16}", "guaranteed: {nvidia.com/gpu: 99}", 1)
        col.settle(key, server.modify("configmaps", with_queues(over)))
        account()
        assert queue_rows(api)[("research.vision", "*")]["guaranteed"] == 16
        assert acc.error and "(namespace yunikorn)" in acc.error and "guaranteed" in acc.error

        # both pods bound: no longer pending
        for pod in WAITING:
            bound = copy.deepcopy(pod)
            bound["spec"]["nodeName"] = "gpu-a100-0"
            bound["status"] = {"phase": "Running", "conditions": [{"type": "PodScheduled", "status": "True"}]}
            rv = server.modify("pods", bound)
        col.settle("pods", rv)
        account()
        assert api("GET", f"/workloads/{APP}", "view-t").status_code == 404


def test_a_pending_application_is_one_gang_of_its_pending_pods() -> None:
    from scheduler.service.yunikorn import build

    def pod(name: str, gpus: int, app: str = "train") -> dict[str, Any]:
        p = bert(name, f"uid-{name}", app, pending=True, gpus=gpus)
        return p

    views, asks = build([pod("w-0", 4), pod("w-1", 4), pod("x-0", 2, "mixed"), pod("x-1", 4, "mixed"),
                         pod("c-0", 0, "cpu")], lambda ns, q, _: "research.nlp")
    ns = BERT["metadata"]["namespace"]
    train = asks[f"yunikorn/{ns}/train"]
    assert not isinstance(train, str)
    assert (train.queue, train.pods, train.gpus_per_pod) == ("research.nlp", 2, 4)
    assert asks[f"yunikorn/{ns}/mixed"] == "its pending pods ask different GPUs (1 x 2, 1 x 4); gpuq's gangs are uniform"
    assert f"yunikorn/{ns}/cpu" not in asks and f"yunikorn/{ns}/cpu" in views       # shown, nothing to advise
