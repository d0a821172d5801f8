"""Which queue a trace pod goes to, and the default quotas of the queues a trace import creates.

Public traces have no queues or teams, so an importer assigns pods itself. The rule is named
by a string (the ``--queues`` / ``--assign`` values of ``gpuq import-trace``):

``hash:N``
    ``zlib.crc32(pod name, UTF-8) % N`` picks one of ``q0 .. q{N-1}``. Stable across runs,
    Python versions and machines (Python's ``hash()`` is salted per process and is not).
``qos``
    one queue per QoS class: ``ls``, ``guaranteed``, ``burstable``, ``be``.
``qos:LS=prod,Guaranteed=prod,Burstable=batch,BE=batch``
    an explicit table from QoS class to queue; ``*=QUEUE`` takes the classes not named.

With a user queue tree (``queues=`` a parsed queue file), the same rules pick among its **leaf
queues**: ``hash`` (or ``hash:N`` with N equal to the number of leaves) hashes over the leaves in
file order; ``qos`` sends each class to the leaf whose last name is the class in lower case;
``qos:...`` names leaves by their dotted path. The user's quotas are then used unchanged.

Without a queue tree, the importer creates flat queues with :func:`default_quotas`.
"""
from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from accounting.errors import QueueConfigError
from accounting.queue_names import nearest
from accounting.queues import parse_queue_config
from scheduler.errors import SchedulerError

QOS_CLASSES = ("LS", "Guaranteed", "Burstable", "BE")


class TraceError(SchedulerError):
    """A trace, or an option of its import, cannot be used.

    ``where`` names the file (or the option, ``--queues``), ``line`` the 1-based line of a CSV
    row when known; not retryable: fix the input.
    """

    def __init__(self, where: str, reason: str, line: int | None = None) -> None:
        self.where = where
        self.reason = reason
        self.line = line
        at = f"{where}:{line}" if line is not None else where
        super().__init__(f"{at}: {reason}")


@dataclass(frozen=True, slots=True)
class Assignment:
    """A parsed assignment rule. ``leaves`` are the leaf queue paths in a fixed order;
    ``table`` maps a QoS class (or ``*``) to a leaf for the ``qos`` rules."""

    rule: str                               # "hash" or "qos"
    leaves: tuple[str, ...]
    table: Mapping[str, str]
    user_queues: bool                       # the tree came from the caller, quotas included

    def queue_of(self, pod_name: str, qos: str) -> str:
        if self.rule == "hash":
            return self.leaves[zlib.crc32(pod_name.encode("utf-8")) % len(self.leaves)]
        leaf = self.table.get(qos, self.table.get("*"))
        if leaf is None:
            named = ", ".join(sorted(self.table)) or "none"
            raise TraceError("assignment", f"pod {pod_name} has qos {qos!r}, which the rule does not map "
                                         f"(mapped: {named}; add {qos}=QUEUE or *=QUEUE)")
        return leaf


def _qos_table(text: str, leaves: Sequence[str] | None) -> dict[str, str]:
    table: dict[str, str] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        qos, sep, queue = part.partition("=")
        qos, queue = qos.strip(), queue.strip()
        if not sep or not qos or not queue:
            raise TraceError("--queues", f"expected QOS=QUEUE, got {part!r}")
        if qos != "*" and qos not in QOS_CLASSES:
            raise TraceError("--queues", f"unknown qos class {qos!r} (expected {', '.join(QOS_CLASSES)} or *)")
        if leaves is not None and queue not in leaves:
            raise TraceError("--queues", f"{queue!r} is not a leaf queue of the queue file "
                                         f"({nearest(queue, leaves)})")
        if leaves is None and "." in queue:
            raise TraceError("--queues", f"{queue!r}: nested queues need a queue file (--queues FILE.yaml)")
        table[qos] = queue
    if not table:
        raise TraceError("--queues", "qos: needs at least one QOS=QUEUE pair")
    return table


def parse_assignment(rule: str, queues: Mapping[str, Any] | None = None) -> Assignment:
    """Parse ``rule`` (see the module docstring); ``queues`` is a parsed queue file (its
    ``queues:`` and optional ``gpu_types:``), validated here with the production rules."""
    rule = rule.strip()
    leaves: tuple[str, ...] | None = None
    if queues is not None:
        try:
            leaves = parse_queue_config(queues, source="queues").leaves()
        except QueueConfigError as exc:
            raise TraceError("queues", str(exc)) from exc
        if not leaves:
            raise TraceError("queues", "the queue file has no queues")
    kind, _, arg = rule.partition(":")
    if kind == "hash":
        if leaves is not None:
            if arg and arg != str(len(leaves)):
                raise TraceError("--assign", f"{rule}: the queue file has {len(leaves)} leaf queues")
            return Assignment("hash", leaves, {}, True)
        if not arg.isdigit() or int(arg) < 1:
            raise TraceError("--queues", f"{rule!r}: expected hash:N with N >= 1")
        return Assignment("hash", tuple(f"q{i}" for i in range(int(arg))), {}, False)
    if kind == "qos" and not arg:
        if leaves is None:
            return Assignment("qos", tuple(q.lower() for q in QOS_CLASSES),
                              {q: q.lower() for q in QOS_CLASSES}, False)
        table = {}
        for q in QOS_CLASSES:
            match = [leaf for leaf in leaves if leaf.rsplit(".", 1)[-1] == q.lower()]
            if len(match) == 1:
                table[q] = match[0]
        return Assignment("qos", leaves, table, True)
    if kind == "qos":
        table = _qos_table(arg, leaves)
        if leaves is None:
            leaves = tuple(dict.fromkeys(table.values()))
        return Assignment("qos", leaves, table, queues is not None)
    raise TraceError("--queues", f"unknown rule {rule!r} (expected hash:N, qos, qos:QOS=QUEUE,... or a file)")


def default_quotas(leaves: Sequence[str], demand_gpu_s: Mapping[str, float],
                   total_gpus: int) -> dict[str, dict[str, Any]]:
    """Flat queues: ``guaranteed.gpu`` split by each queue's share of the GPU-seconds demand,
    ``max.gpu`` the whole cluster.

    The split is by largest remainder: each queue gets ``floor(total * share)``, and the GPUs
    left over go one each to the largest fractional parts (ties: the queue listed first), so the
    guarantees are integers that sum to ``total_gpus`` exactly (0 everywhere when there is no
    demand).
    """
    total_demand = sum(demand_gpu_s.get(q, 0.0) for q in leaves)
    exact = {q: (total_gpus * demand_gpu_s.get(q, 0.0) / total_demand if total_demand > 0 else 0.0)
             for q in leaves}
    share = {q: int(v) for q, v in exact.items()}
    left = total_gpus - sum(share.values()) if total_demand > 0 else 0
    order = sorted(range(len(leaves)), key=lambda i: (-(exact[leaves[i]] - share[leaves[i]]), i))
    for i in order[:left]:
        share[leaves[i]] += 1
    return {q: {"guaranteed": {"gpu": share[q]}, "max": {"gpu": total_gpus}} for q in leaves}
