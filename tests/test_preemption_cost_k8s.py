"""Issue 21, the Kubernetes workload source: a RayJob's ``gpuq.io/last-checkpoint`` annotation is
its workload's last checkpoint. The ``Workload`` is immutable and the annotation moves as the job
saves, so each sync feeds it to the service's entry as ``POST /workloads/{id}/checkpoint`` does;
a later preemption (carried out by the actuator) then counts its cost from it. Through the
replaying API server with the real client."""
from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from accounting.queues import parse_queue_config
from gpuq.settings import CollectorSettings, KubernetesTarget, Settings
from scheduler.actuators.k8s_workloads import KubernetesWorkloadSource
from scheduler.actuators.kubernetes import KubernetesActuator
from scheduler.service import SchedulerService
from scheduler.service.sources import sync_listed
from scheduler.snapshot import Settings as CoreSettings
from scheduler.testing import nodes
from tests.k8s_api_server import ApiServer, load

T0 = 1_764_000_000.0
JOB = "rayjob/team-a/train-llm"               # research.nlp, 2 pods x 8 GPUs
URGENT = "rayjob/team-a/urgent"               # prod (16 GPUs guaranteed), the same shape
QUEUES = {"research": {"queues": {"nlp": {"max": {"gpu": 16}}}}, "prod": {"guaranteed": {"gpu": 16}}}
CHECKPOINT = "gpuq.io/last-checkpoint"


def urgent() -> dict[str, Any]:
    obj = load("rayjob-train-llm.json")
    obj["metadata"].update(name="urgent", uid="0d7e51a2-9c0b-4f3e-8d6b-2f1a7c5e9b40",
                           labels={"kueue.x-k8s.io/queue-name": "prod"})
    return obj


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[tuple[ApiServer, KubernetesWorkloadSource, KubernetesActuator]]:
    with ApiServer([load("rayjob-train-llm.json")]) as server:
        settings = Settings(collector=CollectorSettings(kubernetes=[
            KubernetesTarget(cluster="test", kubeconfig=str(server.kubeconfig(tmp_path / "kubeconfig")))]))
        source = KubernetesWorkloadSource(settings, node_labels={})
        act = KubernetesActuator(settings, node_labels={}, sleep=lambda _s: None)
        try:
            yield server, source, act
        finally:
            source.close()
            act.close()


def annotate(server: ApiServer, value: str) -> None:
    """``kubectl annotate --overwrite rayjob train-llm gpuq.io/last-checkpoint=<value>``: the object
    as the server holds it now (gpuq's admission on it), the annotation changed."""
    obj = server.get("RayJob", "team-a", "train-llm")
    assert obj is not None
    obj = copy.deepcopy(obj)
    obj["metadata"].setdefault("annotations", {})[CHECKPOINT] = value
    server.put(obj)


def test_the_annotation_moves_the_checkpoint_and_a_preemption_counts_from_it(
        k8s: tuple[ApiServer, KubernetesWorkloadSource, KubernetesActuator]) -> None:
    server, source, act = k8s
    svc = SchedulerService(parse_queue_config({"queues": QUEUES}), act, nodes=nodes(("h", "H100", 8, 2)),
                           settings=CoreSettings(True, 5.0), sleep=lambda _s: None)
    assert sync_listed(svc, source, T0).submitted == (JOB,)
    svc.cycle(T0 + 1)
    assert svc.explain(JOB).state == "running"
    assert svc.explain(JOB).last_checkpoint_s is None                 # no annotation yet
    annotate(server, "2025-11-24T16:10:00Z")                          # T0 + 600, as RFC 3339
    sync_listed(svc, source, T0 + 620)
    assert svc.explain(JOB).last_checkpoint_s == T0 + 600
    annotate(server, str(int(T0 + 900)))                              # as Unix seconds, later
    sync_listed(svc, source, T0 + 920)
    assert svc.explain(JOB).last_checkpoint_s == T0 + 900
    annotate(server, "2025-11-24T16:05:00Z")                          # older (a stale writer): kept as it was
    sync_listed(svc, source, T0 + 930)
    assert svc.explain(JOB).last_checkpoint_s == T0 + 900
    annotate(server, "soon")                                          # unreadable: told, nothing moves
    sync_listed(svc, source, T0 + 940)
    assert svc.explain(JOB).last_checkpoint_s == T0 + 900
    told = [e for e in server.events("team-a") if e["reason"] == "BadAnnotation"]
    assert len(told) == 1 and CHECKPOINT in told[0]["message"] and "'soon'" in told[0]["message"]
    assert svc.explain(JOB).state == "running"                        # the object was not taken again as new

    annotate(server, str(int(T0 + 1000)))
    server.put(urgent())
    report = sync_listed(svc, source, T0 + 1010)
    assert report.submitted == (URGENT,) and svc.explain(JOB).last_checkpoint_s == T0 + 1000
    svc.cycle(T0 + 1020)                                              # the preemption delay (5 s) has passed
    job = svc.explain(JOB)
    assert (job.state, job.preempted) == ("pending", 1)
    assert job.lost_gpu_seconds == 16 * (1020.0 - 1000.0)            # 16 GPUs since the checkpoint, not since T0+1
    (p,) = svc.preemptions()
    assert p.victims == (JOB,) and p.lost_gpu_seconds == 320.0
    assert (server.get("RayJob", "team-a", "train-llm") or {})["spec"]["suspend"] is True    # the actuator stopped it
    assert svc.stats.lost_gpu_seconds == {"research.nlp": 320.0}
