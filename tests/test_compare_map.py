"""Issue 20: ``gpuq simulate SCENARIO --compare B [--base A] --map MAP`` replays a scenario of
tests/scenarios under a queue file imported from Kueue's objects (the importer runs here, on
tests/data/kueue/handmade-gpu-cohorts.yaml), its queues and GPU types put onto the file's by the
map, and under the same file with a change; a queue the map leaves out that is not a leaf of the file
is refused by name, and so is a map naming what is in neither."""
from __future__ import annotations

import copy
import io
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from accounting.queue_import.cli import run as import_queues
from scheduler.compare import compare_main

REPO = Path(__file__).resolve().parent.parent
SCENARIO = REPO / "tests" / "scenarios" / "gang-and-fallback.yaml"       # train (big, late), infer (inf)
KUEUE = REPO / "tests" / "data" / "kueue" / "handmade-gpu-cohorts.yaml"
MAP = {"queues": {"train": "org.research.nlp", "infer": "org.prod"}, "gpu_types": {"H100": "h100", "A100": "a100"}}


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    imported = tmp_path / "kueue.yaml"
    err = io.StringIO()
    assert import_queues(["kueue", str(KUEUE), "--out", str(imported)], io.StringIO(), err) == 0, err.getvalue()
    queues = yaml.safe_load(imported.read_text())
    assert queues["queues"]["org"]["queues"]["prod"]["guaranteed"]["gpu"] == 24    # (ClusterQueue prod's nominal)
    changed = copy.deepcopy(queues)            # the change an admin tries: prod cut to one H100 node
    changed["queues"]["org"]["queues"]["prod"].update(guaranteed={"gpu": 8, "gpu/h100": 8},
                                                      max={"gpu": 8, "gpu/h100": 8, "gpu/a100": 0})
    (tmp_path / "changed.yaml").write_text(yaml.safe_dump(changed))
    (tmp_path / "map.yaml").write_text(yaml.safe_dump(MAP))
    return {"imported": imported, "changed": tmp_path / "changed.yaml", "map": tmp_path / "map.yaml"}


def report(capsys: pytest.CaptureFixture[str], *argv: Any) -> dict[str, Any]:
    assert compare_main([str(a) for a in argv] + ["--format", "json"]) == 0, capsys.readouterr().err
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def refused(capsys: pytest.CaptureFixture[str], *argv: Any) -> str:
    assert compare_main([str(a) for a in argv]) == 2
    return capsys.readouterr().err


def test_the_scenario_replays_under_the_imported_kueue_quotas(files: dict[str, Path],
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    got = report(capsys, SCENARIO, "--compare", files["imported"], "--map", files["map"])
    rows = got["queues"]
    assert got["map"]["queues"] == MAP["queues"]
    # each scenario queue beside the Kueue ClusterQueue it is mapped to: the guarantees are the
    # scenario's (A) and the ClusterQueues' nominal quotas summed over flavors (B)
    assert rows["infer -> org.prod"]["guaranteed_gpu"] == {"a": 16, "b": 24, "delta": 8}
    assert rows["train -> org.research.nlp"]["guaranteed_gpu"] == {"a": 32, "b": 20, "delta": -12}
    # under Kueue's quotas, nlp may hold at most 16 A100 (and 24 H100): the 4 x 8 gang "big" that ran
    # on the A100 nodes in A never runs in B; "late" still does
    assert rows["train -> org.research.nlp"]["admitted"] == {"a": 2, "b": 1, "delta": -1}
    assert rows["infer -> org.prod"]["admitted"] == {"a": 1, "b": 1, "delta": 0}
    # the file's other leaves have their own rows, B only
    assert rows["sandbox"]["guaranteed_gpu"] == {"a": None, "b": 2, "delta": None}
    assert "train" not in rows and "org.prod" not in rows


def test_the_imported_file_against_a_change_of_it(files: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    got = report(capsys, SCENARIO, "--base", files["imported"], "--compare", files["changed"], "--map", files["map"])
    assert (got["queues_a"], got["queues_b"]) == (str(files["imported"]), str(files["changed"]))
    rows = got["queues"]                       # both sides are the files' leaves
    assert rows["org.prod"]["guaranteed_gpu"] == {"a": 24, "b": 8, "delta": -16}
    # cut to 8 GPUs, prod cannot run inf (2 x 8): it goes, and late no longer waits for it
    assert rows["org.prod"]["admitted"] == {"a": 1, "b": 0, "delta": -1}
    assert rows["org.research.nlp"]["wait_p95_s"]["a"] > 0 and rows["org.research.nlp"]["wait_p95_s"]["b"] == 0
    # the same map, the same file on both sides: no difference
    same = report(capsys, SCENARIO, "--base", files["imported"], "--compare", files["imported"], "--map", files["map"])
    assert all(t["delta"] in (0, None) for q in same["queues"].values() for t in q.values())


def test_a_map_on_the_command_line_and_a_workloads_file(files: dict[str, Path], tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    scenario = yaml.safe_load(SCENARIO.read_text())
    lines = [json.dumps(w) for w in scenario.pop("workloads")]
    (tmp_path / "work.jsonl").write_text("\n".join(lines) + "\n")
    scenario["workloads_file"] = str(tmp_path / "work.jsonl")
    (tmp_path / "sc.yaml").write_text(yaml.safe_dump(scenario))
    # GPU types not mapped: the scenario's H100/A100 are not the file's types, whose typed quotas
    # then bind nothing; the gpu quota does
    got = report(capsys, tmp_path / "sc.yaml", "--compare", files["imported"],
                 "--map", "train=org.research.nlp, infer=org.prod")
    assert got["map"] == {"source": "--map", "queues": MAP["queues"], "gpu_types": {}}
    assert got["queues"]["train -> org.research.nlp"]["admitted"]["b"] == 2      # all three workloads read
    assert got["queues"]["infer -> org.prod"]["admitted"]["b"] == 1


def test_what_the_map_does_not_cover_is_refused_by_name(files: dict[str, Path],
                                                       capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    err = refused(capsys, SCENARIO, "--compare", files["imported"])
    assert "the workloads use queues that are not leaves here: infer, train" in err
    assert "name a leaf for each with --map" in err
    err = refused(capsys, SCENARIO, "--compare", files["imported"], "--map", "train=org.research.nlp")
    assert f"{files['imported']}: queues: the workloads use queues that are not leaves here: infer " in err
    assert "the map (--map) does not name them" in err

    def bad(m: dict[str, Any]) -> str:
        (tmp_path / "bad.yaml").write_text(yaml.safe_dump(m))
        return refused(capsys, SCENARIO, "--compare", files["imported"], "--map", tmp_path / "bad.yaml")

    err = bad({"queues": {"train": "org.research", "infer": "org.prod"}})
    assert f"{tmp_path / 'bad.yaml'}: queues.train: org.research is not a leaf queue of {files['imported']}" in err
    assert "no workload of the scenario uses this queue" in bad({"queues": {"trian": "org.prod"}})
    assert "gpu_types.V100: no node of the scenario has this GPU type (types: A100, H100)" in bad(
        {"queues": MAP["queues"], "gpu_types": {"V100": "a100"}})
    assert f"gpu_types.H100: b200 is not a GPU type of {files['imported']} (types: a100, h100)" in bad(
        {"queues": MAP["queues"], "gpu_types": {"H100": "b200"}})
    assert "--map[0]: expected SCENARIO_QUEUE=LEAF" in refused(capsys, SCENARIO, "--compare", files["imported"],
                                                               "--map", "=org.prod")
