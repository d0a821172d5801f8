"""gpuq import-queues (issue 20): Kueue's and YuniKorn's published samples (tests/data/kueue,
tests/data/yunikorn, SOURCE.md there) become queue files whose guarantee and max are the source's
numbers, computed here from the source YAML on their own (not copied from the importer's output);
what is not carried over is reported; bad input names its file; the written file round-trips
through ``gpuq queues``; and a Kueue LocalQueue resolves to its ClusterQueue's queue."""
from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.errors import QueueConfigError, QueueImportError
from accounting.queue_import.kueue import from_kueue
from accounting.queue_import.report import Located, render_yaml
from accounting.queue_import.yunikorn import from_yunikorn
from accounting.queues import parse_queue_config
from accounting.resolve import UNASSIGNED, Resolver
from tests.conftest import REPO

KUEUE = REPO / "tests" / "data" / "kueue"
YUNIKORN = REPO / "tests" / "data" / "yunikorn"
GPU = "nvidia.com/gpu"
# the published Kueue samples whose queues have nvidia.com/gpu, in both API versions, and ours
KUEUE_GPU = ["provisioning-setup.yaml", "tas-sample-gpu-queues.yaml", "sample-hami.yaml",
             "v1beta1-provisioning-setup.yaml", "v1beta1-tas-sample-gpu-queues.yaml", "v1beta1-sample-hami.yaml",
             "handmade-gpu-cohorts.yaml"]
YUNIKORN_PUBLISHED = ["core-queues.yaml", "k8shim-priority-configmap.yaml", "k8shim-preemption-configmap.yaml",
                      "k8shim-resource-limits-configmap.yaml", "k8shim-placement-tag-values.yaml",
                      "k8shim-scheduler-configmap.yaml"]


def docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kueue(path: Path) -> Any:
    objs = [Located(d, f"{path.name}, document {i}") for i, d in enumerate(yaml.safe_load_all(path.read_text()), 1)
            if d]
    return from_kueue(objs, source=path.name)


def loaded(imported: Any) -> Any:
    """The queue file as gpuq loads it, from the text the importer writes."""
    text = render_yaml(imported)
    assert yaml.safe_load(text) == imported.data
    return parse_queue_config(yaml.safe_load(text), strict_top=True)


# -- the source's numbers, computed from the objects alone -------------------------------------------
def _amount(value: Any) -> Decimal:
    return Decimal(str(value))


