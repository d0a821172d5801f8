"""The node-by-GPU map's geometry (the idle page draws it): one row per node and GPU type of
``/accounting/capacity``, one cell per GPU, a MIG slice a sub-cell of a GPU's cell, and each cell
filled by what holds it: busy, idle, free or unavailable, in proportion (a GPU a quarter of which
is held is a quarter filled).

Where shares sit
    The API gives each node's amounts (``allocated`` 1.25, ``free`` 6.75), not which device holds
    which share: neither the accounting (its rows are per allocation and node) nor the scheduler's
    ``/nodes`` (``used`` per node) says it. So the map lays a node's amounts out across its cells
    (:func:`layout`): whole busy and idle GPUs first, then what is left of them, the shares, as
    one partly filled cell, then free and unavailable: the tightest packing (the scheduler and Ray
    pack shares best fit too, but a node's shares may in fact sit on more devices than drawn). The
    page's caption says so; nothing here invents a split the data does not have.

MIG slices
    A ``<model>-MIG-<profile>`` row counts slices. A profile ``<N>g.<M>gb`` is ``N/S`` of its GPU,
    ``S`` the GPU's compute slices (7 on the A100 and H100, 4 on the A30: the table of
    :mod:`gpuq.gpu_share`, which the accounting bills slices by), so a slice is drawn ``N/S`` of a
    cell wide and ``floor(S/N)`` slices share a cell; which GPU holds which slice the API does not
    say either, so they are packed in order. A MIG type the queue file renamed to a name without
    ``-MIG-<profile>`` (case aside) cannot be told from a GPU and is drawn as whole cells.
"""
from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuq.gpu_share import mig_fraction

STATES = ("busy", "idle", "free", "unavailable")
_MIG = re.compile(r"^(?P<model>.*)-MIG-(?P<profile>\d+g\.\d+gb\S*?)(?:-SHARED)?$", re.IGNORECASE)
_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class Unit:
    """What one cell (or sub-cell) of a row stands for: a GPU, or a MIG slice ``width`` of a GPU."""

    kind: str           # "GPU" or "slice"
    width: float        # of a GPU's cell
    per_cell: int       # units that share one GPU's cell


def unit_of(gpu_type: str) -> Unit:
    """A GPU, or for ``<model>-MIG-<N>g.<M>gb`` a slice ``N/S`` of a GPU wide (a profile the
    table cannot read: a GPU)."""
    m = _MIG.match(gpu_type)
    if m is None:
        return Unit("GPU", 1.0, 1)
    try:
        share = mig_fraction(m.group("model"), m.group("profile").lower())
    except ValueError:
        return Unit("GPU", 1.0, 1)
    return Unit("slice", float(share), int(1 / share))


def amounts(node: Mapping[str, Any], idle: float) -> dict[str, float]:
    """A node row's units by state; they add up to its capacity. ``idle`` (the node's idle GPUs,
    ``/accounting/idle``) is capped at what is allocated, ``free`` at what is left."""
    cap = max(0.0, float(node["capacity"]))
    alloc = min(cap, max(0.0, float(node["allocated"])))
    i = min(alloc, max(0.0, float(idle)))
    free = min(cap - alloc, max(0.0, float(node["free"])))
    return {"busy": alloc - i, "idle": i, "free": free, "unavailable": max(0.0, cap - alloc - free)}


def layout(by_state: Mapping[str, float]) -> list[tuple[str, float]]:
    """The order a row's cells are filled in: the whole busy GPUs, the whole idle ones, then what
    is left of each (the shares: one partly filled cell, two where they add up to more than one
    GPU), then free and unavailable. So a node holding 2 idle GPUs and a busy share of 0.75 is two
    idle cells and a cell three quarters busy, not a share spread over three cells."""
    busy, idle = by_state["busy"], by_state["idle"]
    whole_busy, whole_idle = math.floor(busy + _EPS), math.floor(idle + _EPS)
    return [("busy", whole_busy), ("idle", whole_idle), ("busy", max(0.0, busy - whole_busy)),
            ("idle", max(0.0, idle - whole_idle)), ("free", by_state["free"]),
            ("unavailable", by_state["unavailable"])]


def row_label(node: Mapping[str, Any]) -> str:
    return f"{node['node']} ({node['gpu_type']})"


def cells(nodes: Iterable[Mapping[str, Any]], idle_on: Mapping[tuple[str, str], float]
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The map's rectangles: ``segments`` (``node``, ``x``, ``x2`` in GPU cells from 0, ``state``,
    ``cell``: the GPU's index, ``unit``: "GPU 3" or "slice 5 (1g.10gb)", ``share``: how much of
    that GPU or slice is in this state) and ``outlines`` (``node``, ``x``, ``x2``, ``kind``: each
    GPU's cell, each slice's sub-cell) to draw over them."""
    segments: list[dict[str, Any]] = []
    outlines: list[dict[str, Any]] = []
    for n in nodes:
        label, unit = row_label(n), unit_of(str(n["gpu_type"]))
        by_state = amounts(n, idle_on.get((n["cluster"], n["node"]), 0.0))
        count = math.ceil(sum(by_state.values()) - _EPS)
        line = layout(by_state)
        mig = _MIG.match(str(n["gpu_type"]))
        profile = mig.group("profile") if mig else ""
        for u in range(count):
            cell, j = divmod(u, unit.per_cell)
            x0 = cell + j * unit.width
            name = f"GPU {cell}" if unit.kind == "GPU" else f"slice {u} ({profile}) on GPU cell {cell}"
            if j == 0:
                outlines.append({"node": label, "x": float(cell), "x2": float(cell + 1), "kind": "GPU"})
            if unit.kind == "slice":
                outlines.append({"node": label, "x": x0, "x2": x0 + unit.width, "kind": "slice"})
            start = 0.0
            for state, length in line:
                end = start + length
                lo, hi = max(start, u), min(end, u + 1)
                if hi - lo > _EPS:
                    segments.append({"node": label, "x": x0 + (lo - u) * unit.width,
                                     "x2": x0 + (hi - u) * unit.width, "state": state, "cell": cell,
                                     "unit": name, "share": round(hi - lo, 3)})
                start = end
    return segments, outlines


def partial(segments: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The segments that fill part of their GPU or slice (the shares drawn as partly filled cells)."""
    return [s for s in segments if s["state"] in ("busy", "idle") and s["share"] < 1]
