"""The queue file's cross-field rules (YuniKorn's), the ``gpu_types:`` and ``mapping:`` sections,
and finding the line of a YAML path for error messages.

Quota rules, checked in pre-order (a parent before its children), first failure raised:

1. ``guaranteed <= max`` per resource, and a typed guarantee ``gpu/T`` within ``max.gpu``;
   a typed guarantee within ``guaranteed.gpu`` when both are given;
2. a queue's ``max`` and ``guaranteed`` are within the ``max`` of the nearest ancestor that
   limits that resource;
3. the children's guarantees fit in the parent's ``guaranteed`` (or, where the parent guarantees
   nothing for that resource, in its ``max``).
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from accounting.errors import QueueConfigError
import re
from dataclasses import replace
from decimal import ROUND_FLOOR, Decimal

from accounting.queues import ROOT, Amount, GpuType, Queue, QueueConfig, QueueMapping, _unknown_keys, thousandths
from gpuq.errors import shown

_TYPE_KEYS = frozenset({"price_per_hour", "node_labels", "equivalent"})
# a MIG type's name: <TYPE>-mig-<profile> (accounting.queues, "GPU types")
_MIG_TYPE = re.compile(r"^(.+)-(?:mig|MIG)-(\d+g\.\d+gb(?:[+-][a-z][a-z.]*)*)$")
_MAPPING_KEYS = frozenset({"labels", "annotations", "namespaces", "default", "local_queues"})


def _show(resource: str, amount: Amount) -> str:
    if resource == "cpu":
        return f"cpu {amount / 1000:g}" if amount % 1000 == 0 else f"cpu {amount}m"
    return f"{resource} {amount}"


def _preorder(config: QueueConfig) -> Iterator[Queue]:
    stack = [ROOT]
    while stack:
        q = config.queues[stack.pop()]
        yield q
        stack.extend(reversed(q.children))


def _limit(config: QueueConfig, path: str, resource: str) -> tuple[str, Amount] | None:
    """The nearest ancestor (root excluded) whose max limits ``resource``, with that max."""
    for anc in config.ancestors(path):
        if anc != ROOT and resource in config.queues[anc].max:
            return anc, config.queues[anc].max[resource]
    return None


def _check_own(q: Queue, where: str) -> None:
    g, m = q.guaranteed, q.max
    for res, amount in g.items():
        if res in m and amount > m[res]:
            raise QueueConfigError(f"{where}.max", f"{_show(res, m[res])} is below guaranteed {amount}")
    for res, amount in g.items():
        if res.startswith("gpu/"):
            if "gpu" in m and amount > m["gpu"]:
                raise QueueConfigError(f"{where}.max", f"gpu {m['gpu']} is below guaranteed {res} {amount}")
            if "gpu" in g and amount > g["gpu"]:
                raise QueueConfigError(f"{where}.guaranteed", f"{res} {amount} is above gpu {g['gpu']}")


def _check_ancestors(config: QueueConfig, q: Queue, where: str) -> None:
    for section, amounts in (("max", q.max), ("guaranteed", q.guaranteed)):
        for res, amount in amounts.items():
            lim = _limit(config, q.path, res)
            if lim is not None and amount > lim[1]:
                raise QueueConfigError(f"{where}.{section}",
                                       f"{_show(res, amount)} is above the max {lim[1]} of {lim[0]}")


def guarantee_cap(q: Queue, res: str) -> tuple[str, Amount] | None:
    """What bounds the guarantees of ``q``'s children for ``res``: its own guarantee, else its max
    (``(section, amount)``), or None when neither names ``res``."""
    if res in q.guaranteed:
        return "guaranteed", q.guaranteed[res]
    if res in q.max:
        return "max", q.max[res]
    return None


def _check_children(config: QueueConfig, q: Queue, source: str) -> None:
    kids = [config.queues[c] for c in q.children]
    resources = sorted({r for k in kids for r in k.guaranteed})
    for res in resources:
        parts = [(k.name, k.guaranteed[res]) for k in kids if k.guaranteed.get(res, 0) > 0]
        total = sum(a for _, a in parts)
        detail = ", ".join(f"{n} {a}" for n, a in sorted(parts))
        bound = guarantee_cap(q, res)
        if bound is None:
            continue
        section, cap = bound
        if total > cap:
            raise QueueConfigError(f"{source}.{q.path}.{section}",
                                   f"{_show(res, cap)} is below the children's guaranteed total {total} ({detail})")


def check_quotas(config: QueueConfig, source: str = "queues") -> None:
    for q in _preorder(config):
        where = f"{source}.{q.path}"
        if q.path != ROOT:
            _check_own(q, where)
            _check_ancestors(config, q, where)
            _check_children(config, q, source)


def parse_gpu_types(raw: Any) -> Mapping[str, GpuType]:
    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, Mapping):
        raise QueueConfigError("gpu_types", f"expected a mapping of type to settings, got {type(raw).__name__}")
    out: dict[str, GpuType] = {}
    owner: dict[str, str] = {}
    for name, spec in raw.items():
        where = f"gpu_types.{name}"
        mig = _MIG_TYPE.match(name) if isinstance(name, str) else None
        if not isinstance(name, str) or not name or any(c in name for c in "/ ") or ("." in name and not mig):
            raise QueueConfigError(where, "invalid gpu type name (no '/', '.' or spaces; a '.' only in a MIG "
                                          "type's profile, <TYPE>-mig-<profile>)")
        spec = {} if spec is None else spec
        if not isinstance(spec, Mapping):
            raise QueueConfigError(where, f"expected a mapping, got {type(spec).__name__}")
        _unknown_keys(spec, _TYPE_KEYS, where)
        price = spec.get("price_per_hour", 0.0)
        if isinstance(price, bool) or not isinstance(price, (int, float)):
            raise QueueConfigError(f"{where}.price_per_hour", f"expected a number, got {shown(price)}")
        if price < 0:
            raise QueueConfigError(f"{where}.price_per_hour", f"must not be negative, got {price}")
        labels = spec.get("node_labels") or []
        if not isinstance(labels, list) or not all(isinstance(v, str) and v for v in labels):
            raise QueueConfigError(f"{where}.node_labels", f"expected a list of label values, got {shown(labels)}")
        for value in [name, *labels]:
            if value in owner and owner[value] != name:
                raise QueueConfigError(f"{where}.node_labels", f"{shown(value)} already means {owner[value]}")
            owner[value] = name
        eq = thousandths(spec["equivalent"], f"{where}.equivalent", positive=True) if "equivalent" in spec else None
        out[name] = GpuType(name=name, price_per_hour=float(price), node_labels=tuple(labels),
                            equivalent=Decimal(eq) if eq is not None else Decimal(1),
                            mig_of=mig.group(1) if mig else "", mig_profile=mig.group(2) if mig else "")
        if mig and "equivalent" not in spec:
            out[name] = replace(out[name], equivalent=Decimal(-1))      # filled below, once its GPU is known
    for name, t in out.items():
        if t.mig_of:
            out[name] = _mig_type(t, out, f"gpu_types.{name}")
    return MappingProxyType(out)


def _mig_type(t: GpuType, types: Mapping[str, GpuType], where: str) -> GpuType:
    """A MIG type checked against the type it slices, its default ``equivalent`` filled: the
    profile's fraction of that GPU times the GPU's equivalent, rounded down to thousandths."""
    from gpuq.gpu_share import mig_fraction

    base = types.get(t.mig_of)
    if base is None or base.mig_of:
        known = ", ".join(sorted(n for n, b in types.items() if not b.mig_of)) or "none"
        raise QueueConfigError(where, f"a MIG type names the GPU type it slices (<TYPE>-mig-<profile>), and "
                                      f"{shown(t.mig_of)} is not declared (declared: {known})")
    product = base.node_labels[0] if base.node_labels else base.name
    try:
        fraction = mig_fraction(product, t.mig_profile)
    except ValueError as exc:
        raise QueueConfigError(where, str(exc)) from None
    if t.equivalent >= 0:
        return t
    worth = (Decimal(fraction.numerator) / fraction.denominator * base.equivalent).quantize(
        Decimal("0.001"), rounding=ROUND_FLOOR)
    return replace(t, equivalent=max(worth, Decimal("0.001")))


def _leaf(value: Any, where: str, queues: Mapping[str, Queue]) -> str:
    if not isinstance(value, str) or value not in queues or value == ROOT:
        from accounting.queue_names import nearest

        leaves = [p for p, q in queues.items() if q.is_leaf and p != ROOT]
        hint = f"; {nearest(value, leaves)}" if isinstance(value, str) else ""
        raise QueueConfigError(where, f"unknown queue {shown(value)}{hint}")
    if not queues[value].is_leaf:
        raise QueueConfigError(where, f"queue {shown(value)} is not a leaf (only leaf queues take pods)")
    return value


def _strings(spec: Mapping[str, Any], key: str, default: tuple[str, ...]) -> tuple[str, ...]:
    if key not in spec:
        return default
    value = spec[key] or []
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise QueueConfigError(f"mapping.{key}", f"expected a list of names, got {shown(value)}")
    return tuple(value)


def parse_mapping(raw: Any, queues: Mapping[str, Queue]) -> QueueMapping:
    if raw is None:
        return QueueMapping()
    if not isinstance(raw, Mapping):
        raise QueueConfigError("mapping", f"expected a mapping, got {type(raw).__name__}")
    _unknown_keys(raw, _MAPPING_KEYS, "mapping")
    base = QueueMapping()
    namespaces = raw.get("namespaces") or {}
    if not isinstance(namespaces, Mapping):
        raise QueueConfigError("mapping.namespaces", f"expected a mapping of namespace to queue, got {shown(namespaces)}")
    ns = {str(k): _leaf(v, f"mapping.namespaces.{k}", queues) for k, v in namespaces.items()}
    default = raw.get("default")
    return QueueMapping(
        labels=_strings(raw, "labels", base.labels),
        annotations=_strings(raw, "annotations", base.annotations),
        namespaces=MappingProxyType(ns),
        default=None if default is None else _leaf(default, "mapping.default", queues),
        local_queues=_local_queues(raw.get("local_queues"), queues),
    )


def _local_queues(raw: Any, queues: Mapping[str, Queue]) -> Mapping[str, Mapping[str, str]]:
    """``mapping.local_queues``: namespace -> LocalQueue name -> leaf queue (accounting.queues, "Local
    queues"); whether the namespace may use the queue is checked with the other access rules."""
    from accounting.access import NAMESPACE

    if raw is None:
        return MappingProxyType({})
    if not isinstance(raw, Mapping):
        raise QueueConfigError("mapping.local_queues", "expected a mapping of namespace to {LocalQueue name: "
                               f"queue}}, got {shown(raw)}")
    out: dict[str, Mapping[str, str]] = {}
    for namespace, names in raw.items():
        where = f"mapping.local_queues.{namespace}"
        if not isinstance(namespace, str) or not NAMESPACE.match(namespace):
            raise QueueConfigError(where, f"{shown(namespace)} is not a Kubernetes namespace name (DNS-1123 label)")
        if not isinstance(names, Mapping):
            raise QueueConfigError(where, f"expected a mapping of LocalQueue name to queue, got {shown(names)}")
        local: dict[str, str] = {}
        for name, target in names.items():
            if not isinstance(name, str) or not name:
                raise QueueConfigError(where, f"expected a LocalQueue name, got {shown(name)}")
            local[name] = _leaf(target, f"{where}.{name}", queues)
        out[namespace] = MappingProxyType(local)
    return MappingProxyType(out)


def line_of(text: str, where: str) -> int | None:
    """The 1-based line of the YAML node that ``where`` names (the nearest one found).

    Queue paths skip the nested ``queues:`` keys (``queues.research.vision`` is
    ``queues -> research -> queues -> vision`` in the file); this walk follows them.
    """
    import yaml

    try:
        node = yaml.compose(text)
    except yaml.YAMLError:
        return None
    if node is None:
        return None
    line = None
    for part in where.split("."):
        if not isinstance(node, yaml.MappingNode):
            break
        found = _child(node, part)
        if found is None:
            nested = _child(node, "queues")
            found = _child(nested[1], part) if nested is not None and isinstance(nested[1], yaml.MappingNode) else None
        if found is None:
            break
        line = found[0].start_mark.line + 1
        node = found[1]
    return line


def _child(node: Any, key: str) -> tuple[Any, Any] | None:
    for k, v in node.value:
        if getattr(k, "value", None) == key:
            return k, v
    return None
