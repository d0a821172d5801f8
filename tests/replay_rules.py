"""An independent checker of a replay's events: every rule of docs/SCENARIOS.md (:class:`Checker`)
and, at every event, what each device holds (:class:`DeviceBook`, :func:`check_devices`).

It shares no code with the scheduler beyond the queue-config parser: it reads the scenario as
written (a mapping, as YAML or JSON lines give it) and the events as the simulator writes them,
and keeps its own books. GPU amounts are integer thousandths here (``0.46`` -> 460, ``2`` ->
2000), so sums of shares are exact without sharing the scheduler's :class:`fractions.Fraction`
arithmetic. Used by tests/test_scheduler_properties.py (random scenarios),
tests/test_trace_shares.py (the Alibaba trace with shares) and benchmarks/bench_trace_shares.py
(the whole trace).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from accounting.queues import OPEN_POLICY, QueueConfig, parse_queue_config

MILLI = 1000
WHOLE = MILLI                      # one device, in thousandths
SCHED_DEFAULTS = {"preemption": True, "preemption_delay_s": 30, "cycle_interval_s": 1,
                  "reclaim": "guarantee"}   # docs/SCENARIOS.md
WORKLOAD_DEFAULTS = {"pods": 1, "gpus_per_pod": 1, "gpu_types": [], "priority": 0, "preemptible": True,
                     "checkpoint": False, "submit": 0}


def milli(v: Any) -> int:
    """GPUs as integer thousandths, exactly (``0.46`` -> 460); anything finer is an error (the
    scheduler's unit is the thousandth)."""
    f = Fraction(str(v)) * MILLI
    if f.denominator != 1:
        raise ValueError(f"{v!r} GPUs is not a whole number of thousandths")
    return int(f)


def node_caps(scenario: Mapping[str, Any]) -> tuple[dict[str, int], dict[str, str]]:
    """(GPUs, GPU type) per node name, node groups expanded as the simulator names them
    (``name-0`` .. ``name-{count-1}``; a group without ``count`` is the one node ``name``)."""
    cap: dict[str, int] = {}
    ntype: dict[str, str] = {}
    for g in scenario["nodes"]:
        names = [f"{g['name']}-{j}" for j in range(g["count"])] if "count" in g else [g["name"]]
        for n in names:
            cap[n] = g["gpus"]
            ntype[n] = g["gpu_type"]
    return cap, ntype


class DeviceBook:
    """The share of every device that each running workload holds, from its admit's ``devices``
    (``{node: {device index: share}}``), given back at its ``finish`` or ``preempt``.

    :meth:`take` checks an admit against the workload and the cluster: every node is known and of
    the admit's GPU type, every index an integer within the node's GPUs, every share a positive
    number of thousandths; a whole gang holds whole devices, ``gpus_per_pod`` of them per pod; a
    gang of shares holds on each device a whole number of its pods' shares (pods of one gang may
    share a device, one pod never spans two); per node the devices add up to ``placement``, in all
    to the gang. Then, the point of it, **no device is held above its whole** (1000 thousandths).
    Only an admit adds to what a device holds, so checking each admit's devices checks the state
    after every event; a finish or preempt must give back what its workload holds, no more.
    """

    def __init__(self, cap: Mapping[str, int], ntype: Mapping[str, str]) -> None:
        self.cap = cap
        self.ntype = ntype
        self.used: dict[str, list[int]] = {n: [0] * c for n, c in cap.items()}
        self.held: dict[str, list[tuple[str, int, int]]] = {}      # workload -> (node, index, share)
        self.busy = 0                                               # devices with any share held
        self.shared = 0                                             # devices held below their whole

    def free(self, node: str, i: int) -> int:
        return WHOLE - self.used[node][i]

    def take(self, wid: str, gpu_type: str, devices: Any, placement: Mapping[str, Any], pods: int,
             per_pod: int) -> list[str]:
        """Record ``wid``'s devices; the list of what is wrong with them (empty: all is right)."""
        bad: list[str] = []
        if wid in self.held:
            return [f"{wid}: admitted while it still holds devices"]
        if not isinstance(devices, Mapping):
            return [f"{wid}: an admit without devices ({devices!r})"]
        got: list[tuple[str, int, int]] = []
        per_node: dict[str, int] = {}
        for node, on in devices.items():
            if node not in self.cap:
                bad.append(f"{wid}: unknown node {node!r}")
                continue
            if self.ntype[node] != gpu_type:
                bad.append(f"{wid}: node {node} is {self.ntype[node]}, the admit says {gpu_type}")
            for key, share in (on or {}).items():
                try:
                    i = int(key)
                    amount = milli(share)
                except (TypeError, ValueError) as exc:
                    bad.append(f"{wid}: {node} device {key!r} share {share!r}: {exc}")
                    continue
                if str(i) != str(key) or not 0 <= i < self.cap[node]:
                    bad.append(f"{wid}: {node} has devices 0..{self.cap[node] - 1}, not {key!r}")
                    continue
                if not 0 < amount <= WHOLE:
                    bad.append(f"{wid}: {node} device {i}: share {share!r} outside (0, 1]")
                    continue
                if per_pod >= WHOLE and amount != WHOLE:
                    bad.append(f"{wid}: a whole gang holds part ({share}) of {node} device {i}")
                if per_pod < WHOLE and amount % per_pod:
                    bad.append(f"{wid}: {node} device {i} holds {share}, not a whole number of pods "
                               f"of {per_pod / MILLI:g} (a pod never spans two devices)")
                got.append((node, i, amount))
                per_node[node] = per_node.get(node, 0) + amount
        want = {str(n): milli(g) for n, g in placement.items()}
        if per_node != want:
            bad.append(f"{wid}: devices add up to {per_node} thousandths per node, placement says {want}")
        if sum(per_node.values()) != pods * per_pod:
            bad.append(f"{wid}: devices hold {sum(per_node.values())} thousandths, the gang asks "
                       f"{pods} x {per_pod}")
        self.held[wid] = got
        for node, i, amount in got:
            was = self.used[node][i]
            now = self.used[node][i] = was + amount
            if was == 0:
                self.busy += 1
            self.shared += (now < WHOLE) - (0 < was < WHOLE)
            if now > WHOLE:
                bad.append(f"{wid}: {node} device {i} held {now / MILLI:g} of its whole "
                           f"({was / MILLI:g} before this admit)")
        return bad

    def give(self, wid: str) -> list[str]:
        got = self.held.pop(wid, None)
        if got is None:
            return [f"{wid}: stops while holding no device"]
        for node, i, amount in got:
            was = self.used[node][i]
            now = self.used[node][i] = was - amount
            if now == 0:
                self.busy -= 1
            self.shared += (0 < now < WHOLE) - (0 < was < WHOLE)
        return []


@dataclass(slots=True)
class DeviceReport:
    """What :func:`check_devices` found: ``problems`` (each naming its event) and the peaks of the
    replay: pods running at once, devices with any share held, devices held below their whole,
    GPUs held by share (thousandths)."""

    events: int = 0
    admits: int = 0
    problems: list[str] = field(default_factory=list)
    peak_pods: int = 0
    peak_devices: int = 0
    peak_shared_devices: int = 0
    peak_gpus_milli: int = 0
    max_device_milli: int = 0


def check_devices(scenario: Mapping[str, Any], events: Iterable[Mapping[str, Any]]) -> DeviceReport:
    """Walk ``events`` with a :class:`DeviceBook`: every admit's devices checked, the state after
    every event never above a device's whole; all problems listed, not only the first."""
    cap, ntype = node_caps(scenario)
    spec = {w["id"]: {**WORKLOAD_DEFAULTS, **w} for w in workloads_of(scenario)}
    book = DeviceBook(cap, ntype)
    rep = DeviceReport()
    pods = held = 0
    size: dict[str, tuple[int, int]] = {}
    for k, e in enumerate(events):
        rep.events += 1
        kind, wid = e["event"], e["workload"]
        if kind == "admit":
            w = spec[wid]
            per = milli(w["gpus_per_pod"])
            rep.admits += 1
            rep.problems += [f"event {k} (t={e['t']}): {p}" for p in
                             book.take(wid, e.get("gpu_type", ""), e.get("devices"), e.get("placement") or {},
                                       w["pods"], per)]
            size[wid] = (w["pods"], w["pods"] * per)
            pods += w["pods"]
            held += w["pods"] * per
        elif kind in ("finish", "preempt"):
            rep.problems += [f"event {k} (t={e['t']}): {p}" for p in book.give(wid)]
            n, g = size.pop(wid, (0, 0))
            pods -= n
            held -= g
        else:
            continue
        rep.peak_pods = max(rep.peak_pods, pods)
        rep.peak_gpus_milli = max(rep.peak_gpus_milli, held)
        rep.peak_devices = max(rep.peak_devices, book.busy)
        rep.peak_shared_devices = max(rep.peak_shared_devices, book.shared)
        for node, i, _ in book.held.get(wid, ()) if kind == "admit" else ():
            rep.max_device_milli = max(rep.max_device_milli, book.used[node][i])
    return rep


def workloads_of(scenario: Mapping[str, Any]) -> Sequence[Mapping[str, Any]]:
    return scenario.get("workloads") or ()


class Checker:
    """Every rule of docs/SCENARIOS.md, checked event by event (the first broken one raises
    ``AssertionError``): order of events, admissions on the cycle grid, acceptable GPU types,
    whole gangs, node capacity per device (:class:`DeviceBook`), every ``max`` on the queue's
    chain, non-preemptible work within its queue's guarantee, preemption only when allowed,
    by a preemptor within its guarantee and never while free capacity would do (judged per
    device: a share fits where some device has that much free), victims' queues not pushed below
    their guarantee, a victim of the preemptor's own queue only under ``within_queue`` and of
    strictly lower priority (such a preemption takes no other queue's work, and no guarantee
    bounds it), nothing preempted before its queue's ``min_runtime_s``, each preempt's
    ``lost_gpu_seconds`` its run's GPU-seconds (0 when it checkpoints), rejections only for what
    never fits or breaks the queue's policy, every workload run for exactly its (remaining) time,
    and all ending finished or rejected.

    Under ``scheduler.reclaim: fair_share`` (issue 21) the preemptor is within its guarantee *or*
    its entitlement, and no victim's queue (nor an ancestor not shared with the preemptor) goes
    below its entitlement either: the entitlements are this checker's own division of the GPUs
    (:meth:`entitlements`, from the running and pending work at the preemption). A preemption
    within the preemptor's own queue is bounded by neither (every queue on the victim's chain is
    the preemptor's own)."""

    def __init__(self, sc: Mapping[str, Any]) -> None:
        self.cfg: QueueConfig = parse_queue_config({"queues": sc["queues"]}, default_policy=OPEN_POLICY)
        self.cap, self.ntype = node_caps(sc)
        self.types = tuple(dict.fromkeys(self.ntype.values()))
        self.nodes_of: dict[str, list[str]] = {t: [n for n in self.cap if self.ntype[n] == t] for t in self.types}
        self.spec = {w["id"]: {**WORKLOAD_DEFAULTS, **w} for w in workloads_of(sc)}
        self.per = {wid: milli(s["gpus_per_pod"]) for wid, s in self.spec.items()}
        self.s = {**SCHED_DEFAULTS, **(sc.get("scheduler") or {})}
        self.book = DeviceBook(self.cap, self.ntype)
        self.running: dict[str, dict[str, Any]] = {}
        self.use: dict[tuple[str, str], int] = {}      # (queue, "gpu" | "gpu/T") -> thousandths running
        self.pinned_use: dict[str, int] = {}          # leaf -> thousandths its non-preemptible work holds
        self.left = {w: float(s["duration"]) for w, s in self.spec.items()}
        self.state = dict.fromkeys(self.spec, "new")
        self.preempting: set[str] = set()       # preemptors whose victims are being listed
        self.own_preemption = False             # is the one being listed within its queue?
        self.at = -1                            # the event being checked (its index)

    def chain(self, q: str) -> tuple[str, ...]:
        return (q, *self.cfg.ancestors(q))

    def usage(self, q: str, res: str) -> int:
        return self.use.get((q, res), 0)

    def guarantee(self, q: str) -> int:
        return self.cfg.queues[q].guaranteed.get("gpu", 0) * MILLI

    def over_max(self, q: str, res: str, amount: int) -> bool:
        m = self.cfg.queues[q].max.get(res)
        return m is not None and m * MILLI < amount

    def slots(self, t: str, per: int, empty: bool, enough: int) -> int:
        """Pods of ``per`` thousandths that fit on type ``t``: now, or on an empty cluster."""
        total = 0
        for n in self.nodes_of.get(t, ()):
            used = [0] * self.cap[n] if empty else self.book.used[n]
            if per < WHOLE:
                total += sum((WHOLE - u) // per for u in used)
            else:
                total += sum(1 for u in used if u == 0) // (per // WHOLE)
            if total >= enough:
                break
        return total

    def fits_now(self, w: Mapping[str, Any]) -> bool:
        """Could ``w`` start on free capacity within every max, right now?"""
        per = milli(w["gpus_per_pod"])
        n = w["pods"] * per
        for t in w["gpu_types"] or self.types:
            if any(self.over_max(q, r, self.usage(q, r) + n) for q in self.chain(w["queue"]) for r in ("gpu", f"gpu/{t}")):
                continue
            if self.slots(t, per, False, w["pods"]) >= w["pods"]:
                return True
        return False

    def over_policy(self, w: Mapping[str, Any]) -> bool:
        p = self.cfg.queues[w["queue"]].policy
        return bool(w["priority"] > p.max_priority or (not w["preemptible"] and not p.non_preemptible))

    def never_fits(self, w: Mapping[str, Any]) -> bool:
        per = milli(w["gpus_per_pod"])
        n = w["pods"] * per
        if not w["preemptible"] and n > self.guarantee(w["queue"]):
            return True                                  # non-preemptible, larger than its guarantee
        for t in w["gpu_types"] or self.types:
            if any(self.over_max(q, r, n) for q in self.chain(w["queue"]) for r in ("gpu", f"gpu/{t}")):
                continue
            if self.slots(t, per, True, w["pods"]) >= w["pods"]:
                return False
        return True

    def check(self, events: Sequence[Mapping[str, Any]]) -> None:
        last_t = 0.0
        for i, e in enumerate(events):
            self.at = i
            t, wid = e["t"], e["workload"]
            w = self.spec[wid]
            assert t >= last_t, "events in time order"
            last_t = t
            getattr(self, "on_" + e["event"])(e, w, t, events, i)
        self.at = len(events)
        for wid, st_ in self.state.items():
            assert st_ in ("finished", "rejected"), f"{wid} ended {st_}"

    def on_submit(self, e: Mapping[str, Any], w: Mapping[str, Any], t: float, events: Sequence[Any], i: int) -> None:
        assert t == w["submit"] and self.state[e["workload"]] == "new"
        self.state[e["workload"]] = "pending"

    def on_reject(self, e: Mapping[str, Any], w: Mapping[str, Any], t: float, events: Sequence[Any], i: int) -> None:
        assert self.state[e["workload"]] == "pending" and (self.never_fits(w) or self.over_policy(w))
        assert e["reason"].startswith("policy: ") == self.over_policy(w), "a policy refusal says so"
        self.state[e["workload"]] = "rejected"

    def on_admit(self, e: Mapping[str, Any], w: Mapping[str, Any], t: float, events: Sequence[Any], i: int) -> None:
        wid, gt, pl = e["workload"], e["gpu_type"], e["placement"]
        per = self.per[wid]
        assert self.state[wid] == "pending" and not self.never_fits(w) and not self.over_policy(w)
        k = t / self.s["cycle_interval_s"]
        assert abs(k - round(k)) < 1e-6, "admissions happen on the cycle grid"
        assert not w["gpu_types"] or gt in w["gpu_types"], "acceptable type"
        gang = w["pods"] * per
        assert sum(milli(n) for n in pl.values()) == gang, "whole gang at once"
        for node, n in pl.items():
            assert self.ntype[node] == gt and milli(n) % per == 0
        bad = self.book.take(wid, gt, e.get("devices"), pl, w["pods"], per)
        assert not bad, "; ".join(bad)                   # node capacity, per device
        self.preempting.discard(wid)
        self.running[wid] = {"queue": w["queue"], "type": gt, "gpus": gang, "start": t,
                             "preemptible": w["preemptible"]}
        self._count(wid, 1)
        self.state[wid] = "running"
        assert self.pinned_use.get(w["queue"], 0) <= self.guarantee(w["queue"]), \
            "no non-preemptible workload holds GPUs over its queue's guarantee"
        for q in self.chain(w["queue"]):
            for r in self.cfg.queues[q].max:
                assert not self.over_max(q, r, self.usage(q, r)), f"{q} over max {r}"

    def on_preempt(self, e: Mapping[str, Any], w: Mapping[str, Any], t: float, events: Sequence[Any], i: int) -> None:
        vid, pid = e["workload"], e["by"]
        p = self.spec[pid]
        assert self.state[vid] == "running", f"{vid} preempted while {self.state[vid]}"
        nxt = next(x for x in events[i + 1:] if x["event"] != "preempt")
        assert (nxt["event"], nxt["workload"], nxt["t"]) == ("admit", pid, t), "preemptor admitted right after"
        assert self.s["preemption"] and t >= p["submit"] + self.s["preemption_delay_s"]
        assert w["preemptible"] and w["priority"] <= p["priority"]
        # within a queue (issue 21): only where within_queue is in force, strictly lower priority,
        # and a preemption's victims are all of its own queue or all of other queues
        own = w["queue"] == p["queue"]
        if own:
            assert self.cfg.queues[p["queue"]].within_queue, "a victim of its own queue without within_queue"
            assert w["priority"] < p["priority"], "within a queue only strictly lower priority"
        assert t - self.running[vid]["start"] >= self.cfg.queues[w["queue"]].min_runtime_s - 1e-9, \
            "nothing preempted before its queue's min_runtime_s"
        run_gs = self.running[vid]["gpus"] * (t - self.running[vid]["start"]) / MILLI
        assert abs(e["lost_gpu_seconds"] - (0.0 if w["checkpoint"] else run_gs)) < 1e-3, \
            "lost_gpu_seconds: the run without a checkpoint, nothing with one"
        if pid not in self.preempting:                  # first victim of this preemption
            self.preempting.add(pid)
            self.own_preemption = own
            assert not self.fits_now(p), "no preemption while free capacity would do"
            if not own:                                 # within its queue, no guarantee bounds it
                would = self.usage(p["queue"], "gpu") + p["pods"] * self.per[pid]
                if self.s["reclaim"] == "fair_share":
                    ent = self.entitlements()
                    assert would <= self.guarantee(p["queue"]) or would <= ent.get(p["queue"], 0), \
                        "preemptor within guarantee or entitlement"
                else:
                    assert would <= self.guarantee(p["queue"]), "preemptor within guarantee"
        assert own == self.own_preemption, "victims all of its own queue or all of others"
        ent = self.entitlements() if self.s["reclaim"] == "fair_share" and not own else {}
        self._stop(vid, t)
        self.left[vid] = self.left[vid] if w["checkpoint"] else float(w["duration"])
        self.state[vid] = "pending"
        shared = set(self.chain(p["queue"]))
        for q in self.chain(w["queue"]):
            if q not in shared:
                assert self.usage(q, "gpu") >= self.guarantee(q), f"{q} below guarantee"
                assert self.usage(q, "gpu") >= ent.get(q, 0), f"{q} below its entitlement ({float(ent.get(q, 0)) / WHOLE:g} GPUs)"

    def entitlements(self) -> dict[str, Fraction]:
        """Each queue's entitlement now, in thousandths (docs/SCENARIOS.md, ``reclaim: fair_share``):
        the cluster's GPUs divided level by level from the root; a queue first gets its ``gpu``
        guarantee up to its demand (its subtree's running and pending work), then what is left of its
        parent's is divided among those still wanting (demand and max not reached, weight above 0)
        by weight, rounded down to whole GPUs, in rounds while a round satisfies someone; the
        rounding's leftover GPUs go one each by the largest fraction cut off (ties: larger weight,
        then file order), each capped by what it still wants."""
        demand: dict[str, int] = {}
        for wid, st_ in self.state.items():
            if st_ in ("running", "pending"):
                for q in self.chain(self.spec[wid]["queue"]):
                    demand[q] = demand.get(q, 0) + self.spec[wid]["pods"] * self.per[wid]
        queues = self.cfg.queues
        out = {"root": Fraction(sum(self.cap.values()) * WHOLE)}
        todo = ["root"]
        while todo:
            parent = todo.pop()
            kids = queues[parent].children
            want, got, weight = {}, {}, {}
            for k in kids:
                cap = queues[k].max.get("gpu")
                want[k] = Fraction(demand.get(k, 0) if cap is None else min(demand.get(k, 0), cap * WHOLE))
                got[k] = min(Fraction(queues[k].guaranteed.get("gpu", 0) * WHOLE), want[k])
                weight[k] = Fraction(queues[k].weight)
            left = out[parent] - sum(got.values())
            cut: dict[str, Fraction] = {}
            while left > 0:
                asking = [k for k in kids if weight[k] > 0 and got[k] < want[k]]
                if not asking:
                    break
                pot, total, again, cut = left, sum(weight[k] for k in asking), False, {}
                for k in asking:
                    fair = pot * weight[k] / total
                    give = want[k] - got[k]
                    if give <= fair:
                        again = True
                    else:
                        give = Fraction(int(fair // WHOLE) * WHOLE)
                        if fair > give:
                            cut[k] = fair - give
                    give = min(give, left)
                    got[k] += give
                    left -= give
                if not again:
                    break
            for k in sorted(cut, key=lambda k: (-cut[k], -weight[k], kids.index(k))):
                give = min(Fraction(WHOLE), left, want[k] - got[k])
                if give > 0:
                    got[k] += give
                    left -= give
            out.update(got)
            todo.extend(kids)
        return out

    def on_finish(self, e: Mapping[str, Any], w: Mapping[str, Any], t: float, events: Sequence[Any], i: int) -> None:
        wid = e["workload"]
        assert self.state[wid] == "running", f"{wid} finishes while {self.state[wid]}"
        assert abs(self.running[wid]["start"] + self.left[wid] - t) < 1e-6, "runs exactly its remaining time"
        self._stop(wid, t)
        self.state[wid] = "finished"

    def _count(self, wid: str, sign: int) -> None:
        r = self.running[wid]
        for q in self.chain(r["queue"]):
            for res in ("gpu", f"gpu/{r['type']}"):
                self.use[(q, res)] = self.use.get((q, res), 0) + sign * r["gpus"]
        if not r["preemptible"]:
            self.pinned_use[r["queue"]] = self.pinned_use.get(r["queue"], 0) + sign * r["gpus"]

    def _stop(self, wid: str, t: float) -> None:
        self._count(wid, -1)
        r = self.running.pop(wid)
        bad = self.book.give(wid)
        assert not bad, "; ".join(bad)
        self.left[wid] -= t - r["start"]


def rule_violations(scenario: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> list[str]:
    """The rules :class:`Checker` finds broken: empty, or the first one with its event (after the
    first, the checker's books no longer follow the replay, so it stops there)."""
    c = Checker(scenario)
    try:
        c.check(events)
    except AssertionError as exc:
        where = f"event {c.at} {dict(events[c.at])}" if 0 <= c.at < len(events) else "at the end"
        return [f"{where}: {exc or 'a rule is broken'}"]
    return []


@dataclass(slots=True)
class Shortfall:
    """What :func:`entitlement_shortfall` measured, per leaf queue: ``gpu_s``, the GPU-seconds the
    queue held below its entitlement (``∫ max(0, entitlement - held) dt``; an entitlement never
    exceeds the queue's demand, so this is GPUs it wanted and was owed); ``waiting_s``, the time it
    had a pending workload that would have kept it within its entitlement (held + the gang <=
    entitlement) and that a preemption could have started: submitted ``preemption_delay_s`` ago
    (preemption on), and preemptible or within its queue's guarantee with the queue's other
    non-preemptible work (the only room such work may take). ``guarantee_violation_s`` of
    scheduler/quality.py, with the entitlement for the guarantee, counted only where reclaiming
    was open to the workload."""

    gpu_s: dict[str, float] = field(default_factory=dict)
    waiting_s: dict[str, float] = field(default_factory=dict)

    @property
    def total_gpu_s(self) -> float:
        return sum(self.gpu_s.values())

    @property
    def total_waiting_s(self) -> float:
        return sum(self.waiting_s.values())


def entitlement_shortfall(scenario: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> Shortfall:
    """How far each leaf queue stayed below its ``reclaim: fair_share`` entitlement over a replay,
    by :meth:`Checker.entitlements` (this module's own division of the GPUs, from the running and
    pending work) after the last event of each instant, held until the next. It does not depend on
    the scenario's ``reclaim``: the same yardstick measures a replay under ``guarantee`` (which
    never preempts to restore an entitlement above the guarantee) and under ``fair_share`` (which
    does), so the two can be compared (tests/test_trace_reclaim.py). The events must pass
    :func:`rule_violations` (the walk raises ``AssertionError`` where they do not)."""
    c = Checker(scenario)
    leaves = list(c.cfg.leaves())
    out = Shortfall(gpu_s=dict.fromkeys(leaves, 0.0), waiting_s=dict.fromkeys(leaves, 0.0))
    prev: float | None = None
    delay = float(c.s["preemption_delay_s"]) if c.s["preemption"] else float("inf")

    def step(until: float) -> None:
        if prev is None or until <= prev:
            return
        ent = c.entitlements()
        dt = until - prev
        for q in leaves:
            held = c.usage(q, "gpu")
            gap = ent.get(q, Fraction(0)) - held
            if gap <= 0:
                continue
            out.gpu_s[q] += float(gap) / MILLI * dt
            if any(st_ == "pending" and c.spec[w]["queue"] == q and entitled(w, q, held, ent[q])
                   for w, st_ in c.state.items()):
                out.waiting_s[q] += dt

    def entitled(wid: str, q: str, held: int, ent: Fraction) -> bool:
        w, gang = c.spec[wid], c.spec[wid]["pods"] * c.per[wid]
        return (prev is not None and prev >= w["submit"] + delay and held + gang <= ent
                and (w["preemptible"] or c.pinned_use.get(q, 0) + gang <= c.guarantee(q)))

    for i, e in enumerate(events):
        c.at = i
        step(e["t"])
        prev = e["t"]
        getattr(c, "on_" + e["event"])(e, c.spec[e["workload"]], e["t"], events, i)
    return out
