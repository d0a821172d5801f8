"""--from / --to values."""
from __future__ import annotations

import pytest

from accounting.errors import TimeSpecError
from accounting.timeparse import parse_time

NOW = 1_700_000_000.0
CASES = [
    ("now", "now", NOW), ("days", "-7d", NOW - 7 * 86400), ("hours", "-2h", NOW - 7200),
    ("minutes", "-30m", NOW - 1800), ("seconds", "-90s", NOW - 90), ("weeks", "-1w", NOW - 604800),
    ("now-minus", "now-1h", NOW - 3600), ("plus", "+1h", NOW + 3600), ("fraction", "-1.5h", NOW - 5400),
    ("iso-z", "2023-11-14T22:13:20Z", NOW), ("iso-offset", "2023-11-14T23:13:20+01:00", NOW),
    ("iso-naive-is-utc", "2023-11-14T22:13:20", NOW), ("date", "2023-11-14", NOW - 22 * 3600 - 13 * 60 - 20),
]


@pytest.mark.parametrize("value,expected", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_parse_time(value: str, expected: float) -> None:
    assert parse_time(value, NOW) == expected


@pytest.mark.parametrize("value", ["yesterday", "-7x", "7d", ""], ids=["word", "unit", "unsigned", "empty"])
def test_bad_time(value: str) -> None:
    with pytest.raises(TimeSpecError, match="cannot read time"):
        parse_time(value, NOW)
