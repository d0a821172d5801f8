"""What an import gives: the queue file's mapping, where each queue came from, and the findings.

A :class:`Finding` is one thing of the source that gpuq did not carry over exactly: ``where`` it
is (``ClusterQueue team-a (kueue.yaml, document 3)``), ``what`` it is, ``why`` gpuq cannot
carry it, and what gpuq did ``instead``. :func:`render_yaml` writes the queue file with a comment
on each queue saying where it came from, and the findings at the end as comments, so the file
keeps its own record of what it is not.

Also here: the quantities both importers read (Kubernetes quantities, summed exactly as
Decimals, written back in the queue file's units) and the queue names they make (a source name
that is not a valid gpuq queue name is rewritten, and said so).
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import ROUND_FLOOR, Decimal
from typing import Any

from accounting.errors import QueueImportError
from accounting.quantity import _QUANTITY, _SUFFIX
from gpuq.errors import shown


@dataclass(frozen=True)
class Finding:
    """One thing not carried over exactly: where, what, why, and what gpuq did instead."""

    where: str
    what: str
    why: str
    instead: str

    def line(self) -> str:
        return f"{self.where}: {self.what}: {self.why}; gpuq: {self.instead}"


@dataclass(frozen=True)
class Imported:
    """An import's result: ``data`` is the queue file's mapping (what
    :func:`accounting.queues.parse_queue_config` takes), ``origins`` the source of each queue by
    its dotted path, ``findings`` what was not carried over exactly, in the source's order."""

    data: dict[str, Any]
    origins: dict[str, str]
    findings: tuple[Finding, ...]


class Located(dict[str, Any]):
    """A parsed object with the place it was read from (``kueue.yaml, document 3``): the CLI wraps
    each document so that findings and errors name it; a plain mapping is named by the importer's
    ``source`` instead."""

    origin: str

    def __init__(self, data: Mapping[str, Any], origin: str) -> None:
        super().__init__(data)
        self.origin = origin


def named(kind: str, name: str, origin: str) -> str:
    """``Kind name (origin)``, the ``where`` of a finding or an error about one source object."""
    return f"{kind} {name} ({origin})" if origin else f"{kind} {name}"


def shown_value(value: Any) -> str:
    """A source value as a finding quotes it: JSON for mappings and lists, cut to 120 characters."""
    import json

    text = json.dumps(value, sort_keys=True, default=str) if isinstance(value, (Mapping, list)) else str(value)
    return text if len(text) <= 120 else text[:117] + "..."


# -- quantities ---------------------------------------------------------------------------------
_EXPONENT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)[eE]([+-]?[0-9]+)\s*$")


def quantity(value: Any, where: str) -> Decimal:
    """A Kubernetes quantity (``9``, ``"36Gi"``, ``"300m"``, ``1e3``) as an exact Decimal in base
    units; QueueImportError naming ``where`` for anything else or a negative one."""
    if isinstance(value, bool) or value is None:
        raise QueueImportError(where, f"expected a quantity such as 8, 500m or 64Gi, got {shown(value)}")
    if isinstance(value, int):
        amount = Decimal(value)
    elif isinstance(value, float):
        amount = Decimal(repr(value))
    elif isinstance(value, str):
        m = _QUANTITY.match(value)
        e = _EXPONENT.match(value)
        if m:
            suffix = m.group(2) or ""
            amount = Decimal(m.group(1)) / 1000 if suffix == "m" else Decimal(m.group(1)) * _SUFFIX[suffix]
        elif e:
            amount = Decimal(e.group(1)).scaleb(int(e.group(2)))
        else:
            raise QueueImportError(where, f"expected a quantity such as 8, 500m or 64Gi, got {shown(value)}")
    else:
        raise QueueImportError(where, f"expected a quantity such as 8, 500m or 64Gi, got {shown(value)}")
    if not amount.is_finite() or amount < 0:
        raise QueueImportError(where, f"expected a non-negative quantity, got {shown(value)}")
    return amount


def gpus(amount: Decimal) -> int:
    """A GPU amount as the queue file takes it: whole GPUs (a fraction is rounded down: the caller
    reports it)."""
    return int(amount.to_integral_value(rounding=ROUND_FLOOR))


