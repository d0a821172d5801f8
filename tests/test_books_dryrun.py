"""Books that balance with the dry-run actuator and a nodes file (issue 16): ``/queues``,
``/accounting/capacity``, ``/nodes`` and ``/workloads`` agree on capacity, allocated and pending per
queue, type and node, gangs spanning nodes included, after every cycle, finish and submission.
The wiring is serve's own (``LiveAccounting.follow``, the declared nodes in the one inventory)."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.audit import Difference
from accounting.inventory import declared
from gpuq.settings import load_settings
from scheduler.actuators.base import DryRunActuator
from scheduler.api import create_app
from scheduler.service import SchedulerService
from scheduler.service.accounting import LiveAccounting, check_books
from scheduler.snapshot import Settings
from scheduler.testing import nodes
from tests.test_api import Api, Clock

QUEUES = {"prod": {"guaranteed": {"gpu": 24}, "max": {"gpu": 40}},
          "speech": {"guaranteed": {"gpu": 8}, "max": {"gpu": 24}},
          "vision": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}}}
NODES = nodes(("h", "H100", 8, 3), ("a", "A100", 8, 2))
WORK = [("speech-1", "speech", 2, ["A100"]), ("prod-1", "prod", 3, ["H100"]), ("vision-1", "vision", 1, ["A100"]),
        ("vision-2", "vision", 1, []), ("vision-3", "vision", 1, ["H100"]), ("speech-2", "speech", 1, [])]


@pytest.fixture
def books(store: Any, tmp_path: Path) -> tuple[Api, SchedulerService, LiveAccounting, Clock]:
    qf = tmp_path / "queues.yaml"
    qf.write_text(yaml.safe_dump({"queues": QUEUES}))
    acc = LiveAccounting(store, queues_file=str(qf), declared=declared([(n.name, n.gpu_type, n.gpus) for n in NODES],
                                                                         "default"))
    svc = SchedulerService(acc.config, DryRunActuator(), nodes=NODES, settings=Settings(False, 0.0), cluster="default")
    acc.follow(svc)
    clock = Clock(float(int(time.time())))
    return Api(create_app(svc, acc, load_settings(None), clock=clock)), svc, acc, clock


def balance(api: Api) -> dict[str, Any]:
    """Every number of the three views against the scheduler's record; returns what it read."""
    wl = api("GET", "/workloads").json()
    queues = {(r["queue"], r["gpu_type"]): r for r in api("GET", "/queues").json()}
    cap = api("GET", "/accounting/capacity").json()
    placed: dict[tuple[str, str], float] = {}
    per_node: dict[str, float] = {}
    waiting: dict[str, float] = {}
    for w in wl:
        if w["state"] == "running":
            for node, n in w["placement"].items():
                for key in ((w["queue"], "*"), (w["queue"], w["gpu_type"])):
                    placed[key] = placed.get(key, 0.0) + n
                per_node[node] = per_node.get(node, 0.0) + n
        elif w["state"] == "pending":
            waiting[w["queue"]] = waiting.get(w["queue"], 0.0) + w["gpus"]
    for q in QUEUES:
        for t in ("*", "H100", "A100"):
            assert queues[(q, t)]["allocated"] == placed.get((q, t), 0.0), (q, t)
        assert queues[(q, "*")]["pending"] == waiting.get(q, 0.0), q
    assert queues[("root", "*")]["allocated"] == sum(v for (q, t), v in placed.items() if t == "*")
    # capacity is the inventory: the nodes the scheduler places on
    assert {n["node"]: n["capacity"] for n in cap["nodes"]} == {n.name: n.gpus for n in NODES}
    assert {n["name"]: n["gpus"] for n in api("GET", "/nodes").json()} == {n.name: n.gpus for n in NODES}
    assert cap["total"]["capacity"] == 40 and {t["gpu_type"]: t["capacity"] for t in cap["types"]} == {
        "A100": 16, "H100": 24}
    assert {n["node"]: n["allocated"] for n in cap["nodes"]} == {n.name: per_node.get(n.name, 0.0) for n in NODES}
    assert {n["name"]: n["used"] for n in api("GET", "/nodes").json()} == {
        n.name: per_node.get(n.name, 0.0) for n in NODES}
    total = sum(per_node.values())
    assert (cap["total"]["allocated"], cap["total"]["free"]) == (total, 40 - total)
    for t in cap["types"]:                                   # per-type rows sum to the totals
        assert t["allocated"] == sum(v for (q, ty), v in placed.items() if ty == t["gpu_type"])
    assert sum(t["free"] for t in cap["types"]) == cap["total"]["free"]
    return {"workloads": wl, "queues": queues, "capacity": cap}


