"""``gpuq import-trace --inflate K`` (sampled, seeded pod copies until the offered load is K) and
``--workloads-file`` (the workloads as JSON lines next to the scenario), on a slice of the real
Alibaba v2023 trace."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.simulator import load_scenario, run_scenario, write_outputs
from scheduler.traces import TraceError, import_trace_main, load_alibaba_v2023, offered_load
from tests.conftest import data_path

LIMIT = 400
SCALE = 0.01          # the first 400 pods, 100x compressed: offered load about 0.24


@pytest.fixture(scope="module")
def trace() -> Path:
    return data_path("traces", "alibaba-gpu-v2023")


def _gpus(sc: dict[str, Any]) -> int:
    return sum(n["gpus"] * n["count"] for n in sc["nodes"])


def _load(trace: Path, **kw: Any) -> Any:
    return load_alibaba_v2023(trace, limit=LIMIT, time_scale=SCALE, **kw)


@pytest.mark.parametrize("k", [1.5, 4.0])
def test_offered_load_reaches_k_within_one_pod(trace: Path, k: float) -> None:
    base = _load(trace).scenario
    r = _load(trace, inflate=k, seed=3)
    sc, st = r.scenario, r.stats
    gpus = _gpus(sc)
    before = offered_load(base["workloads"], gpus)
    assert before < 1.0 and st.load_before == pytest.approx(before)
    got = offered_load(sc["workloads"], gpus)               # independent of the importer's bookkeeping
    assert got == pytest.approx(st.load_after)
    subs = [w["submit"] for w in base["workloads"]]
    one_pod = max(w["gpus_per_pod"] * w["duration"] for w in base["workloads"]) / (gpus * (max(subs) - min(subs)))
    assert k <= got < k + one_pod
    assert len(sc["workloads"]) == LIMIT + st.copies and st.copies > 0
    # copies are pods of the list: same shape and times, a new id, submit order kept
    originals = {w["id"]: w for w in base["workloads"]}
    for w in sc["workloads"]:
        if w["id"] not in originals:
            src, _, n = w["id"].rpartition("-x")
            o = originals[src]
            assert n.isdigit()
            assert {k2: v for k2, v in w.items() if k2 not in ("id", "queue")} == \
                   {k2: v for k2, v in o.items() if k2 not in ("id", "queue")}
    assert [w["submit"] for w in sc["workloads"]] == sorted(w["submit"] for w in sc["workloads"])
    assert len({w["id"] for w in sc["workloads"]}) == len(sc["workloads"])


def test_seeded_and_deterministic(trace: Path) -> None:
    a = _load(trace, inflate=2.0, seed=7).scenario
    b = _load(trace, inflate=2.0, seed=7).scenario
    c = _load(trace, inflate=2.0, seed=8).scenario
    assert a == b
    assert a["workloads"] != c["workloads"]


def test_at_or_above_k_is_a_no_op(trace: Path) -> None:
    # compressed 10,000x the slice's offered load is far above 1: K = 1 adds nothing
    plain = load_alibaba_v2023(trace, limit=LIMIT, time_scale=0.0001)
    r = load_alibaba_v2023(trace, limit=LIMIT, time_scale=0.0001, inflate=1.0, seed=5)
    assert r.stats.load_before > 1.0 and r.stats.copies == 0
    assert r.scenario == plain.scenario
    assert any("nothing added" in line for line in r.stats.summary_lines())


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan")])
def test_bad_k_is_refused(trace: Path, bad: float) -> None:
    with pytest.raises(TraceError, match="--inflate"):
        _load(trace, inflate=bad)


def test_cli_inflate_writes_jsonl_that_replays_as_inline(trace: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    common = ["alibaba-v2023", str(trace), "--limit", "150", "--time-scale", "0.01",
              "--inflate", "1.5", "--seed", "2"]
    assert import_trace_main([*common, "--out", str(tmp_path / "inline.yaml")]) == 0
    assert import_trace_main([*common, "--out", str(tmp_path / "j.yaml"), "--workloads-file"]) == 0
    out = capsys.readouterr()
    assert "sampled pod copies added" in out.out and out.err == ""        # not a TTY: no progress
    head = yaml.safe_load((tmp_path / "j.yaml").read_text())
    assert head["workloads_file"] == "j.workloads.jsonl" and "workloads" not in head
    lines = (tmp_path / "j.workloads.jsonl").read_text().splitlines()
    assert len(lines) > 150
    assert [json.loads(x) for x in lines] == yaml.safe_load((tmp_path / "inline.yaml").read_text())["workloads"]
    a, b = load_scenario(tmp_path / "inline.yaml"), load_scenario(tmp_path / "j.yaml")
    assert a.workloads == b.workloads and len(a.workloads) == len(lines)
    ea, _ = write_outputs(run_scenario(a), tmp_path / "ra")
    eb, _ = write_outputs(run_scenario(b), tmp_path / "rb")
    assert Path(ea).read_bytes() == Path(eb).read_bytes()


def test_cli_workloads_file_needs_a_file_out(trace: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert import_trace_main(["alibaba-v2023", str(trace), "--limit", "5", "--out", "-", "--workloads-file"]) == 2
    assert "--workloads-file: needs --out FILE" in capsys.readouterr().err
