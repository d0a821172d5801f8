"""The Alibaba v2023 importer on slices of the real trace (tests/data/traces), its queue rules and
default quotas, and the ``gpuq import-trace`` entry point."""
from __future__ import annotations

import csv
import zlib
from collections import Counter
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler.model import share_of_gpus
from scheduler.traces import (
    QOS_PREEMPTIBLE,
    QOS_PRIORITY,
    TraceError,
    dump_scenario,
    import_alibaba_v2023,
    import_trace_main,
    load_alibaba_v2023,
)
from scheduler.traces_queues import default_quotas, parse_assignment
from tests.conftest import data_path

REQUIRED = ("id", "queue", "submit", "duration", "pods", "gpus_per_pod", "priority", "preemptible")
LIMIT = 300


@pytest.fixture(scope="module")
def trace() -> Path:
    return data_path("traces", "alibaba-gpu-v2023")


@pytest.fixture(scope="module")
def spec33(trace: Path) -> Any:
    return load_alibaba_v2023(trace, pods_file="openb_pod_list_gpuspec33.csv", limit=LIMIT)


def _csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _leaves(queues: dict[str, Any], prefix: str = "") -> list[str]:
    out = []
    for name, spec in queues.items():
        kids = (spec or {}).get("queues")
        out += _leaves(kids, f"{prefix}{name}.") if kids else [f"{prefix}{name}"]
    return out


def test_structure_matches_the_scenario_format(spec33: Any, trace: Path) -> None:
    sc = spec33.scenario
    work = sc["workloads"]
    assert len(work) == LIMIT
    leaves = set(_leaves(sc["queues"]))
    node_types = {n["gpu_type"] for n in sc["nodes"]}
    assert set(sc["gpu_types"]) == node_types
    for w in work:
        assert all(k in w for k in REQUIRED), w
        assert w["queue"] in leaves
        assert w["duration"] > 0 and w["pods"] == 1 and share_of_gpus(w["gpus_per_pod"]) is not None
        assert set(w.get("gpu_types", [])) <= node_types
        assert len(set(w.get("gpu_types", []))) == len(w.get("gpu_types", []))
    assert any("gpu_types" in w for w in work), "gpuspec33 should carry some type constraints"
    assert len({w["id"] for w in work}) == len(work)
    submits = [w["submit"] for w in work]
    assert submits == sorted(submits) and submits[0] == 0
    # node groups add up to the trace's nodes per model, GPUs too
    rows = _csv(trace / "openb_node_list_gpu_node.csv")
    per_model = Counter(r["model"] for r in rows)
    got: Counter[str] = Counter()
    for n in sc["nodes"]:
        got[n["gpu_type"]] += n["count"]
    assert got == per_model
    assert sum(n["gpus"] * n["count"] for n in sc["nodes"]) == sum(int(r["gpu"]) for r in rows)
    assert len({n["name"] for n in sc["nodes"]}) == len(sc["nodes"])


def test_the_simulator_accepts_and_replays_the_slice(spec33: Any) -> None:
    from scheduler.simulate import run_scenario

    summary = run_scenario(spec33.scenario).summary
    assert sum(q["admitted"] + q["rejected"] for q in summary["queues"].values()) == LIMIT


def test_counts_match_an_independent_reading_of_the_csv(spec33: Any, trace: Path) -> None:
    stats = spec33.stats
    rows = _csv(trace / "openb_pod_list_gpuspec33.csv")[: stats.rows_read]
    gpu = [r for r in rows if int(r["num_gpu"]) >= 1]
    kept = [r for r in gpu if r["scheduled_time"]]
    assert stats.imported == len(kept) == LIMIT
    assert stats.skipped == Counter({k: v for k, v in {"cpu_only": len(rows) - len(gpu),
                                                        "never_scheduled": len(gpu) - len(kept)}.items() if v})
    fractional = sum(1 for r in kept if r["num_gpu"] == "1" and int(r["gpu_milli"]) < 1000)
    assert fractional > 0 and stats.kept_fractional == stats.fractional == fractional
    assert stats.rounded_fractional == 0 and not stats.whole_no_milli and not stats.whole_multi_below
    by_id = {w["id"]: w for w in spec33.scenario["workloads"]}
    for r in kept:
        w = by_id[r["name"]]
        num, milli = int(r["num_gpu"]), int(r["gpu_milli"])
        if num == 1 and milli < 1000:                                    # a share, written as a decimal
            assert type(w["gpus_per_pod"]) is float and w["gpus_per_pod"] == float(Fraction(milli, 1000))
        else:                                                            # whole pods stay whole
            assert w["gpus_per_pod"] == num and type(w["gpus_per_pod"]) is int
        assert w["duration"] == int(r["deletion_time"]) - int(r["scheduled_time"])
        assert w["priority"] == QOS_PRIORITY[r["qos"]] and w["preemptible"] == QOS_PREEMPTIBLE[r["qos"]]
        spec = [t for t in r["gpu_spec"].split("|") if t]
        assert w.get("gpu_types", []) == list(dict.fromkeys(spec))      # order kept, duplicates dropped


