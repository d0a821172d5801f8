"""The API's front door, a pure ASGI middleware that runs before FastAPI reads anything:

* **auth before the body**: a route that needs a role (its dependency is
  :meth:`scheduler.api.auth.Auth.require`) is answered 401/403 from the ``Authorization`` header
  alone, and a path that matches no route needs a valid token too, so an anonymous caller never
  gets a body read on its behalf (nor learns which paths exist);
* **body size**: a ``Content-Length`` over ``api.max_body_bytes`` is answered 413 at once, a bad one
  400; a body sent without a length (chunked) is counted as it arrives and the request is answered
  413 as soon as it passes the cap (the rest is never read).

Answers are problem JSON like the rest of the API (:mod:`scheduler.api.problems`).
"""
from __future__ import annotations

import json
from typing import Any

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.api.auth import Auth
from scheduler.api.problems import MEDIA_TYPE, Problem

OPEN = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


class _TooLarge(Exception):
    pass


class Guard:
    def __init__(self, app: ASGIApp, *, auth: Auth, max_body_bytes: int, routes: Any) -> None:
        self.app, self.auth, self.max_body = app, auth, max_body_bytes
        self.routes = routes                 # the FastAPI app's routes, matched as the router will

    def role_of(self, scope: Scope) -> str | None:
        """The role the matching route needs (``viewer`` when no route matches); None when open."""
        if scope["path"] in OPEN:
            return None
        partial = None
        for route in self.routes:
            match, _ = route.matches(scope)
            if match == Match.FULL:
                return _needed(route) or None
            if match == Match.PARTIAL and partial is None:
                partial = route              # the path with another method: 405, after auth
        return (_needed(partial) if partial is not None else None) or "viewer"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if self.auth.enabled:
            role = self.role_of(scope)
            if role is not None:
                header = headers.get(b"authorization")
                try:
                    self.auth.check(header.decode("latin-1") if header is not None else None, role)
                except Problem as p:
                    await _answer(scope, send, p)
                    return
        length = headers.get(b"content-length")
        if length is not None:
            try:
                n = int(length)
                if n < 0:
                    raise ValueError
            except ValueError:
                await _answer(scope, send, Problem(400, "Content-Length is not a number of bytes"))
                return
            if n > self.max_body:
                await _answer(scope, send, _too_large(self.max_body))
                return
        received = 0
        over = False
        started = False

        async def counted() -> Message:
            nonlocal received, over
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body:
                    over = True
                    raise _TooLarge
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if over:                         # the app's answer to a body it could not read: ours instead
                return
            started = True
            await send(message)

        try:
            await self.app(scope, counted, guarded_send)
        except _TooLarge:
            pass
        except Exception:
            if not over:
                raise
        if over and not started:
            await _answer(scope, send, _too_large(self.max_body))


def _needed(route: Any) -> str | None:
    dependant = getattr(route, "dependant", None)
    stack = list(getattr(dependant, "dependencies", ()))
    while stack:
        d = stack.pop()
        role = getattr(d.call, "gpuq_role", None)
        if role is not None:
            return str(role)
        stack.extend(d.dependencies)
    return None


def _too_large(limit: int) -> Problem:
    return Problem(413, f"the request body is larger than {limit} bytes (api.max_body_bytes)")


async def _answer(scope: Scope, send: Send, p: Problem) -> None:
    body = json.dumps({"type": f"urn:gpuq:problem:{p.slug}", "title": p.title, "status": p.status,
                       "detail": p.detail, "instance": scope.get("path", "")}).encode()
    headers = [(b"content-type", MEDIA_TYPE.encode()), (b"content-length", str(len(body)).encode()),
               (b"connection", b"close")]
    headers += [(k.lower().encode(), v.encode()) for k, v in (p.headers or {}).items()]
    await send({"type": "http.response.start", "status": p.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
