"""``gpuq usage`` and ``gpuq queues``: the lead's CLI calls these with the arguments after the
command and the loaded settings. Both print a table, CSV, or with ``--format json`` a JSON array of
row objects; they return 0, 1 (the store failed) or 2 (bad arguments or queue file). ``gpuq``
itself asks the running ``gpuq serve`` instead when it answers (:mod:`gpuq.remote`), unless
``--local``.

    gpuq usage --from -7d --to now --by queue,gpu_type [--rollup] [--idle-source auto|raw|1m|1h]
    gpuq queues [--at TIME] [--show queues|capacity|nodes|types|starving]
"""
from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any, TextIO

from accounting.errors import AccountingError, QueueConfigError
from accounting.model import Window
from accounting.service import idle_params, load_config, now_view, usage_report
from accounting.timeparse import parse_time
from accounting.usage import BY_KEYS, check_by, counts_losses
from gpuq.errors import GpuqError
from gpuq.output import render

QUEUE_COLUMNS = ("queue", "gpu_type", "allocated", "guaranteed", "entitlement", "max", "pending", "fair_share",
                 "effective_max", "borrowed", "lent", "over_quota_share", "idle")
USAGE_VALUES = ("gpu_seconds", "gpu_hours", "idle_gpu_seconds", "idle_ratio", "cost", "idle_cost", "idle_method")
USAGE_EQ = ("eq_hours", "cost_per_eq_hour")        # where equivalents are set (accounting.usage)
USAGE_LOST = ("lost_gpu_hours",)    # GPU-hours preemptions threw away, by queue (accounting.usage.counts_losses)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise AccountingError(f"{self.prog}: {message}")


def _glue(argv: Sequence[str], flags: frozenset[str] = frozenset({"--from", "--to", "--at"})) -> list[str]:
    """``--from -7d`` as ``--from=-7d``: argparse would take ``-7d`` for an option."""
    out: list[str] = []
    it = iter(argv)
    for tok in it:
        if tok in flags:
            nxt = next(it, None)
            out.append(tok if nxt is None else f"{tok}={nxt}")
        else:
            out.append(tok)
    return out


def _common(prog: str, description: str = "") -> _Parser:
    p = _Parser(prog=prog, description=description or None)
    p.add_argument("--format", choices=["table", "json", "csv"], default="table",
                   help="an aligned table (default), a JSON array of rows, or CSV")
    p.add_argument("--local", action="store_true",
                   help="compute from the store even when gpuq serve answers at api.host:api.port (by default "
                   "its API answers, with the scheduler's live admissions and pending; gpuq.remote)")
    p.add_argument("--token", help="the API token when gpuq serve answers (default: the first of api.tokens)")
    return p


def _open(settings: Any) -> Any:
    from gpuq.store import open_store

    return open_store(settings.store.dsn, default_database=settings.store.database, retention=settings.store.retention,
                      cluster=settings.store.cluster)


def _run(body: Any, out: TextIO, err: TextIO) -> int:
    try:
        return int(body())
    except QueueConfigError as exc:
        err.write(f"error: queue file: {exc.located()}\n")
        return 2
    except (GpuqError, AccountingError) as exc:
        retry = getattr(exc, "retryable", False)
        err.write(f"error: {exc}\n")
        return 1 if retry or isinstance(exc, GpuqError) else 2
    except ValueError as exc:
        err.write(f"error: {exc}\n")
        return 2


