"""RFC 9457 problem details: every error the API answers is ``application/problem+json`` with
``type``, ``title``, ``status``, ``detail`` and ``instance`` (the request path). A 422 also carries
``errors``: one ``{"field", "message", "type"}`` per invalid field, ``field`` dotted from where
it came (``body.gpus_per_pod``, ``query.state``); ``detail`` names the first one.

``type`` is ``urn:gpuq:problem:<slug>``: ``bad-request``, ``unauthorized``, ``forbidden``,
``not-found``, ``conflict``, ``too-large``, ``invalid``, ``actuator-failed``, ``unavailable``,
``http-<status>``, ``internal``.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

log = logging.getLogger(__name__)

MEDIA_TYPE = "application/problem+json"
SLUGS = {400: "bad-request", 401: "unauthorized", 403: "forbidden", 404: "not-found", 409: "conflict",
         413: "too-large", 422: "invalid", 502: "actuator-failed", 503: "unavailable", 500: "internal"}


class Problem(Exception):
    """Raise from a route to answer a problem; ``extra`` members are added to the body."""

    def __init__(self, status: int, detail: str, *, slug: str | None = None, title: str | None = None,
                 headers: dict[str, str] | None = None, **extra: Any) -> None:
        self.status = status
        self.detail = detail
        self.slug = slug or SLUGS.get(status, f"http-{status}")
        self.title = title or HTTPStatus(status).phrase
        self.headers = headers
        self.extra = extra
        super().__init__(detail)


class FieldError(ValueError):
    """Raise from a model validator to name a field below the model: the 422 names
    ``<model's place>.<field>`` (``body.target.namespace``) with ``message``."""

    def __init__(self, field: str, message: str) -> None:
        self.field, self.message = field, message
        super().__init__(f"{field}: {message}")


def invalid(field: str, message: str, type_: str = "value_error") -> Problem:
    """A 422 naming one field (``body.queue``)."""
    return Problem(422, f"{field}: {message}", errors=[{"field": field, "message": message, "type": type_}])


def problem_response(request: Request, p: Problem) -> JSONResponse:
    body = {"type": f"urn:gpuq:problem:{p.slug}", "title": p.title, "status": p.status, "detail": p.detail,
            "instance": request.url.path, **p.extra}
    return JSONResponse(body, status_code=p.status, media_type=MEDIA_TYPE, headers=p.headers)


def _field(loc: Sequence[Any]) -> str:
    return ".".join(str(x) for x in loc)


def _error(e: Any) -> dict[str, str]:
    loc, message = list(e.get("loc", ())), str(e.get("msg", ""))
    err = (e.get("ctx") or {}).get("error")
    if isinstance(err, FieldError):
        loc, message = [*loc, err.field], err.message
    return {"field": _field(loc), "message": message, "type": str(e.get("type", ""))}


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> JSONResponse:
        return problem_response(request, exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [_error(e) for e in exc.errors()]
        first = errors[0] if errors else {"field": "body", "message": "invalid request"}
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        return problem_response(request, Problem(422, f"{first['field']}: {first['message']}{more}", errors=errors))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else HTTPStatus(exc.status_code).phrase
        return problem_response(request, Problem(exc.status_code, detail, headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(request, Problem(500, f"internal error: {type(exc).__name__}"))
