"""Progress on a terminal only (scheduler/progress.py): `gpuq simulate` with stderr on a pseudo-TTY
shows simulated time, events and an ETA; with stderr on a pipe it writes nothing there, and the
replay's output files are the same either way."""
from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import yaml

from scheduler.progress import Progress, duration_text

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _read_all(fd: int) -> bytes:
    out = b""
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:                   # EIO: the other side is closed
            return out
        if not chunk:
            return out
        out += chunk


def test_progress_line_on_a_tty_rate_limited_with_eta() -> None:
    master, slave = pty.openpty()
    clock = Clock()
    with os.fdopen(slave, "w") as tty:
        p = Progress(tty, label="simulate", hz=4.0, clock=clock)
        assert p.enabled
        assert not p.due()                   # nothing in the first quarter second
        clock.t += 0.3
        assert p.due()
        p.show(0.25, 1.0, "t=60 s  events 1,000")
        assert not p.due()                   # rate-limited
        clock.t += 0.3
        p.show(0.5, 1.0, "x")
        p.close()
    text = _read_all(master).decode()
    os.close(master)
    first = text.split("\r")[1]
    assert first.startswith("simulate [#####...............]  25%  t=60 s  events 1,000  elapsed 0s  ETA 1s")
    assert "50%" in text and text.endswith("\r")          # closed: the line is blanked


def test_not_a_tty_writes_nothing() -> None:
    buf = io.StringIO()
    clock = Clock()
    p = Progress(buf, clock=clock)
    clock.t += 10
    assert not p.enabled and not p.due()
    p.show(1, 2, "x")
    p.close()
    assert buf.getvalue() == ""


def test_duration_text() -> None:
    assert [duration_text(s) for s in (0.4, 42, 185, 7620)] == ["0s", "42s", "3m05s", "2h07m"]


def _scenario(tmp_path: Path) -> Path:
    # ~3,000 cycles per 3,000 workloads, ~0.1 ms each: about a second of replay
    data = {"nodes": [{"name": "n", "gpu_type": "A100", "gpus": 8, "count": 4}],
            "queues": {"a": {"guaranteed": {"gpu": 16}}, "b": {"guaranteed": {"gpu": 16}}},
            "workloads_file": "w.jsonl"}
    (tmp_path / "w.jsonl").write_text("".join(
        f'{{"id": "w{i}", "queue": "{"ab"[i % 2]}", "submit": {i}, "duration": 7, "gpus_per_pod": 2}}\n'
        for i in range(8_000)))
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _simulate(scenario: Path, out: Path, stderr: int) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "gpuq.cli", "simulate", str(scenario), "--out", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=stderr)


def test_simulate_shows_progress_on_a_pty_only(tmp_path: Path) -> None:
    sc = _scenario(tmp_path)
    master, slave = pty.openpty()
    proc = _simulate(sc, tmp_path / "tty", slave)
    os.close(slave)
    err = _read_all(master).decode()
    os.close(master)
    out_tty, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "simulate [" in err and "t=" in err and "events " in err and "ETA " in err

    proc = _simulate(sc, tmp_path / "pipe", subprocess.PIPE)
    out_pipe, err_pipe = proc.communicate(timeout=120)
    assert proc.returncode == 0
    assert err_pipe == b""                                   # not a TTY: quiet
    assert out_pipe.split(b" cycles in ")[0] == out_tty.split(b" cycles in ")[0]   # stdout unchanged
    assert out_pipe.startswith(b"s: makespan ")
    for name in ("events.jsonl", "summary.json"):
        a, b = (tmp_path / "tty" / name).read_bytes(), (tmp_path / "pipe" / name).read_bytes()
        if name == "events.jsonl":
            assert a == b
        else:                                               # wall_s differs
            assert a.split(b'"scheduler"')[0] == b.split(b'"scheduler"')[0]


class Ticking:
    """A clock that moves one second per read: every due() is true."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_import_trace_progress_reading_and_writing_on_a_tty(tmp_path: Path) -> None:
    from scheduler.traces import load_alibaba_v2023, write_scenario
    from tests.conftest import data_path

    master, slave = pty.openpty()
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(_read_all(master)))   # a pty's buffer is small
    reader.start()
    with os.fdopen(slave, "w") as tty:
        p = Progress(tty, label="import-trace", clock=Ticking())
        r = load_alibaba_v2023(data_path("traces", "alibaba-gpu-v2023"), limit=200, progress=p)
        write_scenario(r.scenario, tmp_path / "s.yaml", [], tmp_path / "s.jsonl", progress=p)
        p.close()
    reader.join(timeout=30)
    os.close(master)
    text = got[0].decode()
    lines = [x.strip() for x in text.split("\r") if x.strip()]
    reading = [x for x in lines if "reading openb_pod_list_default.csv: row" in x]
    writing = [x for x in lines if "writing s.jsonl:" in x]
    assert reading and writing
    assert all(x.startswith("import-trace [") and "ETA " in x for x in reading + writing)
    assert len((tmp_path / "s.jsonl").read_text().splitlines()) == 200
