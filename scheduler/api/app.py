"""The operator API: ``create_app(service, accounting, settings) -> FastAPI`` (OpenAPI at /docs).

Reads for viewers, mutations for operators, configuration for admins (:mod:`scheduler.api.auth`);
errors are problem JSON (:mod:`scheduler.api.problems`). Routes only translate: the scheduler's
answers come from :class:`scheduler.service.SchedulerService`, the accounting's from
:class:`scheduler.service.accounting.LiveAccounting`. ``/healthz``, ``/readyz``, ``/metrics``
and the OpenAPI pages are open (probes and Prometheus scrape them).
"""
# no "from __future__ import annotations": FastAPI must see the route annotations (local aliases)
import datetime as dt
import logging
import math
import re
import time
from collections.abc import Callable
from typing import Annotated, Any, Literal

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from accounting.errors import AccountingError, TimeSpecError
from accounting.queue_names import nearest
from accounting.timeparse import parse_time
from accounting.usage import check_by
from accounting.watcher import Reload
from gpuq.errors import GpuqError, shown
from scheduler.api import readable
from scheduler.api.auth import Auth, Caller, check_exposure
from scheduler.api.limits import Guard, RefusalLog
from scheduler.api.models import CheckpointIn, DryRunIn, ReloadOut, WorkloadIn, check_spec_size
from scheduler.api.problems import Problem, install, invalid, problem_response
from scheduler.api.routes_acting import acting_router
from scheduler.api.routes_dashboard import dashboard_router
from scheduler.api.routes_whatif import whatif_router
from scheduler.service import SchedulerService
from scheduler.service.errors import (
    ActuatorFailed,
    ConfigRejected,
    DuplicateWorkload,
    InvalidWorkload,
    QueueNotAllowed,
    NotActive,
    ServiceError,
    TakenWorkload,
    UnknownWorkload,
)
from scheduler.service.metrics import SchedulerCollector
from scheduler.service.tenant import tenant_page
from scheduler.service.views import DryRun, NodeView, PreemptionRecord, WorkloadView
from scheduler.whatif import Jobs

log = logging.getLogger(__name__)

_STATUS: dict[type[ServiceError], int] = {UnknownWorkload: 404, DuplicateWorkload: 409, TakenWorkload: 409,
                                          NotActive: 409, ConfigRejected: 409, ActuatorFailed: 502,
                                          InvalidWorkload: 422, QueueNotAllowed: 403}
# GET /queues pages by queue (each queue's rows, one per GPU type and "*", stay together): at 10,000
# queues of 4 GPU types the whole view is 10 MB in one answer (issue 17, benchmarks/bench_api_sizes.py)
QUEUE_PAGE = 1_000
MAX_QUEUE_PAGE = 10_000
_STEP = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}

DESCRIPTION = """Operator API of the gpuq scheduler and accounting.

Authenticate with `Authorization: Bearer TOKEN` (tokens and roles in `api.tokens`): **viewer**
reads, **operator** also submits, cancels and runs dry runs, **admin** also reloads the queue
configuration. Errors are RFC 9457 problem details (`application/problem+json`)."""


