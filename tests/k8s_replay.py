"""A local Kubernetes API server that replays recorded objects in the API's wire format.

Serves, for ``pods`` (``/api/v1/pods``, ``/api/v1/namespaces/<ns>/pods``), ``nodes``
(``/api/v1/nodes``), ``configmaps`` (``/api/v1/namespaces/<ns>/configmaps``, with the
``metadata.name`` field selector, as YuniKorn's are watched) and KubeRay's custom objects ``rayclusters`` and ``rayjobs``
(``/apis/ray.io/v1/<plural>``, ``/apis/ray.io/v1/namespaces/<ns>/<plural>``; answered 404, as by
a cluster without the CRDs, for the plurals named in ``absent``), and Kueue's (``kueue.x-k8s.io``:
``resourceflavors``, ``cohorts``, ``clusterqueues``, ``localqueues``, ``workloads``) in the versions of
``kueue_versions`` only (404 for the others, as a Kueue that does not serve them):

Kueue's visibility API (``visibility.kueue.x-k8s.io``, the versions of ``visibility_versions``; none by
default, 404 as where it is not served): ``GET .../clusterqueues/<name>/pendingworkloads`` answers the
``PendingWorkloadsSummary`` of :attr:`ReplayServer.visibility` for that ClusterQueue (``offset``/``limit``
applied, ``apiVersion`` the version asked), Kueue's NotFound Status naming the queue for one it lacks,
and :attr:`ReplayServer.visibility_status` (e.g. 403) instead when set.

* list: ``{"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": ...},
  "items": [...]}``, paged with ``limit``/``continue`` (a consistent snapshot, like etcd);
* watch (``?watch=true&resourceVersion=N&allowWatchBookmarks=true&timeoutSeconds=S``): chunked
  newline-delimited JSON events ``{"type": ..., "object": ...}`` newer than ``N``, then every event
  pushed while the stream is open, until ``timeoutSeconds`` (or :attr:`max_watch_s`) passes and
  the stream ends with its terminating chunk. BOOKMARK events only with ``allowWatchBookmarks``.

The test scripts it (all thread-safe):

* :meth:`add` / :meth:`modify` / :meth:`delete`: an event with the next resourceVersion
  (the object's ``metadata.resourceVersion`` is set to it, as etcd would);
* :meth:`bookmark`: a BOOKMARK with a fresh resourceVersion (as if other kinds moved on);
* :meth:`expire`: the next watch asking for that resourceVersion gets an ``ERROR`` event with a
  410 ``Expired`` Status (or, with ``http=True``, an HTTP 410); :meth:`compact`: every watch
  from before a resourceVersion gets the 410 (etcd compaction);
* :meth:`drop_next_watch`: the next watch connection is closed after ``n`` events without the
  terminating chunk (a dropped connection);
* :meth:`interrupt_watches`: the watches open now ``"end"`` (terminating chunk, as at
  ``timeoutSeconds``), are ``"drop"``-ped (socket closed mid-stream), or get an ``"expire"``
  ERROR 410 event;
* :attr:`requests`: every request received (path, query), for resume assertions.
"""
from __future__ import annotations

import base64
import copy
import json
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

DATA = Path(__file__).parent / "data" / "k8s"
KUEUE = {"resourceflavors": "ResourceFlavor", "cohorts": "Cohort", "clusterqueues": "ClusterQueue",
         "localqueues": "LocalQueue", "workloads": "Workload"}
KINDS = {"pods": "Pod", "nodes": "Node", "configmaps": "ConfigMap", "rayclusters": "RayCluster",
         "rayjobs": "RayJob", **KUEUE}
API_VERSIONS = {"pods": "v1", "nodes": "v1", "configmaps": "v1", "rayclusters": "ray.io/v1", "rayjobs": "ray.io/v1",
                **{k: "kueue.x-k8s.io/v1beta1" for k in KUEUE}}
CUSTOM = ("rayclusters", "rayjobs", *KUEUE)
NAMESPACED = ("pods", "configmaps", "rayclusters", "rayjobs", "localqueues", "workloads")


def load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    resource: str                 # a key of KINDS ("" for anything else)
    namespace: str | None

    @property
    def watch(self) -> bool:
        return self.query.get("watch") in ("true", "1")


@dataclass(slots=True)
class _Event:
    rv: int
    type: str
    obj: dict[str, Any]


@dataclass(slots=True)
class _Resource:
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)   # "ns/name" -> object
    history: list[_Event] = field(default_factory=list)
    compacted: int = 0
    expire: dict[int, bool] = field(default_factory=dict)              # rv -> http?
    drops: list[int] = field(default_factory=list)
    actions: list[str] = field(default_factory=list)                   # for the open watches


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta['name']}"


