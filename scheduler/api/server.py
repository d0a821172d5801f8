"""The HTTP server's connection limits: how long a client may take, and how many it may hold.

uvicorn, as ``gpuq serve`` runs it, held a slow client for ever (issue 17): a connection that
sent part of its headers and then a byte now and then, or a body a byte at a time, kept its
socket, and after one answer on a keep-alive connection a single byte of the next request cancels
uvicorn's keep-alive timer. Its ``limit_concurrency`` counts open connections too but answers
503 to *requests* past it, so slow connections holding the count would turn every honest caller
away. :func:`server_config` builds the ``uvicorn.Config`` for ``gpuq serve`` (the API and the
standby answers) with :func:`guarded_h11`, uvicorn's h11 protocol with three rules of its own:

* **headers**: a request's headers must be complete within ``api.header_timeout_s`` of the
  connection opening, or of the previous answer on a keep-alive connection (uvicorn's own
  ``timeout_keep_alive``, 5 s, still closes an idle one sooner);
* **body**: once the headers are in, the body must arrive at ``api.body_min_bytes_per_s`` after a
  grace of ``api.body_timeout_s``: the deadline is ``grace + bytes received / rate`` after the
  headers (Apache's ``mod_reqtimeout`` rule), counted while the server is reading (not while the
  app holds the reading back). The same grace bounds an answer the client does not read: when
  the socket's buffers stay full for ``api.body_timeout_s``, the connection is closed;
* **connections**: at most ``api.max_connections`` open at once. When one more arrives, the
  connection that has waited longest for its client (headers or body not complete, an idle
  keep-alive one included) is closed to make room: an honest caller sends its request within
  milliseconds, so connections held open on purpose are the ones that go, and a crowd of them
  larger than the limit cannot keep other callers out (each slow connection is only cut short).
  When every connection is busy on the server's side (its request complete), the new one is
  answered 503 and closed before anything of it is read.

A connection closed by a rule is aborted (nothing more is read or written), counted in
``gpuq_api_connections_closed_total{reason}`` (``header_timeout``, ``body_too_slow``,
``answer_unread``, ``evicted``, ``over_limit``) and logged at most once per reason every 10 s
with the count.
The timers are per connection on the server's event loop (``loop.call_later``), re-armed only when
a deadline passes or a request changes phase, never per byte. uvicorn's choice of protocol is
forced to this one (``http=``): with httptools installed uvicorn would otherwise take its own.
"""
from __future__ import annotations

import asyncio
import json
import logging
import resource
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

import h11
from prometheus_client import CollectorRegistry, Counter
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("gpuq.api.server")

HEADERS, BODY = "headers", "body"
REASONS = ("header_timeout", "body_too_slow", "answer_unread", "evicted", "over_limit")


