"""Queue configuration: the hierarchy, guaranteed/max quotas, GPU types and pod-to-queue mapping.

This module is the contract shared by the accounting engine and the scheduler. It is pure: it
turns a mapping (parsed YAML) into frozen values and raises :class:`QueueConfigError` naming
the YAML path of the first problem (:mod:`accounting.queue_rules` holds the quota rules).

File layout (every section optional except ``queues``)::

    gpu_types:                      # when present, gpu/<TYPE> must name one of these
      H100: {price_per_hour: 4.0, node_labels: [NVIDIA-H100-80GB-HBM3], equivalent: 1}
      A100: {price_per_hour: 1.8, node_labels: [NVIDIA-A100-SXM4-80GB], equivalent: 0.5}
      A100-mig-1g.10gb: {}          # a MIG type: <TYPE>-mig-<profile> (see "GPU types" below)
    mapping:                        # how a pod finds its queue, tried in this order
      labels: [kueue.x-k8s.io/queue-name, queue]
      annotations: [yunikorn.apache.org/queue]
      namespaces: {ml-team: research.vision}
      local_queues: {ml-team: {user-queue: research.vision}}   # Kueue LocalQueues (below)
      default: research.nlp
    policy: {max_priority: 0, non_preemptible: false}   # the root's (these are the defaults)
    queues:
      research:
        guaranteed: {gpu: 24}
        max: {gpu: 80, gpu/H100: 8, gpu_eq: 40, cpu: 512, memory: 4Ti}
        priority: 0
        weight: 2                   # share beyond the guarantees (over-quota), >= 0; 0: none
        preemption: {fence: true}   # no preemption leaves or enters this subtree
        strict_fifo: false
        within_queue: lower_priority    # its own pending may preempt its lower-priority work (default never)
        min_runtime_s: 600          # its work is no victim before it has run this long (default 0)
        namespaces: [ml-team, vision]   # who may submit here (accounting.access); absent: as the parent
        policy: {max_priority: 100, non_preemptible: true}   # what its workloads may ask
        queues: {vision: {...}}
      tenants:
        max: {gpu: 32}
        placement:                  # each namespace gets tenants.<namespace>, made on first use
          namespace_queues: true
          template: {guaranteed: {gpu: 0}, max: {gpu: 8}}

Preemption within a queue, and a minimum runtime
------------------------------------------------
``within_queue``: ``lower_priority`` lets a pending workload of the queue preempt work of strictly
lower priority in its own (leaf) queue (KAI-Scheduler's preempt action, Kueue's
``withinClusterQueue: LowerPriority``); ``never`` (the default) keeps preemption between queues
only. ``min_runtime_s``: admitted work of the queue is no victim, of any preemption, before it has
run that long (a number of seconds, 0 the default). Both are inherited down the tree, as the policy
is: a queue without the key has its parent's, so a department sets it for its queues and a queue
may set it back (``within_queue: never``, ``min_runtime_s: 0``). The rules they add to preemption:
:mod:`scheduler.preemption`.

Resources
---------
A quota is a mapping from resource name to an integer amount:

* ``gpu``        GPUs of any type;
* ``gpu/<TYPE>`` GPUs of that type only (``TYPE`` must be declared in ``gpu_types`` when that
  section is present); for a MIG type, slices of that profile;
* ``gpu_eq``     GPU-equivalents (issue 19): GPUs of any type, each weighed by its type's
  ``equivalent``, so one quota spans models with their worth (8 H100 at 1.0 or 16 A100 at 0.5
  are 8); thousandths allowed (``2.5``), kept exact (an int when whole, else a Decimal);
* ``cpu`` in **millicores** (the file takes ``8`` cores or ``500m``) and ``memory`` in bytes (the
  file takes ``64Gi``, ``1G`` or a plain integer), optional.

``max``: a resource absent from ``max`` is not limited by this queue (its ancestors' max still
apply). ``guaranteed``: a resource absent from ``guaranteed`` has a guarantee of 0 for ``gpu``
(a queue without ``guaranteed`` is guaranteed nothing and does not inherit its parent's), unless
the queue's guarantee is given in ``gpu_eq`` (then that is its GPU guarantee, and its raw GPUs are
bounded only by it); typed ``gpu/<TYPE>`` and ``cpu``/``memory`` guarantees constrain only where
they are given.

A usage vector uses the same keys: a pod holding 8 H100 counts as ``{"gpu": 8, "gpu/H100": 8}``,
and, where some queue sets ``gpu_eq`` (:attr:`QueueConfig.uses_gpu_eq`), also ``"gpu_eq": 8``
(8 x the H100's equivalent).

GPU types
---------
``gpu_types.<TYPE>``: ``price_per_hour`` (the cost of one GPU-hour), ``node_labels`` (the
``nvidia.com/gpu.product`` values, or MIG resources' profiles, that mean this type) and
``equivalent``: what one GPU of the type is worth in GPU-equivalents, a positive number of at most
three decimals (H100 1.0, A100 0.5); 1 when unset.

A **MIG type** is declared by its name, ``<TYPE>-mig-<profile>`` (``A100-mig-1g.10gb``; ``MIG``
in capitals too), ``<TYPE>`` a type declared in the same section and ``<profile>`` a MIG profile
(``<N>g.<M>gb``, :mod:`gpuq.gpu_share`); it is the only kind of type name that may hold a ``.``.
Its GPUs are slices: a MIG resource ``nvidia.com/mig-<profile>`` held on a node of ``<TYPE>``, and
the nodes' ``<product>-MIG-<profile>`` capacity, resolve to it (:meth:`QueueConfig.type_of_label`),
so ``gpu/A100-mig-1g.10gb`` counts slices of that profile, as the scheduler places them. Its
``equivalent`` defaults to its fraction of the GPU (the profile's compute slices, ``1/7`` for a
``1g``) times ``<TYPE>``'s, rounded down to thousandths (``0.5 / 7`` is 0.071).

Local queues (Kueue's LocalQueues)
----------------------------------
``mapping.local_queues.<namespace>.<name>``: the leaf queue that a pod of ``<namespace>`` means
when the queue it names (its ``kueue.x-k8s.io/queue-name``, or any of ``mapping.labels`` and
``mapping.annotations``) is ``<name>``: Kueue's LocalQueue ``<name>`` in that namespace points at
a ClusterQueue, and ``gpuq import-queues kueue`` writes one entry per LocalQueue. The name is
looked up there first, before queue paths and leaf names, and only for pods of that namespace;
the namespace must be one the queue allows (``namespaces``, :mod:`accounting.access`), as for
``mapping.namespaces``. :meth:`QueueMapping.local_queue` answers it.

Policy: what a workload may ask
-------------------------------
``policy`` bounds what the workloads of a queue may ask for themselves (issue 17: both fields
were free per workload, so a tenant could hold borrowed GPUs that nobody could reclaim):

* ``max_priority``: the highest ``priority`` a workload of the queue may have (an integer in
  Kubernetes' PriorityClass range; lower priorities are always allowed);
* ``non_preemptible``: whether a workload of the queue may be non-preemptible. The scheduler
  admits a non-preemptible workload only within its queue's guarantee (``docs/SCENARIOS.md``).

Each queue's policy is inherited down the tree: a queue without ``policy`` (or without one of
its keys) has its parent's, and the top-level ``policy:`` is the root's. A queue may narrow its
parent's bounds but never widen them (a larger ``max_priority``, or ``non_preemptible: true``
under a parent that says false, is an error naming the key); a top-level ``policy:`` bounds
every queue the same way. Without one, the root has :data:`DEFAULT_POLICY` (priority at most 0,
every workload preemptible), which is only a default: a top-level queue may set its own. So a
configuration that uses priorities or non-preemptible work says so, on the queues that may. A scenario's queues
(the simulator) default to :data:`OPEN_POLICY` instead, so that scenarios written before the
policy replay as they did. The API and the Kubernetes source refuse a workload over its queue's
bounds (422, or the reason ``policy`` and an Event); an operator token may narrow them further.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from pathlib import Path
from types import MappingProxyType
from typing import Any

from accounting.errors import QueueConfigError
from accounting.quantity import cpu_millicores, gpu_count, memory_bytes
from gpuq.errors import shown

ROOT = "root"
GPU_EQ = "gpu_eq"                     # the quota resource in GPU-equivalents (module docstring)

Amount = int | Decimal                # ``gpu_eq`` may hold thousandths (an int when whole)
Resources = Mapping[str, Amount]

_EMPTY: Mapping[str, Amount] = MappingProxyType({})
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
QUEUE_KEYS = frozenset({"guaranteed", "max", "priority", "weight", "preemption", "strict_fifo", "policy", "queues",
                        "within_queue", "min_runtime_s"})
WITHIN_QUEUE = ("never", "lower_priority")           # within_queue's values (module docstring)
TOP_KEYS = frozenset({"queues", "gpu_types", "mapping", "policy"})
POLICY_KEYS = frozenset({"max_priority", "non_preemptible"})
PRIORITY_MIN, PRIORITY_MAX = -(2**31), 2**31 - 1      # a workload's priority: Kubernetes' PriorityClass range
# who may use a queue and the queues a parent makes for namespaces (accounting.access)
ACCESS_KEYS = frozenset({"namespaces", "placement"})


@dataclass(frozen=True, slots=True)
class Placement:
    """A parent's placement rule (YuniKorn's ``tag`` rule on the namespace): a namespace allowed
    there that names the parent, or has no queue of its own, gets ``<parent>.<namespace>``, made on
    first use with these quotas (:class:`accounting.access.NamespaceQueues`)."""

    guaranteed: Resources = field(default_factory=lambda: _EMPTY)
    max: Resources = field(default_factory=lambda: _EMPTY)


@dataclass(frozen=True, slots=True)
class Policy:
    """What the workloads of a queue may ask (the module's "Policy" section): the highest
    ``priority`` they may have, and whether they may be non-preemptible. A queue's is the one in
    force there: its own keys, else its parent's."""

    max_priority: int = 0
    non_preemptible: bool = False


DEFAULT_POLICY = Policy()                          # a queue file's root: priority <= 0, all preemptible
OPEN_POLICY = Policy(PRIORITY_MAX, True)           # a scenario's root: no bound


@dataclass(frozen=True, slots=True)
class Queue:
    """One queue of the hierarchy. ``path`` is dotted below the implicit root (``research.vision``);
    the root itself has path ``root``."""

    path: str
    parent: str | None
    guaranteed: Resources = field(default_factory=lambda: _EMPTY)
    max: Resources = field(default_factory=lambda: _EMPTY)
    priority: int = 0
    weight: float = 1.0
    preemption_fence: bool = False   # no preemption leaves or enters this queue's subtree
    strict_fifo: bool = False        # a blocked head blocks the work behind it
    children: tuple[str, ...] = ()
    # the Kubernetes namespaces that may use it, as written (None: its parent's; accounting.access)
    namespaces: frozenset[str] | None = None
    placement: Placement | None = None   # makes a queue below it for each namespace (a parent, always)
    made_for: str = ""                   # the namespace a placement rule made it for ("" in the file)
    policy: Policy = DEFAULT_POLICY  # in force here (inherited), see "Policy" above
    # in force here (inherited), see "Preemption within a queue, and a minimum runtime" above
    within_queue: bool = False       # its pending may preempt its own strictly lower-priority work
    min_runtime_s: float = 0.0       # its admitted work is no victim before it has run this long

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]

    @property
    def is_leaf(self) -> bool:
        return not self.children and self.placement is None


