"""Scheduler events: one shape for the simulator's ``events.jsonl`` and the ``scheduler_events``
table, so the same tools read both.

An event is a dict with FORMAT.md's keys, in this order: ``t``, ``event``, ``workload``,
``queue``, then ``gpu_type`` and ``placement`` (``admit``) or ``by``, ``reason`` and
``lost_gpu_seconds`` (``preempt``, issue 21: the work it threw away; ``reason`` also on ``reject`` and
``cancel``). :func:`event` builds one (the simulator and the live
service both call it). In the table a row adds ``ts`` (wall time), ``cluster``, ``seq`` (order
among events at the same ``t``) and ``spec`` (the submitted workload and its target as JSON, on
``submit`` rows only, so a restarted service can rebuild its queue, a declared
``expected_duration_s`` included; empty elsewhere), and since issue 19 ``placement_milli`` (every
admit's GPUs per node in milli-GPUs: what readers read) and ``shares`` (a gang of shares' device
slots as JSON; such a gang leaves the whole-GPU ``placement`` empty), since issue 21
``lost_gpu_seconds`` (a preempt's cost; 0 elsewhere):

    ts DateTime64(3,'UTC'), cluster, t Float64, seq UInt64, event, workload, queue, gpu_type,
    placement Map(String, UInt32), by, reason, spec, placement_milli Map(String, UInt32), shares,
    lost_gpu_seconds Float64
"""
from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.actuators.base import Target
from accounting.model import as_gpus
from scheduler.model import Workload, gpus_in, gpus_out

TABLE = "scheduler_events"
KINDS = ("submit", "admit", "preempt", "finish", "reject", "cancel")
COLUMNS = ("ts", "cluster", "t", "seq", "event", "workload", "queue", "gpu_type", "placement", "by",
           "reason", "spec", "placement_milli", "shares", "lost_gpu_seconds")


def round_t(x: float) -> float:
    """A clock value as events carry it: rounded to microseconds, never -0.0."""
    return round(x, 6) + 0.0


def without_devices(jsonl: str) -> str:
    """``events.jsonl`` less each admit's ``devices`` (issue 19 added it, as the last key) and each
    preempt's ``lost_gpu_seconds`` (issue 21, likewise the last key): the events as the code before
    wrote them, for comparing decisions across versions."""
    out = []
    for line in jsonl.splitlines(keepends=True):
        at = line.find(', "devices": ')
        if at < 0:
            at = line.find(', "lost_gpu_seconds": ')
        out.append(line if at < 0 else line[:at] + "}" + line[len(line.rstrip("\n")):])
    return "".join(out)


def event(t: float, kind: str, workload: str, queue: str, **extra: Any) -> dict[str, Any]:
    """An event dict in FORMAT.md's key order; ``t`` rounded to microseconds."""
    return {"t": round_t(t), "event": kind, "workload": workload, "queue": queue, **extra}


def to_row(ev: Mapping[str, Any], seq: int, cluster: str, spec: str = "",
           epoch_s: float = 0.0) -> tuple[Any, ...]:
    """A table row (:data:`COLUMNS` order). ``ts`` is ``epoch_s + t``: the live service's clock is
    Unix time (``epoch_s`` 0); a replayed scenario gives the instant its clock starts."""
    ts = dt.datetime.fromtimestamp(epoch_s + float(ev["t"]), dt.UTC)
    given = ev.get("placement") or {}
    shares = ev.get("shares")
    # a gang of shares (issue 19) leaves the whole-GPU column empty; placement_milli holds every
    # admit exactly, and shares its device slots
    devices = ev.get("devices") or {}
    of_shares = bool(shares) or any(float(v) != int(v) for v in given.values()) or any(
        x != 1 for on in devices.values() for x in on.values())
    placement = {} if of_shares else {str(k): int(v) for k, v in given.items()}
    milli = {str(k): round(float(v) * 1000) for k, v in given.items()}
    return (ts, cluster, float(ev["t"]), int(seq), str(ev["event"]), str(ev["workload"]),
            str(ev["queue"]), str(ev.get("gpu_type", "")), placement, str(ev.get("by", "")),
            str(ev.get("reason", "")), spec, milli,
            json.dumps(shares, separators=(",", ":")) if shares else "", float(ev.get("lost_gpu_seconds", 0.0)))


