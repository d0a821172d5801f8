"""Coverage-guided fuzzing of the Prometheus text parser (collector.prometheus.parse).

    .venv/bin/pip install -e ".[fuzz]"                    # atheris (libFuzzer for Python)
    .venv/bin/python -m benchmarks.fuzz_parser --seconds 60 [--corpus DIR]
    .venv/bin/python -m benchmarks.fuzz_parser --seconds 60 --engine random   # no atheris needed

The oracle (:func:`check_page`, shared with tests/test_prometheus_parser_fuzz.py, which runs a
bounded hypothesis version inside ``make test``): ``parse`` never raises on any text; every
problem is a :class:`~collector.errors.ParseError` whose ``lineno`` and ``line`` are the page's own
line; every sample is well-typed; a page costs time linear in its size (at most
``SLOW_S_PER_MB`` seconds per MB, floor ``SLOW_FLOOR_S``). A violation raises, and atheris
saves the input as ``crash-*``.

Seeds: the recorded Ray and dcgm-exporter pages in tests/data. Every ``--report-s`` seconds, and at
the end, a line gives the inputs tried, our parse time against prometheus_client's parser on the
same inputs (``ratio`` = theirs / ours, its exceptions swallowed) and the peak RSS. Under atheris
our parser is instrumented for coverage and theirs is not, so the ratio there is no speed figure
(benchmarks/bench_parser.py is); atheris ends the process itself, so its last line is the last
periodic one. ``--engine random`` mutates the seeds with a seeded RNG (no coverage feedback).
"""
from __future__ import annotations

import argparse
import math
import random
import resource
import sys
import time
from collections.abc import Iterable
from pathlib import Path

from collector.errors import ParseError
from collector.prometheus import Page, Sample, parse

SEEDS = Path(__file__).resolve().parents[1] / "tests" / "data"
SEED_PAGES = ("ray/ray-2.60-head-idle-4gpu.prom", "dcgm/datadog-integrations-core-metrics.txt")
SLOW_S_PER_MB = 2.0
SLOW_FLOOR_S = 0.5


# -- rendering and the oracle (also used by the hypothesis tests) -------------------------------

def _value(v: float) -> str:
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(v)


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render(samples: Iterable[Sample], with_comments: bool = False) -> str:
    """Samples as a text-format (0.0.4) page, as a well-behaved exporter writes them."""
    out = []
    for i, s in enumerate(samples):
        if with_comments and i % 3 == 0:
            out.append(f"# HELP {s.name} help for {s.name}")
            out.append(f"# TYPE {s.name} gauge")
        labels = ",".join(f'{k}="{_escape(v)}"' for k, v in s.labels.items())
        line = s.name + (f"{{{labels}}}" if labels else "") + " " + _value(s.value)
        if s.timestamp_ms is not None:
            line += f" {s.timestamp_ms}"
        out.append(line)
    return "".join(line + "\n" for line in out)


def check_page(text: str, parsed: Page | None = None) -> Page:
    """Parse ``text`` (unless given) and check the parser's contract; AssertionError if broken."""
    t0 = time.perf_counter()
    page = parse(text) if parsed is None else parsed
    took = time.perf_counter() - t0
    limit = max(SLOW_FLOOR_S, SLOW_S_PER_MB * len(text) / 1e6)
    assert parsed is not None or took <= limit, f"{took:.2f}s for {len(text)} characters"
    body = text.replace("\r\n", "\n")
    if body[:1] == "\ufeff":
        body = body[1:]
    lines = body.split("\n")
    for err in page.errors:
        assert isinstance(err, ParseError), repr(err)
        assert 1 <= err.lineno <= len(lines), (err.lineno, len(lines))
        assert err.line == lines[err.lineno - 1][:200], (err.lineno, err.line)
        assert f"line {err.lineno}" in str(err) and err.message
    last = 0
    for err in page.errors:
        assert err.lineno > last, "errors out of line order"
        last = err.lineno
    for s in page:
        assert isinstance(s, Sample) and isinstance(s.name, str) and s.name, s
        assert isinstance(s.value, float), s
        assert s.timestamp_ms is None or isinstance(s.timestamp_ms, int), s
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in s.labels.items()), s
        assert "__name__" not in s.labels, s
    return page


# -- the harness ---------------------------------------------------------------------------------

