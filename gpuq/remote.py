"""``gpuq queues`` and ``gpuq usage`` ask the running ``gpuq serve``; the store when none answers.

:func:`accounting_command`: when the API at ``api.host``/``api.port`` answers ``GET /healthz``
within :data:`HEALTH_TIMEOUT_S` (and is not a standby), both commands print what the API serves
(``/queues``, ``/accounting/usage``; the first configured token, or ``--token``): the scheduler's
live admissions and pending, which the store alone lacks. Otherwise, or with ``--local``, or with
an option the API does not take (``--at``, ``--show``, ``--idle-source``), they compute from the
store as before.

chDB lets one process open a data directory (ClickHouse locks ``<path>/status``). While
``gpuq serve`` runs on ``chdb://PATH``, ``queues`` and ``usage`` ask its API whatever it answers,
and every other command (and ``--local``) gets an error that says so, rather than the engine's
"Error initializing EmbeddedServer".
"""
from __future__ import annotations

import argparse
import errno
import fcntl
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gpuq.errors import StoreUnavailable
from gpuq.output import render
from gpuq.settings import Settings
from gpuq.store.client import parse_dsn

HEALTH_TIMEOUT_S = 0.5


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


def api_base(settings: Settings) -> str:
    """Where this config's ``gpuq serve`` answers: ``api.host`` (a wildcard address as loopback)
    and ``api.port``."""
    host = settings.api.host
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.api.port}"


def serve_answers(settings: Settings, timeout_s: float = HEALTH_TIMEOUT_S) -> bool:
    """True when a ``gpuq serve`` that schedules (not a standby replica) answers ``GET /healthz``
    at :func:`api_base` within ``timeout_s``."""
    import httpx

    if not settings.api.port:
        return False
    try:
        resp = httpx.get(f"{api_base(settings)}/healthz", timeout=timeout_s)
        body = resp.json()
    except (httpx.HTTPError, ValueError):
        return False
    return resp.status_code == 200 and isinstance(body, dict) and body.get("status") == "ok" \
        and body.get("role") != "standby"


def open_unlocked_store(settings: Settings) -> Any:
    """The configured store, opened by this process; a clear error when a running ``gpuq serve``
    holds it (an embedded chDB path opens in one process only)."""
    from gpuq.store import open_store

    held = locked_chdb_path(settings)
    if held:
        raise locked_error(held)
    return open_store(settings.store.dsn, default_database=settings.store.database,
                      retention=settings.store.retention, cluster=settings.store.cluster)


def accounting_command(command: str, argv: Sequence[str], settings: Settings,
                       local: Callable[[list[str]], int]) -> int:
    """``gpuq queues`` / ``gpuq usage``: from the running ``gpuq serve`` when it answers (or holds
    the chDB store), else ``local(argv)`` (the store). ``--local`` forces the store; ``--help``
    is the local command's."""
    rest = list(argv)
    held = locked_chdb_path(settings)
    if "--local" in rest:
        if held:
            raise locked_error(held)
        return local(rest)
    if any(a in ("-h", "--help") for a in rest):
        return local(rest)
    parsed, unknown = _parse(command, rest)
    if held:
        return remote_view(command, rest, settings)
    if not unknown and serve_answers(settings):
        return _show(command, parsed, settings)
    return local(rest)


def _api_get(settings: Settings, path: str, params: dict[str, str], token: str | None) -> Any:
    import httpx

    token = token or (settings.api.tokens[0].token if settings.api.tokens else None)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    url = f"{api_base(settings)}{path}"
    try:
        resp = httpx.get(url, params=params, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise StoreUnavailable(f"{url}: gpuq serve's API does not answer ({exc}); --local reads the store "
                               f"when no other process holds it") from exc
    if resp.status_code >= 400:
        try:
            detail = resp.json().get("detail", resp.text)
        except ValueError:
            detail = resp.text[:300]
        hint = " (--token TOKEN, or --local to read the store)" if resp.status_code in (401, 403) else ""
        raise StoreUnavailable(f"{url}: HTTP {resp.status_code}: {detail}{hint}")
    return resp.json()


QUEUE_PAGE = 10_000          # GET /queues' largest page, in queues (each with its rows per GPU type)


def _all_queues(settings: Settings, token: str | None) -> list[dict[str, Any]]:
    """Every row of ``GET /queues``, a page of queues at a time."""
    rows: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = _api_get(settings, "/queues", {"limit": str(QUEUE_PAGE), "offset": str(offset)}, token)
        rows += page
        if len({r["queue"] for r in page}) < QUEUE_PAGE:
            return rows
        offset += QUEUE_PAGE


def _parse(command: str, argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options the API takes; the rest come back as unknown."""
    p = argparse.ArgumentParser(prog=f"gpuq {command}", add_help=False)
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
    return p.parse_known_args(args)


def remote_view(command: str, argv: Sequence[str], settings: Settings) -> int:
    """``gpuq queues`` / ``gpuq usage`` answered by a running ``gpuq serve``."""
    a, unknown = _parse(command, argv)
    if unknown:
        print(f"gpuq {command}: {' '.join(unknown)}: not available through the API of gpuq serve, which "
              f"holds the store", file=sys.stderr)
        return 2
    return _show(command, a, settings)


def _show(command: str, a: argparse.Namespace, settings: Settings) -> int:
    from accounting.cli import QUEUE_COLUMNS

    if command == "queues":
        rows = _all_queues(settings, a.token)
        columns = [c for c in QUEUE_COLUMNS if not rows or c in rows[0]]
    else:
        params = {"from": a.start, "to": a.end, "by": a.by, "rollup": str(a.rollup).lower()}
        rows = _api_get(settings, "/accounting/usage", params, a.token)
        columns = list(rows[0]) if rows else [*a.by.split(","), "gpu_seconds", "idle_gpu_seconds", "cost"]
    if a.format == "json":
        sys.stdout.write(render(list(rows[0]) if rows else columns, [list(r.values()) for r in rows], "json"))
    else:
        sys.stdout.write(render(columns, [[r.get(c) for c in columns] for r in rows], a.format))
    return 0
