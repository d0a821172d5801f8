"""List and watch one Kubernetes collection with the real client, resuming and retrying.

One :class:`ResourceStream` per collection (``nodes``, ``pods``, or ``pods/<namespace>``, one
ConfigMap by name (``configmaps/<namespace>/<name>``, a ``metadata.name`` field selector), and
KubeRay's ``rayclusters`` / ``rayjobs`` (``ray.io/v1`` custom objects, read with the client's
``CustomObjectsApi``), also per namespace). It does the I/O only; what the objects mean is the handler's business
(:class:`collector.kubernetes.KubernetesWatcher`).

The loop, until ``stop``:

* no resourceVersion: list (paged with ``limit``/``continue``), hand every item to the handler,
  then watch from the list's resourceVersion;
* watch with ``allowWatchBookmarks`` and ``timeoutSeconds``: every event advances the
  resourceVersion; a ``BOOKMARK`` only advances it; when the server ends the stream (its
  timeout), watch again from the last resourceVersion at once;
* 410 Gone (an ``ERROR`` event with code 410, or an HTTP 410): forget the resourceVersion and
  relist at once (with backoff if the watch from the fresh list is refused again);
* anything else (connection refused or dropped mid-stream, HTTP error, a line that is not JSON):
  report a :class:`WatchError` and, after an exponential backoff with jitter (capped), watch
  again from the last resourceVersion (or list again, if the list failed);
* an unexpected exception (a bug, the emit callable failing): report it, back off, relist;
* a custom resource the server does not know (HTTP 404: KubeRay's CRDs not installed): logged
  once, not reported as an error, and asked again every ``absent_retry_s`` (KubeRay installed
  later is picked up). The stream counts as synced meanwhile, so nothing waits for it.

Bodies are read with ``_preload_content=False`` and parsed as plain JSON: the handler works on
the API's own dicts, and the client's model classes (slow for pods) are never built.
"""
from __future__ import annotations

import json
import logging
import random
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import urllib3
from kubernetes.client import CoreV1Api, CustomObjectsApi
from kubernetes.client.exceptions import ApiException
from kubernetes.watch.watch import iter_resp_lines

from collector.errors import ResourceExpired, WatchError

log = logging.getLogger(__name__)
WATCH_EVENTS = frozenset({"ADDED", "MODIFIED", "DELETED"})
KUEUE_GROUP = "kueue.x-k8s.io"
KUEUE_VERSIONS = ("v1beta2", "v1beta1")       # newest first: Kueue serves both since v0.15, v1beta1 alone before
# plural -> (group, versions tried in order: the first one the server serves is used)
CUSTOM_RESOURCES: dict[str, tuple[str, tuple[str, ...]]] = {
    "rayclusters": ("ray.io", ("v1",)), "rayjobs": ("ray.io", ("v1",)),
    "resourceflavors": (KUEUE_GROUP, KUEUE_VERSIONS),
    "cohorts": (KUEUE_GROUP, (*KUEUE_VERSIONS, "v1alpha1")),     # Cohort was v1alpha1 before v1beta1
    "clusterqueues": (KUEUE_GROUP, KUEUE_VERSIONS),
    "localqueues": (KUEUE_GROUP, KUEUE_VERSIONS),
    "workloads": (KUEUE_GROUP, KUEUE_VERSIONS),
}
CLUSTER_SCOPED = frozenset({"nodes", "resourceflavors", "cohorts", "clusterqueues"})


@dataclass(frozen=True, slots=True)
class StreamSpec:
    kind: str                      # "pods", "nodes", "configmaps" (YuniKorn's, one by name, with queues_from:
    #                                yunikorn), or a plural of CUSTOM_RESOURCES (Kueue's only with queues_from: kueue)
    namespace: str | None = None   # objects of one namespace; None = all
    name: str | None = None        # the one object of that name (a field selector), None = all

    @property
    def key(self) -> str:
        """The collector_state key that holds this stream's resourceVersion."""
        base = f"{self.kind}/{self.namespace}" if self.namespace else self.kind
        return f"{base}/{self.name}" if self.name else base

    @property
    def custom(self) -> tuple[str, str] | None:
        """(group, preferred version) of a custom resource, None for a core one."""
        got = CUSTOM_RESOURCES.get(self.kind)
        return (got[0], got[1][0]) if got else None

    @property
    def versions(self) -> tuple[str, ...]:
        """The API versions of a custom resource, tried in this order (empty for a core one)."""
        got = CUSTOM_RESOURCES.get(self.kind)
        return got[1] if got else ()


