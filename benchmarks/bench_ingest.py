"""End to end collector ingest: N Ray nodes' metrics pages a round, over HTTP, into chDB.

    .venv/bin/python -m benchmarks.bench_ingest [--nodes 1000] [--rounds 3] [--gpus 8]

A separate process serves N distinct node pages (the real Ray 2.60 fixture page, given a node
address of its own, plus `ray_node_gpus_*`/`ray_node_gram_*` series for --gpus GPUs, as a
busy GPU node exports). The collector process runs the real runner round (httpx, jitter off,
our parser, row mapping, BatchWriter) into an embedded chDB store and flushes. Peer, in the
same run: the same round with prometheus_client's parser in place of ours. Prints rows/s into
chDB, pages/s, and the collector process's peak RSS (goal: under 1 GiB at 1,000 nodes).
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import resource
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "data" / "ray" / "ray-2.60-head-idle-4gpu.prom"


def node_page(base: str, i: int, gpus: int) -> bytes:
    ip = f"10.{i // 65536 % 256}.{i // 256 % 256}.{i % 256}"
    text = base.replace('NodeAddress="192.0.2.2"', f'NodeAddress="{ip}"')
    lines = [text.rstrip("\n")]
    for metric, val in (("ray_node_gpus_utilization", 37.0), ("ray_node_gram_used", 40960.0),
                        ("ray_node_gram_available", 40960.0), ("ray_node_gpus_power_milliwatts", 350000.0)):
        lines.append(f"# TYPE {metric} gauge")
        for g in range(gpus):
            lines.append(f'{metric}{{GpuDeviceName="NVIDIA H100 80GB HBM3",GpuIndex="{g}",'
                         f'GpuUuid="GPU-{i:06d}-{g}",SessionName="s",Version="2.60.0",ip="{ip}"}} {val + g}')
    return ("\n".join(lines) + "\n").encode()


def serve(port_q: mp.Queue, nodes: int, gpus: int) -> None:
    base = FIXTURE.read_text()
    pages = [node_page(base, i, gpus) for i in range(nodes)]

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802
            i = int(self.path.split("/")[2])
            body = pages[i]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: object) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        request_queue_size = 1024         # listen backlog: 128 concurrent connects at once

    srv = Server(("127.0.0.1", 0), H)
    port_q.put(srv.server_address[1])
    srv.serve_forever()


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_round(runner, stop) -> tuple[float, int]:  # noqa: ANN001
    from collector.http import HttpClient

    async def go() -> int:
        async with HttpClient(timeout_s=900, max_connections=128) as client:
            rep = await runner.run_round(client, stop)
            if rep.failed:
                raise SystemExit(f"{len(rep.failed)} targets failed, e.g. {next(iter(rep.failed.items()))}")
            return rep.rows
    t0 = time.perf_counter()
    rows = asyncio.run(go())
    runner.writer.flush()
    return time.perf_counter() - t0, rows


def fetch_compare(port: int, nodes: int) -> tuple[float, float]:
    """Seconds to GET every page once with our aiohttp client and with httpx's AsyncClient."""
    import httpx

    from collector.http import HttpClient

    urls = [f"http://127.0.0.1:{port}/node/{i}/metrics" for i in range(nodes)]

    async def ours() -> float:
        async with HttpClient(timeout_s=900, max_connections=128) as c:
            t = time.perf_counter()
            await asyncio.gather(*(c.get(u) for u in urls))
            return time.perf_counter() - t

    async def peer() -> float:
        limits = httpx.Limits(max_connections=128)
        async with httpx.AsyncClient(timeout=900, limits=limits) as c:
            t = time.perf_counter()
            rs = await asyncio.gather(*(c.get(u) for u in urls))
            [r.text for r in rs]
            return time.perf_counter() - t
    return min(asyncio.run(ours()) for _ in range(2)), min(asyncio.run(peer()) for _ in range(2))


