"""What a cycle found for each workload it could not start: a closed set of typed verdicts.

A walk (:meth:`scheduler.cycle._Cycle.walk`) stores one verdict per waiting workload and builds no
reason; the reasons are built from the verdicts when :attr:`scheduler.model.Decisions.pending` is
first read. A verdict is shared: every workload of a gang shape in one walk takes the same object
(but the verdict of a non-preemptible workload over its guarantee, which names its GPUs), so a
verdict holds only what is the same for all of them, and what differs per workload (its GPUs, its
submit time) is read from the workload when its reason is built. Four kinds, each named for
what it means:

* :class:`Settled`: the reason is known in full, its code and message (never fits; over a max;
  no room, found this walk; no room and above the guarantee; no victims; fenced; strict FIFO;
  behind a higher priority; non-preemptible over its guarantee). The code is the tag.
* :class:`NoRoom`: no room for the gang shape's room (:attr:`Fit.room`) this cycle; the message is
  the room's, from the walk's all-full map (:data:`AllFull`), kept with the verdicts. Preemption is
  off, so that is all.
* :class:`NoRoomAboveGuarantee`: the same, and preemption is on but the workload's queue would go
  above its gpu guarantee by taking it: the message adds what the queue would hold (its usage
  when walked, kept with the verdicts, plus the workload's GPUs).
* :class:`AwaitingDelay`: no room on free capacity, and the workload may preempt once the
  preemption delay since its submit has passed: the message adds when (``now``, its submit).

All four are immutable ``@final`` :class:`typing.NamedTuple` s: a verdict can be shared, compared
and kept, and ``type(v) is Settled`` and so on narrow a :data:`Verdict` for mypy (the reading
dispatches that way, the cheapest test there is). A workload that starts gets no verdict: the
walk ends there with its :class:`scheduler.model.Admission`.

:class:`Fit` is the part of a gang shape's verdict that no cluster state changes (whether it can
ever run, where it looks for room), with its static verdicts built once.
"""
from __future__ import annotations

from typing import NamedTuple, final

from scheduler.model import Gpus, ReasonCode


@final
class Settled(NamedTuple):
    """A verdict whose reason is known in full when the walk finds it."""

    code: ReasonCode
    message: str


@final
class NoRoom(NamedTuple):
    """No room for the shape: :attr:`Fit.room` ``room`` found none this cycle (its message is the
    walk's :data:`AllFull` ``[room]``), and preemption is off."""

    room: int


@final
class NoRoomAboveGuarantee(NamedTuple):
    """No room for the shape (as :class:`NoRoom`), and no preemption: the workload's queue, holding
    the walk's usage, would go above its gpu guarantee with the workload's GPUs."""

    room: int


@final
class AwaitingDelay(NamedTuple):
    """No room on free capacity (``message``); the workload may preempt once the preemption delay
    after its submit has passed."""

    message: str


Verdict = Settled | NoRoom | NoRoomAboveGuarantee | AwaitingDelay

# Fit.room -> the free-capacity verdict of the shapes that look for that room and found none this
# cycle (a Settled with code no_fit); a walk's NoRoom verdicts read their message here
AllFull = dict[int, Settled]


@final
class Fit(NamedTuple):
    """What a gang shape allows whatever the cluster's state, found once per queue and shape
    (:func:`scheduler.cycle.static_fit`): why it never fits (or ``None``), its acceptable types in
    order, and a number for the room it looks for (``room``: the shapes with the same types, GPUs
    per pod, pods and non-preemptibility look for the same room, :data:`AllFull`); a number for the
    shape in its queue (``key``), its GPUs, whether it is non-preemptible (``pinned``: such shapes
    have rooms of their own, never in :data:`AllFull`), and its verdicts that need no walk: the one
    when it never fits, the two when its room is full."""

    never: str | None
    types: tuple[str, ...]
    room: int
    key: int
    gpus: Gpus
    pinned: bool
    never_fits: Settled | None
    no_room: NoRoom
    no_room_above: NoRoomAboveGuarantee
