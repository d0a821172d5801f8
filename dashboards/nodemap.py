"""The node-by-GPU map's geometry (the idle page draws it): one row per node and GPU type of
``/accounting/capacity``, one cell per GPU, a MIG slice a sub-cell of a GPU's cell, and each cell
filled by what holds it: busy, idle, free or unavailable, in proportion (a GPU a quarter of which
is held is a quarter filled).

Where shares sit
    The accounting gives each node's amounts (``allocated`` 1.25, ``free`` 6.75), not which device
    holds which share. gpuq's own gangs of shares are the exception: the scheduler's placements say
    which device each share is on (``/nodes``' ``devices``: device slot -> share in use; a slot is
    one device for as long as shares hold it, not its index on the node), so such a device is
    drawn as a cell of its own filled to its share (``placed`` "device"). The rest of a node's
    allocation (shares of Ray tasks, KAI fractions, time-sliced pods: no placement of gpuq's) is
    laid out by estimate (:func:`layout`, ``placed`` "estimate"): whole busy and idle GPUs first,
    then what is left of them, the shares, as one partly filled cell, then free and unavailable:
    the tightest packing (the scheduler and Ray pack shares best fit too, but such shares may in
    fact sit on more devices than drawn). Where the placements claim more than the accounting
    holds (one of them is behind), the whole node is estimated. The page marks every estimated
    partly filled cell (≈) and its caption says so.

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
from collections.abc import Iterable, Mapping, Sequence
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


def _units(by_state: Mapping[str, float], count: int, known: Sequence[float]) -> list[list[tuple[str, float, str]]]:
    """Each unit's (cell's or slice's) segments as (state, length in units, placed), in order.

    Without ``known`` the node's amounts are laid out end to end (:func:`layout`), the shares'
    segments ``placed`` "estimate". With ``known`` (the share in use of each device that gpuq's
    placements name, :func:`known_devices`) those devices are cells of their own filled to their
    share ("device"), and only the rest of the allocation is laid out by estimate; the idle GPUs go
    to that rest first (whole idle GPUs stay whole cells). The free and unavailable amounts then
    fill what the partly held cells leave, then whole cells."""
    alloc = by_state["busy"] + by_state["idle"]
    rest = alloc - sum(known)
    if known and (rest < -_EPS or math.ceil(max(rest, 0.0) - _EPS) + len(known) > count):
        known = ()                  # the accounting and the placements disagree (one is behind): estimate
        rest = alloc
    rest = max(rest, 0.0)
    idle_rest = min(by_state["idle"], rest)
    units: list[list[tuple[str, float, str]]] = []
    pos = 0.0                       # where the estimated rest is laid, end to end
    for state, length in layout({"busy": rest - idle_rest, "idle": idle_rest, "free": 0.0, "unavailable": 0.0}):
        end = pos + length
        while end - pos > _EPS:
            u = int(pos + _EPS)
            piece = min(end, u + 1) - pos
            while len(units) <= u:
                units.append([])
            units[u].append((state, piece, "estimate"))
            pos += piece
    left = {"busy": sum(known) - (by_state["idle"] - idle_rest), "idle": by_state["idle"] - idle_rest}
    for share in known:
        cell: list[tuple[str, float, str]] = []
        need = share
        for state in ("busy", "idle"):
            take = min(need, max(0.0, left[state]))
            if take > _EPS:
                cell.append((state, take, "device"))
                left[state] -= take
                need -= take
        units.append(cell)
    pour = [("free", by_state["free"]), ("unavailable", by_state["unavailable"])]
    partly = [u for u in units if 1 - sum(x[1] for x in u) > _EPS]      # the partly held cells, in order
    first_whole = len(units)
    units += [[] for _ in range(count - len(units))]
    for target in [*partly, *units[first_whole:]]:
        for i, (state, amount) in enumerate(pour):
            room = 1 - sum(x[1] for x in target)
            take = min(room, amount)
            if take > _EPS:
                target.append((state, take, ""))
                pour[i] = (state, amount - take)
    return units[:count]


def known_devices(nodes: Iterable[Mapping[str, Any]], placed: Iterable[Mapping[str, Any]]
                  ) -> dict[tuple[str, str], list[float]]:
    """(cluster, node) -> the share in use of each device that gpuq's gangs of shares hold part of
    there (``/nodes``' ``devices``: device slot -> share, the scheduler's placements), in slot
    order. A scheduler node is named as the capacity's node, or ``cluster/node`` with several
    clusters."""
    by_name = {str(p["name"]): p.get("devices") or {} for p in placed}
    out: dict[tuple[str, str], list[float]] = {}
    for n in nodes:
        devices = by_name.get(f"{n['cluster']}/{n['node']}") or by_name.get(str(n["node"])) or {}
        shares = [float(v) for _, v in sorted(devices.items(), key=lambda kv: int(kv[0])) if 0 < float(v)]
        if shares:
            out[(str(n["cluster"]), str(n["node"]))] = shares
    return out


def cells(nodes: Iterable[Mapping[str, Any]], idle_on: Mapping[tuple[str, str], float],
          known: Mapping[tuple[str, str], Sequence[float]] | None = None,
          ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The map's rectangles: ``segments`` (``node``, ``x``, ``x2`` in GPU cells from 0, ``state``,
    ``cell``: the GPU's index, ``unit``: "GPU 3" or "slice 5 (1g.10gb)", ``share``: how much of
    that GPU or slice is in this state, ``placed``: "device" where gpuq's placement names the device
    a share is on, "estimate" where the share's device is laid out by estimate, "" otherwise) and
    ``outlines`` (``node``, ``x``, ``x2``, ``kind``: each GPU's cell, each slice's sub-cell) to draw
    over them. ``known``: :func:`known_devices` (GPU rows only)."""
    segments: list[dict[str, Any]] = []
    outlines: list[dict[str, Any]] = []
    for n in nodes:
        label, unit = row_label(n), unit_of(str(n["gpu_type"]))
        by_state = amounts(n, idle_on.get((n["cluster"], n["node"]), 0.0))
        count = math.ceil(sum(by_state.values()) - _EPS)
        shares = (known or {}).get((n["cluster"], n["node"]), ()) if unit.kind == "GPU" else ()
        units = _units(by_state, count, shares)
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
            for state, length, placed in units[u] if u < len(units) else ():
                if length > _EPS:
                    share = round(length, 3)
                    segments.append({"node": label, "x": x0 + start * unit.width,
                                     "x2": x0 + (start + length) * unit.width, "state": state, "cell": cell,
                                     "unit": name, "share": share,
                                     "placed": placed if state in ("busy", "idle") and share < 1
                                     and unit.kind == "GPU" else ""})
                start += length
    return segments, outlines


def partial(segments: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The segments that fill part of their GPU or slice (the shares drawn as partly filled cells)."""
    return [s for s in segments if s["state"] in ("busy", "idle") and s["share"] < 1]
