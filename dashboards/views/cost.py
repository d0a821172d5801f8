"""Cost: GPU-hours, idle GPU-hours and cost per queue and GPU type over the range, as CSV too; and
what gpuq's preemptions threw away per queue over the range (issue 21: ``lost_gpu_seconds`` of
``/accounting/usage`` by queue, the work since each victim's last checkpoint)."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboards.client import Client
from dashboards.common import Range, bar_height, fetch, metrics_row, queue_scale, type_scale
from dashboards.views import run

COLUMNS = ["queue", "gpu_type", "gpu_hours", "idle_gpu_hours", "idle_pct", "cost", "idle_cost"]


def page() -> None:
    run("Cost", "Who used how many GPU-hours, how many of them idle, and what did it cost?", body)


EQ_COLUMNS = ["eq_hours", "cost_per_eq_hour"]     # where the queue file sets GPU-equivalents


def table(rows: list[dict]) -> pd.DataFrame:
    """The usage rows as the CSV download has them (GPU-hours, %, $; GPU-equivalent hours and $ per
    equivalent hour beside them where equivalents are set)."""
    eq = any("eq_hours" in r for r in rows)
    return pd.DataFrame([{
        "queue": r["queue"], "gpu_type": r["gpu_type"], "gpu_hours": round(r["gpu_seconds"] / 3600, 3),
        "idle_gpu_hours": round(r["idle_gpu_seconds"] / 3600, 3), "idle_pct": round(100 * r["idle_ratio"], 1),
        "cost": round(r["cost"], 2), "idle_cost": round(r["idle_cost"], 2),
        **({"eq_hours": round(r["eq_hours"], 3), "cost_per_eq_hour": r["cost_per_eq_hour"]} if eq else {})}
        for r in rows], columns=COLUMNS + (EQ_COLUMNS if eq else []))


LOST_HELP = ("GPU-hours of work gpuq's preemptions threw away: since the workload's last reported checkpoint "
             "(POST /workloads/{id}/checkpoint or the gpuq.io/last-checkpoint annotation), all of its run "
             "without one")


def lost_by_queue(client: Client, rng: Range) -> dict[str, float] | None:
    """Queue -> GPU-hours preemptions threw away over the range (the queues that lost some), or None
    when the API did not answer (said on the page). The scheduler page shows the same numbers."""
    rows = fetch(client, "/accounting/usage", **{"from": rng.since, "to": "now", "by": "queue"})
    if rows is None:
        return None
    return {r["queue"]: r["lost_gpu_seconds"] / 3600 for r in rows if r.get("lost_gpu_seconds")}


def lost_table(lost: dict[str, float]) -> pd.DataFrame:
    return pd.DataFrame([{"queue": q, "lost GPU-h": round(h, 3)} for q, h in sorted(lost.items())],
                        columns=["queue", "lost GPU-h"])


def body(client: Client, rng: Range) -> None:
    rows = fetch(client, "/accounting/usage", **{"from": rng.since, "to": "now", "by": "queue,gpu_type"})
    lost = lost_by_queue(client, rng) if rows is not None else None      # one message when the API is down
    if rows is None or lost is None:
        return
    if not rows:
        st.info(f"No GPU usage in the last {rng.key}: no allocations were collected in this range.")
        return
    df = table(rows)
    used, idle_h, cost = df["gpu_hours"].sum(), df["idle_gpu_hours"].sum(), df["cost"].sum()
    metrics_row([
        (f"GPU-hours ({rng.key})", f"{used:,.1f} GPU-h"),
        ("Idle GPU-hours", f"{idle_h:,.1f} GPU-h"),
        ("Idle share", f"{100 * idle_h / used if used else 0:.1f} %"),
        ("Cost", f"$ {cost:,.2f}", "gpu_types.*.price_per_hour in the queue file"),
        ("Idle cost", f"$ {df['idle_cost'].sum():,.2f}"),
        ("Lost to preemption", f"{sum(lost.values()):,.2f} GPU-h", LOST_HELP),
        *([("Cost per GPU-equivalent hour", f"$ {cost / df['eq_hours'].sum():,.2f}",
            "cost over GPU-hours x gpu_types.*.equivalent")] if "eq_hours" in df and df["eq_hours"].sum() else []),
    ])
    left, right = st.columns(2)
    with left:
        st.subheader("GPU-hours per queue, by type")
        st.altair_chart(alt.Chart(df).mark_bar().encode(
            y=alt.Y("queue:N", sort="-x", title=None), x=alt.X("sum(gpu_hours):Q", title="GPU-h"),
            color=alt.Color("gpu_type:N", title="GPU type", scale=type_scale(client, df["gpu_type"])),
            tooltip=COLUMNS).properties(height=bar_height(df["queue"].nunique())), width="stretch")
    with right:
        st.subheader("Cost per queue")
        st.altair_chart(alt.Chart(df).mark_bar().encode(
            y=alt.Y("queue:N", sort="-x", title=None), x=alt.X("sum(cost):Q", title="$"),
            color=alt.Color("queue:N", scale=queue_scale(client, df["queue"]), legend=None),
            tooltip=COLUMNS).properties(height=bar_height(df["queue"].nunique())), width="stretch")
    st.dataframe(df, hide_index=True, width="stretch", column_config={
        "gpu_hours": st.column_config.NumberColumn("GPU-h", format="%.2f"),
        "idle_gpu_hours": st.column_config.NumberColumn("idle GPU-h", format="%.2f"),
        "idle_pct": st.column_config.NumberColumn("idle %", format="%.1f %%"),
        "cost": st.column_config.NumberColumn("cost", format="$ %.2f"),
        "idle_cost": st.column_config.NumberColumn("idle cost", format="$ %.2f"),
        "eq_hours": st.column_config.NumberColumn("GPU-eq h", format="%.2f"),
        "cost_per_eq_hour": st.column_config.NumberColumn("$ / GPU-eq h", format="$ %.2f")})
    if lost:
        st.subheader("Lost to preemption per queue")
        st.dataframe(lost_table(lost), hide_index=True, width="stretch", column_config={
            "lost GPU-h": st.column_config.NumberColumn("lost GPU-h", format="%.3f", help=LOST_HELP)})
    st.download_button("Download CSV", df.to_csv(index=False).encode(), file_name=f"gpuq-cost-{rng.key}.csv",
                       mime="text/csv")


if __name__ == "__main__":      # run by st.navigation as a page script
    page()
