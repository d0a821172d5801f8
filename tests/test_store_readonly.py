"""`gpuq query` runs one plain read and nothing else (issue 9, item 1).

On chDB ``readonly=1`` does not stop ``INTO OUTFILE`` (nor ``EXPLAIN SYNTAX ... INTO OUTFILE``):
the file is written, and one written into the store's own ``metadata/`` made the store unopenable.
These tests run every form against a real chDB store and check that it is refused with the place,
that no file appears, and that the store still opens afterwards.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpuq.errors import UnsafeQuery
from gpuq.store.readonly import ALLOWED_TABLE_FUNCTIONS, TABLE_FUNCTIONS, check_read_only
from tests.conftest import REPO


@pytest.fixture(scope="module")
def ro_store(chdb_path: Path):  # noqa: ANN201 - one migrated store for the module (migrating costs ~0.7 s)
    from gpuq.store import open_store

    s = open_store(f"chdb://{chdb_path}?database=readonly_guard")
    yield s
    s.command(f"DROP DATABASE IF EXISTS {s.database}")
    s.close()


def _writes(target: Path) -> dict[str, str]:
    """Every statement form that writes ``target`` (or reaches outside the store) when let through."""
    f = str(target)
    return {
        "outfile": f"SELECT 1 INTO OUTFILE '{f}'",
        "outfile-truncate": f"SELECT 1 INTO OUTFILE '{f}' TRUNCATE",
        "outfile-append": f"SELECT 1 INTO OUTFILE '{f}' APPEND",
        "outfile-compression": f"SELECT 1 INTO OUTFILE '{f}' COMPRESSION 'gzip'",
        "outfile-format": f"SELECT number FROM numbers(3) INTO OUTFILE '{f}' FORMAT CSV",
        "explain-syntax": f"EXPLAIN SYNTAX SELECT 1 INTO OUTFILE '{f}'",
        "explain-ast": f"EXPLAIN AST SELECT 1 INTO OUTFILE '{f}'",
        "explain-plan": f"EXPLAIN PLAN SELECT 1 INTO OUTFILE '{f}'",
        "lower-case": f"select 1 into outfile '{f}'",
        "comment-between": f"SELECT 1 /* comment */ INTO/**/OUTFILE '{f}'",
        "line-comment-first": f"-- just a read\nSELECT 1 INTO OUTFILE '{f}'",
        "newline-split": f"SELECT 1\nINTO\nOUTFILE\n'{f}'",
        "string-then-into": f"SELECT 'a''b\\' -- not a comment' INTO OUTFILE '{f}'",
        "parenthesised": f"(SELECT 1) INTO OUTFILE '{f}'",
        "cte": f"WITH x AS (SELECT 1) SELECT * FROM x INTO OUTFILE '{f}'",
        "two-statements": f"SELECT 1; SELECT 2 INTO OUTFILE '{f}'",
        "insert-function": f"INSERT INTO FUNCTION file('{f}', 'CSV', 'a UInt8') SELECT 1",
        "settings-readonly": "SELECT 1 SETTINGS readonly = 0",
        "file-read": "SELECT * FROM file('/etc/passwd', 'LineAsString')",
        "file-scalar": "SELECT file('/etc/passwd')",
        "url": "SELECT * FROM url('http://127.0.0.1:1/x', 'CSV', 'a String')",
        "s3-mixed-case": "SELECT * FROM S3('http://127.0.0.1:1/b/x.csv')",
        "remote": "SELECT * FROM remote('127.0.0.1:1', system.one)",
        "executable": "SELECT * FROM executable('id', 'TSV', 'x String')",
        "python": "SELECT * FROM python(x)",
        "quoted-function-name": "SELECT * FROM `file`('/etc/hostname', 'LineAsString')",
        "double-quoted-function": 'SELECT "url"(\'http://127.0.0.1:1/x\', \'CSV\', \'a String\')',
        "escaped-quoted-function": "SELECT * FROM `fi\\le`('/etc/hostname', 'LineAsString')",
        "filesystem": "SELECT * FROM filesystem('/')",
        "unknown-table-function": "SELECT * FROM someNewReader('x')",
        "unknown-after-comma": "SELECT * FROM numbers(1) AS a, someNewReader('x') AS b",
        "unknown-in-subquery": "SELECT * FROM (SELECT number FROM numbers(2)) AS a, someNewReader('x')",
        "describe-file": "DESCRIBE TABLE file('/etc/passwd', 'LineAsString')",
        "truncate-table": "TRUNCATE TABLE gpu_samples",
        "drop": "DROP TABLE gpu_samples",
        "system": "SYSTEM DROP DNS CACHE",
        "set": "SET readonly = 0",
        "optimize": "OPTIMIZE TABLE gpu_samples FINAL",
        "heredoc": f"SELECT $$x$$ INTO OUTFILE '{f}'",
        "nested-comment": f"SELECT 1 /* /* */ INTO OUTFILE '{f}' /* */ */",
        "hash-no-space": f"SELECT 1 #x\nINTO OUTFILE '{f}'",
        "unterminated-string": "SELECT 'abc",
        "empty": "  -- nothing\n",
    }


READS = [
    "SELECT 1",
    "SELECT 1;",
    "  select 1 ; -- trailing comment\n",
    "SELECT 'into outfile' AS s, 'INSERT; DROP TABLE x' AS t",
    "SELECT `into` FROM (SELECT 1 AS `into`)",
    'SELECT "outfile" FROM (SELECT 1 AS "outfile")',
    "SELECT 'it''s', 'a\\'b' -- INTO OUTFILE 'x'\n",
    "SELECT 1 AS `a\\` INTO OUTFILE 'x' --`",           # ClickHouse escapes in quoted names too: one alias
    "SELECT 1 AS \"a\"\" INTO OUTFILE 'x' --\"",
    "SELECT 1 /* INTO OUTFILE '/tmp/x' */",
    "SELECT 1 # INTO OUTFILE\n",
    "WITH t AS (SELECT number AS n FROM numbers(5)) SELECT sum(n) FROM t",
    "(SELECT 1) UNION ALL (SELECT 2)",
    "SELECT count() FROM system.tables",
    "SELECT * FROM numbers(2)",
    "SELECT a.number, b.number FROM numbers(2) AS a, numbers(3) AS b WHERE a.number = b.number",
    "SELECT count(), max(number) FROM numbers(5) WHERE number IN (1, 2) GROUP BY number % 2, toString(number)",
    "SELECT * FROM (SELECT number, toString(number) AS s FROM numbers(3)) AS t, numbers(1) AS u ORDER BY t.number",
    "SELECT format('{} {}', 'a', 'b'), replace('ab', 'a', 'c')",
    "SELECT 1.5e-3, 0x1F, -2",
    "SHOW TABLES",
    "DESCRIBE TABLE system.one",
    "EXISTS TABLE system.one",
]


@pytest.mark.parametrize("sql", READS)
def test_plain_reads_pass_and_run_on_chdb(ro_store, sql: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)                      # where an INTO OUTFILE 'x' would land
    assert check_read_only(sql) == sql
    ro_store.read_only_query(sql)                    # and chDB runs it (no syntax the lexer invented)
    assert list(tmp_path.iterdir()) == []            # ... as the read it is: the quoted 'x' is data


@pytest.mark.parametrize("name", list(_writes(Path("/nonexistent/x"))))
def test_every_form_is_refused_with_the_place_and_writes_nothing(ro_store, tmp_path: Path, name: str) -> None:
    target = tmp_path / "out.txt"
    sql = _writes(target)[name]
    with pytest.raises(UnsafeQuery, match=r"line \d+, column \d+") as err:
        ro_store.read_only_query(sql)
    assert err.value.where.startswith("line ")
    assert not target.exists() and not list(tmp_path.iterdir())
    assert ro_store.query("SELECT 1").rows == [(1,)]    # the store still answers


def test_keyword_refusal_points_at_the_keyword() -> None:
    with pytest.raises(UnsafeQuery) as err:
        check_read_only("SELECT a,\n  b INTO OUTFILE 'x'")
    assert err.value.where == "line 2, column 5" and "INTO" in err.value.reason
    with pytest.raises(UnsafeQuery, match="more than one statement"):
        check_read_only("SELECT 1; SELECT 2")
    with pytest.raises(UnsafeQuery, match=r"file\(\) reaches outside the store"):
        check_read_only("SELECT * FROM file('/etc/passwd')")


def test_table_function_list_covers_everything_chdb_knows(ro_store) -> None:
    """A chDB upgrade that brings a new table function fails here until it is classified."""
    names = {r[0].lower() for r in ro_store.query("SELECT name FROM system.table_functions").rows}
    assert names - TABLE_FUNCTIONS == set()
    assert ALLOWED_TABLE_FUNCTIONS <= names


def test_gpuq_query_cli_refuses_writes_and_the_store_still_opens(tmp_path: Path) -> None:
    """The CLI end to end, one process per command as a user runs it; the forms that wrote files
    before the fix (into the store's own metadata/ too) exit 2, name the place and leave nothing."""
    data = tmp_path / "data"
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text(f"store:\n  dsn: chdb://{data}\n  spill_dir: {tmp_path}/spill\n")
    out = tmp_path / "out"
    out.mkdir()
    code = r"""
import json, sys
from gpuq.cli import main
codes = [main(["query", "--config", sys.argv[1], sql]) for sql in json.loads(sys.argv[2])]
print(json.dumps(codes))
"""
    forms = [f"SELECT 1 INTO OUTFILE '{out}/plain'", f"SELECT 1 INTO OUTFILE '{out}/t' TRUNCATE",
             f"SELECT 1 INTO OUTFILE '{out}/a' APPEND", f"EXPLAIN SYNTAX SELECT 1 INTO OUTFILE '{out}/e'",
             f"SELECT 'x' INTO OUTFILE '{data}/metadata/gpuq.sql' TRUNCATE FORMAT RawBLOB",
             "SELECT 1; SELECT 2"]
    r = subprocess.run([sys.executable, "-c", code, str(cfg), json.dumps(forms)], capture_output=True,
                       text=True, cwd=REPO, timeout=120, env=dict(os.environ))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.splitlines()[-1]) == [2] * len(forms)
    assert r.stderr.count("gpuq query: error: refused at line 1, column ") == len(forms)
    assert list(out.iterdir()) == []
    assert not (data / "metadata" / "gpuq.sql").exists()
    ok = subprocess.run([sys.executable, "-m", "gpuq.cli", "query", "--config", str(cfg), "--format", "json",
                         "SELECT count() AS n FROM system.tables WHERE database = 'gpuq'"],
                        capture_output=True, text=True, cwd=REPO, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)[0]["n"] > 5                 # the store opens, its tables are there
