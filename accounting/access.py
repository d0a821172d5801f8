"""Which Kubernetes namespace may use which queue, and the queues that placement rules make for
namespaces (issue 17: a RayJob in ``team-x`` labelled ``queue: prod`` became a prod workload).

The queue file (:mod:`accounting.queues`)::

    mapping:
      namespaces: {prod-ns: prod}
    queues:
      prod:
        namespaces: [prod-ns]            # only work of namespace prod-ns may use prod
        guaranteed: {gpu: 16}
      research:
        namespaces: [ml-a, ml-b]
        queues:
          vision: {namespaces: [ml-a]}   # a child narrows its parent's list, never widens it
          nlp: {}                        # ml-a and ml-b, as its parent
      tenants:
        max: {gpu: 32}
        placement:
          namespace_queues: true         # each namespace gets tenants.<namespace>, made on first use
          template: {guaranteed: {gpu: 0}, max: {gpu: 8}}

``namespaces`` (Kueue's LocalQueue per namespace, YuniKorn's queue ACLs)
    The Kubernetes namespaces whose work may use the queue and its subtree. Absent, the parent's
    list is in force; absent up to the root, **any namespace** may use it (files written before
    this key mean what they meant). ``[]``: no namespace (only work without one: a Ray submission
    or a target-less workload from the API). A child's list must be within the list in force at
    its parent (:func:`check_access`). Work without a namespace is not checked here: an operator
    token's queue scope is what limits it. ``mapping.namespaces`` may only send a namespace to a
    queue that allows it.

``placement`` (YuniKorn's ``tag`` rule on the namespace, "static or dynamic queues")
    ``namespace_queues: true`` makes the queue a parent (never a leaf, even with no children in
    the file) whose allowed namespaces each get a queue of their own, ``<parent>.<namespace>``,
    made on first use (:class:`NamespaceQueues`) with the ``template``'s ``guaranteed`` and ``max``
    (``guaranteed``/``max`` as for any queue; absent: guaranteed nothing, no max of its own). The
    queue made for a namespace is that namespace's alone. Work of a namespace uses it when it
    names the parent or the queue itself, or names no queue it may use (below). When several
    placement parents allow a namespace, the first in the file (top to bottom) is its parent. A
    made queue counts against :data:`accounting.queues.MAX_QUEUES` with the file's, and its
    guarantee must fit its parent's as a child's would (``accounting.queue_rules``, rule 3): past
    either, it is not made (:class:`~accounting.errors.QueueNotCreated`, with the reason).

A namespace's own queue (:meth:`NamespaceQueues.own_queue`): ``mapping.namespaces[namespace]``,
else the queue of its placement rule, else ``mapping.default`` when the namespace may use it. The
accounting bills work that names a queue its namespace may not use to that queue, never to the
one it named (:mod:`accounting.resolve`); the scheduler does not admit it
(``queue_not_allowed``: :mod:`scheduler.service.core`).
"""
from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import replace
from types import MappingProxyType
from typing import Any

from accounting import queues as _queues
from accounting.errors import QueueConfigError, QueueNotCreated
from accounting.queue_rules import _preorder, _show, guarantee_cap
from accounting.queues import ROOT, Amount, GpuType, Placement, Queue, QueueConfig, _resources, _unknown_keys
from gpuq.errors import shown

# a Kubernetes namespace name (DNS-1123 label), which is also a valid queue name
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_PLACEMENT_KEYS = frozenset({"namespace_queues", "template"})
_TEMPLATE_KEYS = frozenset({"guaranteed", "max"})
SHOWN_NAMES = 10                        # names listed in a message, at most


