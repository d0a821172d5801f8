"""The entrypoint wrapper of a gang admitted on Ray: hold its placement group while the job runs.

The ``ray`` actuator submits a multi-pod gang as a Ray job whose entrypoint is::

    python -m scheduler.actuators.ray_gang --name gpuq-<workload id> --namespace gpuq \\
        --bundles '[{"GPU": 2}, {"GPU": 2}]' --nodes 184c76562b71,0d0fe32120ac --strategy PACK \\
        --timeout-s 60 -- '<the user's entrypoint, one shell string>'

It connects to Ray (``ray.init()``: the job's ``RAY_ADDRESS``) as the job's driver, creates the
placement group with bundle ``i`` pinned to node ``nodes[i]`` (a gpuq node name: a prefix of the
Ray node id, resolved among the alive nodes) through ``bundle_label_selector`` on Ray's built-in
``ray.io/node-id`` label, waits until it is placed (at most ``--timeout-s``), then runs the user's
entrypoint in a shell with ``GPUQ_PLACEMENT_GROUP`` (name), ``GPUQ_PLACEMENT_GROUP_ID`` (hex id)
and ``GPUQ_PLACEMENT_GROUP_NAMESPACE`` added to its environment, forwards SIGTERM/SIGINT to it,
removes the group when it exits and exits with its status.

The group is not detached: it belongs to this driver's job, so Ray removes it when the driver
dies however it dies (``POST /api/jobs/<id>/stop`` sends SIGTERM, then SIGKILL). The user's
program reaches the group with ``ray.init(namespace=os.environ["GPUQ_PLACEMENT_GROUP_NAMESPACE"])``
and ``ray.util.get_placement_group(os.environ["GPUQ_PLACEMENT_GROUP"])``, and schedules into it
with ``PlacementGroupSchedulingStrategy``.

Exit statuses of its own: 2 bad arguments, 3 a node is not (or no longer) in the cluster, 75 the
group was not placed in time (EX_TEMPFAIL: the next cycle may admit again). This module imports
nothing of gpuq (only the standard library and ``ray``), so it runs wherever Ray does.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

NODE_ID_LABEL = "ray.io/node-id"
EXIT_NODES, EXIT_NOT_PLACED = 3, 75


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scheduler.actuators.ray_gang")
    p.add_argument("--name", required=True)
    p.add_argument("--namespace", default="gpuq")
    p.add_argument("--bundles", required=True, type=json.loads, help="JSON list of resource dicts")
    p.add_argument("--nodes", default="", help="comma-separated node (id prefix) per bundle")
    p.add_argument("--strategy", default="PACK", choices=["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"])
    p.add_argument("--timeout-s", type=float, default=60.0)
    p.add_argument("entrypoint", nargs=argparse.REMAINDER)
    args = p.parse_args(argv)
    if args.entrypoint[:1] == ["--"]:
        args.entrypoint = args.entrypoint[1:]
    if not args.entrypoint:
        p.error("no entrypoint after --")
    args.nodes = [n for n in args.nodes.split(",") if n]
    if not isinstance(args.bundles, list) or not args.bundles or \
            not all(isinstance(b, dict) for b in args.bundles):
        p.error("--bundles must be a non-empty JSON list of objects")
    if args.nodes and len(args.nodes) != len(args.bundles):
        p.error(f"--nodes names {len(args.nodes)} nodes for {len(args.bundles)} bundles")
    return args


def resolve_nodes(names: Sequence[str], alive: Sequence[str]) -> list[str]:
    """gpuq node names (id prefixes) -> full Ray node ids; ValueError naming the first miss."""
    out = []
    for name in names:
        hits = [n for n in alive if n.startswith(name.lower())]
        if len(hits) != 1:
            raise ValueError(f"node {name!r} matches {len(hits)} alive Ray nodes")
        out.append(hits[0])
    return out


def _say(message: str) -> None:
    print(f"gpuq ray_gang: {message}", file=sys.stderr, flush=True)


def _create(args: argparse.Namespace, selectors: list[dict[str, str]] | None) -> Any:
    """Create the group; a same-named group of an earlier attempt may still be going away."""
    from ray.util.placement_group import placement_group

    end = time.monotonic() + args.timeout_s
    while True:
        try:
            return placement_group(args.bundles, strategy=args.strategy, name=args.name,
                                   bundle_label_selector=selectors)
        except ValueError as exc:                 # "... already exists"
            if "exist" not in str(exc) or time.monotonic() > end:
                raise
            time.sleep(0.5)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import ray
    from ray.util.placement_group import remove_placement_group

    ray.init(namespace=args.namespace, log_to_driver=False)
    try:
        alive = [str(n["NodeID"]) for n in ray.nodes() if n.get("Alive")]
        try:
            ids = resolve_nodes(args.nodes, alive)
        except ValueError as exc:
            _say(f"cannot place {args.name}: {exc}")
            return EXIT_NODES
        selectors = [{NODE_ID_LABEL: i} for i in ids] if ids else None
        pg = _create(args, selectors)
        if not pg.wait(timeout_seconds=max(1, round(args.timeout_s))):
            _say(f"placement group {args.name} not placed after {args.timeout_s:g}s "
                 f"(bundles {json.dumps(args.bundles)} on {','.join(args.nodes) or 'any nodes'})")
            remove_placement_group(pg)
            return EXIT_NOT_PLACED
        _say(f"placement group {args.name} ({pg.id.hex()}) placed: {len(args.bundles)} bundles")
        env = {**os.environ, "GPUQ_PLACEMENT_GROUP": args.name, "GPUQ_PLACEMENT_GROUP_ID": pg.id.hex(),
               "GPUQ_PLACEMENT_GROUP_NAMESPACE": args.namespace}
        code = run_child(" ".join(args.entrypoint), env)
        remove_placement_group(pg)
        return code
    finally:
        ray.shutdown()


def run_child(command: str, env: dict[str, str]) -> int:
    """Run ``command`` in a shell, forwarding SIGTERM/SIGINT; its exit status (128+N if killed)."""
    child = subprocess.Popen(command, shell=True, env=env)
    previous = {}

    def forward(signum: int, _frame: object) -> None:
        if child.poll() is None:
            child.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        previous[sig] = signal.signal(sig, forward)
    try:
        code = child.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
