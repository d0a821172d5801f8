"""A fast path for the plain shape of YAML that gpuq's files have (issue 18): block mappings and
sequences of one-line scalars and one-line flow collections, as a scenario's ``workloads:`` list
is written. It gives exactly what PyYAML's ``CSafeLoader`` gives for such a text, or refuses it.

PyYAML's C loader spends about 17 us a line on a 50,000-workload scenario (7.4 s for its 430,000
lines, docs/PERFORMANCE.md), most of it in Python: a node and two marks per scalar, the resolver's
regular expressions, the constructor's generators.
:func:`load` matches every line with one regular expression (``findall``, in C, a slice of lines at
a time) and builds the dicts and lists directly. What a scalar means is not decided here: each distinct plain scalar goes once
through the loader's own resolver (``yaml_implicit_resolvers``) and its own constructor for the
tag found (``yes`` is ``True``, ``017`` is 15, ``1e3`` a string, ``1:20`` is 80, as YAML 1.1 and
PyYAML have it); the answer is cached for the scalar's next occurrence. Only two shortcuts skip
those calls, each doing what they do: a scalar whose first character has no resolver is a string,
and a plain decimal (``12``, ``-0.5``) is ``int()`` or ``float()`` of its text.

Everything outside that shape raises :class:`Unusual` and the caller loads the text the safe way
(:func:`gpuq.yamlsafe.safe_load`): anchors, aliases and tags (so the alias bound of issue 17 is
never skipped), block scalars (``|``, ``>``), multi-line scalars or flow collections, escapes in
double quotes, ``?`` keys, merge keys (``<<``), document markers and directives, tabs, carriage
returns, control and non-ASCII characters, any indentation that is not plainly nested, a plain
scalar holding ``:``, ``#``, ``,``, ``!``, ``&``, ``*``, a quote, a bracket or a brace. A file with
a syntax error is refused here too, so its message (file and line) still comes from PyYAML. The
fast path is only taken with PyYAML's stock resolver and constructors (nothing registered on the
loader class).
"""
from __future__ import annotations

import re
from collections.abc import Iterator
from itertools import chain
from typing import Any

import yaml
from yaml.nodes import ScalarNode

from gpuq.gcpause import collector_paused

__all__ = ["Unusual", "load"]


class Unusual(Exception):
    """The text is outside the fast path's shape (not an error: load it the safe way)."""


# A plain scalar: a first character that cannot start anything else, then words of safe
# characters separated by spaces (so never ": ", " #", a flow indicator or a quote).
_C = r"A-Za-z0-9_.~/()+^$=<>;@%-"
_PLAIN = rf"(?:[A-Za-z0-9_.~/(+^$=<;]|-(?=[A-Za-z0-9_.]))[{_C}]*(?: +[{_C}]+)*"
_SQ = r"'(?:[^'\n]|'')*'"
_DQ = r'"[^"\\\n]*"'
_SCALAR = rf"{_PLAIN}|{_SQ}|{_DQ}"

# Every line, in one of two forms. Content: indentation, an optional "- " (with its spaces),
# then "key:" with an optional value on the line, or a value alone (valid only after "- "); a
# value is a scalar, or a flow collection from its "[" or "{" to the end of the line (read by
# _flow). Else blank or a comment (all groups empty). A comment needs a space before its "#".
_LINE = re.compile(
    rf"^(?:( *)(- +)?(?:({_SCALAR}):(?: +(?:({_SCALAR})|([\[{{].*)))?|({_SCALAR})|([\[{{].*))(?: +#.*| *)"
    rf"| *(?:#.*)?)$", re.M)
_SLICE = 1 << 16
_MARKER = re.compile(r"^(?:---|\.\.\.)", re.M)
_ODD_CHAR = re.compile(r"[^\n\x20-\x7e]")
# A flow collection's tokens: punctuation, a colon (before a space), a scalar, a comment (after a
# space), or any other character (which refuses the line); _END closes the list.
_FLOW_TOKENS = re.compile(rf" *(?:([\[\]{{}},])|(:(?= ))|({_SCALAR})|((?<= )#.*)|(.))")
_END = ("", "", "", "", "end")
_SIMPLE_INT = re.compile(r"[-+]?(?:0|[1-9][0-9]*)$")
_SIMPLE_FLOAT = re.compile(r"[-+]?[0-9]+\.[0-9]+$")
# The scalar tags the safe constructor builds from the scalar's text alone.
_TAG = "tag:yaml.org,2002:"
_TAGS = frozenset(_TAG + t for t in ("null", "bool", "int", "float", "timestamp", "str"))

