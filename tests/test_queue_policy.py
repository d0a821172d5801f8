"""Issue 17, finding 2: a tenant could hold GPUs nobody can reclaim (``preemptible: false`` or a
huge ``priority`` over its queue's guarantee, from the API or from a Kubernetes object's labels).

The queue policy (``policy: {max_priority, non_preemptible}``, inherited, narrowed by operator
tokens) and the scheduler's rule that a non-preemptible workload runs only within its queue's
guarantee: the queue file's parsing, the core rule, the attack replayed over the API, the
Kubernetes source through the replaying API server (a ``policy`` reason and an Event), a restart,
and the simulator."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from accounting.errors import QueueConfigError
from accounting.queues import DEFAULT_POLICY, OPEN_POLICY, Policy, load_queue_config, parse_queue_config
from gpuq.settings import CollectorSettings, KubernetesTarget, Settings, load_settings
from scheduler import events as ev
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.actuators.k8s_workloads import KubernetesWorkloadSource
from scheduler.actuators.kubernetes import KubernetesActuator
from scheduler.api import create_app
from scheduler.cycle import schedule
from scheduler.model import ReasonCode, Workload
from scheduler.service import SchedulerService
from scheduler.service.sources import sync_listed
from scheduler.simulator import run_scenario
from scheduler.snapshot import Settings as CoreSettings
from scheduler.snapshot import snapshot
from scheduler.testing import cluster, nodes, run, wl
from tests.k8s_api_server import ApiServer, load

# -- the queue file ---------------------------------------------------------------------------------


def test_policy_is_inherited_and_may_only_narrow() -> None:
    c = parse_queue_config({"queues": {
        "prod": {"policy": {"max_priority": 1000, "non_preemptible": True},
                 "queues": {"serving": {}, "batch": {"policy": {"non_preemptible": False}}}},
        "research": {"queues": {"llm": {}}},
    }})
    assert c.queues["prod.serving"].policy == Policy(1000, True)        # inherited whole
    assert c.queues["prod.batch"].policy == Policy(1000, False)         # one key narrowed, the other inherited
    assert c.queues["research.llm"].policy == DEFAULT_POLICY == Policy(0, False)   # the default
    # a scenario's queues have no bound unless they say so
    assert parse_queue_config({"queues": {"q": {}}}, default_policy=OPEN_POLICY).queues["q"].policy == OPEN_POLICY


@pytest.mark.parametrize("data, where, words", [
    ({"queues": {"prod": {"policy": {"max_priority": 10}, "queues": {"s": {"policy": {"max_priority": 11}}}}}},
     "queues.prod.s.policy.max_priority", "11 is above the max_priority 10 in force on prod"),
    ({"queues": {"prod": {"queues": {"s": {"policy": {"non_preemptible": True}}}}}},
     "queues.prod.s.policy.non_preemptible", "prod does not allow non-preemptible workloads"),
    ({"policy": {"max_priority": 5}, "queues": {"prod": {"policy": {"max_priority": 6}}}},
     "queues.prod.policy.max_priority", "in force on root"),
    ({"queues": {"prod": {"policy": {"max_priority": "high"}}}}, "queues.prod.policy.max_priority",
     "expected an integer, got 'high'"),
    ({"queues": {"prod": {"policy": {"max_priority": 2**31}}}}, "queues.prod.policy.max_priority",
     "must be within -2147483648..2147483647"),
    ({"queues": {"prod": {"policy": {"non_preemptible": "yes"}}}}, "queues.prod.policy.non_preemptible",
     "expected true or false"),
    ({"queues": {"prod": {"policy": {"max_prio": 1}}}}, "queues.prod.policy.max_prio", "unknown key"),
    ({"queues": {"prod": {"policy": [1]}}}, "queues.prod.policy", "expected a mapping"),
    ({"policy": {"non_preemptible": 1}, "queues": {}}, "policy.non_preemptible", "expected true or false"),
], ids=["widen-priority", "widen-non-preemptible", "widen-top-level", "not-int", "out-of-range", "not-bool",
        "unknown-key", "not-mapping", "top-level-type"])
def test_bad_policies_are_refused_naming_the_yaml_path(data: dict[str, Any], where: str, words: str) -> None:
    with pytest.raises(QueueConfigError) as err:
        parse_queue_config(data)
    assert err.value.where == where and words in err.value.reason, str(err.value)


def test_a_widening_queue_file_names_the_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "queues.yaml"
    f.write_text("queues:\n  research:\n    policy: {max_priority: 10}\n    queues:\n"
                 "      llm:\n        policy:\n          max_priority: 1000000\n")
    with pytest.raises(QueueConfigError) as err:
        load_queue_config(f)
    assert err.value.located().startswith(f"{f}:7: queues.research.llm.policy.max_priority: 1000000 is above")


# -- the core rule ----------------------------------------------------------------------------------
QUEUES = {"a": {"guaranteed": {"gpu": 8}}, "b": {"guaranteed": {"gpu": 8}}}


def test_non_preemptible_work_runs_only_within_its_queues_guarantee() -> None:
    """Free GPUs are there, yet ``a``'s second non-preemptible 8 stays pending: ``a`` would hold 16
    GPUs nobody can reclaim. A preemptible workload of the very same shape in the same queue, in
    the same cycle, borrows them (the verdicts kept per gang shape keep the two apart)."""
    c = cluster(QUEUES, ("h", "H100", 8, 3))
    pinned = run(wl("pinned", "a", preemptible=False), "H100", ("h-0", 8))
    over = wl("over", "a", preemptible=False, submit_s=1.0)
    borrow = wl("borrow", "a", submit_s=2.0)
    d = schedule(snapshot(c, [pinned], [over, borrow]), 10.0)
    assert [a.workload.id for a in d.admissions] == ["borrow"]
    r = d.reason("over")
    assert r is not None and r.code is ReasonCode.NON_PREEMPTIBLE_OVER_GUARANTEE
    assert r.message == ("non-preemptible: queue a's non-preemptible work would hold 16 gpu, above its "
                         "guaranteed 8 (it holds 8)")
    # within the guarantee it starts on free capacity like any other
    d = schedule(snapshot(c, [], [over, borrow]), 10.0)
    assert {a.workload.id for a in d.admissions} == {"over", "borrow"}
    # ... also when the queue's preemptible work already fills the guarantee: what it then holds
    # above the guarantee is that preemptible work, which others can reclaim
    filled = run(wl("filled", "a"), "H100", ("h-0", 8))
    for _ in range(2):                                 # the second cycle reads the first's memos
        d = schedule(snapshot(c, [filled], [over]), 10.0)
        assert [a.workload.id for a in d.admissions] == ["over"]


def test_a_queue_of_non_preemptible_work_over_its_guarantee_is_not_walked_and_says_so() -> None:
    """A deep queue of non-preemptible work at its guarantee takes its verdicts from counts, not a
    walk (the cycle's "quiet" shortcut), with the same reasons as a cycle on a cluster without
    the memos earlier cycles leave."""
    import dataclasses

    import scheduler.cycle as cy
    from scheduler.memo import CycleMemo

    c = cluster(QUEUES, ("h", "H100", 8, 3))
    pinned = run(wl("pinned", "a", preemptible=False), "H100", ("h-0", 8))
    waiting = [wl(f"w{i}", "a", gpus=4 if i % 2 else 8, preemptible=False, submit_s=float(i)) for i in range(40)]
    snap = snapshot(c, [pinned], waiting)
    schedule(snap, 1.0)                               # the first cycle walks and leaves its memos
    d = schedule(snap, 2.0)
    assert [type(p) for p in d.pending._parts] == [cy._Quiet]          # type: ignore[attr-defined]
    cold = schedule(dataclasses.replace(snap, cluster=dataclasses.replace(c, memo=CycleMemo())), 2.0)
    assert d == cold and d.admissions == () and len(d.pending) == 40
    assert {p.code for p in d.pending} == {ReasonCode.NON_PREEMPTIBLE_OVER_GUARANTEE}
    assert d.reason("w1") is not None and "would hold 12 gpu" in d.reason("w1").message  # type: ignore[union-attr]


def test_a_non_preemptible_workload_within_guarantee_preempts_borrowers() -> None:
    c = cluster(QUEUES, ("h", "H100", 8, 2))
    borrowed = [run(wl(f"b{i}", "b", submit_s=0.0), "H100", (f"h-{i}", 8), start_s=0.0) for i in range(2)]
    mine = wl("mine", "a", preemptible=False, submit_s=0.0)
    d = schedule(snapshot(c, borrowed, [mine], CoreSettings(True, 0.0)), 5.0)
    assert [a.workload.id for a in d.admissions] == ["mine"] and len(d.admissions[0].victims) == 1


def test_non_preemptible_larger_than_its_guarantee_never_fits_and_typed_guarantees_bind() -> None:
    from scheduler.cycle import never_fits

    c = cluster({"a": {"guaranteed": {"gpu": 8, "gpu/H100": 4}}}, ("h", "H100", 8, 1), ("x", "A100", 8, 1))
    assert never_fits(c, wl("big", "a", gpus=16, preemptible=False, types=("A100",))) is not None
    assert never_fits(c, wl("big", "a", gpus=8, types=("A100",))) is None   # preemptible: it may borrow
    # 8 H100 is over the typed guarantee of 4: only A100 is left for it
    assert "guarantees 4" in (never_fits(c, wl("h", "a", preemptible=False, types=("H100",))) or "")
    d = schedule(snapshot(c, [], [wl("w", "a", preemptible=False, types=("H100", "A100"))]), 1.0)
    assert [(a.workload.id, a.placement.gpu_type) for a in d.admissions] == [("w", "A100")]


# -- the attack over the API ----------------------------------------------------------------------------
ATTACK_QUEUES = {"prod": {"guaranteed": {"gpu": 16}},
                 "research": {"queues": {"llm": {"guaranteed": {"gpu": 8}}}}}
TOKENS = [{"token": "op-r", "role": "operator", "name": "researcher", "namespaces": ["*"], "queues": ["research"]},
          {"token": "op-narrow", "role": "operator", "name": "intern", "namespaces": ["*"], "queues": ["research"],
           "max_priority": 5, "non_preemptible": False},
          {"token": "admin-t", "role": "admin", "name": "ada"}]


class Api:
    def __init__(self, app: Any) -> None:
        self.app = app

    def __call__(self, method: str, url: str, token: str, **kw: Any) -> httpx.Response:
        async def go() -> httpx.Response:
            async with httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url="http://localhost") as c:
                return await c.request(method, url, headers={"Authorization": f"Bearer {token}"}, **kw)
        return asyncio.run(go())


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def attack_api(policy: dict[str, Any] | None) -> tuple[SchedulerService, Api, Clock]:
    queues = {**ATTACK_QUEUES, "research": {**ATTACK_QUEUES["research"], **({"policy": policy} if policy else {})}}
    svc = SchedulerService(parse_queue_config({"queues": queues}), DryRunActuator(),
                           nodes=nodes(("h", "H100", 8, 3)), settings=CoreSettings(True, 5.0))
    clock = Clock()
    return svc, Api(create_app(svc, None, load_settings(None, api={"tokens": TOKENS}), clock=clock)), clock


def body(wid: str, queue: str, **kw: Any) -> dict[str, Any]:
    return {"id": wid, "queue": queue, "gpus_per_pod": 8, **kw}


def problem(r: httpx.Response) -> tuple[int, str, str]:
    p = r.json()
    return r.status_code, p["errors"][0]["field"], p["errors"][0]["message"]


def test_the_attack_is_refused_by_default_and_the_admin_gets_its_gpus_back() -> None:
    """The probe's attack on a queue file written before the policy: two 8-GPU workloads over
    research's guarantee, non-preemptible or at priority 1000000. Both are refused (422 naming the
    bound, on submit and dry run alike); what the tenant may submit (preemptible, priority 0)
    borrows the free GPUs, and the admin's 8-GPU workload within prod's guarantee preempts it."""
    svc, api, clock = attack_api(None)
    for extra, want in (({"preemptible": False}, ("body.preemptible", "non-preemptible workloads are not "
                                                  "allowed in research.llm (its policy.non_preemptible is false)")),
                        ({"priority": 1000000}, ("body.priority", "priority 1000000 above research.llm's "
                                                 "max_priority 0"))):
        for path in ("/workloads", "/dry-run"):
            r = api("POST", path, "op-r", json=body("grab", "research.llm", **extra))
            assert problem(r) == (422, *want), r.text
            assert r.json()["errors"][0]["type"] == "policy"
    assert svc.workloads() == []
    for i in range(3):                                   # all 24 GPUs: 8 within llm's guarantee, 16 borrowed
        assert api("POST", "/workloads", "op-r", json=body(f"grab-{i}", "research.llm")).status_code == 201
    svc.cycle(clock.t)
    assert {v.id for v in svc.workloads(state="running")} == {"grab-0", "grab-1", "grab-2"}
    assert api("POST", "/workloads", "admin-t", json=body("serve", "prod")).status_code == 201
    svc.cycle(clock.t + 1)
    assert svc.explain("serve").reason_code == "waiting_preemption_delay"
    svc.cycle(clock.t + 10)
    assert svc.explain("serve").state == "running"
    assert sum(v.state == "running" for v in svc.workloads() if v.queue == "research.llm") == 2


def test_allowed_non_preemptible_work_never_holds_borrowed_gpus() -> None:
    """research allows non-preemptible work (and priorities up to 100): its first non-preemptible
    8 GPUs are within llm's guarantee and run; the second stays pending with
    ``non_preemptible_over_guarantee`` though GPUs are free; prod's workloads take their guarantee,
    the last one by preempting the borrowed, preemptible work."""
    svc, api, clock = attack_api({"max_priority": 100, "non_preemptible": True})
    assert api("POST", "/workloads", "op-r", json=body("pin-0", "research.llm", preemptible=False)).status_code == 201
    svc.cycle(clock.t)
    assert api("POST", "/workloads", "op-r", json=body("pin-1", "research.llm", preemptible=False,
                                                         priority=100)).status_code == 201
    r = api("POST", "/workloads", "op-r", json=body("pin-2", "research.llm", priority=101))
    assert problem(r) == (422, "body.priority", "priority 101 above research.llm's max_priority 100")
    svc.cycle(clock.t + 1)
    pin1 = svc.explain("pin-1")
    assert (pin1.state, pin1.reason_code) == ("pending", "non_preemptible_over_guarantee"), pin1
    assert "would hold 16 gpu, above its guaranteed 8" in (pin1.message or "")
    assert api("POST", "/workloads", "op-r", json=body("borrow", "research.llm")).status_code == 201
    assert api("POST", "/workloads", "admin-t", json=body("serve-0", "prod")).status_code == 201
    svc.cycle(clock.t + 2)
    assert {v.id for v in svc.workloads(state="running")} == {"pin-0", "borrow", "serve-0"}
    assert api("POST", "/workloads", "admin-t", json=body("serve-1", "prod")).status_code == 201
    svc.cycle(clock.t + 3)
    svc.cycle(clock.t + 10)
    assert {v.id for v in svc.workloads(state="running")} == {"pin-0", "serve-0", "serve-1"}
    assert svc.explain("borrow").reason_code == "preempted"
    assert svc.explain("pin-1").reason_code == "non_preemptible_over_guarantee"
    # the queue's bound holds for every caller: an admin cannot go over it either
    r = api("POST", "/workloads", "admin-t", json=body("admin-big", "research.llm", priority=1000))
    assert problem(r) == (422, "body.priority", "priority 1000 above research.llm's max_priority 100")


def test_an_operator_tokens_scope_narrows_the_queues_policy() -> None:
    _, api, _ = attack_api({"max_priority": 100, "non_preemptible": True})
    for path in ("/workloads", "/dry-run"):
        assert problem(api("POST", path, "op-narrow", json=body("x", "research.llm", priority=6))) == (
            422, "body.priority", "priority 6 above this token's max_priority 5")
        assert problem(api("POST", path, "op-narrow", json=body("x", "research.llm", preemptible=False))) == (
            422, "body.preemptible", "this token may not submit non-preemptible workloads (its non_preemptible "
                                     "is false)")
    assert api("POST", "/dry-run", "op-narrow", json=body("x", "research.llm", priority=5)).status_code == 200
    assert api("POST", "/workloads", "op-narrow", json=body("x", "research.llm", priority=5)).status_code == 201


def test_token_bounds_are_for_operators_only() -> None:
    with pytest.raises(Exception, match="max_priority and non_preemptible narrow an operator's submits"):
        load_settings(None, api={"tokens": [{"token": "v", "role": "viewer", "max_priority": 3}]})
    with pytest.raises(Exception, match="less than or equal to 2147483647"):
        load_settings(None, api={"tokens": [{**TOKENS[0], "max_priority": 2**31}]})


# -- the Kubernetes source ------------------------------------------------------------------------------
K8S_QUEUES = {"prod": {"guaranteed": {"gpu": 16}, "policy": {"max_priority": 1000}},
              "team-x": {"guaranteed": {"gpu": 8}}}
GRAB = "rayjob/team-x/grab"


def grab(**annotations: str) -> dict[str, Any]:
    """The probe's object: a RayJob in team-x naming prod's queue, 2 x 8 GPUs, with ``annotations``
    (derived from KubeRay's sample, as the other source tests' objects)."""
    obj = load("rayjob-train-llm.json")
    obj["metadata"].update(name="grab", namespace="team-x", uid="6c1f7b1e-3e5d-4b9f-8b62-1d8e4f3a0c22",
                           labels={"queue": "prod"}, annotations=annotations)
    return obj


@pytest.fixture
def k8s(tmp_path: Path) -> Iterator[tuple[ApiServer, KubernetesWorkloadSource, KubernetesActuator]]:
    with ApiServer([grab(**{"gpuq.io/priority": "2147483647", "gpuq.io/preemptible": "false"})]) as server:
        settings = Settings(collector=CollectorSettings(kubernetes=[
            KubernetesTarget(cluster="test", kubeconfig=str(server.kubeconfig(tmp_path / "kubeconfig")))]))
        source = KubernetesWorkloadSource(settings, node_labels={})
        act = KubernetesActuator(settings, node_labels={}, sleep=lambda _s: None)
        try:
            yield server, source, act
        finally:
            source.close()
            act.close()


def test_an_object_over_its_queues_policy_is_held_with_a_reason_and_an_event(
        k8s: tuple[ApiServer, KubernetesWorkloadSource, KubernetesActuator]) -> None:
    """The probe's RayJob (labelled ``queue: prod``, ``gpuq.io/priority: 2147483647``,
    ``gpuq.io/preemptible: "false"``) is listed, held pending with the reason ``policy`` (never
    in a cycle) and told so by one ``PolicyRefused`` Event however many syncs pass; fixed, it is
    taken as it now is and admitted."""
    server, source, act = k8s
    sink = Rows()
    svc = SchedulerService(parse_queue_config({"queues": K8S_QUEUES}), act, nodes=nodes(("h", "H100", 8, 3)),
                           settings=CoreSettings(True, 5.0), sink=sink, sleep=lambda _s: None)
    told: dict[str, str] = {}
    report = sync_listed(svc, source, 10.0, tell=act.refuse, told=told)
    assert report.submitted == (GRAB,) and report.held == (GRAB,)
    view = svc.explain(GRAB)
    why = "priority 2147483647 above prod's max_priority 1000"
    assert (view.state, view.reason_code, view.message, view.position) == ("pending", "policy", why, None)
    d = svc.cycle(11.0)
    assert d.admissions == () and svc.explain(GRAB).reason_code == "policy"
    (event,) = server.events("team-x")
    assert (event["reason"], event["type"], event["action"]) == ("PolicyRefused", "Warning", "Refuse")
    assert event["message"] == f"not admitted: {why}"
    assert event["involvedObject"] == {"apiVersion": "ray.io/v1", "kind": "RayJob", "name": "grab",
                                       "namespace": "team-x"}
    for t in (12.0, 13.0):
        assert sync_listed(svc, source, t, tell=act.refuse, told=told).held == (GRAB,)
    assert len(server.calls("POST", "/events")) == 1               # told once
    # a restart: the submit is replayed and the workload is held again (before any sync)
    again = SchedulerService(parse_queue_config({"queues": K8S_QUEUES}), DryRunActuator(),
                             nodes=nodes(("h", "H100", 8, 3)))
    again.restore(sink.stored())
    assert again.explain(GRAB).reason_code == "policy" and again.cycle(14.0).admissions == ()
    # priority fixed, still non-preemptible where prod does not allow it: held, told anew
    server.put(grab(**{"gpuq.io/priority": "10", "gpuq.io/preemptible": "false"}))
    sync_listed(svc, source, 15.0, tell=act.refuse, told=told)
    assert svc.explain(GRAB).message == ("non-preemptible workloads are not allowed in prod "
                                         "(its policy.non_preemptible is false)")
    assert len(server.events("team-x")) == 2
    # both fixed: taken as it is now, and admitted by the next cycle
    server.put(grab(**{"gpuq.io/priority": "10"}))
    assert sync_listed(svc, source, 16.0, tell=act.refuse, told=told).held == ()
    svc.cycle(17.0)
    running = svc.explain(GRAB)
    assert (running.state, running.priority, running.preemptible) == ("running", 10, True)
    assert told == {}


def test_a_reload_that_allows_it_releases_a_held_workload() -> None:
    svc = SchedulerService(parse_queue_config({"queues": K8S_QUEUES}), DryRunActuator(),
                           nodes=nodes(("h", "H100", 8, 3)))
    svc.submit(Workload("rayjob/team-x/hi", "prod", gpus_per_pod=8, priority=5000), Target("RayJob", "team-x", "hi"), 1.0)
    assert svc.explain("rayjob/team-x/hi").reason_code == "policy"
    wider = {**K8S_QUEUES, "prod": {**K8S_QUEUES["prod"], "policy": {"max_priority": 10_000}}}
    svc.set_config(parse_queue_config({"queues": wider}))
    view = svc.explain("rayjob/team-x/hi")
    assert (view.reason_code, view.position) == ("queued", 1)
    svc.cycle(2.0)
    assert svc.explain("rayjob/team-x/hi").state == "running"


class Rows:
    """The service's ``scheduler_events`` rows, read back as a restart reads them."""

    def __init__(self) -> None:
        self.rows: list[tuple[Any, ...]] = []

    def write(self, table: str, rows: Any) -> None:
        if table == ev.TABLE:
            self.rows.extend(rows)

    def stored(self) -> list[ev.StoredEvent]:
        return [ev.StoredEvent(int(r[3]), ev.from_row(r[2:11]), str(r[11])) for r in self.rows]


