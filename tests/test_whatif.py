"""`gpuq whatif` on a chDB store filled by replaying a scenario into it (`gpuq simulate --store`'s
function, scheduler.history.record_replay): with no change, the replay as it happened gives the
original replay's events byte for byte, and so its GPU-hours and waits are the history's; with
added nodes no queue waits longer, and the work done (GPU-hours less those preemption threw away)
and the foreign work held as fixed load are the same; the history survives its JSON file; a window
that starts inside the history carries its waiting and running work in; errors name the argument."""
from __future__ import annotations

import io
import json
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuq.settings import Settings
from scheduler.history import FIXED, FOREIGN, from_json, read_history, record_replay
from scheduler.simulator import load_scenario, parse_scenario, run_scenario
from scheduler.whatif import main

SCENARIOS = Path(__file__).parent / "scenarios"
NOW = float(int(time.time()))
CLUSTER = "sim"

# two queues, one node's half held by foreign work in queue b, another node held outside any queue
FOREIGN_SCENARIO: dict[str, Any] = {
    "name": "with-foreign",
    "nodes": [{"name": "n", "gpu_type": "A100", "gpus": 8, "count": 4}],
    "queues": {"a": {"guaranteed": {"gpu": 16}, "max": {"gpu": 32}}, "b": {"guaranteed": {"gpu": 16}, "max": {"gpu": 32}}},
    "fixed": [{"id": "other-1", "node": "n-3", "gpus": 8, "start": 0, "end": 1500},
              {"id": "other-2", "node": "n-2", "gpus": 4, "start": 0, "end": 900, "queue": "b"}],
    "workloads": [{"id": "a", "queue": "a", "submit": 0, "duration": 1000, "gpus_per_pod": 8, "count": 3},
                  {"id": "b", "queue": "b", "submit": 50, "duration": 500, "gpus_per_pod": 4, "count": 3}],
}


def fill(store: Any, scenario: Any) -> tuple[Any, Any, float]:
    """Replay ``scenario`` and write it into ``store`` so that its clock ends at NOW."""
    sc = load_scenario(scenario) if isinstance(scenario, Path) else parse_scenario(scenario)
    result = run_scenario(sc)
    epoch = NOW - float(result.summary["makespan_s"]) - 60
    record_replay(store, sc, result, CLUSTER, epoch)
    return sc, result, epoch


def settings(tmp_path: Path, store: Any, queues: dict[str, Any], **scheduler: Any) -> Settings:
    qf = tmp_path / "queues.yaml"
    qf.write_text(yaml.safe_dump({"queues": queues, "policy": {"max_priority": 100, "non_preemptible": True}}))
    return Settings(store={"dsn": "chdb:///nowhere"}, queues_file=str(qf),
                    scheduler={"cluster": CLUSTER, **scheduler})


