from __future__ import annotations

import datetime as dt
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from gpuq.store import COLUMNS
from gpuq.store.writer import BatchWriter
from tests.conftest import REPO, closed_port

NOW = dt.datetime.now(dt.timezone.utc).replace(hour=12, minute=0, second=0, microsecond=0) - dt.timedelta(days=1)


def rr(n: int, node: str = "n") -> list[tuple]:
    return [(NOW + dt.timedelta(seconds=i), "c", node, "GPU", "USED", float(i)) for i in range(n)]


def count(store, table: str = "ray_resources") -> int:
    return int(store.query(f"SELECT count() FROM {store.database}.{table}").rows[0][0])


def test_buffers_until_flush_then_writes_all(store, tmp_path: Path) -> None:
    w = BatchWriter(store, tmp_path / "spill", batch_rows=1000)
    w.write("ray_resources", rr(10))
    assert count(store) == 0 and w.buffered() == {"ray_resources": 10}
    w.flush()
    assert count(store) == 10 and w.buffered() == {}
    assert w.stats.rows_written == {"ray_resources": 10}


def test_large_buffer_is_split_into_batches(store, tmp_path: Path) -> None:
    w = BatchWriter(store, tmp_path / "spill", batch_rows=7)
    w.write("ray_resources", rr(20))
    w.flush()
    assert count(store) == 20
    parts = store.query("SELECT count() FROM system.parts WHERE database={d:String} "
                        "AND table='ray_resources' AND active", {"d": store.database}).rows[0][0]
    assert parts >= 3          # 7 + 7 + 6 rows, one insert each (merges may fold some)


def test_background_thread_flushes_on_interval_and_close(store, tmp_path: Path) -> None:
    w = BatchWriter(store, tmp_path / "spill", batch_interval_s=0.1).start()
    w.write("ray_resources", rr(5))
    deadline = time.monotonic() + 5
    while count(store) < 5 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert count(store) == 5
    w.write("ray_resources", rr(3, node="m"))
    w.close()
    assert count(store) == 8


def test_store_down_spills_then_replays_exactly_once(store, tmp_path: Path) -> None:
    from gpuq.store import open_store

    port = closed_port()
    dead = BatchWriter(lambda: open_store(f"http://127.0.0.1:{port}/gpuq"), tmp_path / "spill",
                       retry_attempts=2, retry_backoff_s=0.0)
    dead.write("ray_resources", rr(50))
    dead.write("gpu_samples", [(NOW, "c", "n", "GPU-1", 0, "H100", "", "", "p", "ns", "ctr",
                                "DCGM_FI_DEV_GPU_UTIL", 3.0, "dcgm")])
    dead.flush()
    assert dead.spilled_files() == 2 and dead.stats.rows_spilled == {"ray_resources": 50, "gpu_samples": 1}
    keep = tmp_path / "copy"
    shutil.copytree(tmp_path / "spill", keep)

    alive = BatchWriter(store, tmp_path / "spill")
    assert alive.replay() == 51
    assert alive.spilled_files() == 0
    assert count(store) == 50 and count(store, "gpu_samples") == 1
    # the same spilled batches again (say the process died between insert and unlink): no doubles
    shutil.rmtree(tmp_path / "spill")
    shutil.copytree(keep, tmp_path / "spill")
    assert alive.replay() == 51
    assert count(store) == 50 and count(store, "gpu_samples") == 1


def test_memory_bound_spills_when_buffer_overflows(tmp_path: Path) -> None:
    w = BatchWriter(None, tmp_path / "spill", max_buffered_rows=100)
    w.write("ray_resources", rr(60))
    assert w.spilled_files() == 0
    w.write("ray_resources", rr(60))
    assert w.spilled_files() == 1 and w.buffered() == {}


KILLED_WRITER = textwrap.dedent("""
    import datetime as dt, sys, time
    from gpuq.store import open_store
    from gpuq.store.writer import BatchWriter
    dsn, spill = sys.argv[1], sys.argv[2]
    w = BatchWriter(lambda: open_store(dsn), spill, retry_attempts=2, retry_backoff_s=0.01,
                    batch_interval_s=0.1).start()
    now = dt.datetime.now(dt.timezone.utc).replace(hour=12, minute=0, second=0, microsecond=0) - dt.timedelta(days=1)
    w.write("ray_resources", [(now, "c", f"n{i}", "GPU", "USED", float(i)) for i in range(100)])
    while w.spilled_files() == 0:
        time.sleep(0.02)
    print("spilled", flush=True)
    time.sleep(120)
""")


def test_killed_writer_loses_nothing_spilled(store, tmp_path: Path) -> None:
    """The database is unreachable, the writer spills, the process is SIGKILLed; a new writer
    on a live database replays every row."""
    port = closed_port()
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, f"http://127.0.0.1:{port}/gpuq",
                             str(tmp_path / "spill")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line.strip() == "spilled", proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
        proc.wait(10)
    assert not list((tmp_path / "spill").glob("*/.*.tmp"))          # no half-written file
    w = BatchWriter(store, tmp_path / "spill")
    assert w.replay() == 100
    assert count(store) == 100
    assert store.query(f"SELECT sum(value) FROM {store.database}.ray_resources").rows[0][0] == sum(range(100))


def test_unknown_table_is_refused(tmp_path: Path) -> None:
    import pytest

    from gpuq.errors import StoreQueryError

    with pytest.raises(StoreQueryError, match="unknown table"):
        BatchWriter(None, tmp_path).write("nope", [(1,)])
    assert "ray_resources" in COLUMNS


def test_resume_points_are_flushed_after_the_rows_they_cover(store, tmp_path: Path) -> None:
    """A watcher emits its resourceVersion (collector_state) after its rows; the writer must not
    store the resume point first, or a crash between the two inserts would skip those rows."""
    w = BatchWriter(store, tmp_path / "spill")
    w.write("collector_state", [(NOW, "c", "kubernetes", "pods", "41")])     # first into the buffer
    w.write("ray_resources", rr(3))
    w.flush()
    # rows_written records tables in the order their inserts succeeded
    assert list(w.stats.rows_written.items()) == [("ray_resources", 3), ("collector_state", 1)]
    assert count(store, "collector_state") == 1
