"""Refused API requests are counted and logged (issue 9: "what is logged"): 401 without or with a
bad token, 403 for a role too low or a scoped token acting outside its queues, 413 for a body over
the cap; the log names the client, the path and the valid token's name, and a flood from one
client gives one line per interval (with the count held back), while the counter counts all."""
from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry

from scheduler.api.limits import RefusalLog
from tests.test_api_security import job, make_api, make_service


def _refused(api, status: str, method: str) -> float:  # noqa: ANN001
    text = api("GET", "/metrics").text
    for line in text.splitlines():
        if line.startswith("gpuq_api_refused_total{") and f'status="{status}"' in line and f'method="{method}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_refusals_are_counted_and_logged_with_who(caplog: pytest.LogCaptureFixture) -> None:
    api = make_api(make_service(), max_body_bytes=2048)
    caplog.set_level(logging.WARNING, logger="gpuq.api.audit")
    assert api("POST", "/workloads", json=job("j1", "a.x")).status_code == 401
    assert api("POST", "/workloads", "nope", json=job("j1", "a.x")).status_code == 401
    assert api("POST", "/workloads", "view-t", json=job("j1", "a.x")).status_code == 403       # role too low
    assert api("POST", "/workloads", "op-a", json=job("j2", "b")).status_code == 403            # out of scope
    assert api("POST", "/workloads", "op-a", content=b"x" * 5000,
               headers={"content-type": "application/json"}).status_code == 413
    assert api("POST", "/workloads", "op-a", json=job("j3", "a.x")).status_code == 201          # not a refusal

    assert _refused(api, "401", "POST") == 2
    assert _refused(api, "403", "POST") == 2
    assert _refused(api, "413", "POST") == 1
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuq.api.audit"]
    assert any("refused 401 POST /workloads" in m and "no token" in m for m in lines), lines
    assert any("refused 403 POST /workloads" in m and "'alice', operator" in m for m in lines), lines
    assert any("refused 413 POST /workloads" in m for m in lines), lines
    assert not any("201" in m for m in lines)
    assert all("op-a" not in m and "view-t" not in m for m in lines), "a token itself was logged"


def test_a_flood_from_one_client_is_counted_but_logged_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    audit = RefusalLog(CollectorRegistry(), interval_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="gpuq.api.audit")
    logged = [audit.refused(401, "GET", "/queues", "10.0.0.9:5000", "no token") for _ in range(1000)]
    assert logged.count(True) == 1
    assert audit.refused(401, "GET", "/queues", "10.0.0.8:5000", "no token")    # another client: its own line
    now[0] += 10.5
    assert audit.refused(401, "GET", "/queues", "10.0.0.9:5000", "no token")
    assert audit.counter.labels("401", "GET")._value.get() == 1002
    last = [r.getMessage() for r in caplog.records if "10.0.0.9" in r.getMessage()][-1]
    assert "999 more from this client held back" in last


def test_the_limit_keys_on_the_client_address_and_paths_are_logged_escaped(caplog: pytest.LogCaptureFixture) -> None:
    """Issue 17: every connection has a port of its own, so a flood from one address over many
    connections is one line per interval (it was a line per request); a decoded ``%0a`` in a path
    is logged escaped, so it cannot forge a log line."""
    import asyncio

    import httpx
    api = make_api(make_service())
    caplog.set_level(logging.WARNING, logger="gpuq.api.audit")

    async def go() -> None:
        for port in range(5000, 5040):
            transport = httpx.ASGITransport(app=api.app, client=("10.0.0.9", port))
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as c:
                await c.post("/workloads/x%0aINFO forged line", json=job("j1", "a.x"))
    asyncio.run(go())
    lines = [r.getMessage() for r in caplog.records if r.name == "gpuq.api.audit"]
    assert len(lines) == 1, lines
    assert "\n" not in lines[0] and "\\n" in lines[0] and "from 10.0.0.9 " in lines[0], lines
    assert _refused(api, "401", "POST") == 40