def whatif(store: Any, s: Settings, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = main(list(argv), s, now_s=NOW, store=store)
    return rc, out.getvalue(), err.getvalue()


def report(store: Any, s: Settings, *argv: str) -> dict[str, Any]:
    rc, out, err = whatif(store, s, *argv, "--format", "json")
    assert rc == 0, err
    data: dict[str, Any] = json.loads(out)
    return data


def test_no_change_replays_the_history(store: Any, tmp_path: Path) -> None:
    sc, original, _ = fill(store, SCENARIOS / "classic-60-40.yaml")
    s = settings(tmp_path, store, yaml.safe_load((SCENARIOS / "classic-60-40.yaml").read_text())["queues"])
    r = report(store, s, "--from", "-1d", "--out", str(tmp_path / "out"))
    assert r["workloads"] == {"replayed": 16, "carried_in": 0, "unfinished_at_end": 0, "left_out": {}}
    # the replay as it happened is the original replay, event for event
    assert (tmp_path / "out/before/events.jsonl").read_text() == original.events_jsonl()
    for q in ("first", "second"):
        got = {m: v["before"] for m, v in r["queues"][q].items()}
        assert got["gpu_hours"] == pytest.approx(original.summary["queues"][q]["gpu_seconds"] / 3600)
        assert got["gpu_hours"] == pytest.approx(r["observed"][q]["gpu_hours"])        # conserved
        assert (got["wait_p50_s"], got["wait_p90_s"]) == (r["observed"][q]["wait_p50_s"], r["observed"][q]["wait_p90_s"])
        assert got["preemptions"] == r["observed"][q]["preemptions"] == original.summary["queues"][q]["preempted"]
        assert all(v["delta"] in (0, 0.0) for v in r["queues"][q].values())        # no change: after = before
    assert r["queues"]["first"]["preemptions"]["before"] == 4
    # the files are the simulator's own: its summary, and a scenario gpuq simulate replays again
    again = run_scenario(tmp_path / "out/before/scenario.yaml")
    assert again.events_jsonl() == original.events_jsonl()
    assert json.loads((tmp_path / "out/whatif.json").read_text())["queues"] == r["queues"]


SHARES_SCENARIO: dict[str, Any] = {
    "name": "shares", "scheduler": {"cycle_interval_s": 10},
    "nodes": [{"name": "a10", "gpu_type": "A10", "gpus": 2, "count": 2}],
    "queues": {"a": {"guaranteed": {"gpu": 2}, "max": {"gpu": 4}}, "b": {"guaranteed": {"gpu": 2}, "max": {"gpu": 4}}},
    "workloads": [{"id": "s1", "queue": "a", "submit": 0, "duration": 100, "gpus_per_pod": 0.5},
                  {"id": "s2", "queue": "a", "submit": 0, "duration": 50, "gpus_per_pod": 0.25, "pods": 3},
                  {"id": "w1", "queue": "b", "submit": 0, "duration": 80, "gpus_per_pod": 2},
                  {"id": "s3", "queue": "b", "submit": 5, "duration": 60, "gpus_per_pod": 0.5, "pods": 2},
                  {"id": "w2", "queue": "a", "submit": 10, "duration": 30, "gpus_per_pod": 1}],
}


def test_a_history_of_shares_replays_as_it_happened(store: Any, tmp_path: Path) -> None:
    """Shares of one GPU (issue 19) go into the store (placement_milli) and come back out as shares:
    the replay as it happened is the original, event for event (devices included)."""
    sc, original, _ = fill(store, SHARES_SCENARIO)
    r = report(store, settings(tmp_path, store, SHARES_SCENARIO["queues"]), "--from", "-1d", "--out", str(tmp_path / "out"))
    assert r["workloads"]["replayed"] == 5
    assert (tmp_path / "out/before/events.jsonl").read_text() == original.events_jsonl()
    assert '"devices": {"a10-0": {"0": 0.5, "1": 0.25}}' in original.events_jsonl()
    for q in ("a", "b"):
        assert r["queues"][q]["gpu_hours"]["before"] == pytest.approx(original.summary["queues"][q]["gpu_seconds"] / 3600, abs=1e-6)


def test_added_nodes_shorten_waits_and_keep_the_work(store: Any, tmp_path: Path) -> None:
    fill(store, SCENARIOS / "classic-60-40.yaml")
    s = settings(tmp_path, store, yaml.safe_load((SCENARIOS / "classic-60-40.yaml").read_text())["queues"])
    r = report(store, s, "--from", "-1d", "--add-nodes", "A100:8x4", "--add-nodes", "H100:8x1")
    assert r["gpus"] == {"before": 80, "after": 120}
    assert r["change"]["add_nodes"] == ["A100:8x4", "H100:8x1"]
    for q, m in r["queues"].items():
        assert m["wait_p50_s"]["after"] <= m["wait_p50_s"]["before"], q
        assert m["wait_p90_s"]["after"] <= m["wait_p90_s"]["before"], q
        done = [m["gpu_hours"][k] - m["lost_gpu_hours"][k] for k in ("before", "after")]
        assert done[0] == pytest.approx(done[1]), q                         # the same work is done
    # room for the second queue without preemption: nothing is thrown away, no guarantee is owed
    assert r["queues"]["(all)"]["preemptions"] == {"before": 4, "after": 0, "delta": -4}
    assert r["queues"]["second"]["guarantee_violation_s"]["after"] == 0.0 < r["queues"]["second"]["guarantee_violation_s"]["before"]
    rc, table, _ = whatif(store, s, "--from", "-1d", "--add-nodes", "A100:8x4")
    assert rc == 0 and "after = add A100:8x4" in table and "wait p90 s" in table and "delta" in table


def test_foreign_work_is_fixed_load(store: Any, tmp_path: Path) -> None:
    sc, original, epoch = fill(store, FOREIGN_SCENARIO)
    assert original.summary["fixed"]["displaced"] == []
    s = settings(tmp_path, store, FOREIGN_SCENARIO["queues"])
    h = read_history(store, CLUSTER, NOW - 86400, NOW, _config(s))
    fixed = {e.id: e for e in h.entries if e.kind == FIXED}
    assert set(fixed) == {"replay/other-1", "replay/other-2"} and {e.origin for e in fixed.values()} == {FOREIGN}
    assert fixed["replay/other-2"].queue == "b" and fixed["replay/other-1"].queue == ""
    assert fixed["replay/other-2"].runs[0].start_s == epoch and fixed["replay/other-2"].runs[0].end_s == epoch + 900
    assert from_json(json.loads(json.dumps(h.to_json()))) == h                 # the history file keeps it all
    r = report(store, s, "--from", "-1d", "--out", str(tmp_path / "out"))
    assert (tmp_path / "out/before/events.jsonl").read_text() == original.events_jsonl()
    held = original.summary["fixed"]["gpu_seconds"] / 3600
    assert r["fixed"]["before"] == {"held": 2, "displaced": 0, "gpu_hours": pytest.approx(held)}
    # one more node: the same foreign work is held, the waits do not grow
    r2 = report(store, s, "--history", str(tmp_path / "out/history.json"), "--add-nodes", "A100:8x1")
    assert r2["fixed"]["after"]["gpu_hours"] == pytest.approx(held) and r2["fixed"]["after"]["displaced"] == 0
    assert r2["queues"]["b"]["wait_p90_s"]["after"] <= r2["queues"]["b"]["wait_p90_s"]["before"]
    # removing the node held outside any queue moves its fixed load to a node of its type
    r3 = report(store, s, "--from", "-1d", "--remove-nodes", "n-3")
    assert r3["gpus"] == {"before": 32, "after": 24}
    assert r3["fixed"]["after"]["held"] + r3["fixed"]["after"]["displaced"] == 2


def _config(s: Settings) -> Any:
    from accounting.service import load_config

    return load_config(s.queues_file)


def test_window_inside_the_history_carries_work_in(store: Any, tmp_path: Path) -> None:
    _, original, epoch = fill(store, SCENARIOS / "classic-60-40.yaml")
    s = settings(tmp_path, store, yaml.safe_load((SCENARIOS / "classic-60-40.yaml").read_text())["queues"])
    start = epoch + 500                      # first's 6 GPUs-8 gangs run, second's 4 run, more-0/1 wait
    iso = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start))
    r = report(store, s, "--from", iso, "--to", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch + 3000)))
    assert r["clock_start"] == iso
    assert r["workloads"]["carried_in"] == 16 and r["workloads"]["replayed"] == 16
    assert r["workloads"]["unfinished_at_end"] == 10            # f-* run past 3000 s (and f-0..3 restarted)
    assert r["queues"]["(all)"]["wait_p50_s"]["before"] is None  # every wait began before the window
    assert r["observed"]["(all)"]["gpu_hours"] == pytest.approx(80 * 2500 / 3600, rel=0.05)


