"""The writer under faults of its own disk and of the store together (issue 9, items 3 and 4).

A real full disk where we can make one: a 64 KiB tmpfs mounted for the test (we run as root in
CI). Where mounting is refused, the same fault is injected at the OS level: ``write`` on the spill
file raises ``OSError(ENOSPC)`` after the first bytes, as a full disk does. The test prints which.
The store is real: a closed port while "down", the chDB store once "up".
"""
from __future__ import annotations

import datetime as dt
import errno
import logging
import os
import stat
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from collector.health import CollectorMetrics
from gpuq.store import open_store
from gpuq.store import writer as writer_mod
from gpuq.store.writer import BatchWriter
from tests.conftest import closed_port

NOW = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def rr(first: int, n: int) -> list[tuple]:
    """n rows with distinct values first..first+n-1 (the value names the row)."""
    return [(NOW - dt.timedelta(seconds=i), "c", f"n{i % 7}", "GPU", "USED", float(i))
            for i in range(first, first + n)]


def values(store) -> list[float]:
    return sorted(r[0] for r in store.query(f"SELECT value FROM {store.database}.ray_resources").rows)


class Disk:
    """A spill directory whose disk can be filled and freed."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.root = root
        self.mp = monkeypatch
        self.mounted = False
        root.mkdir(parents=True, exist_ok=True)
        try:
            subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(root)],
                           check=True, capture_output=True, timeout=10)
            self.mounted = True
        except (OSError, subprocess.SubprocessError):
            pass
        print(f"full disk: {'64 KiB tmpfs' if self.mounted else 'injected ENOSPC on write'}")
        self.spill = root / "spill"

    def fill(self) -> None:
        if self.mounted:
            with open(self.root / "filler", "ab", buffering=0) as fh:
                try:
                    while True:
                        fh.write(b"\0" * 4096)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
            # leave one page free: the spill gets a partial file before it fails
            size = (self.root / "filler").stat().st_size
            os.truncate(self.root / "filler", max(size - 4096, 0))
        else:
            real_open = open

            def failing_open(file, mode="r", *a, **kw):    # noqa: ANN001 - mirrors open()
                fh = real_open(file, mode, *a, **kw)
                if str(file).endswith(".tmp") and "w" in mode:
                    real_write = fh.write

                    def write(data):                       # noqa: ANN001
                        real_write(data[:10])
                        fh.flush()
                        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
                    fh.write = write
                return fh
            self.mp.setattr(writer_mod, "open", failing_open, raising=False)

    def free(self) -> None:
        if self.mounted:
            (self.root / "filler").unlink(missing_ok=True)
        else:
            self.mp.delattr(writer_mod, "open", raising=False)

    def close(self) -> None:
        if self.mounted:
            subprocess.run(["umount", "-l", str(self.root)], check=False, capture_output=True)


@pytest.fixture
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Disk]:
    d = Disk(tmp_path / "disk", monkeypatch)
    try:
        yield d
    finally:
        d.close()


class Switch:
    """A store that is down (a real closed port) until ``up`` is set."""

    def __init__(self, store) -> None:
        self.store = store
        self.up = False
        self.dead = f"http://127.0.0.1:{closed_port()}/gpuq"

    def __call__(self):
        return self.store if self.up else open_store(self.dead)


def tmp_files(spill: Path) -> list[Path]:
    return list(spill.glob("*/.*.tmp")) if spill.exists() else []


def test_store_down_and_disk_full_then_recovery_every_row_lands_once(store, disk: Disk) -> None:
    sw = Switch(store)
    w = BatchWriter(sw, disk.spill, retry_attempts=1, retry_backoff_s=0.0)
    disk.fill()
    w.write("ray_resources", rr(0, 100))
    w.flush()                                   # used to raise ENOSPC and lose the 100 rows
    assert w.held_rows() == 100 and w.spilled_files() == 0
    assert tmp_files(disk.spill) == []          # the partial file is gone
    assert w.stats.spill_errors >= 1 and w.stats.rows_dropped == {}

    disk.free()                                 # the disk comes back, the store not yet
    w.write("ray_resources", rr(100, 100))
    w.flush()
    assert w.held_rows() == 0 and w.spilled_files() == 2

    disk.fill()                                 # full again
    w.write("ray_resources", rr(200, 100))
    w.flush()
    assert w.held_rows() == 100 and w.buffered() == {"ray_resources": 100}

    sw.up = True                                # the store comes back (the disk still full)
    w.flush()
    assert values(store) == [float(i) for i in range(300)]          # each row once
    assert w.held_rows() == 0 and w.spilled_files() == 0
    w.flush()
    w.replay()
    assert len(values(store)) == 300
    assert w.stats.rows_dropped == {}


def test_beyond_the_bound_the_newest_rows_are_dropped_and_counted(store, disk: Disk,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    sw = Switch(store)
    w = BatchWriter(sw, disk.spill, retry_attempts=1, retry_backoff_s=0.0, max_buffered_rows=150)
    registry = CollectorRegistry()
    CollectorMetrics(registry, w)
    dropped = {"table": "ray_resources", "reason": "spill_failed"}
    assert registry.get_sample_value("gpuq_collector_rows_dropped_total", dropped) == 0
    disk.fill()
    w.write("ray_resources", rr(0, 100))
    w.flush()
    with caplog.at_level(logging.ERROR, logger="gpuq.store.writer"):
        w.write("ray_resources", rr(100, 100))   # over the bound: spill (fails), keep 150
    assert w.held_rows() == 150
    assert w.stats.rows_dropped == {("ray_resources", "spill_failed"): 50}
    assert registry.get_sample_value("gpuq_collector_rows_dropped_total", dropped) == 50
    assert registry.get_sample_value("gpuq_collector_rows_buffered", {"table": "ray_resources"}) == 150
    assert "dropped the newest 50 rows of ray_resources" in caplog.text
    sw.up = True
    w.flush()
    assert values(store) == [float(i) for i in range(150)]         # the oldest kept, the newest lost


def test_spill_fsyncs_the_directory_after_the_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        events.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def replace(a, b) -> None:                   # noqa: ANN001
        events.append("rename")
        real_replace(a, b)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    w = BatchWriter(None, tmp_path / "spill", max_buffered_rows=10)
    w.write("ray_resources", rr(0, 11))          # over the bound: spilled
    assert w.spilled_files() == 1
    assert events == ["fsync-file", "rename", "fsync-dir"]


def write_spill(spill: Path, table: str, name: str, text: bytes, age_s: float) -> Path:
    folder = spill / table
    folder.mkdir(parents=True, exist_ok=True)
    p = folder / f"{name}.jsonl"
    p.write_bytes(text)
    t = (dt.datetime.now() - dt.timedelta(seconds=age_s)).timestamp()
    os.utime(p, (t, t))
    return p


def good_lines(first: int, n: int) -> bytes:
    lines = [f'[{{"$dt":{NOW.timestamp() - i}}},"c","n","GPU","USED",{float(i)}]' for i in range(first, first + n)]
    return ("\n".join(lines) + "\n").encode()


def test_bad_spill_files_are_quarantined_and_the_rest_replayed(store, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    spill = tmp_path / "spill"
    token = uuid.uuid4().hex
    write_spill(spill, "ray_resources", f"{token}-1", good_lines(0, 10), age_s=50)
    truncated = write_spill(spill, "ray_resources", f"{token}-2", good_lines(10, 5)[:-20], age_s=40)
    not_json = write_spill(spill, "ray_resources", f"{token}-3",
                           good_lines(15, 2) + b"{oops\n" + good_lines(17, 1), age_s=30)
    not_utf8 = write_spill(spill, "ray_resources", f"{token}-4", good_lines(18, 1) + b"\xff\xfe\n",
                           age_s=20)
    short_row = write_spill(spill, "ray_resources", f"{token}-5", b'["c","n"]\n', age_s=10)
    bad_dt = write_spill(spill, "ray_resources", f"{token}-6",
                         b'[{"$dt":1e300},"c","n","GPU","USED",1.0]\n', age_s=5)
    write_spill(spill, "ray_resources", f"{token}-7", good_lines(20, 3), age_s=1)

    w = BatchWriter(store, spill)
    registry = CollectorRegistry()
    CollectorMetrics(registry, w)
    with caplog.at_level(logging.ERROR, logger="gpuq.store.writer"):
        w.start()                                # used to raise JSONDecodeError here
    w.close()
    assert values(store) == [float(i) for i in list(range(10)) + [20, 21, 22]]
    q = spill / "quarantine" / "ray_resources"
    assert sorted(p.name for p in w.quarantined_files()) == sorted(
        p.name for p in (truncated, not_json, not_utf8, short_row, bad_dt))
    assert all((q / p.name).exists() and not p.exists()
               for p in (truncated, not_json, not_utf8, short_row, bad_dt))
    assert w.spilled_files() == 0                # the quarantine is out of the replay's way
    assert w.stats.files_quarantined == {"ray_resources": 5}
    assert registry.get_sample_value("gpuq_collector_spill_files_quarantined_total",
                                     {"table": "ray_resources"}) == 5
    # each log line names the file and its first bad line
    assert f"{truncated}: line 5: truncated" in caplog.text
    assert f"{not_json}: line 3: not JSON" in caplog.text
    assert f"{not_utf8}: line 2: not UTF-8" in caplog.text
    assert f"{short_row}: line 1: expected a list of 6 values, got 2 values" in caplog.text
    assert f"{bad_dt}: line 1: not JSON" in caplog.text


def test_gpuq_collect_starts_with_a_corrupt_spill_file(store_dsn: str, store, tmp_path: Path) -> None:
    """The wiring gpuq collect and gpuq serve share (make_writer + start) survives it."""
    from collector.service import run_collect
    from gpuq.settings import Settings, StoreSettings

    spill = tmp_path / "spill"
    bad = write_spill(spill, "ray_resources", "x-1", b'[{"$dt":1},"c"', age_s=10)
    write_spill(spill, "ray_resources", "x-2", good_lines(0, 4), age_s=5)
    settings = Settings(store=StoreSettings(dsn=store_dsn, spill_dir=str(spill)))
    assert run_collect(settings, once=True) == 0
    assert values(store) == [0.0, 1.0, 2.0, 3.0]
    assert (spill / "quarantine" / "ray_resources" / bad.name).exists()


def test_stale_partial_files_are_removed_at_start(tmp_path: Path) -> None:
    spill = tmp_path / "spill" / "ray_resources"
    spill.mkdir(parents=True)
    old, fresh = spill / ".dead-1.tmp", spill / ".live-1.tmp"
    old.write_text('[{"$dt":1},"c"')
    fresh.write_text('[{"$dt":1},"c"')
    t = (dt.datetime.now() - dt.timedelta(hours=1)).timestamp()
    os.utime(old, (t, t))
    BatchWriter(None, tmp_path / "spill").start().close()
    assert not old.exists() and fresh.exists()    # a live writer's file is left alone


def test_rows_still_held_at_close_are_counted_as_lost(store, disk: Disk,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    w = BatchWriter(Switch(store), disk.spill, retry_attempts=1, retry_backoff_s=0.0)
    disk.fill()
    w.write("ray_resources", rr(0, 300))       # more than the page left free
    with caplog.at_level(logging.ERROR, logger="gpuq.store.writer"):
        w.close()
    assert w.stats.rows_dropped == {("ray_resources", "exit"): 300} and w.held_rows() == 0
    assert "exiting with 300 rows of ray_resources neither written nor spilled" in caplog.text


def test_a_spill_file_of_bad_values_does_not_stop_the_later_ones(store, tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Issue 17: a value the client cannot encode ("not-a-number" for a Float64) is bad data, not a
    store that is down: that file is quarantined once with its reason, and the newer ones are
    replayed; a folder of an unknown table is quarantined once, not logged at every flush."""
    from gpuq.store.spillfile import read_reason

    spill = tmp_path / "spill"
    token = uuid.uuid4().hex
    bad = write_spill(spill, "ray_resources", f"{token}-1",
                      f'[{{"$dt":{NOW.timestamp()}}},"c","n","GPU","USED","not-a-number"]\n'.encode(), age_s=30)
    unknown = write_spill(spill, "no_such_table", f"{token}-2", good_lines(0, 1), age_s=20)
    write_spill(spill, "ray_resources", f"{token}-3", good_lines(0, 3), age_s=10)
    w = BatchWriter(store, spill)
    with caplog.at_level(logging.WARNING, logger="gpuq.store.writer"):
        w.start()
        w.flush()
        w.flush()
    w.close()
    assert values(store) == [0.0, 1.0, 2.0]                     # the newer file, replayed
    moved = spill / "quarantine" / "ray_resources" / bad.name
    assert not bad.exists() and moved.exists() and w.stats.rows_refused == {}
    why = read_reason(moved)
    assert why is not None and why.kind == "refused" and "not-a-number" in why.reason and why.rows == 1
    assert caplog.text.count(f"{bad}: ") == 1 and caplog.text.count("quarantined (refused)") == 1
    assert not unknown.exists() and (spill / "quarantine" / "no_such_table" / unknown.name).exists()
    assert caplog.text.count("unknown table 'no_such_table'") == 1
    assert w.stats.files_quarantined == {"ray_resources": 1, "no_such_table": 1}
    assert "store unavailable" not in caplog.text
