"""Read the Go composite literals of KAI-Scheduler's integration tests into Python values.

A small reader for the subset those test files use: typed and untyped composite literals
(``[]*jobs_fake.TestJobBasic{...}``, ``map[string]T{...}``, ``{...}``), keyed elements, strings
(``+`` concatenated), numbers, the named constants below, and ``pointer.Int(x)``-style calls,
which give their argument. A composite with keys is a dict; one without, a list. Used by
``transcribe.py`` only (a tool run by hand, never by the tests).
"""
from __future__ import annotations

import re
from typing import Any

CONSTANTS: dict[str, Any] = {
    "constants.PriorityTrainNumber": 50,
    "constants.PriorityInteractivePreemptibleNumber": 75,
    "constants.PriorityBuildNumber": 100,
    "constants.PriorityInferenceNumber": 125,
    "commonconstants.DefaultQueuePriority": 100,
    "true": True, "false": False, "nil": None,
}

_TOKEN = re.compile(r'\s+|//[^\n]*|/\*.*?\*/|(?P<t>"(?:[^"\\]|\\.)*"|`[^`]*`|[0-9][0-9.eE_]*'
                    r'|[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*|[{}\[\]():,*&+\-/])', re.S)


def tokens(text: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ValueError(f"cannot read Go at offset {pos}: {text[pos:pos + 40]!r}")
        if m.group("t"):
            out.append(m.group("t"))
        pos = m.end()
    return out


class Reader:
    def __init__(self, toks: list[str]) -> None:
        self.t, self.i = toks, 0

    def peek(self, k: int = 0) -> str:
        return self.t[self.i + k] if self.i + k < len(self.t) else ""

    def take(self, want: str | None = None) -> str:
        tok = self.t[self.i]
        if want is not None and tok != want:
            raise ValueError(f"expected {want!r}, got {tok!r} at token {self.i}")
        self.i += 1
        return tok

    def skip_type(self) -> None:
        """A type before ``{``: ``[]*pkg.T``, ``map[string]pkg.T``, ``pkg.T``."""
        while self.peek() != "{":
            self.take()

    def value(self) -> Any:
        v = self.term()
        while self.peek() in ("+", "-", "*", "/") and self.peek(1) not in ("{",):
            op = self.take()
            w = self.term()
            v = {"+": lambda a, b: a + b, "-": lambda a, b: a - b,
                 "*": lambda a, b: a * b, "/": lambda a, b: a / b}[op](v, w)
        return v

    def term(self) -> Any:
        tok = self.peek()
        if tok == "&":
            self.take()
            return self.term()
        if tok == "{":
            return self.composite()
        if tok in ("[", "map") or (tok[:1].isalpha() and self.peek(1) == "{"):
            self.skip_type()
            return self.composite()
        if tok.startswith('"'):
            self.take()
            return bytes(tok[1:-1], "utf-8").decode("unicode_escape")
        if tok.startswith("`"):
            self.take()
            return tok[1:-1]
        if tok[:1].isdigit():
            self.take()
            n = tok.replace("_", "")
            return float(n) if any(c in n for c in ".eE") else int(n)
        if tok == "-":
            self.take()
            return -self.term()
        if tok == "(":
            self.take()
            v = self.value()
            self.take(")")
            return v
        name = self.take()
        if self.peek() == "(":                   # a call: pointer.Int(x), ptr.To(x), time.Duration(x)
            self.take()
            args = []
            while self.peek() != ")":
                args.append(self.value())
                if self.peek() == ",":
                    self.take()
            self.take(")")
            return args[0] if len(args) == 1 else {"call": name, "args": args}
        if name in CONSTANTS:
            return CONSTANTS[name]
        return name.rsplit(".", 1)[-1] if name.startswith("pod_status.") else name

    def composite(self) -> Any:
        self.take("{")
        keyed: dict[Any, Any] = {}
        items: list[Any] = []
        while self.peek() != "}":
            if self.peek(1) == ":" and self.peek() != "{":
                key = self.term()
                self.take(":")
                keyed[key] = self.value()
            else:
                items.append(self.value())
            if self.peek() == ",":
                self.take()
        self.take("}")
        if keyed and items:
            raise ValueError("a composite with both keyed and plain elements")
        return keyed if keyed else items


def test_cases(go_source: str, anchor: str = "[]integration_tests_utils.TestTopologyMetadata{") -> list[dict[str, Any]]:
    """The cases of a KAI integration test file: the list after ``anchor``."""
    start = go_source.index(anchor)
    r = Reader(tokens(go_source[start:]))
    got = r.value()
    assert isinstance(got, list)
    return got
