"""Placement groups and Ray jobs -> gpu_allocations (collector.ray_alloc), pure: rounds of State API entries."""
from __future__ import annotations

import datetime as dt
from typing import Any

import pytest

from collector.k8s_alloc import CLOSED_BY_RELIST, ENDED, OPEN, version_of
from collector.ray_alloc import (
    GpuHolder,
    PlacementGroupLedger,
    RayJob,
    RayJobLedger,
    gpu_models,
    milli_of_units,
    ray_units,
)

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


# -- fractions --------------------------------------------------------------------------------

def test_fractions_are_summed_in_rays_unit_and_rounded_once() -> None:
    assert [ray_units(x) for x in (0.5, 0.25, 0.1, 0.0625, 0.001, 0, 3)] == [5000, 2500, 1000, 625, 10, 0, 30000]
    assert milli_of_units(16 * ray_units(1 / 16)) == 1000              # 16 x 62.5: not 16 x 63
    assert milli_of_units(ray_units(1 / 16)) == 63                     # one alone: half up
    assert milli_of_units(ray_units(0.0004)) == 0
    for bad in ("0.5", -0.5, float("nan"), float("inf"), True, None):
        with pytest.raises(ValueError):
            ray_units(bad)


def test_placement_group_fractions_survive_without_drift() -> None:
    group = {"placement_group_id": "p9", "name": "frac", "state": "CREATED", "bundles": [
        {"unit_resources": {"GPU": 0.1}, "node_id": N1}, {"unit_resources": {"GPU": 0.2}, "node_id": N1},
        {"unit_resources": {"GPU": 0.0625}, "node_id": N2}, {"unit_resources": {"GPU": "x"}, "node_id": N2}]}
    assert 0.1 + 0.2 != 0.3                                             # what a float sum would store
    [a, b] = PlacementGroupLedger("c").round([group], NODES, at(0))
    assert (a.node, a.gpus, b.node, b.gpus) == (N1[:12], 0.3, N2[:12], 0.063)


# -- Ray jobs: tasks and actors outside placement groups --------------------------------------

JOB = RayJob("raysubmit_1", "team/w1", "research.vision")
OTHER = RayJob("01000000")


def hold(job: RayJob, gpus: float, node: str = N1) -> GpuHolder:
    return GpuHolder(job, node, ray_units(gpus), "task t")


def test_job_rows_per_job_and_node_with_their_sum() -> None:
    ledger = RayJobLedger("c")
    got = ledger.round([hold(JOB, 0.5), hold(JOB, 0.5), hold(JOB, 0.25), hold(JOB, 0.5, N2), hold(OTHER, 0.1)],
                       NODES, at(0))
    rows = {(a.pod, a.node): a for a in got}
    assert {k: a.gpus for k, a in rows.items()} == {("raysubmit_1", N1[:12]): 1.25, ("raysubmit_1", N2[:12]): 0.5,
                                                    ("01000000", N1[:12]): 0.1}
    a = rows[("raysubmit_1", N1[:12])]
    assert (a.source, a.workload_id, a.queue, a.gpu_model, a.gpu_resource, a.namespace) == \
        ("ray_job", "team/w1", "research.vision", "H100", "GPU", "")
    assert (a.start, a.end, a.version) == (at(0), None, version_of(at(0), OPEN))
    assert a.uid == f"job:raysubmit_1/{N1[:12]}@{int(at(0).timestamp() * 1000)}"
    assert rows[("01000000", N1[:12])].workload_id == ""
    assert ledger.round([hold(JOB, 0.75), hold(JOB, 0.5), hold(JOB, 0.5, N2), hold(OTHER, 0.1)], None, at(1)) == []


def test_a_changed_amount_ends_the_row_and_opens_the_next() -> None:
    ledger = RayJobLedger("c")
    [first] = ledger.round([hold(JOB, 0.5), hold(JOB, 0.5)], NODES, at(0))
    ended, second = ledger.round([hold(JOB, 0.5)], NODES, at(1))        # one task finished
    assert (ended.uid, ended.end, ended.version) == (first.uid, at(1), version_of(at(1), ENDED))
    assert (second.gpus, second.start, second.end) == (0.5, at(1), None) and second.uid != first.uid
    [gone] = ledger.round([], NODES, at(2))
    assert (gone.uid, gone.end, gone.version) == (second.uid, at(2), version_of(at(2), CLOSED_BY_RELIST))
    assert ledger.open == [] and ledger.round([], NODES, at(3)) == []


def test_an_incomplete_round_opens_and_raises_but_never_ends_or_lowers() -> None:
    ledger = RayJobLedger("c")
    [a] = ledger.round([hold(JOB, 1.0)], NODES, at(0))
    assert ledger.round([hold(JOB, 0.5)], NODES, at(1), complete=False) == []       # not lowered
    assert ledger.round([], NODES, at(2), complete=False) == []                      # not ended
    other, ended, raised = ledger.round([hold(JOB, 1.5), hold(OTHER, 0.25)], NODES, at(3), complete=False)
    assert (ended.uid, ended.end) == (a.uid, at(3))
    assert (raised.gpus, raised.start, other.pod, other.gpus) == (1.5, at(3), "01000000", 0.25)
    assert [x.gpus for x in ledger.open] == [0.25, 1.5]


def test_job_ledger_restarts_from_the_store_and_ends_duplicates() -> None:
    before = RayJobLedger("c")
    rows = [a.row() for a in before.round([hold(JOB, 0.5), hold(OTHER, 0.25)], NODES, at(0))]
    dup = RayJobLedger("c")._row(JOB, N1, 500, at(-5)).row()                       # an older open row of the key
    pg_row = PlacementGroupLedger("c").round([pg("CREATED")], NODES, at(0))[0].row()
    after = RayJobLedger("c", lambda cluster: [*rows, dup, pg_row])
    changes = after.round([hold(JOB, 0.5)], NODES, at(5))        # OTHER finished meanwhile; JOB unchanged
    assert {(a.pod, a.start, a.end) for a in changes} == {("raysubmit_1", at(-5), at(5)), ("01000000", at(0), at(5))}
    assert [(a.pod, a.start) for a in after.open] == [("raysubmit_1", at(0))]


def test_a_new_attribution_is_a_new_row() -> None:
    ledger = RayJobLedger("c")
    ledger.round([hold(RayJob("raysubmit_1"), 0.5)], NODES, at(0))
    ended, opened = ledger.round([hold(JOB, 0.5)], NODES, at(1))
    assert (ended.workload_id, ended.end, opened.workload_id, opened.queue) == ("", at(1), "team/w1", "research.vision")