def writer_throughput(store, spill: str, n: int) -> tuple[float, float]:  # noqa: ANN001
    """Rows/s through BatchWriter.flush (50k-row batches) against 100-row inserts, same rows."""
    import datetime as dt

    from gpuq.store.schema import COLUMNS
    from gpuq.store.writer import BatchWriter

    t0 = dt.datetime(2026, 11, 1, tzinfo=dt.timezone.utc)
    rows = [(t0 + dt.timedelta(seconds=15 * (i // 64)), "bench", f"node-{i % 64 // 8}", f"GPU-{i % 64}",
             i % 8, "NVIDIA H100 80GB HBM3", "", "", f"pod-{i % 64}", "team", "main",
             "DCGM_FI_DEV_GPU_UTIL", float(i % 100), "dcgm") for i in range(n)]
    w = BatchWriter(store, spill, batch_rows=50_000)
    start = time.perf_counter()
    w.write("gpu_samples", rows)
    w.flush()
    fast = n / (time.perf_counter() - start)
    small = rows[: max(n // 20, 1000)]
    start = time.perf_counter()
    for i in range(0, len(small), 100):
        store.insert("gpu_samples", small[i:i + 100], COLUMNS["gpu_samples"])
    slow = len(small) / (time.perf_counter() - start)
    return fast, slow


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--writer-rows", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="200 nodes, 2 rounds, 200k writer rows")
    a = ap.parse_args()
    if a.quick:
        a.nodes, a.rounds, a.writer_rows = 200, 2, 200_000
    if not FIXTURE.exists():
        print(f"missing {FIXTURE}", file=sys.stderr)
        return 2

    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    server = ctx.Process(target=serve, args=(q, a.nodes, a.gpus), daemon=True)
    server.start()
    port = q.get(timeout=60)

    from prometheus_client import CollectorRegistry
    from prometheus_client.parser import text_string_to_metric_families

    import collector.ray as ray_mod
    from collector.health import CollectorMetrics
    from collector.prometheus import Page, Sample
    from collector.ray import RayNodeMetricsTarget
    from collector.runner import CollectorRunner, spans_tracer
    from gpuq.store import open_store
    from gpuq.store.writer import BatchWriter

    tmp = tempfile.mkdtemp(prefix="gpuq-bench-ingest-")
    store = open_store(f"chdb://{tmp}/data")
    writer = BatchWriter(store, f"{tmp}/spill", batch_rows=200_000)
    tracer, _ = spans_tracer("none")
    targets = [RayNodeMetricsTarget("bench", f"http://127.0.0.1:{port}/node/{i}/metrics") for i in range(a.nodes)]
    runner = CollectorRunner(writer, CollectorMetrics(CollectorRegistry(), writer), tracer, targets=targets,
                             timeout_s=900, jitter_s=0)
    stop = threading.Event()

    def measure(label: str) -> float:
        run_round(runner, stop)          # warm-up: connections, caches
        best = float("inf")
        rows = 0
        for _ in range(a.rounds):
            wall, rows = run_round(runner, stop)
            best = min(best, wall)
        print(f"{label:>18}: {a.nodes} pages in {best:.3f} s  -> {a.nodes / best:,.0f} pages/s, "
              f"{rows / best:,.0f} rows/s into chDB ({rows:,} rows a round)")
        return rows / best

    f_ours, f_peer = fetch_compare(port, a.nodes)
    print(f"{'fetch only':>18}: aiohttp {f_ours:.2f} s, httpx {f_peer:.2f} s for {a.nodes} pages "
          f"({f_peer / f_ours:.1f}x)")
    ours = measure("gpuq parser")

    real_parse = ray_mod.parse

    def pc_parse(text: str, keep=None, source: str = "") -> Page:  # noqa: ANN001
        page = Page()
        for fam in text_string_to_metric_families(text):
            for s in fam.samples:
                if keep is None or keep(s.name):
                    page.append(Sample(s.name, dict(s.labels), float(s.value),
                                       None if s.timestamp is None else int(float(s.timestamp) * 1000)))
        return page

    ray_mod.parse = pc_parse  # type: ignore[assignment]
    try:
        peer = measure("prometheus_client")
    finally:
        ray_mod.parse = real_parse  # type: ignore[assignment]

    total = store.query(f"SELECT count() FROM {store.database}.gpu_samples").rows[0][0]
    peak_ingest = rss_mib()          # the goal is about the collector's rounds, not the writer test below
    w_rate, naive_rate = writer_throughput(store, f"{tmp}/spill2", a.writer_rows)
    print(f"{'BatchWriter':>18}: {w_rate:,.0f} gpu_samples rows/s into chDB (batches of 50,000, dedup tokens)")
    print(f"{'100-row inserts':>18}: {naive_rate:,.0f} rows/s (the naive peer)")
    store.close()
    server.terminate()
    peak = rss_mib()
    print(f"rows stored: {total:,} gpu_samples; peak RSS during the rounds: {peak_ingest:.0f} MiB "
          f"(after the writer test holding {a.writer_rows:,} rows: {peak:.0f} MiB)")
    print(f"RESULT ingest nodes={a.nodes} rows_per_s={ours:,.0f} peer_rows_per_s={peer:,.0f} "
          f"ratio={ours / peer:.1f}x writer_rows_per_s={w_rate:,.0f} writer_ratio={w_rate / naive_rate:.1f}x "
          f"peak_rss_mib={peak_ingest:.0f}")
    return 0 if peak_ingest < 1024 else 1


if __name__ == "__main__":
    raise SystemExit(main())
