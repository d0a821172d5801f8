"""A local Kubernetes API server for the actuator tests, in the API's wire format.

Serves what the ``kubernetes`` actuator and the workload source call:

* ``GET`` / ``PATCH /apis/ray.io/v1/namespaces/<ns>/<rayjobs|rayclusters>/<name>``: PATCH takes
  ``application/merge-patch+json`` only (as for any custom resource: 415 otherwise), applies it
  as RFC 7386 (``null`` deletes, lists replace), honours ``metadata.resourceVersion`` in the patch
  as a precondition (409 Conflict when it moved, as the API server does), then bumps the
  resourceVersion (and ``generation`` when ``spec`` changed);
* ``GET /apis/ray.io/v1[/namespaces/<ns>]/<plural>``: ``RayJobList``/``RayClusterList``, paged
  with ``limit``/``continue``;
* ``POST /api/v1/namespaces/<ns>/pods/<name>/eviction``: a ``policy/v1`` Eviction deletes the pod
  (201 Success Status), 404 when there is no such pod, 429 TooManyRequests with the
  ``DisruptionBudget`` cause while :meth:`ApiServer.block_eviction` holds;
* ``GET /apis/scheduling.k8s.io/v1/priorityclasses/<name>``;
* ``GET`` / ``POST`` / ``PUT /apis/coordination.k8s.io/v1/namespaces/<ns>/leases[/<name>]``: the
  Lease of leader election: create (409 AlreadyExists when taken), get (404), replace with the
  optimistic lock the API server applies (``metadata.resourceVersion`` must be the stored one:
  409 Conflict otherwise; an update without one is refused 422 as for any update of an object
  the client read); :meth:`ApiServer.lease` reads one;
* ``POST /api/v1/namespaces/<ns>/events``: a ``v1`` Event is stored (201, the Event with a uid,
  resourceVersion and creationTimestamp); 409 AlreadyExists for a name taken, 422 Invalid for a
  name that is not a DNS subdomain or a namespace that differs from the URL's or from
  ``involvedObject.namespace`` (the API server's legacy Event validation); :meth:`ApiServer.events`
  lists them in creation order.

Scripting: :meth:`ApiServer.hang` leaves matching requests unanswered until :meth:`ApiServer.release`;
:meth:`ApiServer.fail` answers the next ``times`` matching requests with a Status
error; :meth:`ApiServer.after_next_get` changes an object right after the next GET of it is
answered (a concurrent writer, so a strict patch meets a 409). :attr:`ApiServer.requests`
records every request: method, path, query, content type and parsed body; :attr:`ApiServer.patches`
every PATCH applied (object before, patch, object after), which tests/test_k8s_merge_patch.py checks
against an independent RFC 7386 implementation (``json-merge-patch`` from PyPI).
"""
from __future__ import annotations

import base64
import copy
import json
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self
from urllib.parse import parse_qs, urlsplit

from tests.k8s_replay import _status

DATA = Path(__file__).parent / "data" / "k8s_actuator"
PLURALS = {"RayJob": "rayjobs", "RayCluster": "rayclusters"}
KINDS = {v: k for k, v in PLURALS.items()}
MERGE_PATCH = "application/merge-patch+json"


def load(name: str) -> dict[str, Any]:
    return json.loads((DATA / name).read_text())  # type: ignore[no-any-return]


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


@dataclass(frozen=True, slots=True)
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    content_type: str
    body: Any                      # parsed JSON, or the raw text, or None


@dataclass(frozen=True, slots=True)
class Patched:
    """One PATCH the server applied: the object before, the merge patch, the object after."""
    key: tuple[str, str, str]      # (plural, namespace, name)
    before: dict[str, Any]
    patch: dict[str, Any]
    after: dict[str, Any]


@dataclass(slots=True)
class _Fault:
    method: str
    path: str
    status: int
    reason: str
    message: str
    times: int
    details: dict[str, Any] | None = None


