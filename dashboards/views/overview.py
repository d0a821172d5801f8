"""Overview: how many GPUs of each type are there, used, idle, free; who is starving or borrowing;
are the collectors alive."""
from __future__ import annotations

import altair as alt
import pandas as pd
import streamlit as st

from dashboards.client import Client
from dashboards.common import (
    STATE_COLOURS,
    Range,
    bar_height,
    fetch,
    fetch_queues,
    gpus,
    hours,
    metrics_row,
    pct,
    table,
    when,
)
from dashboards.views import run
from gpuq.timefmt import ago


def page() -> None:
    run("Overview", "How many GPUs are there, how many are used, idle or free, and who is waiting?", body)


def body(client: Client, rng: Range) -> None:
    cap = fetch(client, "/accounting/capacity")
    if cap is None:
        return
    total = cap["total"]
    if not total or not total["capacity"]:
        st.info("No GPU nodes seen yet: the accounting reads capacity from Kubernetes node events or Ray's "
                "resources. Configure collector.kubernetes or collector.ray and run `gpuq serve`.")
    else:
        pending = sum(v for k, v in cap["pending"].items() if k == "*")
        metrics_row([
            ("Capacity", gpus(total["capacity"])),
            ("Allocated", gpus(total["allocated"]), f"{pct(total['allocated'] / total['capacity'])} of capacity"),
            ("Idle allocated", gpus(total["idle"]), "allocated GPUs under the idle threshold for the idle window"),
            ("Free", gpus(total["free"])),
            ("Fragmentation", pct(total["fragmentation_ratio"]),
             "free GPUs on partly used nodes / all free GPUs: what a whole-node request cannot use"),
            ("Pending demand", gpus(pending)),
        ])
        _by_type(cap)
    _queues(client, cap)
    _health(client)


def _by_type(cap: dict) -> None:
    rows = []
    for t in cap["types"]:
        busy = max(0.0, t["allocated"] - t["idle"])
        unavailable = max(0.0, t["capacity"] - t["allocated"] - t["free"])
        rows += [(t["gpu_type"], s, v) for s, v in (("busy", busy), ("idle", t["idle"]), ("free", t["free"]),
                                                    ("unavailable", unavailable))]
    df = pd.DataFrame(rows, columns=["GPU type", "state", "GPUs"])
    st.subheader("GPUs by type")
    chart = alt.Chart(df).mark_bar().encode(
        y=alt.Y("GPU type:N", sort=None), x=alt.X("sum(GPUs):Q", title="GPUs"),
        color=alt.Color("state:N", scale=alt.Scale(domain=list(STATE_COLOURS), range=list(STATE_COLOURS.values()))),
        order=alt.Order("state_order:Q"), tooltip=["GPU type", "state", "GPUs"],
    ).transform_calculate(state_order="indexof(['busy','idle','free','unavailable'], datum.state)")
    st.altair_chart(chart.properties(height=bar_height(len(cap["types"]), 44)), width="stretch")
    rows_df = pd.DataFrame([{
        "GPU type": "all types" if t["gpu_type"] == "*" else t["gpu_type"], "capacity (GPUs)": t["capacity"], "allocated (GPUs)": t["allocated"],
        "idle allocated (GPUs)": t["idle"], "free (GPUs)": t["free"],
        "fragmentation (%)": round(100 * t["fragmentation_ratio"], 1),
        "pending (GPUs)": cap["pending"].get(t["gpu_type"], 0.0),
        "8-GPU slots free": t["fits"].get("8", 0)} for t in [*cap["types"], cap["total"]]])
    table(rows_df)


def _queues(client: Client, cap: dict) -> None:
    rows = fetch_queues(client)
    if rows is None:
        return
    st.subheader("Queues now")
    starving = cap.get("starving", [])
    borrowing = [r for r in rows if r["gpu_type"] == "*" and (r.get("borrowed") or 0) > 0 and r["queue"] != "root"]
    left, right = st.columns(2)
    with left:
        st.markdown("**Starved** (below guarantee with work waiting)")
        if starving:
            table(pd.DataFrame([{"queue": s["queue"], "allocated (GPUs)": s["allocated"],
                                        "guaranteed (GPUs)": s["guaranteed"], "pending (GPUs)": s["pending"],
                                        "waiting": hours(s["waiting_s"])} for s in starving]))
        else:
            st.success("No queue is starved.")
    with right:
        st.markdown("**Over their guarantee** (borrowing)")
        if borrowing:
            table(pd.DataFrame([{"queue": r["queue"], "allocated (GPUs)": r["allocated"],
                                        "guaranteed (GPUs)": r["guaranteed"], "borrowed (GPUs)": r["borrowed"]}
                                       for r in borrowing]))
        else:
            st.info("No queue is above its guarantee.")


def _health(client: Client) -> None:
    h = fetch(client, "/collector/health")
    if h is None:
        return
    st.subheader("Collectors")
    src = h["sources"]
    if not src:
        st.warning("No collector data in the last 24 h: nothing has written samples or events. Configure "
                   "collector.dcgm / kubernetes / ray and check `gpuq serve`'s log.")
        return
    if not any(s["source"] in ("dcgm", "nvml") for s in src):
        st.info("No DCGM data yet: idle GPUs need DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL "
                "(collector.dcgm or collector.nvml).")
    stale = [s for s in src if s["stale"]]
    if stale:
        st.warning(f"{len(stale)} source(s) silent for more than {h['stale_after_s']:.0f} s.")
    table(pd.DataFrame([{"source": s["source"], "cluster": s["cluster"], "node": s["node"] or "–",
                                "last row": when(s["last_s"]), "age": ago(s["age_s"]),
                                "rows (24 h)": s["rows"], "status": "stale" if s["stale"] else "ok"}
                               for s in src]))
    if h["targets"]:
        table(pd.DataFrame(h["targets"]))


if __name__ == "__main__":      # run by st.navigation as a page script
    page()
