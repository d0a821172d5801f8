"""Every mutating route of the API, taken from the app's own route table (not a list kept by
hand): refused 403 to a viewer (also before an oversized body is read) and to an operator outside
its namespaces and queues, with nothing changed; carried out for the admin with the same call, so
the 403s are the role and scope checks and not a bad example. A route added later without a
check fails here, and one added without an example in ``EXAMPLES`` fails asking for one."""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from starlette.routing import Mount

from gpuq.store.writer import BatchWriter
from scheduler.actuators.base import DryRunActuator
from scheduler.service import SchedulerService
from scheduler.service.accounting import LiveAccounting
from scheduler.testing import nodes
from tests.test_api_security import QUEUES, Api, job, make_api

MUTATING = {"POST", "PUT", "PATCH", "DELETE"}
HERE = "tests/test_api_routes.py"


@dataclass(frozen=True)
class Call:
    url: str
    json: Any = None


@dataclass(frozen=True)
class Example:
    """How to call a route: ``outside`` op-a's scope (each is refused to it and to the viewer, then
    carried out for the admin), ``inside`` it (carried out for op-a; None: an admin-only route)."""
    outside: tuple[Call, ...]
    inside: Call | None = None
    why_unscoped: str = ""          # an operator route that no scope limits: why (refused to viewers only)
    admin_answers: tuple[int, ...] = ()     # besides 2xx, what the admin may get (past the role check) here


# op-a: role operator, namespaces [team-a], queues [a] (tests/test_api_security.py's TOKENS)
EXAMPLES: dict[tuple[str, str], Example] = {
    ("POST", "/workloads"): Example(
        outside=(Call("/workloads", job("o-queue", "b")),                               # queue outside
                 Call("/workloads", job("o-ns", "a.x", namespace="team-b"))),            # namespace outside
        inside=Call("/workloads", job("i-new", "a.x"))),
    ("DELETE", "/workloads/{workload_id:path}"): Example(
        outside=(Call("/workloads/theirs-queue"), Call("/workloads/theirs-ns")),
        inside=Call("/workloads/mine")),
    ("POST", "/workloads/{workload_id:path}/checkpoint"): Example(
        outside=(Call("/workloads/theirs-queue/checkpoint", {"last_checkpoint": 1}),
                 Call("/workloads/theirs-ns/checkpoint", {"last_checkpoint": "1970-01-01T00:00:02Z"})),
        inside=Call("/workloads/mine/checkpoint", {"last_checkpoint": 3})),
    ("POST", "/dry-run"): Example(
        outside=(Call("/dry-run", {"queue": "b", "gpus_per_pod": 8}),),
        inside=Call("/dry-run", {"queue": "a.x", "gpus_per_pod": 4}),
        why_unscoped="it changes nothing and answers from what a viewer may read anyway"),
    ("POST", "/admin/reload-queues"): Example(outside=(Call("/admin/reload-queues"),)),
    ("POST", "/admin/pause"): Example(outside=(Call("/admin/pause", {"reason": "route table test"}),)),
    ("POST", "/admin/resume"): Example(outside=(Call("/admin/resume"),)),
    # the role check passes for the admin; this app has no queue file to replay under (409)
    ("POST", "/admin/whatif"): Example(outside=(Call("/admin/whatif", {"from": "-1h", "add_nodes": ["H100:8x1"]}),),
                                       admin_answers=(409,)),
}


