"""Issue 20: a Kueue LocalQueue name (``mapping.local_queues``) means the same queue to gpuq's own
scheduler as to the accounting (:func:`accounting.resolve.local_queue`, the first step of both): a
RayJob of ``ml-a`` labelled ``kueue.x-k8s.io/queue-name: user-queue`` is a ``research.vision``
workload, submitted, dry-run and held through the world's sync alike; the namespace rules apply to
the queue it resolves to, and the sync does not take a held one again at every pass."""
from __future__ import annotations

import copy
from typing import Any

import pytest

from accounting.queues import parse_queue_config
from accounting.resolve import Resolver
from scheduler.actuators.base import DryRunActuator, Target
from scheduler.model import Workload
from scheduler.service import SchedulerService
from scheduler.service.errors import InvalidWorkload
from scheduler.service.sources import sync_listed
from scheduler.testing import nodes, wl

FILE: dict[str, Any] = {
    "mapping": {"local_queues": {"ml-a": {"user-queue": "research.vision", "cheap": "research.nlp"},
                                 "ml-b": {"user-queue": "research.nlp"}}},
    "policy": {"max_priority": 100},
    "queues": {
        "research": {"namespaces": ["ml-a", "ml-b"], "guaranteed": {"gpu": 16}, "max": {"gpu": 16},
                     "queues": {"vision": {"namespaces": ["ml-a"], "guaranteed": {"gpu": 8}, "max": {"gpu": 16}},
                                "nlp": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}}}},
    },
}


def service() -> SchedulerService:
    return SchedulerService(parse_queue_config(copy.deepcopy(FILE)), DryRunActuator(),
                            nodes=nodes(("h", "H100", 8, 2)))


class Source:
    def __init__(self, *pending: tuple[Workload, Target]) -> None:
        self.pending_ = list(pending)

    def pending(self) -> list[tuple[Workload, Target]]:
        return list(self.pending_)

    def admitted(self) -> list[tuple[Workload, Target, str]]:
        return []


def test_a_local_queue_name_is_its_queue_in_its_namespace_for_the_scheduler_and_the_accounting() -> None:
    svc = service()
    view = svc.submit(wl("rayjob/ml-a/train", "user-queue", 8), Target("RayJob", "ml-a", "train"), 1.0)
    assert view.queue == "research.vision"
    view = svc.submit(wl("rayjob/ml-b/train", "user-queue", 8), Target("RayJob", "ml-b", "train"), 1.0)
    assert view.queue == "research.nlp"                    # the same name, another namespace's LocalQueue
    resolver = Resolver(parse_queue_config(copy.deepcopy(FILE)))
    assert [resolver.queue("user-queue", ns) for ns in ("ml-a", "ml-b")] == ["research.vision", "research.nlp"]
    d = svc.cycle(2.0)
    assert {a.workload.id: a.workload.queue for a in d.admissions} == {
        "rayjob/ml-a/train": "research.vision", "rayjob/ml-b/train": "research.nlp"}
    # a namespace without that LocalQueue: the name is no queue of the scheduler's
    with pytest.raises(InvalidWorkload, match="user-queue"):
        svc.submit(wl("rayjob/ml-c/x", "user-queue", 8), Target("RayJob", "ml-c", "x"), 3.0)
    # a dry run resolves it the same way
    out = svc.dry_run(wl("probe", "cheap", 8), 3.0, namespace="ml-a")
    assert out is not None and svc.state_of("probe") is None


def test_the_sync_holds_a_local_queue_workload_once_and_takes_it_again_only_when_relabelled() -> None:
    """Held for its queue's policy (priority over the bound) while naming a LocalQueue: the sync
    compares what the object asks with what the service holds through the same resolution, so it
    neither removes nor resubmits it at every pass; relabelled, it is taken again."""
    svc = service()
    greedy = wl("rayjob/ml-a/greedy", "user-queue", 8, priority=500)
    target = Target("RayJob", "ml-a", "greedy")
    src = Source((greedy, target))
    report = sync_listed(svc, src, 1.0)
    assert report.submitted == (greedy.id,) and report.held == (greedy.id,)
    assert svc.explain(greedy.id).queue == "research.vision"
    for now in (2.0, 3.0):
        again = sync_listed(svc, src, now)
        assert again.submitted == () and again.removed == () and again.held == (greedy.id,)
    fixed = wl("rayjob/ml-a/greedy", "user-queue", 8, priority=50)
    src.pending_ = [(fixed, target)]
    assert sync_listed(svc, src, 4.0).submitted == (greedy.id,)
    assert svc.explain(greedy.id).reason_code != "policy"
