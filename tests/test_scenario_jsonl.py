"""``workloads_file:`` (docs/SCENARIOS.md): a JSON-lines file of workloads gives the same replay,
byte for byte, as the same workloads inline; a bad line is named FILE:LINE."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from scheduler.errors import ScenarioError
from scheduler.simulator import load_scenario, run_scenario, write_outputs

EXAMPLES = sorted((Path(__file__).parent / "scenarios").glob("*.yaml"))

HEAD = {"nodes": [{"name": "n", "gpu_type": "A100", "gpus": 8, "count": 2}],
        "queues": {"a": {"guaranteed": {"gpu": 8}}, "b": {"guaranteed": {"gpu": 8}}}}


def _split(src: Path, dst: Path, inline: int = 0) -> Path:
    """Write ``src`` as dst/scenario.yaml + dst/sub/w.jsonl: the first ``inline`` workloads stay
    inline, the rest go to the file, one JSON object a line."""
    data = yaml.safe_load(src.read_text())
    work = data.pop("workloads")
    (dst / "sub").mkdir(parents=True)
    (dst / "sub" / "w.jsonl").write_text("".join(json.dumps(w) + "\n" for w in work[inline:]))
    data["workloads"] = work[:inline]
    data["workloads_file"] = "sub/w.jsonl"
    out = dst / "scenario.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def _events(path: Path, out: Path) -> bytes:
    events, _ = write_outputs(run_scenario(path), out)
    return Path(events).read_bytes()


@pytest.mark.parametrize("example", EXAMPLES, ids=[p.stem for p in EXAMPLES])
def test_jsonl_replays_byte_for_byte_as_inline(example: Path, tmp_path: Path) -> None:
    want = _events(example, tmp_path / "yaml")
    whole = _split(example, tmp_path / "all")
    assert _events(whole, tmp_path / "jsonl") == want
    mixed = _split(example, tmp_path / "mixed", inline=2)          # inline first, then the file
    assert _events(mixed, tmp_path / "mix") == want
    assert load_scenario(whole).workloads == load_scenario(example).workloads


def _scenario(tmp_path: Path, lines: list[str], inline: list[dict] | None = None) -> Path:
    (tmp_path / "w.jsonl").write_text("".join(x + "\n" for x in lines))
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**HEAD, "workloads": inline or [], "workloads_file": "w.jsonl"}))
    return p


GOOD = '{"id": "x", "queue": "a", "duration": 10}'


@pytest.mark.parametrize(("line", "where", "reason"), [
    ('{"id": "y", "queue": "a", "duration": 10, "gpus_per_pod": 0}', "gpus_per_pod",
     "expected a positive integer, or a share of one GPU below 1 in thousandths (0.5), got 0"),
    ('{"id": "y", "queue": "a", "duration": 10, "gpu": 1}', "gpu", "unknown field"),
    ('{"id": "y", "queue": "nope", "duration": 10}', "queue", "unknown queue 'nope'"),
    ('{"id": "y", "queue": "a"}', "duration", "required field missing"),
    ('{"id": "y", "queue": "a", "duration": 10, "gpu_types": ["A100", ""]}', "gpu_types[1]",
     "expected a non-empty string"),
    ('{"id": "y", "queue": "a", "duration": 10', "(line)", "invalid JSON"),
    ('[1, 2]', "(line)", "expected a JSON object (one workload), got list"),
    (GOOD, "id", "duplicate workload id 'x' (first at"),
])
def test_a_bad_line_is_named_file_and_line(tmp_path: Path, line: str, where: str, reason: str) -> None:
    p = _scenario(tmp_path, [GOOD, "", line])              # a blank line is skipped but counted
    with pytest.raises(ScenarioError) as e:
        load_scenario(p)
    assert e.value.source == f"{tmp_path / 'w.jsonl'}:3"
    assert e.value.where == where
    assert reason in e.value.reason
    assert str(e.value).startswith(f"{tmp_path / 'w.jsonl'}:3: {where}: ")


def test_duplicate_between_inline_and_file_names_both(tmp_path: Path) -> None:
    p = _scenario(tmp_path, [GOOD], inline=[{"id": "x", "queue": "b", "duration": 5}])
    with pytest.raises(ScenarioError, match=r"w\.jsonl:1: id: duplicate workload id 'x' \(first at workloads\[0\]\)"):
        load_scenario(p)


def test_missing_file_and_bad_field_value(tmp_path: Path) -> None:
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump({**HEAD, "workloads_file": "absent.jsonl"}))
    with pytest.raises(ScenarioError, match=r"absent\.jsonl: \(file\): cannot read workloads_file"):
        load_scenario(p)
    p.write_text(yaml.safe_dump({**HEAD, "workloads_file": ["x"]}))
    with pytest.raises(ScenarioError, match=r"s\.yaml: workloads_file: expected a non-empty string"):
        load_scenario(p)


def test_relative_to_the_scenario_not_the_cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    p = _scenario(tmp_path, [GOOD, '{"id": "z", "queue": "b", "duration": 3, "submit": 1, "count": 2}'])
    monkeypatch.chdir("/")
    sc = load_scenario(p)
    assert [w.id for w in sc.workloads] == ["x", "z-0", "z-1"]
    assert sc.workloads[1].queue == "b" and sc.workloads[1].submit_s == 1.0


def test_gen_backlog_writes_the_benchmarks_backlog(tmp_path: Path) -> None:
    """benchmarks/gen_backlog.py's files hold bench_scheduler's backlog, inline or as JSON lines."""
    from benchmarks.bench_scheduler import make_backlog, make_cluster
    from benchmarks.gen_backlog import backlog, write

    head, work = backlog(600, 200)
    jl, inline = write(tmp_path, head, work, "both")
    a, b = load_scenario(jl), load_scenario(inline)
    c = make_cluster(200)
    assert a.workloads == b.workloads == make_backlog(c, 600)
    assert a.cluster.nodes == c.nodes and a.cluster.config.leaves() == c.config.leaves()


def test_compare_reads_the_workloads_file_next_to_the_scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from scheduler.cli import simulate_main

    p = _scenario(tmp_path, [GOOD, '{"id": "z", "queue": "b", "duration": 3, "submit": 1}'])
    (tmp_path / "b.yaml").write_text(yaml.safe_dump({"queues": {"a": {"guaranteed": {"gpu": 4}},
                                                                "b": {"guaranteed": {"gpu": 12}}}}))
    monkeypatch.chdir("/")
    assert simulate_main([str(p), "--compare", str(tmp_path / "b.yaml"), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["queues"]["b"]["admitted"] == {"a": 1, "b": 1, "delta": 0}
