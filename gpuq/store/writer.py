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
succeeded. Nothing accepted is lost, nothing is written twice, in the tables nor in the rollups their
materialized views feed. A batch spilled by a writer that started before migration 0006 may have been
inserted before the rollups deduplicated replays: after replaying it the writer rebuilds the rollups
of its periods from the raw rows (:func:`gpuq.store.rebuild.rebuild_range`), and removes the file
only then (docs/SCHEMA.md, "Rollups exactly once").

Faults of the spill itself (disk full, read-only or missing directory: any ``OSError``): the
partial temporary file is removed and the batch is *held* in memory with its token, retried (insert,
then spill) at every flush. Held rows plus buffered rows are bounded by ``max_buffered_rows``; past
the bound the newest rows are dropped, logged and counted in ``stats.rows_dropped[(table,
"spill_failed")]`` (metric ``gpuq_collector_rows_dropped_total{table,reason}``). The directory is
fsynced after each rename, so a spilled file survives a power cut.

A spill file that cannot be read back (not UTF-8, a line that is not JSON, a row that is not a list
of the table's columns: say a truncated last line) is *quarantined*: moved whole to
``spill_dir/quarantine/<table>/<name>``, logged with its path and the first bad line number,
counted in ``stats.files_quarantined[table]``; the other files are replayed. A file is written
whole (temporary name, fsync, rename), so a bad one is corrupt and none of its lines is trusted:
it is not replayed in part. Temporary files older than ``STALE_TMP_S`` (a writer killed while
spilling) are removed at start.
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
from gpuq.store import rebuild
from gpuq.store.client import Store
from gpuq.store.migrate import Retention
from gpuq.store.schema import COLUMNS

log = logging.getLogger(__name__)

Row = Sequence[Any]
LAST_TABLES = ("collector_state",)
REBUILT_FROM = frozenset(source for source, _, _ in rebuild.ROLLUPS.values())   # tables with summed rollups
ROLLUPS_ONCE = 6              # the migration after which the rollups deduplicate replays
QUARANTINE = "quarantine"
STALE_TMP_S = 300.0           # a .tmp this old belongs to no live writer: removed at start


class BadSpillFile(ValueError):
    """A spill file that cannot be read back; ``lineno`` is the first bad line (0: not readable)."""

    def __init__(self, path: Path, lineno: int, why: str) -> None:
        super().__init__(f"{path}: line {lineno}: {why}" if lineno else f"{path}: {why}")
        self.path = path
        self.lineno = lineno


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
    # rows lost on purpose, by (table, reason): "spill_failed" = the store was down, the spill
    # failed too and the in-memory bound was reached (the newest rows go); "exit" = still held
    # in memory when the writer closed
    rows_dropped: dict[tuple[str, str], int] = field(default_factory=dict)
    files_quarantined: dict[str, int] = field(default_factory=dict)   # unreadable spill files
    spill_errors: int = 0                                                # failed spill attempts

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


def _read_spill(path: Path, width: int) -> list[Row]:
    """Rows of a spill file; :class:`BadSpillFile` names the first line that is not a JSON list of
    ``width`` values (a file is all or nothing)."""
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadSpillFile(path, _line_of(path, exc.start), f"not UTF-8 ({exc.reason})") from None
    if text and not text.endswith("\n"):
        # every row ends with a newline: a missing one means the file was cut short
        raise BadSpillFile(path, text.count("\n") + 1, "truncated: the last line has no newline")
    rows: list[Row] = []
    for lineno, line in enumerate(text.split("\n")[:-1], 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line, object_hook=_decode)
        except (ValueError, OverflowError, TypeError, OSError) as exc:   # a bad "$dt" too
            raise BadSpillFile(path, lineno, f"not JSON ({exc})") from None
        if not isinstance(row, list) or len(row) != width:
            got = f"{len(row)} values" if isinstance(row, list) else type(row).__name__
            raise BadSpillFile(path, lineno, f"expected a list of {width} values, got {got}")
        rows.append(row)
    return rows


def _line_of(path: Path, offset: int) -> int:
    """1-based line number of byte ``offset`` in ``path``."""
    with open(path, "rb") as fh:
        return fh.read(offset).count(b"\n") + 1


def _age(p: Path) -> tuple[int, str]:
    try:
        return p.stat().st_mtime_ns, p.name
    except OSError:
        return 0, p.name


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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
        self._dedup_since: float | None = None  # when the rollups started deduplicating (ms), read once
        self._buf: dict[str, list[Row]] = {}
        # batches neither inserted nor spilled (the spill failed): (table, rows, token), oldest
        # first; only touched under _flush_lock
        self._held: list[tuple[str, list[Row], str]] = []
        self._held_rows = 0
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
        if total + self._held_rows > self.max_buffered_rows:
            # the database is slow or down: keep memory bounded by spilling what we hold
            self._spill_all()

    def buffered(self) -> dict[str, int]:
        """Rows in memory by table: buffered, plus held after a failed spill."""
        with self._lock:
            out = {t: len(r) for t, r in self._buf.items() if r}
            for table, rows, _ in list(self._held):
                out[table] = out.get(table, 0) + len(rows)
            return out

    def held_rows(self) -> int:
        """Rows kept in memory because both the insert and the spill failed."""
        return self._held_rows

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
            held, self._held, self._held_rows = self._held, [], 0
            batches = list(held)
            for table, rows in self._take().items():
                for start in range(0, len(rows), self.batch_rows):
                    batches.append((table, rows[start:start + self.batch_rows], self._token()))
            down = False
            for table, chunk, token in batches:
                if down:                     # the store just failed: do not wait on it per batch
                    self._spill_or_hold(table, chunk, token)
                    continue
                try:
                    self._insert(table, chunk, token)
                except StoreQueryError as exc:
                    # the database refused these rows: keep them on disk for a human
                    log.error("insert into %s refused, spilling %d rows: %s", table, len(chunk), exc)
                    self._spill_or_hold(table, chunk, token)
                except StoreError as exc:
                    log.warning("store unavailable, spilling %d rows of %s: %s", len(chunk), table, exc)
                    down = True
                    self._spill_or_hold(table, chunk, token)
                else:
                    self.stats.rows_written[table] = self.stats.rows_written.get(table, 0) + len(chunk)
            if not down:
                self._replay_locked()

    def _spill_all(self) -> None:
        with self._flush_lock:
            held, self._held, self._held_rows = self._held, [], 0
            batches = held + [(t, r, self._token()) for t, r in self._take().items()]
            for table, rows, token in batches:
                self._spill_or_hold(table, rows, token)

    def _spill_or_hold(self, table: str, rows: list[Row], token: str) -> None:
        """Spill; if the disk fails, hold the batch in memory within the bound (caller holds
        _flush_lock). Past the bound the newest rows are dropped and counted."""
        try:
            self._spill(table, rows, token)
            return
        except OSError as exc:
            self.stats.spill_errors += 1
            log.error("spilling %d rows of %s to %s failed (%s): holding them in memory",
                      len(rows), table, self.spill_dir, exc)
        with self._lock:
            room = self.max_buffered_rows - self._held_rows - sum(len(b) for b in self._buf.values())
        keep = rows[:max(room, 0)]
        dropped = len(rows) - len(keep)
        if dropped:
            key = (table, "spill_failed")
            self.stats.rows_dropped[key] = self.stats.rows_dropped.get(key, 0) + dropped
            log.error("memory bound reached (store.max_buffered_rows=%d) with the store down and the "
                      "spill failing: dropped the newest %d rows of %s", self.max_buffered_rows,
                      dropped, table)
        if keep:
            # the token stays with the batch: a retried insert is deduplicated as before
            self._held.append((table, keep, token))
            self._held_rows += len(keep)

    def _spill(self, table: str, rows: Sequence[Row], token: str) -> None:
        folder = self.spill_dir / table
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{token}.jsonl"
        tmp = folder / f".{token}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                for row in rows:
                    fh.write(json.dumps(list(row), default=_encode, separators=(",", ":")))
                    fh.write("\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, final)
        except BaseException:
            # never leave a partial file behind (ENOSPC half way, an error in the rows ...)
            try:
                tmp.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cannot remove partial spill file %s: %s", tmp, exc)
            raise
        _fsync_dir(folder)       # the rename itself must survive a power cut
        self.stats.rows_spilled[table] = self.stats.rows_spilled.get(table, 0) + len(rows)

    def replay(self) -> int:
        """Insert spilled batches (oldest first) while the store takes them; return rows replayed."""
        with self._flush_lock:
            return self._replay_locked()

    def _replay_locked(self) -> int:
        if not self.spill_dir.exists():
            return 0
        files = sorted(self.spill_dir.glob("*/*.jsonl"), key=_age)
        done = 0
        for path in files:
            table = path.parent.name
            if table not in COLUMNS:                 # quarantined once, not logged at every flush
                self._quarantine(path, table, BadSpillFile(path, 0, f"names an unknown table {table!r}"))
                continue
            try:
                rows = _read_spill(path, len(COLUMNS[table]))
            except BadSpillFile as bad:
                self._quarantine(path, table, bad)
                continue
            except OSError as exc:          # vanished (another writer replayed it) or unreadable
                if path.exists():
                    log.error("cannot read spill file %s, left in place: %s", path, exc)
                continue
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
            try:
                self._repair_rollups(path.stem, table, rows)
            except StoreError as exc:
                log.warning("rollups of spilled batch %s not rebuilt yet, left in place: %s", path, exc)
                return done
            path.unlink()
            self._refused.discard(path)
            done += len(rows)
            self.stats.rows_replayed[table] = self.stats.rows_replayed.get(table, 0) + len(rows)
            self.stats.rows_written[table] = self.stats.rows_written.get(table, 0) + len(rows)
        return done

    def _repair_rollups(self, token: str, table: str, rows: Sequence[Row]) -> None:
        """A batch spilled by another writer that started before the store's rollups deduplicated
        (migration 0006) may have been inserted then: its replay was dropped by ``table`` but added
        to the rollups again. Rebuild them for the batch's periods (:func:`rebuild.rebuild_range`)."""
        if table not in REBUILT_FROM or token.startswith(self._id + "-"):
            return
        store = self._ensure_store()
        if self._dedup_since is None:
            got = store.query(f"SELECT count(), toUnixTimestamp64Milli(min(applied_at)) "
                              f"FROM {store.database}.schema_migrations WHERE version = {ROLLUPS_ONCE}").rows[0]
            self._dedup_since = float(got[1]) if got[0] else 0.0
        try:
            started_ms = int(token.split("-", 1)[0], 16)
        except ValueError:
            started_ms = 0                         # not a token of ours: assume the worst
        if started_ms >= self._dedup_since:
            return
        times = [t.timestamp() for t in (r[COLUMNS[table].index("ts")] for r in rows) if isinstance(t, dt.datetime)]
        if not times:
            return
        now = time.time()
        done = rebuild.rebuild_range(store, table, min(times), max(times), now,
                                     rebuild.store_raw_days(store, {t: Retention().raw_days for t in REBUILT_FROM}))
        log.warning("spilled batch %s predates the rollups' deduplication: rebuilt %s from %s for its "
                    "%d rows", token, ", ".join(done) or "nothing", table, len(rows))

    def _quarantine(self, path: Path, table: str, bad: BadSpillFile) -> None:
        dest_dir = self.spill_dir / QUARANTINE / table
        dest = dest_dir / path.name
        try:
            dest_dir.mkdir(parents=True, exist_ok=True)
            os.replace(path, dest)
            _fsync_dir(dest_dir)
        except OSError as exc:
            log.error("corrupt spill file %s (line %d: %s) could not be moved to %s: %s; it is "
                      "skipped", path, bad.lineno, bad, dest_dir, exc)
            if path in self._refused:
                return
            self._refused.add(path)          # counted once, skipped at each replay
        else:
            log.error("corrupt spill file %s quarantined to %s: %s", path, dest, bad)
        self.stats.files_quarantined[table] = self.stats.files_quarantined.get(table, 0) + 1

    def quarantined_files(self) -> list[Path]:
        q = self.spill_dir / QUARANTINE
        return sorted(q.glob("*/*.jsonl")) if q.exists() else []

    def _remove_stale_tmp(self) -> None:
        if not self.spill_dir.exists():
            return
        cutoff = time.time() - STALE_TMP_S
        for tmp in self.spill_dir.glob("*/.*.tmp"):
            try:
                if tmp.stat().st_mtime < cutoff:
                    tmp.unlink()
                    log.warning("removed the partial spill file %s left by a writer that died", tmp)
            except OSError:
                continue

    # -- background thread -------------------------------------------------------------------
    def start(self) -> BatchWriter:
        self._remove_stale_tmp()
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
        with self._flush_lock:
            for table, rows, _ in self._held:     # neither the store nor the disk took them
                key = (table, "exit")
                self.stats.rows_dropped[key] = self.stats.rows_dropped.get(key, 0) + len(rows)
                log.error("exiting with %d rows of %s neither written nor spilled (store down, spill "
                          "failing): they are lost", len(rows), table)
            self._held, self._held_rows = [], 0

    def __enter__(self) -> BatchWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
