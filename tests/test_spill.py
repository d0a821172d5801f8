"""Spill that never blocks (issue 17, finding 3): errors classed by what they mean; a batch the
store refuses for its values quarantined with its reason, on a live insert as on a replay, and the
rest going on; spill format 2 (header, rows, a trailer with the row count and a SHA-256) with
format-1 files still replayed; the gauge of files in quarantine; ``gpuq spill list|replay``.

The store is real (chDB); the CLI runs as a user runs it, one process per command on a chDB path of
its own.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from collector.health import CollectorMetrics
from gpuq.errors import StoreDataError, StoreError, StoreQueryError, StoreUnavailable
from gpuq.store import COLUMNS
from gpuq.store.client import classify
from gpuq.store.spillfile import BadSpillFile, check, read_batch, read_reason
from gpuq.store.writer import BatchWriter, Outcome
from tests.conftest import REPO

NOW = dt.datetime.now(dt.timezone.utc).replace(microsecond=0) - dt.timedelta(hours=1)
BAD = "not-a-number"


def rr(first: int, n: int, bad_at: int | None = None) -> list[tuple]:
    """n ray_resources rows whose values are first..first+n-1; the row ``bad_at`` has a value a
    Float64 cannot take."""
    return [(NOW + dt.timedelta(seconds=i), "c", "n", "GPU", "USED", BAD if i == bad_at else float(i))
            for i in range(first, first + n)]


def values(store: Any) -> list[float]:
    return sorted(r[0] for r in store.query(f"SELECT value FROM {store.database}.ray_resources").rows)


def write_format1(path: Path, rows: list[tuple]) -> Path:
    """A spill file written the way gpuq wrote them before format 2 (the writer's code of then: one
    JSON list per row, a datetime as {"$dt": seconds}, text mode), so the fixture is the old format
    exactly, with times relative to now."""
    def encode(value: Any) -> Any:
        if isinstance(value, dt.datetime):
            return {"$dt": value.timestamp()}
        raise TypeError(type(value).__name__)

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(list(row), default=encode, separators=(",", ":")))
            fh.write("\n")
    return path


def spill_format2(spill: Path, rows: list[tuple]) -> Path:
    """A format-2 file as the writer spills it (store down: no store at all)."""
    w = BatchWriter(None, spill, max_buffered_rows=len(rows) - 1)
    w.write("ray_resources", rows)                       # over the bound: spilled
    (path,) = [p for p in (spill / "ray_resources").glob("*.jsonl") if p.name.startswith(w._id)]
    return path


def gauge(registry: CollectorRegistry, table: str) -> float | None:
    return registry.get_sample_value("gpuq_collector_spill_quarantined_files", {"table": table})


# -- errors classed by what they mean ------------------------------------------------------------
def test_errors_are_classed_by_what_they_mean(store) -> None:
    from clickhouse_connect.driver.exceptions import DatabaseError, DataError, OperationalError

    def cls(exc: BaseException, rows: bool = False) -> type[StoreError]:
        return type(classify(exc, "here", rows))

    assert cls(ValueError("could not convert string to float"), rows=True) is StoreDataError
    assert cls(AttributeError("'float' object has no attribute 'timestamp'"), rows=True) is StoreDataError
    assert cls(DataError("Invalid None value in non-Nullable column")) is StoreDataError
    assert cls(DatabaseError("Code: 72. DB::Exception: Cannot parse Float64 (CANNOT_PARSE_NUMBER)")) is StoreDataError
    assert cls(DatabaseError("Code: 241. DB::Exception: Memory limit exceeded")) is StoreUnavailable
    assert cls(DatabaseError("x", code=252)) is StoreUnavailable                  # TOO_MANY_PARTS
    assert cls(DatabaseError("Code: 60. DB::Exception: Table gpuq.x does not exist")) is StoreQueryError
    assert cls(OperationalError("Error executing HTTP request")) is StoreUnavailable
    assert cls(ConnectionRefusedError(111, "refused")) is StoreUnavailable
    assert cls(ValueError("bad parameter")) is StoreQueryError                   # not an insert: not rows
    odd = classify(RuntimeError("something nobody named"), "here", rows=True)
    assert type(odd) is StoreUnavailable and odd.unclassified                    # kept, then checked
    assert not classify(OperationalError("down"), "here").unclassified

    # the real client and engine, for the forms a spill file can take
    cols = COLUMNS["ray_resources"]
    for value, where in ((BAD, "value"), (NOW.timestamp(), "ts"), ({"a": 1}, "cluster")):
        row = [NOW, "c", "n", "GPU", "USED", 1.0]
        row[cols.index(where)] = value
        with pytest.raises(StoreDataError):
            store.insert("ray_resources", [row], cols)
    with pytest.raises(StoreQueryError) as refused:
        store.insert("no_such_table", [(1,)], ["x"])
    assert not isinstance(refused.value, StoreDataError)                          # not about the rows


# -- live inserts ----------------------------------------------------------------------------------
def test_a_live_batch_refused_for_its_values_is_quarantined_and_the_next_go_in(
        store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: the ValueError was "store unavailable", so the flush spilled this batch and every
    batch after it without trying them, and the replay stopped at it for good."""
    spill = tmp_path / "spill"
    w = BatchWriter(store, spill, batch_rows=3, retry_attempts=3, retry_backoff_s=0.0)
    registry = CollectorRegistry()
    CollectorMetrics(registry, w)
    assert gauge(registry, "ray_resources") == 0
    w.write("ray_resources", rr(0, 3) + rr(3, 3, bad_at=4) + rr(6, 3))      # three batches, the middle bad
    with caplog.at_level(logging.WARNING, logger="gpuq.store.writer"):
        w.flush()
        w.write("ray_resources", rr(9, 2))
        w.flush()
    assert values(store) == [0.0, 1.0, 2.0, 6.0, 7.0, 8.0, 9.0, 10.0]
    assert w.spilled_files() == 0 and w.stats.rows_spilled == {}
    assert w.stats.write_errors == 1                           # not retried: it would be refused again
    (q,) = w.quarantined_files()
    why = read_reason(q)
    assert why is not None and why.kind == "refused" and why.rows == 3 and why.attempts == 1
    # the client's words: the column (several rows) or the value (one row)
    assert "insert into ray_resources failed" in why.reason
    assert "column `value`" in why.reason or "could not convert string to float" in why.reason
    assert [r[5] for r in read_batch(q, "ray_resources", COLUMNS["ray_resources"]).rows] == [3.0, BAD, 5.0]
    assert w.stats.files_quarantined == {"ray_resources": 1} and w.stats.rows_refused == {}
    assert gauge(registry, "ray_resources") == 1
    assert registry.get_sample_value("gpuq_collector_spill_files_quarantined_total", {"table": "ray_resources"}) == 1
    assert "store unavailable" not in caplog.text
    assert caplog.text.count("refused for their values: batch quarantined to") == 1


