"""Errors of the accounting package.

Hierarchy::

    AccountingError                 base; ``retryable`` says whether trying again can help
    ├── QueueConfigError            the queue file is invalid; ``where`` is the YAML path,
    │                               ``file``/``line`` where known (not retryable: fix the file)
    ├── QueueNotCreated             a placement rule could not make a namespace's queue (not retryable)
    ├── QueueImportError            gpuq import-queues cannot read a Kueue or YuniKorn source (not retryable)
    ├── TimeSpecError               a ``--from``/``--to`` value cannot be read (not retryable)
    └── AccountingQueryError        the store could not answer an accounting query (retryable)
"""
from __future__ import annotations


class AccountingError(Exception):
    retryable: bool = False


class QueueConfigError(AccountingError):
    """``where`` names the place (``queues.research.vision.max``), ``reason`` what is wrong there.

    ``str(err)`` is ``"<where>: <reason>"``; :meth:`located` prefixes the file and line when known.
    """

    def __init__(self, where: str, reason: str, file: str | None = None, line: int | None = None) -> None:
        self.where = where
        self.reason = reason
        self.file = file
        self.line = line
        super().__init__(f"{where}: {reason}")

    def located(self) -> str:
        if self.file is None:
            return str(self)
        at = f"{self.file}:{self.line}" if self.line else self.file
        return f"{at}: {self}"


class TimeSpecError(AccountingError):
    def __init__(self, value: str, reason: str) -> None:
        self.value = value
        self.reason = reason
        super().__init__(f"cannot read time {value!r}: {reason}")


class AccountingQueryError(AccountingError):
    retryable = True


class QueueNotCreated(AccountingError):
    """A placement rule could not make ``path`` (``reason``: the queue limit, or no room in the
    parent's guarantee); the work goes where it would without the rule."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"cannot make queue {path}: {reason}")


class QueueImportError(AccountingError):
    """A source that ``gpuq import-queues`` cannot read (:mod:`accounting.queue_import`): ``where``
    names the object or place (``ClusterQueue team-a (kueue.yaml, document 3): spec.cohortName``),
    ``reason`` what is wrong there. Not retryable: fix the source."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: {reason}")
