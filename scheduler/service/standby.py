"""A ``gpuq serve`` replica that does not hold the Lease stands by: it opens no store and acts on
nothing, and answers on the API port only what probes and people need to know:

* ``/healthz`` 200 ``{"status": "ok", "role": "standby", "leader": "<holder>"}`` (the process is
  fine: no restart);
* ``/readyz`` 503 (the Service sends traffic to the leader only);
* ``/metrics`` the elector's metrics (:class:`~scheduler.service.leader.LeaderCollector`:
  ``gpuq_leader 0``, leases lost and acquired at 0 until this replica leads, so that the series the
  leader goes on with has a value to rise from: a takeover after an expiry is seen by ``increase()``);
* anything else 503, naming the leader.

:func:`stand_by` tries for the Lease every retry period and returns True once this replica leads
(the caller then starts the real service on the same port), False when ``stop`` was set first.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any

from scheduler.service.leader import LeaderCollector, LeaderElector

log = logging.getLogger(__name__)


def standby_app(elector: LeaderElector) -> Any:
    """A bare ASGI app (nothing to validate, no body read)."""
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

    registry = CollectorRegistry()
    registry.register(LeaderCollector(elector))

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, leader = scope.get("path", ""), elector.holder()
        body: str | dict[str, Any]
        if path == "/healthz":
            status, body, ctype = 200, {"status": "ok", "role": "standby", "leader": leader}, "application/json"
        elif path == "/metrics":
            status, ctype = 200, CONTENT_TYPE_LATEST
            body = generate_latest(registry).decode()
        else:
            status, ctype = 503, "application/problem+json"
            body = {"type": "urn:gpuq:problem:standby", "title": "Service Unavailable", "status": 503,
                    "detail": f"this replica stands by; the leader is {leader or 'not elected yet'}",
                    "instance": path}
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", ctype.encode()), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})
    return app


def stand_by(settings: Any, elector: LeaderElector, stop: threading.Event) -> bool:
    """Serve the standby answers until this replica takes the Lease (True) or ``stop`` (False)."""
    import uvicorn

    from scheduler.api.server import server_config

    server = uvicorn.Server(server_config(standby_app(elector), settings, timeout_graceful_shutdown=1))
    thread = threading.Thread(target=server.run, name="gpuq-standby-api", daemon=True)
    started = False
    try:
        while not stop.is_set():
            if elector.try_once():
                log.info("leading: lease %s/%s taken as %r", elector.cfg.namespace, elector.cfg.name,
                         elector.cfg.identity)
                return True
            if not started:
                log.info("standing by: lease %s/%s held by %r", elector.cfg.namespace, elector.cfg.name,
                         elector.holder())
                thread.start()
                started = True
            stop.wait(elector.cfg.retry_period_s)
        return False
    finally:
        if started:
            server.should_exit = True
            thread.join(10)
            deadline = time.monotonic() + 5
            while thread.is_alive() and time.monotonic() < deadline:
                time.sleep(0.05)
