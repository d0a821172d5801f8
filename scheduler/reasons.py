"""Reason messages: one wording for the API, the CLI, the dashboards and the simulator.

Every message carries its numbers ("needs 16 gpu/H100, queue research.vision has 8 left of
max 8"; "no node of type H100 with 8 free GPUs (largest free: 4)"). The codes are
:class:`scheduler.model.ReasonCode`.
"""
from __future__ import annotations

from scheduler.model import Workload
from scheduler.quota import Shortfall


def num(x: float) -> str:
    """A number as people write it: 30 not 30.0, 12.5 as is."""
    return str(int(x)) if float(x).is_integer() else f"{x:.6g}"


def quota_max(s: Shortfall) -> str:
    return f"needs {s.needed} {s.resource}, queue {s.queue} has {s.left} left of max {s.limit}"


def never_max(s: Shortfall) -> str:
    return f"needs {s.needed} {s.resource}, queue {s.queue} max is {s.limit}"


def _gang(w: Workload) -> str:
    return f"{w.pods} pods x {w.gpus_per_pod} GPUs" if w.pods > 1 else f"{w.gpus_per_pod} GPUs"


def no_fit(w: Workload, gpu_type: str, slots: int, largest_free: int) -> str:
    if slots == 0:
        return (f"no node of type {gpu_type} with {w.gpus_per_pod} free GPUs "
                f"(largest free: {largest_free})")
    return (f"only {slots} of {w.pods} pods of {w.gpus_per_pod} GPUs fit on free {gpu_type} nodes "
            f"(largest free: {largest_free})")


def never_nodes(w: Workload, gpu_type: str, slots: int) -> str:
    return f"needs {_gang(w)} of type {gpu_type}; all its nodes together hold {slots} such pods"


def no_type(w: Workload) -> str:
    return f"no node of an acceptable type ({', '.join(w.gpu_types)}) in the cluster"


def not_eligible(s: Shortfall) -> str:
    return above_guarantee(s.queue, s.used + s.needed, s.resource, s.limit)


def above_guarantee(queue: str, would_hold: int, resource: str, guaranteed: int) -> str:
    head, tail = above_guarantee_parts(queue, resource, guaranteed)
    return f"{head}{would_hold}{tail}"


def above_guarantee_parts(queue: str, resource: str, guaranteed: int) -> tuple[str, str]:
    """:func:`above_guarantee` as the text before and after ``would_hold``, for a loop over one queue."""
    return f"no preemption: queue {queue} would hold ", f" {resource}, above its guaranteed {guaranteed}"


def pinned_over(s: Shortfall) -> str:
    return (f"non-preemptible: queue {s.queue}'s non-preemptible work would hold {s.used + s.needed} "
            f"{s.resource}, above its guaranteed {s.limit} (it holds {s.used})")


def pinned_never(s: Shortfall) -> str:
    return (f"non-preemptible: needs {s.needed} {s.resource}, queue {s.queue} guarantees {s.limit} "
            "(non-preemptible work runs only within its queue's guarantee)")


def delay(now_s: float, at_s: float, delay_s: float) -> str:
    return f"may preempt at t={num(at_s)} (in {num(at_s - now_s)} s, delay {num(delay_s)} s)"


def no_victims(considered: int) -> str:
    return f"no allowed victim set makes it fit ({considered} running workloads considered)"


def fenced(n: int) -> str:
    return f"no victim set inside its preemption fence; {n} candidates are across a fence"


def strict_fifo(head: Workload, queue: str) -> str:
    return f"behind {head.id} (priority {head.priority}) in strict FIFO queue {queue}"


def preempted(queue: str, s_used: int, needed: int, guaranteed: int) -> str:
    return (f"reclaim guaranteed for {queue}: holds {s_used} of guaranteed {guaranteed} gpu, "
            f"needs {needed}")
