"""Queues: allocated against guaranteed and max over the range, the entitlement (what
``reclaim: fair_share`` reclaims toward, beside the guarantee), fair share, borrowed and lent;
drill into a queue's children and workloads."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboards.client import Client
from dashboards.common import (Range, amount, fetch, fetch_queues, fit, gpus, leaves, metrics_row, queue_scale, table,
                               when)
from dashboards.views import run


def page() -> None:
    run("Queues", "Is each queue getting its guarantee, and who borrows or lends?", body)


def _eq(r: dict) -> dict:
    """GPU-equivalents beside the raw GPUs, where the queue file sets them (the API's ``*_eq``)."""
    if "allocated_eq" not in r:
        return {}
    return {"allocated (GPU-eq)": r["allocated_eq"], "guaranteed (GPU-eq)": r["guaranteed_eq"],
            "max (GPU-eq)": r["max_eq"]}


def _now_table(rows: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([{
        "queue": r["queue"], "allocated (GPUs)": r["allocated"], "reserved (GPUs)": r.get("reserved"),
        "guaranteed (GPUs)": r["guaranteed"], "entitlement (GPUs)": r.get("entitlement"),
        "max (GPUs)": "unlimited" if r["max"] is None else r["max"],
        **_eq(r), "pending (GPUs)": r["pending"],
        "borrowed (GPUs)": r["borrowed"], "lent (GPUs)": r["lent"], "idle (GPUs)": r["idle"],
        "fair share (%)": round(100 * r["fair_share"], 1), "source": r.get("source")} for r in rows])


def body(client: Client, rng: Range) -> None:
    rows = fetch_queues(client)
    if rows is None:
        return
    now = [r for r in rows if r["gpu_type"] == "*" and r["queue"] != "root"]
    if not now:
        st.info("No queues: set queues_file in the config (see docs/ARCHITECTURE.md for the queue file).")
        return
    names = [r["queue"] for r in now]
    leaf = set(leaves(names))
    top = [r for r in now if "." not in r["queue"]]
    metrics_row([
        ("Queues", f"{len(leaf)} leaves"),
        ("Allocated", gpus(sum(r["allocated"] for r in top))),
        ("Guaranteed", gpus(sum(r["guaranteed"] or 0 for r in top))),
        ("Borrowed", gpus(sum(r["borrowed"] or 0 for r in top)), "allocated above the guarantee"),
        ("Lent", gpus(sum(r["lent"] or 0 for r in top)), "guarantee not in use, lent to others"),
        ("Pending", gpus(sum(r["pending"] for r in top))),
    ])
    rng = fit(client, rng)
    series = fetch(client, "/accounting/series", **{"from": rng.since, "to": "now", "step": rng.step})
    cap = fetch(client, "/accounting/capacity")
    if series:
        df = pd.DataFrame(series)
        df["time"] = pd.to_datetime(df["t"], unit="s", utc=True)
        colour = alt.Color("queue:N", scale=queue_scale(client))
        st.subheader(f"All leaf queues against capacity, {rng.label}")
        stacked = alt.Chart(df[df["queue"].isin(leaf)]).mark_area(opacity=0.85, interpolate="step-after").encode(
            x=alt.X("time:T", title=None), y=alt.Y("allocated:Q", stack="zero", title="allocated GPUs"),
            color=colour, tooltip=["queue", "time:T", alt.Tooltip("allocated:Q", format=",.3~f")])
        if cap and cap.get("total"):
            rule = alt.Chart(pd.DataFrame([{"capacity": cap["total"]["capacity"]}])).mark_rule(
                strokeDash=[6, 3], color="black").encode(y="capacity:Q", tooltip=["capacity:Q"])
            stacked = stacked + rule
        st.altair_chart(stacked.properties(height=260), width="stretch")
        with_eq = "allocated_eq" in df.columns
        st.subheader("Per queue: allocated (area), guaranteed (solid), max (dashed)"
                     + (", in GPUs and in GPU-equivalents side by side" if with_eq else ""))
        if with_eq:
            st.caption("GPU-equivalents: each GPU type's GPUs times its equivalent in the queue file "
                       "(gpu_types.<type>.equivalent); a queue's gpu_eq guarantee and max are drawn in them.")
        grid = _per_queue(per_queue_long(df), client, with_eq)
        st.altair_chart(grid, width="content")
    else:
        st.info(f"No allocations in the {rng.label}.")
    st.subheader("Now")
    table(_now_table(now).dropna(axis=1, how="all"))
    _drill(client, now, names)


UNITS = {"": "GPUs", "_eq": "GPU-equivalents"}


def per_queue_long(df: pd.DataFrame) -> pd.DataFrame:
    """The series as rows of (queue, time, kind, unit, value): ``kind`` allocated, guaranteed or
    max, ``unit`` GPUs, and GPU-equivalents where the API gives them (its ``*_eq``)."""
    parts = []
    for suffix, unit in UNITS.items():
        cols = [f"{k}{suffix}" for k in ("allocated", "guaranteed", "max")]
        if cols[0] not in df.columns:
            continue
        part = df[["queue", "time", *cols]].rename(columns=dict(zip(cols, ("allocated", "guaranteed", "max"))))
        part = part.melt(id_vars=["queue", "time"], var_name="kind", value_name="GPUs").dropna()
        part["unit"] = unit
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def _per_queue(long: pd.DataFrame, client: Client, with_eq: bool) -> alt.FacetChart:
    """One small chart per queue; with equivalents a row per queue, GPUs and GPU-equivalents side
    by side (the column headers say which)."""
    area = alt.Chart().mark_area(opacity=0.6, interpolate="step-after").encode(
        x=alt.X("time:T", title=None), y=alt.Y("GPUs:Q", title="GPUs or GPU-eq" if with_eq else "GPUs"),
        color=alt.Color("queue:N", scale=queue_scale(client), legend=None),
        tooltip=["queue", "unit", "time:T", alt.Tooltip("GPUs:Q", title="allocated", format=",.3~f")],
    ).transform_filter("datum.kind == 'allocated'")
    lim = alt.Chart().mark_line(color="#333", interpolate="step-after").encode(
        x="time:T", y="GPUs:Q", detail="kind:N",
        strokeDash=alt.StrokeDash("kind:N", title="limit", scale=alt.Scale(
            domain=["guaranteed", "max"], range=[[1, 0], [5, 3]])),
    ).transform_filter("datum.kind != 'allocated'")
    layer = alt.layer(area, lim, data=long).properties(width=290, height=130)
    if with_eq:
        return layer.facet(row=alt.Row("queue:N", title=None),
                           column=alt.Column("unit:N", title=None, sort=list(UNITS.values()))
                           ).resolve_scale(y="independent")
    return layer.facet(facet=alt.Facet("queue:N", title=None), columns=2).resolve_scale(y="independent")


def placement(p: dict[str, float] | None) -> str | None:
    """Where a running workload holds its GPUs: "a10-0: 0.75, a10-1: 1" (a share as its decimals)."""
    return ", ".join(f"{node}: {amount(g)}" for node, g in p.items()) if p else None


def _drill(client: Client, now: list[dict], names: list[str]) -> None:
    st.subheader("Drill into a queue")
    q = st.selectbox("Queue", sorted(names), key="queue_drill")
    kids = [r for r in now if r["queue"].startswith(q + ".") and "." not in r["queue"][len(q) + 1:]]
    if kids:
        st.markdown(f"**Children of {q}**")
        table(_now_table(kids).dropna(axis=1, how="all"))
    work = fetch(client, "/workloads", queue=q)
    if work is None:
        return
    active = [w for w in work if w["state"] in ("pending", "running")]
    st.markdown(f"**Workloads in {q} and below** ({len(active)} pending or running)")
    if not active:
        st.info(f"No pending or running workloads in {q} (gpuq's, or Kueue's with queues_from: kueue).")
        return
    table(pd.DataFrame([{
        "id": w["id"], "queue": w["queue"], "state": w["state"], "GPUs": w["gpus"], "GPU type": w["gpu_type"],
        "placement": placement(w["placement"]),
        "priority": w["priority"], "submitted": when(w["submit_s"]), "reason": w["reason_code"],
        **({"gpuq would": w["advice"]["summary"].removeprefix("gpuq would ")} if w.get("advice") else {}),
        "message": w["message"], "idle": w["idle"]} for w in active]))


if __name__ == "__main__":      # run by st.navigation as a page script
    page()
