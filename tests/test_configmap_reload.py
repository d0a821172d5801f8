"""The queue file and the secrets as the Helm chart hands them to gpuq (deploy/helm/gpuq).

* The queue file is a ConfigMap mounted as a directory. The kubelet updates such a mount the way
  its AtomicWriter does: the new files go into a new hidden directory ``..<timestamp>``, a symlink
  ``..data_tmp`` to it is renamed over ``..data`` (one atomic step), the old directory is removed;
  ``queues.yaml`` itself is a symlink ``..data/queues.yaml``. These tests do exactly that on a real
  directory and check that the running watcher loads the new file, even when it has the old one's
  size and mtime (a coarse clock), and that a relative ``queues_file`` is not pinned to the old
  hidden directory by resolving the symlink.
* API tokens and the ClickHouse DSN come from Secrets as ``GPUQ_API__TOKENS`` (a JSON list) and
  ``GPUQ_STORE__DSN``; a broken JSON names the variable.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from accounting.watcher import QueueConfigWatcher, Reload
from gpuq.errors import ConfigError
from gpuq.settings import load_settings

QUEUES_A = "queues:\n  research: {guaranteed: {gpu: 4}, max: {gpu: 8}}\n"
QUEUES_B = "queues:\n  research: {guaranteed: {gpu: 6}, max: {gpu: 8}}\n"     # same size as A
QUEUES_BAD = "queues:\n  research: {guaranteed: {gpu: 9}, max: {gpu: 8}}\n"


class KubeletVolume:
    """A ConfigMap volume as the kubelet writes it (pkg/volume/util/atomic_writer.go)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir()
        self.n = 0

    def write(self, files: dict[str, str], *, mtime_ns: int | None = None) -> None:
        self.n += 1
        ts = self.root / f"..2026_01_01_00_00_{self.n:02d}.{1000 + self.n}"
        ts.mkdir()
        for name, text in files.items():
            (ts / name).write_text(text)
            if mtime_ns is not None:
                os.utime(ts / name, ns=(mtime_ns, mtime_ns))
        data = self.root / "..data"
        old = os.readlink(data) if data.is_symlink() else None
        tmp = self.root / "..data_tmp"
        tmp.symlink_to(ts.name)
        os.rename(tmp, data)                           # the atomic swap
        for name in files:
            link = self.root / name
            if not link.is_symlink():
                link.symlink_to(Path("..data") / name)
        if old is not None:
            shutil.rmtree(self.root / old)


def test_watcher_reloads_a_configmap_update_even_with_the_same_size_and_mtime(tmp_path: Path) -> None:
    vol = KubeletVolume(tmp_path / "queues")
    stamp = 1_700_000_000_000_000_000
    vol.write({"queues.yaml": QUEUES_A}, mtime_ns=stamp)
    w = QueueConfigWatcher(vol.root / "queues.yaml")
    assert w.poll() is Reload.LOADED
    assert w.config.queues["research"].guaranteed["gpu"] == 4
    assert w.poll() is Reload.UNCHANGED
    assert len(QUEUES_B) == len(QUEUES_A)
    vol.write({"queues.yaml": QUEUES_B}, mtime_ns=stamp)        # same size, same mtime, new file
    assert w.poll() is Reload.LOADED
    assert w.config.queues["research"].guaranteed["gpu"] == 6
    assert w.generation == 2
    vol.write({"queues.yaml": QUEUES_BAD})
    assert w.poll() is Reload.REJECTED                          # the last good one stays
    assert w.config.queues["research"].guaranteed["gpu"] == 6
    assert "queues.yaml" in w.error.located() and "below guaranteed 9" in str(w.error)
    vol.write({"queues.yaml": QUEUES_A})
    assert w.poll() is Reload.LOADED
    assert w.config.queues["research"].guaranteed["gpu"] == 4


def test_relative_queues_file_keeps_the_configmap_symlink(tmp_path: Path) -> None:
    """``queues_file: queues/queues.yaml`` next to the config: the settings keep the symlink in the
    path (resolving it would pin the hidden directory the kubelet deletes at the next update)."""
    vol = KubeletVolume(tmp_path / "queues")
    vol.write({"queues.yaml": QUEUES_A})
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text("queues_file: queues/queues.yaml\n")
    s = load_settings(cfg)
    assert s.queues_file == str(tmp_path / "queues" / "queues.yaml")
    w = QueueConfigWatcher(s.queues_file)
    assert w.poll() is Reload.LOADED
    vol.write({"queues.yaml": QUEUES_B})
    vol.write({"queues.yaml": QUEUES_B.replace("6", "7")})          # the first hidden dir is long gone
    assert w.poll() is Reload.LOADED
    assert w.config.queues["research"].guaranteed["gpu"] == 7


def test_tokens_and_dsn_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the chart's Secrets become: the file keeps api.host, the environment adds the tokens."""
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text("api: {host: 0.0.0.0, port: 8377}\nstore: {database: gpuq}\n")
    tokens = [{"token": "adm-1", "role": "admin", "name": "admin"},
              {"token": "view-1", "role": "viewer", "name": "dashboard"}]
    monkeypatch.setenv("GPUQ_API__TOKENS", json.dumps(tokens))
    monkeypatch.setenv("GPUQ_STORE__DSN", "http://gpuq:pw@clickhouse:8123/gpuq")
    s = load_settings(cfg)
    assert s.api.host == "0.0.0.0"
    assert [(t.token, t.role) for t in s.api.tokens] == [("adm-1", "admin"), ("view-1", "viewer")]
    assert s.store.dsn == "http://gpuq:pw@clickhouse:8123/gpuq"
    assert s.store.database == "gpuq"


def test_broken_token_json_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text("api: {host: 0.0.0.0}\n")
    monkeypatch.setenv("GPUQ_API__TOKENS", '[{"token": "x", "role": "admin"}')
    with pytest.raises(ConfigError) as exc:
        load_settings(cfg)
    assert "GPUQ_API__TOKENS" in str(exc.value)
    assert "delimiter" in str(exc.value)                        # json's own reason
