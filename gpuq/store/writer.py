"""Batched, retried, spill-to-disk writes into the store.

Collectors call :meth:`BatchWriter.write` with rows for a table; rows are buffered per table and
flushed when a table holds ``batch_rows`` rows or every ``batch_interval_s`` (background thread).
Each flushed batch gets a dedup token (``<writer id>-<seq>``) that ClickHouse remembers
(``insert_deduplication_token``; the tables keep a deduplication window), so a batch retried
after an ambiguous failure is written once.

When the database stays down for ``retry_attempts`` tries, the batch is spilled to
``spill_dir/<table>/<token>.jsonl`` (written to a temporary name, fsynced, then renamed, so a
kill leaves either a whole file or none; the format, with its row count and checksum, is in
:mod:`gpuq.store.spillfile`). Spilled batches are replayed oldest first, with their token, at
start and after each successful flush; a file is removed only after its insert succeeded. Nothing
accepted is lost, nothing is written twice, in the tables nor in the rollups their materialized
views feed. A batch spilled by a writer that started before migration 0006 may have been inserted
before the rollups deduplicated replays: after replaying it the writer rebuilds the rollups of its
periods from the raw rows (:func:`gpuq.store.rebuild.rebuild_range`), and removes the file only
then (docs/SCHEMA.md, "Rollups exactly once").

Errors are classed by what they mean (:func:`gpuq.store.client.classify`), and no batch blocks the
others (issue 17):

* the store is *unavailable* (:class:`StoreUnavailable`): the batch is spilled and the flush
  spills the rest without waiting on the store again; a replay stops there, to go on later. When
  the client failed in a way that names no cause (``unclassified``) and the store answers a
  ping, the failure is that batch's: it is left waiting and the others go on;
* the store refuses the rows *for their values* (:class:`StoreDataError`: a value the client
  cannot encode, a text the database cannot parse): the batch is *quarantined* with its reason,
  on a live insert as on a replay, and the others go on;
* the store refuses for a cause outside the rows (:class:`StoreQueryError`: a missing table, a
  read-only user): the batch waits in the spill directory, counted once in
  ``stats.rows_refused``, retried at each replay (written once the cause is fixed).

Faults of the spill itself (disk full, read-only or missing directory: any ``OSError``): the
partial temporary file is removed and the batch is *held* in memory with its token, retried (insert,
then spill) at every flush. Held rows plus buffered rows are bounded by ``max_buffered_rows``; past
the bound the newest rows are dropped, logged and counted in ``stats.rows_dropped[(table,
"spill_failed")]`` (metric ``gpuq_collector_rows_dropped_total{table,reason}``). The directory is
fsynced after each rename, so a spilled file survives a power cut.

The quarantine, ``spill_dir/quarantine/<table>/``, holds batches refused for their values and spill
files that cannot be read back (not UTF-8, a line that is not JSON, a row of the wrong width, a
last line cut short, a format-2 file without its trailer or whose count or checksum does not
match, a folder that names no table: moved there once, not logged at every flush). Each file
there has a reason file next to it (``<name>.reason``), is logged with its path (and first bad
line), counted in ``stats.files_quarantined[table]`` when it arrives, and in the gauge of files
there now (:meth:`BatchWriter.quarantined_by_table`). A file is written whole, so a bad one is
corrupt and none of its lines is trusted: it is not replayed in part. ``gpuq spill list`` shows the
files and ``gpuq spill replay`` retries them (:meth:`BatchWriter.replay_paths`). Temporary files
older than ``STALE_TMP_S`` (a writer killed while spilling) are removed at start.
"""
from __future__ import annotations

import datetime as dt
import enum
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuq.errors import StoreDataError, StoreError, StoreQueryError, StoreUnavailable
from gpuq.store import rebuild
from gpuq.store.client import Store
from gpuq.store.migrate import Retention
from gpuq.store.schema import COLUMNS
from gpuq.store.spillfile import (QUARANTINE, BadSpillFile, Reason, is_quarantined, quarantined,
                                  quarantined_by_table, read_batch, read_reason, reason_path, waiting,
                                  write_batch, write_reason)

log = logging.getLogger(__name__)

