"""Queue file validation: every rule with its exact message, and the reloading watcher."""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from accounting.errors import QueueConfigError
from accounting.queues import QueueConfig, load_queue_config, parse_queue_config
from accounting.watcher import QueueConfigWatcher, Reload
from tests.accounting_helpers import BASE_QUEUES


def q(spec: dict[str, Any], *, types: bool = True, **extra: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"queues": spec, **extra}
    if types:
        data["gpu_types"] = {"H100": {"price_per_hour": 4.0}, "A100": {}}
    return data


INVALID = [
    ("guaranteed-above-max-typed",
     q({"research": {"queues": {"vision": {"guaranteed": {"gpu/H100": 16}, "max": {"gpu/H100": 8}}}}}),
     "queues.research.vision.max: gpu/H100 8 is below guaranteed 16"),
    ("guaranteed-above-max",
     q({"prod": {"guaranteed": {"gpu": 9}, "max": {"gpu": 8}}}),
     "queues.prod.max: gpu 8 is below guaranteed 9"),
    ("typed-guarantee-above-total-max",
     q({"prod": {"guaranteed": {"gpu/H100": 9}, "max": {"gpu": 8}}}),
     "queues.prod.max: gpu 8 is below guaranteed gpu/H100 9"),
    ("typed-guarantee-above-total-guarantee",
     q({"prod": {"guaranteed": {"gpu": 4, "gpu/H100": 6}}}),
     "queues.prod.guaranteed: gpu/H100 6 is above gpu 4"),
    ("child-max-above-parent",
     q({"research": {"max": {"gpu": 80}, "queues": {"vision": {"max": {"gpu": 100}}}}}),
     "queues.research.vision.max: gpu 100 is above the max 80 of research"),
    ("grandchild-max-above-grandparent",
     q({"a": {"max": {"gpu": 10}, "queues": {"b": {"queues": {"c": {"max": {"gpu": 11}}}}}}}),
     "queues.a.b.c.max: gpu 11 is above the max 10 of a"),
    ("child-guarantee-above-parent-max",
     q({"a": {"max": {"gpu/H100": 4}, "queues": {"b": {"queues": {"c": {"guaranteed": {"gpu/H100": 5}}}}}}}),
     "queues.a.b.c.guaranteed: gpu/H100 5 is above the max 4 of a"),
    ("children-guarantees-exceed-parent",
     q({"research": {"guaranteed": {"gpu": 24},
                     "queues": {"vision": {"guaranteed": {"gpu": 16}}, "nlp": {"guaranteed": {"gpu": 16}}}}}),
     "queues.research.guaranteed: gpu 24 is below the children's guaranteed total 32 (nlp 16, vision 16)"),
    ("children-guarantees-exceed-parent-max",
     q({"research": {"max": {"gpu": 20},
                     "queues": {"vision": {"guaranteed": {"gpu": 16}}, "nlp": {"guaranteed": {"gpu": 8}}}}}),
     "queues.research.max: gpu 20 is below the children's guaranteed total 24 (nlp 8, vision 16)"),
    ("unknown-gpu-type",
     q({"prod": {"max": {"gpu/H200": 8}}}),
     "queues.prod.max.gpu/H200: unknown gpu type 'H200' (declared: A100, H100)"),
    ("unknown-resource",
     q({"prod": {"max": {"gpus": 8}}}),
     "queues.prod.max.gpus: unknown resource (expected gpu, gpu/<TYPE>, gpu_eq, cpu or memory)"),
    ("unknown-queue-key",
     q({"prod": {"guarantee": {"gpu": 8}}}),
     ("queues.prod.guarantee: unknown key (expected one of guaranteed, max, min_runtime_s, namespaces, "
      "placement, policy, preemption, priority, queues, strict_fifo, weight, within_queue)")),
    ("within-queue-value",
     q({"prod": {"within_queue": "LowerPriority"}}),
     "queues.prod.within_queue: expected one of never, lower_priority, got 'LowerPriority'"),
    ("min-runtime-negative",
     q({"research": {"queues": {"nlp": {"min_runtime_s": -5}}}}),
     "queues.research.nlp.min_runtime_s: must be a non-negative number of seconds, got -5"),
    ("min-runtime-text",
     q({"prod": {"min_runtime_s": "10m"}}),
     "queues.prod.min_runtime_s: expected a number, got '10m'"),
    ("unknown-preemption-key",
     q({"prod": {"preemption": {"fense": True}}}),
     "queues.prod.preemption.fense: unknown key (expected one of fence)"),
    ("negative-gpu", q({"prod": {"guaranteed": {"gpu": -1}}}),
     "queues.prod.guaranteed.gpu: must not be negative, got -1"),
    ("fractional-gpu", q({"prod": {"max": {"gpu": 1.5}}}),
     "queues.prod.max.gpu: expected a non-negative integer GPU count, got 1.5"),
    ("string-gpu", q({"prod": {"max": {"gpu": "8"}}}),
     "queues.prod.max.gpu: expected a non-negative integer GPU count, got '8'"),
    ("bool-gpu", q({"prod": {"max": {"gpu": True}}}),
     "queues.prod.max.gpu: expected a non-negative integer GPU count, got True"),
    ("bad-cpu", q({"prod": {"max": {"cpu": "8 cores"}}}),
     "queues.prod.max.cpu: expected a quantity such as 8, 500m or 64Gi, got '8 cores'"),
    ("negative-memory", q({"prod": {"max": {"memory": "-1Gi"}}}),
     "queues.prod.max.memory: must not be negative, got '-1Gi'"),
    ("cpu-guarantee-above-max", q({"prod": {"guaranteed": {"cpu": "1500m"}, "max": {"cpu": 1}}}),
     "queues.prod.max: cpu 1 is below guaranteed 1500"),
    ("bad-weight", q({"prod": {"weight": -1}}), "queues.prod.weight: must be 0 or more (and finite), got -1"),
    ("weight-not-number", q({"prod": {"weight": "heavy"}}), "queues.prod.weight: expected a number, got 'heavy'"),
    ("priority-not-int", q({"prod": {"priority": 1.5}}), "queues.prod.priority: expected an integer, got 1.5"),
    ("fence-not-bool", q({"prod": {"preemption": {"fence": "yes"}}}),
     "queues.prod.preemption.fence: expected true or false, got 'yes'"),
    ("bad-queue-name", q({"pro d": {}}), "queues.pro d: invalid queue name (letters, digits, '_' and '-' only)"),
    ("queue-not-mapping", q({"prod": 8}), "queues.prod: expected a mapping, got int"),
    ("negative-price", {"gpu_types": {"H100": {"price_per_hour": -1}}, "queues": {}},
     "gpu_types.H100.price_per_hour: must not be negative, got -1"),
    ("unknown-type-key", {"gpu_types": {"H100": {"price": 1}}, "queues": {}},
     "gpu_types.H100.price: unknown key (expected one of equivalent, node_labels, price_per_hour)"),
    ("label-two-types", {"gpu_types": {"H100": {"node_labels": ["X"]}, "H200": {"node_labels": ["X"]}},
                         "queues": {}},
     "gpu_types.H200.node_labels: 'X' already means H100"),
    ("mapping-unknown-queue", q({"prod": {}}, mapping={"namespaces": {"ml": "research.visio"}}),
     "mapping.namespaces.ml: unknown queue 'research.visio'; leaf queues: prod"),
    ("mapping-parent-queue", q({"a": {"queues": {"b": {}}}}, mapping={"default": "a"}),
     "mapping.default: queue 'a' is not a leaf (only leaf queues take pods)"),
    ("mapping-unknown-key", q({"prod": {}}, mapping={"label": ["x"]}),
     "mapping.label: unknown key (expected one of annotations, default, labels, local_queues, namespaces)"),
]


