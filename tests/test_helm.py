"""The Helm chart (deploy/helm/gpuq) and the Dockerfile, checked without a cluster or docker.

The chart is rendered by Helm's own engine (helm-python-sdk embeds it; ``Chart.render`` works
offline and renders for Kubernetes 1.36) with the default values and with a typical scaled setup;
every object is validated against the Kubernetes OpenAPI schemas (kubernetes-validate, strict:
unknown fields fail) for the lowest version Chart.yaml's kubeVersion allows and for 1.36, the
ServiceMonitor and PrometheusRule against the prometheus-operator CRD schemas vendored in
tests/data/crds (SOURCES.md there), made strict the same way. The YAML is linted with yamllint
(duplicate keys are errors), RBAC is checked for wildcards, and the generated gpuq.yaml is loaded by
gpuq's own settings loader with the Secrets' values in the environment, as the pod would.
No real Kubernetes API server or image build ran here.
"""
from __future__ import annotations

import base64
import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from helm_python import Chart
from helm_python.errors import HelmRenderError
from yamllint import linter
from yamllint.config import YamlLintConfig

from accounting.queues import parse_queue_config
from gpuq.settings import load_settings

REPO = Path(__file__).resolve().parent.parent
CHART_DIR = REPO / "deploy" / "helm" / "gpuq"
CRDS = Path(__file__).resolve().parent / "data" / "crds"
RELEASE, NAMESPACE = "prod", "gpuq-system"
FULL = "prod-gpuq"
RENDERED_FOR = "1.36"            # helm-python-sdk's Capabilities.KubeVersion

TYPICAL: dict[str, Any] = {
    "shape": "scaled",
    "image": {"repository": "registry.example/gpuq", "tag": "0.1.0"},
    "store": {"existingSecret": "clickhouse-dsn", "existingSecretKey": "url"},
    "auth": {"tokens": [{"token": "adm-xyz", "role": "admin", "name": "ops"},
                        {"token": "op-xyz", "role": "operator", "name": "vision",
                         "namespaces": ["team-vision"], "queues": ["research.vision"]},
                        {"token": "view-xyz", "role": "viewer", "name": "dashboard"}]},
    "kubernetes": {"cluster": "prod"},
    "scheduler": {"actuator": "kubernetes", "cluster": "prod", "namespaces": ["team-vision", "team-llm"]},
    "serve": {"pdb": {"enabled": True}},
    "nvml": {"enabled": True, "runtimeClassName": "nvidia"},
    "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
    "prometheusRule": {"enabled": True},
    "networkPolicy": {"allowNamespaces": ["ops"],
                      "clickhouse": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "clickhouse"}},
                                     "ports": [8123]}},
    "config": {"collector": {"interval_s": 30,
                             "ray": [{"cluster": "prod", "dashboard_url": "http://ray-head.ray:8265"}]},
               "scheduler": {"preemption_delay_s": 60, "reclaim": "fair_share", "usage_half_life_s": 604800}},
    "queues": {"file": {"gpu_types": {"H100": {"node_labels": ["NVIDIA-H100-80GB-HBM3"], "price_per_hour": 4.0}},
                        "queues": {"research": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16},
                                                "queues": {"vision": {"guaranteed": {"gpu": 4}}}},
                                   "prod": {"guaranteed": {"gpu": 8}, "priority": 10}}}},
}


@pytest.fixture(scope="module")
def chart() -> Any:
    with Chart.load(CHART_DIR) as c:
        yield c


def render(chart: Any, values: dict[str, Any] | None = None) -> dict[str, str]:
    return chart.render(values=values or {}, name=RELEASE, namespace=NAMESPACE)


class _UniqueKeyLoader(yaml.SafeLoader):
    pass


def _mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
    keys = [loader.construct_object(k, deep=deep) for k, _ in node.value]
    dup = {k for k in keys if keys.count(k) > 1}
    if dup:
        raise AssertionError(f"duplicate keys {sorted(map(str, dup))} at line {node.start_mark.line + 1}")
    return loader.construct_mapping(node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping)


