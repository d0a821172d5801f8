"""Resource amounts in the queue file: GPU counts, CPU and memory quantities.

* ``gpu`` and ``gpu/<TYPE>``: a non-negative integer (``1.5``, ``"2"`` and ``true`` are refused);
* ``cpu``: cores as a number or a Kubernetes quantity (``500m``); stored in **millicores**;
* ``memory``: bytes as an integer or a Kubernetes quantity (``64Gi``, ``1G``, ``512Mi``); stored
  in bytes.

Each parser returns ``(value, None)`` or ``(None, reason)`` so the caller names the YAML path.
"""
from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from gpuq.errors import shown

_SUFFIX = {
    "": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}
_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?\s*$")


def gpu_count(value: Any) -> tuple[int | None, str | None]:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and value >= 0:
            return int(value), None
        return None, f"expected a non-negative integer GPU count, got {shown(value)}"
    if value < 0:
        return None, f"must not be negative, got {value}"
    return value, None


def _decimal(value: Any) -> tuple[Decimal | None, str, str | None]:
    if isinstance(value, bool):
        return None, "", f"expected a quantity, got {shown(value)}"
    if isinstance(value, (int, float)):
        if value < 0:
            return None, "", f"must not be negative, got {value}"
        return Decimal(str(value)), "", None
    if isinstance(value, str):
        m = _QUANTITY.match(value)
        if m:
            try:
                return Decimal(m.group(1)), m.group(2) or "", None
            except InvalidOperation:  # pragma: no cover - the regex only lets digits through
                pass
        if value.strip().startswith("-"):
            return None, "", f"must not be negative, got {shown(value)}"
    return None, "", f"expected a quantity such as 8, 500m or 64Gi, got {shown(value)}"


def cpu_millicores(value: Any) -> tuple[int | None, str | None]:
    amount, suffix, err = _decimal(value)
    if err or amount is None:
        return None, err
    if suffix == "m":
        milli = amount
    elif suffix == "":
        milli = amount * 1000
    else:
        return None, f"expected cores (8) or millicores (500m), got {shown(value)}"
    if milli != milli.to_integral_value():
        return None, f"finer than a millicore: {shown(value)}"
    return int(milli), None


def memory_bytes(value: Any) -> tuple[int | None, str | None]:
    amount, suffix, err = _decimal(value)
    if err or amount is None:
        return None, err
    if suffix == "m":
        return None, f"memory in millibytes makes no sense: {shown(value)}"
    total = amount * _SUFFIX[suffix]
    if total != total.to_integral_value():
        return None, f"not a whole number of bytes: {shown(value)}"
    return int(total), None
