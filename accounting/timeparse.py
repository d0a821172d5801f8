"""``--from`` / ``--to`` values: ISO 8601 (``2025-01-31``, ``2025-01-31T12:00:00Z``; a time without
a zone is UTC), ``now``, or relative to now: ``-7d``, ``-2h``, ``-30m``, ``-90s``, ``-1w``
(``+`` works too). Every value must land between 1970-01-01 and 9999-12-31 UTC: anything else
(``-<400 nines>w``, ``0001-01-01``) is a TimeSpecError, never an OverflowError."""
from __future__ import annotations

import datetime as dt
import math
import re

from accounting.errors import TimeSpecError

_REL = re.compile(r"^(now)?\s*([+-])\s*(\d+(?:\.\d+)?)\s*([smhdw])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
MAX_S = 253402300799.0        # 9999-12-31T23:59:59Z, the last second datetime can show
_RANGE = "out of range: times must fall between 1970-01-01 and 9999-12-31 UTC"


def parse_time(value: str, now_s: float) -> float:
    """Unix seconds for ``value``; ``now_s`` anchors ``now`` and relative values."""
    v = value.strip()
    if v.lower() == "now":
        return now_s
    m = _REL.match(v.lower())
    if m:
        amount = float(m.group(3)) * _UNIT[m.group(4)]
        return _in_range(value, now_s + amount if m.group(2) == "+" else now_s - amount)
    try:
        t = dt.datetime.fromisoformat(v.replace("Z", "+00:00").replace("z", "+00:00"))
        if t.tzinfo is None:
            t = t.replace(tzinfo=dt.UTC)
        ts = t.timestamp()
    except (ValueError, OverflowError):
        raise TimeSpecError(_short(value), "expected ISO 8601 (2025-01-31T12:00:00Z), now, or "
                                           "-7d/-2h/-30m/-90s") from None
    return _in_range(value, ts)


def _in_range(value: str, t: float) -> float:
    if not math.isfinite(t) or not 0.0 <= t <= MAX_S:
        raise TimeSpecError(_short(value), _RANGE)
    return t


def _short(value: str) -> str:
    return value if len(value) <= 64 else value[:61] + "..."
