"""Values of the scheduler core: nodes, workloads, placements and the decisions of one cycle.

All are frozen and slotted; times are seconds on the caller's clock (``*_s``). A workload is one
gang (a pod set): ``pods`` pods of ``gpus_per_pod`` GPUs each, all of one GPU type, started and
stopped together.

GPU amounts (:data:`Gpus`) are exact: an ``int`` for whole GPUs, a :class:`decimal.Decimal` of
thousandths for a *share* (issue 19: ``gpus_per_pod`` below 1, a share of one device that never
spans two; 1 and above are whole devices). Sums stay exact (no float drift: a decimal context
keeps 28 digits, and thousandths of GPUs never come near), an int where whole work is all there
is, so a cluster without shares computes exactly what it did before. Decimal, not Fraction: the
C decimal's add and compare are about ten times faster, and the cycle adds and compares GPU
amounts on its hot path (the backlog benchmark with shares mixed in: docs/PERFORMANCE.md); output
turns an amount into an int when whole and a float of at most three decimals otherwise
(:func:`gpus_out`).
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from decimal import Decimal
from itertools import chain
from typing import Any

# Workload ids the Kubernetes source gives the objects it finds (``rayjob/<namespace>/<name>``,
# ``raycluster/<namespace>/<name>``): reserved, refused from the API (issue 17: an operator's
# workload of that id made the real object be skipped).
SOURCE_ID_PREFIXES = ("rayjob/", "raycluster/")

Gpus = int | Decimal        # an amount of GPUs: whole, or thousandths of one (module docstring)
MILLI = 1000


def share_of_gpus(value: object) -> Gpus | None:
    """A per-pod GPU request as the core keeps it: an ``int`` of 1 or more, or a share of one GPU
    in thousandths (``0.5`` -> ``Decimal("0.5")``); ``None`` when it is neither (0, negative, more
    than three decimals, or above 1 and not whole)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Decimal)):
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, int):
        return value if value >= 1 else None
    milli = (value if isinstance(value, Decimal) else Decimal(repr(value))) * MILLI
    if not milli.is_finite() or milli != milli.to_integral_value() or not 0 < milli < MILLI:
        return None
    return Decimal(int(milli)) / MILLI


def exact(g: Gpus) -> Gpus:
    """An amount as the core keeps it: an int when whole (a sum of shares that came out whole, or a
    share given back), so sums of whole work stay ints and a whole sum reads ``24``, not ``24.00``."""
    if isinstance(g, int) or g != g.to_integral_value():
        return g
    return int(g)


def is_share(gpus_per_pod: Gpus) -> bool:
    """A share of one device (below 1), not whole devices."""
    return type(gpus_per_pod) is not int


def gpus_out(x: Gpus | float) -> int | float:
    """An amount as output carries it (JSON, tables): an int when whole, else a float of at most
    three decimals (thousandths are the unit; a sum of shares is exact before it is rounded here)."""
    if type(x) is int:
        return x
    if x == int(x):
        return int(x)
    return round(float(x), 3)


def whole(x: Gpus) -> int:
    """``x`` where only whole GPUs may be (fixed load in a scenario holds whole GPUs); a share
    there is a bug, said loudly."""
    if type(x) is int:
        return x
    if x == int(x):
        return int(x)
    raise ValueError(f"{gpus_text(x)} GPUs where only whole GPUs are taken")


def from_milli(milli: int) -> Gpus:
    """milli-GPUs (the store's unit) as the core keeps amounts: an int when whole."""
    return exact(Decimal(milli) / MILLI)


def gpus_in(x: int | float | str) -> Gpus:
    """An amount read back from output (JSON, a table): an int when whole, else exact thousandths."""
    d = Decimal(x) if isinstance(x, str) else Decimal(repr(float(x)))
    if d == d.to_integral_value():
        return int(d)
    return d.quantize(Decimal("0.001"))


def placement_event(p: Placement) -> dict[str, Any]:
    """What an ``admit`` event says of a placement: ``placement`` (GPUs per node as output carries
    them) and, for a gang of shares, ``shares`` ([[node, slot, share], ...]: which of gpuq's device
    slots holds each share, so a restart gives each back where it was taken)."""
    out: dict[str, Any] = {"placement": p.as_output()}
    if p.shares:
        out["shares"] = [[n, slot, gpus_out(s)] for n, slot, s in p.shares]
    return out


