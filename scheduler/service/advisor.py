"""gpuq's own scheduler as an advisor next to another one (``queues_from: kueue``; docs/KUEUE.md).

With ``queues_from: kueue`` Kueue admits and gpuq acts on nothing (the dry-run actuator). For each
Workload Kueue holds pending, gpuq shows what its own scheduler would do with it, beside Kueue's
reason: admit it where, preempt whom first, or why it would wait too. :func:`decide` answers from
**one** run of the core (:func:`scheduler.cycle.schedule`) on the snapshot the live cycle would
decide on next (:meth:`SchedulerService.advice_input`: the same nodes, queue tree, running and
foreign work), with every pending Kueue Workload added as a pending workload of its queue. So the
answers agree with each other (two Workloads are not both advised onto the same free GPUs) and with
gpuq's own pending work, which the same run decides on. Nothing is recorded or acted on: the run
works on a copy of the cluster with a memo of its own, so the live cycle's memo is never touched.

What the run sees of Kueue's work:

* a pending Workload is one gang (:func:`scheduler.service.kueue.gang`: its pod sets that ask
  GPUs), its priority Kueue's, queued since its creation or last eviction (Kueue's own order),
  of the GPU types its queue's quotas name (its ClusterQueue's flavors, in their order: Kueue
  places it on no other type), any type when they name none;
  one gpuq cannot read as a gang, whose queue is not a leaf of gpuq's tree or that could never
  run here gets ``none`` or ``reject`` without the run;
* an admitted Workload whose pods run is the foreign work its pods are (they occupy their nodes
  and count for their queue, :mod:`scheduler.service.ledger`), but **preemptible**, named by its
  Workload id and with Kueue's priority: in the live cycle no actuator can stop foreign work, but
  the question here is what gpuq would do were it the scheduler, and Kueue can preempt its own
  Workloads. Decision: one foreign group carrying rows of several Workloads, or a Workload
  whose pods form several groups, stays as it is (not a victim; the advice never names a victim
  that is not one whole Workload). An admitted Workload whose pods are not seen yet holds Kueue's
  quota but nothing in gpuq's snapshot (as in the live cycle): for those seconds gpuq's advice may
  see more room than Kueue does.

A Workload that could preempt but must first wait its preemption delay (``scheduler.
preemption_delay_s``, counted from when it was queued) is decided again at the end of the delay
from now on the same snapshot (as a dry run does): its advice says what it would preempt then.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accounting.queues import ROOT
from scheduler.cycle import never_fits, schedule
from scheduler.memo import CycleMemo
from scheduler.model import Decisions, ReasonCode, Running, Workload, gpus_out
from scheduler.service.views import Advice, Victim
from scheduler.snapshot import Snapshot, snapshot

ADMIT, PREEMPT, WAIT, REJECT, NONE = "admit", "preempt", "wait", "reject", "none"


@dataclass(frozen=True, slots=True)
class Advised:
    """One advisor run: the advice per pending workload id and, when the core ran, the snapshot
    it decided on (the live cycle's with the other scheduler's pending workloads added and its
    admitted ones adopted) and its decisions at ``now``: what the start-time forecast of those
    workloads goes forward from (:meth:`scheduler.service.forecasts.Forecasts.external`)."""

    advice: dict[str, Advice]
    snapshot: Snapshot | None = None
    first: Decisions | None = None
    targets: tuple[str, ...] = ()           # the pending workloads the run decided on


def advise(service: Any, asks: Mapping[str, Workload | str], running: Mapping[str, int], now: float) -> Advised:
    """:func:`run` on ``service``'s snapshot now."""
    snap, ids = service.advice_input()
    return run(snap, ids, asks, running, now, service.settings.preemption_delay_s)


def decide(snap: Snapshot, ids: Mapping[str, Sequence[str]], asks: Mapping[str, Workload | str],
           running: Mapping[str, int], now: float, delay_s: float) -> dict[str, Advice]:
    """The advice per pending workload id (:func:`run`'s)."""
    return run(snap, ids, asks, running, now, delay_s).advice