# Each content line becomes tokens (kind, column, key, value): _DASH (a "- "), _KEY (a key and
# its value, _NONE when nothing follows the colon), _ITEM (a value after "- "). Every token is
# used once, so a flow collection built for one is never shared.
_DASH, _KEY, _ITEM = 0, 1, 2
_NONE: Any = object()


def _stock(loader_cls: type) -> bool:
    """Whether ``loader_cls`` resolves and constructs scalars as PyYAML ships it (the shortcuts
    of _Scalars depend on it; a resolver added later is tried after the stock ones anyway)."""
    from yaml.constructor import SafeConstructor as S
    from yaml.resolver import Resolver

    constructors = getattr(loader_cls, "yaml_constructors", None)
    return (getattr(loader_cls, "yaml_implicit_resolvers", None) is Resolver.yaml_implicit_resolvers
            and constructors is S.yaml_constructors
            and all(constructors.get(_TAG + t) is f for t, f in (
                ("int", S.construct_yaml_int), ("float", S.construct_yaml_float), ("str", S.construct_yaml_str)))
            and not getattr(loader_cls, "yaml_path_resolvers", None))


class _Scalars(dict[str, Any]):
    """Scalar text (quotes included) to its value, filled as texts are first seen; a plain one as
    ``loader_cls`` resolves and constructs it."""

    def __init__(self, loader_cls: type) -> None:
        super().__init__()
        self.loader_cls = loader_cls
        self.loader: Any = None
        # resolve() tries the resolvers filed under the scalar's first character and those filed
        # under None (any character; none in stock PyYAML): where there are none, it is a string
        table = loader_cls.yaml_implicit_resolvers  # type: ignore[attr-defined]
        self.no_resolver = frozenset() if None in table else frozenset(
            chr(c) for c in range(0x20, 0x7f) if chr(c) not in table)

    def __missing__(self, text: str) -> Any:
        first = text[0]
        if first == "'":
            value: Any = text[1:-1].replace("''", "'")
        elif first == '"':
            value = text[1:-1]                  # no escapes (_DQ)
        elif first in self.no_resolver:         # resolve(): the default tag; construct_yaml_str
            value = text
        elif _SIMPLE_FLOAT.match(text):         # resolve(): float; construct_yaml_float: float()
            value = float(text)
        elif _SIMPLE_INT.match(text):           # resolve(): int; construct_yaml_int: int()
            value = int(text)
        else:
            if self.loader is None:
                self.loader = self.loader_cls("")
            tag = self.loader.resolve(ScalarNode, text, (True, False))
            if tag not in _TAGS:
                raise Unusual(f"plain scalar {text!r} resolves to {tag}")
            try:
                value = self.loader.yaml_constructors[tag](self.loader, ScalarNode(tag, text))
            except Exception as exc:            # PyYAML fails on it: let it say so
                raise Unusual(f"plain scalar {text!r}: {exc}") from None
        self[text] = value
        return value

    def dispose(self) -> None:
        if self.loader is not None:
            self.loader.dispose()


def load(text: str, loader_cls: type | None = None) -> Any:
    """The document in ``text`` as ``yaml.load(text, loader_cls)`` gives it (default
    ``CSafeLoader``, else ``SafeLoader``), or :class:`Unusual` when the text is outside the shape
    this reads."""
    if loader_cls is None:
        loader_cls = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    if not _stock(loader_cls):
        raise Unusual("the loader has its own resolvers or constructors")
    if not text.isascii() or _ODD_CHAR.search(text):
        raise Unusual("a tab, carriage return, control or non-ASCII character")
    if _MARKER.search(text):
        raise Unusual("a document marker")
    scalars = _Scalars(loader_cls)
    try:
        with collector_paused():            # dicts, lists and tuples, no reference cycles
            tokens = _tokens(text, scalars)
            if not tokens:
                return None
            b = _Builder(tokens)
            out = b.node(0)
        if b.pos != len(tokens):
            raise Unusual("content after the document's end")
        return out
    except RecursionError:
        raise Unusual("nested too deep") from None  # the safe path says so, with the line
    finally:
        scalars.dispose()


def _rows(text: str) -> Iterator[list[tuple[str, str, str, str, str, str, str]]]:
    """Every line's groups, a slice of about 64 KiB of lines at a time (so that the groups of
    the whole text are never held at once: they weigh some ten times the text)."""
    start, n = 0, len(text)
    while start <= n:
        end = text.find("\n", start + _SLICE)
        if end < 0:
            end = n
        rows = _LINE.findall(text, start, end)
        if len(rows) != text.count("\n", start, end) + 1:   # a line that matched neither form
            raise Unusual("a line outside the shape")
        yield rows
        start = end + 1


