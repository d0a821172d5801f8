"""Which namespace may use which queue (issue 17, "a tenant can hold GPUs nobody can reclaim": a
RayJob in team-x labelled ``queue: prod`` became a prod workload). The queue file's ``namespaces``
lists and placement rules (:mod:`accounting.access`); the accounting's billing
(:class:`accounting.resolve.Resolver`); the scheduler's admission (held ``queue_not_allowed``, 403
from the API); the queues placement rules make, seen by the scheduler (quotas), ``/queues`` and
the accounting, and bounded by ``MAX_QUEUES``. The Kubernetes source and the collector through
the store: tests/test_queue_access_k8s.py."""
from __future__ import annotations

import copy
import logging
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.access import rule_of
from accounting.errors import QueueConfigError
from accounting.queues import MAX_QUEUES, load_queue_config, parse_queue_config
from accounting.resolve import UNASSIGNED, Resolver
from gpuq.settings import load_settings
from scheduler import events as ev
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.api import create_app
from scheduler.service import SchedulerService
from scheduler.service.errors import ConfigRejected, InvalidWorkload, QueueNotAllowed
from scheduler.snapshot import Settings
from scheduler.testing import nodes, wl
from tests.test_api import TOKENS, Api, Clock, is_problem

FILE: dict[str, Any] = {
    "mapping": {"namespaces": {"prod-ns": "prod"}},
    "queues": {
        "prod": {"namespaces": ["prod-ns"], "guaranteed": {"gpu": 8}, "max": {"gpu": 16}},
        "research": {"namespaces": ["ml-a", "ml-b"],
                     "queues": {"vision": {"namespaces": ["ml-a"]}, "nlp": {}}},
        "tenants": {"guaranteed": {"gpu": 4}, "max": {"gpu": 16},
                    "placement": {"namespace_queues": True,
                                  "template": {"guaranteed": {"gpu": 2}, "max": {"gpu": 8}}}},
    },
}
NOT_PROD = "namespace team-x may not use queue prod: queues.prod.namespaces does not list it"


def config(data: dict[str, Any] = FILE) -> Any:
    return parse_queue_config(copy.deepcopy(data))


def with_(path: str, value: Any, data: dict[str, Any] = FILE) -> dict[str, Any]:
    """``data`` with the value at the dotted ``path`` replaced (None: removed)."""
    out = copy.deepcopy(data)
    *head, last = path.split(".")
    node = out
    for key in head:
        node = node.setdefault(key, {})
    if value is None:
        node.pop(last, None)
    else:
        node[last] = value
    return out


# -- the queue file ------------------------------------------------------------------------------------
def test_namespaces_are_inherited_and_narrowed_and_placement_parents_take_no_work() -> None:
    c = config()
    assert rule_of(c.queues, "research.nlp") == (frozenset({"ml-a", "ml-b"}), "research")
    assert rule_of(c.queues, "research.vision") == (frozenset({"ml-a"}), "research.vision")
    assert rule_of(c.queues, "tenants") == (None, "")
    assert c.leaves() == ("prod", "research.vision", "research.nlp")      # tenants is a parent, always
    assert c.queues["tenants"].placement is not None and c.queues["tenants"].placement.max == {"gpu": 8}


def test_without_namespaces_any_namespace_may_use_any_queue() -> None:
    """Backward compatible: a file without the key means what it meant."""
    from accounting.access import refusal
    from tests.accounting_helpers import BASE_QUEUES

    c = parse_queue_config(BASE_QUEUES)
    assert all(refusal(c.queues, q, ns) is None for q in c.leaves() for ns in ("team-x", "kube-system"))
    r = Resolver(c)
    leaf = c.leaves()[0]
    assert r.queue(leaf, "team-x") == leaf