@pytest.mark.parametrize("data,message", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid_config_names_the_place(data: dict[str, Any], message: str) -> None:
    with pytest.raises(QueueConfigError) as err:
        parse_queue_config(data)
    assert str(err.value) == message
    assert err.value.where == message.split(": ", 1)[0]


VALID = [
    ("format-md-example", BASE_QUEUES),
    ("no-gpu-types-any-type-allowed", {"queues": {"a": {"max": {"gpu/B200": 4}}}}),
    ("children-fill-parent-exactly",
     q({"r": {"guaranteed": {"gpu": 24}, "queues": {"a": {"guaranteed": {"gpu": 16}}, "b": {"guaranteed": {"gpu": 8}}}}})),
    ("parent-without-guarantee", q({"r": {"queues": {"a": {"guaranteed": {"gpu": 16}}}}})),
    ("cpu-and-memory-suffixes", q({"a": {"guaranteed": {"cpu": "500m", "memory": "64Gi"},
                                         "max": {"cpu": 8, "memory": 137438953472}}})),
    ("scenario-extra-top-keys", {"name": "x", "nodes": [], "workloads": [], "queues": {"a": {}}}),
]


@pytest.mark.parametrize("data", [c[1] for c in VALID], ids=[c[0] for c in VALID])
def test_valid_configs_parse(data: dict[str, Any]) -> None:
    assert isinstance(parse_queue_config(data), QueueConfig)


def test_parsed_values() -> None:
    c = parse_queue_config(q({"a": {"guaranteed": {"cpu": "500m", "memory": "1Gi", "gpu": 2}, "weight": 2,
                                    "priority": 3, "preemption": {"fence": True}, "strict_fifo": True}},
                             mapping={"namespaces": {"ml": "a"}, "default": "a", "labels": ["team"]}))
    a = c.queues["a"]
    assert dict(a.guaranteed) == {"cpu": 500, "memory": 2**30, "gpu": 2}
    assert (a.weight, a.priority, a.preemption_fence, a.strict_fifo) == (2.0, 3, True, True)
    assert c.mapping.labels == ("team",) and dict(c.mapping.namespaces) == {"ml": "a"}
    assert c.gpu_types["H100"].price_per_hour == 4.0
    assert c.root.children == ("a",)


def test_strict_top_refuses_unknown_sections() -> None:
    with pytest.raises(QueueConfigError, match=r"^\(top\)\.queus: unknown key"):
        parse_queue_config({"queus": {}}, strict_top=True)


def test_load_reports_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "queues.yaml"
    f.write_text("gpu_types:\n  H100: {}\nqueues:\n  research:\n    queues:\n      vision:\n"
                 "        guaranteed: {gpu/H100: 16}\n        max: {gpu/H100: 8}\n")
    with pytest.raises(QueueConfigError) as err:
        load_queue_config(f)
    assert str(err.value) == "queues.research.vision.max: gpu/H100 8 is below guaranteed 16"
    assert err.value.located() == f"{f}:8: queues.research.vision.max: gpu/H100 8 is below guaranteed 16"


class FakeFs:
    def __init__(self) -> None:
        self.text: str | None = None
        self.mtime = 0
        self.reads = 0

    def write(self, text: str) -> None:
        self.text, self.mtime = text, self.mtime + 1

    def stat(self, _: Path) -> tuple[int, int] | None:
        return None if self.text is None else (self.mtime, len(self.text))

    def read(self, _: Path) -> str:
        self.reads += 1
        assert self.text is not None
        return self.text


GOOD = "queues:\n  a: {guaranteed: {gpu: 4}}\n"
GOOD2 = "queues:\n  a: {guaranteed: {gpu: 8}}\n"
BAD = "queues:\n  a: {guaranteed: {gpu: 8}, max: {gpu: 4}}\n"


def test_watcher_reloads_and_keeps_last_good() -> None:
    fs = FakeFs()
    w = QueueConfigWatcher("q.yaml", stat=fs.stat, read=fs.read)
    assert w.poll() is Reload.REJECTED and w.config is None and "file not found" in str(w.error)
    fs.write(GOOD)
    assert w.poll() is Reload.LOADED and w.error is None
    assert w.config is not None and w.config.queues["a"].guaranteed["gpu"] == 4
    assert w.poll() is Reload.UNCHANGED and fs.reads == 1           # stat unchanged: no read
    fs.write(GOOD)
    assert w.poll() is Reload.UNCHANGED and w.generation == 1       # same bytes: no reload
    fs.write(BAD)
    assert w.poll() is Reload.REJECTED
    assert w.config.queues["a"].guaranteed["gpu"] == 4               # last good kept
    assert w.error is not None and w.error.located() == "q.yaml:2: queues.a.max: gpu 4 is below guaranteed 8"
    assert w.poll() is Reload.UNCHANGED and w.error is not None
    fs.write(GOOD2)
    assert w.poll() is Reload.LOADED and w.error is None and w.generation == 2
    assert w.config.queues["a"].guaranteed["gpu"] == 8


def test_watcher_invalid_yaml_has_line() -> None:
    fs = FakeFs()
    fs.write("queues:\n  a: [\n")
    w = QueueConfigWatcher("q.yaml", stat=fs.stat, read=fs.read)
    assert w.poll() is Reload.REJECTED
    assert w.error is not None and w.error.line is not None and "invalid YAML" in w.error.reason


def test_watcher_on_a_real_file(tmp_path: Path) -> None:
    f = tmp_path / "q.yaml"
    f.write_text(GOOD)
    w = QueueConfigWatcher(f)
    assert w.poll() is Reload.LOADED
    f.write_text(BAD + "# longer\n")
    assert w.poll() is Reload.REJECTED and w.config is not None


def test_base_config_is_not_mutated() -> None:
    before = copy.deepcopy(BASE_QUEUES)
    parse_queue_config(BASE_QUEUES)
    assert BASE_QUEUES == before


def test_within_queue_and_min_runtime_are_inherited_and_may_be_set_back() -> None:
    """A department's ``within_queue`` and ``min_runtime_s`` are its queues' unless a queue sets its
    own (``never``, 0: back to the defaults); a placement-made queue has its parent's."""
    cfg = parse_queue_config({"queues": {
        "research": {"within_queue": "lower_priority", "min_runtime_s": 600, "queues": {
            "nlp": {}, "vision": {"within_queue": "never", "min_runtime_s": 0},
            "tenants": {"placement": {"namespace_queues": True, "template": {"max": {"gpu": 4}}}}}},
        "prod": {}}})
    qs = cfg.queues
    assert (qs["research.nlp"].within_queue, qs["research.nlp"].min_runtime_s) == (True, 600.0)
    assert (qs["research.vision"].within_queue, qs["research.vision"].min_runtime_s) == (False, 0.0)
    assert (qs["prod"].within_queue, qs["prod"].min_runtime_s) == (False, 0.0)
    assert qs["research.tenants"].within_queue and qs["research.tenants"].min_runtime_s == 600.0
