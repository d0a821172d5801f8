"""Errors of the gpuq shell (settings, store, CLI).

Hierarchy::

    GpuqError                       base; ``retryable`` says whether trying again can help
    ├── ConfigError                 a settings file or variable is invalid; ``where`` names it
    ├── UnsafeQuery                 ``gpuq query`` refused a statement that is not one plain read
    └── StoreError                  the ClickHouse store failed
        ├── StoreUnavailable        cannot reach the database (retryable)
        ├── StoreQueryError         the database refused a statement (not retryable)
        │   └── StoreDataError      ... for the values of the rows it was given: this batch can
        │                           never be written as it is, other batches can
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
    """The database cannot be reached, or said "not now" (overloaded, a replica without its
    coordinator): trying again later can help. ``unclassified``: the client failed in a way that
    names no cause (not a network error, not an answer of the database); it is taken as
    unavailability, which keeps the rows, and the writer checks that the store answers before it
    waits on it (a store that answers was not the cause)."""

    retryable = True

    def __init__(self, message: str, *, unclassified: bool = False) -> None:
        super().__init__(message)
        self.unclassified = unclassified


class StoreQueryError(StoreError):
    pass


class StoreDataError(StoreQueryError):
    """The database, or its client while encoding them, refused rows for their values ("t":
    "not-a-number" for a Float64, None in a non-Nullable column, a text it cannot parse): the same
    rows will be refused again, other rows will not. The writer quarantines such a batch and goes on
    (:mod:`gpuq.store.writer`); a refusal that is not about the rows (a missing table, a read-only
    user) stays a plain :class:`StoreQueryError` and the batch waits for the cause to be fixed."""


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