def test_hash_assignment_is_crc32_and_stable(trace: Path) -> None:
    a = import_alibaba_v2023(trace, limit=50, assignment="hash:5")
    b = import_alibaba_v2023(trace, limit=50, assignment="hash:5")
    assert a == b
    for w in a["workloads"]:
        assert w["queue"] == f"q{zlib.crc32(w['id'].encode()) % 5}"
    assert list(a["queues"]) == ["q0", "q1", "q2", "q3", "q4"]
    # pinned: a salted hash() or another function would move these
    first = {w["id"]: w["queue"] for w in import_alibaba_v2023(trace, limit=3)["workloads"]}
    assert first == {"openb-pod-0000": "q0", "openb-pod-0001": "q6", "openb-pod-0002": "q4"}


def test_qos_assignment_and_explicit_table(trace: Path) -> None:
    qos = {r["name"]: r["qos"] for r in _csv(trace / "openb_pod_list_default.csv")}
    sc = import_alibaba_v2023(trace, limit=LIMIT, assignment="qos")
    assert list(sc["queues"]) == ["ls", "guaranteed", "burstable", "be"]
    assert all(w["queue"] == qos[w["id"]].lower() for w in sc["workloads"])
    assert {w["queue"] for w in sc["workloads"]} >= {"ls", "be"}
    sc2 = import_alibaba_v2023(trace, limit=LIMIT, assignment="qos:LS=prod,Guaranteed=prod,*=batch")
    assert list(sc2["queues"]) == ["prod", "batch"]
    assert all(w["queue"] == ("prod" if qos[w["id"]] in ("LS", "Guaranteed") else "batch")
               for w in sc2["workloads"])
    assert all((w["queue"] == "prod") == (not w["preemptible"]) for w in sc2["workloads"])


def test_default_quotas_follow_demand_and_fill_the_cluster(spec33: Any) -> None:
    sc, stats = spec33.scenario, spec33.stats
    total = sum(n["gpus"] * n["count"] for n in sc["nodes"])
    g = {q: s["guaranteed"]["gpu"] for q, s in sc["queues"].items()}
    assert sum(g.values()) == total
    assert all(s["max"] == {"gpu": total} for s in sc["queues"].values())
    top = max(stats.demand_gpu_s, key=lambda q: stats.demand_gpu_s[q])
    assert g[top] == max(g.values())


@pytest.mark.parametrize(("demand", "total", "want"), [
    ({"a": 1.0, "b": 1.0}, 5, {"a": 3, "b": 2}),             # tie on the remainder: first listed wins
    ({"a": 3.0, "b": 1.0}, 8, {"a": 6, "b": 2}),
    ({"a": 1.0, "b": 1.0, "c": 1.0}, 10, {"a": 4, "b": 3, "c": 3}),
    ({"a": 0.0, "b": 0.0}, 8, {"a": 0, "b": 0}),             # no demand: nothing guaranteed
    ({"a": 1.0, "b": 0.0}, 7, {"a": 7, "b": 0}),
], ids=["tie", "proportional", "three-way", "no-demand", "one-idle"])
def test_default_quotas_table(demand: dict[str, float], total: int, want: dict[str, int]) -> None:
    got = default_quotas(list(demand), demand, total)
    assert {q: s["guaranteed"]["gpu"] for q, s in got.items()} == want
    assert all(s["max"] == {"gpu": total} for s in got.values())


def test_user_queue_file_keeps_its_quotas(trace: Path) -> None:
    queues = {"queues": {"prod": {"guaranteed": {"gpu": 100}, "max": {"gpu": 200},
                                  "queues": {"ls": {"guaranteed": {"gpu": 50}}, "guaranteed": {}}},
                         "batch": {"queues": {"burstable": {}, "be": {"max": {"gpu/T4": 10}}}}},
              "gpu_types": {"T4": {"price_per_hour": 0.5}}}
    sc = import_alibaba_v2023(trace, limit=LIMIT, queues=queues, assignment="qos")
    assert sc["queues"] == queues["queues"]
    assert sc["gpu_types"]["T4"] == {"price_per_hour": 0.5} and "G2" in sc["gpu_types"]
    assert {w["queue"] for w in sc["workloads"]} <= {"prod.ls", "prod.guaranteed", "batch.burstable", "batch.be"}
    hashed = import_alibaba_v2023(trace, limit=LIMIT, queues=queues, assignment="hash")
    leaves = ["prod.ls", "prod.guaranteed", "batch.burstable", "batch.be"]
    assert all(w["queue"] == leaves[zlib.crc32(w["id"].encode()) % 4] for w in hashed["workloads"])


