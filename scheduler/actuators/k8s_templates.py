"""What the ``kubernetes`` actuator changes in a KubeRay object, as pure functions over its JSON.

Admission (:func:`admitted_object`, Kueue's ``RunWithPodSetsInfo``/``podset.Merge``):

* ``spec.suspend: false``;
* the GPU-type node selector ``<key>=<value>`` merged into **every** pod template (head, worker
  groups, a RayJob's ``submitterPodTemplate``), as Kueue does for a flavor; a template already
  selecting another value for the key is a conflict;
* **the chosen nodes**: every template that requests GPUs (a GPU worker group; the head or the
  submitter only when they request GPUs) gets required node affinity
  ``kubernetes.io/hostname In [<nodes>]``, ANDed into each of its existing
  ``requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms`` (one new term when it has
  none), as Kueue's topology-aware scheduling pins a pod set to its domain. All GPU groups get all
  the placement's nodes: the scheduler's Workload is one gang, its placement one set of nodes,
  with no split per group. A head or submitter without GPUs, and CPU-only groups, keep no
  hostname pin (they need no GPU node, and pinning them to GPU nodes would take CPU and memory
  the gang was placed for). Workers the in-tree autoscaler adds later land on the same nodes or
  stay pending: they are not part of the admitted gang. Node names: the placement's are the
  scheduler's, ``cluster/node`` when the store holds several clusters and ``node:type`` for the
  MIG slices of a node showing several types; :func:`kube_node_names` strips both to the
  Kubernetes node name (and refuses nodes of another cluster). A template whose own
  ``kubernetes.io/hostname In`` terms all exclude the chosen nodes is a conflict.
* ``gpuq.io/workload: <workload id>`` (kept on suspension: terminating pods still join to it)
  and ``gpuq.io/admission`` recording what to restore: the templates' original ``nodeSelector``
  and ``affinity`` in template order (``null`` where there was none), the workload, the type, the
  selector pair and the nodes. A JSON merge patch replaces lists whole, so only this record can
  give back a template's affinity as it was.

Suspension (:func:`suspended_object`, Kueue's ``RestorePodSetsInfo``): ``spec.suspend: true``,
selectors and affinity restored exactly from the record (which is removed), and a mark.
"""
from __future__ import annotations

import copy
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
HOSTNAME_LABEL = "kubernetes.io/hostname"
ADMISSION_ANNOTATION = "gpuq.io/admission"
WORKLOAD_ANNOTATION = "gpuq.io/workload"
PREEMPTED_ANNOTATION = "gpuq.io/preempted"
CANCELLED_ANNOTATION = "gpuq.io/cancelled"
# what makes a template a GPU pod set: devices (time-sliced replicas too), and the time-sliced
# replicas NVIDIA's device plugin renames with ``renameByDefault: true``; MIG slices by their prefix
GPU_RESOURCES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
MIG_PREFIX = "nvidia.com/mig-"
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


class ObjectError(ValueError):
    """The object cannot be handled as asked (no pod templates, a node selector conflict)."""


