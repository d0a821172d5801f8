"""Batched, retried, spill-to-disk writes into the store.

Collectors call :meth:`BatchWriter.write` with rows for a table; rows are buffered per table and
flushed when a table holds ``batch_rows`` rows or every ``batch_interval_s`` (background thread).
Each flushed batch gets a dedup token (``<writer id>-<seq>``) that ClickHouse remembers
(``insert_deduplication_token``; the tables keep a deduplication window), so a batch retried
after an ambiguous failure is written once.

When the database stays down for ``retry_attempts`` tries, the batch is spilled to
``spill_dir/<table>/<token>.jsonl`` (written to a temporary name, fsynced, then renamed, so a
kill leaves either a whole file or none). Spilled batches are replayed oldest first, with their
token, at start and after each successful flush; a file is removed only after its insert
succeeded. Nothing accepted is lost, nothing is written twice.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuq.errors import StoreError, StoreQueryError
from gpuq.store.client import Store
from gpuq.store.schema import COLUMNS

log = logging.getLogger(__name__)

Row = Sequence[Any]
LAST_TABLES = ("collector_state",)


@dataclass(slots=True)
class WriterStats:
    """Counters the collector exports as its own health metrics."""

    rows_written: dict[str, int]
    rows_spilled: dict[str, int]
    rows_replayed: dict[str, int]
    write_errors: int = 0
    # rows the database refused (not retryable: bad rows or schema), by table: they stay in the
    # spill directory, retried at each replay; each batch counts once
    rows_refused: dict[str, int] = field(default_factory=dict)

    @classmethod
    def empty(cls) -> WriterStats:
        return cls({}, {}, {})


def _encode(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return {"$dt": value.timestamp()}
    raise TypeError(f"cannot spill value of type {type(value).__name__}")


def _decode(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and "$dt" in obj:
        return dt.datetime.fromtimestamp(obj["$dt"], tz=dt.timezone.utc)
    return obj


class BatchWriter:
    def __init__(
        self,
        store: Store | Callable[[], Store] | None,
        spill_dir: str | Path,
        *,
        batch_rows: int = 50_000,
        batch_interval_s: float = 2.0,
        retry_attempts: int = 3,
        retry_backoff_s: float = 0.5,
        max_buffered_rows: int = 1_000_000,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        # a factory lets the writer start while the database is down and connect later
        self._connect: Callable[[], Store] | None = None
        self.store: Store | None = None
        if isinstance(store, Store) or store is None:
            self.store = store
        else:
            self._connect = store
        self.spill_dir = Path(spill_dir)
        self.batch_rows = batch_rows
        self.batch_interval_s = batch_interval_s
        self.retry_attempts = retry_attempts
        self.retry_backoff_s = retry_backoff_s
        self.max_buffered_rows = max_buffered_rows
        self.stats = WriterStats.empty()
        self._sleep = sleep
        self._id = f"{int(time.time() * 1000):x}-{secrets.token_hex(4)}"
        self._seq = 0
        self._refused: set[Path] = set()       # spill files the database refused (counted once)
        self._buf: dict[str, list[Row]] = {}
        self._lock = threading.Lock()          # guards _buf
        self._flush_lock = threading.Lock()    # one flush at a time
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- producer side -------------------------------------------------------------------
    def write(self, table: str, rows: Sequence[Row]) -> None:
        if table not in COLUMNS:
            raise StoreQueryError(f"unknown table {table!r}")
        if not rows:
            return
        with self._lock:
            buf = self._buf.setdefault(table, [])
            buf.extend(rows)
            size = len(buf)
            total = sum(len(b) for b in self._buf.values())
        if size >= self.batch_rows:
            self._wake.set()
        if total > self.max_buffered_rows:
            # the database is slow or down: keep memory bounded by spilling what we hold
            self._spill_all()

    def buffered(self) -> dict[str, int]:
        with self._lock:
            return {t: len(r) for t, r in self._buf.items() if r}

    def spilled_files(self) -> int:
        return sum(1 for _ in self.spill_dir.glob("*/*.jsonl")) if self.spill_dir.exists() else 0

    # -- flushing --------------------------------------------------------------------------
    def _take(self) -> dict[str, list[Row]]:
        """Everything buffered, with ``collector_state`` last: a resume point must never be
        stored ahead of the rows it covers (a crash between tables would then skip them)."""
        with self._lock:
            taken = {t: r for t, r in self._buf.items() if r and t not in LAST_TABLES}
            taken.update({t: self._buf[t] for t in LAST_TABLES if self._buf.get(t)})
            self._buf = {}
        return taken

    def _token(self) -> str:
        self._seq += 1
        return f"{self._id}-{self._seq:08d}"

    def _ensure_store(self) -> Store:
        if self.store is None:
            if self._connect is None:
                raise StoreError("no store configured")
            self.store = self._connect()    # raises StoreUnavailable while the database is down
        return self.store

    def _insert(self, table: str, rows: Sequence[Row], token: str) -> None:
        delay = self.retry_backoff_s
        for attempt in range(1, self.retry_attempts + 1):
            try:
                self._ensure_store().insert(table, rows, COLUMNS[table], dedup_token=token)
                return
            except StoreError as exc:
                self.stats.write_errors += 1
                if not exc.retryable or attempt == self.retry_attempts:
                    raise
                log.warning("insert into %s failed (attempt %d/%d): %s", table, attempt,
                            self.retry_attempts, exc)
                self._sleep(delay)
                delay *= 2

    def flush(self) -> None:
        """Write everything buffered now; spill what the database will not take."""
        with self._flush_lock:
            for table, rows in self._take().items():
                for start in range(0, len(rows), self.batch_rows):
                    chunk = rows[start:start + self.batch_rows]
                    token = self._token()
                    try:
                        self._insert(table, chunk, token)
                    except StoreQueryError as exc:
                        # the database refused these rows: keep them on disk for a human
                        log.error("insert into %s refused, spilling %d rows: %s", table, len(chunk), exc)
                        self._spill(table, chunk, token)
                    except StoreError as exc:
                        log.warning("store unavailable, spilling %d rows of %s: %s", len(chunk), table, exc)
                        self._spill(table, chunk, token)
                    else:
                        self.stats.rows_written[table] = self.stats.rows_written.get(table, 0) + len(chunk)
            self._replay_locked()

    def _spill_all(self) -> None:
        with self._flush_lock:
            for table, rows in self._take().items():
                self._spill(table, rows, self._token())

    def _spill(self, table: str, rows: Sequence[Row], token: str) -> None:
        folder = self.spill_dir / table
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{token}.jsonl"
        tmp = folder / f".{token}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(list(row), default=_encode, separators=(",", ":")))
                fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
        self.stats.rows_spilled[table] = self.stats.rows_spilled.get(table, 0) + len(rows)

    def replay(self) -> int:
        """Insert spilled batches (oldest first) while the store takes them; return rows replayed."""
        with self._flush_lock:
            return self._replay_locked()

    def _replay_locked(self) -> int:
        if not self.spill_dir.exists():
            return 0
        files = sorted(self.spill_dir.glob("*/*.jsonl"), key=lambda p: (p.stat().st_mtime_ns, p.name))
        done = 0
        for path in files:
            table = path.parent.name
            if table not in COLUMNS:
                log.error("spill file %s names unknown table %r: left in place", path, table)
                continue
            with open(path, encoding="utf-8") as fh:
                rows = [json.loads(line, object_hook=_decode) for line in fh if line.strip()]
            try:
                self._insert(table, rows, path.stem)
            except StoreQueryError as exc:
                if path not in self._refused:
                    self._refused.add(path)
                    self.stats.rows_refused[table] = self.stats.rows_refused.get(table, 0) + len(rows)
                    log.error("spilled batch %s refused by the database, left in place: %s", path, exc)
                continue
            except StoreError:
                return done          # still down: try again later
            path.unlink()
            self._refused.discard(path)
            done += len(rows)
            self.stats.rows_replayed[table] = self.stats.rows_replayed.get(table, 0) + len(rows)
            self.stats.rows_written[table] = self.stats.rows_written.get(table, 0) + len(rows)
        return done

    # -- background thread -------------------------------------------------------------------
    def start(self) -> BatchWriter:
        self.replay()
        self._thread = threading.Thread(target=self._run, name="gpuq-writer", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.batch_interval_s)
            self._wake.clear()
            try:
                self.flush()
            except Exception:  # noqa: BLE001 - the writer thread must survive anything
                log.exception("writer flush failed")

    def close(self) -> None:
        """Stop the thread and flush what is held (spilling it if the store is down)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush()

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
