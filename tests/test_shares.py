"""Shares of one GPU in the scheduler core and the simulator (issue 19): a pod asking less than one
GPU takes a share of one device and never spans two; shares pack best-fit onto partly used devices
before a whole device is opened; quotas count shares exactly; "it fits in free capacity" is judged
per device; the simulator's ``devices`` never give a device more than its whole, and the occupancy
kept from event to event equals the one computed from scratch."""
from __future__ import annotations

import random
from decimal import Decimal
from typing import Any

import pytest

from scheduler.model import Placement, Running, gpus_out, share_of_gpus
from scheduler.placement import FreeIndex
from scheduler.simulator import parse_scenario
from scheduler.simulator.engine import simulate
from scheduler.snapshot import occupancy_after, occupancy_of
from scheduler.testing import admitted, cluster, cycle, run, victims, wl

HALF, QUARTER = Decimal("0.5"), Decimal("0.25")


def test_share_values_are_thousandths_of_one_gpu() -> None:
    assert share_of_gpus(0.46) == Decimal("0.46") and share_of_gpus(0.5) == HALF
    assert share_of_gpus(2) == 2 and share_of_gpus(2.0) == 2 and type(share_of_gpus(2.0)) is int
    for bad in (0, -1, 1.5, 0.0005, True, "0.5", None):
        assert share_of_gpus(bad) is None, bad
    assert gpus_out(Decimal("0.75") + QUARTER) == 1 and type(gpus_out(Decimal("1"))) is int
    assert gpus_out(Decimal("0.1") + Decimal("0.2")) == 0.3                  # exact before output


def test_shares_fill_partly_used_devices_best_fit_before_opening_a_whole_one() -> None:
    c = cluster({"a": {"guaranteed": {"gpu": 8}}}, ("n", "A10", 2, 2))
    idx = FreeIndex(c, occupancy_of(c, ()).node_free)
    first = idx.place("A10", HALF, 1)
    assert first is not None and first.shares == (("n-0", 0, HALF),) and idx.free == [1, 2]
    second = idx.place("A10", QUARTER, 1)       # onto the half-used device, not a new one
    assert second is not None and second.shares == (("n-0", 0, QUARTER),) and idx.free == [1, 2]
    third = idx.place("A10", HALF, 1)           # 0.25 left there: a whole device, on the fuller node
    assert third is not None and third.shares == (("n-0", 1, HALF),) and idx.free == [0, 2]
    best = idx.place("A10", QUARTER, 1)         # two devices with room (0.25 and 0.5): the tighter
    assert best is not None and best.shares == (("n-0", 0, QUARTER),)
    gang = idx.place("A10", QUARTER, 3)         # pods of one gang share a device: 2 on the 0.5 left, 1 new
    assert gang is not None and gang.shares == (("n-0", 1, HALF), ("n-1", 0, QUARTER))
    assert gang.nodes == (("n-0", HALF), ("n-1", QUARTER))
    assert idx.slots("A10", Decimal("0.75"), 100) == 1 + 1 * 1    # n-1: one whole device, one 0.75 left


def test_giving_back_and_taking_again_restores_the_index() -> None:
    c = cluster({"a": {"guaranteed": {"gpu": 8}}}, ("n", "A10", 2, 2))
    idx = FreeIndex(c, occupancy_of(c, ()).node_free)
    ps = [idx.place("A10", k, pods) for k, pods in ((HALF, 1), (QUARTER, 3), (Decimal("0.3"), 2), (HALF, 2))]
    assert all(p is not None for p in ps)
    before = (list(idx.free), {i: dict(d) for i, d in idx.partial().items()})
    for p in reversed(ps):
        assert p is not None
        idx.release(p)
    assert idx.free == [2, 2] and not any(idx.partial().values())
    for p in ps:
        assert p is not None
        idx.take(p)
    assert (idx.free, {i: d for i, d in idx.partial().items() if d}) == before
    with pytest.raises(ValueError, match="slot 9 holds no share"):
        idx.release(Placement("A10", (("n-0", HALF),), (("n-0", 9, HALF),)))


