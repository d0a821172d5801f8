"""Rollups exactly once (issue 16): a batch inserted with its dedup token and then retried or replayed
(a spill file replayed after a crash between its insert and the removal of its file) changes no
rollup. Every rollup fed by a materialized view is compared with what its view makes of the raw rows
(:func:`books`); migration 0006 repairs a store whose rollups were inflated before, rebuilding what
the raw rows still cover and logging what it keeps.
"""
from __future__ import annotations

import datetime as dt
import importlib
import itertools
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuq.errors import StoreUnavailable
from gpuq.store import COLUMNS, Retention
from gpuq.store.client import Store
from gpuq.store.writer import BatchWriter

mig = importlib.import_module("gpuq.store.migrate")      # gpuq.store.migrate is also a function's name

# Times relative to now (the tables' TTL drops old rows): the batch starts 30 minutes before the
# last midnight, so it spans two days (two partitions: the insert is cut into two blocks) and two hours.
MIDNIGHT = dt.datetime.now(dt.UTC).replace(hour=0, minute=0, second=0, microsecond=0)
BASE = MIDNIGHT - dt.timedelta(minutes=30)
PROF, UTIL = "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "DCGM_FI_DEV_GPU_UTIL"
_tokens = itertools.count()


def gpu_rows(n: int, start: dt.datetime = BASE, step_s: int = 7, gpu: str = "GPU-0") -> list[tuple[Any, ...]]:
    """Samples of two activity metrics and one other, one of them on no pod (the hourly view skips it)."""
    out = []
    for i in range(n):
        metric = (PROF, UTIL, "DCGM_FI_DEV_FB_USED")[i % 3]
        pod = "" if i % 11 == 0 else f"pod-{i % 2}"
        out.append((start + dt.timedelta(seconds=i * step_s), "c", "n1", gpu, 0, "A100", "", "", pod, "ns", "main",
                    metric, float(i % 97) / (100.0 if metric == PROF else 1.0), "dcgm"))
    return out


def ray_rows(n: int, start: dt.datetime = BASE, node: str = "n1") -> list[tuple[Any, ...]]:
    return [(start + dt.timedelta(seconds=i * 13), "c", node, "GPU", ("USED", "TOTAL")[i % 2], float(i % 8))
            for i in range(n)]


def alloc_rows(n: int, first_uid: int = 0) -> list[tuple[Any, ...]]:
    return [("c", "ns", f"pod-{u}", f"uid-{u}", "q", "n1", "A100", "nvidia.com/gpu", 1.0, 0, "", BASE, None, 1,
             "pod", "", "", "") for u in range(first_uid, first_uid + n)]


def _rows(store: Store, sql: str) -> list[tuple[Any, ...]]:
    return sorted(store.query(sql.format(db=store.database)).rows)


# Each rollup, read back aggregated per its key, next to the same aggregation of its raw rows with the
# view's own expressions: equal when every raw row is counted once.
BOOKS: dict[str, tuple[str, str]] = {
    "gpu_samples_1m": (
        """SELECT minute, cluster, node, gpu_uuid, mig_instance, namespace, pod, metric, sum(value_count),
                  round(sum(value_sum), 6), min(value_min), max(value_max)
           FROM {db}.gpu_samples_1m GROUP BY ALL""",
        """SELECT toStartOfMinute(ts) AS minute, cluster, node, gpu_uuid, mig_instance, namespace, pod, metric,
                  count(), round(sum(value), 6), min(value), max(value)
           FROM {db}.gpu_samples GROUP BY ALL"""),
    "ray_resources_1m": (
        """SELECT minute, cluster, node, resource, state, sum(value_count), round(sum(value_sum), 6), max(value_max)
           FROM {db}.ray_resources_1m GROUP BY ALL""",
        """SELECT toStartOfMinute(ts) AS minute, cluster, node, resource, state, count(), round(sum(value), 6),
                  max(value)
           FROM {db}.ray_resources GROUP BY ALL"""),
    # max and groupBitOr do not grow with a repeated row: activity_rows counts the rows the view wrote
    "gpu_activity_1h": (
        """SELECT hour, cluster, node, gpu_uuid, mig_instance, namespace, pod, max(prof_max), max(util_max),
                  groupBitOr(prof_minutes), groupBitOr(util_minutes)
           FROM {db}.gpu_activity_1h GROUP BY ALL""",
        """SELECT toStartOfHour(ts) AS hour, cluster, node, gpu_uuid, mig_instance, namespace, pod,
                  maxIf(value * 100, metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE'),
                  maxIf(value, metric = 'DCGM_FI_DEV_GPU_UTIL'),
                  groupBitOrIf(bitShiftLeft(toUInt64(1), toMinute(ts)), metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE'),
                  groupBitOrIf(bitShiftLeft(toUInt64(1), toMinute(ts)), metric = 'DCGM_FI_DEV_GPU_UTIL')
           FROM {db}.gpu_samples
           WHERE metric IN ('DCGM_FI_PROF_GR_ENGINE_ACTIVE', 'DCGM_FI_DEV_GPU_UTIL') AND pod != '' GROUP BY ALL"""),
    # a copy of every ledger row (read with FINAL, but a replay must not add rows either)
    "gpu_allocations_open": (
        "SELECT uid, version, count() FROM {db}.gpu_allocations_open GROUP BY ALL",
        "SELECT uid, version, count() FROM {db}.gpu_allocations GROUP BY ALL"),
}


