"""The demo's dcgm-exporter: the recorded page (deploy/demo/data, see its SOURCES.md) rewritten for
the demo's nodes and served over local HTTP from a thread of the demo process.

The page's first GPU (a Tesla T4's series, one per metric family) is the template: for every GPU
of every demo node its lines are repeated with ``Hostname`` the node's gpuq name (what the
scheduler's ``/nodes`` says), ``gpu``/``UUID``/``device``/``modelName`` of that GPU, and the
utilization (``DCGM_FI_DEV_GPU_UTIL``), power and memory used the demo decides: busy (70-95 %)
for a GPU held by a working workload, 0 for a free GPU or one held by the story's idle workload.
A held GPU carries ``pod="gpuq-<workload id>"`` (and ``container="ray-worker"``, no namespace),
the name of the placement group the ray actuator holds a gang in, which is how the ledger names
that allocation: dcgm-exporter likewise attributes a GPU to the pod that holds it.
"""
from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "deploy" / "demo" / "data" / "datadog-integrations-core-metrics.txt"
MODELS = {"H100": "NVIDIA H100 80GB HBM3", "A100": "NVIDIA A100-SXM4-80GB"}
_LABELS = re.compile(r"^(\w+)\{(.*)\} (\S+)$")


@dataclass(frozen=True, slots=True)
class Gpu:
    node: str               # the node's gpuq name
    index: int
    gpu_type: str
    util_pct: float         # what the page says the GPU does
    workload: str = ""      # the gpuq workload holding it, '' when free


def template(page: str) -> list[tuple[str, str, str]]:
    """(HELP/TYPE lines, metric name, value) for each family of the page's first GPU."""
    lines = page.splitlines()
    host = next(m.group(1) for line in lines if (m := re.search(r'Hostname="([^"]*)"', line)))
    out: list[tuple[str, str, str]] = []
    meta: list[str] = []
    for line in lines:
        if line.startswith(("# HELP", "# TYPE")):
            meta.append(line)
        if line.startswith("#"):
            continue
        m = _LABELS.match(line)
        if m and f'Hostname="{host}"' in m.group(2):
            out.append(("\n".join(meta[-2:]), m.group(1), m.group(3)))
        meta = []
    return out


def render(families: list[tuple[str, str, str]], gpus: Iterable[Gpu]) -> str:
    gpus = list(gpus)
    parts: list[str] = []
    for meta, name, value in families:
        parts.append(meta)
        for g in gpus:
            uuid = "GPU-" + hashlib.sha256(f"{g.node}/{g.index}".encode()).hexdigest()[:32]
            labels = (f'gpu="{g.index}",UUID="{uuid}",device="nvidia{g.index}",'
                      f'modelName="{MODELS.get(g.gpu_type, g.gpu_type)}",Hostname="{g.node}"')
            if g.workload:
                labels += f',container="ray-worker",pod="gpuq-{g.workload}"'
            parts.append(f"{name}{{{labels}}} {_value(name, value, g)}")
    return "\n".join(parts) + "\n"


def _value(name: str, recorded: str, g: Gpu) -> str:
    if name == "DCGM_FI_DEV_GPU_UTIL":
        return f"{g.util_pct:.0f}"
    if name == "DCGM_FI_DEV_FB_USED":
        return "0" if not g.workload else str(int(20000 + 600 * g.util_pct))
    if name == "DCGM_FI_DEV_POWER_USAGE":
        return f"{70 + 6 * g.util_pct:.3f}"
    return recorded


class DcgmServer:
    """Serves ``render(template, gpus())`` at ``/metrics`` on 127.0.0.1 until :meth:`close`."""

    def __init__(self, gpus: Callable[[], list[Gpu]], page: Path = PAGE) -> None:
        families = template(page.read_text())

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = render(families, gpus()).encode() if self.path.split("?")[0] == "/metrics" else b""
                self.send_response(200 if body else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/metrics"
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.1,), daemon=True,
                                        name="gpuq-demo-dcgm")
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
