"""The API's front door, a pure ASGI middleware that runs before FastAPI reads anything:

* **auth before the body**: a route that needs a role (its dependency is
  :meth:`scheduler.api.auth.Auth.require`) is answered 401/403 from the ``Authorization`` header
  alone, and a path that matches no route needs a valid token too, so an anonymous caller never
  gets a body read on its behalf (nor learns which paths exist);
* **body size**: a ``Content-Length`` over ``api.max_body_bytes`` is answered 413 at once, a bad one
  400; a body sent without a length (chunked) is counted as it arrives and the request is answered
  413 as soon as it passes the cap (the rest is never read).

Answers are problem JSON like the rest of the API (:mod:`scheduler.api.problems`).

Every refusal (401, 403, 413), whether answered here or by a route (a scoped token acting outside
its namespaces or queues), is counted in ``gpuq_api_refused_total{status,method}`` and logged as a
warning with the client address, method, path and the token's name when the token is valid
(:class:`RefusalLog`: one line per client, status and caller every ``interval_s``, with the count of the
lines held back, so a flood of bad requests cannot flood the log).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter

from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.api.auth import Auth
from scheduler.api.problems import MEDIA_TYPE, Problem

log = logging.getLogger("gpuq.api.audit")
REFUSED = frozenset({401, 403, 413})
OPEN = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc"})


class _TooLarge(Exception):
    pass


class RefusalLog:
    """Counts refused requests and logs them, one line per (client, status, who) per ``interval_s``
    (``who`` is "no token", "token not valid" or the valid token's name and role, never the token)."""

    def __init__(self, registry: CollectorRegistry | None, interval_s: float = 10.0,
                 clock: Any = time.monotonic) -> None:
        self.counter = Counter("gpuq_api_refused", "API requests refused: 401 no or bad token, 403 role "
                               "or scope, 413 body too large", ["status", "method"], registry=registry)
        self.interval_s, self.clock = interval_s, clock
        self._last: dict[tuple[str, int, str], tuple[float, int]] = {}   # -> (logged at, held back)
        self._lock = threading.Lock()

    def refused(self, status: int, method: str, path: str, client: str, who: str) -> bool:
        """Count one refusal; True when it was logged (not held back)."""
        self.counter.labels(str(status), method).inc()
        now, key = self.clock(), (client, status, who)
        with self._lock:
            if len(self._last) > 10_000:                 # many clients: forget the old ones
                self._last = {k: v for k, v in self._last.items() if now - v[0] < self.interval_s}
            at, held = self._last.get(key, (-1e18, 0))
            if now - at < self.interval_s:
                self._last[key] = (at, held + 1)
                return False
            self._last[key] = (now, 0)
        more = f" ({held} more from this client held back)" if held else ""
        log.warning("refused %d %s %s from %s (%s)%s", status, printable(method), printable(path), client, who, more)
        return True


def printable(text: str, limit: int = 200) -> str:
    """``text`` as a log line may show it: control and other unprintable characters escaped (a
    decoded ``%0a`` in a path cannot start a forged line), at most ``limit`` characters kept."""
    out = text if text.isprintable() else "".join(c if c.isprintable() else c.encode("unicode_escape").decode()
                                                   for c in text)
    return out if len(out) <= limit else out[:limit] + f"... ({len(out)} characters)"


MUTATING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


class Guard:
    def __init__(self, app: ASGIApp, *, auth: Auth, max_body_bytes: int, routes: Any,
                 refusals: RefusalLog | None = None, hosts: Sequence[str] = ()) -> None:
        self.app, self.auth, self.max_body = app, auth, max_body_bytes
        self.routes = routes                 # the FastAPI app's routes, matched as the router will
        self.refusals = refusals
        self.hosts = frozenset(h.lower().strip("[]") for h in (*LOOPBACK_NAMES, *hosts) if h)

    def _forged(self, scope: Scope, headers: dict[bytes, bytes]) -> Problem | None:
        """With auth off, a mutating request must be JSON, carry a Host this API answers as, and an
        Origin (when a browser sends one) of such a host: a page in a browser cannot then pause,
        resume or reload through a cross-origin ``text/plain`` POST or a rebound DNS name (issue
        17). The CLI sends JSON and no Origin."""
        ctype = headers.get(b"content-type", b"").split(b";", 1)[0].strip().lower()
        if ctype != b"application/json":
            return Problem(415, "with authentication off, a request that changes something must be "
                                "application/json")
        for name in (b"host", b"origin"):
            value = headers.get(name)
            if value is None:
                if name == b"host":
                    return Problem(403, "no Host header")
                continue
            text = value.decode("latin-1")
            host = urlsplit(text if name == b"origin" else f"//{text}").hostname or ""
            if host.lower() not in self.hosts:
                return Problem(403, f"{name.decode().capitalize()} {printable(text, 80)!r} is not one this API "
                                    "answers as (api.host, loopback names, api.allowed_hosts)")
        return None

    def _who(self, headers: dict[bytes, bytes]) -> str:
        header = headers.get(b"authorization")
        if header is None:
            return "no token"
        caller = self.auth.from_header(header.decode("latin-1"))
        return f"token {caller.name!r}, {caller.role}" if caller is not None else "token not valid"

    def _audited(self, scope: Scope, send: Send, headers: dict[bytes, bytes]) -> Send:
        refusals = self.refusals
        if refusals is None:
            return send

        async def audited(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] in REFUSED:
                client = scope.get("client")
                # keyed on the client's address: every new connection has a port of its own
                refusals.refused(message["status"], scope.get("method", ""), scope.get("path", ""),
                                 str(client[0]) if client else "unknown", self._who(headers))
            await send(message)
        return audited

    def role_of(self, scope: Scope) -> str | None:
        """The role the matching route needs (``viewer`` when no route matches); None when open."""
        if scope["path"] in OPEN:
            return None
        match, route = _route(self.routes, scope)
        if match == Match.FULL:
            return _needed(route) or None
        # the path with another method (405, after auth), or no route at all
        return (_needed(route) if route is not None else None) or "viewer"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        send = self._audited(scope, send, headers)
        if not self.auth.enabled and scope.get("method") in MUTATING:
            forged = self._forged(scope, headers)
            if forged is not None:
                await _answer(scope, send, forged)
                return
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


def _route(routes: Any, scope: Scope) -> tuple[Match, Any]:
    """The route the router takes for ``scope`` (FULL), else the first for its path with another
    method (PARTIAL), else (NONE, None). An included router is looked into: FastAPI keeps it whole
    in the app's routes from 0.1xx on (older versions copied its routes into the app's)."""
    partial = None
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            prefix = route.include_context.prefix
            if not scope["path"].startswith(prefix):
                continue
            match, found = _route(inner.routes, {**scope, "path": scope["path"][len(prefix):]} if prefix else scope)
        else:
            match, _ = route.matches(scope)
            found = route
        if match == Match.FULL:
            return match, found
        if match == Match.PARTIAL and partial is None:
            partial = found
    return (Match.PARTIAL, partial) if partial is not None else (Match.NONE, None)


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
