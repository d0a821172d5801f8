"""GPU-equivalents in the queues' time series (issue 19): ``queue_series`` and
``GET /accounting/series`` carry ``allocated_eq`` (each type's GPUs times its ``equivalent``),
``guaranteed_eq`` and ``max_eq`` next to the raw GPUs where the queue file sets equivalents, and
nothing more where it does not. The expected equivalents are computed here from the allocations'
own times and the file's numbers, not by the code under test.

The allocations (seconds from the start of a two-hour window, one-hour steps):
  a1  queue a  2 H100 (worth 1)      0 - open
  a2  queue a  4 A100 (worth 0.5) 3600 - open
  b1  queue b  1 L4   (worth 0.25)   0 - 5400
  b2  queue b  0.5 of an A100     1800 - open
"""
from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.model import Allocation, Window, milli
from accounting.queues import parse_queue_config
from accounting.resolve import Resolver
from accounting.series import queue_series
from gpuq.settings import load_settings
from scheduler.actuators.base import DryRunActuator
from scheduler.api import create_app
from scheduler.service import SchedulerService
from tests.test_api import TOKENS, Api

H100, A100, L4 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB", "NVIDIA-L4"
WORTH = {H100: 1.0, A100: 0.5, L4: 0.25}            # the equivalents the file below sets, by model
TYPES = {"H100": {"node_labels": [H100]}, "A100": {"equivalent": 0.5, "node_labels": [A100]},
         "L4": {"equivalent": 0.25, "node_labels": [L4]}}
QUEUES = {"a": {"guaranteed": {"gpu_eq": 2.5}, "max": {"gpu_eq": 6, "gpu": 16}}, "b": {"guaranteed": {"gpu": 4}}}
NOW = float(int(time.time()) // 3600 * 3600)       # hour-aligned: two whole steps
T0 = NOW - 7200
# (pod, queue, model, gpus, start, end) in seconds from T0
ALLOCS = [("a1", "a", H100, 2, 0, None), ("a2", "a", A100, 4, 3600, None),
          ("b1", "b", L4, 1, 0, 5400), ("b2", "b", A100, 0.5, 1800, None)]


def expected(queue: str, step: int, worth: dict[str, float]) -> float:
    """The average over step ``step`` (an hour) of the queue's GPUs times ``worth`` by model."""
    lo, hi = step * 3600, (step + 1) * 3600
    total = 0.0
    for _, q, model, g, start, end in ALLOCS:
        if q == queue:
            total += g * worth[model] * max(0, min(hi, 7200 if end is None else end) - max(lo, start))
    return total / 3600


def allocations() -> list[Allocation]:
    return [Allocation("c", "ns", pod, f"u-{pod}", q, "n1", model, milli(g), T0 + start,
                       None if end is None else T0 + end) for pod, q, model, g, start, end in ALLOCS]


def test_series_carries_equivalents_that_balance() -> None:
    r = Resolver(parse_queue_config({"gpu_types": TYPES, "queues": QUEUES}))
    pts = {(p.queue, round(p.t_s - T0)): p for p in queue_series(allocations(), r, Window(T0, NOW), 3600, NOW)}
    assert set(pts) == {(q, t) for q in ("a", "b") for t in (0, 3600)}
    raw = dict.fromkeys(WORTH, 1.0)
    for (q, t), p in pts.items():
        assert p.allocated == pytest.approx(expected(q, t // 3600, raw))
        assert p.allocated_eq == pytest.approx(expected(q, t // 3600, WORTH))
    # by hand, the second hour: a = 2 x 1 + 4 x 0.5 = 4; b = 1 x 0.25 for half of it + 0.5 x 0.5
    assert pts[("a", 3600)].allocated_eq == pytest.approx(4.0) and pts[("a", 3600)].allocated == 6
    assert pts[("b", 3600)].allocated_eq == pytest.approx(0.125 + 0.25)
    assert (pts[("a", 0)].guaranteed_eq, pts[("a", 0)].max_eq, pts[("a", 0)].max) == (2.5, 6, 16)
    assert (pts[("b", 0)].guaranteed, pts[("b", 0)].guaranteed_eq, pts[("b", 0)].max_eq) == (4, None, None)
    assert set(pts[("b", 0)].as_dict()) == {"queue", "t", "allocated", "guaranteed", "max", "allocated_eq",
                                            "guaranteed_eq", "max_eq"}


def test_series_without_equivalents_is_as_before() -> None:
    plain = {"H100": {"node_labels": [H100]}, "A100": {"node_labels": [A100]}, "L4": {"node_labels": [L4]}}
    r = Resolver(parse_queue_config({"gpu_types": plain, "queues": {"a": {"guaranteed": {"gpu": 8}}, "b": {}}}))
    pts = queue_series(allocations(), r, Window(T0, NOW), 3600, NOW)
    assert all(p.allocated_eq is None and p.guaranteed_eq is None for p in pts)
    assert {tuple(p.as_dict()) for p in pts} == {("queue", "t", "allocated", "guaranteed", "max")}


def _rows() -> list[tuple[Any, ...]]:
    def ts(offset: float | None) -> dt.datetime | None:
        return None if offset is None else dt.datetime.fromtimestamp(T0 + offset, dt.UTC)

    return [("c", "ns", pod, f"u-{pod}", q, "n1", model, "nvidia.com/gpu", g, 0, "", ts(start), ts(end), 1)
            for pod, q, model, g, start, end in ALLOCS]


@pytest.mark.parametrize("with_eq", [True, False])
def test_api_series_has_equivalents_where_set(store: Any, tmp_path: Path, with_eq: bool) -> None:
    from scheduler.service.accounting import LiveAccounting

    store.insert("gpu_allocations", _rows(), ("cluster", "namespace", "pod", "uid", "queue", "node", "gpu_model",
                                             "gpu_resource", "gpus", "priority", "ray_cluster", "start", "end",
                                             "version"))
    types = TYPES if with_eq else {t: {"node_labels": v["node_labels"]} for t, v in TYPES.items()}
    queues = QUEUES if with_eq else {"a": {"max": {"gpu": 16}}, "b": {"guaranteed": {"gpu": 4}}}
    qf = tmp_path / "queues.yaml"
    qf.write_text(yaml.safe_dump({"gpu_types": types, "queues": queues}))
    acc = LiveAccounting(store, queues_file=str(qf))
    svc = SchedulerService(acc.config, DryRunActuator())
    api = Api(create_app(svc, acc, load_settings(None, api={"tokens": TOKENS}), clock=lambda: NOW))
    got = api("GET", "/accounting/series?from=-2h&step=1h", token="view-t")
    assert got.status_code == 200, got.text
    points = {(p["queue"], round(p["t"] - T0)): p for p in got.json()}
    assert set(points) == {(q, t) for q in ("a", "b") for t in (0, 3600)}
    for (q, t), p in points.items():
        assert p["allocated"] == pytest.approx(expected(q, t // 3600, dict.fromkeys(WORTH, 1.0)))
        if with_eq:
            assert p["allocated_eq"] == pytest.approx(expected(q, t // 3600, WORTH))
        else:
            assert "allocated_eq" not in p and "guaranteed_eq" not in p
    if with_eq:
        a = points[("a", 3600)]
        assert (a["allocated"], a["allocated_eq"], a["guaranteed_eq"], a["max_eq"]) == (6, 4, 2.5, 6)
