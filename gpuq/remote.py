"""When another process holds the embedded store.

chDB lets one process open a data directory (ClickHouse locks ``<path>/status``). While
``gpuq serve`` runs on ``chdb://PATH``, ``gpuq queues`` and ``gpuq usage`` from another shell ask
its API instead (``api.host``/``api.port``, the first configured token), and every other command
gets an error that says so, rather than the engine's "Error initializing EmbeddedServer".
"""
from __future__ import annotations

import argparse
import errno
import fcntl
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpuq.errors import StoreUnavailable
from gpuq.output import render
from gpuq.settings import Settings
from gpuq.store.client import parse_dsn


def locked_chdb_path(settings: Settings) -> str | None:
    """The chDB data directory when another process holds it, else None."""
    try:
        dsn = parse_dsn(settings.store.dsn, settings.store.database)
    except Exception:  # noqa: BLE001 - a bad DSN is reported by the command itself
        return None
    status = Path(dsn.target) / "status"
    if dsn.kind != "chdb" or not status.exists():
        return None
    fd = os.open(status, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return dsn.target
        raise
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
    return None


def locked_error(path: str) -> StoreUnavailable:
    return StoreUnavailable(
        f"{path}: the embedded store is open in another process (chDB allows one process per data "
        f"directory): ask that process through its API (`gpuq queues`, `gpuq usage`, `gpuq workloads` "
        f"do this while `gpuq serve` runs), stop it, or use a ClickHouse server (store.dsn: http://...)")


def _api_get(settings: Settings, path: str, params: dict[str, str], token: str | None) -> Any:
    import httpx

    token = token or (settings.api.tokens[0].token if settings.api.tokens else None)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"http://{settings.api.host}:{settings.api.port}{path}"
    try:
        resp = httpx.get(url, params=params, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise StoreUnavailable(f"{url}: the store is held by another process and its API does not "
                               f"answer ({exc})") from exc
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text[:300]
        raise StoreUnavailable(f"{url}: HTTP {resp.status_code}: {detail}")
    return resp.json()


def remote_view(command: str, argv: Sequence[str], settings: Settings) -> int:
    """``gpuq queues`` / ``gpuq usage`` answered by a running ``gpuq serve``."""
    p = argparse.ArgumentParser(prog=f"gpuq {command}")
    p.add_argument("--format", "-f", choices=["table", "json", "csv"], default="table")
    p.add_argument("--token")
    if command == "usage":
        p.add_argument("--from", dest="start", default="-1d")
        p.add_argument("--to", dest="end", default="now")
        p.add_argument("--by", default="queue")
        p.add_argument("--rollup", action="store_true")
    args: list[str] = []
    rest = list(argv)
    while rest:                      # "--from -7d": a value starting with "-" would read as an option
        arg = rest.pop(0)
        args.append(f"{arg}={rest.pop(0)}" if arg in ("--from", "--to") and rest else arg)
    a, unknown = p.parse_known_args(args)
    if unknown:
        print(f"gpuq {command}: {' '.join(unknown)}: not available through the API of the process "
              f"holding the store", file=sys.stderr)
        return 2
    if command == "queues":
        rows = _api_get(settings, "/queues", {}, a.token)
        columns = ["queue", "gpu_type", "allocated", "guaranteed", "max", "pending", "fair_share",
                   "borrowed", "lent", "idle"]
    else:
        params = {"from": a.start, "to": a.end, "by": a.by, "rollup": str(a.rollup).lower()}
        rows = _api_get(settings, "/accounting/usage", params, a.token)
        columns = list(rows[0]) if rows else [*a.by.split(","), "gpu_seconds", "idle_gpu_seconds", "cost"]
    if a.format == "json":
        sys.stdout.write(render(list(rows[0]) if rows else columns, [list(r.values()) for r in rows], "json"))
    else:
        sys.stdout.write(render(columns, [[r.get(c) for c in columns] for r in rows], a.format))
    return 0
