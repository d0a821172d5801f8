-- The one ledger of allocations (docs/ARCHITECTURE.md, "The ledger"): gpu_allocations holds every
-- observed or admitted allocation, with where it was seen.
--   source       pod | placement_group | ray_job | admission (precedence in that order: a workload
--                seen by several sources is counted once, from the first)
--   workload_id  the gpuq workload id when the allocation belongs to one (pods: the top owner's
--                gpuq.io/workload annotation; placement groups: named gpuq-<id>; Ray jobs: submission
--                id gpuq-<id>; admissions: the id), else ''
--   owner_kind, owner  the pod's top owner (RayJob, RayCluster, Job, ...), '' for a bare pod
ALTER TABLE {db}.gpu_allocations ADD COLUMN IF NOT EXISTS source LowCardinality(String) DEFAULT 'pod';
ALTER TABLE {db}.gpu_allocations ADD COLUMN IF NOT EXISTS workload_id String DEFAULT '';
ALTER TABLE {db}.gpu_allocations ADD COLUMN IF NOT EXISTS owner_kind LowCardinality(String) DEFAULT '';
ALTER TABLE {db}.gpu_allocations ADD COLUMN IF NOT EXISTS owner String DEFAULT '';
ALTER TABLE {db}.gpu_allocations_open ADD COLUMN IF NOT EXISTS source LowCardinality(String) DEFAULT 'pod';
ALTER TABLE {db}.gpu_allocations_open ADD COLUMN IF NOT EXISTS workload_id String DEFAULT '';
ALTER TABLE {db}.gpu_allocations_open ADD COLUMN IF NOT EXISTS owner_kind LowCardinality(String) DEFAULT '';
ALTER TABLE {db}.gpu_allocations_open ADD COLUMN IF NOT EXISTS owner String DEFAULT '';
DROP VIEW IF EXISTS {db}.gpu_allocations_open_mv;
CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.gpu_allocations_open_mv TO {db}.gpu_allocations_open AS
SELECT cluster, namespace, pod, uid, queue, node, gpu_model, gpu_resource, gpus, priority, ray_cluster,
       start, end, version, source, workload_id, owner_kind, owner
FROM {db}.gpu_allocations;
