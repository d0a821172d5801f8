"""Issue 21, the live service: what a preemption cost. The submitter reports a checkpoint
(``POST /workloads/{id}/checkpoint``, RFC 3339 or Unix seconds); a preemption records the
GPU-seconds thrown away since it (all of the run without one) on the workload, the preemption
record, the metrics and the stored event."""
from __future__ import annotations

import pytest

from gpuq.settings import load_settings
from scheduler.actuators.k8s_workloads import checkpoint_seconds, last_checkpoint
from scheduler.api import create_app
from scheduler.service import SchedulerService
from tests.test_api import TOKENS, Api, Clock, body, is_problem, make_service


def test_a_preemption_costs_the_work_since_the_last_checkpoint() -> None:
    svc, clock = make_service(), Clock()
    api = Api(create_app(svc, None, load_settings(None, api={"tokens": TOKENS}), clock=clock))
    for wid, t in (("a1", 1.0), ("a2", 2.0)):
        api("POST", "/workloads", token="op-t", json=body(wid))
        svc.cycle(t)
    # a2 (8 GPUs, started at t=2) checkpointed at t=1000, as RFC 3339; an older report moves nothing
    r = api("POST", "/workloads/a2/checkpoint", token="op-t", json={"last_checkpoint": "1970-01-01T00:16:40Z"})
    assert r.status_code == 200 and r.json()["last_checkpoint_s"] == 1000.0, r.text
    api("POST", "/workloads/a2/checkpoint", token="op-t", json={"last_checkpoint": 900})
    is_problem(api("POST", "/workloads/a2/checkpoint", token="op-t", json={"last_checkpoint": "yesterday"}),
               422, "invalid")
    is_problem(api("POST", "/workloads/a2/checkpoint", token="view-t", json={"last_checkpoint": 1}), 403, "forbidden")
    api("POST", "/workloads", token="op-t", json=body("b1", "b"))
    svc.cycle(1031.0)
    [p] = api("GET", "/preemptions", token="view-t").json()
    assert p["victims"] == ["a2"] and p["lost_gpu_seconds"] == 8 * 31.0
    a2 = api("GET", "/workloads/a2", token="view-t").json()
    assert a2["lost_gpu_seconds"] == 8 * 31.0 and a2["preempted"] == 1
    assert svc.stats.lost_gpu_seconds == {"a": 8 * 31.0}
    text = api("GET", "/metrics").text
    assert 'gpuq_scheduler_preemption_lost_gpu_seconds_total{queue="a"} 248.0' in text


def test_without_a_checkpoint_the_whole_run_is_lost() -> None:
    svc: SchedulerService = make_service()
    for wid, t in (("a1", 1.0), ("a2", 2.0)):
        svc.submit(*_w(wid, "a", t))
        svc.cycle(t)
    svc.submit(*_w("b1", "b", 1000.0))
    svc.cycle(1031.0)
    assert svc.explain("a2").lost_gpu_seconds == 8 * (1031.0 - 2.0)


def _w(wid: str, queue: str, t: float):  # type: ignore[no-untyped-def]
    from scheduler.actuators.base import Target
    from scheduler.model import Workload

    return Workload(wid, queue, gpus_per_pod=8, submit_s=t), Target(kind="None"), t


@pytest.mark.parametrize(("value", "seconds"), [
    ("2025-06-01T10:00:00Z", 1748772000.0), ("2025-06-01T12:00:00+02:00", 1748772000.0),
    ("1748772000", 1748772000.0), (1748772000.5, 1748772000.5)])
def test_checkpoint_times_read(value: object, seconds: float) -> None:
    assert checkpoint_seconds(value) == seconds
    if isinstance(value, str):
        assert last_checkpoint({"gpuq.io/last-checkpoint": value}) == seconds


@pytest.mark.parametrize("value", ["2025-06-01T10:00:00", "soon", "-5", "nan", True])
def test_bad_checkpoint_times_are_refused(value: object) -> None:
    with pytest.raises(ValueError):
        checkpoint_seconds(value)
    warned: list[str] = []
    if isinstance(value, str):
        assert last_checkpoint({"gpuq.io/last-checkpoint": value}, warned.append) is None
        assert "gpuq.io/last-checkpoint" in warned[0]