def books(store: Store) -> dict[str, tuple[list[Any], list[Any]]]:
    """Per rollup: (what it holds, what its raw rows make)."""
    return {t: (_rows(store, got), _rows(store, want)) for t, (got, want) in BOOKS.items()}


def assert_balanced(store: Store) -> None:
    for table, (got, want) in books(store).items():
        assert want, f"{table}: no raw rows, the comparison proves nothing"
        assert got == want, f"{table}: the rollup differs from its raw rows"


def activity_rows(store: Store) -> tuple[int, int]:
    """(rows in gpu_activity_1h, its groups): equal while each group was written by one insert, once
    (merges fold rows of a group together, never below one)."""
    rows = count(store, "gpu_activity_1h")
    return rows, int(store.query(f"SELECT uniqExact(hour, cluster, node, gpu_uuid, mig_instance, namespace, pod) "
                                 f"FROM {store.database}.gpu_activity_1h").rows[0][0])


def count(store: Store, table: str) -> int:
    return int(store.query(f"SELECT count() FROM {store.database}.{table}").rows[0][0])


def value_count(store: Store, table: str) -> int:
    return int(store.query(f"SELECT sum(value_count) FROM {store.database}.{table}").rows[0][0])


BATCHES = {"gpu_samples": gpu_rows(600), "ray_resources": ray_rows(300), "gpu_allocations": alloc_rows(5)}


def insert_all(store: Store, tokens: dict[str, str], times: int = 1) -> None:
    for _ in range(times):
        for table, rows in BATCHES.items():
            store.insert(table, rows, COLUMNS[table], dedup_token=tokens[table])


def new_tokens() -> dict[str, str]:
    n = next(_tokens)
    return {t: f"test-{n}-{t}" for t in BATCHES}


@pytest.mark.parametrize("replays", [1, 2, 5])
def test_a_replayed_batch_changes_no_rollup(store: Store, replays: int) -> None:
    tokens = new_tokens()
    insert_all(store, tokens)
    first = books(store)
    insert_all(store, tokens, times=replays)
    assert books(store) == first
    assert_balanced(store)
    assert count(store, "gpu_samples") == 600 and value_count(store, "gpu_samples_1m") == 600
    assert count(store, "ray_resources") == 300 and value_count(store, "ray_resources_1m") == 300
    assert count(store, "gpu_allocations") == 5 == count(store, "gpu_allocations_open")
    rows, groups = activity_rows(store)
    assert rows == groups > 2
    # a new batch (another token) with the same rows is new data: counted again
    insert_all(store, new_tokens())
    assert value_count(store, "gpu_samples_1m") == 1200 == count(store, "gpu_samples")
    assert_balanced(store)


