"""``store.cluster``: the schema on a ClickHouse cluster (shards of replicas, ``remote_servers``).

With a cluster name set, every migration statement is rewritten (:func:`cluster_statements`):

* each MergeTree-family table ``T`` becomes ``T_local``, created ``ON CLUSTER '<name>'`` with the
  ``Replicated`` form of its engine (ZooKeeper path ``/clickhouse/tables/{shard}/{database}/T_local``,
  replica ``{replica}``: the macros of each server, the ClickHouse docs' convention; the engine's
  own arguments follow, e.g. ``ReplicatedReplacingMergeTree(path, replica, version, deleted)``),
  with its columns, codecs, indexes, partitioning, order and TTL unchanged
  (``non_replicated_deduplication_window`` becomes ``replicated_deduplication_window``);
* ``T`` itself becomes ``Distributed('<name>', '<db>', 'T_local', <sharding key>)`` over them, so
  every query, insert and read of gpuq keeps its table names;
* a materialized view reads the *local* source table and writes into the *local* target table on
  each server: a rollup row is built on the shard that holds its raw rows, and the rollup table's
  Distributed sharding key is its source's (:data:`SHARDING_KEYS`), so a row inserted directly
  would land on the same shard;
* ``ALTER TABLE ... ADD/DROP/MODIFY COLUMN`` goes ``ON CLUSTER`` to the local table and to the
  Distributed one (``CREATE TABLE ... AS`` copied the columns once only); ``MODIFY TTL``, ``MATERIALIZE COLUMN`` and
  ``MODIFY SETTING`` to the local table (``non_replicated_deduplication_window`` becomes
  ``replicated_deduplication_window``); ``DELETE FROM`` (a lightweight delete) ``ON CLUSTER`` to the
  local table, as :meth:`gpuq.store.client.Store.mutation_target` does; ``DROP VIEW`` and
  ``CREATE DATABASE`` ``ON CLUSTER``; ``INSERT ... SELECT`` is left as written (Distributed to
  Distributed: a rollup rebuilt from its raw rows lands on their shard by the shared sharding key).

Sharding keys (:data:`SHARDING_KEYS`). ``FINAL`` on a Distributed table deduplicates within each
shard only, and a rollup's rows are merged within each shard only: so every key of a
ReplacingMergeTree or AggregatingMergeTree table is a hash of columns of its ``ORDER BY`` key (all
versions of one row land on one shard), and every rollup fed by a view takes its source's key,
whose columns are part of the rollup's key. Keys are deterministic (never ``rand()``): a batch
retried with the same ``insert_deduplication_token`` must reach the same shards to be dropped
there. Queries that read rollups aggregate again (``sum``/``max``/``groupBitOr`` ... ``GROUP BY``)
on the initiator, which is right however rows are spread.

Inserts go through the Distributed tables with ``insert_distributed_sync = 1`` (the store sets it,
:class:`gpuq.store.client.Store`): an insert returns once every shard has its part, so an error
reaches the writer (retry, spill) instead of a background queue, the dedup token is checked on
each shard, and the scheduler reads its own restart state back.

No ClickHouse cluster ran where this was written: the statements are checked by ClickHouse's own
parser (``formatQuery`` in chDB) and, with the Replicated engines and ``ON CLUSTER`` taken out, run
on chDB with a one-shard ``remote_servers`` cluster (``tests/test_store_cluster.py``).
"""
from __future__ import annotations

import re

from gpuq.errors import ConfigError

CLUSTER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,99}$")
LOCAL_SUFFIX = "_local"
ZK_PATH = "/clickhouse/tables/{shard}/{database}/"

