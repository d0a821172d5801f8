"""Reload the queue file when it changes; an invalid file keeps the last good configuration.

The file system is injected (``stat`` and ``read``) so tests drive it without sleeping::

    watcher = QueueConfigWatcher("queues.yaml")
    watcher.poll()            # Reload.LOADED; watcher.config is the configuration
    ...                       # the file is edited and breaks
    watcher.poll()            # Reload.REJECTED; watcher.config is unchanged, watcher.error says why

A change is noticed by the file's ``(mtime_ns, size, inode, device)``, read through symlinks; the
content hash then decides whether it really changed (an editor that rewrites the same bytes is not
a reload). The inode is there for Kubernetes: a ConfigMap mounted as a directory is updated by the
kubelet writing the new files into a new hidden directory and swapping the ``..data`` symlink to it
(``queues.yaml -> ..data/queues.yaml``), so the path names a new file at once, which may have the
old one's size and, on a coarse clock, its mtime. (Mount it as a directory: a ``subPath`` mount is
never updated.)
"""
from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable
from pathlib import Path

import yaml

from gpuq.yamlsafe import safe_load

from accounting.errors import QueueConfigError
from accounting.queue_rules import line_of
from accounting.queues import QueueConfig, parse_queue_config


class Reload(enum.Enum):
    UNCHANGED = "unchanged"
    LOADED = "loaded"        # a new configuration is in force
    REJECTED = "rejected"    # the file changed but is invalid: the last good one stays


def _stat(path: Path) -> tuple[int, ...] | None:
    try:
        st = path.stat()                 # follows the symlinks (a ConfigMap's ..data swap)
    except OSError:
        return None
    return st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev


def _read(path: Path) -> str:
    return path.read_text()


class QueueConfigWatcher:
    def __init__(self, path: str | Path, *, stat: Callable[[Path], tuple[int, ...] | None] = _stat,
                 read: Callable[[Path], str] = _read) -> None:
        self.path = Path(path)
        self._stat = stat
        self._read = read
        self._seen_stat: tuple[int, ...] | None = None
        self._seen_hash: str | None = None
        self.config: QueueConfig | None = None
        self.error: QueueConfigError | None = None
        self.generation = 0          # bumps at every LOADED

    def poll(self) -> Reload:
        stamp = self._stat(self.path)
        if stamp is None:
            return self._reject(QueueConfigError(str(self.path), "cannot read: file not found", file=str(self.path)),
                                None, None)
        if stamp == self._seen_stat:
            return Reload.UNCHANGED
        try:
            text = self._read(self.path)
        except OSError as exc:
            return self._reject(QueueConfigError(str(self.path), f"cannot read: {exc.strerror or exc}",
                                                 file=str(self.path)), stamp, None)
        digest = hashlib.sha256(text.encode()).hexdigest()
        if digest == self._seen_hash:
            self._seen_stat = stamp
            return Reload.UNCHANGED
        try:
            config = self._parse(text)
        except QueueConfigError as exc:
            return self._reject(exc, stamp, digest)
        self._seen_stat, self._seen_hash = stamp, digest
        self.config, self.error = config, None
        self.generation += 1
        return Reload.LOADED

    def _reject(self, err: QueueConfigError, stamp: tuple[int, ...] | None, digest: str | None) -> Reload:
        changed = (stamp, digest) != (self._seen_stat, self._seen_hash) or self.error is None
        self._seen_stat, self._seen_hash = stamp, digest
        self.error = err
        return Reload.REJECTED if changed else Reload.UNCHANGED

    def _parse(self, text: str) -> QueueConfig:
        file = str(self.path)
        try:
            data = safe_load(text) or {}
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            raise QueueConfigError(file, f"invalid YAML: {getattr(exc, 'problem', None) or exc}",
                                   file=file, line=mark.line + 1 if mark else None) from exc
        try:
            return parse_queue_config(data, source="queues", strict_top=True)
        except QueueConfigError as exc:
            exc.file, exc.line = file, line_of(text, exc.where)
            raise
