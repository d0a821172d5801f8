"""SQL for the store adapter. Each query mirrors a pure function of the engine (named below) so
tests can check that both give the same numbers on the same rows.

Parameters are ClickHouse query parameters; times are Unix milliseconds (``Int64``); ``{db}`` is
substituted with the database name (an identifier checked by the store), ``@ALLOC@`` with the
table the allocations are read from: ``gpu_allocations``, or ``gpu_allocations_open`` for windows
it covers (see :func:`accounting.store_adapter.alloc_table`).
"""
from __future__ import annotations

PROF = "DCGM_FI_PROF_GR_ENGINE_ACTIVE"
UTIL = "DCGM_FI_DEV_GPU_UTIL"
_W = ("fromUnixTimestamp64Milli({f:Int64}, 'UTC') AS wf, fromUnixTimestamp64Milli({t:Int64}, 'UTC') AS wt, "
      "fromUnixTimestamp64Milli({n:Int64}, 'UTC') AS wn")

# The ledger (accounting.ledger.dedup; the same rule, kept equal by tests/test_ledger.py and
# tests/test_books_conservation.py): the allocations overlapping [wf, wt). Foreign rows (no workload
# id) count as they are. A gpuq workload counts on each node it holds: its observed rows there from
# their best source in the window (pod, then placement group, then Ray job: `bo`); a Kueue Workload's
# row (rank 3, no node) until the workload is seen on any node (the same cut over `_WPART`); and its admission
# there from the admit until the workload is seen there (`cut`: the earliest start of its observed
# rows there that end after the admit, found as the rows after the admission in the order of observed
# ends and admission starts; the whole admission when there is none). gpuq's rows are read from
# `_REACH` before the window too, so that the cut and a workload's queue (a placement group the
# collector closed a little after its admission ended takes the admission's) do not depend on where
# the window starts. A foreign row is a partition of its own (`_PART`): the windows cost nothing for
# the rows most stores hold. No lambda and no ARRAY JOIN: their analysis is what a query of this
# size pays most for.
_OPEN_MS = "toInt64(9223372036854775807)"
_REACH = "toIntervalDay(1)"
_PART = "workload_id, if(workload_id = '', uid, node)"
# a Kueue Workload's row: its workload on any node of its cluster (Kueue's ids, kueue/<ns>/<name>,
# repeat across clusters; gpuq's own are unique)
_WPART = "workload_id, if(workload_id = '', uid, cluster)"
# What both ledgers select from the rows read: each row's source rank, its span in ms, the best
# observed rank of its (workload, node) in the window (`bo`), the queue of its (workload, node)
# (`wq`); and the earliest start of the observed rows of its partition that end after it starts
# (`_seen_from`: where an admission, or the plain ledger's Kueue row, is cut).
_RANKED = f"""multiIf(source = 'pod', 0, source = 'placement_group', 1, source = 'ray_job', 2, source = 'kueue', 3, 4)
             AS rank,
           toUnixTimestamp64Milli(start) AS s_ms, ifNull(toUnixTimestamp64Milli(end), {_OPEN_MS}) AS e_ms,
           minIf(rank, rank < 3 AND e_ms > toUnixTimestamp64Milli(wf)) OVER (PARTITION BY {_PART}) AS bo,
           max(queue) OVER (PARTITION BY {_PART}) AS wq"""
_ROWS = f"""FROM {{db}}.@ALLOC@ FINAL
    WHERE start < wt AND (end IS NULL OR end > if(workload_id = '', wf, wf - {_REACH}))"""


def _seen_from(part: str) -> str:
    return (f"greatest(s_ms, min(if(rank < 3, s_ms, {_OPEN_MS})) OVER (PARTITION BY {part} "
            "ORDER BY if(rank < 3, e_ms, s_ms) DESC, rank DESC ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW))")