# Public table -> the Distributed table's sharding key (why, per table: see docs/SCHEMA.md).
_GPU = "cityHash64(cluster, node, gpu_uuid)"          # one GPU's series (and its rollups) on one shard
_RAY = "cityHash64(cluster, node)"
_ALLOC = "cityHash64(cluster, uid)"                   # the ReplacingMergeTree key (cluster, uid)
SHARDING_KEYS: dict[str, str] = {
    "schema_migrations": "cityHash64(version)",
    "gpu_samples": _GPU,
    "gpu_samples_1m": _GPU,                           # fed by gpu_samples_1m_mv on gpu_samples' shard
    "gpu_activity_1h": _GPU,                          # fed by gpu_activity_1h_mv on gpu_samples' shard
    "ray_resources": _RAY,
    "ray_resources_1m": _RAY,                         # fed by ray_resources_1m_mv
    "ray_nodes": "cityHash64(cluster, node_id)",
    "ray_jobs": "cityHash64(cluster, if(submission_id = '', job_id, submission_id))",
    "ray_placement_groups": "cityHash64(cluster, placement_group_id)",
    "pod_events": "cityHash64(cluster, uid)",
    "node_events": "cityHash64(cluster, node)",
    "gpu_allocations": _ALLOC,
    "gpu_allocations_open": _ALLOC,                   # fed by gpu_allocations_open_mv
    "gpu_allocations_open_pruned": "cityHash64(cutoff)",
    "collector_state": "cityHash64(cluster, source, key)",
    "kueue_objects": "cityHash64(cluster, kind, namespace, name)",   # the ReplacingMergeTree key
    "accounting_usage_1h": "cityHash64(cluster, queue, hour)",
    "accounting_hours": "cityHash64(hour)",
    "scheduler_events": "cityHash64(cluster, workload)",   # a workload's events together
    "scheduler_state": "cityHash64(cluster, workload)",    # the ReplacingMergeTree key
}

# Materialized view -> (source, target): the pairs whose sharding keys must agree.
VIEWS: dict[str, tuple[str, str]] = {
    "gpu_samples_1m_mv": ("gpu_samples", "gpu_samples_1m"),
    "ray_resources_1m_mv": ("ray_resources", "ray_resources_1m"),
    "gpu_activity_1h_mv": ("gpu_samples", "gpu_activity_1h"),
    "gpu_allocations_open_mv": ("gpu_allocations", "gpu_allocations_open"),
}


class ClusterDDLError(ValueError):
    """A migration statement of a shape the cluster rewrite does not know (add it here first)."""


def check_cluster_name(name: str) -> str:
    """The cluster name, checked: it is quoted into DDL, so only ``[A-Za-z0-9_.-]``."""
    if not isinstance(name, str) or not CLUSTER_NAME.match(name):
        raise ConfigError("store.cluster", f"{name!r} is not a cluster name of remote_servers "
                                           f"(letters, digits, '_', '.', '-'; starting with a letter or '_')")
    return name


def local_name(table: str) -> str:
    return table + LOCAL_SUFFIX


def on_cluster(cluster: str) -> str:
    return f" ON CLUSTER '{check_cluster_name(cluster)}'"


def sharding_key(table: str) -> str:
    try:
        return SHARDING_KEYS[table]
    except KeyError:
        raise ClusterDDLError(f"table {table!r} has no sharding key in gpuq.store.cluster.SHARDING_KEYS") from None


_CREATE_TABLE = re.compile(r"^CREATE TABLE IF NOT EXISTS (\w+)\.(\w+) \(", re.S)
_ENGINE = re.compile(r"\)\s*ENGINE = (\w*)MergeTree(?:\(([^()]*)\))?")
_CREATE_MV = re.compile(r"^CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+)\.(\w+) TO (\w+)\.(\w+) AS\b(.*)$", re.S)
_ALTER = re.compile(r"^ALTER TABLE (\w+)\.(\w+) (.*)$", re.S)
_ALTER_COLUMN = re.compile(r"^(ADD|DROP|MODIFY|RENAME|COMMENT|CLEAR) COLUMN\b")
_DELETE = re.compile(r"^DELETE FROM (\w+)\.(\w+) WHERE (.*)$", re.S)
_DROP_VIEW = re.compile(r"^DROP VIEW IF EXISTS (\w+)\.(\w+)$")
_CREATE_DB = re.compile(r"^CREATE DATABASE IF NOT EXISTS (\w+)$")


