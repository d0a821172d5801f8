"""Map what the collectors saw (a queue label, a GPU product label) onto the queue file.

Queue: the collected name is tried as a dotted path (``research.vision``, with or without a
``root.`` prefix), then as a unique leaf name (a Kueue LocalQueue or YuniKorn leaf named
``vision``), then the namespace map, then ``mapping.default``; otherwise the pod counts under
:data:`UNASSIGNED`, a pseudo-queue below the root, so nothing allocated goes uncounted.
Without any configured queue (no queue file) the collected names are used as they are.

GPU type: a MIG resource (``nvidia.com/mig-1g.10gb``) is looked up by its profile, then the
``gpu_model`` product label via ``gpu_types.<T>.node_labels``; an unknown model keeps its own
name, and an empty one becomes ``unknown``.
"""
from __future__ import annotations

from accounting.queues import ROOT, QueueConfig

UNASSIGNED = "(unassigned)"
UNKNOWN_TYPE = "unknown"
_MIG = "nvidia.com/mig-"


class Resolver:
    """Memoising resolver for one configuration (pure: same inputs, same answers)."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        by_name: dict[str, list[str]] = {}
        for leaf in config.leaves():
            by_name.setdefault(leaf.rsplit(".", 1)[-1], []).append(leaf)
        self._leaf_by_name = {n: paths[0] for n, paths in by_name.items() if len(paths) == 1}
        self._queues: dict[tuple[str, str], str] = {}
        self._types: dict[tuple[str, str], str] = {}

    def queue(self, raw: str, namespace: str) -> str:
        key = (raw, namespace)
        hit = self._queues.get(key)
        if hit is None:
            hit = self._queues[key] = self._queue(raw, namespace)
        return hit

    def _queue(self, raw: str, namespace: str) -> str:
        queues = self.config.queues
        name = raw[len(ROOT) + 1:] if raw.startswith(ROOT + ".") else raw
        if name and name != ROOT and name in queues:
            return name
        if name in self._leaf_by_name:
            return self._leaf_by_name[name]
        if not self.config.root.children:
            return name or UNASSIGNED
        mapping = self.config.mapping
        if namespace in mapping.namespaces:
            return mapping.namespaces[namespace]
        return mapping.default or UNASSIGNED

    def gpu_type(self, gpu_model: str, gpu_resource: str = "") -> str:
        key = (gpu_model, gpu_resource)
        hit = self._types.get(key)
        if hit is None:
            hit = self._types[key] = self._gpu_type(gpu_model, gpu_resource)
        return hit

    def _gpu_type(self, gpu_model: str, gpu_resource: str) -> str:
        if gpu_resource.startswith(_MIG):
            found = self.config.type_of_label(gpu_resource[len(_MIG):]) or self.config.type_of_label(gpu_resource)
            if found:
                return found
        return self.config.type_of_label(gpu_model) or gpu_model or UNKNOWN_TYPE

    def price_per_hour(self, gpu_type: str) -> float:
        t = self.config.gpu_types.get(gpu_type)
        return t.price_per_hour if t else 0.0

    def chain(self, path: str) -> tuple[str, ...]:
        """The queue and its ancestors below the root (the pseudo-queue has none)."""
        if path == UNASSIGNED or path not in self.config.queues:
            return (path,)
        return (path, *[a for a in self.config.ancestors(path) if a != ROOT])