ONE = Decimal(1)


@dataclass(frozen=True, slots=True)
class GpuType:
    name: str
    price_per_hour: float = 0.0
    # node label values (nvidia.com/gpu.product, MIG profiles) that mean this type
    node_labels: tuple[str, ...] = ()
    equivalent: Decimal = ONE     # GPU-equivalents one GPU (a MIG type: one slice) of it is worth
    mig_of: str = ""              # a MIG type: the type it slices ("" for a whole-GPU type)
    mig_profile: str = ""         # a MIG type: its profile (``1g.10gb``)


@dataclass(frozen=True, slots=True)
class QueueMapping:
    """How a pod finds its queue, tried in order: labels, annotations, then namespace map."""

    labels: tuple[str, ...] = ("kueue.x-k8s.io/queue-name", "queue", "yunikorn.apache.org/queue")
    annotations: tuple[str, ...] = ("yunikorn.apache.org/queue",)
    namespaces: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    default: str | None = None
    # namespace -> LocalQueue name -> leaf queue (the module's "Local queues")
    local_queues: Mapping[str, Mapping[str, str]] = field(default_factory=lambda: MappingProxyType({}))

    def local_queue(self, namespace: str, name: str) -> str | None:
        """The leaf queue that ``name`` means for a pod of ``namespace`` as one of its LocalQueues,
        or None when the namespace has no LocalQueue of that name."""
        return self.local_queues.get(namespace, {}).get(name) if namespace and name else None