def pod_templates(kind: str, obj: Mapping[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(where, template)`` for the head, each worker group and a RayJob's explicit
    ``submitterPodTemplate``, in that order (the dicts of ``obj`` itself, for editing a copy)."""
    spec = obj.get("spec") or {}
    cluster = spec.get("rayClusterSpec") if kind == "RayJob" else spec
    prefix = "spec.rayClusterSpec" if kind == "RayJob" else "spec"
    if not isinstance(cluster, dict):
        raise ObjectError(f"{prefix} is missing (a RayJob on an existing cluster has no pods to admit)")
    out: list[tuple[str, dict[str, Any]]] = []
    head = (cluster.get("headGroupSpec") or {}).get("template")
    if not isinstance(head, dict):
        raise ObjectError(f"{prefix}.headGroupSpec.template is missing")
    out.append((f"{prefix}.headGroupSpec.template", head))
    for i, group in enumerate(cluster.get("workerGroupSpecs") or ()):
        tmpl = group.get("template") if isinstance(group, dict) else None
        if not isinstance(tmpl, dict):
            raise ObjectError(f"{prefix}.workerGroupSpecs[{i}].template is missing")
        out.append((f"{prefix}.workerGroupSpecs[{i}].template", tmpl))
    if kind == "RayJob" and isinstance(spec.get("submitterPodTemplate"), dict):
        out.append(("spec.submitterPodTemplate", spec["submitterPodTemplate"]))
    return out


def merge_patch(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch turning ``before`` into ``after`` (removed keys -> ``null``;
    a changed list is sent whole), as ``jsonpatch.CreateMergePatch`` computes it."""
    patch: dict[str, Any] = {key: None for key in before if key not in after}
    for key, value in after.items():
        old = before.get(key, _MISSING)
        if isinstance(value, dict) and isinstance(old, dict):
            sub = merge_patch(old, value)
            if sub:
                patch[key] = sub
        elif old is _MISSING or old != value:
            patch[key] = value
    return patch


_MISSING = object()


# -- nodes and GPUs -------------------------------------------------------------------------------
def kube_node_names(nodes: Iterable[str], cluster: str = "") -> tuple[str, ...]:
    """The Kubernetes node names of scheduler node names, deduplicated in order: ``cluster/node``
    -> ``node`` (ObjectError when ``cluster`` is given and differs), ``node:type`` (a MIG slice)
    -> ``node``. Kubernetes node names hold neither ``/`` nor ``:``."""
    out: dict[str, None] = {}
    for raw in nodes:
        where, _, node = raw.rpartition("/")
        if where and cluster and where != cluster:
            raise ObjectError(f"node {raw!r} is in cluster {where!r}; this actuator drives cluster {cluster!r}")
        node = node.partition(":")[0]
        if not node:
            raise ObjectError(f"node {raw!r} names no Kubernetes node")
        out[node] = None
    return tuple(out)


def requests_gpus(tmpl: Mapping[str, Any], resources: Sequence[str] = GPU_RESOURCES) -> bool:
    """Whether a pod of this template requests one of ``resources`` or a MIG slice."""
    spec = tmpl.get("spec") or {}
    for c in [*(spec.get("containers") or ()), *(spec.get("initContainers") or ())]:
        res = (c.get("resources") or {}) if isinstance(c, dict) else {}
        for amounts in (res.get("limits") or {}, res.get("requests") or {}):
            for name, amount in amounts.items():
                if (name in resources or name.startswith(MIG_PREFIX)) and str(amount) not in ("0", ""):
                    return True
    return False


def _pin(nodes: Sequence[str]) -> dict[str, Any]:
    return {"key": HOSTNAME_LABEL, "operator": "In", "values": list(nodes)}


def pin_nodes(where: str, tmpl: dict[str, Any], nodes: Sequence[str]) -> None:
    """AND ``kubernetes.io/hostname In nodes`` into every required node selector term (in place)."""
    spec = tmpl.setdefault("spec", {})
    if not isinstance(spec.get("affinity"), dict):
        spec["affinity"] = {}
    node_aff = spec["affinity"].setdefault("nodeAffinity", {})
    required = node_aff.get(_REQUIRED)
    if not isinstance(required, dict):
        required = node_aff[_REQUIRED] = {}
    terms = [t for t in required.get("nodeSelectorTerms") or () if isinstance(t, dict)] or [{}]
    wanted = set(nodes)
    open_terms = [t for t in terms if all(
        not (e.get("key") == HOSTNAME_LABEL and e.get("operator") == "In" and not wanted & set(e.get("values") or ()))
        for e in t.get("matchExpressions") or ())]
    if not open_terms:
        raise ObjectError(f"nodeAffinity conflict in {where}: its {HOSTNAME_LABEL} terms exclude the chosen "
                          f"nodes {', '.join(nodes)}")
    required["nodeSelectorTerms"] = [{**t, "matchExpressions": [*(t.get("matchExpressions") or ()), _pin(nodes)]}
                                     for t in terms]


def _unpin(tmpl: dict[str, Any], nodes: Sequence[str]) -> None:
    """Remove the expression :func:`pin_nodes` added, and what it created empty (in place)."""
    spec = tmpl.get("spec") or {}
    affinity = spec.get("affinity")
    node_aff = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = node_aff.get(_REQUIRED) if isinstance(node_aff, dict) else None
    if not isinstance(required, dict):
        return
    pin, terms = _pin(nodes), []
    for term in required.get("nodeSelectorTerms") or ():
        exprs = [e for e in term.get("matchExpressions") or () if e != pin]
        rest = {k: v for k, v in term.items() if k != "matchExpressions"}
        if exprs or rest:
            terms.append({**rest, "matchExpressions": exprs} if exprs else rest)
    if terms:
        required["nodeSelectorTerms"] = terms
        return
    assert isinstance(affinity, dict) and isinstance(node_aff, dict)   # required came from them
    del node_aff[_REQUIRED]
    if not node_aff:
        del affinity["nodeAffinity"]
    if not affinity:
        del spec["affinity"]


# -- the record and restoring -----------------------------------------------------------------------
def _annotations(obj: dict[str, Any]) -> dict[str, Any]:
    meta = obj.setdefault("metadata", {})
    if not isinstance(meta.get("annotations"), dict):
        meta["annotations"] = {}
    return meta["annotations"]  # type: ignore[no-any-return]


def admission_record(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(ADMISSION_ANNOTATION)
    try:
        rec = json.loads(raw) if raw else None
    except ValueError:
        return None
    return rec if isinstance(rec, dict) else None


def restore_templates(kind: str, obj: dict[str, Any]) -> None:
    """Put back the node selectors and affinity recorded at admission (in place; Kueue's
    RestorePodSpec). When the templates changed in number since, only what admission injected is
    removed: the key=value selector pair and the hostname expression."""
    rec = admission_record(obj)
    if rec is None:
        return
    templates = pod_templates(kind, obj)
    selectors, affinities = rec.get("nodeSelectors"), rec.get("affinities")
    if isinstance(selectors, list) and len(selectors) == len(templates):
        for (_, tmpl), sel in zip(templates, selectors):
            _set_spec(tmpl, "nodeSelector", dict(sel) if isinstance(sel, dict) else None)
    else:
        key, value = rec.get("key") or GPU_PRODUCT_LABEL, rec.get("value")
        for _, tmpl in templates:
            sel = _selector(tmpl)
            if sel.get(key) == value:
                del sel[key]
                _set_spec(tmpl, "nodeSelector", sel or None)
    if isinstance(affinities, list) and len(affinities) == len(templates):
        for (_, tmpl), aff in zip(templates, affinities):
            spec = tmpl.setdefault("spec", {})
            if isinstance(aff, dict):
                spec["affinity"] = aff                # exactly as it was, {} included
            else:
                spec.pop("affinity", None)
    elif rec.get("nodes"):
        for _, tmpl in templates:
            _unpin(tmpl, list(rec["nodes"]))


def _set_spec(tmpl: dict[str, Any], field: str, value: dict[str, Any] | None) -> None:
    """Set ``spec.<field>``, or remove it when ``value`` is empty."""
    spec = tmpl.setdefault("spec", {})
    if value:
        spec[field] = value
    else:
        spec.pop(field, None)


def _selector(tmpl: Mapping[str, Any]) -> dict[str, str]:
    return dict((tmpl.get("spec") or {}).get("nodeSelector") or {})


def is_admitted(kind: str, obj: Mapping[str, Any], key: str, value: str | None) -> bool:
    """Unsuspended, and every template selects ``key=value`` (any selector when ``value`` is None)."""
    if (obj.get("spec") or {}).get("suspend") is True:
        return False
    return value is None or all(_selector(t).get(key) == value for _, t in pod_templates(kind, obj))


def admitted_object(kind: str, obj: Mapping[str, Any], workload_id: str, gpu_type: str, key: str,
                    value: str | None, nodes: Sequence[str] = (),
                    gpu_resources: Sequence[str] = GPU_RESOURCES) -> dict[str, Any]:
    """A copy of ``obj`` unsuspended, ``key=value`` merged into every pod template, the GPU
    templates pinned to ``nodes`` (Kubernetes node names; none: no pin), the originals recorded,
    the workload annotated, the stop marks cleared. ObjectError on a conflict."""
    after = copy.deepcopy(dict(obj))
    restore_templates(kind, after)                    # a stale record: start from the originals
    templates = pod_templates(kind, after)
    selectors = [(_selector(t) or None) for _, t in templates]
    affinities = [copy.deepcopy((t.get("spec") or {}).get("affinity")) for _, t in templates]
    for where, tmpl in templates:
        if value is not None:
            sel = _selector(tmpl)
            if sel.get(key, value) != value:
                raise ObjectError(f"nodeSelector conflict in {where}: {key}={sel[key]!r}, "
                                  f"admission wants {value!r}")
            _set_spec(tmpl, "nodeSelector", {**sel, key: value})
        if nodes and requests_gpus(tmpl, gpu_resources):
            pin_nodes(where, tmpl, nodes)
    after.setdefault("spec", {})["suspend"] = False
    notes = _annotations(after)
    record = {"affinities": affinities, "gpuType": gpu_type, "key": key, "nodeSelectors": selectors,
              "nodes": list(nodes), "value": value, "workload": workload_id}
    notes[ADMISSION_ANNOTATION] = json.dumps(record, separators=(",", ":"))
    notes[WORKLOAD_ANNOTATION] = workload_id
    notes.pop(PREEMPTED_ANNOTATION, None)
    notes.pop(CANCELLED_ANNOTATION, None)
    return after


def suspended_object(kind: str, obj: Mapping[str, Any], mark: tuple[str, str]) -> dict[str, Any]:
    """A copy of ``obj`` suspended, its node selectors and affinity restored and ``mark`` annotated."""
    after = copy.deepcopy(dict(obj))
    restore_templates(kind, after)
    after.setdefault("spec", {})["suspend"] = True
    notes = _annotations(after)
    notes.pop(ADMISSION_ANNOTATION, None)
    notes[mark[0]] = mark[1]
    return after
