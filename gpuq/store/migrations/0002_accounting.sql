-- Accounting rollups (owned by the accounting package). Placeholders: {db}, {ttl[TABLE]}.
-- gpu_activity_1h: per hour, GPU and pod, the DCGM activity the idle detection needs, so a month
-- of idle GPU-hours reads ~720 rows per GPU instead of every sample.
--   prof_max / util_max: highest DCGM_FI_PROF_GR_ENGINE_ACTIVE (times 100) / DCGM_FI_DEV_GPU_UTIL;
--   prof_minutes / util_minutes: bit m is set when minute m of the hour had such a sample.
CREATE TABLE IF NOT EXISTS {db}.gpu_activity_1h (
    hour          DateTime('UTC'),
    cluster       LowCardinality(String),
    node          LowCardinality(String),
    gpu_uuid      LowCardinality(String),
    mig_instance  LowCardinality(String),
    namespace     LowCardinality(String),
    pod           String,
    prof_max      SimpleAggregateFunction(max, Float64),
    util_max      SimpleAggregateFunction(max, Float64),
    prof_minutes  SimpleAggregateFunction(groupBitOr, UInt64),
    util_minutes  SimpleAggregateFunction(groupBitOr, UInt64)
) ENGINE = AggregatingMergeTree
PARTITION BY toYYYYMM(hour)
ORDER BY (cluster, hour, namespace, pod, node, gpu_uuid, mig_instance)
TTL {ttl[gpu_activity_1h]};

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.gpu_activity_1h_mv TO {db}.gpu_activity_1h AS
SELECT toStartOfHour(ts) AS hour, cluster, node, gpu_uuid, mig_instance, namespace, pod,
       maxIf(value * 100, metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE') AS prof_max,
       maxIf(value, metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_max,
       groupBitOrIf(bitShiftLeft(toUInt64(1), toMinute(ts)), metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE') AS prof_minutes,
       groupBitOrIf(bitShiftLeft(toUInt64(1), toMinute(ts)), metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_minutes
FROM {db}.gpu_samples
WHERE metric IN ('DCGM_FI_PROF_GR_ENGINE_ACTIVE', 'DCGM_FI_DEV_GPU_UTIL') AND pod != ''
GROUP BY hour, cluster, node, gpu_uuid, mig_instance, namespace, pod;

-- accounting_usage_1h: the accounting engine's own results per closed hour (exact, minute-level idle
-- detection), written by accounting.rollup.materialize_hours; a month per queue reads ~720 rows per
-- (queue, namespace, type). A recomputed hour replaces the old rows (ReplacingMergeTree(computed_at)).
-- The idle parameters it used are recorded with each row.
CREATE TABLE IF NOT EXISTS {db}.accounting_usage_1h (
    hour                DateTime('UTC'),
    cluster             LowCardinality(String),
    queue               LowCardinality(String),
    namespace           LowCardinality(String),
    gpu_model           LowCardinality(String),
    gpu_resource        LowCardinality(String),
    gpu_seconds         Float64,
    idle_gpu_seconds    Float64,
    idle_threshold_pct  Float64,
    idle_window_s       Float64,
    computed_at         DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(computed_at)
PARTITION BY toYYYYMM(hour)
ORDER BY (hour, cluster, queue, namespace, gpu_model, gpu_resource)
TTL {ttl[accounting_usage_1h]};

-- The hours accounting_usage_1h holds (an hour without any usage has no row there, but one here).
CREATE TABLE IF NOT EXISTS {db}.accounting_hours (
    hour         DateTime('UTC'),
    computed_at  DateTime64(3, 'UTC')
) ENGINE = ReplacingMergeTree(computed_at)
ORDER BY hour;

-- gpu_allocations_open: the allocations that can still matter to "now" and to the hours not yet
-- materialised, so that reading them does not merge every pod ever seen (gpu_allocations FINAL).
-- A copy of every gpu_allocations row (same columns, same ReplacingMergeTree(version) key, fed by
-- gpu_allocations_open_mv), from which accounting.rollup.prune_open_allocations deletes, every
-- rollup cycle, the pods whose latest row ended before a cutoff (all their rows at once, so no
-- older version is left to resurface). The cutoffs used are in gpu_allocations_open_pruned: a
-- window starting at or after the latest one finds every allocation it overlaps here.
CREATE TABLE IF NOT EXISTS {db}.gpu_allocations_open (
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

CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.gpu_allocations_open_mv TO {db}.gpu_allocations_open AS
SELECT cluster, namespace, pod, uid, queue, node, gpu_model, gpu_resource, gpus, priority, ray_cluster,
       start, end, version
FROM {db}.gpu_allocations;

CREATE TABLE IF NOT EXISTS {db}.gpu_allocations_open_pruned (
    cutoff       DateTime64(3, 'UTC'),
    computed_at  DateTime64(3, 'UTC')
) ENGINE = MergeTree
ORDER BY cutoff;

-- Rows written before this migration (a store that had gpu_allocations already).
INSERT INTO {db}.gpu_allocations_open
SELECT cluster, namespace, pod, uid, queue, node, gpu_model, gpu_resource, gpus, priority, ray_cluster,
       start, end, version
FROM {db}.gpu_allocations