# -- replays ----------------------------------------------------------------------------------------------
def scenario(workloads: list[dict[str, Any]], **queue_a: Any) -> dict[str, Any]:
    return {"name": "policy", "scheduler": {"preemption_delay_s": 0},
            "nodes": [{"name": "h", "gpu_type": "H100", "gpus": 8, "count": 2}],
            "queues": {"a": {"guaranteed": {"gpu": 8}, **queue_a}, "b": {}}, "workloads": workloads}


def test_replays_keep_the_rule_and_a_scenario_policy_rejects_at_arrival() -> None:
    work = [{"id": "p1", "queue": "a", "gpus_per_pod": 8, "preemptible": False, "duration": 100},
            {"id": "p2", "queue": "a", "gpus_per_pod": 8, "preemptible": False, "duration": 100},
            {"id": "hi", "queue": "a", "gpus_per_pod": 8, "priority": 1000, "duration": 10},
            {"id": "huge", "queue": "b", "gpus_per_pod": 8, "preemptible": False, "duration": 10}]
    # a scenario without policy has no bound (as before it existed); the rule holds: p2 waits for
    # p1 though GPUs are free, and b (no guarantee) can never run non-preemptible work
    events = run_scenario(scenario(work)).events
    at = {(e["event"], e["workload"]): e for e in events}
    assert at[("admit", "p2")]["t"] >= 100 and at[("admit", "hi")]["t"] == 0
    assert at[("reject", "huge")]["reason"] == ("non-preemptible: needs 8 gpu, queue b guarantees 0 "
                                                "(non-preemptible work runs only within its queue's guarantee)")
    # with a policy the over-bound workloads are rejected on arrival, saying why
    events = run_scenario(scenario(work, policy={"max_priority": 10, "non_preemptible": False})).events
    rejected = {e["workload"]: e["reason"] for e in events if e["event"] == "reject"}
    assert rejected == {"p1": "policy: non-preemptible workloads are not allowed in a (its policy.non_preemptible "
                               "is false)",
                        "p2": "policy: non-preemptible workloads are not allowed in a (its policy.non_preemptible "
                              "is false)",
                        "hi": "policy: priority 1000 above a's max_priority 10",
                        "huge": at[("reject", "huge")]["reason"]}


