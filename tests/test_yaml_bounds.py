"""Files that cannot explode (issue 17): every YAML gpuq loads is refused when its aliases expand it
past a bound tied to its size, before any object is built, with the file and line; no error message
formats more than a few hundred characters of a value; a queue file holds at most 10,000 queues."""
from __future__ import annotations

import resource
import time
from pathlib import Path

import pytest

from accounting.errors import QueueConfigError
from accounting.queues import MAX_QUEUES, load_queue_config, parse_queue_config
from gpuq.errors import ConfigError, shown
from gpuq.settings import load_settings
from gpuq.yamlsafe import ExpansionError, safe_load


def laughs(levels: int = 9, width: int = 9, top: str = "queues") -> str:
    """The classic alias bomb: each level a list of ``width`` aliases of the one below."""
    lines = [f"l0: &l0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]")
    lines.append(f"{top}: *l{levels - 1}")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_is_refused_before_it_is_built() -> None:
    text = laughs()
    assert len(text) < 600                              # 9^9 = 387 M items once expanded
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    with pytest.raises(ExpansionError, match="aliases expand this document past") as err:
        safe_load(text)
    assert time.perf_counter() - t < 1.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 50_000     # KiB: nothing was built
    assert err.value.problem_mark is not None and err.value.problem_mark.line >= 0


def test_plain_files_and_honest_aliases_still_load() -> None:
    assert safe_load("a: &x {gpu: 8}\nb: *x\nc: [1, 2]\n") == {"a": {"gpu": 8}, "b": {"gpu": 8}, "c": [1, 2]}
    assert safe_load("") is None


@pytest.mark.parametrize("name", ["queues.yaml", "gpuq.yaml"])
def test_every_loader_reports_the_bomb_with_the_file(tmp_path: Path, name: str) -> None:
    f = tmp_path / name
    f.write_text(laughs(top="queues" if name == "queues.yaml" else "store"))
    if name == "queues.yaml":
        with pytest.raises(QueueConfigError) as qerr:
            load_queue_config(f)
        assert "aliases expand" in str(qerr.value) and str(f) in qerr.value.located()
    else:
        with pytest.raises(ConfigError) as cerr:
            load_settings(str(f))
        assert "aliases expand" in str(cerr.value) and str(f) in str(cerr.value)


def test_a_scenario_bomb_is_refused_with_its_line(tmp_path: Path) -> None:
    from scheduler.simulator.scenario import load_yaml
    from scheduler.errors import ScenarioError
    f = tmp_path / "s.yaml"
    f.write_text(laughs(top="workloads"))
    with pytest.raises(ScenarioError, match="aliases expand") as err:
        load_yaml(f)
    assert len(str(err.value)) < 500


def test_error_messages_show_a_few_hundred_characters_of_a_value() -> None:
    huge = [[list(range(1000))] * 1000] * 1000
    assert len(shown(huge)) <= 203
    with pytest.raises(QueueConfigError) as err:
        parse_queue_config({"queues": {"a": {"weight": ["x" * 100_000]}}})
    assert len(str(err.value)) < 500


def test_a_queue_file_of_more_than_the_limit_is_refused() -> None:
    many = {f"q{i}": {} for i in range(MAX_QUEUES + 1)}
    with pytest.raises(QueueConfigError, match="more than 10,000 queues"):
        parse_queue_config({"queues": many})
    assert len(parse_queue_config({"queues": {f"q{i}": {} for i in range(100)}}).leaves()) == 100
