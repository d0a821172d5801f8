"""``gpuq simulate SCENARIO.yaml --compare QUEUES_B.yaml [--base QUEUES_A.yaml] [--map MAP]
[--out DIR] [--format table|json]``.

Replays one workload under two queue configurations through :func:`scheduler.simulate.run_scenario`:

* **A**: the scenario as written (its own ``queues:`` and ``gpu_types:``);
* **B**: the same scenario with ``queues:`` replaced by those of the file B, and ``gpu_types:`` and
  the top-level ``policy:`` too when B has those sections. B may be a production queue file (its
  ``mapping:`` is ignored; as in any scenario, its queues without a policy have no bound) or a
  whole scenario (only its ``queues:``, ``gpu_types:`` and ``policy:`` are used). Every queue the
  workloads name must be a leaf of B.

``--base QUEUES_A.yaml`` makes A the scenario under that file's queues (as B is made), so two
files are compared on one scenario: an imported Kueue file (``gpuq import-queues``) against the same
file with a change. ``--map MAP`` (:class:`QueueMap`) puts the scenario's queues (and GPU types)
onto the files' names, in A and B alike (with ``--base``; without it A runs as written and only B
is mapped): a YAML file ``{queues: {SCENARIO_QUEUE: LEAF}, gpu_types: {SCENARIO_TYPE: TYPE}}``,
or, for queues only, ``SCENARIO_QUEUE=LEAF,...`` on the command line. The workloads (those of a
``workloads_file:`` too) and the nodes are renamed; a queue the workloads use that the map does not
name must be a leaf of the file as it is, and is refused by name otherwise. A mapped queue's row
reads ``scenario_queue -> leaf`` where the map sends it alone to that leaf (its A and B figures side
by side); where several go to one leaf, that leaf has its own row. The scenario contract
(docs/SCENARIOS.md) is unchanged: the map renames before the scenario is read.

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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
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


def with_queues(scenario: Mapping[str, Any], queues_b: Mapping[str, Any], source: str = "<B>",
                hint: str = "") -> dict[str, Any]:
    """The scenario with B's ``queues:`` (and ``gpu_types:`` and the top-level ``policy:`` when B
    has one); checks that every queue the workloads use is a leaf of B (``hint`` ends the error)."""
    from accounting.errors import QueueConfigError
    from accounting.queues import OPEN_POLICY, parse_queue_config

    if not isinstance(queues_b.get("queues"), Mapping):
        raise ScenarioError("queues", "expected a 'queues:' mapping", source)
    types = queues_b.get("gpu_types", scenario.get("gpu_types"))
    try:
        leaves = set(parse_queue_config({"queues": queues_b["queues"], "gpu_types": types,
                                         "policy": queues_b.get("policy", scenario.get("policy"))},
                                        default_policy=OPEN_POLICY).leaves())
    except QueueConfigError as exc:
        raise ScenarioError(exc.where, exc.reason, source) from exc
    used = sorted({str(w.get("queue")) for w in scenario.get("workloads") or [] if isinstance(w, Mapping)})
    missing = [q for q in used if q not in leaves]
    if missing:
        raise ScenarioError("queues", f"the workloads use queues that are not leaves here: {', '.join(missing)} "
                                      f"(leaves: {', '.join(sorted(leaves))}){hint}", source)
    out = dict(scenario)
    out["queues"] = queues_b["queues"]
    for key in ("gpu_types", "policy"):
        if key in queues_b:
            out[key] = queues_b[key]
    return out


def leaves_of(file: Mapping[str, Any], scenario: Mapping[str, Any], source: str) -> frozenset[str]:
    """The leaf queues of a queue file (its ``gpu_types:`` and ``policy:``, else the scenario's)."""
    from accounting.errors import QueueConfigError
    from accounting.queues import OPEN_POLICY, parse_queue_config

    if not isinstance(file.get("queues"), Mapping):
        raise ScenarioError("queues", "expected a 'queues:' mapping", source)
    try:
        return frozenset(parse_queue_config({"queues": file["queues"],
                                             "gpu_types": file.get("gpu_types", scenario.get("gpu_types")),
                                             "policy": file.get("policy", scenario.get("policy"))},
                                            default_policy=OPEN_POLICY).leaves())
    except QueueConfigError as exc:
        raise ScenarioError(exc.where, exc.reason, source) from exc


@dataclass(frozen=True)
class QueueMap:
    """``--map``: the scenario's queue names onto a queue file's leaves, and its GPU type names
    onto the file's types (module docstring); ``source`` names it in errors."""

    queues: Mapping[str, str]
    gpu_types: Mapping[str, str]
    source: str

    @classmethod
    def parse(cls, arg: str) -> QueueMap:
        """A YAML file (``queues:``, optional ``gpu_types:``), or ``a=b,c=d`` (queues) when ``arg``
        holds ``=`` and names no file."""
        path = Path(arg)
        if "=" in arg and not path.exists():
            pairs: dict[str, str] = {}
            for i, item in enumerate(x.strip() for x in arg.split(",")):
                name, sep, leaf = (p.strip() for p in item.partition("="))
                if not sep or not name or not leaf:
                    raise ScenarioError(f"--map[{i}]", f"expected SCENARIO_QUEUE=LEAF, got {item!r}", arg)
                if name in pairs:
                    raise ScenarioError(f"--map[{i}]", f"{name} is mapped twice", arg)
                pairs[name] = leaf
            return cls(pairs, {}, "--map")
        data = _load_yaml(path, "queue map")
        unknown = sorted(set(data) - {"queues", "gpu_types"})
        if unknown:
            raise ScenarioError(unknown[0], "unknown section (expected queues: and gpu_types:)", arg)
        sections: list[dict[str, str]] = []
        for key in ("queues", "gpu_types"):
            raw = data.get(key) or {}
            if not isinstance(raw, Mapping) or not all(isinstance(v, str) and v for v in raw.values()):
                raise ScenarioError(key, "expected a mapping of names to names", arg)
            sections.append({str(k): v for k, v in raw.items()})
        if not sections[0]:
            raise ScenarioError("queues", "expected at least one SCENARIO_QUEUE: LEAF", arg)
        return cls(sections[0], sections[1], arg)

    def onto(self, scenario: Mapping[str, Any], file: Mapping[str, Any], file_source: str) -> dict[str, Any]:
        """The scenario with its queues and GPU types renamed (workloads, those of its
        ``workloads_file:`` read in, and nodes), after checking the map against both: every name it
        maps is the scenario's, every queue it maps to a leaf of ``file``, every type a type of
        ``file`` (where it declares types)."""
        leaves = leaves_of(file, scenario, file_source)
        works = list(_all_workloads(scenario))
        used = {str(w.get("queue")) for w in works if isinstance(w, Mapping)}
        own = set((scenario.get("queues") or {}).keys()) if isinstance(scenario.get("queues"), Mapping) else set()
        for name, leaf in self.queues.items():
            if name not in used and not any(name == q or q.startswith(name + ".") for q in own):
                raise ScenarioError(f"queues.{name}", "no workload of the scenario uses this queue", self.source)
            if leaf not in leaves:
                raise ScenarioError(f"queues.{name}", f"{leaf} is not a leaf queue of {file_source} "
                                    f"(leaves: {', '.join(sorted(leaves))})", self.source)
        types = {str(n.get("gpu_type")) for n in scenario.get("nodes") or () if isinstance(n, Mapping)}
        declared = file.get("gpu_types")
        for name, to in self.gpu_types.items():
            if name not in types:
                raise ScenarioError(f"gpu_types.{name}", "no node of the scenario has this GPU type "
                                    f"(types: {', '.join(sorted(types))})", self.source)
            if isinstance(declared, Mapping) and to not in declared:
                raise ScenarioError(f"gpu_types.{name}", f"{to} is not a GPU type of {file_source} "
                                    f"(types: {', '.join(sorted(map(str, declared)))})", self.source)
        q, t = self.queues, self.gpu_types

        def work(w: Any) -> Any:
            if not isinstance(w, Mapping):
                return w
            out = dict(w)
            if isinstance(out.get("queue"), str):
                out["queue"] = q.get(out["queue"], out["queue"])
            if isinstance(out.get("gpu_types"), list):
                out["gpu_types"] = [t.get(x, x) if isinstance(x, str) else x for x in out["gpu_types"]]
            return out

        out = {k: v for k, v in scenario.items() if k != "workloads_file"}
        out["workloads"] = [work(w) for w in works]
        out["nodes"] = [{**n, "gpu_type": t.get(str(n.get("gpu_type")), n.get("gpu_type"))}
                        if isinstance(n, Mapping) else n for n in scenario.get("nodes") or ()]
        return out

    def pairs(self, scenario: Mapping[str, Any]) -> dict[str, str]:
        """The mapped queues that alone go to their leaf (one row each in the report)."""
        used = {str(w.get("queue")) for w in _all_workloads(scenario) if isinstance(w, Mapping)}
        into: dict[str, int] = {}
        for name in used:
            leaf = self.queues.get(name, name)
            into[leaf] = into.get(leaf, 0) + 1
        return {a: b for a, b in self.queues.items() if into.get(b, 0) <= 1}


def _all_workloads(scenario: Mapping[str, Any]) -> Iterator[Any]:
    """The scenario's workload objects, those of its ``workloads_file:`` (one JSON object a line)
    after those of ``workloads:``."""
    yield from scenario.get("workloads") or ()
    wf = scenario.get("workloads_file")
    if isinstance(wf, str) and wf:
        from scheduler.simulator.scenario import _json_lines

        for _, raw in _json_lines(Path(wf)):
            yield raw


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
    from accounting.queues import OPEN_POLICY, parse_queue_config
    from scheduler.simulator.report import percentile

    s = result.summary
    config = parse_queue_config({"queues": scenario.get("queues") or {}, "gpu_types": scenario.get("gpu_types"),
                                 "policy": scenario.get("policy")}, default_policy=OPEN_POLICY)
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


def diff(view_a: Mapping[str, Any], view_b: Mapping[str, Any],
         pairs: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``{"totals": {metric: {a, b, delta}}, "queues": {queue: {metric: {a, b, delta}}}}``; a queue
    present on one side only has ``null`` on the other. ``pairs``: A's queue -> B's queue shown on
    its row (``a -> b``; :meth:`QueueMap.pairs`), where the two are named apart."""
    def triple(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None, metrics: tuple[str, ...]) -> dict[str, Any]:
        out = {}
        for m in metrics:
            va, vb = (a or {}).get(m), (b or {}).get(m)
            out[m] = {"a": va, "b": vb, "delta": _delta(va, vb)}
        return out

    qa, qb = view_a["queues"], view_b["queues"]
    pairs = pairs or {}
    rows: dict[str, Any] = {}
    shown: set[str] = set()
    for q in qa:
        b = pairs.get(q, q)
        rows[q if b == q else f"{q} -> {b}"] = triple(qa[q], qb.get(b), QUEUE_METRICS)
        shown.add(b)
    for q in qb:
        if q not in shown:
            rows[q] = triple(None, qb[q], QUEUE_METRICS)
    return {"totals": triple(view_a["totals"], view_b["totals"], TOTAL_METRICS), "queues": rows}


def compare(scenario: Mapping[str, Any], queues_b: Mapping[str, Any], *, source_a: str = "<scenario>",
            source_b: str = "<B>", queues_a: Mapping[str, Any] | None = None,
            queue_map: QueueMap | None = None) -> tuple[dict[str, Any], Any, Any]:
    """Run ``scenario`` as is, or with ``queues_a`` (A), and with ``queues_b`` (B), its queues
    renamed by ``queue_map`` where given (in A too with ``queues_a``); returns ``(report, result_a,
    result_b)`` where ``report`` is :func:`diff` plus the scenario's name, where A's and B's queues
    come from and the map."""
    from scheduler.simulate import run_scenario

    hint = (f"; the map ({queue_map.source}) does not name them" if queue_map is not None
            else "; name a leaf for each with --map")
    if queue_map is not None:
        scenario_b = with_queues(queue_map.onto(scenario, queues_b, source_b), queues_b, source_b, hint)
    else:
        scenario_b = with_queues(scenario, queues_b, source_b, hint)
    if queues_a is None:
        scenario_a = dict(scenario)
    elif queue_map is not None:
        scenario_a = with_queues(queue_map.onto(scenario, queues_a, source_a), queues_a, source_a, hint)
    else:
        scenario_a = with_queues(scenario, queues_a, source_a, hint)
    result_a = run_scenario(scenario_a)
    result_b = run_scenario(scenario_b)
    pairs = {} if queue_map is None else queue_map.pairs(scenario)
    if queues_a is not None:
        pairs = {}                      # both sides are mapped: the rows are the files' leaves
    report = {"scenario": result_a.summary["name"], "queues_a": source_a, "queues_b": source_b,
              **({"map": {"source": queue_map.source, "queues": dict(queue_map.queues),
                          "gpu_types": dict(queue_map.gpu_types)}} if queue_map is not None else {}),
              **diff(run_view(result_a, scenario_a), run_view(result_b, scenario_b), pairs)}
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
    p.add_argument("scenario", help="the scenario, a YAML file (docs/SCENARIOS.md)")
    p.add_argument("--compare", required=True, metavar="QUEUES_B.yaml",
                   help="a queue file (queues:, and optional gpu_types:) to run the same workloads under")
    p.add_argument("--base", metavar="QUEUES_A.yaml", help="run A under this file's queues too, not the "
                   "scenario's own (e.g. an imported Kueue file as A, the same file changed as B)")
    p.add_argument("--map", metavar="MAP", help="the scenario's queues (and GPU types) onto the files' names: a "
                   "YAML file {queues: {SCENARIO_QUEUE: LEAF}, gpu_types: {SCENARIO_TYPE: TYPE}}, or "
                   "SCENARIO_QUEUE=LEAF,... (docs/SCENARIOS.md)")
    p.add_argument("--out", metavar="DIR", help="also write DIR/a, DIR/b (events, summary) and DIR/compare.json")
    p.add_argument("--format", "-f", choices=["table", "json"], default="table", help="a table (default) or JSON")
    return p


def compare_main(argv: list[str], settings: object = None) -> int:
    """Exit status 0, or 2 for an unreadable or invalid scenario or queue file (the message names
    the file and the YAML path). ``settings`` is accepted for the CLI's uniform signature."""
    args = compare_parser().parse_args(argv)
    try:
        scenario = _load_yaml(Path(args.scenario), "scenario")
        wf = scenario.get("workloads_file")
        if isinstance(wf, str) and wf and not Path(wf).is_absolute():   # relative to the scenario, not the cwd
            scenario = {**scenario, "workloads_file": str(Path(args.scenario).parent / wf)}
        queues_b = _load_yaml(Path(args.compare), "queue file")
        queues_a = _load_yaml(Path(args.base), "queue file") if args.base else None
        queue_map = QueueMap.parse(args.map) if args.map else None
        report, result_a, result_b = compare(scenario, queues_b, source_a=args.base or args.scenario,
                                            source_b=args.compare, queues_a=queues_a, queue_map=queue_map)
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


# -- gpuq simulate SCENARIO --baseline fifo|per-queue ------------------------------------------------
BASELINE_LABELS = {"wait_p50_s": "wait p50 s", "wait_p90_s": "wait p90 s", "wait_p99_s": "wait p99 s",
                   "utilization": "utilization", "preemptions": "preemptions",
                   "stranded_gpu_hours": "stranded GPU-h", "stranded_gpus_avg": "stranded GPUs avg",
                   "guarantee_violation_s": "guarantee violated s", "utilization_eq": "utilization (GPU-eq)",
                   "stranded_gpu_eq_hours": "stranded GPU-eq-h", "stranded_gpus_eq_avg": "stranded GPU-eq avg"}


def baselines_run(sc: Any, names: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Replay the parsed scenario ``sc`` through gpuq's core, then through each baseline policy
    (:mod:`scheduler.baselines`); returns ``(report, results)``: the report is
    ``{"scenario", "policies", "queues": {queue: {metric: {policy: value}}}}`` (``(all)`` last) and
    ``results`` maps each policy (``gpuq`` first) to its ``SimResult``."""
    from scheduler.baselines import POLICIES
    from scheduler.quality import EQ_METRICS, METRICS, quality
    from scheduler.simulator import run_scenario
    from scheduler.simulator.engine import simulate

    results = {"gpuq": run_scenario(sc)}
    for name in names:
        results[name] = simulate(sc, POLICIES[name])
    views = {p: quality(sc.cluster, sc.workloads, r.events, r.summary) for p, r in results.items()}
    rows = list(views["gpuq"])
    report = {"scenario": sc.name, "policies": list(results),
              "queues": {q: {m: {p: views[p][q][m] for p in results}
                             for m in (*METRICS, *(EQ_METRICS if sc.cluster.config.has_equivalents else ()))}
                         for q in rows}}
    return report, results


def render_baselines(report: Mapping[str, Any], totals_only: bool = False) -> str:
    from gpuq.output import render

    policies = report["policies"]
    rows: list[list[Any]] = []
    for q, metrics in report["queues"].items():
        if totals_only and q != "(all)":
            continue
        for i, (m, vals) in enumerate(metrics.items()):
            rows.append([q if i == 0 else "", BASELINE_LABELS[m], *(vals[p] for p in policies)])
    head = (f"{report['scenario']}: gpuq's core and baselines on the same scenario (fifo: plain FIFO, best fit, "
            f"no queues; per-queue: one admission per queue per cycle, no preemption: a lower bound on Kueue)\n")
    return head + render(["queue", "metric", *policies], rows, "table")


def baseline_parser() -> argparse.ArgumentParser:
    from scheduler.baselines import POLICIES

    p = argparse.ArgumentParser(prog="gpuq simulate", description="Replay a scenario through gpuq's core and "
                                "through baseline schedulers; print wait percentiles, utilization, "
                                "preemptions, stranded GPUs and guarantee violations side by side.")
    p.add_argument("scenario", help="the scenario, a YAML file (docs/SCENARIOS.md)")
    p.add_argument("--baseline", required=True, metavar="POLICY[,POLICY]",
                   help=f"comma-separated baselines: {', '.join(POLICIES)} (or 'all')")
    p.add_argument("--out", metavar="DIR", help="also write DIR/events.jsonl and DIR/summary.json (gpuq's run, "
                   "as plain simulate does), DIR/baseline-<policy>/ for each baseline and DIR/quality.json")
    p.add_argument("--format", "-f", choices=["table", "json"], default="table", help="a table (default) or JSON")
    p.add_argument("--totals", action="store_true", help="print the (all) rows only (the table; "
                   "quality.json and --format json keep every queue)")
    return p


def baseline_main(argv: list[str], settings: object = None) -> int:
    """Exit status 0, or 2 for an unknown policy or an unreadable or invalid scenario."""
    from scheduler.baselines import POLICIES
    from scheduler.simulator import load_scenario, write_outputs

    args = baseline_parser().parse_args(argv)
    names = list(POLICIES) if args.baseline == "all" else [n.strip() for n in args.baseline.split(",") if n.strip()]
    unknown = [n for n in names if n not in POLICIES]
    if unknown or not names:
        print(f"gpuq simulate --baseline: error: unknown policy {', '.join(unknown) or '(none)'} "
              f"(expected {', '.join(POLICIES)} or all)", file=sys.stderr)
        return 2
    try:
        sc = load_scenario(args.scenario)
    except ScenarioError as exc:
        print(f"gpuq simulate --baseline: error: {exc}", file=sys.stderr)
        return 2
    report, results = baselines_run(sc, list(dict.fromkeys(names)))
    if args.out:
        out = Path(args.out)
        for policy, res in results.items():
            write_outputs(res, out if policy == "gpuq" else out / f"baseline-{policy}")
        (out / "quality.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.format == "json":
        sys.stdout.write(json.dumps(report, indent=2) + "\n")
    else:
        sys.stdout.write(render_baselines(report, args.totals))
    return 0
