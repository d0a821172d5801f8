"""Scheduler: what waits and why (and when it is expected to start), what was admitted and
preempted, how right the start-time forecasts were per queue, what would happen if a workload
arrived now (the API's dry run, with its forecast), and what the past days would have been with
other queues or nodes (the API's what-if, ``POST /admin/whatif``: docs/WHATIF.md)."""
from __future__ import annotations

import datetime as dt
import time
from typing import Any

import altair as alt
import pandas as pd
import streamlit as st

from dashboards.client import ApiError, Client
from dashboards.common import (Range, amount, bar_height, duration, fetch, fetch_queues, fit, gpus, leaves,
                               metrics_row, pct, table, when)
from dashboards.views import run
from dashboards.views.cost import LOST_HELP, lost_by_queue, lost_table

EVENT_COLOURS = {"admit": "#54a24b", "preempt": "#e45756", "finish": "#4c78a8", "cancel": "#bab0ac",
                 "reject": "#b279a2"}


def page() -> None:
    run("Scheduler", "What is waiting and why, what was admitted or preempted, and what if something arrived now?",
        body)
    _what_if(st.session_state["gpuq_client"])
    _history_what_if(st.session_state["gpuq_client"])


def _advice(w: dict) -> dict[str, str]:
    """The "gpuq would" column: for another scheduler's pending workload (``queues_from: kueue``:
    the reason beside it is Kueue's), what gpuq's scheduler would do with it (its advice's summary);
    no column at all where nothing has advice (gpuq schedules alone)."""
    a = w.get("advice")
    return {"gpuq would": a["summary"].removeprefix("gpuq would ")} if a else {}


def body(client: Client, rng: Range) -> None:
    work = fetch(client, "/workloads")
    shown_rng = fit(client, rng)
    events = fetch(client, "/scheduler/events", **{"from": rng.since, "to": "now"})
    lost = lost_by_queue(client, rng) if work is not None and events is not None else None
    if work is None or events is None or lost is None:
        return
    pending = sorted((w for w in work if w["state"] == "pending"), key=lambda w: (w["queue"], w["position"] or 0))
    running = [w for w in work if w["state"] == "running"]
    kinds = pd.Series([e["event"] for e in events], dtype="object").value_counts()
    metrics_row([
        ("Pending workloads", f"{len(pending)}", f"{gpus(sum(w['gpus'] for w in pending))} asked"),
        ("Pending GPUs", gpus(sum(w["gpus"] for w in pending))),
        ("Running workloads", f"{len(running)}", f"{gpus(sum(w['gpus'] for w in running))} held"),
        (f"Admitted ({rng.key})", f"{int(kinds.get('admit', 0))}"),
        (f"Preempted ({rng.key})", f"{int(kinds.get('preempt', 0))}"),
        (f"Lost to preemption ({rng.key})", f"{sum(lost.values()):,.2f} GPU-h", LOST_HELP),
    ])
    st.subheader("Pending workloads")
    now = shown_rng.end_s if shown_rng.end_s is not None else time.time()
    if pending:
        table(pd.DataFrame([{
            "queue": w["queue"], "position": w["position"], "id": w["id"], "GPUs": w["gpus"],
            "GPU types": ", ".join(w["gpu_types"]) or "any", "priority": w["priority"],
            "waiting": duration(max(0.0, now - w["submit_s"])), "expected start": expected(w.get("eta"), now),
            "reason": w["reason_code"], **_advice(w), "message": w["message"]}
            for w in pending]))
    else:
        st.success("Nothing is waiting.")
    _accuracy(client)
    st.subheader(f"Admissions and preemptions, {shown_rng.label}")
    shown = [e for e in events if e["event"] != "submit"]
    if not shown:
        st.info(f"No scheduler decisions in the last {rng.key}.")
    else:
        df = pd.DataFrame(shown)
        df["time"] = pd.to_datetime(df["t"], unit="s", utc=True)
        qnames = sorted({e["queue"] for e in shown})
        st.altair_chart(alt.Chart(df).mark_point(filled=True, size=90).encode(
            x=alt.X("time:T", title=None, scale=alt.Scale(domain=[_iso(now - shown_rng.seconds), _iso(now)])),
            y=alt.Y("queue:N", title=None),
            color=alt.Color("event:N", scale=alt.Scale(domain=list(EVENT_COLOURS), range=list(EVENT_COLOURS.values()))),
            shape="event:N", tooltip=["time:T", "event", "workload", "queue", "gpus", "by", "reason"],
        ).properties(height=bar_height(len(qnames))), width="stretch")
        table(pd.DataFrame([{"time": when(e["t"]), "event": e["event"], "workload": e["workload"],
                             "queue": e["queue"], "GPUs": e["gpus"] or None, "GPU type": e["gpu_type"] or None,
                             "by": e["by"] or None, "reason": e["reason"] or None,
                             "lost GPU-h": round(e["lost_gpu_seconds"] / 3600, 3) if "lost_gpu_seconds" in e
                             else None} for e in shown]))
    if lost:
        st.subheader(f"Lost to preemption per queue, {shown_rng.label}")
        table(lost_table(lost))