def test_queues_capacity_and_workloads_agree_with_gangs(books: tuple[Api, SchedulerService, LiveAccounting, Clock]
                                                        ) -> None:
    api, svc, acc, clock = books
    acc.refresh(clock.t)
    for wid, queue, pods, types in WORK:
        r = api("POST", "/workloads", json={"id": wid, "queue": queue, "pods": pods, "gpus_per_pod": 8,
                                           "gpu_types": types, "duration": 600})
        assert r.status_code == 201, r.text
    seen = balance(api)                                      # nothing placed yet: all pending, live
    assert seen["queues"][("vision", "*")]["pending"] == 24
    clock.t += 1
    svc.cycle(clock.t)
    seen = balance(api)
    running = {w["id"]: w for w in seen["workloads"] if w["state"] == "running"}
    assert len(running["speech-1"]["placement"]) == 2            # gangs across two and three nodes
    assert len(running["prod-1"]["placement"]) == 3
    assert seen["queues"][("speech", "*")]["allocated"] >= 16
    assert seen["capacity"]["total"]["allocated"] == 40
    r = acc.refresh(clock.t)                                 # the next accounting interval: the same books
    balance(api)
    assert check_books(acc, svc, r, clock.t) == ()           # and the audit finds them balanced
    books = api("GET", "/books").json()
    assert books["balanced"] and books["differences"] == [] and books["unbalanced_gpus"] == 0
    assert "gpuq_books_unbalanced_gpus 0.0" in api("GET", "/metrics").text
    svc.finish("prod-1", clock.t + 10)
    clock.t += 11
    svc.cycle(clock.t)
    balance(api)
    r = acc.refresh(clock.t)
    balance(api)
    assert check_books(acc, svc, r, clock.t) == ()


def test_the_books_balance_with_gangs_of_shares_across_nodes(
        books: tuple[Api, SchedulerService, LiveAccounting, Clock]) -> None:
    """Shares of one GPU (issue 19): a gang of 12 pods x 0.75 spans both A100 nodes, a gang of
    6 x 0.25 fills the devices it left a quarter of; /queues, /accounting/capacity, /nodes and
    /workloads agree to the thousandth and the audit finds the books balanced, before and after one
    of them finishes."""
    api, svc, acc, clock = books
    acc.refresh(clock.t)
    for wid, queue, pods, per_pod in (("speech-s", "speech", 12, 0.75), ("vision-s", "vision", 6, 0.25)):
        r = api("POST", "/workloads", json={"id": wid, "queue": queue, "pods": pods, "gpus_per_pod": per_pod,
                                           "gpu_types": ["A100"], "duration": 600})
        assert r.status_code == 201, r.text
    clock.t += 1
    svc.cycle(clock.t)
    seen = balance(api)
    running = {w["id"]: w for w in seen["workloads"] if w["state"] == "running"}
    assert set(running) == {"speech-s", "vision-s"}
    assert len(running["speech-s"]["placement"]) == 2 and sum(running["speech-s"]["placement"].values()) == 9
    assert seen["capacity"]["total"]["allocated"] == 10.5          # 12 devices in use, 1.5 GPUs of them free
    r = acc.refresh(clock.t)
    balance(api)
    assert check_books(acc, svc, r, clock.t) == ()
    svc.finish("vision-s", clock.t + 10)
    clock.t += 11
    svc.cycle(clock.t)
    r = acc.refresh(clock.t)
    balance(api)
    assert check_books(acc, svc, r, clock.t) == ()


