-- The scheduler's restart state, kept apart from the TTL'd scheduler_events (issue 9): one row per
-- workload still open (pending or running), holding every event of it since its submit (the submit
-- with its spec included) as JSON: [[seq, event, spec], ...] in the order they took effect. It is
-- written with each event (version = the event's seq); when the workload ends (finish, cancel,
-- reject) a row with deleted = 1 replaces it. No TTL: a workload running longer than any retention
-- is still known after a restart. Read with FINAL (scheduler.service_replay.read_restart).
CREATE TABLE IF NOT EXISTS {db}.scheduler_state (
    cluster   LowCardinality(String),
    workload  String,
    version   UInt64,
    deleted   UInt8,
    ts        DateTime64(3, 'UTC'),
    events    String CODEC(ZSTD(1))
) ENGINE = ReplacingMergeTree(version, deleted)
ORDER BY (cluster, workload);
