"""The brakes over the API: ``POST /admin/pause`` and ``POST /admin/resume`` (admin) stop and
restart all acting (the cycle still decides and shows each decision as a ``paused`` reason);
``GET /scheduler/status`` (viewer) says whether acting is paused, by whom and why, what is in
flight, and the preemption brake's limits and counts (:meth:`SchedulerService.status`).
"""
# no "from __future__ import annotations": FastAPI must see the route annotations (local aliases)
import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends
from pydantic import BaseModel, ConfigDict, StringConstraints

from scheduler.api.auth import Auth, Caller

log = logging.getLogger(__name__)


class PauseIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    reason: Annotated[str, StringConstraints(max_length=500)] = ""


def acting_router(auth: Auth, service: Any, clock: Callable[[], float]) -> APIRouter:
    viewer = Annotated[Caller, Depends(auth.require("viewer"))]
    admin = Annotated[Caller, Depends(auth.require("admin"))]
    router = APIRouter()

    @router.get("/scheduler/status", tags=["scheduler"],
                summary="Acting paused or not (by whom, why), actions in flight, the preemption brake")
    def status(_: viewer) -> Any:
        return service.status(clock())

    @router.post("/admin/pause", tags=["admin"], summary="Stop all acting until /admin/resume (decisions go on, "
                 "shown as 'paused' reasons); recorded, so a restart stays paused")
    def pause(caller: admin, body: Annotated[PauseIn | None, Body()] = None) -> Any:
        now = clock()
        service.pause(now, by=caller.actor, reason=body.reason if body else "")
        log.warning("%s paused acting: %s", caller.actor, (body.reason if body else "") or "no reason given")
        return service.status(now)

    @router.post("/admin/resume", tags=["admin"], summary="Act again from the next cycle")
    def resume(caller: admin) -> Any:
        now = clock()
        service.resume(now, by=caller.actor)
        return service.status(now)

    return router