Row = Sequence[Any]
LAST_TABLES = ("collector_state",)
REBUILT_FROM = frozenset(source for source, _, _ in rebuild.ROLLUPS.values())   # tables with summed rollups
ROLLUPS_ONCE = 6              # the migration after which the rollups deduplicate replays
STALE_TMP_S = 300.0           # a .tmp this old belongs to no live writer: removed at start
__all__ = ["QUARANTINE", "BadSpillFile", "BatchWriter", "Outcome", "WriterStats"]


class Outcome(str, enum.Enum):
    """What one replay of a spill file did (:meth:`BatchWriter.replay_paths`)."""

    REPLAYED = "replayed"          # the store took it; the file is gone
    QUARANTINED = "quarantined"    # refused for its values or unreadable: in quarantine with its reason
    WAITING = "waiting"            # refused for a cause outside the rows: left where it was
    GONE = "gone"                  # not there any more (another writer replayed it)


@dataclass(slots=True)
class WriterStats:
    """Counters the collector exports as its own health metrics."""

    rows_written: dict[str, int]
    rows_spilled: dict[str, int]
    rows_replayed: dict[str, int]
    write_errors: int = 0
    # rows the database refused for a cause outside them (a missing table, a permission), by
    # table: they stay in the spill directory, retried at each replay; each batch counts once
    rows_refused: dict[str, int] = field(default_factory=dict)
    # rows lost on purpose, by (table, reason): "spill_failed" = the store was down, the spill
    # failed too and the in-memory bound was reached (the newest rows go); "exit" = still held
    # in memory when the writer closed
    rows_dropped: dict[tuple[str, str], int] = field(default_factory=dict)
    # files moved to the quarantine (refused for their values, or unreadable), by table: a counter
    files_quarantined: dict[str, int] = field(default_factory=dict)
    spill_errors: int = 0                                                # failed spill attempts

    @classmethod
    def empty(cls) -> WriterStats:
        return cls({}, {}, {})


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
        return sum(1 for _ in self.spill_dir.glob("*/*.jsonl")) if self.spill_dir.is_dir() else 0

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

    def _insert(self, table: str, rows: Sequence[Row], token: str,
                columns: Sequence[str] | None = None) -> None:
        delay = self.retry_backoff_s
        for attempt in range(1, self.retry_attempts + 1):
            try:
                self._ensure_store().insert(table, rows, columns or COLUMNS[table], dedup_token=token)
                return
            except StoreError as exc:
                self.stats.write_errors += 1
                if not exc.retryable or attempt == self.retry_attempts:
                    raise
                log.warning("insert into %s failed (attempt %d/%d): %s", table, attempt,
                            self.retry_attempts, exc)
                self._sleep(delay)
                delay *= 2

    def _down(self, exc: StoreError) -> bool:
        """Whether ``exc`` (the last try of an insert failed with it) means the store is down. An
        ``unclassified`` failure is checked: a store that answers a ping was not its cause."""
        if not isinstance(exc, StoreUnavailable) or not exc.unclassified or self.store is None:
            return True
        try:
            return not self.store.ping()
        except StoreError:
            return True

    def flush(self) -> None:
        """Write everything buffered now; spill what the database will not take, quarantine what
        it refuses for its values."""
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
                except StoreDataError as exc:
                    # these rows will be refused again, the next batches will not: set them aside
                    self._quarantine_batch(table, chunk, token, exc)
                except StoreQueryError as exc:
                    # refused for a cause outside the rows (schema, permissions): they wait on disk
                    log.error("insert into %s refused, spilling %d rows: %s", table, len(chunk), exc)
                    self._spill_or_hold(table, chunk, token)
                except StoreError as exc:
                    if self._down(exc):
                        log.warning("store unavailable, spilling %d rows of %s: %s", len(chunk), table, exc)
                        down = True
                    else:
                        log.error("insert of %d rows into %s failed though the store answers, spilling "
                                  "them: %s", len(chunk), table, exc)
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
        self._hold(table, rows, token)

    def _hold(self, table: str, rows: list[Row], token: str) -> None:
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

    def _write_file(self, folder: Path, table: str, rows: Sequence[Row], token: str) -> Path:
        """``folder/<token>.jsonl`` in the current format, whole or not at all (temporary name,
        fsync, rename, fsync of the folder)."""
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / f"{token}.jsonl"
        tmp = folder / f".{token}.tmp"
        try:
            with open(tmp, "wb") as fh:
                write_batch(fh, table, COLUMNS[table], rows)
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
        return final

    def _spill(self, table: str, rows: Sequence[Row], token: str) -> None:
        self._write_file(self.spill_dir / table, table, rows, token)
        self.stats.rows_spilled[table] = self.stats.rows_spilled.get(table, 0) + len(rows)

    def _quarantine_batch(self, table: str, rows: list[Row], token: str, exc: StoreError) -> None:
        """A live batch the store refused for its values: written straight to the quarantine with
        its reason (the reason first: a file there always has one). If the disk fails, the batch
        is held like any other and tried again at the next flush."""
        folder = self.spill_dir / QUARANTINE / table
        dest = folder / f"{token}.jsonl"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            write_reason(dest, Reason("refused", str(exc), rows=len(rows), at=time.time()))
            self._write_file(folder, table, rows, token)
        except OSError as err:
            self.stats.spill_errors += 1
            try:
                reason_path(dest).unlink(missing_ok=True)      # no reason without its file
            except OSError:
                pass
            log.error("insert of %d rows into %s refused for their values (%s); writing them to the "
                      "quarantine %s failed (%s): holding them in memory", len(rows), table, exc, folder, err)
            self._hold(table, rows, token)
            return
        self.stats.files_quarantined[table] = self.stats.files_quarantined.get(table, 0) + 1
        log.error("insert of %d rows into %s refused for their values: batch quarantined to %s, the "
                  "next batches go on (gpuq spill list; gpuq spill replay --quarantined once fixed): %s",
                  len(rows), table, dest, exc)

    def replay(self) -> int:
        """Insert spilled batches (oldest first) while the store takes them; return rows replayed."""
        with self._flush_lock:
            return self._replay_locked()

    def _replay_locked(self) -> int:
        done = 0
        for path in waiting(self.spill_dir):
            try:
                outcome, rows, _ = self._replay_one(path)
            except StoreError as exc:
                log.debug("replay stopped at %s: %s", path, exc)
                return done          # still down: try again later
            if outcome is Outcome.REPLAYED:
                done += rows
        return done

    def replay_paths(self, paths: Sequence[Path]) -> list[tuple[Path, Outcome, int, str]]:
        """Try these spill files now, waiting or in quarantine (``gpuq spill replay``): a file the
        store takes is removed, with its reason file; one refused for its values or unreadable is
        (still) in quarantine with the new reason; one refused for a cause outside its rows is left
        where it was. Returns each file's outcome, rows replayed and reason ("" when replayed). Raises
        :class:`StoreUnavailable` (or another :class:`StoreError` that is not a refusal) when the
        store is down: the files before it are done."""
        out: list[tuple[Path, Outcome, int, str]] = []
        with self._flush_lock:
            for path in paths:
                outcome, rows, reason = self._replay_one(path)
                out.append((path, outcome, rows, reason))
        return out

    def _replay_one(self, path: Path) -> tuple[Outcome, int, str]:
        """Replay one file (caller holds _flush_lock): the outcome, the rows replayed, and why it
        was not ("" when it was). Raises :class:`StoreError` when the store is down (the caller
        stops there)."""
        table = path.parent.name
        if table not in COLUMNS:                 # quarantined once, not logged at every flush
            why = Reason("unknown_table", f"names an unknown table {table!r}")
            return self._quarantine(path, table, why), 0, why.reason
        try:
            batch = read_batch(path, table, COLUMNS[table])
        except BadSpillFile as bad:
            why = Reason("corrupt", bad.why, line=bad.lineno)
            return self._quarantine(path, table, why), 0, why.reason
        except OSError as exc:          # vanished (another writer replayed it) or unreadable
            if path.exists():
                log.error("cannot read spill file %s, left in place: %s", path, exc)
                return Outcome.WAITING, 0, f"cannot read: {exc}"
            return Outcome.GONE, 0, "not there any more"
        rows = batch.rows
        try:
            self._insert(table, rows, path.stem, batch.columns)
        except StoreDataError as exc:
            why = Reason("refused", str(exc), rows=len(rows))
            return self._quarantine(path, table, why), 0, why.reason
        except StoreQueryError as exc:
            self._refuse(path, table, len(rows), exc)
            return Outcome.WAITING, 0, str(exc)
        except StoreError as exc:
            if self._down(exc):
                raise
            self._refuse(path, table, len(rows), exc)     # this file's failure, not the store's
            return Outcome.WAITING, 0, str(exc)
        try:
            self._repair_rollups(path.stem, table, rows, batch.columns)
        except StoreUnavailable:
            raise
        except StoreError as exc:
            log.warning("rollups of spilled batch %s not rebuilt yet, left in place: %s", path, exc)
            return Outcome.WAITING, 0, f"rollups not rebuilt: {exc}"
        path.unlink()
        # its reason goes too; a file a person moved back from the quarantine left its reason there
        left = self.spill_dir / QUARANTINE / table / path.name
        reason = reason_path(path) if is_quarantined(path) else None if left.exists() else reason_path(left)
        if is_quarantined(path):
            log.warning("quarantined spill file %s replayed: %d rows of %s", path, len(rows), table)
        if reason is not None:
            try:
                reason.unlink(missing_ok=True)
            except OSError as exc:
                log.warning("cannot remove %s: %s", reason, exc)
        self._refused.discard(path)
        self.stats.rows_replayed[table] = self.stats.rows_replayed.get(table, 0) + len(rows)
        self.stats.rows_written[table] = self.stats.rows_written.get(table, 0) + len(rows)
        return Outcome.REPLAYED, len(rows), ""

    def _refuse(self, path: Path, table: str, rows: int, exc: StoreError) -> None:
        """A spill file refused for a cause outside its rows: left where it is, counted and logged
        once (it is tried again at every replay)."""
        if path not in self._refused:
            self._refused.add(path)
            self.stats.rows_refused[table] = self.stats.rows_refused.get(table, 0) + rows
            log.error("spilled batch %s refused by the database, left in place: %s", path, exc)

    def _repair_rollups(self, token: str, table: str, rows: Sequence[Row],
                        columns: Sequence[str] | None = None) -> None:
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
        cols = list(columns or COLUMNS[table])
        if "ts" not in cols:
            return
        times = [t.timestamp() for t in (r[cols.index("ts")] for r in rows) if isinstance(t, dt.datetime)]
        if not times:
            return
        now = time.time()
        done = rebuild.rebuild_range(store, table, min(times), max(times), now,
                                     rebuild.store_raw_days(store, {t: Retention().raw_days for t in REBUILT_FROM}))
        log.warning("spilled batch %s predates the rollups' deduplication: rebuilt %s from %s for its "
                    "%d rows", token, ", ".join(done) or "nothing", table, len(rows))

    def _quarantine(self, path: Path, table: str, why: Reason) -> Outcome:
        """Move ``path`` to the quarantine with its reason (written first: a file there always has
        one), once; a file already there gets the new reason, one more attempt. Counted when it
        arrives; a file that cannot be moved is skipped at each replay, counted once."""
        why = Reason(why.kind, why.reason, why.line, why.rows, why.at or time.time(), why.attempts)
        if is_quarantined(path):
            before = read_reason(path)
            write_reason(path, Reason(why.kind, why.reason, why.line, why.rows, why.at,
                                      (before.attempts + 1) if before else 2))
            log.error("quarantined spill file %s refused again, left in quarantine: %s", path, why.reason)
            return Outcome.QUARANTINED
        dest_dir = self.spill_dir / QUARANTINE / table
        dest = dest_dir / path.name
        what = f"{path}: line {why.line}: {why.reason}" if why.line else f"{path}: {why.reason}"
        try:
            dest_dir.mkdir(parents=True, exist_ok=True)
            write_reason(dest, why)
            os.replace(path, dest)
            _fsync_dir(dest_dir)
        except OSError as exc:
            log.error("spill file %s (%s) could not be moved to %s: %s; it is skipped", what, why.kind,
                      dest_dir, exc)
            if path in self._refused:
                return Outcome.WAITING
            self._refused.add(path)          # counted once, skipped at each replay
            self.stats.files_quarantined[table] = self.stats.files_quarantined.get(table, 0) + 1
            return Outcome.WAITING
        log.error("spill file quarantined (%s) to %s: %s", why.kind, dest, what)
        self.stats.files_quarantined[table] = self.stats.files_quarantined.get(table, 0) + 1
        return Outcome.QUARANTINED

    def quarantined_files(self) -> list[Path]:
        return quarantined(self.spill_dir)

    def quarantined_by_table(self) -> dict[str, int]:
        """Files in quarantine now, by table, under this writer's spill directory and the
        scheduler's inside it (the gauge ``gpuq_collector_spill_quarantined_files``)."""
        return quarantined_by_table(self.spill_dir)

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
