"""Issue 20: ``gpuq whatif`` over a history that holds Kueue's Workloads (``queues_from: kueue``).

A small stored history, written as ``gpuq serve`` writes it: the Kueue collector's own code
(:class:`collector.k8s_kueue.KueueIndex`) turns each Workload's changes (pending, admitted,
finished) into ``kueue_objects`` rows and the Workload's ledger rows (source ``kueue``), and the
Workloads' pods are the ledger's pod rows joined to them (``workload_id kueue/<ns>/<name>``). The
what-if reads it back (:func:`scheduler.history.read_history`) and replays the Workloads as
workloads of their queue (the LocalQueue resolved through the imported queue file), not as
foreign fixed load, then again with one more node."""
from __future__ import annotations

import datetime as dt
import io
import json
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import yaml

from accounting.queue_import.kueue import from_kueue
from collector.k8s_kueue import KueueIndex
from gpuq.settings import Settings
from gpuq.store.schema import COLUMNS
from scheduler.history import FIXED, WORKLOAD, read_history
from scheduler.whatif import main
from tests.test_kueue_advice import A100, FLAVOR, cluster_queue, local_queue, workload

T0 = 1_795_000_000.0                  # a fixed instant (2026-11-18T11:06:40Z)
NOW = T0 + 4000
CLUSTER = "prod"


