"""The books audit themselves: what the accounting shows against what the scheduler placed. Pure.

Every accounting interval ``gpuq serve`` compares, per (queue, GPU type, node), the GPUs the
accounting's live ledger holds now (observed rows and gpuq's admissions, after the one ledger
rule: :func:`accounting.ledger.combine`, :func:`accounting.intervals.running`) with the scheduler's
own record of what it placed (its running workloads' placements, and the foreign work it counts).
Both sides name queues as the accounting resolves them (a queue that is not a leaf, and
``(unassigned)``, are :data:`OTHER`: the scheduler holds such work as plain occupied GPUs) and
nodes as the scheduler names them. A difference is a bug or a world that disagrees with gpuq (a
pod on another node than chosen); it is served as ``gpuq_books_difference_gpus`` and alerted on
when it stays (``GpuqBooksUnbalanced``), and ``gpuq check`` prints it.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from accounting.model import Allocation, as_gpus, milli
from accounting.resolve import Resolver

OTHER = "(not a leaf queue)"


@dataclass(frozen=True, slots=True)
class Placed:
    """GPUs the scheduler holds on one node for one queue (``queue`` :data:`OTHER` for occupied GPUs)."""

    queue: str
    gpu_type: str
    node: str
    gpus: float


@dataclass(frozen=True, slots=True)
class Difference:
    queue: str
    gpu_type: str
    node: str
    accounted: float          # what the accounting shows
    placed: float             # what the scheduler placed

    @property
    def gpus(self) -> float:
        return self.accounted - self.placed


def audit(live: Iterable[Allocation], placed: Iterable[Placed], resolver: Resolver,
          node_name: Callable[[Allocation], str], type_of: Callable[[str, Allocation], str]) -> tuple[Difference, ...]:
    """The (queue, type, node) cells where the two records differ, in that order. ``live``: the
    ledger's rows running now; ``type_of(node, row)``: a row's GPU type as the scheduler types
    its node."""
    rows = [(resolver.queue(a.queue, a.namespace), a) for a in live]
    leaves = set(resolver.config.leaves())                     # with the queues placement rules made
    books: dict[tuple[str, str, str], list[int]] = {}          # milli-GPUs: exact
    for q, a in rows:
        node = node_name(a)
        cell = books.setdefault((q if q in leaves else OTHER, type_of(node, a), node), [0, 0])
        cell[0] += a.counted_milli
    for p in placed:
        cell = books.setdefault((p.queue, p.gpu_type, p.node), [0, 0])
        cell[1] += milli(p.gpus)
    return tuple(Difference(q, t, n, as_gpus(acc), as_gpus(pl)) for (q, t, n), (acc, pl) in sorted(books.items())
                 if acc != pl)


def unbalanced(diffs: Iterable[Difference]) -> float:
    """GPUs on the wrong side of the books, summed over cells."""
    return sum(abs(d.gpus) for d in diffs)