def expected(eta: dict[str, str] | None, now: float) -> str | None:
    """A forecast as the pending table shows it: "in 12 min (5 min to 25 min)": p50, and p10 to
    p90 (80 % of starts), counted from the API's now; None (shown "–") when there is none yet."""
    if not eta:
        return None
    p10, p50, p90 = (max(0.0, _seconds(eta[k]) - now) for k in ("p10", "p50", "p90"))
    if p90 <= 0:
        return "any moment now"
    return f"in {duration(p50)} ({duration(p10)} to {duration(p90)})"


def _seconds(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _accuracy(client: Client) -> None:
    st.subheader("Start-time forecasts: how right they were")
    acc = fetch(client, "/forecasts/accuracy")
    if acc is None:
        return
    rows: list[dict[str, Any]] = acc.get("queues") or []
    if not rows:
        st.info("No workload has started with a forecast yet.")
        return
    table(pd.DataFrame([{
        "queue": r["queue"], "forecast": FORECAST_KINDS.get(r["forecast"], r["forecast"]), "starts": r["starts"],
        "inside p10-p90": pct(r["inside_interval"]), "median error": duration(r["median_error_s"]),
        "median relative error": pct(r["median_relative_error"])} for r in rows]))
    st.caption("Over each queue's last starts: the share that started between the forecast's p10 and p90 "
               "(80 % is calibrated), and how far p50 was from the start (relative: over the wait, for "
               "waits of a minute or more).")


FORECAST_KINDS = {"submit": "first, after submission", "latest": "last, before the start"}


def _iso(t: float) -> str:
    return pd.Timestamp(t, unit="s", tz="UTC").isoformat()


def _what_if(client: Client) -> None:
    st.subheader("What if this arrived now?")
    rows = fetch_queues(client)
    if rows is None:
        return
    qs = leaves(r["queue"] for r in rows if r["queue"] != "(unassigned)")
    types = sorted({r["gpu_type"] for r in rows if r["gpu_type"] != "*"})
    if not qs:
        st.info("No queues configured.")
        return
    with st.form("what_if"):
        c1, c2, c3, c4 = st.columns(4)
        queue = c1.selectbox("Queue", qs)
        pods = c2.number_input("Pods", min_value=1, value=1, step=1)
        per_pod = c3.number_input("GPUs per pod (below 1: a share of one GPU)", min_value=0.001, value=8.0,
                                  step=0.25, format="%g")
        priority = c4.number_input("Priority", value=0, step=1)
        wanted = st.multiselect("GPU types (in order of preference; none: any)", types)
        preemptible = st.checkbox("Preemptible", value=True)
        token = st.text_input("Operator token (the dry run needs the operator role; empty: the dashboard's)",
                              type="password")
        go = st.form_submit_button("Dry run")
    if not go:
        return
    body = {"queue": queue, "pods": int(pods), "gpus_per_pod": per_pod_json(per_pod), "priority": int(priority),
            "gpu_types": wanted, "preemptible": preemptible}
    try:
        d = client.post("/dry-run", body, token or None)
    except ApiError as exc:
        st.error(f"Dry run refused: {exc.url}: {exc.why}")
        return
    _answer(d)


def per_pod_json(v: float) -> int | float:
    """The form's GPUs per pod as the API takes it: whole GPUs an int, a share its thousandths
    (0.5, 0.125; the API refuses anything finer, or a fraction above 1, naming the field)."""
    return int(v) if float(v).is_integer() else round(float(v), 3)


def _answer(d: dict) -> None:
    outcome = d["outcome"]
    where = ", ".join(f"{n}: {gpus(g)}" for n, g in (d.get("placement") or {}).items())
    text = {"admit": f"Admitted now on {d.get('gpu_type')}: {where}",
            "preempt": f"Admitted once {len(d.get('victims') or [])} workload(s) stop",
            "pending": f"Pending: {d.get('reason_code')}: {d.get('message')}"
                       + (f" (position {d['position']})" if d.get("position") is not None else ""),
            "reject": f"Rejected: {d.get('message')}"}.get(outcome, outcome)
    if outcome == "pending" and d.get("eta"):
        text += f"; expected to start {expected(d['eta'], _seconds(d['eta']['at']))}"
    (st.success if outcome == "admit" else st.warning if outcome in ("preempt", "pending") else st.error)(text)
    if d.get("victims"):
        table(pd.DataFrame(d["victims"]))
    if d.get("after_delay"):
        a = d["after_delay"]
        st.info(" ".join(x for x in ("After the preemption delay:", a.get("outcome"), a.get("reason_code"),
                                     a.get("message")) if x))
    if d.get("also_admitted"):
        st.caption(f"This cycle would also admit: {', '.join(map(str, d['also_admitted']))}")


WINDOWS = {"last day": "-1d", "last 7 days": "-7d", "last 30 days": "-30d"}
WAIT_S = 45.0          # how long the page waits for a replay before it offers to look again


def _history_what_if(client: Client) -> None:
    st.subheader("What if the queues or the nodes had been different?")
    st.caption("Replays the work gpuq saw over the window as it happened and again with the change, and shows "
               "both per queue. Needs the admin role; the replay runs outside the API (docs/WHATIF.md).")
    nodes = fetch(client, "/nodes")
    names = sorted(n["name"] for n in nodes or [])
    with st.form("history_what_if"):
        c1, c2 = st.columns(2)
        window = c1.selectbox("Window", list(WINDOWS), index=1)
        add = c2.text_input("Add nodes (TYPE:GPUSxCOUNT, comma-separated)", placeholder="H100:8x4, A100:8x2")
        remove = st.multiselect("Remove nodes", names)
        queues = st.text_area("Queue file to replay under (YAML; empty: the queues as they are)", height=150)
        token = st.text_input("Admin token (empty: the dashboard's)", type="password", key="whatif_token")
        go = st.form_submit_button("Replay")
    if go:
        body = {"from": WINDOWS[window], "to": "now", "add_nodes": [a.strip() for a in add.split(",") if a.strip()],
                "remove_nodes": remove}
        if queues.strip():
            body["queues"] = queues
        try:
            job = client.post("/admin/whatif", body, token or None)
        except ApiError as exc:
            st.error(f"What-if refused: {exc.why}")
            return
        st.session_state["whatif_job"] = (job["id"], token or None)
    held = st.session_state.get("whatif_job")
    if held is None:
        return
    job_id, job_token = held
    job = _wait(client, job_id, job_token)
    if job is None:
        return
    if job["state"] == "running":
        st.info(f"The replay {job_id} is still running (started {job['started']}).")
        st.button("Look again", key="whatif_again")
    elif job["state"] == "failed":
        st.error(f"The replay failed: {job.get('error')}")
    else:
        _report(job["report"])


def _wait(client: Client, job_id: str, token: str | None) -> dict | None:
    end = time.monotonic() + WAIT_S
    with st.spinner("Replaying the history twice..."):
        while True:
            try:
                job = client.get_now(f"/admin/whatif/{job_id}", token)
            except ApiError as exc:
                st.error(f"What-if {job_id}: {exc.why}")
                st.session_state.pop("whatif_job", None)
                return None
            if job["state"] != "running" or time.monotonic() > end:
                return dict(job)
            time.sleep(0.5)


def report_frame(report: dict) -> pd.DataFrame:
    """The report's side-by-side rows: queue, metric, before, after, delta."""
    labels = {"wait_p50_s": "wait p50 (s)", "wait_p90_s": "wait p90 (s)", "gpu_hours": "GPU-hours",
              "lost_gpu_hours": "lost GPU-hours", "utilization": "utilization", "preemptions": "preemptions",
              "guarantee_violation_s": "guarantee violated (s)"}
    return pd.DataFrame([{"queue": q, "metric": labels.get(m, m), "before": v["before"], "after": v["after"],
                          "delta": v["delta"]} for q, metrics in report["queues"].items() for m, v in metrics.items()])


def _signed(v: float) -> str:
    return ("+" if v >= 0 else "") + amount(v)


def _report(r: dict) -> None:
    w, change = r["workloads"], r["change"]
    what = "; ".join(x for x in (
        "the queues given" if change["queues"] else "",
        f"add {', '.join(change['add_nodes'])}" if change["add_nodes"] else "",
        f"remove {', '.join(change['remove_nodes'])}" if change["remove_nodes"] else "") if x) or "no change"
    totals = r["queues"]["(all)"]
    metrics_row([
        ("Workloads replayed", f"{w['replayed']}", f"{w['carried_in']} carried in"),
        ("GPUs", amount(r["gpus"]["after"]), f"{_signed(r['gpus']['after'] - r['gpus']['before'])} GPUs"),
        ("Wait p90 after", f"{totals['wait_p90_s']['after'] or 0:.0f} s")
        if totals["wait_p90_s"]["delta"] is None else
        ("Wait p90 after", f"{totals['wait_p90_s']['after']:.0f} s", f"{totals['wait_p90_s']['delta']:+.0f} s"),
        ("Preemptions after", f"{totals['preemptions']['after']}", f"{totals['preemptions']['delta']:+d}"),
    ])
    st.caption(f"{r['from']} to {r['to']}: before = as it happened, after = {what}. History recorded "
               f"{r['observed']['(all)']['gpu_hours']:.2f} GPU-hours of these workloads; the replay as it happened "
               f"{totals['gpu_hours']['before']:.2f}.")
    for note in r.get("notes") or []:
        st.caption(f"note: {note}")
    table(report_frame(r))


if __name__ == "__main__":      # run by st.navigation as a page script
    page()
