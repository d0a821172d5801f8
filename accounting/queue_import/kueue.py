"""Kueue's queue objects as a gpuq queue file (issue 20): :func:`from_kueue`.

Objects read (``kueue.x-k8s.io`` ``v1beta2``, ``v1beta1``, and ``v1alpha1`` Cohorts; any order):

* **ResourceFlavor**: its ``nodeLabels``' ``nvidia.com/gpu.product`` value is a GPU type (declared
  in ``gpu_types``, named after the flavor, with that value as its ``node_labels``); a flavor
  without node labels matches every node, so its GPUs are untyped (``gpu`` only); a flavor with
  other node labels is a type of its own name without ``node_labels`` (reported: gpuq types GPUs
  by product).
* **Cohort** (and each name a ClusterQueue's ``cohortName``/``cohort`` or a Cohort's
  ``parentName``/``parent`` gives): a parent queue, nested as the cohorts nest. Its guarantee and
  max are its total: its members' nominal quotas plus its own.
* **ClusterQueue**: a leaf below its cohort (top level without one). Per resource, summed over its
  flavors: ``guaranteed`` is the nominal quota, and ``gpu/<TYPE>`` the nominal quota of the flavors
  of that type; ``max`` is, per flavor, ``nominalQuota + borrowingLimit`` when set, else what its
  cohort can give it (the cohort's total less what the others may not lend:
  ``nominal - lendingLimit``), never more than that, and just the nominal quota without a cohort.
  A ClusterQueue whose flavors all have a type may use no other type: ``max.gpu/<other>`` is 0.
  ``fairSharing.weight`` is the ``weight``, ``queueingStrategy: StrictFIFO`` is ``strict_fifo``,
  ``preemption.reclaimWithinCohort: Never`` (Kueue's default) is a preemption fence on the queue,
  ``preemption.withinClusterQueue: LowerPriority`` is ``within_queue: lower_priority`` (issue 21;
  ``LowerOrNewerEqualPriority`` too, reported: gpuq takes only strictly lower priority).
* **LocalQueue**: ``mapping.local_queues.<namespace>.<name>`` is its ClusterQueue's queue (a pod of
  that namespace naming the LocalQueue is that queue's), and its namespace is one the queue allows
  (``namespaces``); a LocalQueue named ``default`` also takes the namespace's pods that name no
  queue (``mapping.namespaces``, Kueue's LocalQueue defaulting).

Resources carried: ``nvidia.com/gpu`` (``gpu``), ``cpu`` and ``memory``; every other resource, and
each field gpuq has no concept for, is a :class:`~accounting.queue_import.report.Finding`. The
top-level ``policy`` lets workloads have any priority (Kueue bounds no queue's priorities).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from accounting.errors import QueueImportError
from accounting.queue_import.report import (Finding, Imported, Names, cpu_text, decimal_text, gpus, memory_text, named,
                                            quantity, queue_at, shown_value)
from accounting.queues import PRIORITY_MAX
from gpuq.errors import shown

GROUP = "kueue.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1", "v1alpha1")
GPU_RESOURCE = "nvidia.com/gpu"
PRODUCT_LABEL = "nvidia.com/gpu.product"
CARRIED = {GPU_RESOURCE: "gpu", "cpu": "cpu", "memory": "memory"}
READ = ("ResourceFlavor", "Cohort", "ClusterQueue", "LocalQueue")
SILENT = ("Workload",)                      # read by the live mode, not queue configuration
DEFAULT_LOCAL_QUEUE = "default"             # Kueue's LocalQueue defaulting: it takes unlabelled jobs
OPEN_POLICY = {"max_priority": PRIORITY_MAX, "non_preemptible": False}

Quotas = dict[str, dict[str, Decimal]]      # flavor -> Kueue resource -> amount


@dataclass
class _Object:
    kind: str
    name: str
    where: str
    spec: Mapping[str, Any]
    raw: Mapping[str, Any]


@dataclass
class _Node:
    """A cohort or a ClusterQueue, with its quotas per flavor and resource."""

    kind: str
    name: str
    where: str
    parent: str = ""                                     # its cohort's name
    nominal: Quotas = field(default_factory=dict)
    borrowing: Quotas = field(default_factory=dict)
    lending: Quotas = field(default_factory=dict)
    flavors: list[str] = field(default_factory=list)     # in the queue's order
    covered: set[str] = field(default_factory=set)       # Kueue resources it has a quota for
    spec: Mapping[str, Any] = field(default_factory=dict)
    children: list[str] = field(default_factory=list)    # keys of _Node (kind:name)

    @property
    def key(self) -> str:
        return f"{self.kind}:{self.name}"


class _Import:
    def __init__(self, source: str) -> None:
        self.source = source
        self.findings: list[Finding] = []
        self.flavors: dict[str, _Object] = {}
        self.nodes: dict[str, _Node] = {}
        self.local_queues: list[_Object] = []
        self.types: dict[str, str] = {}                  # flavor -> gpu type ("" : untyped)
        self.type_labels: dict[str, list[str]] = {}

    def note(self, where: str, what: str, why: str, instead: str) -> None:
        self.findings.append(Finding(where, what, why, instead))

    # -- reading ------------------------------------------------------------------------------
    def objects(self, objects: Iterable[Any]) -> Iterator[_Object]:
        for i, obj in enumerate(objects, 1):
            if obj is None:
                continue
            origin = getattr(obj, "origin", "") or self.source
            place = origin or f"object {i}"
            if not isinstance(obj, Mapping):
                raise QueueImportError(place, "expected a Kubernetes object (a mapping with apiVersion and kind), "
                                       f"got {type(obj).__name__}")
            if obj.get("kind") == "List" and isinstance(obj.get("items"), list):
                for j, item in enumerate(obj["items"]):
                    yield from self.objects([_with_origin(item, f"{place}, items[{j}]")])
                continue
            kind, version = obj.get("kind"), obj.get("apiVersion")
            if not isinstance(kind, str) or not isinstance(version, str):
                raise QueueImportError(place, "expected a Kubernetes object with apiVersion and kind, "
                                       f"got the keys {shown(sorted(map(str, obj)))}")
            meta = obj.get("metadata") or {}
            name = meta.get("name") if isinstance(meta, Mapping) else None
            if not isinstance(name, str) or not name:
                raise QueueImportError(f"{kind} ({place})", "metadata.name: expected the object's name")
            where = named(kind, name, origin)
            group, _, ver = version.rpartition("/")
            if group != GROUP:
                self.note(where, f"{version} {kind}", "not a Kueue object", "ignored it")
                continue
            if kind in SILENT:
                continue
            if kind not in READ:
                self.note(where, f"Kueue {kind}", "gpuq has no such concept in its queue file", "ignored it")
                continue
            if ver not in VERSIONS:
                self.note(where, f"apiVersion {version}", f"gpuq knows {', '.join(VERSIONS)}",
                          "read it as v1beta2")
            spec = obj.get("spec") or {}
            if not isinstance(spec, Mapping):
                raise QueueImportError(where, f"spec: expected a mapping, got {type(spec).__name__}")
            yield _Object(kind, name, where, spec, obj)

    def read(self, objects: Iterable[Any]) -> None:
        seen: dict[tuple[str, str, str], str] = {}
        for o in self.objects(objects):
            ns = ""
            if o.kind == "LocalQueue":
                meta = o.raw.get("metadata") or {}
                ns = str(meta.get("namespace") or "")
            key = (o.kind, ns, o.name)
            if key in seen:
                raise QueueImportError(o.where, f"a second {o.kind} of that name (the first: {seen[key]})")
            seen[key] = o.where
            if o.kind == "ResourceFlavor":
                self.flavors[o.name] = o
            elif o.kind == "LocalQueue":
                self.local_queues.append(o)
            elif o.kind == "Cohort":
                self.cohort(o)
            else:
                self.cluster_queue(o)

    def _reference(self, o: _Object, keys: tuple[str, ...]) -> str:
        for k in keys:
            value = o.spec.get(k)
            if value is not None and value != "":
                if not isinstance(value, str):
                    raise QueueImportError(o.where, f"spec.{k}: expected a cohort's name, got {shown(value)}")
                return value
        return ""

    def cohort(self, o: _Object) -> None:
        node = self._node("Cohort", o.name, o.where)
        node.parent = self._reference(o, ("parentName", "parent"))
        node.spec = o.spec
        self._quotas(node, o)
        for k in sorted(set(o.spec) - {"parentName", "parent", "resourceGroups", "fairSharing"}):
            self.note(o.where, f"spec.{k}", "gpuq has no such setting on a parent queue", "ignored it")

    def _node(self, kind: str, name: str, where: str) -> _Node:
        node = self.nodes.get(f"{kind}:{name}")
        if node is None:
            node = self.nodes[f"{kind}:{name}"] = _Node(kind, name, where)
        elif where:
            node.where = where
        return node

    def cluster_queue(self, o: _Object) -> None:
        node = self._node("ClusterQueue", o.name, o.where)
        node.parent = self._reference(o, ("cohortName", "cohort"))
        node.spec = o.spec
        self._quotas(node, o)

    def _quotas(self, node: _Node, o: _Object) -> None:
        for at, group in _items(o, o.spec.get("resourceGroups"), "spec.resourceGroups"):
            if not isinstance(group, Mapping):
                raise QueueImportError(o.where, f"{at}: expected a mapping, got {type(group).__name__}")
            for fat, flavor in _named(o, group.get("flavors"), f"{at}.flavors", "flavor"):
                fname = flavor["name"]
                if fname not in node.flavors:
                    node.flavors.append(fname)
                for rat, res in _named(o, flavor.get("resources"), f"{fat}.resources", "resource"):
                    rname = res["name"]
                    node.covered.add(rname)
                    node.nominal.setdefault(fname, {})[rname] = quantity(res.get("nominalQuota", 0),
                                                                        f"{o.where}: {rat}.nominalQuota")
                    for key, into in (("borrowingLimit", node.borrowing), ("lendingLimit", node.lending)):
                        if res.get(key) is not None:
                            into.setdefault(fname, {})[rname] = quantity(res[key], f"{o.where}: {rat}.{key}")

    # -- building -------------------------------------------------------------------------------
    def tree(self) -> list[str]:
        """Link each node to its cohort (making the cohorts only named), refuse a cycle, and return
        the top-level keys in the source's order."""
        for node in list(self.nodes.values()):
            if node.parent:
                self._node("Cohort", node.parent, "")
        for node in self.nodes.values():
            if node.parent:
                self.nodes[f"Cohort:{node.parent}"].children.append(node.key)
        for node in self.nodes.values():
            if node.kind != "Cohort":
                continue
            seen, at = [node.name], node
            while at.parent:
                if at.parent in seen:
                    raise QueueImportError(node.where or named("Cohort", node.name, self.source),
                                           f"cohorts in a cycle: {' -> '.join([*seen, at.parent])}")
                seen.append(at.parent)
                at = self.nodes[f"Cohort:{at.parent}"]
        return [n.key for n in self.nodes.values() if not n.parent]

    def gpu_types(self) -> dict[str, Any]:
        """The GPU type of each flavor some queue gives GPUs in (module docstring)."""
        used = sorted({f for n in self.nodes.values() for f, res in n.nominal.items() if GPU_RESOURCE in res})
        out: dict[str, Any] = {}
        by_product: dict[str, str] = {}
        names = Names()
        for fname in used:
            flavor = self.flavors.get(fname)
            if flavor is None:
                self.note(named("ResourceFlavor", fname, self.source), "a flavor the queues name",
                          "it is not among the objects read", "took its GPUs as untyped (gpu only)")
                self.types[fname] = ""
                continue
            labels = flavor.spec.get("nodeLabels") or {}
            if not isinstance(labels, Mapping):
                raise QueueImportError(flavor.where, f"spec.nodeLabels: expected a mapping, got {shown(labels)}")
            for key in ("nodeTaints", "tolerations", "topologyName"):
                if flavor.spec.get(key):
                    self.note(flavor.where, f"spec.{key}", "gpuq places by GPU type and free GPUs only",
                              "ignored it")
            if not labels:
                self.types[fname] = ""              # every node: untyped GPUs
                continue
            product = labels.get(PRODUCT_LABEL)
            others = {k: v for k, v in labels.items() if k != PRODUCT_LABEL}
            if isinstance(product, str) and product in by_product:
                self.types[fname] = by_product[product]
                self.note(flavor.where, f"nodeLabels {PRODUCT_LABEL}={product}",
                          f"flavor {by_product[product]} selects the same product, and gpuq types GPUs by product",
                          f"counted its GPUs as type {by_product[product]}")
                continue
            tname = names.name(fname)
            self.types[fname] = tname
            if isinstance(product, str):
                by_product[product] = tname
                out[tname] = {"node_labels": [product]}
            else:
                out[tname] = {}
            if others:
                shown_labels = ", ".join(f"{k}={v}" for k, v in sorted(others.items()))
                self.note(flavor.where, f"nodeLabels {shown_labels}",
                          f"gpuq types a node's GPUs by its {PRODUCT_LABEL} label only",
                          f"declared GPU type {tname}" + (f" for {product}" if isinstance(product, str) else
                                                          " without node_labels: add the product to "
                                                          f"gpu_types.{tname}.node_labels for its quota to count"))
        return out

    def totals(self, key: str, memo: dict[str, tuple[Quotas, Quotas]]) -> tuple[Quotas, Quotas]:
        """``(total, lendable)`` of a node per flavor and resource: a ClusterQueue's nominal quota
        and what it may lend; a cohort's own quota plus its children's."""
        if key in memo:
            return memo[key]
        node = self.nodes[key]
        total = {f: dict(r) for f, r in node.nominal.items()}
        lendable = {f: dict(r) for f, r in node.nominal.items()}
        if node.kind == "ClusterQueue":
            for f, res in node.lending.items():
                for r, limit in res.items():
                    lendable.setdefault(f, {})[r] = min(limit, node.nominal.get(f, {}).get(r, Decimal(0)))
        for child in node.children:
            t, lend = self.totals(child, memo)
            _add(total, t)
            _add(lendable, lend)
        memo[key] = (total, lendable)
        return memo[key]


