"""What every page shares: the time range (in the URL), colours, units, empty states."""
from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import altair as alt
import pandas as pd
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
    """The range a page shows: ``key`` is the choice in the URL; ``seconds`` and ``step`` what the
    API is asked for. :func:`fit` narrows them to a history younger than the range (``fitted``),
    ``end_s`` is then the API's clock (None: not asked)."""
    key: str
    seconds: int
    step: str
    fitted: bool = False
    end_s: float | None = None

    @property
    def since(self) -> str:
        return f"-{self.seconds}s"

    @property
    def label(self) -> str:
        """"last 24h", or "last 6 min (all the history there is; range 24h)"."""
        if not self.fitted:
            return f"last {self.key}"
        return f"last {duration(self.seconds)} (all the history there is; range {self.key})"


# steps (seconds) for a fitted range: the first that gives at most POINTS points
STEPS_S = (15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400)
POINTS = 90


def step_for(span_s: float) -> int:
    return next((s for s in STEPS_S if span_s / s <= POINTS), STEPS_S[-1])


def fit(client: Client, rng: Range) -> Range:
    """``rng`` fitted to the data: when the history (``data_since`` of ``/collector/health``) is
    younger than the range, the range shrinks to it (at least 5 minutes, with a margin before the
    first row) and the step to one that gives a short history points; ``end_s`` is the API's now.
    Unchanged when the API cannot say."""
    try:
        h = client.get("/collector/health")
    except ApiError:
        return rng
    now, since = h.get("at"), h.get("data_since")
    if now is None:
        return rng
    if since is None or now - since >= rng.seconds:
        return Range(rng.key, rng.seconds, rng.step, False, float(now))
    age = max(0.0, float(now) - float(since))
    span = math.ceil(min(rng.seconds, max(300.0, 1.1 * age + 60.0)))
    return Range(rng.key, span, f"{step_for(span)}s", True, float(now))


def duration(seconds: float) -> str:
    """A length of time as people say it: "45 s", "6 min", "2.4 h", "3.0 d"."""
    s = float(seconds)
    if s < 90:
        return f"{s:.0f} s"
    if s < 90 * 60:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h" if s < 48 * 3600 else f"{s / 86400:.1f} d"


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


QUEUE_PAGE = 10_000            # GET /queues' largest page (queues; each with its rows per GPU type)


def all_queues(get: Any) -> list[dict[str, Any]] | None:
    """Every row of ``GET /queues``, page after page (``get(path, **params)``: the client's or
    :func:`fetch`); None when a page is None (the error was shown)."""
    rows: list[dict[str, Any]] = []
    offset = 0
    while True:
        page = get("/queues", limit=QUEUE_PAGE, offset=offset)
        if page is None:
            return None
        rows += page
        if len({r["queue"] for r in page}) < QUEUE_PAGE:
            return rows
        offset += QUEUE_PAGE


def fetch_queues(client: Client) -> list[dict[str, Any]] | None:
    """Every row of ``GET /queues``, or None after showing why it is missing."""
    return all_queues(lambda path, **params: fetch(client, path, **params))


def unreachable(exc: ApiError) -> None:
    if exc.status in (401, 403):
        st.error(f"API refused the dashboard's token: {exc.url}: {exc.why}. Set dashboard.token to a "
                 "viewer token from api.tokens.")
    elif exc.status is None:
        st.error(f"API unreachable: {exc.url}: {exc.why}. Is `gpuq serve` running? "
                 "(dashboard.api_url in the config)")
    else:
        st.error(f"API error: {exc.url}: {exc.why}")


def amount(v: float) -> str:
    """A GPU amount as people read it: whole ones as integers ("12"), a share with the decimals it
    has ("0.5", "1.25", "0.125": the API's amounts are thousandths), never rounded to a whole
    number it is not (0.9996 is "0.9996", 0.0004 "0.0004"); past 6 decimals, six significant
    digits (float noise in a sum: 2.0000001 is "2", 1e-09 "1e-09")."""
    v = float(v)
    if v.is_integer():
        return f"{v:,.0f}"
    for places in range(3, 7):
        text = f"{v:,.{places}f}".rstrip("0").rstrip(".")
        if "." in text:
            return text
    return f"{v:,.6g}"


def gpus(v: float | None) -> str:
    """"12 GPUs", "1.25 GPUs", "0.5 GPUs"; "–" for none (:func:`amount`)."""
    return "–" if v is None else f"{amount(v)} GPUs"


def pct(v: float | None) -> str:
    return "–" if v is None else f"{100 * v:.0f} %"


def hours(seconds: float) -> str:
    h = seconds / 3600
    return f"{h:,.1f} h" if h < 48 else f"{h / 24:,.1f} d"


def when(t: float | None) -> str:
    if t is None:
        return "–"
    return dt.datetime.fromtimestamp(t, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def readable(df: pd.DataFrame) -> pd.DataFrame:
    """``df`` as a person reads it: a missing value is "–", never None or NaN. A column with a
    missing value or with text among numbers ("unlimited") becomes text; the others keep their type."""
    out = df.copy()
    for c in out.columns:
        col = out[c]
        mixed = col.dtype == object and len({type(v) for v in col}) > 1
        if mixed or col.isna().any():
            out[c] = [_cell(v) for v in col]
    return out


def table(df: pd.DataFrame, **kw: Any) -> None:
    """A table without index, full width, missing values shown as "–"."""
    st.dataframe(readable(df), hide_index=True, width="stretch", **kw)


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
        rows = all_queues(client.get) or []
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
