"""The ``ray`` actuator against a real local Ray head (the session fixture of tests/ray_fixtures)."""
from __future__ import annotations

import json
import re
import shlex
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from gpuq.errors import ConfigError
from gpuq.settings import CollectorSettings, RayTarget, Settings
from scheduler.actuators.base import Target
from scheduler.actuators.ray import RayActuator, RayJobState, submission_id
from scheduler.model import Placement, Workload
from tests.conftest import closed_port
from tests.ray_fixtures import RayHead, ray_head_fixture  # noqa: F401 - the fixture

SLEEP = Target("RaySubmission", metadata={"owner": "alice"}, entrypoint=(
    f"{shlex.quote(sys.executable)} -c 'import os, time; "
    f"print(\"CVD=\" + str(os.environ.get(\"CUDA_VISIBLE_DEVICES\")), flush=True); time.sleep(30)'"))
H100 = Placement("H100", (("head", 1),))


def wait_for(get: Callable[[], RayJobState | None], want: str, timeout_s: float = 40.0) -> RayJobState:
    deadline, state = time.monotonic() + timeout_s, None
    while time.monotonic() < deadline:
        state = get()
        if state is not None and state.status == want:
            return state
        time.sleep(0.5)
    raise AssertionError(f"not {want} after {timeout_s}s: {state}")


def jobs_of(head: RayHead, workload_id: str) -> list[dict[str, Any]]:
    jobs = httpx.get(f"{head.dashboard_url}/api/jobs/", timeout=10).json()
    return [j for j in jobs if (j.get("metadata") or {}).get("gpuq.workload") == workload_id]


def driver_log(head: RayHead, sid: str, timeout_s: float = 20.0) -> str:
    deadline, logs = time.monotonic() + timeout_s, ""
    while time.monotonic() < deadline and not re.search(r"^CVD=", logs, re.M):   # not the echoed command
        logs = httpx.get(f"{head.dashboard_url}/api/jobs/{sid}/logs", timeout=10).json().get("logs", "")
        time.sleep(0.3)
    return logs


class Recording(httpx.HTTPTransport):
    """The real transport, keeping every request the actuator sends."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, str, Any]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        self.sent.append((request.method, request.url.path, body))
        return super().handle_request(request)


@pytest.fixture
def recording() -> Recording:
    return Recording()


@pytest.fixture
def actuator(ray_head: RayHead, recording: Recording) -> Iterator[RayActuator]:
    settings = Settings(collector=CollectorSettings(
        ray=[RayTarget(cluster="local", dashboard_url=ray_head.dashboard_url)]))
    act = RayActuator(settings, attempts=8, backoff_s=0.5,    # the job agent may still be starting
                      transport=recording)
    yield act
    act.close()


@pytest.mark.ray
def test_admit_runs_once_and_preempt_stops(actuator: RayActuator, ray_head: RayHead,
                                           recording: Recording) -> None:
    wl = Workload(f"test/{uuid.uuid4().hex[:8]}", "research.nlp", pods=1, gpus_per_pod=1)
    assert actuator.status(wl) is None
    first = actuator.admit(wl, SLEEP, H100)
    assert first.ok and first.detail["submitted"], first.message
    sid = submission_id(wl.id, 0)
    assert first.detail["submission_id"] == sid
    running = wait_for(lambda: actuator.status(wl), "RUNNING")
    assert running.submission_id == sid and not running.finished

    (job,) = jobs_of(ray_head, wl.id)
    assert job["submission_id"] == sid and job["entrypoint"] == SLEEP.entrypoint
    assert job["metadata"] == {"owner": "alice", "gpuq.workload": wl.id, "gpuq.queue": "research.nlp",
                               "gpuq.attempt": "0"}
    posts = [body for method, path, body in recording.sent if method == "POST"]
    assert posts == [{"entrypoint": SLEEP.entrypoint, "submission_id": sid, "metadata": job["metadata"],
                      "entrypoint_num_gpus": 1, "entrypoint_resources": {"accelerator_type:H100": 0.001}}]
    assert re.search(r"CVD=\d+\n", driver_log(ray_head, sid))   # Ray gave the driver its one GPU

    again = actuator.admit(wl, SLEEP, H100)                 # idempotent: no second job
    assert again.ok and again.detail == {"submission_id": sid, "submitted": False, "finished": False}
    fresh = RayActuator(Settings(), dashboard=ray_head.dashboard_url)   # no cache: finds it by probing
    try:
        assert fresh.admit(wl, SLEEP, H100).detail["submitted"] is False
    finally:
        fresh.close()
    assert len(jobs_of(ray_head, wl.id)) == 1

    stop = actuator.preempt(wl, SLEEP, "queue research.cv below its guarantee")
    assert stop.ok and stop.detail["stopped"], stop.message
    assert wait_for(lambda: actuator.status(wl), "STOPPED").finished
    twice = actuator.preempt(wl, SLEEP, "again")
    assert twice.ok and twice.detail["stopped"] is False and "already stopped" in twice.message

    readmit = actuator.admit(wl, SLEEP, H100)               # the next admission is a new attempt
    assert readmit.ok and readmit.detail["submission_id"] == submission_id(wl.id, 1)
    assert actuator.cancel(wl, SLEEP).ok
    assert wait_for(lambda: actuator.status(wl), "STOPPED").attempt == 1
    assert sorted(j["submission_id"] for j in jobs_of(ray_head, wl.id)) == [sid, submission_id(wl.id, 1)]


class _RacingTransport(httpx.HTTPTransport):
    """Submits the same job itself just before the actuator's POST (a concurrent admission)."""

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if request.method == "POST" and request.url.path == "/api/jobs/":
            with httpx.Client(base_url=f"{request.url.scheme}://{request.url.netloc.decode()}") as other:
                assert other.post("/api/jobs/", content=request.content,
                                  headers={"content-type": "application/json"}, timeout=30).status_code == 200
        return super().handle_request(request)


