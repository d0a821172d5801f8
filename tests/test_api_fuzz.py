"""schemathesis against the API's own OpenAPI document, at a reduced size (benchmarks/bench_fuzz_api.py
runs the full one): every operation, positive and negative inputs, as every kind of caller (none,
forged, viewer, operator, scoped operator, admin), on a real chDB store with the dry-run
actuator. No 500 (or other 5xx than the documented 502/503), no call over 5 s, no answer showing
a token the caller did not send, and every answer matching the schema its status declares."""
from __future__ import annotations

import logging
from pathlib import Path

from benchmarks.bench_fuzz_api import CALLERS, api_under_test, fuzz


def test_fuzz_every_operation_as_every_caller(tmp_path: Path) -> None:
    logging.disable(logging.WARNING)          # every refused request logs; thousands of records cost time
    try:
        with api_under_test(tmp_path) as (app, svc):
            paths = set(app.openapi()["paths"])
            report = fuzz(app, svc, examples=5)   # an unhandled error raises through the test client
    finally:
        logging.disable(logging.NOTSET)
    assert not report.failures, "\n".join(report.failures[:20])
    reached = {label.split(" ", 1)[1] for (label, _) in report.statuses}
    assert reached == paths                                   # every operation was called
    statuses = {s for (_, s) in report.statuses}
    assert {200, 401, 403, 422} <= statuses                   # the callers were told apart
    assert report.calls >= len(paths) * len(CALLERS)
