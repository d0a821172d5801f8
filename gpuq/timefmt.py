"""Times as people read them, wherever text leaves gpuq for a person (the API's messages, the
CLI, the dashboards): ISO 8601 in UTC ("2026-11-22T10:05:26Z") or "3 min ago", never epoch seconds.

The scheduler's core writes instants into its messages as ``t=<seconds>`` (its clock: scenario
seconds in the simulator, whose ``events.jsonl`` is a contract and stays as it is; Unix time in
the live service). :func:`readable` rewrites those at the edge.
"""
from __future__ import annotations

import datetime as dt
import re

# "t=1795638326.48", "t=1030": an instant on the scheduler's clock inside a message
_T = re.compile(r"\bt=(-?\d+(?:\.\d+)?)(?![\w.])")


def iso(t: float | None, missing: str = "-") -> str:
    """``t`` (Unix seconds) as ``2026-11-22T10:05:26Z``; ``missing`` for None."""
    if t is None:
        return missing
    return dt.datetime.fromtimestamp(float(t), dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def readable(text: str | None) -> str | None:
    """``text`` with every ``t=<Unix seconds>`` written as an ISO time (None stays None):
    "preempted by serve-1 at t=1795638326.48: ..." -> "preempted by serve-1 at 2026-11-24T16:25:26Z: ..."."""
    if not text or "t=" not in text:
        return text
    return _T.sub(lambda m: iso(float(m.group(1))), text)


def span(seconds: float) -> str:
    """A length of time as people say it: "40 s", "12 min", "2.5 h", "3.0 d"."""
    s = max(0.0, float(seconds))
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    if s < 48 * 3600:
        return f"{s / 3600:.1f} h"
    return f"{s / 86400:.1f} d"


def ago(seconds: float) -> str:
    """A duration back from now as people say it: "just now", "45 s ago", "3 min ago", "2.5 h ago",
    "4.0 d ago"."""
    return "just now" if float(seconds) < 1 else span(seconds) + " ago"
