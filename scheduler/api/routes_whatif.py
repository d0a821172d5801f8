"""``POST /admin/whatif`` and ``GET /admin/whatif/{id}`` (admin): ``gpuq whatif`` over the API, for
the dashboard's scheduler page (docs/WHATIF.md, docs/API.md).

The route reads the history from the store and checks the change here (a bad field is a 422 naming
it, as ``gpuq whatif`` names the argument); the two replays run in a process of their own
(:class:`scheduler.whatif.Jobs`), one at a time, so a long replay never holds the API. The answer
is the job (202); the report comes with ``GET /admin/whatif/{id}`` once it is done.
"""
# no "from __future__ import annotations": FastAPI must see the route annotations (local aliases)
import logging
from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Response
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from scheduler.api.auth import Auth, Caller
from scheduler.api.problems import Problem, invalid
from scheduler.errors import ScenarioError, WhatifError

log = logging.getLogger(__name__)

# which body field a WhatifError's argument is
_FIELDS = {"--from": "body.from", "--from/--to": "body.from", "--to": "body.to", "--add-nodes": "body.add_nodes",
           "--remove-nodes": "body.remove_nodes", "--queues": "body.queues", "queues": "body.queues"}
Name = Annotated[str, StringConstraints(min_length=1, max_length=253)]


class WhatifIn(BaseModel):
    """The window (``from``, ``to``: ISO 8601, ``now`` or ``-7d``) and the change: a queue file's
    text (``queues``), nodes to add (``TYPE:GPUSxCOUNT``) and to remove (their names)."""

    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)

    start: str = Field("-7d", alias="from", max_length=64)
    end: str = Field("now", alias="to", max_length=64)
    queues: str | None = Field(None, max_length=1_000_000)
    add_nodes: list[Annotated[str, StringConstraints(min_length=1, max_length=100)]] = Field(default_factory=list,
                                                                                             max_length=64)
    remove_nodes: list[Name] = Field(default_factory=list, max_length=10_000)


def whatif_router(auth: Auth, service: Any, accounting: Any, settings: Any, clock: Callable[[], float],
                  jobs: Any) -> APIRouter:
    admin = Annotated[Caller, Depends(auth.require("admin"))]
    router = APIRouter(tags=["admin"])

    @router.post("/admin/whatif", status_code=202, summary="Replay the history of a window as it happened and "
                 "under a change (queues, added or removed nodes) in a process of its own; the report comes "
                 "with GET /admin/whatif/{id}", responses={409: {}, 422: {}, 503: {}})
    def start(body: WhatifIn, caller: admin, response: Response) -> Any:
        from scheduler import whatif as wi

        if accounting is None:
            raise Problem(503, "the accounting (and its store) is not configured in this process")
        now = clock()
        try:
            jobs.check_free(now)
        except wi.WhatifBusy as exc:
            raise Problem(409, str(exc)) from exc
        try:
            t0, t1 = wi.window(body.start, body.end, now)
            change = wi.Change(wi.queue_text(body.queues) if body.queues is not None else None,
                               "the queues given" if body.queues is not None else "",
                               tuple(wi.parse_add_nodes(a) for a in body.add_nodes), tuple(body.remove_nodes))
            base = wi.base_queues(settings)
            sched = wi.scheduler_settings(settings)
            h = wi.read(settings, accounting.store, service.cluster_name, t0, t1)
            scenario, _ = wi.scenario_of(h, base, sched)          # what the replay process would refuse: here
            wi.apply_change(scenario, change)
        except WhatifError as exc:
            field = _FIELDS.get(exc.argument)
            if field is None:
                raise Problem(409, str(exc)) from exc
            raise invalid(field, exc.reason) from exc
        except ScenarioError as exc:
            raise Problem(409, f"the configured nodes file: {exc}") from exc
        try:
            job = jobs.start(wi.job_input(h, base, sched, change), caller.actor, now, change.describe())
        except wi.WhatifBusy as exc:
            raise Problem(409, str(exc)) from exc
        log.info("%s started what-if %s over %s..%s: %s", caller.actor, job.id, body.start, body.end, change.describe())
        response.headers["Location"] = f"/admin/whatif/{job.id}"
        return job.view()

    @router.get("/admin/whatif/{job_id}", summary="A what-if replay: running, done (with its report: per queue, "
                "before and after) or failed (why)", responses={404: {}})
    def get(job_id: str, _: admin) -> Any:
        job = jobs.get(job_id, clock())
        if job is None:
            raise Problem(404, f"no what-if {job_id!r} (the last ones are kept, and only until a restart)")
        return job.view()

    return router
