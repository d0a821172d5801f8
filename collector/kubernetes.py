"""The Kubernetes watcher: list and watch nodes, pods and KubeRay's RayClusters and RayJobs, emit
pod_events, node_events, gpu_allocations and the resume points in collector_state.

Wiring (the runner's side)::

    watcher = KubernetesWatcher(
        target,                                   # gpuq.settings.KubernetesTarget
        queues=queue_config.mapping,              # anything shaped like QueueMapping
        load_state=state_loader(store),           # (cluster, source, key) -> value | None
        open_allocations=open_allocations_loader(store),   # cluster -> open Allocation rows
        on_error=record_health,                   # every WatchError, as it happens
    )
    watcher.run(writer.write, stop)               # in a thread; returns within ~2 s of stop

Streams: ``nodes``, ``rayclusters`` and ``rayjobs`` (``ray.io/v1``, read only: the pods' owners,
:mod:`collector.k8s_owners`), and ``pods`` (each but ``nodes`` as one ``<kind>/<ns>`` stream per
configured namespace when namespaces are set), each in its own thread
(:mod:`collector.k8s_stream`). The pod streams wait for the first list of the others, so pods
get their node's GPU model and their owner's queue from the start; an owner seen after its pods
re-attributes their open allocations (:mod:`collector.k8s_state`). Where KubeRay's CRDs are not
installed (404) its streams log it once and pods are attributed from their own labels.
With ``kueue=True`` Kueue's five kinds are streams too (:mod:`collector.k8s_kueue`), and one more
thread polls Kueue's visibility API for each ClusterQueue known, every
``target.kueue_visibility_interval_s`` (:mod:`collector.k8s_kueue_visibility`).

Resume: each stream's resourceVersion is emitted as a ``collector_state`` row
(``source="kubernetes"``, ``key`` = ``nodes`` / ``pods`` / ``pods/<ns>``) after the rows it covers:
after a list, at every bookmark, when a watch ends, at stop, and at most every
``checkpoint_interval_s`` in between. At start ``load_state`` gives it back and the stream
watches from there without relisting; the node and owner streams read their list once (no
rows) to refill the GPU-model cache and the owner index, and the open allocations in the store
are read once, so that a changed attribution outranks the stored rows (:mod:`collector.k8s_alloc`). If the server answers 410 the stream relists. Events replayed
because the stored resourceVersion lags collapse in the store (see :mod:`collector.k8s_state`).

Relists: after a pod list the allocations still open, in the store (``open_allocations``) or
here, whose pod is not in the list are closed at the list time; the others are re-emitted with
the same version, so they read the same.
"""
from __future__ import annotations

import datetime as dt
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kubernetes.client import ApiClient, Configuration, CoreV1Api, CustomObjectsApi

from collector.base import Emit
from collector.errors import CollectorError, WatchError
from collector.k8s_alloc import Allocation
from collector.k8s_extract import QueueKeys, QueueLookup
from collector.k8s_kueue import KUEUE_KINDS, KueueIndex, Key, key_of
from collector.k8s_kueue_visibility import KIND as SUMMARY_KIND
from collector.k8s_kueue_visibility import VisibilityPoller, run_poller
from collector.k8s_owners import OWNER_KINDS
from collector.k8s_state import ClusterTracker, Rows, merge
from collector.k8s_yunikorn import CONFIGMAPS, YuniKornIndex
from collector.k8s_stream import CLUSTER_SCOPED, ResourceStream, StreamOptions, StreamSpec
from gpuq.errors import ConfigError
from gpuq.kube import load_configuration
from gpuq.settings import KubernetesTarget

log = logging.getLogger(__name__)

SOURCE = "kubernetes"
LoadState = Callable[[str, str, str], "str | None"]
OpenAllocations = Callable[[str], Iterable["Allocation | Sequence[Any]"]]
OnError = Callable[[CollectorError], None]
StoredKueue = Callable[[str], "tuple[Iterable[Key], Iterable[Allocation | Sequence[Any]]]"]
Clock = Callable[[], dt.datetime]
_TABLE_ORDER = ("node_events", "pod_events", "kueue_objects", "gpu_allocations")


