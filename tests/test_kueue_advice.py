"""Issue 20: gpuq's own scheduler as an advisor beside Kueue (``queues_from: kueue``;
scheduler/service/advisor.py). Kueue's objects (shaped as tests/data/kueue/live_*.yaml: one A100
flavor, two ClusterQueues in a cohort) make the queue tree through the importer, as
:class:`~scheduler.service.kueue.KueueQueues` does live; Kueue's Workloads become views with
Kueue's reason through :class:`~scheduler.service.kueue.KueueWorkloads`; the pods of the Workloads
Kueue admitted are the ledger's observed allocations the service is given each accounting
interval. Then ``/workloads``, ``GET /workloads/{id}`` and ``gpuq explain``'s text show, per
pending Workload, what gpuq would do, decided in one run of the core: admit where, preempt whom, why
it would wait too, never, or why it cannot advise."""
from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from accounting.model import Allocation, milli
from accounting.queue_import.kueue import from_kueue
from accounting.queues import parse_queue_config
from gpuq.settings import load_settings
from scheduler.actuators.base import DryRunActuator
from scheduler.api import create_app
from scheduler.cli import explain_text
from scheduler.model import Node
from scheduler.service import SchedulerService
from scheduler.service.kueue import KueueWorkloads
from tests.test_api_security import Api

DATA = Path(__file__).parent / "data" / "kueue"
FLAVOR, CQ, LQ = yaml.safe_load_all((DATA / "live_cluster.yaml").read_text())
WL = yaml.safe_load((DATA / "live_workload.yaml").read_text())
A100 = "NVIDIA-A100-SXM4-80GB"
NOW = 1_795_000_000.0                   # a fixed instant (2026-11-18T11:06:40Z)
QUEUED = "2026-11-18T10:00:00Z"          # NOW - 1 h 6 min 40 s: past any preemption delay
TOKENS = [{"token": "view-t", "role": "viewer", "name": "vera"}]


def cluster_queue(name: str, gpus: int) -> dict[str, Any]:
    cq = copy.deepcopy(CQ)
    cq["metadata"].update(name=name, uid=f"cq-{name}")
    cq["spec"]["cohort"] = "research"
    # Kueue's default (Never) is a preemption fence in gpuq: this cohort lets its members take back
    cq["spec"]["preemption"] = {"reclaimWithinCohort": "Any"}
    cq["spec"]["resourceGroups"][0]["flavors"][0]["resources"][2]["nominalQuota"] = gpus
    return cq


def local_queue(ns: str, cq: str) -> dict[str, Any]:
    lq = copy.deepcopy(LQ)
    lq["metadata"].update(namespace=ns, name=cq, uid=f"lq-{ns}")
    lq["spec"]["clusterQueue"] = cq
    return lq


def workload(ns: str, name: str, sets: Sequence[tuple[int, int]], priority: int = 0, admitted: bool = False,
             cq: str = "", queued: str = QUEUED) -> dict[str, Any]:
    """A Workload of ``sets`` (pods, GPUs per pod), owned by a RayJob ``name``; pending with Kueue's
    reason (live_workload.yaml's), or admitted to ``cq``."""
    wl = copy.deepcopy(WL["pending"])
    wl["metadata"].update(namespace=ns, name=name, uid=f"wl-{name}", creationTimestamp=queued)
    wl["metadata"]["ownerReferences"][0].update(name=name, uid=f"rj-{name}")
    wl["spec"].update(queueName=cq or ("llm" if ns == "team-llm" else "speech"), priority=priority)
    worker = wl["spec"]["podSets"][1]
    wl["spec"]["podSets"] = [wl["spec"]["podSets"][0]]
    for i, (pods, gpus) in enumerate(sets):
        ps = copy.deepcopy(worker)
        ps.update(name=f"workers-{i}", count=pods)
        ps["template"]["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": str(gpus)}}
        wl["spec"]["podSets"].append(ps)
    if admitted:
        wl["status"] = copy.deepcopy(WL["admitted"]["status"])
        wl["status"]["admission"]["clusterQueue"] = cq
        wl["status"]["admission"]["podSetAssignments"][1]["resourceUsage"]["nvidia.com/gpu"] = str(
            sum(p * g for p, g in sets))
    return wl


