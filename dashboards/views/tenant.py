"""My queue: one queue as its tenants see it (``GET /queues/{queue}/tenant``, issue 21): its
guarantee and entitlement beside what it holds, its recent usage decayed and the score that places
it in the order of queues (fair share over time), when its pending work is forecast to start, and
the preemptions it suffered. A viewer token scoped to queues sees its own queues only; the queue
chosen stays in the URL (``?queue=research.vision``)."""
from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from dashboards.client import Client
from dashboards.common import Range, fetch, fetch_queues, gpus, metrics_row, table
from dashboards.views import run


def page() -> None:
    run("My queue", "What is my queue guaranteed, what did it use lately, and when does my work start?", body)


def _eta(e: dict | None) -> str:
    if not e:
        return "not forecast"
    return f"{e.get('p50', '?')} (p10 {e.get('p10', '?')}, p90 {e.get('p90', '?')})"


def body(client: Client, rng: Range) -> None:
    rows = fetch_queues(client)
    if rows is None:
        return
    names = sorted({r["queue"] for r in rows if r["queue"] != "root"})
    if not names:
        st.info("No queue to show: this token reads none, or the queue file has none.")
        return
    asked = st.query_params.get("queue")
    queue = st.selectbox("Queue", names, index=names.index(asked) if asked in names else 0)
    st.query_params["queue"] = queue
    t = fetch(client, f"/queues/{queue}/tenant")
    if t is None:
        return
    star: dict[str, Any] = next((r for r in t["now"] if r["gpu_type"] == "*"), {})
    usage = t["usage"]
    on = usage.get("half_life_s", 0) > 0
    items: list[tuple[str, ...]] = [("Allocated", gpus(star.get("allocated", 0.0))),
                                    ("Guaranteed", gpus(t["guaranteed"].get("gpu", 0)))]
    if "entitlement" in t:
        items.append(("Entitlement", gpus(t["entitlement"]), "its share of the GPUs beyond the guarantees"))
    items.append(("Pending", f"{len(t['pending'])} workloads"))
    if on and "decayed_gpu_hours" in usage:
        items.append(("Recent usage", f"{usage['decayed_gpu_hours']:,.1f} GPU-h",
                      f"GPU-hours decayed with a half-life of {usage['half_life_s'] / 86400:g} d"))
    items.append(("Preempted", f"{t['preemptions']['suffered']}", "recent preemptions that took its work"))
    metrics_row(items)
    if on and "score" in usage:
        st.caption(f"Score {usage['score']:.3g} (recent GPU-hours per weight {t['weight']:g}): place "
                   f"{usage['rank']} of {usage['queues_ranked']} queues; a lower score is served first "
                   "among queues equally owed GPUs.")
    elif not on:
        st.caption("Fair share over time is off (scheduler.usage_half_life_s: 0): queues are ordered by "
                   "their share of their guarantee alone.")
    st.subheader("Pending work and its forecast start")
    if t["pending"]:
        table(pd.DataFrame([{"workload": p["id"], "GPUs": p["gpus"], "position": p["position"],
                             "priority": p["priority"], "forecast start": _eta(p.get("eta")),
                             "why it waits": p.get("message") or ""} for p in t["pending"]]))
    else:
        st.info("Nothing pending.")
    st.subheader("Preemptions that took its work")
    pre = t["preemptions"]
    if "lost_gpu_seconds" in pre:
        st.caption(f"Work thrown away: {pre['lost_gpu_seconds'] / 3600:,.1f} GPU-h")
    if pre["recent"]:
        table(pd.DataFrame([{"preempted by": r["preemptor"], "its queue": r["queue"],
                             "victims": ", ".join(r["victims"]), "why": r["reason"]} for r in pre["recent"]]))
    else:
        st.info("No recent preemption took its work.")




if __name__ == "__main__":      # run by st.navigation as a page script
    page()
