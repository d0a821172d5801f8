"""What every page shares: the time range (in the URL), colours, units, empty states."""
from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import altair as alt
import streamlit as st

from dashboards.client import ApiError, Client

RANGES = {"1h": (3600, "1m"), "6h": (6 * 3600, "10m"), "24h": (86400, "1h"), "7d": (7 * 86400, "6h"),
          "30d": (30 * 86400, "1d")}
DEFAULT_RANGE = "24h"

# Tableau-like, colour-blind friendly; queues and GPU types draw from different lists
_TYPE_COLOURS = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#9d755d", "#eeca3b")
_QUEUE_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                  "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
                  "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5")
STATE_COLOURS = {"busy": "#4c78a8", "idle": "#e45756", "free": "#54a24b", "unavailable": "#bab0ac"}


def palette(names: Iterable[str], kind: str = "queue") -> dict[str, str]:
    """One colour per name, the same on every page: names in sorted order take the colours in
    turn (the pages pass the full set of queues or types, so a name keeps its colour)."""
    colours = _TYPE_COLOURS if kind == "gpu_type" else _QUEUE_COLOURS
    return {n: colours[i % len(colours)] for i, n in enumerate(sorted(set(names)))}


def scale(names: Iterable[str], kind: str = "queue") -> alt.Scale:
    p = palette(names, kind)
    return alt.Scale(domain=list(p), range=list(p.values()))


@dataclass(frozen=True, slots=True)
class Range:
    key: str
    seconds: int
    step: str

    @property
    def since(self) -> str:
        return f"-{self.seconds}s"


def time_range() -> Range:
    """The range picker in the sidebar; the choice lives in the URL (``?range=7d``)."""
    current = st.query_params.get("range") or st.session_state.get("range") or DEFAULT_RANGE
    if current not in RANGES:
        current = DEFAULT_RANGE
    key = st.sidebar.selectbox("Time range", list(RANGES), index=list(RANGES).index(current), key="range_pick")
    st.session_state["range"] = key
    if st.query_params.get("range") != key:
        st.query_params["range"] = key
    seconds, step = RANGES[key]
    return Range(key, seconds, step)


def fetch(client: Client, path: str, **params: Any) -> Any:
    """The API's answer, or None after showing why it is missing."""
    try:
        return client.get(path, **params)
    except ApiError as exc:
        unreachable(exc)
        return None


def unreachable(exc: ApiError) -> None:
    if exc.status in (401, 403):
        st.error(f"API refused the dashboard's token: {exc.url}: {exc.why}. Set dashboard.token to a "
                 "viewer token from api.tokens.")
    elif exc.status is None:
        st.error(f"API unreachable: {exc.url}: {exc.why}. Is `gpuq serve` running? "
                 "(dashboard.api_url in the config)")
    else:
        st.error(f"API error: {exc.url}: {exc.why}")


def gpus(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:,.0f} GPUs" if float(v).is_integer() else f"{v:,.1f} GPUs"


def pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f} %"


def hours(seconds: float) -> str:
    h = seconds / 3600
    return f"{h:,.1f} h" if h < 48 else f"{h / 24:,.1f} d"


def when(t: float | None) -> str:
    if t is None:
        return "–"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def leaves(queues: Iterable[str]) -> list[str]:
    qs = sorted(set(queues))
    return [q for q in qs if not any(o.startswith(q + ".") for o in qs) and q != "root"]


def metrics_row(items: Sequence[tuple[str, ...]]) -> None:
    cols = st.columns(len(items))
    for col, item in zip(cols, items):
        label, value, *rest = item
        col.metric(label, value, help=rest[0] if rest else None)


def queue_scale(client: Client, seen: Iterable[str] = ()) -> alt.Scale:
    """The queue colours every page uses: over all queues of /queues (plus any ``seen`` that the
    view does not know yet), so a queue has one colour everywhere."""
    try:
        rows = client.get("/queues")
    except ApiError:
        rows = []
    return scale([*(r["queue"] for r in rows if r["queue"] != "root"), *seen])


def type_scale(client: Client, seen: Iterable[str] = ()) -> alt.Scale:
    """The GPU type colours every page uses: over the types with capacity, plus ``seen``."""
    try:
        types = [t["gpu_type"] for t in client.get("/accounting/capacity")["types"]]
    except ApiError:
        types = []
    return scale([*types, *seen], "gpu_type")


def bar_height(rows: int, per_row: int = 36) -> int:
    """A horizontal bar chart's height for ``rows`` bars, with room for the axis."""
    return max(110, per_row * rows + 60)
