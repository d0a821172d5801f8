"""One run of the demo: what it started, in order, and how it stops it (:meth:`Session.close`
undoes whatever :meth:`Session.start` got to, in reverse: dashboard, ``gpuq serve`` (SIGTERM: it
flushes its events), the Ray jobs (Jobs API stop), the Ray nodes (their process groups), the DCGM
page; then any process still carrying this run's marker in its argv is killed)."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from gpuq.demo import report
from gpuq.demo.cluster import LocalCluster, LocalNode, die_with_parent, free_port, start_local_cluster, stop_group
from gpuq.demo.dcgm import DcgmServer
from gpuq.demo.story import Story, body, shares_job


def _spawn(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "gpuq.cli", *argv], stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=die_with_parent)


def _wait(cond: Any, proc: subprocess.Popen[bytes], what: str, log: Path, timeout_s: float = 90) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode}:\n{log.read_text()[-2000:]}")
        try:
            if cond():
                return
        except (httpx.HTTPError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{what} not ready after {timeout_s:.0f} s (log: {log})")


class Session:
    def __init__(self, root: Path, story: Story, stop: threading.Event) -> None:
        self.root, self.story, self.stop = root, story, stop
        self.cfg = root / "gpuq.yaml"
        self.tmp = Path(tempfile.mkdtemp(prefix="gpuq-demo-", dir="/tmp"))     # short: Ray's socket paths
        self.marker = f"--gpuq-demo={self.tmp.name}"
        self.cluster: LocalCluster | None = None
        self.dcgm: DcgmServer | None = None
        self.serve: subprocess.Popen[bytes] | None = None
        self.dashboard: subprocess.Popen[bytes] | None = None
        self.watcher: report.Watcher | None = None
        self.labels: dict[str, str] = {}
        self.t0: float | None = None
        self.shares_record = root / "shares.json"    # what the shares' driver says its holders held
        self.shares_state = ""                       # the shares' Ray job status, as last seen
        self.shares_node = ""                        # the gpuq name of the node with their GPU type

    def _gpus(self) -> list[Any]:
        if self.watcher is None:
            return []
        shares = self.story.shares
        busy = {self.shares_node: shares.gpus} if shares and self.shares_state == "RUNNING" else {}
        return report.gpus(self.watcher.nodes, self.watcher.running, set(self.story.idle), int(time.time() // 10),
                           busy)

    def start(self, nodes: list[LocalNode], *, with_dashboard: bool, head: LocalNode = LocalNode("head")) -> None:
        from gpuq.demo.run import config

        t = time.monotonic()
        self.dcgm = DcgmServer(self._gpus)
        gpus = [n for n in (head, *nodes) if n.gpus]
        print(f"starting a local Ray cluster: a head{f' with {head.gpus} {head.gpu_type}' if head.gpus else ''} and "
              f"{', '.join(f'{n.name} ({n.gpus} {n.gpu_type})' for n in nodes)}", flush=True)
        self.cluster = start_local_cluster(nodes, self.tmp, head=head)
        self.labels = {self.cluster.node_name(n.name): f"{n.name}({self.cluster.node_name(n.name)})" for n in gpus}
        if self.story.shares is not None:
            self.shares_node = next((self.cluster.node_name(n.name) for n in gpus
                                     if n.gpu_type == self.story.shares.gpu_type), "")
        api_port, dash_port = free_port(), free_port()
        self.cfg.write_text(yaml.safe_dump(config(self.root, self.cluster, self.dcgm.url, api_port, self.story,
                                                  dash_port), sort_keys=False))
        api = f"http://127.0.0.1:{api_port}"
        print(f"starting gpuq serve (ray actuator, config {self.cfg})", flush=True)
        log = self.root / "serve.log"
        self.serve = _spawn(["serve", "--config", str(self.cfg)], log)
        _wait(lambda: httpx.get(f"{api}/readyz", timeout=2).status_code == 200, self.serve, "gpuq serve", log)
        # the story starts once the scheduler sees exactly the Ray nodes, by their gpuq names (until the
        # State API has answered, the accounting names nodes by the metrics pages' addresses)
        expected = {self.cluster.node_name(n.name) for n in gpus}
        _wait(lambda: {n["name"] for n in httpx.get(f"{api}/nodes", timeout=2).json() if n["gpus"] > 0} == expected,
              self.serve, f"the scheduler's view of the Ray nodes ({', '.join(sorted(expected))})", log)
        print(f"Ray nodes: {', '.join(self.labels.values())}; temp dir {self.tmp}", flush=True)
        self.watcher = report.Watcher(api, self.labels)
        self.watcher.poll(0)
        lines = [f"Ray dashboard     {self.cluster.dashboard_url}", f"gpuq API          {api}  (docs: {api}/docs)",
                 f"DCGM page         {self.dcgm.url}"]
        if with_dashboard:
            dlog = self.root / "dashboard.log"
            self.dashboard = _spawn(["dashboard", "--config", str(self.cfg), "--port", str(dash_port)], dlog)
            lines.insert(0, f"dashboards        http://127.0.0.1:{dash_port}")
        else:
            lines.insert(0, "dashboards        (not started: `gpuq dashboard` is not available here)")
        print(f"up in {time.monotonic() - t:.0f} s\n" + "\n".join(lines), flush=True)

    def tell(self, duration_s: float | None) -> None:
        assert self.watcher is not None
        steps = sorted(self.story.steps, key=lambda s: s.at_s)
        length = duration_s if duration_s is not None else self.story.length_s
        print(f"\nthe story ({self.story.name}, {length:.0f} s){'' if duration_s else '; Ctrl-C to stop'}:",
              flush=True)
        self.t0 = time.time()
        told = False
        shares = self.story.shares
        while not self.stop.is_set():
            now = time.time() - self.t0
            while steps and steps[0].at_s <= now:
                step = steps.pop(0)
                r = self.watcher.http.post("/workloads", json=body(step, self.marker))
                if r.status_code != 201:
                    print(f"t={now:6.1f}s  submit {step.id} refused: HTTP {r.status_code} {r.text[:200]}")
                elif step.note:
                    print(f"t={now:6.1f}s  -- {step.note}", flush=True)
            if shares is not None and not self.shares_state and shares.at_s <= now:
                self._submit_shares(now)
            elif shares is not None and self.shares_state in ("PENDING", "RUNNING"):
                self._poll_shares(now)
            self.watcher.poll(now)
            if duration_s is not None and now >= duration_s:
                break
            if not told and not steps and now >= length:
                told = True
                print("the story is told; everything keeps running until Ctrl-C", flush=True)
            self.stop.wait(0.5)
        print(f"\nstopping at t={time.time() - self.t0:.1f}s" + (" (signal)" if self.stop.is_set() else ""),
              flush=True)

    def _submit_shares(self, now: float) -> None:
        """Submit the shares' job straight to Ray's Jobs API: gpuq's scheduler never sees it ask,
        only its collector sees what it holds."""
        assert self.cluster is not None and self.story.shares is not None
        shares = self.story.shares
        try:
            r = httpx.post(f"{self.cluster.dashboard_url}/api/jobs/", timeout=10,
                           json=shares_job(shares, str(self.shares_record), self.marker))
            why = "" if r.status_code == 200 else f"HTTP {r.status_code} {r.text[:200]}"
        except httpx.HTTPError as exc:
            why = str(exc)
        if why:
            self.shares_state = "REFUSED"
            print(f"t={now:6.1f}s  ray job {shares.id} refused: {why}", flush=True)
            return
        self.shares_state = "PENDING"
        print(f"t={now:6.1f}s  -- {shares.note}", flush=True)

    def _poll_shares(self, now: float) -> None:
        assert self.cluster is not None and self.story.shares is not None
        shares = self.story.shares
        try:
            state = str(httpx.get(f"{self.cluster.dashboard_url}/api/jobs/{shares.id}", timeout=5).json()["status"])
        except (httpx.HTTPError, ValueError, KeyError, TypeError):
            return
        if state == self.shares_state:
            return
        self.shares_state = state
        where = self.labels.get(self.shares_node, self.shares_node)
        if state == "RUNNING":
            print(f"t={now:6.1f}s  ray job  {shares.id} ({shares.queue}, {shares.shape}, {shares.gpus:g} GPUs "
                  f"on {where}) runs, outside gpuq's scheduler", flush=True)
        else:
            print(f"t={now:6.1f}s  ray job  {shares.id} {state.lower()}", flush=True)

    def close(self) -> None:
        if self.dashboard is not None:
            stop_group(self.dashboard, 5)
        serve_ok = False
        if self.serve is not None:
            self.serve.send_signal(signal.SIGTERM)
            try:
                serve_ok = self.serve.wait(timeout=30) == 0
            except subprocess.TimeoutExpired:
                stop_group(self.serve, 1)
        if self.watcher is not None:
            self.watcher.close()
        if self.cluster is not None:
            _stop_jobs(self.cluster.dashboard_url)
            self.cluster.stop()
        _kill_marked(self.tmp.name)
        if self.dcgm is not None:
            self.dcgm.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
        print("stopped: gpuq serve, the Ray jobs and nodes, the DCGM page" + (", the dashboards" if self.dashboard else ""))
        if serve_ok and self.t0 is not None:
            try:
                lines = report.summary(self.cfg, self.t0, self.story.gang, self.story.idle, self.labels,
                                       self.story.shares, self.shares_record)
            except RuntimeError as exc:
                lines = [f"(no summary: {exc})"]
            print("\nsummary (from the store, " + f"{self.cfg.parent / 'store'}):\n  " + "\n  ".join(lines))
            print(f'\nmore: gpuq query --config {os.path.relpath(self.cfg)} '
                  '"SELECT event, count() FROM scheduler_events GROUP BY event"', flush=True)


def _stop_jobs(dashboard_url: str) -> None:
    """Stop the Ray jobs still running (their drivers are not in the nodes' process groups)."""
    try:
        with httpx.Client(base_url=dashboard_url, timeout=5) as http:
            jobs = http.get("/api/jobs/").json()
            live = [j["submission_id"] for j in jobs if j.get("status") in ("PENDING", "RUNNING")
                    and j.get("submission_id")]
            for sid in live:
                http.post(f"/api/jobs/{sid}/stop")
            end = time.monotonic() + 10
            while live and time.monotonic() < end:
                time.sleep(0.5)
                jobs = http.get("/api/jobs/").json()
                live = [j["submission_id"] for j in jobs if j.get("status") in ("PENDING", "RUNNING")]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        pass


def _kill_marked(needle: str) -> None:
    """SIGKILL any process left that is this run's: its argv or an open file names ``needle`` (the
    run's temp dir: Ray's processes log there; the entrypoints carry it as their marker)."""
    for pid in marked(needle):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def marked(needle: str) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            names = [(d / "cmdline").read_bytes().decode(errors="replace")]
            names += [os.readlink(f) for f in (d / "fd").iterdir()]
        except OSError:
            continue
        if any(needle in n for n in names):
            out.append(int(d.name))
    return out
