"""SQL for the store adapter. Each query mirrors a pure function of the engine (named below) so
tests can check that both give the same numbers on the same rows.

Parameters are ClickHouse query parameters; times are Unix milliseconds (``Int64``); ``{db}`` is
substituted with the database name (an identifier checked by the store).
"""
from __future__ import annotations

PROF = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
_W = ("fromUnixTimestamp64Milli({f:Int64}, 'UTC') AS wf, fromUnixTimestamp64Milli({t:Int64}, 'UTC') AS wt, "
      "fromUnixTimestamp64Milli({n:Int64}, 'UTC') AS wn")

# Allocations overlapping [wf, wt) with the end they really had (accounting.intervals.effective_ends):
# open rows count to now, and a row is cut at the start of the next uid of the same pod.
ALLOC_SPANS = """
SELECT cluster, namespace, pod, uid, queue, node, gpu_model, gpu_resource, gpus, priority, ray_cluster, start,
       end, least(coalesce(end, wn), wn, coalesce(next_start, wn)) AS eff_end
FROM (
  SELECT *, leadInFrame(toNullable(start)) OVER (PARTITION BY cluster, namespace, pod ORDER BY start, uid
                                                 ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS next_start
  FROM {db}.gpu_allocations FINAL
  WHERE start < wt AND (end IS NULL OR end > wf)
)"""

# GPU-seconds per UsageAgg key (accounting.intervals.clip + to_aggs).
USAGE = f"""
WITH {_W}
SELECT cluster, queue, namespace, if({{by_workload:UInt8}}, if(ray_cluster != '', ray_cluster, pod), '') AS workload,
       gpu_model, gpu_resource, sum(gpus * greatest(0, toUnixTimestamp64Milli(least(eff_end, wt)) - toUnixTimestamp64Milli(greatest(start, wf)))) / 1000
         AS gpu_seconds
FROM ({ALLOC_SPANS})
GROUP BY cluster, queue, namespace, workload, gpu_model, gpu_resource
HAVING gpu_seconds > 0
ORDER BY cluster, queue, namespace, workload, gpu_model, gpu_resource"""

ALLOCATIONS = f"""
WITH {_W}
SELECT cluster, namespace, pod, uid, queue, node, gpu_model, gpus, toUnixTimestamp64Milli(start) / 1000,
       if(end IS NULL, NULL, toUnixTimestamp64Milli(assumeNotNull(end)) / 1000), gpu_resource, priority, ray_cluster
FROM {{db}}.gpu_allocations FINAL
WHERE start < wt AND (end IS NULL OR end > wf)
ORDER BY cluster, namespace, pod, start, uid"""

# Activity per (GPU, pod, bucket) (accounting.idle.activity_points), from three sources. Series are
# grouped by a 64-bit hash of their six key strings (twice as fast as grouping by the strings).
BUCKETS_RAW = f"""
SELECT cityHash64(cluster, node, gpu_uuid, mig_instance, namespace, pod) AS h, any((cluster, node, gpu_uuid, mig_instance, namespace, pod)) AS k,
       toInt64(toUnixTimestamp(toStartOfInterval(ts, toIntervalSecond({{bucket:UInt32}})))) AS b,
       if(countIf(metric = '{PROF}') > 0, maxIf(value, metric = '{PROF}') * 100, maxIf(value, metric = '{UTIL}')) AS act
FROM {{db}}.gpu_samples
WHERE metric IN ('{PROF}', '{UTIL}') AND pod != '' AND ts >= wscan AND ts < wscan_end
GROUP BY h, b"""

BUCKETS_1M = f"""
SELECT cityHash64(cluster, node, gpu_uuid, mig_instance, namespace, pod) AS h, any((cluster, node, gpu_uuid, mig_instance, namespace, pod)) AS k, toInt64(toUnixTimestamp(minute)) AS b,
       if(countIf(metric = '{PROF}') > 0, maxIf(value_max, metric = '{PROF}') * 100,
          maxIf(value_max, metric = '{UTIL}')) AS act
FROM {{db}}.gpu_samples_1m
WHERE metric IN ('{PROF}', '{UTIL}') AND pod != '' AND minute >= wscan AND minute < wscan_end
GROUP BY h, b"""

# An hour with fewer than {min_minutes:UInt8} minutes of data is unknown: it counts as not quiet.
BUCKETS_1H = """
SELECT cityHash64(cluster, node, gpu_uuid, mig_instance, namespace, pod) AS h, any((cluster, node, gpu_uuid, mig_instance, namespace, pod)) AS k, toInt64(toUnixTimestamp(hour)) AS b,
       if(bitCount(bitOr(groupBitOr(prof_minutes), groupBitOr(util_minutes))) < {min_minutes:UInt8}, 1e9,
          if(groupBitOr(prof_minutes) != 0, max(prof_max), max(util_max))) AS act
FROM {db}.gpu_activity_1h
WHERE hour >= wscan AND hour < wscan_end
GROUP BY h, b"""

