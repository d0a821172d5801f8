"""Column order of every table that gpuq writes: writers pass tuples in this order.

``tests/test_store.py`` checks these lists against the migrated database, so they cannot drift
from the SQL in ``migrations/``.
"""
from __future__ import annotations

COLUMNS: dict[str, tuple[str, ...]] = {
    "gpu_samples": (
        "ts", "cluster", "node", "gpu_uuid", "gpu_index", "gpu_model", "mig_profile",
        "mig_instance", "pod", "namespace", "container", "metric", "value", "source",
    ),
    "ray_resources": ("ts", "cluster", "node", "resource", "state", "value"),
    "ray_nodes": (
        "ts", "cluster", "node_id", "node_ip", "node_name", "is_head", "state",
        "resources_total", "labels",
    ),
    "ray_jobs": (
        "ts", "cluster", "job_id", "submission_id", "status", "entrypoint", "start_time",
        "end_time", "metadata",
    ),
    "ray_placement_groups": (
        "ts", "cluster", "placement_group_id", "name", "job_id", "state", "strategy", "bundles",
        "gpus", "bundles_json",
    ),
    "pod_events": (
        "ts", "cluster", "namespace", "pod", "uid", "event", "phase", "node", "gpus",
        "gpu_resource", "gpu_model", "queue", "priority", "ray_cluster", "ray_node_type",
        "resource_version",
    ),
    "node_events": (
        "ts", "cluster", "node", "uid", "event", "ready", "unschedulable", "gpu_model",
        "gpu_capacity", "gpu_allocatable", "mig_resources", "labels", "resource_version",
    ),
    "gpu_allocations": (
        "cluster", "namespace", "pod", "uid", "queue", "node", "gpu_model", "gpu_resource", "gpus",
        "priority", "ray_cluster", "start", "end", "version", "source", "workload_id", "owner_kind",
        "owner",
    ),
    "collector_state": ("ts", "cluster", "source", "key", "value"),
    "kueue_objects": ("ts", "cluster", "kind", "namespace", "name", "uid", "resource_version", "deleted",
                      "object"),
    "scheduler_events": (
        "ts", "cluster", "t", "seq", "event", "workload", "queue", "gpu_type", "placement", "by",
        "reason", "spec", "placement_milli", "shares", "lost_gpu_seconds",
    ),
    "scheduler_state": ("cluster", "workload", "version", "deleted", "ts", "events"),
}

# Columns the store derives at insert (a DEFAULT of the written columns), never written: the ledger
# counts milli-GPUs (0007_milli_gpus.sql), derived from the GPUs writers send.
DERIVED: dict[str, tuple[str, ...]] = {"gpu_allocations": ("milli_gpus",)}

# Rows as an older gpuq wrote them, before a migration added columns at the end of a table (each
# with a DEFAULT): the number of values such a row holds. A spill file of format 1 (rows only, no
# header naming its columns) written then is read with the table's first columns, so a spill made
# before an upgrade is replayed after it (scheduler_events: 12 before 0009 added placement_milli
# and shares, 14 before 0011 added lost_gpu_seconds).
OLDER_WIDTHS: dict[str, tuple[int, ...]] = {"scheduler_events": (12, 14)}