LEDGER = f"""(
  SELECT * EXCEPT (rank, s_ms, e_ms, bo, wq, cut) REPLACE (
           if(queue = '', wq, queue) AS queue,
           if(cut < e_ms, fromUnixTimestamp64Milli(cut, 'UTC'), end) AS end)
  FROM (
    SELECT *, {_RANKED},
           multiIf(rank = 4, {_seen_from(_PART)}, rank = 3, {_seen_from(_WPART)}, e_ms) AS cut
    {_ROWS}
  )
  WHERE (workload_id = '' OR rank = bo OR (rank >= 3 AND cut > s_ms)) AND cut > toUnixTimestamp64Milli(wf)
)"""

# With Kueue's rows in the store (accounting.store_adapter.ledger_sql chooses): the same ledger, but
# a Kueue Workload's row (rank 3) counts what of it is not seen yet (accounting.ledger.kueue_segments):
# its milli-GPUs less the most its workload's counted observed rows (`ba`: the best source on each
# node over all rows read) held at once since its start, on any node (`held`, over `_WPART`), in
# pieces (`seg`: start ms, end ms, milli-GPUs, uid suffix), one output row each. Lambdas and ARRAY
# JOIN are what this costs (some 25 ms of analysis a query), so stores without Kueue rows use LEDGER.
_PIECES = """arrayMap(x -> (x.1, x.2, x.3, if(x.1 = s_ms, '', concat('#', toString(x.1)))),
  arrayFilter(x -> x.3 > 0 AND x.2 > x.1,
    arrayMap(k -> (p0[kj[k]].1, if(k = length(kj), e_ms, p0[kj[k + 1]].1), p0[kj[k]].2), arrayEnumerate(kj))))"""
_PIECE_ARRAYS = f"""
           arrayFilter(x -> x.2 > s_ms, if(rank = 3, held, [])) AS rel,   -- only a Kueue row has pieces
           arraySort(arrayConcat(arrayMap(x -> (greatest(x.1, s_ms), x.3), rel),
                                 arrayMap(x -> (x.2, -x.3), arrayFilter(x -> x.2 < {_OPEN_MS}, rel)))) AS ev,
           arrayCumSum(arrayMap(x -> x.2, ev)) AS run,
           arrayMap(i -> greatest(toInt64(0), toInt64(milli_gpus) - arrayMax(arraySlice(run, 1, i))), arrayEnumerate(run)) AS rest,
           arrayFilter(x -> x.1 < e_ms, arrayMap(i -> (ev[i].1, rest[i]),
                       arrayFilter(i -> i = length(ev) OR ev[i + 1].1 != ev[i].1, arrayEnumerate(ev)))) AS pts,
           arrayConcat([(s_ms, toInt64(milli_gpus))], pts) AS p0,
           arrayFilter(j -> j = 1 OR p0[j].2 != p0[j - 1].2, arrayEnumerate(p0)) AS kj"""
LEDGER_KUEUE = f"""(
  SELECT * EXCEPT (rank, s_ms, e_ms, bo, ba, wq, cut, held, rel, ev, run, rest, pts, p0, kj, seg) REPLACE (
           if(queue = '', wq, queue) AS queue,
           if(rank = 3, concat(uid, seg.4), uid) AS uid,
           if(rank = 3, fromUnixTimestamp64Milli(seg.1, 'UTC'), start) AS start,
           if(rank = 3, toUInt32(seg.3), milli_gpus) AS milli_gpus,
           multiIf(rank = 3, if(seg.2 >= {_OPEN_MS}, NULL, fromUnixTimestamp64Milli(seg.2, 'UTC')),
                   cut < e_ms, fromUnixTimestamp64Milli(cut, 'UTC'), end) AS end)
  FROM (
    SELECT *,{_PIECE_ARRAYS}
    FROM (
      SELECT *, groupArrayIf((s_ms, e_ms, toInt64(milli_gpus)), rank < 3 AND rank = ba) OVER (PARTITION BY {_WPART}) AS held
      FROM (
        SELECT *, {_RANKED},
               minIf(rank, rank < 3) OVER (PARTITION BY {_PART}) AS ba,
               if(rank = 4, {_seen_from(_PART)}, e_ms) AS cut
        {_ROWS}
      )
    )
  )
  ARRAY JOIN if(rank = 3, {_PIECES}, [(s_ms, e_ms, toInt64(milli_gpus), '')]) AS seg
  WHERE (workload_id = '' OR rank = bo OR rank = 3 OR (rank = 4 AND cut > s_ms))
    AND if(rank = 3, seg.2, cut) > toUnixTimestamp64Milli(wf)
)"""

