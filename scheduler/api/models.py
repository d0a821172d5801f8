"""Request bodies of the operator API (responses are the service's frozen views, see
:mod:`scheduler.service_views`). Bodies are strict: unknown fields, wrong types and out-of-range
numbers are answered 422 naming the field."""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from scheduler.actuators.base import Target
from scheduler.model import Workload

WorkloadId = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,252}$")]


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class TargetIn(_Body):
    """What the workload is in the world (see ``scheduler.actuators.base.Target``)."""

    kind: Literal["", "RayJob", "RayCluster", "Pod", "RaySubmission"] = ""
    namespace: str = ""
    name: str = ""
    api_version: str = ""
    entrypoint: str = ""
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)

    def to_target(self) -> Target:
        return Target(self.kind, self.namespace, self.name, self.api_version, self.entrypoint,
                      dict(self.runtime_env), dict(self.metadata))


class WorkloadIn(_Body):
    """A gang: ``pods`` pods of ``gpus_per_pod`` GPUs, all of one type from ``gpu_types`` (in order
    of preference; empty: any type). ``duration`` (seconds of running time) makes the scheduler
    finish it by itself; without it the workload runs until the world says it ended."""

    id: WorkloadId
    queue: Annotated[str, StringConstraints(min_length=1)]
    pods: int = Field(1, ge=1, le=100_000)
    gpus_per_pod: int = Field(1, ge=1, le=1024)
    gpu_types: list[Annotated[str, StringConstraints(min_length=1)]] = Field(default_factory=list)
    priority: int = Field(0, ge=-(2**31), le=2**31 - 1)
    preemptible: bool = True
    duration: float | None = Field(None, gt=0)
    checkpoint: bool = False
    originator: bool = False
    target: TargetIn = Field(default_factory=TargetIn)

    def to_workload(self, now_s: float) -> Workload:
        return Workload(self.id, self.queue, pods=self.pods, gpus_per_pod=self.gpus_per_pod,
                        gpu_types=tuple(self.gpu_types), priority=self.priority, preemptible=self.preemptible,
                        submit_s=now_s, duration_s=self.duration or 0.0, checkpoint=self.checkpoint,
                        originator=self.originator)


class DryRunIn(WorkloadIn):
    id: WorkloadId = "dry-run"


class ReloadOut(BaseModel):
    result: Literal["loaded", "unchanged", "rejected", "static"]
    error: str | None = None
    queues: list[str]
