"""What a collector holds in memory when a signal arrives, read from its ``/metrics``.

Used by the SIGTERM tests of ``gpuq collect`` and ``gpuq serve``: the scrape target is a
:class:`~tests.ray_fixtures.Canned` page; once a scrape has succeeded the page is turned into a
503, and after a failed scrape has been counted the collector accepts no more rows. What it has
accepted then is ``rows_buffered`` + ``rows_written`` per table, and that is what the store must
hold after the process has exited.
"""
from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from tests.ray_fixtures import Canned


def samples(text: str, name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples called ``name`` (``..._total`` for counters) in a Prometheus text page, by labels."""
    return {frozenset(s.labels.items()): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples if s.name == name}


def by_table(text: str, name: str) -> dict[str, int]:
    """``name{table=...}`` as {table: value}, the tables at 0 left out."""
    return {dict(k)["table"]: int(v) for k, v in samples(text, name).items() if v}


def scrapes(text: str, cluster: str, result: str) -> float:
    return sum(v for k, v in samples(text, "gpuq_collector_scrapes_total").items()
               if dict(k).get("cluster") == cluster and dict(k).get("result") == result)


def _wait(metrics: Callable[[], str], cond: Callable[[str], bool], timeout: float, what: str) -> str:
    end = time.monotonic() + timeout
    text = ""
    while time.monotonic() < end:
        text = metrics()
        if text and cond(text):
            return text
        time.sleep(0.2)
    raise AssertionError(f"no {what} after {timeout} s; last /metrics:\n{text[-3000:]}")


def quiesce(metrics: Callable[[], str], target: Canned, path: str, cluster: str,
            timeout: float = 60) -> dict[str, int]:
    """Wait for a good scrape of ``target``'s ``path``, then make it answer 503 and wait for a failed
    scrape; return the rows the collector holds in memory per table. Asserts that nothing was
    written yet (the test's flush interval is long), so the flush at exit is what stores them."""
    _wait(metrics, lambda t: scrapes(t, cluster, "ok") >= 1, timeout, "successful scrape")
    target.set(path, "down for the test", status=503)
    text = metrics()
    failed = scrapes(text, cluster, "error")
    # one failed scrape after the switch: the round that may have read the page before it is over
    text = _wait(metrics, lambda t: scrapes(t, cluster, "error") > failed, timeout, "failed scrape")
    held = by_table(text, "gpuq_collector_rows_buffered")
    assert held, f"nothing buffered:\n{text}"
    assert by_table(text, "gpuq_collector_rows_written_total") == {}, "rows flushed before the signal"
    return held
