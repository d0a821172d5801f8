-- Rollups exactly once (issue 16). A batch inserted with its dedup token and then retried or
-- replayed (a spill file replayed after a crash between its insert and the removal of its file) was
-- dropped by gpu_samples but summed again by its materialized views into the rollups. Inserts now
-- carry deduplicate_blocks_in_dependent_materialized_views = 1 (gpuq.store.client.DEDUP_SETTINGS)
-- and every view's target keeps a deduplication window of its own, as its source does
-- (gpu_allocations gets one too: it had none, so a replayed batch doubled its rows and the view's).
-- Placeholders: {db}; {since[ROLLUP]} the start of the first minute/hour whose raw rows are all still
-- within the raw table's retention (gpuq.store.rebuild, computed once per run): the rollup is rebuilt
-- from the raw rows from there on, with the view's own expressions; its older rows are kept as they
-- were and logged (gpuq.store.rebuild.report_kept). docs/SCHEMA.md, "Rollups exactly once".
-- gpu_allocations_open is not rebuilt: it is read with FINAL (a repeated row never counted twice),
-- and a copy of gpu_allocations would bring back every pod pruned from it.
ALTER TABLE {db}.gpu_samples_1m MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE {db}.ray_resources_1m MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE {db}.gpu_activity_1h MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE {db}.gpu_allocations MODIFY SETTING non_replicated_deduplication_window = 10000;
ALTER TABLE {db}.gpu_allocations_open MODIFY SETTING non_replicated_deduplication_window = 10000;

-- The rebuild (gpuq.store.rebuild.statements, the views' own expressions): each DELETE and its
-- INSERT cover the same range (a fixed time), so re-running an interrupted migration gives the same
-- rows.
DELETE FROM {db}.gpu_samples_1m WHERE minute >= {since[gpu_samples_1m]};
INSERT INTO {db}.gpu_samples_1m (minute, cluster, node, gpu_uuid, mig_instance, gpu_model, namespace, pod, metric, value_sum, value_count, value_min, value_max)
SELECT toStartOfMinute(ts) AS minute, cluster, node, gpu_uuid, mig_instance, anyLast(toString(gpu_model)) AS gpu_model, namespace, pod, metric, sum(value) AS value_sum, toUInt64(count()) AS value_count, min(value) AS value_min, max(value) AS value_max
FROM {db}.gpu_samples
WHERE ts >= {since[gpu_samples_1m]}
GROUP BY minute, cluster, node, gpu_uuid, mig_instance, namespace, pod, metric
SETTINGS insert_deduplicate = 0;

DELETE FROM {db}.ray_resources_1m WHERE minute >= {since[ray_resources_1m]};
INSERT INTO {db}.ray_resources_1m (minute, cluster, node, resource, state, value_sum, value_count, value_max)
SELECT toStartOfMinute(ts) AS minute, cluster, node, resource, state, sum(value) AS value_sum, toUInt64(count()) AS value_count, max(value) AS value_max
FROM {db}.ray_resources
WHERE ts >= {since[ray_resources_1m]}
GROUP BY minute, cluster, node, resource, state
SETTINGS insert_deduplicate = 0;

DELETE FROM {db}.gpu_activity_1h WHERE hour >= {since[gpu_activity_1h]};
INSERT INTO {db}.gpu_activity_1h (hour, cluster, node, gpu_uuid, mig_instance, namespace, pod, prof_max, util_max, prof_minutes, util_minutes)
SELECT toStartOfHour(ts) AS hour, cluster, node, gpu_uuid, mig_instance, namespace, pod, maxIf(value * 100, metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE') AS prof_max, maxIf(value, metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_max, groupBitOrIf(bitShiftLeft(toUInt64(1), toMinute(ts)), metric = 'DCGM_FI_PROF_GR_ENGINE_ACTIVE') AS prof_minutes, groupBitOrIf(bitShiftLeft(toUInt64(1), toMinute(ts)), metric = 'DCGM_FI_DEV_GPU_UTIL') AS util_minutes
FROM {db}.gpu_samples
WHERE metric IN ('DCGM_FI_PROF_GR_ENGINE_ACTIVE', 'DCGM_FI_DEV_GPU_UTIL') AND pod != '' AND ts >= {since[gpu_activity_1h]}
GROUP BY hour, cluster, node, gpu_uuid, mig_instance, namespace, pod
SETTINGS insert_deduplicate = 0
