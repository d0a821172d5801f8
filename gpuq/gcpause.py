"""Building a large structure that makes no reference cycles (a YAML document's dicts and lists, a
scenario's workloads) with the cyclic garbage collector paused (issue 18).

Every 700 container allocations start a young collection, and as the structure grows, full ones
that walk all of it and find nothing to free: about a quarter of loading a 50,000-workload
scenario. What the build drops is freed by reference counting as usual; the collector is back on
(if it was on) when the block ends, however it ends.
"""
from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