# A row's slot (accounting.ledger.slot): a pod's rows run one at a time; the rows of the other
# sources name one node of a multi-node allocation each, so their slot also holds the node.
SLOT = "cluster, namespace, pod, if(source = 'pod', '', node)"

# The workload a bill names (accounting.model.Allocation.billed_as).
BILLED_AS = "if({p}workload_id != '', {p}workload_id, if({p}ray_cluster != '', {p}ray_cluster, {p}pod))"

# Allocations overlapping [wf, wt) with the end they really had (accounting.intervals.effective_ends):
# open rows count to now, and a row is cut at the start of the next uid of the same slot.
ALLOC_SPANS = f"""
SELECT cluster, namespace, pod, uid, queue, node, gpu_model, gpu_resource, milli_gpus, priority, ray_cluster, workload_id,
       source, start, end, least(coalesce(end, wn), wn, coalesce(next_start, wn)) AS eff_end
FROM (
  SELECT *, leadInFrame(toNullable(start)) OVER (PARTITION BY {SLOT} ORDER BY start, uid
                                                 ROWS BETWEEN CURRENT ROW AND 1 FOLLOWING) AS next_start
  FROM @LEDGER@
)"""

# GPU-seconds per UsageAgg key (accounting.intervals.clip + to_aggs).
USAGE = f"""
WITH {_W}
SELECT cluster, queue, namespace, if({{by_workload:UInt8}}, {BILLED_AS.format(p='')}, '') AS workload,
       gpu_model, gpu_resource,
       sum(milli_gpus * greatest(0, toUnixTimestamp64Milli(least(eff_end, wt)) - toUnixTimestamp64Milli(greatest(start, wf))))
         / 1e6 AS gpu_seconds
FROM ({ALLOC_SPANS})
GROUP BY cluster, queue, namespace, workload, gpu_model, gpu_resource
HAVING gpu_seconds > 0
ORDER BY cluster, queue, namespace, workload, gpu_model, gpu_resource"""

# The ledger's raw rows for a window, the rule not applied (accounting.store_adapter.read_allocations
# applies accounting.ledger.dedup in Python: the same rule, and on a few thousand rows cheaper than
# LEDGER's windows): foreign rows overlapping [wf, wt), gpuq's from _REACH before it.
LEDGER_ROWS = f"""
WITH {_W}
SELECT cluster, namespace, pod, uid, queue, node, gpu_model, milli_gpus, toUnixTimestamp64Milli(start) / 1000,
       if(end IS NULL, NULL, toUnixTimestamp64Milli(assumeNotNull(end)) / 1000), gpu_resource, priority, ray_cluster,
       source, workload_id, owner_kind, owner
FROM {{db}}.@ALLOC@ FINAL
WHERE start < wt AND (end IS NULL OR end > if(workload_id = '', wf, wf - {_REACH}))
ORDER BY cluster, namespace, pod, start, uid"""

# The same through LEDGER (tests/test_ledger.py checks it gives read_allocations' rows).
ALLOCATIONS = f"""
WITH {_W}
SELECT cluster, namespace, pod, uid, queue, node, gpu_model, milli_gpus, toUnixTimestamp64Milli(start) / 1000,
       if(end IS NULL, NULL, toUnixTimestamp64Milli(assumeNotNull(end)) / 1000), gpu_resource, priority, ray_cluster,
       source, workload_id, owner_kind, owner
FROM @LEDGER@
WHERE {{sources:String}} = '' OR has(splitByChar(',', {{sources:String}}), source)
ORDER BY cluster, namespace, pod, start, uid"""