# -- parsing (called by accounting.queues for each queue that has the keys) ------------------------
def parse_access(queue: Queue, spec: Mapping[str, Any], where: str,
                 gpu_types: Mapping[str, GpuType] | None) -> Queue:
    """``queue`` with its ``namespaces`` and ``placement`` read from ``spec``."""
    namespaces = None
    if "namespaces" in spec:
        raw = spec["namespaces"]
        if raw is None:
            raw = []
        if not isinstance(raw, list):
            raise QueueConfigError(f"{where}.namespaces",
                                   f"expected a list of Kubernetes namespace names, got {shown(raw)}")
        for value in raw:
            if not isinstance(value, str) or not NAMESPACE.match(value):
                raise QueueConfigError(f"{where}.namespaces", f"{shown(value)} is not a Kubernetes namespace name "
                                       "(DNS-1123 label: lower case letters, digits and '-', at most 63)")
        namespaces = frozenset(raw)
    placement = None
    if "placement" in spec:
        placement = _placement(spec["placement"], f"{where}.placement", gpu_types)
    return replace(queue, namespaces=namespaces, placement=placement)


def _placement(raw: Any, where: str, gpu_types: Mapping[str, GpuType] | None) -> Placement | None:
    if not isinstance(raw, Mapping):
        raise QueueConfigError(where, f"expected a mapping (namespace_queues, template), got {type(raw).__name__}")
    _unknown_keys(raw, _PLACEMENT_KEYS, where)
    on = raw.get("namespace_queues")
    if not isinstance(on, bool):
        raise QueueConfigError(f"{where}.namespace_queues", "expected true or false (true: each namespace gets a "
                               f"queue of its own below this one), got {shown(on)}")
    template = raw.get("template") or {}
    if not isinstance(template, Mapping):
        raise QueueConfigError(f"{where}.template", f"expected a mapping (guaranteed, max), got {type(template).__name__}")
    _unknown_keys(template, _TEMPLATE_KEYS, f"{where}.template")
    made = Placement(guaranteed=_resources(template.get("guaranteed"), f"{where}.template.guaranteed", gpu_types),
                     max=_resources(template.get("max"), f"{where}.template.max", gpu_types))
    return made if on else None


# -- the rules in force -----------------------------------------------------------------------------
def rule_of(queues: Mapping[str, Queue], path: str) -> tuple[frozenset[str] | None, str]:
    """The namespaces that may use ``path`` and the queue whose ``namespaces`` says so (its own or
    the nearest ancestor's); ``(None, "")`` when no queue on the way to the root has a list."""
    q = queues.get(path)
    while q is not None:
        if q.namespaces is not None:
            return q.namespaces, q.path
        q = queues.get(q.parent) if q.parent is not None else None
    return None, ""


def refusal(queues: Mapping[str, Queue], path: str, namespace: str) -> str | None:
    """Why work of ``namespace`` may not use the queue ``path`` (None: it may, or the queue is
    unknown, or there is no namespace). Names the rule, never the namespaces it lists (another
    tenant's names are not the caller's to read)."""
    if not namespace or path not in queues:
        return None
    allowed, at = rule_of(queues, path)
    if allowed is None or namespace in allowed:
        return None
    made_for = queues[at].made_for
    if made_for:
        return (f"namespace {namespace} may not use queue {path}: it is namespace {made_for}'s own "
                f"(made by the placement rule of {queues[at].parent})")
    rule = f"queues.{at}.namespaces"
    return f"namespace {namespace} may not use queue {path}: {rule} does not list it"


