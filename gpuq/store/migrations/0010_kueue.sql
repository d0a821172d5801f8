-- Kueue's objects as the Kubernetes collector last saw them (queues_from: kueue; collector/k8s_kueue.py):
-- ResourceFlavor, Cohort, ClusterQueue, LocalQueue and Workload, one row per object and change; read
-- with FINAL, the latest row of each (cluster, kind, namespace, name) wins, deleted = 1 once it is gone.
-- `object` is the object's JSON (without managedFields). gpuq serve builds the queue tree and the
-- Workloads' views from it (scheduler/service/kueue.py). No TTL: the latest state of a long-lived
-- ClusterQueue must stay; deleted objects are few.
CREATE TABLE IF NOT EXISTS {db}.kueue_objects (
    ts                DateTime64(3, 'UTC'),
    cluster           LowCardinality(String),
    kind              LowCardinality(String),
    namespace         LowCardinality(String),
    name              String,
    uid               String,
    resource_version  String,
    deleted           UInt8,
    object            String CODEC(ZSTD(1))
) ENGINE = ReplacingMergeTree(ts)
ORDER BY (cluster, kind, namespace, name);