@dataclass(frozen=True, slots=True)
class QueueConfig:
    queues: Mapping[str, Queue]          # every queue by path, the root included
    gpu_types: Mapping[str, GpuType] = field(default_factory=lambda: MappingProxyType({}))
    mapping: QueueMapping = field(default_factory=QueueMapping)

    @property
    def root(self) -> Queue:
        return self.queues[ROOT]

    def leaves(self) -> tuple[str, ...]:
        return tuple(p for p, q in self.queues.items() if q.is_leaf and p != ROOT)

    def ancestors(self, path: str) -> tuple[str, ...]:
        """The queue's parent, grandparent, ... up to and including ``root``."""
        out: list[str] = []
        parent = self.queues[path].parent
        while parent is not None:
            out.append(parent)
            parent = self.queues[parent].parent
        return tuple(out)

    def type_of_label(self, label_value: str) -> str | None:
        """The type a label value (a product, a MIG profile, a type's name) means. A MIG model
        (``<product>-MIG-<profile>``, the nodes' MIG capacity) is the MIG type of its product's
        type and that profile, when declared."""
        for t in self.gpu_types.values():
            if label_value == t.name or label_value in t.node_labels:
                return t.name
        from gpuq.gpu_share import base_model, mig_profile_of

        profile = mig_profile_of(label_value)
        if profile:
            base = self.type_of_label(base_model(label_value))
            return self.mig_type(base, profile) if base else None
        return None

    def mig_type(self, base: str, profile: str) -> str | None:
        """The declared MIG type slicing ``base`` with ``profile``, if any."""
        for t in self.gpu_types.values():
            if t.mig_of == base and t.mig_profile == profile:
                return t.name
        return None

    def mig_model(self, gpu_type: str) -> str:
        """The nodes' model name of a MIG type's slices (``<product>-MIG-<profile>``, as the
        collector names a pod's slice and :mod:`gpuq.gpu_share` reads its fraction): a declared
        MIG type's from the GPU it slices (that type's first ``node_labels``, else its name, as its
        ``equivalent`` is computed), a type that is such a name already itself; ``""`` for any
        other type (and a name whose profile the table cannot read)."""
        from gpuq.gpu_share import mig_slice_milli

        t = self.gpu_types.get(gpu_type)
        model = gpu_type
        if t is not None and t.mig_of:
            base = self.gpu_types.get(t.mig_of)
            product = base.node_labels[0] if base is not None and base.node_labels else t.mig_of
            model = f"{product}-MIG-{t.mig_profile}"
        return model if mig_slice_milli(model) else ""

    @property
    def uses_gpu_eq(self) -> bool:
        """Whether some queue (or placement template) sets a ``gpu_eq`` guarantee or max: only then
        do usage vectors carry ``gpu_eq`` (a configuration without it costs nothing more)."""
        for q in self.queues.values():
            if GPU_EQ in q.guaranteed or GPU_EQ in q.max:
                return True
            if q.placement is not None and (GPU_EQ in q.placement.guaranteed or GPU_EQ in q.placement.max):
                return True
        return False

    @property
    def has_equivalents(self) -> bool:
        """Whether the views show GPU-equivalents beside raw GPUs: some queue sets ``gpu_eq``, or
        some type is worth other than 1."""
        return self.uses_gpu_eq or any(t.equivalent != ONE for t in self.gpu_types.values())

    def equivalents(self) -> Mapping[str, Decimal]:
        """GPU type -> its ``equivalent`` (a type not declared is worth 1)."""
        return MappingProxyType({n: t.equivalent for n, t in self.gpu_types.items()})


