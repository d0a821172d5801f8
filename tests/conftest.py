"""Shared fixtures.

chDB opens one data path per process at a time, so the whole test session shares one path and
each test that needs a store gets a database of its own on it (``store`` fixture).

Tests must not depend on today's date: chDB drops rows older than a table's TTL (at insert or the
next merge), so a test that inserts fixed-date rows passes today and fails once the date moves
on. The autouse ``expired_rows`` fixture watches every ``Store.insert`` and fails the test, naming
the table, when it inserted rows older than that table's retention in its store; a test that
does so on purpose says which tables with ``@pytest.mark.allow_expired_rows("table", ...)``.
``GPUQ_TEST_RETENTION_AUDIT_DAYS=N`` treats every retention as at most N days, to find tests whose
rows are fixed in time before they expire for real.

The live scheduler keeps its snapshot between cycles and brings it up to date from the entries it
touched (``scheduler/service/kept.py``); the autouse ``checked_snapshots`` fixture makes every
service in every test compare each snapshot with one built from all its entries, so a mutation
path that forgets to touch what it changes fails the test that takes it. A test that times the
service says so with ``@pytest.mark.unchecked_snapshots``.
"""
from __future__ import annotations

import datetime as dt
import itertools
import os
import re
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data"
SCENARIOS = REPO / "tests" / "scenarios"
_counter = itertools.count()


def data_path(*parts: str) -> Path:
    """A file or folder of the recorded test data in ``tests/data`` (each folder says its source
    and licence in SOURCES.md). Missing data fails the test: it is part of the repository."""
    p = DATA.joinpath(*parts)
    if not p.exists():
        pytest.fail(f"{p} is missing: the recorded test data is part of the repository (tests/data)")
    return p


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "allow_expired_rows(*tables): the test inserts rows older than "
                                       "those tables' retention on purpose (the expired-rows check skips them)")
    config.addinivalue_line("markers", "unchecked_snapshots: the test times the live scheduler; its kept "
                                       "snapshots are not compared with ones built from scratch")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """With ``make test``'s workers (pytest-xdist, ``--dist loadgroup``): a test module runs on one
    worker (its module fixtures start once), and every module with a test marked ``ray`` on the
    same worker, one after another, with one session Ray head: two Ray clusters starting at once
    on two busy cores missed Ray's startup timeouts in a full run. xdist's own hook reads the
    marks after this one (it runs last)."""
    ray_modules = {item.nodeid.split("::", 1)[0] for item in items if item.get_closest_marker("ray")}
    for item in items:
        module = item.nodeid.split("::", 1)[0]
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group("ray" if module in ray_modules else module))


@dataclass(frozen=True, slots=True)
class Expired:
    database: str
    table: str
    oldest: float                 # Unix seconds of the oldest row inserted
    days: int                     # the table's retention in that store


