"""A thin adapter over clickhouse-connect: one ``Store`` for chDB (embedded) and HTTP servers.

``chdb://PATH`` opens the real ClickHouse engine in-process on a data directory
(``chdb:///var/lib/gpuq`` is absolute, ``chdb://.gpuq/data`` relative to the working directory);
``http(s)://user:pass@host:8123/db`` talks to a server. A ``?database=NAME`` query parameter
(or the path of an HTTP DSN) picks the database; it defaults to ``gpuq``.

chDB allows one data path per process at a time: close a store before opening another path.
The engine is shared by every Store on the same path, and calls are serialised with a lock.

``cluster`` (``store.cluster``, HTTP DSNs only) names the ClickHouse cluster the schema lives on
(:mod:`gpuq.store.cluster`): inserts and commands then carry ``insert_distributed_sync = 1`` (an
insert into a Distributed table returns once every shard has its rows) and
``allow_nondeterministic_mutations = 1`` (the one mutation, pruning ``gpu_allocations_open``,
selects its rows with a subquery), and :meth:`Store.mutation_target` names the local tables.
"""
from __future__ import annotations

import re
import struct
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from gpuq.errors import ConfigError, StoreDataError, StoreError, StoreQueryError, StoreUnavailable

_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# An insert with a dedup token: dropped by the table it names when that token is in its window, and
# by each materialized view's target too (the view's block is named after the token and the view):
# without the second setting a replayed batch was dropped in gpu_samples but summed again into
# gpu_samples_1m. Its default is 1 on recent servers, 0 on older ones: sent explicitly. The targets
# need a window of their own (migration 0006, docs/SCHEMA.md "Rollups exactly once").
DEDUP_SETTINGS: dict[str, Any] = {"insert_deduplicate": 1, "deduplicate_blocks_in_dependent_materialized_views": 1}
_LOCK = threading.RLock()

# ClickHouse error codes (src/Common/ErrorCodes.cpp) by what they mean for the statement that got
# them. The rows' values: the same rows are refused again, other rows are not.
DATA_CODES = frozenset({
    6,    # CANNOT_PARSE_TEXT
    26,   # CANNOT_PARSE_QUOTED_STRING
    27,   # CANNOT_PARSE_INPUT_ASSERTION_FAILED
    38,   # CANNOT_PARSE_DATE
    41,   # CANNOT_PARSE_DATETIME
    70,   # CANNOT_CONVERT_TYPE
    72,   # CANNOT_PARSE_NUMBER
    117,  # INCORRECT_DATA
    131,  # TOO_LARGE_STRING_SIZE
    190,  # SIZES_OF_ARRAYS_DOESNT_MATCH
    321,  # VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE
    349,  # CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN
    376,  # CANNOT_PARSE_UUID
    467,  # CANNOT_PARSE_BOOL
    469,  # VIOLATED_CONSTRAINT
})
# The database is there but cannot take the statement now: trying again later can help.
TRANSIENT_CODES = frozenset({
    159,  # TIMEOUT_EXCEEDED
    202,  # TOO_MANY_SIMULTANEOUS_QUERIES
    203,  # NO_FREE_CONNECTION
    209,  # SOCKET_TIMEOUT
    210,  # NETWORK_ERROR
    225,  # NO_ZOOKEEPER
    236,  # ABORTED
    241,  # MEMORY_LIMIT_EXCEEDED
    242,  # TABLE_IS_READ_ONLY (a replica that lost its coordinator)
    243,  # NOT_ENOUGH_SPACE
    252,  # TOO_MANY_PARTS
    279,  # ALL_CONNECTION_TRIES_FAILED
    285,  # TOO_FEW_LIVE_REPLICAS
    319,  # UNKNOWN_STATUS_OF_INSERT
    394,  # QUERY_WAS_CANCELLED
    439,  # CANNOT_SCHEDULE_TASK
    999,  # KEEPER_EXCEPTION
})
# What the client raises while encoding rows it cannot put in the columns' types: "not-a-number"
# for a Float64 (ValueError), a dict for a String (TypeError), a number for a DateTime64
# (AttributeError), a surrogate in a string (UnicodeEncodeError is a ValueError) ...
_ENCODING = (ValueError, TypeError, AttributeError, KeyError, IndexError, OverflowError, struct.error)
_CODE = re.compile(r"\bCode: (\d+)\b")


