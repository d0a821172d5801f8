"""GPU-equivalents and MIG-profile quotas (issue 19): ``gpu_types.<T>.equivalent``, ``gpu_eq``
guarantees and maxes in the queue file, the scheduler honouring them, and configurations without
them deciding as before."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from accounting.errors import QueueConfigError
from accounting.model import Allocation, NodeCapacity
from accounting.now import NowSnapshot, compute_now
from accounting.queues import parse_queue_config
from accounting.model import UsageAgg
from accounting.resolve import Resolver
from accounting.usage import usage_rows
from scheduler.simulator import run_scenario

TYPES = {"H100": {"node_labels": ["NVIDIA-H100-80GB-HBM3"]},
         "A100": {"equivalent": 0.5, "node_labels": ["NVIDIA-A100-SXM4-80GB"]}}


def cfg(queues: dict[str, Any], types: dict[str, Any] | None = None) -> Any:
    return parse_queue_config({"gpu_types": TYPES if types is None else types, "queues": queues})


def test_equivalents_and_gpu_eq_parse_exactly() -> None:
    c = cfg({"a": {"guaranteed": {"gpu_eq": 2.5}, "max": {"gpu_eq": 4, "gpu": 16}}, "b": {}},
            {**TYPES, "A100-mig-1g.10gb": {}})
    assert c.gpu_types["H100"].equivalent == 1 and c.gpu_types["A100"].equivalent == Decimal("0.5")
    mig = c.gpu_types["A100-mig-1g.10gb"]
    assert (mig.mig_of, mig.mig_profile, mig.equivalent) == ("A100", "1g.10gb", Decimal("0.071"))  # 0.5/7 down
    assert c.queues["a"].guaranteed["gpu_eq"] == Decimal("2.5") and type(c.queues["a"].max["gpu_eq"]) is int
    assert c.uses_gpu_eq and not cfg({"a": {"max": {"gpu": 8}}}).uses_gpu_eq
    assert c.type_of_label("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb") == "A100-mig-1g.10gb"
    assert Resolver(c).gpu_type("NVIDIA-A100-SXM4-80GB", "nvidia.com/mig-1g.10gb") == "A100-mig-1g.10gb"


@pytest.mark.parametrize(("types", "queues", "message"), [
    ({"H100": {"equivalent": 0}}, {}, "gpu_types.H100.equivalent: must be positive, got 0"),
    ({"H100": {"equivalent": "x"}}, {}, "gpu_types.H100.equivalent: expected a number, got 'x'"),
    ({"H100": {"equivalent": 0.0005}}, {}, "gpu_types.H100.equivalent: at most three decimals"),
    (TYPES, {"a": {"max": {"gpu_eq": -1}}}, "queues.a.max.gpu_eq: must be non-negative, got -1"),
    (TYPES, {"a": {"max": {"gpu_eq": 1.2345}}}, "queues.a.max.gpu_eq: at most three decimals"),
    (TYPES, {"a": {"guaranteed": {"gpu_eq": 5}, "max": {"gpu_eq": 4}}}, "queues.a.max: gpu_eq 4 is below guaranteed 5"),
    (TYPES, {"p": {"max": {"gpu_eq": 2}, "queues": {"c": {"max": {"gpu_eq": 3}}}}},
     "queues.p.c.max: gpu_eq 3 is above the max 2 of p"),
    ({"B200-mig-1g.10gb": {}}, {}, "gpu_types.B200-mig-1g.10gb: a MIG type names the GPU type it slices"),
    ({"A.100": {}}, {}, "gpu_types.A.100: invalid gpu type name"),
    ({**TYPES, "A100-mig-9g.90gb": {}}, {}, "gpu_types.A100-mig-9g.90gb: MIG profile '9g.90gb' has 9 compute slices"),
])
def test_errors_name_the_yaml_path(types: dict[str, Any], queues: dict[str, Any], message: str) -> None:
    with pytest.raises(QueueConfigError) as exc:
        cfg(queues, types)
    assert str(exc.value).startswith(message), str(exc.value)


NODES = [{"name": "h", "gpu_type": "H100", "gpus": 8, "count": 1},
         {"name": "a", "gpu_type": "A100", "gpus": 8, "count": 1}]


def admitted(r: Any, t: float) -> dict[str, str]:
    """Workload -> GPU type of those admitted at ``t``."""
    return {e["workload"]: e["gpu_type"] for e in r.events if e["event"] == "admit" and e["t"] == t}


@pytest.mark.parametrize(("gpu_type", "expect"), [("H100", 2), ("A100", 4)])
def test_a_gpu_eq_max_admits_by_worth(gpu_type: str, expect: int) -> None:
    """max gpu_eq 2 spans the models: 2 H100 (1.0 each) or 4 A100 (0.5 each)."""
    r = run_scenario({"gpu_types": TYPES, "nodes": NODES, "queues": {"q": {"max": {"gpu_eq": 2}}},
                      "workloads": [{"id": "w", "queue": "q", "submit": 0, "duration": 100, "gpus_per_pod": 1,
                                     "gpu_types": [gpu_type], "count": 6}]})
    now = admitted(r, 0.0)
    assert len(now) == expect and set(now.values()) == {gpu_type}


def test_preemption_restores_a_gpu_eq_guarantee() -> None:
    """``hi`` is guaranteed 2 equivalents; ``lo`` fills the A100 node; ``hi``'s 4 A100 (2.0) are
    within its guarantee, so lo gives back exactly what it needs, and no more."""
    r = run_scenario({"gpu_types": TYPES, "nodes": [NODES[1]],
                      "queues": {"lo": {}, "hi": {"guaranteed": {"gpu_eq": 2}}},
                      "workloads": [
                          {"id": "lo", "queue": "lo", "submit": 0, "duration": 1000, "gpus_per_pod": 2, "count": 4},
                          {"id": "hi", "queue": "hi", "submit": 10, "duration": 100, "gpus_per_pod": 4},
                          {"id": "more", "queue": "hi", "submit": 20, "duration": 100, "gpus_per_pod": 2}]})
    pre = [e for e in r.events if e["event"] == "preempt"]
    assert len(pre) == 2 and {e["by"] for e in pre} == {"hi"}
    assert pre[0]["reason"] == "reclaim guaranteed for hi: holds 0 of guaranteed 2 gpu_eq, needs 2"
    assert "hi" in admitted(r, 40.0)
    assert "more" in admitted(r, 140.0)        # 2 more A100 would be 3.0 > 2: it waits, lo keeps the rest


def test_a_mig_profile_quota_counts_slices() -> None:
    types = {**TYPES, "A100-mig-1g.10gb": {}}
    r = run_scenario({"gpu_types": types, "nodes": [{"name": "m", "gpu_type": "A100-mig-1g.10gb", "gpus": 14}],
                      "queues": {"q": {"max": {"gpu/A100-mig-1g.10gb": 3}}},
                      "workloads": [{"id": "w", "queue": "q", "submit": 0, "duration": 100, "gpus_per_pod": 1,
                                     "count": 5}]})
    assert len(admitted(r, 0.0)) == 3
    c = parse_queue_config({"gpu_types": types, "queues": {"q": {"max": {"gpu/A100-mig-1g.10gb": 3}}}})
    node = NodeCapacity("c", "n", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", 14000)
    al = Allocation("c", "ns", "p", "u", "q", "n", "NVIDIA-A100-SXM4-80GB-MIG-1g.10gb", 285, 0.0, None,
                    gpu_resource="nvidia.com/mig-1g.10gb")      # two 1g slices billed floor(2000/7)
    rows = {(x.queue, x.gpu_type): x for x in compute_now(NowSnapshot(10.0, (al,), (node,)), Resolver(c)).rows}
    assert rows[("q", "A100-mig-1g.10gb")].allocated == 2 and rows[("q", "A100-mig-1g.10gb")].max == 3


def test_the_now_view_shows_equivalents_beside_raw_gpus() -> None:
    c = cfg({"a": {"guaranteed": {"gpu_eq": 4}, "max": {"gpu_eq": 8}}})
    als = tuple(Allocation("c", "ns", f"p{i}", f"u{i}", "a", "n", "NVIDIA-A100-SXM4-80GB", 1000, 0.0, None)
                for i in range(3))
    node = NodeCapacity("c", "n", "NVIDIA-A100-SXM4-80GB", 8000)
    rows = {(x.queue, x.gpu_type): x for x in compute_now(NowSnapshot(10.0, als, (node,)), Resolver(c)).rows}
    star = rows[("a", "*")].as_dict()
    assert (star["allocated"], star["allocated_eq"], star["guaranteed_eq"], star["max_eq"]) == (3, 1.5, 4, 8)
    assert rows[("a", "*")].fair_share == pytest.approx(1.5 / 4)
    plain = cfg({"a": {"guaranteed": {"gpu": 4}}}, {"H100": {}, "A100": {"node_labels": ["NVIDIA-A100-SXM4-80GB"]}})
    old = compute_now(NowSnapshot(10.0, als, (node,)), Resolver(plain)).rows
    assert all("allocated_eq" not in x.as_dict() for x in old)


def test_old_configs_decide_as_before() -> None:
    """gpu_types with equivalents but no gpu_eq quota: usage vectors carry no gpu_eq."""
    s = {"gpu_types": TYPES, "nodes": NODES, "queues": {"q": {"max": {"gpu": 3}}},
         "workloads": [{"id": "w", "queue": "q", "submit": 0, "duration": 100, "gpus_per_pod": 1, "count": 5}]}
    r = run_scenario(s)
    plain = run_scenario({**s, "gpu_types": {"H100": {}, "A100": {}}})
    assert r.events == plain.events and len(admitted(r, 0.0)) == 3


def test_cost_per_equivalent_hour() -> None:
    """An A100 hour at $2 is 0.5 equivalent-hours: $4 per equivalent-hour, as an H100 hour at $4."""
    types = {"H100": {"price_per_hour": 4.0, "node_labels": ["NVIDIA-H100-80GB-HBM3"]},
             "A100": {"price_per_hour": 2.0, "equivalent": 0.5, "node_labels": ["NVIDIA-A100-SXM4-80GB"]}}
    aggs = [UsageAgg("c", "a", "ns", "w", "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu", gpu_seconds=7200.0),
            UsageAgg("c", "b", "ns", "w", "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu", gpu_seconds=3600.0)]
    rows = {r.keys[0][1]: r.as_dict() for r in usage_rows(aggs, Resolver(cfg({"a": {}, "b": {}}, types)), ["queue"])}
    assert (rows["a"]["cost"], rows["a"]["eq_hours"], rows["a"]["cost_per_eq_hour"]) == (4.0, 1.0, 4.0)
    assert (rows["b"]["cost"], rows["b"]["eq_hours"], rows["b"]["cost_per_eq_hour"]) == (4.0, 1.0, 4.0)
    plain = {"H100": {"price_per_hour": 4.0}, "A100": {"price_per_hour": 2.0}}
    old = usage_rows(aggs, Resolver(cfg({"a": {}, "b": {}}, plain)), ["queue"])
    assert all("eq_hours" not in r.as_dict() for r in old)


def test_dashboard_tables_put_equivalents_beside_gpus() -> None:
    from dashboards.views.cost import table
    from dashboards.views.queues import _now_table

    usage = {"queue": "a", "gpu_type": "A100", "gpu_seconds": 7200.0, "idle_gpu_seconds": 0.0, "idle_ratio": 0.0,
             "cost": 4.0, "idle_cost": 0.0}
    assert "eq_hours" not in table([usage]).columns
    df = table([{**usage, "eq_hours": 1.0, "cost_per_eq_hour": 4.0}])
    assert (df.loc[0, "eq_hours"], df.loc[0, "cost_per_eq_hour"]) == (1.0, 4.0)
    row = {"queue": "a", "allocated": 3, "guaranteed": None, "max": None, "pending": 0, "borrowed": None, "lent": None,
           "idle": 0, "fair_share": 0.375}
    assert "allocated (GPU-eq)" not in _now_table([row]).columns
    eq = _now_table([{**row, "allocated_eq": 1.5, "guaranteed_eq": 4, "max_eq": 8}])
    cols = list(eq.columns)
    assert cols.index("allocated (GPU-eq)") == cols.index("max (GPUs)") + 1 and eq.loc[0, "guaranteed (GPU-eq)"] == 4


def test_fair_share_is_in_equivalents_where_the_guarantee_is() -> None:
    from scheduler.model import Node, Placement, Running, Workload
    from scheduler.quota import Ledger, fair_share
    from scheduler.snapshot import UNBOUNDED, build_cluster, occupancy_of

    c = build_cluster(cfg({"eq": {"guaranteed": {"gpu_eq": 4}}, "raw": {"guaranteed": {"gpu": 4}}}),
                      [Node("a", "A100", 8)])
    assert c.equivalents is not None and "gpu" not in c.guarantee["eq"] and c.gpu_guarantee["eq"] == UNBOUNDED
    run = [Running(Workload(q, q, pods=4), Placement("A100", (("a", 4),)), 0.0) for q in ("eq", "raw")]
    ledger = Ledger(occupancy_of(c, run).usage)
    assert ledger.used("eq", "gpu_eq") == 2 and ledger.used("raw", "gpu_eq") == 2
    assert fair_share(c, ledger, "eq") == 0.5 and fair_share(c, ledger, "raw") == 1.0   # 2 of 4 eq; 4 of 4 GPUs