INVALID = [
    ("not-a-list", with_("queues.prod.namespaces", "prod-ns"),
     "queues.prod.namespaces: expected a list of Kubernetes namespace names, got 'prod-ns'"),
    ("not-a-namespace-name", with_("queues.prod.namespaces", ["prod-ns", "Prod_NS"]),
     "queues.prod.namespaces: 'Prod_NS' is not a Kubernetes namespace name (DNS-1123 label: lower case "
     "letters, digits and '-', at most 63)"),
    ("child-widens", with_("queues.research.queues.vision.namespaces", ["ml-a", "ml-c", "ml-d"]),
     "queues.research.vision.namespaces: ml-c, ml-d not allowed by research's namespaces (ml-a, ml-b): "
     "a queue may only narrow its parent's list"),
    ("mapping-to-a-queue-the-namespace-may-not-use", with_("mapping.namespaces", {"team-x": "prod"}),
     f"mapping.namespaces.team-x: {NOT_PROD}"),
    ("default-is-a-placement-parent", with_("mapping.default", "tenants"),
     "mapping.default: queue 'tenants' is not a leaf (only leaf queues take pods)"),
    ("placement-without-the-switch", with_("queues.tenants.placement", {"template": {}}),
     "queues.tenants.placement.namespace_queues: expected true or false (true: each namespace gets a queue "
     "of its own below this one), got None"),
    ("placement-unknown-key", with_("queues.tenants.placement.template.weight", 2),
     "queues.tenants.placement.template.weight: unknown key (expected one of guaranteed, max)"),
    ("template-above-the-parents-max", with_("queues.tenants.placement.template.max", {"gpu": 32}),
     "queues.tenants.placement.template.max: gpu 32 is above the max 16 of tenants"),
    ("template-guarantee-above-its-max", with_("queues.tenants.placement.template.guaranteed", {"gpu": 9}),
     "queues.tenants.placement.template.max: gpu 8 is below guaranteed 9"),
    ("template-unknown-resource", with_("queues.tenants.placement.template.max", {"gpus": 8}),
     "queues.tenants.placement.template.max.gpus: unknown resource (expected gpu, gpu/<TYPE>, gpu_eq, cpu or memory)"),
]