class Stats:
    def __init__(self, report_s: float) -> None:
        self.report_s = report_s
        self.inputs = 0
        self.ours = 0.0
        self.theirs = 0.0
        self.started = self.last = time.monotonic()

    def one(self, text: str) -> None:
        t0 = time.perf_counter()
        check_page(text)
        t1 = time.perf_counter()
        try:
            from prometheus_client.parser import text_string_to_metric_families

            for _ in text_string_to_metric_families(text):
                pass
        except Exception:  # noqa: BLE001 - the peer's errors are not under test
            pass
        t2 = time.perf_counter()
        self.inputs += 1
        self.ours += t1 - t0
        self.theirs += t2 - t1
        if time.monotonic() - self.last >= self.report_s:
            self.report()

    def report(self, final: bool = False) -> None:
        self.last = time.monotonic()
        rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        ratio = self.theirs / self.ours if self.ours else float("nan")
        print(f"{'RESULT fuzz_parser' if final else 'fuzz_parser'} inputs={self.inputs} "
              f"seconds={self.last - self.started:.0f} ours_s={self.ours:.2f} "
              f"prometheus_client_s={self.theirs:.2f} ratio={ratio:.1f} peak_rss_mib={rss_mib:.0f}",
              flush=True)


def _mutate(rng: random.Random, text: str) -> str:
    nasty = list('{}"\\#= \t\n\r,.eE+-_:') + ["\x00", "\ufeff", "é", "NaN", "# EOF\n", '="', "\\n"]
    for _ in range(rng.randint(1, 8)):
        at = rng.randint(0, len(text))
        op = rng.randrange(4)
        if op == 0:
            text = text[:at] + rng.choice(nasty) + text[at:]
        elif op == 1:
            text = text[:at] + text[at + rng.randint(1, 20):]
        elif op == 2:
            text = text[:at] + rng.choice(nasty) + text[at + 1:]
        else:
            text = text[:at] + text[max(0, at - 80):at] * rng.randint(1, 50) + text[at:]
    return text


def seeds(corpus: Path | None) -> list[str]:
    found = [(SEEDS / p).read_text() for p in SEED_PAGES if (SEEDS / p).exists()]
    if corpus is not None and corpus.is_dir():
        found += [p.read_bytes().decode("utf-8", "replace") for p in sorted(corpus.iterdir()) if p.is_file()]
    # single lines too: small inputs mutate into more shapes per second
    return found + [line for page in found[:2] for line in page.splitlines()[:200]]


def run_random(seconds: float, stats: Stats, corpus: Path | None, seed: int) -> None:
    rng = random.Random(seed)
    pool = seeds(corpus)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stats.one(_mutate(rng, rng.choice(pool)))


def run_atheris(seconds: float, stats: Stats, corpus: Path | None) -> None:
    import atheris  # the [fuzz] extra

    def one(data: bytes) -> None:
        stats.one(data.decode("utf-8", "replace"))

    seed_dir = corpus
    if seed_dir is None:
        import tempfile

        seed_dir = Path(tempfile.mkdtemp(prefix="gpuq-fuzz-parser-"))
        for i, text in enumerate(seeds(None)[:50]):
            (seed_dir / f"seed-{i:03d}").write_text(text)
    argv = [sys.argv[0], f"-max_total_time={int(seconds)}", "-rss_limit_mb=4096", "-timeout=10",
            "-max_len=65536", str(seed_dir)]
    import collector.prometheus

    atheris.instrument_func(collector.prometheus.parse)   # coverage feedback: the parser's code
    for fn in vars(collector.prometheus).values():
        if callable(fn) and getattr(fn, "__module__", "") == "collector.prometheus" \
                and hasattr(fn, "__code__"):
            atheris.instrument_func(fn)
    atheris.Setup(argv, one)
    atheris.Fuzz()   # exits the process when the time is up; stats were printed every report_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--engine", choices=("atheris", "random"), default="atheris")
    ap.add_argument("--corpus", type=Path, default=None, help="atheris corpus directory (kept, grown)")
    ap.add_argument("--report-s", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    stats = Stats(args.report_s)
    if args.engine == "atheris":
        try:
            import atheris  # noqa: F401
        except ImportError:
            print("atheris is not installed (pip install -e '.[fuzz]'): using --engine random", flush=True)
            args.engine = "random"
    if args.engine == "atheris":
        run_atheris(args.seconds, stats, args.corpus)
    else:
        run_random(args.seconds, stats, args.corpus, args.seed)
    stats.report(final=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
