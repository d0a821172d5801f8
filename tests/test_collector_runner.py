"""The runner: every target isolated (an unreachable one, a slow one, a malformed page), timeouts,
the collector's own health metrics and one OpenTelemetry span per scrape."""
from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from opentelemetry.trace import StatusCode
from prometheus_client import CollectorRegistry, generate_latest

from collector.dcgm import DcgmTarget
from collector.health import CollectorMetrics
from collector.http import HttpClient
from collector.runner import CollectorRunner, spans_tracer
from gpuq.store.writer import BatchWriter
from tests.conftest import closed_port, data_path, serving
from tests.ray_fixtures import Canned, http_server_fixture  # noqa: F401


@pytest.fixture
def slow_url() -> Iterator[str]:
    class Slow(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            time.sleep(3)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    with serving(Slow) as url:
        yield f"{url}/metrics"


def test_round_isolates_targets_and_records_health(http_server: Canned, slow_url: str, tmp_path: Path) -> None:
    page = data_path("dcgm", "datadog-integrations-core-metrics.txt").read_text()
    good = http_server.set("/good", page)
    broken = http_server.set("/broken", page.replace("DCGM_FI_DEV_MEM_CLOCK{", "DCGM_FI_DEV_MEM_CLOCK{gpu=", 1))
    dead = f"http://127.0.0.1:{closed_port()}/metrics"
    writer = BatchWriter(None, tmp_path / "spill")
    registry = CollectorRegistry()
    tracer, spans = spans_tracer("memory")
    runner = CollectorRunner(writer, CollectorMetrics(registry, writer), tracer,
                             targets=[DcgmTarget("lab", u) for u in (good, broken, dead, slow_url)],
                             timeout_s=1.0, jitter_s=0.2)

    async def go():  # noqa: ANN202
        async with HttpClient(timeout_s=5) as client:
            return await runner.run_round(client)
    t0 = time.monotonic()
    report = asyncio.run(go())
    assert time.monotonic() - t0 < 2.5                        # the slow target did not hold the round

    assert report.outcomes[good] == "ok" and report.outcomes[broken] == "ok"
    assert report.outcomes[slow_url] == "timeout"
    assert dead in report.outcomes[dead] and "cannot connect" in report.outcomes[dead]
    assert writer.buffered()["gpu_samples"] == report.rows > 0

    text = generate_latest(registry).decode()
    assert f'gpuq_collector_scrapes_total{{cluster="lab",result="ok",source="dcgm",target="{good}"}} 1.0' in text
    assert f'gpuq_collector_scrapes_total{{cluster="lab",result="timeout",source="dcgm",target="{slow_url}"}} 1.0' in text
    assert f'gpuq_collector_scrapes_total{{cluster="lab",result="error",source="dcgm",target="{dead}"}} 1.0' in text
    assert f'gpuq_collector_parse_errors_total{{cluster="lab",source="dcgm",target="{broken}"}} 1.0' in text
    assert 'gpuq_collector_rows_buffered{table="gpu_samples"}' in text

    finished = {s.attributes["gpuq.target"]: s for s in spans.get_finished_spans()}
    assert set(finished) == {good, broken, dead, slow_url}
    assert finished[good].status.status_code is not StatusCode.ERROR
    assert finished[good].attributes["gpuq.samples"] > 0
    assert finished[broken].attributes["gpuq.parse_errors"] == 1
    assert finished[dead].status.status_code is StatusCode.ERROR
    assert finished[slow_url].status.status_code is StatusCode.ERROR


def test_stop_ends_the_loop_between_rounds(http_server: Canned, tmp_path: Path) -> None:
    url = http_server.set("/m", "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",UUID=\"GPU-1\"} 5\n")
    writer = BatchWriter(None, tmp_path / "spill")
    tracer, _ = spans_tracer("none")
    runner = CollectorRunner(writer, CollectorMetrics(CollectorRegistry(), writer), tracer,
                             targets=[DcgmTarget("lab", url)], interval_s=30, jitter_s=0)
    stop = threading.Event()
    th = threading.Thread(target=runner.run, args=(stop,))
    th.start()
    deadline = time.monotonic() + 10
    while not writer.buffered() and time.monotonic() < deadline:
        time.sleep(0.05)
    t0 = time.monotonic()
    stop.set()
    th.join(timeout=5)
    assert not th.is_alive() and time.monotonic() - t0 < 1.0     # did not wait out the 30 s interval
    assert writer.buffered() == {"gpu_samples": 1}