def walk(routes: list[Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(method, path) of every route, into included routers (FastAPI keeps them whole from 0.1xx
    on, older versions copy their routes into the app's)."""
    for route in routes:
        inner = getattr(route, "original_router", None)
        if inner is not None:
            yield from walk(inner.routes, prefix + route.include_context.prefix)
        elif isinstance(route, Mount):
            pytest.fail(f"a mounted app at {route.path}: its routes cannot be walked for their roles")
        else:
            for method in sorted(getattr(route, "methods", None) or ()):
                yield method, prefix + route.path


@dataclass
class World:
    api: Api
    svc: SchedulerService
    acc: LiveAccounting
    log: list[str] = field(default_factory=list)

    def state(self) -> Any:
        """What a refused call must leave as it was."""
        return ([(w.id, w.state) for w in self.svc.workloads()], self.svc.paused,
                sorted(self.svc.config.leaves()), self.acc.error)


@pytest.fixture
def world(store: Any, tmp_path: Path) -> Iterator[World]:
    qf = tmp_path / "queues.yaml"
    qf.write_text(yaml.safe_dump({"queues": QUEUES}))
    acc = LiveAccounting(store, queues_file=str(qf))
    writer = BatchWriter(store, tmp_path / "spill")
    svc = SchedulerService(acc.config, DryRunActuator(), nodes=nodes(("h", "H100", 8, 2)), sink=writer)
    api = make_api(svc, acc, max_body_bytes=4096)
    for wid, queue, ns in (("theirs-queue", "b", "team-a"), ("theirs-ns", "a.y", "team-b"), ("mine", "a.x", "team-a")):
        assert api("POST", "/workloads", "admin-t", json=job(wid, queue, namespace=ns)).status_code == 201
    yield World(api, svc, acc)
    writer.close()


def mutating_routes(api: Api) -> list[tuple[str, str]]:
    return sorted({(m, p) for m, p in walk(api.app.routes) if m in MUTATING})


def test_the_examples_cover_the_route_table_and_nothing_else(world: World) -> None:
    routes = mutating_routes(world.api)
    assert len(routes) >= 6, routes                  # the walk sees the included routers' routes too
    missing = [f"{m} {p}" for m, p in routes if (m, p) not in EXAMPLES]
    assert not missing, (f"mutating routes without an example: {missing}. Add each to EXAMPLES in {HERE} "
                         "with a plausible body: a call outside op-a's scope (namespaces [team-a], queues "
                         "[a]) and one inside it, or none for an admin-only route")
    stale = [f"{m} {p}" for m, p in EXAMPLES if (m, p) not in routes]
    assert not stale, f"EXAMPLES in {HERE} names routes the app no longer has: {stale}"


@pytest.mark.parametrize("route", sorted(EXAMPLES), ids=lambda r: f"{r[0]} {r[1]}")
def test_a_mutating_route_is_refused_outside_the_role_and_scope(world: World, route: tuple[str, str]) -> None:
    method, _ = route
    ex = EXAMPLES[route]
    api = world.api
    before = world.state()
    big = b'{"reason": "' + b"x" * 10_000 + b'"}'
    for call in ex.outside:
        kw = {"json": call.json} if call.json is not None else {}
        r = api(method, call.url, "view-t", **kw)
        assert r.status_code == 403, f"{method} {call.url} as a viewer: {r.status_code} {r.text}"
        assert "needs the" in r.json()["detail"]
        # the role is checked before the body is read: 403, not 413
        r = api(method, call.url, "view-t", content=big, headers={"content-type": "application/json"})
        assert r.status_code == 403, f"{method} {call.url} as a viewer with a big body: {r.status_code} {r.text}"
        if not ex.why_unscoped:
            r = api(method, call.url, "op-a", **kw)
            assert r.status_code == 403, f"{method} {call.url} outside op-a's scope: {r.status_code} {r.text}"
        assert world.state() == before, f"{method} {call.url}: a refused call changed something"
    if ex.inside is not None:
        kw = {"json": ex.inside.json} if ex.inside.json is not None else {}
        r = api(method, ex.inside.url, "op-a", **kw)
        assert 200 <= r.status_code < 300, f"{method} {ex.inside.url} inside op-a's scope: {r.status_code} {r.text}"
    for call in ex.outside:                         # the same calls are fine for the admin
        kw = {"json": call.json} if call.json is not None else {}
        r = api(method, call.url, "admin-t", **kw)
        assert 200 <= r.status_code < 300 or r.status_code in ex.admin_answers, (
            f"{method} {call.url} as the admin: {r.status_code} {r.text}")
