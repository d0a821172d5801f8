"""Record the State API answers of tests/data/ray/ray-2.60-gpu-holders/ from a throwaway Ray head.

Run from the repository root: ``PYTHONPATH=$PWD python tests/data/ray/record_gpu_holders.py OUT``.
It starts its own head (4 logical GPUs, as the tests' ``ray_head``), runs the work SOURCES.md
describes, waits until every piece of it runs, saves each answer as Ray sent it (only the Python
path and the temp dir replaced by placeholders), and stops the head it started.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from tests.conftest import free_port
from tests.ray_fixtures import _stop_group, _wait_alive

SUBMITTED = """
import time, ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
ray.init()
@ray.remote(num_gpus=0.5, num_cpus=0)
def half():
    time.sleep(600)
@ray.remote(num_gpus=0.25, num_cpus=0)
class Quarter:
    def ready(self):
        return True
q = Quarter.remote()
ray.get(q.ready.remote())
refs = [half.remote() for _ in range(2)]
pg = placement_group([{"GPU": 0.1}, {"GPU": 0.2}], name="gpuq-team/pg")
ray.get(pg.ready())
inside = half.options(num_gpus=0.1, scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()
time.sleep(600)
"""


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gpuq-rec-", dir="/tmp"))
    ports: list[int] = []
    while len(ports) < 5:
        if (p := free_port()) not in ports:
            ports.append(p)
    gcs, dash, metrics, agent, client_port = ports
    ray_cli = Path(sys.executable).with_name("ray")
    cmd = [str(ray_cli), "start", "--head", "--block", "--disable-usage-stats", f"--port={gcs}",
           "--num-cpus=2", "--num-gpus=4", '--resources={"accelerator_type:H100": 4}',
           f"--metrics-export-port={metrics}", "--include-dashboard=true", "--dashboard-host=127.0.0.1",
           f"--dashboard-port={dash}", f"--dashboard-agent-listen-port={agent}",
           f"--ray-client-server-port={client_port}", f"--temp-dir={tmp}"]
    log = tmp / "ray-start.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"})
    base = f"http://127.0.0.1:{dash}"
    try:
        ip = _wait_alive(base, proc, log, 90)
        import ray

        ray.init(address=f"{ip}:{gcs}", log_to_driver=False, logging_level="ERROR")

        @ray.remote(num_gpus=0.5, num_cpus=0)
        def half() -> None:
            time.sleep(600)

        @ray.remote(num_gpus=0.0625, num_cpus=0)
        def sixteenth() -> None:
            time.sleep(600)

        @ray.remote(num_gpus=0.5, num_cpus=0)
        def blocked(refs: list[object]) -> None:
            ray.get(refs[0])

        driver_refs = [half.remote(), sixteenth.remote(), blocked.remote([sixteenth.remote()])]
        r = httpx.post(f"{base}/api/jobs/", timeout=30, json={
            "entrypoint": f"{sys.executable} -c '{SUBMITTED}'", "submission_id": "gpuq-team-w1-0a1b2c3d-a0",
            "entrypoint_num_gpus": 0.25, "entrypoint_num_cpus": 0,
            "metadata": {"gpuq.workload": "team/w1", "gpuq.queue": "research.vision"}})
        r.raise_for_status()
        end = time.monotonic() + 120
        while ray.available_resources().get("GPU", 4.0) > 4 - 2.925 + 1e-6:   # all of it placed
            if time.monotonic() > end:
                raise RuntimeError(f"not all placed: {ray.available_resources()}")
            time.sleep(0.5)
        time.sleep(3)                                        # task events reach the GCS each second
        limit = 10_000
        by_state = f"limit={limit}&detail=true&filter_keys=state&filter_predicates=%3D&filter_values="
        answers = {f"tasks-{s.lower().replace('_', '-')}.json": f"/api/v0/tasks?{by_state}{s}"
                   for s in ("RUNNING", "RUNNING_IN_RAY_GET", "RUNNING_IN_RAY_WAIT")}
        answers |= {"actors-alive.json": f"/api/v0/actors?{by_state}ALIVE",
                    "placement-groups.json": f"/api/v0/placement_groups?limit={limit}&detail=true",
                    "nodes.json": f"/api/v0/nodes?limit={limit}", "jobs.json": "/api/jobs/"}
        for name, path in answers.items():
            got = httpx.get(base + path, timeout=30)
            got.raise_for_status()
            text = got.text.replace(sys.executable, "python").replace(str(tmp), "/tmp/ray")
            (out / name).write_text(json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n")
        print("driver job", ray.get_runtime_context().get_job_id(), "node", ray.get_runtime_context().get_node_id(),
              "available", ray.available_resources().get("GPU"), "refs", len(driver_refs))
    finally:
        try:
            import ray

            ray.shutdown()
        finally:
            _stop_group(proc)
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