def test_the_insert_asks_the_views_to_deduplicate(store: Store) -> None:
    """Older servers default ``deduplicate_blocks_in_dependent_materialized_views`` to 0: Store.insert
    sends 1. With it 0, the view's target adds a replayed batch again (the check can fail)."""
    store._client.set_client_setting("deduplicate_blocks_in_dependent_materialized_views", 0)
    rows = ray_rows(120)
    for _ in range(3):
        store.insert("ray_resources", rows, COLUMNS["ray_resources"], dedup_token="older-server")
    assert value_count(store, "ray_resources_1m") == 120 == count(store, "ray_resources")
    for _ in range(2):                                   # as before: the token alone
        store._client.insert(f"{store.database}.ray_resources", ray_rows(60, node="n2"),
                             column_names=list(COLUMNS["ray_resources"]),
                             settings={"insert_deduplicate": 1, "insert_deduplication_token": "without"})
    assert count(store, "ray_resources") == 180
    assert value_count(store, "ray_resources_1m") == 240                 # the replay summed again


@pytest.fixture
def old_store(store_dsn: str) -> Iterator[Store]:
    """A store made before migration 0006 (its rollups had no deduplication window)."""
    from tests.conftest import store_before
    with store_before(store_dsn, 6, retention=Retention(raw_days=2, rollup_days=30)) as s:
        yield s


def test_the_migration_repairs_inflated_rollups(old_store: Store) -> None:
    tokens = new_tokens()
    insert_all(old_store, tokens, times=3)            # inserted, then replayed twice before the fix
    assert count(old_store, "gpu_samples") == 600
    assert value_count(old_store, "gpu_samples_1m") == 1800
    assert value_count(old_store, "ray_resources_1m") == 900
    assert count(old_store, "gpu_allocations") == 15              # the ledger had no window either
    assert any(got != want for got, want in books(old_store).values())
    rows, groups = activity_rows(old_store)
    assert rows > groups                              # unless merged already: 3 rows a group
    assert mig.migrate(old_store, retention=Retention(raw_days=2, rollup_days=30))[:3] == [6, 7, 8]
    assert value_count(old_store, "gpu_samples_1m") == 600
    assert value_count(old_store, "ray_resources_1m") == 900 // 3
    # gpu_allocations_open is not rebuilt (read with FINAL; a copy would bring pruned pods back):
    # its replayed copies stay with the ledger's own, one to one
    assert_balanced(old_store)
    assert activity_rows(old_store)[0] == activity_rows(old_store)[1]
    after = new_tokens()                              # and now a replay changes nothing
    insert_all(old_store, after, times=3)
    assert value_count(old_store, "gpu_samples_1m") == 1200 == count(old_store, "gpu_samples")
    assert_balanced(old_store)


def test_the_migration_rebuilds_with_the_views_own_statements() -> None:
    """The rebuild in 0006 is gpuq.store.rebuild.statements, whose SELECTs are the views' (the books
    above compare their results with the raw rows; this keeps the two texts one)."""
    six = next(m for m in mig.load_migrations() if m.version == 6)
    since = {t: f"<{t}>" for t in mig.rebuild.ROLLUPS}
    got = mig.migration_statements(six, "db", {}, "", since)
    want = [s for r in mig.rebuild.ROLLUPS for s in mig.rebuild.statements("db", r, since[r])]
    assert got[-len(want):] == want and len(want) == 6
    with pytest.raises(ValueError, match="0006_rollups_once rebuilds rollups"):
        mig.migration_statements(six, "db", {}, "")


def test_an_interrupted_migration_run_again_rebuilds_the_same(old_store: Store) -> None:
    insert_all(old_store, new_tokens(), times=2)
    mig.migrate(old_store, retention=Retention(raw_days=2, rollup_days=30))
    once = books(old_store)
    old_store.command(f"DELETE FROM {old_store.database}.schema_migrations WHERE version = 6")
    assert mig.migrate(old_store, retention=Retention(raw_days=2, rollup_days=30)) == [6]
    assert books(old_store) == once
    assert value_count(old_store, "gpu_samples_1m") == 600
    assert_balanced(old_store)


