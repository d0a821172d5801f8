"""Slow clients against a real ``gpuq serve`` at its default limits (issue 17).
``python -m benchmarks.bench_slow_clients [--connections 200]``

A real ``gpuq serve`` (its own process, as :mod:`benchmarks.bench_api_load` starts it: dry-run
actuator, chDB store in a temporary directory, viewer and scoped operator tokens, the default
``api.header_timeout_s`` 10 s, ``api.body_timeout_s`` 10 s, ``api.body_min_bytes_per_s`` 1024,
``api.max_connections`` 512). While another caller sends ``GET /healthz`` and ``GET /queues``
(viewer token) on a new connection every 20 ms, ``--connections`` slow connections open at once:
half send a request line and then one header line every 2 s and never finish (slowloris), half
are an operator's ``POST /dry-run`` with ``Content-Length: 5000`` whose body comes a byte every
0.5 s (2 bytes/s). Printed: the other caller's p50/p99/max and errors over the window, when the
slow connections were closed (seconds after each opened: min, median, max per kind), the
server's ``gpuq_api_connections_closed_total`` and its RSS before and at the peak (``VmHWM``).

Goal (the issue's): the other caller's p99 under 100 ms with no error, every slow connection
closed within 30 s; the exit status is 1 when missed. The last line is ``RESULT slow_clients ...``.
"""
from __future__ import annotations

import argparse
import asyncio
import http.client
import re
import statistics
import tempfile
import threading
import time
from pathlib import Path

import httpx

from benchmarks.bench_api_load import OPERATOR, VIEWER, serve, vm_hwm_mib

GIVE_UP_S = 40.0


async def slow(port: int, head: bytes, drip: bytes, every_s: float) -> float | None:
    """Seconds until the server closed the connection (None: still open after ``GIVE_UP_S``)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    t0 = loop.time()
    writer.write(head)
    read = asyncio.ensure_future(reader.read(65536))
    try:
        while loop.time() - t0 < GIVE_UP_S:
            await asyncio.wait([read], timeout=every_s)
            if read.done():
                return loop.time() - t0
            writer.write(drip)
        return None
    finally:
        read.cancel()
        writer.transport.abort()


class Caller(threading.Thread):
    def __init__(self, port: int) -> None:
        super().__init__(daemon=True)
        self.port, self.stop = port, threading.Event()
        self.ms: list[float] = []
        self.errors: list[str] = []

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            path = "/healthz" if i % 2 else "/queues"
            i += 1
            t0 = time.perf_counter()
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
                c.request("GET", path, headers={"Authorization": f"Bearer {VIEWER}"})
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    self.ms.append((time.perf_counter() - t0) * 1000)
                else:
                    self.errors.append(f"{path}: {r.status}")
            except OSError as exc:
                self.errors.append(f"{path}: {exc!r}")
            time.sleep(0.02)

    def pct(self, p: float) -> float:
        xs = sorted(self.ms)
        return xs[min(len(xs) - 1, int(len(xs) * p / 100))] if xs else float("nan")


def rss_mib(pid: int) -> float:
    m = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return int(m.group(1)) / 1024 if m else float("nan")


def closed_counts(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=30).text
    return {m.group(1): float(m.group(2)) for m in
            re.finditer(r'^gpuq_api_connections_closed_total\{reason="([a-z_]+)"\} (\S+)$', text, re.M)}


def spread(xs: list[float]) -> str:
    return f"{min(xs):.2f} / {statistics.median(xs):.2f} / {max(xs):.2f} s" if xs else "none"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--connections", type=int, default=200, help="slow connections, half of each kind")
    a = ap.parse_args(argv)
    half = a.connections // 2
    with tempfile.TemporaryDirectory() as tmp, serve(Path(tmp), 1.0) as (proc, url):
        port = int(url.rsplit(":", 1)[1])
        rss0 = rss_mib(proc.pid)
        caller = Caller(port)
        caller.start()
        time.sleep(1.0)
        warm = len(caller.ms)
        head_h = b"GET /queues HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        head_b = (b"POST /dry-run HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Authorization: Bearer " + OPERATOR.encode() + b"\r\nContent-Length: 5000\r\n\r\n")

        async def crowd() -> list[float | None]:
            return await asyncio.gather(*[slow(port, head_h, b"X-Slow: 1\r\n", 2.0) for _ in range(half)],
                                        *[slow(port, head_b, b" ", 0.5) for _ in range(half)])

        t0 = time.monotonic()
        closed = asyncio.run(crowd())
        window_s = time.monotonic() - t0
        caller.stop.set()
        caller.join(15)
        caller.ms = caller.ms[warm:]
        counts = closed_counts(url)
        peak = vm_hwm_mib(proc.pid)
    heads = [t for t in closed[:half] if t is not None]
    bodies = [t for t in closed[half:] if t is not None]
    still = sum(t is None for t in closed)
    print(f"{a.connections} slow connections ({half} unfinished headers, {half} bodies at 2 bytes/s), "
          f"window {window_s:.1f} s")
    print(f"  closed after (min / median / max): headers {spread(heads)}; bodies {spread(bodies)}; still open "
          f"after {GIVE_UP_S:g} s: {still}")
    print(f"  the other caller: {len(caller.ms)} requests, p50 {caller.pct(50):.1f} ms, p99 {caller.pct(99):.1f} ms, "
          f"max {caller.pct(100):.1f} ms, errors {len(caller.errors)} {caller.errors[:3]}")
    print(f"  gpuq_api_connections_closed_total: {counts}")
    print(f"  server RSS {rss0:.0f} MiB before, peak {peak:.0f} MiB")
    worst = max([*heads, *bodies], default=float("nan"))
    ok = still == 0 and worst <= 30 and caller.pct(99) < 100 and not caller.errors
    print(f"RESULT slow_clients connections={a.connections} closed_max_s={worst:.2f} p99_ms={caller.pct(99):.1f} "
          f"errors={len(caller.errors)} still_open={still} rss_peak_mib={peak:.0f} goal={'met' if ok else 'missed'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