# Idle detection (accounting.idle.activity_points + idle_runs), in two stages and one pass over the
# samples. Stage 1 groups by series only, (cluster, node, gpu_uuid, mig_instance, namespace, pod):
# a hash table with an entry per series, where grouping by (series, bucket) built one with an entry
# per GPU-minute. The key is gpu_uuid (LowCardinality: grouped by its dictionary) and a 64-bit hash
# of the rest, built around `hp`, the hash of the pod's (cluster, namespace, pod) that joins the
# allocations (POD_HASH); the names are kept with any() where a query needs them. Each sample sets
# one bit of its bucket: 1 UTIL quiet, 2 UTIL busy, 4 PROF quiet, 8 PROF busy ("busy": the value,
# PROF times 100, at or over the threshold; a bucket's activity is its highest sample, so it is busy
# as soon as one sample is). A bucket's activity comes from PROF when it has a PROF bit, else from
# UTIL; no bit means no data. Two states carry the bits:
#   * _RESAMPLE (windows up to RESAMPLE_MAX_BUCKETS buckets): groupBitOrResample, one byte per
#     bucket of the scan, set in O(1) per sample;
#   * _CODES (longer windows): a bitmap of codes bucket * 4 + kind (kind 0 UTIL quiet, 1 UTIL busy,
#     2 PROF quiet, 3 PROF busy), whose largest code per bucket is the deciding one; its size follows
#     the samples rather than the window. Sorted again: a small bitmap is a plain set.
# Both end as `pos` (bucket offsets from {b0:Int64}, ascending) and `q` (quiet flags) per series.
RESAMPLE_MAX_BUCKETS = 2880
POD_HASH = "cityHash64({p}pod, cityHash64({p}namespace), cityHash64({p}cluster))"
_KEY = (f"gpu_uuid AS k_gpu, cityHash64({POD_HASH.format(p='')} AS hp, cityHash64(node), cityHash64(mig_instance)) AS h, "
        "any(hp) AS k_hp, any(cluster) AS k_cluster, any(node) AS k_node, any(mig_instance) AS k_mig, "
        "any(namespace) AS k_ns, any(pod) AS k_pod")
_BITS = "toUInt8(if(metric = '{p}', if({v} * 100 >= {{threshold:Float64}}, 8, 4), if({v} >= {{threshold:Float64}}, 2, 1)))"
_KIND = "if(metric = '{p}', if({v} * 100 >= {{threshold:Float64}}, 3, 2), toUInt8({v} >= {{threshold:Float64}}))"
_RESAMPLE = ("groupBitOrResample({{b0:Int64}}, {{b1:Int64}}, 1)({bits}, {b}) AS bits, "
             "arrayMap(i -> i - 1, arrayFilter((i, x) -> x != 0, arrayEnumerate(bits), bits)) AS pos, "
             "arrayMap(x -> if(bitAnd(x, 12) != 0, bitAnd(x, 8) = 0, bitAnd(x, 2) = 0), arrayFilter(x -> x != 0, bits)) AS q")
_CODES = ("arraySort(bitmapToArray(groupBitmapState(toUInt32(({rel}) * 4 + {kind})))) AS codes, "
          "arrayFilter((x, nx) -> bitShiftRight(x, 2) != bitShiftRight(nx, 2), codes, "
          "arrayPushBack(arrayPopFront(codes), 4294967295)) AS d, "
          "arrayMap(x -> bitShiftRight(x, 2), d) AS pos, arrayMap(x -> bitAnd(x, 1) = 0, d) AS q")