@pytest.mark.parametrize("data, message", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_access_rules_name_the_place(data: dict[str, Any], message: str) -> None:
    with pytest.raises(QueueConfigError) as err:
        parse_queue_config(data)
    assert str(err.value) == message


def test_a_bad_rule_in_a_file_names_its_line(tmp_path: Path) -> None:
    f = tmp_path / "queues.yaml"
    f.write_text(yaml.safe_dump(with_("queues.research.queues.vision.namespaces", ["ml-c"]), sort_keys=False))
    with pytest.raises(QueueConfigError) as err:
        load_queue_config(f)
    line = f.read_text().splitlines().index("      vision:") + 2            # the namespaces: line below it
    assert err.value.located().startswith(f"{f}:{line}: queues.research.vision.namespaces: ml-c not allowed")


# -- the accounting's billing --------------------------------------------------------------------------
@pytest.mark.parametrize("raw, namespace, billed", [
    ("prod", "prod-ns", "prod"),
    ("prod", "team-x", "tenants.team-x"),                 # named a queue it may not use: its own queue
    ("root.prod", "team-x", "tenants.team-x"),
    ("research.vision", "ml-b", "tenants.ml-b"),          # the child narrowed the list
    ("research.nlp", "ml-b", "research.nlp"),
    ("", "team-y", "tenants.team-y"),                     # names nothing: its placement rule's queue
    ("tenants", "team-z", "tenants.team-z"),              # names the parent: its own queue below it
    ("tenants.team-q", "team-x", "tenants.team-x"),       # another namespace's own queue: not for it
    ("", "prod-ns", "prod"),                              # the namespace map first
    ("prod", "", "prod"),                                 # no namespace: not checked
])
def test_the_accounting_bills_a_namespace_to_its_own_queue_never_to_one_it_may_not_use(
        raw: str, namespace: str, billed: str) -> None:
    assert Resolver(config()).queue(raw, namespace) == billed


def test_the_default_is_used_only_when_the_namespace_may_use_it() -> None:
    data = with_("mapping.default", "research.nlp", with_("queues.tenants", None))
    r = Resolver(config(data))
    assert (r.queue("", "ml-a"), r.queue("prod", "ml-b")) == ("research.nlp", "research.nlp")
    assert (r.queue("", "team-x"), r.queue("prod", "team-x")) == (UNASSIGNED, UNASSIGNED)


def test_placement_makes_namespace_queues_with_the_template_while_the_parents_guarantee_has_room(
        caplog: pytest.LogCaptureFixture) -> None:
    r = Resolver(config())
    assert r.queue("", "team-a") == "tenants.team-a" and r.queue("", "team-b") == "tenants.team-b"
    made = r.config.queues["tenants.team-a"]
    assert (dict(made.guaranteed), dict(made.max), made.namespaces, made.made_for) == (
        {"gpu": 2}, {"gpu": 8}, frozenset({"team-a"}), "team-a")
    assert r.config.queues["tenants"].children == ("tenants.team-a", "tenants.team-b")
    assert r.chain("tenants.team-a") == ("tenants.team-a", "tenants")
    with caplog.at_level(logging.WARNING, "accounting.resolve"):
        assert r.queue("", "team-c") == UNASSIGNED               # 2 + 2 of tenants' 4 taken: not made
        assert r.queue("tenants", "team-c") == UNASSIGNED
    assert "tenants.team-c" not in r.config.queues
    assert [m.getMessage() for m in caplog.records] == [
        "cannot make queue tenants.team-c: the guarantees of tenants's queues (4) and its template's (2) would "
        "exceed its guaranteed gpu 4; its namespace's work is billed to its next queue, else (unassigned)"]


def big_config(extra: dict[str, Any] | None = None) -> Any:
    """MAX_QUEUES - 1 queues: room for one made queue."""
    qs: dict[str, Any] = {f"q{i}": {} for i in range(MAX_QUEUES - 2)}
    qs["tenants"] = {"placement": {"namespace_queues": True, "template": {"max": {"gpu": 8}}}}
    return parse_queue_config({"queues": qs, **(extra or {})})


def test_made_queues_count_against_max_queues() -> None:
    c = big_config()
    assert len(c.queues) - 1 == MAX_QUEUES - 1
    r = Resolver(c)
    assert r.queue("", "team-a") == "tenants.team-a"
    assert r.queue("", "team-b") == UNASSIGNED and len(r.config.queues) - 1 == MAX_QUEUES
    svc = SchedulerService(c, DryRunActuator(), nodes=nodes(("h", "H100", 8, 2)))
    api = Api(create_app(svc, None, load_settings(None, api={"tokens": TOKENS}), clock=Clock()))
    ok = api("POST", "/workloads", token="op-t", json=job("a1", "tenants", "team-a"))
    assert ok.status_code == 201 and ok.json()["queue"] == "tenants.team-a"
    p = is_problem(api("POST", "/workloads", token="op-t", json=job("b1", "tenants", "team-b")), 422, "invalid")
    assert p["detail"] == ("body.queue: cannot make queue tenants.team-b: the configuration has 10,000 queues, the "
                           "most gpuq takes (accounting.queues.MAX_QUEUES)")
    assert "tenants.team-b" not in svc.config.queues


# -- the scheduler and the API ---------------------------------------------------------------------------
def job(wid: str, queue: str, namespace: str, gpus: int = 8, pods: int = 1) -> dict[str, Any]:
    return {"id": wid, "queue": queue, "gpus_per_pod": gpus, "pods": pods,
            "target": {"kind": "RayJob", "namespace": namespace, "name": wid}}


def make(data: dict[str, Any] = FILE, sink: Any = None) -> SchedulerService:
    return SchedulerService(config(data), DryRunActuator(), nodes=nodes(("h", "H100", 8, 4)),
                            settings=Settings(True, 30.0), sink=sink)


def test_the_api_refuses_a_namespace_its_queue_does_not_allow() -> None:
    svc = make()
    api = Api(create_app(svc, None, load_settings(None, api={"tokens": TOKENS}), clock=Clock()))
    for url in ("/workloads", "/dry-run"):
        p = is_problem(api("POST", url, token="op-t", json=job("w1", "prod", "team-x")), 403, "queue-not-allowed")
        assert p["detail"].startswith(NOT_PROD) and "prod-ns" not in p["detail"]   # the rule, not its names
        assert "billed to tenants.team-x" in p["detail"]
    assert svc.workloads() == []
    assert api("POST", "/workloads", token="op-t", json=job("w2", "prod", "prod-ns")).status_code == 201
    no_ns = {"id": "w3", "queue": "prod", "gpus_per_pod": 8}                       # no namespace: not checked
    assert api("POST", "/workloads", token="op-t", json=no_ns).status_code == 201
    p = is_problem(api("POST", "/workloads", token="op-t", json=job("w4", "research.vision", "ml-b")), 403,
                   "queue-not-allowed")
    assert "queues.research.vision.namespaces does not list it" in p["detail"]
    p = is_problem(api("POST", "/workloads", token="op-t", json=job("w5", "tenants.team-y", "team-x")), 422,
                   "invalid")                                   # another namespace's own queue: not made for it
    assert "unknown queue 'tenants.team-y'" in p["detail"] and "tenants.team-y" not in svc.config.queues


def test_a_held_workload_is_never_admitted_and_a_reload_that_allows_it_lets_it_go() -> None:
    svc = make()
    with pytest.raises(QueueNotAllowed):
        svc.submit(wl("rayjob/team-x/j", "prod"), Target("RayJob", "team-x", "j"), 1.0)
    v = svc.submit(wl("rayjob/team-x/j", "prod"), Target("RayJob", "team-x", "j"), 1.0, hold_not_allowed=True)
    assert (v.state, v.queue, v.reason_code, v.position) == ("pending", "prod", "queue_not_allowed", None)
    assert v.message == (f"{NOT_PROD}; not admitted (what it runs anyway is billed to tenants.team-x)")
    d = svc.cycle(2.0)                                           # 32 GPUs free: still not admitted
    assert d.admissions == () and svc.explain("rayjob/team-x/j").reason_code == "queue_not_allowed"
    assert svc.pending_demand() == ()
    allowed = with_("queues.prod.namespaces", ["prod-ns", "team-x"])
    svc.set_config(config(allowed))
    assert svc.explain("rayjob/team-x/j").reason_code == "queued"
    svc.cycle(3.0)
    assert svc.state_of("rayjob/team-x/j") == "running"
    with pytest.raises(ConfigRejected, match=r"namespaces the new configuration does not allow there: prod \(team-x\)"):
        svc.set_config(config())                                 # would strand what runs: refused
    assert "team-x" in svc.config.queues["prod"].namespaces
    # a pending one is held again by a reload that no longer allows it
    svc.submit(wl("rayjob/team-x/k", "prod"), Target("RayJob", "team-x", "k"), 4.0)
    svc.finish("rayjob/team-x/j", 5.0)
    svc.set_config(config())
    assert svc.explain("rayjob/team-x/k").reason_code == "queue_not_allowed"


def test_a_namespace_queue_is_made_on_first_use_with_the_template_and_shown_everywhere(
        store: Any, tmp_path: Path) -> None:
    from gpuq.store.writer import BatchWriter
    from scheduler.service.accounting import LiveAccounting

    f = tmp_path / "queues.yaml"
    f.write_text(yaml.safe_dump(FILE))
    writer = BatchWriter(store, tmp_path / "spill")
    acc = LiveAccounting(store, queues_file=str(f))
    svc = SchedulerService(acc.config, DryRunActuator(), nodes=nodes(("h", "H100", 8, 4)), sink=writer)
    acc.follow(svc)
    clock = Clock(float(int(time.time())) - 3600)           # the store keeps rows of the last 400 days
    api = Api(create_app(svc, acc, load_settings(None, api={"tokens": TOKENS}), clock=clock))
    assert "tenants.team-x" not in svc.config.queues
    r = api("POST", "/workloads", token="op-t", json=job("train", "tenants", "team-x"))
    assert r.status_code == 201 and r.json()["queue"] == "tenants.team-x"           # made now, for team-x
    made = svc.config.queues["tenants.team-x"]
    assert (dict(made.guaranteed), dict(made.max)) == ({"gpu": 2}, {"gpu": 8})
    big = api("POST", "/workloads", token="op-t", json=job("big", "tenants.team-x", "team-x", pods=2))
    assert big.json()["state"] == "rejected" and "queue tenants.team-x max is 8" in big.json()["message"]
    svc.cycle(clock.t)
    assert svc.state_of("train") == "running"
    writer.flush()
    acc.refresh(clock.t)
    rows = {r["queue"]: r for r in api("GET", "/queues", token="view-t").json() if r["gpu_type"] == "*"}
    assert (rows["tenants.team-x"]["allocated"], rows["tenants.team-x"]["guaranteed"],
            rows["tenants.team-x"]["max"]) == (8, 2, 8)
    assert rows["tenants"]["allocated"] == 8
    clock.t += 3600
    usage = api("GET", "/accounting/usage?from=-2h&to=now&by=queue", token="view-t").json()
    assert [(u["queue"], u["gpu_seconds"]) for u in usage] == [("tenants.team-x", 8 * 3600.0)]
    # a reload keeps what the rules still make; the scheduler's restart makes it again
    f.write_text(yaml.safe_dump(with_("queues.research.queues.nlp.max", {"gpu": 4})))
    assert api("POST", "/admin/reload-queues", token="admin-t").json()["result"] == "loaded"
    assert "tenants.team-x" in svc.config.leaves() and svc.config.queues["research.nlp"].max == {"gpu": 4}
    held = svc.submit(wl("rayjob/team-x/p", "prod"), Target("RayJob", "team-x", "p"), clock.t,
                      hold_not_allowed=True)
    writer.flush()
    again = SchedulerService(config(), DryRunActuator(), nodes=nodes(("h", "H100", 8, 4)))
    again.restore(ev.read_events(store, "default"))
    assert again.state_of("train") == "running" and "tenants.team-x" in again.config.leaves()
    assert again.explain(held.id).reason_code == "queue_not_allowed"
    with pytest.raises(InvalidWorkload):
        again.dry_run(wl("d", "tenants.team-y"), clock.t, "team-x")


def test_what_a_namespace_runs_past_gpuq_holds_its_own_queues_quota_in_the_scheduler() -> None:
    """Pods of team-x naming prod, not admitted by gpuq: the scheduler counts them for team-x's own
    queue (made for them), so team-x's next workload meets that queue's max of 8; prod is untouched."""
    from accounting.model import Allocation, milli

    svc = make()
    resolver = Resolver(svc.config)
    pods = [Allocation("k", "team-x", f"p{i}", f"uid-{i}", "prod", "h-0", "H100", milli(3), 0.0, None)
            for i in range(2)]
    svc.set_observed(pods, lambda a: resolver.queue(a.queue, a.namespace), lambda a: a.node, 5.0, None)
    assert [(r.workload.queue, r.placement.nodes) for r in svc.foreign_running()] == [
        ("tenants.team-x", (("h-0", 3),)), ("tenants.team-x", (("h-0", 3),))]
    svc.submit(wl("x1", "tenants", 4), Target("RayJob", "team-x", "x1"), 6.0)
    svc.submit(wl("p1", "prod", 8), Target("RayJob", "prod-ns", "p1"), 6.0)
    svc.cycle(7.0)
    assert svc.explain("x1").reason_code == "quota_max" and "tenants.team-x" in (svc.explain("x1").message or "")
    assert svc.state_of("p1") == "running"