def test_the_quarantine_failing_holds_the_batch_and_loses_nothing(store, tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    (spill / "quarantine").write_text("a file where the folder should be")    # the move cannot happen
    w = BatchWriter(store, spill, retry_attempts=1)
    w.write("ray_resources", rr(0, 2, bad_at=1))
    w.flush()
    assert w.held_rows() == 2 and w.stats.spill_errors == 1 and w.stats.files_quarantined == {}
    (spill / "quarantine").unlink()
    w.flush()                                                  # refused again, quarantined now
    assert w.held_rows() == 0 and len(w.quarantined_files()) == 1


def test_a_failure_naming_no_cause_with_a_store_that_answers_does_not_block(
        store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An error the classes do not know (here a RuntimeError from the client for one batch) is
    taken as unavailability, which keeps the rows; but the store answers a ping, so that batch is
    left waiting and the newer ones are replayed."""
    spill = tmp_path / "spill"
    odd = write_format1(spill / "ray_resources" / "odd-1.jsonl", rr(0, 2))
    write_format1(spill / "ray_resources" / "later-2.jsonl", rr(2, 2))
    os.utime(odd, (1, 1))                                       # the oldest: replayed first
    client = store._client
    real = client.insert

    def insert(table: str, rows: Any, **kw: Any) -> Any:
        if kw.get("settings", {}).get("insert_deduplication_token") == "odd-1":
            raise RuntimeError("an error of a kind nobody classed")
        return real(table, rows, **kw)

    monkeypatch.setattr(client, "insert", insert)
    w = BatchWriter(store, spill, retry_attempts=1)
    assert w.replay() == 2
    assert values(store) == [2.0, 3.0] and odd.exists()
    assert w.stats.rows_refused == {"ray_resources": 2}


def test_finding_3_again_a_scheduler_spill_file_with_t_not_a_number(
        store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """The probe's file, again: gpuq serve's scheduler spill folder, a scheduler_events row with
    "t": "not-a-number", newer valid files after it. Before: replay stopped at it ("store
    unavailable") and logged a traceback at every flush."""
    root = tmp_path / "spill" / "scheduler"

    def event(t: Any, seq: int) -> tuple:
        """A row as a gpuq before migration 0009 wrote it (12 values: its spill files are read after
        the upgrade with the table's first columns, gpuq.store.schema.OLDER_WIDTHS)."""
        return (NOW, "c", t, seq, "submit", f"w{seq}", "prod", "H100", {}, "alice (operator)", "", "{}")

    bad = write_format1(root / "scheduler_events" / "probe-1.jsonl", [event(BAD, 1)])
    newer = [write_format1(root / "scheduler_events" / f"later-{i}.jsonl", [event(float(i), i)]) for i in (2, 3)]
    for age, p in enumerate((bad, *newer)):
        os.utime(p, (1_000_000 + age, 1_000_000 + age))
    w = BatchWriter(store, root, batch_interval_s=3600)
    with caplog.at_level(logging.DEBUG):
        w.start()
        for _ in range(5):
            w.write("scheduler_events", [(*event(float(10), 10), {}, "", 0.0)])   # today's 15 values
            w.flush()
        w.close()
    got = store.query(f"SELECT seq FROM {store.database}.scheduler_events ORDER BY seq").rows
    assert got == [(2,), (3,), (10,), (10,), (10,), (10,), (10,)]
    assert not bad.exists() and w.spilled_files() == 0
    assert w.quarantined_by_table() == {"scheduler_events": 1}
    why = read_reason(root / "quarantine" / "scheduler_events" / bad.name)
    assert why is not None and why.kind == "refused"
    assert caplog.text.count("Traceback") <= 1                 # the client's own, once: not every flush
    assert "store unavailable" not in caplog.text


# -- the spill format --------------------------------------------------------------------------------
def test_format_2_has_a_header_and_a_trailer_with_count_and_checksum(tmp_path: Path) -> None:
    path = spill_format2(tmp_path / "spill", rr(0, 3))
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 6
    assert json.loads(lines[0]) == {"gpuq_spill": 2, "table": "ray_resources", "columns": list(COLUMNS["ray_resources"])}
    trailer = json.loads(lines[4])
    assert trailer == {"rows": 3, "sha256": hashlib.sha256(b"\n".join(lines[:4]) + b"\n").hexdigest()}
    batch = read_batch(path, "ray_resources", COLUMNS["ray_resources"])
    assert batch.version == 2 and [r[5] for r in batch.rows] == [0.0, 1.0, 2.0] and batch.rows[0][0] == NOW


def test_damaged_format_2_files_are_quarantined_whole_and_old_ones_still_replay(
        store, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    spill = tmp_path / "spill"
    folder = spill / "ray_resources"

    def damaged(name: str, first: int, edit: Any) -> Path:
        whole = spill_format2(tmp_path / f"made-{name}", rr(first, 4))
        lines = whole.read_bytes().splitlines(keepends=True)
        p = folder / f"{name}.jsonl"
        folder.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"".join(edit(lines)))
        return p

    cut_trailer = damaged("cut-trailer", 100, lambda ls: ls[:-1])          # cut exactly at a line boundary
    cut_rows = damaged("cut-rows", 200, lambda ls: ls[:3])                 # header and two rows
    no_row = damaged("no-row", 300, lambda ls: ls[:2] + ls[3:])           # a row gone, trailer kept
    edited = damaged("edited", 400, lambda ls: [ls[0], ls[1].replace(b"400.0", b"499.0"), *ls[2:]])
    header_only = damaged("header-only", 500, lambda ls: ls[:1])
    newer = damaged("newer", 600, lambda ls: [ls[0].replace(b'"gpuq_spill":2', b'"gpuq_spill":3'), *ls[1:]])
    good = spill_format2(spill, rr(0, 4))
    old = write_format1(folder / "old-format.jsonl", rr(10, 3))
    for age, p in enumerate((cut_trailer, cut_rows, no_row, edited, header_only, newer, good, old)):
        os.utime(p, (1_000_000 + age, 1_000_000 + age))

    w = BatchWriter(store, spill)
    registry = CollectorRegistry()
    CollectorMetrics(registry, w)
    with caplog.at_level(logging.ERROR, logger="gpuq.store.writer"):
        assert w.replay() == 7
    assert values(store) == [0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0]          # nothing of a damaged file
    assert w.spilled_files() == 0
    reasons = {p.name: read_reason(p) for p in w.quarantined_files()}
    assert set(reasons) == {p.name for p in (cut_trailer, cut_rows, no_row, edited, header_only, newer)}
    assert all(r is not None and r.kind == "corrupt" for r in reasons.values())
    said = {name.removesuffix(".jsonl"): f"line {r.line}: {r.reason}" for name, r in reasons.items() if r}
    assert said["cut-trailer"] == "line 5: no trailer after line 5: the file was cut short (a format-2 file ends with its row count and checksum)"
    assert said["cut-rows"].startswith("line 3: no trailer after line 3")
    assert said["no-row"] == "line 5: the trailer counts 4 rows, the file holds 3"
    assert said["edited"] == "line 6: checksum mismatch: the file changed after it was written"
    assert said["header-only"].startswith("line 1: no trailer after line 1")
    assert said["newer"].startswith("line 1: spill format 3 is not one this gpuq reads (2)")
    assert gauge(registry, "ray_resources") == 6
    assert f"{folder / 'cut-trailer.jsonl'}: line 5: no trailer" in caplog.text


def test_a_format_2_file_from_before_a_column_was_added_replays(store, tmp_path: Path) -> None:
    """The header names the columns: a batch spilled before a migration added one replays after it
    (the column takes its default); a column the table does not have sends it to quarantine."""
    spill = tmp_path / "spill"
    path = spill_format2(spill, rr(0, 2))
    lines = path.read_text().splitlines()
    cols = [c for c in COLUMNS["ray_resources"] if c != "state"]
    body = [json.dumps({"gpuq_spill": 2, "table": "ray_resources", "columns": cols}, separators=(",", ":"))]
    for line in lines[1:-1]:
        row = json.loads(line)
        del row[COLUMNS["ray_resources"].index("state")]
        body.append(json.dumps(row, separators=(",", ":")))
    text = "".join(f"{x}\n" for x in body)
    digest = hashlib.sha256(text.encode()).hexdigest()
    path.write_text(text + json.dumps({"rows": 2, "sha256": digest}) + "\n")
    unknown = path.with_name("unknown-col.jsonl")
    unknown.write_text(text.replace('"value"]', '"value","gone"]'))
    assert BatchWriter(store, spill).replay() == 2
    assert store.query(f"SELECT state, value FROM {store.database}.ray_resources ORDER BY value").rows == [
        ("", 0.0), ("", 1.0)]
    with pytest.raises(BadSpillFile, match="not columns of ray_resources"):
        check(spill / "quarantine" / "ray_resources" / unknown.name, "ray_resources", COLUMNS["ray_resources"])


def test_the_gauge_counts_the_files_in_quarantine_now_of_both_spill_roots(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    for root, table, n in ((spill, "ray_resources", 2), (spill, "gpu_samples", 1),
                           (spill / "scheduler", "scheduler_events", 1)):
        for i in range(n):
            write_format1(root / "quarantine" / table / f"x-{i}.jsonl", rr(0, 1))
    w = BatchWriter(None, spill)
    registry = CollectorRegistry()
    CollectorMetrics(registry, w)
    assert gauge(registry, "ray_resources") == 2 and gauge(registry, "gpu_samples") == 1
    assert gauge(registry, "scheduler_events") == 1 and gauge(registry, "pod_events") == 0
    shutil.rmtree(spill / "quarantine" / "ray_resources")
    assert gauge(registry, "ray_resources") == 0                  # what is there now, not a count of arrivals


def test_replay_paths_keeps_a_refused_quarantined_file_with_the_new_reason(store, tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    w = BatchWriter(store, spill, retry_attempts=1)
    w.write("ray_resources", rr(0, 2, bad_at=0))
    w.flush()
    (q,) = w.quarantined_files()
    [(path, outcome, rows, reason)] = w.replay_paths([q])
    assert (path, outcome, rows) == (q, Outcome.QUARANTINED, 0) and "could not convert" in reason
    why = read_reason(q)
    assert q.exists() and why is not None and why.attempts == 2
    assert w.stats.files_quarantined == {"ray_resources": 1}        # counted when it arrived, once


# -- gpuq spill list | replay ------------------------------------------------------------------------
def gpuq(cfg: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuq.cli", *args, "--config", str(cfg)], capture_output=True,
                          text=True, cwd=REPO, timeout=120, env=dict(os.environ))


def listing(cfg: Path) -> list[dict[str, Any]]:
    r = gpuq(cfg, "spill", "list", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_gpuq_spill_list_and_replay_end_to_end(tmp_path: Path) -> None:
    spill = tmp_path / "spill"
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text(f"store:\n  dsn: chdb://{tmp_path / 'data'}\n  spill_dir: {spill}\n  retry_backoff_s: 0\n")
    folder = spill / "ray_resources"
    good = spill_format2(spill, rr(0, 2))
    old = write_format1(folder / "old-1.jsonl", rr(2, 2))
    bad_a = write_format1(folder / "bad-a.jsonl", rr(4, 2, bad_at=5))
    bad_b = write_format1(folder / "bad-b.jsonl", rr(6, 2, bad_at=6))
    event = write_format1(spill / "scheduler" / "quarantine" / "no_such_table" / "e-1.jsonl", rr(0, 1))
    for age, p in enumerate((good, old, bad_a, bad_b)):
        os.utime(p, (1_000_000 + age, 1_000_000 + age))

    before = {Path(e["file"]).name: e for e in listing(cfg)}
    assert {n: (e["state"], e["table"], e["rows"]) for n, e in before.items()} == {
        good.name: ("waiting", "ray_resources", 2), "old-1.jsonl": ("waiting", "ray_resources", 2),
        "bad-a.jsonl": ("waiting", "ray_resources", 2), "bad-b.jsonl": ("waiting", "ray_resources", 2),
        "e-1.jsonl": ("quarantined", "no_such_table", None)}
    assert before["e-1.jsonl"]["reason"] == "names an unknown table 'no_such_table'"   # no reason file: checked

    r = gpuq(cfg, "spill", "replay")                         # the waiting ones; two refused for their values
    assert r.returncode == 1, r.stderr
    assert f"replayed     {good} (2 rows)" in r.stdout and f"replayed     {old} (2 rows)" in r.stdout
    assert r.stdout.count("quarantined  ") == 2 and "insert into ray_resources failed" in r.stdout
    assert f"quarantined  {spill / 'quarantine' / 'ray_resources' / 'bad-a.jsonl'}: " in r.stdout
    after = {Path(e["file"]).name: e for e in listing(cfg)}
    assert set(after) == {"bad-a.jsonl", "bad-b.jsonl", "e-1.jsonl"}
    assert after["bad-a.jsonl"]["state"] == "quarantined" and after["bad-a.jsonl"]["kind"] == "refused"
    assert "insert into ray_resources failed" in after["bad-a.jsonl"]["reason"]
    assert after["bad-a.jsonl"]["rows"] == 2

    q = spill / "quarantine" / "ray_resources"
    # a person fixes bad-a where it lies, and bad-b by moving the fixed file back to the spill folder
    write_format1(q / "bad-a.jsonl", rr(4, 2))
    write_format1(folder / "bad-b.jsonl", rr(6, 2))
    (q / "bad-b.jsonl").unlink()
    r = gpuq(cfg, "spill", "replay", str(tmp_path / "elsewhere.jsonl"))
    assert r.returncode == 2 and "not a spill file" in r.stderr
    r = gpuq(cfg, "spill", "replay", "--quarantined")
    assert r.returncode == 1, r.stderr                      # the event file's folder names no table
    assert f"replayed     {q / 'bad-a.jsonl'} (2 rows)" in r.stdout
    assert f"replayed     {folder / 'bad-b.jsonl'} (2 rows)" in r.stdout
    assert "names an unknown table 'no_such_table'" in r.stdout
    assert sorted(p.name for p in q.iterdir()) == []         # files and reasons gone, moved-back one's too
    [left] = listing(cfg)
    assert left["file"] == str(event) and left["kind"] == "unknown_table"

    r = gpuq(cfg, "query", "--format", "json", "SELECT value FROM ray_resources ORDER BY value")
    assert r.returncode == 0, r.stderr
    assert [x["value"] for x in json.loads(r.stdout)] == [float(i) for i in range(8)]
    r = gpuq(cfg, "spill", "replay")
    assert r.returncode == 0 and "nothing to replay" in r.stdout
