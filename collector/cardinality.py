"""A per-target cap on distinct series, against label-cardinality explosions.

A target whose page suddenly carries a label with a new value per line (a request id, a
timestamp in a label, a bug in an exporter) would otherwise write one new series per line into
``gpu_samples`` / ``ray_resources`` every round. :class:`SeriesCap` keeps, per target, the series
(a row without its time and value) it has seen, at most ``max_series`` of them:

* a series already known is always kept, wherever it is on the page;
* a new series is admitted while the target holds fewer than ``max_series``, in page order;
* past that, new series are refused: their rows are not written, counted per target
  (``gpuq_collector_series_refused_total``) and logged once when the target reaches the cap.

Series not seen for ``forget_rounds`` scrapes of their target are forgotten when room is needed
(pods come and go; their series must not hold the slots forever), and a target not scraped for
``forget_rounds`` rounds is forgotten whole. Memory is bounded by ``max_series`` per live target.
Only series tables are capped; State API and Kubernetes rows are objects, not series.
"""
from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuq.store.schema import COLUMNS

log = logging.getLogger(__name__)

# table -> indexes of the columns that are not part of the series' identity (time, value)
SERIES_TABLES: dict[str, frozenset[int]] = {
    t: frozenset(COLUMNS[t].index(c) for c in ("ts", "value")) for t in ("gpu_samples", "ray_resources")
}


@dataclass(slots=True)
class _Target:
    seen: dict[Hashable, int] = field(default_factory=dict)   # series -> the scrape it was last seen
    scrapes: int = 0
    last_round: int = 0
    capped: bool = False


class SeriesCap:
    def __init__(self, max_series: int, forget_rounds: int = 20) -> None:
        if max_series < 1 or forget_rounds < 1:
            raise ValueError("max_series and forget_rounds must be at least 1")
        self.max_series = max_series
        self.forget_rounds = forget_rounds
        self._targets: dict[Hashable, _Target] = {}
        self._round = 0

    def new_round(self) -> None:
        """Call once per collector round: forgets targets gone for ``forget_rounds`` rounds."""
        self._round += 1
        gone = [k for k, t in self._targets.items() if self._round - t.last_round > self.forget_rounds]
        for k in gone:
            del self._targets[k]

    def known(self, target: Hashable) -> int:
        t = self._targets.get(target)
        return len(t.seen) if t else 0

    def admit(self, target: Hashable, rows: dict[str, list[tuple[Any, ...]]]) -> int:
        """Filter one scrape's ``{table: rows}`` in place; returns the rows refused."""
        t = self._targets.get(target)
        if t is None:
            t = self._targets[target] = _Target()
        t.scrapes += 1
        t.last_round = self._round
        now = t.scrapes
        seen = t.seen
        refused = 0
        full = False                 # at the cap, forgetting tried once this scrape: refuse the rest
        for table, table_rows in rows.items():
            skip = SERIES_TABLES.get(table)
            if skip is None:
                continue
            keep = [i for i in range(len(COLUMNS[table])) if i not in skip]
            kept: list[tuple[Any, ...]] = []
            for row in table_rows:
                key = (table, *(row[i] for i in keep))
                if key in seen:
                    seen[key] = now
                    kept.append(row)
                    continue
                if full or (len(seen) >= self.max_series and not self._forget(t, now)):
                    full = True
                    refused += 1
                    continue
                seen[key] = now
                kept.append(row)
            table_rows[:] = kept
        if refused and not t.capped:
            log.warning("target %s has more than %d distinct series (collector.max_series_per_target): "
                        "%d new series refused this scrape; series already known are kept",
                        _name(target), self.max_series, refused)
        t.capped = bool(refused)
        return refused

    def _forget(self, t: _Target, now: int) -> bool:
        """Drop series not seen for ``forget_rounds`` scrapes; True if that made room."""
        if now - min(t.seen.values(), default=now) <= self.forget_rounds:
            return False
        stale = [k for k, last in t.seen.items() if now - last > self.forget_rounds]
        for k in stale:
            del t.seen[k]
        return len(t.seen) < self.max_series


def _name(target: Hashable) -> str:
    if isinstance(target, Sequence) and not isinstance(target, str):
        return " ".join(str(p) for p in target)
    return str(target)
