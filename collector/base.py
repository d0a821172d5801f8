"""The contract between the collector runner and its sources.

A *scrape target* is polled once a round (Ray node pages, the Ray State API, dcgm-exporter
pages, NVML). A *watcher* runs for the life of the process (Kubernetes list+watch). Both return
or emit rows as ``{table: [tuple in gpuq.store.schema.COLUMNS[table] order]}``; the runner
hands them to the BatchWriter. Sources do no writing, no retries across rounds and no metrics of
their own: the runner times them, isolates their failures and records their health.
"""
from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collector.http import HttpClient


Rows = dict[str, list[tuple[Any, ...]]]
Emit = Callable[[str, Sequence[tuple[Any, ...]]], None]


@dataclass(slots=True)
class ScrapeResult:
    rows: Rows = field(default_factory=dict)
    samples: int = 0                       # samples parsed from the page(s)
    errors: list[Exception] = field(default_factory=list)   # non-fatal (malformed lines ...)

    def add(self, table: str, rows: Sequence[tuple[Any, ...]]) -> None:
        if rows:
            self.rows.setdefault(table, []).extend(rows)


class ScrapeTarget(Protocol):
    @property
    def source(self) -> str: ...     # "ray", "ray-state", "dcgm", "nvml"

    @property
    def cluster(self) -> str: ...

    @property
    def name(self) -> str: ...       # what a human recognises: the URL, or "nvml@host"

    async def scrape(self, client: HttpClient, now: dt.datetime) -> ScrapeResult:
        """One round. Raise a collector.errors.CollectorError for a failed target."""
        ...


class Discoverer(Protocol):
    """Produces the current list of scrape targets (e.g. Ray nodes found through the State API)."""

    async def targets(self, client: HttpClient) -> list[ScrapeTarget]: ...


class Watcher(Protocol):
    @property
    def source(self) -> str: ...

    @property
    def cluster(self) -> str: ...

    @property
    def name(self) -> str: ...

    def run(self, emit: Emit, stop: threading.Event, once: bool = False) -> None:
        """Watch until ``stop`` is set (or, with ``once``, after one full list), emitting rows."""
        ...