def test_quotas_count_shares_exactly() -> None:
    c = cluster({"a": {"guaranteed": {"gpu": 1}, "max": {"gpu": 1}}}, ("n", "A10", 4, 1))
    pending = [wl(f"q{i}", "a", gpus=Decimal("0.1") * 2 + Decimal("0.05"), submit_s=i) for i in range(5)]  # 0.25
    d = cycle(c, pending)
    assert sorted(admitted(d)) == ["q0", "q1", "q2", "q3"]               # 4 x 0.25 = 1, the max
    reason = d.reason("q4")
    assert reason is not None and reason.code.value == "quota_max"
    assert "needs 0.25 gpu, queue a has 0 left of max 1" in reason.message


def test_fits_in_free_capacity_is_judged_per_device() -> None:
    """Half of each of two devices is free (1 GPU in all): a 1-GPU pod does not fit, so a queue
    below its guarantee preempts for it; a 0.5 pod fits, and preempts nothing."""
    c = cluster({"a": {"guaranteed": {"gpu": 1}}, "b": {"guaranteed": {"gpu": 0}}}, ("n", "A10", 2, 1))
    held = [run(wl(f"b{i}", "b", gpus=HALF), "A10", ("n-0", HALF)) for i in range(2)]
    held = [Running(r.workload, Placement("A10", (("n-0", HALF),), (("n-0", i, HALF),)), 0.0)
            for i, r in enumerate(held)]
    whole = cycle(c, [wl("a1", "a", gpus=1, submit_s=0)], held, now=100)
    assert len(victims(whole)["a1"]) == 1 and admitted(whole)["a1"] == {"n-0": 1}
    share = cycle(c, [wl("a2", "a", gpus=HALF, submit_s=0)], held, now=100)
    assert victims(share) == {} and admitted(share)["a2"] == {"n-0": HALF}
    reason = cycle(c, [wl("a3", "a", gpus=Decimal("0.75"), submit_s=0)], held, now=10).reason("a3")
    assert reason is not None and "no device of type A10 with 0.75 of a GPU free (largest free share: 0.5)" \
        in reason.message