# A sample's bucket, numbered from the epoch (toRelativeMinuteNum for minutes: one function, not three).
_RAW_B = {True: "toRelativeMinuteNum(ts)", False: "intDiv(toUnixTimestamp64Milli(ts), {bucket:UInt32} * 1000)"}
_RAW_WHERE = f"""
FROM {{db}}.gpu_samples
WHERE metric IN ('{PROF}', '{UTIL}') AND pod != '' AND ts >= wscan AND ts < wscan_end
GROUP BY k_gpu, h"""
_M_B = {True: "toRelativeMinuteNum(minute)", False: "intDiv(toUnixTimestamp(minute), {bucket:UInt32})"}
_M_WHERE = f"""
FROM {{db}}.gpu_samples_1m
WHERE metric IN ('{PROF}', '{UTIL}') AND pod != '' AND minute >= wscan AND minute < wscan_end
GROUP BY k_gpu, h"""


def _stage1(state: str, b: str, v: str, where: str) -> str:
    bits = _BITS.format(p=PROF, v=v)
    kind = _KIND.format(p=PROF, v=v)
    return f"SELECT {_KEY},\n       " + state.format(bits=bits, kind=kind, b=b, rel=f"{b} - {{b0:Int64}}") + where


# (source, dense, minute buckets) -> stage 1
BUCKETS = {(src, dense, minute): _stage1(_RESAMPLE if dense else _CODES, bucket[minute], v, where)
           for src, bucket, v, where in (("raw", _RAW_B, "value", _RAW_WHERE), ("1m", _M_B, "value_max", _M_WHERE))
           for dense in (True, False) for minute in (True, False)}

# The hourly rollup: an hour with fewer than {min_minutes:UInt8} minutes of data is unknown, and
# counts as busy (not quiet). Rows of one (series, hour) are combined first (the table merges them
# in the background), then each hour is one deciding code (kind 2 quiet, 3 busy).
_NAMES = ("any(k_hp) AS k_hp, any(k_cluster) AS k_cluster, any(k_node) AS k_node, any(k_mig) AS k_mig, "
          "any(k_ns) AS k_ns, any(k_pod) AS k_pod")
_H_ACT = f"""
SELECT k_gpu, h, {_NAMES}, b,
       if(bitCount(bitOr(groupBitOr(prof_minutes), groupBitOr(util_minutes))) < {{min_minutes:UInt8}}, 1e9,
          if(groupBitOr(prof_minutes) != 0, max(prof_max), max(util_max))) AS act
FROM (SELECT gpu_uuid AS k_gpu, cityHash64({POD_HASH.format(p='')} AS hp, cityHash64(node), cityHash64(mig_instance)) AS h,
             hp AS k_hp, cluster AS k_cluster, node AS k_node, mig_instance AS k_mig, namespace AS k_ns, pod AS k_pod,
             intDiv(toUnixTimestamp(hour), {{bucket:UInt32}}) - {{b0:Int64}} AS b, prof_max, util_max, prof_minutes, util_minutes
      FROM {{db}}.gpu_activity_1h
      WHERE hour >= wscan AND hour < wscan_end)
GROUP BY k_gpu, h, b"""
BUCKETS[("1h", False, False)] = (f"\nSELECT k_gpu, h, {_NAMES}, "
                                 + _CODES.format(rel="b", kind="2 + (act >= {threshold:Float64})")
                                 + f"\nFROM ({_H_ACT})\nGROUP BY k_gpu, h")