@dataclass(slots=True)
class Limits:
    """The rules of :func:`guarded_h11` (``api.*`` settings), their counter and their log."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 10.0
    body_min_bytes_per_s: float = 1024.0
    max_connections: int = 512
    registry: CollectorRegistry | None = None
    log_interval_s: float = 10.0
    counter: Any = field(init=False)
    # the connections waiting for their client (headers or body), longest waiting first: the event
    # loop's thread alone touches it
    waiting: dict[GuardedH11, None] = field(init=False, default_factory=dict)
    _logged: dict[str, tuple[float, int]] = field(init=False, default_factory=dict)
    _lock: threading.Lock = field(init=False, default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.counter = Counter("gpuq_api_connections_closed", "API connections closed by the server's rules: "
                               "header_timeout, body_too_slow, answer_unread, evicted (the longest waiting, for a "
                               "new one past the limit), over_limit (api.header_timeout_s, "
                               "api.body_timeout_s, api.body_min_bytes_per_s, api.max_connections)", ["reason"],
                               registry=self.registry)
        for reason in REASONS:
            self.counter.labels(reason)

    @classmethod
    def of(cls, api: Any, registry: CollectorRegistry | None = None) -> Limits:
        return cls(api.header_timeout_s, api.body_timeout_s, float(api.body_min_bytes_per_s), api.max_connections,
                   registry)

    def closed(self, reason: str, client: Any) -> None:
        """Count a connection closed by a rule; log one line per reason every ``log_interval_s``."""
        self.counter.labels(reason).inc()
        now = time.monotonic()
        with self._lock:
            at, held = self._logged.get(reason, (-1e18, 0))
            if now - at < self.log_interval_s:
                self._logged[reason] = (at, held + 1)
                return
            self._logged[reason] = (now, 0)
        who = f"{client[0]}:{client[1]}" if client else "a client"
        more = f" ({held} more since the last such line)" if held else ""
        log.warning("closed the connection of %s: %s%s", who, _WHY[reason].format(l=self), more)


_WHY = {
    "header_timeout": "its request headers were not complete within {l.header_timeout_s:g} s (api.header_timeout_s)",
    "body_too_slow": "its request body came slower than {l.body_min_bytes_per_s:g} bytes/s after "
                     "{l.body_timeout_s:g} s (api.body_min_bytes_per_s, api.body_timeout_s)",
    "answer_unread": "it read nothing of its answer for {l.body_timeout_s:g} s (api.body_timeout_s)",
    "evicted": "it had waited longest for its request while {l.max_connections} connections were open "
               "(api.max_connections) and another came",
    "over_limit": "{l.max_connections} connections were open (api.max_connections), none waiting on its client; "
                  "answered 503",
}


def _busy(limit: int) -> bytes:
    body = json.dumps({"type": "urn:gpuq:problem:unavailable", "title": "Service Unavailable", "status": 503,
                       "detail": f"the server holds {limit} connections (api.max_connections): try again"}).encode()
    head = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/problem+json\r\n"
            b"content-length: %d\r\nconnection: close\r\nretry-after: 1\r\n\r\n" % len(body))
    return head + body


class GuardedH11(H11Protocol):
    """uvicorn's h11 protocol with :class:`Limits` (a subclass per server: :func:`guarded_h11`)."""

    limits: ClassVar[Limits] = Limits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: str | None = None      # HEADERS: waiting for a request; BODY: for its body; None: ours
        self._since = 0.0                   # when the phase began (loop time)
        self._bytes = 0                     # body bytes received in this phase
        self._timer: asyncio.TimerHandle | None = None
        self._stall: asyncio.TimerHandle | None = None
        self._refused = False

    # -- uvicorn's protocol, followed ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        lim = self.limits
        if len(self.server_state.connections) >= lim.max_connections:
            # the longest waiting on its client; not one still being sent its last answer
            victim = next((c for c in lim.waiting if not c.transport.get_write_buffer_size()), None)
            if victim is None:
                self._refused = True
                self.transport = transport
                self.client = transport.get_extra_info("peername")
                transport.write(_busy(lim.max_connections))
                transport.close()
                lim.closed("over_limit", self.client)
                return
            victim._close("evicted")
        super().connection_made(transport)
        self._follow()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._phase == BODY:
            self._bytes += len(data)
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        self.limits.waiting.pop(self, None)
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        if self._refused:
            return
        super().pause_writing()
        if self._stall is None:
            self._stall = self.loop.call_later(self.limits.body_timeout_s, self._unread)

    def resume_writing(self) -> None:
        if self._refused:
            return
        super().resume_writing()
        if self._stall is not None:
            self._stall.cancel()
            self._stall = None

    # -- the rules -----------------------------------------------------------------------------------
    def _follow(self) -> None:
        """Start the deadline of the phase the client is in, when it changed."""
        state = self.conn.their_state
        phase = HEADERS if state is h11.IDLE else BODY if state is h11.SEND_BODY else None
        if phase == self._phase:
            return
        if phase is None:
            self.limits.waiting.pop(self, None)
        elif self._phase is None:                  # a new request: waiting from now (headers, then body)
            self.limits.waiting[self] = None
        self._phase, self._since, self._bytes = phase, self.loop.time(), 0
        self._cancel()
        if phase is not None and not self.transport.is_closing():
            self._arm(self._deadline())

    def _deadline(self) -> float:
        lim = self.limits
        if self._phase == HEADERS:
            return self._since + lim.header_timeout_s
        return self._since + lim.body_timeout_s + self._bytes / lim.body_min_bytes_per_s

    def _arm(self, at: float) -> None:
        self._timer = self.loop.call_at(at, self._expire)

    def _cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        if self._phase is None or self.transport.is_closing():
            return
        now = self.loop.time()
        if self._phase == BODY and self.flow.read_paused:
            # the app has not taken what came (uvicorn stops reading past 64 KiB held): the wait is
            # ours, not the client's; the grace starts again from now
            self._since = now - self._bytes / self.limits.body_min_bytes_per_s
        elif self._phase == HEADERS and self.transport.get_write_buffer_size():
            # the client is still being sent its last answer (that has a rule of its own): the
            # next request's headers are not due yet
            self._since = now
        deadline = self._deadline()
        if now < deadline:
            self._arm(deadline)
            return
        self._close("header_timeout" if self._phase == HEADERS else "body_too_slow")

    def _unread(self) -> None:
        self._stall = None
        if self.flow.write_paused and not self.transport.is_closing():
            self._close("answer_unread")

    def _close(self, reason: str) -> None:
        # an idle keep-alive connection that sent nothing of a next request is uvicorn's to close
        # quietly (its own timeout_keep_alive is shorter); it is counted only when it had begun one
        idle = self._phase == HEADERS and self.cycle is not None and not self.conn.trailing_data[0]
        self._phase = None
        self._cancel()
        self.limits.waiting.pop(self, None)
        self.transport.abort()
        if not idle or reason != "header_timeout":
            self.limits.closed(reason, self.client)


def guarded_h11(limits: Limits) -> type[GuardedH11]:
    """A :class:`GuardedH11` subclass with these limits (uvicorn builds the protocol per connection
    from the class alone)."""
    return type("GuardedH11", (GuardedH11,), {"limits": limits})


def server_config(app: Any, settings: Any, registry: CollectorRegistry | None = None, **kw: Any) -> Any:
    """The ``uvicorn.Config`` ``gpuq serve`` runs ``app`` with: its bind address, the connection
    limits of :mod:`this module <scheduler.api.server>` from ``settings.api``, no access log, no
    lifespan, no websockets (the API has none, and an upgraded connection is no longer this
    protocol's to time)."""
    import uvicorn

    api = settings.api
    raise_fd_limit(api.max_connections)
    options: dict[str, Any] = {"host": api.host, "port": api.port, "log_level": "warning", "lifespan": "off",
                               "access_log": False, "timeout_graceful_shutdown": 2, "ws": "none",
                               "http": guarded_h11(Limits.of(api, registry))}
    options.update(kw)
    return uvicorn.Config(app, **options)


def raise_fd_limit(connections: int, spare: int = 256) -> None:
    """Raise the process's soft limit on open files to hold ``connections`` sockets and ``spare``
    more (the store, the log, the spill files), up to the hard limit; warn when that is not enough."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (OSError, ValueError):
        return
    want = connections + spare
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
            soft = new
        except (OSError, ValueError):
            pass
    if soft != resource.RLIM_INFINITY and soft < want:
        log.warning("open files are limited to %d: fewer than api.max_connections (%d) and %d spare; "
                    "connections past it fail to be accepted (raise the limit, ulimit -n)", soft, connections, spare)
