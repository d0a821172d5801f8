"""Reading Kubernetes objects given as plain mappings (a watch event's object, a row of
``kueue_objects``): their RFC 3339 times and their status conditions.

Shared here because both sides read the same objects and may not import each other: the collector
(:mod:`collector.k8s_kueue`, as it writes the ledger's rows) and the live scheduler's views of other
schedulers' workloads (:mod:`scheduler.service.kueue`, :mod:`scheduler.service.yunikorn`) and the
replay of their history (:mod:`scheduler.history`). Lenient by design: what cannot be read is None
(the caller falls back, as it would on a field the object lacks), never an error.
"""
from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any


_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+))?([a-zA-Z]*)$")
_SUFFIX = {
    "": 1.0, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60,
}


def parse_quantity(value: Any) -> float:
    """A Kubernetes quantity (``"2"``, ``"500m"``, ``"1Ki"``, ``"1e3"``) as a float; raises on an
    unreadable one (unlike the lenient readers below: the collector names the object)."""
    if isinstance(value, bool):
        raise TypeError(f"invalid quantity {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    m = _QUANTITY.match(str(value).strip())
    if not m or m.group(3) not in _SUFFIX:
        raise ValueError(f"invalid quantity {value!r}")
    number = float(m.group(1)) * (10.0 ** int(m.group(2)) if m.group(2) else 1.0)
    return number * _SUFFIX[m.group(3)]


def k8s_time(value: Any) -> dt.datetime | None:
    """A Kubernetes timestamp (``2026-11-22T10:05:26Z``) as an aware datetime (UTC when it names no
    zone); None when empty or unreadable."""
    if not value:
        return None
    try:
        t = dt.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.replace(tzinfo=dt.UTC)


def k8s_seconds(value: Any) -> float | None:
    """:func:`k8s_time` in Unix seconds."""
    t = k8s_time(value)
    return None if t is None else t.timestamp()


def condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    """The object's status condition of that type, if any."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if isinstance(c, Mapping) and c.get("type") == kind:
            return c
    return None


def is_true(obj: Mapping[str, Any], kind: str) -> bool:
    """Whether the object has that condition with status ``True``."""
    c = condition(obj, kind)
    return c is not None and str(c.get("status")) == "True"
