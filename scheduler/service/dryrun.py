"""``SchedulerService.dry_run``: what the next cycle would do if ``workload`` arrived now.

It runs :func:`scheduler.cycle.schedule` on a snapshot of the live state with the workload added;
the snapshot is a copy (the core never writes to it) and nothing is recorded or actuated. A
workload that could preempt but must first wait its preemption delay also gets ``after_delay``:
the cycle at the end of the delay on the same state, so "what would you preempt" has an answer.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Sequence

from scheduler.cycle import never_fits, schedule
from scheduler.model import Decisions, ReasonCode, Running, Workload, gpus_out
from scheduler.service.views import DryRun, Victim
from scheduler.snapshot import Cluster, Snapshot


def dry_run(workload: Workload, now: float, *, known: Collection[str], cluster: Cluster,
            snapshot: Callable[[Sequence[Workload]], Snapshot], preemption_delay_s: float) -> DryRun:
    """``known``: the ids in use; ``cluster``: the cluster now; ``snapshot(extra)``: the live state
    with ``extra`` pending too (the service takes it under its lock)."""
    w = dataclasses.replace(workload, submit_s=now)
    while w.id in known:                 # a what-if never collides with a live id
        w = dataclasses.replace(w, id=w.id + "~dry-run")
    why = never_fits(cluster, w)
    if why is not None:
        return DryRun(w.id, w.queue, now, "reject", reason_code=ReasonCode.NEVER_FITS.value, message=why)
    snap = snapshot([w])
    running = {r.workload.id: r for r in snap.running}
    out = _outcome(schedule(snap, now), w, now, running)
    if out.reason_code == ReasonCode.WAITING_PREEMPTION_DELAY.value:
        at = now + preemption_delay_s
        out = dataclasses.replace(out, after_delay=_outcome(schedule(snap, at), w, at, running))
    return out


def _outcome(d: Decisions, w: Workload, at: float, running: dict[str, Running]) -> DryRun:
    others = tuple(a.workload.id for a in d.admissions if a.workload.id != w.id)
    for a in d.admissions:
        if a.workload.id == w.id:
            victims = tuple(Victim(v, running[v].workload.queue, gpus_out(running[v].workload.gpus),
                                   running[v].workload.priority) for v in a.victims)
            return DryRun(w.id, w.queue, at, "preempt" if victims else "admit", a.placement.gpu_type,
                          a.placement.as_output(), victims, also_admitted=others)
    p = d.reason(w.id)
    assert p is not None, "schedule() gives every pending workload a reason"
    return DryRun(w.id, w.queue, at, "pending", reason_code=p.code.value, message=p.message,
                  position=p.position, also_admitted=others)
