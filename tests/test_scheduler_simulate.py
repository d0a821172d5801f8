"""The simulator through `gpuq simulate`'s function: the format's two examples, the classic 60/40
scenario, the clock, restarts, rejects, outputs and input errors."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import simulate_main
from scheduler.errors import ScenarioError
from scheduler.simulator import run_scenario, write_outputs

OWN = Path(__file__).parent / "scenarios"


def events(result: Any, kind: str | None = None) -> list[dict[str, Any]]:
    return [e for e in result.events if kind is None or e["event"] == kind]


def held(result: Any, t: float, prefix: str = "") -> int:
    """GPUs held at time ``t`` (after the events at ``t``) by queues starting with ``prefix``."""
    running: dict[str, int] = {}
    for e in result.events:
        if e["t"] > t:
            break
        if e["event"] == "admit" and e["queue"].startswith(prefix):
            running[e["workload"]] = sum(e["placement"].values())
        elif e["event"] in ("finish", "preempt"):
            running.pop(e["workload"], None)
    return sum(running.values())


def test_gang_and_fallback() -> None:
    r = run_scenario(OWN / "gang-and-fallback.yaml")
    admits = {e["workload"]: e for e in events(r, "admit")}
    assert admits["inf"]["t"] == 0.0 and admits["inf"]["placement"] == {"h-0": 8, "h-1": 8}
    assert admits["big"]["gpu_type"] == "A100" and len(admits["big"]["placement"]) == 4
    assert admits["late"]["t"] == 1000.0 and admits["late"]["gpu_type"] == "H100"
    assert r.summary["preemptions"] == 0


def test_hierarchy_max() -> None:
    r = run_scenario(OWN / "hierarchy-max.yaml")
    times = sorted({e["t"] for e in r.events})
    for t in times:
        assert held(r, t, "research") <= 32
        assert held(r, t, "research.vision") <= 8
    assert max(held(r, t, "research") for t in times) == 32     # prod's idle quota lifts nothing
    assert r.summary["queues"]["research.vision"]["finished"] == 3
    assert r.summary["queues"]["research.nlp"]["finished"] == 4


def test_classic_60_40() -> None:
    r = run_scenario(OWN / "classic-60-40.yaml")
    pre = events(r, "preempt")
    assert len(pre) == 4 and {e["t"] for e in pre} == {130.0}
    assert all(e["queue"] == "first" and e["by"].startswith("s-") for e in pre)
    assert held(r, 130.0, "second") == 32 and held(r, 130.0, "first") == 48    # exactly its 40%
    more = [e for e in events(r, "admit") if e["workload"].startswith("more")]
    assert [e["t"] for e in more] == [1130.0, 1130.0]                           # waited, no preemption
    assert r.summary["preemptions"] == 4


def test_preempt_comes_right_before_its_preemptor_admit() -> None:
    r = run_scenario(OWN / "classic-60-40.yaml")
    evs = list(r.events)
    for i, e in enumerate(evs):
        if e["event"] == "preempt":
            nxt = next(x for x in evs[i + 1:] if x["event"] != "preempt")
            assert (nxt["event"], nxt["workload"], nxt["t"]) == ("admit", e["by"], e["t"])


def base(**over: Any) -> dict[str, Any]:
    s: dict[str, Any] = {
        "nodes": [{"name": "n", "gpu_type": "A100", "gpus": 8, "count": 2}],
        "queues": {"lo": {"max": {"gpu": 16}}, "hi": {"guaranteed": {"gpu": 8}}},
        "workloads": [
            {"id": "v", "queue": "lo", "submit": 0, "duration": 100, "pods": 2, "gpus_per_pod": 8},
            {"id": "p", "queue": "hi", "submit": 10, "duration": 50, "gpus_per_pod": 8},
        ],
    }
    s.update(over)
    return s


@pytest.mark.parametrize(("checkpoint", "finish_t"), [
    pytest.param(False, 190.0, id="restart-from-zero"),     # preempted at 40, readmitted 90, +100
    pytest.param(True, 150.0, id="checkpoint-resumes"),     # ran 40 s, 60 left after 90
])
def test_preempted_work_restarts_or_resumes(checkpoint: bool, finish_t: float) -> None:
    s = base()
    s["workloads"][0]["checkpoint"] = checkpoint
    r = run_scenario(s)
    assert [(e["t"], e["workload"]) for e in events(r, "preempt")] == [(40.0, "v")]
    fin = {e["workload"]: e["t"] for e in events(r, "finish")}
    assert fin == {"p": 90.0, "v": finish_t}


def test_cycles_follow_the_grid_and_skip_idle_time() -> None:
    s = base(scheduler={"cycle_interval_s": 7, "preemption": False})
    s["workloads"] = [{"id": "a", "queue": "lo", "submit": 3, "duration": 1000},
                      {"id": "b", "queue": "lo", "submit": 100000, "duration": 5}]
    r = run_scenario(s)
    assert [e["t"] for e in events(r, "admit")] == [7.0, 100002.0]     # 7 * 14286 = 100002
    assert r.summary["scheduler"]["cycles"] < 10


def test_reject_and_until() -> None:
    s = base(until=60, scheduler={"preemption": False})
    s["workloads"].append({"id": "huge", "queue": "hi", "submit": 5, "duration": 1, "pods": 3, "gpus_per_pod": 8})
    r = run_scenario(s)
    (rej,) = events(r, "reject")
    assert (rej["workload"], rej["t"]) == ("huge", 5.0)
    assert rej["reason"] == "needs 3 pods x 8 GPUs of type A100; all its nodes together hold 2 such pods"
    assert r.summary["makespan_s"] == 60.0 and r.summary["queues"]["hi"]["rejected"] == 1
    assert r.summary["queues"]["lo"]["gpu_seconds"] == 16 * 60.0
    assert r.summary["gpu_utilization"] == 1.0


def test_outputs_are_byte_identical_and_follow_the_format(tmp_path: Path) -> None:
    a, b = run_scenario(OWN / "classic-60-40.yaml"), run_scenario(OWN / "classic-60-40.yaml")
    assert a.events_jsonl() == b.events_jsonl()
    write_outputs(a, tmp_path)
    first = (tmp_path / "events.jsonl").read_text().splitlines()[0]
    assert first == '{"t": 0.0, "event": "submit", "workload": "f-0", "queue": "first"}'
    summary = json.loads((tmp_path / "summary.json").read_text())
    # lost_gpu_seconds (issue 21) only where something was preempted: a run without keeps its bytes
    assert summary["preemptions"] > 0
    assert list(summary) == ["name", "makespan_s", "gpu_utilization", "preemptions", "queues", "scheduler",
                             "lost_gpu_seconds"]
    preempts = [e for e in a.events if e["event"] == "preempt"]
    assert all(list(e)[-1] == "lost_gpu_seconds" for e in preempts)
    assert summary["lost_gpu_seconds"] == round(sum(e["lost_gpu_seconds"] for e in preempts), 6)
    assert list(summary["queues"]["first"]) == ["admitted", "finished", "preempted", "rejected",
                                                "gpu_seconds", "wait_p50_s", "wait_p95_s"]
    assert summary["queues"]["second"]["wait_p50_s"] == 30.0


@pytest.mark.parametrize(("edit", "message"), [
    pytest.param(lambda s: s["workloads"][1].update(gpus_per_pod=0),
                 "workloads[1].gpus_per_pod: expected a positive integer, or a share of one GPU below 1 in "
                 "thousandths (0.5), got 0", id="gpus-per-pod"),
    pytest.param(lambda s: s["workloads"][0].update(queue="nope"),
                 "workloads[0].queue: unknown queue 'nope'", id="unknown-queue"),
    pytest.param(lambda s: s["workloads"][0].update(gpu_per_pod=8),
                 "workloads[0].gpu_per_pod: unknown field", id="typo-field"),
    pytest.param(lambda s: s["nodes"][0].update(gpus="eight"),
                 "nodes[0].gpus: expected an integer >= 0", id="node-gpus"),
    pytest.param(lambda s: s.update(scheduler={"cycle_interval_s": 0}),
                 "scheduler.cycle_interval_s: expected a positive number", id="interval"),
    pytest.param(lambda s: s["queues"]["lo"].update(max={"gpu": -1}),
                 "queues.lo.max.gpu", id="queue-config"),
    pytest.param(lambda s: s["workloads"].append(dict(s["workloads"][0])),
                 "workloads[2].id: duplicate workload id 'v'", id="duplicate-id"),
])
def test_scenario_errors_name_the_yaml_path(edit: Any, message: str) -> None:
    s = base()
    edit(s)
    with pytest.raises(ScenarioError) as err:
        run_scenario(s)
    assert message in str(err.value)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_main([str(OWN / "classic-60-40.yaml"), "--out", str(tmp_path / "o")]) == 0
    assert (tmp_path / "o" / "events.jsonl").exists() and (tmp_path / "o" / "summary.json").exists()
    bad = tmp_path / "bad.yaml"
    bad.write_text("nodes: []\nworkloads:\n  - {id: x, queue: q, duration: 1}\n")
    assert simulate_main([str(bad), "--out", str(tmp_path / "o2")]) == 2
    assert f"{bad}: workloads[0].queue: unknown queue 'q'" in capsys.readouterr().err
