"""The spill directory on disk: the format of a spill file, its quarantine, and what waits there.

Layout (``store.spill_dir``; ``gpuq serve``'s scheduler writes its own events under the
``scheduler/`` folder of it, laid out the same way: :func:`roots`)::

    <root>/<table>/<token>.jsonl                 a batch waiting for the store (oldest first)
    <root>/<table>/.<token>.tmp                  being written (renamed when whole)
    <root>/quarantine/<table>/<token>.jsonl      a batch the store refused for its values, or a
                                                 file that cannot be read back: kept for a human
    <root>/quarantine/<table>/<token>.jsonl.reason   why (one JSON object, below)

The file name is the batch's dedup token: a batch replayed twice is stored once.

**Format 2** (written since issue 17): a header line, the rows, a trailer line::

    {"gpuq_spill":2,"table":"ray_resources","columns":["ts","cluster",...]}
    [{"$dt":1764000000.0},"c","n","GPU","USED",1.0]
    ...
    {"rows":N,"sha256":"<hex>"}

Each row is a JSON list of the header's columns (a ``datetime`` as ``{"$dt": Unix seconds}``).
``sha256`` is the SHA-256 of every byte before the trailer line (header and rows, newlines
included) and ``rows`` the number of row lines. A file is written whole (temporary name, fsync,
rename), so a format-2 file without its trailer, or whose count or checksum does not match, was
damaged after it was written (a cut at a line boundary included, which the format before could
not see): it is quarantined whole, never replayed in part. The header's columns let a batch
spilled before a migration added a column be replayed after it (the new column takes its
default); a column the table no longer has sends the file to quarantine.

**Format 1** (before issue 17, and what a person writes by hand): no header and no trailer, one
row per line, each a JSON list of all the table's columns in :data:`gpuq.store.schema.COLUMNS`
order. Such files still replay; what can be checked is that each line is a whole row and the
file ends with a newline.

A **reason** file (``<file>.reason``) is one JSON object: ``kind`` (``refused``: the store
refused the rows for their values; ``corrupt``: the file cannot be read back or fails its checks;
``unknown_table``: its folder names no table of this gpuq), ``reason`` (the store's or the
reader's words), ``line`` (the first bad line, 0 when none), ``rows`` (when known), ``at`` (Unix
seconds) and ``attempts`` (how many times it was tried: ``gpuq spill replay`` adds one).
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gpuq.errors import shown
from gpuq.store.schema import OLDER_WIDTHS

FORMAT = 2
QUARANTINE = "quarantine"
SCHEDULER = "scheduler"            # gpuq serve's scheduler events: <spill_dir>/scheduler/<table>/
REASON_SUFFIX = ".reason"
Row = Sequence[Any]


class BadSpillFile(ValueError):
    """A spill file that cannot be read back; ``lineno`` is the first bad line (0: the file as a
    whole)."""

    def __init__(self, path: Path, lineno: int, why: str) -> None:
        super().__init__(f"{path}: line {lineno}: {why}" if lineno else f"{path}: {why}")
        self.path = path
        self.lineno = lineno
        self.why = why


@dataclass(frozen=True, slots=True)
class SpillBatch:
    """What a spill file holds: its format, the columns of its rows, and the rows."""

    version: int
    columns: tuple[str, ...]
    rows: list[Row]


@dataclass(frozen=True, slots=True)
class Reason:
    kind: str                  # refused | corrupt | unknown_table
    reason: str
    line: int = 0
    rows: int | None = None
    at: float = 0.0
    attempts: int = 1

    def dumps(self) -> str:
        return json.dumps({"kind": self.kind, "reason": self.reason, "line": self.line, "rows": self.rows,
                           "at": self.at, "attempts": self.attempts}, separators=(",", ":")) + "\n"


def clip(text: str, limit: int = 300) -> str:
    """``text`` cut to about ``limit`` characters for a message or a reason file."""
    return text if len(text) <= limit else text[:limit] + "..."


def encode_value(value: Any) -> Any:
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return {"$dt": value.timestamp()}
    raise TypeError(f"cannot spill value of type {type(value).__name__}")


def _decode(obj: dict[str, Any]) -> Any:
    if len(obj) == 1 and "$dt" in obj:
        return dt.datetime.fromtimestamp(obj["$dt"], tz=dt.timezone.utc)
    return obj


def write_batch(fh: IO[bytes], table: str, columns: Sequence[str], rows: Sequence[Row]) -> None:
    """Write a format-2 file to ``fh`` (opened ``"wb"``; the caller fsyncs and renames it)."""
    digest = hashlib.sha256()

    def put(line: bytes) -> None:
        digest.update(line)
        fh.write(line)

    put(json.dumps({"gpuq_spill": FORMAT, "table": table, "columns": list(columns)},
                   separators=(",", ":")).encode() + b"\n")
    for row in rows:
        put(json.dumps(list(row), default=encode_value, separators=(",", ":")).encode() + b"\n")
    fh.write(json.dumps({"rows": len(rows), "sha256": digest.hexdigest()}, separators=(",", ":")).encode() + b"\n")


def _line_of(data: bytes, offset: int) -> int:
    return data[:offset].count(b"\n") + 1


def _object(line: str) -> dict[str, Any] | None:
    """``line`` as a JSON object, or None (a row is a list)."""
    if not line.startswith("{"):
        return None
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def check(path: Path, table: str, table_columns: Sequence[str]) -> tuple[int, tuple[str, ...], list[str], int]:
    """Read ``path`` and check it as a whole, without decoding its rows: its format, the columns of
    its rows, the row lines and the line number of the first. Cheap enough to list a backlog
    (``gpuq spill list``). Raises :class:`BadSpillFile` naming the first bad line."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadSpillFile(path, _line_of(data, exc.start), f"not UTF-8 ({exc.reason})") from None
    if not text:
        # gpuq never writes an empty file: this one lost its contents
        raise BadSpillFile(path, 0, "empty: the file lost its contents")
    if not text.endswith("\n"):
        # every line ends with a newline: a missing one means the file was cut short
        raise BadSpillFile(path, text.count("\n") + 1, "truncated: the last line has no newline")
    lines = text.split("\n")[:-1]
    header = _object(lines[0])
    if header is None or "gpuq_spill" not in header:          # format 1: rows only
        return 1, tuple(table_columns), lines, 1
    version = header.get("gpuq_spill")
    if version != FORMAT:
        raise BadSpillFile(path, 1, f"spill format {shown(version, 40)} is not one this gpuq reads "
                                    f"({FORMAT}): written by a newer gpuq?")
    if header.get("table") != table:
        raise BadSpillFile(path, 1, f"written for table {shown(header.get('table'), 80)}, found in the "
                                    f"folder of {table!r}")
    columns = header.get("columns")
    if not isinstance(columns, list) or not columns or not all(isinstance(c, str) for c in columns):
        raise BadSpillFile(path, 1, "the header has no list of column names")
    unknown = [c for c in columns if c not in table_columns]
    if unknown or len(set(columns)) != len(columns):
        raise BadSpillFile(path, 1, f"columns {shown(unknown or columns, 120)} are not columns of {table} "
                                    f"in this gpuq (or repeat)")
    trailer = _object(lines[-1]) if len(lines) > 1 else None
    if trailer is None or set(trailer) != {"rows", "sha256"}:
        raise BadSpillFile(path, len(lines), f"no trailer after line {len(lines)}: the file was cut short "
                                             f"(a format-2 file ends with its row count and checksum)")
    body = data[:len(data) - len(lines[-1].encode()) - 1]
    if trailer["rows"] != len(lines) - 2:
        raise BadSpillFile(path, len(lines), f"the trailer counts {shown(trailer['rows'], 40)} rows, the "
                                             f"file holds {len(lines) - 2}")
    if trailer["sha256"] != hashlib.sha256(body).hexdigest():
        raise BadSpillFile(path, len(lines), "checksum mismatch: the file changed after it was written")
    return FORMAT, tuple(columns), lines[1:-1], 2


