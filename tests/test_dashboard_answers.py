"""What the dashboard routes answer people (scheduler.service.dashboard): every event carries the
workload's GPUs, even the ones the simulator's event format leaves without a placement (finish,
preempt, cancel, reject); a workload is named as its users know it."""
from __future__ import annotations

import time
from typing import Any

from accounting.model import Allocation
from gpuq.store import COLUMNS
from scheduler.actuators.base import Target
from scheduler.events import event, spec_json, to_row
from scheduler.model import Workload
from scheduler.service.dashboard import scheduler_events, workload_name

NOW = float(int(time.time()))


def test_events_carry_the_workloads_gpus(store: Any) -> None:
    """llm-1 (4 H100) admitted, preempted, admitted again on other nodes with 4, finished; gang (2 x 4)
    submitted and cancelled while pending; big (64) rejected."""
    def sub(wid: str, pods: int, per_pod: int) -> str:
        return spec_json(Workload(wid, "q", pods=pods, gpus_per_pod=per_pod), Target())

    evs = [
        (event(NOW - 100, "submit", "llm-1", "q"), sub("llm-1", 1, 4)),
        (event(NOW - 99, "admit", "llm-1", "q", gpu_type="H100", placement={"h-a": 4}), ""),
        (event(NOW - 90, "submit", "gang", "q"), sub("gang", 2, 4)),
        (event(NOW - 80, "preempt", "llm-1", "q", by="serve-1", reason="reclaim"), ""),
        (event(NOW - 70, "admit", "llm-1", "q", gpu_type="H100", placement={"h-b": 2, "h-c": 2}), ""),
        (event(NOW - 60, "cancel", "gang", "q", reason="by ops"), ""),
        (event(NOW - 50, "finish", "llm-1", "q"), ""),
        (event(NOW - 40, "submit", "big", "q"), sub("big", 8, 8)),
        (event(NOW - 40, "reject", "big", "q", reason="never fits"), ""),
    ]
    store.insert("scheduler_events", [to_row(e, i, "c", spec) for i, (e, spec) in enumerate(evs)],
                 COLUMNS["scheduler_events"])
    got = scheduler_events(store, "c", NOW - 1000, NOW, ("admit", "preempt", "finish", "cancel", "reject"), 100)
    assert [(e["event"], e["workload"], e["gpus"], e["gpu_type"]) for e in got] == [
        ("reject", "big", 64, ""),
        ("finish", "llm-1", 4, "H100"),
        ("cancel", "gang", 8, ""),            # pending: the GPUs it asked for
        ("admit", "llm-1", 4, "H100"),
        ("preempt", "llm-1", 4, "H100"),
        ("admit", "llm-1", 4, "H100"),
    ]
    assert all(e["placement"] == {} for e in got if e["event"] != "admit")     # the row as stored


def _alloc(namespace: str, pod: str, ray_cluster: str = "", workload_id: str = "") -> Allocation:
    return Allocation("c", namespace, pod, "u", "", "n", "H100", 1000, 0.0, None, ray_cluster=ray_cluster,
                      workload_id=workload_id)


def test_workloads_are_named_as_their_users_know_them() -> None:
    assert workload_name(_alloc("", "gpuq-nb-1", workload_id="nb-1")) == "nb-1"       # a gpuq placement group
    assert workload_name(_alloc("ml", "train-0", workload_id="ml/train")) == "ml/train"
    assert workload_name(_alloc("ml", "v1")) == "ml/v1"
    assert workload_name(_alloc("ml", "rc-head", ray_cluster="rc")) == "ml/rc"
    assert workload_name(_alloc("", "raylet-job")) == "raylet-job"                    # never "/raylet-job"