def usage_main(argv: Sequence[str], settings: Any, *, now_s: float | None = None,
               out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr

    def body() -> int:
        p = _common("gpuq usage", "GPU-hours, idle GPU-hours and their cost over a period, per queue (or "
                    "per GPU type, namespace, workload, cluster). Idle: allocated GPUs whose utilization stayed "
                    "under the idle threshold. Grouped by queue (and cluster): lost_gpu_hours, the work "
                    "gpuq's preemptions threw away (since the workload's last checkpoint).")
        p.add_argument("--from", dest="start", metavar="TIME", default="-1d",
                       help="start: an ISO 8601 time, now, or back from now like -7d, -2h, -30m (default -1d)")
        p.add_argument("--to", dest="end", metavar="TIME", default="now", help="end, as --from (default now)")
        p.add_argument("--by", default="queue", help=f"group by, comma-separated: {','.join(BY_KEYS)} "
                       "(default queue)")
        p.add_argument("--rollup", action="store_true", help="add parent queues (sums of their subtree)")
        p.add_argument("--idle-source", choices=["auto", "raw", "1m", "1h"], default="auto",
                       help="which utilization samples decide idle: raw, the 1-minute or 1-hour rollups, or "
                       "auto (raw where kept, rollups before)")
        a = p.parse_args(_glue(argv))
        now = time.time() if now_s is None else now_s
        window = Window(parse_time(a.start, now), parse_time(a.end, now))
        by = check_by([k.strip() for k in a.by.split(",") if k.strip()])
        config = load_config(settings.queues_file)
        store = _open(settings)
        try:
            rows = usage_report(store, config, window, now, by, idle_params(settings),
                                rollup=a.rollup, idle_source=a.idle_source)
        finally:
            store.close()
        dicts = [r.as_dict() for r in rows]
        columns = (*by, *USAGE_VALUES, *(USAGE_EQ if any("eq_hours" in d for d in dicts) else ()),
                   *(USAGE_LOST if counts_losses(by) else ()))
        out.write(render(columns, [[d[c] for c in columns] for d in dicts], a.format))
        return 0

    return _run(body, out, err)


def queues_main(argv: Sequence[str], settings: Any, *, now_s: float | None = None,
                out: TextIO | None = None, err: TextIO | None = None) -> int:
    out, err = out or sys.stdout, err or sys.stderr

    def body() -> int:
        p = _common("gpuq queues", "Each queue at one moment: GPUs allocated, guaranteed and at most allowed, "
                    "waiting, fair share, borrowed from and lent to other queues, idle; or the capacity, "
                    "nodes, GPU types or starving queues at that moment.")
        p.add_argument("--at", metavar="TIME", default="now",
                       help="the moment: an ISO 8601 time, now, or back from now like -2h (default now)")
        p.add_argument("--show", choices=["queues", "capacity", "nodes", "types", "starving"], default="queues",
                       help="what to list (default queues)")
        a = p.parse_args(_glue(argv))
        now = time.time() if now_s is None else now_s
        at = parse_time(a.at, now)
        config = load_config(settings.queues_file)
        store = _open(settings)
        try:
            view = now_view(store, config, at, idle_params(settings), settings.accounting.starvation_s)
        finally:
            store.close()
        columns, rows = _table(view, a.show)
        out.write(render(columns, rows, a.format))
        return 0

    return _run(body, out, err)


def _table(view: Any, show: str) -> tuple[tuple[str, ...], list[list[Any]]]:
    cols: tuple[str, ...]
    if show == "queues":
        cols = QUEUE_COLUMNS
        if any(r.allocated_eq is not None for r in view.rows):    # equivalents set: beside the raw GPUs
            at = cols.index("max") + 1
            cols = (*cols[:at], "allocated_eq", "guaranteed_eq", "max_eq", *cols[at:])
        return cols, [[getattr(r, c) for c in cols] for r in view.rows]
    if show == "nodes":
        cols = ("cluster", "node", "gpu_type", "capacity", "allocated", "free", "schedulable", "overcommitted")
        return cols, [[getattr(n, c) for c in cols] for n in view.capacity.nodes]
    if show == "capacity":
        cols = ("gpu_type", "capacity", "allocated", "free", "fragmented_free", "fragmentation_ratio",
                "fits_1", "fits_2", "fits_4", "fits_8")
        return cols, [[t.gpu_type, t.capacity, t.allocated, t.free, t.fragmented_free, t.fragmentation_ratio,
                       *[t.fits.get(k, 0) for k in (1, 2, 4, 8)]] for t in (*view.capacity.types, view.capacity.total)]
    if show == "types":
        cols = ("gpu_type", "queue", "capacity", "allocated", "idle", "free")
        return cols, [[getattr(d, c) for c in cols] for d in view.distribution]
    cols = ("queue", "allocated", "guaranteed", "pending", "waiting_s")
    return cols, [[getattr(s, c) for c in cols] for s in view.starving]
