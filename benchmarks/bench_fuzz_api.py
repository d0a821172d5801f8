"""Fuzz the operator API with schemathesis against its own OpenAPI document: every operation, with
every kind of caller (no token, a forged one, viewer, operator, a scoped operator, admin), valid
and invalid inputs (schemathesis' positive and negative generation), in process (ASGI) against
the real app on a real chDB store with the dry-run actuator (nothing acts for real).

    .venv/bin/python -m benchmarks.bench_fuzz_api [--quick] [--examples N] [--seed S]

A call fails when it answers 500 (or any 5xx but 502/503, which are documented answers), takes
longer than ``--max-call-s``, or does not match the response schema the document declares for
its status (schemathesis' ``response_schema_conformance``). Generated bodies are steered half the
time to a real queue and real workload ids, so the scheduler's paths are reached, not only the
validation's; the scheduler cycles between calls.

The peer, measured in the same run: ``GET /healthz`` through the same client; ``ratio`` is the
fuzzed calls' mean time over the peer's. The last line is ``RESULT fuzz_api ...``; the exit status
is 1 when any call failed. ``tests/test_api_fuzz.py`` runs a reduced size in ``make test``.
"""
from __future__ import annotations

import argparse
import json
import logging
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUEUES = {"a": {"guaranteed": {"gpu": 8}, "queues": {"x": {"guaranteed": {"gpu": 4}}, "y": {}}},
          "b": {"guaranteed": {"gpu": 8}}}
LEAVES = ("a.x", "a.y", "b")
TOKENS = [{"token": "view-t", "role": "viewer", "name": "vera"},
          {"token": "op-t", "role": "operator", "name": "otto", "namespaces": ["*"], "queues": ["*"]},
          {"token": "op-a", "role": "operator", "name": "alice", "namespaces": ["team-a"], "queues": ["a"]},
          {"token": "admin-t", "role": "admin", "name": "ada"}]
CALLERS: dict[str, str | None] = {"anonymous": None, "forged": "not-a-token", "viewer": "view-t",
                                  "operator": "op-t", "scoped-operator": "op-a", "admin": "admin-t"}
SECRETS = ("view-t", "op-t", "op-a", "admin-t", "lots-of-gpus")
# values that broke the API before (issue 9): mixed into generated requests
HOSTILE_TIMES = ("-" + "9" * 400 + "w", "+" + "9" * 400 + "d", "-99999999999w", "0001-01-01", "9999-12-31T23:59:59-12:00",
                 "now-1e3d", "-1.5h", "2025-02-30")
HOSTILE_STEPS = ("9" * 400, "9" * 400 + "w", "0.0000001s", "1e3", "-1h")
HOSTILE_NUMBERS = (float("inf"), float("-inf"), float("nan"), 1e300, -0.0, 2**63)


@dataclass
class Report:
    calls: int = 0
    statuses: Counter[tuple[str, int]] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)     # (operation, mode) with nothing to generate


@contextmanager
def api_under_test(root: Path) -> Iterator[tuple[Any, Any]]:
    """The real app (dry-run actuator, LiveAccounting on a chDB store in ``root``); yields (app, service)."""
    import yaml

    from gpuq.settings import load_settings
    from gpuq.store import open_store
    from scheduler.actuators.base import DryRunActuator
    from scheduler.api import create_app
    from scheduler.service import SchedulerService
    from scheduler.service.accounting import LiveAccounting
    from scheduler.testing import nodes

    qf = root / "queues.yaml"
    qf.write_text(yaml.safe_dump({"queues": QUEUES}))
    store = open_store(f"chdb://{root / 'data'}")
    try:
        acc = LiveAccounting(store, queues_file=str(qf))
        svc = SchedulerService(acc.config, DryRunActuator(), nodes=nodes(("h", "H100", 8, 2)))
        settings = load_settings(None, api={"tokens": TOKENS, "max_body_bytes": 65_536, "max_spec_bytes": 8192})
        yield create_app(svc, acc, settings), svc
    finally:
        store.close()


