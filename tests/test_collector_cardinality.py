"""Hostile scrape targets. Label-cardinality explosions are capped per target
(collector.max_series_per_target): a real runner scrapes a real HTTP page with 50,000 distinct
label values; the series already known are kept, new ones past the cap are refused, counted per
target and logged once. A page larger than collector.max_page_bytes is refused unread."""
from __future__ import annotations

import asyncio
import datetime as dt
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from collector.cardinality import SeriesCap
from collector.dcgm import DcgmTarget
from collector.health import CollectorMetrics
from collector.http import HttpClient
from collector.runner import CollectorRunner, spans_tracer
from gpuq.settings import CollectorSettings
from gpuq.store.writer import BatchWriter
from tests.conftest import serving
from tests.ray_fixtures import Canned, http_server_fixture  # noqa: F401

NORMAL = "".join(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{g}",modelName="H100"}} {g}\n' for g in range(8))


def exploding(first: int, n: int) -> str:
    """One series per line: a request id in a label, as a broken exporter would write."""
    return "".join(f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="GPU-0",pod="req-{i}"}} 1\n'
                   for i in range(first, first + n))


def test_cap_holds_on_a_50k_series_page(http_server: Canned, tmp_path: Path,
                                        caplog: pytest.LogCaptureFixture) -> None:
    cap = 1000
    url = http_server.set("/m", NORMAL + exploding(0, 50_000))
    quiet = http_server.set("/q", NORMAL)
    writer = BatchWriter(None, tmp_path / "spill", max_buffered_rows=10_000_000)
    registry = CollectorRegistry()
    tracer, spans = spans_tracer("memory")
    runner = CollectorRunner(writer, CollectorMetrics(registry, writer), tracer,
                             targets=[DcgmTarget("lab", url), DcgmTarget("lab", quiet)], jitter_s=0,
                             max_series_per_target=cap)
    labels = {"source": "dcgm", "cluster": "lab", "target": url}

    async def rounds(n: int) -> None:
        async with HttpClient(timeout_s=30) as client:
            for _ in range(n):
                await runner.run_round(client)

    with caplog.at_level(logging.WARNING, logger="collector.cardinality"):
        asyncio.run(rounds(1))
    assert writer.buffered() == {"gpu_samples": cap + 8}     # cap from the big page, 8 from the quiet one
    assert registry.get_sample_value("gpuq_collector_series_refused_total", labels) == 50_008 - cap
    assert registry.get_sample_value("gpuq_collector_series", labels) == cap
    assert registry.get_sample_value("gpuq_collector_series_refused_total", labels | {"target": quiet}) is None
    assert caplog.text.count("more than 1000 distinct series") == 1
    assert url in caplog.text
    span = next(s for s in spans.get_finished_spans() if s.attributes["gpuq.target"] == url)
    assert span.attributes["gpuq.series_refused"] == 50_008 - cap

    # the next page: a fresh burst first, the known GPU series last: the known ones are kept
    http_server.set("/m", exploding(50_000, 50_000) + NORMAL)
    before = writer.buffered()["gpu_samples"]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="collector.cardinality"):
        asyncio.run(rounds(1))
    new_rows = [r for r in writer._buf["gpu_samples"][before:] if r[3] == "GPU-0" or r[5] == "H100"]
    assert {r[11] for r in new_rows[-16:]} == {"DCGM_FI_DEV_GPU_UTIL"}   # the 8 known series, both targets
    assert writer.buffered()["gpu_samples"] == before + 16          # nothing new from the burst
    assert registry.get_sample_value("gpuq_collector_series_refused_total", labels) == (50_008 - cap) + 50_000
    assert "more than 1000" not in caplog.text                     # logged once, not every round
    assert runner.series_cap.known(("dcgm", "lab", url)) == cap


def row(pod: str, value: float = 1.0) -> tuple:
    now = dt.datetime.now(dt.timezone.utc)
    return (now, "c", "n", "GPU-0", 0, "H100", "", "", pod, "ns", "ctr", "DCGM_FI_DEV_FB_USED", value, "dcgm")