def thousandths(value: Any, where: str, *, positive: bool = False) -> Amount:
    """A number of at most three decimals, exact: an int when whole, else a Decimal. Refused (naming
    ``where``): a non-number, a negative one (or 0 when ``positive``), more than three decimals."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise QueueConfigError(where, f"expected a number, got {shown(value)}")
    try:
        d = Decimal(value) if isinstance(value, (int, str)) else Decimal(repr(value))
    except InvalidOperation:
        raise QueueConfigError(where, f"expected a number, got {shown(value)}") from None
    if not d.is_finite():
        raise QueueConfigError(where, f"expected a number, got {shown(value)}")
    if d < 0 or (positive and d == 0):
        raise QueueConfigError(where, f"must be {'positive' if positive else 'non-negative'}, got {shown(value)}")
    if d * 1000 != (d * 1000).to_integral_value():
        raise QueueConfigError(where, f"at most three decimals (thousandths), got {shown(value)}")
    return int(d) if d == d.to_integral_value() else d.normalize()


def _resources(raw: Any, where: str, gpu_types: Mapping[str, GpuType] | None) -> Resources:
    if raw is None:
        return _EMPTY
    if not isinstance(raw, Mapping):
        raise QueueConfigError(where, f"expected a mapping of resource to amount, got {type(raw).__name__}")
    out: dict[str, Amount] = {}
    for key, value in raw.items():
        key = str(key)
        if key == GPU_EQ:
            out[key] = thousandths(value, f"{where}.{key}")
            continue
        if key == "gpu" or key.startswith("gpu/"):
            if key.startswith("gpu/") and gpu_types is not None and key[4:] not in gpu_types:
                known = ", ".join(sorted(gpu_types)) or "none"
                raise QueueConfigError(f"{where}.{key}", f"unknown gpu type {shown(key[4:])} (declared: {known})")
            amount, err = gpu_count(value)
        elif key == "cpu":
            amount, err = cpu_millicores(value)
        elif key == "memory":
            amount, err = memory_bytes(value)
        else:
            raise QueueConfigError(f"{where}.{key}",
                                   "unknown resource (expected gpu, gpu/<TYPE>, gpu_eq, cpu or memory)")
        if err is not None or amount is None:
            raise QueueConfigError(f"{where}.{key}", err or "invalid amount")
        out[key] = amount
    return MappingProxyType(out)


def _number(spec: Mapping[str, Any], key: str, default: float, where: str, *, integer: bool = False) -> Any:
    value = spec.get(key, default)
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok:
        kind = "an integer" if integer else "a number"
        raise QueueConfigError(f"{where}.{key}", f"expected {kind}, got {shown(value)}")
    return value


def _flag(spec: Mapping[str, Any], key: str, where: str) -> bool:
    value = spec.get(key, False)
    if not isinstance(value, bool):
        raise QueueConfigError(f"{where}.{key}", f"expected true or false, got {shown(value)}")
    return value


def _unknown_keys(spec: Mapping[str, Any], allowed: frozenset[str], where: str) -> None:
    extra = sorted(str(k) for k in spec if k not in allowed)
    if extra:
        raise QueueConfigError(f"{where}.{extra[0]}", f"unknown key (expected one of {', '.join(sorted(allowed))})")


def parse_policy(raw: Any, inherited: Policy, where: str, parent: str | None = None) -> Policy:
    """The policy in force at ``where``: ``raw`` (a ``policy:`` mapping, or None) over
    ``inherited``. ``parent`` names the queue it is inherited from; a key that widens its bound is
    refused (the root, ``parent`` None, may set any)."""
    if raw is None:
        return inherited
    if not isinstance(raw, Mapping):
        raise QueueConfigError(where, f"expected a mapping (max_priority, non_preemptible), got {type(raw).__name__}")
    _unknown_keys(raw, POLICY_KEYS, where)
    top = int(_number(raw, "max_priority", inherited.max_priority, where, integer=True))
    if not PRIORITY_MIN <= top <= PRIORITY_MAX:
        raise QueueConfigError(f"{where}.max_priority", f"must be within {PRIORITY_MIN}..{PRIORITY_MAX} "
                                                        f"(Kubernetes' priority range), got {shown(top)}")
    pinned = raw.get("non_preemptible", inherited.non_preemptible)
    if not isinstance(pinned, bool):
        raise QueueConfigError(f"{where}.non_preemptible", f"expected true or false, got {shown(pinned)}")
    if parent is not None and top > inherited.max_priority:
        raise QueueConfigError(f"{where}.max_priority", f"{top} is above the max_priority {inherited.max_priority} "
                               f"in force on {parent}: a queue may narrow its parent's policy, not widen it")
    if parent is not None and pinned and not inherited.non_preemptible:
        raise QueueConfigError(f"{where}.non_preemptible", f"true, but {parent} does not allow non-preemptible "
                               "workloads: a queue may narrow its parent's policy, not widen it")
    return Policy(top, pinned)


def _within_queue(spec: Mapping[str, Any], inherited: bool, where: str) -> bool:
    if "within_queue" not in spec:
        return inherited
    value = spec["within_queue"]
    if value not in WITHIN_QUEUE:
        raise QueueConfigError(f"{where}.within_queue", f"expected one of {', '.join(WITHIN_QUEUE)}, got {shown(value)}")
    return bool(value == "lower_priority")


def _min_runtime(spec: Mapping[str, Any], inherited: float, where: str) -> float:
    if "min_runtime_s" not in spec:
        return inherited
    value = _number(spec, "min_runtime_s", 0, where)
    if not 0 <= value < float("inf"):
        raise QueueConfigError(f"{where}.min_runtime_s", f"must be a non-negative number of seconds, got {shown(value)}")
    return float(value)


def _queue(name: Any, spec: Any, parent: str, path: str, where: str,
           gpu_types: Mapping[str, GpuType] | None, inherited: Policy,
           bounded: bool = True, up: Queue | None = None) -> tuple[Queue, Mapping[str, Any]]:
    """One queue of the file; ``up``: its parent (None for a top-level queue), whose
    ``within_queue`` and ``min_runtime_s`` it inherits."""
    if not _NAME.match(str(name)):
        raise QueueConfigError(where, "invalid queue name (letters, digits, '_' and '-' only)")
    spec = {} if spec is None else spec
    if not isinstance(spec, Mapping):
        raise QueueConfigError(where, f"expected a mapping, got {type(spec).__name__}")
    _unknown_keys(spec, QUEUE_KEYS | ACCESS_KEYS, where)
    weight = float(_number(spec, "weight", 1.0, where))
    if not 0 <= weight < float("inf"):          # 0: no share beyond the guarantee (issue 21)
        raise QueueConfigError(f"{where}.weight", f"must be 0 or more (and finite), got {shown(spec['weight'])}")
    pre = spec.get("preemption") or {}
    if not isinstance(pre, Mapping):
        raise QueueConfigError(f"{where}.preemption", f"expected a mapping, got {type(pre).__name__}")
    _unknown_keys(pre, frozenset({"fence"}), f"{where}.preemption")
    kids = spec.get("queues") or {}
    if not isinstance(kids, Mapping):
        raise QueueConfigError(f"{where}.queues", f"expected a mapping of queues, got {type(kids).__name__}")
    queue = Queue(
        path=path, parent=parent,
        guaranteed=_resources(spec.get("guaranteed"), f"{where}.guaranteed", gpu_types),
        max=_resources(spec.get("max"), f"{where}.max", gpu_types),
        priority=int(_number(spec, "priority", 0, where, integer=True)),
        weight=weight,
        preemption_fence=_flag(pre, "fence", f"{where}.preemption"),
        strict_fifo=_flag(spec, "strict_fifo", where),
        policy=parse_policy(spec.get("policy"), inherited, f"{where}.policy", parent if bounded else None),
        within_queue=_within_queue(spec, up.within_queue if up is not None else False, where),
        min_runtime_s=_min_runtime(spec, up.min_runtime_s if up is not None else 0.0, where),
    )
    if "namespaces" in spec or "placement" in spec:
        from accounting.access import parse_access

        queue = parse_access(queue, spec, where, gpu_types)
    return queue, kids


MAX_QUEUES = 10_000          # a queue file with more is refused (issue 17: a 639-byte file was 262,126 queues)


def parse_queue_config(data: Mapping[str, Any], source: str = "queues", *,
                       strict_top: bool = False, default_policy: Policy = DEFAULT_POLICY) -> QueueConfig:
    """Build and validate a :class:`QueueConfig` from the parsed YAML of a queue file.

    ``source`` prefixes queue paths in messages (``queues.research.vision.max``). Top-level keys
    other than ``queues``, ``gpu_types``, ``mapping`` and ``policy`` are ignored (a scenario file
    carries more), unless ``strict_top`` (the production file) refuses them. ``default_policy``:
    the root's policy when the file has no top-level ``policy:`` (a scenario passes
    :data:`OPEN_POLICY`).
    """
    from accounting.queue_rules import check_quotas, parse_gpu_types, parse_mapping

    if not isinstance(data, Mapping):
        raise QueueConfigError(source, f"expected a mapping at the top level, got {type(data).__name__}")
    if strict_top:
        _unknown_keys(data, TOP_KEYS, "(top)")
    gpu_types = parse_gpu_types(data.get("gpu_types"))
    declared = gpu_types if data.get("gpu_types") is not None else None
    queues: dict[str, Queue] = {}
    # the root's policy: a top-level ``policy:`` bounds every queue; without one the default is
    # only a default, which a top-level queue may replace with its own
    root_policy = parse_policy(data.get("policy"), default_policy, "policy")
    root_bounds = data.get("policy") is not None

    seen = 0                       # queues met so far, the root left out (parents count before their children)

    def walk(raw: Mapping[str, Any], parent: str, prefix: str, inherited: Policy,
             up: Queue | None = None) -> tuple[str, ...]:
        nonlocal seen
        names: list[str] = []
        for name, spec in raw.items():
            path = f"{prefix}{name}"
            seen += 1
            if seen > MAX_QUEUES:
                raise QueueConfigError(f"{source}.{path}", f"more than {MAX_QUEUES:,} queues: gpuq takes at most "
                                       f"{MAX_QUEUES:,} (accounting.queues.MAX_QUEUES); split the cluster or merge queues")
            queue, kids_raw = _queue(name, spec, parent, path, f"{source}.{path}", declared, inherited,
                                     bounded=parent != ROOT or root_bounds, up=up)
            kids = walk(kids_raw, path, f"{path}.", queue.policy, queue)
            queues[path] = replace(queue, children=kids)
            names.append(path)
        return tuple(names)

    raw_queues = data.get("queues") or {}
    if not isinstance(raw_queues, Mapping):
        raise QueueConfigError(source, f"expected a mapping of queues, got {type(raw_queues).__name__}")
    top = walk(raw_queues, ROOT, "", root_policy)
    queues[ROOT] = Queue(path=ROOT, parent=None, children=top, policy=root_policy)
    config = QueueConfig(queues=MappingProxyType(queues), gpu_types=gpu_types,
                         mapping=parse_mapping(data.get("mapping"), queues))
    check_quotas(config, source)
    from accounting.access import check_access

    check_access(config, source)
    return config


def load_queue_config(path: str | Path) -> QueueConfig:
    """Read and validate a queue file; errors carry the file and the line of the YAML path."""
    import yaml

    from gpuq.yamlsafe import safe_load

    from accounting.queue_rules import line_of

    p = Path(path)
    try:
        text = p.read_text()
        data = safe_load(text) or {}
    except OSError as exc:
        raise QueueConfigError(str(p), f"cannot read: {exc.strerror or exc}", file=str(p)) from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise QueueConfigError(str(p), f"invalid YAML: {getattr(exc, 'problem', None) or exc}",
                               file=str(p), line=mark.line + 1 if mark else None) from exc
    try:
        return parse_queue_config(data, source="queues", strict_top=True)
    except QueueConfigError as exc:
        exc.file, exc.line = str(p), line_of(text, exc.where)
        raise
