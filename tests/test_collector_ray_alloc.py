"""Placement groups -> gpu_allocations (collector.ray_alloc), pure: rounds of State API entries."""
from __future__ import annotations

import datetime as dt
from typing import Any

from collector.k8s_alloc import CLOSED_BY_RELIST, ENDED, OPEN, version_of
from collector.ray_alloc import PlacementGroupLedger, gpu_models

T0 = dt.datetime(2026, 11, 21, 12, 0, tzinfo=dt.UTC)
N1, N2 = "aa" * 28, "bb" * 28
NODES = [{"node_id": N1, "resources_total": {"GPU": 4.0, "accelerator_type:H100": 4.0}},
         {"node_id": N2, "resources_total": {"GPU": 4.0}}]


def pg(state: str, *, pg_id: str = "p1", name: str = "gpuq-team/train", created_ns: int | None = None) -> dict[str, Any]:
    bundles = [{"unit_resources": {"GPU": 2.0, "CPU": 1.0}, "node_id": N1},
               {"unit_resources": {"GPU": 1.0}, "node_id": N1},
               {"unit_resources": {"GPU": 2.0}, "node_id": N2},
               {"unit_resources": {"CPU": 1.0}, "node_id": None}]
    stats = {"creation_request_received_ns": str(created_ns)} if created_ns else {}
    return {"placement_group_id": pg_id, "name": name, "state": state, "bundles": bundles, "stats": stats}


def at(minutes: float) -> dt.datetime:
    return T0 + dt.timedelta(minutes=minutes)


def test_open_once_then_removed_closes_each_node() -> None:
    ledger = PlacementGroupLedger("c")
    created = int(at(-1).timestamp() * 1e9)
    first = ledger.round([pg("CREATED", created_ns=created)], NODES, at(0))
    assert [(a.node, a.gpu_model, a.gpus, a.uid, a.workload_id, a.source, a.start) for a in first] == [
        (N1[:12], "H100", 3.0, f"p1/{N1[:12]}", "team/train", "placement_group", at(-1)),
        (N2[:12], "", 2.0, f"p1/{N2[:12]}", "team/train", "placement_group", at(-1))]
    assert all(a.version == version_of(at(-1), OPEN) and a.end is None for a in first)
    assert ledger.round([pg("CREATED")], None, at(1)) == []          # unchanged: nothing emitted
    ended = ledger.round([pg("REMOVED")], NODES, at(2))
    assert [(a.end, a.version) for a in ended] == [(at(2), version_of(at(2), ENDED))] * 2
    assert ledger.open == [] and ledger.round([pg("REMOVED")], NODES, at(3)) == []


def test_pending_and_foreign_groups() -> None:
    ledger = PlacementGroupLedger("c")
    assert ledger.round([pg("PENDING")], NODES, at(0)) == []
    [a, _] = ledger.round([pg("CREATED", name="mypg", pg_id="p2")], NODES, at(0))
    assert a.workload_id == "" and a.start == at(0) and a.pod == "mypg"


def test_vanished_group_closes_only_on_a_complete_list() -> None:
    ledger = PlacementGroupLedger("c")
    ledger.round([pg("CREATED")], NODES, at(0))
    assert ledger.round([], NODES, at(1), complete=False) == []
    gone = ledger.round([], NODES, at(2))
    assert {(a.end, a.version) for a in gone} == {(at(2), version_of(at(2), CLOSED_BY_RELIST))}


def test_restart_reads_open_rows_from_the_store() -> None:
    before = PlacementGroupLedger("c")
    rows = [a.row() for a in before.round([pg("CREATED"), pg("CREATED", pg_id="p3")], NODES, at(0))]
    pod_row = ("c", "ns", "pod", "u1", "q", "n", "H100", "nvidia.com/gpu", 1.0, 0, "", at(0), None, 1,
               "pod", "", "", "")
    asked: list[str] = []
    after = PlacementGroupLedger("c", lambda cluster: asked.append(cluster) or [*rows, pod_row])
    changes = after.round([pg("CREATED")], NODES, at(5))      # p1 still there, p3 gone meanwhile
    assert asked == ["c"]
    assert {(a.uid, a.end) for a in changes} == {(f"p3/{N1[:12]}", at(5)), (f"p3/{N2[:12]}", at(5))}
    assert [a.uid for a in after.open] == [f"p1/{N1[:12]}", f"p1/{N2[:12]}"]


def test_gpu_models_from_resources() -> None:
    assert gpu_models(NODES + [{"node_id": "x", "resources_total": {"accelerator_type:A100": 1,
                                                                    "accelerator_type:B200": 1}}]) == \
        {N1: "H100", "x": "A100"}