def create_app(service: SchedulerService, accounting: Any, settings: Any, *,
               clock: Callable[[], float] = time.time, registry: CollectorRegistry | None = None,
               leader: str | None = None, whatif_jobs: Jobs | None = None) -> FastAPI:
    """``leader``: this replica's identity when it was elected (``/healthz`` then says
    ``role: leader``; without election it says ``role: single``). ``accounting``: a :class:`~scheduler.service.accounting.LiveAccounting` (or None: the
    accounting endpoints answer 503). ``settings``: the gpuq settings (``api.tokens``,
    ``scheduler.cycle_interval_s``). ``clock`` gives the scheduler's ``now``. ``whatif_jobs``: where
    ``POST /admin/whatif`` runs its replays (default: a :class:`scheduler.whatif.Jobs` of its own)."""
    check_exposure(settings.api)              # ConfigError: no tokens on a non-loopback host
    auth = Auth(settings.api.tokens)
    registry = registry or CollectorRegistry()
    registry.register(SchedulerCollector(service))
    if accounting is not None:
        registry.register(accounting.collector)
    stale_s = max(10.0, 5 * settings.scheduler.cycle_interval_s)

    app = FastAPI(title="gpuq", version="0.1.0", description=DESCRIPTION)
    install(app)
    # auth from the headers and the size cap, before anything reads the body
    app.add_middleware(Guard, auth=auth, max_body_bytes=settings.api.max_body_bytes, routes=app.router.routes,
                       refusals=RefusalLog(registry), hosts=(settings.api.host, *settings.api.allowed_hosts))

    @app.exception_handler(ServiceError)
    async def _service_error(request: Request, exc: ServiceError) -> JSONResponse:
        status = next((s for cls, s in _STATUS.items() if isinstance(exc, cls)), 500)
        if isinstance(exc, InvalidWorkload):
            return problem_response(request, invalid(f"body.{exc.field}", exc.message))
        return problem_response(request, Problem(status, exc.message, slug=getattr(exc, "slug", None)))

    # the store's and the queue file's errors name hosts, databases and file contents: they go to
    # the log, the caller learns what failed, not the details
    @app.exception_handler(AccountingError)
    async def _accounting_error(request: Request, exc: AccountingError) -> JSONResponse:
        if isinstance(exc, TimeSpecError):
            return problem_response(request, Problem(422, str(exc)))
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        what = "the store did not answer" if getattr(exc, "retryable", False) else "the queue configuration is not usable"
        return problem_response(request, Problem(503, f"accounting: {what} (details in the server's log)"))

    @app.exception_handler(GpuqError)
    async def _store_error(request: Request, exc: GpuqError) -> JSONResponse:
        log.warning("%s %s: %s", request.method, request.url.path, exc)
        return problem_response(request, Problem(503, "store: unavailable or refused the query (details in the "
                                                      "server's log)"))

    viewer = Annotated[Caller, Depends(auth.require("viewer"))]
    # the reads that filter by the caller's queues: a queue-scoped viewer (a tenant) gets these only
    tenant = Annotated[Caller, Depends(auth.require("viewer", scoped=True))]
    operator = Annotated[Caller, Depends(auth.require("operator"))]
    admin = Annotated[Caller, Depends(auth.require("admin"))]

    def need_accounting() -> Any:
        if accounting is None:
            raise Problem(503, "the accounting is not configured in this process")
        return accounting

    # -- probes ------------------------------------------------------------------------------
    @app.get("/healthz", tags=["probes"], summary="The process is up, and its role (single, or leader "
             "of replicas elected on a Lease; a standby answers with role standby)")
    def healthz() -> dict[str, str]:
        if leader is None:
            return {"status": "ok", "role": "single"}
        return {"status": "ok", "role": "leader", "leader": leader}

    @app.get("/readyz", tags=["probes"], summary="Store reachable, configuration loaded, last cycle recent",
             responses={503: {"description": "not ready (problem JSON with the checks)"}})
    def readyz(request: Request) -> Any:
        # the checks and the queue file's error only for a valid token (any role): anonymous
        # probes get the status alone
        detailed = auth.from_header(request.headers.get("authorization")) is not None
        now = clock()
        last = service.stats.last_cycle_s
        checks = {
            "store": accounting is None or accounting.ping(),
            "config": accounting is None or accounting.config_loaded,
            "cycle": last is not None and now - last <= stale_s,
        }
        age = None if last is None else round(now - last, 3)
        error = getattr(accounting, "error", None)
        if all(checks.values()):
            if not detailed:
                return {"status": "ready"}
            return {"status": "ready", "checks": checks, "last_cycle_age_s": age, "config_error": error}
        if not detailed:
            return problem_response(request, Problem(503, "not ready"))
        failing = ", ".join(k for k, ok in checks.items() if not ok)
        return problem_response(request, Problem(503, f"not ready: {failing}", checks=checks,
                                                 last_cycle_age_s=age, config_error=error))

    @app.get("/metrics", tags=["probes"], summary="Prometheus metrics (scheduler and accounting)",
             response_class=Response)
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    # -- the scheduler -------------------------------------------------------------------------
    @app.get("/workloads", tags=["workloads"], response_model=list[WorkloadView],
             summary="Workloads, filtered by queue (and its subtree) and state; a page with limit and offset")
    def list_workloads(caller: tenant, queue: str | None = None,
                       state: Literal["pending", "running", "finished", "cancelled", "rejected"] | None = None,
                       limit: Annotated[int | None, Query(ge=1, le=100_000)] = None,
                       offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> Any:
        reads = caller.reads
        if reads is not None:                     # a tenant: its queues' workloads only
            if queue is not None:
                caller.check_read(queue)
            elif len(reads) == 1:
                queue = reads[0]
            else:
                mine = [v for v in service.workloads(None, state) if caller.may_read(v.queue)]
                return readable.workloads(mine[offset:None if limit is None else offset + limit])
        return readable.workloads(service.workloads(queue, state, limit, offset))

    @app.get("/workloads/{workload_id:path}", tags=["workloads"], response_model=WorkloadView,
             summary="One workload with its reason code, message and position", responses={404: {}})
    def get_workload(workload_id: str, caller: tenant) -> Any:
        view = service.explain(workload_id)
        if not caller.may_read(view.queue):       # a tenant learns nothing of others' workloads
            raise UnknownWorkload(workload_id)
        return readable.workload(view)

    @app.post("/workloads", tags=["workloads"], response_model=WorkloadView, status_code=201,
              summary="Submit a workload (422 also when its priority or non-preemptibility is over its "
                      "queue's policy or the token's bounds)", responses={403: {}, 409: {}, 422: {}})
    def submit(body: WorkloadIn, caller: operator, response: Response) -> Any:
        caller.check_target(body.queue, body.target.namespace)
        now = clock()
        workload, target = body.to_workload(now), body.target.to_target()
        caller.check_policy(service.config, workload)
        check_spec_size(workload, target, settings.api.max_spec_bytes)
        view = readable.workload(service.submit(workload, target, now, actor=caller.actor))
        response.headers["Location"] = f"/workloads/{view.id}"
        log.info("%s submitted %s to %s", caller.actor, view.id, view.queue)
        return view

    @app.post("/workloads/{workload_id:path}/checkpoint", tags=["workloads"], response_model=WorkloadView,
              summary="Report the workload's last checkpoint (RFC 3339 or Unix seconds): a preemption then "
                      "throws away only the work since it", responses={404: {}, 409: {}, 422: {}})
    def checkpoint(workload_id: str, body: CheckpointIn, caller: operator) -> Any:
        current = service.explain(workload_id)
        caller.check_target(current.queue, current.target.get("namespace", ""))
        return readable.workload(service.checkpoint(workload_id, body.seconds(), clock()))

    @app.delete("/workloads/{workload_id:path}", tags=["workloads"], response_model=WorkloadView,
                summary="Cancel a pending or running workload", responses={404: {}, 409: {}, 502: {}})
    def cancel(workload_id: str, caller: operator) -> Any:
        current = service.explain(workload_id)
        caller.check_target(current.queue, current.target.get("namespace", ""))
        view = readable.workload(service.cancel(workload_id, clock(), by=caller.actor))
        log.info("%s cancelled %s", caller.actor, workload_id)
        return view

    @app.post("/dry-run", tags=["workloads"], response_model=DryRun,
              summary="What the scheduler would do if this workload arrived now (nothing changes; the same "
                      "policy bounds as a submit)", responses={403: {}, 422: {}})
    def dry_run(body: DryRunIn, caller: operator) -> Any:
        now = clock()
        workload = body.to_workload(now)
        caller.check_policy(service.config, workload)
        return readable.dry_run(service.dry_run(workload, now, body.target.namespace))

    @app.get("/nodes", tags=["cluster"], response_model=list[NodeView], summary="Nodes and what the scheduler placed there")
    def nodes(_: viewer) -> Any:
        return service.nodes()

    @app.get("/preemptions", tags=["cluster"], response_model=list[PreemptionRecord],
             summary="Recent preemptions, newest first: preemptor, victims, why")
    def preemptions(_: viewer, limit: Annotated[int, Query(ge=1, le=10_000)] = 100) -> Any:
        return readable.preemptions(service.preemptions(limit))

    @app.get("/forecasts/accuracy", tags=["workloads"],
             summary="How right the start-time forecasts were, per queue: over the last starts, the share "
                     "inside [p10, p90] and the median error of p50 (seconds, and relative to the wait); "
                     "when the forecasts were last refreshed")
    def forecast_accuracy(_: viewer) -> Any:
        return service.forecasts.status()

    # -- the accounting --------------------------------------------------------------------------
    @app.get("/queues", tags=["accounting"],
             summary='The accounting\'s "now" view per queue and GPU type; a page of queues with limit and offset '
                     f'(default {QUEUE_PAGE}, at most {MAX_QUEUE_PAGE}); X-Total-Count says how many queues in all',
             responses={200: {"headers": {"X-Total-Count": {
                 "description": "the number of queues in the view (the root included)",
                 "schema": {"type": "integer"}}}}})
    def queues(caller: tenant, response: Response,
               limit: Annotated[int, Query(ge=1, le=MAX_QUEUE_PAGE)] = QUEUE_PAGE,
               offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> Any:
        if caller.reads is not None:              # a tenant: its queues' rows, paged by queue
            rows = [r for r in need_accounting().rows() if caller.may_read(str(r["queue"]))]
            names = list(dict.fromkeys(str(r["queue"]) for r in rows))
            page = set(names[offset:offset + limit])
            response.headers["X-Total-Count"] = str(len(names))
            return [r for r in rows if r["queue"] in page]
        rows, total = need_accounting().queue_page(limit, offset)
        response.headers["X-Total-Count"] = str(total)
        return rows

    @app.get("/queues/{queue}/tenant", tags=["accounting"],
             summary="One queue as its tenants see it: guarantee, entitlement, decayed usage and score, the "
                     "forecasts of its pending work, the preemptions it suffered (docs/API.md)",
             responses={403: {}, 404: {}})
    def tenant_view(queue: str, caller: tenant) -> Any:
        caller.check_read(queue)
        page = tenant_page(service, accounting, queue, clock(), readable.preemptions, readable.workloads)
        if page is None:
            raise Problem(404, f"unknown queue {shown(queue)}")
        return page

    @app.get("/books", tags=["accounting"],
             summary="The last audit of the books: the accounting against what the scheduler placed, per queue, "
                     "GPU type and node (gpuq check)")
    def books(_: viewer) -> Any:
        at = service.books_at_s
        diffs = service.books
        return {"at": None if at is None else dt.datetime.fromtimestamp(at, dt.UTC).isoformat(), "balanced": at is not None and not diffs,
                "unbalanced_gpus": sum(abs(d.gpus) for d in diffs),
                "differences": [{"queue": d.queue, "gpu_type": d.gpu_type, "node": d.node, "accounted": d.accounted,
                                 "placed": d.placed, "difference": d.gpus} for d in diffs]}

    @app.get("/accounting/usage", tags=["accounting"], summary="GPU-seconds, idle and cost over a window")
    def usage(caller: tenant, start: Annotated[str, Query(alias="from")] = "-1d",
              end: Annotated[str, Query(alias="to")] = "now", by: str = "queue", rollup: bool = False) -> Any:
        acc = need_accounting()
        now = clock()
        t0, t1 = _window(start, end, now)
        try:
            keys = check_by([k.strip() for k in by.split(",") if k.strip()])
        except ValueError as exc:
            raise invalid("query.by", str(exc).replace("--by", "by")) from exc
        if caller.reads is not None:              # a tenant: rows by queue, its queues' only
            if "queue" not in keys:
                raise Problem(403, "this token reads usage by queue only (by=queue,...)")
            return [r for r in acc.usage(t0, t1, keys, now, rollup) if caller.may_read(str(r["queue"]))]
        return acc.usage(t0, t1, keys, now, rollup)

    @app.get("/accounting/series", tags=["accounting"],
             summary="Allocated, guaranteed and max GPUs per queue at a step (the admins' chart)")
    def series(_: viewer, queue: str | None = None, start: Annotated[str, Query(alias="from")] = "-1d",
               end: Annotated[str, Query(alias="to")] = "now", step: str = "1h") -> Any:
        acc = need_accounting()
        now = clock()
        t0, t1 = _window(start, end, now)
        m = _STEP.match(step)
        step_s = float(m.group(1)) * _UNIT[m.group(2)] if m else 0.0
        if not 0 < step_s < math.inf:
            given = step if len(step) <= 40 else step[:37] + "..."
            raise invalid("query.step", f"expected a positive finite duration (300, 5m, 1h, 1d), got {given!r}")
        if (t1 - t0) / step_s > 10_000:
            raise invalid("query.step", f"{math.ceil((t1 - t0) / step_s)} steps: at most 10000 per request")
        points = acc.series(t0, t1, step_s, now, queue)
        config = service.config
        if queue is not None and not points and queue not in config.queues:
            raise invalid("query.queue", f"unknown queue {shown(queue)}; "
                                         f"{nearest(queue, [q for q in config.queues if q != 'root'], 'queues')}")
        return points

    # -- configuration -------------------------------------------------------------------------------
    @app.post("/admin/reload-queues", tags=["admin"], response_model=ReloadOut,
              summary="Read the queue file again now", responses={409: {}})
    def reload_queues(caller: admin) -> Any:
        acc = need_accounting()
        result = acc.reload(accept=service.set_config)
        leaves = sorted(service.config.leaves())
        service.note_reload(clock(), caller.actor, "static" if result is None else result.value)
        if result is None:
            return ReloadOut(result="static", queues=leaves)
        if result is Reload.REJECTED:
            raise Problem(409, f"queue configuration not taken: {acc.error}")
        log.info("%s reloaded the queue file: %s", caller.actor, result.value)
        return ReloadOut(result=result.value, error=acc.error, queues=leaves)

    app.include_router(dashboard_router(auth, service, accounting, settings, clock, _window, registry))
    app.include_router(acting_router(auth, service, clock))
    app.include_router(whatif_router(auth, service, accounting, settings, clock, whatif_jobs or Jobs()))
    return app


def _window(start: str, end: str, now: float) -> tuple[float, float]:
    out = []
    for field, value in (("query.from", start), ("query.to", end)):
        try:
            out.append(parse_time(value, now))
        except AccountingError as exc:
            raise invalid(field, str(exc)) from exc
    if out[1] < out[0]:
        raise invalid("query.to", "the window ends before it starts")
    return out[0], out[1]
