"""``gpuq dashboard [--port 8501] [--host H] [--api-url URL]``: run the Streamlit app.

The ``dashboard`` settings (``api_url``, ``token``, ``refresh_s``, ``cache_ttl_s``) are resolved
here from the config file and passed to the Streamlit process explicitly in its environment
(as ``GPUQ_DASHBOARD__*``, which :mod:`gpuq.settings` reads there); the token never appears on a
command line. SIGTERM or Ctrl-C stop the child too.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

APP = Path(__file__).resolve().parent / "app.py"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gpuq dashboard", description="Run the Streamlit dashboards; they read "
                                "the gpuq HTTP API at dashboard.api_url with dashboard.token.")
    p.add_argument("--port", type=int, help="default: dashboard.port (8501)")
    p.add_argument("--host", help="address to bind (default: dashboard.host, 127.0.0.1)")
    p.add_argument("--api-url", help="default: dashboard.api_url")
    return p


def command(settings: Any, port: int, host: str) -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port),
            "--server.address", host, "--server.headless", "true", "--browser.gatherUsageStats", "false",
            "--server.fileWatcherType", "none", "--client.toolbarMode", "minimal"]


def dashboard_main(argv: list[str], settings: Any) -> int:
    args = parser().parse_args(argv)
    d = settings.dashboard
    env = {**os.environ,
           "GPUQ_DASHBOARD__API_URL": args.api_url or d.api_url, "GPUQ_DASHBOARD__TOKEN": d.token,
           "GPUQ_DASHBOARD__REFRESH_S": str(d.refresh_s), "GPUQ_DASHBOARD__CACHE_TTL_S": str(d.cache_ttl_s)}
    port = d.port if args.port is None else args.port
    host = args.host or d.host
    print(f"gpuq dashboard: http://{host}:{port} reading {env['GPUQ_DASHBOARD__API_URL']}", file=sys.stderr)
    proc = subprocess.Popen(command(settings, port, host), env=env)

    def stop(signum: int, _frame: Any) -> None:
        proc.send_signal(signal.SIGTERM)
    old = signal.signal(signal.SIGTERM, stop)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(timeout=10)
    finally:
        signal.signal(signal.SIGTERM, old)
