"""Times as people read them (gpuq.timefmt): the core's "t=<seconds>" becomes an ISO time at the
edge; other numbers and text stay as they are."""
from __future__ import annotations

import datetime as dt

import pytest

from gpuq.timefmt import ago, iso, readable

T = dt.datetime(2026, 11, 24, 16, 25, 26, 480000, tzinfo=dt.UTC).timestamp()


def test_iso_is_utc_to_the_second() -> None:
    assert iso(T) == "2026-11-24T16:25:26Z"
    assert iso(None) == "-" and iso(None, "never") == "never"


@pytest.mark.parametrize(("text", "want"), [
    (f"preempted by serve-1 at t={T:.2f}: reclaim", "preempted by serve-1 at 2026-11-24T16:25:26Z: reclaim"),
    (f"may preempt at t={T:.0f} (in 5 s, delay 5 s)", "may preempt at 2026-11-24T16:25:26Z (in 5 s, delay 5 s)"),
    (f"will retry at t={T}; not before t={T + 60}",
     "will retry at 2026-11-24T16:25:26Z; not before 2026-11-24T16:26:26Z"),
    ("acting is paused (by ops at t=0)", "acting is paused (by ops at 1970-01-01T00:00:00Z)"),
])
def test_readable_rewrites_every_instant(text: str, want: str) -> None:
    assert readable(text) == want


def test_the_cores_delay_message_at_a_unix_time_reads_as_an_iso_time() -> None:
    """scheduler.reasons.num wrote a Unix time with 6 significant digits ("t=1.79579e+09"), which
    the demo showed and readable() could not rewrite."""
    from scheduler.reasons import delay
    text = delay(T - 2.5, T + 0.25, 3.0)
    assert "e+" not in text and readable(text) == "may preempt at 2026-11-24T16:25:26Z (in 2.75 s, delay 3 s)"


@pytest.mark.parametrize("text", ["needs 16 gpu, queue a has 8 left of max 8", "split=4", "at=5", "t=x", "",
                                  None, "limit t=5m"])
def test_readable_leaves_other_text(text: str | None) -> None:
    assert readable(text) == text


def test_ago_in_words() -> None:
    assert [ago(s) for s in (0.2, 45, 180, 9000, 5 * 86400)] == [
        "just now", "45 s ago", "3 min ago", "2.5 h ago", "5.0 d ago"]