def run(snap: Snapshot, ids: Mapping[str, Sequence[str]], asks: Mapping[str, Workload | str],
        running: Mapping[str, int], now: float, delay_s: float) -> Advised:
    """The advice per pending workload id, and the run it came from. ``snap``: the live cycle's
    snapshot; ``ids``: the workload ids of each foreign running workload's rows; ``asks``: the
    other scheduler's pending workloads by id (a :class:`Workload`, or why it cannot be one);
    ``running``: its admitted workloads' priorities by id (the victims it may choose among)."""
    cluster = dataclasses.replace(snap.cluster, memo=CycleMemo())   # never the live cycle's memo
    out: dict[str, Advice] = {}
    workloads: list[Workload] = []
    for wid, ask in asks.items():
        if isinstance(ask, str):
            out[wid] = Advice(NONE, now, f"gpuq cannot advise: {ask}", message=ask)
            continue
        q = cluster.config.queues.get(ask.queue)
        if q is None or not q.is_leaf or ask.queue == ROOT:
            why = f"its queue {ask.queue or '(none)'} is not a leaf queue of gpuq's tree"
            out[wid] = Advice(NONE, now, f"gpuq cannot advise: {why}", message=why)
            continue
        if not ask.gpu_types:
            ask = dataclasses.replace(ask, gpu_types=_flavor_types(q))
        never = never_fits(cluster, ask) if cluster.nodes else None
        if never is not None:
            out[wid] = Advice(REJECT, now, f"gpuq would never run it: {never}",
                              reason_code=ReasonCode.NEVER_FITS.value, message=never)
            continue
        workloads.append(ask)
    if not workloads:
        return Advised(out)
    world = _adopt(snap.running, ids, running)
    base = snapshot(cluster, world, [*snap.pending, *workloads], snap.settings)
    by_id = {r.workload.id: r for r in world}
    d = schedule(base, now)
    later: Decisions | None = None
    for w in workloads:
        a = _outcome(d, w, now, by_id)
        if a.reason_code == ReasonCode.WAITING_PREEMPTION_DELAY.value:
            if later is None:
                later = schedule(base, now + delay_s)
            after = _outcome(later, w, now + delay_s, by_id)
            if after.outcome == PREEMPT:
                a = dataclasses.replace(after, after_delay=True, summary=(
                    f"gpuq would wait its preemption delay, then {after.summary.removeprefix('gpuq would ')}"))
        out[w.id] = a
    return Advised(out, base, d, tuple(w.id for w in workloads))


def _flavor_types(q: Any) -> tuple[str, ...]:
    """The GPU types a queue's quotas name (``gpu/<type>``: an imported ClusterQueue's flavors, in
    its order, which is Kueue's order of preference); () when none is named (any type). A Workload
    of a ClusterQueue runs only on its flavors: advising it onto another type would be advice
    Kueue could never follow."""
    keys = [*q.guaranteed, *q.max]
    return tuple(dict.fromkeys(k[4:] for k in keys if k.startswith("gpu/")))


def _adopt(world: Sequence[Running], ids: Mapping[str, Sequence[str]], running: Mapping[str, int]) -> list[Running]:
    """The running work with each foreign group that is exactly one admitted Workload's pods made
    that Workload: its id, its priority, preemptible (the module's second point)."""
    owner = {rid: names[0] for rid, names in ids.items() if len(names) == 1 and names[0] in running}
    groups = Counter(owner.values())
    out = []
    for r in world:
        wid = owner.get(r.workload.id)
        if wid is not None and groups[wid] == 1:
            w = dataclasses.replace(r.workload, id=wid, priority=running[wid], preemptible=True)
            r = Running(w, r.placement, r.start_s, r.idle)
        out.append(r)
    return out


def _where(p: Any) -> str:
    nodes = ", ".join(f"{n}:{gpus_out(g)}" for n, g in p.nodes)
    return f"{nodes} ({p.gpu_type})" if p.gpu_type else nodes


def _outcome(d: Decisions, w: Workload, at: float, running: Mapping[str, Running]) -> Advice:
    for a in d.admissions:
        if a.workload.id == w.id:
            victims = tuple(Victim(v, running[v].workload.queue, gpus_out(running[v].workload.gpus),
                                   running[v].workload.priority) for v in a.victims)
            where = _where(a.placement)
            if victims:
                return Advice(PREEMPT, at, f"gpuq would preempt {', '.join(v.id for v in victims)} and admit it "
                              f"on {where}", a.placement.gpu_type, a.placement.as_output(), victims)
            return Advice(ADMIT, at, f"gpuq would admit it on {where}", a.placement.gpu_type, a.placement.as_output())
    p = d.reason(w.id)
    assert p is not None, "schedule() gives every pending workload a reason"
    return Advice(WAIT, at, f"gpuq would wait too: {p.code.value}: {p.message}", reason_code=p.code.value,
                  message=p.message, position=p.position)
