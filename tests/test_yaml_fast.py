"""The YAML fast path (issue 18, gpuq/yamlfast.py): whatever it reads, it reads to exactly what
PyYAML's C loader gives (types, key order, YAML 1.1's ``yes``/``017``/``1:20``), and it refuses
anything else to the bounded safe path: on YAML 1.1 corner cases, every YAML file of the
repository and every YAML block of its docs, the benchmark's 8-hour scenario at a reduced size in
both styles, and generated documents and their mutations. Errors still name the file and line as
before, and an alias bomb is still refused before anything is built."""
from __future__ import annotations

import datetime as dt
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks._sim_baseline.scenario import load_yaml as load_yaml_before
from benchmarks.bench_simulate import same, trickle_text
from gpuq import yamlfast
from gpuq.yamlsafe import ExpansionError, safe_load
from scheduler.errors import ScenarioError
from scheduler.simulator.scenario import load_yaml

REPO = Path(__file__).resolve().parents[1]
C_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
FUZZ = settings(max_examples=300, deadline=2000, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def reference(text: str) -> tuple[str, Any]:
    try:
        return "ok", yaml.load(text, Loader=C_LOADER)
    except Exception as exc:                # noqa: BLE001 - any failure: the fast path must not read it
        return "error", type(exc).__name__


def fast(text: str) -> tuple[str, Any]:
    try:
        return "ok", yamlfast.load(text)
    except yamlfast.Unusual:
        return "unusual", None


def check(text: str) -> bool:
    """The property: the fast path refuses ``text`` or reads it exactly as the C loader does.
    True when it read it."""
    got, ref = fast(text), reference(text)
    if got[0] == "unusual":
        return False
    assert ref[0] == "ok", f"the fast path read a text PyYAML refuses ({ref[1]}): {text!r}"
    assert same(got[1], ref[1]), f"{text!r}: fast {got[1]!r} != PyYAML {ref[1]!r}"
    return True


# Scalars whose meaning YAML 1.1 (PyYAML) and YAML 1.2 loaders disagree on, or that look like
# syntax: the faster YAML loaders on PyPI read many of these differently (docs/PERFORMANCE.md).
CORNERS = [
    "yes", "No", "on", "OFF", "y", "n", "True", "TRUE", "tRue", "~", "null", "Null", "NULL", "None", "017", "0o17", "08",
    "0x1F", "0x_1F", "0b101", "-0x10", "1_000", "1__2", "1:20", "190:20:30", "1:2.5", "1e3", "1.0e3", "1.0e+3",
    "12e03", "1.5e-3", ".inf", "-.INF", "+.inf", ".nan", ".NaN", "+.5", "-.5", ".5", "1.", "0.", "-0", "+12", "-0.0",
    "-1_0.5_0", "9999999999999999999999", "2024-01-01", "2024-1-1", "2002-12-14t21:59:43.10-05:00",
    "2001-12-14 21:59:43.10 -5", "=", "<<", "0.0.0", ".", "x-y_z.w+v", "a b", "a  b", "(x)", "^x", "$x", "~x", "/x/y",
    "x@y%z", "x;y", "-x", "_x", "w123", "org3.team7",
]


@pytest.mark.parametrize("scalar", CORNERS)
def test_each_corner_scalar_reads_as_pyyaml_reads_it(scalar: str) -> None:
    for text in (f"a: {scalar}\n", f"- {scalar}\n", f"{scalar}: 1\n", f"a: [{scalar}, x]\n",
                 f"a: {{k: {scalar}}}\n", f"a: '{scalar}'\n", f'a: "{scalar}"\n'):
        check(text)


@pytest.mark.parametrize("text", [
    "a: &x 1\nb: *x\n", "a: !!str 5\n", "a: |\n  x\n", "a: >\n  x\n", "a: x\n  y\n", "--- 1\n--- 2\n", "a: 1\n...\n",
    "%YAML 1.1\n---\na: yes\n", "a: 1\tb\n", "a:\t1\n", "? [1, 2]\n: x\n", "<<: {b: 1}\nc: 2\n", 'a: "x\\ty"\n',
    "a: b#c\n", "a: [1,]\n", "a: [1, 2\n", "a: {a:1}\n", "a: b: c\n", "a:b\n", "a:\n  - 1\n b: 2\n", "- - a\n",
    "-\n  a: 1\n", "a: it's\n", "a: é\n", "a: 1\r\nb: 2\r\n", "\ufeffa: 1\n", "a: \x07\n", "a: 1\n  b: 2\n",
    "a:\n    b: 1\n  c: 2\n", "  a: 1\nb: 2\n", "a: 1:20\n", "a: =\n", "a: 2024-01-01 10:00\n",
])
def test_what_the_fast_path_refuses(text: str) -> None:
    """Anchors, tags, block scalars, multi-line scalars, documents, tabs, escapes, odd indentation,
    non-ASCII and control characters, merge and ``?`` keys, sexagesimals, syntax errors: the safe
    path reads them (or says what is wrong), as before."""
    assert fast(text)[0] == "unusual"
    got: tuple[str, Any]
    try:
        got = "ok", safe_load(text)
    except Exception as exc:                # noqa: BLE001
        got = "error", type(exc).__name__
    ref = reference(text)
    assert got[0] == ref[0] and (same(got[1], ref[1]) if got[0] == "ok" else got[1] == ref[1])


@pytest.mark.parametrize("text", [
    "", "# only a comment\n", "a:\n", "a: 1\n\n\nb: 2\n", "a: 1 # c\n#d\n  #e\nb: 2\n", "a: b\n  # note\nc: d\n",
    "a:\n  b: 1\n  c:\n    - x\n    - y\n  d:\n  - z\ne: 2\n", "- a: 1\n  b: 2\n- c: 3\n-   d: 4\n    e: 5\n",
    "a:\n- 1\n- 2\nb: 3\n", "a: [a b, 'c d', \"e\"]  # c\n", "a: {a: 1, b: [2, 3], c: {d: e}}\n", "a: [ ]\nb: { }\n",
    "a: 'it''s'\n", "'': 1\n\"q\": ''\n", "1: a\n2: b\nyes: c\nnull: d\n", "a: 1\na: 2\nb: 3\n", "a:     b   \n",
])
def test_what_the_fast_path_reads(text: str) -> None:
    assert check(text), f"refused {text!r}"


def _repository_yaml() -> list[tuple[str, str]]:
    """Every YAML file of the repository and every YAML block of its Markdown, by path (hidden
    folders, virtual environments and Helm templates, which are not YAML until rendered, left out)."""
    paths = []
    for top, dirs, files in os.walk(REPO):
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in ("node_modules", "venv", "build",
                                                                             "templates", "__pycache__"))
        paths += [Path(top, f) for f in sorted(files) if f.endswith((".yaml", ".yml", ".md"))]
    texts = []
    for path in paths:
        f, text = path.relative_to(REPO).as_posix(), path.read_text()
        if f.endswith(".md"):
            texts += [(f"{f}#{i}", m.group(1)) for i, m in enumerate(re.finditer(r"```ya?ml\n(.*?)```", text, re.S))]
        else:
            texts.append((f, text))
    return texts


