"""YuniKorn's queue configuration as a gpuq queue file (issue 20): :func:`from_yunikorn`.

Read: the ``queues.yaml`` of the ``yunikorn-configs`` ConfigMap (parsed), the ConfigMap itself (its
``data["queues.yaml"]`` is parsed), or a mapping with a ``queues.yaml`` text (the chart's values).
One partition (``default`` unless said otherwise) is imported; the others are reported.

* The queue tree as it is: ``root``'s children are the top-level queues, each queue's ``queues``
  its children.
* ``resources.guaranteed`` and ``resources.max``: ``nvidia.com/gpu`` (and the vendor names
  :data:`GPU_ALIASES`, reported) is ``gpu``, ``vcore`` is ``cpu``, ``memory`` is ``memory``; any
  other resource is reported. YuniKorn's quota rules are gpuq's (``accounting.queue_rules``), so
  the numbers carry over as they are.
* ``properties``: ``priority.offset`` is the queue's ``priority``; ``priority.policy: fence`` is
  reported (gpuq's queue priority is the offset alone, always); ``preemption.policy: fence`` is a
  preemption fence; ``disabled`` and ``preemption.delay`` are reported, as every other property.
* ``placementrules``: ``provided`` is what gpuq does already (a pod's ``yunikorn.apache.org/queue``
  label or annotation names its queue); ``tag`` on the namespace below a ``fixed`` parent makes
  that parent a placement parent (``placement: {namespace_queues: true}``, its ``childtemplate``'s
  resources the template); ``fixed`` is ``mapping.default``; ``user``, ``group``, filters and
  ``create`` of a queue that is not there are reported.
* ``submitacl``/``adminacl`` (users and groups, which gpuq does not know), ``limits``,
  ``maxapplications``, and ``parent: true`` on a queue that has no children are reported.
"""
from __future__ import annotations

from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from accounting.errors import QueueImportError
from accounting.queue_import.report import (Finding, Imported, Names, cpu_text, gpus, memory_text, named, quantity,
                                            queue_at, shown_value)
from accounting.queues import PRIORITY_MAX, PRIORITY_MIN
from gpuq.errors import shown

GPU_RESOURCE = "nvidia.com/gpu"
GPU_ALIASES = ("gpu", "amd.com/gpu", "gpu.intel.com/i915")       # counted as gpu, with a finding
OPEN_POLICY = {"max_priority": PRIORITY_MAX, "non_preemptible": False}
QUEUE_KEYS = frozenset({"name", "parent", "resources", "properties", "submitacl", "adminacl", "maxapplications",
                        "limits", "childtemplate", "queues"})
CARRIED_PROPERTIES = frozenset({"priority.offset", "priority.policy", "preemption.policy"})


def from_yunikorn(config: Mapping[str, Any], *, partition: str = "default", source: str = "") -> Imported:
    """The queue file of one partition of a YuniKorn queue configuration (module docstring);
    QueueImportError naming the place of anything that cannot be read."""
    origin = getattr(config, "origin", "") or source
    parsed, origin = _queues_yaml(config, origin)
    imp = _Import(origin)
    part = imp.partition(parsed, partition)
    pwhere = named("partition", str(part.get("name")), origin)
    queues_raw = part.get("queues")
    if not isinstance(queues_raw, list):
        raise QueueImportError(pwhere, f"queues: expected a list of queues, got {shown(queues_raw)}")
    roots = [q for q in queues_raw if isinstance(q, Mapping) and str(q.get("name", "")).lower() == "root"]
    if len(roots) == 1 and len(queues_raw) == 1:
        root = roots[0]
        imp.check_root(root)
        top = root.get("queues") or []
    else:
        top = queues_raw                                      # YuniKorn puts them below root itself
    data: dict[str, Any] = {}
    queues = imp.children(top, "root", "", "queues")
    mapping = imp.placement(part.get("placementrules") or [], queues)
    imp.childless_parents(queues)
    if mapping:
        data["mapping"] = mapping
    data["policy"] = dict(OPEN_POLICY)
    data["queues"] = queues
    return Imported(data=data, origins=imp.origins, findings=tuple(imp.findings))


