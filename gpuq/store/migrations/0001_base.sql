-- gpuq public schema, version 1. Placeholders: {db} database, {ttl[TABLE]} the
-- table's TTL expression (gpuq.store.migrate: retention by kind, on DateTime64 so it cannot wrap).
-- Time is UTC, DateTime64(3). Raw series are MergeTree, partitioned by day, TTL'd.
-- Sources that repeat themselves (State API snapshots, relists) go to ReplacingMergeTree:
-- read them with FINAL or argMax.

CREATE TABLE IF NOT EXISTS {db}.gpu_samples (
    ts           DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    cluster      LowCardinality(String),
    node         LowCardinality(String),
    gpu_uuid     LowCardinality(String),
    gpu_index    UInt16,
    gpu_model    LowCardinality(String),
    mig_profile  LowCardinality(String),
    mig_instance LowCardinality(String),
    pod          String CODEC(ZSTD(1)),
    namespace    LowCardinality(String),
    container    LowCardinality(String),
    metric       LowCardinality(String),
    value        Float64 CODEC(Gorilla, ZSTD(1)),
    source       LowCardinality(String)
) ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (cluster, metric, node, gpu_uuid, mig_instance, ts)
TTL {ttl[gpu_samples]}
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.ray_resources (
    ts        DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    cluster   LowCardinality(String),
    node      LowCardinality(String),
    resource  LowCardinality(String),
    state     LowCardinality(String),
    value     Float64 CODEC(Gorilla, ZSTD(1))
) ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (cluster, resource, state, node, ts)
TTL {ttl[ray_resources]}
SETTINGS non_replicated_deduplication_window = 10000;

CREATE TABLE IF NOT EXISTS {db}.ray_nodes (
    ts              DateTime64(3, 'UTC'),
    cluster         LowCardinality(String),
    node_id         String,
    node_ip         String,
    node_name       String,
    is_head         UInt8,
    state           LowCardinality(String),
    resources_total Map(LowCardinality(String), Float64),
    labels          Map(LowCardinality(String), String)
) ENGINE = ReplacingMergeTree(ts)
PARTITION BY toYYYYMM(ts)
ORDER BY (cluster, node_id)
TTL {ttl[ray_nodes]};

CREATE TABLE IF NOT EXISTS {db}.ray_jobs (
    ts             DateTime64(3, 'UTC'),
    cluster        LowCardinality(String),
    job_id         String,
    submission_id  String,
    status         LowCardinality(String),
    entrypoint     String CODEC(ZSTD(1)),
    start_time     Nullable(DateTime64(3, 'UTC')),
    end_time       Nullable(DateTime64(3, 'UTC')),
    metadata       Map(String, String)
) ENGINE = ReplacingMergeTree(ts)
PARTITION BY toYYYYMM(ts)
ORDER BY (cluster, if(submission_id = '', job_id, submission_id))
TTL {ttl[ray_jobs]};

CREATE TABLE IF NOT EXISTS {db}.ray_placement_groups (
    ts                  DateTime64(3, 'UTC'),
    cluster             LowCardinality(String),
    placement_group_id  String,
    name                String,
    job_id              String,
    state               LowCardinality(String),
    strategy            LowCardinality(String),
    bundles             UInt32,
    gpus                Float64,
    bundles_json        String CODEC(ZSTD(1))
) ENGINE = ReplacingMergeTree(ts)
PARTITION BY toYYYYMM(ts)
ORDER BY (cluster, placement_group_id)
TTL {ttl[ray_placement_groups]};

