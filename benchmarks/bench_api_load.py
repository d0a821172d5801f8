"""The operator API under load on loopback (issue 9). ``python -m benchmarks.bench_api_load [--full]``

A real ``gpuq serve`` process (dry-run actuator, chDB store in a temporary directory, a static
cluster of 2 x 8 H100 so that nearly every submitted workload stays pending) is filled with
``--pending`` workloads over ``POST /workloads``; then an **open-loop** load generator sends
``--rate`` requests/s for ``--seconds`` while the scheduler cycles (every
``scheduler.cycle_interval_s``) over all of them. Each request has a start time fixed in advance
(``i / rate``) and its latency is measured from that time, not from when the client got round to
sending it, so a stall of the server shows in the figures instead of slowing the load down
(coordinated omission).

The mix (weights in ``MIX``), with a viewer token for reads and an operator token (scoped
``namespaces: [bench]``, ``queues: ['*']``) for writes: ``GET /workloads/{id}`` (what
``gpuq explain`` reads), ``GET /workloads?state=pending&limit=50``, ``GET /queues``,
``GET /accounting/capacity``, ``GET /nodes``, ``GET /scheduler/status``, ``GET /healthz``,
``GET /metrics``, ``POST /workloads`` and ``DELETE /workloads/{id}`` of workloads it posted.
An error is a transport error, a timeout (``--timeout``) or any status but the expected one.

The peer, measured in the same run on the same server: the same mix at the same rate before the
fill, with the scheduler holding only ``PEER_PENDING`` pending workloads; the ratio printed is
the loaded p99 over the peer's. Cycles during each window and their durations come from
``/metrics`` (``gpuq_scheduler_cycles_total`` and the ``gpuq_scheduler_cycle_duration_seconds``
histogram, read before and after); the server's peak RSS is its ``VmHWM``.

Sizes: reduced (default, also run by tests/test_api_load.py) 1,000 pending at 100 requests/s for
10 s; ``--full`` 10,000 pending at 200 requests/s for 60 s (goal: p99 under 100 ms, no error:
the exit status is 1 when that is missed; the reduced run fails only on errors). The last line
is ``RESULT api_load ...``.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter, deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
VIEWER, OPERATOR = "bench-viewer", "bench-operator"
NS = "bench"
PEER_PENDING = 20
QUEUES = ("research.vision", "research.nlp", "prod.serving", "prod.batch")
# (name, weight): the share of the requests each kind takes
MIX: tuple[tuple[str, int], ...] = (
    ("get_workload", 30), ("list_pending", 10), ("queues", 15), ("capacity", 10), ("nodes", 5),
    ("status", 5), ("healthz", 10), ("metrics", 1), ("submit", 8), ("cancel", 6),
)


@dataclass(slots=True)
class Window:
    """One measured window: latencies (ms from the scheduled start) per kind, errors, cycles."""

    name: str
    pending: int
    rate: float
    seconds: float
    lat: dict[str, list[float]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    wall_s: float = 0.0
    lag_ms: float = 0.0                      # the generator's own lateness at the last start
    cycles: float = 0.0
    cycle_s: float = 0.0
    cycle_buckets: dict[float, float] = field(default_factory=dict)
    gc_ms: list[float] | None = None                       # the server's full collections (--gc-pauses)
    span: tuple[float, float] = (0.0, 0.0)                 # wall-clock start and end

    @property
    def all(self) -> list[float]:
        return sorted(x for xs in self.lat.values() for x in xs)

    @property
    def n_errors(self) -> int:
        return sum(self.errors.values())

    def pct(self, p: float, kind: str | None = None) -> float:
        xs = self.all if kind is None else sorted(self.lat.get(kind, ()))
        return xs[min(len(xs) - 1, int(len(xs) * p / 100))] if xs else float("nan")

    def cycle_le(self, p: float) -> float:
        """The histogram bucket bound under which ``p`` % of this window's cycles ended (s)."""
        if self.cycles <= 0:
            return float("nan")
        for bound, n in sorted(self.cycle_buckets.items()):
            if n >= self.cycles * p / 100:
                return bound
        return float("inf")

    def summary(self) -> str:
        done = len(self.all) + self.n_errors
        return (f"{self.name}: pending={self.pending} rate={self.rate:g}/s requests={done} "
                f"achieved={done / self.wall_s:.1f}/s p50={self.pct(50):.1f} p90={self.pct(90):.1f} "
                f"p99={self.pct(99):.1f} max={self.pct(100):.1f} ms errors={self.n_errors} "
                f"cycles={self.cycles:.0f} cycle_mean={1000 * self.cycle_s / max(self.cycles, 1):.1f} ms "
                f"cycle_p99<={1000 * self.cycle_le(99):g} ms generator_lag={self.lag_ms:.1f} ms"
                + (f" full_gcs={len(self.gc_ms)} gc_max={max(self.gc_ms, default=0):.1f} ms"
                   if self.gc_ms is not None else ""))


