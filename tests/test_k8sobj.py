"""gpuq.k8sobj: the Kubernetes timestamps and conditions the collector and the live scheduler both read."""
from __future__ import annotations

import datetime as dt

from gpuq.k8sobj import condition, is_true, k8s_seconds, k8s_time


def test_times_read_as_utc_and_unreadable_ones_as_none() -> None:
    assert k8s_time("2026-11-22T10:05:26Z") == dt.datetime(2026, 11, 22, 10, 5, 26, tzinfo=dt.UTC)
    assert k8s_time("2026-11-22T10:05:26") == dt.datetime(2026, 11, 22, 10, 5, 26, tzinfo=dt.UTC)  # no zone: UTC
    assert k8s_time("2026-11-22T11:05:26+01:00") == k8s_time("2026-11-22T10:05:26Z")
    assert k8s_seconds("1970-01-01T00:01:40Z") == 100.0
    for bad in (None, "", 0, "yesterday"):
        assert k8s_time(bad) is None and k8s_seconds(bad) is None


def test_conditions_by_type() -> None:
    obj = {"status": {"conditions": ["junk", {"type": "Finished", "status": "False"},
                                     {"type": "QuotaReserved", "status": "True", "reason": "r"}]}}
    assert condition(obj, "QuotaReserved") == {"type": "QuotaReserved", "status": "True", "reason": "r"}
    assert condition(obj, "Evicted") is None and condition({}, "Evicted") is None
    assert is_true(obj, "QuotaReserved") and not is_true(obj, "Finished") and not is_true(obj, "Evicted")