def placement_of_event(gpu_type: str, placement: Mapping[str, Any],
                       shares: Sequence[Sequence[Any]] | None = None) -> Placement:
    """:func:`placement_event` read back."""
    nodes = tuple((str(n), gpus_in(g)) for n, g in placement.items())
    held = tuple((str(n), int(slot), Decimal(repr(float(s)))) for n, slot, s in shares or ())
    return Placement(gpu_type, nodes, held)


def gpus_text(x: Gpus | float) -> str:
    """An amount as messages say it: ``8``, ``0.5``, ``1.25``."""
    return str(gpus_out(x))


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpu_type: str
    gpus: int
    cpu_millicores: int = 0      # informational: placement packs GPUs only
    memory_bytes: int = 0


@dataclass(frozen=True, slots=True)
class Workload:
    """A gang. ``gpu_types`` lists acceptable types in order of preference; empty means any type.

    ``originator`` marks the workload that holds its application's originator pod (the Ray head):
    it is preempted last. ``order_key`` is the documented in-queue order
    ``(-priority, submit_s, id)``: higher priority first, then older, then the stable id.

    ``duration_s`` is the running time the simulator gives the workload (a scenario's ``duration``):
    the truth of a replay, which nothing that forecasts may read. ``expected_duration_s`` is what
    its submitter declared it will need (a scenario's ``expected_duration``), or ``None``: the only
    duration of the workload itself that start-time forecasts use (:mod:`scheduler.forecast`). No
    decision of the core reads either.
    """

    id: str
    queue: str
    pods: int = 1
    gpus_per_pod: Gpus = 1
    gpu_types: tuple[str, ...] = ()
    priority: int = 0
    preemptible: bool = True
    submit_s: float = 0.0
    duration_s: float = 0.0
    checkpoint: bool = False
    originator: bool = False
    cpu_millicores_per_pod: int = 0
    memory_per_pod_bytes: int = 0
    expected_duration_s: float | None = None
    order_key: tuple[int, float, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "order_key", (-self.priority, self.submit_s, self.id))

    @property
    def gpus(self) -> Gpus:
        return self.pods * self.gpus_per_pod


Share = tuple[str, int, Decimal]     # (node, device slot on that node, share of the device held)


@dataclass(frozen=True, slots=True)
class Placement:
    """Where a gang runs: one GPU type and GPUs taken per node (node order of the cluster).

    A gang of shares also says which device each share is on: ``shares`` holds (node, slot,
    share) per device it uses (pods of one gang may share a device: their shares summed). A slot
    names a partly used device of the node for as long as some share holds it; which physical
    device that is, the caller decides (:class:`scheduler.simulator.engine` keeps the table): the
    core only needs slots to free a share from the device it took it on. Whole gangs hold no
    shares, and their placement is what it always was."""

    gpu_type: str
    nodes: tuple[tuple[str, Gpus], ...]
    shares: tuple[Share, ...] = ()

    def as_dict(self) -> dict[str, Gpus]:
        return dict(self.nodes)

    def as_output(self) -> dict[str, int | float]:
        """:meth:`as_dict` with each amount as output carries it (:func:`gpus_out`)."""
        return {n: gpus_out(g) for n, g in self.nodes}


@dataclass(frozen=True, slots=True)
class Running:
    """An admitted workload. ``idle`` is the accounting's view that its GPUs sit idle."""

    workload: Workload
    placement: Placement
    start_s: float
    idle: bool = False


def lost_gpu_seconds(r: Running, now_s: float, last_checkpoint_s: float | None = None) -> float:
    """The GPU-seconds of work a preemption of ``r`` at ``now_s`` throws away (issue 21): its GPUs
    times the time since its start, or since its last checkpoint when it reports one taken during
    this run (a checkpoint before the start saves nothing of this run; one after ``now_s``, a
    clock ahead, counts as ``now_s``: nothing lost)."""
    since = r.start_s if last_checkpoint_s is None else min(max(r.start_s, last_checkpoint_s), now_s)
    return max(0.0, float(r.workload.gpus) * (now_s - since))