# -- the server ------------------------------------------------------------------------------------
def write_config(root: Path, port: int, cycle_interval_s: float) -> Path:
    (root / "queues.yaml").write_text(yaml.safe_dump({"queues": {
        "research": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}, "queues": {
            "vision": {"guaranteed": {"gpu": 4}}, "nlp": {"guaranteed": {"gpu": 4}}}},
        "prod": {"guaranteed": {"gpu": 8}, "max": {"gpu": 16}, "queues": {
            "serving": {"guaranteed": {"gpu": 4}}, "batch": {"guaranteed": {"gpu": 4}}}}},
        "policy": {"max_priority": 1}}))           # the bench submits priorities 0 and 1 (queue policy)
    (root / "nodes.yaml").write_text(yaml.safe_dump([{"name": "h", "gpu_type": "H100", "gpus": 8, "count": 2}]))
    cfg = root / "gpuq.yaml"
    cfg.write_text(yaml.safe_dump({
        "store": {"dsn": f"chdb://{root / 'data'}", "spill_dir": str(root / "spill")},
        "queues_file": "queues.yaml",
        "scheduler": {"actuator": "dry-run", "cycle_interval_s": cycle_interval_s},
        "accounting": {"interval_s": 5},
        "collector": {"metrics_port": 0},
        "api": {"host": "127.0.0.1", "port": port, "tokens": [
            {"token": VIEWER, "role": "viewer", "name": "bench-viewer"},
            {"token": OPERATOR, "role": "operator", "name": "bench-operator", "namespaces": [NS], "queues": ["*"]}]},
    }))
    return cfg


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serve(root: Path, cycle_interval_s: float) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``gpuq serve`` as a deployment runs it (its own process), ready on a free loopback port."""
    port = free_port()
    cfg = write_config(root, port, cycle_interval_s)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    env["PYTHONPATH"] = os.pathsep.join([*([str(root / "site")] if (root / "site").is_dir() else []), str(REPO)])
    log = root / "serve.log"
    url = f"http://127.0.0.1:{port}"
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "gpuq.cli", "serve", "--config", str(cfg),
                                 "--nodes", "nodes.yaml", "--no-collect"],
                                cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        end = time.monotonic() + 60
        with httpx.Client(base_url=url, timeout=2) as c:
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"gpuq serve exited ({proc.returncode}):\n{log.read_text()}")
                try:
                    if c.get("/readyz").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                if time.monotonic() > end:
                    raise RuntimeError(f"gpuq serve not ready after 60 s:\n{log.read_text()}")
                time.sleep(0.1)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


GC_HOOK = """import gc, time
_t = [0.0]
def _gc(phase, info):
    if phase == "start":
        _t[0] = time.perf_counter()
    elif info["generation"] == 2:
        with open(%r, "a") as f:
            f.write(f"{time.time():.3f} {(time.perf_counter() - _t[0]) * 1000:.2f}\\n")
gc.callbacks.append(_gc)
"""


def gc_pauses(root: Path, since: float, until: float) -> list[float]:
    """The server's full collections (ms) between two wall-clock times (``--gc-pauses``)."""
    path = root / "gc.log"
    if not path.exists():
        return []
    rows = [line.split() for line in path.read_text().splitlines() if line.strip()]
    return sorted(float(ms) for t, ms in rows if since <= float(t) <= until)


