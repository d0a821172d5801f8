"""``gpuq simulate SCENARIO.yaml --compare QUEUES_B.yaml [--out DIR] [--format table|json]``.

Replays one workload under two queue configurations through :func:`scheduler.simulate.run_scenario`:

* **A**: the scenario as written (its own ``queues:`` and ``gpu_types:``);
* **B**: the same scenario with ``queues:`` replaced by those of the file B, and ``gpu_types:`` too
  when B has that section. B may be a production queue file (its ``mapping:`` is ignored) or a
  whole scenario (only its ``queues:`` and ``gpu_types:`` are used). Every queue the workloads
  name must be a leaf of B.

It prints, per leaf queue, A, B and ``delta = B - A`` of: the guaranteed GPUs, utilization (the
queue's GPU-seconds over the cluster's GPU-seconds up to that run's makespan; the queues' values
add up to ``gpu_utilization``), wait p50/p95 (submit to first admit), preemptions suffered,
admitted and finished; and the totals: gpu_utilization, makespan, preemptions and the waits over
all workloads. With ``--out DIR`` it also writes ``DIR/a/`` and ``DIR/b/`` (events.jsonl and
summary.json of each run) and ``DIR/compare.json``. A delta is ``null`` where either side is
(no workload of that queue was admitted).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from scheduler.errors import ScenarioError
from scheduler.simulator.scenario import load_yaml

QUEUE_METRICS = ("guaranteed_gpu", "utilization", "wait_p50_s", "wait_p95_s", "preempted", "admitted",
                 "finished")
TOTAL_METRICS = ("gpu_utilization", "makespan_s", "preemptions", "wait_p50_s", "wait_p95_s")


def _load_yaml(path: Path, what: str) -> Mapping[str, Any]:
    data = load_yaml(path, what)
    if not isinstance(data, Mapping):
        raise ScenarioError("(top)", f"expected a mapping, got {type(data).__name__}", str(path))
    return data


def with_queues(scenario: Mapping[str, Any], queues_b: Mapping[str, Any], source: str = "<B>") -> dict[str, Any]:
    """The scenario with B's ``queues:`` (and ``gpu_types:`` when B has one); checks that every
    queue the workloads use is a leaf of B."""
    from accounting.errors import QueueConfigError
    from accounting.queues import parse_queue_config

    if not isinstance(queues_b.get("queues"), Mapping):
        raise ScenarioError("queues", "expected a 'queues:' mapping", source)
    types = queues_b.get("gpu_types", scenario.get("gpu_types"))
    try:
        leaves = set(parse_queue_config({"queues": queues_b["queues"], "gpu_types": types}).leaves())
    except QueueConfigError as exc:
        raise ScenarioError(exc.where, exc.reason, source) from exc
    used = sorted({str(w.get("queue")) for w in scenario.get("workloads") or [] if isinstance(w, Mapping)})
    missing = [q for q in used if q not in leaves]
    if missing:
        raise ScenarioError("queues", f"the workloads use queues that are not leaves here: {', '.join(missing)} "
                                      f"(leaves: {', '.join(sorted(leaves))})", source)
    out = dict(scenario)
    out["queues"] = queues_b["queues"]
    if "gpu_types" in queues_b:
        out["gpu_types"] = queues_b["gpu_types"]
    return out


def total_gpus(scenario: Mapping[str, Any]) -> int:
    return sum(int(n.get("gpus", 0)) * int(n.get("count", 1)) for n in scenario.get("nodes") or [])


def _delta(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    d = b - a
    return round(d, 6) + 0.0 if isinstance(d, float) else d


def _waits(events: tuple[dict[str, Any], ...]) -> list[float]:
    """Submit to first admit of every admitted workload (the summary's waits, over all queues)."""
    submit: dict[str, float] = {}
    waits: list[float] = []
    for e in events:
        if e["event"] == "submit":
            submit[e["workload"]] = e["t"]
        elif e["event"] == "admit" and e["workload"] in submit:
            waits.append(e["t"] - submit.pop(e["workload"]))
    return waits


def run_view(result: Any, scenario: Mapping[str, Any]) -> dict[str, Any]:
    """Per-queue and total figures of one run (a ``SimResult`` of ``scenario``)."""
    from accounting.queues import parse_queue_config
    from scheduler.simulator.report import percentile

    s = result.summary
    config = parse_queue_config({"queues": scenario.get("queues") or {}, "gpu_types": scenario.get("gpu_types")})
    capacity = total_gpus(scenario) * s["makespan_s"]
    per: dict[str, dict[str, Any]] = {}
    for q, qs in s["queues"].items():
        per[q] = {
            "guaranteed_gpu": config.queues[q].guaranteed.get("gpu", 0),
            "utilization": round(qs["gpu_seconds"] / capacity, 6) if capacity > 0 else 0.0,
            "wait_p50_s": qs["wait_p50_s"], "wait_p95_s": qs["wait_p95_s"],
            "preempted": qs["preempted"], "admitted": qs["admitted"], "finished": qs["finished"],
        }
    waits = _waits(result.events)
    totals = {"gpu_utilization": s["gpu_utilization"], "makespan_s": s["makespan_s"],
              "preemptions": s["preemptions"], "wait_p50_s": percentile(waits, 50),
              "wait_p95_s": percentile(waits, 95)}
    return {"queues": per, "totals": totals}


def diff(view_a: Mapping[str, Any], view_b: Mapping[str, Any]) -> dict[str, Any]:
    """``{"totals": {metric: {a, b, delta}}, "queues": {queue: {metric: {a, b, delta}}}}``; a queue
    present on one side only has ``null`` on the other."""
    def triple(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, metrics: tuple[str, ...]) -> dict[str, Any]:
        out = {}
        for m in metrics:
            va, vb = (a or {}).get(m), (b or {}).get(m)
            out[m] = {"a": va, "b": vb, "delta": _delta(va, vb)}
        return out

    qa, qb = view_a["queues"], view_b["queues"]
    names = list(qa) + [q for q in qb if q not in qa]
    return {"totals": triple(view_a["totals"], view_b["totals"], TOTAL_METRICS),
            "queues": {q: triple(qa.get(q), qb.get(q), QUEUE_METRICS) for q in names}}


def compare(scenario: Mapping[str, Any], queues_b: Mapping[str, Any], *, source_a: str = "<scenario>",
            source_b: str = "<B>") -> tuple[dict[str, Any], Any, Any]:
    """Run ``scenario`` as is (A) and with ``queues_b`` (B); returns ``(report, result_a, result_b)``
    where ``report`` is :func:`diff` plus the scenario's name and where A's and B's queues come from."""
    from scheduler.simulate import run_scenario

    scenario_b = with_queues(scenario, queues_b, source_b)
    result_a = run_scenario(scenario)
    result_b = run_scenario(scenario_b)
    report = {"scenario": result_a.summary["name"], "queues_a": source_a, "queues_b": source_b,
              **diff(run_view(result_a, scenario), run_view(result_b, scenario_b))}
    return report, result_a, result_b


_LABELS = {"guaranteed_gpu": "guaranteed gpu", "utilization": "utilization", "wait_p50_s": "wait p50 s",
           "wait_p95_s": "wait p95 s", "preempted": "preempted", "admitted": "admitted", "finished": "finished",
           "gpu_utilization": "gpu utilization", "makespan_s": "makespan s", "preemptions": "preemptions"}


def _signed(v: Any) -> Any:
    if v is None or isinstance(v, str):
        return v
    text = f"{v:.6g}" if isinstance(v, float) else str(v)
    return text if v <= 0 else "+" + text


def render_table(report: Mapping[str, Any]) -> str:
    from gpuq.output import render

    rows: list[list[Any]] = []
    for q, metrics in report["queues"].items():
        for i, (m, t) in enumerate(metrics.items()):
            rows.append([q if i == 0 else "", _LABELS[m], t["a"], t["b"], _signed(t["delta"])])
    for i, (m, t) in enumerate(report["totals"].items()):
        rows.append(["(all)" if i == 0 else "", _LABELS[m], t["a"], t["b"], _signed(t["delta"])])
    head = f"{report['scenario']}: A = queues of {report['queues_a']}, B = queues of {report['queues_b']}\n"
    return head + render(["queue", "metric", "A", "B", "delta (B-A)"], rows, "table")


def compare_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuq simulate", description="Replay a scenario under its own queues (A) "
                                "and under the queues of another file (B); print the difference per queue.")
    p.add_argument("scenario", help="scenario YAML file (FORMAT.md)")
    p.add_argument("--compare", required=True, metavar="QUEUES_B.yaml",
                   help="YAML with queues: (and optional gpu_types:) to run the same workloads under")
    p.add_argument("--out", metavar="DIR", help="also write DIR/a, DIR/b (events, summary) and DIR/compare.json")
    p.add_argument("--format", "-f", choices=["table", "json"], default="table")
    return p


def compare_main(argv: list[str], settings: object = None) -> int:
    """Exit status 0, or 2 for an unreadable or invalid scenario or queue file (the message names
    the file and the YAML path). ``settings`` is accepted for the CLI's uniform signature."""
    args = compare_parser().parse_args(argv)
    try:
        scenario = _load_yaml(Path(args.scenario), "scenario")
        queues_b = _load_yaml(Path(args.compare), "queue file")
        report, result_a, result_b = compare(scenario, queues_b, source_a=args.scenario,
                                            source_b=args.compare)
    except ScenarioError as exc:
        print(f"gpuq simulate --compare: error: {exc}", file=sys.stderr)
        return 2
    if args.out:
        from scheduler.simulate import write_outputs

        out = Path(args.out)
        write_outputs(result_a, out / "a")
        write_outputs(result_b, out / "b")
        (out / "compare.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.format == "json":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render_table(report))
    return 0