def test_every_yaml_of_the_repository_and_its_docs() -> None:
    read = {name for name, text in _repository_yaml() if check(text)}
    scenarios = {f"tests/scenarios/{p.name}" for p in (REPO / "tests" / "scenarios").glob("*.yaml")}
    assert scenarios and scenarios <= read, f"scenario files the fast path refused: {sorted(scenarios - read)}"
    assert "docs/SCENARIOS.md#0" in read    # the format's own example: comments, flow mappings, lists


@pytest.mark.parametrize("style", ["block", "flow"])
def test_the_benchmarks_scenario_reads_the_same(style: str) -> None:
    text = trickle_text(1_000, 26, style=style)
    assert check(text)
    assert len(yamlfast.load(text)["workloads"]) == 1_000


def test_a_bad_line_anywhere_in_a_long_text_is_refused() -> None:
    """The lines are matched a slice at a time: a bad line at either side of a slice's edge."""
    text = trickle_text(1_000, 26)
    assert len(text) > 2 * yamlfast._SLICE
    cuts = [text.find("\n", k * yamlfast._SLICE) for k in (1, 2)]
    for cut in cuts:
        for at in (cut, cut + 1, text.rfind("\n", 0, cut)):
            for bad in ("\n  - a: b: c", "\n\tx: 1", "\n  - id: [x", "\n!x"):
                assert fast(text[:at] + bad + text[at:])[0] == "unusual", (at, bad)
    assert check(text) and check(text[:cuts[0] + 1]) and check(text[:cuts[0]])


def test_pyyaml_with_its_own_resolvers_is_left_alone() -> None:
    class Loader(C_LOADER):                 # type: ignore[misc,valid-type]
        pass
    Loader.add_implicit_resolver("!dur", re.compile(r"^\d+m$"), list("0123456789"))
    with pytest.raises(yamlfast.Unusual):
        yamlfast.load("a: 5m\n", Loader)

    class Loader2(C_LOADER):                # type: ignore[misc,valid-type]
        pass
    Loader2.add_constructor("tag:yaml.org,2002:int", lambda loader, node: f"int {node.value}")
    with pytest.raises(yamlfast.Unusual):
        yamlfast.load("a: 5\n", Loader2)
    assert same(yamlfast.load("a: 5\n", C_LOADER), {"a": 5})