def utc_now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def api_configuration(target: KubernetesTarget) -> Configuration:
    """The client configuration of a target (kubeconfig path + context, or in-cluster)."""
    try:
        return load_configuration(target)          # retries 0: the streams retry, with backoff
    except ConfigError as exc:
        where = "in-cluster service account" if target.in_cluster else (target.kubeconfig or "default kubeconfig")
        raise WatchError(f"{exc.where}: {exc.reason}", source=where, cluster=target.cluster,
                         retryable=False) from exc


class KubernetesWatcher:
    source = SOURCE

    def __init__(self, target: KubernetesTarget, *, queues: QueueLookup | None = None,
                 load_state: LoadState | None = None,
                 open_allocations: OpenAllocations | None = None,
                 on_error: OnError | None = None, clock: Clock = utc_now, kueue: bool = False,
                 yunikorn: str | None = None, stored_kueue: StoredKueue | None = None,
                 rng: random.Random | None = None, options: StreamOptions | None = None,
                 checkpoint_interval_s: float = 1.0, stop_grace_s: float = 2.0) -> None:
        self.target = target
        self.cluster = target.cluster
        self.name = target.kubeconfig or ("in-cluster" if target.in_cluster else "kubeconfig")
        self.server = ""
        self._load_state = load_state
        self._open_allocations = open_allocations
        self._on_error = on_error
        self._clock = clock
        self._rng = rng or random.Random()
        self.options = options or StreamOptions(watch_timeout_s=target.watch_timeout_s)
        self.checkpoint_interval_s = checkpoint_interval_s
        self.stop_grace_s = stop_grace_s
        self.tracker = ClusterTracker(self.cluster, queues or QueueKeys(),
                                      kueue=KueueIndex(self.cluster) if kueue else None,
                                      yunikorn=YuniKornIndex(self.cluster, yunikorn) if yunikorn else None)
        self._stored_kueue = stored_kueue
        self._lock = threading.RLock()
        self._emit: Emit | None = None
        self._checkpoints: dict[str, tuple[str, float]] = {}

    @property
    def specs(self) -> list[StreamSpec]:
        """``nodes``, the owner streams, then the pod streams (the order ``once`` lists them in)."""
        namespaces: list[str | None] = list(self.target.namespaces) or [None]
        owners = [StreamSpec(kind, ns) for kind in OWNER_KINDS for ns in namespaces]
        kueue = [] if self.tracker.kueue is None else [
            StreamSpec(kind, None if kind in CLUSTER_SCOPED else ns) for kind in KUEUE_KINDS
            for ns in ([None] if kind in CLUSTER_SCOPED else namespaces)]
        yunikorn = [] if self.tracker.yunikorn is None else [
            StreamSpec("configmaps", self.tracker.yunikorn.namespace, name) for name in CONFIGMAPS]
        return [StreamSpec("nodes"), *owners, *kueue, *yunikorn, *(StreamSpec("pods", ns) for ns in namespaces)]

    # -- run ----------------------------------------------------------------------------------
    def run(self, emit: Emit, stop: threading.Event, once: bool = False) -> None:
        """Watch until ``stop`` (or, with ``once``, list everything once and return)."""
        cfg = api_configuration(self.target)
        self.server = self.name = str(cfg.host)
        api_client = ApiClient(cfg)
        api, custom_api = CoreV1Api(api_client), CustomObjectsApi(api_client)
        with self._lock:
            self._emit = emit
        try:
            streams = [ResourceStream(spec, api, self, cluster=self.cluster, server=self.server,
                                      stop=stop, options=self.options, custom_api=custom_api,
                                      rng=random.Random(self._rng.random()))
                       for spec in self.specs]
            if once:
                for stream in streams:
                    try:
                        stream.list_once()
                    except WatchError as exc:
                        if not stream.absent(exc):
                            raise
                poller = self._visibility(api_client)
                if poller is not None:
                    self._write_summaries(poller.poll(self._cluster_queues(), self._clock())[0])
                return
            stored = self._stored_open()
            with self._lock:
                self.tracker.remember_stored(stored)
            self._remember_kueue()
            self._watch_all(streams, stop, self._visibility(api_client))
        finally:
            with self._lock:
                self._emit = None                 # a straggling thread emits nothing more
            api_client.close()  # type: ignore[no-untyped-call]

    def _watch_all(self, streams: list[ResourceStream], stop: threading.Event,
                   poller: VisibilityPoller | None = None) -> None:
        first = [s.synced for s in streams if s.spec.kind != "pods"]   # nodes and owners
        threads = []
        if poller is not None:          # after the ClusterQueues' first list
            ready = [s.synced for s in streams if s.spec.kind == "clusterqueues"]
            threads.append(threading.Thread(
                target=run_poller, name=f"k8s-{self.cluster}-kueue-visibility", daemon=True,
                args=(poller, self._cluster_queues, self._write_summaries, self._clock, stop, ready)))
            threads[-1].start()
        for stream in streams:
            resume = self._resume_point(stream.spec)
            is_pods = stream.spec.kind == "pods"
            thread = threading.Thread(
                target=self._run_stream, name=f"k8s-{self.cluster}-{stream.spec.key}", daemon=True,
                args=(stream, resume, not is_pods, first if is_pods else ()))
            thread.start()
            threads.append(thread)
        stop.wait()
        for stream in streams:
            stream.interrupt()
        deadline = time.monotonic() + self.stop_grace_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _run_stream(self, stream: ResourceStream, resume: str | None, prime: bool,
                    wait_for: Sequence[threading.Event]) -> None:
        try:
            stream.run(resume, prime=prime, wait_for=wait_for)
        except Exception as exc:  # a last resort: the stream itself catches and retries
            log.exception("kubernetes stream %s crashed", stream.spec.key)
            self.on_error(WatchError(f"kubernetes cluster {self.cluster!r} at {self.server}: "
                                     f"{stream.spec.key}: stream stopped: {exc!r}",
                                     source=self.server, cluster=self.cluster,
                                     resource=stream.spec.key, retryable=False))

    def _resume_point(self, spec: StreamSpec) -> str | None:
        if self._load_state is None:
            return None
        try:
            return self._load_state(self.cluster, SOURCE, spec.key) or None
        except Exception as exc:  # noqa: BLE001 - the store may be down: list instead
            self.on_error(WatchError(f"kubernetes cluster {self.cluster!r}: cannot read the resume "
                                     f"point of {spec.key}, listing instead: {exc}",
                                     source=self.server, cluster=self.cluster, resource=spec.key))
            return None

    # -- the streams' handler (called from the stream threads) ---------------------------------
    def on_listed(self, spec: StreamSpec, items: list[dict[str, Any]], resource_version: str) -> None:
        stored = self._stored_open() if spec.kind == "pods" else []
        with self._lock:
            now = self._clock()
            rows: Rows = {}
            if spec.kind == "pods":
                self.tracker.remember_stored(stored)
            for obj in items:
                merge(rows, self._apply(spec, "SYNC", obj, now))
            if spec.kind == "nodes":
                names = {str((o.get("metadata") or {}).get("name") or "") for o in items}
                merge(rows, self.tracker.nodes_relisted(names, now))
            elif spec.kind in OWNER_KINDS:
                uids = {str((o.get("metadata") or {}).get("uid") or "") for o in items}
                merge(rows, self.tracker.owners_relisted(spec.kind, spec.namespace, uids, now))
            elif spec.kind in KUEUE_KINDS:
                keys = {key_of(KUEUE_KINDS[spec.kind], o) for o in items}
                merge(rows, self.tracker.kueue_relisted(spec.kind, spec.namespace, keys, now))
            elif spec.kind == "configmaps":
                if self.tracker.yunikorn is not None and spec.name:
                    keys = {key_of("ConfigMap", o) for o in items}
                    merge(rows, self.tracker.yunikorn.configmaps_relisted(spec.name, keys, now))
            else:
                uids = {str((o.get("metadata") or {}).get("uid") or "") for o in items}
                merge(rows, self.tracker.pods_relisted(spec.namespace, uids, stored, now))
                if self.tracker.yunikorn is not None:
                    keys = {key_of("Pod", o) for o in items}
                    merge(rows, self.tracker.yunikorn.pods_relisted(spec.namespace, keys, now))
            self._write(rows)
            self.on_resource_version(spec, resource_version, True)

    def on_primed(self, spec: StreamSpec, items: list[dict[str, Any]]) -> None:
        with self._lock:
            if spec.kind == "nodes":
                self.tracker.prime_nodes(items)
            elif spec.kind in OWNER_KINDS:
                self.tracker.prime_owners(spec.kind, items)
            elif spec.kind in KUEUE_KINDS and self.tracker.kueue is not None:
                self.tracker.kueue.prime(spec.kind, items)

    def on_event(self, spec: StreamSpec, event: str, obj: dict[str, Any]) -> None:
        with self._lock:
            self._write(self._apply(spec, event, obj, self._clock()))

    def on_resource_version(self, spec: StreamSpec, resource_version: str, force: bool) -> None:
        with self._lock:
            last, at = self._checkpoints.get(spec.key, ("", 0.0))
            mono = time.monotonic()
            if not resource_version or resource_version == last:
                return
            if not force and mono - at < self.checkpoint_interval_s:
                return
            if self._emit is None:
                return
            self._emit("collector_state", [(self._clock(), self.cluster, SOURCE, spec.key, resource_version)])
            self._checkpoints[spec.key] = (resource_version, mono)

    def on_error(self, error: CollectorError) -> None:
        log.warning("%s", error)
        if self._on_error is not None:
            self._on_error(error)

    # -- helpers ------------------------------------------------------------------------------
    def _apply(self, spec: StreamSpec, event: str, obj: Mapping[str, Any], now: dt.datetime) -> Rows:
        try:
            if spec.kind == "nodes":
                return self.tracker.on_node(event, obj, now)
            if spec.kind in OWNER_KINDS:
                return self.tracker.on_owner(spec.kind, event, obj, now)
            if spec.kind in KUEUE_KINDS:
                return self.tracker.on_kueue(spec.kind, event, obj, now)
            if spec.kind == "configmaps":
                return self.tracker.yunikorn.on_configmap(event, obj, now) if self.tracker.yunikorn else {}
            return self.tracker.on_pod(event, obj, now)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            meta = obj.get("metadata") or {}
            ident = "/".join(p for p in (meta.get("namespace"), meta.get("name")) if p) or "?"
            self.on_error(WatchError(
                f"kubernetes cluster {self.cluster!r} at {self.server}: {spec.key}: cannot read "
                f"{ident} (resourceVersion {meta.get('resourceVersion')}): {exc}",
                source=self.server, cluster=self.cluster, resource=spec.key, retryable=False))
            return {}

    def _write(self, rows: Rows) -> None:
        if self._emit is None:
            return
        for table in _TABLE_ORDER:
            if rows.get(table):
                self._emit(table, rows[table])

    def _visibility(self, api_client: ApiClient) -> VisibilityPoller | None:
        """The poller of Kueue's visibility API (``queues_from: kueue`` and an interval set), else None."""
        interval = self.target.kueue_visibility_interval_s
        if self.tracker.kueue is None or interval <= 0:
            return None
        with self._lock:
            stored = self.tracker.kueue.stored_names(SUMMARY_KIND)
        return VisibilityPoller(api_client, cluster=self.cluster, server=self.server, interval_s=interval,
                                absent_retry_s=self.options.absent_retry_s, stored=stored,
                                timeout=(self.options.connect_timeout_s, self.options.list_read_timeout_s))

    def _cluster_queues(self) -> list[str]:
        with self._lock:
            return self.tracker.kueue.cluster_queues() if self.tracker.kueue is not None else []

    def _write_summaries(self, rows: list[tuple[Any, ...]]) -> None:
        with self._lock:
            self._write({"kueue_objects": rows})

    def _stored_open(self) -> list[Allocation]:
        if self._open_allocations is None:
            return []
        try:
            got = self._open_allocations(self.cluster)
            rows = [a if isinstance(a, Allocation) else Allocation.from_row(a) for a in got]
            return [a for a in rows if a.source == "pod"]     # a Kueue Workload's row is closed by its own stream
        except Exception as exc:  # noqa: BLE001 - keep listing; only in-memory allocations close
            self.on_error(WatchError(f"kubernetes cluster {self.cluster!r}: cannot read the open "
                                     f"allocations from the store: {exc}", source=self.server,
                                     cluster=self.cluster, resource="pods"))
            return []


    def _remember_kueue(self) -> None:
        """The Kueue objects (or YuniKorn's ConfigMaps and pending pods) live in the store and the
        open Workload rows (before a restart)."""
        if (self.tracker.kueue is None and self.tracker.yunikorn is None) or self._stored_kueue is None:
            return
        try:
            keys, rows = self._stored_kueue(self.cluster)
            opened = [a if isinstance(a, Allocation) else Allocation.from_row(a) for a in rows]
        except Exception as exc:  # noqa: BLE001 - the lists still show what exists now
            self.on_error(WatchError(f"kubernetes cluster {self.cluster!r}: cannot read the stored Kueue "
                                     f"objects: {exc}", source=self.server, cluster=self.cluster,
                                     resource="workloads"))
            return
        with self._lock:
            if self.tracker.kueue is not None:
                self.tracker.kueue.remember_stored(keys, opened)
            if self.tracker.yunikorn is not None:
                self.tracker.yunikorn.remember_stored(keys)