def objects(rendered: dict[str, str]) -> list[dict[str, Any]]:
    out = []
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            continue
        for doc in yaml.load_all(text, Loader=_UniqueKeyLoader):
            if doc:
                assert isinstance(doc, dict), f"{path}: a document that is not an object"
                out.append(doc)
    return out


def by(objs: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name
             and (namespace is None or o["metadata"].get("namespace") == namespace)]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found in {[(o['kind'], o['metadata']['name']) for o in objs]}"
    return found[0]


def min_kube_version() -> str:
    chart_yaml = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    m = re.fullmatch(r">=\s*(\d+)\.(\d+)\.\d+(-0)?", chart_yaml["kubeVersion"])
    assert m, f"Chart.yaml kubeVersion {chart_yaml['kubeVersion']!r} is not '>=X.Y.Z-0'"
    return f"{m.group(1)}.{m.group(2)}"


def _strict(schema: Any) -> Any:
    """A CRD schema as the API server prunes it: unknown fields would be dropped silently, so an
    object with one fails here (additionalProperties false where the schema lists properties)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if ("properties" in out and "additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields")):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def crd_validator(kind: str) -> jsonschema.Validator:
    crd = yaml.safe_load((CRDS / f"monitoring.coreos.com_{kind}.yaml").read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    schema = copy.deepcopy(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object", "required": ["name"],
                                        "properties": {"name": {"type": "string"}, "labels": {"type": "object"},
                                                       "annotations": {"type": "object"},
                                                       "namespace": {"type": "string"}}}
    schema = _strict(schema)
    schema.setdefault("required", []).extend(["apiVersion", "kind", "metadata", "spec"])
    return jsonschema.Draft202012Validator(schema)


def validate_all(objs: list[dict[str, Any]]) -> set[str]:
    versions = (min_kube_version(), RENDERED_FOR)
    validators = {"ServiceMonitor": crd_validator("servicemonitors"),
                  "PrometheusRule": crd_validator("prometheusrules")}
    kinds = set()
    for obj in objs:
        kinds.add(obj["kind"])
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["kind"] in validators:
            assert obj["apiVersion"] == "monitoring.coreos.com/v1", where
            errors = sorted(validators[obj["kind"]].iter_errors(obj), key=lambda e: list(e.path))
            assert not errors, f"{where}: " + "; ".join(f"{'.'.join(map(str, e.path))}: {e.message}" for e in errors)
            continue
        for v in versions:
            try:
                kubernetes_validate.validate(obj, v, strict=True)
            except kubernetes_validate.ValidationError as exc:
                raise AssertionError(f"{where} against Kubernetes {v}: {'.'.join(map(str, exc.path))}: "
                                     f"{exc.message}") from exc
    return kinds


def pod_specs(objs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o["spec"]["template"]["spec"] for o in objs
            if o["kind"] in ("Deployment", "DaemonSet")}


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


# -- rendering and validation ------------------------------------------------------------------
def test_default_values_render_one_pod_on_chdb_and_validate(chart: Any) -> None:
    objs = objects(render(chart))
    kinds = validate_all(objs)
    assert kinds == {"ConfigMap", "Secret", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                     "Deployment", "Service", "PersistentVolumeClaim", "NetworkPolicy"}
    serve = by(objs, "Deployment", FULL)
    assert serve["spec"]["replicas"] == 1 and serve["spec"]["strategy"] == {"type": "Recreate"}
    (c,) = serve["spec"]["template"]["spec"]["containers"]
    assert c["args"] == ["serve", "--config", "/etc/gpuq/gpuq.yaml"]          # collectors inside
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    vols = {v["name"]: v for v in serve["spec"]["template"]["spec"]["volumes"]}
    assert vols["data"]["persistentVolumeClaim"]["claimName"] == f"{FULL}-data"
    assert "subPath" not in [m for m in c["volumeMounts"] if m["name"] == "queues"][0]
    pvc = by(objs, "PersistentVolumeClaim", f"{FULL}-data")
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert not [o for o in objs if o["kind"] in ("Role", "PodDisruptionBudget", "DaemonSet")]
    assert {o["metadata"]["name"] for o in objs if o["kind"] == "Deployment"} == {FULL, f"{FULL}-dashboard"}


def test_typical_scaled_values_render_and_validate(chart: Any) -> None:
    objs = objects(render(chart, TYPICAL))
    kinds = validate_all(objs)
    assert {"DaemonSet", "Role", "RoleBinding", "PodDisruptionBudget", "ServiceMonitor",
            "PrometheusRule"} <= kinds
    assert "PersistentVolumeClaim" not in kinds and "Secret" in kinds
    serve = by(objs, "Deployment", FULL)
    assert serve["spec"]["replicas"] == 2
    assert serve["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    (c,) = serve["spec"]["template"]["spec"]["containers"]
    assert c["args"][-1] == "--no-collect"
    assert c["image"] == "registry.example/gpuq:0.1.0"
    env = env_of(c)
    assert env["GPUQ_STORE__DSN"] == {"secretKeyRef": {"name": "clickhouse-dsn", "key": "url"}}
    assert env["GPUQ_API__TOKENS"] == {"secretKeyRef": {"name": f"{FULL}-auth", "key": "tokens"}}
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    collector = by(objs, "Deployment", f"{FULL}-collector")
    (cc,) = collector["spec"]["template"]["spec"]["containers"]
    assert cc["args"] == ["collect", "--config", "/etc/gpuq/gpuq.yaml"]
    assert collector["spec"]["replicas"] == 1
    nvml = by(objs, "DaemonSet", f"{FULL}-nvml")
    ns = nvml["spec"]["template"]["spec"]
    assert ns["runtimeClassName"] == "nvidia" and ns["automountServiceAccountToken"] is False
    assert ns["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert env_of(ns["containers"][0])["GPUQ_COLLECTOR__NVML__NODE"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    dash = by(objs, "Deployment", f"{FULL}-dashboard")
    assert env_of(dash["spec"]["template"]["spec"]["containers"][0])["GPUQ_DASHBOARD__TOKEN"] == {
        "secretKeyRef": {"name": f"{FULL}-auth", "key": "dashboard-token"}}
    # no Secret for the DSN (an existing one is named); the auth Secret carries the tokens
    assert [o["metadata"]["name"] for o in objs if o["kind"] == "Secret"] == [f"{FULL}-auth"]
    # the metrics Service publishes the standby too; the API Service only Ready pods
    assert by(objs, "Service", f"{FULL}-metrics")["spec"]["publishNotReadyAddresses"] is True
    assert "publishNotReadyAddresses" not in by(objs, "Service", FULL)["spec"]
    # the PrometheusRule is alerts/ as rendered by `make alerts`, unchanged
    rule = by(objs, "PrometheusRule", FULL)
    shipped = yaml.safe_load((CHART_DIR / "files" / "prometheusrule.yaml").read_text())
    assert rule["spec"] == shipped["spec"] and len(rule["spec"]["groups"]) >= 1
    assert by(objs, "ServiceMonitor", FULL)["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_rendered_yaml_passes_yamllint(chart: Any) -> None:
    conf = YamlLintConfig("extends: default\nrules:\n  line-length: disable\n  document-start: disable\n"
                          "  comments: disable\n  comments-indentation: disable\n  empty-lines: disable\n"
                          "  indentation: {spaces: consistent, indent-sequences: whatever}\n"
                          "  key-duplicates: enable\n  truthy: {check-keys: false}\n")
    for values in ({}, TYPICAL):
        for path, text in render(chart, values).items():
            if path.endswith("NOTES.txt") or not text.strip():
                continue
            problems = [p for p in linter.run(text, conf) if p.level == "error"]
            assert not problems, f"{path}: " + "; ".join(f"{p.line}:{p.column} {p.desc}" for p in problems)


# -- least privilege ----------------------------------------------------------------------------
def test_rbac_grants_no_wildcard_and_only_what_each_part_needs(chart: Any) -> None:
    for values in ({}, TYPICAL):
        for o in objects(render(chart, values)):
            if o["kind"] not in ("Role", "ClusterRole"):
                continue
            for rule in o["rules"]:
                for key in ("verbs", "resources", "apiGroups", "resourceNames", "nonResourceURLs"):
                    assert not any("*" in v for v in rule.get(key, [])), f"{o['metadata']['name']}: {rule}"
    objs = objects(render(chart, TYPICAL))
    roles = {(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]): o["rules"]
             for o in objs if o["kind"] in ("Role", "ClusterRole")}
    assert roles[("ClusterRole", None, f"{FULL}-{NAMESPACE}-collector")] == [
        {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["ray.io"], "resources": ["rayjobs", "rayclusters"], "verbs": ["get", "list", "watch"]}]
    for ns in ("team-vision", "team-llm"):
        assert roles[("Role", ns, f"{FULL}-actuator")] == [
            {"apiGroups": ["ray.io"], "resources": ["rayjobs", "rayclusters"], "verbs": ["get", "list", "patch"]},
            {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
            {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]}]
    assert roles[("Role", NAMESPACE, f"{FULL}-leader")] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [FULL],
         "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    # no write anywhere else: the actuator Roles are only in the namespaces given
    writes = {k for k, rules in roles.items()
              if any(set(r["verbs"]) - {"get", "list", "watch"} for r in rules)}
    assert writes == {("Role", "team-vision", f"{FULL}-actuator"), ("Role", "team-llm", f"{FULL}-actuator"),
                      ("Role", NAMESPACE, f"{FULL}-leader")}
    bindings = {(o["metadata"].get("namespace"), o["roleRef"]["name"]): [s["name"] for s in o["subjects"]]
                for o in objs if o["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert bindings[(None, f"{FULL}-{NAMESPACE}-collector")] == [f"{FULL}-collector"]    # not the serve pods
    assert bindings[("team-llm", f"{FULL}-actuator")] == [FULL]
    specs = pod_specs(objs)
    assert specs[f"{FULL}-dashboard"]["automountServiceAccountToken"] is False


def test_every_pod_is_non_root_read_only_and_bounded(chart: Any) -> None:
    for values in ({}, TYPICAL):
        for name, spec in pod_specs(objects(render(chart, values))).items():
            psc = spec["securityContext"]
            assert psc["runAsNonRoot"] is True and psc["runAsUser"] == 10001, name
            assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, name
            mounts_ok = {v["name"] for v in spec["volumes"] if "emptyDir" in v or "persistentVolumeClaim" in v}
            for c in spec["containers"]:
                sc = c["securityContext"]
                assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False, name
                assert sc["capabilities"] == {"drop": ["ALL"]}, name
                assert set(c["resources"]) == {"requests", "limits"}, name
                assert {"cpu", "memory"} <= set(c["resources"]["limits"]), name
                writable = {m["mountPath"] for m in c["volumeMounts"] if m["name"] in mounts_ok}
                assert "/tmp" in writable, name
                assert c["livenessProbe"], name


def test_network_policies_cover_every_pod(chart: Any) -> None:
    objs = objects(render(chart, TYPICAL))
    pols = [o for o in objs if o["kind"] == "NetworkPolicy"]
    for o in objs:
        if o["kind"] not in ("Deployment", "DaemonSet"):
            continue
        labels = o["spec"]["template"]["metadata"]["labels"]
        mine = [p for p in pols if p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert len(mine) == 1, o["metadata"]["name"]
        assert mine[0]["spec"]["policyTypes"] == ["Ingress", "Egress"]
        egress_ports = {p["port"] for rule in mine[0]["spec"]["egress"] for p in rule["ports"]}
        assert 53 in egress_ports
    serve_pol = by(objs, "NetworkPolicy", f"{FULL}-serve")
    sources = serve_pol["spec"]["ingress"][0]["from"]
    assert {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}}} in sources
    assert any(s.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "dashboard"
               for s in sources)
    ch = [r for r in serve_pol["spec"]["egress"] if r["ports"] == [{"port": 8123, "protocol": "TCP"}]]
    assert ch and ch[0]["to"] == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "clickhouse"}}}]


# -- the generated configuration is one gpuq accepts -------------------------------------------------
def _secret(objs: list[dict[str, Any]], name: str, key: str) -> str:
    return base64.b64decode(by(objs, "Secret", name)["data"][key]).decode()


def test_generated_config_loads_with_gpuq_settings(chart: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    objs = objects(render(chart, TYPICAL))
    cm = by(objs, "ConfigMap", f"{FULL}-config")["data"]
    (tmp_path / "gpuq.yaml").write_text(cm["gpuq.yaml"])
    (tmp_path / "gpuq-nvml.yaml").write_text(cm["gpuq-nvml.yaml"])
    tokens = _secret(objs, f"{FULL}-auth", "tokens")
    monkeypatch.setenv("GPUQ_API__TOKENS", tokens)                                # as the pod gets them
    monkeypatch.setenv("GPUQ_STORE__DSN", "http://gpuq:pw@clickhouse.clickhouse:8123/gpuq")
    monkeypatch.setenv("POD_NAME", "prod-gpuq-5d9c-abcde")
    s = load_settings(tmp_path / "gpuq.yaml")
    assert s.api.host == "0.0.0.0" and s.api.port == 8377
    assert [t.role for t in s.api.tokens] == ["admin", "operator", "viewer"]
    assert s.store.dsn.startswith("http://") and s.store.spill_dir == "/var/lib/gpuq/spill"
    assert s.queues_file == "/etc/gpuq/queues/queues.yaml"
    assert s.scheduler.actuator == "kubernetes" and s.scheduler.preemption_delay_s == 60
    assert s.scheduler.reclaim == "fair_share" and s.scheduler.usage_half_life_s == 604800   # issue 21
    assert s.collector.interval_s == 30 and s.collector.ray[0].cluster == "prod"
    (k8s,) = s.collector.kubernetes
    assert k8s.in_cluster and sorted(k8s.namespaces) == ["team-llm", "team-vision"]
    assert s.leader.enabled and s.leader.lease_name == FULL and s.leader.namespace == NAMESPACE
    assert s.leader.identity == "prod-gpuq-5d9c-abcde" and s.leader.in_cluster
    assert (s.leader.lease_duration_s, s.leader.renew_deadline_s, s.leader.retry_period_s) == (15, 10, 2)
    assert s.dashboard.api_url == f"http://{FULL}.{NAMESPACE}.svc:8377"
    assert _secret(objs, f"{FULL}-auth", "dashboard-token") == "view-xyz"
    monkeypatch.setenv("GPUQ_COLLECTOR__NVML__NODE", "gpu-node-7")
    n = load_settings(tmp_path / "gpuq-nvml.yaml")
    assert n.collector.nvml.enabled and n.collector.nvml.node == "gpu-node-7"
    assert not (n.collector.ray or n.collector.dcgm or n.collector.kubernetes)
    queues = yaml.safe_load(by(objs, "ConfigMap", f"{FULL}-queues")["data"]["queues.yaml"])
    cfg = parse_queue_config(queues, source="queues", strict_top=True)
    assert cfg.queues["research"].guaranteed["gpu"] == 8


def test_default_config_loads_and_generates_tokens(chart: Any, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    objs = objects(render(chart))
    (tmp_path / "gpuq.yaml").write_text(by(objs, "ConfigMap", f"{FULL}-config")["data"]["gpuq.yaml"])
    tokens = json.loads(_secret(objs, f"{FULL}-auth", "tokens"))
    assert [t["role"] for t in tokens] == ["admin", "viewer"]
    assert all(len(t["token"]) == 40 for t in tokens)
    assert _secret(objs, f"{FULL}-auth", "dashboard-token") == tokens[1]["token"]
    monkeypatch.setenv("GPUQ_API__TOKENS", json.dumps(tokens))
    s = load_settings(tmp_path / "gpuq.yaml")
    assert s.store.dsn == "chdb:///var/lib/gpuq/store"
    assert not s.leader.enabled and s.scheduler.actuator == "dry-run"
    assert s.collector.kubernetes[0].in_cluster and s.collector.kubernetes[0].namespaces == []
    from scheduler.api.auth import check_exposure
    check_exposure(s.api)                  # 0.0.0.0 with tokens: gpuq serve starts


def test_otel_values_set_the_otlp_exporter_and_the_sdk_variables(chart: Any, tmp_path: Path) -> None:
    values = {**TYPICAL, "otel": {"enabled": True, "endpoint": "http://otel-collector.observability:4318",
                                  "headersSecret": "otlp-auth", "resourceAttributes": "k8s.cluster.name=prod"}}
    objs = objects(render(chart, values))
    validate_all(objs)
    for name, spec in pod_specs(objs).items():
        if name.endswith("-dashboard"):
            continue
        env = env_of(spec["containers"][0])
        assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel-collector.observability:4318", name
        assert env["OTEL_EXPORTER_OTLP_PROTOCOL"] == "http/protobuf", name
        assert env["OTEL_EXPORTER_OTLP_HEADERS"] == {"secretKeyRef": {"name": "otlp-auth", "key": "headers"}}
        assert env["OTEL_RESOURCE_ATTRIBUTES"] == "k8s.cluster.name=prod"
    text = by(objs, "ConfigMap", f"{FULL}-config")["data"]["gpuq.yaml"]
    assert yaml.safe_load(text)["collector"]["otel_exporter"] == "otlp"
    egress = by(objs, "NetworkPolicy", f"{FULL}-serve")["spec"]["egress"]
    assert any({"port": 4318, "protocol": "TCP"} in r["ports"] for r in egress)
    (tmp_path / "gpuq.yaml").write_text(text)
    assert load_settings(tmp_path / "gpuq.yaml").collector.otel_exporter == "otlp"


def test_existing_secrets_are_referenced_not_created(chart: Any) -> None:
    objs = objects(render(chart, {"shape": "scaled", "store": {"existingSecret": "ch"},
                                  "auth": {"existingSecret": "gpuq-tokens"}}))
    validate_all(objs)
    assert not [o for o in objs if o["kind"] == "Secret"]
    env = env_of(by(objs, "Deployment", FULL)["spec"]["template"]["spec"]["containers"][0])
    assert env["GPUQ_API__TOKENS"] == {"secretKeyRef": {"name": "gpuq-tokens", "key": "tokens"}}
    assert env["GPUQ_STORE__DSN"] == {"secretKeyRef": {"name": "ch", "key": "dsn"}}


@pytest.mark.parametrize(("values", "message"), [
    ({"shape": "scaled"}, "shape scaled needs a ClickHouse server: set store.dsn"),
    ({"shape": "multi"}, 'shape must be single or scaled (got "multi")'),
    ({"nvml": {"enabled": True}}, "nvml.enabled runs a collector on every GPU node, which needs shape scaled"),
    ({"scheduler": {"actuator": "kubernetes"}}, "scheduler.actuator kubernetes needs scheduler.namespaces"),
    ({"config": {"api": {"tokens": [{"token": "x"}]}}}, "config.api.tokens would land in a ConfigMap"),
    ({"config": {"store": {"dsn": "http://u:p@ch:8123/db"}}}, "config.store.dsn would land in a ConfigMap"),
    ({"auth": {"tokens": [{"token": "a", "role": "admin"}]}}, "auth.tokens has no viewer token for the dashboard"),
    ({"auth": {"tokens": [{"token": "v", "role": "viewer"}], "dashboardToken": "w"}},
     "auth.dashboardToken is not one of auth.tokens"),
    ({"otel": {"enabled": True}}, "otel.enabled needs otel.endpoint"),
])
def test_bad_values_fail_the_render_naming_the_value(chart: Any, values: dict[str, Any], message: str) -> None:
    with pytest.raises(HelmRenderError) as exc:
        render(chart, values)
    assert message in str(exc.value)


def test_scaled_with_a_dsn_value_creates_its_secret(chart: Any) -> None:
    objs = objects(render(chart, {"shape": "scaled", "store": {"dsn": "https://gpuq:pw@ch.example:8443/gpuq"}}))
    validate_all(objs)
    assert _secret(objs, f"{FULL}-store", "dsn") == "https://gpuq:pw@ch.example:8443/gpuq"
    assert "pw@" not in by(objs, "ConfigMap", f"{FULL}-config")["data"]["gpuq.yaml"]


# -- the Dockerfile (not built here: no docker) ---------------------------------------------------
def test_dockerfile_is_non_root_pinned_and_runs_gpuq() -> None:
    text = (REPO / "Dockerfile").read_text()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.strip().startswith("#")]
    bases = [ln.split()[1] for ln in lines if ln.upper().startswith("FROM ")]
    assert bases and all(re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", b) for b in bases), bases
    users = [ln.split()[1] for ln in lines if ln.upper().startswith("USER ")]
    assert users and re.fullmatch(r"[1-9]\d{3,}(:\d+)?", users[-1]), users          # numeric, not root
    uid = int(users[-1].split(":")[0])
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert values["podSecurityContext"]["runAsUser"] == uid
    assert 'ENTRYPOINT ["gpuq"]' in lines
    assert 'CMD ["serve", "--config", "/etc/gpuq/gpuq.yaml"]' in lines
    ignored = {ln.strip() for ln in (REPO / ".dockerignore").read_text().splitlines()}
    assert {".venv", ".git", "tests", ".gpuq", "benchmarks"} <= ignored
    for copied in re.findall(r"^COPY (?!--from)(\S+)", text, flags=re.M):
        assert copied not in ignored, f"{copied} is copied but .dockerignore leaves it out"


def test_queues_from_kueue_reads_kueue_and_loads(chart: Any, tmp_path: Path) -> None:
    """``queues.from: kueue`` (issue 20): the collector's ClusterRole also reads Kueue's objects (read
    only), and the config follows Kueue with the dry-run actuator, no queue file."""
    objs = objects(render(chart, {"queues": {"from": "kueue"}}))
    rules = by(objs, "ClusterRole", f"{FULL}-{NAMESPACE}-collector")["rules"]
    assert rules[-2] == {"apiGroups": ["kueue.x-k8s.io"], "verbs": ["get", "list", "watch"],
                         "resources": ["resourceflavors", "cohorts", "clusterqueues", "localqueues", "workloads"]}
    # Kueue's visibility API: the pending Workloads of a ClusterQueue, read with one GET each
    assert rules[-1] == {"apiGroups": ["visibility.kueue.x-k8s.io"], "verbs": ["get"],
                         "resources": ["clusterqueues/pendingworkloads"]}
    (tmp_path / "gpuq.yaml").write_text(by(objs, "ConfigMap", f"{FULL}-config")["data"]["gpuq.yaml"])
    s = load_settings(tmp_path / "gpuq.yaml")
    assert (s.queues_from, s.queues_file, s.scheduler.actuator) == ("kueue", None, "dry-run")
    default = by(objects(render(chart, {})), "ClusterRole", f"{FULL}-{NAMESPACE}-collector")["rules"]
    assert all("kueue.x-k8s.io" not in g for r in default for g in r["apiGroups"])


def test_queues_from_yunikorn_reads_its_two_configmaps_by_name_and_loads(chart: Any, tmp_path: Path) -> None:
    """``queues.from: yunikorn`` (issue 20): a Role in YuniKorn's namespace reads its two queue
    ConfigMaps by name (read only), bound to the collector; the config follows YuniKorn with the
    dry-run actuator, no queue file, the namespace and partition given."""
    objs = objects(render(chart, {"queues": {"from": "yunikorn", "yunikorn": {"namespace": "yk-system",
                                                                             "partition": "gpu"}}}))
    role = by(objs, "Role", f"{FULL}-{NAMESPACE}-yunikorn-configs")
    assert role["metadata"]["namespace"] == "yk-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                              "resourceNames": ["yunikorn-configs", "yunikorn-defaults"], "verbs": ["get", "list", "watch"]}]
    binding = by(objs, "RoleBinding", f"{FULL}-{NAMESPACE}-yunikorn-configs")
    assert binding["metadata"]["namespace"] == "yk-system" and binding["subjects"][0]["namespace"] == NAMESPACE
    (tmp_path / "gpuq.yaml").write_text(by(objs, "ConfigMap", f"{FULL}-config")["data"]["gpuq.yaml"])
    s = load_settings(tmp_path / "gpuq.yaml")
    assert (s.queues_from, s.queues_file, s.scheduler.actuator, s.yunikorn.namespace, s.yunikorn.partition) == (
        "yunikorn", None, "dry-run", "yk-system", "gpu")
    for values in ({}, {"queues": {"from": "kueue"}}):
        assert not [o for o in objects(render(chart, values)) if o["metadata"]["name"].endswith("-yunikorn-configs")]