def classify(exc: BaseException, where: str, rows: bool = False) -> StoreError:
    """The :class:`StoreError` that says what ``exc`` (raised by clickhouse-connect or chDB for a
    statement; ``where`` names it) means. In this order: a ClickHouse error code of
    :data:`DATA_CODES` is bad data and one of :data:`TRANSIENT_CODES` a store to try again later,
    wherever it was raised; the client's ``DataError``, and for an insert (``rows``) any error of
    encoding the values, is bad data; a failure to talk to the database (``OperationalError``, an
    ``OSError``, a broken HTTP exchange) is unavailability, and so is anything else unknown, marked
    ``unclassified``; any other answer of the database is a refusal (a missing table, a syntax
    error, a permission)."""
    from http.client import HTTPException

    from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError
    from urllib3.exceptions import HTTPError

    text = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
    code = getattr(exc, "code", None)
    if not isinstance(code, int):
        m = _CODE.search(str(exc)[:2000])
        code = int(m.group(1)) if m else None
    if code in DATA_CODES:
        return StoreDataError(f"{where}: {text}")
    if code in TRANSIENT_CODES:
        return StoreUnavailable(f"{where}: {text}")
    if isinstance(exc, DataError) or (rows and isinstance(exc, _ENCODING) and not isinstance(exc, DatabaseError)):
        return StoreDataError(f"{where}: {type(exc).__name__}: {text}")
    if isinstance(exc, (ValueError, TypeError, OverflowError)) and not isinstance(exc, DatabaseError):
        return StoreQueryError(f"{where}: {type(exc).__name__}: {text}")   # a value in a query's parameters
    if isinstance(exc, (OperationalError, OSError, EOFError, HTTPException, HTTPError)):
        return StoreUnavailable(f"{where}: {text}")
    if not isinstance(exc, DatabaseError):
        return StoreUnavailable(f"{where}: {type(exc).__name__}: {text}", unclassified=True)
    return StoreQueryError(f"{where}: {text}")


@dataclass(frozen=True, slots=True)
class Dsn:
    kind: str            # "chdb" or "http"
    target: str          # chdb: absolute data path; http: the DSN without the database query
    database: str

    @property
    def display(self) -> str:
        """The DSN without a password, for messages."""
        return mask_dsn(self.target)


_SECRET_PARAMS = frozenset({"password", "pass", "pwd", "passwd", "secret", "token", "access_token",
                            "access_key", "secret_key", "key"})


def mask_dsn(dsn: str) -> str:
    """``dsn`` with every password replaced by ``***``: the user-info password (up to the *last*
    ``@`` of the part before the query, so a password holding ``@``, ``/`` or ``:`` is hidden
    whole; an empty user too: ``http://:pw@host``) and secret query parameters
    (``?password=...``). Never raises: anything unparseable after ``://`` is hidden entirely."""
    scheme, sep, rest = dsn.partition("://")
    if not sep:
        return dsn if "@" not in dsn and "password" not in dsn.lower() else "***"
    head, qsep, query = rest.partition("?")
    if "@" in head:
        userinfo, host = head.rsplit("@", 1)
        user = userinfo.split(":", 1)[0]
        head = f"{user}:***@{host}" if ":" in userinfo else f"{userinfo}@{host}"
    if qsep:
        params = []
        for item in query.split("&"):
            key, eq, value = item.partition("=")
            params.append(f"{key}=***" if eq and key.strip().lower() in _SECRET_PARAMS else item)
        query = "&".join(params)
    return f"{scheme}://{head}{qsep}{query}"


def parse_dsn(dsn: str, default_database: str = "gpuq") -> Dsn:
    parts = urlsplit(dsn)
    query = parse_qs(parts.query)
    database = (query.get("database") or [""])[0]
    if parts.scheme == "chdb":
        raw = dsn[len("chdb://"):].split("?", 1)[0]
        if not raw:
            raise ConfigError("store.dsn", f"chdb DSN needs a data path, got {mask_dsn(dsn)!r}")
        path = Path(raw).expanduser().resolve()
        kind, target = "chdb", str(path)
    elif parts.scheme in ("http", "https"):
        kind = "http"
        database = database or parts.path.strip("/")
        target = dsn.split("?", 1)[0]
    else:
        raise ConfigError("store.dsn", f"unknown scheme {parts.scheme!r} in {mask_dsn(dsn)!r}: use chdb:// or http(s)://")
    database = database or default_database
    if not _IDENT.match(database):
        if "@" in database or ":" in database:      # a password with '/' in it: do not echo it
            raise ConfigError("store.dsn", "invalid database name after the host: URL-encode a password "
                                           "holding '/' (%2F), '?' (%3F) or '#' (%23)")
        raise ConfigError("store.dsn", f"invalid database name {database!r}")
    return Dsn(kind=kind, target=target, database=database)


@dataclass(frozen=True, slots=True)
class Result:
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]

    def dicts(self) -> list[dict[str, Any]]:
        return [dict(zip(self.columns, r)) for r in self.rows]


