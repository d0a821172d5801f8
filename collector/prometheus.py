"""Parser for the Prometheus text format (0.0.4) and OpenMetrics text (1.0, 2.0 names).

``parse(text) -> Page``: a list of :class:`Sample` (one per series line, in page order) with
``errors`` (malformed lines, skipped; the rest of the page is kept), ``types`` and ``helps``
(metric family -> ``# TYPE`` / ``# HELP`` text, keyed by the name written on that line).

Accepted syntax: ``# HELP``/``# TYPE``/``# UNIT`` and other comments, blank lines, ``# EOF``
(ends the page), CRLF or LF line ends, a last line without newline, label values with the
escapes ``\\\\`` ``\\"`` ``\\n`` (other backslash pairs are kept verbatim, as Prometheus does),
a trailing comma in a label set, spaces and tabs around ``{ } = ,``, quoted UTF-8 metric and label
names (``{"my.metric", "label.name"="v"}`` or ``__name__="..."``), values as Go's ParseFloat reads
them (ints, floats, exponents, ``NaN``, ``Inf``, ``+Inf``, ``-Inf``; no ``_``, no hex), optional
timestamps, OpenMetrics exemplars (``# {trace_id="..."} 1.0 123`` after the value: ignored).

Timestamps: a page whose last non-blank line is ``# EOF`` is OpenMetrics, whose timestamps are
seconds (float); everywhere else they are milliseconds (ints; a float is read as ms, as
prometheus_client does). ``Sample.timestamp_ms`` is always int ms. Text after a ``# EOF`` line is
not parsed (one error names its first line).

``keep``: a collection of names keeps the samples whose series name is in it; a family name ``x``
also keeps ``x_bucket x_count x_sum x_created x_total x_info x_gcount x_gsum`` (FAMILY_SUFFIXES),
so ``keep={"x"}`` keeps a whole histogram or summary. With a collection, a series line that does
not start with a kept name is skipped unread (a string prefix test): it costs next to nothing and
adds no errors. A callable gets each series name (called once per distinct name per page) after
the line's shape matched and before its labels are parsed; a line the fast match rejects is
parsed in full, so its errors are reported whatever the callable says. ``# HELP``/``# TYPE`` are
recorded for every family either way.

Labels: each sample gets its own plain ``dict`` in page order, so a caller may mutate one
sample's labels without touching another's. A label block repeated within a page is parsed once:
its first sample gets the parsed dict, later ones a copy made during the parse, and the cache
dies with the call (a copy costs little; read-only proxies would trip json and similar code).

Values are always ``float``; a page is always str (decode bytes as UTF-8 first); a leading BOM
is dropped.

Speed: a well-formed line (legacy names, no escapes, single spaces) takes one compiled
``fullmatch``; anything else falls back to a small tokenizer that also names what is wrong.
See docs/PERFORMANCE.md and ``benchmarks/bench_parser.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import NamedTuple, cast

from collector.errors import ParseError

__all__ = ["Page", "Sample", "parse", "FAMILY_SUFFIXES"]

FAMILY_SUFFIXES = ("_bucket", "_count", "_sum", "_created", "_total", "_info", "_gcount", "_gsum")
_TYPES = frozenset(  # text format's five plus OpenMetrics' (accepted in both: be lenient)
    {"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset", "gaugehistogram"}
)
_NAN = float("nan")


class Sample(NamedTuple):
    """One series value: an immutable tuple (``labels`` is a dict of its own per sample).

    Equality is by value, and a NaN value equals a NaN value (unlike plain tuples of floats).
    """

    name: str
    labels: dict[str, str]
    value: float
    timestamp_ms: int | None = None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sample):
            return tuple.__eq__(self, other)  # type: ignore[no-any-return]
        a, b = self.value, other.value
        return (
            self.name == other.name
            and self.labels == other.labels
            and self.timestamp_ms == other.timestamp_ms
            and (a == b or (a != a and b != b))
        )

    def __ne__(self, other: object) -> bool:
        eq = self.__eq__(other)
        return eq if eq is NotImplemented else not eq


Sample.__hash__ = None  # type: ignore[assignment]  # labels is a dict


class Page(list[Sample]):
    """The samples of one page, plus what else the page said."""

    __slots__ = ("errors", "types", "helps")

    def __init__(self, samples: Iterable[Sample] = ()) -> None:
        super().__init__(samples)
        self.errors: list[ParseError] = []
        self.types: dict[str, str] = {}
        self.helps: dict[str, str] = {}


class _BadLine(Exception):
    """Internal: why a line was rejected (turned into a ParseError with its line number)."""


# ---------------------------------------------------------------------------------------------
# Fast path: one fullmatch for the common well-formed line.

# The label block is taken as one span here; _fast_labels() splits it on '",' and checks each
# 'name="value' piece (once per distinct piece per page), which is cheaper than a regex that
# walks every label of every line. Distinct blocks are parsed once per page.
_FAST_HEAD = r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? ([-+.0-9a-zA-Z]+)"
_EXEMPLAR = r'(?: # \{.*\} [^ ]+(?: [^ ]+)?)?'
_fast_text = re.compile(_FAST_HEAD + r"(?: (-?[0-9]+))?" + _EXEMPLAR).fullmatch
_fast_om = re.compile(_FAST_HEAD + r"(?: ([-+]?[0-9.eE+\-]+))?" + _EXEMPLAR).fullmatch
_LNAME = r"[a-zA-Z_][a-zA-Z0-9_]*"
_piece = re.compile("(" + _LNAME + r')="([^"\\]*)').fullmatch
_meta = re.compile(  # the usual # TYPE / # HELP line (no escapes); others go to _comment()
    r"# (?:TYPE ([a-zA-Z_:][a-zA-Z0-9_:]*) (" + "|".join(sorted(_TYPES)) + r")"
    r"|HELP ([a-zA-Z_:][a-zA-Z0-9_:]*)(?: ([^\\]*))?)"
).fullmatch

# ---------------------------------------------------------------------------------------------
# Slow path pieces.

_ws = cast("Callable[..., re.Match[str]]", re.compile(r"[ \t]*").match)  # matches anywhere (maybe empty)
_legacy_name = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*").match
_label_name = re.compile(_LNAME).match
_quoted = re.compile(r'"((?:[^"\\]|\\.)*)"').match
_escape = re.compile(r'\\([\\n"])')
_value_chars = re.compile(r"[-+.0-9a-zA-Z]+").fullmatch
_int_ts = re.compile(r"[-+]?[0-9]+").fullmatch
_exemplar = re.compile(r'[ \t]*\{.*\}[ \t]+\S+(?:[ \t]+\S+)?[ \t]*').fullmatch
_UNESCAPE = {"\\": "\\", "n": "\n", '"': '"'}


def _unescape(s: str) -> str:
    return _escape.sub(lambda m: _UNESCAPE[m.group(1)], s) if "\\" in s else s


def _value(tok: str) -> float:
    if _value_chars(tok) is None:
        raise _BadLine(f"invalid value {tok!r}")
    try:
        return float(tok)
    except ValueError:
        raise _BadLine(f"invalid value {tok!r}") from None


def _timestamp_ms(tok: str, om: bool) -> int:
    if not om and _int_ts(tok) is not None:
        return int(tok)
    try:
        t = float(tok) if _value_chars(tok) else _NAN
    except ValueError:
        t = _NAN
    if t != t or t in (float("inf"), float("-inf")):
        raise _BadLine(f"invalid timestamp {tok!r}")
    return round(t * 1000) if om else round(t)


def _label_block(s: str, pos: int, name: str | None) -> tuple[dict[str, str], str | None, int]:
    """Parse labels from just after '{'; returns (labels, metric name, position after '}')."""
    labels: dict[str, str] = {}
    n = len(s)
    first = True
    while True:
        pos = _ws(s, pos).end()
        if pos >= n:
            raise _BadLine("unterminated label block: missing '}'")
        if s[pos] == "}":
            return labels, name, pos + 1
        if s[pos] == '"':
            m = _quoted(s, pos)
            if m is None:
                raise _BadLine("unterminated quoted name in label block")
            term, quoted = _unescape(m.group(1)), True
        else:
            m = _label_name(s, pos)
            if m is None:
                raise _BadLine(f"invalid label name at {s[pos:pos + 20]!r}")
            term, quoted = m.group(), False
        pos = _ws(s, m.end()).end()
        if quoted and first and name is None and pos < n and s[pos] in ",}":
            name = term  # {"my.metric", ...}: the quoted metric name comes first
        else:
            if pos >= n or s[pos] != "=":
                raise _BadLine(f"expected '=' after label name {term!r}")
            pos = _ws(s, pos + 1).end()
            if pos >= n or s[pos] != '"':
                raise _BadLine(f"expected '\"' to open the value of label {term!r}")
            m = _quoted(s, pos)
            if m is None:
                raise _BadLine(f"unterminated value of label {term!r}")
            if term in labels:
                raise _BadLine(f"duplicate label name {term!r}")
            labels[term] = _unescape(m.group(1))
            pos = _ws(s, m.end()).end()
        first = False
        if pos >= n:
            raise _BadLine("unterminated label block: missing '}'")
        if s[pos] == ",":
            pos += 1
        elif s[pos] != "}":
            raise _BadLine(f"expected ',' or '}}' after label {term!r}, found {s[pos]!r}")


def _slow_sample(line: str, om: bool) -> Sample:
    s = line.strip(" \t")
    name: str | None = None
    pos = 0
    if s[0] == '"':
        m = _quoted(s)
        if m is None:
            raise _BadLine("unterminated quoted metric name")
        name, pos = _unescape(m.group(1)), m.end()
    elif s[0] != "{":
        m = _legacy_name(s)
        if m is None:
            raise _BadLine(f"invalid metric name at {s[:20]!r}")
        name, pos = m.group(), m.end()
    labels: dict[str, str] = {}
    brace = _ws(s, pos).end()
    if brace < len(s) and s[brace] == "{":
        labels, name, pos = _label_block(s, brace + 1, name)
    if "__name__" in labels:
        if name is not None:
            raise _BadLine("metric name given twice (before the labels and as __name__)")
        name = labels.pop("__name__")
    if not name:
        raise _BadLine("missing metric name")
    rest = s[pos:]
    if not rest or rest[0] not in " \t":
        if rest and brace == pos and s[0] not in '"{':
            raise _BadLine(
                f"invalid character {rest[0]!r} after metric name {name!r} "
                '(UTF-8 names must be quoted: {"my.metric"})'
            )
        found = repr(rest[0]) if rest else "end of line"
        raise _BadLine(f"expected a space and a value after {name!r}, found {found}")
    body, hashmark, exemplar = rest.partition("#")
    if hashmark and _exemplar(exemplar) is None:
        raise _BadLine("malformed exemplar (expected '# {labels} value [timestamp]')")
    toks = body.split()
    if not toks:
        raise _BadLine(f"missing value for {name!r}")
    if len(toks) > 2:
        raise _BadLine(f"unexpected text after the timestamp: {toks[2]!r}")
    ts = _timestamp_ms(toks[1], om) if len(toks) == 2 else None
    return Sample(name, labels, _value(toks[0]), ts)


def _comment(line: str, page: Page) -> None:
    """Record # HELP / # TYPE; other comments are ignored."""
    body = line[1:].lstrip(" \t")
    kind = body[:4]
    if kind not in ("HELP", "TYPE") or (len(body) > 4 and body[4] not in " \t"):
        return
    rest = body[4:].lstrip(" \t")
    if rest.startswith('"'):
        m = _quoted(rest)
        if m is None:
            raise _BadLine(f"unterminated quoted metric name in # {kind} line")
        name = _unescape(m.group(1))
    else:
        m = _legacy_name(rest)
        if m is None:
            raise _BadLine(f"missing or invalid metric name in # {kind} line")
        name = m.group()
    rest = rest[m.end():]
    if rest and rest[0] not in " \t":
        raise _BadLine(f"invalid metric name in # {kind} line at {rest[:20]!r} (quote UTF-8 names)")
    if kind == "TYPE":
        rest = rest.strip(" \t")
        if rest not in _TYPES:
            raise _BadLine(f"unknown metric type {rest!r} for {name!r}")
        page.types[name] = rest
    else:
        page.helps[name] = _unescape(rest[1:])  # the doc follows one blank, kept verbatim


