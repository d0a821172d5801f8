"""``store.cluster``: the DDL for a ClickHouse cluster (gpuq.store.cluster).

No ClickHouse cluster (nor ZooKeeper/Keeper) runs here. What is checked:
* unset, the migrations send today's statements byte for byte;
* set, the statements have the expected shape (Replicated engines with the macros, ``ON CLUSTER``,
  a Distributed twin per table with its sharding key, views reading and writing local tables, TTLs
  kept, ALTERs on the local and Distributed tables) and ClickHouse's own parser (chDB's
  ``formatQuery``) reads each of them;
* the queries name only public tables;
* run on chDB with a one-shard ``remote_servers`` cluster of the local engine (a config file), with
  the Replicated engines and ``ON CLUSTER`` taken out (they need Keeper): the Distributed tables,
  views on local tables, the prune's DELETE on the local table and every accounting read give the
  same answers as the single-server schema. One shard only: rows spread over several shards, and
  replication, are not exercised.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from gpuq.errors import ConfigError
from gpuq.store import connect, rebuild
from gpuq.store.client import Store
from gpuq.store.cluster import SHARDING_KEYS, VIEWS, ClusterDDLError, cluster_statements, local_name

REPO = Path(__file__).resolve().parents[1]
mig = importlib.import_module("gpuq.store.migrate")
CLUSTER = "gpuq_test"
# sha256 of the statements (database, schema_migrations, migrations 0001-0005) for database gpuq
# and the default retention, as sent before store.cluster existed (checked against that commit).
TODAY_SHA = "5cfc6e43f4ec20431c0b5c180afc1683ed3bf393bd4942a45dbcd6702f999284"
# The clock a rollup rebuild (migration 0006) is given here: its statements name a fixed time.
NOW = 1_700_000_000.0


def _statements(cluster: str, db: str = "gpuq", upto: int = 10**6) -> list[str]:
    ttl = mig.ttl_expressions(mig.Retention())
    since = rebuild.since_literals(NOW, mig.retention_days(mig.Retention()))
    out = mig.bootstrap_statements(db, cluster)
    for m in mig.load_migrations():
        if m.version <= upto:
            out += mig.migration_statements(m, db, ttl, cluster, since)
    return out


def _creates(stmts: list[str]) -> dict[str, str]:
    return {m.group(1): s for s in stmts if (m := re.match(r"CREATE TABLE IF NOT EXISTS gpuq\.(\w+) ", s))}


def test_without_a_cluster_the_statements_are_todays_byte_for_byte(chdb_path: Path) -> None:
    got = _statements("", upto=5)
    assert hashlib.sha256("\n;\n".join(got).encode()).hexdigest() == TODAY_SHA
    sent: list[str] = []

    class Recording(Store):
        def command(self, sql: str, parameters: Any = None, settings: Any = None) -> Any:
            sent.append(sql)
            assert not settings, "no cluster: no extra settings"
            return super().command(sql, parameters, settings)

    plain = connect(f"chdb://{chdb_path}?database=gpuq")
    store = Recording(plain.dsn, plain._client)
    try:
        mig.migrate(store, now=NOW)
        assert [s for s in sent if not s.startswith("INSERT INTO gpuq.schema_migrations")] == _statements("")
        assert not any("_local" in s or "Distributed" in s or "ON CLUSTER" in s for s in sent)
    finally:
        store.command("DROP DATABASE IF EXISTS gpuq")


def test_every_table_is_replicated_on_the_cluster_with_a_distributed_twin() -> None:
    stmts = _statements(CLUSTER)
    creates = _creates(stmts)
    assert set(SHARDING_KEYS) == {t for t in creates if not t.endswith("_local")}
    for table, key in SHARDING_KEYS.items():
        local = creates[local_name(table)]
        assert local.startswith(f"CREATE TABLE IF NOT EXISTS gpuq.{table}_local ON CLUSTER '{CLUSTER}' (")
        assert re.search(rf"ENGINE = Replicated\w*MergeTree\('/clickhouse/tables/{{shard}}/{{database}}/"
                         rf"{table}_local', '{{replica}}'", local), table
        assert creates[table] == (f"CREATE TABLE IF NOT EXISTS gpuq.{table} ON CLUSTER '{CLUSTER}' AS gpuq.{table}_local "
                                  f"ENGINE = Distributed('{CLUSTER}', 'gpuq', '{table}_local', {key})")
        assert stmts.index(local) < stmts.index(creates[table])
        if table in mig.RETENTION:
            assert f"TTL toDateTime64({mig.RETENTION[table][1]}, 3) + toIntervalDay(" in local, table
        assert "non_replicated" not in local
    # the engines keep their arguments after the path and the replica
    assert "ReplicatedReplacingMergeTree('/clickhouse/tables/{shard}/{database}/scheduler_state_local', " \
           "'{replica}', version, deleted)" in creates["scheduler_state_local"]
    assert "'{replica}', ts)" in creates["ray_nodes_local"]
    assert "ReplicatedAggregatingMergeTree(" in creates["gpu_samples_1m_local"]
    assert "SETTINGS replicated_deduplication_window = 10000" in creates["gpu_samples_local"]
    # every statement but the INSERT ... SELECTs (Distributed to Distributed) runs ON CLUSTER
    assert all(f"ON CLUSTER '{CLUSTER}'" in s for s in stmts if not s.startswith("INSERT"))
    assert [s for s in stmts if s.startswith("INSERT")] == [s for s in _statements("") if s.startswith("INSERT")]


def test_the_rollup_rebuild_deletes_on_the_local_tables_and_sets_their_window() -> None:
    stmts = _statements(CLUSTER)
    since = rebuild.since_literals(NOW, mig.retention_days(mig.Retention()))
    for table in rebuild.ROLLUPS:
        col = rebuild.ROLLUPS[table][1]
        assert (f"DELETE FROM gpuq.{table}_local ON CLUSTER '{CLUSTER}' WHERE {col} >= {since[table]}") in stmts
        assert (f"ALTER TABLE gpuq.{table}_local ON CLUSTER '{CLUSTER}' MODIFY SETTING "
                f"replicated_deduplication_window = 10000") in stmts
        insert = next(s for s in stmts if s.startswith(f"INSERT INTO gpuq.{table} ("))
        assert stmts.index(next(s for s in stmts if s.startswith(f"DELETE FROM gpuq.{table}_local"))) < stmts.index(insert)
        assert f">= {since[table]}" in insert and "_local" not in insert
    assert not any("non_replicated" in s for s in stmts)
    with pytest.raises(ClusterDDLError, match="no sharding key"):
        cluster_statements("DELETE FROM gpuq.nowhere WHERE 1", CLUSTER)


def test_views_read_and_write_the_local_tables_and_alters_reach_both() -> None:
    stmts = _statements(CLUSTER)
    views = [s for s in stmts if s.startswith("CREATE MATERIALIZED VIEW")]
    assert {re.match(r"CREATE MATERIALIZED VIEW IF NOT EXISTS gpuq\.(\w+)", v).group(1) for v in views} == set(VIEWS)
    for v in views:
        name = re.match(r"CREATE MATERIALIZED VIEW IF NOT EXISTS gpuq\.(\w+)", v).group(1)
        source, target = VIEWS[name]
        assert f" ON CLUSTER '{CLUSTER}' TO gpuq.{target}_local AS" in v
        assert re.findall(r"FROM gpuq\.(\w+)", v) == [f"{source}_local"]
    assert f"DROP VIEW IF EXISTS gpuq.gpu_allocations_open_mv ON CLUSTER '{CLUSTER}'" in stmts
    adds = [s for s in stmts if s.startswith("ALTER TABLE") and "ADD COLUMN IF NOT EXISTS workload_id" in s]
    assert adds == [f"ALTER TABLE gpuq.{t} ON CLUSTER '{CLUSTER}' ADD COLUMN IF NOT EXISTS workload_id String DEFAULT ''"
                    for t in ("gpu_allocations_local", "gpu_allocations", "gpu_allocations_open_local",
                              "gpu_allocations_open")]


def _cols(expr: str) -> set[str]:
    words = set(re.findall(r"\b[a-z_][a-z0-9_]*\b", expr))
    return words - {"cityhash64", "cityHash64", "if", "toDate", "todate"}


def test_sharding_keys_keep_every_version_of_a_row_on_one_shard() -> None:
    creates = _creates(_statements(CLUSTER))
    merging = 0
    for table, key in SHARDING_KEYS.items():
        if "ENGINE = ReplicatedMergeTree(" in creates[local_name(table)]:
            continue                             # rows that never merge: any deterministic key does
        order = re.search(r"\nORDER BY (.+)|\) ENGINE = .*? ORDER BY (.+)$", creates[local_name(table)])
        order_key = next(g for g in order.groups() if g)
        assert _cols(key.replace("cityHash64", "")) <= _cols(order_key), (table, key, order_key)
        merging += 1
    assert merging == 16                         # Replacing and Aggregating tables (kueue_objects: 0010)
    for source, target in VIEWS.values():        # a rollup is built on its source rows' shard
        assert SHARDING_KEYS[source] == SHARDING_KEYS[target]
    assert not any("rand" in k for k in SHARDING_KEYS.values())     # retries must reach the same shard


def test_clickhouse_parses_every_cluster_statement(store) -> None:
    stmts = _statements(CLUSTER)
    for s in stmts:
        out = store.query("SELECT formatQuery({q:String})", {"q": s}).rows[0][0]
        assert out.split()[0] == s.split()[0]
    store.query("SELECT formatQuery({q:String})", {"q": "CREATE TABLE x ON CLUSTER 'c' (a UInt8) ENGINE = Log"})
    with pytest.raises(Exception, match="Syntax error"):       # the check can fail
        store.query("SELECT formatQuery({q:String})", {"q": stmts[3].replace(") ENGINE", ") ENGINE ENGINE")})


def test_the_ttl_alters_go_on_cluster_to_the_local_tables(store) -> None:
    db = store.database
    store.command(f"CREATE TABLE {db}.gpu_samples_local (ts DateTime64(3, 'UTC')) ENGINE = MergeTree ORDER BY ts "
                  f"TTL toDateTime(ts) + INTERVAL 5 DAY")
    on = Store(store.dsn, store._client, cluster=CLUSTER)
    ttl = mig.ttl_expressions(mig.Retention())
    assert mig.ttl_statements(on, ttl) == [
        f"ALTER TABLE {db}.gpu_samples_local ON CLUSTER '{CLUSTER}' MODIFY TTL {ttl['gpu_samples']}"]
    assert on.mutation_target("gpu_allocations_open") == f"{db}.gpu_allocations_open_local ON CLUSTER '{CLUSTER}'"


def test_unknown_statements_and_bad_names_are_refused_with_where() -> None:
    with pytest.raises(ClusterDDLError, match="no cluster form"):
        cluster_statements("RENAME TABLE gpuq.a TO gpuq.b", CLUSTER)
    with pytest.raises(ClusterDDLError, match="no sharding key"):
        cluster_statements("CREATE TABLE IF NOT EXISTS gpuq.new_table (a UInt8) ENGINE = MergeTree ORDER BY a", CLUSTER)
    with pytest.raises(ClusterDDLError, match="unknown alteration"):
        cluster_statements("ALTER TABLE gpuq.gpu_samples DELETE WHERE 1", CLUSTER)
    with pytest.raises(ConfigError, match="store.cluster"):
        cluster_statements("CREATE DATABASE IF NOT EXISTS gpuq", "a'b")
    from gpuq.settings import load_settings

    assert load_settings(store={"cluster": "prod-ch.eu_1"}).store.cluster == "prod-ch.eu_1"
    with pytest.raises(ConfigError, match="store.cluster"):
        load_settings(store={"cluster": "x' OR 1"})
    with pytest.raises(ConfigError, match="store.cluster.*chDB"):
        connect("chdb:///tmp/gpuq-never-opened", cluster=CLUSTER)


_READERS = ["accounting", "scheduler", "collector", "dashboards", "gpuq"]


def test_queries_name_only_public_tables() -> None:
    from accounting import sql

    texts = {k: v for k, v in vars(sql).items() if isinstance(v, str) and k.isupper()}
    texts |= {f"BUCKETS{k}": v for k, v in sql.BUCKETS.items()}
    named = set()
    for name, text in texts.items():
        assert "_local" not in text, name
        named |= set(re.findall(r"\{\{?db\}?\}\.(\w+)", text))
    assert named and named <= set(SHARDING_KEYS) | {"@ALLOC@"}
    local = re.compile(rf"\b({'|'.join(SHARDING_KEYS)})_local\b")
    checked = 0
    for folder in _READERS:                            # and no Python code names a local table
        for py in (REPO / folder).rglob("*.py"):
            if py.parts[-2:] != ("store", "cluster.py"):
                assert not local.search(py.read_text()), py
                checked += 1
    assert checked > 50 and local.search("FROM gpuq.scheduler_state_local FINAL")


@pytest.fixture(scope="module")
def emulated() -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, str(Path(__file__)), "--emulate"], capture_output=True, text=True,
                       timeout=120, cwd=REPO, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_on_a_one_shard_cluster_every_read_matches_the_single_server(emulated: dict[str, Any]) -> None:
    assert emulated["engines"]["gpu_samples"] == "Distributed"
    assert emulated["engines"]["gpu_samples_local"] == "MergeTree"
    assert emulated["engines"]["scheduler_state_local"] == "ReplacingMergeTree"
    assert emulated["views"] == {v: f"{t}_local" for v, (_, t) in VIEWS.items()}
    for name, (plain, clustered) in emulated["reads"].items():
        assert clustered == plain, name
        assert plain, f"{name}: nothing read, the comparison proves nothing"
    assert emulated["reads"]["count_samples"][1] == [[2280]]   # the retried batch (same dedup token) dropped
    assert emulated["pruned"] == [1, 1]                # the DELETE on the local table removed the same pod
    assert emulated["insert_settings"]["insert_distributed_sync"] == 1


def test_a_store_is_not_converted_between_the_two_shapes(emulated: dict[str, Any]) -> None:
    assert "created without a cluster" in emulated["mismatch"]["cluster_on_plain"]
    assert "created on a cluster" in emulated["mismatch"]["plain_on_cluster"]


# --- the emulation, run in its own process (chDB: one engine per process, here with a config) ----
def _emulate(sql: str) -> str:
    """A cluster statement runnable without Keeper: no ON CLUSTER, the plain engines."""
    sql = re.sub(r" ON CLUSTER '[^']*'", "", sql)
    sql = re.sub(r"Replicated(\w*MergeTree)\('[^']*', '\{replica\}'(?:, )?", r"\1(", sql)
    sql = re.sub(r"MergeTree\(\)", "MergeTree", sql)
    return re.sub(r"\breplicated_deduplication_window", "non_replicated_deduplication_window", sql)


def _emulate_main() -> None:  # pragma: no cover - runs in a subprocess
    import tempfile

    import clickhouse_connect

    from accounting import rollup
    from accounting import store_adapter as sa
    from accounting.idle import IdleParams
    from accounting.model import Window
    from gpuq.store import COLUMNS
    from gpuq.store.client import parse_dsn
    from tests.test_accounting_store import NOW, T0, alloc_row, node_row, samples, ts

    root = Path(tempfile.mkdtemp())
    cfg = root / "config.xml"
    cfg.write_text(f"""<clickhouse><tcp_port>9000</tcp_port>
  <remote_servers><{CLUSTER}><shard><internal_replication>true</internal_replication>
    <replica><host>localhost</host><port>9000</port></replica></shard></{CLUSTER}></remote_servers>
  <macros><shard>01</shard><replica>r1</replica></macros></clickhouse>""")
    client = clickhouse_connect.get_client(dsn=f"chdb://{root / 'data'}", chdb_options={"config-file": str(cfg)})
    seen_settings: dict[str, Any] = {}

    class Emulated(Store):
        def command(self, sql: str, parameters: Any = None, settings: Any = None) -> Any:
            return super().command(_emulate(sql), parameters, settings)

        def insert(self, table: str, rows: Any, columns: Any, dedup_token: str | None = None) -> int:
            seen_settings.update(self._write_settings)
            return super().insert(table, rows, columns, dedup_token)

    plain = Store(parse_dsn(f"chdb://{root / 'data'}?database=plain"), client)
    clus = Emulated(parse_dsn(f"chdb://{root / 'data'}?database=clus"), client, cluster=CLUSTER)
    mismatch = {}
    for s in (plain, clus):
        mig.migrate(s)
    for name, s in (("cluster_on_plain", Emulated(plain.dsn, client, cluster=CLUSTER)),
                    ("plain_on_cluster", Store(clus.dsn, client))):
        try:
            mig.migrate(s)
        except ConfigError as exc:
            mismatch[name] = str(exc)
    h100, a100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
    for s in (plain, clus):
        s.insert("node_events", [node_row("h0", h100, 8), node_row("a0", a100, 8)], COLUMNS["node_events"])
        s.insert("gpu_allocations", [
            alloc_row("v1", "u1", "vision", "h0", h100, 8, 0, None, 1),
            alloc_row("v1", "u1", "vision", "h0", h100, 8, 0, 3600, 2),
            alloc_row("v1", "u2", "vision", "h0", h100, 8, 3600, None, 3),
            alloc_row("n1", "u3", "research.nlp", "a0", a100, 2, 1800, None, 1),
            alloc_row("old", "u5", "prod", "h0", h100, 8, -3 * 86400, -2 * 86400, 2)], COLUMNS["gpu_allocations"])
        rows = samples("h0", "GPU-h0-0", "v1", "DCGM_FI_DEV_GPU_UTIL", 0.0, 0, 7200)
        for i in range(1, 4):
            rows += samples("h0", f"GPU-h0-{i}", "v1", "DCGM_FI_DEV_GPU_UTIL", 80.0, 0, 7200)
        rows += samples("a0", "GPU-a0-0", "n1", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.01, 1800, 7200)
        s.insert("gpu_samples", rows, COLUMNS["gpu_samples"], dedup_token="batch-1")
        s.insert("gpu_samples", rows, COLUMNS["gpu_samples"], dedup_token="batch-1")     # a retry: dropped
        s.insert("pod_events", [(ts(1000), "c", "ml", "n2", "u9", "ADDED", "Pending", "", 4.0, "nvidia.com/gpu", "",
                                 "research.nlp", 0, "", "", "7")], COLUMNS["pod_events"])
        s.insert("scheduler_state", [("c", "w1", 1, 0, ts(0), "[[1]]"), ("c", "w1", 2, 0, ts(1), "[[1],[2]]"),
                                     ("c", "w2", 1, 0, ts(0), "[[3]]"), ("c", "w2", 2, 1, ts(2), "")],
                 COLUMNS["scheduler_state"])
    w, p = Window(T0, T0 + 7200), IdleParams()
    reads: dict[str, list[Any]] = {}
    pruned = []
    for s in (plain, clus):
        got = {
            "count_samples": sa._q(s, "SELECT count() FROM {db}.gpu_samples", {}),
            "usage_idle_raw": sa.read_usage_idle(s, w, NOW, p, "raw"),
            "usage_idle_1m": sa.read_usage_idle(s, w, NOW, p, "1m"),
            "usage_idle_1h": sa.read_usage_idle(s, w, NOW, p, "1h"),
            "idle_runs": sa.read_idle_runs(s, w, NOW, p, "1m"),
            "allocations": sa.read_allocations(s, w, NOW),
            "nodes": sa.read_nodes(s, NOW),
            "pending": sa.read_pending(s, NOW),
            "restart_state": sa._q(s, "SELECT workload, events FROM {db}.scheduler_state FINAL ORDER BY workload", {}),
        }
        pruned.append(rollup.prune_open_allocations(s, NOW, keep_s=86400))       # the pod "old"
        rollup.materialize_hours(s, NOW, since_s=T0)
        got["open_after_prune"] = sa._q(s, "SELECT uid FROM {db}.gpu_allocations_open FINAL ORDER BY uid", {})
        got["materialized"] = rollup.read_materialized(s, w)
        for k, v in got.items():
            reads.setdefault(k, []).append(json.loads(json.dumps(v, default=repr)))
    engines = dict(clus.query("SELECT name, engine FROM system.tables WHERE database = 'clus'").rows)
    views = {n: re.search(r" TO clus\.(\w+)", q).group(1) for n, q in clus.query(
        "SELECT name, create_table_query FROM system.tables WHERE database = 'clus' AND engine = 'MaterializedView'").rows}
    print(json.dumps({"engines": engines, "views": views, "reads": reads, "pruned": pruned, "mismatch": mismatch,
                      "insert_settings": seen_settings}))


if __name__ == "__main__" and sys.argv[1:] == ["--emulate"]:
    _emulate_main()