def _queues_yaml(config: Mapping[str, Any], origin: str) -> tuple[Mapping[str, Any], str]:
    """The parsed queue configuration: ``config`` itself, or the ``queues.yaml`` text of a
    ConfigMap's ``data`` (or of a mapping that holds it directly), parsed."""
    from gpuq.yamlsafe import safe_load

    if not isinstance(config, Mapping):
        raise QueueImportError(origin or "the configuration", f"expected a mapping, got {type(config).__name__}")
    holder: Mapping[str, Any] = config
    where = origin
    if config.get("kind") == "ConfigMap" or isinstance(config.get("data"), Mapping):
        holder = config.get("data") or {}
        name = (config.get("metadata") or {}).get("name", "")
        where = named("ConfigMap", str(name), origin) if name else origin
        if not isinstance(holder, Mapping) or "queues.yaml" not in holder:
            raise QueueImportError(where or "ConfigMap", "data: no queues.yaml in it")
    if "queues.yaml" in holder and "partitions" not in holder:
        text = holder["queues.yaml"]
        at = f"{where}, data.queues.yaml" if where else "data.queues.yaml"
        if not isinstance(text, str):
            raise QueueImportError(at, f"expected the text of a queues.yaml, got {type(text).__name__}")
        import yaml

        try:
            parsed = safe_load(text) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f" line {mark.line + 1}" if mark is not None else ""
            raise QueueImportError(f"{at}{line}", f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
        if not isinstance(parsed, Mapping):
            raise QueueImportError(at, f"expected a mapping with partitions, got {type(parsed).__name__}")
        return parsed, at
    return config, origin


class _Import:
    def __init__(self, origin: str) -> None:
        self.origin = origin
        self.findings: list[Finding] = []
        self.origins: dict[str, str] = {}
        self.paths: dict[str, str] = {}               # YuniKorn path (root.a.b, lower case) -> gpuq path
        self.raw: dict[str, Mapping[str, Any]] = {}   # gpuq path -> the YuniKorn queue
        self.placed: set[str] = set()                 # gpuq paths a placement rule made placement parents

    def note(self, where: str, what: str, why: str, instead: str) -> None:
        self.findings.append(Finding(where, what, why, instead))

    def partition(self, parsed: Mapping[str, Any], name: str) -> Mapping[str, Any]:
        parts = parsed.get("partitions")
        if not isinstance(parts, list) or not parts:
            raise QueueImportError(self.origin or "queues.yaml", "partitions: expected a list of partitions")
        found = None
        for i, p in enumerate(parts):
            if not isinstance(p, Mapping) or not isinstance(p.get("name"), str):
                raise QueueImportError(f"{self.origin}: partitions[{i}]" if self.origin else f"partitions[{i}]",
                                       "expected a partition with a name")
            if p["name"].lower() == name.lower() and found is None:
                found = p
            else:
                self.note(named("partition", p["name"], self.origin), "another partition",
                          "one queue file is one partition's queues", f"left it out (--partition {p['name']})")
        if found is None:
            have = ", ".join(str(p.get("name")) for p in parts)
            raise QueueImportError(self.origin or "queues.yaml", f"no partition {shown(name)} (partitions: {have})")
        where = named("partition", found["name"], self.origin)
        for key in sorted(set(found) - {"name", "queues", "placementrules"}):
            self.note(where, f"{key} {shown_value(found[key])}", "gpuq has no such setting", "ignored it")
        return found

    def check_root(self, root: Mapping[str, Any]) -> None:
        where = named("queue", "root", self.origin)
        res = root.get("resources") or {}
        if isinstance(res, Mapping) and (res.get("guaranteed") or res.get("max")):
            self.note(where, f"resources {shown_value(res)}", "gpuq's root has no quota: the cluster is its limit",
                      "ignored them")
        self.acl(root, where)
        self.properties(root, where, {})
        for key in ("maxapplications", "limits", "childtemplate"):
            if root.get(key):
                self.note(where, f"{key} {shown_value(root[key])}", _WHY[key], "ignored it")

    def children(self, raw: Any, ypath: str, prefix: str, at: str) -> dict[str, Any]:
        if not isinstance(raw, list):
            raise QueueImportError(named("queue", ypath, self.origin), f"queues: expected a list, got {shown(raw)}")
        names = Names()
        out: dict[str, Any] = {}
        for i, q in enumerate(raw):
            if not isinstance(q, Mapping) or not isinstance(q.get("name"), str) or not q["name"]:
                raise QueueImportError(named("queue", ypath, self.origin), f"queues[{i}]: expected a queue with a name")
            yname = f"{ypath}.{q['name']}"
            where = named("queue", yname, self.origin)
            name = names.name(q["name"])
            if name != q["name"]:
                self.note(where, f"the name {q['name']}", "gpuq queue names are letters, digits, '_' and '-', "
                          "once below a parent", f"named it {name}")
            path = f"{prefix}{name}"
            self.origins[path] = where
            self.paths[yname.lower()] = path
            self.raw[path] = q
            out[name] = self.queue(q, yname, path, where)
        return out

    def queue(self, q: Mapping[str, Any], ypath: str, path: str, where: str) -> dict[str, Any]:
        for key in sorted(str(k) for k in set(q) - QUEUE_KEYS):
            self.note(where, f"{key}", "not a YuniKorn queue key gpuq knows", "ignored it")
        spec: dict[str, Any] = {}
        res = q.get("resources") or {}
        if not isinstance(res, Mapping):
            raise QueueImportError(where, f"resources: expected a mapping, got {shown(res)}")
        for section in ("guaranteed", "max"):
            if res.get(section):
                spec[section] = self.resources(res[section], where, f"resources.{section}")
        self.properties(q, where, spec)
        self.acl(q, where)
        for key in ("maxapplications", "limits"):
            if q.get(key):
                self.note(where, f"{key} {shown_value(q[key])}", _WHY[key], "ignored it")
        kids = q.get("queues") or []
        if kids:
            spec["queues"] = self.children(kids, ypath, f"{path}.", where)
        return spec

    def resources(self, raw: Any, where: str, at: str) -> dict[str, Any]:
        if not isinstance(raw, Mapping):
            raise QueueImportError(where, f"{at}: expected a mapping of resource to amount, got {shown(raw)}")
        out: dict[str, Any] = {}
        gpu = Decimal(0)
        has_gpu = False
        other = []
        for key, value in raw.items():
            key = str(key)
            amount = quantity(value, f"{where}: {at}.{key}")
            if key == GPU_RESOURCE or key in GPU_ALIASES:
                gpu += amount
                has_gpu = True
                if key != GPU_RESOURCE:
                    self.note(where, f"{at}.{key}", f"gpuq counts the nodes' {GPU_RESOURCE}", "counted it as gpu")
            elif key == "vcore":
                out["cpu"] = cpu_text(amount)
            elif key == "memory":
                out["memory"] = memory_text(amount)
            else:
                other.append(key)
        if has_gpu:
            if gpu != gpu.to_integral_value():
                self.note(where, f"{at} gpu {gpu}", "gpuq counts whole GPUs", "rounded it down")
            out = {"gpu": gpus(gpu), **out}
        if other:
            self.note(where, f"{at} {', '.join(other)}", f"gpuq's queue file takes {GPU_RESOURCE}, vcore (cpu) "
                      "and memory only", "left them out")
        return out

    def properties(self, q: Mapping[str, Any], where: str, spec: dict[str, Any]) -> None:
        props = q.get("properties") or {}
        if not isinstance(props, Mapping):
            raise QueueImportError(where, f"properties: expected a mapping, got {shown(props)}")
        if "priority.offset" in props:
            try:
                offset = int(str(props["priority.offset"]).strip())
            except ValueError:
                raise QueueImportError(where, "properties.priority.offset: expected an integer, got "
                                       f"{shown(props['priority.offset'])}") from None
            if not PRIORITY_MIN <= offset <= PRIORITY_MAX:
                raise QueueImportError(where, f"properties.priority.offset: out of range: {offset}")
            if offset:
                spec["priority"] = offset
        ppolicy = str(props.get("priority.policy", "default")).lower()
        if ppolicy == "fence":
            self.note(where, "priority.policy: fence", "gpuq's queue priority is its offset alone, fenced or not "
                      "(YuniKorn adds the offset to its most urgent application's priority unless fenced)",
                      "the offset is its priority, as fenced")
        elif ppolicy != "default":
            self.note(where, f"priority.policy: {ppolicy}", "not a policy gpuq knows", "ignored it")
        elif spec.get("priority"):
            self.note(where, "priority.offset without priority.policy: fence", "YuniKorn adds the offset to its "
                      "most urgent application's priority; gpuq's queue priority is fixed", "the offset is its "
                      "priority")
        pre = str(props.get("preemption.policy", "default")).lower()
        if pre == "fence":
            spec["preemption"] = {"fence": True}
        elif pre != "default":
            self.note(where, f"preemption.policy: {pre}", "gpuq may preempt any queue's work over its guarantee",
                      "ignored it")
        rest = sorted(str(k) for k in props if k not in CARRIED_PROPERTIES)
        if rest:
            self.note(where, "properties " + ", ".join(f"{k}={props[k]}" for k in rest), "gpuq has no such "
                      "settings", "ignored them")

    def acl(self, q: Mapping[str, Any], where: str) -> None:
        for key, what in (("submitacl", "who may submit"), ("adminacl", "who may administer it")):
            value = q.get(key)
            if value is None or not str(value).strip():
                continue
            if key == "submitacl" and str(value).strip() == "*":
                continue                                # everyone: as in gpuq
            self.note(where, f"{key} {shown(str(value))}", f"gpuq does not know users and groups ({what})",
                      "any namespace may use it" if key == "submitacl" else "gpuq's admin tokens administer it")

    def placement(self, rules: Any, queues: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(rules, list):
            raise QueueImportError(self.origin or "partition", f"placementrules: expected a list, got {shown(rules)}")
        mapping: dict[str, Any] = {}
        tagged = False
        for i, rule in enumerate(rules):
            where = f"placement rule {i + 1}" + (f" ({self.origin})" if self.origin else "")
            if not isinstance(rule, Mapping) or not isinstance(rule.get("name"), str):
                raise QueueImportError(where, f"expected a rule with a name, got {shown(rule)}")
            name = rule["name"].lower()
            if rule.get("filter"):
                self.note(where, f"{name} rule's filter {shown_value(rule['filter'])}", "gpuq does not know users and "
                          "groups", "the rule applies to every namespace")
            if name == "provided":
                if rule.get("create"):
                    self.note(where, "provided rule with create: true", "gpuq does not make a queue a pod names",
                              "a pod naming no queue of the file is billed to its namespace's queue")
            elif name == "tag":
                tagged = self.tag(rule, where, queues, mapping, tagged)
            elif name == "fixed":
                target = self.paths.get(_root_path(str(rule.get("value", ""))).lower())
                if target is None or queue_at(queues, target).get("queues"):
                    self.note(where, f"fixed rule to {rule.get('value')}", "not a leaf queue of the file",
                              "ignored it")
                elif "default" not in mapping:
                    mapping["default"] = target
            elif name == "recovery":
                continue
            else:
                self.note(where, f"{name} rule", "gpuq places work by its namespace and the queue it names, "
                          "not by user or group", "ignored it")
        return mapping

    def tag(self, rule: Mapping[str, Any], where: str, queues: dict[str, Any], mapping: dict[str, Any],
            tagged: bool) -> bool:
        if str(rule.get("value", "")).lower() != "namespace":
            self.note(where, f"tag rule on {rule.get('value')}", "gpuq places by namespace only", "ignored it")
            return tagged
        parent_rule = rule.get("parent")
        parent = "root"
        if isinstance(parent_rule, Mapping):
            if str(parent_rule.get("name", "")).lower() != "fixed":
                self.note(where, f"tag rule below a {parent_rule.get('name')} rule", "gpuq's namespace queues sit "
                          "below one fixed parent", "ignored it")
                return tagged
            parent = _root_path(str(parent_rule.get("value", "")))
        if parent == "root":
            made = 0
            for name, spec in queues.items():
                if not spec.get("queues") and _is_namespace(name):
                    mapping.setdefault("namespaces", {}).setdefault(name, name)
                    made += 1
            self.note(where, "tag rule on the namespace below root", "gpuq makes namespace queues only below "
                      "a parent queue", f"namespaces with a top-level leaf of their name use it ({made} of them); "
                      "others are billed to mapping.default or (unassigned)")
            return tagged
        path = self.paths.get(parent.lower())
        if path is None:
            self.note(where, f"tag rule below {parent}", "no such queue in the file", "ignored it")
            return tagged
        if tagged:
            self.note(where, "a second tag rule on the namespace", "YuniKorn tries the rules in order, gpuq takes "
                      "the first placement parent in the file for a namespace", "made it a placement parent too")
        spec = queue_at(queues, path)
        raw = self.raw[path]
        if rule.get("create", False):
            template: dict[str, Any] = {}
            child = raw.get("childtemplate") or {}
            res = child.get("resources") if isinstance(child, Mapping) else None
            if isinstance(res, Mapping):
                for section in ("guaranteed", "max"):
                    if res.get(section):
                        template[section] = self.resources(res[section], self.origins[path],
                                                           f"childtemplate.resources.{section}")
            if isinstance(child, Mapping):
                for key in sorted(set(child) - {"resources"}):
                    self.note(self.origins[path], f"childtemplate.{key}", "gpuq's placement template takes "
                              "guaranteed and max only", "ignored it")
            spec["placement"] = {"namespace_queues": True, **({"template": template} if template else {})}
            self.placed.add(path)
        else:
            for name, kid in (spec.get("queues") or {}).items():
                if not kid.get("queues") and _is_namespace(name):
                    mapping.setdefault("namespaces", {}).setdefault(name, f"{path}.{name}")
        return True

    def childless_parents(self, queues: dict[str, Any], prefix: str = "") -> None:
        for name, spec in queues.items():
            path = f"{prefix}{name}"
            raw = self.raw.get(path, {})
            if spec.get("queues"):
                self.childless_parents(spec["queues"], f"{path}.")
            elif raw.get("parent") and path not in self.placed:
                self.note(self.origins[path], "parent: true without children", "YuniKorn makes its children as "
                          "work arrives, by rules gpuq has not carried", "it is a leaf queue")
            elif raw.get("childtemplate") and path not in self.placed:
                self.note(self.origins[path], "childtemplate", "no tag rule on the namespace makes queues below it",
                          "ignored it")


_WHY = {
    "maxapplications": "gpuq does not limit a queue's number of running workloads",
    "limits": "gpuq does not know users and groups, and limits queues, not them",
    "childtemplate": "gpuq's root makes no queues",
}


def _root_path(value: str) -> str:
    value = value.strip()
    return value if value.lower() == "root" or value.lower().startswith("root.") else f"root.{value}"


def _is_namespace(name: str) -> bool:
    from accounting.access import NAMESPACE

    return NAMESPACE.match(name) is not None
