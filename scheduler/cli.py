"""Scheduler commands, argparse-based; ``gpuq.cli`` delegates to them with the arguments after the
command and the loaded settings:

    gpuq simulate SCENARIO.yaml --out DIR          replay a scenario (simulate_main)
    gpuq whatif --from -7d [--add-nodes ...]       the cluster's history, replayed under a change
    gpuq serve [--nodes FILE] [--cluster NAME]     the API, collectors, accounting and scheduler
    gpuq workloads [--queue Q] [--state S]         the workloads, from a running serve (HTTP)
    gpuq explain ID                                why a workload is pending, from a running serve

chDB lets one process open a data path, so ``workloads`` and ``explain`` ask ``gpuq serve`` over
HTTP (``--api URL``, default ``api.host:api.port``; ``--token``, default the first configured).
"""
from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

from scheduler.errors import ScenarioError
from scheduler.model import Node


def simulate_parser(prog: str = "gpuq simulate") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="Replay a scenario (nodes, queues and a workload mix; docs/SCENARIOS.md) through gpuq's "
        "scheduler on a simulated clock, in seconds instead of days. Writes what happened to "
        "DIR/events.jsonl and the totals (waits, utilization, preemptions) to DIR/summary.json.",
    )
    p.add_argument("scenario", help="the scenario, a YAML file")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (created if missing)")
    p.add_argument("--eta", action="store_true",
                   help="put on each submit event the start-time forecast made when it was submitted: "
                        '"eta": {"p10", "p50", "p90"} in seconds on the scenario\'s clock (changes no decision; '
                        "costs more than a plain replay)")
    p.add_argument("--eta-method", choices=("timeline", "runs"),
                   help="how to forecast: timeline (the default, what gpuq serve does: one pass through the "
                        "work ahead) or runs (the scheduler run forward several times with sampled run times: "
                        "slower; for comparison)")
    p.add_argument("--eta-runs", type=int, metavar="K",
                   help="with --eta-method runs: forward runs per forecast (default: scheduler.forecast.RUNS)")
    p.add_argument("--eta-seed", type=int, default=0, metavar="N", help="with --eta-method runs: the seed (default 0)")
    p.add_argument("--eta-arrivals", action="store_true",
                   help="with --eta-method runs: also draw the work that will arrive, from the submits so far "
                        "(docs/PERFORMANCE.md, \"Start-time forecasts\")")
    p.add_argument("--compare", metavar="QUEUES_B.yaml",
                   help="also replay the same work under this queue file and print both results side "
                   "by side; --out is then optional (with --base QUEUES_A.yaml and --map MAP: see "
                   "gpuq simulate SCENARIO --compare B --help)")
    p.add_argument("--baseline", metavar="POLICY[,POLICY]",
                   help="also replay it with simpler schedulers (fifo, per-queue, or all) and print "
                   "the waits, utilization and fairness side by side; --out is then optional")
    p.add_argument("--store", action="store_true",
                   help="also write the replay into the configured store as if gpuq had run it (its "
                   "events, nodes and allocations), ending now: a history for gpuq whatif")
    p.add_argument("--cluster", metavar="NAME", help="with --store: the cluster name its events carry "
                   "(default: scheduler.cluster)")
    return p


