"""Kubernetes collector throughput, against a peer measured in the same run.

1. Per pod event: the watcher's path (``json.loads`` + :class:`ClusterTracker.on_pod`: extraction
   and rows) against the client's model path that ``kubernetes.watch.Watch`` takes
   (``ApiClient.deserialize`` into ``V1Pod``) on the recorded pods of tests/data/k8s.
2. End to end: a list of N pods served by the replay server, read by the real client and turned
   into rows (``KubernetesWatcher.run(once=True)``).

    .venv/bin/python -m benchmarks.bench_k8s [--pods 5000] [--seconds 2]
"""
from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient

from collector.k8s_state import ClusterTracker
from collector.kubernetes import KubernetesWatcher
from gpuq.settings import KubernetesTarget
from tests.k8s_replay import ReplayServer, load

NOW = dt.datetime(2026, 11, 21, 10, 0, tzinfo=dt.UTC)


def rate(fn: Callable[[], int], seconds: float) -> float:
    done, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        done += fn()
    return done / (time.perf_counter() - began)


def many_pods(n: int) -> list[dict[str, Any]]:
    base = load("pods.json")["items"]
    out = []
    for i in range(n):
        pod = copy.deepcopy(base[i % len(base)])
        pod["metadata"]["name"] = f"{pod['metadata']['name']}-{i}"
        pod["metadata"]["uid"] = f"{pod['metadata']['uid'][:-6]}{i:06d}"
        out.append(pod)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--pods", type=int, default=5000)
    ap.add_argument("--seconds", type=float, default=2.0)
    args = ap.parse_args()

    lines = [json.dumps({"type": "MODIFIED", "object": p}) for p in load("pods.json")["items"]]
    tracker = ClusterTracker("bench")
    api = ApiClient()

    def ours() -> int:
        for line in lines:
            ev = json.loads(line)
            tracker.on_pod(ev["type"], ev["object"], NOW)
        return len(lines)

    def models() -> int:
        for line in lines:
            ev = json.loads(line)
            api.deserialize(json.dumps(ev["object"]), "V1Pod", "application/json")
        return len(lines)

    a, b = rate(ours, args.seconds), rate(models, args.seconds)
    print(f"pod events, extraction + rows : {a:10.0f}/s")
    print(f"pod events, client V1Pod model: {b:10.0f}/s   (ratio {a / b:.1f}x)")

    pods = many_pods(args.pods)
    with ReplayServer(pods, load("nodes.json")["items"], resource_version=10**6) as server, \
            tempfile.TemporaryDirectory() as tmp:
        target = KubernetesTarget(cluster="bench", kubeconfig=str(server.kubeconfig(Path(tmp) / "kc")))
        rows: list[int] = []
        began = time.perf_counter()
        KubernetesWatcher(target).run(lambda table, rs: rows.append(len(rs)), threading.Event(), once=True)
        took = time.perf_counter() - began
    print(f"list of {args.pods} pods -> {sum(rows)} rows through the real client: {took:.2f}s "
          f"({args.pods / took:.0f} pods/s)")


if __name__ == "__main__":
    main()
