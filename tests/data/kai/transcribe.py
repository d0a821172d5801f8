"""Transcribe KAI-Scheduler's reclaim and preempt integration cases into gpuq scenarios.

A tool run by hand (never by the tests), from the KAI checkout's test files::

    python tests/data/kai/transcribe.py KAI_REPO_DIR tests/data/kai

writes one scenario per case (``<file>/<NN>.yaml``, docs/SCENARIOS.md) and ``expect.yaml``: per
case its source, its class (comparable under ``reclaim: guarantee``, only under the future
``reclaim: fair_share``, or not comparable, with the reason) and KAI's outcome per job. SOURCE.md
says how KAI's concepts map; the expectations live outside the scenarios so that the scenario
loader never sees them.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).parent))
import golit  # noqa: E402

COMMIT = "72de64fc8eca10fa8cca26a20156178f3edbe092"
BASE = "pkg/scheduler/actions/integration_tests/"
FILES = ["reclaim/reclaim_test.go", "reclaim/reclaimFractional_test.go", "preempt/preempt_test.go",
         "preempt/preemptGang_test.go", "preempt/preemptFractional_test.go", "reclaim/reclaimMIG_test.go",
         "preempt/preemptMIG_test.go", "reclaim/reclaim_gpu_dra_test.go"]
KAI_DEFAULT_QUEUE_PRIORITY = 100    # commonconstants.DefaultQueuePriority: gpuq's 0
NON_PREEMPTIBLE_FROM = 100          # pkg/common/podgroup/preemptible.go: priority >= 100 is non-preemptible
DURATION = 1_000_000                # nothing finishes during a case

_FLOOR = ("gpuq's victim floor: a victim's queue never goes below its guarantee, a whole job at a time; "
          "KAI takes a whole job from a queue over its fair share even when that leaves it below its deserved quota")
_FLOOR_FAIR = ("gpuq's victim floor under reclaim: fair_share: a victim's queue never goes below its entitlement "
               "(nor its guarantee), a whole job at a time; KAI takes a whole job from a queue over its fair share "
               "even when that leaves it below its fair share")
# Cases read one by one (SOURCE.md); by (file, index). ``fair_share``: KAI's outcome follows from
# over-quota weights (the share beyond the deserved quota), toward which gpuq's `reclaim: guarantee`
# never reclaims: compared under the future `reclaim: fair_share` (issue 21).
FAIR_SHARE: dict[tuple[str, int], str] = {
    ("reclaim/reclaim_test.go", 0): "weights 3:1 on one node: queue0's fair share is above its deserved 1",
    ("reclaim/reclaim_test.go", 10): "weights 1:1 split the 6 GPUs beyond the quotas: queue1 reclaims 4 with deserved 1",
    ("reclaim/reclaim_test.go", 11): "queue0 reclaims above its deserved 2 with the GPU left over by the weights 2:1",
    ("reclaim/reclaim_test.go", 15): "departments weighted by their quotas: d2's queue reclaims 4 with deserved 1",
    ("reclaim/reclaim_test.go", 19): "weights 4:2, the leftover GPU to the larger remainder: queue1 reclaims 3 with deserved 2",
}
# ``within_queue``: KAI's preempt action (a job preempts lower-priority work of its own queue), which
# gpuq lacks today: compared under the future per-queue `within_queue: lower_priority` (issue 21).
WITHIN_QUEUE: dict[tuple[str, int], str] = {
    (f, i): "preemption within the queue (KAI's preempt action)"
    for f, i in [("preempt/preempt_test.go", 0), ("preempt/preempt_test.go", 1), ("preempt/preempt_test.go", 2),
                 ("preempt/preemptGang_test.go", 0), ("preempt/preemptGang_test.go", 2),
                 ("preempt/preemptFractional_test.go", 1), ("preempt/preemptFractional_test.go", 2)]
}
# Comparable under `reclaim: guarantee`, and gpuq decides otherwise, by a rule it keeps on purpose.
DIFFERS: dict[tuple[str, int], str] = {
    ("reclaim/reclaim_test.go", 1): _FLOOR + " (queue0 2 -> 0, deserved 1)",
    ("reclaim/reclaim_test.go", 3): _FLOOR + " (KAI takes queue0's younger 2-GPU job, 3 -> 1 with deserved 2; "
                                             "gpuq takes its 1-GPU job, 3 -> 2)",
    ("reclaim/reclaim_test.go", 6): _FLOOR + " (queue0 8 -> 0, deserved 6)",
    ("reclaim/reclaim_test.go", 17): _FLOOR + " (d1.queue0 2 -> 0, deserved 1, in a department d1 with no quota: "
                                              "KAI's d1 is over its fair share of 0, gpuq floors the leaf queue)",
    # under reclaim: fair_share (class fair_share): the same floor, at the entitlement
    ("reclaim/reclaim_test.go", 11): _FLOOR_FAIR + " (queue1 3 -> 0 with entitlement 2 and deserved 1: its "
                                                   "one job holds 3 GPUs, and queue0's 1-GPU reclaim needs it)",
}
# Not comparable by reading them, beyond what _unsupported() finds from their fields.
NOT_COMPARABLE: dict[tuple[str, int], str] = {
    ("reclaim/reclaim_test.go", 7): "the expectation pins a bug in KAI's allocate (the test's own name says so)",
}


def _slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")[:60]


def _unsupported(t: dict[str, Any], outer: dict[str, Any]) -> str | None:
    """Why a case cannot be written as a gpuq scenario at all, from the fields it uses."""
    jobs = t["Jobs"]
    if "TestDRAObjects" in t or any("ResourceClaimNames" in k for j in jobs for k in j["Tasks"]):
        return "DRA resource claims: gpuq has no DRA model"
    if any("RequiredMigInstances" in k for j in jobs for k in j["Tasks"]) or \
            any("MigInstances" in n for n in t["Nodes"].values()):
        return ("dynamic MIG instances requested by profile on mixed-strategy nodes: gpuq models MIG as fixed "
                "slice types (<TYPE>-mig-<profile>), not KAI's per-node instance packing")
    if any(j.get("RequiredCPUsPerTask") or j.get("RequiredMemoryPerTask") for j in jobs) or \
            any(n.get("CPUMillis") or n.get("CPUMemory") for n in t["Nodes"].values()) or \
            any("DeservedCPUs" in q or "DeservedMemory" in q for q in t["Queues"]):
        return "CPU/memory requests and quotas (useOnlyFreeResources): gpuq schedules and reclaims GPUs only"
    if any(j.get("RequiredGpuMemory") for j in jobs):
        return "GPU memory requests (gpu-memory): gpuq's shares are fractions of a device"
    if "TaskExpectedResults" in t or any(j.get("RootSubGroupSet") for j in jobs) or \
            any(len({k.get("State") for k in j["Tasks"]}) > 1 for j in jobs):
        return "elastic jobs (some pods running, some pending; reclaimed per pod): gpuq's gangs are all or nothing"
    for d in t.get("Departments", []):
        below = sum(q.get("DeservedGPUs", 0) for q in t["Queues"] if q.get("ParentQueue") == d["Name"])
        if d.get("DeservedGPUs") and d["DeservedGPUs"] < below:
            return (f"department {d['Name']}'s deserved quota {d['DeservedGPUs']} is below its queues' total {below}: "
                    "gpuq's queue file refuses a guarantee below its children's")
    if "JobExpectedResults" not in t:
        return "no per-job expectations in the test"
    for j in jobs:
        g = j.get("RequiredGPUsPerTask", 0)
        if g == 0:
            return f"job {j['Name']} asks no GPU"
        if g > 1 and g != int(g):
            return f"job {j['Name']} asks {g} GPUs per pod: gpuq takes shares below 1 or whole GPUs"
    return None


def _queues(t: dict[str, Any]) -> tuple[dict[str, Any], dict[str, str], dict[str, float]]:
    """gpuq's queue tree (departments as parent queues), each KAI queue's dotted path, and KAI's
    GPU over-quota weights by path (0 where unset, as KAI's test builder leaves them)."""
    tree: dict[str, Any] = {}
    path: dict[str, str] = {}
    weights: dict[str, float] = {}
    depts = {d["Name"]: d for d in t.get("Departments", [])}

    def spec(q: dict[str, Any], weight: float) -> dict[str, Any]:
        s: dict[str, Any] = {}
        if q.get("DeservedGPUs"):
            s["guaranteed"] = {"gpu": _num(q["DeservedGPUs"])}
        if q.get("MaxAllowedGPUs"):
            s["max"] = {"gpu": _num(q["MaxAllowedGPUs"])}
        if q.get("Priority") is not None:
            s["priority"] = q["Priority"] - KAI_DEFAULT_QUEUE_PRIORITY
        if weight > 0:
            s["weight"] = _num(weight)
        return s

    for name, d in depts.items():
        tree[name] = spec(d, d.get("DeservedGPUs", 0))     # KAI's builder: a department's weight is its quota
        tree[name]["queues"] = {}
        weights[name] = d.get("DeservedGPUs", 0)
    for q in t["Queues"]:
        w = q.get("GPUOverQuotaWeight", 0)
        parent = q.get("ParentQueue")
        if parent in depts:
            tree[parent]["queues"][q["Name"]] = spec(q, w)
            path[q["Name"]] = f"{parent}.{q['Name']}"
        else:
            tree[q["Name"]] = spec(q, w)
            path[q["Name"]] = q["Name"]
        weights[path[q["Name"]]] = w
    for name in depts:
        if not tree[name]["queues"]:
            del tree[name]["queues"]              # a department without queues: a leaf nobody uses
    return tree, path, weights


def _num(x: float) -> float | int:
    return int(x) if x == int(x) else x


def transcribe(go_file: str, index: int, case: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    t = case["TestTopologyBasic"]
    entry: dict[str, Any] = {"kai_file": BASE + go_file, "kai_test": t["Name"], "kai_index": index}
    why = _unsupported(t, case) or NOT_COMPARABLE.get((go_file, index))
    if why is not None:
        entry["class"] = "not_comparable"
        entry["why"] = why
        return None, entry
    tree, path, weights = _queues(t)
    # KAI's test builder: jobs stably sorted by priority (highest first), then created one minute
    # apart in that order, the first oldest. Running ones are admitted one per cycle in that
    # order (so the youngest is the last, as in KAI); pending ones are submitted after them.
    jobs = sorted(t["Jobs"], key=lambda j: -j["Priority"])
    running = [j for j in jobs if j["Tasks"][0].get("State") == "Running"]
    pending = [j for j in jobs if j["Tasks"][0].get("State") == "Pending"]
    if len(running) + len(pending) != len(jobs):
        entry["class"] = "not_comparable"
        other = sorted({j["Tasks"][0].get("State") for j in jobs} - {"Running", "Pending"})
        entry["why"] = (f"a job starts {'/'.join(map(str, other))} (being stopped): a gpuq replay starts "
                        "with work running or pending, none half-stopped")
        return None, entry
    workloads = []
    for i, j in enumerate(running):
        workloads.append(_workload(j, path, float(i)))
    r = len(running)
    for i, j in enumerate(pending):
        workloads.append(_workload(j, path, r + i / 1000))
    nodes = [{"name": n, "gpu_type": "GPU", "gpus": int(spec.get("GPUs", 0))} for n, spec in t["Nodes"].items()]
    if any(n["gpus"] < 1 for n in nodes):
        entry["class"] = "not_comparable"
        entry["why"] = "a node without GPUs"
        return None, entry
    scenario = {
        "name": f"kai: {t['Name']}",
        "until": r + 30,
        "scheduler": {"preemption": True, "preemption_delay_s": 0, "cycle_interval_s": 1},
        "nodes": nodes,
        "queues": tree,
        "workloads": workloads,
    }
    expected = {}
    for j in t["Jobs"]:
        status = t["JobExpectedResults"][j["Name"]]["Status"]
        was = j["Tasks"][0]["State"]
        expected[j["Name"]] = ("evicted" if was == "Running" else "pending") if status == "Pending" else "running"
    key = (go_file, index)
    if key in FAIR_SHARE:
        entry["class"], entry["why"] = "fair_share", FAIR_SHARE[key]
    elif key in WITHIN_QUEUE:
        entry["class"], entry["why"] = "within_queue", WITHIN_QUEUE[key]
    else:
        entry["class"] = "guarantee"
    if key in DIFFERS:
        entry["differs"] = DIFFERS[key]
    entry["preloaded"] = [j["Name"] for j in running]
    entry["kai_weights"] = weights
    entry["expect"] = expected
    return scenario, entry


def _workload(j: dict[str, Any], path: dict[str, str], submit: float) -> dict[str, Any]:
    w: dict[str, Any] = {"id": j["Name"], "queue": path[j["QueueName"]], "submit": submit, "duration": DURATION}
    if len(j["Tasks"]) != 1:
        w["pods"] = len(j["Tasks"])
    w["gpus_per_pod"] = _num(j["RequiredGPUsPerTask"])
    w["priority"] = j["Priority"]
    if j["Priority"] >= NON_PREEMPTIBLE_FROM:
        w["preemptible"] = False
    return w


def main(kai_repo: str, out_dir: str) -> None:
    out = Path(out_dir)
    entries = []
    for go_file in FILES:
        text = Path(kai_repo, BASE, go_file).read_text()
        stem = Path(go_file).stem
        for i, case in enumerate(golit.test_cases(text)):
            scenario, entry = transcribe(go_file, i, case)
            key = f"{stem}/{i:02d}"
            entry = {"case": key, **entry}
            if scenario is not None:
                f = out / f"{key}.yaml"
                f.parent.mkdir(parents=True, exist_ok=True)
                f.write_text(f"# KAI-Scheduler {BASE}{go_file} @ {COMMIT[:12]}\n# {entry['kai_test']}\n"
                             + yaml.safe_dump(scenario, sort_keys=False, default_flow_style=None, width=120))
                entry["scenario"] = f"{key}.yaml"
            entries.append(entry)
    (out / "expect.yaml").write_text(
        "# KAI's outcome for each transcribed case (tests/test_kai_cases.py); written by transcribe.py\n"
        + yaml.safe_dump({"commit": COMMIT, "cases": entries}, sort_keys=False, width=120))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
