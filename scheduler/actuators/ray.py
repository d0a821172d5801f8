"""The ``ray`` actuator: start and stop gpuq's own Ray jobs with the Job Submission REST API.

A workload submitted to gpuq with ``Target(kind="RaySubmission", entrypoint=..., runtime_env=...,
metadata=...)`` becomes one Ray job per admission:

* **admit**: ``POST {dashboard}/api/jobs/`` with ``{"entrypoint", "submission_id", "runtime_env",
  "metadata", "entrypoint_num_gpus", "entrypoint_resources"}``. The submission id is deterministic,
  ``gpuq-<slug of the workload id>-<8 hex of its sha256>-a<N>``, N counting the workload's
  admissions: the actuator finds the latest existing attempt by ``GET /api/jobs/<id>`` from the
  last one it knew (cached per workload; after a restart it probes from 0). If that attempt is
  PENDING or RUNNING the workload is already admitted: ok, nothing is sent; if it SUCCEEDED, ok
  with ``detail["finished"]``; otherwise (STOPPED after a preemption, FAILED) the next N is
  submitted. A refused submission whose id then reads back from ``GET /api/jobs/<id>`` (Ray
  refuses a duplicate id: a retried POST that had gone through, a concurrent admit) is ok.
  GPUs: a one-pod workload's GPUs are reserved for the entrypoint itself
  (``entrypoint_num_gpus`` = ``gpus_per_pod``), and when the placement names a GPU type the
  driver is pinned to a node of that type with ``entrypoint_resources``
  ``{"accelerator_type:<TYPE>": 0.001}`` (Ray's accelerator resource; ``accelerator_resources``
  maps gpuq type names to other resource names, ``pin_accelerator_type=False`` turns it off), and
  to the placement's node with ``entrypoint_label_selector`` ``{"ray.io/node-id": <its full id>}``
  (read from the State API's alive nodes; Ray 2.60's Job API), so the GPUs are held where gpuq
  counts them.
  A multi-pod gang is held in a Ray placement group named ``gpuq-<workload id>``
  (:func:`gpuq.ray_names.placement_group_name`): one bundle per pod, ``{"GPU": gpus_per_pod}``
  plus ``{"CPU": cpu_millicores_per_pod / 1000}`` when the workload asks for CPU and the
  accelerator resource (0.001) when pinning, bundle ``i`` pinned to the node the placement chose
  for it (``Placement.nodes`` in order, ``gpus // gpus_per_pod`` bundles per node), strategy PACK
  (the workload model has no spread preference; with every bundle pinned to its node the strategy
  only matters where Ray would otherwise choose). The job's entrypoint becomes the wrapper
  :mod:`scheduler.actuators.ray_gang` around the user's: it creates the group as the job's
  driver, waits until it is placed, runs the user's entrypoint with ``GPUQ_PLACEMENT_GROUP``,
  ``GPUQ_PLACEMENT_GROUP_ID`` and ``GPUQ_PLACEMENT_GROUP_NAMESPACE`` set, and the group dies with
  the job (stopped, failed or finished). The driver itself reserves nothing.
  Metadata: the target's metadata plus ``gpuq.workload``, ``gpuq.queue``, ``gpuq.attempt`` (and
  ``gpuq.placement_group`` for a gang).
* **preempt** / **cancel**: ``POST {dashboard}/api/jobs/<id>/stop`` on the latest attempt; a
  workload never submitted, a job already finished, or one Ray does not know (404) is ok. Stopping
  is asynchronous: the job reaches STOPPED shortly after. Cancel and preempt send the same
  request; the difference (requeue or not) is the service's.
* :meth:`RayActuator.status` reads the latest attempt's status (None when never submitted), for
  the service to learn that a job finished.

Every call goes through :func:`with_retries` (httpx, sync, with timeouts): connection errors,
timeouts and 5xx are retried; 4xx are not. With a ``fence`` (leader election), every attempt and
every POST (submit, stop) asks it right before it is sent; a replica that no longer holds the Lease
sends nothing more (:func:`~scheduler.actuators.base.fenced`). Reads are not fenced.
"""
from __future__ import annotations

import hashlib
import json
import re
import shlex
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from gpuq.errors import ConfigError
from gpuq.ray_names import placement_group_name
from gpuq.settings import Settings
from scheduler.actuators.base import ActionResult, Fence, Target, fenced, may_act, with_retries
from scheduler.errors import SchedulerError
from scheduler.model import Placement, Workload

