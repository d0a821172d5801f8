from __future__ import annotations

from pathlib import Path

import pytest

from gpuq.errors import ConfigError
from gpuq.settings import load_settings

CONTRACT = """
store:
  dsn: chdb:///var/lib/gpuq
collector:
  interval_s: 15
  metrics_port: 9464
  ray:
    - cluster: demo
      dashboard_url: http://127.0.0.1:8265
      metrics_urls: [http://127.0.0.1:8080/metrics]
  dcgm:
    - cluster: demo
      urls: [http://node-1:9400/metrics]
  kubernetes:
    - cluster: prod
      kubeconfig: ~/.kube/config
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "gpuq.yaml"
    p.write_text(text)
    return p


def test_contract_keys_load(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, CONTRACT))
    assert s.store.dsn == "chdb:///var/lib/gpuq"
    assert s.collector.interval_s == 15
    assert s.collector.metrics_port == 9464
    assert s.collector.ray[0].metrics_urls == ["http://127.0.0.1:8080/metrics"]
    assert s.collector.dcgm[0].urls == ["http://node-1:9400/metrics"]
    assert s.collector.kubernetes[0].kubeconfig == "~/.kube/config"


def test_environment_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUQ_STORE__DSN", "http://ch:8123/gpuq")
    monkeypatch.setenv("GPUQ_COLLECTOR__INTERVAL_S", "30")
    s = load_settings(write(tmp_path, CONTRACT))
    assert s.store.dsn == "http://ch:8123/gpuq"
    assert s.collector.interval_s == 30
    assert s.collector.ray[0].cluster == "demo"      # the rest of the file still applies


@pytest.mark.parametrize(
    "text, where, words",
    [
        ("collector:\n  interval_s: fast\n", "collector.interval_s", "valid number"),
        ("collector:\n  ray:\n    - cluster: a\n      dashbord_url: x\n", "collector.ray.0.dashbord_url", "Extra"),
        ("collector:\n  ray:\n    - dashboard_url: x\n", "collector.ray.0.cluster", "required"),
        ("store:\n  ttl_days: 0\n", "store.ttl_days", "greater than or equal"),
        ("collector:\n  metrics_port: [1]\n", "collector.metrics_port", "integer"),
        ("nonsense: 1\n", "nonsense", "Extra"),
    ],
    ids=["wrong-type", "unknown-key", "missing-key", "out-of-range", "list-for-int", "unknown-section"],
)
def test_bad_config_names_the_place(tmp_path: Path, text: str, where: str, words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert err.value.where == f"{path}: {where}"
    assert words in err.value.reason


def test_yaml_syntax_error_has_line(tmp_path: Path) -> None:
    path = write(tmp_path, "store:\n  dsn: [unclosed\ncollector: {}\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert err.value.where.startswith(f"{path}:")
    assert "invalid YAML" in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_settings(tmp_path / "nope.yaml")


def test_queues_file_relative_to_config(tmp_path: Path) -> None:
    s = load_settings(write(tmp_path, "queues_file: queues.yaml\n"))
    assert s.queues_file == str(tmp_path / "queues.yaml")
