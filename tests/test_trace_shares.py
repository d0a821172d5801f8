"""The Alibaba trace replayed with shares of one GPU (issue 19) next to the same pods rounded up
to whole GPUs: every device stays within its whole at every event (the admits' ``devices``,
checked by tests/replay_rules.py), no rule of docs/SCENARIOS.md is broken, and more pods run at
once. Reduced to stay fast: the first 400 GPU pods, arrivals compressed 10,000x, on 1/32 of the
cluster (each node group and each queue's guarantee cut to 1/32, as benchmarks/bench_eta.py cuts
it), so that the GPUs run short and work waits. The whole trace: benchmarks/bench_trace_shares.py."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from benchmarks.bench_trace_shares import cut
from scheduler.simulator import run_scenario
from scheduler.traces import load_alibaba_v2023, round_up_shares
from tests.conftest import data_path
from tests.replay_rules import check_devices, rule_violations

LIMIT, TIME_SCALE, SHRINK = 400, 0.0001, 32


@pytest.fixture(scope="module")
def replays() -> dict[str, Any]:
    trace: Path = data_path("traces", "alibaba-gpu-v2023")
    shares = cut(load_alibaba_v2023(trace, limit=LIMIT, time_scale=TIME_SCALE).scenario, SHRINK)
    rounded = round_up_shares(shares)
    return {name: (sc, run_scenario(sc)) for name, sc in (("shares", shares), ("rounded", rounded))}


def test_the_two_sides_differ_only_in_the_shares(replays: dict[str, Any]) -> None:
    shares, rounded = replays["shares"][0], replays["rounded"][0]
    assert {k: v for k, v in shares.items() if k != "workloads"} == \
           {k: v for k, v in rounded.items() if k != "workloads"}
    asked = [w["gpus_per_pod"] for w in shares["workloads"]]
    assert sum(1 for g in asked if g < 1) > LIMIT // 4          # a good part of the trace asks shares
    assert [w["gpus_per_pod"] for w in rounded["workloads"]] == [1 if g < 1 else g for g in asked]
    assert [dict(w, gpus_per_pod=0) for w in shares["workloads"]] == \
           [dict(w, gpus_per_pod=0) for w in rounded["workloads"]]


def test_no_device_above_its_whole_and_no_rule_broken(replays: dict[str, Any]) -> None:
    for name, (sc, res) in replays.items():
        rep = check_devices(sc, res.events)
        assert rep.problems == [], name
        assert rep.admits >= LIMIT and rep.max_device_milli <= 1000
        assert rule_violations(sc, list(res.events)) == [], name
        assert res.summary["preemptions"] > 0, "the preemption rules were exercised, shares included"
    sc, res = replays["shares"]
    assert check_devices(sc, res.events).peak_shared_devices > 0     # devices held in part ...
    sharing = [e for e in res.events if e["event"] == "admit"
               and any(0 < s < 1 for on in e["devices"].values() for s in on.values())]
    assert sharing and all(len(e["devices"]) == 1 and len(next(iter(e["devices"].values()))) == 1
                           for e in sharing), "a pod of a share sits on one device"


def test_shares_fit_more_pods_at_once(replays: dict[str, Any]) -> None:
    peak = {name: check_devices(sc, res.events) for name, (sc, res) in replays.items()}
    cluster = sum(n["gpus"] * n["count"] for n in replays["shares"][0]["nodes"])
    assert peak["rounded"].peak_pods <= cluster                 # one pod, one GPU at least
    assert peak["shares"].peak_pods > cluster                   # more pods than GPUs ...
    assert peak["shares"].peak_pods >= peak["rounded"].peak_pods * 1.2   # ... and than rounded (256 vs 193)
    assert peak["shares"].peak_gpus_milli <= cluster * 1000


# -- the checker can fail ----------------------------------------------------------------------

HAND = {
    "name": "hand", "scheduler": {"preemption": False},
    "nodes": [{"name": "one", "gpu_type": "T4", "gpus": 1, "count": 1},
              {"name": "two", "gpu_type": "T4", "gpus": 2, "count": 1}],
    "queues": {"a": {"guaranteed": {"gpu": 3}}},
    "workloads": [
        # 0.1 + 0.2 + 0.7 is 1.0000000000000002 in floats and exactly one GPU in thousandths
        {"id": "s1", "queue": "a", "submit": 0, "duration": 100, "gpus_per_pod": 0.1},
        {"id": "s2", "queue": "a", "submit": 0, "duration": 100, "gpus_per_pod": 0.2},
        {"id": "s7", "queue": "a", "submit": 0, "duration": 100, "gpus_per_pod": 0.7},
        {"id": "w2", "queue": "a", "submit": 0, "duration": 50, "gpus_per_pod": 2},
        {"id": "h", "queue": "a", "submit": 60, "duration": 10, "pods": 2, "gpus_per_pod": 0.5},
    ],
}


def _admit(events: list[dict[str, Any]], wid: str) -> dict[str, Any]:
    return next(e for e in events if e["event"] == "admit" and e["workload"] == wid)


def test_the_hand_made_replay_passes_exactly() -> None:
    events = [dict(e) for e in run_scenario(HAND).events]
    rep = check_devices(HAND, events)
    assert rep.problems == [] and rule_violations(HAND, events) == []
    one = {e["workload"]: e["devices"] for e in events if e["event"] == "admit" and "one-0" in e["devices"]}
    assert sorted(one) == ["s1", "s2", "s7"] and rep.max_device_milli == 1000    # one device, full


@pytest.mark.parametrize(("corrupt", "needle"), [
    # h's two pods put on the device s1, s2 and s7 fill (h runs at 60, they until 100)
    (lambda ev: _admit(ev, "h").update(placement={"one-0": 1}, devices={"one-0": {"0": 1}}),
     "one-0 device 0 held 2 of its whole (1 before this admit)"),
    (lambda ev: _admit(ev, "w2").update(devices={"two-0": {"0": 1, "2": 1}}), "two-0 has devices 0..1, not '2'"),
    (lambda ev: _admit(ev, "s7").update(devices={"one-0": {"0": 0.7005}}), "not a whole number of thousandths"),
    (lambda ev: _admit(ev, "w2").update(devices={"two-0": {"0": 1, "1": 0.5}}), "a whole gang holds part"),
    (lambda ev: _admit(ev, "w2").update(devices={"two-0": {"0": 1}}), "devices add up to"),
    (lambda ev: _admit(ev, "h").update(devices={"two-0": {"0": 0.75, "1": 0.25}}), "not a whole number of pods"),
    (lambda ev: _admit(ev, "s2").pop("devices"), "an admit without devices"),
    (lambda ev: _admit(ev, "s1").update(devices={"nowhere": {"0": 0.1}}), "unknown node 'nowhere'"),
    (lambda ev: ev.append(dict(next(e for e in ev if e["event"] == "finish"), t=1000.0)),
     "stops while holding no device"),
], ids=["over-whole", "index-out-of-range", "not-thousandths", "whole-gang-in-part", "short-of-placement",
        "pod-split", "missing", "unknown-node", "given-back-twice"])
def test_a_corrupted_event_fails_the_device_check(corrupt: Any, needle: str) -> None:
    events = [copy.deepcopy(dict(e)) for e in run_scenario(HAND).events]
    corrupt(events)
    problems = check_devices(HAND, events).problems
    assert problems and any(needle in p for p in problems), problems
    assert rule_violations(HAND, events), "the rule checker, which keeps the same books, fails too"
