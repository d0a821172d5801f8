"""YAML that cannot explode (issue 17): every file gpuq loads (settings, queue file, nodes file,
scenario, trace queues, collector sources) goes through :func:`safe_load`.

A document of nested aliases ("billion laughs") is small as text and huge once anything walks it:
a 484-byte queue file became 262,126 queues and 1.9 GiB. :func:`safe_load` composes the node graph
(aliases are shared nodes, nothing is copied yet), counts the nodes it would have with every alias
expanded, and refuses it when that passes ``max(MIN_NODES, NODES_PER_BYTE * len(text))`` (a plain
file has about one node per 5 to 20 bytes), before any object is built. The refusal is a
``yaml.MarkedYAMLError``, so every caller reports it like a syntax error, with the file and line.

A text of the plain shape (block mappings and lists of one-line values, no anchors, aliases or
tags: what a scenario's ``workloads:`` list is) is read by :mod:`gpuq.yamlfast` first, to the same
Python data about ten times faster (issue 18); anything else, a syntax error included, comes here.
"""
from __future__ import annotations

from typing import Any

import yaml

from gpuq import yamlfast

MIN_NODES = 100_000
NODES_PER_BYTE = 10


class ExpansionError(yaml.MarkedYAMLError):
    """The document's aliases expand it past the bound."""


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` (libyaml's parser where installed), refusing a document whose aliases
    expand it past the bound; the first document only, as ``safe_load``."""
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yamlfast.load(text, loader_cls)  # no aliases there: nothing to bound
    except yamlfast.Unusual:
        pass
    loader = loader_cls(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check(node, max(MIN_NODES, NODES_PER_BYTE * len(text)))
        return loader.construct_document(node)
    finally:
        loader.dispose()


def safe_load_all(text: str) -> list[tuple[int, Any]]:
    """Every document of a multi-document text (``---``), as ``(line, data)``: the 1-based line the
    document starts on, and its data (None for an empty one); each bounded as :func:`safe_load`
    bounds one. A syntax error is a ``yaml.MarkedYAMLError`` with its line, as there."""
    loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_cls(text)
    out: list[tuple[int, Any]] = []
    limit = max(MIN_NODES, NODES_PER_BYTE * len(text))
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:                     # pragma: no cover - check_node said there is one
                break
            _check(node, limit)
            out.append((node.start_mark.line + 1, loader.construct_document(node)))
    finally:
        loader.dispose()
    return out


def _check(root: yaml.Node, limit: int) -> None:
    sizes: dict[int, int] = {}
    busy: set[int] = set()

    def size(n: yaml.Node) -> int:
        key = id(n)
        if key in sizes:
            return sizes[key]
        if key in busy:
            raise ExpansionError(problem="an alias refers to a node that contains it", problem_mark=n.start_mark)
        busy.add(key)
        total = 1
        if isinstance(n, yaml.SequenceNode):
            for child in n.value:
                total += size(child)
                if total > limit:
                    break
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                total += size(k) + size(v)
                if total > limit:
                    break
        busy.discard(key)
        if total > limit:
            raise ExpansionError(problem=f"aliases expand this document past {limit:,} nodes (the bound for "
                                         f"its size): refused before loading it", problem_mark=n.start_mark)
        sizes[key] = total
        return total

    try:
        size(root)
    except RecursionError:
        raise ExpansionError(problem="nested too deep", problem_mark=root.start_mark) from None
