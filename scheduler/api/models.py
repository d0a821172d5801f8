"""Request bodies of the operator API (responses are the service's frozen views, see
:mod:`scheduler.service.views`). Bodies are strict: unknown fields, wrong types and out-of-range
numbers are answered 422 naming the field."""
from __future__ import annotations

import json
import math
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, StrictInt, StringConstraints, model_validator

from scheduler.actuators.base import Target
from scheduler.api.problems import FieldError
from scheduler.model import SOURCE_ID_PREFIXES, Workload, share_of_gpus

WorkloadId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,252}$")]
# Kubernetes names: a namespace is a DNS-1123 label, an object name a DNS-1123 subdomain
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
KUBERNETES_KINDS = ("RayJob", "RayCluster", "Pod")
MAX_DURATION_S = 10 * 366 * 86400.0     # ten years of running time


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TargetIn(_Body):
    """What the workload is in the world (see ``scheduler.actuators.base.Target``)."""

    kind: Literal["", "RayJob", "RayCluster", "Pod", "RaySubmission"] = ""
    namespace: Annotated[str, StringConstraints(max_length=63)] = ""
    name: Annotated[str, StringConstraints(max_length=253)] = ""
    api_version: Annotated[str, StringConstraints(max_length=253)] = ""
    entrypoint: Annotated[str, StringConstraints(max_length=16_384)] = ""
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[Annotated[str, StringConstraints(max_length=253)], str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _names(self) -> "TargetIn":
        """A Kubernetes target needs a valid namespace and name (never empty); a Ray submission is
        not a Kubernetes object and has no namespace; a target-less workload's names, where given,
        follow the Kubernetes rules too (the accounting matches pods by them)."""
        _plain_json(self.runtime_env, "runtime_env", 0)
        if self.kind in KUBERNETES_KINDS:
            if not self.namespace:
                raise FieldError("namespace", f"a {self.kind} target needs its namespace")
            if not self.name:
                raise FieldError("name", f"a {self.kind} target needs its name")
        if self.kind == "RaySubmission" and self.namespace:
            raise FieldError("namespace", "a RaySubmission is not a Kubernetes object: leave namespace empty")
        if self.namespace and not DNS1123_LABEL.match(self.namespace):
            raise FieldError("namespace", "not a Kubernetes namespace name (DNS-1123 label: lower case "
                                            "letters, digits and '-', at most 63)")
        if self.name and self.kind != "RaySubmission" and not DNS1123_SUBDOMAIN.match(self.name):
            raise FieldError("name", "not a Kubernetes object name (DNS-1123 subdomain: lower case letters, "
                                       "digits, '-' and '.', at most 253)")
        return self

    def to_target(self) -> Target:
        return Target(self.kind, self.namespace, self.name, self.api_version, self.entrypoint,
                      dict(self.runtime_env), dict(self.metadata))


class CheckpointIn(_Body):
    """A workload's last checkpoint (issue 21): an RFC 3339 time with its offset, or Unix seconds.
    A preemption after it throws away only the work since then (``lost_gpu_seconds``)."""

    last_checkpoint: Annotated[str, StringConstraints(min_length=1, max_length=64)] | StrictFloat | StrictInt

    @model_validator(mode="after")
    def _readable(self) -> CheckpointIn:
        from scheduler.actuators.k8s_workloads import checkpoint_seconds

        try:
            checkpoint_seconds(self.last_checkpoint)
        except ValueError as exc:
            raise FieldError("last_checkpoint", str(exc)) from None
        return self

    def seconds(self) -> float:
        from scheduler.actuators.k8s_workloads import checkpoint_seconds

        return checkpoint_seconds(self.last_checkpoint)


class WorkloadIn(_Body):
    """A gang: ``pods`` pods of ``gpus_per_pod`` GPUs, all of one type from ``gpu_types`` (in order
    of preference; empty: any type). ``duration`` (seconds of running time) makes the scheduler
    finish it by itself; without it the workload runs until the world says it ended.
    ``expected_duration`` (seconds) is how long its submitter expects it to run: it changes no
    decision, only the start-time forecasts (its own and of the work behind it).
    ``gpus_per_pod`` below 1 is a share of one GPU in thousandths (``0.5``; issue 19): each pod
    takes its share on one device; 1 and above must be whole."""

    id: WorkloadId
    queue: Annotated[str, StringConstraints(min_length=1, max_length=253)]
    pods: int = Field(1, ge=1, le=100_000)
    gpus_per_pod: StrictFloat = Field(1, gt=0, le=1024, allow_inf_nan=False)
    gpu_types: list[Annotated[str, StringConstraints(min_length=1, max_length=64)]] = Field(default_factory=list,
                                                                                           max_length=32)
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1)
    preemptible: bool = True
    duration: float | None = Field(None, gt=0, le=MAX_DURATION_S, allow_inf_nan=False)
    expected_duration: float | None = Field(None, gt=0, le=MAX_DURATION_S, allow_inf_nan=False)
    checkpoint: bool = False
    originator: bool = False
    target: TargetIn = Field(default_factory=TargetIn)

    @model_validator(mode="after")
    def _whole_or_a_share(self) -> "WorkloadIn":
        if share_of_gpus(self.gpus_per_pod) is None:
            raise FieldError("gpus_per_pod", "a whole number of GPUs, or a share of one GPU below 1 in "
                                             f"thousandths (0.5), not {self.gpus_per_pod}")
        return self

    @model_validator(mode="after")
    def _not_a_source_id(self) -> "WorkloadIn":
        if self.id.lower().startswith(SOURCE_ID_PREFIXES):
            raise FieldError("id", f"ids starting with {' or '.join(SOURCE_ID_PREFIXES)} are the Kubernetes "
                                   "source's (the objects it finds): choose another id")
        return self

    def to_workload(self, now_s: float) -> Workload:
        per_pod = share_of_gpus(self.gpus_per_pod)
        assert per_pod is not None            # _whole_or_a_share
        return Workload(self.id, self.queue, pods=self.pods, gpus_per_pod=per_pod,
                        gpu_types=tuple(self.gpu_types), priority=self.priority, preemptible=self.preemptible,
                        submit_s=now_s, duration_s=self.duration or 0.0, checkpoint=self.checkpoint,
                        originator=self.originator, expected_duration_s=self.expected_duration)