def read_batch(path: Path, table: str, table_columns: Sequence[str]) -> SpillBatch:
    """The rows of a spill file, all or nothing: :class:`BadSpillFile` names the first line that
    fails :func:`check` or is not a JSON list of the file's columns."""
    version, columns, lines, first = check(path, table, table_columns)
    rows: list[Row] = []
    older = OLDER_WIDTHS.get(table, ()) if version == 1 else ()
    for lineno, line in enumerate(lines, first):
        if not line.strip() and version == 1:
            continue
        try:
            row = json.loads(line, object_hook=_decode)
        except (ValueError, OverflowError, TypeError, OSError) as exc:   # a bad "$dt" too
            raise BadSpillFile(path, lineno, f"not JSON ({clip(str(exc))})") from None
        if isinstance(row, list) and not rows and len(row) in older:
            columns = columns[:len(row)]        # written before columns were added at the end
        if not isinstance(row, list) or len(row) != len(columns):
            got = f"{len(row)} values" if isinstance(row, list) else type(row).__name__
            raise BadSpillFile(path, lineno, f"expected a list of {len(columns)} values, got {got}")
        rows.append(row)
    return SpillBatch(version, columns, rows)


# -- the quarantine's reasons ------------------------------------------------------------------
def reason_path(path: Path) -> Path:
    return path.with_name(path.name + REASON_SUFFIX)