def _create_table(stmt: str, m: re.Match[str], cluster: str) -> list[str]:
    db, table = m.group(1), m.group(2)
    key = sharding_key(table)
    engines = list(_ENGINE.finditer(stmt))
    if len(engines) != 1:
        raise ClusterDDLError(f"CREATE TABLE {db}.{table}: expected one '... ENGINE = *MergeTree', "
                              f"found {len(engines)}")
    e = engines[0]
    local = local_name(table)
    args = f"'{ZK_PATH}{local}', '{{replica}}'" + (f", {e.group(2)}" if e.group(2) else "")
    engine = f") ENGINE = Replicated{e.group(1)}MergeTree({args})"
    body = stmt[m.end():e.start()]
    tail = stmt[e.end():].replace("non_replicated_deduplication_window", "replicated_deduplication_window")
    head = f"CREATE TABLE IF NOT EXISTS {db}.{local}{on_cluster(cluster)} ("
    dist = (f"CREATE TABLE IF NOT EXISTS {db}.{table}{on_cluster(cluster)} AS {db}.{local} "
            f"ENGINE = Distributed('{cluster}', '{db}', '{local}', {key})")
    return [head + body + engine + tail, dist]


def cluster_statements(stmt: str, cluster: str) -> list[str]:
    """One formatted migration statement (``{db}`` and ``{ttl[...]}`` already substituted) as the
    statements that do the same on ``cluster``; raises :class:`ClusterDDLError` on a statement of
    an unknown shape rather than guessing."""
    check_cluster_name(cluster)
    s = stmt.strip()
    if m := _CREATE_TABLE.match(s):
        return _create_table(s, m, cluster)
    if m := _CREATE_MV.match(s):
        db, view, tdb, target, select = m.groups()
        if view not in VIEWS:
            raise ClusterDDLError(f"materialized view {db}.{view} is not in gpuq.store.cluster.VIEWS")
        source, vtarget = VIEWS[view]
        if vtarget != target:
            raise ClusterDDLError(f"materialized view {db}.{view} writes to {target}, VIEWS says {vtarget}")
        sources = re.findall(rf"\b(?:FROM|JOIN) {re.escape(db)}\.(\w+)", select)
        if sources != [source]:
            raise ClusterDDLError(f"materialized view {db}.{view} reads {sources}, VIEWS says [{source!r}]")
        select = re.sub(rf"\b(FROM|JOIN) {re.escape(db)}\.{source}\b", rf"\1 {db}.{local_name(source)}", select)
        return [f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{view}{on_cluster(cluster)} "
                f"TO {tdb}.{local_name(target)} AS{select}"]
    if m := _ALTER.match(s):
        db, table, rest = m.groups()
        sharding_key(table)                               # a table this module knows
        local = f"ALTER TABLE {db}.{local_name(table)}{on_cluster(cluster)} {rest}"
        if _ALTER_COLUMN.match(rest):
            return [local, f"ALTER TABLE {db}.{table}{on_cluster(cluster)} {rest}"]
        if rest.startswith("MODIFY TTL ") or rest.startswith("MATERIALIZE COLUMN "):   # the data's: local
            return [local]
        if rest.startswith("MODIFY SETTING "):              # the engine's settings: the local table's
            return [local.replace("non_replicated_deduplication_window", "replicated_deduplication_window")]
        raise ClusterDDLError(f"ALTER TABLE {db}.{table}: unknown alteration {rest[:40]!r}")
    if m := _DELETE.match(s):
        db, table, where = m.groups()
        sharding_key(table)
        return [f"DELETE FROM {db}.{local_name(table)}{on_cluster(cluster)} WHERE {where}"]
    if m := _DROP_VIEW.match(s):
        return [f"DROP VIEW IF EXISTS {m.group(1)}.{m.group(2)}{on_cluster(cluster)}"]
    if m := _CREATE_DB.match(s):
        return [f"CREATE DATABASE IF NOT EXISTS {m.group(1)}{on_cluster(cluster)}"]
    if s.startswith("INSERT INTO "):
        return [s]
    raise ClusterDDLError(f"no cluster form for the statement {s[:60]!r}")