def test_rollup_rows_older_than_the_raw_rows_are_kept_and_logged(old_store: Store,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Raw rows are kept 2 days, gpu_activity_1h 30 days: its rows of 5 days ago cannot be rebuilt."""
    insert_all(old_store, new_tokens(), times=2)
    old = MIDNIGHT - dt.timedelta(days=5)
    kept = [(old + dt.timedelta(hours=h), "c", "n1", "GPU-0", "", "ns", "pod-0", 50.0, 40.0, 3, 5) for h in range(4)]
    old_store.insert("gpu_activity_1h", kept, ["hour", "cluster", "node", "gpu_uuid", "mig_instance", "namespace",
                                               "pod", "prof_max", "util_max", "prof_minutes", "util_minutes"])
    old_store.insert("gpu_activity_1h", kept[:2], ["hour", "cluster", "node", "gpu_uuid", "mig_instance",
                                                   "namespace", "pod", "prof_max", "util_max", "prof_minutes",
                                                   "util_minutes"])                   # two of them twice
    before_old = _rows(old_store, "SELECT * FROM {db}.gpu_activity_1h WHERE hour < now() - INTERVAL 2 DAY")
    with caplog.at_level(logging.WARNING, logger="gpuq.store.migrate"):
        mig.migrate(old_store, retention=Retention(raw_days=2, rollup_days=30))
    assert _rows(old_store, "SELECT * FROM {db}.gpu_activity_1h WHERE hour < now() - INTERVAL 2 DAY") == before_old
    said = [r.getMessage() for r in caplog.records if "could not rebuild" in r.getMessage()]
    assert len(said) == 1
    before = said[0].split("(before ")[1][:16]
    assert said[0] == (f"gpu_activity_1h: could not rebuild 6 rows from {old:%Y-%m-%d %H:%M} to "
                       f"{old + dt.timedelta(hours=3):%Y-%m-%d %H:%M} UTC (before {before}, "
                       f"gpu_samples no longer holds all their raw rows): kept as they were")
    since = dt.datetime.strptime(before, "%Y-%m-%d %H:%M").replace(tzinfo=dt.UTC)
    assert dt.timedelta(0) <= since - (dt.datetime.now(dt.UTC) - dt.timedelta(days=2)) <= dt.timedelta(hours=1)
    # the recent hours were rebuilt from the raw rows (the old rows stand apart in the comparison)
    old_store.command(f"DELETE FROM {old_store.database}.gpu_activity_1h WHERE hour < now() - INTERVAL 2 DAY")
    assert_balanced(old_store)


def test_nothing_is_logged_when_every_rollup_row_could_be_rebuilt(old_store: Store,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    insert_all(old_store, new_tokens(), times=2)
    with caplog.at_level(logging.WARNING, logger="gpuq.store.migrate"):
        mig.migrate(old_store, retention=Retention(raw_days=2, rollup_days=30))
    assert not [r for r in caplog.records if "could not rebuild" in r.getMessage()]
    assert_balanced(old_store)


def _down() -> Store:
    raise StoreUnavailable("test: the database is down")


@pytest.mark.parametrize("replays", [1, 2, 5])
def test_the_writer_replaying_a_file_already_inserted_changes_no_rollup(store: Store, tmp_path: Path,
                                                                       replays: int) -> None:
    spill = tmp_path / "spill"
    w = BatchWriter(_down, spill, retry_attempts=1, retry_backoff_s=0)
    for table, rows in BATCHES.items():
        w.write(table, rows)
    w.flush()                                         # the store is down: every batch spilled
    files = sorted(spill.glob("*/*.jsonl"))
    assert len(files) == 3
    saved = tmp_path / "saved"
    shutil.copytree(spill, saved)
    for _ in range(replays):
        # a writer replays the files, inserts them, and dies before removing them: they are back
        assert BatchWriter(store, spill).replay() == 905
        assert not list(spill.glob("*/*.jsonl"))
        shutil.rmtree(spill)
        shutil.copytree(saved, spill)
    restarted = BatchWriter(store, spill)
    assert restarted.replay() == 905                  # inserted again as far as it knows ...
    assert restarted.spilled_files() == 0
    assert count(store, "gpu_samples") == 600         # ... and dropped everywhere
    assert value_count(store, "gpu_samples_1m") == 600
    assert value_count(store, "ray_resources_1m") == 300
    assert count(store, "gpu_allocations_open") == 5
    assert activity_rows(store)[0] == activity_rows(store)[1]
    assert_balanced(store)


def test_a_file_spilled_before_the_upgrade_and_replayed_after_it_is_repaired(
        old_store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The crash before the upgrade: a writer replayed its file, then died before removing it. The
    rollups had no window then: the replay after the upgrade is dropped by gpu_samples but would be
    added to them again; the writer rebuilds their periods from the raw rows before removing the file."""
    spill, saved = tmp_path / "spill", tmp_path / "saved"
    before = BatchWriter(_down, spill, retry_attempts=1, retry_backoff_s=0)
    for table, rows in BATCHES.items():
        before.write(table, rows)
    before.flush()
    shutil.copytree(spill, saved)
    assert BatchWriter(old_store, spill).replay() == 905
    shutil.rmtree(spill)
    shutil.copytree(saved, spill)                     # the files are back
    assert mig.migrate(old_store, retention=Retention(raw_days=2, rollup_days=30))[:3] == [6, 7, 8]
    assert_balanced(old_store)
    old_store.insert("gpu_samples", BATCHES["gpu_samples"], COLUMNS["gpu_samples"],
                     dedup_token=next(spill.glob("gpu_samples/*.jsonl")).stem)
    assert value_count(old_store, "gpu_samples_1m") == 1200       # what a plain replay does now
    after = BatchWriter(old_store, spill)
    with caplog.at_level(logging.WARNING, logger="gpuq.store.writer"):
        assert after.replay() == 905 and after.spilled_files() == 0
    said = sorted(r.getMessage().split(": ")[1] for r in caplog.records if "predates" in r.getMessage())
    assert said == ["rebuilt gpu_samples_1m, gpu_activity_1h from gpu_samples for its 600 rows",
                    "rebuilt ray_resources_1m from ray_resources for its 300 rows"]
    assert count(old_store, "gpu_samples") == 600
    assert value_count(old_store, "gpu_samples_1m") == 600
    assert value_count(old_store, "ray_resources_1m") == 300
    assert_balanced(old_store)
    # a file of a writer started after the upgrade is replayed without a rebuild (none needed)
    late = BatchWriter(_down, spill, retry_attempts=1, retry_backoff_s=0)
    late.write("gpu_samples", gpu_rows(50, gpu="GPU-late"))
    late.flush()
    old_store.insert("gpu_samples", gpu_rows(50, gpu="GPU-late"), COLUMNS["gpu_samples"],
                     dedup_token=next(spill.glob("gpu_samples/*.jsonl")).stem)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpuq.store.writer"):
        assert BatchWriter(old_store, spill).replay() == 50
    assert not [r for r in caplog.records if "predates" in r.getMessage()]
    assert value_count(old_store, "gpu_samples_1m") == 650 == count(old_store, "gpu_samples")
    assert_balanced(old_store)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.tuples(st.integers(2, 80), st.integers(0, 3), st.integers(0, 7200)), min_size=1, max_size=4))