def _items(o: _Object, value: Any, at: str) -> Iterator[tuple[str, Any]]:
    """(``at[i]``, item) of a list in ``o`` at ``at`` (absent: none); an error naming the place
    when it is no list."""
    items = value or []
    if not isinstance(items, list):
        raise QueueImportError(o.where, f"{at}: expected a list, got {type(items).__name__}")
    for i, item in enumerate(items):
        yield f"{at}[{i}]", item


def _named(o: _Object, value: Any, at: str, what: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """:func:`_items` of a list whose items are mappings with a ``name`` (the ``what``'s)."""
    for place, item in _items(o, value, at):
        if not isinstance(item, Mapping) or not isinstance(item.get("name"), str):
            raise QueueImportError(o.where, f"{place}: expected a mapping with the {what}'s name")
        yield place, item


def _with_origin(obj: Any, origin: str) -> Any:
    from accounting.queue_import.report import Located

    return Located(obj, origin) if isinstance(obj, Mapping) else obj


def _add(into: Quotas, more: Quotas) -> None:
    for f, res in more.items():
        for r, amount in res.items():
            into.setdefault(f, {})[r] = into.setdefault(f, {}).get(r, Decimal(0)) + amount


def _sum(quotas: Quotas, resource: str, flavors: Iterable[str] | None = None) -> Decimal:
    return sum((res.get(resource, Decimal(0)) for f, res in quotas.items() if flavors is None or f in flavors),
               Decimal(0))


def from_kueue(objects: Iterable[Mapping[str, Any]], *, source: str = "") -> Imported:
    """The queue file of Kueue's objects (module docstring); QueueImportError on an object that
    cannot be read, naming it and the field."""
    imp = _Import(source)
    imp.read(objects)
    top = imp.tree()
    types = imp.gpu_types()
    memo: dict[str, tuple[Quotas, Quotas]] = {}
    origins: dict[str, str] = {}
    paths: dict[str, str] = {}                     # ClusterQueue name -> queue path

    def queue(key: str, prefix: str, names: Names) -> tuple[str, dict[str, Any]] | None:
        node = imp.nodes[key]
        where = node.where or named(node.kind, node.name, source)
        if node.kind == "Cohort" and not _has_queue(imp, key):
            imp.note(where, "a cohort without ClusterQueues", "a queue without children would be a leaf that "
                     "takes work", "left it out")
            return None
        name = names.name(node.name)
        if name != node.name:
            why = ("gpuq queue names are letters, digits, '_' and '-'" if _valid(node.name) is False else
                   "another queue below the same parent has that name")
            imp.note(where, f"the name {node.name}", why, f"named the queue {name}")
        path = f"{prefix}{name}"
        origins[path] = where if node.where else f"{where}, named by its members"
        spec = _cohort(imp, node, key, memo, types, where) if node.kind == "Cohort" else \
            _cluster_queue(imp, node, memo, types, where)
        if node.kind == "Cohort":
            kids: dict[str, Any] = {}
            child_names = Names()
            for child in node.children:
                got = queue(child, f"{path}.", child_names)
                if got is not None:
                    kids[got[0]] = got[1]
            spec["queues"] = kids
        else:
            paths[node.name] = path
        return name, spec

    queues: dict[str, Any] = {}
    top_names = Names()
    for key in top:
        got = queue(key, "", top_names)
        if got is not None:
            queues[got[0]] = got[1]
    data: dict[str, Any] = {}
    if types:
        data["gpu_types"] = types
    mapping = _local_queues(imp, paths, queues)
    if mapping:
        data["mapping"] = mapping
    data["policy"] = dict(OPEN_POLICY)
    data["queues"] = queues
    if not imp.nodes:
        imp.note(source or "the input", "no Cohort or ClusterQueue", "there is nothing to import",
                 "wrote a file without queues")
    return Imported(data=data, origins=origins, findings=tuple(imp.findings))


def _valid(name: str) -> bool:
    import re

    return re.match(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$", name) is not None


def _has_queue(imp: _Import, key: str) -> bool:
    node = imp.nodes[key]
    return node.kind == "ClusterQueue" or any(_has_queue(imp, c) for c in node.children)


def _resources(imp: _Import, node: _Node, nominal: Quotas, limit: Quotas, types: Mapping[str, Any],
               where: str, queue: bool) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(guaranteed, max)`` of the queue file from per-flavor quotas (module docstring); ``queue``:
    a ClusterQueue's (a cohort's sums are not reported again)."""
    guaranteed: dict[str, Any] = {}
    most: dict[str, Any] = {}
    gpu_flavors = [f for f in node.flavors if GPU_RESOURCE in nominal.get(f, {})]
    if GPU_RESOURCE in node.covered or queue:
        g, m = _sum(nominal, GPU_RESOURCE), _sum(limit, GPU_RESOURCE)
        for amount, what in ((g, "nominal quota"), (m, "max")):
            if queue and amount != amount.to_integral_value():
                imp.note(where, f"{GPU_RESOURCE} {what} {amount}", "gpuq counts whole GPUs", "rounded it down")
        guaranteed["gpu"], most["gpu"] = gpus(g), gpus(m)
        by_type: dict[str, list[str]] = {}
        for f in gpu_flavors:
            t = imp.types.get(f, "")
            if t:
                by_type.setdefault(t, []).append(f)
        for t, fl in sorted(by_type.items()):
            guaranteed[f"gpu/{t}"] = gpus(_sum(nominal, GPU_RESOURCE, fl))
            most[f"gpu/{t}"] = gpus(_sum(limit, GPU_RESOURCE, fl))
        if queue and gpu_flavors and all(imp.types.get(f) for f in gpu_flavors):
            for t in sorted(types):
                most.setdefault(f"gpu/{t}", 0)
    for res, key, text in (("cpu", "cpu", cpu_text), ("memory", "memory", memory_text)):
        if res in node.covered:
            guaranteed[key], most[key] = text(_sum(nominal, res)), text(_sum(limit, res))
            if queue and len([f for f in node.flavors if res in nominal.get(f, {})]) > 1:
                imp.note(where, f"{res} quotas in several flavors", "gpuq has one quota per resource, not per flavor",
                         f"summed them ({guaranteed[key]} guaranteed)")
    other = sorted(node.covered - set(CARRIED))
    if queue and other:
        imp.note(where, f"quotas of {', '.join(other)}", f"gpuq's queue file takes {GPU_RESOURCE}, cpu and memory only",
                 "left them out")
    return guaranteed, most


def _weight(imp: _Import, node: _Node, where: str) -> Decimal | None:
    fs = node.spec.get("fairSharing")
    if not isinstance(fs, Mapping) or fs.get("weight") is None:
        return None
    w = quantity(fs["weight"], f"{where}: spec.fairSharing.weight")
    if w == 0:              # Kueue's "always at a disadvantage": gpuq's no share beyond the guarantee
        return Decimal(0)
    if w * 1000 != (w * 1000).to_integral_value():
        w = w.quantize(Decimal("0.001"))
    return w


def _cohort(imp: _Import, node: _Node, key: str, memo: dict[str, tuple[Quotas, Quotas]],
            types: Mapping[str, Any], where: str) -> dict[str, Any]:
    total, _ = imp.totals(key, memo)
    node.covered = {r for res in total.values() for r in res}
    node.flavors = list(total)
    guaranteed, most = _resources(imp, node, total, total, types, where, queue=False)
    spec: dict[str, Any] = {"guaranteed": guaranteed, "max": most}
    weight = _weight(imp, node, where)
    if weight is not None:
        spec["weight"] = decimal_text(weight)
    if node.borrowing or node.lending:
        imp.note(where, "borrowingLimit/lendingLimit of a cohort", "gpuq has no limit on what a parent queue "
                 "borrows or lends", "its max is its total, as without them")
    if node.parent:
        imp.note(where, f"a cohort within cohort {node.parent}", "Kueue lets its members borrow from the whole "
                 "cohort tree; a gpuq queue's max stays within its parent's", "its members' max is within its total")
    return spec


def _cluster_queue(imp: _Import, node: _Node, memo: dict[str, tuple[Quotas, Quotas]],
                   types: Mapping[str, Any], where: str) -> dict[str, Any]:
    spec = node.spec
    limit: Quotas = {}
    if node.parent:
        parent_key = f"Cohort:{node.parent}"
        pool, _ = imp.totals(parent_key, memo)
        pool = {f: dict(r) for f, r in pool.items()}
        for sibling in imp.nodes[parent_key].children:
            if sibling == node.key:
                continue
            t, lend = imp.totals(sibling, memo)
            for f, res in t.items():
                for r, amount in res.items():
                    pool[f][r] -= amount - lend.get(f, {}).get(r, Decimal(0))
        for f, res in node.nominal.items():
            for r, amount in res.items():
                reach = pool.get(f, {}).get(r, amount)
                cap = node.borrowing.get(f, {}).get(r)
                limit.setdefault(f, {})[r] = reach if cap is None else min(amount + cap, reach)
    else:
        limit = {f: dict(r) for f, r in node.nominal.items()}
        if node.borrowing:
            imp.note(where, "borrowingLimit", "a ClusterQueue without a cohort has nobody to borrow from",
                     "its max is its nominal quota")
    if node.lending:
        imp.note(where, "lendingLimit", "gpuq has no lending limit: it lends a queue's idle guarantee and takes "
                 "it back by preemption", "the others' max counts only what it may lend, but together they may "
                 "borrow more of it than the limit")
    guaranteed, most = _resources(imp, node, node.nominal, limit, types, where, queue=True)
    out: dict[str, Any] = {"guaranteed": guaranteed, "max": most}
    weight = _weight(imp, node, where)
    if weight is not None:
        out["weight"] = decimal_text(weight)
    if spec.get("queueingStrategy") == "StrictFIFO":
        out["strict_fifo"] = True
    _preemption(imp, node, out, where)
    gpu_flavors = [f for f in node.flavors if GPU_RESOURCE in node.nominal.get(f, {})]
    if len(gpu_flavors) > 1:
        imp.note(where, f"the flavor order {', '.join(gpu_flavors)}", "gpuq places a workload on any GPU type "
                 "the queue's quotas allow, in no order of flavors", "kept each flavor's quota, not the order")
    if spec.get("flavorFungibility"):
        imp.note(where, f"flavorFungibility {shown_value(spec['flavorFungibility'])}", "gpuq has no flavor order "
                 "to try next or stop at", "ignored it")
    selector = spec.get("namespaceSelector")
    if isinstance(selector, Mapping) and (selector.get("matchLabels") or selector.get("matchExpressions")):
        imp.note(where, f"namespaceSelector {shown_value(selector)}", "gpuq does not read namespace labels",
                 "the queue allows the namespaces of its LocalQueues")
    for key in ("admissionChecks", "admissionChecksStrategy", "stopPolicy", "admissionScope",
                "concurrentAdmissionPolicy"):
        if spec.get(key) and not (key == "stopPolicy" and spec[key] == "None"):
            imp.note(where, f"spec.{key} {shown_value(spec[key])}", "gpuq has no such concept", "ignored it")
    return out


def _preemption(imp: _Import, node: _Node, out: dict[str, Any], where: str) -> None:
    pre = node.spec.get("preemption") or {}
    if not isinstance(pre, Mapping):
        raise QueueImportError(where, f"spec.preemption: expected a mapping, got {shown(pre)}")
    reclaim = pre.get("reclaimWithinCohort") or "Never"
    within = pre.get("withinClusterQueue") or "Never"
    borrow = pre.get("borrowWithinCohort") or {}
    if node.parent and reclaim == "Never":
        out["preemption"] = {"fence": True}
        others = [imp.nodes[k] for k in imp.nodes[f"Cohort:{node.parent}"].children if k != node.key]
        reclaimers = [o.name for o in others if o.kind == "ClusterQueue" and
                      ((o.spec.get("preemption") or {}).get("reclaimWithinCohort") or "Never") != "Never"]
        if reclaimers:
            imp.note(where, "reclaimWithinCohort: Never beside " + ", ".join(reclaimers),
                     "a gpuq fence stops preemption both ways, Kueue's Never only this queue's",
                     "fenced it: the others do not take back from it what it borrows")
    elif reclaim == "Any":
        imp.note(where, "reclaimWithinCohort: Any", "gpuq preempts only work of a priority at most the "
                 "preemptor's", "took it as LowerPriority")
    if within in ("LowerPriority", "LowerOrNewerEqualPriority"):    # issue 21: gpuq's within_queue
        out["within_queue"] = "lower_priority"
        if within != "LowerPriority":
            imp.note(where, f"withinClusterQueue: {within}", "gpuq preempts within a queue only work of "
                     "strictly lower priority", "took it as LowerPriority (within_queue: lower_priority)")
    elif within != "Never":
        imp.note(where, f"withinClusterQueue: {shown_value(within)}", "not a value Kueue defines", "ignored it")
    if isinstance(borrow, Mapping) and (borrow.get("policy") or "Never") != "Never":
        imp.note(where, f"borrowWithinCohort {shown_value(borrow)}", "gpuq preempts to take back a guarantee, never "
                 "to borrow", "ignored it")


def _local_queues(imp: _Import, paths: Mapping[str, str], queues: dict[str, Any]) -> dict[str, Any]:
    local: dict[str, dict[str, str]] = {}
    namespaces: dict[str, str] = {}
    allowed: dict[str, set[str]] = {}
    for o in imp.local_queues:
        meta = o.raw.get("metadata") or {}
        ns = meta.get("namespace")
        cq = o.spec.get("clusterQueue")
        if not isinstance(ns, str) or not ns:
            imp.note(o.where, "a LocalQueue without a namespace", "it binds no namespace (kubectl applies it to "
                     "the current one)", "left it out")
            continue
        if not isinstance(cq, str) or cq not in paths:
            imp.note(o.where, f"clusterQueue {shown(cq)}", "no such ClusterQueue among the objects read",
                     "left it out")
            continue
        local.setdefault(ns, {})[o.name] = paths[cq]
        allowed.setdefault(cq, set()).add(ns)
        if o.name == DEFAULT_LOCAL_QUEUE:
            namespaces[ns] = paths[cq]
        if o.spec.get("fairSharing"):
            imp.note(o.where, "fairSharing of a LocalQueue", "gpuq shares within a queue by priority and "
                     "submission order", "ignored it")
        for key in sorted(set(o.spec) - {"clusterQueue", "fairSharing"}):
            imp.note(o.where, f"spec.{key}", "gpuq has no such setting", "ignored it")
    if local:
        for cq, path in paths.items():
            spec = queue_at(queues, path)
            spec["namespaces"] = sorted(allowed.get(cq, ()))
            if cq not in allowed:
                imp.note(imp.nodes[f"ClusterQueue:{cq}"].where, "a ClusterQueue without a LocalQueue",
                         "no namespace can submit to it", "it allows no namespace (namespaces: [])")
    elif paths:
        imp.note(imp.source or "the input", "no LocalQueue with a namespace", "nothing says which namespaces use which queue",
                 "any namespace may use every queue; pass the LocalQueues too")
    mapping: dict[str, Any] = {}
    if local:
        mapping["local_queues"] = {ns: dict(sorted(lqs.items())) for ns, lqs in sorted(local.items())}
    if namespaces:
        mapping["namespaces"] = dict(sorted(namespaces.items()))
    return mapping