# ---------------------------------------------------------------------------------------------


def _keep_fns(
    keep: Callable[[str], bool] | Collection[str] | None,
) -> tuple[tuple[str, ...] | None, Callable[[str], bool] | None]:
    """(line prefixes worth reading or None, exact test of a series name or None)."""
    if keep is None:
        return None, None
    if isinstance(keep, str):
        raise TypeError("keep must be a collection of names or a callable, not a str")
    if callable(keep):
        decided: dict[str, bool] = {}

        def want(name: str) -> bool:
            r = decided.get(name)
            if r is None:
                r = decided[name] = bool(keep(name))  # type: ignore[operator]
            return r

        return None, want
    names = set(keep)
    # Comments, quoted names and odd lines are always read; a series line only if it starts with a
    # kept name (its exact name is checked after the line matched, before its labels are parsed).
    prefixes = tuple(sorted(names)) + ("#", "{", '"', " ", "\t")
    return prefixes, frozenset(names | {n + s for n in names for s in FAMILY_SUFFIXES}).__contains__


def _is_openmetrics(text: str) -> bool:
    tail = text[-64:].rstrip()
    return tail.endswith("\n# EOF") or tail == "# EOF"


def parse(
    text: str,
    *,
    keep: Callable[[str], bool] | Collection[str] | None = None,
    source: str = "<page>",
) -> Page:
    """Parse one exposition page. Never raises on bad input: see ``Page.errors``."""
    if "\r" in text:
        text = text.replace("\r\n", "\n")
    if text[:1] == "\ufeff":
        text = text[1:]
    om = _is_openmetrics(text)
    fast = _fast_om if om else _fast_text
    prefixes, want = _keep_fns(keep)
    page = Page()
    append = page.append
    errors = page.errors
    types = page.types
    helps = page.helps
    blocks: dict[str, dict[str, str]] = {}  # label block text -> parsed labels (copied per sample)
    pieces: dict[str, tuple[str, str]] = {}  # 'name="value' -> (name, value), checked
    new = tuple.__new__
    lines = enumerate(text.split("\n"), 1)
    for lineno, line in lines:
        if prefixes is not None and not line.startswith(prefixes):
            continue
        m = fast(line)
        if m is not None:
            name, block, value, ts = m.groups()
            if want is not None and not want(name):
                continue
            if block:
                labels = blocks.get(block)
                if labels is not None:
                    labels = labels.copy()  # the first user of a block got the cached dict itself
                else:
                    labels = _fast_labels(block, pieces, blocks)
                    if labels is not None:
                        blocks[block] = labels
            else:
                labels = {}
            if labels is not None:
                try:
                    v = float(value)
                    if ts is not None:
                        ts = _timestamp_ms(ts, True) if om else int(ts)
                except (ValueError, _BadLine):
                    pass  # the slow path names the problem
                else:
                    append(new(Sample, (name, labels, v, ts)))
                    continue
        elif line[:1] == "#":
            m = _meta(line)
            if m is not None:
                name, kind, help_name, doc = m.groups()
                if name:
                    types[name] = kind
                else:
                    helps[help_name] = doc or ""
                continue
        if not line or line.isspace():
            continue
        try:
            if line.lstrip(" \t")[0] == "#":
                if line.strip(" \t") == "# EOF":
                    _after_eof(lines, errors, source)
                    break
                _comment(line.lstrip(" \t"), page)
                continue
            sample = _slow_sample(line, om)
        except _BadLine as bad:
            errors.append(ParseError(str(bad), lineno=lineno, line=line, source=source))
            continue
        if want is None or want(sample.name):
            append(sample)
    return page


