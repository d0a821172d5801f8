"""``--from`` / ``--to`` values: ISO 8601 (``2025-01-31``, ``2025-01-31T12:00:00Z``; a time without
a zone is UTC), ``now``, or relative to now: ``-7d``, ``-2h``, ``-30m``, ``-90s``, ``-1w``
(``+`` works too)."""
from __future__ import annotations

import datetime as dt
import re

from accounting.errors import TimeSpecError

_REL = re.compile(r"^(now)?\s*([+-])\s*(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(value: str, now_s: float) -> float:
    """Unix seconds for ``value``; ``now_s`` anchors ``now`` and relative values."""
    v = value.strip()
    if v.lower() == "now":
        return now_s
    m = _REL.match(v.lower())
    if m:
        amount = float(m.group(3)) * _UNIT[m.group(4)]
        return now_s + amount if m.group(2) == "+" else now_s - amount
    try:
        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise TimeSpecError(value, "expected ISO 8601 (2025-01-31T12:00:00Z), now, or -7d/-2h/-30m/-90s") from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    return t.timestamp()