def test_series_unseen_for_forget_rounds_free_their_slots() -> None:
    cap = SeriesCap(3, forget_rounds=2)
    rows = {"gpu_samples": [row("a"), row("b"), row("c"), row("d")]}
    cap.new_round()
    assert cap.admit("t", rows) == 1 and [r[8] for r in rows["gpu_samples"]] == ["a", "b", "c"]
    for _ in range(2):                      # a, b, c go away; d keeps being refused meanwhile
        cap.new_round()
        assert cap.admit("t", {"gpu_samples": [row("d")]}) == 1
    cap.new_round()
    rows = {"gpu_samples": [row("d"), row("e")]}
    assert cap.admit("t", rows) == 0 and cap.known("t") == 2   # a, b, c forgotten: room again
    # the same series with a new value or time is the same series
    assert cap.admit("t", {"gpu_samples": [row("d", 7.0)]}) == 0 and cap.known("t") == 2
    # other tables than series tables are not capped
    assert cap.admit("t", {"ray_nodes": [("x",)] * 10}) == 0


def test_a_target_gone_for_forget_rounds_is_forgotten() -> None:
    cap = SeriesCap(10, forget_rounds=2)
    cap.new_round()
    cap.admit("gone", {"gpu_samples": [row("a")]})
    for _ in range(3):
        cap.new_round()
        cap.admit("live", {"gpu_samples": [row("a")]})
    assert cap.known("gone") == 0 and cap.known("live") == 1


def test_setting_reaches_the_runner() -> None:
    s = CollectorSettings(max_series_per_target=5)
    assert s.max_series_per_target == 5 and CollectorSettings().max_series_per_target == 20_000
    with pytest.raises(ValueError, match="max_series_per_target"):
        CollectorSettings(max_series_per_target=0)


@pytest.fixture
def endless_url() -> Iterator[str]:
    """A target that streams a page without Content-Length and never ends it on its own."""
    class Endless(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.end_headers()
            line = b'DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-0"} 1\n' * 1000
            try:
                for _ in range(10_000):          # ~450 MB if read to the end
                    self.wfile.write(line)
            except OSError:
                pass                             # the collector hung up: what we want

        def log_message(self, *a: object) -> None:
            pass

    with serving(Endless) as url:
        yield f"{url}/metrics"


def test_a_page_over_max_page_bytes_is_refused_unread(http_server: Canned, endless_url: str,
                                                      tmp_path: Path) -> None:
    big = http_server.set("/big", NORMAL * 3_000)                   # 1.5 MB, Content-Length given
    small = http_server.set("/small", NORMAL)
    writer = BatchWriter(None, tmp_path / "spill")
    registry = CollectorRegistry()
    tracer, _ = spans_tracer("none")
    runner = CollectorRunner(writer, CollectorMetrics(registry, writer), tracer, jitter_s=0,
                             timeout_s=20, max_page_bytes=2**20,
                             targets=[DcgmTarget("lab", u) for u in (big, small, endless_url)])
    stop = threading.Event()
    (report,) = runner.run(stop, once=True)
    assert report.outcomes[small] == "ok"
    for url in (big, endless_url):
        assert "answer larger than 1048576 bytes" in report.outcomes[url]
        assert "(collector.max_page_bytes): not read" in report.outcomes[url]
        assert registry.get_sample_value("gpuq_collector_scrapes_total", {
            "source": "dcgm", "cluster": "lab", "target": url, "result": "error"}) == 1
    assert writer.buffered() == {"gpu_samples": 8}                 # only the small page's rows
    assert "(1488000 announced)" in report.outcomes[big]          # refused on its Content-Length


def test_benchmark_reduced(capsys: pytest.CaptureFixture[str]) -> None:
    """benchmarks/bench_cardinality.py at its --quick size: the capped state is >= 5x smaller than
    the uncapped peer's and the cap costs less than parsing the page."""
    from benchmarks.bench_cardinality import main

    assert main(["--quick"]) == 0, capsys.readouterr().out
    assert "RESULT cardinality memory_ratio=" in capsys.readouterr().out
