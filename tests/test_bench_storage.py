"""The storage sizing benchmark (benchmarks/bench_storage.py), reduced: 16 GPUs for 5 minutes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_reduced_storage_sizing_run() -> None:
    r = subprocess.run([sys.executable, "-m", "benchmarks.bench_storage", "--gpus", "16", "--minutes", "5", "--json"],
                       capture_output=True, text=True, timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    t = out["tables"]
    m = out["metrics_per_gpu"]
    assert m == 17 and "DCGM_FI_DEV_GPU_UTIL" in out["metrics"]       # the recorded page's set + PROF activity
    assert t["gpu_samples"]["rows"] == 16 * m * 20                     # 20 scrapes of 16 GPUs, every series
    assert t["gpu_samples"]["rows_per_day_per_1000_gpus"] == 1000 * m * 5760
    assert t["gpu_samples_1m"]["rows"] == 16 * m * 5                   # filled by the view, one row a minute
    assert t["gpu_samples_lz4"]["rows"] == t["gpu_samples"]["rows"]
    for name in ("gpu_samples", "ray_resources", "pod_events", "gpu_allocations", "scheduler_state"):
        assert 0 < t[name]["compressed_bytes"] < t[name]["uncompressed_bytes"], name
    assert out["peak_rss_mib"] > 0 and out["total_compressed_mib_per_day_per_1000_gpus"] > 0