def _tokens(text: str, scalars: _Scalars) -> list[tuple[int, int, Any, Any]]:
    out: list[tuple[int, int, Any, Any]] = []
    append = out.append
    for ind, dash, key, kv, kf, v, f in chain.from_iterable(_rows(text)):
        col = len(ind)
        if dash:
            append((_DASH, col, None, None))
            col += len(dash)
        if key:
            if len(key) > 1000:
                raise Unusual("a key over 1,000 characters (PyYAML's simple keys stop at 1,024)")
            append((_KEY, col, scalars[key], scalars[kv] if kv else _flow(kf, scalars) if kf else _NONE))
        elif v:
            if not dash:
                raise Unusual("a scalar line")     # a multi-line scalar or a root scalar
            append((_ITEM, col, None, scalars[v]))
        elif f:
            if not dash:
                raise Unusual("a flow collection on a line of its own")
            append((_ITEM, col, None, _flow(f, scalars)))
        elif dash:
            raise Unusual("a dash without a value on its line")
    return out


def _flow(text: str, scalars: _Scalars) -> Any:
    """A flow collection that fills the rest of a line (then spaces or a comment), from its
    tokens (one pass in C); a character outside every token, or a wrong token, refuses it."""
    tokens = _FLOW_TOKENS.findall(text)
    tokens.append(_END)
    value, i = _flow_node(tokens, 0, scalars)
    if tokens[i][3]:                       # a comment
        i += 1
    if i != len(tokens) - 1:
        raise Unusual(f"after a flow collection: {text[:60]!r}")
    return value


def _flow_node(tokens: list[tuple[str, str, str, str, str]], i: int, scalars: _Scalars) -> tuple[Any, int]:
    p, _, s, _, _ = tokens[i]
    if s:
        return scalars[s], i + 1
    if p == "[":
        seq: list[Any] = []
        i += 1
        if tokens[i][0] == "]":
            return seq, i + 1
        while True:
            item, i = _flow_node(tokens, i, scalars)
            seq.append(item)
            p = tokens[i][0]
            i += 1
            if p == "]":
                return seq, i
            if p != ",":
                raise Unusual("in a flow sequence")
    if p == "{":
        mapping: dict[Any, Any] = {}
        i += 1
        if tokens[i][0] == "}":
            return mapping, i + 1
        while True:
            s = tokens[i][2]
            if not s or not tokens[i + 1][1]:
                raise Unusual("in a flow mapping: not a scalar key and a colon")
            mapping[scalars[s]], i = _flow_node(tokens, i + 2, scalars)
            p = tokens[i][0]
            i += 1
            if p == "}":
                return mapping, i
            if p != ",":
                raise Unusual("in a flow mapping")
    raise Unusual("in a flow collection")


class _Builder:
    """Blocks from tokens, by column: a mapping's keys share a column, a sequence's dashes too;
    a key's value sits deeper, or is a sequence at the key's own column (YAML's indentless
    sequence). Anything else is refused."""

    def __init__(self, tokens: list[tuple[int, int, Any, Any]]) -> None:
        self.tokens = tokens
        self.pos = 0

    def node(self, above: int) -> Any:
        kind, col = self.tokens[self.pos][:2]
        if col < above:
            raise Unusual("a block less indented than its parent")
        if kind == _KEY:
            return self.mapping(col)
        if kind == _DASH:
            return self.sequence(col)
        raise Unusual("a value where a block was expected")

    def mapping(self, col: int) -> dict[Any, Any]:
        tokens, n = self.tokens, len(self.tokens)
        out: dict[Any, Any] = {}
        while self.pos < n:
            kind, c, key, value = tokens[self.pos]
            if c < col:
                break
            if c > col or kind != _KEY:
                raise Unusual("a line out of its block")
            self.pos += 1
            if value is not _NONE:
                out[key] = value
            elif self.pos < n and tokens[self.pos][1] > col:
                out[key] = self.node(col + 1)
            elif self.pos < n and tokens[self.pos][1] == col and tokens[self.pos][0] == _DASH:
                out[key] = self.sequence(col)
            else:
                out[key] = None
        return out

    def sequence(self, col: int) -> list[Any]:
        tokens, n = self.tokens, len(self.tokens)
        out: list[Any] = []
        while self.pos < n:
            kind, c = tokens[self.pos][:2]
            if c < col or (kind == _KEY and c == col):
                break                                   # the end of an indentless sequence
            if c > col or kind != _DASH:
                raise Unusual("a line out of its block")
            kind, c, _, value = tokens[self.pos + 1]    # a dash is followed by its line's rest
            if kind == _ITEM:
                self.pos += 2
                out.append(value)
                if self.pos < n and tokens[self.pos][1] > col:
                    raise Unusual("a line below an item's value")
            else:
                self.pos += 1
                out.append(self.mapping(c))
        return out