@pytest.mark.parametrize(("rule", "queues", "needle"), [
    ("hash:0", None, "hash:N"),
    ("round-robin", None, "unknown rule"),
    ("qos:LS=a.b", None, "queue file"),
    ("qos:XX=a", None, "unknown qos class"),
    ("qos:LS=nope", {"queues": {"a": {}}}, "not a leaf"),
    ("hash:3", {"queues": {"a": {}, "b": {}}}, "2 leaf queues"),
    ("hash", {"queues": {"a": {"guaranteed": {"gpu": 9}, "max": {"gpu": 8}}}}, "below guaranteed"),
], ids=["hash-zero", "unknown", "nested-without-file", "bad-qos", "not-leaf", "leaf-count", "bad-quota"])
def test_bad_assignment_rules(rule: str, queues: dict[str, Any] | None, needle: str) -> None:
    with pytest.raises(TraceError, match=needle):
        parse_assignment(rule, queues)


def test_unmapped_qos_class_is_an_error(trace: Path) -> None:
    with pytest.raises(TraceError, match=r"openb-pod-0017 has qos 'Burstable'.*add Burstable=QUEUE or \*=QUEUE"):
        import_alibaba_v2023(trace, limit=LIMIT, assignment="qos:LS=prod")


def test_options_pending_and_scales(trace: Path) -> None:
    base = load_alibaba_v2023(trace, limit=LIMIT)
    scaled = load_alibaba_v2023(trace, limit=LIMIT, time_scale=0.1, duration_scale=0.5)
    for a, b in zip(base.scenario["workloads"], scaled.scenario["workloads"], strict=True):
        assert b["submit"] == pytest.approx(a["submit"] * 0.1, abs=1e-3)
        assert b["duration"] == pytest.approx(a["duration"] * 0.5, abs=1e-3)
    # the full default pod list: 861 GPU pods were never scheduled; a default duration keeps them
    full = load_alibaba_v2023(trace)
    kept = load_alibaba_v2023(trace, pending_duration_s=600)
    assert full.stats.skipped["never_scheduled"] == 861 and full.stats.imported == 6203
    assert kept.stats.pending_given_duration == 861 and kept.stats.imported == 6203 + 861
    assert full.stats.kept_fractional == 2573 and full.stats.rounded_fractional == 0


def test_shares_kept_by_default_and_rounded_with_the_flag(trace: Path) -> None:
    """openb-pod-0001 asks gpu_milli 460: gpus_per_pod 0.46 (exactly 23/50 once parsed); with
    round_fractions it takes 1 GPU as before. Whole pods (1 GPU at 1000, and the 2-, 4- and 8-GPU
    pods) are the same both ways, and so is everything but the shares."""
    kept = load_alibaba_v2023(trace)
    rounded = load_alibaba_v2023(trace, round_fractions=True)
    k = {w["id"]: w for w in kept.scenario["workloads"]}
    r = {w["id"]: w for w in rounded.scenario["workloads"]}
    assert k["openb-pod-0001"]["gpus_per_pod"] == 0.46 and r["openb-pod-0001"]["gpus_per_pod"] == 1
    assert share_of_gpus(k["openb-pod-0001"]["gpus_per_pod"]) == Fraction(23, 50)
    assert "0.46" in dump_scenario(kept.scenario).split("openb-pod-0001,", 1)[1].split("\n", 1)[0]
    assert list(k) == list(r)
    shares = {i for i, w in k.items() if w["gpus_per_pod"] < 1}
    assert len(shares) == kept.stats.kept_fractional == rounded.stats.rounded_fractional == 2573
    assert rounded.stats.kept_fractional == 0
    sizes = Counter(w["gpus_per_pod"] for i, w in k.items() if i not in shares)
    assert sizes == {1: 6129 - 2573, 2: 15, 4: 15, 8: 44}                # docs/TRACES.md
    for i in k:
        a, b = dict(k[i]), dict(r[i])
        assert b["gpus_per_pod"] == (1 if i in shares else a["gpus_per_pod"])
        a.pop("gpus_per_pod"), b.pop("gpus_per_pod")
        assert a == b
    # the shares add up exactly (thousandths, no float drift), and the stats say so
    total = sum(share_of_gpus(k[i]["gpus_per_pod"]) or 0 for i in shares)
    assert total == kept.stats.fractional_gpus == rounded.stats.fractional_gpus
    assert sum(kept.stats.requested_gpus_by_type.values()) == 6571 - 2573 + total
    assert sum(rounded.stats.requested_gpus_by_type.values()) == 6571
    assert any(f"kept as shares of one GPU: 2573 ({float(total):g} GPUs" in x for x in kept.stats.summary_lines())
    assert any("rounded up to 1 whole GPU: 2573 (--round-fractions" in x for x in rounded.stats.summary_lines())