def test_the_trace_import_gives_its_queues_the_policy_their_pods_need() -> None:
    """The Alibaba import marks LS and Guaranteed pods non-preemptible (priority 2): the queues it
    creates say so explicitly, and so work unchanged as a production queue file (whose default
    would refuse them), every pod within its queue's policy."""
    from scheduler.policy import refusal
    from scheduler.traces import load_alibaba_v2023
    from tests.conftest import data_path

    sc = load_alibaba_v2023(data_path("traces", "alibaba-gpu-v2023"), assignment="qos", limit=1500).scenario
    policies = {q: spec["policy"] for q, spec in sc["queues"].items()}
    assert policies == {"ls": {"max_priority": 2, "non_preemptible": True},
                        "guaranteed": {"max_priority": 2, "non_preemptible": True},
                        "burstable": {"max_priority": 1, "non_preemptible": False},
                        "be": {"max_priority": 0, "non_preemptible": False}}
    production = parse_queue_config({"queues": sc["queues"]}, strict_top=True)
    kinds = {(w["priority"], w["preemptible"]) for w in sc["workloads"]}
    assert {(2, False), (1, True), (0, True)} <= kinds
    for w in sc["workloads"]:
        workload = Workload(w["id"], w["queue"], priority=w["priority"], preemptible=w["preemptible"])
        assert refusal(production, workload) is None, w
