"""Ledger rows from Ray placement groups: ``gpu_allocations`` with ``source='placement_group'``.

One allocation per placement group per node that holds GPU bundles of it:

* ``pod`` = the group's name, ``uid`` = ``<placement group id>/<node>``, ``namespace`` and
  ``queue`` '' (the accounting resolves the queue through the workload), ``node`` =
  :func:`gpuq.ray_names.ray_node_name` of the bundles' node, ``gpu_model`` = the node's
  ``accelerator_type:<T>`` resource (the first, if several), ``gpu_resource`` ``GPU``, ``gpus`` =
  the GPUs of the group's bundles on that node, ``workload_id`` = the gpuq id of a group named
  ``gpuq-<id>`` (:func:`gpuq.ray_names.workload_of_placement_group`), else ''.
* ``start``: the State API's ``stats.creation_request_received_ns`` when given, else the time the
  group was first seen placed. ``end``: the time it was first seen ``REMOVED``, or the time it was
  missing from a complete list (Ray forgets removed groups after a while).
* ``version`` as in :mod:`collector.k8s_alloc`: ``ms(start)*10+1`` open, ``ms(end)*10+2`` removed,
  ``ms(end)*10+3`` gone from the list; an end outranks its start.

:class:`PlacementGroupLedger` keeps the open allocations of one cluster between rounds (the
scrape targets themselves are rebuilt every round) and emits a row only when something changed.
After a restart it starts from the open ``placement_group`` rows in the store
(``open_allocations``, the loader the Kubernetes watcher uses), so a group removed meanwhile is
closed at the first complete list.
"""
from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from collector.k8s_alloc import CLOSED_BY_RELIST, ENDED, OPEN, Allocation, version_of
from gpuq.ray_names import ray_node_name, workload_of_placement_group

SOURCE = "placement_group"
ACCEL_PREFIX = "accelerator_type:"
PLACED = frozenset({"CREATED", "RESCHEDULING"})
OpenAllocations = Callable[[str], Iterable["Allocation | Sequence[Any]"]]


def gpu_models(nodes: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """node id -> GPU type from ``resources_total`` (``accelerator_type:H100`` -> ``H100``)."""
    out = {}
    for n in nodes:
        types = sorted(k[len(ACCEL_PREFIX):] for k in (n.get("resources_total") or {})
                       if str(k).startswith(ACCEL_PREFIX))
        if n.get("node_id") and types:
            out[str(n["node_id"])] = types[0]
    return out


def _created(pg: Mapping[str, Any]) -> dt.datetime | None:
    ns = (pg.get("stats") or {}).get("creation_request_received_ns")
    try:
        value = int(ns)  # type: ignore[arg-type]  # a missing one raises TypeError, caught
    except (TypeError, ValueError):
        return None
    return dt.datetime.fromtimestamp(value / 1e9, dt.UTC) if value > 0 else None


def pg_allocations(pg: Mapping[str, Any], *, cluster: str, models: Mapping[str, str],
                   seen_at: dt.datetime) -> list[Allocation]:
    """The open allocations a placed group implies (pure); [] for one holding no GPU."""
    per_node: dict[str, float] = {}
    for b in pg.get("bundles") or []:
        gpus = (b.get("unit_resources") or {}).get("GPU", 0)
        if b.get("node_id") and isinstance(gpus, (int, float)) and gpus > 0:
            per_node[b["node_id"]] = per_node.get(b["node_id"], 0.0) + float(gpus)
    start = _created(pg) or seen_at
    name, pg_id = str(pg.get("name") or ""), str(pg.get("placement_group_id") or "")
    return [Allocation(cluster, "", name, f"{pg_id}/{ray_node_name(node)}", "", ray_node_name(node),
                       models.get(node, ""), "GPU", gpus, 0, "", start, None, version_of(start, OPEN),
                       SOURCE, workload_of_placement_group(name))
            for node, gpus in sorted(per_node.items())]


def close(alloc: Allocation, at: dt.datetime, order: int) -> Allocation:
    end = max(at, alloc.start)
    return replace(alloc, end=end, version=version_of(end, order))


class PlacementGroupLedger:
    """Open placement-group allocations of one cluster, across rounds. Thread-safe."""

    def __init__(self, cluster: str, open_allocations: OpenAllocations | None = None) -> None:
        self.cluster = cluster
        self._load = open_allocations
        self._open: dict[str, Allocation] | None = None          # uid -> open allocation
        self._models: dict[str, str] = {}
        self._lock = threading.Lock()

    def _loaded(self) -> dict[str, Allocation]:
        if self._open is None:
            got = self._load(self.cluster) if self._load is not None else []
            rows = [a if isinstance(a, Allocation) else Allocation.from_row(a) for a in got]
            self._open = {a.uid: a for a in rows if a.source == SOURCE and a.open}
        return self._open

    def round(self, pgs: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]] | None,
              now: dt.datetime, complete: bool = True) -> list[Allocation]:
        """This round's changes: new allocations, and ends. ``nodes`` None: the node list could not
        be read (the last models are used); ``complete`` False (a truncated or partial list):
        nothing is closed for missing from it."""
        with self._lock:
            open_ = self._loaded()
            if nodes is not None:
                self._models.update(gpu_models(nodes))
            out: list[Allocation] = []
            placed: set[str] = set()
            for pg in pgs:
                state = pg.get("state")
                if state in PLACED:
                    for a in pg_allocations(pg, cluster=self.cluster, models=self._models, seen_at=now):
                        placed.add(a.uid)
                        if a.uid not in open_:
                            open_[a.uid] = a
                            out.append(a)
                elif state == "REMOVED":
                    prefix = f"{pg.get('placement_group_id') or ''}/"
                    for uid in [u for u in open_ if u.startswith(prefix)]:
                        out.append(close(open_.pop(uid), now, ENDED))
            if complete:
                for uid in [u for u in open_ if u not in placed]:
                    out.append(close(open_.pop(uid), now, CLOSED_BY_RELIST))
            return out

    @property
    def open(self) -> list[Allocation]:
        with self._lock:
            return sorted(self._loaded().values(), key=lambda a: a.uid)
