"""A one-line progress display on stderr for long commands (``gpuq simulate``, ``gpuq import-trace``).

Dependency-free: the line is rewritten in place with a carriage return, at most ``hz`` times a
second, and only when the stream is a terminal; otherwise every call returns at once and nothing
is written (logs and pipes stay clean). stdout is never touched.

    p = Progress.auto()                 # enabled iff stderr is a TTY
    while ...:
        if p.due():                     # cheap: one clock read, rate-limited
            p.show(done, total, "t=120 s  events 4,100")
    p.close()                           # clears the line
"""
from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "duration_text"]


def duration_text(s: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``."""
    s = max(0, int(round(s)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Progress:
    def __init__(self, stream: TextIO | None = None, *, enabled: bool | None = None, hz: float = 4.0,
                 label: str = "", width: int = 20, clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream if stream is not None else sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = enabled
        self.label = label
        self.width = width
        self.clock = clock
        self.period = 1.0 / hz
        self.start = clock()
        self.next_at = self.start + self.period       # the first line after one period: short runs stay silent
        self.shown = 0                                # characters of the last line written

    @classmethod
    def auto(cls, label: str = "") -> Progress:
        """On stderr, enabled when stderr is a terminal."""
        return cls(sys.stderr, label=label)

    def due(self) -> bool:
        return self.enabled and self.clock() >= self.next_at

    def show(self, done: float, total: float | None, detail: str = "") -> None:
        """Write ``label [#####.....]  42%  detail  elapsed 3s  ETA 4s`` (no bar or ETA when
        ``total`` is unknown); the ETA assumes the rate so far holds."""
        if not self.enabled:
            return
        now = self.clock()
        self.next_at = now + self.period
        elapsed = now - self.start
        parts = []
        if total:
            frac = min(max(done / total, 0.0), 1.0)
            filled = int(frac * self.width)
            parts.append(f"[{'#' * filled}{'.' * (self.width - filled)}] {frac * 100:3.0f}%")
        if detail:
            parts.append(detail)
        parts.append(f"elapsed {duration_text(elapsed)}")
        if total and done > 0:
            parts.append(f"ETA {duration_text(elapsed * (total - done) / done)}")
        elif total:
            parts.append("ETA ?")
        line = (f"{self.label} " if self.label else "") + "  ".join(parts)
        pad = max(0, self.shown - len(line))
        self.stream.write("\r" + line + " " * pad)
        self.stream.flush()
        self.shown = len(line)

    def close(self) -> None:
        """Erase the line (only if one was written)."""
        if self.enabled and self.shown:
            self.stream.write("\r" + " " * self.shown + "\r")
            self.stream.flush()
            self.shown = 0