def test_errors_name_the_argument(store: Any, tmp_path: Path) -> None:
    fill(store, SCENARIOS / "classic-60-40.yaml")
    s = settings(tmp_path, store, yaml.safe_load((SCENARIOS / "classic-60-40.yaml").read_text())["queues"])
    cases = [
        (["--add-nodes", "H100:8"], "--add-nodes: expected TYPE:GPUSxCOUNT"),
        (["--add-nodes", "H100:0x2"], "--add-nodes: expected TYPE:GPUSxCOUNT"),
        (["--remove-nodes", "n-0", "gpu-99"], "--remove-nodes: unknown node 'gpu-99'"),
        (["--queues", str(tmp_path / "missing.yaml")], "--queues: " + str(tmp_path / "missing.yaml")),
        (["--from", "-2d", "--to", "-1d"], "--from: no workload of cluster 'sim' to replay"),
        (["--from", "yesterday"], "--from/--to: "),
        (["--from", "-1h", "--to", "-2h"], "--to: -2h is not after --from -1h"),
        (["--history", str(tmp_path / "nope.json")], "--history: "),
    ]
    (tmp_path / "other.yaml").write_text("queues: {first: {guaranteed: {gpu: 8}}}\n")
    cases.append((["--queues", str(tmp_path / "other.yaml")], "the workloads use queues that are not leaves here: second"))
    (tmp_path / "bad.yaml").write_text("queues: {first: {guaranteed: {gpu: -1}}}\n")
    cases.append((["--queues", str(tmp_path / "bad.yaml")], "--queues: " + str(tmp_path / "bad.yaml")))
    for argv, message in cases:
        rc, out, err = whatif(store, s, "--from", "-1d", *argv) if argv[0] != "--from" else whatif(store, s, *argv)
        assert rc == 2 and out == "", argv
        assert err.startswith("gpuq whatif: error: ") and message in err, (argv, err)
    unconfigured = Settings(store={"dsn": "chdb:///nowhere"}, scheduler={"cluster": CLUSTER})
    rc, _, err = whatif(store, unconfigured, "--from", "-1d")
    assert rc == 2 and "queues_file: no queue file is configured" in err


def test_simulate_store_then_whatif_as_commands(tmp_path: Path) -> None:
    """The two commands as a user runs them, each a process of its own (chDB allows one per path):
    `gpuq simulate --store` fills a fresh store, `gpuq whatif` replays it as the replay it was."""
    import os
    import subprocess
    import sys

    (tmp_path / "queues.yaml").write_text(yaml.safe_dump(
        {"queues": yaml.safe_load((SCENARIOS / "classic-60-40.yaml").read_text())["queues"]}))
    (tmp_path / "gpuq.yaml").write_text(yaml.safe_dump({"store": {"dsn": f"chdb://{tmp_path / 'data'}"},
                                                        "queues_file": str(tmp_path / "queues.yaml")}))
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}

    def gpuq(*argv: str) -> str:
        r = subprocess.run([sys.executable, "-m", "gpuq.cli", *argv, "--config", str(tmp_path / "gpuq.yaml")],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        return r.stdout

    said = gpuq("simulate", str(SCENARIOS / "classic-60-40.yaml"), "--out", "run", "--store", "--cluster", "lab")
    assert "as cluster 'lab'" in said
    start = said.split("--from ")[1].split(" ")[0].rstrip(")")
    r = json.loads(gpuq("whatif", "--cluster", "lab", "--from", start, "--out", "wi", "--json"))
    assert r["workloads"]["replayed"] == 16 and r["from"] == start
    assert (tmp_path / "wi/before/events.jsonl").read_text() == (tmp_path / "run/events.jsonl").read_text()
