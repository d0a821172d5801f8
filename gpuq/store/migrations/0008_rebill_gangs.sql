-- Bills of multi-node allocations (issue 16). Before, the accounting read the ledger per workload and
-- cut a placement group's or an admission's rows on every node but one (they share one pod name):
-- a gang on two nodes was billed for one. The hours materialised that way (accounting_usage_1h,
-- accounting_hours) are removed for every hour such an allocation touched, so they are computed
-- from the ledger again (it never expires): by gpuq serve's materialisation for the last 48 hours,
-- live by every usage query for older ones (docs/SCHEMA.md, "Bills made before 0008").
DELETE FROM {db}.accounting_usage_1h WHERE hour IN (SELECT arrayJoin(arrayMap(i -> toDateTime(toStartOfHour(start), 'UTC') + toIntervalHour(i), range(toUInt32(dateDiff('hour', toStartOfHour(start), toStartOfHour(coalesce(end, now64(3)))) + 1)))) FROM {db}.gpu_allocations FINAL WHERE source != 'pod' AND (cluster, namespace, pod) IN (SELECT cluster, namespace, pod FROM {db}.gpu_allocations FINAL WHERE source != 'pod' GROUP BY cluster, namespace, pod HAVING uniqExact(node) > 1));
DELETE FROM {db}.accounting_hours WHERE hour IN (SELECT arrayJoin(arrayMap(i -> toDateTime(toStartOfHour(start), 'UTC') + toIntervalHour(i), range(toUInt32(dateDiff('hour', toStartOfHour(start), toStartOfHour(coalesce(end, now64(3)))) + 1)))) FROM {db}.gpu_allocations FINAL WHERE source != 'pod' AND (cluster, namespace, pod) IN (SELECT cluster, namespace, pod FROM {db}.gpu_allocations FINAL WHERE source != 'pod' GROUP BY cluster, namespace, pod HAVING uniqExact(node) > 1))