def test_the_audit_names_a_workload_seen_on_another_node(books: tuple[Api, SchedulerService, LiveAccounting, Clock],
                                                         store: Any) -> None:
    """A gpuq workload whose pod the collector sees on another node than the scheduler chose: the
    accounting counts the pod there (and the admission where it was not seen): the books differ on
    the node it ran on, by its GPUs, and ``/books`` and the gauge say so."""
    import datetime as dt

    from gpuq.store.schema import COLUMNS
    api, svc, acc, clock = books
    api("POST", "/workloads", json={"id": "w", "queue": "prod", "gpus_per_pod": 8, "gpu_types": ["H100"],
                                    "target": {"kind": "RayJob", "namespace": "ns", "name": "w"}})
    svc.cycle(clock.t)
    (chosen,) = svc.explain("w").placement
    other = next(n.name for n in NODES if n.gpu_type == "H100" and n.name != chosen)
    start = dt.datetime.fromtimestamp(clock.t, dt.UTC)
    store.insert("gpu_allocations", [("default", "ns", "w-head", "u1", "prod", other, "H100", "nvidia.com/gpu", 8.0, 0,
                                      "", start, None, 1, "pod", "w", "RayJob", "w")], COLUMNS["gpu_allocations"])
    clock.t += 1
    r = acc.refresh(clock.t)
    diffs = check_books(acc, svc, r, clock.t)
    assert [(d.queue, d.node, d.accounted, d.placed) for d in diffs] == [("prod", other, 8.0, 0.0)]
    books = api("GET", "/books").json()
    assert not books["balanced"] and books["unbalanced_gpus"] == 8
    assert f'gpuq_books_difference_gpus{{gpu_type="H100",node="{other}",queue="prod"}} 8.0' in api("GET", "/metrics").text


def test_observed_pending_pods_that_are_not_gpuqs_still_count(books: tuple[Api, SchedulerService, LiveAccounting,
                                                                          Clock], store: Any) -> None:
    import datetime as dt

    from gpuq.store.schema import COLUMNS
    api, svc, acc, clock = books
    cols = COLUMNS["pod_events"]

    def pod(name: str, ns: str, queue: str, gpus: int) -> tuple[Any, ...]:
        row = {"ts": dt.datetime.fromtimestamp(clock.t - 5, dt.UTC), "cluster": "default", "namespace": ns,
               "pod": name, "uid": name, "event": "ADDED", "phase": "Pending", "node": "", "gpus": float(gpus),
               "gpu_resource": "nvidia.com/gpu", "gpu_model": "", "queue": queue, "priority": 0,
               "ray_cluster": "", "ray_node_type": "", "resource_version": "1"}
        return tuple(row[c] for c in cols)

    api("POST", "/workloads", json={"id": "vision-1", "queue": "vision", "gpus_per_pod": 8,
                                    "target": {"kind": "RayJob", "namespace": "team-v", "name": "vision-1"}})
    store.insert("pod_events", [pod("other-0", "team-v", "vision", 4),                # foreign: counts
                                pod("vision-1-abcde", "team-v", "vision", 8)], cols)  # gpuq's own: once
    acc.refresh(clock.t)
    q = {(r["queue"], r["gpu_type"]): r for r in api("GET", "/queues").json()}
    assert q[("vision", "*")]["pending"] == 8 + 4


def test_gpuq_check_prints_the_audit_and_exits_3_when_unbalanced(books: tuple[Api, SchedulerService, LiveAccounting,
                                                                             Clock],
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """``gpuq check`` prints what ``/books`` answers (here the real app's answer, relayed by a
    loopback server): 0 when the books balance, 3 with the cells when they do not."""
    import json
    from http.server import BaseHTTPRequestHandler

    from scheduler.cli import check_main
    from tests.conftest import serving
    api, svc, acc, clock = books
    answer: dict[str, Any] = {}

    class Books(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    svc.cycle(clock.t)
    check_books(acc, svc, acc.refresh(clock.t), clock.t)
    settings = load_settings(None)
    with serving(Books) as url:
        answer.update(api("GET", "/books").json())
        assert check_main(["--api", url], settings) == 0
        assert "the books balance" in capsys.readouterr().out
        svc.books = (*svc.books, Difference("prod", "H100", "h-0", 8.0, 0.0))   # as an audit would find it
        answer.clear()
        answer.update(api("GET", "/books").json())
        assert check_main(["--api", url], settings) == 3
        out = capsys.readouterr().out
        assert "do NOT balance" in out and "prod H100 on h-0: accounting 8, scheduler 0" in out
