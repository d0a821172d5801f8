"""The ``gpuq`` command line (:func:`main`): every command takes ``--config FILE``; the commands
that only pass their arguments on are delegated to ``accounting.cli``, ``scheduler.cli``,
``scheduler.traces``, ``gpuq.demo.run`` and ``dashboards.launch``. What ``gpuq --help`` says is
:data:`DESCRIPTION`, in the words of the people who run it.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from gpuq.errors import GpuqError
from gpuq.output import render
from gpuq.settings import Settings, load_settings

log = logging.getLogger("gpuq")

DESCRIPTION = """\
gpuq watches a shared GPU cluster, accounts every GPU-hour to a team's queue, and schedules
workloads by the queues' guarantees, preempting when a queue needs its guarantee back.

Run it:
  gpuq serve                 the scheduler, its HTTP API, the collectors and the accounting
  gpuq dashboard             the dashboards in a browser (they read gpuq serve's API)
  gpuq demo                  all of it on this machine with a story of five teams (make demo)

Ask a running gpuq serve:
  gpuq workloads             what runs and what waits
  gpuq explain ID            why a workload waits, or where it runs
  gpuq check                 do the books balance: what the accounting shows against what was placed
  gpuq status                is the scheduler acting; what it is doing; the preemption limit
  gpuq pause / resume        stop all acting, and start again (admin token)

Read the accounting:
  gpuq queues                each queue now: allocated, guaranteed, borrowed, lent, idle
  gpuq usage --from -7d      GPU-hours, idle GPU-hours and cost per queue over a period
  gpuq query "SQL"           any read-only SQL on the collected data
  (queues and usage ask a running gpuq serve when one answers, so they show what its API shows;
   --local reads the store instead)

Try a policy before using it:
  gpuq simulate FILE --out DIR   replay a recorded or invented workload mix (docs/SCENARIOS.md)
  gpuq import-trace ...          turn a public GPU trace into such a mix (docs/TRACES.md)
  gpuq import-queues kueue|yunikorn FILE...   the queues of the scheduler the cluster runs as a gpuq
                                 queue file (docs/KUEUE.md, docs/YUNIKORN.md)
  gpuq whatif --from -7d ...     last week's work again with other queues or more nodes: waits,
                                 GPU-hours, preemptions per queue, before and after (docs/WHATIF.md)

Keep it running:
  gpuq collect               only the collectors (Kubernetes, Ray, DCGM, NVML)
  gpuq migrate               create or upgrade the tables
  gpuq spill list            batches the store has not taken yet, and those in quarantine (why)
  gpuq spill replay          try them again now (--quarantined: the quarantined ones too)

Every command takes --config FILE (settings; GPUQ_* environment variables override them) and
--help for its own options.
"""


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


SPILL_COLUMNS = ("state", "table", "rows", "age", "written", "kind", "reason", "file")


def cmd_spill_list(args: argparse.Namespace, settings: Settings) -> int:
    """Every spill file (the collectors' and the scheduler's), waiting or in quarantine; needs no
    store, so it works while gpuq serve holds an embedded one."""
    import time

    from gpuq.store.schema import COLUMNS
    from gpuq.store.spillfile import clip, entries
    from gpuq.timefmt import ago, iso

    now = time.time()
    rows = [(e.state, e.table, e.rows, ago(now - e.written), iso(e.written), e.kind,
             clip(e.reason, 160) if args.format == "table" else e.reason, str(e.path))
            for e in entries(settings.store.spill_dir, COLUMNS)]
    sys.stdout.write(render(SPILL_COLUMNS, rows, args.format))
    return 0


def _spill_root(spill_dir: str, name: str) -> tuple[Path, Path]:
    """``name`` as a spill file of ``spill_dir`` (waiting or in quarantine) and the spill root it
    belongs to; a GpuqError names what is wrong with it."""
    from gpuq.store.spillfile import is_quarantined, roots

    path = Path(name).resolve()
    if path.suffix != ".jsonl" or not path.is_file():
        raise GpuqError(f"{name}: not a spill file (a <table>/<token>.jsonl that exists)")
    root = path.parents[2] if is_quarantined(path) else path.parents[1]
    if root not in [r.resolve() for r in roots(spill_dir)]:
        raise GpuqError(f"{name}: not in the spill directory {spill_dir} (store.spill_dir) nor its "
                        f"quarantine; move it to {spill_dir}/<table>/ to replay it")
    return root, path


def cmd_spill_replay(args: argparse.Namespace, settings: Settings) -> int:
    """Insert spill files now: those waiting (and with --quarantined those in quarantine), or the
    FILEs named. Exit 0 when the store took every one, 1 when some stay (refused: in quarantine
    with the new reason; or waiting for a cause outside their rows), 2 on an error (a FILE that is
    no spill file of this configuration, a store that cannot be reached: what was replayed before
    it is done)."""
    from gpuq.store.spillfile import QUARANTINE, is_quarantined, quarantined, roots, waiting
    from gpuq.store.writer import BatchWriter, Outcome

    st = settings.store
    todo: dict[Path, list[Path]] = {}
    if args.files:
        for name in args.files:
            root, path = _spill_root(st.spill_dir, name)
            todo.setdefault(root, []).append(path)
    else:
        for root in roots(st.spill_dir):
            files = waiting(root) + (quarantined(root) if args.quarantined else [])
            if files:
                todo[root.resolve()] = files
    if not todo:
        print(f"nothing to replay in {st.spill_dir}" + ("" if args.quarantined else
              " (the quarantined files are tried with --quarantined)"))
        return 0
    store = _store(settings)
    left = 0
    try:
        for root, paths in todo.items():
            writer = BatchWriter(store, root, retry_attempts=st.retry_attempts, retry_backoff_s=st.retry_backoff_s)
            for path in paths:
                for _, outcome, rows, reason in writer.replay_paths([path]):
                    if outcome is Outcome.REPLAYED:
                        print(f"replayed     {path} ({rows} rows)")
                    elif outcome is Outcome.GONE:
                        print(f"gone         {path} (replayed by a running writer meanwhile)")
                    else:
                        left += 1
                        where = path
                        if outcome is Outcome.QUARANTINED and not is_quarantined(path):
                            where = root / QUARANTINE / path.parent.name / path.name
                        print(f"{outcome.value:<12} {where}: {reason}")
                sys.stdout.flush()
    finally:
        store.close()
    return 1 if left else 0


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

    return int(simulate_main(rest, settings))


def build_parser() -> argparse.ArgumentParser:
    def add_common(parser: argparse.ArgumentParser, default: object) -> None:
        parser.add_argument("--config", "-c", metavar="FILE", default=default,
                            help="YAML settings file (GPUQ_* variables override it)")
        parser.add_argument("--log-level", default="INFO" if default is None else default,
                            choices=["DEBUG", "INFO", "WARNING", "ERROR"])

    # sub-commands accept the same options but must not reset what was given before them
    common = argparse.ArgumentParser(add_help=False)
    add_common(common, argparse.SUPPRESS)
    p = argparse.ArgumentParser(prog="gpuq", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_common(p, None)
    sub = p.add_subparsers(dest="command", required=True, title="commands", metavar="COMMAND")

    c = sub.add_parser("collect", parents=[common], help="only collect: GPUs, pods and nodes into the store",
                       description="Collect what the cluster does (Kubernetes pods and nodes, Ray, DCGM "
                       "or NVML GPU metrics) into the store, without the scheduler or the API.")
    c.add_argument("--once", action="store_true", help="one round of every configured source, then exit")
    c.set_defaults(func=cmd_collect)

    q = sub.add_parser("query", parents=[common], help="read-only SQL on the collected data",
                       description="Run one read-only SQL statement (SELECT, SHOW, DESCRIBE) on the store "
                       "and print the rows. Writes are refused.")
    q.add_argument("sql", help='the statement, e.g. "SELECT event, count() FROM scheduler_events GROUP BY event"')
    q.add_argument("--format", "-f", choices=["table", "json", "csv"], default="table",
                   help="an aligned table (default), a JSON array of rows, or CSV")
    q.set_defaults(func=cmd_query)

    m = sub.add_parser("migrate", parents=[common], help="create or upgrade the tables",
                       description="Create the store's tables, or upgrade them to this version of gpuq, "
                       "and print what was applied.")
    m.set_defaults(func=cmd_migrate)

    sp = sub.add_parser("spill", parents=[common], help="batches the store has not taken: list them, replay them",
                        formatter_class=argparse.RawDescriptionHelpFormatter,
                        description="The spill directory (store.spill_dir) holds the batches the store\n"
                        "did not take: waiting ones (the store was down; gpuq replays them by itself) and\n"
                        "quarantined ones (refused for their values, or unreadable: kept for a person,\n"
                        "with the reason). docs/OPERATIONS.md, 'The spill directory'.\n\n"
                        "  gpuq spill list [--format table|json|csv]       every file: state, table, rows, age, reason\n"
                        "  gpuq spill replay [--quarantined] [FILE...]     insert them now (exit 0 all taken, 1 some\n"
                        "                                                  refused, 2 error)")
    spill = sp.add_subparsers(dest="spill_command", required=True, title="actions", metavar="ACTION")
    sl = spill.add_parser("list", parents=[common], help="every spill file: state, table, rows, age, reason",
                          description="List the spill files, waiting then quarantined, oldest first: "
                          "table, rows, age, and why a file is in quarantine (or would be at its "
                          "replay). Needs no store. Exit 0, or 2 on an error.")
    sl.add_argument("--format", "-f", choices=["table", "json", "csv"], default="table",
                    help="an aligned table (default), a JSON array of rows, or CSV")
    sl.set_defaults(func=cmd_spill_list)
    sr = spill.add_parser("replay", parents=[common], help="insert spill files into the store now",
                          description="Insert the waiting spill files into the configured store now "
                          "(with --quarantined the quarantined ones too; with FILEs just those, "
                          "wherever they are). A file the store takes is removed; one it refuses for "
                          "its values, or that cannot be read, is (still) in quarantine with the new "
                          "reason. Exit 0: every file taken; 1: some stay (listed with the reason); "
                          "2: an error (a FILE outside the spill directory, the store unreachable).")
    sr.add_argument("--quarantined", action="store_true", help="also retry every file in quarantine")
    sr.add_argument("files", nargs="*", metavar="FILE", help="spill files to retry (waiting or quarantined)")
    sr.set_defaults(func=cmd_spill_replay)

    for name, module, func, text in (
        ("queues", "accounting.cli", "queues_main", "each queue now: allocated, guaranteed, borrowed, idle"),
        ("usage", "accounting.cli", "usage_main", "GPU-hours, idle GPU-hours and cost over a period"),
        ("import-trace", "scheduler.traces", "import_trace_main", "turn a public GPU trace into a scenario"),
        ("import-queues", "accounting.queue_import.cli", "import_queues_main",
         "write a gpuq queue file from Kueue's or YuniKorn's queues"),
        ("whatif", "scheduler.cli", "whatif_main", "replay the cluster's past week under other queues or nodes"),
        ("serve", "scheduler.cli", "serve_main", "run the scheduler, its API, the collectors and the accounting"),
        ("workloads", "scheduler.cli", "workloads_main", "what runs and what waits (from gpuq serve)"),
        ("explain", "scheduler.cli", "explain_main", "why a workload waits, or where it runs"),
        ("check", "scheduler.cli", "check_main", "do the books balance: the accounting against what the scheduler placed"),
        ("status", "scheduler.cli", "status_main", "is the scheduler acting; what it is doing; the preemption limit"),
        ("pause", "scheduler.cli", "pause_main", "stop all acting until gpuq resume (admin token)"),
        ("resume", "scheduler.cli", "resume_main", "act again after gpuq pause (admin token)"),
        ("demo", "gpuq.demo.run", "demo_main", "everything on this machine, with a story of five teams"),
        ("dashboard", "dashboards.launch", "dashboard_main", "the dashboards in a browser (they read the API)"),
    ):
        sp = sub.add_parser(name, parents=[common], help=text, add_help=False)
        sp.add_argument("rest", nargs=argparse.REMAINDER)
        sp.set_defaults(func=_delegate(module, func))
    s = sub.add_parser("simulate", parents=[common], help="replay a workload mix under a queue policy (docs/SCENARIOS.md)",
                       add_help=False)
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
        if args.command in ("queues", "usage"):           # gpuq serve's view when it answers
            from gpuq.remote import accounting_command

            def local(rest: list[str]) -> int:
                args.rest = rest
                return int(args.func(args, settings))

            return accounting_command(args.command, args.rest, settings, local)
        if args.command in STORE_COMMANDS or getattr(args, "spill_command", None) == "replay":
            from gpuq.remote import locked_chdb_path, locked_error

            held = locked_chdb_path(settings)
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
