"""Fuzzing the Prometheus text parser with hypothesis (issue 9): generated pages and their
mutations never crash it or hang it, every problem is a ParseError naming its line, and a
page generated from known samples parses to those samples, as prometheus_client's own parser
reads them. The coverage-guided harness is benchmarks/fuzz_parser.py (atheris)."""
from __future__ import annotations

import math
import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.fuzz_parser import check_page, render
from collector.errors import ParseError
from collector.prometheus import Sample, parse

FUZZ = settings(max_examples=300, deadline=2000, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

names = st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True)
label_names = st.from_regex(r"[a-zA-Z][a-zA-Z0-9_]{0,12}", fullmatch=True)
label_values = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
values = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**53, 2**53).map(float))
timestamps = st.one_of(st.none(), st.integers(0, 4_000_000_000_000))
samples = st.builds(Sample, names, st.dictionaries(label_names, label_values, max_size=5), values, timestamps)
pages = st.lists(samples, max_size=30)

NASTY = list('{}"\\#= \t\n\r,.eE+-_:') + ["\x00", "\ufeff", "é", "NaN", "Inf", "# EOF\n", '="', "}}", "\\n"]


def reference(text: str) -> list[Sample]:
    """prometheus_client's reading of a text-format page, as our Samples."""
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            ts = None if s.timestamp is None else round(float(s.timestamp) * 1000)
            out.append(Sample(s.name, dict(s.labels), float(s.value), ts))
    return out


@FUZZ
@given(pages)
def test_generated_pages_round_trip_like_prometheus_client(page: list[Sample]) -> None:
    text = render(page)
    got = parse(text)
    assert got.errors == []
    assert list(got) == page
    assert reference(text) == page


@FUZZ
@given(pages, st.data())
def test_mutated_pages_never_crash_and_name_the_line(page: list[Sample], data: st.DataObject) -> None:
    text = render(page, with_comments=True)
    for _ in range(data.draw(st.integers(1, 8))):
        op = data.draw(st.sampled_from(["insert", "delete", "replace", "duplicate"]))
        at = data.draw(st.integers(0, len(text)))
        if op == "insert":
            text = text[:at] + data.draw(st.sampled_from(NASTY)) + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + data.draw(st.integers(1, 10)):]
        elif op == "replace" and at < len(text):
            text = text[:at] + data.draw(st.sampled_from(NASTY)) + text[at + 1:]
        else:
            text = text[:at] + text[max(0, at - 40):at] + text[at:]
    check_page(text)


@FUZZ
@given(st.lists(st.sampled_from(NASTY + list("abc019 ")), max_size=200).map("".join))
def test_arbitrary_text_never_crashes(text: str) -> None:
    check_page(text)


def test_check_page_rejects_a_wrong_line_number() -> None:
    """The oracle itself can fail: a ParseError pointing at the wrong line is caught."""
    page = parse("ok 1\nbad{ 1\n")
    assert [(e.lineno, e.line) for e in page.errors] == [(2, "bad{ 1")]
    assert isinstance(page.errors[0], ParseError) and "line 2" in str(page.errors[0])
    page.errors[0].lineno = 1
    try:
        check_page("ok 1\nbad{ 1\n", parsed=page)
    except AssertionError:
        pass
    else:
        raise AssertionError("check_page accepted an error on the wrong line")


def test_pathological_lines_stay_linear() -> None:
    """Shapes that make backtracking regexes explode: 20,000-long repeats parse in well under a
    second each (the parser's fast path and tokenizer are linear on them)."""
    n = 20_000
    lines = {
        "exemplar braces": "a 1 # {" + "} a b c" * n,
        "label commas": "a{" + 'b="1",' * n + "} 1",
        "escaped quotes": 'a{b="' + '\\"' * n + "} 1",
        "open block": "a{" + " " * n,
        "hash runs": "a 1 " + "# {} 1 " * n,
        "tabs": "a 1 # {" + "}\t\ta\t\tb\t\tc" * n,
    }
    for what, line in lines.items():
        t0 = time.perf_counter()
        check_page(line)
        took = time.perf_counter() - t0
        assert took < 1.0, f"{what}: {took:.2f}s"
    assert math.isnan(parse("a NaN")[0].value)