def simulate_main(argv: list[str], settings: Any = None) -> int:
    """Exit status: 0 done, 2 bad arguments or an invalid scenario (the message names the YAML path),
    1 the store (``--store``) could not be written."""
    from scheduler.simulator import run_scenario, write_outputs
    from scheduler.progress import Progress

    if "--compare" in argv:
        from scheduler.compare import compare_main

        return compare_main(argv)
    if any(a == "--baseline" or a.startswith("--baseline=") for a in argv):
        from scheduler.compare import baseline_main

        return baseline_main(argv)
    from scheduler.simulator import EtaOptions

    parser = simulate_parser()
    args = parser.parse_args(argv)
    eta = None
    runs_only = args.eta_runs is not None or args.eta_seed or args.eta_arrivals
    if args.eta:
        method = args.eta_method or "timeline"
        if runs_only and method != "runs":
            parser.error("--eta-runs, --eta-seed and --eta-arrivals go with --eta-method runs")
        if args.eta_runs is not None and args.eta_runs < 1:
            parser.error("--eta-runs: must be at least 1")
        eta = EtaOptions(seed=args.eta_seed, arrivals=args.eta_arrivals, method=method)
        if args.eta_runs is not None:
            eta = EtaOptions(runs=args.eta_runs, seed=args.eta_seed, arrivals=args.eta_arrivals, method=method)
    elif runs_only or args.eta_method:
        parser.error("--eta-method, --eta-runs, --eta-seed and --eta-arrivals go with --eta")
    if args.cluster and not args.store:
        parser.error("--cluster goes with --store")
    from scheduler.simulator import load_scenario

    try:
        sc = load_scenario(args.scenario)
        result = run_scenario(sc, progress=Progress.auto("simulate"), eta=eta)
    except ScenarioError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    events, summary = write_outputs(result, args.out)
    s = result.summary
    print(f"{s['name']}: makespan {s['makespan_s']} s, utilization {s['gpu_utilization']:.3f}, "
          f"{s['preemptions']} preemptions, {s['scheduler']['cycles']} cycles in "
          f"{s['scheduler']['wall_s']:.3f} s; wrote {events} and {summary}")
    if args.store:
        return _record(sc, result, settings, args.cluster)
    return 0


def _record(sc: Any, result: Any, settings: Any, cluster: str | None) -> int:
    """``gpuq simulate --store``: the replay into the configured store, its clock ending now."""
    import math
    import time

    from gpuq.errors import GpuqError
    from gpuq.remote import open_unlocked_store
    from gpuq.settings import load_settings
    from scheduler.history import record_replay

    settings = settings if settings is not None else load_settings(None)
    name = cluster or settings.scheduler.cluster
    epoch = float(math.floor(time.time() - float(result.summary["makespan_s"])))
    try:
        store = open_unlocked_store(settings)
        try:
            n = record_replay(store, sc, result, name, epoch)
        finally:
            store.close()
    except GpuqError as exc:
        print(f"gpuq simulate --store: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {n} rows into {settings.store.dsn} as cluster {name!r}, its clock starting at "
          f"{_iso(epoch)} (gpuq whatif --cluster {name} --from {_iso(epoch)} replays it)")
    return 0


def whatif_main(argv: list[str], settings: Any) -> int:
    """``gpuq whatif``: :func:`scheduler.whatif.main`."""
    from scheduler.whatif import main

    return main(argv, settings)




# -- gpuq serve / workloads / explain ----------------------------------------------------------------
def serve_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuq serve",
        description="Run gpuq: the scheduler, its HTTP API (for the CLI and the dashboards), the "
        "collectors and the accounting, all on one store. SIGTERM or Ctrl-C stops everything within "
        "seconds.")
    p.add_argument("--nodes", metavar="FILE", help="schedule onto a fixed list of nodes: a YAML list of node "
                   "groups as in a scenario ({name, gpu_type, gpus, count}); default: the nodes the "
                   "collectors see")
    p.add_argument("--cluster", metavar="NAME",
                   help="the cluster name recorded with each decision (default: scheduler.cluster)")
    p.add_argument("--no-collect", action="store_true", help="do not run the collectors in this process")
    return p


def load_nodes(path: str) -> list[Node]:
    """A node list file: ``[{name, gpu_type, gpus, count}, ...]`` or ``{nodes: [...]}``
    (:func:`scheduler.simulator.scenario.load_nodes`)."""
    from scheduler.simulator.scenario import load_nodes as load

    return load(path)


