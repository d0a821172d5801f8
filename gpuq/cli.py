"""The ``gpuq`` command line. Every command takes ``--config FILE``.

    gpuq collect [--once]          run the collectors (Ray, DCGM, Kubernetes, NVML) into the store
    gpuq query "SQL" [--format]    read-only SQL against the store, as a table, JSON or CSV
    gpuq migrate                   create or upgrade the schema and print the applied versions
    gpuq queues / usage            the accounting views (see accounting.cli)
    gpuq simulate SCENARIO --out   replay a scenario through the scheduler core (see scheduler.cli)
    gpuq dashboard [--port 8501]   the Streamlit dashboards, reading the API (see dashboards.launch)
    gpuq status / pause / resume   is the scheduler acting; stop or restart all acting (admin token)
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from gpuq.errors import GpuqError
from gpuq.output import render
from gpuq.settings import Settings, load_settings

log = logging.getLogger("gpuq")


def _store(settings: Settings):  # noqa: ANN202 - gpuq.store.Store, imported lazily (chdb is heavy)
    from gpuq.store import open_store

    return open_store(settings.store.dsn, default_database=settings.store.database,
                      retention=settings.store.retention, cluster=settings.store.cluster)


def cmd_query(args: argparse.Namespace, settings: Settings) -> int:
    from gpuq.store.readonly import check_read_only

    check_read_only(args.sql)                 # before the store opens: a refused statement touches nothing
    store = _store(settings)
    try:
        result = store.read_only_query(args.sql)
    finally:
        store.close()
    sys.stdout.write(render(result.columns, result.rows, args.format))
    return 0


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    from gpuq.store import connect, migrate

    store = connect(settings.store.dsn, settings.store.database, cluster=settings.store.cluster)
    try:
        applied = migrate(store, retention=settings.store.retention)
    finally:
        store.close()
    print(f"schema up to date in {store.database}; applied now: {applied or 'none'}")
    return 0


def cmd_collect(args: argparse.Namespace, settings: Settings) -> int:
    from collector.service import run_collect

    return run_collect(settings, once=args.once)


def _delegate(module: str, func: str) -> Callable[[argparse.Namespace, Settings], int]:
    def run(args: argparse.Namespace, settings: Settings) -> int:
        import importlib

        fn = getattr(importlib.import_module(module), func)
        return int(fn(list(args.rest), settings))
    return run


def _simulate(args: argparse.Namespace, settings: Settings) -> int:
    rest = list(args.rest)
    if "--compare" in rest:
        from scheduler.compare import compare_main

        return int(compare_main(rest, settings))
    from scheduler.cli import simulate_main

    return int(simulate_main(rest))


def build_parser() -> argparse.ArgumentParser:
    def add_common(parser: argparse.ArgumentParser, default: object) -> None:
        parser.add_argument("--config", "-c", metavar="FILE", default=default,
                            help="YAML settings file (GPUQ_* variables override it)")
        parser.add_argument("--log-level", default="INFO" if default is None else default,
                            choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    # sub-commands accept the same options but must not reset what was given before them
    common = argparse.ArgumentParser(add_help=False)
    add_common(common, argparse.SUPPRESS)
    p = argparse.ArgumentParser(prog="gpuq", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p, None)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("collect", parents=[common], help="run the collectors")
    c.add_argument("--once", action="store_true", help="one round of every configured source, then exit")
    c.set_defaults(func=cmd_collect)

    q = sub.add_parser("query", parents=[common], help="read-only SQL against the store")
    q.add_argument("sql")
    q.add_argument("--format", "-f", choices=["table", "json", "csv"], default="table")
    q.set_defaults(func=cmd_query)

    m = sub.add_parser("migrate", parents=[common], help="create or upgrade the schema")
    m.set_defaults(func=cmd_migrate)

    for name, module, func, text in (
        ("queues", "accounting.cli", "queues_main", "per queue and GPU type now"),
        ("usage", "accounting.cli", "usage_main", "GPU-seconds, idle and cost over a window"),
        ("import-trace", "scheduler.traces", "import_trace_main", "turn a public trace into a scenario"),
        ("serve", "scheduler.cli", "serve_main", "the API, collectors, accounting and scheduler"),
        ("workloads", "scheduler.cli", "workloads_main", "the scheduler's workloads"),
        ("explain", "scheduler.cli", "explain_main", "why a workload is pending"),
        ("check", "scheduler.cli", "check_main", "do the books balance: accounting against the scheduler's placements"),
        ("status", "scheduler.cli", "status_main", "is the scheduler acting; in flight; the preemption brake"),
        ("pause", "scheduler.cli", "pause_main", "stop all acting until gpuq resume (admin)"),
        ("resume", "scheduler.cli", "resume_main", "act again (admin)"),
        ("demo", "gpuq.demo.run", "demo_main", "local Ray, gpuq serve, dashboards and a story (make demo)"),
        ("dashboard", "dashboards.launch", "dashboard_main", "the Streamlit dashboards (read the API)"),
    ):
        sp = sub.add_parser(name, parents=[common], help=text, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
        sp.set_defaults(func=_delegate(module, func))
    s = sub.add_parser("simulate", parents=[common], help="replay a scenario (docs/SCENARIOS.md)", add_help=False)
    s.add_argument("rest", nargs=argparse.REMAINDER)
    s.set_defaults(func=_simulate)
    return p


_GLOBAL = ("--config", "--log-level")
STORE_COMMANDS = ("collect", "query", "migrate", "queues", "usage", "serve")


def _hoist_globals(argv: list[str]) -> list[str]:
    """Move ``--config F`` and ``--log-level L`` to the front wherever the user put them, so
    commands that pass the rest of their line on (queues, usage, simulate, ...) do not swallow
    them: ``gpuq explain ID --config F`` works like ``gpuq --config F explain ID``."""
    front: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name = arg.split("=", 1)[0]
        if name in _GLOBAL and "=" in arg:
            front.append(arg)
        elif arg in _GLOBAL and i + 1 < len(argv):
            front += [arg, argv[i + 1]]
            i += 1
        else:
            rest.append(arg)
        i += 1
    return front + rest


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(_hoist_globals(list(sys.argv[1:] if argv is None else argv)))
    if unknown and hasattr(args, "rest"):
        args.rest = list(unknown) + list(args.rest)
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)      # one INFO line per request otherwise
    try:
        settings = load_settings(args.config)
        if args.command in STORE_COMMANDS:
            from gpuq.remote import locked_chdb_path, locked_error, remote_view

            held = locked_chdb_path(settings)
            if held and args.command in ("queues", "usage"):
                return remote_view(args.command, args.rest, settings)
            if held and not (args.command == "serve" and settings.leader.enabled):
                raise locked_error(held)             # an elected replica stands by until the leader is gone
        return int(args.func(args, settings))
    except GpuqError as exc:
        print(f"gpuq {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