def from_row(row: Sequence[Any], placement_milli: Mapping[str, int] | None = None, shares: str = "",
             lost_gpu_seconds: float = 0.0) -> dict[str, Any]:
    """The event dict of a row (``COLUMNS[2:11]`` order: t, seq, event, ..., reason): FORMAT.md's
    keys only, optional ones only where set. ``placement_milli`` and ``shares`` (their columns,
    issue 19) give a gang of shares its placement and slots; without them, whole GPUs. A
    ``preempt`` carries ``lost_gpu_seconds`` (its column, issue 21; 0 in rows from before it)."""
    t, _seq, kind, wid, queue, gpu_type, placement, by, reason = row[:9]
    extra: dict[str, Any] = {}
    if kind == "admit":
        if placement_milli:
            got = {str(k): as_gpus(int(v)) for k, v in dict(placement_milli).items()}
        else:
            got = {str(k): int(v) for k, v in dict(placement).items()}
        extra = {"gpu_type": str(gpu_type), "placement": got}
        if shares:
            extra["shares"] = json.loads(shares)
    if by:
        extra["by"] = str(by)
    if reason:
        extra["reason"] = str(reason)
    if kind == "preempt":
        extra["lost_gpu_seconds"] = float(lost_gpu_seconds)
    return event(float(t), str(kind), str(wid), str(queue), **extra)


@dataclass(frozen=True, slots=True)
class StoredEvent:
    seq: int
    event: dict[str, Any]
    spec: str


def read_events(store: Any, cluster: str) -> list[StoredEvent]:
    """A cluster's events in the order they took effect ``(t, seq)``."""
    sql = (f"SELECT t, seq, event, workload, queue, gpu_type, placement, by, reason, spec, placement_milli, shares, "
           f"lost_gpu_seconds FROM {store.database}.{TABLE} WHERE cluster = {{c:String}} ORDER BY t, seq")
    return [StoredEvent(int(r[1]), from_row(r, r[10], str(r[11]), float(r[12])), str(r[9]))
            for r in store.query(sql, {"c": cluster}).rows]


# -- the workload spec carried by submit rows ------------------------------------------------------
_W_FIELDS = ("id", "queue", "pods", "gpus_per_pod", "priority", "preemptible", "submit_s", "duration_s",
             "checkpoint", "originator", "cpu_millicores_per_pod", "memory_per_pod_bytes")
_T_FIELDS = ("kind", "namespace", "name", "api_version", "entrypoint")


def spec_json(w: Workload, target: Target) -> str:
    """The spec a ``submit`` row carries; ``expected_duration_s`` only where declared (the specs
    stored before it existed read back the same)."""
    data: dict[str, Any] = {f: getattr(w, f) for f in _W_FIELDS}
    data["gpus_per_pod"] = gpus_out(w.gpus_per_pod)        # a share as a decimal number (issue 19)
    data["gpu_types"] = list(w.gpu_types)
    if w.expected_duration_s is not None:
        data["expected_duration_s"] = w.expected_duration_s
    t: dict[str, Any] = {f: getattr(target, f) for f in _T_FIELDS}
    t["runtime_env"] = dict(target.runtime_env)
    t["metadata"] = dict(target.metadata)
    data["target"] = t
    return json.dumps(data, separators=(",", ":"), sort_keys=True)


def parse_spec(text: str) -> tuple[Workload, Target]:
    data = json.loads(text)
    t = data.pop("target", {}) or {}
    types = tuple(data.pop("gpu_types", ()) or ())
    expected = data.pop("expected_duration_s", None)
    if "gpus_per_pod" in data:
        data["gpus_per_pod"] = gpus_in(data["gpus_per_pod"])
    w = Workload(**{k: v for k, v in data.items() if k in _W_FIELDS}, gpu_types=types,
                 expected_duration_s=None if expected is None else float(expected))
    target = Target(**{k: t[k] for k in (*_T_FIELDS, "runtime_env", "metadata") if k in t})
    return w, target