# Idle runs (accounting.idle.idle_runs) from each series' points: a quiet point starts a new run
# when the point before it is busy or more than {reach:UInt32} s earlier (series without a quiet
# point are dropped first). Arrays, one pass per series; the lambdas take shifted copies of the
# arrays rather than indexing a captured array, which ClickHouse would copy for every element
# (O(n^2)).
RUNS = """
SELECT k_hp AS hp, k_cluster AS cluster, k_node AS node, k_gpu AS gpu_uuid, k_mig AS mig_instance, k_ns AS namespace,
       k_pod AS pod, ({b0:Int64} + pos[se.1]) * {bucket:UInt32} AS s, ({b0:Int64} + pos[se.2] + 1) * {bucket:UInt32} AS e,
       se.2 = length(pos) AS is_open
FROM (
  SELECT k_hp, k_cluster, k_node, k_gpu, k_mig, k_ns, k_pod, pos,
         arrayMap((cur, prev, prev_q) -> NOT prev_q OR (cur - prev) * {bucket:UInt32} > {reach:UInt32},
                  pos, arrayPushFront(arrayPopBack(pos), 0), arrayPushFront(arrayPopBack(q), 0)) AS brk,
         arrayFilter((i, qi, bi) -> qi AND bi, arrayEnumerate(pos), q, brk) AS starts,
         arrayFilter((i, qi, next_brk, next_q) -> qi AND (next_brk OR NOT next_q), arrayEnumerate(pos), q,
                     arrayPushBack(arrayPopFront(brk), 1), arrayPushBack(arrayPopFront(q), 0)) AS ends
  FROM (@SUB@)
  WHERE has(q, 1)
)
ARRAY JOIN arrayZip(starts, ends) AS se
WHERE e - s >= {window:UInt32}"""

SCAN = ("fromUnixTimestamp64Milli({scan:Int64}, 'UTC') AS wscan, "
        "fromUnixTimestamp64Milli({scan_end:Int64}, 'UTC') AS wscan_end")

# GPU-seconds and idle GPU-seconds per UsageAgg key in one pass over the allocations
# (accounting.intervals.clip + to_aggs, accounting.idle.attribute_idle): each allocation, cut to
# the window and to its effective end, takes the idle runs of its (cluster, namespace, pod) (joined
# by POD_HASH), a pod's wherever DCGM names its node, another source's (one row per node of a
# multi-node allocation) on its own node only (accounting.idle.attribute_idle), each clipped the same
# way and weighted by the allocation's share of the device (`dev_milli`: a MIG slice's fraction,
# `SLICE_MILLI`, else its milli-GPUs up to one GPU; gpuq.gpu_share.device_share_milli), never more than
# its own GPU-seconds there (a share seen on two devices is still its share). The runs come
# from a scan a window's worth wider on each side ({scan}, {scan_end}), so that a run crossing an
# edge is idle by its whole length. `idle_method` (accounting.idle.idle_method): the distinct methods
# of the group's allocations; a pod that shares a GPU is `per_process` when dcgm-exporter's
# per-process fields reported it in the scan (PER_PROCESS_PODS).
# A MIG model's slice share, looked up in the arrays the store adapter computes with
# gpuq.gpu_share.mig_slice_milli for the MIG models of the allocations (a lookup per row: evaluating
# the profile table in SQL for every allocation cost a third of a month's usage query).
SLICE_MILLI = "transform(toString(gpu_model), {mig_models:Array(String)}, {mig_milli:Array(UInt32)}, toUInt32(0))"
MIG_MODELS = "SELECT DISTINCT toString(gpu_model) FROM {db}.@ALLOC@ WHERE position(gpu_model, '-MIG-') > 0"
PER_PROCESS_PODS = f"""
SELECT DISTINCT {POD_HASH.format(p='')} AS pp_hp FROM {{db}}.gpu_samples
WHERE metric = '{UTIL}' AND source = 'dcgm-process' AND pod != '' AND ts >= wscan AND ts < wscan_end"""
USAGE_IDLE = f"""
WITH {_W}, {SCAN}
SELECT a.cluster, a.queue, a.namespace, if({{by_workload:UInt8}}, {BILLED_AS.format(p='a.')}, '') AS workload,
       a.gpu_model, a.gpu_resource,
       sum(a.milli_gpus * greatest(0, toUnixTimestamp64Milli(least(a.eff_end, wt))
                                      - toUnixTimestamp64Milli(greatest(a.start, wf)))) / 1e6 AS gpu_seconds,
       sum(least(a.milli_gpus * greatest(0, toUnixTimestamp64Milli(least(a.eff_end, wt))
                                            - toUnixTimestamp64Milli(greatest(a.start, wf))),
           if(a.source = 'pod',
              arraySum((s, e) -> greatest(0, least(e * 1000, toUnixTimestamp64Milli(a.eff_end), toUnixTimestamp64Milli(wt))
                                          - greatest(s * 1000, toUnixTimestamp64Milli(a.start), toUnixTimestamp64Milli(wf))),
                       r.ss, r.es),
              arraySum((s, e, nd) -> if(nd = cityHash64(a.node),
                       greatest(0, least(e * 1000, toUnixTimestamp64Milli(a.eff_end), toUnixTimestamp64Milli(wt))
                                   - greatest(s * 1000, toUnixTimestamp64Milli(a.start), toUnixTimestamp64Milli(wf))), 0),
                       r.ss, r.es, r.ns)) * dev_milli)) / 1e6 AS idle_gpu_seconds,
       arrayStringConcat(arraySort(groupUniqArrayIf(
           multiIf(slice_milli > 0 OR a.milli_gpus % 1000 = 0, 'device', pp.pp_hp != 0, 'per_process',
                   'device_split_by_share'),
           a.eff_end > wf AND a.start < wt)), ',') AS idle_method
FROM (SELECT *, {SLICE_MILLI} AS slice_milli,
             if(slice_milli > 0, slice_milli, least(milli_gpus, 1000)) AS dev_milli
      FROM ({ALLOC_SPANS})) AS a
LEFT JOIN (SELECT hp, groupArray(s) AS ss, groupArray(e) AS es, groupArray(cityHash64(node)) AS ns FROM (@SUB@)
           GROUP BY hp) AS r
  ON {POD_HASH.format(p='a.')} = r.hp
LEFT JOIN ({PER_PROCESS_PODS}) AS pp
  ON {POD_HASH.format(p='a.')} = pp.pp_hp
GROUP BY a.cluster, a.queue, a.namespace, workload, a.gpu_model, a.gpu_resource
HAVING gpu_seconds > 0 OR idle_gpu_seconds > 0
ORDER BY a.cluster, a.queue, a.namespace, workload, a.gpu_model, a.gpu_resource"""

