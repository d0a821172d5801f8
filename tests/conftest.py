"""Shared fixtures.

chDB opens one data path per process at a time, so the whole test session shares one path and
each test that needs a store gets a database of its own on it (``store`` fixture).
"""
from __future__ import annotations

import itertools
import socket
from collections.abc import Iterator
from pathlib import Path

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_port() -> int:
    """A port nothing listens on (bound then released)."""
    return free_port()


def die_with_parent() -> None:
    """``preexec_fn`` for test subprocesses: SIGTERM the child if the test process dies (a killed
    pytest must not leave a `gpuq serve` running)."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