CREATE TABLE IF NOT EXISTS {db}.pod_events (
    ts                DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    cluster           LowCardinality(String),
    namespace         LowCardinality(String),
    pod               String,
    uid               String,
    event             LowCardinality(String),
    phase             LowCardinality(String),
    node              LowCardinality(String),
    gpus              Float64,
    gpu_resource      LowCardinality(String),
    gpu_model         LowCardinality(String),
    queue             LowCardinality(String),
    priority          Int32,
    ray_cluster       String,
    ray_node_type     LowCardinality(String),
    resource_version  String
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (cluster, namespace, pod, uid, resource_version, event)
TTL {ttl[pod_events]};

CREATE TABLE IF NOT EXISTS {db}.node_events (
    ts                DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    cluster           LowCardinality(String),
    node              LowCardinality(String),
    uid               String,
    event             LowCardinality(String),
    ready             UInt8,
    unschedulable     UInt8,
    gpu_model         LowCardinality(String),
    gpu_capacity      Float64,
    gpu_allocatable   Float64,
    mig_resources     Map(LowCardinality(String), Float64),
    labels            Map(LowCardinality(String), String),
    resource_version  String
) ENGINE = ReplacingMergeTree
PARTITION BY toDate(ts)
ORDER BY (cluster, node, uid, resource_version, event)
TTL {ttl[node_events]};

-- One row per pod that held GPUs; the row with the highest version wins (read with FINAL).
-- `end` is NULL while the pod runs.
CREATE TABLE IF NOT EXISTS {db}.gpu_allocations (
    cluster       LowCardinality(String),
    namespace     LowCardinality(String),
    pod           String,
    uid           String,
    queue         LowCardinality(String),
    node          LowCardinality(String),
    gpu_model     LowCardinality(String),
    gpu_resource  LowCardinality(String),
    gpus          Float64,
    priority      Int32,
    ray_cluster   String,
    start         DateTime64(3, 'UTC'),
    end           Nullable(DateTime64(3, 'UTC')),
    version       UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY (cluster, uid);

-- Where each collector stopped (Kubernetes resourceVersion and the like).
CREATE TABLE IF NOT EXISTS {db}.collector_state (
    ts       DateTime64(3, 'UTC'),
    cluster  LowCardinality(String),
    source   LowCardinality(String),
    key      String,
    value    String
) ENGINE = ReplacingMergeTree(ts)
ORDER BY (cluster, source, key);

-- Rollups for accounting and dashboards: per-minute aggregates of the raw series.
CREATE TABLE IF NOT EXISTS {db}.gpu_samples_1m (
    minute       DateTime('UTC'),
    cluster      LowCardinality(String),
    node         LowCardinality(String),
    gpu_uuid     LowCardinality(String),
    mig_instance LowCardinality(String),
    gpu_model    SimpleAggregateFunction(anyLast, String),
    namespace    LowCardinality(String),
    pod          String,
    metric       LowCardinality(String),
    value_sum    SimpleAggregateFunction(sum, Float64),
    value_count  SimpleAggregateFunction(sum, UInt64),
    value_min    SimpleAggregateFunction(min, Float64),
    value_max    SimpleAggregateFunction(max, Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (cluster, metric, node, gpu_uuid, mig_instance, namespace, pod, minute)
TTL {ttl[gpu_samples_1m]};

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.gpu_samples_1m_mv TO {db}.gpu_samples_1m AS
SELECT toStartOfMinute(ts) AS minute, cluster, node, gpu_uuid, mig_instance,
       anyLast(toString(gpu_model)) AS gpu_model, namespace, pod, metric,
       sum(value) AS value_sum, toUInt64(count()) AS value_count,
       min(value) AS value_min, max(value) AS value_max
FROM {db}.gpu_samples
GROUP BY minute, cluster, node, gpu_uuid, mig_instance, namespace, pod, metric;

CREATE TABLE IF NOT EXISTS {db}.ray_resources_1m (
    minute       DateTime('UTC'),
    cluster      LowCardinality(String),
    node         LowCardinality(String),
    resource     LowCardinality(String),
    state        LowCardinality(String),
    value_sum    SimpleAggregateFunction(sum, Float64),
    value_count  SimpleAggregateFunction(sum, UInt64),
    value_max    SimpleAggregateFunction(max, Float64)
) ENGINE = AggregatingMergeTree
PARTITION BY toDate(minute)
ORDER BY (cluster, resource, state, node, minute)
TTL {ttl[ray_resources_1m]};

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.ray_resources_1m_mv TO {db}.ray_resources_1m AS
SELECT toStartOfMinute(ts) AS minute, cluster, node, resource, state,
       sum(value) AS value_sum, toUInt64(count()) AS value_count, max(value) AS value_max
FROM {db}.ray_resources
GROUP BY minute, cluster, node, resource, state;
