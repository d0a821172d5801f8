"""How gpuq names Ray things, shared by the collector, the accounting and the Ray actuator
(which may not import each other).

* A Ray node is ``ray_node_name(node_id)``: the first 12 hex characters of its node id. Ray-only
  clusters started with plain ``ray start`` have no node names of their own, and local nodes share
  one IP; 12 hex characters (48 bits) keep a cluster's names distinct in practice.
* A placement group gpuq creates for a workload is named ``placement_group_name(workload_id)``
  = ``gpuq-<workload id>``; ``workload_of_placement_group(name)`` reverses it ('' for others).
"""
from __future__ import annotations

NODE_NAME_CHARS = 12
PG_PREFIX = "gpuq-"


def ray_node_name(node_id: str) -> str:
    """``"0b36bf516a5df435..."`` -> ``"0b36bf516a5d"``."""
    return node_id[:NODE_NAME_CHARS].lower()


def placement_group_name(workload_id: str) -> str:
    """Ray takes any string as a placement group name: the id is kept verbatim, so the mapping is
    reversible."""
    return PG_PREFIX + workload_id


def workload_of_placement_group(name: str) -> str:
    return name[len(PG_PREFIX):] if name.startswith(PG_PREFIX) else ""