@dataclass(slots=True)
class _State:
    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)  # (plural, ns, name)
    pods: set[tuple[str, str]] = field(default_factory=set)
    blocked: dict[tuple[str, str], str] = field(default_factory=dict)                # pod -> PDB name
    priority_classes: dict[str, int] = field(default_factory=dict)
    faults: list[_Fault] = field(default_factory=list)
    after_get: dict[str, Callable[[dict[str, Any]], None]] = field(default_factory=dict)
    events: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)      # (ns, name)
    leases: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)      # (ns, name)


class ApiServer:
    def __init__(self, objects: Iterable[Mapping[str, Any]] = (), *, pods: Iterable[tuple[str, str]] = (),
                 priority_classes: Mapping[str, int] | None = None, resource_version: int = 50000) -> None:
        self._lock = threading.Lock()
        self._rv = resource_version
        self._state = _State(pods=set(pods), priority_classes=dict(priority_classes or {}))
        for obj in objects:
            self.put(obj)
        self.requests: list[Recorded] = []
        self._hung: set[tuple[str, str]] = set()            # (method, path) that get no answer
        self._released = threading.Event()
        self.patches: list[Patched] = []      # every PATCH applied, for an independent RFC 7386 check
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.05,), daemon=True)

    # -- lifecycle --------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> Self:
        self._thread.start()
        return self

    def close(self) -> None:
        self.release()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def kubeconfig(self, path: Path) -> Path:
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "test",
               "clusters": [{"name": "test", "cluster": {"server": self.url}}],
               "users": [{"name": "anonymous", "user": {}}],
               "contexts": [{"name": "test", "context": {"cluster": "test", "user": "anonymous"}}]}
        path.write_text(json.dumps(cfg))
        return path

    # -- state and scripting ----------------------------------------------------------------------
    def put(self, given: Mapping[str, Any]) -> None:
        obj = copy.deepcopy(dict(given))
        meta = obj["metadata"]
        with self._lock:
            self._rv = max(self._rv, int(meta.get("resourceVersion") or 0))
            self._state.objects[(PLURALS[obj["kind"]], meta["namespace"], meta["name"])] = obj

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self._state.objects.get((PLURALS[kind], namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self._state.leases.get((namespace, name))
            return copy.deepcopy(obj) if obj is not None else None

    def has_pod(self, namespace: str, name: str) -> bool:
        with self._lock:
            return (namespace, name) in self._state.pods

    def events(self, namespace: str | None = None) -> list[dict[str, Any]]:
        """The Events created, oldest first."""
        with self._lock:
            return [copy.deepcopy(e) for (ns, _), e in self._state.events.items()
                    if namespace is None or ns == namespace]

    def fail(self, method: str, path: str, status: int, message: str, *, reason: str = "", times: int = 1,
             details: dict[str, Any] | None = None) -> None:
        with self._lock:
            reason = reason or _REASONS.get(status, "InternalError")
            self._state.faults.append(_Fault(method, path, status, reason, message, times, details))

    def hang(self, method: str, path: str) -> None:
        """Requests ``method path`` get no answer until :meth:`release` (a hung API server: the
        client's request timeout is what ends them)."""
        with self._lock:
            self._hung.add((method, path))
            self._released.clear()

    def release(self) -> None:
        """Answer the hung requests (and stop hanging)."""
        with self._lock:
            self._hung.clear()
            self._released.set()

    def _hangs(self, method: str, path: str) -> bool:
        with self._lock:
            return (method, path) in self._hung

    def block_eviction(self, namespace: str, name: str, pdb: str) -> None:
        with self._lock:
            self._state.blocked[(namespace, name)] = pdb

    def after_next_get(self, path: str, change: Callable[[dict[str, Any]], None]) -> None:
        with self._lock:
            self._state.after_get[path] = change

    def calls(self, method: str | None = None, path_suffix: str = "") -> list[Recorded]:
        return [r for r in list(self.requests)
                if (method is None or r.method == method) and r.path.endswith(path_suffix)]

    # -- serving ----------------------------------------------------------------------------------
    def _fault(self, method: str, path: str) -> tuple[int, dict[str, Any]] | None:
        with self._lock:
            for f in self._state.faults:
                if f.times > 0 and f.method == method and f.path == path:
                    f.times -= 1
                    body = _status(f.status, f.reason, f.message)
                    if f.details:
                        body["details"] = f.details
                    return f.status, body
        return None

    def _get_object(self, key: tuple[str, str, str], path: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            obj = self._state.objects.get(key)
            if obj is None:
                return 404, _not_found(key)
            answer = copy.deepcopy(obj)
            change = self._state.after_get.pop(path, None)
            if change is not None:
                change(obj)
                self._bump(obj, answer)
            return 200, answer

    def _bump(self, obj: dict[str, Any], before: Mapping[str, Any]) -> None:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if obj.get("spec") != before.get("spec"):
            obj["metadata"]["generation"] = int(obj["metadata"].get("generation") or 1) + 1

    def _patch_object(self, key: tuple[str, str, str], content_type: str,
                      body: Any) -> tuple[int, dict[str, Any]]:
        if content_type.split(";")[0].strip() != MERGE_PATCH:
            return 415, _status(415, "UnsupportedMediaType",
                                "the body of the request was in an unknown format - accepted media types "
                                f"include: application/json-patch+json, {MERGE_PATCH}, "
                                "application/apply-patch+yaml")
        if not isinstance(body, dict):
            return 400, _status(400, "BadRequest", "the body of the request is not a JSON object")
        with self._lock:
            obj = self._state.objects.get(key)
            if obj is None:
                return 404, _not_found(key)
            want = (body.get("metadata") or {}).get("resourceVersion")
            if want is not None and want != obj["metadata"]["resourceVersion"]:
                return 409, _status(409, "Conflict", f"Operation cannot be fulfilled on {key[0]}.ray.io "
                                    f"\"{key[2]}\": the object has been modified; please apply your changes "
                                    f"to the latest version and try again")
            patched = apply_merge_patch(obj, body)
            patched["metadata"]["resourceVersion"] = obj["metadata"]["resourceVersion"]
            self._bump(patched, obj)
            self._state.objects[key] = patched
            self.patches.append(Patched(key, copy.deepcopy(obj), copy.deepcopy(body), copy.deepcopy(patched)))
            return 200, copy.deepcopy(patched)

    def _list(self, plural: str, ns: str | None, query: Mapping[str, str]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            items = [copy.deepcopy(o) for (p, n, _), o in sorted(self._state.objects.items())
                     if p == plural and (ns is None or n == ns)]
            rv = str(self._rv)
        start = int(base64.urlsafe_b64decode(query["continue"]).decode()) if query.get("continue") else 0
        limit = int(query.get("limit") or 0) or len(items)
        meta: dict[str, Any] = {"resourceVersion": rv}
        if start + limit < len(items):
            meta["continue"] = base64.urlsafe_b64encode(str(start + limit).encode()).decode()
        for item in items:
            item.pop("apiVersion", None)
            item.pop("kind", None)
        return 200, {"apiVersion": "ray.io/v1", "kind": f"{KINDS[plural]}List", "metadata": meta,
                     "items": items[start:start + limit]}

    def _evict(self, ns: str, name: str, content_type: str, body: Any) -> tuple[int, dict[str, Any]]:
        if content_type and content_type.split(";")[0].strip() != "application/json":
            return 415, _status(415, "UnsupportedMediaType", "the body of the request was in an unknown "
                                "format - accepted media types include: application/json, application/yaml")
        kind = (body.get("apiVersion"), body.get("kind")) if isinstance(body, dict) else None
        if kind != ("policy/v1", "Eviction"):
            return 400, _status(400, "BadRequest", "expected a policy/v1 Eviction")
        if (body.get("metadata") or {}).get("name") != name:
            return 400, _status(400, "BadRequest", "name in URL does not match name in Eviction object")
        with self._lock:
            if (ns, name) not in self._state.pods:
                body = _status(404, "NotFound", f"pods \"{name}\" not found")
                body["details"] = {"name": name, "kind": "pods"}
                return 404, body
            pdb = self._state.blocked.get((ns, name))
            if pdb:
                body = _status(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's "
                                                       "disruption budget.")
                body["details"] = {"causes": [{"reason": "DisruptionBudget", "message": f"The disruption "
                                               f"budget {pdb} needs 1 healthy pods and has 1 currently"}]}
                return 429, body
            self._state.pods.discard((ns, name))
        return 201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201}

    def _create_event(self, ns: str, body: Any) -> tuple[int, dict[str, Any]]:
        if not isinstance(body, dict) or (body.get("apiVersion"), body.get("kind")) != ("v1", "Event"):
            return 400, _status(400, "BadRequest", "expected a v1 Event")
        meta = body.get("metadata") or {}
        name = str(meta.get("name") or "")
        involved = body.get("involvedObject") or {}
        problems = []
        if not _DNS_SUBDOMAIN.fullmatch(name) or len(name) > 253:
            problems.append(f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain")
        if meta.get("namespace", ns) != ns:
            problems.append("metadata.namespace: Invalid value: does not match the namespace of the request")
        if involved.get("namespace") != ns:
            problems.append("involvedObject.namespace: Invalid value: does not match event.namespace")
        if problems:
            return 422, _status(422, "Invalid", f"Event \"{name}\" is invalid: " + ", ".join(problems))
        with self._lock:
            if (ns, name) in self._state.events:
                body = _status(409, "AlreadyExists", f"events \"{name}\" already exists")
                body["details"] = {"name": name, "kind": "events"}
                return 409, body
            self._rv += 1
            stored = copy.deepcopy(body)
            stored["metadata"] = {**meta, "namespace": ns, "resourceVersion": str(self._rv),
                                  "uid": f"00000000-0000-4000-8000-{self._rv:012d}",
                                  "creationTimestamp": body.get("firstTimestamp") or "2025-03-04T12:00:00Z"}
            self._state.events[(ns, name)] = stored
        return 201, copy.deepcopy(stored)

    def _lease(self, method: str, ns: str, name: str | None, body: Any) -> tuple[int, dict[str, Any]]:
        gone = f'leases.coordination.k8s.io "{name}" not found'
        with self._lock:
            if method == "GET":
                obj = self._state.leases.get((ns, name or ""))
                return (200, copy.deepcopy(obj)) if obj is not None else (404, _status(404, "NotFound", gone))
            if not isinstance(body, dict) or body.get("kind", "Lease") != "Lease":   # no kind: the URL's
                return 400, _status(400, "BadRequest", "the body is not a coordination.k8s.io/v1 Lease")
            meta = body.setdefault("metadata", {})
            if method == "POST":
                name = str(meta.get("name") or "")
                if (ns, name) in self._state.leases:
                    return 409, _status(409, "AlreadyExists", f'leases.coordination.k8s.io "{name}" already exists')
                if not _DNS_SUBDOMAIN.fullmatch(name):
                    return 422, _status(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid')
                meta.update(namespace=ns, uid=f"lease-{self._rv + 1}", creationTimestamp="2026-01-01T00:00:00Z")
            else:                                                          # PUT: replace
                stored = self._state.leases.get((ns, name or ""))
                if stored is None:
                    return 404, _status(404, "NotFound", gone)
                if not meta.get("resourceVersion"):
                    return 422, _status(422, "Invalid", f'Lease.coordination.k8s.io "{name}" is invalid: '
                                        "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
                if meta["resourceVersion"] != stored["metadata"]["resourceVersion"]:
                    return 409, _status(409, "Conflict", f'Operation cannot be fulfilled on leases.coordination.k8s.io '
                                        f'"{name}": the object has been modified; please apply your changes to the '
                                        "latest version and try again")
                meta.update(namespace=ns, name=name, uid=stored["metadata"]["uid"],
                            creationTimestamp=stored["metadata"]["creationTimestamp"])
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            obj = {**copy.deepcopy(body), "apiVersion": "coordination.k8s.io/v1", "kind": "Lease"}
            self._state.leases[(ns, str(meta["name"]))] = obj
            return (201 if method == "POST" else 200), copy.deepcopy(obj)

    def _priority_class(self, name: str) -> tuple[int, dict[str, Any]]:
        with self._lock:
            value = self._state.priority_classes.get(name)
        if value is None:
            return 404, _status(404, "NotFound", f"priorityclasses.scheduling.k8s.io \"{name}\" not found")
        return 200, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                     "metadata": {"name": name}, "value": value, "preemptionPolicy": "PreemptLowerPriority"}

    def route(self, method: str, path: str, query: Mapping[str, str], content_type: str,
              body: Any) -> tuple[int, dict[str, Any]]:
        fault = self._fault(method, path)
        if fault is not None:
            return fault
        s = path.strip("/").split("/")
        if s[:3] == ["apis", "ray.io", "v1"]:
            if len(s) == 7 and s[3] == "namespaces" and s[5] in KINDS:
                key = (s[5], s[4], s[6])
                if method == "GET":
                    return self._get_object(key, path)
                if method == "PATCH":
                    return self._patch_object(key, content_type, body)
            if method == "GET" and len(s) == 6 and s[3] == "namespaces" and s[5] in KINDS:
                return self._list(s[5], s[4], query)
            if method == "GET" and len(s) == 4 and s[3] in KINDS:
                return self._list(s[3], None, query)
        if method == "POST" and len(s) == 7 and s[:3] == ["api", "v1", "namespaces"] \
                and (s[4], s[6]) == ("pods", "eviction"):
            return self._evict(s[3], s[5], content_type, body)
        if method == "POST" and len(s) == 5 and s[:3] == ["api", "v1", "namespaces"] and s[4] == "events":
            if content_type.split(";")[0].strip() != "application/json":
                return 415, _status(415, "UnsupportedMediaType", "the body of the request was in an unknown "
                                    "format - accepted media types include: application/json, application/yaml")
            return self._create_event(s[3], body)
        if s[:4] == ["apis", "coordination.k8s.io", "v1", "namespaces"] and len(s) in (6, 7) and s[5] == "leases":
            if (method, len(s)) in (("GET", 7), ("PUT", 7), ("POST", 6)):
                return self._lease(method, s[4], s[6] if len(s) == 7 else None, body)
        if method == "GET" and len(s) == 5 and s[:4] == ["apis", "scheduling.k8s.io", "v1",
                                                         "priorityclasses"]:
            return self._priority_class(s[4])
        return 404, _status(404, "NotFound",
                            f"the server could not find the requested resource ({method} {path})")


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 409: "Conflict", 422: "Invalid",
            429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable"}


def _not_found(key: tuple[str, str, str]) -> dict[str, Any]:
    body = _status(404, "NotFound", f"{key[0]}.ray.io \"{key[2]}\" not found")
    body["details"] = {"name": key[2], "group": "ray.io", "kind": key[0]}
    return body


def _handler(server: ApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _serve(self, method: str) -> None:
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            content_type = self.headers.get("Content-Type") or ""
            body: Any = None
            if raw:
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
            server.requests.append(Recorded(method, parts.path, query, content_type, body))
            if server._hangs(method, parts.path):
                server._released.wait(60)
            status, answer = server.route(method, parts.path, query, content_type, body)
            data = json.dumps(answer, separators=(",", ":")).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            self._serve("GET")

        def do_PATCH(self) -> None:
            self._serve("PATCH")

        def do_POST(self) -> None:
            self._serve("POST")

        def do_PUT(self) -> None:
            self._serve("PUT")

    return Handler