def test_odd_gpu_milli_stays_whole_and_is_counted(tmp_path: Path, trace: Path) -> None:
    """Not in the shipped lists: a one-GPU pod with gpu_milli 0 has no share to keep, and a
    multi-GPU pod below 1000 keeps its whole GPUs; each is counted and said."""
    (tmp_path / "openb_node_list_gpu_node.csv").write_text((trace / "openb_node_list_gpu_node.csv").read_text())
    head = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time"
    (tmp_path / "pods.csv").write_text("\n".join([
        head, "p0,1,1,1,0,,BE,Succeeded,0,10,0", "p1,1,1,2,500,,BE,Succeeded,0,10,0",
        "p2,1,1,1,1,,BE,Succeeded,0,10,0", "p3,1,1,1,999,,BE,Succeeded,0,10,0"]) + "\n")
    got = load_alibaba_v2023(tmp_path, pods_file="pods.csv")
    assert [w["gpus_per_pod"] for w in got.scenario["workloads"]] == [1, 2, 0.001, 0.999]
    assert (got.stats.whole_no_milli, got.stats.whole_multi_below, got.stats.kept_fractional) == (1, 1, 2)
    lines = got.stats.summary_lines()
    assert "one-GPU pods with gpu_milli 0 or empty, given 1 whole GPU: 1" in lines
    assert "multi-GPU pods with gpu_milli below 1000, kept whole: 1" in lines


def test_deterministic_yaml(trace: Path, tmp_path: Path) -> None:
    one = dump_scenario(import_alibaba_v2023(trace, limit=LIMIT, assignment="qos"))
    two = dump_scenario(import_alibaba_v2023(trace, limit=LIMIT, assignment="qos"))
    assert one == two
    assert yaml.safe_load(one) == import_alibaba_v2023(trace, limit=LIMIT, assignment="qos")


def test_file_without_times_is_refused(trace: Path) -> None:
    with pytest.raises(TraceError, match="missing columns.*creation_time") as err:
        load_alibaba_v2023(trace, pods_file="openb_pod_list_multigpu50.csv")
    assert err.value.line == 1


def test_bad_value_names_file_and_line(tmp_path: Path, trace: Path) -> None:
    (tmp_path / "openb_node_list_gpu_node.csv").write_text((trace / "openb_node_list_gpu_node.csv").read_text())
    lines = (trace / "openb_pod_list_default.csv").read_text().splitlines()[:4]
    lines[3] = lines[3].replace(",1558381,", ",soon,", 1)
    (tmp_path / "pods.csv").write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceError, match=r"pods.csv:4: column creation_time"):
        load_alibaba_v2023(tmp_path, pods_file="pods.csv")


def test_cli_writes_the_scenario_and_a_summary(trace: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "sc.yaml"
    qfile = tmp_path / "q.yaml"
    qfile.write_text("queues:\n  a: {guaranteed: {gpu: 10}}\n  b: {}\n")
    rc = import_trace_main(["alibaba-v2023", str(trace), "--out", str(out), "--limit", "40",
                            "--queues", str(qfile), "--assign", "qos:LS=a,*=b", "--no-preemption"], None)
    assert rc == 0
    text = capsys.readouterr().out
    assert "imported 40 workloads" in text and "kept as shares of one GPU: " in text
    sc = yaml.safe_load(out.read_text())
    assert sc["scheduler"] == {"preemption": False} and len(sc["workloads"]) == 40
    assert out.read_text().startswith("# gpuq import-trace")
    assert any(w["gpus_per_pod"] < 1 for w in sc["workloads"])
    rc = import_trace_main(["alibaba-v2023", str(trace), "--out", str(out), "--limit", "40",
                            "--round-fractions"], None)
    assert rc == 0 and "rounded up to 1 whole GPU: " in capsys.readouterr().out
    assert all(type(w["gpus_per_pod"]) is int for w in yaml.safe_load(out.read_text())["workloads"])
    rc = import_trace_main(["alibaba-v2023", str(trace), "--out", str(out), "--queues", "hash:0"], None)
    assert rc == 2 and "hash:N" in capsys.readouterr().err