def _selected_name(query: dict[str, str]) -> str | None:
    """The name a ``fieldSelector=metadata.name=<name>`` selects (the only field selector served)."""
    sel = query.get("fieldSelector") or ""
    return sel.removeprefix("metadata.name=") if sel.startswith("metadata.name=") else None


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class ReplayServer:
    def __init__(self, pods: Iterable[dict[str, Any]] = (), nodes: Iterable[dict[str, Any]] = (),
                 resource_version: int = 1, max_watch_s: float = 30.0, *,
                 rayclusters: Iterable[dict[str, Any]] = (), rayjobs: Iterable[dict[str, Any]] = (),
                 absent: Iterable[str] = (), kueue: dict[str, Iterable[dict[str, Any]]] | None = None,
                 kueue_versions: Iterable[str] = ("v1beta1",), configmaps: Iterable[dict[str, Any]] = (),
                 visibility: dict[str, dict[str, Any]] | None = None, visibility_versions: Iterable[str] = ()) -> None:
        self._cond = threading.Condition()
        self._rv = resource_version
        self._res = {kind: _Resource() for kind in KINDS}
        self.absent = frozenset(absent)
        self.kueue_versions = tuple(kueue_versions)      # the versions of kueue.x-k8s.io served (404 others)
        self.visibility = copy.deepcopy(visibility or {})    # ClusterQueue -> PendingWorkloadsSummary
        self.visibility_versions = tuple(visibility_versions)   # of visibility.kueue.x-k8s.io (none: 404)
        self.visibility_status: int | None = None       # answered instead of the summary (403: forbidden)
        for kind, items in (("pods", pods), ("nodes", nodes), ("rayclusters", rayclusters),
                            ("rayjobs", rayjobs), ("configmaps", configmaps), *(kueue or {}).items()):
            for obj in items:
                obj = copy.deepcopy(obj)
                self._rv = max(self._rv, int(obj["metadata"].get("resourceVersion") or 0))
                self._res[kind].objects[_key(obj)] = obj
        self.max_watch_s = max_watch_s
        self.requests: list[Request] = []
        self._snapshots: dict[int, dict[tuple[str, str], list[dict[str, Any]]]] = {}
        self._closing = False
        self._open: dict[str, int] = {}
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,),
                                        name="k8s-replay", daemon=True)

    @classmethod
    def recorded(cls, **kw: Any) -> ReplayServer:
        """The recorded lists of tests/data/k8s."""
        pods, nodes = load("pods.json"), load("nodes.json")
        rv = max(int(pods["metadata"]["resourceVersion"]), int(nodes["metadata"]["resourceVersion"]))
        return cls(pods["items"], nodes["items"], resource_version=rv, **kw)

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def close(self) -> None:
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kubeconfig(self, path: Path, context: str = "replay") -> Path:
        """A kubeconfig pointing the real client at this server (plain HTTP, no auth)."""
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": context,
               "clusters": [{"name": "replay", "cluster": {"server": self.url}}],
               "users": [{"name": "anonymous", "user": {}}],
               "contexts": [{"name": context, "context": {"cluster": "replay", "user": "anonymous"}}]}
        path.write_text(json.dumps(cfg))
        return path

    # -- scripting ------------------------------------------------------------------------------
    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    def _push(self, kind: str, type_: str, obj: dict[str, Any] | None) -> int:
        with self._cond:
            self._rv += 1
            res = self._res[kind]
            body: dict[str, Any]
            if obj is None:                           # a bookmark
                body = {"kind": KINDS[kind], "apiVersion": API_VERSIONS[kind],
                        "metadata": {"resourceVersion": str(self._rv)}}
            else:
                body = copy.deepcopy(obj)
                body.setdefault("kind", KINDS[kind])
                body.setdefault("apiVersion", API_VERSIONS[kind])
                body["metadata"]["resourceVersion"] = str(self._rv)
                item = body if kind in CUSTOM else {k: v for k, v in body.items()
                                                    if k not in ("kind", "apiVersion")}
                if type_ == "DELETED":
                    res.objects.pop(_key(body), None)
                else:
                    res.objects[_key(body)] = item
            res.history.append(_Event(self._rv, type_, body))
            self._cond.notify_all()
            return self._rv

    def add(self, kind: str, obj: dict[str, Any]) -> int:
        return self._push(kind, "ADDED", obj)

    def modify(self, kind: str, obj: dict[str, Any]) -> int:
        return self._push(kind, "MODIFIED", obj)

    def delete(self, kind: str, obj: dict[str, Any]) -> int:
        return self._push(kind, "DELETED", obj)

    def event(self, kind: str, event: dict[str, Any]) -> int:
        """Push a recorded watch event ``{"type": ..., "object": ...}``."""
        return self._push(kind, event["type"], event["object"])

    def bookmark(self, kind: str) -> int:
        return self._push(kind, "BOOKMARK", None)

    def expire(self, kind: str, resource_version: int | str, http: bool = False) -> None:
        with self._cond:
            self._res[kind].expire[int(resource_version)] = http

    def compact(self, kind: str, before: int | str) -> None:
        with self._cond:
            self._res[kind].compacted = int(before)

    def drop_next_watch(self, kind: str, after_events: int = 0) -> None:
        with self._cond:
            self._res[kind].drops.append(after_events)

    def interrupt_watches(self, kind: str, how: str = "end") -> None:
        if how not in ("end", "drop", "expire"):
            raise ValueError(how)
        with self._cond:
            self._res[kind].actions.append(how)
            self._cond.notify_all()

    def open_watches(self, kind: str) -> int:
        with self._cond:
            return self._open.get(kind, 0)

    def watch_requests(self, kind: str) -> list[str]:
        """The resourceVersion of every watch request for ``kind``, in order."""
        return [r.query.get("resourceVersion", "") for r in list(self.requests)
                if r.resource == kind and r.watch]

    def list_requests(self, kind: str) -> list[Request]:
        return [r for r in list(self.requests) if r.resource == kind and not r.watch]

    def wait(self, predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.01)
        return predicate()

    # -- serving (called from the handler threads) ------------------------------------------------
    def _pending_workloads(self, version: str, name: str, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Kueue's pendingworkloads subresource (pkg/visibility/storage/pending_workloads_cq.go)."""
        with self._cond:
            status, summary = self.visibility_status, copy.deepcopy(self.visibility.get(name))
        if status == 403:
            return 403, _status(403, "Forbidden", f'clusterqueues.visibility.kueue.x-k8s.io "{name}" is forbidden: '
                                "User \"system:serviceaccount:gpuq:gpuq\" cannot get resource "
                                '"clusterqueues/pendingworkloads" in API group "visibility.kueue.x-k8s.io" at the '
                                "cluster scope")
        if status is not None:
            return status, _status(status, "InternalError", "an error on the server has prevented the request")
        if summary is None:
            body = _status(404, "NotFound", f'clusterqueue.visibility.kueue.x-k8s.io "{name}" not found')
            body["details"] = {"name": name, "group": "visibility.kueue.x-k8s.io", "kind": "clusterqueue"}
            return 404, body
        offset, limit = int(query.get("offset") or 0), int(query.get("limit") or 1000)
        summary["items"] = (summary.get("items") or [])[offset:offset + limit]
        summary["apiVersion"] = f"visibility.kueue.x-k8s.io/{version}"
        return 200, summary

    def _list(self, kind: str, ns: str | None, query: dict[str, str]) -> tuple[int, dict[str, Any]]:
        token = query.get("continue")
        limit = int(query.get("limit") or 0)
        with self._cond:
            if token:
                rv_s, _, start_s = base64.urlsafe_b64decode(token.encode()).decode().partition("/")
                rv, start = int(rv_s), int(start_s)
                snap = self._snapshots.get(rv, {}).get((kind, ns or ""))
                if snap is None:
                    return 410, _status(410, "Expired", "The provided continue parameter is too old")
            else:
                rv, start = self._rv, 0
                name = _selected_name(query)
                snap = sorted((o for k, o in self._res[kind].objects.items()
                               if (ns is None or k.startswith(f"{ns}/"))
                               and (name is None or o["metadata"]["name"] == name)), key=_key)
                self._snapshots.setdefault(rv, {})[(kind, ns or "")] = snap
        end = start + limit if limit else len(snap)
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if end < len(snap):
            meta["continue"] = base64.urlsafe_b64encode(f"{rv}/{end}".encode()).decode()
            meta["remainingItemCount"] = len(snap) - end
        return 200, {"kind": f"{KINDS[kind]}List", "apiVersion": API_VERSIONS[kind], "metadata": meta,
                     "items": snap[start:end]}

    def _watch_plan(self, kind: str, rv: int) -> tuple[str, int | None, int]:
        """(plan, drop-after, first action index) for a new watch from ``rv``."""
        with self._cond:
            res = self._res[kind]
            seen = len(res.actions)
            if rv in res.expire:
                return ("expire-http" if res.expire.pop(rv) else "expire"), None, seen
            if rv < res.compacted:
                return "expire", None, seen
            self._open[kind] = self._open.get(kind, 0) + 1
            return "ok", (res.drops.pop(0) if res.drops else None), seen

    def _watch_closed(self, kind: str) -> None:
        with self._cond:
            self._open[kind] -= 1

    def _next_events(self, kind: str, ns: str | None, after: int, deadline: float,
                     bookmarks: bool, seen: int, name: str | None = None) -> list[_Event] | str | None:
        """New events, an action ("end", "drop", "expire") or None at the deadline."""
        with self._cond:
            while True:
                res = self._res[kind]
                got = [e for e in res.history if e.rv > after
                       and (bookmarks or e.type != "BOOKMARK")
                       and (ns is None or e.type == "BOOKMARK"
                            or e.obj["metadata"].get("namespace") == ns)
                       and (name is None or e.type == "BOOKMARK" or e.obj["metadata"].get("name") == name)]
                if len(res.actions) > seen:
                    return res.actions[seen]
                if got or self._closing:
                    return got
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.2))


