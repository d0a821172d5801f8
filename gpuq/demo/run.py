"""``gpuq demo``: gpuq's main job, alive, on this machine (``make demo``).

    gpuq demo [--story full|quick] [--duration S] [--no-dashboard]

Starts a local Ray cluster (a head with two L4 and H100/A100 worker nodes of logical GPUs,
:mod:`gpuq.demo.cluster`), the served DCGM page (:mod:`gpuq.demo.dcgm`), ``gpuq serve`` with the
``ray`` actuator and the collectors on both (config ``.gpuq/demo/gpuq.yaml``, store
``chdb://.gpuq/demo/store``), and ``gpuq dashboard`` where it exists; prints the URLs, tells the
story (:mod:`gpuq.demo.story`) over the API and prints what happens. Without ``--duration`` it runs
until Ctrl-C or SIGTERM; with it, for S seconds of story. Either way it then stops everything it
started (serve gets SIGTERM and flushes; the Ray jobs and nodes stop) and prints the summary read
back from the store. Exit status 0, or 1 when something could not start.
"""
from __future__ import annotations

import argparse
import shutil
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from gpuq.demo.cluster import LocalCluster, LocalNode
from gpuq.demo.story import STORIES, Story

NODES = [LocalNode("h100-a", 4, "H100"), LocalNode("h100-b", 4, "H100"), LocalNode("a100-a", 4, "A100")]
HEAD = LocalNode("head-l4", 2, "L4")     # the head's GPUs: the Ray tasks' shares (story.Shares)
QUEUES = Path(__file__).resolve().parents[2] / "deploy" / "demo" / "queues.yaml"


class Interrupted(BaseException):
    pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuq demo", description=(
        "See gpuq at work on this machine, no GPUs or Kubernetes needed: a local Ray cluster of 14 "
        "pretend GPUs (8 H100, 4 A100, 2 L4), gpuq serve, the dashboards, and a story of six teams sharing "
        "them (admissions, a preemption, a gang that waits, an idle notebook, Ray tasks holding half a GPU), "
        "printed as it happens. "
        "Ctrl-C stops everything and prints a summary (README, \"The demo\")."))
    p.add_argument("--story", choices=sorted(STORIES), default="full",
                   help="full (about 2 minutes, default) or quick (a shorter one)")
    p.add_argument("--duration", type=float, metavar="S", help="headless: tell the story for S seconds, then stop")
    p.add_argument("--dir", default=".gpuq/demo", help="config, store and logs (emptied at start)")
    p.add_argument("--no-dashboard", action="store_true", help="do not start gpuq dashboard")
    return p


def config(root: Path, cluster: LocalCluster, dcgm_url: str, api_port: int, story: Story,
           dashboard_port: int) -> dict[str, Any]:
    from gpuq.settings import Settings

    cfg: dict[str, Any] = {
        "store": {"dsn": f"chdb://{root / 'store'}", "spill_dir": str(root / "spill"), "batch_interval_s": 1},
        "queues_file": str(QUEUES),
        "collector": {"interval_s": 2, "jitter_s": 0.2, "timeout_s": 3, "metrics_port": 0,
                      "ray": [{"cluster": "demo", "dashboard_url": cluster.dashboard_url,
                               "metrics_urls": list(cluster.metrics_urls.values())}],
                      "dcgm": [{"cluster": "demo", "urls": [dcgm_url]}]},
        "accounting": {"interval_s": 2, "idle_window_s": 20, "idle_threshold_pct": 5},
        "scheduler": {"actuator": "ray", "cluster": "demo", "cycle_interval_s": 1,
                      "preemption_delay_s": story.preemption_delay_s},
        "api": {"host": "127.0.0.1", "port": api_port},
    }
    if "dashboard" in Settings.model_fields:       # gpuq dashboard's settings, where they exist
        cfg["dashboard"] = {"api_url": f"http://127.0.0.1:{api_port}", "port": dashboard_port, "refresh_s": 5,
                            "cache_ttl_s": 2}
    return cfg


def dashboard_available() -> bool:
    from gpuq.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return "dashboard" in sub.choices


def demo_main(argv: list[str], settings: Any = None) -> int:
    args = parser().parse_args(argv)
    story = STORIES[args.story]
    root = Path(args.dir).resolve()
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    stop = threading.Event()
    phase = {"raise": True}

    def on_signal(signum: int, frame: Any) -> None:
        stop.set()
        if phase["raise"]:
            phase["raise"] = False
            raise Interrupted(signal.Signals(signum).name)

    from gpuq.demo.session import Session

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    session = Session(root, story, stop)
    try:
        session.start(NODES, with_dashboard=not args.no_dashboard and dashboard_available(), head=HEAD)
        phase["raise"] = False
        session.tell(args.duration)
        return 0
    except Interrupted as exc:
        print(f"\n{exc}: stopping", flush=True)
        return 0
    except RuntimeError as exc:
        print(f"gpuq demo: error: {exc}", file=sys.stderr)
        return 1
    finally:
        phase["raise"] = False
        session.close()
        for s, h in previous.items():
            signal.signal(s, h)

