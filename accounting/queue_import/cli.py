"""``gpuq import-queues``: read Kueue objects or a YuniKorn queue configuration, write a gpuq queue
file, and report on stderr, one line each, what was not carried over exactly.

    gpuq import-queues kueue FILE... [--out queues.yaml]
    gpuq import-queues yunikorn FILE [--partition default] [--out queues.yaml]

Exit 0 when the file is written (with or without findings: they are the report, not errors);
2 when a source cannot be read (the message names the file and the document or line) or the
result would not load as a queue file. Without ``--out`` the file goes to stdout. ``-`` reads
stdin. Nothing is written when there is an error.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from accounting.errors import AccountingError, QueueConfigError, QueueImportError
from accounting.queue_import.report import Imported, Located, render_yaml


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise AccountingError(f"{self.prog}: {message}")


def _parser() -> _Parser:
    p = _Parser(prog="gpuq import-queues", description="Write a gpuq queue file from the queues of the scheduler "
                "the cluster runs (Kueue's objects, or YuniKorn's queue configuration), with a comment on each "
                "queue saying where it came from; what could not be carried over exactly is reported on stderr, "
                "one line each (what, why, what gpuq did instead). docs/KUEUE.md, docs/YUNIKORN.md.",
                formatter_class=argparse.RawDescriptionHelpFormatter,
                epilog="  gpuq import-queues kueue FILE... [--out queues.yaml]\n"
                "  gpuq import-queues yunikorn FILE [--partition default] [--out queues.yaml]\n\n"
                "Exit 0 when the file is written (the findings on stderr), 2 when a source cannot be read "
                "(the file and\nthe document or line are named) or would not load as a gpuq queue file.")
    sub = p.add_subparsers(dest="scheduler", required=True, metavar="{kueue,yunikorn}")
    k = sub.add_parser("kueue", help="ResourceFlavors, Cohorts, ClusterQueues and LocalQueues (YAML, several "
                       "documents a file; v1beta1 and newer)")
    k.add_argument("files", nargs="+", metavar="FILE", help="YAML files of Kueue objects ('-': stdin)")
    y = sub.add_parser("yunikorn", help="the queues.yaml of the yunikorn-configs ConfigMap, or the ConfigMap")
    y.add_argument("files", nargs=1, metavar="FILE", help="queues.yaml, or the ConfigMap's YAML ('-': stdin)")
    y.add_argument("--partition", default="default", help="the partition to import (default: default)")
    for sp in (k, y):
        sp.add_argument("--out", "-o", metavar="FILE", help="write the queue file here (default: stdout)")
    return p


def _read(name: str) -> str:
    try:
        return sys.stdin.read() if name == "-" else Path(name).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise QueueImportError(name, f"cannot read: {getattr(exc, 'strerror', None) or exc}") from None


def _documents(name: str) -> list[Located]:
    """The documents of a YAML file, each with where it is (``FILE, document N (line L)``)."""
    import yaml

    from gpuq.yamlsafe import safe_load_all

    text = _read(name)
    try:
        docs = safe_load_all(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"{name}, line {mark.line + 1}" if mark is not None else name
        raise QueueImportError(at, f"invalid YAML: {getattr(exc, 'problem', None) or exc}") from None
    out: list[Located] = []
    for n, (line, data) in enumerate(docs, 1):
        if data is None:
            continue
        origin = f"{name}, document {n}" if len(docs) > 1 else name
        if not isinstance(data, dict):
            raise QueueImportError(f"{origin} (line {line})", f"expected a mapping, got {type(data).__name__}")
        out.append(Located(data, origin))
    return out


def run(argv: Sequence[str], out: TextIO, err: TextIO) -> int:
    """The command: 0 written (findings on ``err``), 2 on an error (said on ``err``)."""
    from accounting.queues import parse_queue_config

    try:
        a = _parser().parse_args(list(argv))
        source = ", ".join(a.files)
        imported: Imported
        if a.scheduler == "kueue":
            from accounting.queue_import.kueue import from_kueue

            objects = [doc for name in a.files for doc in _documents(name)]
            imported = from_kueue(objects, source=source)
        else:
            from accounting.queue_import.yunikorn import from_yunikorn

            docs = _documents(a.files[0])
            if len(docs) != 1:
                raise QueueImportError(a.files[0], f"expected one YAML document (queues.yaml or the ConfigMap), "
                                       f"got {len(docs)}")
            imported = from_yunikorn(docs[0], partition=a.partition, source=source)
        text = render_yaml(imported)
        try:
            parse_queue_config(imported.data, source="queues", strict_top=True)
        except QueueConfigError as exc:          # a source that its own scheduler would not take either
            raise QueueImportError(source, f"the imported queues do not load as a gpuq queue file: {exc}") from None
    except (QueueImportError, AccountingError) as exc:
        err.write(f"gpuq import-queues: error: {exc}\n")
        return 2
    if a.out:
        try:
            Path(a.out).write_text(text)
        except OSError as exc:
            err.write(f"gpuq import-queues: error: {a.out}: cannot write: {exc.strerror or exc}\n")
            return 2
    else:
        out.write(text)
    queues = sum(1 for _ in imported.origins)
    for f in imported.findings:
        err.write(f"not carried over: {' '.join(f.line().split())}\n")
    err.write(f"gpuq import-queues: {queues} queues from {source}"
              + (f" written to {a.out}" if a.out else "") + f"; {len(imported.findings)} not carried over exactly\n")
    return 0


def import_queues_main(argv: Sequence[str], settings: Any = None) -> int:
    """``gpuq import-queues``, called by :mod:`gpuq.cli` with the arguments after the command."""
    return run(argv, sys.stdout, sys.stderr)
