"""The demo's story: which workloads arrive when, submitted over ``POST /workloads``.

Cluster: two H100 nodes and one A100 node of 4 GPUs each (12 GPUs). Queues: deploy/demo/queues.yaml
(research.llm, research.vision, research.train, prod, analytics). The ``full`` story (story time,
from the first submission; preemption delay 5 s):

* t=0   research.llm fills the cluster (llm-1, llm-2: 4 H100 each; llm-3: 2 A100) next to a
        research.vision notebook (nb-1: 2 A100) that holds its GPUs and does nothing;
* t=10  prod's serve-1 (4 H100, priority 10) finds no room; after the delay it preempts an llm
        job: prod gets its guarantee (4) back;
* t=20  research.train's gang-1 (2 pods x 4 H100) needs two whole H100 nodes; it waits while
        serve-1 holds one, and is admitted across both nodes once serve-1 ends (~30 s of work),
        preempting the llm job left there (research.train is guaranteed 8);
* t=25  analytics asks for 1 A100: the A100 node is full and analytics has no guarantee to
        reclaim, so it waits, with its reason;
* nb-1's GPUs read 0 % in the served DCGM page throughout: an idle allocation;
* t=2   shares of GPUs: a Ray job submitted straight to Ray (not through gpuq), shares-1, runs two
        tasks of ``num_gpus=0.5`` and an actor of ``num_gpus=0.25`` on the head's two L4 GPUs for
        60 s: gpuq's Ray collector sees them, the ledger bills the job 1.25 GPUs (``ray_job``, in
        its ``gpuq.queue`` metadata's queue, inference) and the node map draws the L4 node one
        GPU and a quarter full.

``quick`` is the same without analytics and with shorter waits (shares-1 for 15 s), for the test.
Every entrypoint is ``python -c "import time; time.sleep(N)"``; a one-pod job reserves its GPUs in
Ray for as long as it sleeps (the ray actuator's ``entrypoint_num_gpus``).
"""
from __future__ import annotations

import json
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

LONG_S = 3600       # "until the demo ends"


@dataclass(frozen=True, slots=True)
class Step:
    at_s: float
    id: str
    queue: str
    gpus_per_pod: int
    gpu_types: tuple[str, ...]
    sleep_s: float = LONG_S
    pods: int = 1
    priority: int = 0
    idle: bool = False          # holds its GPUs without using them (0 % in the DCGM page)
    note: str = ""


@dataclass(frozen=True, slots=True)
class Shares:
    """Ray work that gpuq does not schedule but sees and bills: a job submitted straight to Ray's
    Jobs API as ``id`` (its submission id, the name the books give it), whose driver holds
    ``actors`` (one actor per share) and runs ``tasks`` (one task per share) on ``gpu_type`` GPUs
    for ``hold_s``, then ends them. ``queue`` is its ``gpuq.queue`` metadata (how the ledger
    attributes a Ray job). The driver writes when each holder started and ended to the file named
    by its last argument but one (the demo's record of what Ray gave, to check the bill against)."""
    at_s: float
    id: str
    queue: str
    gpu_type: str
    hold_s: float
    tasks: tuple[float, ...] = (0.5, 0.5)
    actors: tuple[float, ...] = (0.25,)
    note: str = ""

    @property
    def gpus(self) -> float:
        return round(sum(self.tasks) + sum(self.actors), 3)

    @property
    def shape(self) -> str:
        """ "2 tasks x 0.5 + 1 actor x 0.25 GPU" """
        def part(what: str, xs: tuple[float, ...]) -> list[str]:
            return [f"{xs.count(g)} {what}{'s' if xs.count(g) > 1 else ''} x {g:g}" for g in sorted(set(xs), reverse=True)]
        return " + ".join([*part("task", self.tasks), *part("actor", self.actors)]) + " GPU"


@dataclass(frozen=True, slots=True)
class Story:
    name: str
    steps: tuple[Step, ...]
    preemption_delay_s: float
    length_s: float             # the story is told by then (the headless default)
    gang: str = "gang-1"
    idle: tuple[str, ...] = field(default=())
    shares: Shares | None = None


def _shares(hold_s: float) -> Shares:
    return Shares(2, "shares-1", "inference", "L4", hold_s,
                  note="Ray tasks of num_gpus=0.5 and an actor of 0.25 share the head's L4 GPUs (1.25 GPUs)")