TERMINAL = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
ACTIVE = frozenset({"PENDING", "RUNNING"})
_SLUG = re.compile(r"[^A-Za-z0-9_-]+")


class RayJobError(SchedulerError):
    """Reading a job's status failed; ``url`` names the request, ``retryable`` whether to retry."""

    def __init__(self, url: str, message: str, retryable: bool) -> None:
        self.url = url
        self.retryable = retryable
        super().__init__(f"ray: GET {url} failed: {message}")


@dataclass(frozen=True, slots=True)
class RayJobState:
    submission_id: str
    attempt: int
    status: str                      # PENDING | RUNNING | STOPPED | SUCCEEDED | FAILED
    message: str = ""

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


def submission_id(workload_id: str, attempt: int) -> str:
    """Deterministic and Ray-safe: ``gpuq-<slug>-<sha256[:8]>-a<attempt>``."""
    slug = _SLUG.sub("-", workload_id).strip("-")[:40] or "w"
    digest = hashlib.sha256(workload_id.encode()).hexdigest()[:8]
    return f"gpuq-{slug}-{digest}-a{attempt}"


def dashboard_url(settings: Settings) -> str:
    for target in settings.collector.ray:
        if target.dashboard_url:
            return target.dashboard_url
    raise ConfigError("collector.ray[*].dashboard_url", "the ray actuator needs a Ray dashboard URL")


NODE_ID_LABEL = "ray.io/node-id"            # Ray's built-in label of each node: its full id


class _Failed(Exception):
    def __init__(self, result: ActionResult) -> None:
        super().__init__(result.message)
        self.result = result