def _epoch(value: Any) -> float | None:
    if isinstance(value, dt.datetime):
        return (value if value.tzinfo else value.replace(tzinfo=dt.UTC)).timestamp()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, str):
        try:
            return _epoch(dt.datetime.fromisoformat(value.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


class ExpiredRows:
    """Rows a test inserted that are older than their table's retention (see the module doc)."""

    def __init__(self, audit_days: int | None = None) -> None:
        self.found: list[Expired] = []
        self.audit_days = audit_days

    def retention_days(self, store: Any, table: str) -> int | None:
        try:
            rows = store.query("SELECT engine_full FROM system.tables WHERE database = {d:String} AND name = {t:String}",
                               {"d": store.database, "t": table}).rows
        except Exception:  # noqa: BLE001 - a store the test broke on purpose: nothing to check
            return None
        m = re.search(r" TTL .*?toIntervalDay\((\d+)\)", rows[0][0]) if rows else None
        if m is None:
            return None
        days = int(m.group(1))
        return min(days, self.audit_days) if self.audit_days else days

    def check(self, store: Any, table: str, rows: Sequence[Sequence[Any]], columns: Sequence[str]) -> None:
        from gpuq.store.migrate import RETENTION

        if table not in RETENTION or not rows or RETENTION[table][1] not in columns:
            return
        i = list(columns).index(RETENTION[table][1])
        times = [t for t in (_epoch(r[i]) for r in rows) if t is not None]
        days = self.retention_days(store, table) if times else None
        if days is not None and min(times) < time.time() - days * 86_400:
            self.found.append(Expired(store.database, table, min(times), days))

    def message(self, found: Sequence[Expired]) -> str:
        return "; ".join(
            f"{e.database}.{e.table}: rows dated {dt.datetime.fromtimestamp(e.oldest, dt.UTC):%Y-%m-%d %H:%M:%S}Z are "
            f"older than its retention of {e.days} days (chDB drops them): use times relative to now, or "
            f"open the store with a retention long enough for the data" for e in found)


@pytest.fixture(autouse=True)
def expired_rows(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[ExpiredRows]:
    from gpuq.store.client import Store

    audit = os.environ.get("GPUQ_TEST_RETENTION_AUDIT_DAYS")
    rec = ExpiredRows(int(audit) if audit else None)
    insert = Store.insert

    def checked(self: Store, table: str, rows: Sequence[Sequence[Any]], columns: Sequence[str],
                dedup_token: str | None = None) -> int:
        rec.check(self, table, rows, columns)
        return insert(self, table, rows, columns, dedup_token)

    monkeypatch.setattr(Store, "insert", checked)
    yield rec
    marker = request.node.get_closest_marker("allow_expired_rows")
    allowed = set(marker.args) if marker else set()
    bad = [e for e in rec.found if e.table not in allowed]
    if bad:
        pytest.fail(f"{request.node.nodeid} inserted expired rows: {rec.message(bad)}", pytrace=False)


@pytest.fixture(autouse=True)
def checked_snapshots(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    from scheduler.service.core import SchedulerService

    if request.node.get_closest_marker("unchecked_snapshots") is None:
        monkeypatch.setattr(SchedulerService, "check_snapshots", True)


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture
def store_dsn(chdb_path: Path) -> str:
    return f"chdb://{chdb_path}?database=t{next(_counter)}"


@pytest.fixture
def store(store_dsn: str) -> Iterator["object"]:
    from gpuq.store import open_store

    s = open_store(store_dsn)
    try:
        yield s
    finally:
        s.command(f"DROP DATABASE IF EXISTS {s.database}")
        s.close()


@contextmanager
def store_before(store_dsn: str, version: int, **migrate_kw: Any) -> Iterator[Any]:
    """A store migrated up to (not including) migration ``version``, as an older gpuq left it; the
    test then runs the real migrations on it. Dropped afterwards."""
    import importlib

    from gpuq.store import connect
    mig = importlib.import_module("gpuq.store.migrate")     # the module (gpuq.store.migrate is also a function)
    s = connect(store_dsn)
    everything = mig.load_migrations
    try:
        mig.load_migrations = lambda: [x for x in everything() if x.version < version]
        try:
            mig.migrate(s, **migrate_kw)
        finally:
            mig.load_migrations = everything
        s.use_database()
        yield s
    finally:
        s.command(f"DROP DATABASE IF EXISTS {s.database}")
        s.close()


# For recorded data with fixed times (tests/data): everything kept 100 years, the longest retention
# accepted, so the data's dates stay inside it until 2126 whatever today's date.
LONG_RETENTION = {"raw_days": 36_500, "rollup_days": 36_500, "events_days": 36_500}


@pytest.fixture
def long_store(store_dsn: str) -> Iterator["object"]:
    """A ``store`` with :data:`LONG_RETENTION` (give ``store={"dsn": store_dsn, "retention":
    LONG_RETENTION}`` to settings that open it again, or the next start sets the defaults back)."""
    from gpuq.store import Retention, open_store

    s = open_store(store_dsn, retention=Retention(**LONG_RETENTION))
    try:
        yield s
    finally:
        s.command(f"DROP DATABASE IF EXISTS {s.database}")
        s.close()


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` on a threaded loopback HTTP server; yields ``http://127.0.0.1:PORT``."""
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}"
    finally:
        srv.shutdown()
        srv.server_close()


def free_port() -> int:
    """A port free now and not handed out before in this process (two picks in a row may otherwise
    get the same just-released port): the demo's picker, shared."""
    from gpuq.demo.cluster import free_port as pick

    return pick()


def closed_port() -> int:
    """A port nothing listens on (bound then released)."""
    return free_port()


def die_with_parent() -> None:
    """``preexec_fn`` for test subprocesses: SIGTERM the child if the test process dies (a killed
    pytest must not leave a `gpuq serve` running)."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG


def stop_processes(procs: list[subprocess.Popen[Any]]) -> None:
    """Stop test subprocesses, the last started first: SIGTERM (a clean stop, which the caller may
    then check by its return code), SIGKILL after 15 s."""
    for p in reversed(procs):
        p.terminate()
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
