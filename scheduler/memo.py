"""What the scheduling cycle keeps on the cluster between cycles: :class:`CycleMemo`.

Nothing here is a decision. Each field is a function of the (immutable) cluster, or of the last
snapshots a cycle saw, kept because recomputing it would cost a pass over the backlog or the
running workloads; a cycle checks that what it keeps still belongs to its input (the same object,
by identity) before using it, and a cycle on a new, empty memo decides exactly the same
(``tests/test_scheduler_properties.py``). So a memo may be dropped at any time (a cluster built
anew has a new one); it must not be shared by two cycles running at once (the service runs one
``schedule()`` at a time).

Three kinds of field, by what makes them stale:

* **Static**: pure functions of the cluster (its nodes and queue tree), never stale: ``queues``,
  ``facts``, ``rooms`` and ``room_verdicts``, ``fit_keys``, ``queue_ranks``, ``gpus_total``.
* **Follows the input**: kept for the last input and updated from what changed, or rebuilt when
  the input is not the one it was kept for: ``grouped`` and ``grouped_changes``
  (:mod:`scheduler.ordering`), ``candidates`` (:mod:`scheduler.preemption`), ``counts``,
  ``fit_lists``, ``queue_keys``, ``built``, ``pending_gpus`` and ``entitlement`` (``reclaim:
  fair_share`` only: kept while the demand per queue is equal).
* **Per workload**: ``known``, bounded (emptied when it holds far more than the pending).

The records' types live here so that every field is named and typed in one place; their makers
are the modules that fill them.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from scheduler.model import Gpus, PendingReason, Running, Workload
from scheduler.verdicts import Fit, NoRoom, NoRoomAboveGuarantee, Settled

if TYPE_CHECKING:
    from scheduler.ordering import QueueKey
    from scheduler.preemption import Candidate, CandidateKey

# a gang shape, as static fits are kept per queue: gpu types, gpus per pod, pods, cpu millicores
# per pod, memory bytes per pod, preemptible
Shape = tuple[tuple[str, ...], int, int, int, int, bool]
# the room a shape looks for (Fit.room): its acceptable types, gpus per pod, pods, non-preemptible
RoomKey = tuple[tuple[str, ...], Gpus, int, bool]
# queue -> (its list before, the workloads that left it, those that joined it) of the last grouping
QueueChanges = dict[str, tuple[list[Workload], list[Workload], list[Workload]]]


class QueueTable(NamedTuple):
    """The queue tree as a cycle reads it: the leaf queues, the strict-FIFO ones, each queue's
    gpu guarantee, and the queues whose work may preempt within them (``within_queue``)."""

    leaves: frozenset[str]
    strict: frozenset[str]
    gpu_guarantee: dict[str, int]
    within: frozenset[str] = frozenset()


class QueueFacts(NamedTuple):
    """What never changes of a leaf queue: its :class:`Fit` per gang shape (filled as shapes come),
    the smallest max of each resource over its chain, and
    :func:`scheduler.reasons.above_guarantee_parts` for its gpu guarantee."""

    fits: dict[Shape, Fit]
    caps: dict[str, Gpus]
    why_not: tuple[str, str]


class Known:
    """A pending workload the cycle has seen: the workload (the same object, or the entry is not
    its), its :class:`Fit`, and its last reason (``None`` until one is built). The reason is reused
    as the same immutable object while code, message and position are unchanged, so a steady cycle
    allocates next to nothing; ``last`` is replaced in place."""

    __slots__ = ("fit", "last", "workload")

    def __init__(self, workload: Workload, fit: Fit, last: PendingReason | None = None) -> None:
        self.workload, self.fit, self.last = workload, fit, last


class QueueCounts:
    """What a walk reads of a queue's pending list ``lst`` to tell whether the queue is quiet, kept
    across cycles and updated from the workloads that left and joined it, counting those that can
    fit at all: how many preemptible ones look for each room (:attr:`Fit.room`), how many of them
    all ask for each GPU count, and how many non-preemptible ones do. Stale once ``lst`` is not
    the queue's list (then updated or counted anew)."""

    __slots__ = ("gpus", "lst", "pinned", "rooms")

    def __init__(self, lst: list[Workload]) -> None:
        self.lst = lst
        self.rooms: dict[int, int] = {}
        self.gpus: dict[Gpus, int] = {}
        self.pinned: dict[Gpus, int] = {}