IDLE_RUNS = f"""
WITH {_W}, {SCAN}
SELECT cluster, node, gpu_uuid, mig_instance, namespace, pod, s, e, is_open FROM (@SUB@)"""

# The latest event of each node; of its labels only the device plugin's replicas (time-slicing, MPS).
NODES = """
SELECT cluster, node, argMax(gpu_model, ts), argMax(gpu_allocatable, ts), argMax(ready, ts),
       argMax(unschedulable, ts), argMax(event, ts) AS last_event, argMax(mig_resources, ts),
       mapFilter((k, v) -> endsWith(k, '.replicas'), argMax(labels, ts))
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

# The State API's view of Ray nodes (preferred to the metrics pages, whose NodeAddress is shared by
# every node of one host): alive nodes seen in the last 10 minutes, named by the first 12 hex
# characters of their node id (collector.ray.ray_node_name), the placement groups' node names.
RAY_STATE_NODES = """
SELECT cluster, substring(node_id, 1, 12) AS node,
       arrayStringConcat(arrayMap(k -> replaceOne(k, 'accelerator_type:', ''),
                                  arrayFilter(k -> startsWith(k, 'accelerator_type:'), mapKeys(res))), ',') AS model,
       res['GPU'] AS gpus
FROM (
  SELECT cluster, node_id, argMax(resources_total, ts) AS res, argMax(state, ts) AS st, max(ts) AS seen
  FROM {db}.ray_nodes
  WHERE ts <= fromUnixTimestamp64Milli({n:Int64}, 'UTC')
  GROUP BY cluster, node_id
)
WHERE st = 'ALIVE' AND seen > fromUnixTimestamp64Milli({n:Int64}, 'UTC') - INTERVAL 10 MINUTE AND gpus > 0
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
