"""Idle GPUs: allocated but unused (by queue and workload, for how long), free GPUs by type and
node, a node-by-GPU map showing what fragmentation strands, and the idle GPU-hours of the range by
workload with how they were measured (``idle_method``: a share of a GPU is idle by its share)."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from dashboards import nodemap
from dashboards.client import Client
from dashboards.common import (
    STATE_COLOURS,
    Range,
    amount,
    bar_height,
    fetch,
    gpus,
    hours,
    metrics_row,
    pct,
    queue_scale,
    table,
    when,
)
from dashboards.views import run


def page() -> None:
    run("Idle GPUs", "Which allocated GPUs sit idle, since when, and where are the free ones?", body)


def body(client: Client, rng: Range) -> None:
    idle = fetch(client, "/accounting/idle")
    cap = fetch(client, "/accounting/capacity")
    if idle is None or cap is None:
        return
    work = idle["workloads"]
    total = cap["total"] or {"free": 0.0, "fragmented_free": 0.0, "fragmentation_ratio": 0.0}
    metrics_row([
        ("Idle allocated", gpus(idle["idle_gpus"])),
        ("Idle workloads", f"{len(work)}"),
        ("Longest idle", hours(max((w["idle_for_s"] for w in work), default=0.0))),
        ("Free", gpus(total["free"])),
        ("Stranded free", gpus(total["fragmented_free"]),
         f"free GPUs on partly used nodes ({pct(total['fragmentation_ratio'])} of free)"),
    ])
    st.subheader("Idle allocated GPUs")
    if work:
        df = pd.DataFrame([{"queue": w["queue"], "workload": w["name"],
                            "idle (GPUs)": w["idle_gpus"], "allocated (GPUs)": w["allocated_gpus"],
                            "GPU type": w["gpu_type"], "idle for": hours(w["idle_for_s"]),
                            "idle for (h)": round(w["idle_for_s"] / 3600, 2), "idle since": when(w["idle_since"]),
                            "nodes": ", ".join(w["nodes"])} for w in work])
        st.altair_chart(alt.Chart(df).mark_bar().encode(
            y=alt.Y("workload:N", sort="-x", title=None), x=alt.X("idle (GPUs):Q"),
            color=alt.Color("queue:N", scale=queue_scale(client, df["queue"])), tooltip=list(df.columns),
        ).properties(height=bar_height(len(df))), width="stretch")
        table(df)
    else:
        health = fetch(client, "/collector/health") or {"sources": []}
        if not any(s["source"] in ("dcgm", "nvml") for s in health["sources"]):
            st.info("No DCGM data yet: idle detection needs DCGM_FI_PROF_GR_ENGINE_ACTIVE or DCGM_FI_DEV_GPU_UTIL "
                    "samples (configure collector.dcgm or collector.nvml).")
        else:
            st.success("No allocated GPU has been idle for the whole idle window.")
    _nodes(client, cap, idle)
    _methods(client, rng)


METHODS = {
    "device": "whole GPUs and MIG slices: the device's own activity",
    "per_process": "a share of a GPU: its own processes' activity (dcgm-exporter's per-process fields)",
    "device_split_by_share": "a share of a GPU: the device's activity, a quiet device idle for each holder "
                             "by its share",
}


def _methods(client: Client, rng: Range) -> None:
    rows = fetch(client, "/accounting/usage", **{"from": rng.since, "to": "now", "by": "queue,workload"})
    idle = [r for r in rows or () if r["idle_gpu_seconds"] > 0]
    if not idle:
        return
    st.subheader(f"Idle GPU-hours ({rng.key}) and how they were measured")
    st.caption("A share of a GPU (a time-sliced replica, a KAI fraction) or a MIG slice is idle for its share of "
               "the device, not for a whole GPU. idle_method: " + "; ".join(f"{k}: {v}" for k, v in METHODS.items())
               + ".")
    table(pd.DataFrame([{"queue": r["queue"], "workload": r["workload"],
                         "idle (GPU-h)": round(r["idle_gpu_seconds"] / 3600, 3),
                         "used (GPU-h)": round(r["gpu_seconds"] / 3600, 3), "idle share": pct(r["idle_ratio"]),
                         "idle_method": r["idle_method"] or "–"}
                        for r in sorted(idle, key=lambda r: -r["idle_gpu_seconds"])]))


def _nodes(client: Client, cap: dict, idle: dict) -> None:
    nodes = cap["nodes"]
    if not nodes:
        return
    idle_on = {(n["cluster"], n["node"]): n["idle_gpus"] for n in idle["nodes"]}
    st.subheader("Node by GPU map")
    placed = fetch(client, "/nodes") or []          # the scheduler's: which device each of its shares is on
    segments, outlines = nodemap.cells(nodes, idle_on, nodemap.known_devices(nodes, placed))
    shared = nodemap.partial(segments)
    st.caption("Each cell is one GPU: busy, idle (allocated, unused), free, or unavailable (node not ready or "
               "cordoned); a GPU held in part (a share: a Ray task's num_gpus=0.5, a pod's fraction) is filled "
               "in part, and a MIG slice is a sub-cell as wide as its share of the GPU. Free cells on a partly "
               "used node are stranded for whole-node requests. Shares gpuq placed are drawn on the devices "
               "its placements name; for the other shares the API gives each node's amounts, not which "
               "device holds which share, so they are estimated, marked ≈: filled in order, whole GPUs first, "
               "what is left one partly filled cell (they may sit on more devices than drawn)."
               + (f" Partly held now: {', '.join(_held(s) for s in shared)}." if shared else ""))
    st.altair_chart(_map(segments, outlines, len(nodes)), width="stretch")
    st.subheader("Free GPUs by type and node")
    free = [n for n in nodes if n["free"] > 0]
    if not free:
        st.info("No free GPUs.")
        return
    table(pd.DataFrame([{"GPU type": n["gpu_type"], "node": n["node"], "cluster": n["cluster"],
                                "free (GPUs)": n["free"], "capacity (GPUs)": n["capacity"],
                                "stranded": 0 < n["free"] < n["capacity"]} for n in free]))


def _map(segments: list[dict], outlines: list[dict], rows: int) -> alt.LayerChart:
    """Cells as rectangles on a GPU axis: the states' segments, then each GPU's and slice's outline
    over them (white), so a partly filled cell reads as one cell."""
    width = max((o["x2"] for o in outlines), default=1.0)
    scale = alt.Scale(domain=[0, width], nice=False)
    x = alt.X("x:Q", title="GPUs", scale=scale,
              axis=alt.Axis(tickMinStep=1, format="d", grid=False))
    y = alt.Y("node:N", sort=None, title=None, axis=alt.Axis(labelLimit=320))
    fill = alt.Chart(pd.DataFrame(segments)).mark_rect().encode(
        x=x, x2="x2:Q", y=y,
        color=alt.Color("state:N", scale=alt.Scale(domain=list(STATE_COLOURS), range=list(STATE_COLOURS.values()))),
        tooltip=["node", "unit", "state", alt.Tooltip("share:Q", title="of it"),
                 alt.Tooltip("placed:N", title="device")])
    lines = alt.Chart(pd.DataFrame(outlines)).mark_rect(filled=False, color="white").encode(
        x=x, x2="x2:Q", y=y,
        strokeWidth=alt.StrokeWidth("kind:N", scale=alt.Scale(domain=["GPU", "slice"], range=[3, 1]), legend=None))
    layers = [fill, lines]
    guessed = [{**s, "mid": (s["x"] + s["x2"]) / 2, "mark": "≈"} for s in segments if s["placed"] == "estimate"]
    if guessed:          # a share whose device is not known: laid out by estimate
        layers.append(alt.Chart(pd.DataFrame(guessed)).mark_text(fontSize=14, color="black").encode(
            x=alt.X("mid:Q", scale=scale), y=y, text="mark:N", tooltip=["node", "unit", "state", "share"]))
    return alt.LayerChart(layer=layers, height=bar_height(rows, 30))


def _held(segment: Mapping[str, Any]) -> str:
    """ "a100-0 (A100) GPU 2: 0.25 busy" for the caption; "≈" after it where the device is estimated."""
    mark = " ≈" if segment.get("placed") == "estimate" else ""
    return f"{segment['node']} {segment['unit']}: {amount(segment['share'])} {segment['state']}{mark}"


if __name__ == "__main__":      # run by st.navigation as a page script
    page()