def vm_hwm_mib(pid: int) -> float:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return float("nan")
    m = re.search(r"^VmHWM:\s+(\d+) kB", text, re.M)
    return int(m.group(1)) / 1024 if m else float("nan")


def body(wid: str, rng: random.Random) -> dict[str, Any]:
    return {"id": wid, "queue": rng.choice(QUEUES), "pods": rng.choice((1, 1, 2)), "gpus_per_pod": 8,
            "priority": rng.choice((0, 0, 1)),
            "target": {"kind": "RayJob", "namespace": NS, "name": wid, "api_version": "ray.io/v1"}}


def fill(url: str, n: int, prefix: str, seed: int = 1, threads: int = 8) -> list[str]:
    """Submit ``n`` workloads (8-GPU pods on a 16-GPU cluster: all but a few stay pending)."""
    rng = random.Random(seed)
    bodies = [body(f"{prefix}-{i:05d}", rng) for i in range(n)]
    chunks = [bodies[i::threads] for i in range(threads)]

    def post(chunk: list[dict[str, Any]]) -> int:
        bad = 0
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=30) as c:
            for b in chunk:
                r = c.post("/workloads", json=b)
                if r.status_code != 201:
                    bad += 1
                    if bad == 1:
                        print(f"    fill: {r.status_code} {r.text[:200]}", flush=True)
        return bad

    with ThreadPoolExecutor(threads) as ex:
        bad = sum(ex.map(post, chunks))
    if bad:
        raise RuntimeError(f"{bad} of {n} submissions failed")
    return [b["id"] for b in bodies]


# -- /metrics -------------------------------------------------------------------------------------
def cycle_metrics(url: str) -> tuple[float, float, dict[float, float]]:
    text = httpx.get(url + "/metrics", timeout=120).text      # an overloaded server answers late
    count = float(re.search(r"^gpuq_scheduler_cycles_total (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    total = float(re.search(r"^gpuq_scheduler_cycle_duration_seconds_sum (\S+)$", text, re.M).group(1))  # type: ignore[union-attr]
    buckets = {float(le): float(v) for le, v in
               re.findall(r'^gpuq_scheduler_cycle_duration_seconds_bucket\{le="([^"]+)"\} (\S+)$', text, re.M)}
    return count, total, buckets


def pending_count(url: str) -> int:
    text = httpx.get(url + "/metrics", timeout=120).text
    return int(sum(float(v) for v in re.findall(r"^gpuq_scheduler_pending_workloads\{[^}]*\} (\S+)$", text, re.M)))


# -- the load ---------------------------------------------------------------------------------------
EXPECT = {"submit": 201}


async def generate(url: str, w: Window, ids: list[str], prefix: str, seed: int, timeout_s: float) -> None:
    """The open loop: request ``i`` starts at ``t0 + i / rate`` whatever the earlier ones are doing
    (aiohttp: a light client, so that on a small machine the generator is not what is measured)."""
    import aiohttp

    rng = random.Random(seed)
    kinds = [k for k, _ in MIX]
    weights = [n for _, n in MIX]
    n = int(w.rate * w.seconds)
    plan = rng.choices(kinds, weights, k=n)
    posted: deque[str] = deque()
    hv, ho = {"Authorization": f"Bearer {VIEWER}"}, {"Authorization": f"Bearer {OPERATOR}"}
    conn = aiohttp.TCPConnector(limit=512, force_close=False)
    async with aiohttp.ClientSession(url, connector=conn, timeout=aiohttp.ClientTimeout(total=timeout_s)) as c:

        async def one(i: int, kind: str, at: float) -> None:
            if kind == "cancel" and not posted:
                kind = "submit"
            payload: Any = None
            method, path, params, headers = "GET", "", None, hv
            if kind == "get_workload":
                path = f"/workloads/{rng.choice(ids)}"
            elif kind == "list_pending":
                path, params = "/workloads", {"state": "pending", "limit": "50"}
            elif kind == "queues":
                path = "/queues"
            elif kind == "capacity":
                path = "/accounting/capacity"
            elif kind == "nodes":
                path = "/nodes"
            elif kind == "status":
                path = "/scheduler/status"
            elif kind == "healthz":
                path, headers = "/healthz", {}
            elif kind == "metrics":
                path, headers = "/metrics", {}
            elif kind == "submit":
                method, path, headers, payload = "POST", "/workloads", ho, body(f"{prefix}-{i:06d}", rng)
            else:
                method, path, headers = "DELETE", f"/workloads/{posted.popleft()}", ho
            try:
                async with c.request(method, path, params=params, json=payload, headers=headers) as r:
                    data = await r.read()
                    status = r.status
            except asyncio.TimeoutError:
                w.errors[f"{kind}: timeout"] += 1
                return
            except aiohttp.ClientError as exc:
                w.errors[f"{kind}: {type(exc).__name__}"] += 1
                return
            ms = (time.perf_counter() - at) * 1000
            w.statuses[status] += 1
            if status != EXPECT.get(kind, 200):
                w.errors[f"{kind}: HTTP {status}"] += 1
                if w.errors[f"{kind}: HTTP {status}"] == 1:
                    print(f"    {kind}: {status} {data[:300]!r}", flush=True)
                return
            if kind == "submit":
                posted.append(payload["id"])
            w.lat.setdefault(kind, []).append(ms)

        tasks = []
        t0 = time.perf_counter()
        for i, kind in enumerate(plan):
            at = t0 + i / w.rate
            delay = at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(i, kind, at)))
        w.lag_ms = max(0.0, (time.perf_counter() - (t0 + (n - 1) / w.rate)) * 1000)
        await asyncio.gather(*tasks)
        w.wall_s = time.perf_counter() - t0