def serve_main(argv: list[str], settings: Any) -> int:
    """Exit status: 0 stopped cleanly, 1 the API could not start, 2 bad arguments or configuration."""
    import threading

    from accounting.errors import QueueConfigError
    from collector.service import install_stop_handlers
    from scheduler.service.runtime import serve

    from gpuq.errors import ConfigError
    from scheduler.api.auth import check_exposure

    args = serve_parser().parse_args(argv)
    try:
        check_exposure(settings.api)            # no tokens on a non-loopback host: refused
        nodes_file = args.nodes or settings.scheduler.nodes_file
        nodes = load_nodes(nodes_file) if nodes_file else None
    except (ScenarioError, ConfigError) as exc:
        print(f"gpuq serve: error: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    previous = install_stop_handlers(stop)
    cluster = args.cluster or settings.scheduler.cluster
    try:
        if settings.leader.enabled:
            return _serve_elected(settings, stop, nodes, cluster, collect=not args.no_collect)
        return serve(settings, stop, nodes=nodes, cluster=cluster, collect=not args.no_collect)
    except QueueConfigError as exc:
        print(f"gpuq serve: error: queue file: {exc.located()}", file=sys.stderr)
        return 2
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _serve_elected(settings: Any, stop: Any, nodes: Any, cluster: str, collect: bool) -> int:
    """``gpuq serve`` with ``leader.enabled``: stand by until this replica holds the Lease, then serve
    (store, collectors, scheduler, API) while it renews. Losing the Lease stops everything at once
    and exits 1 (Kubernetes restarts the pod, which stands by); SIGTERM stops cleanly, closes the
    store, then releases the Lease so a standby takes over at its next try."""
    import threading

    from scheduler.service.leader import LeaderElector, LeaseConfig, coordination_api
    from scheduler.service.runtime import serve
    from scheduler.service.standby import stand_by

    le = settings.leader
    elector = LeaderElector(coordination_api(le.kubeconfig or "", le.context, le.in_cluster),
                            LeaseConfig(le.lease_name, le.namespace, le.identity, le.lease_duration_s,
                                        le.renew_deadline_s, le.retry_period_s))
    if not stand_by(settings, elector, stop):
        return 0
    lost = threading.Event()

    def stopped_leading() -> None:
        lost.set()
        stop.set()

    elector.run(lambda: None, stopped_leading)
    try:
        rc = serve(settings, stop, nodes=nodes, cluster=cluster, collect=collect, leader=elector)
    finally:
        elector.stop()
    if lost.is_set():
        print("gpuq serve: lost the lease: stopped acting; exiting to stand by again", file=sys.stderr)
        return 1
    elector.release()                          # after the store is closed: the next leader may open it
    return rc


def _client_parser(prog: str, description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=description)
    p.add_argument("--api", metavar="URL", help="where gpuq serve answers (default: http://api.host:api.port "
                   "from the config)")
    p.add_argument("--token", help="your API token (default: the first of api.tokens in the config, if any)")
    return p


def _call(args: argparse.Namespace, settings: Any, prog: str, path: str,
          params: dict[str, str] | None = None, method: str = "GET", body: Any = None) -> Any:
    """``method path`` on the API (GET unless told); raise SystemExit(1) with the problem's detail
    on failure."""
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)     # no request log lines on a CLI's stderr
    host = settings.api.host if settings.api.host not in ("0.0.0.0", "::", "") else "127.0.0.1"
    base = (args.api or f"http://{host}:{settings.api.port}").rstrip("/")
    token = args.token or (settings.api.tokens[0].token if settings.api.tokens else None)
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        # a change is always sent as JSON (with auth off, the API takes nothing else: issue 17)
        json_body = body if body is not None or method == "GET" else {}
        r = httpx.request(method, base + path, params=params, headers=headers, json=json_body, timeout=10.0)
    except httpx.HTTPError as exc:
        print(f"{prog}: error: cannot reach {base}: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc
    if r.status_code >= 400:
        try:
            detail = r.json().get("detail") or r.text
        except ValueError:
            detail = r.text
        print(f"{prog}: error: {detail} (HTTP {r.status_code})", file=sys.stderr)
        raise SystemExit(1)
    return r.json()


def acting_main(argv: list[str], settings: Any, command: str) -> int:
    """``gpuq pause [--reason TEXT]`` / ``gpuq resume`` (admin token) stop and restart all acting of
    a running ``gpuq serve``; ``gpuq status`` (viewer) says whether it acts, what is in flight and
    the preemption brake. 0, or 1 (API refused or unreachable)."""
    texts = {"pause": "Stop all acting: nothing is started, preempted or cancelled until gpuq resume. The "
                      "scheduler still decides, and each waiting workload says it waits for the pause.",
             "resume": "Act again from the next scheduling cycle.",
             "status": "Whether the scheduler acts (or who paused it and why), what it is starting or "
                       "stopping now, and how many preemptions the preemption limit still allows."}
    p = _client_parser(f"gpuq {command}", texts[command])
    if command == "pause":
        p.add_argument("--reason", default="", help="why, for the others: recorded and shown by gpuq status")
    p.add_argument("--format", "-f", choices=["text", "json"], default="text", help="text (default) or JSON")
    args = p.parse_args(argv)
    try:
        if command == "status":
            st = _call(args, settings, "gpuq status", "/scheduler/status")
        else:
            body = {"reason": args.reason} if command == "pause" else None
            st = _call(args, settings, f"gpuq {command}", f"/admin/{command}", method="POST", body=body)
    except SystemExit as exc:
        return int(exc.code or 1)
    return _show(st, args.format, status_text)


def _show(answer: Any, fmt: str, text: Any) -> int:
    """Print an API answer as JSON or through its text renderer; 0."""
    print(json.dumps(answer, indent=1) if fmt == "json" else text(answer), end="\n" if fmt == "json" else "")
    return 0


def pause_main(argv: list[str], settings: Any) -> int:
    return acting_main(argv, settings, "pause")


def resume_main(argv: list[str], settings: Any) -> int:
    return acting_main(argv, settings, "resume")


def status_main(argv: list[str], settings: Any) -> int:
    return acting_main(argv, settings, "status")


def status_text(st: dict[str, Any]) -> str:
    if st.get("paused"):
        lines = [f"acting: PAUSED since {_iso(st.get('paused_since'))} by {st.get('paused_by')}"
                 + (f": {st['pause_reason']}" if st.get("pause_reason") else "")]
    else:
        lines = ["acting: on"]
    lines.append(f"actuator: {st.get('actuator')}; cycles: {st.get('cycles')}")
    flight = st.get("in_flight") or {}
    lines.append("in flight: " + (", ".join(f"{w} ({a})" for w, a in sorted(flight.items())) or "nothing"))
    lim = st.get("preemption_limit") or {}
    lines.append(f"preemption limit: {lim.get('per_queue_per_hour')} per queue, "
                 f"{lim.get('cluster_per_hour')} in all, per hour")
    last = st.get("preemptions_last_hour") or {}
    if last:
        lines.append("preemptions in the last hour: " + ", ".join(f"{q} {n}" for q, n in last.items()))
    held = st.get("preemptions_limited") or {}
    if held:
        lines.append("held back by the limit: " + ", ".join(f"{q} {n}" for q, n in held.items()))
    cost = st.get("preemption_cost") or {}
    if cost.get("lost_gpu_seconds"):
        lines.append(f"lost to preemption in the last {cost.get('window_s', 0) / 3600:g} h: "
                     f"{cost['lost_gpu_seconds'] / 3600:.3f} GPU-h ("
                     + ", ".join(f"{q} {x / 3600:.3f}" for q, x in (cost.get("by_queue") or {}).items()) + ")")
    return "\n".join(lines) + "\n"


def check_main(argv: list[str], settings: Any) -> int:
    """``gpuq check [--format text|json]``: the last audit of the books of a running ``gpuq serve``
    (``GET /books``). 0 when they balance, 3 when they do not, 1 when the API failed."""
    p = _client_parser("gpuq check", "Do the books balance? What the accounting shows against what the "
                                     "scheduler placed, per queue, GPU type and node.")
    p.add_argument("--format", "-f", choices=["text", "json"], default="text")
    args = p.parse_args(argv)
    try:
        books = _call(args, settings, "gpuq check", "/books")
    except SystemExit as exc:
        return int(exc.code or 1)
    _show(books, args.format, books_text)
    return 0 if books["balanced"] else 3


def books_text(b: dict[str, Any]) -> str:
    if b["at"] is None:
        return "the books have not been audited yet (the first accounting interval has not run)\n"
    if b["balanced"]:
        return f"the books balance (audited at {b['at']}): the accounting shows what the scheduler placed\n"
    lines = [f"the books do NOT balance (audited at {b['at']}): {b['unbalanced_gpus']:g} GPUs differ"]
    lines += [f"  {d['queue']} {d['gpu_type']} on {d['node']}: accounting {d['accounted']:g}, "
              f"scheduler {d['placed']:g}" for d in b["differences"]]
    lines.append("see docs/runbooks/GpuqBooksUnbalanced.md")
    return "\n".join(lines) + "\n"


WORKLOAD_COLUMNS = ("id", "queue", "state", "gpus", "priority", "gpu_type", "reason_code", "position", "eta",
                    "message")


def workloads_main(argv: list[str], settings: Any) -> int:
    """``gpuq workloads [--queue Q] [--state S] [--format table|json|csv]``: 0 or 1 (API failed)."""
    from gpuq.output import render

    p = _client_parser("gpuq workloads", "The workloads gpuq schedules: what runs, what waits and why, from a "
                       "running gpuq serve.")
    p.add_argument("--queue", help="only this queue and the queues below it")
    p.add_argument("--state", choices=["pending", "running", "finished", "cancelled", "rejected"],
                   help="only workloads in this state")
    p.add_argument("--format", "-f", choices=["table", "json", "csv"], default="table",
                   help="an aligned table (default), JSON or CSV")
    args = p.parse_args(argv)
    params = {k: v for k, v in (("queue", args.queue), ("state", args.state)) if v}
    try:
        rows = _call(args, settings, "gpuq workloads", "/workloads", params)
    except SystemExit as exc:
        return int(exc.code or 1)
    if args.format == "json":
        print(json.dumps(rows, indent=1))
    else:
        sys.stdout.write(render(WORKLOAD_COLUMNS, [workload_row(r) for r in rows], args.format))
    return 0


def workload_row(r: dict[str, Any]) -> list[Any]:
    """A row of ``gpuq workloads``: ``eta`` is the forecast's p50 (its ISO time; empty when none)."""
    eta = r.get("eta") or {}
    return [eta.get("p50") if c == "eta" else r.get(c) for c in WORKLOAD_COLUMNS]


def explain_main(argv: list[str], settings: Any) -> int:
    """``gpuq explain ID [--format text|json]``: why a workload is where it is. 0, or 1 (unknown
    workload, API failed)."""
    from urllib.parse import quote

    p = _client_parser("gpuq explain", "Why a workload waits (the reason, with its numbers, and its place in "
                       "its queue), or where it runs, from a running gpuq serve.")
    p.add_argument("id", help="the workload's id, as given when it was submitted")
    p.add_argument("--format", "-f", choices=["text", "json"], default="text", help="text (default) or JSON")
    args = p.parse_args(argv)
    try:
        w = _call(args, settings, "gpuq explain", f"/workloads/{quote(args.id, safe='/')}")
    except SystemExit as exc:
        return int(exc.code or 1)
    return _show(w, args.format, explain_text)


OTHER = {"kueue": "Kueue", "yunikorn": "YuniKorn"}     # the schedulers gpuq advises beside, as people write them


def explain_text(w: dict[str, Any], now: float | None = None) -> str:
    """``gpuq explain``'s text; ``now`` (default: this machine's clock) is what the forecast's
    "in about 12 min" counts from."""
    import time

    gang = f"{w['pods']} x {w['gpus_per_pod']} GPUs" if w["pods"] > 1 else f"{w['gpus_per_pod']} GPUs"
    types = ", ".join(w["gpu_types"]) or "any type"
    lines = [f"workload {w['id']} in queue {w['queue']}: {w['state']} ({gang} of {types}, priority {w['priority']})"]
    if w["state"] == "pending":
        lines.append(f"reason: {w['reason_code']}")
        lines.append(f"  {w['message']}")
        eta = w.get("eta")
        other = str((w.get("target") or {}).get("scheduler") or "")
        where = f"position {w['position']} in {w['queue']}" if w.get("position") is not None else ""
        if where and w.get("position_source") == "kueue":      # Kueue's visibility API, not gpuq's rank
            where += f" (from {OTHER.get(other, other) or 'Kueue'})"
        if eta:
            # another scheduler's workload: gpuq's forecast, as gpuq would run it, not that scheduler's
            whose = f"gpuq's forecast (gpuq's policy, {OTHER.get(other, other)}'s quotas): " if other else ""
            lines.append(f"{whose}{eta_text(eta, time.time() if now is None else now)}{', ' + where if where else ''}")
        else:
            lines.append(f"{where + '; ' if where else ''}no start-time forecast yet")
    elif w["state"] == "running":
        where = ", ".join(f"{n}:{g}" for n, g in (w["placement"] or {}).items())
        lines.append(f"running on {w['gpu_type']} ({where}) since {_iso(w['start_s'])}")
    elif w.get("message"):
        lines.append(f"{w['reason_code']}: {w['message']}")
    advice = w.get("advice")
    if advice:                        # another scheduler's workload (queues_from: kueue): gpuq's view beside
        lines.append(f"gpuq would: {advice_text(advice)}")
    if w.get("preempted"):
        lines.append(f"preempted {w['preempted']} time(s)")
    return "\n".join(lines) + "\n"


def advice_text(a: dict[str, Any]) -> str:
    """What gpuq's scheduler would do (:class:`scheduler.service.views.Advice`) in a few words:
    "admit on node-a:4 (A100)", "preempt kueue/ns/x, then admit on ...", "wait: quota_max: ..."."""
    where = ", ".join(f"{n}:{g}" for n, g in (a.get("placement") or {}).items())
    where += f" ({a['gpu_type']})" if a.get("gpu_type") else ""
    outcome = a.get("outcome")
    if outcome == "admit":
        return f"admit on {where}"
    if outcome == "preempt":
        victims = ", ".join(v["id"] for v in a.get("victims") or ())
        delay = "after its preemption delay, " if a.get("after_delay") else ""
        return f"{delay}preempt {victims}, then admit on {where}"
    if outcome == "wait":
        at = f" (position {a['position']})" if a.get("position") is not None else ""
        return f"wait: {a.get('reason_code')}: {a.get('message')}{at}"
    if outcome == "reject":
        return f"never run it: {a.get('message')}"
    return f"no advice: {a.get('message')}"


def eta_text(eta: dict[str, str], now: float) -> str:
    """A forecast as people say it: "expected to start in about 12 min (80 % between 5 and 25 min)"."""
    p10, p50, p90 = (_seconds(eta[k]) - now for k in ("p10", "p50", "p90"))
    if p90 <= 0:
        return f"expected to start any moment now (forecast for {eta['p50']})"
    if p50 <= 0:
        return f"expected to start any moment now (80 % by {_wait(p90)} from now)"
    low, high = _wait(max(p10, 0.0)), _wait(p90)
    if low == high:                           # declared durations only: no spread to speak of
        return f"expected to start in about {_wait(p50)}"
    return f"expected to start in about {_wait(p50)} (80 % between {low} and {high})"


def _wait(s: float) -> str:
    """A wait rounded as people say it: "40 s", "12 min", "2.5 h", "3.0 d"."""
    from gpuq.timefmt import span

    return span(s)


def _seconds(text: str) -> float:
    import datetime as dt

    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _iso(t: float | None) -> str:
    import datetime as dt

    if t is None:
        return "-"
    return dt.datetime.fromtimestamp(t, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(simulate_main(sys.argv[1:]))
