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
import hashlib
import json
from pathlib import Path
from typing import Any

import yaml

DATA = Path(__file__).parent / "data"
UPSTREAM = DATA / "k8s" / "upstream"
DERIVED_DIRS = ("k8s_actuator",)


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


def apply_ops(doc: Any, ops: list[dict[str, Any]], where: str = "") -> Any:
    """RFC 6902 ``add`` / ``replace`` / ``remove`` (all this data needs)."""
    out = copy.deepcopy(doc)
    for i, op in enumerate(ops):
        at = f"{where}ops[{i}] {op.get('op')} {op.get('path')}"
        if not str(op.get("why") or "").strip():
            raise ValueError(f"{at}: no 'why'")
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


def derive(directory: str, name: str) -> Any:
    spec = derivations(directory)[name]
    base = upstream_document(spec["upstream"], spec.get("document", 0))
    return apply_ops(base, spec["ops"], f"{directory}/DERIVED.json: {name}: ")


def render(obj: Any) -> str:
    return json.dumps(obj, indent=2) + "\n"


def main() -> None:
    for directory in DERIVED_DIRS:
        for name in derivations(directory):
            (DATA / directory / name).write_text(render(derive(directory, name)))
            print(f"wrote tests/data/{directory}/{name}")


if __name__ == "__main__":
    main()