class RayActuator:
    """Starts RaySubmission workloads as Ray jobs; see the module docstring for the requests."""

    name = "ray"

    def __init__(self, settings: Settings, *, dashboard: str | None = None, timeout_s: float = 10.0,
                 attempts: int = 4, backoff_s: float = 0.2, sleep: Callable[[float], None] = time.sleep,
                 headers: Mapping[str, str] | None = None, pin_accelerator_type: bool = True,
                 accelerator_resources: Mapping[str, str] | None = None,
                 transport: httpx.BaseTransport | None = None, python: str = "python",
                 placement_namespace: str = "gpuq", placement_timeout_s: float = 60.0,
                 fence: Fence | None = None) -> None:
        self.url = (dashboard or dashboard_url(settings)).rstrip("/")
        self.fence = fence                         # asked before each attempt and each POST
        self._http = httpx.Client(base_url=self.url, timeout=httpx.Timeout(timeout_s),
                                  headers=dict(headers or {}), transport=transport)
        self.attempts, self.backoff_s, self._sleep = attempts, backoff_s, sleep
        self.pin_accelerator_type = pin_accelerator_type
        self.accelerator_resources = dict(accelerator_resources or {})
        self._latest: dict[str, int] = {}          # workload id -> latest attempt known to exist
        self.python = python                       # runs the gang wrapper on the Ray node
        self.placement_namespace, self.placement_timeout_s = placement_namespace, placement_timeout_s

    def close(self) -> None:
        self._http.close()

    # -- the protocol ---------------------------------------------------------------------------
    def admit(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        if target.kind != "RaySubmission" or not target.entrypoint:
            return ActionResult(False, f"ray: cannot admit {workload.id}: only RaySubmission targets with an "
                                       f"entrypoint are started (got {target.kind or 'none'})")
        return self._retry(lambda: self._admit_once(workload, target, placement))

    def preempt(self, workload: Workload, target: Target, reason: str) -> ActionResult:
        return self._retry(lambda: self._stop_once(workload))

    def cancel(self, workload: Workload, target: Target) -> ActionResult:
        return self._retry(lambda: self._stop_once(workload))

    def status(self, workload: Workload) -> RayJobState | None:
        """The latest attempt's state, None when never submitted; RayJobError when unreadable."""
        try:
            return self._find(workload.id)
        except _Failed as failed:
            raise RayJobError(str(failed.result.detail.get("url", self.url)), failed.result.message,
                              failed.result.retryable) from None

    # -- one attempt each ---------------------------------------------------------------------------
    def _admit_once(self, workload: Workload, target: Target, placement: Placement) -> ActionResult:
        try:
            latest = self._find(workload.id)
            if latest is not None and (latest.status in ACTIVE or latest.status == "SUCCEEDED"):
                return ActionResult(True, f"ray: {workload.id} already {latest.status.lower()} as "
                                          f"{latest.submission_id}",
                                    detail={"submission_id": latest.submission_id, "submitted": False,
                                            "finished": latest.finished})
            attempt = 0 if latest is None else latest.attempt + 1
            sid = submission_id(workload.id, attempt)
            body = self._submission(workload, target, placement, sid, attempt)
            resp = self._call("POST", "/api/jobs/", json=body)
        except _Failed as failed:
            return failed.result
        detail: dict[str, Any] = {"submission_id": sid, "submitted": True, "url": f"{self.url}/api/jobs/"}
        if "gpuq.placement_group" in body["metadata"]:
            detail["placement_group"] = body["metadata"]["gpuq.placement_group"]
        if resp.status_code == 200:
            self._latest[workload.id] = attempt
            return ActionResult(True, f"ray: submitted {workload.id} as {sid}", detail=detail)
        failure = self._http_failure("POST", "/api/jobs/", resp)
        try:                        # Ray refuses a duplicate submission_id: is the job there?
            there = self._call("GET", f"/api/jobs/{sid}").status_code == 200
        except _Failed:
            there = False
        if there:
            self._latest[workload.id] = attempt
            return ActionResult(True, f"ray: {workload.id} was already submitted as {sid}",
                                detail={**detail, "submitted": False})
        return failure

    def _submission(self, workload: Workload, target: Target, placement: Placement, sid: str,
                    attempt: int) -> dict[str, Any]:
        meta = {str(k): str(v) for k, v in target.metadata.items()}
        meta.update({"gpuq.workload": workload.id, "gpuq.queue": workload.queue,
                     "gpuq.attempt": str(attempt)})
        body: dict[str, Any] = {"entrypoint": target.entrypoint, "submission_id": sid, "metadata": meta}
        if target.runtime_env:
            body["runtime_env"] = dict(target.runtime_env)
        if workload.pods > 1 and workload.gpus_per_pod > 0:
            meta["gpuq.placement_group"] = placement_group_name(workload.id)
            body["entrypoint"] = self.gang_entrypoint(workload, target, placement)
            return body
        if workload.pods == 1 and workload.gpus_per_pod > 0:
            body["entrypoint_num_gpus"] = float(workload.gpus_per_pod)   # a share too: 0.5 (issue 19)
            if (node := self._node_id(placement)) is not None:
                body["entrypoint_label_selector"] = {NODE_ID_LABEL: node}
        if (accel := self._accelerator(placement)) is not None:
            body["entrypoint_resources"] = {accel: 0.001}
        return body

    def _node_id(self, placement: Placement) -> str | None:
        """The full Ray node id of a one-node placement (gpuq names a Ray node by its id's first 12
        hex digits, :func:`gpuq.ray_names.ray_node_name`), among the alive nodes of the State API;
        ``None`` when it names no single alive node or the nodes cannot be read (then the entrypoint
        is pinned by type only, as before). Without it Ray put a one-pod workload's entrypoint on any
        node of the type: the GPUs were held on another node than the one gpuq counted busy, and
        billed twice (there by the collector, here by the admission)."""
        if len(placement.nodes) != 1:
            return None
        name = placement.nodes[0][0].lower()
        try:
            resp = self._call("GET", "/api/v0/nodes?limit=10000&detail=false")
            rows = resp.json()["data"]["result"]["result"]
            alive = [str(n["node_id"]) for n in rows if n.get("state") == "ALIVE"]
        except (_Failed, ValueError, KeyError, TypeError):
            return None
        hits = [n for n in alive if n.startswith(name)]
        return hits[0] if len(hits) == 1 else None

    def _accelerator(self, placement: Placement) -> str | None:
        if not (self.pin_accelerator_type and placement.gpu_type):
            return None
        return self.accelerator_resources.get(placement.gpu_type, f"accelerator_type:{placement.gpu_type}")

    def gang_bundles(self, workload: Workload, placement: Placement) -> tuple[list[dict[str, float]], list[str]]:
        """(bundles, node of each bundle): one bundle per pod, on the placement's nodes in order."""
        bundle: dict[str, float] = {"GPU": float(workload.gpus_per_pod)}
        if workload.cpu_millicores_per_pod > 0:
            bundle["CPU"] = workload.cpu_millicores_per_pod / 1000
        if (accel := self._accelerator(placement)) is not None:
            bundle[accel] = 0.001
        nodes = [node for node, gpus in placement.nodes for _ in range(int(gpus // workload.gpus_per_pod))]
        if len(nodes) != workload.pods:      # a placement that does not split into pods: let Ray choose
            nodes = []
        return [dict(bundle) for _ in range(workload.pods)], nodes

    def gang_entrypoint(self, workload: Workload, target: Target, placement: Placement) -> str:
        bundles, nodes = self.gang_bundles(workload, placement)
        args = [self.python, "-m", "scheduler.actuators.ray_gang",
                "--name", placement_group_name(workload.id), "--namespace", self.placement_namespace,
                "--bundles", json.dumps(bundles, separators=(",", ":")), "--strategy", "PACK",
                "--timeout-s", f"{self.placement_timeout_s:g}"]
        if nodes:
            args += ["--nodes", ",".join(nodes)]
        return " ".join(shlex.quote(a) for a in args) + " -- " + shlex.quote(target.entrypoint)

    def _stop_once(self, workload: Workload) -> ActionResult:
        try:
            latest = self._find(workload.id)
            if latest is None:
                return ActionResult(True, f"ray: {workload.id} was never submitted",
                                    detail={"stopped": False})
            sid = latest.submission_id
            if latest.finished:
                return ActionResult(True, f"ray: {sid} already {latest.status.lower()}",
                                    detail={"submission_id": sid, "stopped": False})
            resp = self._call("POST", f"/api/jobs/{sid}/stop")
        except _Failed as failed:
            return failed.result
        if resp.status_code == 404:
            return ActionResult(True, f"ray: {sid} is gone", detail={"submission_id": sid, "stopped": False})
        if resp.status_code != 200:
            return self._http_failure("POST", f"/api/jobs/{sid}/stop", resp)
        stopped = bool(_json(resp).get("stopped"))
        return ActionResult(True, f"ray: stopped {sid}" if stopped else f"ray: {sid} had already ended",
                            detail={"submission_id": sid, "stopped": stopped})

    # -- I/O ----------------------------------------------------------------------------------------
    def _find(self, workload_id: str) -> RayJobState | None:
        """The latest existing attempt (GETs from the last known one until a 404)."""
        start = self._latest.get(workload_id, 0)
        attempt, found = start, None
        while True:
            sid = submission_id(workload_id, attempt)
            resp = self._call("GET", f"/api/jobs/{sid}")
            if resp.status_code == 404:
                break
            if resp.status_code != 200:
                raise _Failed(self._http_failure("GET", f"/api/jobs/{sid}", resp))
            info = _json(resp)
            found = RayJobState(sid, attempt, str(info.get("status") or ""), str(info.get("message") or ""))
            attempt += 1
        if found is not None:
            self._latest[workload_id] = found.attempt
        elif start:                                   # the jobs were deleted: probe from 0
            self._latest.pop(workload_id, None)
            return self._find(workload_id)
        return found

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        if method != "GET" and not may_act(self.fence):
            raise _Failed(fenced(f"ray: {method} {self.url}{path}"))
        try:
            return self._http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise _Failed(ActionResult(False, f"ray: {method} {self.url}{path} failed: cannot reach the Ray "
                                              f"dashboard at {self.url}: {exc!r}", True,
                                       {"url": f"{self.url}{path}"})) from exc

    def _http_failure(self, method: str, path: str, resp: httpx.Response) -> ActionResult:
        text = " ".join(resp.text.split())
        text = text if len(text) <= 300 else text[:150] + " ... " + text[-150:]
        return ActionResult(False, f"ray: {method} {self.url}{path} failed: HTTP {resp.status_code}: {text}",
                            resp.status_code >= 500 or resp.status_code in (408, 429),
                            {"url": f"{self.url}{path}", "status": resp.status_code})

    def _retry(self, call: Callable[[], ActionResult]) -> ActionResult:
        return with_retries(call, attempts=self.attempts, backoff_s=self.backoff_s, sleep=self._sleep,
                            fence=self.fence)


def _json(resp: httpx.Response) -> dict[str, Any]:
    try:
        body = resp.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}