class DryRunIn(WorkloadIn):
    id: WorkloadId = "dry-run"


class ReloadOut(BaseModel):
    result: Literal["loaded", "unchanged", "rejected", "static"]
    error: str | None = None
    queues: list[str]


def check_spec_size(workload: Workload, target: Target, limit: int) -> None:
    """422 when the workload's spec as stored (``scheduler_events.spec``, replayed at every start)
    is over ``limit`` bytes, naming its largest field."""
    from scheduler.api.problems import invalid
    from scheduler.events import spec_json

    size = len(spec_json(workload, target).encode())
    if size <= limit:
        return
    parts = {"body.target.runtime_env": target.runtime_env, "body.target.metadata": target.metadata,
             "body.target.entrypoint": target.entrypoint, "body.gpu_types": list(workload.gpu_types)}
    field = max(parts, key=lambda k: len(json.dumps(parts[k], separators=(",", ":"))))
    raise invalid(field, f"the workload's spec is {size} bytes; at most {limit} (api.max_spec_bytes)")


def _plain_json(value: Any, field: str, depth: int) -> None:
    """Finite numbers, nested at most 32 deep: what JSON without extensions can carry on."""
    if depth > 32:
        raise FieldError(field, "nested more than 32 deep")
    if isinstance(value, float) and not math.isfinite(value):
        raise FieldError(field, "numbers must be finite (no Infinity or NaN)")
    if isinstance(value, dict):
        for v in value.values():
            _plain_json(v, field, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _plain_json(v, field, depth + 1)
