"""Map what the collectors saw (a queue label, a GPU product label) onto the queue file.

Queue: the collected name is first one of the pod's namespace's LocalQueues
(``mapping.local_queues``: Kueue's LocalQueue of that name, whose ClusterQueue's queue it means),
then tried as a dotted path (``research.vision``, with or without a
``root.`` prefix), then as a unique leaf name (a Kueue LocalQueue or YuniKorn leaf named
``vision``); a placement parent, or ``<parent>.<namespace>`` of one, is the namespace's own queue
below it (made on first use: :mod:`accounting.access`). The queue found counts only when the
pod's namespace may use it (the ``namespaces`` lists); otherwise, and when nothing was found, the
namespace's own queue: the namespace map, then its placement rule's queue, then
``mapping.default`` (when the namespace may use it), so work that names a queue its namespace may
not use is billed to the namespace's queue, never to the one it named. Otherwise the pod counts
under :data:`UNASSIGNED`, a pseudo-queue below the root, so nothing allocated goes uncounted.
Without any configured queue (no queue file) the collected names are used as they are.

GPU type: a MIG resource (``nvidia.com/mig-1g.10gb``) is looked up by its profile, then as the
declared MIG type of the node's GPU type and that profile (``A100-mig-1g.10gb``), then the
``gpu_model`` product label via ``gpu_types.<T>.node_labels``; an unknown model keeps its own
name, and an empty one becomes ``unknown``.
"""
from __future__ import annotations

import logging

from accounting.access import NamespaceQueues, refusal
from accounting.errors import QueueNotCreated
from accounting.queues import ROOT, QueueConfig

log = logging.getLogger(__name__)

UNASSIGNED = "(unassigned)"
UNKNOWN_TYPE = "unknown"
_MIG = "nvidia.com/mig-"


def local_queue(config: QueueConfig, raw: str, namespace: str) -> str | None:
    """The queue that ``raw`` names as one of ``namespace``'s LocalQueues (``mapping.local_queues``:
    Kueue's LocalQueue of that name, whose ClusterQueue's queue it means), else None. The first step
    of :meth:`Resolver.queue`; gpuq's own scheduler takes the same step for the queue a workload names
    (:mod:`scheduler.service.core`), so a LocalQueue name means one queue to both."""
    return config.mapping.local_queue(namespace, raw)


class Resolver:
    """Memoising resolver for one configuration (pure: same inputs, same answers)."""

    def __init__(self, config: QueueConfig) -> None:
        self._nsq = NamespaceQueues(config)
        by_name: dict[str, list[str]] = {}
        for leaf in config.leaves():
            by_name.setdefault(leaf.rsplit(".", 1)[-1], []).append(leaf)
        self._leaf_by_name = {n: paths[0] for n, paths in by_name.items() if len(paths) == 1}
        self._queues: dict[tuple[str, str], str] = {}
        self._types: dict[tuple[str, str], str] = {}

    @property
    def config(self) -> QueueConfig:
        """The configuration with the queues placement rules made so far (read it after resolving)."""
        return self._nsq.config

    def queue(self, raw: str, namespace: str) -> str:
        key = (raw, namespace)
        hit = self._queues.get(key)
        if hit is None:
            hit = self._queues[key] = self._queue(raw, namespace)
        return hit

    def _queue(self, raw: str, namespace: str) -> str:
        base = self._nsq.base
        name = raw[len(ROOT) + 1:] if raw.startswith(ROOT + ".") else raw
        found = local_queue(base, raw, namespace)
        if found is None:
            found = name if name and name != ROOT and name in base.queues else self._leaf_by_name.get(name)
        if not base.root.children:
            return found or name or UNASSIGNED
        placed = self._nsq.place(found or name, namespace)
        if placed is not None:
            found = self._made(placed)
        if found is not None and refusal(base.queues, found, namespace) is None:   # a made queue is not in base
            return found
        for own in self._nsq.own_queues(namespace):
            got = own if own in base.queues else self._made(own)
            if got is not None:
                return got
        return UNASSIGNED

    def _made(self, path: str) -> str | None:
        """``path``, made by its placement rule if need be; None (logged once) when it cannot be."""
        try:
            return self._nsq.make(path).path
        except QueueNotCreated as exc:
            _warn_once(f"{exc}; its namespace's work is billed to its next queue, else {UNASSIGNED}")
            return None

    def gpu_type(self, gpu_model: str, gpu_resource: str = "") -> str:
        key = (gpu_model, gpu_resource)
        hit = self._types.get(key)
        if hit is None:
            hit = self._types[key] = self._gpu_type(gpu_model, gpu_resource)
        return hit

    def _gpu_type(self, gpu_model: str, gpu_resource: str) -> str:
        if gpu_resource.startswith(_MIG):
            profile = gpu_resource[len(_MIG):].removesuffix(".shared")
            found = self.config.type_of_label(gpu_resource[len(_MIG):]) or self.config.type_of_label(gpu_resource)
            if not found:                     # a declared MIG type of the node's GPU (<TYPE>-mig-<profile>)
                base = self.config.type_of_label(gpu_model)
                found = self.config.mig_type(base, profile) if base else None
            if found:
                return found
        return self.config.type_of_label(gpu_model) or gpu_model or UNKNOWN_TYPE

    def price_per_hour(self, gpu_type: str) -> float:
        t = self.config.gpu_types.get(gpu_type)
        return t.price_per_hour if t else 0.0

    def chain(self, path: str) -> tuple[str, ...]:
        """The queue and its ancestors below the root (the pseudo-queue has none)."""
        base = self._nsq.base
        made = self._nsq.get(path) if path not in base.queues else None
        if made is not None and made.parent is not None:       # made by a placement rule
            return (path, *self.chain(made.parent))
        if path == UNASSIGNED or path not in base.queues:
            return (path,)
        return (path, *[a for a in base.ancestors(path) if a != ROOT])


_warned: set[str] = set()


def _warn_once(message: str) -> None:
    """Each refusal once per process (a resolver is made for each view), at most 1,000 kept."""
    if message not in _warned and len(_warned) < 1000:
        _warned.add(message)
        log.warning("%s", message)
