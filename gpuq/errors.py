"""Errors of the gpuq shell (settings, store, CLI).

Hierarchy::

    GpuqError                       base; ``retryable`` says whether trying again can help
    ├── ConfigError                 a settings file or variable is invalid; ``where`` names it
    ├── UnsafeQuery                 ``gpuq query`` refused a statement that is not one plain read
    └── StoreError                  the ClickHouse store failed
        ├── StoreUnavailable        cannot reach the database (retryable)
        ├── StoreQueryError         the database refused a statement (not retryable)
        └── MigrationError          a schema migration failed; ``version`` names it
"""
from __future__ import annotations


class GpuqError(Exception):
    retryable: bool = False


class ConfigError(GpuqError):
    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"{where}: {reason}")


class UnsafeQuery(GpuqError):
    """A user's statement is not one plain read (``gpuq.store.readonly``); ``where`` is the line and
    column of the offending token. Nothing was sent to the store."""

    def __init__(self, where: str, reason: str) -> None:
        self.where = where
        self.reason = reason
        super().__init__(f"refused at {where}: {reason}")


class StoreError(GpuqError):
    pass


class StoreUnavailable(StoreError):
    retryable = True


class StoreQueryError(StoreError):
    pass


class MigrationError(StoreError):
    def __init__(self, version: int, message: str) -> None:
        self.version = version
        super().__init__(f"migration {version:04d}: {message}")


def shown(value: object, limit: int = 200) -> str:
    """``repr(value)`` for an error message, at most about ``limit`` characters (a value from a
    hostile file can be huge once expanded: issue 17); a large container's repr is never built
    whole (``reprlib``: a few items per level, a few levels)."""
    import reprlib

    r = reprlib.Repr()
    r.maxlevel, r.maxlist, r.maxtuple, r.maxdict, r.maxset = 3, 8, 8, 8, 8
    r.maxstring = r.maxother = r.maxlong = limit
    text = r.repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