def pod(ns: str, wid: str, name: str, node: str, gpus: int, queue: str, start: float) -> Allocation:
    """A pod of an admitted Workload as the ledger has it: joined to the Workload by its owners."""
    return Allocation(cluster="prod", namespace=ns, pod=name, uid=f"uid-{name}", queue=queue, node=node,
                      gpu_model=A100, milli_gpus=milli(gpus), start_s=start, end_s=None, owner=wid.rsplit("/", 1)[1],
                      owner_kind="RayJob", workload_id=wid)


class World:
    """The pieces gpuq serve wires with ``queues_from: kueue`` (scheduler.service.runtime), with
    the store's reads replaced by the objects given here."""

    def __init__(self, objects: list[dict[str, Any]]) -> None:
        self.objects = objects
        imported = from_kueue([o for o in objects if o["kind"] != "Workload"], source="kueue")
        self.config = parse_queue_config(imported.data, source="queues", strict_top=True)
        self.paths = {q.rsplit(".", 1)[-1]: q for q in self.config.leaves()}
        self.service = SchedulerService(self.config, DryRunActuator(),
                                        nodes=[Node("a100-0", "a100", 8), Node("a100-1", "a100", 4),
                                               Node("h100-0", "h100", 8)])   # (no flavor of theirs)
        self.kueue = KueueWorkloads(lambda kinds: [o for o in self.objects if o["kind"] in kinds],
                                    lambda ns, lq, cq: self.paths.get(cq, "(unassigned)"))
        self.service.external = self.kueue
        self.api = Api(create_app(self.service, None, load_settings(None, api={"tokens": TOKENS}), clock=time.time))

    def account(self, observed: Sequence[Allocation]) -> None:
        """One accounting interval: the Workloads read, the pods observed, the advice given."""
        self.kueue.refresh()
        self.service.set_observed(observed, lambda a: a.queue, lambda a: a.node, NOW, None)
        self.kueue.advise(self.service, NOW)

    def advice(self, wid: str) -> dict[str, Any]:
        got: dict[str, Any] = self.api("GET", f"/workloads/{wid}", "view-t").json()
        return got


def test_gpuq_advises_on_each_pending_kueue_workload_beside_kueues_reason() -> None:
    # llm: nominal 8; speech: nominal 4; one cohort (each may borrow up to the cohort's 12)
    speech_a = workload("team-speech", "asr-a", [(1, 4)], admitted=True, cq="speech")
    speech_b = workload("team-speech", "asr-b", [(1, 4)], admitted=True, cq="speech")
    pending = [
        workload("team-llm", "small", [(2, 2)], priority=5),            # fits on a100-1's 4 free
        workload("team-llm", "big", [(1, 4)], priority=3),              # within llm's guarantee: preempts
        workload("team-llm", "late", [(1, 4)], priority=1),             # over llm's guarantee: waits
        workload("team-llm", "huge", [(2, 8)]),                         # more than llm's max of 12
        workload("team-llm", "mixed", [(1, 2), (1, 4)]),                # not one uniform gang
    ]
    world = World([FLAVOR, cluster_queue("llm", 8), cluster_queue("speech", 4), local_queue("team-llm", "llm"),
                   local_queue("team-speech", "speech"), speech_a, speech_b, *pending])
    speech = world.paths["speech"]
    # speech borrows: its two Workloads' pods hold all of a100-0; asr-b started last (the youngest)
    world.account([pod("team-speech", "kueue/team-speech/asr-a", "asr-a-0", "a100-0", 4, speech, NOW - 3600),
                   pod("team-speech", "kueue/team-speech/asr-b", "asr-b-0", "a100-0", 4, speech, NOW - 600)])

    small = world.advice("kueue/team-llm/small")
    assert (small["state"], small["reason_code"]) == ("pending", "kueue_Pending")     # Kueue's own reason, kept
    assert "insufficient unused quota" in small["message"]
    assert small["advice"]["outcome"] == "admit"
    assert (small["advice"]["gpu_type"], small["advice"]["placement"]) == ("a100", {"a100-1": 4})

    big = world.advice("kueue/team-llm/big")["advice"]
    assert big["outcome"] == "preempt" and big["placement"] == {"a100-0": 4}
    # the youngest of speech's Workloads, named by its Kueue id, with Kueue's priority and queue
    assert big["victims"] == [{"id": "kueue/team-speech/asr-b", "queue": speech, "gpus": 4, "priority": 0}]
    assert big["summary"] == ("gpuq would preempt kueue/team-speech/asr-b and admit it on a100-0:4 (a100)")

    late = world.advice("kueue/team-llm/late")["advice"]        # decided with the two above: no GPUs left
    assert late["outcome"] == "wait" and late["reason_code"] and late["position"] == 1
    assert late["summary"].startswith(f"gpuq would wait too: {late['reason_code']}: ")

    huge = world.advice("kueue/team-llm/huge")["advice"]
    assert (huge["outcome"], huge["reason_code"]) == ("reject", "never_fits")
    mixed = world.advice("kueue/team-llm/mixed")["advice"]
    assert mixed["outcome"] == "none" and "different GPUs per pod (1 x 2, 1 x 4)" in mixed["message"]

    # the list carries the same advice; running Workloads and gpuq's own have none
    listed = {w["id"]: w for w in world.api("GET", "/workloads", "view-t").json()}
    assert listed["kueue/team-llm/big"]["advice"] == big
    assert listed["kueue/team-speech/asr-a"]["state"] == "running" and listed["kueue/team-speech/asr-a"]["advice"] is None

    # gpuq explain: Kueue's reason, then gpuq's line
    text = explain_text(world.advice("kueue/team-llm/big"), now=NOW)
    assert "reason: kueue_Pending" in text
    assert "gpuq would: preempt kueue/team-speech/asr-b, then admit on a100-0:4 (a100)" in text
    assert "gpuq would: admit on a100-1:4 (a100)" in explain_text(world.advice("kueue/team-llm/small"), now=NOW)

    # advice never acts: nothing admitted, nothing preempted, no event
    assert world.service.workloads() and not world.service.preemptions()
    assert all(w["state"] == "running" for w in listed.values() if w["id"].startswith("kueue/team-speech/"))


