"""Property test: random small scenarios replayed through the simulator; an independent checker
(below; it shares no code with the scheduler beyond the queue-config parser) walks the events and
checks every rule of docs/SCENARIOS.md, and a second run must give the same bytes."""
from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from accounting.queues import OPEN_POLICY, QueueConfig, parse_queue_config
from scheduler.simulator import run_scenario

TYPES = ("H100", "A100")


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    groups = [(t, draw(st.sampled_from([2, 4, 8, 8])), draw(st.integers(0 if t == "A100" else 1, 2)))
              for t in TYPES]
    groups = [g for g in groups if g[2]]
    nodes = [{"name": f"g{i}", "gpu_type": t, "gpus": g, "count": c} for i, (t, g, c) in enumerate(groups)]
    total = sum(g * c for _, g, c in groups)
    ga = draw(st.integers(0, total))
    gb = draw(st.integers(0, total - ga))
    a: dict[str, Any] = {"guaranteed": {"gpu": ga}}
    if draw(st.booleans()):
        a["max"] = {"gpu": draw(st.integers(max(ga, 1), total))}
    queues: dict[str, Any] = {"a": a, "b": {"guaranteed": {"gpu": gb}}}
    leaves = ["a", "b"]
    if draw(st.booleans()):
        gx = draw(st.integers(0, ga))
        x: dict[str, Any] = {"guaranteed": {"gpu": gx}}
        if draw(st.booleans()):
            x["max"] = {"gpu/H100": draw(st.integers(0, 16))}
        a["queues"] = {"x": x, "y": {"guaranteed": {"gpu": draw(st.integers(0, ga - gx))}}}
        leaves = ["a.x", "a.y", "b"]
    if draw(st.integers(0, 3)):
        queues["c"] = {}                                   # no guarantee: borrows early, gets preempted
        leaves.append("c")
    if draw(st.booleans()):                                # a queue policy: what a's workloads may ask
        a["policy"] = {"max_priority": draw(st.integers(0, 2)), "non_preemptible": draw(st.booleans())}
        if "queues" in a and draw(st.booleans()):
            a["queues"]["x"]["policy"] = {"max_priority": draw(st.integers(0, a["policy"]["max_priority"]))}
    workloads = []
    for i in range(draw(st.integers(2, 10))):
        types = draw(st.sampled_from([[], ["H100"], ["A100"], ["H100", "A100"], ["A100", "H100"]]))
        queue = draw(st.sampled_from(leaves))
        workloads.append({
            "id": f"w{i}", "queue": queue,
            "submit": draw(st.integers(0, 10 if queue == "c" else 80)), "duration": draw(st.integers(1, 300)),
            "pods": draw(st.sampled_from([1, 1, 2, 3])), "gpus_per_pod": draw(st.sampled_from([1, 2, 4, 4, 8])),
            "gpu_types": types, "priority": draw(st.integers(0, 2)),
            "preemptible": draw(st.booleans()) or draw(st.booleans()),
            "checkpoint": draw(st.booleans()),
        })
    if draw(st.booleans()):                                # flood: one queue fills the cluster first
        small = min(g for _, g, _ in groups)
        flood = draw(st.sampled_from(leaves))
        for j in range(total // small):
            workloads.append({"id": f"f{j}", "queue": flood, "submit": 0, "duration": draw(st.integers(50, 400)),
                              "gpus_per_pod": small, "priority": draw(st.integers(0, 1)),
                              "originator": j == 0, "checkpoint": j % 2 == 1})
    sched = {"preemption": draw(st.booleans()) or draw(st.booleans()),
             "preemption_delay_s": draw(st.sampled_from([0, 5, 5, 30])),
             "cycle_interval_s": draw(st.sampled_from([1, 2.5, 10]))}
    return {"name": "random", "scheduler": sched, "nodes": nodes, "queues": queues, "workloads": workloads}


class Checker:
    def __init__(self, sc: dict[str, Any]) -> None:
        self.cfg: QueueConfig = parse_queue_config({"queues": sc["queues"]}, default_policy=OPEN_POLICY)
        self.cap: dict[str, int] = {}
        self.ntype: dict[str, str] = {}
        for g in sc["nodes"]:
            for j in range(g["count"]):
                self.cap[f"{g['name']}-{j}"] = g["gpus"]
                self.ntype[f"{g['name']}-{j}"] = g["gpu_type"]
        defaults = {"pods": 1, "gpus_per_pod": 1, "gpu_types": [], "priority": 0, "preemptible": True,
                    "checkpoint": False, "submit": 0}
        self.spec = {w["id"]: {**defaults, **w} for w in sc["workloads"]}
        self.s = sc["scheduler"]
        self.used = dict.fromkeys(self.cap, 0)
        self.running: dict[str, dict[str, Any]] = {}
        self.left = {w: float(s["duration"]) for w, s in self.spec.items()}
        self.state = dict.fromkeys(self.spec, "new")
        self.preempting: set[str] = set()       # preemptors whose victims are being listed

    def chain(self, q: str) -> tuple[str, ...]:
        return (q, *self.cfg.ancestors(q))

    def usage(self, q: str, res: str) -> int:
        return sum(r["gpus"] for r in self.running.values()
                   if q in self.chain(r["queue"]) and res in ("gpu", f"gpu/{r['type']}"))

    def fits_now(self, w: dict[str, Any]) -> bool:
        """Could ``w`` start on free capacity within every max, right now?"""
        for t in w["gpu_types"] or TYPES:
            n = w["pods"] * w["gpus_per_pod"]
            if any(self.cfg.queues[q].max.get(r, 10**9) < self.usage(q, r) + n
                   for q in self.chain(w["queue"]) for r in ("gpu", f"gpu/{t}")):
                continue
            slots = sum((self.cap[n_] - self.used[n_]) // w["gpus_per_pod"] for n_ in self.cap if self.ntype[n_] == t)
            if slots >= w["pods"]:
                return True
        return False

    def pinned(self, q: str) -> int:
        """GPUs the non-preemptible workloads of leaf ``q`` hold."""
        return sum(r["gpus"] for r in self.running.values() if r["queue"] == q and not r["preemptible"])

    def over_policy(self, w: dict[str, Any]) -> bool:
        p = self.cfg.queues[w["queue"]].policy
        return w["priority"] > p.max_priority or (not w["preemptible"] and not p.non_preemptible)

    def never_fits(self, w: dict[str, Any]) -> bool:
        n = w["pods"] * w["gpus_per_pod"]
        if not w["preemptible"] and n > self.cfg.queues[w["queue"]].guaranteed.get("gpu", 0):
            return True                                  # non-preemptible, larger than its guarantee
        for t in w["gpu_types"] or TYPES:
            if any(self.cfg.queues[q].max.get(r, 10**9) < n for q in self.chain(w["queue"]) for r in ("gpu", f"gpu/{t}")):
                continue
            if sum(c // w["gpus_per_pod"] for n_, c in self.cap.items() if self.ntype[n_] == t) >= w["pods"]:
                return False
        return True

    def check(self, events: list[dict[str, Any]]) -> None:
        last_t = 0.0
        for i, e in enumerate(events):
            t, wid = e["t"], e["workload"]
            w = self.spec[wid]
            assert t >= last_t, "events in time order"
            last_t = t
            getattr(self, "on_" + e["event"])(e, w, t, events[i + 1:])
        for wid, st_ in self.state.items():
            assert st_ in ("finished", "rejected"), f"{wid} ended {st_}"

    def on_submit(self, e: dict[str, Any], w: dict[str, Any], t: float, rest: list[Any]) -> None:
        assert t == w["submit"] and self.state[e["workload"]] == "new"
        self.state[e["workload"]] = "pending"

    def on_reject(self, e: dict[str, Any], w: dict[str, Any], t: float, rest: list[Any]) -> None:
        assert self.state[e["workload"]] == "pending" and (self.never_fits(w) or self.over_policy(w))
        assert e["reason"].startswith("policy: ") == self.over_policy(w), "a policy refusal says so"
        self.state[e["workload"]] = "rejected"

    def on_admit(self, e: dict[str, Any], w: dict[str, Any], t: float, rest: list[Any]) -> None:
        wid, gt, pl = e["workload"], e["gpu_type"], e["placement"]
        assert self.state[wid] == "pending" and not self.never_fits(w) and not self.over_policy(w)
        k = t / self.s["cycle_interval_s"]
        assert abs(k - round(k)) < 1e-6, "admissions happen on the cycle grid"
        assert not w["gpu_types"] or gt in w["gpu_types"], "acceptable type"
        assert sum(pl.values()) == w["pods"] * w["gpus_per_pod"], "whole gang at once"
        for node, n in pl.items():
            assert self.ntype[node] == gt and n % w["gpus_per_pod"] == 0
            self.used[node] += n
            assert self.used[node] <= self.cap[node], f"node {node} over capacity"
        self.preempting.discard(wid)
        self.running[wid] = {"queue": w["queue"], "type": gt, "gpus": sum(pl.values()), "start": t, "pl": pl,
                             "preemptible": w["preemptible"]}
        self.state[wid] = "running"
        g = self.cfg.queues[w["queue"]].guaranteed.get("gpu", 0)
        assert self.pinned(w["queue"]) <= g, "no non-preemptible workload holds GPUs over its queue's guarantee"
        for q in self.chain(w["queue"]):
            for r, m in self.cfg.queues[q].max.items():
                assert self.usage(q, r) <= m, f"{q} over max {r}"

    def on_preempt(self, e: dict[str, Any], w: dict[str, Any], t: float, rest: list[Any]) -> None:
        vid, pid = e["workload"], e["by"]
        p = self.spec[pid]
        nxt = next(x for x in rest if x["event"] != "preempt")
        assert (nxt["event"], nxt["workload"], nxt["t"]) == ("admit", pid, t), "preemptor admitted right after"
        assert self.s["preemption"] and t >= p["submit"] + self.s["preemption_delay_s"]
        assert w["preemptible"] and w["priority"] <= p["priority"] and w["queue"] != p["queue"]
        if pid not in self.preempting:                  # first victim of this preemption
            self.preempting.add(pid)
            assert not self.fits_now(p), "no preemption while free capacity would do"
            g = self.cfg.queues[p["queue"]].guaranteed.get("gpu", 0)
            assert self.usage(p["queue"], "gpu") + p["pods"] * p["gpus_per_pod"] <= g, "preemptor within guarantee"
        self._stop(vid, t)
        self.left[vid] = self.left[vid] if w["checkpoint"] else float(w["duration"])
        self.state[vid] = "pending"
        shared = set(self.chain(p["queue"]))
        for q in self.chain(w["queue"]):
            if q not in shared:
                assert self.usage(q, "gpu") >= self.cfg.queues[q].guaranteed.get("gpu", 0), f"{q} below guarantee"

    def on_finish(self, e: dict[str, Any], w: dict[str, Any], t: float, rest: list[Any]) -> None:
        wid = e["workload"]
        assert abs(self.running[wid]["start"] + self.left[wid] - t) < 1e-6, "runs exactly its remaining time"
        self._stop(wid, t)
        self.state[wid] = "finished"

    def _stop(self, wid: str, t: float) -> None:
        r = self.running.pop(wid)
        for node, n in r["pl"].items():
            self.used[node] -= n
        self.left[wid] -= t - r["start"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_scenarios_keep_every_rule(sc: dict[str, Any]) -> None:
    first = run_scenario(sc)
    Checker(sc).check(list(first.events))
    assert run_scenario(sc).events_jsonl() == first.events_jsonl()


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_cross_cycle_memos_never_change_a_decision(sc: dict[str, Any]) -> None:
    """Every cycle of a replay decides the same (admissions, preemptions, each reason and its
    position) with the memos the cluster keeps across cycles as on a cluster with none."""
    import dataclasses

    from scheduler.cycle import schedule
    from scheduler.memo import CycleMemo
    from scheduler.simulator import parse_scenario
    from scheduler.simulator.engine import simulate

    def checked(snap: Any, now: float) -> Any:
        warm = schedule(snap, now)
        cold = dataclasses.replace(snap, cluster=dataclasses.replace(snap.cluster, memo=CycleMemo()))
        assert schedule(cold, now) == warm
        return warm

    simulate(parse_scenario(sc), checked)
