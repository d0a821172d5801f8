"""The accounting benchmark's generators still fit the schema: the fleet (a month of pods in the
ledger, the hourly rollups, recent raw samples) and a small raw scan are generated into chDB and
read back through the accounting, so a schema change cannot break `benchmarks/bench_accounting.py`
unnoticed (the ledger's four columns once did)."""
from __future__ import annotations

import time
from pathlib import Path

from benchmarks.bench_accounting import GPUS, generate_fleet, generate_raw
from gpuq.store import open_store


def test_generators_fit_the_schema_and_read_back(tmp_path: Path) -> None:
    now = float(int(time.time()) // 60 * 60)
    store = open_store(f"chdb://{tmp_path / 'data'}?database=fleet", ttl_days=365)
    try:
        generate_fleet(store, now)
        db = store.database
        pods, sources = store.query(f"SELECT count(), groupUniqArray(source) FROM {db}.gpu_allocations").rows[0]
        assert pods > 1_000_000 and sources == ["pod"]
        assert store.query(f"SELECT count() FROM {db}.accounting_usage_1h").rows[0][0] > 100_000
        generate_raw(store, 2 * GPUS * 10, now, block_rows=100_000)      # 10 samples of each metric a GPU
        assert store.query(f"SELECT count() FROM {db}.gpu_samples WHERE ts > now() - INTERVAL 1 HOUR").rows[0][0] > 0
    finally:
        store.close()
