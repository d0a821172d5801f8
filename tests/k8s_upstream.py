"""Test objects derived from published upstream ones, every change written down with its reason.

``tests/data/k8s/upstream/`` holds verbatim copies of published Kubernetes/KubeRay objects (source
repository, path, commit and git blob hash in ``tests/data/k8s/upstream/UPSTREAM.json``).
``tests/data/<dir>/DERIVED.json`` says, for each data file there, which upstream document it starts
from and which JSON Patch (RFC 6902) operations turn it into the object the test serves, each
with a ``why`` (what the API server or an operator adds, or what a test needs). The data files are
written by ``python -m tests.k8s_upstream`` and checked against the derivation by
tests/test_k8s_data.py, so nothing in them is hand-written without a recorded reason.
"""
from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import json_merge_patch
import yaml

DATA = Path(__file__).parent / "data"
UPSTREAM = DATA / "k8s" / "upstream"
DERIVED_DIRS = ("k8s_actuator", "k8s")
_TIMESTAMP = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ")


def blob_sha(data: bytes) -> str:
    """The git blob hash of ``data`` (``git hash-object``), to match the upstream commit's tree."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def upstream_index() -> dict[str, dict[str, str]]:
    return json.loads((UPSTREAM / "UPSTREAM.json").read_text())  # type: ignore[no-any-return]


def upstream_document(name: str, document: int = 0) -> Any:
    return list(yaml.safe_load_all((UPSTREAM / name).read_text()))[document]


def _pointer(path: str) -> list[str]:
    if not path.startswith("/"):
        raise ValueError(f"{path!r}: a JSON pointer starts with '/'")
    return [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]


def _shift_times(node: Any, by: dt.timedelta) -> Any:
    """Every RFC 3339 UTC timestamp (``2022-11-14T23:10:15Z``) in ``node`` moved by ``by``."""
    if isinstance(node, dict):
        return {k: _shift_times(v, by) for k, v in node.items()}
    if isinstance(node, list):
        return [_shift_times(v, by) for v in node]
    if isinstance(node, str) and _TIMESTAMP.fullmatch(node):
        moved = dt.datetime.strptime(node, "%Y-%m-%dT%H:%M:%SZ") + by
        return moved.strftime("%Y-%m-%dT%H:%M:%SZ")
    return node


def apply_ops(doc: Any, ops: list[dict[str, Any]], where: str = "") -> Any:
    """RFC 6902 ``add`` / ``replace`` / ``remove`` (all this data needs), ``x-merge`` (an RFC 7386
    merge patch at ``path``, by ``json-merge-patch``) and ``x-shift-times``:
    every timestamp moved so that the one at ``path`` becomes ``value`` (a recording moved to the
    tests' day with its spacing kept)."""
    out = copy.deepcopy(doc)
    for i, op in enumerate(ops):
        at = f"{where}ops[{i}] {op.get('op')} {op.get('path')}"
        if not str(op.get("why") or "").strip():
            raise ValueError(f"{at}: no 'why'")
        if op["op"] == "x-merge":            # an RFC 7386 merge patch at ``path`` (labels, capacity)
            *parents, last = _pointer(op["path"])
            node = out
            for p in parents:
                node = node[int(p)] if isinstance(node, list) else node[p]
            node[last] = json_merge_patch.merge(copy.deepcopy(node.get(last) or {}), copy.deepcopy(op["value"]))
            continue
        if op["op"] == "x-shift-times":
            node = out
            for p in _pointer(op["path"]):
                node = node[int(p)] if isinstance(node, list) else node[p]
            fmt = "%Y-%m-%dT%H:%M:%SZ"
            out = _shift_times(out, dt.datetime.strptime(op["value"], fmt) - dt.datetime.strptime(node, fmt))
            continue
        *parents, last = _pointer(op["path"])
        node = out
        for p in parents:
            node = node[int(p)] if isinstance(node, list) else node[p]
        kind = op["op"]
        if isinstance(node, list):
            index = len(node) if last == "-" else int(last)
            if kind == "add":
                node.insert(index, copy.deepcopy(op["value"]))
            elif kind == "replace":
                node[index] = copy.deepcopy(op["value"])
            elif kind == "remove":
                del node[index]
            else:
                raise ValueError(f"{at}: unknown op")
        else:
            if kind in ("replace", "remove") and last not in node:
                raise ValueError(f"{at}: no such member to {kind}")
            if kind == "add" and last in node:
                raise ValueError(f"{at}: already there; say 'replace'")
            if kind == "remove":
                del node[last]
            elif kind in ("add", "replace"):
                node[last] = copy.deepcopy(op["value"])
            else:
                raise ValueError(f"{at}: unknown op")
    return out


def derivations(directory: str) -> dict[str, dict[str, Any]]:
    return json.loads((DATA / directory / "DERIVED.json").read_text())  # type: ignore[no-any-return]


def _derive_one(spec: dict[str, Any], where: str, done: dict[str, list[Any]]) -> Any:
    """One object: ``upstream`` (+ ``document``, a ``pointer`` into it, put at ``into``), or ``like``
    an object derived before in the same file (``"pods/1"``); then its ``ops``."""
    if "like" in spec:
        other, _, ref = spec["like"].rpartition("#")
        group, index = ref.split("/")
        base = (derive(*other.split("/")) if other else done)[group][int(index)]
    else:
        base = upstream_document(spec["upstream"], spec.get("document", 0))
        for p in _pointer(spec["pointer"]) if spec.get("pointer") else ():
            base = base[int(p)] if isinstance(base, list) else base[p]
        if spec.get("into"):
            base = {_pointer(spec["into"])[0]: base}
    return apply_ops(base, spec["ops"], where)


def derive(directory: str, name: str) -> Any:
    """A single object; (``compose``) a JSON object of named lists of objects after the fields of
    ``frame`` (a ``PodList``); or (``events``) a list of watch events ``{"type", "object"}``.
    ``like`` may name an object of another file: ``"k8s/nodes.json#items/0"``."""
    spec = derivations(directory)[name]
    where = f"{directory}/DERIVED.json: {name}: "
    if "events" in spec:                           # "like": "events/1" is an earlier event's object
        objects: dict[str, list[Any]] = {"events": []}
        for i, e in enumerate(spec["events"]):
            objects["events"].append(_derive_one(e["object"], f"{where}events[{i}]: ", objects))
        return [{"type": e["type"], "object": o} for e, o in zip(spec["events"], objects["events"])]
    if "compose" not in spec:
        return _derive_one(spec, where, {})
    done: dict[str, Any] = copy.deepcopy(spec.get("frame") or {})
    for group, specs in spec["compose"].items():
        done[group] = []
        for i, one in enumerate(specs):
            done[group].append(_derive_one(one, f"{where}{group}[{i}]: ", done))
    return done


def render(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"


def main() -> None:
    for directory in DERIVED_DIRS:
        for name in derivations(directory):
            (DATA / directory / name).write_text(render(derive(directory, name)))
            print(f"wrote tests/data/{directory}/{name}")


if __name__ == "__main__":
    main()
