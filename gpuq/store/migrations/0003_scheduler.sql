-- The scheduler's decisions, in the shape of the simulator's events.jsonl (FORMAT.md):
-- t is the scheduler's clock in seconds (Unix time for `gpuq serve`), seq orders events at the
-- same t, event is submit|admit|preempt|finish|reject|cancel. placement (admit) maps node to
-- GPUs; by and reason name a preemptor and why (reason also on reject and cancel). spec holds
-- the submitted workload and its target as JSON on submit rows (empty elsewhere): a restarted
-- `gpuq serve` rebuilds its pending and running workloads from these rows.
-- Batches carry a dedup token, so a retried or replayed batch is written once.

CREATE TABLE IF NOT EXISTS {db}.scheduler_events (
    ts         DateTime64(3, 'UTC') CODEC(DoubleDelta, ZSTD(1)),
    cluster    LowCardinality(String),
    t          Float64,
    seq        UInt64,
    event      LowCardinality(String),
    workload   String,
    queue      LowCardinality(String),
    gpu_type   LowCardinality(String),
    placement  Map(String, UInt32),
    by         String,
    reason     String CODEC(ZSTD(1)),
    spec       String CODEC(ZSTD(1)),
    INDEX workload_idx workload TYPE bloom_filter GRANULARITY 4
) ENGINE = MergeTree
PARTITION BY toDate(ts)
ORDER BY (cluster, t, seq)
TTL {ttl[scheduler_events]}
SETTINGS non_replicated_deduplication_window = 10000;