def check_access(config: QueueConfig, source: str = "queues") -> None:
    """The file's access rules, first failure raised: a child's ``namespaces`` within its parent's
    list in force; a placement template within the max of its parent and the parent's ancestors;
    ``mapping.namespaces`` and ``mapping.local_queues`` only to a queue that namespace may use."""
    queues = config.queues
    for q in _preorder(config):
        if q.path == ROOT:
            continue
        where = f"{source}.{q.path}"
        if q.namespaces is not None and q.parent is not None:
            above, at = rule_of(queues, q.parent)
            wider = sorted(q.namespaces - above) if above is not None else []
            if wider:
                raise QueueConfigError(f"{where}.namespaces", f"{_names(wider)} not allowed by {at}'s namespaces "
                                       f"({_names(sorted(above or ()))}): a queue may only narrow its parent's list")
        if q.placement is not None:
            _check_template(config, q, f"{where}.placement.template")
    for namespace, target in config.mapping.namespaces.items():
        why = refusal(queues, target, namespace)
        if why is not None:
            raise QueueConfigError(f"mapping.namespaces.{namespace}", why)
    for namespace, local in config.mapping.local_queues.items():
        for name, target in local.items():
            why = refusal(queues, target, namespace)
            if why is not None:
                raise QueueConfigError(f"mapping.local_queues.{namespace}.{name}", why)


def _check_template(config: QueueConfig, parent: Queue, where: str) -> None:
    t = parent.placement
    assert t is not None
    for res, amount in t.guaranteed.items():
        if res in t.max and amount > t.max[res]:
            raise QueueConfigError(f"{where}.max", f"{_show(res, t.max[res])} is below guaranteed {amount}")
    chain = [parent.path, *config.ancestors(parent.path)]
    for section, amounts in (("max", t.max), ("guaranteed", t.guaranteed)):
        for res, amount in amounts.items():
            for anc in chain:
                cap = config.queues[anc].max.get(res) if anc != ROOT else None
                if cap is not None and amount > cap:
                    raise QueueConfigError(f"{where}.{section}", f"{_show(res, amount)} is above the max {cap} of {anc}")


def _names(names: list[str]) -> str:
    more = len(names) - SHOWN_NAMES
    return ", ".join(names[:SHOWN_NAMES]) + (f" and {more} more" if more > 0 else "")


