from __future__ import annotations

import datetime as dt

import pytest

from gpuq.errors import ConfigError, StoreQueryError, StoreUnavailable
from gpuq.store import COLUMNS, connect, migrate, parse_dsn
from gpuq.store.migrate import load_migrations
from tests.conftest import closed_port

NOW = dt.datetime.now(dt.timezone.utc).replace(hour=12, minute=0, second=0, microsecond=0) - dt.timedelta(days=1)


@pytest.mark.parametrize(
    "dsn, kind, database",
    [
        ("chdb:///var/lib/gpuq", "chdb", "gpuq"),
        ("chdb:///var/lib/gpuq?database=other", "chdb", "other"),
        ("http://u:p@ch:8123/metrics", "http", "metrics"),
        ("https://ch:8443", "https", "gpuq"),
    ],
    ids=["chdb-default-db", "chdb-db-param", "http-db-path", "https-default-db"],
)
def test_parse_dsn(dsn: str, kind: str, database: str) -> None:
    d = parse_dsn(dsn)
    assert d.kind == ("http" if kind.startswith("http") else kind)
    assert d.database == database


@pytest.mark.parametrize("dsn, shown", [
    ("http://user:secret@ch:8123/db", "http://user:***@ch:8123/db"),
    ("http://:secret@ch:8123/db", "http://:***@ch:8123/db"),                 # no user name
    ("https://user:p@ss@w0rd@ch:8443/db", "https://user:***@ch:8443/db"),     # '@' in the password
    ("http://user:se/cr:et@ch:8123", "http://user:***@ch:8123"),             # '/' and ':' in it
    ("http://user@ch:8123/db", "http://user@ch:8123/db"),                    # no password at all
], ids=["user-pass", "empty-user", "at-in-password", "slash-in-password", "user-only"])
def test_dsn_hides_password(dsn: str, shown: str) -> None:
    from gpuq.store.client import mask_dsn

    assert mask_dsn(dsn) == shown
    try:
        assert parse_dsn(dsn).display == shown
    except ConfigError as exc:                   # a password with '/' is not a valid URL: refused, unseen
        assert "cr" not in str(exc) and "store.dsn" in str(exc)


@pytest.mark.parametrize("dsn", [
    "http://ch:8123/db?password=secret", "http://ch:8123/?database=db&Password=secret&x=1",
    "http://u:secret@ch:8123/db?pwd=secret", "http://:s@cret@ch/db?token=secret",
])
def test_mask_dsn_hides_query_string_passwords(dsn: str) -> None:
    from gpuq.store.client import mask_dsn

    masked = mask_dsn(dsn)
    assert "secret" not in masked and "cret" not in masked and "***" in masked
    assert "ch" in masked                                                    # the host stays readable


def test_dsn_errors_do_not_show_the_password() -> None:
    with pytest.raises(ConfigError) as err:
        parse_dsn("postgres://u:secret@db/x?password=secret")
    assert "secret" not in str(err.value) and "store.dsn" in str(err.value)


@pytest.mark.parametrize("dsn", ["postgres://x", "chdb://", "chdb:///x?database=bad-name"],
                         ids=["scheme", "no-path", "bad-db"])
def test_bad_dsn(dsn: str) -> None:
    with pytest.raises(ConfigError, match="store.dsn"):
        parse_dsn(dsn)


def test_columns_match_migrated_tables(store) -> None:
    from gpuq.store.schema import DERIVED
    for table, cols in COLUMNS.items():
        rows = store.query(f"DESCRIBE TABLE {store.database}.{table}").rows
        got = tuple(r[0] for r in rows if r[0] not in DERIVED.get(table, ()))
        assert got == cols, table
        derived = {r[0]: (r[2], r[3]) for r in rows if r[0] in DERIVED.get(table, ())}
        assert set(derived) == set(DERIVED.get(table, ())), table
        assert all(kind == "DEFAULT" for kind, _ in derived.values()), derived      # computed at insert