def kueue_numbers(objects: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """Each ClusterQueue's and cohort's (name) GPU guarantee and max by Kueue's rules: a ClusterQueue
    gets, per flavor, its nominal quota plus its borrowingLimit, at most what its cohort holds in that
    flavor less what the others may not lend; a cohort's guarantee and max are its subtree's nominal
    quotas and its own."""
    kueue_objs = [o for o in objects if o["apiVersion"].startswith("kueue.x-k8s.io/")]
    cqs = {o["metadata"]["name"]: o["spec"] for o in kueue_objs if o["kind"] == "ClusterQueue"}
    cohorts = {o["metadata"]["name"]: o.get("spec") or {} for o in kueue_objs if o["kind"] == "Cohort"}

    def gpu_rows(spec: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
        for group in spec.get("resourceGroups") or []:
            for flavor in group["flavors"]:
                for res in flavor["resources"]:
                    if res["name"] == GPU:
                        yield flavor["name"], res

    def cohort_of(spec: dict[str, Any]) -> str:
        return spec.get("cohortName") or spec.get("cohort") or ""

    def parent_of(name: str) -> str:
        return (cohorts.get(name) or {}).get("parentName", "")

    def within(cq_cohort: str, cohort: str) -> bool:
        while cq_cohort:
            if cq_cohort == cohort:
                return True
            cq_cohort = parent_of(cq_cohort)
        return False

    def held(cohort: str, flavor: str | None, lendable: bool, but: str = "") -> Decimal:
        """What the subtree of ``cohort`` holds (in ``flavor``, or all), each ClusterQueue but ``but``
        counted at its nominal quota, or its lendingLimit when ``lendable``."""
        total = Decimal(0)
        for name, spec in cqs.items():
            if name != but and within(cohort_of(spec), cohort):
                for f, res in gpu_rows(spec):
                    if flavor in (None, f):
                        n = _amount(res.get("nominalQuota", 0))
                        lend = res.get("lendingLimit")
                        total += min(n, _amount(lend)) if lendable and lend is not None else n
        for name, spec in cohorts.items():
            if within(name, cohort):
                for f, res in gpu_rows(spec):
                    if flavor in (None, f):
                        total += _amount(res.get("nominalQuota", 0))
        return total

    out: dict[str, tuple[int, int]] = {}
    for name, spec in cqs.items():
        guarantee = sum((_amount(r.get("nominalQuota", 0)) for _, r in gpu_rows(spec)), Decimal(0))
        top = Decimal(0)
        for f, res in gpu_rows(spec):
            nominal = _amount(res.get("nominalQuota", 0))
            cohort = cohort_of(spec)
            if not cohort:
                top += nominal
                continue
            reach = nominal + held(cohort, f, lendable=True, but=name)
            limit = res.get("borrowingLimit")
            top += reach if limit is None else min(nominal + _amount(limit), reach)
        out[name] = (int(guarantee), int(top))
    for name in {cohort_of(s) for s in cqs.values()} - {""} | set(cohorts):
        total = held(name, None, lendable=False)
        out[name] = (int(total), int(total))
    return out


def gpu_of(q: Any, section: str) -> int | None:
    return getattr(q, section).get("gpu")


# -- Kueue ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", KUEUE_GPU)
def test_kueue_queues_have_the_sources_guarantee_and_max(name: str) -> None:
    path = KUEUE / name
    imported = kueue(path)
    config = loaded(imported)
    expected = kueue_numbers(docs(path))
    by_name = {p.rsplit(".", 1)[-1]: p for p in config.queues if p != "root"}
    have_cohorts = {n for n in expected if n in by_name and config.queues[by_name[n]].children}
    assert expected, name
    for queue, (guarantee, most) in expected.items():
        if queue not in by_name:                  # a cohort without ClusterQueues is left out (reported)
            assert any(queue in f.where for f in imported.findings), queue
            continue
        q = config.queues[by_name[queue]]
        assert (gpu_of(q, "guaranteed"), gpu_of(q, "max")) == (guarantee, most), (name, queue)
    # every ClusterQueue is a leaf below its cohort, nested as the cohorts nest
    for o in docs(path):
        if o["kind"] == "ClusterQueue":
            cohort = o["spec"].get("cohortName") or o["spec"].get("cohort")
            q = config.queues[by_name[o["metadata"]["name"]]]
            assert q.is_leaf and (q.parent == by_name[cohort] if cohort else q.parent == "root")
            assert q.parent == "root" or q.parent in {by_name[c] for c in have_cohorts}


def test_kueue_typed_guarantees_follow_the_flavors_gpu_products() -> None:
    path = KUEUE / "handmade-gpu-cohorts.yaml"
    objects = docs(path)
    config = loaded(kueue(path))
    products = {o["metadata"]["name"]: (o.get("spec") or {}).get("nodeLabels", {}).get("nvidia.com/gpu.product")
                for o in objects if o["kind"] == "ResourceFlavor"}
    for flavor, product in products.items():
        if product:
            assert config.type_of_label(product) == flavor
        else:
            assert flavor not in config.gpu_types            # every node: untyped GPUs
    for o in objects:
        if o["kind"] != "ClusterQueue":
            continue
        q = next(config.queues[p] for p in config.queues if p.endswith(o["metadata"]["name"]))
        typed: dict[str, int] = {}
        for group in o["spec"]["resourceGroups"]:
            for flavor in group["flavors"]:
                for res in flavor["resources"]:
                    if res["name"] == GPU and products.get(flavor["name"]):
                        typed[f"gpu/{flavor['name']}"] = typed.get(f"gpu/{flavor['name']}", 0) + res["nominalQuota"]
        assert {k: v for k, v in q.guaranteed.items() if k.startswith("gpu/")} == typed, q.path
        fs = (o["spec"].get("fairSharing") or {}).get("weight")
        assert q.weight == (float(fs) if fs else 1.0)
        assert q.strict_fifo == (o["spec"].get("queueingStrategy") == "StrictFIFO")


def test_kueue_local_queues_bind_namespaces_and_resolve() -> None:
    path = KUEUE / "handmade-gpu-cohorts.yaml"
    config = loaded(kueue(path))
    lqs = [o for o in docs(path) if o["kind"] == "LocalQueue"]
    r = Resolver(config)
    for lq in lqs:
        ns, name, cq = lq["metadata"]["namespace"], lq["metadata"]["name"], lq["spec"]["clusterQueue"]
        path_of_cq = next(p for p in config.queues if p.rsplit(".", 1)[-1] == cq)
        assert config.mapping.local_queue(ns, name) == path_of_cq
        assert ns in (config.queues[path_of_cq].namespaces or ())
        assert r.queue(name, ns) == path_of_cq, (ns, name)
    # the same LocalQueue name means another queue in another namespace; in a namespace without it, nothing
    assert r.queue("batch", "team-vision") == "org.research.vision"
    assert r.queue("batch", "team-nlp") == "org.research.nlp"
    assert r.queue("batch", "elsewhere") == UNASSIGNED
    # a LocalQueue named default takes the namespace's pods that name no queue (Kueue's defaulting)
    assert r.queue("", "team-vision") == "org.research.vision"
    assert r.queue("", "team-nlp") == UNASSIGNED
    # naming another namespace's queue directly does not get it: the namespace rule holds
    assert r.queue("org.research.nlp", "team-vision") == "org.research.vision"
    assert r.queue("vision", "team-nlp") == UNASSIGNED


def test_local_queues_in_the_file_are_checked() -> None:
    base = {"queues": {"a": {"namespaces": ["x"]}, "b": {}, "p": {"queues": {"c": {}}}}}
    ok = parse_queue_config({**base, "mapping": {"local_queues": {"x": {"lq": "a"}, "y": {"lq": "b"}}}})
    assert ok.mapping.local_queue("x", "lq") == "a" and ok.mapping.local_queue("y", "lq") == "b"
    assert ok.mapping.local_queue("z", "lq") is None
    for local, where in (({"y": {"lq": "a"}}, "mapping.local_queues.y.lq"),       # y may not use a
                         ({"x": {"lq": "p"}}, "mapping.local_queues.x.lq"),       # not a leaf
                         ({"x": {"lq": "nope"}}, "mapping.local_queues.x.lq"),
                         ({"Not_A_Namespace": {"lq": "b"}}, "mapping.local_queues.Not_A_Namespace"),
                         ({"x": ["a"]}, "mapping.local_queues.x")):
        with pytest.raises(QueueConfigError) as err:
            parse_queue_config({**base, "mapping": {"local_queues": local}})
        assert err.value.where == where, (local, str(err.value))


def _findings(imported: Any) -> list[str]:
    return [f.line() for f in imported.findings]


def test_kueue_reports_what_it_does_not_carry() -> None:
    lines = _findings(kueue(KUEUE / "handmade-gpu-cohorts.yaml"))
    expect = [
        ("ClusterQueue nlp (handmade-gpu-cohorts.yaml, document 7): lendingLimit", "no lending limit"),
        ("ClusterQueue nlp", "flavorFungibility"), ("ClusterQueue nlp", "namespaceSelector"),
        ("ClusterQueue nlp", "reclaimWithinCohort: Never beside vision"),
        ("ClusterQueue prod", "borrowWithinCohort"), ("ClusterQueue prod", "reclaimWithinCohort: Any"),
        ("ClusterQueue prod", "quotas of ephemeral-storage"),
        ("ClusterQueue sandbox", "borrowingLimit"),
        ("Cohort research", "a cohort within cohort org"),
        ("ResourceFlavor a100", "cloud.google.com/gke-nodepool=a100-pool"),
    ]
    for where, what in expect:
        assert any(line.startswith(where) and what in line for line in lines), (where, what, lines)
    # withinClusterQueue: LowerPriority has its home now (issue 21): carried, not reported
    assert not any("withinClusterQueue" in line for line in lines)
    config = loaded(kueue(KUEUE / "handmade-gpu-cohorts.yaml"))
    within = {p for p, q in config.queues.items() if q.within_queue}
    assert within and all(p.endswith("vision") for p in within), within
    assert all(line.count(": ") >= 2 and "; gpuq: " in line for line in lines)      # what, why, instead
    hami = _findings(kueue(KUEUE / "sample-hami.yaml"))
    assert any("nvidia.com/total-gpucores, nvidia.com/total-gpumem" in line for line in hami)
    assert any(line.startswith("Deployment gpu-burn (sample-hami.yaml, document 5)") for line in hami)
    assert any("gpu_types.hami-flavor.node_labels" in line for line in hami)     # no product label: said so
    prov = _findings(kueue(KUEUE / "provisioning-setup.yaml"))
    assert any(line.startswith("AdmissionCheck sample-prov") for line in prov)
    assert any("admissionChecksStrategy" in line for line in prov)


def test_kueue_reads_the_kueueviz_samples_cohorts_and_preemption() -> None:
    objs = [Located(d, f"{p.name}, document {i}") for p in sorted(KUEUE.glob("kueueviz-*.yaml"))
            for i, d in enumerate(yaml.safe_load_all(p.read_text()), 1) if d]
    imported = from_kueue(objs, source="kueueviz")
    config = loaded(imported)
    members = {"emergency-cluster-queue", "agi-cluster-queue", "llm-cluster-queue"}
    assert {p.split(".")[-1] for p in config.queues["ai-for-humanity-foundation"].children} == members
    # Kueue's default, reclaimWithinCohort Never, is a fence; LowerPriority and Any are not
    assert config.queues["ai-for-humanity-foundation.agi-cluster-queue"].preemption_fence
    assert not config.queues["ai-for-humanity-foundation.llm-cluster-queue"].preemption_fence
    lines = _findings(imported)
    assert any("orphan-cohort-for-testing" in line and "without ClusterQueues" in line for line in lines)
    assert any("a LocalQueue without a namespace" in line for line in lines)
    assert any("quotas of gpu" in line for line in lines)        # the samples' "gpu" is not nvidia.com/gpu


# -- YuniKorn ----------------------------------------------------------------------------------------
def yunikorn(path: Path, partition: str = "default") -> Any:
    return from_yunikorn(Located(yaml.safe_load(path.read_text()), path.name), partition=partition)


def _yk_tree(path: Path) -> dict[str, dict[str, Any]]:
    """The source's queues by dotted path below root, from the file alone."""
    raw = yaml.safe_load(path.read_text())
    if "data" in raw or "queues.yaml" in raw:
        raw = yaml.safe_load((raw.get("data") or raw)["queues.yaml"])
    part = next(p for p in raw["partitions"] if p["name"] == "default")
    out: dict[str, dict[str, Any]] = {}

    def walk(queues: list[dict[str, Any]], prefix: str) -> None:
        for q in queues:
            out[prefix + q["name"]] = q
            walk(q.get("queues") or [], f"{prefix}{q['name']}.")

    (root,) = part["queues"]
    walk(root.get("queues") or [], "")
    return out


def _yk_gpus(q: dict[str, Any], section: str) -> int | None:
    res = (q.get("resources") or {}).get(section) or {}
    found = [v for k, v in res.items() if k in ("nvidia.com/gpu", "gpu")]
    return sum(found) if found else None


@pytest.mark.parametrize("name", ["handmade-gpu-queues.yaml", *YUNIKORN_PUBLISHED])
def test_yunikorn_tree_guarantees_max_and_priorities_are_the_sources(name: str) -> None:
    path = YUNIKORN / name
    imported = yunikorn(path)
    config = loaded(imported)
    tree = _yk_tree(path)
    assert set(config.queues) - {"root"} == set(tree)
    for p, q in tree.items():
        have = config.queues[p]
        assert gpu_of(have, "guaranteed") == _yk_gpus(q, "guaranteed"), p
        assert gpu_of(have, "max") == _yk_gpus(q, "max"), p
        offset = int((q.get("properties") or {}).get("priority.offset", 0))
        assert have.priority == offset, p
        fence = (q.get("properties") or {}).get("preemption.policy") == "fence"
        assert have.preemption_fence == fence, p


def test_yunikorn_reports_acls_parents_limits_and_maps_placement() -> None:
    imported = yunikorn(YUNIKORN / "handmade-gpu-queues.yaml")
    config = loaded(imported)
    lines = _findings(imported)
    for where, what in (("queue root.research.vision", "submitacl"), ("queue root.prod", "adminacl"),
                        ("queue root.research.nlp", "maxapplications 20"), ("queue root.overflow", "parent: true"),
                        ("queue root.shared", "limits"), ("queue root.research.vision", "priority.policy: fence"),
                        ("queue root.prod", "ephemeral-storage"), ("partition gpu", "another partition")):
        assert any(line.startswith(where) and what in line for line in lines), (where, what, lines)
    tenants = config.queues["tenants"]                   # tag on the namespace below fixed root.tenants
    assert tenants.placement is not None and tenants.placement.max == {"gpu": 4}
    assert config.mapping.default == "shared"           # the fixed rule
    assert Resolver(config).queue("", "team-x") == "tenants.team-x"
    core = _findings(yunikorn(YUNIKORN / "core-queues.yaml"))
    assert any(line.startswith("queue root.sandbox") and "parent: true" in line for line in core)
    assert any(line.startswith("queue root.sandbox") and "submitacl" in line for line in core)
    assert any("user rule" in line for line in core)
    gpu_partition = loaded(yunikorn(YUNIKORN / "core-queues.yaml", partition="gpu"))
    assert set(gpu_partition.queues) == {"root", "production", "test"}


# -- bad input ---------------------------------------------------------------------------------------
def gpuq(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run([sys.executable, "-m", "gpuq.cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)


def test_bad_input_names_the_file_and_the_place(tmp_path: Path) -> None:
    bad_quota = tmp_path / "cq.yaml"
    bad_quota.write_text((KUEUE / "provisioning-setup.yaml").read_text().replace("nominalQuota: 9\n", "nominalQuota: lots\n", 1))
    with pytest.raises(QueueImportError) as err:
        from_kueue([Located(d, f"cq.yaml, document {i}") for i, d in enumerate(yaml.safe_load_all(bad_quota.read_text()), 1)])
    assert "ClusterQueue cluster-queue (cq.yaml, document 2)" in str(err.value)
    assert "nominalQuota" in str(err.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text("apiVersion: kueue.x-k8s.io/v1beta2\nkind: ClusterQueue\n---\nmetadata: [\n")
    cases = [
        (("kueue", str(bad_quota)), ["cq.yaml, document 2", "nominalQuota", "lots"]),
        (("kueue", str(broken)), ["broken.yaml, line", "invalid YAML"]),
        (("kueue", str(tmp_path / "missing.yaml")), ["missing.yaml", "cannot read"]),
        (("yunikorn", str(YUNIKORN / "core-queues.yaml"), "--partition", "nope"), ["no partition 'nope'", "gpu"]),
    ]
    for args, words in cases:
        proc = gpuq("import-queues", *args, "--out", str(tmp_path / "out.yaml"), cwd=tmp_path)
        assert proc.returncode == 2, (args, proc.stderr)
        assert all(w in proc.stderr for w in words), (args, proc.stderr)
        assert not (tmp_path / "out.yaml").exists()


# -- round trip: import, then gpuq queues ------------------------------------------------------------
def _round_trip(tmp_path: Path, args: list[str]) -> tuple[dict[tuple[str, str], tuple[Any, Any]], str]:
    proc = gpuq("import-queues", *args, "--out", "queues.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (tmp_path / "gpuq.yaml").write_text(f"store: {{dsn: 'chdb://{tmp_path / 'data'}'}}\nqueues_file: queues.yaml\n")
    shown = gpuq("queues", "--config", "gpuq.yaml", "--local", "--format", "json", cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    rows = {(r["queue"], r["gpu_type"]): (r["guaranteed"], r["max"]) for r in json.loads(shown.stdout)}
    return rows, proc.stderr


def test_round_trip_kueue_import_then_gpuq_queues(tmp_path: Path) -> None:
    src = KUEUE / "handmade-gpu-cohorts.yaml"
    rows, report = _round_trip(tmp_path, ["kueue", str(src), str(KUEUE / "provisioning-setup.yaml")])
    expected = {**kueue_numbers(docs(src)), **kueue_numbers(docs(KUEUE / "provisioning-setup.yaml"))}
    paths = {q.rsplit(".", 1)[-1]: q for q, _ in rows}
    for name, numbers in expected.items():
        assert rows[(paths[name], "*")] == numbers, name
    assert "lendingLimit" in report and "not carried over exactly" in report
    text = (tmp_path / "queues.yaml").read_text()
    assert "org:  # Cohort org (" in text and "# ClusterQueue cluster-queue (" in text


def test_round_trip_yunikorn_import_then_gpuq_queues(tmp_path: Path) -> None:
    src = YUNIKORN / "handmade-gpu-queues.yaml"
    rows, report = _round_trip(tmp_path, ["yunikorn", str(src)])
    for p, q in _yk_tree(src).items():                  # no guaranteed: guaranteed nothing, in both
        assert rows[(p, "*")] == (_yk_gpus(q, "guaranteed") or 0, _yk_gpus(q, "max")), p
    assert "maxapplications" in report
