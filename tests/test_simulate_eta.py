"""`gpuq simulate --eta`: the forecast made at submit on each submit event, decisions unchanged,
first-cycle admissions exact, rejected workloads without one; and the scenario's optional
``expected_duration``."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import simulate_main
from scheduler.errors import ScenarioError
from scheduler.simulator import EtaOptions, parse_scenario, run_scenario

OWN = Path(__file__).parent / "scenarios"


def mixed(n: int = 60, seed: int = 5) -> dict[str, Any]:
    """Two queues on 2 x 8 GPUs: bursts, gangs, priorities, checkpoints, preemption (delay 20 s),
    declared durations on a third of them, and two that are rejected at arrival."""
    rng = random.Random(seed)
    work: list[dict[str, Any]] = []
    t = 0.0
    for i in range(n):
        if i % 5 == 0:
            t += rng.expovariate(1 / 200.0)
        q = "a" if rng.random() < 0.5 else "b"
        w: dict[str, Any] = {"id": f"w{i}", "queue": q, "submit": round(t + rng.uniform(0, 10), 2),
                             "duration": round(rng.lognormvariate(5.0, 0.8), 2),
                             "gpus_per_pod": rng.choice((1, 2, 4, 8)), "pods": rng.choice((1, 1, 2)),
                             "checkpoint": rng.random() < 0.3, "priority": rng.choice((0, 0, 1))}
        if rng.random() < 0.33:
            w["expected_duration"] = round(w["duration"] * rng.uniform(0.5, 2.0), 2)
        work.append(w)
    work.append({"id": "too-big", "queue": "b", "submit": 50, "duration": 10, "pods": 3, "gpus_per_pod": 8})
    work.append({"id": "over-policy", "queue": "a", "submit": 60, "duration": 10, "priority": 99})
    return {"name": "mixed", "scheduler": {"preemption_delay_s": 20},
            "nodes": [{"name": "h", "gpu_type": "H100", "gpus": 8, "count": 2}],
            "queues": {"a": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}, "policy": {"max_priority": 1}},
                       "b": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}}},
            "workloads": work}


def strip(events: Any) -> list[dict[str, Any]]:
    return [{k: v for k, v in e.items() if k != "eta"} for e in events]


def check(plain: Any, with_eta: Any) -> dict[str, dict[str, float]]:
    """The shared assertions; returns the forecasts by workload."""
    assert strip(with_eta.events) == list(plain.events)
    assert with_eta.summary["queues"] == plain.summary["queues"]
    rejected = {e["workload"] for e in plain.events if e["event"] == "reject"}
    etas: dict[str, dict[str, float]] = {}
    for e in with_eta.events:
        if e["event"] != "submit":
            continue
        wid = e["workload"]
        if wid in rejected:
            assert "eta" not in e
            continue
        eta = e["eta"]
        assert list(eta) == ["p10", "p50", "p90"]
        assert e["t"] <= eta["p10"] <= eta["p50"] <= eta["p90"]
        etas[wid] = eta
    return etas


@pytest.mark.parametrize("method", ["timeline", "runs"])
def test_eta_changes_no_decision_and_marks_submits(method: str) -> None:
    sc = mixed()
    plain = run_scenario(sc)
    opts = EtaOptions(runs=8, method=method)
    res = run_scenario(sc, eta=opts)
    etas = check(plain, res)
    assert len(etas) == 60
    assert plain.summary["preemptions"] > 0            # the forward runs had preemption to follow
    # admitted in the first cycle at or after submission (a submit is an event: a cycle runs at
    # the next grid time, here the next whole second): exactly that cycle's time; the others later
    subs = {e["workload"]: e["t"] for e in plain.events if e["event"] == "submit"}
    first: dict[str, float] = {}
    for e in plain.events:
        if e["event"] == "admit":
            first.setdefault(e["workload"], e["t"])
    exact = 0
    for wid, eta in etas.items():
        cycle = float(math.ceil(subs[wid] - 1e-9))
        if first[wid] == cycle:
            assert eta == {"p10": cycle, "p50": cycle, "p90": cycle}
            exact += 1
        else:
            assert eta["p10"] > cycle
    assert 5 <= exact < len(etas)
    # some waited, and their forecasts are not all point masses
    assert any(v["p90"] > v["p10"] for v in etas.values())
    # the same seed, the same bytes; another seed, other forecasts (the timeline's stratified
    # middle path is drawn from it; without spreading it draws nothing)
    again = run_scenario(sc, eta=opts)
    assert again.events_jsonl() == res.events_jsonl()
    other = run_scenario(sc, eta=EtaOptions(runs=8, seed=1, method=method))
    if method == "timeline":
        assert strip(other.events) == strip(res.events) and other.events_jsonl() != res.events_jsonl()
        flat = [run_scenario(sc, eta=EtaOptions(method=method, seed=k, spread=False)).events_jsonl() for k in (0, 1)]
        assert flat[0] == flat[1] != res.events_jsonl()
        return
    assert strip(other.events) == strip(res.events) and other.events_jsonl() != res.events_jsonl()
    # drawing arrivals too changes the forecasts, not the decisions
    with_arrivals = run_scenario(sc, eta=EtaOptions(runs=4, arrivals=True, method=method))
    assert len(check(plain, with_arrivals)) == 60 and with_arrivals.events_jsonl() != res.events_jsonl()


@pytest.mark.parametrize("name", ["classic-60-40.yaml", "gang-and-fallback.yaml", "hierarchy-max.yaml"])
def test_examples_unchanged_with_eta(name: str) -> None:
    check(run_scenario(OWN / name), run_scenario(OWN / name, eta=EtaOptions()))
    check(run_scenario(OWN / name), run_scenario(OWN / name, eta=EtaOptions(runs=4, method="runs")))


def test_cli_eta(tmp_path: Path) -> None:
    scen = tmp_path / "s.yaml"
    scen.write_text(json.dumps(mixed(20)))                     # JSON is YAML
    assert simulate_main([str(scen), "--out", str(tmp_path / "plain")]) == 0
    assert simulate_main([str(scen), "--out", str(tmp_path / "eta"), "--eta", "--eta-method", "runs", "--eta-runs", "4",
                          "--eta-arrivals"]) == 0
    assert simulate_main([str(scen), "--out", str(tmp_path / "tl"), "--eta"]) == 0
    plain = [json.loads(x) for x in (tmp_path / "plain" / "events.jsonl").read_text().splitlines()]
    eta = [json.loads(x) for x in (tmp_path / "eta" / "events.jsonl").read_text().splitlines()]
    assert strip(eta) == plain
    assert sum("eta" in e for e in eta) == 20
    tl = [json.loads(x) for x in (tmp_path / "tl" / "events.jsonl").read_text().splitlines()]
    assert strip(tl) == plain and sum("eta" in e for e in tl) == 20
    assert "eta" not in (tmp_path / "plain" / "events.jsonl").read_text()


def test_cli_eta_options_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scen = tmp_path / "s.yaml"
    scen.write_text(json.dumps(mixed(5)))
    for argv in (["--eta", "--eta-method", "runs", "--eta-runs", "0"], ["--eta-seed", "3"], ["--eta-runs", "4"],
                 ["--eta-arrivals"], ["--eta", "--eta-runs", "4"], ["--eta-method", "runs"],
                 ["--eta", "--eta-method", "other"]):
        with pytest.raises(SystemExit) as exc:
            simulate_main([str(scen), "--out", str(tmp_path / "o"), *argv])
        assert exc.value.code == 2
    assert "--eta" in capsys.readouterr().err


def test_expected_duration_in_scenarios(tmp_path: Path) -> None:
    base = {"nodes": [{"name": "h", "gpu_type": "H100", "gpus": 8}], "queues": {"q": {}}}
    sc = parse_scenario({**base, "workloads": [
        {"id": "a", "queue": "q", "duration": 100, "expected_duration": 120, "count": 2},
        {"id": "b", "queue": "q", "duration": 100},
        {"id": "c", "queue": "q", "duration": 100, "expected_duration": None}]})
    got = {w.id: w.expected_duration_s for w in sc.workloads}
    assert got == {"a-0": 120.0, "a-1": 120.0, "b": None, "c": None}
    assert all(w.duration_s == 100.0 for w in sc.workloads)     # never read from duration, nor into it
    with pytest.raises(ScenarioError, match=r"workloads\[0\]\.expected_duration: expected a positive number"):
        parse_scenario({**base, "workloads": [{"id": "a", "queue": "q", "duration": 1, "expected_duration": 0}]})
    lines = tmp_path / "w.jsonl"
    lines.write_text('{"id": "x", "queue": "q", "duration": 5, "expected_duration": 7.5}\n'
                     '{"id": "y", "queue": "q", "duration": 5, "expected_duration": "soon"}\n')
    with pytest.raises(ScenarioError, match=r"w\.jsonl:2: expected_duration: expected a positive number"):
        parse_scenario({**base, "workloads_file": str(lines)})
    lines.write_text('{"id": "x", "queue": "q", "duration": 5, "expected_duration": 7.5}\n')
    assert parse_scenario({**base, "workloads_file": str(lines)}).workloads[0].expected_duration_s == 7.5
    # declared or not, the replay's decisions are the same
    plain = run_scenario({**base, "workloads": [{"id": "a", "queue": "q", "duration": 100, "count": 3}]})
    declared = run_scenario({**base, "workloads": [{"id": "a", "queue": "q", "duration": 100, "count": 3,
                                                     "expected_duration": 5}]})
    assert plain.events == declared.events
