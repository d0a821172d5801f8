"""The API's answers at the largest queue file gpuq takes (issue 17). ``python -m benchmarks.bench_api_sizes``

A queue file of ``accounting.queues.MAX_QUEUES`` (10,000) queues: 100 parents of 99 leaves, four
GPU types, guarantees on every queue; 125 declared nodes of 8 GPUs of each type; one pending
workload in each of 1,000 leaves (so the scheduler's and the accounting's per-queue series are
not all zero). The app runs in process on a chDB store in a temporary directory (the answers'
sizes do not depend on the transport). Printed: the bytes and the time of ``GET /metrics``, of
``GET /queues`` (the default page, the largest page, and all pages together), and of the
unknown-queue answer of ``POST /workloads`` (which used to list every leaf). The original finding
(``/metrics`` 53 MB, ``/queues`` 20 MB) was at 100,000 queues, a size the queue file now refuses.
The last line is ``RESULT api_sizes ...``.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

TYPES = ("H100", "A100", "L40S", "T4")


def config(parents: int = 100, leaves: int = 99) -> dict[str, Any]:
    return {"gpu_types": {t: {"price_per_hour": 1.0} for t in TYPES},
            "queues": {f"org{p:02d}": {"guaranteed": {"gpu": 0}, "queues": {
                f"team{t:03d}": {"guaranteed": {"gpu": 0}, "max": {"gpu": 64}} for t in range(leaves)}}
                for p in range(parents)}}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parents", type=int, default=100)
    ap.add_argument("--leaves", type=int, default=99, help="leaves per parent")
    a = ap.parse_args(argv)

    from accounting.model import NodeCapacity
    from accounting.queues import parse_queue_config
    from gpuq.settings import load_settings
    from gpuq.store import open_store
    from scheduler.actuators.base import DryRunActuator, Target
    from scheduler.api import create_app
    from scheduler.model import Workload
    from scheduler.service import SchedulerService
    from scheduler.service.accounting import LiveAccounting

    t0 = time.perf_counter()
    cfg = parse_queue_config(config(a.parents, a.leaves))
    parse_s = time.perf_counter() - t0
    nodes = [NodeCapacity("c", f"{t.lower()}-{i}", t, 8000) for t in TYPES for i in range(125)]
    with tempfile.TemporaryDirectory() as tmp:
        store = open_store(f"chdb://{Path(tmp) / 'data'}")
        try:
            acc = LiveAccounting(store, config=cfg, declared=nodes)
            svc = SchedulerService(cfg, DryRunActuator())
            leaves = cfg.leaves()
            now = time.time()
            for i, leaf in enumerate(leaves[:: max(1, len(leaves) // 1000)][:1000]):
                svc.submit(Workload(f"w{i}", leaf, gpus_per_pod=8, gpu_types=(TYPES[i % 4],)), Target(), now)
            acc.pending = svc.pending_demand
            acc.refresh(now)
            app = create_app(svc, acc, load_settings(None), clock=time.time)

            result: dict[str, int] = {}

            async def run() -> list[str]:
                out = []
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
                    async def get(key: str, label: str, url: str, **kw: Any) -> httpx.Response:
                        t = time.perf_counter()
                        r = await c.request(kw.pop("method", "GET"), url, **kw)
                        ms = (time.perf_counter() - t) * 1000
                        out.append(f"{label:<34} {r.status_code}  {len(r.content):>12,} bytes  {ms:8.1f} ms")
                        result[key] = len(r.content)
                        return r

                    metrics = await get("metrics", "GET /metrics", "/metrics")
                    families: dict[str, int] = {}
                    for line in metrics.text.splitlines():
                        if not line.startswith("#"):
                            name = line.split("{", 1)[0].split(" ", 1)[0]
                            families[name] = families.get(name, 0) + len(line) + 1
                    first = await get("queues_default_page", "GET /queues (default page)", "/queues")
                    total = int(first.headers["x-total-count"])
                    await get("queues_largest_page", "GET /queues?limit=10000 (largest)", "/queues?limit=10000")
                    size, t, offset = 0, time.perf_counter(), 0
                    while offset < total:
                        r = await c.get(f"/queues?limit=1000&offset={offset}")
                        size += len(r.content)
                        offset += 1000
                    out.append(f"{'GET /queues, every page of 1,000':<34} 200  {size:>12,} bytes  "
                               f"{(time.perf_counter() - t) * 1000:8.1f} ms  ({total:,} queues)")
                    result["queues_all"] = size
                    r = await get("unknown_queue", "POST /workloads, unknown queue", "/workloads", method="POST",
                                  json={"id": "x", "queue": "org42.taem017"})
                    out.append(f"    {r.json()['detail'][:300]}")
                    top = sorted(families.items(), key=lambda kv: -kv[1])[:6]
                    out.append("/metrics by family: " + ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in top))
                return out

            lines = asyncio.run(run())
        finally:
            store.close()
    print(f"{len(cfg.queues) - 1:,} queues ({len(cfg.leaves()):,} leaves), {len(TYPES)} GPU types, "
          f"{len(nodes)} nodes; queue file parsed in {parse_s:.2f} s")
    for line in lines:
        print(line)
    print("RESULT api_sizes " + " ".join(f"{k}={v}" for k, v in result.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