def _fill() -> tuple[Step, ...]:
    return (Step(0, "llm-1", "research.llm", 4, ("H100",), note="research.llm fills the H100 nodes"),
            Step(0, "llm-2", "research.llm", 4, ("H100",)),
            Step(0, "nb-1", "research.vision", 1, ("A100",), pods=2, idle=True,
                 note="an idle notebook (2 x 1 A100, a placement group) holds 2 A100"),
            Step(0, "llm-3", "research.llm", 2, ("A100",), note="and the rest of the A100 node"))


STORIES = {
    "full": Story("full", (
        *_fill(),
        Step(10, "serve-1", "prod", 4, ("H100",), sleep_s=30, priority=10,
             note="prod arrives: preempts an llm job after the 5 s delay"),
        Step(20, "gang-1", "research.train", 4, ("H100",), sleep_s=30, pods=2,
             note="a 2 x 4 H100 gang waits for two whole nodes"),
        Step(25, "ana-1", "analytics", 1, ("A100",), sleep_s=20,
             note="analytics waits: A100 full, no guarantee to reclaim"),
    ), preemption_delay_s=5, length_s=110, idle=("nb-1",), shares=_shares(60)),
    "quick": Story("quick", (
        *_fill(),
        Step(3, "serve-1", "prod", 4, ("H100",), sleep_s=12, priority=10, note="prod preempts an llm job"),
        Step(5, "gang-1", "research.train", 4, ("H100",), sleep_s=10, pods=2,
             note="a 2 x 4 H100 gang waits for two whole nodes"),
    ), preemption_delay_s=3, length_s=45, idle=("nb-1",), shares=_shares(15)),
}


def body(step: Step, marker: str) -> dict[str, Any]:
    """The ``POST /workloads`` body; ``marker`` ends the entrypoint's argv so that the demo's
    processes can be found (and checked gone) by it."""
    code = f"import time; time.sleep({step.sleep_s:g})"
    entrypoint = f"{shlex.quote(sys.executable)} -c {shlex.quote(code)} {shlex.quote(marker)}"
    return {"id": step.id, "queue": step.queue, "pods": step.pods, "gpus_per_pod": step.gpus_per_pod,
            "gpu_types": list(step.gpu_types), "priority": step.priority,
            "target": {"kind": "RaySubmission", "entrypoint": entrypoint,
                       "metadata": {"gpuq.demo": step.note[:100]}}}


# The shares' driver: argv hold_s, task shares, actor shares, the GPU type, the record file, the marker.
DRIVER = """
import json, sys, time, ray
hold, tasks, actors, accel, out = float(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4], sys.argv[5]
ray.init(log_to_driver=False, logging_level="ERROR")
on = {"accelerator_type:" + accel: 0.001}
@ray.remote(num_cpus=0)
def task(s):
    t = time.time(); time.sleep(s); return [t, time.time()]
@ray.remote(num_cpus=0)
class Holder:
    def ready(self):
        return time.time()
held = [Holder.options(num_gpus=g, resources=on).remote() for g in actors]
starts = ray.get([h.ready.remote() for h in held])
runs = ray.get([task.options(num_gpus=g, resources=on).remote(hold) for g in tasks])
for h in held:
    ray.kill(h)
end = time.time()
with open(out, "w") as f:
    json.dump({"tasks": [[g, *r] for g, r in zip(tasks, runs)], "actors": [[g, s, end] for g, s in zip(actors, starts)]}, f)
"""


def shares_job(shares: Shares, record: str, marker: str) -> dict[str, Any]:
    """The ``POST /api/jobs/`` body (Ray's Jobs API) of the shares' job: its driver reserves
    nothing itself (its tasks and actors hold the shares); ``marker`` ends its argv as the story's
    entrypoints' does."""
    argv = [str(shares.hold_s), json.dumps(list(shares.tasks)), json.dumps(list(shares.actors)), shares.gpu_type,
            record, marker]
    entrypoint = " ".join(shlex.quote(a) for a in (sys.executable, "-c", DRIVER, *argv))
    return {"entrypoint": entrypoint, "submission_id": shares.id,
            "metadata": {"gpuq.queue": shares.queue, "gpuq.demo": shares.note[:100]}}


def billed_as_run(record: dict[str, Any]) -> float:
    """GPU-seconds the driver's record says its holders held: share x (end - start), summed."""
    return sum(g * (e - s) for g, s, e in (*record["tasks"], *record["actors"]))
