"""Retention by kind, and a TTL that cannot wrap (issue 9, items 14 and 15), on real chDB.

``store.ttl_days: 36500`` used to give ``toDateTime(ts) + toIntervalDay(36500)``: past DateTime's
2106 limit it wraps to 1990 and every row expired at the first merge. Now the TTL is computed on
DateTime64 and the settings are bounded; rollups and scheduler events keep their own retention.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuq.errors import ConfigError
from gpuq.store import open_store

MAX_DAYS = 36_500           # gpuq.settings.MAX_RETENTION_DAYS
# every TTL'd table and its time column (gpuq.store.migrate.RETENTION; kept here so that the first
# test also runs against the code before the fix, where it fails)
TIME_COLUMN = {
    "gpu_samples": "ts", "ray_resources": "ts", "ray_nodes": "ts", "ray_jobs": "ts",
    "ray_placement_groups": "ts", "pod_events": "ts", "node_events": "ts", "gpu_samples_1m": "minute",
    "ray_resources_1m": "minute", "gpu_activity_1h": "hour", "accounting_usage_1h": "hour",
    "scheduler_events": "ts",
}


def _open(chdb_path: Path, name: str, **kw: object):  # noqa: ANN202
    return open_store(f"chdb://{chdb_path}?database={name}", **kw)  # type: ignore[arg-type]


@pytest.fixture
def fresh(chdb_path: Path, request: pytest.FixtureRequest) -> Iterator[list]:
    opened: list = []
    yield opened
    for s in opened:
        s.command(f"DROP DATABASE IF EXISTS {s.database}")
        s.close()


def _insert_at(store, table: str, age_days: float) -> None:
    """One row ``age_days`` old into ``table`` (other columns default), as the writers would."""
    col = TIME_COLUMN[table]
    store.command(f"INSERT INTO {store.database}.{table} ({col}) "
                  f"SELECT now64(3) - toIntervalSecond({int(age_days * 86400)})")


def _count_after_merge(store, table: str) -> int:
    store.command(f"OPTIMIZE TABLE {store.database}.{table} FINAL")    # TTL is applied on merge
    return int(store.query(f"SELECT count() FROM {store.database}.{table}").rows[0][0])


def _ttls(store) -> dict[str, str]:
    rows = store.query("SELECT name, engine_full FROM system.tables WHERE database = {d:String}",
                       {"d": store.database}).rows
    return {n: full.split(" TTL ", 1)[1].split(" SETTINGS ")[0] if " TTL " in full else "" for n, full in rows}


def test_the_longest_accepted_retention_keeps_rows(chdb_path: Path, fresh: list) -> None:
    """With ``store.ttl_days`` at its maximum a row written now is still there after a merge, in
    every TTL'd table (the old TTL wrapped to 1990 and dropped gpu_samples, pod_events,
    scheduler_events ...)."""
    store = _open(chdb_path, "ret_max", ttl_days=MAX_DAYS)
    fresh.append(store)
    for table in TIME_COLUMN:
        _insert_at(store, table, 0)
    kept = {table: _count_after_merge(store, table) for table in TIME_COLUMN}
    assert [t for t, n in kept.items() if n < 1] == [], kept


def test_every_kind_at_its_longest_keeps_rows(chdb_path: Path, fresh: list) -> None:
    from gpuq.settings import MAX_RETENTION_DAYS, StoreSettings
    from gpuq.store.migrate import RETENTION

    assert MAX_RETENTION_DAYS == MAX_DAYS and {t: c for t, (_, c) in RETENTION.items()} == TIME_COLUMN
    longest = StoreSettings(retention={"raw_days": MAX_DAYS, "rollup_days": MAX_DAYS, "events_days": MAX_DAYS})
    store = _open(chdb_path, "ret_max_all", retention=longest.retention)
    fresh.append(store)
    for table in TIME_COLUMN:
        _insert_at(store, table, 0)
    assert [t for t in TIME_COLUMN if _count_after_merge(store, t) < 1] == []


@pytest.mark.parametrize("key, value", [("ttl_days", MAX_DAYS + 1), ("retention.raw_days", 0),
                                        ("retention.rollup_days", 10**6), ("retention.events_days", MAX_DAYS + 1)])
def test_retention_out_of_range_is_refused_naming_the_key(tmp_path: Path, key: str, value: int) -> None:
    from gpuq.settings import load_settings

    cfg = tmp_path / "gpuq.yaml"
    if "." in key:
        outer, inner = key.split(".")
        cfg.write_text(f"store:\n  {outer}:\n    {inner}: {value}\n")
    else:
        cfg.write_text(f"store:\n  {key}: {value}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(cfg)
    assert f"{cfg}: store.{key}" in str(err.value) and str(value) in str(err.value)


def test_ttl_days_is_the_old_name_of_raw_days(tmp_path: Path) -> None:
    from gpuq.settings import StoreSettings, load_settings

    assert StoreSettings(ttl_days=30).retention.raw_days == 30
    assert StoreSettings(retention={"raw_days": 7}).ttl_days == 7
    d = StoreSettings()
    assert (d.ttl_days, d.retention.raw_days, d.retention.rollup_days, d.retention.events_days) == (90, 90, 800, 400)
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text("store:\n  ttl_days: 5\n  retention: {raw_days: 6}\n")
    with pytest.raises(ConfigError, match="store.ttl_days .5. is the old name of store.retention.raw_days"):
        load_settings(cfg)


def test_each_kind_keeps_its_own_retention(chdb_path: Path, fresh: list) -> None:
    """Raw series 1 day, rollups and scheduler events longer: 10-day-old rows of a bill and of the
    scheduler's journal survive the merge that removes the raw samples of the same age."""
    from gpuq.store.migrate import Retention

    store = _open(chdb_path, "ret_kinds", retention=Retention(raw_days=1, rollup_days=800, events_days=30))
    fresh.append(store)
    got = {}
    for table in ("gpu_samples", "pod_events", "accounting_usage_1h", "gpu_activity_1h", "scheduler_events"):
        _insert_at(store, table, 10)
        got[table] = _count_after_merge(store, table)
    assert got == {"gpu_samples": 0, "pod_events": 0, "accounting_usage_1h": 1, "gpu_activity_1h": 1,
                   "scheduler_events": 1}
    ttls = _ttls(store)
    assert ttls["gpu_allocations"] == ttls["scheduler_state"] == ttls["collector_state"] == ""   # never TTL'd