def test_the_advice_follows_the_world_and_goes_with_the_workload() -> None:
    speech_a = workload("team-speech", "asr-a", [(1, 8)], admitted=True, cq="speech")
    small = workload("team-llm", "small", [(2, 2)])
    world = World([FLAVOR, cluster_queue("llm", 8), cluster_queue("speech", 4), local_queue("team-llm", "llm"),
                   local_queue("team-speech", "speech"), speech_a, small])
    speech = world.paths["speech"]
    held = [pod("team-speech", "kueue/team-speech/asr-a", "asr-a-0", "a100-0", 8, speech, NOW - 600)]
    world.account(held)
    assert world.advice("kueue/team-llm/small")["advice"]["placement"] == {"a100-1": 4}
    # a foreign pod of no Workload takes a100-1: gpuq would now preempt? no: asr-a is one Workload of
    # 8 GPUs and speech's guarantee is 4: taking it would leave speech below its guarantee: wait
    other = Allocation(cluster="prod", namespace="team-x", pod="x-0", uid="uid-x", queue="(unassigned)",
                       node="a100-1", gpu_model=A100, milli_gpus=milli(4), start_s=NOW - 60, end_s=None)
    world.account([*held, other])
    after = world.advice("kueue/team-llm/small")["advice"]
    assert after["outcome"] == "wait" and after["placement"] is None
    # Kueue admits it: no advice any more
    world.objects[-1] = workload("team-llm", "small", [(2, 2)], admitted=True, cq="llm")
    world.account([*held, other])
    assert world.advice("kueue/team-llm/small")["advice"] is None


