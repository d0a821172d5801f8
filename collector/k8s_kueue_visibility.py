"""Kueue's visibility API as the Kubernetes watcher polls it (``queues_from: kueue``). Read only.

Kueue serves, beside its CRDs, an aggregated API (``visibility.kueue.x-k8s.io``, ``v1beta2`` since
Kueue 0.15 and ``v1beta1`` before and beside it; feature gate ``VisibilityOnDemand``, on by default
since 0.9) whose ``GET /apis/visibility.kueue.x-k8s.io/<version>/clusterqueues/<name>/pendingworkloads``
answers a ``PendingWorkloadsSummary``: the pending Workloads of that ClusterQueue in Kueue's own
queue order, each with ``metadata.name``/``namespace``, ``priority``, ``localQueueName``,
``positionInClusterQueue`` and ``positionInLocalQueue`` (both **0-based**; apis/visibility/v1beta2/
types.go, pkg/visibility/storage/pending_workloads_cq.go in kubernetes-sigs/kueue). Kueue's order
knows what a Workload's own fields do not show (admission fair sharing between LocalQueues, the
Workload a preemption is under way for), so where it is served gpuq shows Kueue's position rather
than the one it computes (:func:`scheduler.service.kueue.build`).

:class:`VisibilityPoller` asks it for every ClusterQueue the watcher knows, every
``kueue_visibility_interval_s`` (``collector.kubernetes[].kueue_visibility_interval_s``, default 30 s;
0: never), and stores each answer as one ``kueue_objects`` row (kind ``PendingWorkloadsSummary``,
named after the ClusterQueue, no namespace), the summary as Kueue answered it with ``gpuq``'s
``fetched`` time and ``interval_s`` added, so that ``gpuq serve`` can tell a fresh answer from one left
behind by a collector that stopped. A ClusterQueue gone, or the API no longer answering, marks its
row deleted. Kueue answers a page at a time (``limit``, default 1,000, and ``offset``): the pages
are asked one after another until one comes back short, up to :data:`MAX_ITEMS` Workloads (then
``gpuq.truncated`` is set, and the rest keep gpuq's computed positions). A Workload admitted between
two pages moves the later ones up by one: a Workload seen twice is kept once, at its first page's
position, and the one skipped keeps its computed position until the next round.

Not served (404 from every version, e.g. no ``APIService`` or the feature gate off) or forbidden
(403: the collector's ClusterRole lacks ``clusterqueues/pendingworkloads``): logged once, the rows
marked deleted (gpuq computes positions again), and asked again only every ``absent_retry_s`` (the
streams' 5 minutes). A 404 whose Status names the ClusterQueue is Kueue saying it does not know that
queue (yet): that queue has no summary, the others go on. Other failures (5xx, the API server
unreachable) are logged (the same failure round after round once) and the next round asks again; the
stored rows age out meanwhile.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import urllib3
from kubernetes.client import ApiClient
from kubernetes.client.exceptions import ApiException

from collector.k8s_kueue import kept

log = logging.getLogger(__name__)

GROUP = "visibility.kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")        # newest first: v1beta2 since Kueue 0.15, v1beta1 before
KIND = "PendingWorkloadsSummary"         # the kueue_objects kind of a stored answer (named after its ClusterQueue)
LIMIT = 1000                             # a page (Kueue's default `limit`); the next asked at `offset`
MAX_ITEMS = 10_000                       # read per ClusterQueue; Workloads past it keep gpuq's computed position
Row = tuple[Any, ...]


class NotServed(Exception):
    """The visibility API is not served, or not to us: why, for the one log line."""


def summary_row(cluster: str, cluster_queue: str, summary: Mapping[str, Any] | None, now: dt.datetime,
                interval_s: float) -> Row:
    """The ``kueue_objects`` row of one answer (``None``: the row that marks it deleted)."""
    obj: dict[str, Any] = {"kind": KIND, "metadata": {"name": cluster_queue}, "items": []}
    if summary is not None:
        obj = kept(summary)
        obj["metadata"] = {**(obj.get("metadata") or {}), "name": cluster_queue}
        obj["gpuq"] = {**(obj.get("gpuq") or {}),          # what the fetch noted (truncated)
                       "fetched": now.isoformat().replace("+00:00", "Z"), "interval_s": interval_s}
    return (now, cluster, KIND, "", cluster_queue, "", "", int(summary is None),
            json.dumps(obj, separators=(",", ":"), sort_keys=True))


class VisibilityPoller:
    """Asks Kueue's visibility API for each ClusterQueue's pending Workloads (the module's rules)."""

    def __init__(self, api_client: ApiClient, *, cluster: str, server: str, interval_s: float,
                 absent_retry_s: float, timeout: tuple[float, float], stored: Iterable[str] = ()) -> None:
        self.api_client = api_client
        self.cluster = cluster
        self.server = server
        self.interval_s = interval_s
        self.absent_retry_s = absent_retry_s
        self.timeout = timeout
        self.version_index = 0               # of VERSIONS: the one served (found by the first answer)
        self.live: set[str] = set(stored)    # the ClusterQueues whose summary is stored live
        self.unavailable: str | None = None  # why not served, once logged; None while it answers
        self.failing = ""                    # the last round's other failures, as logged ("" when none)

    # -- one round ---------------------------------------------------------------------------------
    def poll(self, cluster_queues: Iterable[str], now: dt.datetime) -> tuple[list[Row], float]:
        """The rows of one round over these ClusterQueues and how long to wait before the next."""
        rows: list[Row] = []
        names = sorted(set(cluster_queues))
        failed: list[str] = []
        try:
            for name in names:
                try:
                    summary = self._fetch(name)
                except (RuntimeError, ValueError, OSError, urllib3.exceptions.HTTPError) as exc:
                    failed.append(f"{name}: {exc}")      # its stored answer ages out meanwhile
                    continue
                if summary is None:                  # Kueue does not know this ClusterQueue (yet)
                    if name in self.live:
                        rows.append(summary_row(self.cluster, name, None, now, self.interval_s))
                        self.live.discard(name)
                    continue
                rows.append(summary_row(self.cluster, name, summary, now, self.interval_s))
                self.live.add(name)
        except NotServed as exc:
            if self.unavailable is None:
                log.warning("kubernetes cluster %r at %s: Kueue's visibility API %s; positions of pending "
                            "Workloads are computed by gpuq; asking again every %.0f s", self.cluster, self.server,
                            exc, self.absent_retry_s)
            self.unavailable = str(exc)
            rows.extend(summary_row(self.cluster, n, None, now, self.interval_s) for n in sorted(self.live))
            self.live.clear()
            return rows, self.absent_retry_s
        said = "; ".join(failed)
        if said and said != self.failing:          # the same failure round after round: once (a 503 lasting)
            log.warning("kubernetes cluster %r at %s: Kueue's visibility API: %s; asking again every %.0f s",
                        self.cluster, self.server, said, self.interval_s)
        self.failing = said
        if self.unavailable is not None and len(failed) < len(names):
            log.info("kubernetes cluster %r at %s: Kueue's visibility API (%s/%s) answers again", self.cluster,
                     self.server, GROUP, VERSIONS[self.version_index])
            self.unavailable = None
        for gone in sorted(self.live - set(names)):   # its ClusterQueue deleted
            rows.append(summary_row(self.cluster, gone, None, now, self.interval_s))
            self.live.discard(gone)
        return rows, self.interval_s

    # -- I/O ---------------------------------------------------------------------------------------
    def _fetch(self, name: str) -> dict[str, Any] | None:
        """The summary of one ClusterQueue, its pages joined (the module's rules); None when Kueue
        does not know it. Raises :class:`NotServed`, or :class:`RuntimeError` (and the client's I/O
        errors) for this queue alone."""
        first = self._page(name, 0)
        if first is None:
            return None
        items = list(_items(first, name))
        seen = {_key(i) for i in items}
        page = items
        while len(page) >= LIMIT and len(items) < MAX_ITEMS:
            nxt = self._page(name, len(items))
            page = list(_items(nxt, name)) if nxt is not None else []
            items += (i for i in page if _key(i) not in seen)
            seen.update(_key(i) for i in page)
        if len(items) >= MAX_ITEMS and len(page) >= LIMIT:
            first["gpuq"] = {"truncated": True}
        first["items"] = items[:MAX_ITEMS]
        return first

    def _page(self, name: str, offset: int) -> dict[str, Any] | None:
        while True:
            version = VERSIONS[self.version_index]
            status, body = self._get(f"/apis/{GROUP}/{version}/clusterqueues/{{name}}/pendingworkloads", name, offset)
            if 200 <= status < 300:
                if not isinstance(body, dict):
                    raise ValueError(f"clusterqueues/{name}/pendingworkloads: the answer is not a JSON object")
                return body
            if status == 403:
                self.version_index = 0
                raise NotServed(f"is forbidden to the collector (403: {_message(body)}; the ClusterRole needs "
                                f"get on {GROUP} clusterqueues/pendingworkloads)")
            if status == 404:
                details = body.get("details") if isinstance(body, dict) else None
                if isinstance(details, dict) and details.get("name") == name:
                    return None                      # Kueue's own NotFound: it knows no such ClusterQueue
                if self.version_index + 1 < len(VERSIONS):
                    self.version_index += 1
                    continue
                self.version_index = 0
                raise NotServed(f"is not served ({GROUP}/{' nor '.join(VERSIONS)}: 404)")
            raise RuntimeError(f"clusterqueues/{name}/pendingworkloads: HTTP {status}: {_message(body)}")

    def _get(self, path: str, name: str, offset: int = 0) -> tuple[int, Any]:
        query: list[tuple[str, Any]] = [("limit", LIMIT), *([("offset", offset)] if offset else [])]
        method, url, headers, body, post = self.api_client.param_serialize(
            "GET", path, path_params={"name": name}, query_params=query,
            header_params={"Accept": "application/json"}, auth_settings=["BearerToken"])
        try:
            resp = self.api_client.call_api(method, url, header_params=headers, body=body, post_params=post,
                                            _request_timeout=self.timeout)
            resp.read()
        except ApiException as exc:
            if not exc.status:
                raise RuntimeError(f"cannot reach the API server: {exc.reason}") from exc
            return int(exc.status), _json(exc.body)
        return int(resp.status), _json(resp.data)


def _items(summary: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    items = summary.get("items")
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError(f"clusterqueues/{name}/pendingworkloads: items is not a list of objects")
    return items


def _key(item: Mapping[str, Any]) -> tuple[str, str]:
    meta = item.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def _json(data: Any) -> Any:
    try:
        return json.loads(data) if data else None
    except (ValueError, TypeError):
        return None


def _message(body: Any) -> str:
    return str(body.get("message") or body.get("reason") or "") if isinstance(body, dict) else ""


def run_poller(poller: VisibilityPoller, names: Callable[[], list[str]], write: Callable[[list[Row]], None],
               clock: Callable[[], dt.datetime], stop: threading.Event, ready: Iterable[threading.Event] = ()) -> None:
    """Poll until ``stop``: after the ClusterQueues' first list (``ready``), a round, then wait."""
    for event in ready:
        while not event.wait(0.1):
            if stop.is_set():
                return
    while not stop.is_set():
        try:
            rows, wait = poller.poll(names(), clock())
        except Exception:  # a last resort (a bug): the pods and Kueue's streams go on without it
            log.exception("kubernetes cluster %r: polling Kueue's visibility API failed", poller.cluster)
            rows, wait = [], poller.interval_s
        if rows:
            write(rows)
        stop.wait(wait)