class Store:
    """Query, insert and run DDL against one database. Thread-safe."""

    def __init__(self, dsn: Dsn, client: Any, cluster: str = "") -> None:
        from gpuq.store.cluster import check_cluster_name

        self.dsn = dsn
        self.database = dsn.database
        self.cluster = check_cluster_name(cluster) if cluster else ""
        self._client = client
        self._closed = False
        self._write_settings: dict[str, Any] = (
            {"insert_distributed_sync": 1, "allow_nondeterministic_mutations": 1} if cluster else {})

    def mutation_target(self, table: str) -> str:
        """The table a ``DELETE``/``OPTIMIZE`` of ``table`` names: ``db.table``, or on a cluster the
        replicated local tables of every shard (a Distributed table takes neither)."""
        if not self.cluster:
            return f"{self.database}.{table}"
        from gpuq.store.cluster import local_name, on_cluster

        return f"{self.database}.{local_name(table)}{on_cluster(self.cluster)}"

    # -- errors --------------------------------------------------------------------------
    def _wrap(self, exc: Exception, what: str, rows: bool = False) -> Exception:
        """``exc`` as a :class:`StoreError` classed by what it means (issue 17), not by where it was
        raised: :class:`StoreUnavailable` when trying again later can help, :class:`StoreDataError`
        when the rows are the cause, :class:`StoreQueryError` for any other refusal. ``rows``: the
        call sent rows (an insert), whose encoding by the client can fail only because of them."""
        return classify(exc, f"{self.dsn.display}: {what}", rows)

    def query(self, sql: str, parameters: Mapping[str, Any] | None = None,
              settings: Mapping[str, Any] | None = None) -> Result:
        try:
            with _LOCK:
                r = self._client.query(sql, parameters=dict(parameters or {}), settings=dict(settings or {}))
            return Result(tuple(r.column_names), list(r.result_rows))
        except Exception as exc:  # noqa: BLE001 - re-raised as a StoreError
            raise self._wrap(exc, "query failed") from exc

    def read_only_query(self, sql: str) -> Result:
        """A user's statement (``gpuq query``): refused unless it is one plain read
        (:func:`gpuq.store.readonly.check_read_only`), then run with ``readonly=1`` as a second layer."""
        from gpuq.store.readonly import check_read_only

        return self.query(check_read_only(sql), settings={"readonly": 1})

    def command(self, sql: str, parameters: Mapping[str, Any] | None = None,
                settings: Mapping[str, Any] | None = None) -> Any:
        try:
            with _LOCK:
                return self._client.command(sql, parameters=dict(parameters or {}),
                                            settings={**self._write_settings, **(settings or {})})
        except Exception as exc:  # noqa: BLE001
            raise self._wrap(exc, "command failed") from exc

    def insert(self, table: str, rows: Sequence[Sequence[Any]], columns: Sequence[str],
               dedup_token: str | None = None) -> int:
        """Insert rows; with ``dedup_token`` a repeated insert of the same batch is a no-op, in
        ``table`` and in the rollups its materialized views feed (:data:`DEDUP_SETTINGS`)."""
        if not rows:
            return 0
        settings: dict[str, Any] = dict(self._write_settings)
        if dedup_token:
            settings |= {**DEDUP_SETTINGS, "insert_deduplication_token": dedup_token}
        try:
            with _LOCK:
                self._client.insert(f"{self.database}.{table}", rows, column_names=list(columns),
                                    settings=settings)
        except Exception as exc:  # noqa: BLE001
            raise self._wrap(exc, f"insert into {table} failed", rows=True) from exc
        return len(rows)

    def use_database(self) -> None:
        """Make unqualified table names resolve in this store's database (it must exist)."""
        with _LOCK:
            self._client.database = self.database

    def ping(self) -> bool:
        try:
            self.query("SELECT 1")
            return True
        except StoreUnavailable:
            return False

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            with _LOCK:
                try:
                    self._client.close()
                except Exception:  # noqa: BLE001 - closing a dead connection is fine
                    pass

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(dsn: str | Dsn, default_database: str = "gpuq", connect_timeout_s: float = 5.0,
            cluster: str = "") -> Store:
    """Open a store (no schema work). Raises StoreUnavailable if the target cannot be reached.
    ``cluster`` (``store.cluster``) needs a ClickHouse server: chDB has no Replicated tables."""
    import clickhouse_connect

    d = dsn if isinstance(dsn, Dsn) else parse_dsn(dsn, default_database)
    if cluster and d.kind == "chdb":
        raise ConfigError("store.cluster", f"is {cluster!r} but store.dsn is chDB ({d.display}): a cluster "
                                           f"needs a ClickHouse server (an http(s):// DSN)")
    try:
        with _LOCK:
            if d.kind == "chdb":
                Path(d.target).mkdir(parents=True, exist_ok=True)
                client = clickhouse_connect.get_client(dsn=f"chdb://{d.target}")
            else:
                client = clickhouse_connect.get_client(
                    dsn=d.target, database="default", connect_timeout=connect_timeout_s,
                    send_receive_timeout=30, autogenerate_session_id=False)
    except Exception as exc:  # noqa: BLE001
        msg = str(exc).strip().splitlines()[0][:500] if str(exc).strip() else type(exc).__name__
        raise StoreUnavailable(f"{d.display}: cannot open store: {msg}") from exc
    return Store(d, client, cluster)