def test_the_ledger_counts_milli_gpus_for_old_and_new_rows(store) -> None:
    """0007_milli_gpus.sql: a row written with gpus 0.46 (a share) or 8 holds milli_gpus 460 or 8000,
    and the accounting reads that integer."""
    import datetime as dt
    t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    row = lambda uid, g: ("c", "ns", "p", uid, "q", "n", "H100", "nvidia.com/gpu", g, 0, "", t, None, 1, "pod",  # noqa: E731
                          "", "", "")
    store.insert("gpu_allocations", [row("a", 0.46), row("b", 8.0)], COLUMNS["gpu_allocations"])
    got = dict(store.query(f"SELECT uid, milli_gpus FROM {store.database}.gpu_allocations ORDER BY uid").rows)
    assert got == {"a": 460, "b": 8000}


def test_migrations_are_recorded_and_idempotent(store) -> None:
    versions = [m.version for m in load_migrations()]
    recorded = sorted(r[0] for r in store.query(f"SELECT version FROM {store.database}.schema_migrations FINAL").rows)
    assert recorded == versions
    assert migrate(store) == []            # nothing left to apply
    recorded2 = store.query(f"SELECT count() FROM {store.database}.schema_migrations FINAL").rows[0][0]
    assert recorded2 == len(versions)


def test_ttl_follows_settings(store) -> None:
    migrate(store, ttl_days=7)
    full = store.query("SELECT engine_full FROM system.tables WHERE database={d:String} AND name='gpu_samples'",
                       {"d": store.database}).rows[0][0]
    assert "toIntervalDay(7)" in full


def test_rollup_view_aggregates_samples(store) -> None:
    rows = [(NOW + dt.timedelta(seconds=15 * i), "c", "n1", "GPU-1", 0, "H100", "", "", "p", "ns", "ctr",
             "DCGM_FI_DEV_GPU_UTIL", float(v), "dcgm") for i, v in enumerate([10, 20, 30, 40])]
    store.insert("gpu_samples", rows, COLUMNS["gpu_samples"])
    got = store.query(f"SELECT minute, sum(value_sum)/sum(value_count), min(value_min), max(value_max) "
                      f"FROM {store.database}.gpu_samples_1m GROUP BY minute").rows
    assert got == [(NOW.replace(tzinfo=None), 25.0, 10.0, 40.0)]


def test_insert_dedup_token_makes_retries_idempotent(store) -> None:
    rows = [(NOW, "c", "n", "GPU", "USED", 2.0)]
    for _ in range(3):
        store.insert("ray_resources", rows, COLUMNS["ray_resources"], dedup_token="batch-1")
    store.insert("ray_resources", rows, COLUMNS["ray_resources"], dedup_token="batch-2")
    assert store.query(f"SELECT count() FROM {store.database}.ray_resources").rows[0][0] == 2


def test_bad_sql_is_a_query_error_not_unavailable(store) -> None:
    with pytest.raises(StoreQueryError, match="UNKNOWN_TABLE|Unknown table"):
        store.query(f"SELECT * FROM {store.database}.nope")


def test_unreachable_server_is_unavailable() -> None:
    port = closed_port()
    with pytest.raises(StoreUnavailable, match=f"127.0.0.1:{port}"):
        connect(f"http://127.0.0.1:{port}/gpuq", connect_timeout_s=1)


def test_the_milli_gpu_migration_converts_existing_rows(store_dsn: str) -> None:
    """A store made before 0007 holds ledger rows in GPUs only: after the migration every reader
    gets their milli-GPUs, stored in the rows' parts (MATERIALIZE COLUMN), not only computed."""
    import datetime as dt

    from gpuq.store import migrate
    from tests.conftest import store_before
    with store_before(store_dsn, 7) as s:
        t = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
        s.insert("gpu_allocations", [("c", "ns", "p", "old", "q", "n", "H100", "nvidia.com/gpu", 0.25, 0, "", t, None,
                                      1, "pod", "", "", "")], COLUMNS["gpu_allocations"])
        assert migrate(s)[:2] == [7, 8]
        rows = s.query(f"SELECT uid, milli_gpus FROM {s.database}.gpu_allocations FINAL").rows
        assert rows == [("old", 250)]