class ReasonCode(Enum):
    """Why a workload is still pending after a cycle."""

    QUOTA_MAX = "quota_max"                        # its queue or an ancestor would exceed max
    NO_FIT = "no_fit"                              # no acceptable nodes with enough free GPUs
    WAITING_PREEMPTION_DELAY = "waiting_preemption_delay"  # may preempt once the delay has passed
    WAITING_FOR_VICTIMS = "waiting_for_victims"    # adapters: admitted, victims still stopping
    NO_VICTIMS = "no_victims"                      # may preempt, but no allowed victim set fits it
    FENCED = "fenced"                              # the only victims are behind a preemption fence
    STRICT_FIFO = "strict_fifo"                    # behind a blocked head in a strict-FIFO queue
    BEHIND_HIGHER_PRIORITY = "behind_higher_priority"  # strict FIFO, head has higher priority
    NEVER_FITS = "never_fits"                      # larger than its queue's max or any node group
    # its target's namespace may not use its queue (accounting.access): held by the service, never
    # decided on (the cycle does not see it)
    QUEUE_NOT_ALLOWED = "queue_not_allowed"
    # non-preemptible, and its queue's non-preemptible work would go above the queue's guarantee
    NON_PREEMPTIBLE_OVER_GUARANTEE = "non_preemptible_over_guarantee"


@dataclass(frozen=True, slots=True)
class PendingReason:
    workload: str
    queue: str
    code: ReasonCode
    message: str
    position: int                # 1-based place among its queue's pending workloads


def _slot_setters(cls: type, names: tuple[str, ...]) -> tuple[Callable[[object, object], None], ...]:
    return tuple(getattr(cls, n).__set__ for n in names)


_PR_SET = _slot_setters(PendingReason, ("workload", "queue", "code", "message", "position"))


def pending_reason(workload: str, queue: str, code: ReasonCode, message: str, position: int) -> PendingReason:
    """``PendingReason(workload, queue, code, message, position)``, built about twice as fast: the
    frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``; this sets the
    slots directly. The cycle makes one per waiting workload (10,000 a cycle at scale)."""
    r = object.__new__(PendingReason)
    sw, sq, sc, sm, sp = _PR_SET
    sw(r, workload)
    sq(r, queue)
    sc(r, code)
    sm(r, message)
    sp(r, position)
    return r


_Part = Sequence[PendingReason] | Callable[[], Sequence[PendingReason]]


class PendingReasons(Sequence[PendingReason]):
    """:attr:`Decisions.pending` as the cycle leaves it: per queue either its reasons or a
    callable that builds them (a queue whose verdicts the cycle replayed from the last cycle's,
    :mod:`scheduler.cycle`), built all at once on first read and kept. It reads as, and compares
    equal to, the tuple of its reasons: the simulator never reads it, so a cycle in a deep backlog
    does not pay for reasons no one asks for."""

    __slots__ = ("_built", "_items", "_len", "_parts")

    def __init__(self, parts: Sequence[_Part], length: int) -> None:
        self._parts: Sequence[_Part] | None = parts
        self._len = length
        self._built: tuple[Sequence[PendingReason], ...] | None = None
        self._items: tuple[PendingReason, ...] | None = None

    def parts(self) -> tuple[Sequence[PendingReason], ...]:
        """The reasons queue by queue (one part per queue with waiting workloads, in the order the
        sequence reads them), each built once. A part is never changed once built, and a queue
        whose reasons the cycle reused is the same part object as in the cycle it was built (a
        reader that keeps what it read, the service, skips a part it has already read)."""
        built = self._built
        if built is None:
            parts = self._parts
            assert parts is not None
            built = self._built = tuple([p() if callable(p) else p for p in parts])
            self._parts = None
        return built

    def _all(self) -> tuple[PendingReason, ...]:
        items = self._items
        if items is None:
            items = self._items = tuple(chain.from_iterable(self.parts()))
        return items

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        return self._all()[i]

    def __iter__(self) -> Iterator[PendingReason]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PendingReasons):
            return self._all() == other._all()
        if isinstance(other, tuple):
            return self._all() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._all())

    def __repr__(self) -> str:
        return repr(self._all())


@dataclass(frozen=True, slots=True)
class Admission:
    """Start ``workload`` at ``placement``; ``victims`` (ids) must stop first, in this order."""

    workload: Workload
    placement: Placement
    victims: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Preemption:
    preemptor: str
    queue: str                   # the preemptor's queue
    victims: tuple[str, ...]
    reason: str


@dataclass(frozen=True, slots=True)
class Decisions:
    """One cycle's outcome. ``admissions`` are in the order they take effect; an admission with
    victims follows its :class:`Preemption` (same preemptor), which is listed in ``preemptions``."""

    now_s: float
    admissions: tuple[Admission, ...]
    preemptions: tuple[Preemption, ...]
    pending: Sequence[PendingReason]      # a tuple, or PendingReasons (built on first read)

    def reason(self, workload_id: str) -> PendingReason | None:
        for p in self.pending:
            if p.workload == workload_id:
                return p
        return None
