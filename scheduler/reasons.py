"""Reason messages: one wording for the API, the CLI, the dashboards and the simulator.

Every message carries its numbers ("needs 16 gpu/H100, queue research.vision has 8 left of
max 8"; "no node of type H100 with 8 free GPUs (largest free: 4)"). The codes are
:class:`scheduler.model.ReasonCode`.
"""
from __future__ import annotations

from scheduler.model import Gpus, Workload, gpus_text, is_share
from scheduler.quota import Shortfall


def num(x: float) -> str:
    """A number as people write it: 30 not 30.0, 12.5 as is; a large one (a Unix time, the live
    service's clock) in full to the millisecond, never ``1.79579e+09``."""
    if float(x).is_integer():
        return str(int(x))
    if abs(x) >= 1e5:
        return f"{x:.3f}".rstrip("0").rstrip(".")
    return f"{x:.6g}"


def amount(x: Gpus) -> str:
    """An amount: an int as always, a share as a decimal (``0.5``; a whole sum of shares ``24``,
    never ``24.00``)."""
    return str(x) if type(x) is int else gpus_text(x)



def quota_max(s: Shortfall) -> str:
    return f"needs {amount(s.needed)} {s.resource}, queue {s.queue} has {amount(s.left)} left of max {amount(s.limit)}"


def never_max(s: Shortfall) -> str:
    return f"needs {amount(s.needed)} {s.resource}, queue {s.queue} max is {amount(s.limit)}"


def _gang(w: Workload) -> str:
    k = amount(w.gpus_per_pod)
    return f"{w.pods} pods x {k} GPUs" if w.pods > 1 else f"{k} GPUs"


def no_fit(w: Workload, gpu_type: str, slots: int, largest_free: Gpus) -> str:
    k = w.gpus_per_pod
    if is_share(k):
        if slots == 0:
            return (f"no device of type {gpu_type} with {amount(k)} of a GPU free "
                    f"(largest free share: {amount(largest_free)})")
        return (f"only {slots} of {w.pods} pods of {amount(k)} GPU fit on free {gpu_type} devices "
                f"(largest free share: {amount(largest_free)})")
    if slots == 0:
        return (f"no node of type {gpu_type} with {k} free GPUs "
                f"(largest free: {largest_free})")
    return (f"only {slots} of {w.pods} pods of {k} GPUs fit on free {gpu_type} nodes "
            f"(largest free: {largest_free})")


def never_nodes(w: Workload, gpu_type: str, slots: int) -> str:
    return f"needs {_gang(w)} of type {gpu_type}; all its nodes together hold {slots} such pods"


def no_type(w: Workload) -> str:
    return f"no node of an acceptable type ({', '.join(w.gpu_types)}) in the cluster"


def not_eligible(s: Shortfall) -> str:
    return above_guarantee(s.queue, s.used + s.needed, s.resource, s.limit)


def above_guarantee(queue: str, would_hold: Gpus, resource: str, guaranteed: Gpus) -> str:
    head, tail = above_guarantee_parts(queue, resource, guaranteed)
    return f"{head}{amount(would_hold)}{tail}"


def above_guarantee_parts(queue: str, resource: str, guaranteed: Gpus) -> tuple[str, str]:
    """:func:`above_guarantee` as the text before and after ``would_hold``, for a loop over one queue."""
    return f"no preemption: queue {queue} would hold ", f" {resource}, above its guaranteed {amount(guaranteed)}"


def above_entitlement_parts(queue: str, guaranteed: Gpus, entitled: Gpus) -> tuple[str, str]:
    """``reclaim: fair_share``'s :func:`above_guarantee_parts`: a queue may preempt within its
    guarantee or its entitlement (in GPUs of any type), so the reason names both."""
    return (f"no preemption: queue {queue} would hold ",
            f" gpu, above its guaranteed {amount(guaranteed)} and its entitlement {amount(entitled)}")


def not_entitled(queue: str, would_hold: Gpus, guaranteed: Gpus, entitled: Gpus) -> str:
    head, tail = above_entitlement_parts(queue, guaranteed, entitled)
    return f"{head}{amount(would_hold)}{tail}"


def pinned_over(s: Shortfall) -> str:
    return (f"non-preemptible: queue {s.queue}'s non-preemptible work would hold {amount(s.used + s.needed)} "
            f"{s.resource}, above its guaranteed {s.limit} (it holds {amount(s.used)})")


def pinned_never(s: Shortfall) -> str:
    return (f"non-preemptible: needs {amount(s.needed)} {s.resource}, queue {s.queue} guarantees {s.limit} "
            "(non-preemptible work runs only within its queue's guarantee)")


def delay(now_s: float, at_s: float, delay_s: float) -> str:
    return f"may preempt at t={num(at_s)} (in {num(at_s - now_s)} s, delay {num(delay_s)} s)"


def no_victims(considered: int) -> str:
    return f"no allowed victim set makes it fit ({considered} running workloads considered)"


def no_victims_within(queue: str, priority: int, considered: int) -> str:
    return (f"no lower-priority work of its queue {queue} makes it fit (within_queue: {considered} "
            f"running workloads below priority {priority} considered)")


def protected(n: int, until_s: float, now_s: float) -> str:
    """Candidates a search could have used but for their queue's ``min_runtime_s``."""
    which = "1 more candidate is" if n == 1 else f"{n} more candidates are"
    return f"{which} protected by min_runtime_s, the first until t={num(until_s)} (in {num(until_s - now_s)} s)"


def fenced(n: int) -> str:
    return f"no victim set inside its preemption fence; {n} candidates are across a fence"


def strict_fifo(head: Workload, queue: str) -> str:
    return f"behind {head.id} (priority {head.priority}) in strict FIFO queue {queue}"


def preempted_within(queue: str, priority: int, victims_top: int) -> str:
    return (f"preempt within queue {queue} (within_queue: lower_priority): priority {priority} over "
            f"work of priority {victims_top} and below")


def preempted(queue: str, s_used: Gpus, needed: Gpus, guaranteed: Gpus, resource: str = "gpu") -> str:
    return (f"reclaim guaranteed for {queue}: holds {amount(s_used)} of guaranteed {amount(guaranteed)} {resource}, "
            f"needs {amount(needed)}")


def preempted_entitled(queue: str, s_used: Gpus, needed: Gpus, entitled: Gpus, guaranteed: Gpus) -> str:
    """A preemption under ``reclaim: fair_share`` that restores the preemptor's entitlement (its
    queue goes above its guarantee, within its entitlement); one that restores the guarantee says
    :func:`preempted`."""
    return (f"reclaim entitlement for {queue}: holds {amount(s_used)} of entitlement {amount(entitled)} gpu "
            f"(guaranteed {amount(guaranteed)}), needs {amount(needed)}")