def measure(url: str, name: str, ids: list[str], rate: float, seconds: float, seed: int,
            timeout_s: float) -> Window:
    w = Window(name, pending_count(url), rate, seconds)
    c0, s0, b0 = cycle_metrics(url)
    t0 = time.time()
    asyncio.run(generate(url, w, ids, f"{name}-load", seed, timeout_s))
    w.span = (t0, time.time())
    c1, s1, b1 = cycle_metrics(url)
    w.cycles, w.cycle_s = c1 - c0, s1 - s0
    w.cycle_buckets = {b: b1[b] - b0.get(b, 0.0) for b in b1}
    return w


@dataclass(slots=True)
class Result:
    loaded: Window
    peer: Window
    server_rss_mib: float
    client_rss_mib: float
    fill_s: float

    @property
    def ratio(self) -> float:
        return self.loaded.pct(99) / max(self.peer.pct(99), 1e-9)


def run(pending: int = 1_000, rate: float = 100.0, seconds: float = 10.0, cycle_interval_s: float = 1.0,
        timeout_s: float = 10.0, seed: int = 7, verbose: bool = True, profile: str | None = None,
        gc_log: bool = False) -> Result:
    """Start a server, measure the peer window, fill, measure the loaded window. ``profile``: a
    file for py-spy's collapsed stacks of the server's threads holding the GIL during the loaded
    window (where the time goes). ``gc_log``: the server logs each full collection's pause (a
    ``sitecustomize`` in its ``PYTHONPATH``), reported per window."""
    say = print if verbose else (lambda *a, **k: None)
    with tempfile.TemporaryDirectory(prefix="gpuq-bench-api-") as tmp, \
            serve(_with_gc_hook(Path(tmp)) if gc_log else Path(tmp), cycle_interval_s) as (proc, url):
        base = fill(url, PEER_PENDING, "peer")
        peer = measure(url, "peer", base, rate, seconds, seed, timeout_s)
        say("   ", peer.summary(), flush=True)
        t0 = time.perf_counter()
        ids = fill(url, pending, "w", seed=seed)
        fill_s = time.perf_counter() - t0
        say(f"    filled {pending} workloads in {fill_s:.1f} s ({pending / fill_s:.0f}/s); "
            f"pending now {pending_count(url)}", flush=True)
        spy = None
        if profile:
            spy = subprocess.Popen(["py-spy", "record", "-p", str(proc.pid), "-d", str(int(seconds)), "-r", "250",
                                    "--gil", "-t", "-f", "raw", "-o", profile], stdout=subprocess.DEVNULL)
        loaded = measure(url, "loaded", ids, rate, seconds, seed + 1, timeout_s)
        if spy is not None:
            spy.wait(timeout=60)
        say("   ", loaded.summary(), flush=True)
        for w in (peer, loaded):
            say(f"    {w.name} p99 by kind (ms): "
                + " ".join(f"{k}={w.pct(99, k):.1f}" for k in sorted(w.lat)), flush=True)
            if w.errors:
                say(f"    {w.name} errors: {dict(w.errors)}", flush=True)
        rss = vm_hwm_mib(proc.pid)
        for w in (peer, loaded):
            w.gc_ms = gc_pauses(Path(tmp), *w.span) if gc_log else None
            if w.gc_ms is not None:
                say(f"    {w.name}: the server's full collections during the window: {len(w.gc_ms)}"
                    + (f", longest {max(w.gc_ms):.1f} ms" if w.gc_ms else ""), flush=True)
    client = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return Result(loaded, peer, rss, client, fill_s)