def test_a_workload_within_its_preemption_delay_is_told_what_it_would_preempt_after_it() -> None:
    speech = [workload("team-speech", f"asr-{x}", [(1, 4)], admitted=True, cq="speech") for x in "ab"]
    # queued 10 s before NOW: gpuq waits 30 s (scheduler.preemption_delay_s) before preempting
    fresh = workload("team-llm", "fresh", [(1, 4)], queued="2026-11-18T11:06:30Z")
    world = World([FLAVOR, cluster_queue("llm", 8), cluster_queue("speech", 4), local_queue("team-llm", "llm"),
                   local_queue("team-speech", "speech"), *speech, fresh])
    path = world.paths["speech"]
    busy = Allocation(cluster="prod", namespace="team-x", pod="x-0", uid="uid-x", queue="(unassigned)",
                      node="a100-1", gpu_model=A100, milli_gpus=milli(4), start_s=NOW - 60, end_s=None)
    world.account([pod("team-speech", f"kueue/team-speech/asr-{x}", f"asr-{x}-0", "a100-0", 4, path, NOW - 600 + i)
                   for i, x in enumerate("ab")] + [busy])
    a = world.advice("kueue/team-llm/fresh")["advice"]
    assert (a["outcome"], a["after_delay"], a["at_s"]) == ("preempt", True, NOW + 30)
    assert [v["id"] for v in a["victims"]] == ["kueue/team-speech/asr-b"]
    assert a["summary"].startswith("gpuq would wait its preemption delay, then preempt kueue/team-speech/asr-b")
    assert explain_text(world.advice("kueue/team-llm/fresh"), now=NOW).splitlines()[-1] == (
        "gpuq would: after its preemption delay, preempt kueue/team-speech/asr-b, then admit on a100-0:4 (a100)")


def finished(ns: str, name: str, cq: str, pods: int, gpus: int, ran_s: float, end: float) -> dict[str, Any]:
    """A Workload Kueue admitted to ``cq`` that finished at ``end`` after ``ran_s`` seconds."""
    wl = workload(ns, name, [(pods, gpus)], admitted=True, cq=cq)
    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))      # noqa: E731
    for c in wl["status"]["conditions"]:
        c["lastTransitionTime"] = iso(end - ran_s)
    wl["status"]["conditions"].append({"type": "Finished", "status": "True", "reason": "Succeeded", "message": "done",
                                       "lastTransitionTime": iso(end)})
    return wl


def test_kueues_pending_workloads_get_gpuqs_start_time_forecast() -> None:
    # as the first test's world, with a history: llm's and speech's finished Workloads ran 30 min each
    speech_a = workload("team-speech", "asr-a", [(1, 4)], admitted=True, cq="speech")
    pending = [workload("team-llm", "small", [(1, 4)], priority=5),       # fits now
               workload("team-llm", "late", [(1, 8)], priority=1),        # needs all of a100-0
               workload("team-llm", "mixed", [(1, 2), (1, 4)])]           # no gang: no forecast
    done = [finished("team-llm" if i % 2 else "team-speech", f"old-{i}", "llm" if i % 2 else "speech", 1, 4, 1800.0,
                     NOW - 600 * i) for i in range(1, 9)]
    world = World([FLAVOR, cluster_queue("llm", 8), cluster_queue("speech", 4), local_queue("team-llm", "llm"),
                   local_queue("team-speech", "speech"), speech_a, *pending, *done])
    speech = world.paths["speech"]
    world.account([pod("team-speech", "kueue/team-speech/asr-a", "asr-a-0", "a100-0", 4, speech, NOW - 600)])

    old = world.advice("kueue/team-llm/old-1")
    assert old["state"] == "finished" and old["end_s"] - old["start_s"] == 1800.0
    small = world.advice("kueue/team-llm/small")
    assert small["advice"]["outcome"] == "admit"
    assert small["eta"]["p50"] == small["eta"]["at"] == time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(NOW))
    assert small["advice"]["placement"] == {"a100-0": 4}          # beside asr-a
    # late needs all of a100-0: gpuq's forecast goes forward from the advisor's own run (small
    # started there now), with the durations Kueue's finished Workloads taught (30 min each, all
    # alike: no spread), not the 1 h prior: it starts when small ends, asr-a having ended before
    late = world.advice("kueue/team-llm/late")
    assert late["advice"]["outcome"] == "wait" and late["eta"] is not None
    p10, p50, p90 = (_seconds(late["eta"][k]) for k in ("p10", "p50", "p90"))
    assert NOW < p10 <= p50 <= p90
    assert 1800 <= p50 - NOW <= 1801                  # on the scheduler's grid (1 s)
    assert world.advice("kueue/team-llm/mixed")["eta"] is None
    assert world.advice("kueue/team-speech/asr-a")["eta"] is None
    text = explain_text(late, now=NOW)
    assert "gpuq's forecast (gpuq's policy, Kueue's quotas): expected to start in about" in text
    # the list carries the same forecast
    listed = {w["id"]: w for w in world.api("GET", "/workloads", "view-t").json()}
    assert listed["kueue/team-llm/late"]["eta"] == late["eta"]


def _seconds(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
