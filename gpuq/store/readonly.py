"""The guard in front of every statement a user types (``gpuq query``): one plain read, or nothing.

ClickHouse's ``readonly=1`` is not enough on its own: on chDB ``SELECT 1 INTO OUTFILE 'x'`` (and
``EXPLAIN SYNTAX ... INTO OUTFILE``) writes the file anyway, and a file written into the store's
own ``metadata/`` made the store unopenable. So the statement is checked here, without sending it
to ClickHouse, by a small ClickHouse-aware lexer, and ``readonly=1`` stays as a second layer.

The lexer knows string literals (``'...'`` with backslash escapes and doubled quotes), quoted
identifiers (`` `...` `` and ``"..."``), comments (``--`` and ``# `` / ``#!`` to the end of the line,
``/* ... */``), numbers and bare words. What it does not know is refused rather than guessed: a
nested ``/*`` inside a comment, a ``#`` not followed by a space or ``!``, ``$`` (heredoc strings),
characters outside ASCII, an unterminated string, identifier or comment.

A statement is refused, with the line and column of the offending token, when:

* there is more than one statement (a ``;`` followed by anything but whitespace or comments);
* it does not start with ``SELECT``, ``WITH``, ``SHOW``, ``DESCRIBE``, ``DESC`` or ``EXISTS``
  (after opening parentheses): ``EXPLAIN`` is refused too, since on chDB ``EXPLAIN SYNTAX ...
  INTO OUTFILE`` writes the file;
* a bare word outside strings, quoted identifiers and comments is one of :data:`FORBIDDEN_WORDS`
  (``INTO``, ``OUTFILE``, ``INSERT``, ``SETTINGS``, ``READONLY``, ``SYSTEM`` unless it is the
  ``system.`` database ...). The same words inside a string (``SELECT 'into outfile'``) or a
  quoted identifier are data and pass;
* it calls a table function other than the harmless generators of :data:`ALLOWED_TABLE_FUNCTIONS`:
  any call of a name in :data:`TABLE_FUNCTIONS` (``file``, ``url``, ``s3``, ``remote``, ``mysql``,
  ``executable``, ``python`` ...) anywhere, and any call at all right after ``FROM``, ``JOIN``,
  ``TABLE``, ``DESCRIBE`` or a comma of a ``FROM`` list whose name is not allowed. ``tests/test_store_readonly.py`` checks that every table function
  the installed chDB knows is in :data:`TABLE_FUNCTIONS`.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpuq.errors import UnsafeQuery

STARTS = frozenset({"SELECT", "WITH", "SHOW", "DESCRIBE", "DESC", "EXISTS"})
FORBIDDEN_WORDS = frozenset({
    "INTO", "OUTFILE", "INSERT", "TRUNCATE", "APPEND", "COMPRESSION", "SYSTEM", "KILL", "ALTER",
    "CREATE", "DROP", "ATTACH", "DETACH", "OPTIMIZE", "RENAME", "GRANT", "REVOKE", "SET", "SETTINGS",
    "READONLY", "EXPLAIN", "DELETE", "UPDATE", "EXCHANGE", "UNDROP", "BACKUP", "RESTORE", "USE",
    "MOVE", "CHECK", "WATCH", "EXECUTE",
})
# system.table_functions of chDB 4.4 (ClickHouse 25.x), lower case; a test keeps it complete.
TABLE_FUNCTIONS = frozenset({
    "sqlstandardvalues", "arrowstream", "azureblobstorage", "azureblobstoragecluster", "bigquery",
    "cluster", "clusterallreplicas", "cosn", "deltalake", "deltalakeazure", "deltalakeazurecluster",
    "deltalakecluster", "deltalakelocal", "deltalakes3", "deltalakes3cluster", "dictionary", "eval",
    "executable", "file", "filecluster", "filesystem", "format", "fuzzjson", "fuzzquery", "gcs",
    "generaterandom", "generateseries", "generate_series", "hdfs", "hdfscluster", "hudi",
    "hudicluster", "iceberg", "icebergazure", "icebergazurecluster", "icebergcluster", "iceberghdfs",
    "iceberghdfscluster", "iceberglocal", "iceberglocalcluster", "icebergs3", "icebergs3cluster",
    "input", "jdbc", "loop", "merge", "mergetreeanalyzeindexes", "mergetreeanalyzeindexesuuid",
    "mergetreecodecblockcounts", "mergetreeindex", "mergetreeprojection", "mergetreetextindex",
    "mongodb", "mysql", "null", "numbers", "numbers_mt", "odbc", "oss", "paimon", "paimonazure",
    "paimonazurecluster", "paimoncluster", "paimonhdfs", "paimonhdfscluster", "paimonlocal",
    "paimons3", "paimons3cluster", "postgresql", "primes", "prometheusquery",
    "prometheusqueryrange", "python", "redis", "remote", "remotesecure", "s3", "s3cluster",
    "sqlite", "timeseriesdata", "timeseriesmetricfamilies", "timeseriesmetrics",
    "timeseriessamples", "timeseriesselector", "timeseriestags", "url", "urlcluster", "values",
    "view", "viewexplain", "viewifpermitted", "ytsaurus", "zeros", "zeros_mt",
    # older or server-only names
    "s3queue", "azurequeue", "hive", "mysqlcluster", "postgresqlcluster", "remotecluster",
})
# Generators that read nothing outside the query (``format`` parses data given inline; the name
# is also the scalar ``format(pattern, ...)``; ``view`` wraps a subquery that is checked too).
ALLOWED_TABLE_FUNCTIONS = frozenset({
    "numbers", "numbers_mt", "zeros", "zeros_mt", "generaterandom", "generateseries",
    "generate_series", "values", "null", "primes", "format", "view",
})
_TABLE_POSITION = frozenset({"FROM", "JOIN", "TABLE", "DESCRIBE", "DESC"})
_CLAUSE_ENDS = frozenset({"WHERE", "PREWHERE", "GROUP", "ORDER", "HAVING", "LIMIT", "OFFSET", "UNION",
                          "EXCEPT", "INTERSECT", "FORMAT", "QUALIFY", "WINDOW", "SELECT", "ON", "USING",
                          "SAMPLE", "FINAL"})
_PUNCT = set("()[]{},.;:+-*/%<>=!|?^&~@")
_WORD_START = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_")
_WORD = _WORD_START | set("0123456789")


@dataclass(frozen=True, slots=True)
class Token:
    kind: str        # word | number | string | ident | punct
    text: str
    pos: int


def _where(sql: str, pos: int) -> str:
    line = sql.count("\n", 0, pos) + 1
    col = pos - (sql.rfind("\n", 0, pos) + 1) + 1
    return f"line {line}, column {col}"


def _refuse(sql: str, pos: int, reason: str) -> UnsafeQuery:
    return UnsafeQuery(_where(sql, pos), reason)


def tokenize(sql: str) -> list[Token]:
    """Tokens outside comments; raise UnsafeQuery on anything this lexer does not understand."""
    out: list[Token] = []
    i, n = 0, len(sql)
    while i < n:
        c = sql[i]
        if c in " \t\r\n\f\v":
            i += 1
        elif sql.startswith("--", i) or (c == "#" and sql[i + 1:i + 2] in (" ", "!")):
            j = sql.find("\n", i)
            i = n if j < 0 else j + 1
        elif c == "#":
            raise _refuse(sql, i, "'#' starts a comment only before a space or '!'")
        elif sql.startswith("/*", i):
            j = sql.find("*/", i + 2)
            if j < 0:
                raise _refuse(sql, i, "unterminated comment")
            if "/*" in sql[i + 2:j]:
                raise _refuse(sql, sql.index("/*", i + 2), "nested comments are not accepted")
            i = j + 2
        elif c in "'`\"":
            j = i + 1
            while True:
                if j >= n:
                    what = "string" if c == "'" else "quoted identifier"
                    raise _refuse(sql, i, f"unterminated {what}")
                if sql[j] == "\\":
                    j += 2
                elif sql[j] == c:
                    if sql[j + 1:j + 2] == c:       # a doubled quote is the quote itself
                        j += 2
                    else:
                        break
                else:
                    j += 1
            out.append(Token("string" if c == "'" else "ident", sql[i:j + 1], i))
            i = j + 1
        elif c in _WORD_START:
            j = i + 1
            while j < n and sql[j] in _WORD:
                j += 1
            out.append(Token("word", sql[i:j], i))
            i = j
        elif c.isascii() and c.isdigit():
            j = i + 1
            while j < n and (sql[j] in _WORD or sql[j] == "." or
                             (sql[j] in "+-" and sql[j - 1] in "eEpP" and not sql[i:j].lower().startswith("0x"))):
                j += 1
            out.append(Token("number", sql[i:j], i))
            i = j
        elif c in _PUNCT:
            out.append(Token("punct", c, i))
            i += 1
        elif c == "$":
            raise _refuse(sql, i, "'$' (heredoc strings) is not accepted")
        else:
            raise _refuse(sql, i, f"unexpected character {c!r}")
    return out


def _unquote(text: str) -> str:
    """The name a quoted identifier stands for (backslash escapes and doubled quotes undone)."""
    q, body, out, i = text[0], text[1:-1], [], 0
    while i < len(body):
        if body[i] == "\\" and i + 1 < len(body):
            out.append(body[i + 1])
            i += 2
        elif body[i] == q and body[i + 1:i + 2] == q:
            out.append(q)
            i += 2
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def check_read_only(sql: str) -> str:
    """Return ``sql`` when it is one plain read; else raise :class:`UnsafeQuery` naming the place."""
    tokens = tokenize(sql)
    if not tokens:
        raise UnsafeQuery("line 1, column 1", "empty statement")
    for k, t in enumerate(tokens):
        if t.kind == "punct" and t.text == ";" and k != len(tokens) - 1:
            raise _refuse(sql, t.pos, "more than one statement: gpuq query runs exactly one")
    first = next((t for t in tokens if not (t.kind == "punct" and t.text == "(")), tokens[0])
    if first.kind != "word" or first.text.upper() not in STARTS:
        raise _refuse(sql, first.pos, f"{first.text!r} is not a read: a statement must start with "
                                      f"{', '.join(sorted(STARTS))}")
    depth, from_at = 0, set()            # paren depths inside a FROM clause (for ", table(...)")
    for k, t in enumerate(tokens):
        if t.kind == "punct":
            if t.text == "(":
                depth += 1
            elif t.text == ")":
                from_at.discard(depth)
                depth -= 1
            continue
        if t.kind == "word" and t.text.upper() in ("FROM", "JOIN"):
            from_at.add(depth)
        elif t.kind == "word" and t.text.upper() in _CLAUSE_ENDS:
            from_at.discard(depth)
        if t.kind not in ("word", "ident"):
            continue
        nxt = tokens[k + 1].text if k + 1 < len(tokens) and tokens[k + 1].kind == "punct" else ""
        if t.kind == "word":
            upper = t.text.upper()
            if upper == "SYSTEM" and nxt == ".":
                continue                              # the system database: system.tables
            if upper in FORBIDDEN_WORDS:
                raise _refuse(sql, t.pos, f"{upper} is not accepted: gpuq query only reads "
                                          f"(no INTO OUTFILE, writes, DDL, SYSTEM or SETTINGS)")
        if nxt != "(":
            continue
        # a call; ClickHouse also calls a quoted name: `file`('/etc/passwd') is file()
        lower = (t.text if t.kind == "word" else _unquote(t.text)).lower()
        prev = tokens[k - 1] if k > 0 else None
        after_from = prev is not None and (
            (prev.kind == "word" and prev.text.upper() in _TABLE_POSITION)
            or (prev.kind == "punct" and prev.text == "," and depth in from_at))   # FROM a, b(...)
        if lower in TABLE_FUNCTIONS and lower not in ALLOWED_TABLE_FUNCTIONS:
            raise _refuse(sql, t.pos, f"table function {lower}() reaches outside the store; allowed: "
                                      f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}")
        if after_from and lower not in ALLOWED_TABLE_FUNCTIONS:
            raise _refuse(sql, t.pos, f"table function {lower}() is not accepted; allowed: "
                                      f"{', '.join(sorted(ALLOWED_TABLE_FUNCTIONS))}")
    return sql