@dataclass(frozen=True, slots=True)
class StreamOptions:
    watch_timeout_s: int = 300         # timeoutSeconds asked of the server
    page_size: int = 500               # list limit
    connect_timeout_s: float = 5.0
    list_read_timeout_s: float = 60.0
    backoff_base_s: float = 0.5
    backoff_cap_s: float = 30.0
    min_watch_s: float = 1.0           # a watch shorter than this with no event counts as a failure
    absent_retry_s: float = 300.0      # how often to ask again for a custom resource answered 404


def backoff_delay(attempt: int, base_s: float, cap_s: float, rng: random.Random) -> float:
    """Exponential backoff with equal jitter: ``min(cap, base * 2**attempt) * U[0.5, 1)``."""
    return min(cap_s, base_s * (2.0 ** min(attempt, 30))) * (0.5 + rng.random() / 2)


class StreamHandler(Protocol):
    def on_listed(self, spec: StreamSpec, items: list[dict[str, Any]], resource_version: str) -> None: ...
    def on_primed(self, spec: StreamSpec, items: list[dict[str, Any]]) -> None: ...
    def on_event(self, spec: StreamSpec, event: str, obj: dict[str, Any]) -> None: ...
    def on_resource_version(self, spec: StreamSpec, resource_version: str, force: bool) -> None: ...
    def on_error(self, error: WatchError) -> None: ...


