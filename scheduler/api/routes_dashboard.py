"""Routes the dashboards need beyond the operator API's: capacity and fragmentation, idle GPUs,
collector health, the scheduler's recent events. Viewer role, like the other reads; the answers
come from :mod:`scheduler.service.dashboard`.
"""
# no "from __future__ import annotations": FastAPI must see the route annotations (local aliases)
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query

from scheduler.api import readable
from scheduler.api.auth import Auth, Caller
from scheduler.api.problems import Problem
from scheduler.service.dashboard import EVENTS, capacity, collector_health, idle, scheduler_events

EventKind = Literal["submit", "admit", "preempt", "finish", "reject", "cancel"]


def dashboard_router(auth: Auth, service: Any, accounting: Any, settings: Any, clock: Callable[[], float],
                     window: Callable[[str, str, float], tuple[float, float]], registry: Any = None) -> APIRouter:
    viewer = Annotated[Caller, Depends(auth.require("viewer"))]
    router = APIRouter(tags=["dashboards"])
    stale_s = max(120.0, 4 * settings.collector.interval_s)

    def need() -> Any:
        if accounting is None:
            raise Problem(503, "the accounting is not configured in this process")
        return accounting

    @router.get("/accounting/capacity", summary="Capacity, allocated, idle and free GPUs per type and node; "
                "fragmentation; pending demand per type; starving queues")
    def get_capacity(_: viewer) -> Any:
        return capacity(need())

    @router.get("/accounting/idle", summary="GPUs idle now per workload (with idle since) and per node")
    def get_idle(_: viewer) -> Any:
        return idle(need(), clock())

    @router.get("/collector/health", summary="The newest row of each collector source per cluster "
                "(and node), and the scrape results per target when this process collects")
    def get_health(_: viewer) -> Any:
        return collector_health(need().store, clock(), stale_s, registry=registry)

    @router.get("/scheduler/events", summary="The scheduler's recorded decisions in a window, newest first, "
                "each with the workload's GPUs")
    def get_events(_: viewer, start: Annotated[str, Query(alias="from")] = "-1d",
                   end: Annotated[str, Query(alias="to")] = "now",
                   event: Annotated[list[EventKind] | None, Query()] = None,
                   limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> Any:
        t0, t1 = window(start, end, clock())
        rows = scheduler_events(need().store, service.cluster_name, t0, t1, event or EVENTS, limit)
        return readable.events(rows)

    return router
