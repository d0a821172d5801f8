"""What an error says when a workload, a rule or a query names a queue that is not a leaf.

A configuration holds up to :data:`accounting.queues.MAX_QUEUES` (10,000) queues; an error that
listed every leaf was as large as the configuration (issue 17: a 100,000-queue file made each
unknown-queue answer megabytes). :func:`leaf_problem` names at most :data:`NEAR` queues instead:
the leaves whose names are nearest to the one asked for (``difflib``), or, for a parent queue,
leaves under it, with how many there are in all.

The search costs at most one ``quick_ratio`` per leaf and one full ``ratio`` for the
:data:`SHORTLIST` best of those (about 20 ms at 10,000 leaves, where ``difflib.get_close_matches``
alone took up to 180 ms for a name that looks like many), so callers compute the message outside
any lock they hold.
"""
from __future__ import annotations

import difflib
import heapq
from collections.abc import Iterable, Sequence

from accounting.queues import ROOT, QueueConfig
from gpuq.errors import shown

NEAR = 10             # at most this many queues named in one message
SHORTLIST = 100       # candidates by quick_ratio that get the full ratio
CUTOFF = 0.6          # difflib's default: below it a name is not "near"
_LONGEST = 253        # a queue name is a path of at most this many characters: longer is near nothing


def near(name: str, names: Iterable[str], n: int = NEAR) -> list[str]:
    """At most ``n`` of ``names`` nearest to ``name`` (difflib's ratio at least :data:`CUTOFF`),
    best first, ties by name."""
    if not name or len(name) > _LONGEST:
        return []
    matcher = difflib.SequenceMatcher(autojunk=False)
    matcher.set_seq2(name)

    def quick(candidate: str) -> float:
        matcher.set_seq1(candidate)
        return matcher.quick_ratio() if matcher.real_quick_ratio() >= CUTOFF else 0.0

    scores = ((quick(c), c) for c in names if c != name)
    shortlist = heapq.nlargest(SHORTLIST, (s for s in scores if s[0] >= CUTOFF))
    scored = []
    for _, candidate in shortlist:
        matcher.set_seq1(candidate)
        ratio = matcher.ratio()
        if ratio >= CUTOFF:
            scored.append((-ratio, candidate))
    return [c for _, c in sorted(scored)[:n]]


def listed(names: Sequence[str], total: int, noun: str = "leaf queues") -> str:
    """``a, b, c`` with ``(N leaf queues in all)`` when there are more than those shown."""
    text = ", ".join(names)
    return text + (f" ({total:,} {noun} in all)" if total > len(names) else "")


def leaf_problem(config: QueueConfig, name: str, takes: str = "workloads") -> str | None:
    """None when ``name`` is a leaf queue of ``config``; else the message saying why not, naming at
    most :data:`NEAR` queues: a parent's leaves (the first in order), or the leaves nearest to an
    unknown name. ``takes`` says what only leaves take (workloads, pods)."""
    queue = config.queues.get(name)
    if queue is not None and queue.is_leaf and name != ROOT:
        return None
    leaves = config.leaves()
    if queue is not None:
        under = [leaf for leaf in leaves if name == ROOT or leaf.startswith(name + ".")]
        return (f"queue {shown(name)} is not a leaf (only leaf queues take {takes}); leaves under it: "
                f"{listed(under[:NEAR], len(under))}")
    return f"unknown queue {shown(name)}; " + nearest(name, leaves)


def nearest(name: str, names: Sequence[str], noun: str = "leaf queues") -> str:
    """What to say of ``names`` (the ``noun``) to a caller who asked for the unknown ``name``: all of
    them when they are at most :data:`NEAR`, else ``near: a, b (N leaf queues in all)``, or that
    none is near."""
    if not names:
        return f"no {noun} configured"
    if len(names) <= NEAR:
        return f"{noun}: {', '.join(names)}"
    found = near(name, names)
    if found:
        return f"near: {listed(found, len(names), noun)}"
    return f"none of the {len(names):,} {noun} is near it"