def _fast_labels(
    block: str, pieces: dict[str, tuple[str, str]], blocks: dict[str, dict[str, str]]
) -> dict[str, str] | None:
    """Labels of a block without escapes, or None (then the slow path parses and reports).

    Histogram buckets repeat one label set with only ``le`` changing: such a block is built from
    the labels of the same block with ``le=""`` (parsed once, same order), then ``le`` is set.
    """
    i = block.find('le="')
    if i >= 0 and (i == 0 or block[i - 1] == ","):
        j = block.find('"', i + 4)
        le = block[i + 4 : j]
        if j > i and le and "\\" not in le:
            base_key = block[: i + 4] + block[j:]
            base = blocks.get(base_key)
            if base is None:
                base = _split_labels(base_key, pieces)
                if base is None:
                    return None
                blocks[base_key] = base
            labels = base.copy()
            labels["le"] = le
            return labels
    return _split_labels(block, pieces)


def _split_labels(block: str, pieces: dict[str, tuple[str, str]]) -> dict[str, str] | None:
    """The block is well-formed iff it ends with '"' (after an optional trailing comma) and every
    piece of block[:-1].split('",') is 'name="value' with a legacy name and no '"' or '\\' in the
    value: values cannot hold '"', so '",' only occurs between labels.
    """
    if block[-1] == ",":
        block = block[:-1]
    if block[-1:] != '"':
        return None
    parts = block[:-1].split('",')
    items = list(map(pieces.get, parts))
    if None in items:
        for k, part in enumerate(parts):
            if items[k] is None:
                m = _piece(part)
                if m is None:
                    return None
                items[k] = pieces[part] = m.groups()  # type: ignore[assignment]
    labels = dict(items)  # type: ignore[arg-type]
    if len(labels) != len(parts) or "__name__" in labels:
        return None  # a duplicate name, or the metric name given twice
    return labels


def _after_eof(lines: Iterator[tuple[int, str]], errors: list[ParseError], source: str) -> None:
    for lineno, extra in lines:
        if extra and not extra.isspace():
            msg = "text after '# EOF' (the rest of the page is ignored)"
            errors.append(ParseError(msg, lineno=lineno, line=extra, source=source))
            return