# Idle runs (accounting.idle.idle_runs): per (GPU, pod) the buckets in time order; a bucket starts
# a new run when it follows a busy one or a gap over {reach}. Arrays, not window functions: one
# pass per series, and only the runs come out. The lambdas take shifted copies of the arrays
# rather than indexing a captured array, which ClickHouse would copy for every element (O(n^2)).
RUNS = """
SELECT k.1 AS cluster, k.2 AS node, k.3 AS gpu_uuid, k.4 AS mig_instance, k.5 AS namespace, k.6 AS pod,
       bs[se.1] AS s, bs[se.2] + {bucket:UInt32} AS e, se.2 = length(bs) AS is_open
FROM (
  SELECT any(k) AS k, arraySort(groupArray((b, act))) AS pts,
         arrayMap(x -> x.1, pts) AS bs,
         arrayMap(x -> x.2 < {threshold:Float64}, pts) AS q,
         arrayMap((cur, prev, prev_q) -> NOT prev_q OR cur - prev > {reach:UInt32},
                  bs, arrayPushFront(arrayPopBack(bs), 0), arrayPushFront(arrayPopBack(q), 0)) AS brk,
         arrayFilter((i, qi, bi) -> qi AND bi, arrayEnumerate(bs), q, brk) AS starts,
         arrayFilter((i, qi, next_brk, next_q) -> qi AND (next_brk OR NOT next_q), arrayEnumerate(bs), q,
                     arrayPushBack(arrayPopFront(brk), 1), arrayPushBack(arrayPopFront(q), 0)) AS ends
  FROM (@SUB@)
  GROUP BY h
)
ARRAY JOIN arrayZip(starts, ends) AS se
WHERE e - s >= {window:UInt32}"""

SCAN = ("fromUnixTimestamp64Milli({scan:Int64}, 'UTC') AS wscan, "
        "fromUnixTimestamp64Milli({scan_end:Int64}, 'UTC') AS wscan_end")

# Idle GPU-seconds per UsageAgg key (accounting.idle.attribute_idle), runs clipped to the window and
# to the span of the pod's allocations.
IDLE = f"""
WITH {_W}, {SCAN}
SELECT r.cluster, a.queue, r.namespace, if({{by_workload:UInt8}}, a.workload, '') AS workload, a.gpu_model, a.gpu_resource,
       sum(greatest(0, least(r.e * 1000, toUnixTimestamp64Milli(wt), a.last_end)
                       - greatest(r.s * 1000, toUnixTimestamp64Milli(wf), a.first_start))) / 1000 AS idle_gpu_seconds
FROM (@SUB@) AS r
INNER JOIN (
  SELECT cluster, namespace, pod, argMax(queue, start) AS queue,
         argMax(if(ray_cluster != '', ray_cluster, pod), start) AS workload, argMax(gpu_model, start) AS gpu_model,
         argMax(gpu_resource, start) AS gpu_resource, min(toUnixTimestamp64Milli(start)) AS first_start,
         max(toUnixTimestamp64Milli(eff_end)) AS last_end
  FROM ({ALLOC_SPANS}) GROUP BY cluster, namespace, pod
) AS a ON r.cluster = a.cluster AND r.namespace = a.namespace AND r.pod = a.pod
GROUP BY r.cluster, a.queue, r.namespace, workload, a.gpu_model, a.gpu_resource
HAVING idle_gpu_seconds > 0"""

IDLE_RUNS = f"""
WITH {_W}, {SCAN}
SELECT cluster, node, gpu_uuid, mig_instance, namespace, pod, s, e, is_open FROM (@SUB@)"""

NODES = """
SELECT cluster, node, argMax(gpu_model, ts), argMax(gpu_allocatable, ts), argMax(ready, ts),
       argMax(unschedulable, ts), argMax(event, ts) AS last_event, argMax(mig_resources, ts)
FROM {db}.node_events
WHERE ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')
GROUP BY cluster, node
HAVING last_event != 'DELETED'
ORDER BY cluster, node"""

# Ray's view, for clusters without node_events: the latest GPU USED/AVAILABLE per node, and the
# node's accelerator_type:<T> resource as its model.
RAY_NODES = """
SELECT cluster, node, anyIf(replaceOne(resource, 'accelerator_type:', ''), resource LIKE 'accelerator_type:%') AS model,
       sumIf(v, resource = 'GPU') AS gpus
FROM (
  SELECT cluster, node, resource, state, argMax(value, ts) AS v
  FROM {db}.ray_resources
  WHERE ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC') AND ts > fromUnixTimestamp64Milli({n:Int64}, 'UTC') - INTERVAL 10 MINUTE
    AND (resource = 'GPU' OR resource LIKE 'accelerator_type:%')
  GROUP BY cluster, node, resource, state
)
GROUP BY cluster, node
HAVING gpus > 0
ORDER BY cluster, node"""

# Pods whose latest event says Pending, unbound, asking for GPUs (accounting.model.PendingDemand).
PENDING = """
SELECT cluster, namespace, if(argMax(ray_cluster, ts) != '', argMax(ray_cluster, ts), pod) AS workload,
       argMax(queue, ts), argMax(gpus, ts) AS g, toUnixTimestamp64Milli(min(ts)) / 1000, argMax(gpu_model, ts),
       argMax(phase, ts) AS ph, argMax(event, ts) AS ev, argMax(node, ts) AS nd
FROM {db}.pod_events
WHERE ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')
  AND ts > fromUnixTimestamp64Milli({n:Int64}, 'UTC') - toIntervalSecond({lookback:UInt32})
GROUP BY cluster, namespace, pod, uid
HAVING ph = 'Pending' AND ev != 'DELETED' AND g > 0 AND nd = ''
ORDER BY cluster, namespace, workload"""
