"""Import the Alibaba GPU cluster trace v2023 (openb) as a ``gpuq simulate`` scenario.

``import_alibaba_v2023(trace_dir)`` returns a scenario mapping in the format of
``docs/SCENARIOS.md``; ``gpuq import-trace alibaba-v2023 DIR --out FILE`` writes it
(:func:`import_trace_main`). docs/TRACES.md explains every choice with the counts on the real
trace. In short:

* **Nodes**: ``openb_node_list_gpu_node.csv``, one node group per (model, GPUs per node), named
  ``<model lower>-<gpus>g`` with its ``count`` (``t4-2g`` x 387 expands to ``t4-2g-0`` ..). The
  models become ``gpu_types``. CPU and memory are not carried (FORMAT.md has no field for them).
* **Pods**: only GPU pods (``num_gpu >= 1``). Each pod is a gang of one pod with ``num_gpu``
  GPUs (the trace has no gangs). A fractional pod (``num_gpu == 1``, ``0 < gpu_milli < 1000``)
  **keeps its share** of one GPU: ``gpu_milli`` 460 becomes ``gpus_per_pod: 0.46`` (thousandths,
  as the trace gives them and the scheduler keeps them exactly: :func:`scheduler.model.share_of_gpus`;
  issue 19). ``round_fractions=True`` (``--round-fractions``) rounds each up to one whole GPU
  instead, as the import did before the scheduler took shares, to compare the two replays. Pods of
  ``num_gpu >= 2`` (``gpu_milli`` 1000 in the shipped lists) and ``num_gpu == 1`` with ``gpu_milli``
  1000 stay whole; a ``gpu_milli`` of 0 or none on a one-GPU pod asks no share to keep and takes
  one whole GPU, and a multi-GPU pod below 1000 keeps its ``num_gpu`` whole GPUs (neither is in
  the shipped lists; both are counted). The import counts each kind. ``gpu_spec`` ``A|B`` becomes
  ``gpu_types: [A, B]`` (that order, duplicates dropped, types without nodes dropped); empty means
  any type.
* **Times**: ``submit = (creation_time - first creation_time) * time_scale``; ``duration =
  (deletion_time - scheduled_time) * duration_scale``. ``time_scale < 1`` packs arrivals closer,
  which raises the load. A pod never scheduled in the trace (the 861 GPU pods still ``Pending``
  at its end) has no running time: it is **skipped** unless ``pending_duration_s`` gives one.
  Pods that ran until the end of the trace keep the censored running time the trace shows.
* **QoS**: priority ``LS 2, Guaranteed 2, Burstable 1, BE 0``; LS and Guaranteed pods are not
  preemptible, Burstable and BE are (so the scheduler admits them only within their queue's
  guarantee). No checkpointing (a preempted pod starts over). The queues the importer creates
  carry an explicit ``policy`` allowing what their pods ask: ``max_priority`` their highest
  priority, ``non_preemptible`` whether any is not preemptible.
* **Queues**: see :mod:`scheduler.traces_queues` (``hash:N`` by CRC-32 of the pod name, ``qos``,
  an explicit QoS table, or a user queue file). Created queues get ``guaranteed.gpu`` in
  proportion to their GPU-seconds demand (integers summing to the cluster's GPUs) and
  ``max.gpu`` the whole cluster.
* **Ids** are the pod names (``openb-pod-0017``). The output depends only on the inputs.
* **Inflation** (``inflate=K``, ``--inflate K``): while the offered load (GPU-seconds demanded
  over cluster GPUs x the span of submit times, after the scales) is below K, add a copy of a pod
  drawn uniformly with replacement (``random.Random(seed)``), as the FGD paper (Weng et al., ATC
  2023) inflates these traces; a copy keeps the pod's shape, QoS, submit time and running time, is
  named ``<pod>-x<n>`` and picks its queue by the rule like any pod. Already at or above K: no change.
* **Large outputs**: ``gpuq import-trace`` writes the workloads as JSON lines next to the scenario
  (``workloads_file:``, docs/SCENARIOS.md) with ``--workloads-file`` or above
  ``JSONL_THRESHOLD`` workloads.
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from gpuq.yamlsafe import safe_load

from scheduler.model import Gpus, gpus_out, gpus_text
from scheduler.progress import Progress
from scheduler.traces_queues import Assignment, TraceError, default_quotas, parse_assignment

__all__ = ["ImportStats", "TraceError", "TraceImport", "dump_scenario", "import_alibaba_v2023",
           "import_trace_main", "load_alibaba_v2023", "offered_load", "round_up_shares", "write_scenario"]

NODES_FILE = "openb_node_list_gpu_node.csv"
PODS_FILE = "openb_pod_list_default.csv"
JSONL_THRESHOLD = 20_000         # more workloads than this: gpuq import-trace writes them as JSON lines
QOS_PRIORITY: Mapping[str, int] = MappingProxyType({"LS": 2, "Guaranteed": 2, "Burstable": 1, "BE": 0})
QOS_PREEMPTIBLE: Mapping[str, bool] = MappingProxyType(
    {"LS": False, "Guaranteed": False, "Burstable": True, "BE": True})
_NODE_COLUMNS = ("sn", "gpu", "model")
_POD_COLUMNS = ("name", "num_gpu", "gpu_milli", "gpu_spec", "qos", "creation_time",
                "deletion_time", "scheduled_time")


@dataclass(slots=True)
class ImportStats:
    """What an import kept, dropped and changed. ``skipped`` maps a reason to a count:
    ``cpu_only`` (no GPU), ``never_scheduled`` (no ``scheduled_time``), ``no_deletion_time``,
    ``nonpositive_duration``, ``unknown_gpu_type`` (``gpu_spec`` names no node type),
    ``unknown_qos``."""

    pods_file: str
    rule: str
    rows_read: int = 0
    imported: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    round_fractions: bool = False        # --round-fractions: shares rounded up to 1 whole GPU
    fractional: int = 0                  # num_gpu == 1, 0 < gpu_milli < 1000: a share of one GPU ...
    fractional_gpus: Decimal = Decimal(0)        # ... the sum of those shares
    rounded_fractional: int = 0          # of them, rounded up to 1 whole GPU (--round-fractions)
    kept_fractional: int = 0             # of them, kept as a share (the default)
    whole_no_milli: int = 0              # num_gpu == 1, gpu_milli 0 or empty: 1 whole GPU
    whole_multi_below: int = 0           # num_gpu >= 2, gpu_milli < 1000: num_gpu whole GPUs
    pending_given_duration: int = 0      # never scheduled, kept with pending_duration_s
    never_fits: int = 0                  # more GPUs than any node of an acceptable type has
    by_qos: Counter[str] = field(default_factory=Counter)
    nodes_by_type: dict[str, int] = field(default_factory=dict)
    cluster_gpus_by_type: dict[str, int] = field(default_factory=dict)
    requested_gpus_by_type: dict[str, Gpus] = field(default_factory=dict)  # first choice or "any"
    demand_gpu_s: dict[str, float] = field(default_factory=dict)            # per queue
    inflate: float | None = None         # the target offered load, when inflating
    load_before: float | None = None     # offered load before inflating
    load_after: float | None = None
    copies: int = 0                      # pods added by inflation

    def summary_lines(self) -> list[str]:
        skipped = sum(self.skipped.values())
        why = ", ".join(f"{k} {v}" for k, v in sorted(self.skipped.items())) or "none"
        gpus = sum(self.cluster_gpus_by_type.values())
        lines = [
            f"imported {self.imported} workloads from {self.rows_read} rows of {self.pods_file}",
            f"skipped {skipped}: {why}",
            self._fractions_line(),
            "qos: " + ", ".join(f"{k} {v}" for k, v in sorted(self.by_qos.items())),
            f"cluster: {sum(self.nodes_by_type.values())} nodes, {gpus} GPUs: "
            + ", ".join(f"{t} {n}" for t, n in sorted(self.cluster_gpus_by_type.items())),
            f"requested GPUs ({gpus_text(sum(self.requested_gpus_by_type.values()))}) by first choice: "
            + ", ".join(f"{t} {gpus_text(n)}" for t, n in sorted(self.requested_gpus_by_type.items())),
            f"queues ({self.rule}), GPU-hours demanded: "
            + ", ".join(f"{q} {d / 3600:.0f}" for q, d in self.demand_gpu_s.items()),
        ]
        if self.whole_no_milli:
            lines.append(f"one-GPU pods with gpu_milli 0 or empty, given 1 whole GPU: {self.whole_no_milli}")
        if self.whole_multi_below:
            lines.append(f"multi-GPU pods with gpu_milli below 1000, kept whole: {self.whole_multi_below}")
        if self.pending_given_duration:
            lines.append(f"never-scheduled pods kept with the default duration: {self.pending_given_duration}")
        if self.inflate is not None:
            lines.append(f"offered load {self.load_before:.3f} -> {self.load_after:.3f} (target {self.inflate:g}): "
                         f"{self.copies} sampled pod copies added" if self.copies else
                         f"offered load {self.load_before:.3f} is at or above the target {self.inflate:g}: "
                         "nothing added")
        if self.never_fits:
            lines.append(f"larger than any node of an acceptable type (the simulator rejects them): "
                         f"{self.never_fits}")
        return lines

    def _fractions_line(self) -> str:
        if self.round_fractions:
            return (f"fractional GPUs rounded up to 1 whole GPU: {self.rounded_fractional} "
                    f"(--round-fractions; their shares add up to {gpus_text(self.fractional_gpus)} GPUs)")
        return (f"fractional pods kept as shares of one GPU: {self.kept_fractional} "
                f"({gpus_text(self.fractional_gpus)} GPUs; rounded up they would take {self.kept_fractional})")


@dataclass(frozen=True, slots=True)
class TraceImport:
    scenario: dict[str, Any]
    stats: ImportStats


@dataclass(frozen=True, slots=True)
class _Pod:
    name: str
    gpus: Gpus                   # whole GPUs, or a Decimal of thousandths below 1 (a share)
    gpu_types: tuple[str, ...]
    qos: str
    creation_s: int
    duration_s: float


def _rows(path: Path, needed: tuple[str, ...], hint: str = "") -> Iterator[tuple[int, dict[str, str]]]:
    try:
        handle = path.open(newline="")
    except OSError as exc:
        raise TraceError(str(path), f"cannot read: {exc.strerror or exc}") from exc
    with handle:
        reader = csv.DictReader(handle)
        missing = [c for c in needed if c not in (reader.fieldnames or [])]
        if missing:
            raise TraceError(str(path), f"missing columns {', '.join(missing)} (has: "
                                        f"{', '.join(reader.fieldnames or [])}){hint}", line=1)
        for row in reader:
            yield reader.line_num, row


def _int(row: Mapping[str, str], col: str, path: Path, line: int) -> int | None:
    text = (row.get(col) or "").strip()
    if not text:
        return None
    try:
        return int(text)
    except ValueError:
        raise TraceError(str(path), f"column {col}: expected an integer, got {text!r}", line=line) from None


def _read_nodes(path: Path) -> tuple[list[dict[str, Any]], dict[str, int], dict[str, int]]:
    groups: Counter[tuple[str, int]] = Counter()
    for line, row in _rows(path, _NODE_COLUMNS):
        gpus, model = _int(row, "gpu", path, line), row["model"].strip()
        if gpus is None or gpus < 1 or not model:
            raise TraceError(str(path), "a GPU node needs gpu >= 1 and a model", line=line)
        groups[(model, gpus)] += 1
    nodes = [{"name": f"{m.lower()}-{g}g", "gpu_type": m, "gpus": g, "count": n}
             for (m, g), n in sorted(groups.items())]
    by_type: Counter[str] = Counter()
    gpus_by_type: Counter[str] = Counter()
    for (m, g), n in groups.items():
        by_type[m] += n
        gpus_by_type[m] += n * g
    return nodes, dict(sorted(by_type.items())), dict(sorted(gpus_by_type.items()))


def _seconds(x: float) -> int | float:
    r = round(x, 3)
    return int(r) if float(r).is_integer() else r


def _gpus(num_gpu: int, milli: int | None, stats: ImportStats) -> Gpus:
    """The GPUs one imported pod asks (module docstring), counted in ``stats``."""
    if num_gpu >= 2:
        if milli is not None and milli < 1000:
            stats.whole_multi_below += 1
        return num_gpu
    if milli is None or milli <= 0:
        stats.whole_no_milli += 1
        return 1
    if milli >= 1000:
        return 1
    share = Decimal(milli) / 1000
    stats.fractional += 1
    stats.fractional_gpus += share
    if stats.round_fractions:
        stats.rounded_fractional += 1
        return 1
    stats.kept_fractional += 1
    return share


def _read_pods(path: Path, types: Mapping[str, int], stats: ImportStats, *, limit: int | None,
               pending_duration_s: float | None, progress: Progress | None = None) -> list[_Pod]:
    pods: list[_Pod] = []
    hint = f"; {path.name} carries no times and cannot be replayed" if "multigpu" in path.name else ""
    total = None
    if progress is not None and progress.enabled:
        try:
            with path.open("rb") as f:
                total = max(sum(1 for _ in f) - 1, 1)
        except OSError:
            total = None
    for line, row in _rows(path, _POD_COLUMNS, hint):
        if limit is not None and len(pods) >= limit:
            break
        stats.rows_read += 1
        if progress is not None and progress.due():
            progress.show(stats.rows_read, total, f"reading {path.name}: row {stats.rows_read:,}, "
                          f"{len(pods):,} pods")
        num_gpu = _int(row, "num_gpu", path, line) or 0
        milli = _int(row, "gpu_milli", path, line)
        created = _int(row, "creation_time", path, line)
        scheduled = _int(row, "scheduled_time", path, line)
        deleted = _int(row, "deletion_time", path, line)
        qos = row["qos"].strip()
        spec = [t.strip() for t in row["gpu_spec"].split("|") if t.strip()]
        wanted = tuple(dict.fromkeys(t for t in spec if t in types))
        reason = None
        if num_gpu < 1:
            reason = "cpu_only"
        elif created is None:
            raise TraceError(str(path), "a GPU pod without creation_time", line=line)
        elif qos not in QOS_PRIORITY:
            reason = "unknown_qos"
        elif spec and not wanted:
            reason = "unknown_gpu_type"
        elif scheduled is None and pending_duration_s is None:
            reason = "never_scheduled"
        elif scheduled is not None and deleted is None:
            reason = "no_deletion_time"
        elif scheduled is not None and deleted is not None and deleted - scheduled <= 0:
            reason = "nonpositive_duration"
        if reason is not None:
            stats.skipped[reason] += 1
            continue
        if scheduled is None or deleted is None:
            assert pending_duration_s is not None
            duration: float = pending_duration_s
            stats.pending_given_duration += 1
        else:
            duration = deleted - scheduled
        assert created is not None
        pods.append(_Pod(row["name"].strip(), _gpus(num_gpu, milli, stats), wanted, qos, created, duration))
    return pods


def load_alibaba_v2023(trace_dir: str | Path, *, pods_file: str = PODS_FILE, assignment: str = "hash:8",
                       queues: Mapping[str, Any] | None = None, limit: int | None = None,
                       time_scale: float = 1.0, duration_scale: float = 1.0,
                       pending_duration_s: float | None = None, name: str | None = None,
                       scheduler: Mapping[str, Any] | None = None, inflate: float | None = None,
                       seed: int = 0, round_fractions: bool = False,
                       progress: Progress | None = None) -> TraceImport:
    """Read the trace and build the scenario and the import statistics (see the module docstring).

    ``assignment`` is a rule of :mod:`scheduler.traces_queues`; ``queues`` a parsed queue file
    (``{"queues": ..., "gpu_types": ...}``) whose quotas are used unchanged; ``limit`` stops after
    that many imported workloads; ``scheduler`` is copied to the scenario's ``scheduler:``;
    ``inflate`` the offered load to reach by adding sampled pod copies (``seed``; see the module
    docstring); ``round_fractions`` rounds each share of one GPU up to a whole GPU (as the import
    did before issue 19); ``progress`` shows how far the reading is.
    """
    if time_scale <= 0 or duration_scale <= 0:
        raise TraceError("--time-scale", "time_scale and duration_scale must be positive")
    if pending_duration_s is not None and pending_duration_s <= 0:
        raise TraceError("--pending-duration", "must be positive")
    if limit is not None and limit < 0:
        raise TraceError("--limit", "must not be negative")
    if inflate is not None and not inflate > 0:
        raise TraceError("--inflate", f"the target offered load must be positive, got {inflate!r}")
    trace = Path(trace_dir)
    rule: Assignment = parse_assignment(assignment, queues)
    nodes, nodes_by_type, gpus_by_type = _read_nodes(trace / NODES_FILE)
    stats = ImportStats(pods_file=pods_file, rule=assignment, nodes_by_type=nodes_by_type,
                        cluster_gpus_by_type=gpus_by_type, round_fractions=round_fractions)
    pods = _read_pods(trace / pods_file, gpus_by_type, stats, limit=limit,
                      pending_duration_s=pending_duration_s, progress=progress)
    biggest: dict[str, int] = {}
    for n in nodes:
        biggest[n["gpu_type"]] = max(biggest.get(n["gpu_type"], 0), n["gpus"])
    start = min((p.creation_s for p in pods), default=0)
    if inflate is not None:
        pods = _inflate(pods, start, time_scale, duration_scale, sum(gpus_by_type.values()), inflate, seed, stats)
    demand: dict[str, float] = dict.fromkeys(rule.leaves, 0.0)
    asks: dict[str, tuple[int, bool]] = {}      # queue -> (highest priority, any non-preemptible)
    workloads: list[tuple[float, int, dict[str, Any]]] = []
    for i, pod in enumerate(pods):
        queue = rule.queue_of(pod.name, pod.qos)
        submit = _seconds((pod.creation_s - start) * time_scale)
        duration = max(_seconds(pod.duration_s * duration_scale), 0.001)
        demand[queue] = demand.get(queue, 0.0) + float(pod.gpus) * duration
        w: dict[str, Any] = {"id": pod.name, "queue": queue, "submit": submit, "duration": duration,
                             "pods": 1, "gpus_per_pod": gpus_out(pod.gpus)}
        if pod.gpu_types:
            w["gpu_types"] = list(pod.gpu_types)
        w["priority"] = QOS_PRIORITY[pod.qos]
        w["preemptible"] = QOS_PREEMPTIBLE[pod.qos]
        top, pinned = asks.get(queue, (0, False))
        asks[queue] = (max(top, w["priority"]), pinned or not w["preemptible"])
        workloads.append((submit, i, w))
        stats.by_qos[pod.qos] += 1
        first = pod.gpu_types[0] if pod.gpu_types else "any"
        stats.requested_gpus_by_type[first] = stats.requested_gpus_by_type.get(first, 0) + pod.gpus
        if pod.gpus > max(biggest[t] for t in (pod.gpu_types or tuple(biggest))):
            stats.never_fits += 1
    workloads.sort(key=lambda x: (x[0], x[1]))
    stats.imported = len(workloads)
    stats.demand_gpu_s = demand
    total_gpus = sum(gpus_by_type.values())
    types: dict[str, Any] = {t: {} for t in gpus_by_type}
    if queues is not None:
        types = {**dict(queues.get("gpu_types") or {}), **{t: v for t, v in types.items()
                                                          if t not in (queues.get("gpu_types") or {})}}
        tree = dict(queues["queues"])
    else:
        tree = default_quotas(rule.leaves, demand, total_gpus)
        for q, spec in tree.items():         # what its pods ask, said explicitly (the queue policy)
            top, pinned = asks.get(q, (0, False))
            spec["policy"] = {"max_priority": top, "non_preemptible": pinned}
    scenario: dict[str, Any] = {"name": name or f"alibaba-v2023-{Path(pods_file).stem}"}
    if scheduler:
        scenario["scheduler"] = dict(scheduler)
    scenario.update({"gpu_types": types, "nodes": nodes, "queues": tree,
                     "workloads": [w for _, _, w in workloads]})
    return TraceImport(scenario, stats)


def _scaled(pod: _Pod, start: int, time_scale: float, duration_scale: float) -> tuple[float, float]:
    """(submit, duration) of a pod in the scenario, rounded as written."""
    return (_seconds((pod.creation_s - start) * time_scale),
            max(_seconds(pod.duration_s * duration_scale), 0.001))


def offered_load(workloads: list[Mapping[str, Any]], total_gpus: int) -> float:
    """GPU-seconds demanded over ``total_gpus`` x the span of submit times (inf for a zero span)."""
    if not workloads:
        return 0.0
    demand = sum(w.get("pods", 1) * w.get("gpus_per_pod", 1) * w["duration"] for w in workloads)
    subs = [w.get("submit", 0) for w in workloads]
    span = max(subs) - min(subs)
    return demand / (total_gpus * span) if span > 0 else float("inf")


def _inflate(pods: list[_Pod], start: int, time_scale: float, duration_scale: float, total_gpus: int,
             target: float, seed: int, stats: ImportStats) -> list[_Pod]:
    stats.inflate = target
    if not pods:
        raise TraceError("--inflate", "no pods were imported: nothing to sample from")
    scaled = [_scaled(p, start, time_scale, duration_scale) for p in pods]
    subs = [s for s, _ in scaled]
    span = max(subs) - min(subs)
    if span <= 0:
        raise TraceError("--inflate", "all imported pods are submitted at the same instant: the offered "
                                      "load (over the span of submit times) is undefined")
    capacity = total_gpus * span
    demand = sum(float(p.gpus) * d for p, (_, d) in zip(pods, scaled, strict=True))
    stats.load_before = demand / capacity
    rng = random.Random(seed)
    out = list(pods)
    n = len(pods)
    while demand < target * capacity:
        i = rng.randrange(n)
        p = pods[i]
        stats.copies += 1
        out.append(_Pod(f"{p.name}-x{stats.copies}", p.gpus, p.gpu_types, p.qos, p.creation_s, p.duration_s))
        demand += float(p.gpus) * scaled[i][1]
    stats.load_after = demand / capacity
    return out


def round_up_shares(scenario: Mapping[str, Any]) -> dict[str, Any]:
    """``scenario`` with every workload's share of one GPU (``gpus_per_pod`` below 1) rounded up
    to one whole GPU and all else the same: the same pods, times, queues and quotas. Replaying both
    measures what shares alone change (docs/TRACES.md, benchmarks/bench_trace_shares.py); an
    import with ``round_fractions`` differs in its default quotas too, which follow the demand."""
    work = [dict(w, gpus_per_pod=1) if w.get("gpus_per_pod", 1) < 1 else dict(w)
            for w in scenario.get("workloads") or ()]
    return {**scenario, "workloads": work}


def import_alibaba_v2023(trace_dir: str | Path, **options: Any) -> dict[str, Any]:
    """The scenario mapping of :func:`load_alibaba_v2023` (same keyword options)."""
    return load_alibaba_v2023(trace_dir, **options).scenario


def write_scenario(scenario: Mapping[str, Any], out: Path, comment: list[str] | None = None,
                   workloads_file: Path | None = None, progress: Progress | None = None) -> Path | None:
    """Write ``scenario`` as YAML to ``out``; with ``workloads_file`` the workloads go there as JSON
    lines (one object a line, the same fields as inline) and the YAML names it relative to ``out``'s
    directory. Returns the JSONL path, if one was written."""
    if workloads_file is None:
        out.write_text(dump_scenario(scenario, comment))
        return None
    work = scenario.get("workloads") or []
    try:
        rel = Path(workloads_file).resolve().relative_to(out.resolve().parent)
    except ValueError:
        rel = Path(workloads_file).resolve()
    head = {k: v for k, v in scenario.items() if k != "workloads"}
    head["workloads_file"] = rel.as_posix()
    dumps = json.JSONEncoder(separators=(", ", ": ")).encode
    with Path(workloads_file).open("w", encoding="utf-8") as f:
        for i, w in enumerate(work):
            f.write(dumps(w) + "\n")
            if progress is not None and progress.due():
                progress.show(i, len(work), f"writing {Path(workloads_file).name}: {i:,} workloads")
    text = "".join(f"# {c}\n" for c in comment or [])
    out.write_text(text + yaml.safe_dump(head, sort_keys=False, default_flow_style=None, width=110))
    return Path(workloads_file)


def dump_scenario(scenario: Mapping[str, Any], comment: list[str] | None = None) -> str:
    """YAML text of a scenario: block style, one flow-style line per workload and node."""
    head = {k: v for k, v in scenario.items() if k != "workloads"}
    text = "".join(f"# {c}\n" for c in comment or [])
    text += yaml.safe_dump(head, sort_keys=False, default_flow_style=None, width=110)
    rows = [yaml.safe_dump(w, sort_keys=False, default_flow_style=True, width=1 << 30).strip()
            for w in scenario.get("workloads", [])]
    return text + ("workloads:\n" + "".join(f"  - {r}\n" for r in rows) if rows else "workloads: []\n")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuq import-trace", description="Turn a public GPU trace into a "
                                "scenario for gpuq simulate (docs/TRACES.md).")
    p.add_argument("trace", choices=["alibaba-v2023"])
    p.add_argument("trace_dir", metavar="TRACE_DIR")
    p.add_argument("--out", "-o", required=True, help="scenario YAML to write ('-' for stdout)")
    p.add_argument("--pods-file", default=PODS_FILE)
    p.add_argument("--queues", default="hash:8", metavar="hash:N|qos|qos:QOS=Q,...|FILE.yaml",
                   help="queue rule, or a queue file whose leaves take the pods (default hash:8)")
    p.add_argument("--assign", default="hash", metavar="hash|qos|qos:QOS=Q,...",
                   help="with a queue file: how pods pick its leaf queues (default hash)")
    p.add_argument("--limit", type=int, help="stop after N imported workloads")
    p.add_argument("--time-scale", type=float, default=1.0, help="multiply submit times (0.1: 10x the load)")
    p.add_argument("--duration-scale", type=float, default=1.0, help="multiply running times")
    p.add_argument("--pending-duration", type=float, metavar="S",
                   help="keep never-scheduled pods with this running time (default: skip them)")
    p.add_argument("--name", help="scenario name (default alibaba-v2023-<pods file>)")
    p.add_argument("--cycle-interval", type=float, metavar="S",
                   help="seconds between scheduling cycles in the scenario (scheduler.cycle_interval_s)")
    p.add_argument("--no-preemption", action="store_true",
                   help="a scenario where gpuq never preempts (scheduler.preemption: false)")
    p.add_argument("--inflate", type=float, metavar="K", help="add sampled copies of pods until the offered "
                   "load (GPU-seconds over GPUs x span of submit times) is K (docs/TRACES.md)")
    p.add_argument("--seed", type=int, default=0, help="seed of --inflate's sampling (default 0)")
    p.add_argument("--round-fractions", action="store_true",
                   help="round each pod's share of one GPU (gpu_milli < 1000) up to a whole GPU, as "
                   "before gpuq took shares; default: keep it (gpu_milli 460 -> gpus_per_pod: 0.46)")
    p.add_argument("--workloads-file", nargs="?", const="", metavar="FILE.jsonl",
                   help="write the workloads as JSON lines to FILE.jsonl (default: next to --out, "
                   f"<out>.workloads.jsonl); automatic above {JSONL_THRESHOLD:,} workloads")
    return p


def import_trace_main(argv: list[str], settings: object = None) -> int:
    """``gpuq import-trace alibaba-v2023 TRACE_DIR --out FILE ...``; ``settings`` is accepted for
    the CLI's uniform signature and not used."""
    args = _parser().parse_args(argv)
    progress = Progress.auto("import-trace")
    sched: dict[str, Any] = {}
    if args.no_preemption:
        sched["preemption"] = False
    if args.cycle_interval is not None:
        sched["cycle_interval_s"] = args.cycle_interval
    try:
        queues, rule = None, args.queues
        if args.queues.endswith((".yaml", ".yml")) or Path(args.queues).is_file():
            queues, rule = _read_queue_file(Path(args.queues)), args.assign
        result = load_alibaba_v2023(args.trace_dir, pods_file=args.pods_file, assignment=rule,
                                    queues=queues, limit=args.limit, time_scale=args.time_scale,
                                    duration_scale=args.duration_scale,
                                    pending_duration_s=args.pending_duration, name=args.name,
                                    scheduler=sched or None, inflate=args.inflate, seed=args.seed,
                                    round_fractions=args.round_fractions, progress=progress)
        lines = result.stats.summary_lines()
        comment = [f"gpuq import-trace {' '.join(argv)}", *lines]
        n = len(result.scenario["workloads"])
        if args.out == "-":
            if args.workloads_file is not None:
                raise TraceError("--workloads-file", "needs --out FILE (the scenario names the file)")
            sys.stdout.write(dump_scenario(result.scenario, comment))
        else:
            out_path = Path(args.out)
            jsonl = None
            if args.workloads_file is not None or n > JSONL_THRESHOLD:
                jsonl = (Path(args.workloads_file) if args.workloads_file
                         else out_path.with_name(out_path.stem + ".workloads.jsonl"))
            written = write_scenario(result.scenario, out_path, comment, jsonl, progress)
            if written is not None:
                lines.append(f"workloads: {n} lines of JSON in {written}")
    except (TraceError, OSError) as exc:
        progress.close()
        print(f"gpuq import-trace: error: {exc}", file=sys.stderr)
        return 2
    progress.close()
    out = sys.stderr if args.out == "-" else sys.stdout
    for line in lines:
        print(line, file=out)
    if args.out != "-":
        print(f"wrote {args.out}", file=out)
    return 0


def _read_queue_file(path: Path) -> Mapping[str, Any]:
    try:
        data = safe_load(path.read_text()) or {}
    except OSError as exc:
        raise TraceError(str(path), f"cannot read: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise TraceError(str(path), f"invalid YAML: {exc}") from exc
    if not isinstance(data, Mapping) or not isinstance(data.get("queues"), Mapping):
        raise TraceError(str(path), "expected a mapping with a 'queues:' section")
    return data