@pytest.mark.ray
def test_a_refused_duplicate_submission_is_ok(ray_head: RayHead) -> None:
    wl = Workload(f"test/{uuid.uuid4().hex[:8]}", "q", pods=1, gpus_per_pod=0)
    act = RayActuator(Settings(), dashboard=ray_head.dashboard_url, transport=_RacingTransport(),
                      attempts=8, backoff_s=0.5, pin_accelerator_type=False)
    try:
        res = act.admit(wl, SLEEP, H100)
        assert res.ok and res.detail["submitted"] is False and "already submitted" in res.message, res.message
        (job,) = jobs_of(ray_head, wl.id)
        assert job["submission_id"] == submission_id(wl.id, 0)
        assert "CVD=None" in driver_log(ray_head, job["submission_id"])   # a GPU-less driver holds none
        assert act.cancel(wl, SLEEP).ok
    finally:
        act.close()


def test_unreachable_dashboard_is_retryable_and_named() -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    act = RayActuator(Settings(), dashboard=url, attempts=2, sleep=lambda _s: None, timeout_s=2)
    try:
        wl = Workload("test/x", "q")
        for res in (act.admit(wl, SLEEP, H100), act.preempt(wl, SLEEP, "r")):
            assert not res.ok and res.retryable
            assert f"cannot reach the Ray dashboard at {url}" in res.message
            assert "after 2 attempts" in res.message
    finally:
        act.close()


def test_only_submissions_are_admitted_and_a_dashboard_is_required() -> None:
    act = RayActuator(Settings(), dashboard="http://127.0.0.1:1")
    try:
        res = act.admit(Workload("w", "q"), Target("RayJob", "ns", "n"), H100)
        assert not res.ok and not res.retryable and "only RaySubmission" in res.message
    finally:
        act.close()
    with pytest.raises(ConfigError, match="dashboard_url"):
        RayActuator(Settings())


@pytest.mark.parametrize("wid", ["rayjob/team-a/train", "a b/c:d", "x" * 200], ids=["path", "odd", "long"])
def test_submission_ids_are_deterministic_and_safe(wid: str) -> None:
    sid = submission_id(wid, 3)
    assert sid == submission_id(wid, 3) != submission_id(wid, 4) and sid.endswith("-a3")
    assert len(sid) < 70 and all(c.isalnum() or c in "-_" for c in sid)
    assert submission_id(wid + "!", 3) != sid
