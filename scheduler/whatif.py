"""``gpuq whatif``: the cluster's own history replayed as it happened and again under a change.

    gpuq whatif [--from -7d] [--to now] [--queues FILE] [--add-nodes TYPE:GPUSxCOUNT ...]
                [--remove-nodes NAME ...] [--out DIR] [--format table|json]

:func:`scenario_of` turns a :class:`scheduler.history.History` into a scenario (docs/SCENARIOS.md)
that the simulator replays (:func:`run`), once as it was and once with the change
(:func:`apply_change`), and :func:`report` sets the two side by side per queue.

How history becomes a scenario (docs/WHATIF.md says it for people):

* **The clock** starts at ``--from`` when some workload was already waiting or running then
  (*carried in*: it enters at 0 and its wait, begun before the window, is not counted), else at
  the first submit in the window (so a history the simulator wrote replays on its own grid). The
  replay stops at ``--to`` (``until``).
* **Workloads** (the history's ``kind: workload`` entries, of any origin: gpuq's, Kueue's Workloads,
  YuniKorn's applications) keep their queue, shape,
  GPU types, priority, preemptibility and checkpointing. Their ``duration``: for one that finished
  (or was cancelled while running) inside the window, the running time it was seen to need: its
  last run when it does not checkpoint (a preempted run was lost), all its runs when it does; for
  one that had not finished by ``--to`` (running, waiting, rejected), the duration it was
  submitted with when it declared one, else longer than the window: it was not done by then in
  history, so it is not done in any replay. One cancelled before it ever ran is left out (the
  replay cannot cancel), and so is one whose queue the queue file does not have as a leaf.
* **Foreign work** (``kind: fixed``) is fixed load (the scenario's ``fixed:``): held on its node
  from its start to its end, in its queue when that is a leaf.
* **Nodes**: the history's; the scheduler's settings (``preemption``, ``preemption_delay_s``,
  ``cycle_interval_s``) are gpuq's; the queues the queue file's (``queues_file``; a file without a
  top-level ``policy:`` has the production default, as ``gpuq serve`` reads it).

The change: ``--queues FILE`` replaces the queues (and ``gpu_types:``, ``policy:`` where FILE has
them; a production queue file or a whole scenario, as ``gpuq simulate --compare`` takes);
``--add-nodes TYPE:GPUSxCOUNT`` adds COUNT nodes of GPUS GPUs of TYPE (``added-<type>-<n>``);
``--remove-nodes NAME`` removes nodes (their fixed load moves to a node of the same type, as the
engine places it, or is displaced).
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from scheduler.errors import ScenarioError, WhatifError
from scheduler.history import FINISHED, FIXED, WORKLOAD, History
from scheduler.model import gpus_out

# what a production queue file without a top-level ``policy:`` means (accounting.queues.DEFAULT_POLICY)
PRODUCTION_POLICY = {"max_priority": 0, "non_preemptible": False}
METRICS = ("wait_p50_s", "wait_p90_s", "gpu_hours", "lost_gpu_hours", "utilization", "preemptions",
           "guarantee_violation_s")
LABELS = {"wait_p50_s": "wait p50 s", "wait_p90_s": "wait p90 s", "gpu_hours": "GPU-hours",
          "lost_gpu_hours": "lost GPU-hours", "utilization": "utilization", "preemptions": "preemptions",
          "guarantee_violation_s": "guarantee violated s"}
ALL = "(all)"
_ADD = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._/-]*):([1-9][0-9]*)x([1-9][0-9]*)$")


@dataclass(frozen=True, slots=True)
class Change:
    """What the second replay changes. ``queues``: a queue file's mapping (``queues_source`` names
    it); ``add_nodes``: ``(gpu type, GPUs per node, count)``; ``remove_nodes``: node names."""

    queues: Mapping[str, Any] | None = None
    queues_source: str = ""
    add_nodes: tuple[tuple[str, int, int], ...] = ()
    remove_nodes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return self.queues is None and not self.add_nodes and not self.remove_nodes

    def describe(self) -> dict[str, Any]:
        return {"queues": self.queues_source or None,
                "add_nodes": [f"{t}:{g}x{n}" for t, g, n in self.add_nodes],
                "remove_nodes": list(self.remove_nodes)}


def parse_add_nodes(text: str) -> tuple[str, int, int]:
    m = _ADD.match(text.strip())
    if not m:
        raise WhatifError("--add-nodes", f"expected TYPE:GPUSxCOUNT (H100:8x4: four nodes of 8 H100), got {text!r}")
    return m.group(1), int(m.group(2)), int(m.group(3))


def load_queue_file(path: str, argument: str = "--queues") -> dict[str, Any]:
    """A queue file (or a scenario: its ``queues:``, ``gpu_types:``, ``policy:``) as a mapping,
    checked; an unreadable or invalid file is a WhatifError naming ``argument`` and the file."""
    from scheduler.simulator.scenario import load_yaml

    try:
        data = load_yaml(path, "queue file")
    except ScenarioError as exc:
        raise WhatifError(argument, str(exc)) from exc
    return queue_mapping(data, path, argument)


def queue_text(text: str, argument: str = "queues") -> dict[str, Any]:
    """:func:`load_queue_file` of a queue file's text (the API's ``queues`` field)."""
    import yaml

    from gpuq.yamlsafe import safe_load

    try:
        data = safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark else ""
        raise WhatifError(argument, f"{where}invalid YAML: {getattr(exc, 'problem', None) or exc}") from exc
    return queue_mapping(data, "(text)", argument)


def queue_mapping(data: Any, source: str, argument: str) -> dict[str, Any]:
    from accounting.errors import QueueConfigError
    from accounting.queues import parse_queue_config

    if not isinstance(data, Mapping) or not isinstance(data.get("queues"), Mapping):
        raise WhatifError(argument, f"{source}: expected a queue file with a 'queues:' mapping")
    out = {k: data[k] for k in ("queues", "gpu_types", "policy") if k in data}
    try:
        parse_queue_config(out)                     # as gpuq serve reads it
    except QueueConfigError as exc:
        raise WhatifError(argument, f"{source}: {exc.located()}") from exc
    if "policy" not in out:
        # gpuq serve gives the root of a file without policy: the production default, which its
        # top-level queues inherit key by key but may widen; a scenario's root is open instead, so
        # the default goes on each top-level queue (the same bounds, everywhere below)
        out["queues"] = {name: {**q, "policy": {**PRODUCTION_POLICY, **(q.get("policy") or {})}}
                         if isinstance(q, Mapping) else q for name, q in out["queues"].items()}
    return out


# -- history -> scenario ---------------------------------------------------------------------------
@dataclass(slots=True)
class Plan:
    """How the history became the scenario: its clock and what it did with each entry."""

    zero_s: float
    until_s: float
    carried: set[str] = field(default_factory=set)        # waiting or running at --from
    unfinished: set[str] = field(default_factory=set)     # not done by --to
    left_out: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    observed: dict[str, dict[str, Any]] = field(default_factory=dict)

    def leave_out(self, why: str) -> None:
        self.left_out[why] = self.left_out.get(why, 0) + 1


def scenario_of(h: History, queues: Mapping[str, Any], scheduler: Mapping[str, Any]) -> tuple[dict[str, Any], Plan]:
    """The scenario of ``h`` under ``queues`` (a queue file's mapping, :func:`load_queue_file`) and
    the scheduler settings ``scheduler`` (``preemption``, ``preemption_delay_s``,
    ``cycle_interval_s``); and the :class:`Plan` it followed."""
    from accounting.queues import parse_queue_config

    leaves = set(parse_queue_config(dict(queues)).leaves())
    work = [e for e in h.entries if e.kind == WORKLOAD]
    kept = []
    plan = Plan(0.0, 0.0)
    unknown: dict[str, int] = {}
    for e in work:
        if e.state == "cancelled":
            plan.leave_out("cancelled before it ran")
        elif e.queue not in leaves:
            plan.leave_out("queue not a leaf of the queue file")
            unknown[e.queue] = unknown.get(e.queue, 0) + 1
        else:
            kept.append(e)
    if unknown:
        plan.notes.append("left out, their queue is not a leaf of the queue file: "
                          + ", ".join(f"{q or '(none)'} ({n})" for q, n in sorted(unknown.items())))
    if not kept:
        raise WhatifError("--from", f"no workload of cluster {h.cluster!r} to replay between "
                                    f"{_iso(h.start_s)} and {_iso(h.end_s)}"
                          + (f" ({', '.join(f'{n} {why}' for why, n in plan.left_out.items())})" if plan.left_out else ""))
    carried = [e for e in kept if e.submit_s < h.start_s]
    zero = h.start_s if carried else min(e.submit_s for e in kept)
    until = max(h.end_s - zero, 0.0)
    plan.zero_s, plan.until_s = zero, until
    beyond = 2.0 * until + 1.0            # longer than the window: not done inside it, in any replay
    workloads = []
    for e in kept:
        inside = [r.within(zero, h.end_s) for r in e.runs]
        if e.state == FINISHED:
            duration = sum(inside) if e.checkpoint else (inside[-1] if inside else 0.0)
            duration = max(duration, 0.001)
        else:
            plan.unfinished.add(e.id)
            duration = e.declared_s if e.declared_s > 0 and e.submit_s >= zero else beyond
        if e.submit_s < zero:
            plan.carried.add(e.id)
        w: dict[str, Any] = {"id": e.id, "queue": e.queue, "submit": round(max(e.submit_s, zero) - zero, 6),
                             "duration": round(duration, 6), "pods": e.pods, "gpus_per_pod": gpus_out(e.gpus_per_pod),
                             "priority": e.priority, "preemptible": e.preemptible, "checkpoint": e.checkpoint,
                             "originator": e.originator}
        if e.gpu_types:
            w["gpu_types"] = list(e.gpu_types)
        workloads.append(w)
        _observe(plan, e, zero, h.end_s, inside)
    nodes: list[dict[str, Any]] = [{"name": n.name, "gpu_type": n.gpu_type, "gpus": n.gpus}
                                   for n in h.nodes if n.gpus >= 1]
    by_name = {n["name"]: n for n in nodes}
    fixed = []
    for e in h.entries:
        if e.kind != FIXED:
            continue
        for k, r in enumerate(e.runs):
            if r.end_s is not None and r.end_s <= zero:
                continue
            for node, g in r.placement.items():
                n = by_name.get(node)
                if n is None:
                    plan.notes.append(f"fixed load {e.id} on node {node}, which is in no inventory: left out")
                    continue
                # fixed load holds whole devices: a foreign share holds its device (rounded up)
                item: dict[str, Any] = {"id": _fixed_id(e.id, k, node, r), "node": node,
                                        "gpus": min(math.ceil(g), n["gpus"]),
                                        "start": round(max(r.start_s, zero) - zero, 6)}
                if r.end_s is not None:
                    item["end"] = round(r.end_s - zero, 6)
                    if item["end"] <= item["start"]:
                        continue
                if e.queue in leaves:
                    item["queue"] = e.queue
                fixed.append(item)
    scenario: dict[str, Any] = {
        "name": f"{h.cluster} {_iso(zero)}..{_iso(h.end_s)}", "until": round(until, 6),
        "scheduler": dict(scheduler), "nodes": nodes, **{k: v for k, v in queues.items()},
        "workloads": workloads,
    }
    if fixed:
        scenario["fixed"] = fixed
    return scenario, plan


def _fixed_id(eid: str, k: int, node: str, r: Any) -> str:
    return eid if k == 0 and len(r.placement) == 1 else f"{eid}@{k}:{node}"


def _observe(plan: Plan, e: Any, zero: float, end: float, inside: list[float]) -> None:
    """The history's own figures per queue, over the same window: GPU-hours of its runs, waits of
    the workloads submitted inside it (submit to first run), preemptions."""
    q = plan.observed.setdefault(e.queue, {"gpu_seconds": 0.0, "waits": [], "preemptions": 0})
    q["gpu_seconds"] += sum(s * float(r.gpus) for s, r in zip(inside, e.runs))
    if e.submit_s >= zero and e.runs:
        q["waits"].append(e.runs[0].start_s - e.submit_s)
    q["preemptions"] += e.preemptions


def apply_change(scenario: Mapping[str, Any], change: Change) -> tuple[dict[str, Any], list[str]]:
    """The scenario with ``change`` made; and notes on what moved (fixed load of removed nodes)."""
    from scheduler.compare import with_queues

    out = dict(scenario)
    notes: list[str] = []
    nodes = [dict(n) for n in scenario["nodes"]]
    names = [n["name"] for n in nodes]
    for name in change.remove_nodes:
        if name not in names:
            from accounting.queue_names import nearest

            raise WhatifError("--remove-nodes", f"unknown node {name!r}; {nearest(name, names, 'nodes')}")
    gone = set(change.remove_nodes)
    kept = [n for n in nodes if n["name"] not in gone]
    taken = {n["name"] for n in nodes}
    for gpu_type, gpus, count in change.add_nodes:
        base = f"added-{re.sub(r'[^a-z0-9]+', '-', gpu_type.lower()).strip('-') or 'gpu'}"
        k = 0
        for _ in range(count):
            while f"{base}-{k}" in taken:
                k += 1
            taken.add(f"{base}-{k}")
            kept.append({"name": f"{base}-{k}", "gpu_type": gpu_type, "gpus": gpus})
    out["nodes"] = kept
    if gone and scenario.get("fixed"):
        type_of = {n["name"]: n["gpu_type"] for n in nodes}
        fixed = []
        for f in scenario["fixed"]:
            if f["node"] not in gone:
                fixed.append(f)
                continue
            other = next((n for n in kept if n["gpu_type"] == type_of[f["node"]] and n["gpus"] >= f["gpus"]), None)
            if other is None:
                notes.append(f"fixed load {f['id']} was on removed node {f['node']}, and no node of its type is left: "
                             f"left out")
                continue
            fixed.append({**f, "node": other["name"]})
        out["fixed"] = fixed
        if not fixed:
            del out["fixed"]
    if change.queues is not None:
        try:
            out = with_queues(out, change.queues, change.queues_source)
        except ScenarioError as exc:
            raise WhatifError("--queues", str(exc)) from exc
        if "policy" not in change.queues:       # its own defaults are on its queues (queue_mapping)
            out.pop("policy", None)
        from accounting.queues import parse_queue_config

        leaves = set(parse_queue_config({k: out[k] for k in ("queues", "gpu_types", "policy") if k in out}).leaves())
        if out.get("fixed"):
            out["fixed"] = [f if f.get("queue") in leaves or "queue" not in f
                            else {k: v for k, v in f.items() if k != "queue"} for f in out["fixed"]]
    return out, notes


# -- running and comparing ----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Replay:
    scenario: dict[str, Any]
    parsed: Any              # the Scenario
    result: Any              # its SimResult


def replay(scenario: Mapping[str, Any], source: str) -> Replay:
    from scheduler.simulator import parse_scenario, run_scenario

    try:
        sc = parse_scenario(scenario, source=source)
    except ScenarioError as exc:
        raise WhatifError(source, str(exc)) from exc
    return Replay(dict(scenario), sc, run_scenario(sc))


def view(r: Replay, plan: Plan) -> dict[str, dict[str, Any]]:
    """Per leaf queue and ``(all)``: :data:`METRICS` of one replay. Waits leave the carried-in
    workloads out; utilization is over the whole window (``until``) and the run's own GPUs;
    ``lost_gpu_hours`` are the GPU-hours of runs a preemption cut short of a workload that does not
    checkpoint (it starts over), so GPU-hours less lost GPU-hours is the work done, the same in any
    replay where the same workloads finish."""
    from scheduler.quality import quality

    summary = r.result.summary
    q = quality(r.parsed.cluster, r.parsed.workloads, r.result.events, summary, r.result.held)
    capacity = sum(n.gpus for n in r.parsed.cluster.nodes) * plan.until_s
    by_id = {w.id: w for w in r.parsed.workloads}
    submit: dict[str, float] = {}
    started: dict[str, float] = {}
    waits: dict[str, list[float]] = {name: [] for name in summary["queues"]}
    lost: dict[str, float] = dict.fromkeys(summary["queues"], 0.0)
    for e in r.result.events:
        kind, wid = e["event"], e["workload"]
        if kind == "submit" and wid not in plan.carried:
            submit[wid] = e["t"]
        elif kind == "admit":
            started[wid] = e["t"]
            if wid in submit:
                waits[e["queue"]].append(e["t"] - submit.pop(wid))
        elif kind == "preempt" and not by_id[wid].checkpoint:
            lost[e["queue"]] += float(by_id[wid].gpus) * (e["t"] - started[wid])
    out: dict[str, dict[str, Any]] = {}
    for name, s in summary["queues"].items():
        out[name] = _row(waits[name], s["gpu_seconds"], lost[name], capacity, s["preempted"],
                         q[name]["guarantee_violation_s"])
    everything = [w for ws in waits.values() for w in ws]
    total = sum(s["gpu_seconds"] for s in summary["queues"].values())
    out[ALL] = _row(everything, total, sum(lost.values()), capacity, summary["preemptions"],
                    q[ALL]["guarantee_violation_s"])
    return out


def _row(waits: list[float], gpu_seconds: float, lost_s: float, capacity: float, preemptions: int,
         violation_s: float) -> dict[str, Any]:
    from scheduler.simulator.report import percentile

    return {"wait_p50_s": percentile(waits, 50), "wait_p90_s": percentile(waits, 90),
            "gpu_hours": round(gpu_seconds / 3600.0, 6) + 0.0, "lost_gpu_hours": round(lost_s / 3600.0, 6) + 0.0,
            "utilization": round(gpu_seconds / capacity, 6) + 0.0 if capacity > 0 else 0.0,
            "preemptions": preemptions, "guarantee_violation_s": violation_s}


def observed_view(plan: Plan) -> dict[str, dict[str, Any]]:
    from scheduler.simulator.report import percentile

    out: dict[str, dict[str, Any]] = {}
    for q, o in sorted(plan.observed.items()):
        out[q] = {"wait_p50_s": percentile(o["waits"], 50), "wait_p90_s": percentile(o["waits"], 90),
                  "gpu_hours": round(o["gpu_seconds"] / 3600.0, 6) + 0.0, "preemptions": o["preemptions"]}
    allw = [w for o in plan.observed.values() for w in o["waits"]]
    out[ALL] = {"wait_p50_s": percentile(allw, 50), "wait_p90_s": percentile(allw, 90),
                "gpu_hours": round(sum(o["gpu_seconds"] for o in plan.observed.values()) / 3600.0, 6) + 0.0,
                "preemptions": sum(o["preemptions"] for o in plan.observed.values())}
    return out


def _delta(a: Any, b: Any) -> Any:
    if a is None or b is None:
        return None
    d = b - a
    return round(d, 6) + 0.0 if isinstance(d, float) else d


def _fixed_summary(r: Replay) -> dict[str, Any]:
    f = r.result.summary.get("fixed") or {"held": 0, "displaced": [], "gpu_seconds": 0.0}
    return {"held": f["held"], "displaced": len(f["displaced"]), "gpu_hours": round(f["gpu_seconds"] / 3600.0, 6) + 0.0}


@dataclass(frozen=True, slots=True)
class Outcome:
    report: dict[str, Any]
    before: Replay
    after: Replay


def whatif(h: History, queues: Mapping[str, Any], scheduler: Mapping[str, Any], change: Change) -> Outcome:
    """Replay ``h`` under ``queues`` (before) and with ``change`` (after); with no change the second
    replay is the first (the simulator gives the same bytes for the same scenario)."""
    scenario, plan = scenario_of(h, queues, scheduler)
    before = replay(scenario, "the history as it happened")
    notes = list(h.notes) + plan.notes
    if change.empty:
        after = before
    else:
        changed, moved = apply_change(scenario, change)
        notes += moved
        after = replay(changed, "the history under the change")
    vb, va = view(before, plan), view(after, plan)
    names = list(vb) + [q for q in va if q not in vb]
    rows = {q: {m: {"before": (vb.get(q) or {}).get(m), "after": (va.get(q) or {}).get(m),
                    "delta": _delta((vb.get(q) or {}).get(m), (va.get(q) or {}).get(m))} for m in METRICS}
            for q in names if q != ALL}
    rows[ALL] = {m: {"before": vb[ALL][m], "after": va[ALL][m], "delta": _delta(vb[ALL][m], va[ALL][m])}
                 for m in METRICS}
    report = {
        "cluster": h.cluster, "from": _iso(h.start_s), "to": _iso(h.end_s), "clock_start": _iso(plan.zero_s),
        "change": change.describe(),
        "workloads": {"replayed": len(before.parsed.workloads), "carried_in": len(plan.carried),
                      "unfinished_at_end": len(plan.unfinished), "left_out": dict(sorted(plan.left_out.items()))},
        "fixed": {"before": _fixed_summary(before), "after": _fixed_summary(after)},
        "gpus": {"before": sum(n.gpus for n in before.parsed.cluster.nodes),
                 "after": sum(n.gpus for n in after.parsed.cluster.nodes)},
        "observed": observed_view(plan),
        "queues": rows,
        "notes": notes,
    }
    return Outcome(report, before, after)


def _signed(v: Any) -> Any:
    if v is None:
        return None
    text = f"{v:.6g}" if isinstance(v, float) else str(v)
    return text if v <= 0 else "+" + text


def render_table(report: Mapping[str, Any]) -> str:
    from gpuq.output import render

    w, fx, obs = report["workloads"], report["fixed"], report["observed"][ALL]
    change = report["change"]
    what = "; ".join(x for x in (
        f"queues of {change['queues']}" if change["queues"] else "",
        f"add {', '.join(change['add_nodes'])}" if change["add_nodes"] else "",
        f"remove {', '.join(change['remove_nodes'])}" if change["remove_nodes"] else "") if x) or "no change"
    lines = [f"{report['cluster']}: {report['from']} to {report['to']} (clock from {report['clock_start']}); "
             f"before = as it happened, after = {what}",
             f"{w['replayed']} workloads replayed ({w['carried_in']} carried in from before the window, "
             f"{w['unfinished_at_end']} not done at its end)"
             + (f"; left out: {', '.join(f'{n} {why}' for why, n in w['left_out'].items())}" if w["left_out"] else ""),
             f"GPUs {report['gpus']['before']} before, {report['gpus']['after']} after; history recorded "
             f"{obs['gpu_hours']:g} GPU-hours of these workloads, the replay as it happened "
             f"{report['queues'][ALL]['gpu_hours']['before']:g}"]
    if fx["before"]["held"] or fx["after"]["held"]:
        lines.append(f"foreign work as fixed load: {fx['before']['gpu_hours']:g} GPU-hours before, "
                     f"{fx['after']['gpu_hours']:g} after"
                     + (f" ({fx['after']['displaced']} displaced: no room left for it)" if fx["after"]["displaced"] else ""))
    lines += [f"note: {n}" for n in report["notes"]]
    rows: list[list[Any]] = []
    for q, metrics in report["queues"].items():
        for i, (m, t) in enumerate(metrics.items()):
            rows.append([q if i == 0 else "", LABELS[m], t["before"], t["after"], _signed(t["delta"])])
    return "\n".join(lines) + "\n" + render(["queue", "metric", "before", "after", "delta"], rows, "table")


def write_out(outcome: Outcome, h: History, out_dir: str | Path) -> Path:
    """``DIR/before/`` and ``DIR/after/``: each replay's ``events.jsonl`` and ``summary.json`` (the
    simulator's format) and its ``scenario.yaml`` (``gpuq simulate`` replays it again);
    ``DIR/history.json`` (``gpuq whatif --history`` reads it) and ``DIR/whatif.json`` (the report)."""
    import yaml

    from scheduler.simulator import write_outputs

    out = Path(out_dir)
    for name, r in (("before", outcome.before), ("after", outcome.after)):
        write_outputs(r.result, out / name)
        (out / name / "scenario.yaml").write_text(yaml.safe_dump(r.scenario, sort_keys=False))
    (out / "history.json").write_text(json.dumps(h.to_json(), indent=1) + "\n")
    (out / "whatif.json").write_text(json.dumps(outcome.report, indent=2) + "\n")
    return out


def _iso(t: float) -> str:
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- the command ------------------------------------------------------------------------------------
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuq whatif",
        description="What if the queues or the nodes had been different? Takes the workloads gpuq saw "
        "over a period (when each was submitted, its shape, how long it ran; other schedulers' pods as "
        "fixed load), replays them as they happened and again with the change, and prints side by side "
        "per queue: waits, GPU-hours, utilization, preemptions and time below guarantee (docs/WHATIF.md).")
    p.add_argument("--from", dest="start", metavar="TIME", default="-7d",
                   help="start: an ISO 8601 time, or back from now like -7d, -12h (default -7d)")
    p.add_argument("--to", dest="end", metavar="TIME", default="now", help="end, as --from (default now)")
    p.add_argument("--queues", metavar="FILE", help="the change: replay under this queue file instead")
    p.add_argument("--add-nodes", action="append", default=[], metavar="TYPE:GPUSxCOUNT",
                   help="the change: add COUNT nodes of GPUS GPUs of TYPE (H100:8x4); may be repeated")
    p.add_argument("--remove-nodes", nargs="+", action="extend", default=[], metavar="NAME",
                   help="the change: remove these nodes")
    p.add_argument("--cluster", metavar="NAME", help="whose history: the scheduler's cluster name "
                   "(default: scheduler.cluster)")
    p.add_argument("--history", metavar="FILE", help="replay a history saved by --out (DIR/history.json) "
                   "instead of reading the store")
    p.add_argument("--out", metavar="DIR", help="also keep both replays (DIR/before, DIR/after: events.jsonl, "
                   "summary.json, scenario.yaml), the history and the report (DIR/whatif.json)")
    p.add_argument("--format", "-f", choices=["table", "json"], default="table", help="a table (default) or JSON")
    p.add_argument("--json", action="store_const", const="json", dest="format", help="the same as --format json")
    return p


def _glue(argv: Sequence[str]) -> list[str]:
    """``--from -7d`` as ``--from=-7d`` (argparse would take ``-7d`` for an option)."""
    out: list[str] = []
    it = iter(argv)
    for tok in it:
        if tok in ("--from", "--to"):
            nxt = next(it, None)
            out.append(tok if nxt is None else f"{tok}={nxt}")
        else:
            out.append(tok)
    return out


def scheduler_settings(settings: Any) -> dict[str, Any]:
    s = settings.scheduler
    out: dict[str, Any] = {"preemption": bool(s.preemption), "preemption_delay_s": float(s.preemption_delay_s),
                           "cycle_interval_s": float(s.cycle_interval_s)}
    reclaim = getattr(s, "reclaim", "guarantee")
    if reclaim != "guarantee":           # the default is left out: a scenario without it is as before
        out["reclaim"] = reclaim
    return out


def base_queues(settings: Any) -> dict[str, Any]:
    """The queues gpuq runs under (``queues_file``); none configured: one open queue per queue the
    history names cannot be guessed, so that is an error naming the setting."""
    if not settings.queues_file:
        raise WhatifError("queues_file", "no queue file is configured: gpuq whatif replays under the queues "
                                         "gpuq runs with (set queues_file in the config)")
    return load_queue_file(settings.queues_file, "queues_file")


def declared_nodes(settings: Any) -> list[tuple[str, str, int]]:
    path = settings.scheduler.nodes_file
    if not path:
        return []
    from scheduler.simulator.scenario import load_nodes

    return [(n.name, n.gpu_type, n.gpus) for n in load_nodes(path)]


def read(settings: Any, store: Any, cluster: str, start_s: float, end_s: float) -> History:
    from accounting.service import load_config
    from scheduler.history import read_history

    return read_history(store, cluster, start_s, end_s, load_config(settings.queues_file), declared_nodes(settings))


def window(start: str, end: str, now: float) -> tuple[float, float]:
    """``--from`` and ``--to`` (ISO 8601, ``now``, ``-7d``) as Unix seconds, the end after the start."""
    from accounting.errors import TimeSpecError
    from accounting.timeparse import parse_time

    try:
        t0, t1 = parse_time(start, now), parse_time(end, now)
    except TimeSpecError as exc:
        raise WhatifError("--from/--to", str(exc)) from exc
    if t1 <= t0:
        raise WhatifError("--to", f"{end} is not after --from {start}")
    return t0, t1


def main(argv: Sequence[str], settings: Any, *, now_s: float | None = None, store: Any = None) -> int:
    """Exit status 0; 2 for a bad argument, an unreadable file or an empty window (the message names
    the argument); 1 when the store cannot be read. ``store``: an open store to read (tests);
    default: the configured one."""
    import time

    from gpuq.errors import GpuqError

    p = parser()
    args = p.parse_args(_glue(argv))
    now = time.time() if now_s is None else now_s
    try:
        start, end = window(args.start, args.end, now)
        change = Change(load_queue_file(args.queues) if args.queues else None, args.queues or "",
                        tuple(parse_add_nodes(a) for a in args.add_nodes), tuple(args.remove_nodes))
        queues = base_queues(settings)
        if args.history:
            from scheduler.history import load_json

            try:
                h = load_json(args.history)
            except ScenarioError as exc:
                raise WhatifError("--history", str(exc)) from exc
        else:
            cluster = args.cluster or settings.scheduler.cluster
            h = _read_store(settings, store, cluster, start, end)
        outcome = whatif(h, queues, scheduler_settings(settings), change)
    except (WhatifError, ScenarioError) as exc:
        print(f"gpuq whatif: error: {exc}", file=sys.stderr)
        return 2
    except GpuqError as exc:
        print(f"gpuq whatif: error: {exc}", file=sys.stderr)
        return 1
    if args.out:
        write_out(outcome, h, args.out)
    if args.format == "json":
        sys.stdout.write(json.dumps(outcome.report, indent=2) + "\n")
    else:
        sys.stdout.write(render_table(outcome.report))
    return 0


def _read_store(settings: Any, store: Any, cluster: str, start: float, end: float) -> History:
    if store is not None:
        return read(settings, store, cluster, start, end)
    from gpuq.remote import open_unlocked_store

    s = open_unlocked_store(settings)
    try:
        return read(settings, s, cluster, start, end)
    finally:
        s.close()


# -- out of the API's process (POST /admin/whatif) ---------------------------------------------------
JOB_LIMIT_S = 900.0        # a replay running longer is stopped (a week of a busy cluster takes seconds to minutes)
JOBS_KEPT = 16


class WhatifBusy(Exception):
    """A what-if replay is already running (one at a time: each takes a CPU)."""


@dataclass(slots=True)
class Job:
    id: str
    by: str
    started_s: float
    dir: Path
    proc: Any                            # subprocess.Popen
    change: dict[str, Any]
    state: str = "running"               # running | done | failed
    ended_s: float | None = None
    report: dict[str, Any] | None = None
    error: str | None = None

    def view(self, with_report: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "state": self.state, "by": self.by, "started": _iso(self.started_s),
                               "ended": None if self.ended_s is None else _iso(self.ended_s), "change": self.change}
        if self.error is not None:
            out["error"] = self.error
        if with_report and self.report is not None:
            out["report"] = self.report
        return out


def job_input(h: History, base: Mapping[str, Any], scheduler: Mapping[str, Any], change: Change) -> dict[str, Any]:
    """What a replay process needs, as JSON: the history, the queues and settings, the change."""
    return {"history": h.to_json(), "base": dict(base), "scheduler": dict(scheduler),
            "change": {"queues": None if change.queues is None else dict(change.queues),
                       "queues_source": change.queues_source, "add_nodes": [list(a) for a in change.add_nodes],
                       "remove_nodes": list(change.remove_nodes)}}


class Jobs:
    """The what-if replays the API started, each in a process of its own (``python -m
    scheduler.whatif JOB_DIR``): the API only reads the history (a query) and checks the change;
    the replays, which take a CPU for seconds to minutes, never run in its process. One at a time
    (:class:`WhatifBusy`); one running past ``limit_s`` is killed; the last ``keep`` are kept, in
    memory only (a restart forgets them)."""

    def __init__(self, limit_s: float = JOB_LIMIT_S, keep: int = JOBS_KEPT) -> None:
        import threading

        self.limit_s, self.keep = limit_s, keep
        self._jobs: dict[str, Job] = {}
        self._lock = threading.Lock()

    def start(self, data: Mapping[str, Any], by: str, now_s: float, change: dict[str, Any]) -> Job:
        import os
        import subprocess
        import tempfile
        import uuid

        with self._lock:
            self._check_free(now_s)
            d = Path(tempfile.mkdtemp(prefix="gpuq-whatif-"))
            (d / "job.json").write_text(json.dumps(data))
            env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}   # no settings, no tokens
            env["GPUQ_WHATIF_LIMIT_S"] = str(int(self.limit_s))
            with open(d / "stderr.txt", "wb") as stderr:     # the child's own copy stays open
                proc = subprocess.Popen([sys.executable, "-m", "scheduler.whatif", str(d)], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=stderr, env=env,
                                        cwd=str(Path(__file__).resolve().parents[1]))
            job = Job(uuid.uuid4().hex[:12], by, now_s, d, proc, change)
            self._jobs[job.id] = job
            for old in list(self._jobs)[:-self.keep]:
                if self._jobs[old].state != "running":
                    del self._jobs[old]
            return job

    def check_free(self, now_s: float) -> None:
        """WhatifBusy while a replay runs (the API asks before it reads the history)."""
        with self._lock:
            self._check_free(now_s)

    def _check_free(self, now_s: float) -> None:
        for job in self._jobs.values():
            self._poll(job, now_s)
            if job.state == "running":
                raise WhatifBusy(f"a what-if started by {job.by} at {_iso(job.started_s)} is still running ({job.id})")

    def get(self, job_id: str, now_s: float) -> Job | None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is not None:
                self._poll(job, now_s)
            return job

    def _poll(self, job: Job, now_s: float) -> None:
        import shutil

        if job.state != "running":
            return
        rc = job.proc.poll()
        if rc is None:
            if now_s - job.started_s <= self.limit_s:
                return
            job.proc.kill()
            job.proc.wait()
            job.state, job.error = "failed", f"stopped: still running after {self.limit_s:.0f} s"
        else:
            result, err = job.dir / "result.json", job.dir / "error.txt"
            if rc == 0 and result.exists():
                job.state, job.report = "done", json.loads(result.read_text())
            else:
                job.state = "failed"
                job.error = err.read_text().strip() if err.exists() else f"the replay process exited with {rc}"
        job.ended_s = now_s
        shutil.rmtree(job.dir, ignore_errors=True)

    def close(self) -> None:
        with self._lock:
            for job in self._jobs.values():
                if job.state == "running":
                    job.proc.kill()


def run_job(job_dir: str) -> int:
    """``python -m scheduler.whatif JOB_DIR``: replay ``JOB_DIR/job.json`` (:func:`job_input`); the
    report goes to ``result.json``, a refusal to ``error.txt``. Exits when its parent (the API)
    is gone, or after ``GPUQ_WHATIF_LIMIT_S`` seconds."""
    import os
    import signal
    import threading
    import time

    from scheduler.history import from_json

    parent = os.getppid()

    def orphaned() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(3)

    threading.Thread(target=orphaned, daemon=True).start()
    signal.alarm(max(1, int(float(os.environ.get("GPUQ_WHATIF_LIMIT_S", JOB_LIMIT_S)))))
    d = Path(job_dir)
    try:
        job = json.loads((d / "job.json").read_text())
        c = job["change"]
        change = Change(c["queues"], c["queues_source"], tuple((str(t), int(g), int(n)) for t, g, n in c["add_nodes"]),
                        tuple(c["remove_nodes"]))
        outcome = whatif(from_json(job["history"]), job["base"], job["scheduler"], change)
    except (WhatifError, ScenarioError) as exc:
        (d / "error.txt").write_text(str(exc))
        return 2
    tmp = d / "result.json.tmp"
    tmp.write_text(json.dumps(outcome.report))
    tmp.replace(d / "result.json")
    return 0


if __name__ == "__main__":  # pragma: no cover - the API's replay process
    raise SystemExit(run_job(sys.argv[1]))