# -- store adapters for the runner -----------------------------------------------------------
def state_loader(store: Any) -> LoadState:
    """``load_state`` reading ``collector_state`` from a :class:`gpuq.store.Store`."""
    def load(cluster: str, source: str, key: str) -> str | None:
        rows = store.query(
            f"SELECT value FROM {store.database}.collector_state FINAL WHERE cluster = {{c:String}} "
            f"AND source = {{s:String}} AND key = {{k:String}} ORDER BY ts DESC LIMIT 1",
            {"c": cluster, "s": source, "k": key}).rows
        return str(rows[0][0]) if rows else None
    return load


def open_allocations_loader(store: Any) -> OpenAllocations:
    """``open_allocations`` reading ``gpu_allocations FINAL`` rows with no end."""
    from gpuq.store.schema import COLUMNS

    cols = ", ".join(f"`{c}`" for c in COLUMNS["gpu_allocations"])

    def load(cluster: str) -> list[Allocation]:
        rows = store.query(
            f"SELECT {cols} FROM (SELECT {cols} FROM {store.database}.gpu_allocations FINAL "
            f"WHERE cluster = {{c:String}}) WHERE `end` IS NULL", {"c": cluster}).rows
        return [Allocation.from_row(r) for r in rows]
    return load


def stored_kueue_loader(store: Any) -> StoredKueue:
    """``stored_kueue``: the Kueue objects ``kueue_objects FINAL`` holds live, and the open
    ``gpu_allocations`` rows of source ``kueue``, of a cluster."""
    from gpuq.store.schema import COLUMNS

    cols = ", ".join(f"`{c}`" for c in COLUMNS["gpu_allocations"])

    def load(cluster: str) -> tuple[list[Key], list[Allocation]]:
        keys = store.query(
            f"SELECT kind, namespace, name FROM {store.database}.kueue_objects FINAL "
            f"WHERE cluster = {{c:String}} AND deleted = 0", {"c": cluster}).rows
        rows = store.query(
            f"SELECT {cols} FROM (SELECT {cols} FROM {store.database}.gpu_allocations FINAL "
            f"WHERE cluster = {{c:String}} AND source = 'kueue') WHERE `end` IS NULL", {"c": cluster}).rows
        return [(str(k), str(n), str(m)) for k, n, m in keys], [Allocation.from_row(r) for r in rows]
    return load
