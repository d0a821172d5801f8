"""What a workload may ask of its queue: the queue policy's bounds (issue 17, finding 2).

A workload's ``priority`` and ``preemptible`` are its own fields, set by whoever submits it (an
API caller, a Kubernetes object's labels). Unbounded, they let a tenant hold GPUs nobody can
reclaim: a workload above its queue's guarantee with ``preemptible: false`` (never a victim) or a
priority above every preemptor's (victims have at most the preemptor's priority). So:

* the queue file bounds both per queue (``policy: {max_priority, non_preemptible}``, inherited
  down the tree, :class:`accounting.queues.Policy`); an operator token may narrow them further;
* :func:`refusal` says whether a workload is over those bounds, and which: the API answers it
  with a 422 naming the field, the live service holds such a workload pending with the reason
  ``policy`` (the Kubernetes source's objects, which no 422 can reach; a Kubernetes Event tells
  the object's owner), the simulator rejects it at arrival;
* and the scheduler admits a non-preemptible workload only within its queue's guarantee
  (:mod:`scheduler.cycle`, reason ``non_preemptible_over_guarantee``), so even an allowed one
  never holds borrowed GPUs.

Pure: no I/O; the message names the bound and where it is set, never more than the workload's
own numbers and queue.
"""
from __future__ import annotations

from dataclasses import dataclass

from accounting.queues import QueueConfig
from scheduler.model import Workload

POLICY = "policy"              # the reason code of a workload held for its queue's policy


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a workload is over its bounds: ``field`` is the workload's (``priority`` or
    ``preemptible``), ``message`` names the bound (``priority 1000000 above research.llm's
    max_priority 100``)."""

    field: str
    message: str


@dataclass(frozen=True, slots=True)
class Narrowing:
    """An operator token's own bounds, applied after its queue's: ``max_priority`` None for none;
    ``non_preemptible`` False: the token may not submit non-preemptible workloads."""

    max_priority: int | None = None
    non_preemptible: bool = True


OPEN = Narrowing()


def refusal(config: QueueConfig, w: Workload, token: Narrowing = OPEN) -> Refusal | None:
    """Whether ``w`` is over its queue's policy (or ``token``'s narrower one); None when it is
    within, or when its queue is unknown (that is refused elsewhere, with the queue named)."""
    queue = config.queues.get(w.queue)
    if queue is None:
        return None
    policy = queue.policy
    if w.priority > policy.max_priority:
        return Refusal("priority", f"priority {w.priority} above {w.queue}'s max_priority {policy.max_priority}")
    if token.max_priority is not None and w.priority > token.max_priority:
        return Refusal("priority", f"priority {w.priority} above this token's max_priority {token.max_priority}")
    if not w.preemptible and not policy.non_preemptible:
        return Refusal("preemptible", f"non-preemptible workloads are not allowed in {w.queue} "
                                      "(its policy.non_preemptible is false)")
    if not w.preemptible and not token.non_preemptible:
        return Refusal("preemptible", "this token may not submit non-preemptible workloads "
                                      "(its non_preemptible is false)")
    return None
