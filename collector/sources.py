"""Builds the scrape targets, discoverers and watchers that the settings name."""
from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from typing import Any

from collector.base import Discoverer, ScrapeTarget, Watcher
from gpuq.errors import StoreError
from gpuq.settings import Settings
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
        store = self._store()
        if store is None:
            return None
        try:
            rows = store.query(
                f"SELECT argMax(value, ts) FROM {store.database}.collector_state "
                "WHERE cluster = {c:String} AND source = {s:String} AND key = {k:String} HAVING count() > 0",
                {"c": cluster, "s": source, "k": key}).rows
        except StoreError as exc:
            log.warning("cannot read collector state: %s", exc)
            return None
        return str(rows[0][0]) if rows else None

    def open_allocations(self, cluster: str) -> set[str]:
        store = self._store()
        if store is None:
            return set()
        try:
            rows = store.query(
                f"SELECT uid FROM {store.database}.gpu_allocations FINAL "
                "WHERE cluster = {c:String} AND end IS NULL", {"c": cluster}).rows
        except StoreError as exc:
            log.warning("cannot read open allocations: %s", exc)
            return set()
        return {str(r[0]) for r in rows}


def build_sources(settings: Settings, state: StoreState) -> tuple[list[ScrapeTarget], list[Discoverer], list[Watcher]]:
    cs = settings.collector
    targets: list[ScrapeTarget] = []
    discoverers: list[Discoverer] = []
    watchers: list[Watcher] = []
    if cs.ray:
        from collector.ray import RayDiscoverer

        discoverers.extend(RayDiscoverer(t) for t in cs.ray)
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

        mapping = _queue_mapping(settings)
        for t in cs.kubernetes:
            watchers.append(KubernetesWatcher(t, load_state=state.load_state,
                                              open_allocations=state.open_allocations, **mapping))
    return targets, discoverers, watchers


def _queue_mapping(settings: Settings) -> dict[str, Any]:
    """Pod-to-queue mapping from the queue file, as plain values (the collector never imports
    accounting: the file is read here as YAML)."""
    if not settings.queues_file:
        return {}
    import yaml

    try:
        with open(settings.queues_file, encoding="utf-8") as fh:
            data = yaml.safe_load(fh) or {}
    except (OSError, yaml.YAMLError) as exc:
        log.warning("queue mapping not read from %s: %s", settings.queues_file, exc)
        return {}
    m = data.get("mapping") or {}
    out: dict[str, Any] = {}
    if "labels" in m:
        out["queue_labels"] = tuple(m["labels"])
    if "annotations" in m:
        out["queue_annotations"] = tuple(m["annotations"])
    if "namespaces" in m:
        out["queue_namespaces"] = dict(m["namespaces"])
    if "default" in m:
        out["queue_default"] = m["default"]
    return out