def _scenario(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    work = []
    for i in range(60):
        share = rng.random() < 0.6
        work.append({"id": f"w{i}", "queue": rng.choice(["a", "b", "c"]), "submit": round(rng.uniform(0, 600), 1),
                     "duration": round(rng.uniform(20, 400), 1), "priority": rng.choice([0, 0, 1]),
                     "pods": rng.choice([1, 1, 2, 3]) if share else rng.choice([1, 2]),
                     "gpus_per_pod": rng.choice([0.1, 0.25, 0.3, 0.5, 0.75]) if share else rng.choice([1, 2, 4]),
                     "checkpoint": rng.random() < 0.3})
    return {"name": f"shares-{seed}", "scheduler": {"cycle_interval_s": 10, "preemption_delay_s": 20},
            "nodes": [{"name": "h", "gpu_type": "H100", "gpus": 4, "count": 2}, {"name": "a", "gpu_type": "A10", "gpus": 2, "count": 2}],
            "queues": {"a": {"guaranteed": {"gpu": 5}, "max": {"gpu": 12}},
                       "b": {"guaranteed": {"gpu": 4}, "max": {"gpu": 12}},
                       "c": {"guaranteed": {"gpu": 3}, "max": {"gpu": 6}}},
            "workloads": work}


@pytest.mark.parametrize("seed", range(6))
def test_replays_never_give_a_device_more_than_its_whole(seed: int) -> None:
    """At every event: each device's shares sum to at most 1, a whole gang's devices are its own,
    the devices agree with the placement, and the occupancy kept event by event (the simulator's)
    equals the one computed from what runs."""
    sc = parse_scenario(_scenario(seed), source="s.yaml")
    result = simulate(sc)
    gpus = {n.name: n.gpus for n in sc.cluster.nodes}
    by_id = {w.id: w for w in sc.workloads}
    holds: dict[tuple[str, str], Decimal] = {}
    whole: dict[tuple[str, str], str] = {}
    held: dict[str, dict[str, dict[str, Any]]] = {}
    running: dict[str, Running] = {}
    shares = admits = 0
    for e in result.events:
        wid = e["workload"]
        if e["event"] == "admit":
            admits += 1
            w, devs = by_id[wid], e["devices"]
            assert {n: sum(Decimal(str(x)) for x in on.values()) for n, on in devs.items()} == \
                {n: Decimal(str(g)) for n, g in e["placement"].items()}
            for node, on in devs.items():
                for dev, x in on.items():
                    assert 0 <= int(dev) < gpus[node]
                    key = (node, dev)
                    if isinstance(x, float):
                        shares += 1
                        assert key not in whole, f"{wid} shares {key} held whole by {whole.get(key)}"
                        holds[key] = holds.get(key, Decimal(0)) + Decimal(str(x))
                        assert holds[key] <= 1, f"device {key} over its whole at t={e['t']}"
                    else:
                        assert x == 1 and key not in whole and key not in holds, f"{wid} on {key}"
                        whole[key] = wid
            held[wid] = devs
            running[wid] = Running(w, Placement(e["gpu_type"], tuple(
                (n, share_of_gpus(g) or 0) for n, g in e["placement"].items())), e["t"])
        elif e["event"] in ("finish", "preempt"):
            for node, on in held.pop(wid).items():
                for dev, x in on.items():
                    key = (node, dev)
                    if isinstance(x, float):
                        holds[key] -= Decimal(str(x))
                        if not holds[key]:
                            del holds[key]
                    else:
                        del whole[key]
            running.pop(wid)
        # GPUs per node: whole devices held + shared devices never above the node's
        for node, n in gpus.items():
            used = sum(1 for k in whole if k[0] == node) + sum(1 for k in holds if k[0] == node)
            assert used <= n
    assert shares > 20 and admits > 40                              # the replay exercised shares
    assert not holds and not whole                                  # everything given back


@pytest.mark.parametrize("seed", range(4))
def test_the_occupancy_kept_between_cycles_equals_one_from_scratch(seed: int) -> None:
    """occupancy_after over starts and stops of shares (the simulator's and the service's way)
    equals occupancy_of the running set, slots and usage included."""
    rng = random.Random(seed)
    c = cluster({"a": {"guaranteed": {"gpu": 4}}, "b": {"guaranteed": {"gpu": 4}}}, ("n", "A10", 2, 3))
    idx = FreeIndex(c, occupancy_of(c, ()).node_free)
    occ = occupancy_of(c, ())
    live: list[Running] = []
    for step in range(200):
        if live and rng.random() < 0.45:
            r = live.pop(rng.randrange(len(live)))
            idx.release(r.placement)
            occ = occupancy_after(c, occ, (r,), ())
        else:
            k = rng.choice([Decimal("0.1"), QUARTER, HALF, Decimal("0.75"), 1])
            w = wl(f"w{step}", rng.choice("ab"), gpus=k, pods=rng.choice([1, 2]))
            p = idx.place("A10", w.gpus_per_pod, w.pods)
            if p is None:
                continue
            r = Running(w, p, 0.0)
            live.append(r)
            occ = occupancy_after(c, occ, (), (r,))
        scratch = occupancy_of(c, live)
        assert (occ.node_free, occ.partial) == (scratch.node_free, scratch.partial) == \
            (tuple(idx.free), {i: d for i, d in idx.partial().items() if d})
        def used(u: Any) -> set[tuple[str, str, Any]]:
            return {(q, k, v) for q, m in u.items() for k, v in m.items() if v}
        assert used(occ.usage) == used(scratch.usage)
        for q in "ab":
            assert occ.usage.get(q, {}).get("gpu", 0) == sum((r.workload.gpus for r in live if r.workload.queue == q), 0)