def iso(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def at(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.UTC)


def lives(name: str, sets: list[tuple[int, int]], created: float, reserved: float, end: float | None) -> list[
        tuple[float, dict[str, Any]]]:
    """A Workload's changes as the collector sees them: pending at ``created``, admitted to llm at
    ``reserved``, finished at ``end`` (None: still running)."""
    pending = workload("team-llm", name, sets, queued=iso(created))
    admitted = workload("team-llm", name, sets, admitted=True, cq="llm", queued=iso(created))
    for c in admitted["status"]["conditions"]:
        c["lastTransitionTime"] = iso(reserved)
    out = [(created, pending), (reserved, admitted)]
    if end is not None:
        done = json.loads(json.dumps(admitted))
        done["status"]["conditions"].append({"type": "Finished", "status": "True", "reason": "Succeeded",
                                             "message": "done", "lastTransitionTime": iso(end)})
        out.append((end, done))
    return out


def pod_row(name: str, wid: str, gpus: int, start: float, end: float | None) -> tuple[Any, ...]:
    return (CLUSTER, "team-llm", name, f"uid-{name}", "llm", "a100-0", A100, "nvidia.com/gpu", float(gpus), 0, "",
            at(start), at(end) if end is not None else None, round((end or start) * 1000) * 10 + (2 if end else 1),
            "pod", wid, "RayJob", wid.rsplit("/", 1)[1])


def fill(store: Any) -> None:
    """first: 2 x 4 GPUs, all of a100-0 for 30 min; second (1 x 4) queued behind it for 30 min;
    third (1 x 4) admitted then too and still running."""
    index = KueueIndex(CLUSTER)
    rows: dict[str, list[tuple[Any, ...]]] = {}

    def add(got: dict[str, list[tuple[Any, ...]]]) -> None:
        for table, rs in got.items():
            rows.setdefault(table, []).extend(rs)

    add(index.on_object("resourceflavors", "ADDED", FLAVOR, at(T0 - 60))[0])
    changes = [*lives("first", [(2, 4)], T0, T0 + 10, T0 + 1815), *lives("second", [(1, 4)], T0 + 20, T0 + 1820, T0 + 2425),
               *lives("third", [(1, 4)], T0 + 30, T0 + 1830, None)]
    for t, obj in sorted(changes, key=lambda c: c[0]):
        add(index.on_object("workloads", "MODIFIED", obj, at(t))[0])
    pods = [pod_row("first-w-0", "kueue/team-llm/first", 4, T0 + 15, T0 + 1815),
            pod_row("first-w-1", "kueue/team-llm/first", 4, T0 + 15, T0 + 1815),
            pod_row("second-w-0", "kueue/team-llm/second", 4, T0 + 1825, T0 + 2425),
            pod_row("third-w-0", "kueue/team-llm/third", 4, T0 + 1835, None)]
    rows["gpu_allocations"].extend(pods)
    nodes = [(at(t), CLUSTER, "a100-0", "node-a100-0", kind, 1, 0, A100, 8.0, 8.0, {}, {}, v)
             for t, kind, v in ((T0 - 60, "ADDED", "1"), (NOW - 10, "SYNC", "2"))]
    store.insert("node_events", nodes, COLUMNS["node_events"])
    for table, rs in rows.items():
        store.insert(table, rs, COLUMNS[table])


def settings(tmp_path: Path) -> Settings:
    """The queues as ``gpuq import-queues kueue`` gives them from the same objects."""
    imported = from_kueue([FLAVOR, cluster_queue("llm", 8), local_queue("team-llm", "llm")], source="kueue")
    qf = tmp_path / "queues.yaml"
    qf.write_text(yaml.safe_dump(imported.data))
    return Settings(store={"dsn": "chdb:///nowhere"}, queues_file=str(qf), scheduler={"cluster": CLUSTER})


def report(store: Any, s: Settings, *argv: str) -> dict[str, Any]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main([*argv, "--format", "json"], s, now_s=NOW, store=store)
    assert rc == 0, err.getvalue()
    data: dict[str, Any] = json.loads(out.getvalue())
    return data


def test_kueue_workloads_replay_as_workloads_of_their_queue(store: Any, tmp_path: Path) -> None:
    from accounting.service import load_config

    fill(store)
    s = settings(tmp_path)
    config = load_config(s.queues_file)
    llm = next(q for q in config.leaves() if q.rsplit(".", 1)[-1] == "llm")
    h = read_history(store, CLUSTER, NOW - 86400, NOW, config)
    assert not [e for e in h.entries if e.kind == FIXED]                  # not foreign load
    got = {e.id: e for e in h.entries}
    assert set(got) == {"kueue/team-llm/first", "kueue/team-llm/second", "kueue/team-llm/third"}
    first, second, third = (got[f"kueue/team-llm/{n}"] for n in ("first", "second", "third"))
    assert {(e.kind, e.origin, e.queue) for e in got.values()} == {(WORKLOAD, "kueue", llm)}
    # the Workload's gang (its pod sets asking GPUs), created when it was, run from its reservation
    # to its pods' end on their nodes
    assert (first.pods, first.gpus_per_pod, first.submit_s, first.state) == (2, 4, T0, "finished")
    assert [(r.start_s, r.end_s, dict(r.placement), r.gpu_type) for r in first.runs] == [
        (T0 + 10, T0 + 1815, {"a100-0": 8}, "a100")]
    assert (second.submit_s, second.runs[0].start_s, second.runs[0].end_s) == (T0 + 20, T0 + 1820, T0 + 2425)
    assert (third.state, third.runs[0].end_s) == ("running", None)

    r = report(store, s, "--from", "-1d", "--add-nodes", "a100:8x1")
    assert r["workloads"]["replayed"] == 3 and r["workloads"]["unfinished_at_end"] == 1
    assert r["fixed"]["before"]["held"] == 0
    q = r["queues"][llm]
    # as it happened, second and third waited for first's 30 min; a second node alone does not
    # help: the ClusterQueue's quota (8 GPUs) binds, as it did in Kueue
    assert q["wait_p90_s"]["before"] >= 1800 - 30      # submitted 20 and 30 s after first
    assert q["wait_p90_s"]["after"] == q["wait_p90_s"]["before"]
    assert q["gpu_hours"]["before"] > 0
    # the node and a quota of 16: they start at once
    more = tmp_path / "more.yaml"
    more.write_text(yaml.safe_dump(from_kueue([FLAVOR, cluster_queue("llm", 16), local_queue("team-llm", "llm")],
                                              source="kueue").data))
    r2 = report(store, s, "--from", "-1d", "--add-nodes", "a100:8x1", "--queues", str(more))
    assert r2["queues"][llm]["wait_p90_s"]["after"] <= 5