def _with_gc_hook(root: Path) -> Path:
    (root / "site").mkdir()
    (root / "site" / "sitecustomize.py").write_text(GC_HOOK % str(root / "gc.log"))
    return root


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="10,000 pending, 200 requests/s, 60 s (the issue's figures)")
    ap.add_argument("--pending", type=int)
    ap.add_argument("--rate", type=float)
    ap.add_argument("--seconds", type=float)
    ap.add_argument("--cycle-interval", type=float, default=1.0, help="scheduler.cycle_interval_s (default 1)")
    ap.add_argument("--timeout", type=float, default=10.0, help="a request slower than this is an error")
    ap.add_argument("--goal-p99-ms", type=float, default=100.0)
    ap.add_argument("--gc-pauses", action="store_true", help="log the server's full garbage collections")
    ap.add_argument("--profile", metavar="FILE", help="py-spy collapsed stacks of the server during the loaded window")
    args = ap.parse_args(argv)
    pending, rate, seconds = (10_000, 200.0, 60.0) if args.full else (1_000, 100.0, 10.0)
    pending, rate, seconds = args.pending or pending, args.rate or rate, args.seconds or seconds
    print(f"gpuq serve (dry-run actuator, 2 x 8 H100), {pending} pending, {rate:g} requests/s for {seconds:g} s, "
          f"cycle every {args.cycle_interval:g} s; load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs",
          flush=True)
    res = run(pending, rate, seconds, args.cycle_interval, args.timeout, profile=args.profile, gc_log=args.gc_pauses)
    lw, pw = res.loaded, res.peer
    met = lw.n_errors == 0 and lw.pct(99) < args.goal_p99_ms
    print(f"RESULT api_load pending={lw.pending} rate={rate:g} seconds={seconds:g} requests={len(lw.all) + lw.n_errors} "
          f"achieved_rps={(len(lw.all) + lw.n_errors) / lw.wall_s:.1f} p50_ms={lw.pct(50):.1f} p90_ms={lw.pct(90):.1f} "
          f"p99_ms={lw.pct(99):.1f} max_ms={lw.pct(100):.1f} errors={lw.n_errors} cycles={lw.cycles:.0f} "
          f"cycle_mean_ms={1000 * lw.cycle_s / max(lw.cycles, 1):.1f} peer_p99_ms={pw.pct(99):.1f} "
          f"peer_pending={pw.pending} ratio={res.ratio:.2f}x server_peak_rss_mib={res.server_rss_mib:.0f} "
          f"client_peak_rss_mib={res.client_rss_mib:.0f} (goal p99 < {args.goal_p99_ms:g} ms, 0 errors: "
          f"{'met' if met else 'MISSED'})", flush=True)
    if args.full or args.pending or args.rate:
        return 0 if met else 1
    return 0 if lw.n_errors == 0 and pw.n_errors == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