def test_a_syntax_error_names_the_file_and_line_as_before(tmp_path: Path) -> None:
    lines = trickle_text(200, 26).splitlines()
    at = lines.index("workloads:") + 120
    for broken in ("    pods: [1, 2", "   queue: x", "    priority: 1: 2", "  - id: 'x"):
        f = tmp_path / "s.yaml"
        f.write_text("\n".join(lines[:at] + [broken] + lines[at:]) + "\n")
        with pytest.raises(ScenarioError) as now:
            load_yaml(f)
        with pytest.raises(ScenarioError) as before:
            load_yaml_before(f)
        assert str(now.value) == str(before.value)
        assert str(f) in str(now.value) and re.search(r"line \d+", str(now.value))


def test_an_alias_bomb_never_reaches_the_fast_path() -> None:
    from tests.test_yaml_bounds import laughs

    with pytest.raises(yamlfast.Unusual):
        yamlfast.load(laughs())
    with pytest.raises(ExpansionError):
        safe_load(laughs())


def test_deep_nesting_is_refused_to_the_safe_path() -> None:
    deep = "".join(" " * i + "a:\n" for i in range(5_000))
    assert fast(deep)[0] == "unusual"
    assert fast("a: " + "[" * 5_000 + "]" * 5_000 + "\n")[0] == "unusual"


def test_timestamps_are_pyyamls() -> None:
    assert same(yamlfast.load("a: 2024-01-01\nb: 2002-12-14\n"), {"a": dt.date(2024, 1, 1), "b": dt.date(2002, 12, 14)})


# -- generated documents ---------------------------------------------------------------------------
_PLAIN = st.from_regex(r"[a-z0-9][a-z0-9._/-]{0,8}", fullmatch=True)
_NOISY = st.text(st.sampled_from(list("ab1 :#'\"[]{},-&*!|>%@`\\\t.é")), min_size=1, max_size=6)
_CLEAN = st.one_of(st.sampled_from(CORNERS), _PLAIN, _PLAIN)


def _scalar(draw: Any, noisy: bool) -> str:
    s = draw(st.one_of(_CLEAN, _NOISY) if noisy else _CLEAN)
    quote = draw(st.sampled_from(["", "", "", "'", '"']))
    return f"{quote}{s}{quote}" if quote != "'" else "'" + s.replace("'", "''") + "'"


@st.composite
def flows(draw: Any, noisy: bool, depth: int = 0) -> str:
    if depth > 2 or draw(st.booleans()):
        return _scalar(draw, noisy)
    items = [draw(flows(noisy, depth + 1)) for _ in range(draw(st.integers(0, 3)))]
    if draw(st.booleans()):
        return "[" + ", ".join(items) + "]"
    return "{" + ", ".join(f"{_scalar(draw, noisy)}: {v}" for v in items) + "}"


@st.composite
def blocks(draw: Any, noisy: bool, indent: int = 0, depth: int = 0) -> list[str]:
    """Lines of a block mapping or sequence at ``indent``; ``noisy``: with scalars of YAML's
    syntax characters, tabs and non-ASCII (mostly invalid or refused)."""
    pad = " " * indent
    lines: list[str] = []
    is_seq = draw(st.booleans())
    for _ in range(draw(st.integers(1, 4))):
        head = f"{pad}- " if is_seq else f"{pad}{_scalar(draw, noisy)}: "
        kind = draw(st.sampled_from(["scalar", "flow", "block", "empty"] if depth < 3 else ["scalar"]))
        comment = draw(st.sampled_from(["", "", "", "  # note", " #x"]))
        if kind == "scalar":
            lines.append(f"{head}{_scalar(draw, noisy)}{comment}")
        elif kind == "flow":
            lines.append(f"{head}{draw(flows(noisy))}{comment}")
        elif kind == "empty" and not is_seq:
            lines.append(head.rstrip() + comment)
        elif is_seq and draw(st.integers(0, 3)) > 0:            # "- key: value" and the keys under it
            inner = draw(blocks(noisy, indent + 2, depth + 1))
            lines.append(f"{head}{inner[0].lstrip(' ')}")
            lines += inner[1:]
        else:
            step = draw(st.sampled_from([1, 2, 4] if is_seq else [0, 2, 4]))   # 0: an indentless sequence
            lines.append(head.rstrip() + comment)
            lines += draw(blocks(noisy, indent + step, depth + 1))
        if draw(st.integers(0, 9)) == 0:
            lines.append(draw(st.sampled_from(["", "# c", " " * (indent + 1) + "# c", "   "])))
    return lines


documents = st.integers(0, 3).flatmap(lambda i: blocks(noisy=i == 0)).map(lambda lines: "\n".join(lines) + "\n")


@FUZZ
@given(documents)
def test_generated_documents_read_as_pyyaml_reads_them(text: str) -> None:
    check(text)


@FUZZ
@given(documents, st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(list(" -:#'\"[]{},\n\tx1&*!|>")),
                                     st.booleans()), min_size=1, max_size=4))
def test_mutated_documents_read_as_pyyaml_reads_them(text: str, edits: list[tuple[int, str, bool]]) -> None:
    for pos, ch, insert in edits:
        pos %= len(text)
        text = text[:pos] + ch + text[pos + (0 if insert else 1):]
    check(text)
