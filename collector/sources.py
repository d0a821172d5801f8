"""Builds the scrape targets, discoverers and watchers that the settings name."""
from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from collector.base import Discoverer, ScrapeTarget, Watcher
from gpuq.errors import StoreError
from gpuq.settings import RayTarget, Settings
from gpuq.store.client import Store

log = logging.getLogger(__name__)


class StoreState:
    """Read-back of collector state (resume points, open allocations) from the store.

    Answers ``None`` / empty while the store is unreachable: the watchers then relist, and the
    ReplacingMergeTree keys make the repeated rows collapse.
    """

    def __init__(self, store: Callable[[], Store | None]) -> None:
        self._store = store

    def load_state(self, cluster: str, source: str, key: str) -> str | None:
        from collector.kubernetes import state_loader

        store = self._store()
        if store is None:
            return None
        try:
            return state_loader(store)(cluster, source, key)
        except StoreError as exc:
            log.warning("cannot read collector state: %s", exc)
            return None

    def open_allocations(self, cluster: str) -> list[Any]:
        from collector.kubernetes import open_allocations_loader

        store = self._store()
        if store is None:
            return []
        try:
            return list(open_allocations_loader(store)(cluster))
        except StoreError as exc:
            log.warning("cannot read open allocations: %s", exc)
            return []

    def stored_kueue(self, cluster: str) -> tuple[list[Any], list[Any]]:
        from collector.kubernetes import stored_kueue_loader

        store = self._store()
        if store is None:
            return [], []
        try:
            keys, rows = stored_kueue_loader(store)(cluster)
            return list(keys), list(rows)
        except StoreError as exc:
            log.warning("cannot read the stored Kueue objects: %s", exc)
            return [], []


def ray_job_allocations(target: RayTarget, settings: Settings) -> bool:
    """Whether this Ray cluster's tasks and actors are billed as ``ray_job`` (``RayTarget.ray_job_allocations``;
    by default not where a Kubernetes target has the same cluster name: the Ray nodes are pods there,
    and the pods hold and bill the GPUs)."""
    if target.ray_job_allocations is not None:
        return target.ray_job_allocations
    return not any(k.cluster == target.cluster for k in settings.collector.kubernetes)


def build_sources(settings: Settings, state: StoreState,
                  on_error: Callable[[Exception], None] | None = None,
                  ) -> tuple[list[ScrapeTarget], list[Discoverer], list[Watcher]]:
    cs = settings.collector
    targets: list[ScrapeTarget] = []
    discoverers: list[Discoverer] = []
    watchers: list[Watcher] = []
    if cs.ray:
        from collector.ray import RayDiscoverer

        discoverers.extend(RayDiscoverer(t, open_allocations=state.open_allocations,
                                         job_allocations=ray_job_allocations(t, settings))
                           for t in cs.ray)
    if cs.dcgm:
        from collector.dcgm import DcgmDiscoverer

        discoverers.extend(
            DcgmDiscoverer(t, next((k for k in cs.kubernetes if k.cluster == t.cluster), None))
            for t in cs.dcgm)
    if cs.nvml.enabled:
        from collector.nvml import NvmlTarget

        targets.append(NvmlTarget(cs.nvml.cluster, cs.nvml.node or socket.gethostname()))
    if cs.kubernetes:
        from collector.kubernetes import KubernetesWatcher

        queues = _queue_mapping(settings)
        for t in cs.kubernetes:
            watchers.append(KubernetesWatcher(t, queues=queues, load_state=state.load_state,
                                              open_allocations=state.open_allocations, on_error=on_error,
                                              kueue=settings.queues_from == "kueue",
                                              yunikorn=settings.yunikorn.namespace
                                              if settings.queues_from == "yunikorn" else None,
                                              stored_kueue=state.stored_kueue))
    return targets, discoverers, watchers


def _queue_mapping(settings: Settings) -> Any:
    """Pod-to-queue mapping from the queue file's ``mapping:`` section as plain values (the
    collector never imports accounting: the file is read here as YAML). Defaults otherwise.

    With a placement rule in the file (``placement: {namespace_queues: true}`` on some queue),
    ``mapping.default`` is left to the accounting: a pod that names no queue is recorded with none,
    so that the accounting can put it in its namespace's queue before the default
    (:mod:`accounting.access`); recorded as the default, it would look as if it named it."""
    from collector.k8s_extract import QueueKeys

    if not settings.queues_file:
        return QueueKeys()
    import yaml

    from gpuq.yamlsafe import safe_load

    try:
        with open(settings.queues_file, encoding="utf-8") as fh:
            data = safe_load(fh.read()) or {}
    except (OSError, yaml.YAMLError) as exc:
        log.warning("queue mapping not read from %s: %s", settings.queues_file, exc)
        return QueueKeys()
    m = data.get("mapping") or {}
    base = QueueKeys()
    return QueueKeys(
        labels=tuple(m.get("labels", base.labels)),
        annotations=tuple(m.get("annotations", base.annotations)),
        namespaces=dict(m.get("namespaces") or {}),
        default=None if _has_placement(data.get("queues")) else m.get("default"),
    )


def _has_placement(queues: Any, depth: int = 0) -> bool:
    """Whether a queue of this ``queues:`` section (as parsed YAML) has a placement rule on."""
    if not isinstance(queues, dict) or depth > 64:
        return False
    for spec in queues.values():
        if isinstance(spec, dict):
            rule = spec.get("placement")
            if isinstance(rule, dict) and rule.get("namespace_queues") is True:
                return True
            if _has_placement(spec.get("queues"), depth + 1):
                return True
    return False