def test_an_old_single_ttl_store_is_brought_to_retention_by_kind(chdb_path: Path, fresh: list) -> None:
    """A store made before this change (``toDateTime(ts) + INTERVAL 90 DAY`` everywhere) gets each
    table's expression at the next start, and the next start after that changes nothing."""
    from gpuq.settings import StoreSettings
    from gpuq.store.migrate import migrate, retention_days, ttl_expressions

    store = _open(chdb_path, "ret_upgrade")
    fresh.append(store)
    for table, col in TIME_COLUMN.items():
        old = f"toDateTime({col}) + INTERVAL 90 DAY" if col == "ts" else f"{col} + INTERVAL 90 DAY"
        store.command(f"ALTER TABLE {store.database}.{table} MODIFY TTL {old}")
    settings = StoreSettings(retention={"raw_days": 30, "rollup_days": 900, "events_days": 365})
    migrate(store, retention=settings.retention)
    want = ttl_expressions(settings.retention)
    assert {t: _ttls(store)[t] for t in TIME_COLUMN} == want
    assert retention_days(settings.retention)["accounting_usage_1h"] == 900
    before = store.query("SELECT count() FROM system.mutations WHERE database = {d:String}",
                         {"d": store.database}).rows[0][0]
    migrate(store, retention=settings.retention)                     # nothing to change now
    after = store.query("SELECT count() FROM system.mutations WHERE database = {d:String}",
                        {"d": store.database}).rows[0][0]
    assert after == before


@pytest.mark.allow_expired_rows("gpu_samples")
def test_the_expired_rows_check_fires_and_names_the_table(store, expired_rows) -> None:
    """The fixture check of tests/conftest.py: a test inserting rows older than its store's
    retention is caught (here allowed by the marker, so this test can look at what was found)."""
    import datetime as dt

    from gpuq.store import COLUMNS

    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=91)            # the default raw retention is 90
    fresh_ts = dt.datetime.now(dt.UTC)
    row = ("c", "n", "GPU-1", 0, "H100", "", "", "p", "ns", "ctr", "DCGM_FI_DEV_GPU_UTIL", 1.0, "dcgm")
    store.insert("gpu_samples", [(fresh_ts, *row)], COLUMNS["gpu_samples"])
    assert expired_rows.found == []
    store.insert("gpu_samples", [(fresh_ts, *row), (old, *row)], COLUMNS["gpu_samples"])
    [found] = expired_rows.found
    assert (found.database, found.table, found.days) == (store.database, "gpu_samples", 90)
    text = expired_rows.message([found])
    assert f"{store.database}.gpu_samples: rows dated {old:%Y-%m-%d}" in text and "retention of 90 days" in text
    store.insert("gpu_allocations", [("c", "ns", "p", "u", "q", "n", "H100", "nvidia.com/gpu", 1.0, 0, "",
                                      old, None, 1, "pod", "", "", "")], COLUMNS["gpu_allocations"])
    assert len(expired_rows.found) == 1                              # the ledger has no TTL


def test_a_test_that_inserts_expired_rows_fails(tmp_path: Path) -> None:
    """End to end: pytest runs a test that inserts a 91-day-old sample (no marker) and reports it
    failed, naming the table."""
    import subprocess
    import sys

    from tests.conftest import REPO

    (tmp_path / "test_old_rows.py").write_text(
        "import datetime as dt\n"
        "from gpuq.store import COLUMNS\n"
        "def test_old(store):\n"
        "    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=91)\n"
        "    store.insert('gpu_samples', [(old, 'c', 'n', 'GPU-1', 0, 'H100', '', '', 'p', 'ns', 'ctr',\n"
        "                                  'DCGM_FI_DEV_GPU_UTIL', 1.0, 'dcgm')], COLUMNS['gpu_samples'])\n")
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.conftest",
                        "--rootdir", str(tmp_path), str(tmp_path / "test_old_rows.py")],
                       capture_output=True, text=True, cwd=REPO, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "test_old_rows.py::test_old inserted expired rows" in r.stdout
    assert ".gpu_samples: rows dated" in r.stdout and "retention of 90 days" in r.stdout