def fuzz(app: Any, svc: Any, examples: int, *, max_call_s: float = 5.0, seed: int | None = None) -> Report:
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed
    from hypothesis import strategies as st
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode
    from schemathesis.specs.openapi.checks import response_schema_conformance

    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    operations = [r.ok() for r in schema.get_all_operations()]
    report = Report()
    clock = [time.time()]

    def runner(op: Any, mode: Any, caller: str, token: str | None) -> Any:
        # a caller without a valid token stops at the front door (401): a few examples show it
        n = examples if caller not in ("anonymous", "forged") else max(2, examples // 3)

        @settings(max_examples=n, deadline=None, database=None, derandomize=seed is None,
                  suppress_health_check=list(HealthCheck))
        @given(case=op.as_strategy(generation_mode=mode), data=st.data())
        def run(case: Any, data: Any) -> None:
            _steer(case, data, svc, st)
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            t0 = time.perf_counter()
            extra: dict[str, Any] = {}
            raw = json.dumps(case.body) if isinstance(case.body, dict) else ""
            if "Infinity" in raw or "NaN" in raw:
                extra = {"data": raw.encode()}          # JSON as Python writes it: requests refuses inf
                headers["Content-Type"] = "application/json"
            r = case.call(headers=headers, **extra)
            took = time.perf_counter() - t0
            report.calls += 1
            report.seconds.append(took)
            report.statuses[(op.label, r.status_code)] += 1
            where = f"{op.label} as {caller} ({mode.value}) {case.path_parameters or ''} {case.query or ''}"
            if r.status_code == 500 or r.status_code > 503 or r.status_code == 501:
                report.failures.append(f"{where}: HTTP {r.status_code}: {r.text[:300]}")
            if took > max_call_s:
                report.failures.append(f"{where}: took {took:.1f} s")
            sent = f"{case.body} {case.path_parameters} {case.query} {case.headers}"
            leaked = [s for s in SECRETS if s in r.text and s != token and s not in sent]
            if leaked:
                report.failures.append(f"{where}: the answer shows {leaked}")
            try:                                      # strict JSON: no Infinity or NaN in an answer
                if "json" in r.headers.get("content-type", ""):
                    json.loads(r.text, parse_constant=_no_constant)
            except ValueError as exc:
                report.failures.append(f"{where}: not strict JSON: {exc}")
            try:
                case.validate_response(r, checks=[response_schema_conformance])
            except Exception as exc:  # schemathesis' FailureGroup
                report.failures.append(f"{where}: response schema: {str(exc)[:400]}")
            if data.draw(st.integers(0, 7), label="cycle") == 0:
                clock[0] += 31.0
                svc.cycle(clock[0])
        return hseed(seed)(run) if seed is not None else run

    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            for caller, token in CALLERS.items():
                try:
                    runner(op, mode, caller, token)()
                except Unsatisfiable:
                    report.skipped.append(f"{op.label} {mode.value} {caller}")
    return report


def _steer(case: Any, data: Any, svc: Any, st: Any) -> None:
    """Half the time, point a generated request at something that exists; sometimes put in a
    value that broke the API before."""
    names = {q.name for q in case.operation.query}
    if names & {"from", "to", "step"} and data.draw(st.integers(0, 2), label="hostile query") == 0:
        case.query = dict(case.query or {})
        key = data.draw(st.sampled_from(sorted(names & {"from", "to", "step"})), label="hostile key")
        case.query[key] = data.draw(st.sampled_from(HOSTILE_STEPS if key == "step" else HOSTILE_TIMES), label=key)
    if isinstance(case.body, dict) and data.draw(st.integers(0, 3), label="hostile number") == 0:
        key = data.draw(st.sampled_from(("duration", "priority", "pods")), label="number field")
        case.body[key] = data.draw(st.sampled_from(HOSTILE_NUMBERS), label="number")
    if not data.draw(st.booleans(), label="steer"):
        return
    if isinstance(case.body, dict):
        case.body["queue"] = data.draw(st.sampled_from(LEAVES), label="queue")
        if isinstance(case.body.get("id"), str) and data.draw(st.booleans(), label="fresh id"):
            case.body["id"] = f"w{data.draw(st.integers(0, 50), label='id')}"
        target = case.body.get("target")
        if isinstance(target, dict) and target.get("kind") in ("RayJob", "RayCluster", "Pod"):
            target["namespace"] = data.draw(st.sampled_from(("team-a", "team-b")), label="namespace")
            target["name"] = "job-1"
    if case.path_parameters and "workload_id" in case.path_parameters:
        ids = [w.id for w in svc.workloads()]
        if ids:
            case.path_parameters["workload_id"] = data.draw(st.sampled_from(ids), label="existing id")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} in the answer")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="the reduced size (5 examples per operation, mode and caller)")
    p.add_argument("--examples", type=int, default=100, help="examples per operation, mode and caller")
    p.add_argument("--seed", type=int, help="hypothesis seed (default: derandomized)")
    p.add_argument("--max-call-s", type=float, default=5.0)
    args = p.parse_args(argv)
    examples = 5 if args.quick else args.examples
    logging.disable(logging.WARNING)                 # the app logs every 4xx cause at INFO/WARNING
    import httpx

    with tempfile.TemporaryDirectory(prefix="gpuq-fuzz-") as tmp, api_under_test(Path(tmp)) as (app, svc):
        t0 = time.perf_counter()
        report = fuzz(app, svc, examples, max_call_s=args.max_call_s, seed=args.seed)
        wall = time.perf_counter() - t0
        import asyncio

        async def peer() -> list[float]:
            out = []
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as c:
                for _ in range(200):
                    t = time.perf_counter()
                    await c.get("/healthz")
                    out.append(time.perf_counter() - t)
            return out
        peer_s = asyncio.run(peer())
    for f in report.failures[:20]:
        print("FAIL", f)
    by_status = Counter(s for (_, s) in report.statuses.elements())
    mean_ms = statistics.fmean(report.seconds) * 1000 if report.seconds else 0.0
    p99_ms = (statistics.quantiles(report.seconds, n=100)[98] * 1000) if len(report.seconds) >= 100 else max(
        report.seconds or [0.0]) * 1000
    peer_ms = statistics.fmean(peer_s) * 1000
    peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"statuses: {dict(sorted(by_status.items()))}; nothing to generate for {len(report.skipped)} "
          f"(operation, mode, caller) combinations")
    print(f"RESULT fuzz_api calls={report.calls} failures={len(report.failures)} wall_s={wall:.1f} "
          f"mean_ms={mean_ms:.2f} p99_ms={p99_ms:.2f} healthz_ms={peer_ms:.2f} ratio={mean_ms / peer_ms:.1f}x "
          f"peak_rss_mib={peak_rss_mib:.0f}")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