class FitList(NamedTuple):
    """The :class:`Fit` of each workload of a queue's pending list ``lst``, in order; stale once
    ``lst`` is not the queue's list."""

    lst: list[Workload]
    fits: list[Fit]


class KeptKey(NamedTuple):
    """A queue's key (:func:`scheduler.ordering.queue_key`) and the usage mapping it was computed
    from; stale once the queue's usage is another mapping (the snapshot's are immutable)."""

    usage: Mapping[str, int]
    key: QueueKey


class BuiltReasons(NamedTuple):
    """The reasons last built for a quiet queue (one not walked: its verdicts follow from its fits),
    and all they followed from: its pending list, whether preemption was on, its gpu usage, its
    entitlement (``reclaim: fair_share``), its non-preemptible GPUs and the verdict of each room its workloads look for. Equal inputs give
    these same reasons back."""

    lst: list[Workload]
    preemption: bool
    used: Gpus
    entitled: Gpus | None         # its entitlement under reclaim: fair_share (the reasons say it), else None
    pinned: Gpus
    rooms: tuple[Settled, ...]
    reasons: list[PendingReason]


class GroupedPending(NamedTuple):
    """The last :func:`scheduler.ordering.grouped`: the pending sequence grouped (the same object),
    the ids of its workloads and id -> workload (``None`` when the caller's changes were used), and
    the groups (each list never changed once handed out)."""

    pending: Sequence[Workload]
    ids: set[int] | None
    by_id: dict[int, Workload] | None
    groups: dict[str, list[Workload]]


class CandidateOrder(NamedTuple):
    """Every preemptible running workload in candidate order (:mod:`scheduler.preemption`), for the
    running sequence of the last call (kept: it holds its objects, so their ids are not reused):
    the ids of that sequence, the candidate keys in order, the candidates in the same order, and
    id of a running -> its candidate."""

    running: Sequence[Running]
    ids: set[int]
    keys: list[CandidateKey]
    cands: list[Candidate]
    by_id: dict[int, Candidate]


@dataclass(slots=True, eq=False)
class CycleMemo:
    """Everything a cycle keeps on its :class:`scheduler.snapshot.Cluster` (``cluster.memo``)."""

    # static: the queue tree as a cycle reads it (built on the first cycle)
    queues: QueueTable | None = None
    # static: leaf queue -> what never changes of it, static fits per shape included
    facts: dict[str, QueueFacts] = field(default_factory=dict)
    # static: the number of each room (Fit.room), in order of first sight, and its two verdicts
    # (NoRoom, NoRoomAboveGuarantee), shared by the shapes that look for it
    rooms: dict[RoomKey, int] = field(default_factory=dict)
    room_verdicts: list[tuple[NoRoom, NoRoomAboveGuarantee]] = field(default_factory=list)
    # static: the number of each (queue, gang shape) (Fit.key), in order of first sight
    fit_keys: dict[tuple[str, Shape], int] = field(default_factory=dict)
    # static: each queue's rank in the victim order (scheduler.preemption.queue_ranks)
    queue_ranks: dict[str, tuple[int, ...]] | None = None
    # static: the cluster's GPUs (what reclaim: fair_share divides, scheduler.quota.cycle_entitlements)
    gpus_total: int | None = None
    # follows the pending: the last grouping by queue, and what it changed per queue (empty after a
    # full regrouping: every list new)
    grouped: GroupedPending | None = None
    grouped_changes: QueueChanges = field(default_factory=dict)
    # follows the running: the preemptible ones in candidate order
    candidates: CandidateOrder | None = None
    # follows each queue's list: its counts of rooms and gang sizes, its workloads' fits
    counts: dict[str, QueueCounts] = field(default_factory=dict)
    fit_lists: dict[str, FitList] = field(default_factory=dict)
    # follows each queue's usage: its key
    queue_keys: dict[str, KeptKey] = field(default_factory=dict)
    # follows each quiet queue's inputs: its reasons last built
    built: dict[str, BuiltReasons] = field(default_factory=dict)
    # follows the demand (reclaim: fair_share only, scheduler.quota.cycle_entitlements): each leaf's
    # pending list and its GPUs; the demand per queue the entitlements were last divided for, and them
    pending_gpus: dict[str, tuple[list[Workload], Gpus]] = field(default_factory=dict)
    entitlement: tuple[dict[str, Gpus], Mapping[str, Gpus]] | None = None
    # per pending workload, by id: the workload, its fit, its last reason; bounded
    known: dict[str, Known] = field(default_factory=dict)