def cpu_text(cores: Decimal) -> int | str:
    """Cores as the queue file writes them: ``8``, or ``"1500m"`` (rounded down to a millicore)."""
    milli = int((cores * 1000).to_integral_value(rounding=ROUND_FLOOR))
    return milli // 1000 if milli % 1000 == 0 else f"{milli}m"


def memory_text(amount: Decimal) -> int | str:
    """Bytes as the queue file writes them, in the unit that writes them shortest and exactly
    (``"36Gi"``, ``"500G"``), else as an integer number of bytes."""
    total = int(amount.to_integral_value(rounding=ROUND_FLOOR))
    texts = [f"{total // _SUFFIX[s]}{s}" for s in ("Ei", "Pi", "Ti", "Gi", "Mi", "Ki", "E", "P", "T", "G", "M", "k")
             if total and total % _SUFFIX[s] == 0]
    return min(texts, key=len) if texts else total


def decimal_text(value: Decimal) -> int | float:
    """A weight as the queue file writes it: an int when whole."""
    return int(value) if value == value.to_integral_value() else float(value)


# -- queue names --------------------------------------------------------------------------------
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
_BAD = re.compile(r"[^A-Za-z0-9_-]")


class Names:
    """The gpuq name of each source name below one parent: the name itself where gpuq takes it, else
    with every other character made ``_`` (and a ``-2``, ``-3``... where two would be the same)."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def name(self, source: str) -> str:
        base = source if _NAME.match(source) else _BAD.sub("_", source)
        if not base or base[0] == "-":
            base = "_" + base
        name, n = base, 1
        while name in self._taken:
            n += 1
            name = f"{base}-{n}"
        self._taken.add(name)
        return name


def queue_at(queues: dict[str, Any], path: str) -> dict[str, Any]:
    """The queue file's mapping of the queue at a dotted path (``a.b``) of a ``queues:`` tree."""
    parts = path.split(".")
    spec: dict[str, Any] = queues[parts[0]]
    for p in parts[1:]:
        spec = spec["queues"][p]
    return spec


# -- the queue file's text ----------------------------------------------------------------------
def _flow(value: Any) -> str:
    import yaml

    text: str = yaml.safe_dump(value, default_flow_style=True, width=10**9, sort_keys=False)
    return text.removesuffix("\n...\n").strip()


def render_yaml(imported: Imported) -> str:
    """The queue file: ``imported.data`` with a comment on each queue saying where it came from, and
    the findings at the end as comments. It loads back to ``imported.data`` exactly."""
    lines = ["# gpuq queue file written by gpuq import-queues (docs/KUEUE.md, docs/YUNIKORN.md).",
             "# Each queue says where it came from; what was not carried over exactly is listed at the end."]
    data = imported.data
    for key, value in data.items():
        if key == "queues":
            continue
        if isinstance(value, Mapping) and value:
            lines.append(f"{_flow(key)}:")
            for k, v in value.items():
                lines.append(f"  {_flow(k)}: {_flow(v)}")
        else:
            lines.append(f"{_flow(key)}: {_flow(value)}")
    queues = data.get("queues") or {}
    lines.append("queues:" if queues else "queues: {}")
    _queues(queues, "", 1, imported.origins, lines)
    if imported.findings:
        lines.append("")
        lines.append(f"# Not carried over exactly ({len(imported.findings)}):")
        lines += [f"# - {' '.join(f.line().split())}" for f in imported.findings]
    return "\n".join(lines) + "\n"


def _queues(queues: Mapping[str, Any], prefix: str, depth: int, origins: Mapping[str, str], lines: list[str]) -> None:
    pad = "  " * depth
    for name, spec in queues.items():
        path = f"{prefix}{name}"
        origin = origins.get(path, "")
        note = f"  # {' '.join(origin.split())}" if origin else ""
        spec = spec or {}
        body = {k: v for k, v in spec.items() if k != "queues"}
        kids = spec.get("queues") or {}
        if not body and not kids:
            lines.append(f"{pad}{_flow(name)}: {{}}{note}")
            continue
        lines.append(f"{pad}{_flow(name)}:{note}")
        for k, v in body.items():
            lines.append(f"{pad}  {_flow(k)}: {_flow(v)}")
        if kids:
            lines.append(f"{pad}  queues:")
            _queues(kids, f"{path}.", depth + 2, origins, lines)