def write_reason(path: Path, reason: Reason) -> None:
    """Write the reason file of ``path`` (a temporary name, then a rename: never half a reason)."""
    dest = reason_path(path)
    tmp = dest.with_name(f".{dest.name}.tmp")
    tmp.write_text(reason.dumps(), encoding="utf-8")
    os.replace(tmp, dest)


def read_reason(path: Path) -> Reason | None:
    """The reason file of ``path``; None when there is none or it cannot be read."""
    try:
        obj = json.loads(reason_path(path).read_text(encoding="utf-8"))
        return Reason(kind=str(obj.get("kind", "")), reason=str(obj.get("reason", "")),
                      line=int(obj.get("line") or 0),
                      rows=int(obj["rows"]) if isinstance(obj.get("rows"), int) else None,
                      at=float(obj.get("at") or 0.0), attempts=int(obj.get("attempts") or 1))
    except (OSError, ValueError, TypeError, AttributeError):
        return None


# -- what the spill directory holds ------------------------------------------------------------
def roots(spill_dir: str | Path) -> list[Path]:
    """The spill roots under ``store.spill_dir``: its own (the collectors') and the scheduler's."""
    base = Path(spill_dir)
    return [base, base / SCHEDULER]


def waiting(root: Path) -> list[Path]:
    """The batches waiting under ``root``, oldest first."""
    return sorted(root.glob("*/*.jsonl"), key=_age) if root.is_dir() else []


def quarantined(root: Path) -> list[Path]:
    q = root / QUARANTINE
    return sorted(q.glob("*/*.jsonl"), key=_age) if q.is_dir() else []


def quarantined_by_table(spill_dir: str | Path) -> dict[str, int]:
    """Files in quarantine now, by table, under every root of ``spill_dir`` (the gauge
    ``gpuq_collector_spill_quarantined_files``)."""
    out: dict[str, int] = {}
    for root in roots(spill_dir):
        for p in quarantined(root):
            out[p.parent.name] = out.get(p.parent.name, 0) + 1
    return out


def is_quarantined(path: Path) -> bool:
    return path.parent.parent.name == QUARANTINE


def _age(p: Path) -> tuple[int, str]:
    try:
        return p.stat().st_mtime_ns, p.name
    except OSError:
        return 0, p.name


@dataclass(frozen=True, slots=True)
class Entry:
    """One file of :func:`entries` (``gpuq spill list``)."""

    path: Path
    state: str                 # waiting | quarantined
    table: str
    rows: int | None           # None: it cannot be read
    written: float             # mtime, Unix seconds
    reason: str                # why it is in quarantine, or what is wrong with a waiting one ("" when fine)
    kind: str = ""


def entries(spill_dir: str | Path, columns: dict[str, tuple[str, ...]]) -> list[Entry]:
    """Every spill file under ``spill_dir`` (waiting, then quarantined; oldest first in each),
    checked with :func:`check` for its row count: a waiting file that would be quarantined at
    its replay says why."""
    out: list[Entry] = []
    for root in roots(spill_dir):
        for state, files in (("waiting", waiting(root)), ("quarantined", quarantined(root))):
            for p in files:
                table = p.parent.name
                rows: int | None = None
                problem = ""
                try:
                    mtime = p.stat().st_mtime
                except OSError:
                    continue                                   # replayed meanwhile
                if table not in columns:
                    problem = f"names an unknown table {table!r}"
                else:
                    try:
                        version, _, lines, _ = check(p, table, columns[table])
                        rows = len([x for x in lines if x.strip()]) if version == 1 else len(lines)
                    except BadSpillFile as bad:
                        problem = str(bad).removeprefix(f"{p}: ")
                    except OSError as exc:
                        problem = f"cannot read: {exc.strerror or exc}"
                kind = ""
                if state == "quarantined":
                    why = read_reason(p)
                    if why is not None:
                        kind, problem = why.kind, why.reason
                        rows = rows if rows is not None else why.rows
                    elif not problem:
                        problem = "no reason recorded"
                out.append(Entry(p, state, table, rows, mtime, problem, kind))
    return out