def test_any_batches_retried_any_number_of_times_balance(store: Store,
                                                         batches: list[tuple[int, int, int]]) -> None:
    """Batches of any size and start, each inserted once and retried 0-3 times (in between others)."""
    sent = []
    for n, retries, offset in batches:
        token, start = f"prop-{next(_tokens)}", BASE + dt.timedelta(seconds=offset)
        gpu = gpu_rows(n, start, step_s=31, gpu=f"GPU-{token}")
        store.insert("gpu_samples", gpu, COLUMNS["gpu_samples"], dedup_token=token)
        store.insert("ray_resources", ray_rows(n, start, node=token), COLUMNS["ray_resources"], dedup_token=token)
        store.insert("gpu_allocations", alloc_rows(1 + n % 3, n), COLUMNS["gpu_allocations"], dedup_token=token)
        sent.append((token, gpu, start, n, retries))
    for token, gpu, start, n, retries in sent:
        for _ in range(retries):
            store.insert("gpu_samples", gpu, COLUMNS["gpu_samples"], dedup_token=token)
            store.insert("ray_resources", ray_rows(n, start, node=token), COLUMNS["ray_resources"], dedup_token=token)
            store.insert("gpu_allocations", alloc_rows(1 + n % 3, n), COLUMNS["gpu_allocations"], dedup_token=token)
    assert_balanced(store)
    assert value_count(store, "gpu_samples_1m") == count(store, "gpu_samples")
    rows, groups = activity_rows(store)       # every batch has GPUs of its own: its own groups
    assert rows == groups
