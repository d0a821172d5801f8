"""The API's answers with their messages written for people: the scheduler's core puts instants
into reasons as ``t=<seconds>`` (the simulator's ``events.jsonl`` keeps them so); here, at the
edge, every such instant becomes an ISO time (:func:`gpuq.timefmt.readable`). Numbers meant for
programs (``submit_s``, ``t``, ...) stay numbers."""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from gpuq.timefmt import readable
from scheduler.service.views import DryRun, PreemptionRecord, WorkloadView


def workload(v: WorkloadView) -> WorkloadView:
    a = v.advice
    if a is not None:
        a = replace(a, summary=readable(a.summary) or "", message=readable(a.message))
    return replace(v, message=readable(v.message), actuator_message=readable(v.actuator_message) or "", advice=a)


def workloads(vs: list[WorkloadView]) -> list[WorkloadView]:
    return [workload(v) for v in vs]


def dry_run(d: DryRun) -> DryRun:
    after = dry_run(d.after_delay) if d.after_delay is not None else None
    return replace(d, message=readable(d.message), after_delay=after)


def preemptions(rs: list[PreemptionRecord]) -> list[PreemptionRecord]:
    return [replace(r, reason=readable(r.reason) or "") for r in rs]


def events(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{**r, "reason": readable(r.get("reason")) or ""} for r in rows]