# -- the queues placement rules make ------------------------------------------------------------------
class NamespaceQueues:
    """``base`` and the queues its placement rules made, each made on first use and kept (thread-safe).

    :attr:`config` is ``base`` with every made queue below its parent, built again only after a
    queue was made (a made queue is ``O(1)``; the configuration ``O(queues)`` once per change).
    The scheduler keeps one per configuration in force (its quotas); the accounting's
    :class:`~accounting.resolve.Resolver` one per configuration it resolves against.
    """

    def __init__(self, base: QueueConfig) -> None:
        self.base = base
        self._parents = tuple(q.path for q in _preorder(base) if q.placement is not None)
        self._made: dict[str, Queue] = {}
        self._held: dict[str, dict[str, Amount]] = {}     # parent -> guarantees its children hold
        self._lock = threading.Lock()
        self._config: QueueConfig = base
        self._stale = False                              # a queue was made since _config was built

    @property
    def placement_parents(self) -> tuple[str, ...]:
        return self._parents

    @property
    def config(self) -> QueueConfig:
        with self._lock:
            if self._stale:
                self._config, self._stale = _grown(self.base, self._made), False
            return self._config

    def made(self) -> tuple[Queue, ...]:
        """The queues made so far, in the order they were made."""
        with self._lock:
            return tuple(self._made.values())

    def get(self, path: str) -> Queue | None:
        return self.base.queues.get(path) or self._made.get(path)

    def parent_for(self, namespace: str) -> str | None:
        """The placement parent of ``namespace``: the first (top to bottom) that allows it."""
        if not NAMESPACE.match(namespace):
            return None
        for p in self._parents:
            allowed, _ = rule_of(self.base.queues, p)
            if allowed is None or namespace in allowed:
                return p
        return None

    def place(self, name: str, namespace: str) -> str | None:
        """What ``name`` means for work of ``namespace`` under the placement rules: a placement parent
        that allows the namespace, or ``<parent>.<namespace>`` of one, is ``<parent>.<namespace>``
        (made or not yet); anything else is None (not the rules' to place)."""
        if not namespace or not NAMESPACE.match(namespace):
            return None
        q = self.base.queues.get(name)
        parent = name if q is not None and q.placement is not None else name.rpartition(".")[0]
        pq = self.base.queues.get(parent)
        if pq is None or pq.placement is None or (name != parent and name.rpartition(".")[2] != namespace):
            return None
        allowed, _ = rule_of(self.base.queues, parent)
        if allowed is not None and namespace not in allowed:
            return None
        return f"{parent}.{namespace}"

    def own_queue(self, namespace: str) -> str | None:
        """The queue of work of ``namespace`` that names none it may use: ``mapping.namespaces``, then
        its placement rule's queue (made or not yet), then ``mapping.default`` if it may use it."""
        return next(iter(self.own_queues(namespace)), None)

    def own_queues(self, namespace: str) -> list[str]:
        """:meth:`own_queue` and the ones after it, in order (the next is used when a placement rule
        cannot make its queue)."""
        mapping = self.base.mapping
        if namespace in mapping.namespaces:
            return [mapping.namespaces[namespace]]
        out = []
        parent = self.parent_for(namespace) if namespace else None
        if parent is not None:
            out.append(f"{parent}.{namespace}")
        if mapping.default and refusal(self.base.queues, mapping.default, namespace) is None:
            out.append(mapping.default)
        return out

    def make(self, path: str) -> Queue:
        """The queue ``path`` (``<parent>.<namespace>`` as :meth:`place` gives it), made now if it is
        not there yet; QueueNotCreated past :data:`~accounting.queues.MAX_QUEUES` or when the
        template's guarantee does not fit the parent's."""
        have = self.get(path)
        if have is not None:
            return have
        parent_path, _, namespace = path.rpartition(".")
        parent = self.base.queues[parent_path]
        t = parent.placement
        assert t is not None, f"{parent_path} has no placement rule"
        with self._lock:
            if path in self._made:
                return self._made[path]
            limit = _queues.MAX_QUEUES
            if len(self.base.queues) - 1 + len(self._made) >= limit:
                raise QueueNotCreated(path, f"the configuration has {limit:,} queues, the most gpuq takes "
                                      "(accounting.queues.MAX_QUEUES)")
            held = self._held.get(parent_path)
            if held is None:
                held = self._held[parent_path] = _guarantees(self.base, parent)
            for res, amount in t.guaranteed.items():
                bound = guarantee_cap(parent, res)
                if bound is None:
                    continue
                section, cap = bound
                if amount > 0 and held.get(res, 0) + amount > cap:
                    raise QueueNotCreated(path, f"the guarantees of {parent_path}'s queues ({held.get(res, 0)}) and "
                                          f"its template's ({amount}) would exceed its {section} {_show(res, cap)}")
            for res, amount in t.guaranteed.items():
                held[res] = held.get(res, 0) + amount
            q = Queue(path=path, parent=parent_path, guaranteed=t.guaranteed, max=t.max,
                      namespaces=frozenset({namespace}), made_for=namespace,
                      policy=parent.policy,          # the parent's policy, as a child in the file inherits it
                      within_queue=parent.within_queue, min_runtime_s=parent.min_runtime_s)
            self._made[path] = q
            self._stale = True
            return q


def _guarantees(base: QueueConfig, parent: Queue) -> dict[str, Amount]:
    out: dict[str, Amount] = {}
    for c in parent.children:
        for res, amount in base.queues[c].guaranteed.items():
            out[res] = out.get(res, 0) + amount
    return out


def _grown(base: QueueConfig, made: Mapping[str, Queue]) -> QueueConfig:
    queues = dict(base.queues)
    kids: dict[str, list[str]] = {}
    for path, q in made.items():
        assert q.parent is not None
        kids.setdefault(q.parent, []).append(path)
    for parent, paths in kids.items():
        queues[parent] = replace(queues[parent], children=(*queues[parent].children, *paths))
    queues.update(made)
    return replace(base, queues=MappingProxyType(queues))
