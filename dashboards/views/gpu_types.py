"""GPU types: how capacity and use split by type, and by type and queue."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboards.client import Client
from dashboards.common import Range, bar_height, fetch, gpus, metrics_row, pct, queue_scale, table, type_scale
from dashboards.views import run


def page() -> None:
    run("GPU types", "Which GPU types do we have, and which queues use them?", body)


def body(client: Client, rng: Range) -> None:
    cap = fetch(client, "/accounting/capacity")
    if cap is None:
        return
    types = cap["types"]
    if not types:
        st.info("No GPU nodes seen yet: configure collector.kubernetes or collector.ray and run `gpuq serve`.")
        return
    metrics_row([(t["gpu_type"], gpus(t["capacity"]),
                  f"{gpus(t['allocated'])} allocated ({pct(t['allocated'] / t['capacity'] if t['capacity'] else 0)}), "
                  f"{gpus(t['free'])} free") for t in types][:8])
    left, right = st.columns(2)
    with left:
        st.subheader("Capacity by type")
        df = pd.DataFrame([{"GPU type": t["gpu_type"], "GPUs": t["capacity"]} for t in types])
        st.altair_chart(alt.Chart(df).mark_arc(innerRadius=60).encode(
            theta="GPUs:Q", color=alt.Color("GPU type:N", scale=type_scale(client)),
            tooltip=["GPU type", "GPUs"]).properties(height=260), width="stretch")
    with right:
        st.subheader("Allocated share by type")
        df = pd.DataFrame([{"GPU type": t["gpu_type"], "allocated (%)": round(100 * t["allocated"] / t["capacity"], 1)
                            if t["capacity"] else 0.0} for t in types])
        st.altair_chart(alt.Chart(df).mark_bar().encode(
            x=alt.X("GPU type:N", sort=None), y=alt.Y("allocated (%):Q", scale=alt.Scale(domain=[0, 100])),
            color=alt.Color("GPU type:N", scale=type_scale(client), legend=None),
            tooltip=["GPU type", "allocated (%)"]).properties(height=260), width="stretch")
    dist = [d for d in cap.get("distribution", []) if d["queue"] != "*"]
    st.subheader("Allocated GPUs by type and queue")
    if dist:
        df = pd.DataFrame([{"GPU type": d["gpu_type"], "queue": d["queue"], "allocated (GPUs)": d["allocated"],
                            "idle (GPUs)": d["idle"]} for d in dist])
        st.altair_chart(alt.Chart(df).mark_bar().encode(
            y=alt.Y("GPU type:N", sort=None), x=alt.X("sum(allocated (GPUs)):Q", title="allocated GPUs"),
            color=alt.Color("queue:N", scale=queue_scale(client, df["queue"])), tooltip=list(df.columns)
        ).properties(height=bar_height(len(types), 44)), width="stretch")
        table(df)
    else:
        st.info("No GPUs are allocated now.")
    st.subheader("By type")
    table(pd.DataFrame([{"GPU type": "all types" if t["gpu_type"] == "*" else t["gpu_type"], "capacity (GPUs)": t["capacity"],
                                "allocated (GPUs)": t["allocated"], "idle (GPUs)": t["idle"], "free (GPUs)": t["free"],
                                "fragmentation (%)": round(100 * t["fragmentation_ratio"], 1)}
                               for t in [*types, cap["total"]]]))


if __name__ == "__main__":      # run by st.navigation as a page script
    page()
