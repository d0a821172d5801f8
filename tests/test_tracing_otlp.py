"""Spans over OTLP/HTTP to a local receiver (a real HTTP server decoding the protobuf
``ExportTraceServiceRequest`` with opentelemetry-proto), configured only by the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_SERVICE_NAME`` variables:

* ``gpuq serve`` sends a span per scrape (a DCGM page served locally), per scheduler cycle and per
  actuator call (the admission of a submitted workload), and flushes what it holds at SIGTERM;
* ``gpuq collect --once`` sends its scrape spans before it exits.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.conftest import data_path, die_with_parent, free_port, serving
from tests.test_serve import TOKEN, _env

REPO = Path(__file__).resolve().parents[1]


class Receiver:
    """An OTLP/HTTP trace receiver: ``POST /v1/traces`` with ``application/x-protobuf``."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest,
            ExportTraceServiceResponse,
        )

        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                ok = self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf"
                if ok:
                    req = ExportTraceServiceRequest()
                    req.ParseFromString(body)
                    with lock:
                        outer.requests += 1
                        for rs in req.resource_spans:
                            resource = {a.key: a.value.string_value for a in rs.resource.attributes}
                            for ss in rs.scope_spans:
                                for sp in ss.spans:
                                    attrs = {a.key: _value(a.value) for a in sp.attributes}
                                    outer.spans.append({"name": sp.name, "scope": ss.scope.name, "attrs": attrs,
                                                        "resource": resource, "status": sp.status.code})
                data = ExportTraceServiceResponse().SerializeToString() if ok else b""
                self.send_response(200 if ok else 404)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.handler, self.url = Handler, ""          # the url once served (the fixture)

    def names(self) -> set[str]:
        return {s["name"] for s in self.spans}


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class PageServer:
    def __init__(self, page: bytes) -> None:
        self.url = ""                                  # the page's url once served (the fixture)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(page)))
                self.end_headers()
                self.wfile.write(page)

        self.handler = Handler


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    with serving(r.handler) as r.url:
        yield r


@pytest.fixture
def page() -> Iterator[PageServer]:
    p = PageServer(data_path("dcgm", "datadog-integrations-core-metrics.txt").read_bytes())
    with serving(p.handler) as url:
        p.url = f"{url}/metrics"
        yield p


def otel_env(receiver: Receiver) -> dict[str, str]:
    env = {k: v for k, v in _env().items() if not k.startswith("OTEL_")}
    env.update(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_SERVICE_NAME="gpuq-test", OTEL_BSP_SCHEDULE_DELAY="200")
    return env


def config(tmp_path: Path, page: PageServer, port: int) -> Path:
    (tmp_path / "queues.yaml").write_text(yaml.safe_dump({"queues": {"a": {"guaranteed": {"gpu": 8}}}}))
    (tmp_path / "nodes.yaml").write_text(yaml.safe_dump([{"name": "h", "gpu_type": "H100", "gpus": 8, "count": 1}]))
    cfg = tmp_path / "gpuq.yaml"
    cfg.write_text(yaml.safe_dump({
        "store": {"dsn": f"chdb://{tmp_path / 'data'}", "spill_dir": str(tmp_path / "spill"), "batch_interval_s": 0.5},
        "queues_file": "queues.yaml",
        "scheduler": {"actuator": "dry-run", "cycle_interval_s": 0.2},
        "accounting": {"interval_s": 1},
        "collector": {"metrics_port": 0, "interval_s": 1, "otel_exporter": "otlp",
                      "dcgm": [{"cluster": "lab", "urls": [page.url]}]},
        "api": {"host": "127.0.0.1", "port": port, "tokens": [{"token": TOKEN, "role": "admin", "name": "ci"}]},
    }))
    return cfg


@pytest.mark.timeout(120)
def test_gpuq_serve_sends_scrape_cycle_and_actuator_spans(tmp_path: Path, receiver: Receiver,
                                                          page: PageServer) -> None:
    port = free_port()
    cfg = config(tmp_path, page, port)
    log = tmp_path / "serve.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpuq.cli", "serve", "--config", str(cfg), "--nodes", "nodes.yaml"],
                                cwd=tmp_path, env=otel_env(receiver), stdout=out, stderr=subprocess.STDOUT,
                                preexec_fn=die_with_parent)
    try:
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": f"Bearer {TOKEN}"},
                              timeout=5)
        end = time.monotonic() + 40
        while time.monotonic() < end:
            assert proc.poll() is None, log.read_text()
            try:
                if client.get("/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert client.post("/workloads", json={"id": "w1", "queue": "a", "gpus_per_pod": 4}).status_code == 201
        end = time.monotonic() + 20
        while client.get("/workloads/w1").json()["state"] != "running" and time.monotonic() < end:
            time.sleep(0.1)
        end = time.monotonic() + 20                                 # a scrape round happened
        while "scrape dcgm" not in receiver.names() and time.monotonic() < end:
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    names = receiver.names()
    assert {"scrape dcgm", "scheduler.cycle", "actuator.admit"} <= names, names
    admit = next(s for s in receiver.spans if s["name"] == "actuator.admit")
    assert admit["attrs"]["gpuq.workload"] == "w1" and admit["attrs"]["gpuq.ok"] is True
    assert admit["attrs"]["gpuq.actuator"] == "dry-run" and admit["attrs"]["gpuq.nodes"] == "h-0:4"
    assert admit["scope"] == "gpuq.scheduler"
    scrape = next(s for s in receiver.spans if s["name"] == "scrape dcgm")
    assert scrape["attrs"]["gpuq.target"] == page.url and scrape["scope"] == "gpuq.collector"
    cycles = [s for s in receiver.spans if s["name"] == "scheduler.cycle"]
    assert any(s["attrs"]["gpuq.admissions"] == 1 for s in cycles)
    assert {s["resource"].get("service.name") for s in receiver.spans} == {"gpuq-test"}


@pytest.mark.timeout(60)
def test_gpuq_collect_once_flushes_its_spans(tmp_path: Path, receiver: Receiver, page: PageServer) -> None:
    cfg = config(tmp_path, page, free_port())
    r = subprocess.run([sys.executable, "-m", "gpuq.cli", "collect", "--once", "--config", str(cfg)], cwd=tmp_path,
                       env={**otel_env(receiver), "OTEL_BSP_SCHEDULE_DELAY": "60000"},   # only the flush sends
                       capture_output=True, text=True, timeout=50)
    assert r.returncode == 0, r.stderr
    assert [s["name"] for s in receiver.spans] == ["scrape dcgm"]
    assert receiver.spans[0]["resource"]["service.name"] == "gpuq-test"