class ResourceStream:
    def __init__(self, spec: StreamSpec, api: CoreV1Api, handler: StreamHandler, *, cluster: str,
                 server: str, stop: threading.Event, options: StreamOptions = StreamOptions(),
                 rng: random.Random | None = None, custom_api: CustomObjectsApi | None = None) -> None:
        self.spec = spec
        self.api = api
        self.custom_api = custom_api
        self.absent_logged = False
        self.handler = handler
        self.cluster = cluster
        self.server = server
        self.stop = stop
        self.options = options
        self.rng = rng or random.Random()
        self.resource_version: str | None = None
        self.version_index = 0              # of spec.versions: the one served (found by the list)
        self.synced = threading.Event()     # set after the first list (or prime) attempt
        self._resp: Any = None
        self._resp_lock = threading.Lock()

    # -- the loop ---------------------------------------------------------------------------
    def run(self, resume_from: str | None = None, *, prime: bool = False,
            wait_for: Sequence[threading.Event] = ()) -> None:
        """List/watch until ``stop``. With ``resume_from``, watch from there without relisting
        (``prime``: read the collection once for the handler's cache first). ``wait_for``: start
        once these are set (other streams' first list)."""
        self.resource_version = resume_from or None
        need_prime = prime and self.resource_version is not None
        failures = expired = 0
        for event in wait_for:
            while not event.wait(0.1):
                if self.stop.is_set():
                    return
        while not self.stop.is_set():
            try:
                if need_prime:
                    self.handler.on_primed(self.spec, self._list()[0])
                    need_prime = False
                    self.synced.set()
                if self.resource_version is None:
                    self.list_once()
                    failures = 0
                started, events = time.monotonic(), self._watch()
                if events or time.monotonic() - started >= self.options.min_watch_s:
                    failures = expired = 0
                    continue
                raise self._error("watch ended at once without events", None)
            except ResourceExpired as exc:
                log.info("%s: %s; relisting", self.spec.key, exc.message)
                self.resource_version = None
                need_prime = False
                expired += 1
                if expired > 1:                   # 410 again straight after a list: back off
                    self.stop.wait(backoff_delay(expired - 2, self.options.backoff_base_s,
                                                 self.options.backoff_cap_s, self.rng))
            except Exception as exc:  # a WatchError, or a bug / a failing emit
                self.synced.set()
                if self.stop.is_set():
                    return
                if self.absent(exc):
                    self.resource_version = None
                    need_prime = False
                    self.stop.wait(self.options.absent_retry_s)
                    continue
                if not isinstance(exc, WatchError):
                    log.exception("%s: unexpected error; relisting after a backoff", self.spec.key)
                    self.resource_version = None          # what was handed over may be incomplete
                    need_prime = False
                    exc = self._error(f"unexpected error, relisting: {exc!r}", None, retryable=False)
                self.handler.on_error(exc)
                delay = backoff_delay(failures, self.options.backoff_base_s, self.options.backoff_cap_s,
                                      self.rng)
                failures += 1
                self.stop.wait(delay)
            finally:
                if self.resource_version:
                    self.handler.on_resource_version(self.spec, self.resource_version, True)

    def absent(self, exc: BaseException) -> bool:
        """True (and logged once) when ``exc`` says the server does not serve this custom resource."""
        if self.spec.custom is None or not isinstance(exc, WatchError) or exc.status != 404:
            return False
        if not self.absent_logged:
            self.absent_logged = True
            group = self.spec.custom[0]
            log.warning("kubernetes cluster %r at %s: %s.%s/%s not served (CRD not installed?); going on "
                        "without it, asking again every %.0f s", self.cluster, self.server, self.spec.kind,
                        group, " nor ".join(self.spec.versions), self.options.absent_retry_s)
        return True

    @property
    def version(self) -> str:
        """The API version asked for now (a custom resource's)."""
        return self.spec.versions[self.version_index]

    def list_once(self) -> str:
        """List the whole collection, hand it to the handler; return the list's resourceVersion."""
        try:
            items, rv = self._list()
            self.handler.on_listed(self.spec, items, rv)
            self.resource_version = rv
            return rv
        finally:
            self.synced.set()

    def interrupt(self) -> None:
        """Unblock a list or watch in flight (called from another thread after ``stop`` is set;
        a request still waiting for its response headers is cut as soon as they arrive)."""
        with self._resp_lock:
            resp = self._resp
        conn = getattr(resp, "connection", None) if resp is not None else None
        sock = getattr(conn, "sock", None)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    # -- I/O ----------------------------------------------------------------------------------
    def _call(self, **kwargs: Any) -> Any:
        what = "watch" if kwargs.get("watch") else "list"
        resp: Any
        try:
            custom = self.spec.custom
            if custom is not None:
                if self.custom_api is None:
                    raise TypeError(f"{self.spec.key}: a custom resource stream needs custom_api")
                group, version = custom[0], self.version
                if self.spec.namespace:
                    resp = self.custom_api.list_namespaced_custom_object(
                        group, version, self.spec.namespace, self.spec.kind, _preload_content=False, **kwargs)
                else:
                    resp = self.custom_api.list_cluster_custom_object(
                        group, version, self.spec.kind, _preload_content=False, **kwargs)
            elif self.spec.kind == "nodes":
                resp = self.api.list_node(_preload_content=False, **kwargs)
            elif self.spec.kind == "configmaps":
                if not self.spec.namespace or not self.spec.name:
                    raise TypeError(f"{self.spec.key}: a ConfigMap stream names its namespace and name")
                resp = self.api.list_namespaced_config_map(
                    self.spec.namespace, field_selector=f"metadata.name={self.spec.name}", _preload_content=False,
                    **kwargs)
            elif self.spec.namespace:
                resp = self.api.list_namespaced_pod(self.spec.namespace, _preload_content=False, **kwargs)
            else:
                resp = self.api.list_pod_for_all_namespaces(_preload_content=False, **kwargs)
        except ApiException as exc:
            raise self._api_error(what, exc) from exc
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise self._error(f"cannot reach the API server ({what}): {_reason(exc)}", None) from exc
        with self._resp_lock:
            self._resp = resp
        if self.stop.is_set():            # stopped while the request was in flight
            self.interrupt()
        return resp

    def _release(self, resp: Any) -> None:
        with self._resp_lock:
            self._resp = None
        try:
            resp.close()
            resp.release_conn()
        except Exception as exc:  # noqa: BLE001 - a broken connection is being thrown away anyway
            log.debug("closing a %s response: %r", self.spec.key, exc)

    def _list(self) -> tuple[list[dict[str, Any]], str]:
        """The whole collection; a custom resource answered 404 is asked for in its next version
        (Kueue's newest first), and all of them 404 raises that 404 (from the first version again)."""
        while True:
            try:
                return self._list_version()
            except WatchError as exc:
                if exc.status != 404 or self.version_index + 1 >= len(self.spec.versions):
                    self.version_index = 0
                    raise
                self.version_index += 1
                log.info("%s: %s not served; trying %s", self.spec.key, self.spec.versions[self.version_index - 1],
                         self.version)

    def _list_version(self) -> tuple[list[dict[str, Any]], str]:
        items: list[dict[str, Any]] = []
        token: str | None = None
        timeout = (self.options.connect_timeout_s, self.options.list_read_timeout_s)
        while True:
            kwargs: dict[str, Any] = {"limit": self.options.page_size, "_request_timeout": timeout}
            if token:
                kwargs["_continue"] = token
            resp = self._call(**kwargs)
            try:
                body = json.loads(resp.data)
            except (urllib3.exceptions.HTTPError, OSError) as exc:
                raise self._error(f"list broken off: {_reason(exc)}", None) from exc
            except ValueError as exc:
                raise self._error(f"list answer is not JSON: {exc}", None, retryable=False) from exc
            finally:
                self._release(resp)
            items.extend(body.get("items") or ())
            meta = body.get("metadata") or {}
            token = meta.get("continue") or None
            if not token:
                return items, str(meta.get("resourceVersion") or "")

    def _watch(self) -> int:
        opts = self.options
        resp = self._call(
            watch=True, resource_version=self.resource_version, allow_watch_bookmarks=True,
            timeout_seconds=opts.watch_timeout_s,
            _request_timeout=(opts.connect_timeout_s, opts.watch_timeout_s + 15.0),
        )
        events = 0
        try:
            for event, obj in self._events(resp):
                if self.stop.is_set():
                    break
                rv = str(((obj.get("metadata") or {}).get("resourceVersion")) or "")
                if event == "BOOKMARK":
                    if rv:
                        self.resource_version = rv
                        self.handler.on_resource_version(self.spec, rv, True)
                    continue
                if event not in WATCH_EVENTS:
                    continue
                events += 1
                self.handler.on_event(self.spec, event, obj)
                if rv:
                    self.resource_version = rv
                    self.handler.on_resource_version(self.spec, rv, False)
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            if not self.stop.is_set():
                raise self._error(f"watch connection dropped at resourceVersion "
                                  f"{self.resource_version}: {_reason(exc)}", None) from exc
        finally:
            self._release(resp)
        return events

    def _events(self, resp: Any) -> Iterator[tuple[str, dict[str, Any]]]:
        for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
            if not line.strip():
                continue
            try:
                ev = json.loads(line)
                kind, obj = str(ev["type"]), ev.get("object") or {}
            except (ValueError, KeyError, TypeError) as exc:
                raise self._error(f"watch event is not JSON: {line[:120]!r}", None) from exc
            if kind == "ERROR":
                raise self._status_error(obj)
            yield kind, obj

    # -- errors -------------------------------------------------------------------------------
    def _error(self, message: str, status: int | None, *, retryable: bool | None = None) -> WatchError:
        cls = ResourceExpired if status == 410 else WatchError
        return cls(f"kubernetes cluster {self.cluster!r} at {self.server}: {self.spec.key}: {message}",
                   source=self.server, cluster=self.cluster, resource=self.spec.key, status=status,
                   retryable=retryable)

    def _status_error(self, status: Mapping[str, Any]) -> WatchError:
        code = status.get("code")
        code = int(code) if isinstance(code, int) else None
        text = f"{status.get('reason') or 'Error'}: {status.get('message') or ''}".strip()
        return self._error(f"watch error {code}: {text}", code,
                           retryable=None if code is None else _retryable_status(code))

    def _api_error(self, what: str, exc: ApiException) -> WatchError:
        status = int(exc.status) if exc.status else None
        detail = exc.reason or ""
        try:
            body = json.loads(exc.body) if exc.body else {}
            detail = body.get("message") or detail
        except (ValueError, AttributeError):
            pass
        if not status:
            return self._error(f"cannot reach the API server ({what}): {detail}", None)
        return self._error(f"{what} failed: HTTP {status}: {detail}", status,
                           retryable=_retryable_status(status))


def _retryable_status(status: int) -> bool:
    return status not in (400, 401, 403, 404, 405, 422)


def _reason(exc: BaseException) -> str:
    inner = getattr(exc, "reason", None)
    text = str(inner if isinstance(inner, BaseException) else exc)
    return text.splitlines()[0][:300] if text else type(exc).__name__