def _handler(server: ReplayServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:   # quiet
            pass

        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            segs = parts.path.strip("/").split("/")
            kind, ns = "", None
            if segs[:2] == ["api", "v1"] and len(segs) == 3 and segs[2] in KINDS:
                kind = segs[2]
            elif segs[:3] == ["api", "v1", "namespaces"] and len(segs) == 5 and segs[4] in ("pods", "configmaps"):
                kind, ns = segs[4], segs[3]
            elif (segs[:2] == ["apis", "ray.io"] and segs[2:3] == ["v1"]) or (
                    segs[:2] == ["apis", "kueue.x-k8s.io"] and segs[2:3] and segs[2] in server.kueue_versions):
                mine = ("rayclusters", "rayjobs") if segs[1] == "ray.io" else tuple(KUEUE)
                if len(segs) == 4 and segs[3] in mine:
                    kind = segs[3]
                elif len(segs) == 6 and segs[3] == "namespaces" and segs[5] in mine:
                    kind, ns = segs[5], segs[4]
            req = Request("GET", parts.path, query, kind, ns)
            server.requests.append(req)
            if (len(segs) == 6 and segs[:2] == ["apis", "visibility.kueue.x-k8s.io"]
                    and segs[2] in server.visibility_versions and (segs[3], segs[5]) == ("clusterqueues",
                                                                                        "pendingworkloads")):
                self._json(*server._pending_workloads(segs[2], segs[4], query))
            elif not kind or kind in server.absent:
                self._json(404, _status(404, "NotFound", f"the server could not find {parts.path}"))
            elif req.watch:
                self._watch(kind, ns, query)
            else:
                self._json(*server._list(kind, ns, query))

        def _json(self, code: int, body: dict[str, Any]) -> None:
            data = json.dumps(body, separators=(",", ":")).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _watch(self, kind: str, ns: str | None, query: dict[str, str]) -> None:
            rv = int(query.get("resourceVersion") or 0)
            plan, drop_after, seen = server._watch_plan(kind, rv)
            if plan == "expire-http":
                self._json(410, _status(410, "Expired", f"too old resource version: {rv}"))
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Cache-Control", "no-cache, private")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            if plan == "expire":
                self._expired(rv)
                self._chunk(b"")
                return
            try:
                self._stream(kind, ns, query, rv, drop_after, seen)
            except OSError:
                self.close_connection = True          # the client went away
            finally:
                server._watch_closed(kind)

        def _expired(self, rv: int) -> None:
            err = _status(410, "Expired", f"too old resource version: {rv} ({server.resource_version})")
            self._chunk(json.dumps({"type": "ERROR", "object": err}).encode() + b"\n")

        def _stream(self, kind: str, ns: str | None, query: dict[str, str], rv: int,
                    drop_after: int | None, seen: int) -> None:
            timeout = float(query.get("timeoutSeconds") or server.max_watch_s)
            deadline = time.monotonic() + min(timeout, server.max_watch_s)
            bookmarks = query.get("allowWatchBookmarks") in ("true", "1")
            sent, after = 0, rv
            while drop_after is None or sent < drop_after:
                got = server._next_events(kind, ns, after, deadline, bookmarks, seen, _selected_name(query))
                if got == "drop":
                    break
                if got == "expire":
                    self._expired(after)
                if not got or isinstance(got, str):
                    self._chunk(b"")                  # the terminating chunk
                    return
                for e in got[: None if drop_after is None else drop_after - sent]:
                    self._chunk(json.dumps({"type": e.type, "object": e.obj}).encode() + b"\n")
                    sent += 1
                    after = e.rv
            self._drop()                              # close without the terminating chunk

        def _drop(self) -> None:
            self.close_connection = True
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    return Handler
