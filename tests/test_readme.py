"""README.md says what the code does: every ```yaml block loads through gpuq's own loader, every
command of the ```sh blocks either runs here (in a temporary directory, on a chDB store of its
own) or is listed in NOT_RUN with the reason, every row of the command table names a command and
options that exist, and each error message the README quotes is the one the code prints."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from accounting.queues import load_queue_config
from gpuq.settings import load_settings
from tests.conftest import REPO, SCENARIOS

README = (REPO / "README.md").read_text()
BIN = Path(sys.executable).parent
GPUQ = BIN / "gpuq"

# Commands of the ```sh blocks that this test does not run, by their start, and why.
NOT_RUN = {
    "make demo": "starts Ray, gpuq serve and the dashboards until Ctrl-C (tests/test_demo.py runs gpuq demo)",
    "make test": "the whole suite, which contains this test",
    "make setup": "creates .venv and installs packages (the suite already runs inside it)",
    ".venv/bin/ray start": "starts a Ray head (the Ray collector tests start their own)",
    ".venv/bin/gpuq collect": "needs the Ray head above (tests/test_cli_collect.py runs collect)",
    ".venv/bin/gpuq serve": "runs until stopped (tests/test_serve.py and the browser test run it)",
    ".venv/bin/gpuq dashboard": "runs until stopped (tests/test_dashboards_browser.py runs it)",
}


def blocks(lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", README, re.S | re.M)


def commands(block: str) -> list[str]:
    """Split an sh block into commands: ``\\`` continuations, quotes across lines and here-documents
    stay in one command; trailing ``# comments`` go."""
    out: list[str] = []
    lines = block.splitlines()
    i = 0
    while i < len(lines):
        cmd = lines[i]
        heredoc = re.search(r"<<-?'?(\w+)'?", cmd)
        while cmd.endswith("\\") or cmd.count('"') % 2 or cmd.count("'") % 2 and not heredoc:
            i += 1
            cmd += "\n" + lines[i]
        if heredoc:
            while lines[i] != heredoc.group(1):
                i += 1
                cmd += "\n" + lines[i]
        else:
            cmd = re.sub(r"\s+#\s.*$", "", cmd)
        if cmd.strip():
            out.append(cmd.strip())
        i += 1
    return out


def run(cmd: str | list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUQ_")}
    if isinstance(cmd, str):
        cmd = ["bash", "-euo", "pipefail", "-c", cmd.replace(".venv/bin/", f"{BIN}/")]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    if check:
        assert proc.returncode == 0, f"{cmd} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def quoted_after(lead: str) -> str:
    """The `code` quoted right after ``lead`` in the README, its line breaks made spaces."""
    m = re.search(re.escape(lead) + r"\s*`([^`]+)`", README)
    assert m, f"README no longer quotes a message after {lead!r}"
    return " ".join(m.group(1).split())


# ---------------------------------------------------------------------------------------------
# YAML blocks


def test_the_readme_has_its_blocks() -> None:
    assert len(blocks("yaml")) == 2 and len(blocks("sh")) >= 2


def test_the_debian_packages_are_the_makefiles() -> None:
    """The setup paragraph names each Debian package `make` installs, and no other."""
    makefile = (REPO / "Makefile").read_text()
    m = re.search(r"^DEB_PACKAGES := (.+)$", makefile, re.M)
    assert m, "the Makefile no longer sets DEB_PACKAGES"
    para = README.split("## The two commands", 1)[1].split("```", 1)[0]
    named = set(re.findall(r"`([a-z][a-z-]+)` \(", para))           # `package` (what it is for)
    assert named == set(m.group(1).split()), para


def test_settings_block_loads(tmp_path: Path) -> None:
    (settings_block,) = [b for b in blocks("yaml") if b.startswith("store:")]
    path = tmp_path / "gpuq.yaml"
    path.write_text(settings_block)
    s = load_settings(path)
    assert s.store.dsn == "chdb:///var/lib/gpuq" and s.store.ttl_days == 90
    assert s.collector.ray[0].cluster == "demo" and s.collector.dcgm[0].urls == ["http://node-1:9400/metrics"]
    assert s.queues_file == str(tmp_path / "queues.yaml")          # relative to the settings file
    assert s.accounting.idle_window_s == 1800 and s.scheduler.actuator == "dry-run"
    assert s.api.tokens[0].role == "operator" and s.api.tokens[0].queues == ["research"]


def test_queue_file_block_loads(tmp_path: Path) -> None:
    (queue_block,) = [b for b in blocks("yaml") if b.startswith("gpu_types:")]
    path = tmp_path / "queues.yaml"
    path.write_text(queue_block)
    config = load_queue_config(path)
    assert {"research", "research.vision", "prod"} <= set(config.queues)
    assert dict(config.mapping.namespaces) == {"team-vision": "research.vision"}
    assert config.gpu_types["H100"].price_per_hour == 4.0


def test_environment_variables_override_the_file(monkeypatch: pytest.MonkeyPatch) -> None:
    pairs = dict(re.findall(r"`(GPUQ_\w+)=([^`\s]+)`", README))
    assert set(pairs) == {"GPUQ_STORE__DSN", "GPUQ_COLLECTOR__INTERVAL_S"}
    for k, v in pairs.items():
        monkeypatch.setenv(k, v)
    s = load_settings()
    assert s.store.dsn == pairs["GPUQ_STORE__DSN"]
    assert s.collector.interval_s == float(pairs["GPUQ_COLLECTOR__INTERVAL_S"])


# ---------------------------------------------------------------------------------------------
# Quoted errors: the README quotes what the code prints


def test_broken_queue_file_error_is_the_quoted_one(tmp_path: Path) -> None:
    (queue_block,) = [b for b in blocks("yaml") if b.startswith("gpu_types:")]
    change = quoted_after("had `vision` said")                          # guaranteed: {gpu/H100: 16}
    broken = queue_block.replace("vision: {guaranteed: {gpu: 16}", f"vision: {{{change}")
    assert broken != queue_block
    (tmp_path / "queues.yaml").write_text(broken)
    (tmp_path / "gpuq.yaml").write_text("store: {dsn: 'chdb://.gpuq/data'}\nqueues_file: queues.yaml\n")
    proc = run([str(GPUQ), "queues", "--config", "gpuq.yaml"], tmp_path, check=False)
    assert proc.returncode != 0
    expected = quoted_after("`gpuq queues` would stop with")
    assert f"/{expected}" in " ".join(proc.stderr.split()), proc.stderr


def test_settings_error_is_the_quoted_one(tmp_path: Path) -> None:
    expected = quoted_after("Errors name the place:")
    (try_it,) = [b for b in blocks("sh") if "cat > gpuq.yaml" in b]
    settings = re.search(r"<<'YAML'\n(.*?)^YAML$", try_it, re.S | re.M)
    assert settings
    broken = settings.group(1).replace("- cluster: demo\n      dashboard_url", "- dashboard_url")
    assert broken != settings.group(1)
    (tmp_path / "gpuq.yaml").write_text(broken)
    proc = run([str(GPUQ), "migrate", "--config", "gpuq.yaml"], tmp_path, check=False)
    assert proc.returncode != 0 and expected in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------
# sh blocks


def test_every_command_is_run_or_says_why_not(tmp_path: Path) -> None:
    ran = []
    for block in blocks("sh"):
        for cmd in commands(block):
            if any(cmd.startswith(prefix) for prefix in NOT_RUN):
                continue
            run(cmd, tmp_path)
            ran.append(cmd)
    assert any(c.startswith(".venv/bin/gpuq query") for c in ran), ran
    assert (tmp_path / ".gpuq" / "data").is_dir()                  # the query opened the embedded store


def test_not_run_entries_are_all_in_the_readme() -> None:
    cmds = [c for b in blocks("sh") for c in commands(b)]
    for prefix in NOT_RUN:
        assert any(c.startswith(prefix) for c in cmds), f"{prefix!r} is no longer in README.md"


# ---------------------------------------------------------------------------------------------
# The command table: each row's command and options exist; the ones without a cluster run.

# the first cell of each row whose command starts `gpuq`: one or more `code` commands (`\|` in
# them is a literal |)
CELLS = re.findall(r"^\| (`gpuq .*?`) \| ", README, re.M)
ROWS = [c.replace("\\|", "|") for cell in CELLS for c in re.findall(r"`(gpuq [^`]*)`", cell)]


def test_command_table_is_read() -> None:
    names = {r.split()[1] for r in ROWS}
    assert {"collect", "query", "migrate", "queues", "usage", "simulate", "import-trace", "serve",
            "workloads"} <= names


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.split()[1])
def test_command_and_options_exist(row: str, tmp_path: Path) -> None:
    name = row.split()[1]
    proc = run([str(GPUQ), name, "--help"], tmp_path)
    for option in re.findall(r"--[a-z][a-z-]*", row):
        assert option in proc.stdout, f"{row}: {option} is not in `gpuq {name} --help`"
    for value in re.findall(r"\[--\w+ ([a-z|]+)\]", row):      # listed choices, e.g. table|json|csv
        for choice in value.split("|"):
            assert choice in proc.stdout, f"{row}: {choice} is not in `gpuq {name} --help`"


def test_table_commands_without_a_cluster_run(tmp_path: Path) -> None:
    (queue_block,) = [b for b in blocks("yaml") if b.startswith("gpu_types:")]
    (tmp_path / "queues.yaml").write_text(queue_block)
    (tmp_path / "gpuq.yaml").write_text("store: {dsn: 'chdb://.gpuq/data'}\nqueues_file: queues.yaml\n")
    cfg = ["--config", "gpuq.yaml"]
    out = run([str(GPUQ), "migrate", *cfg], tmp_path).stdout
    assert "gpuq" in out
    rows = run([str(GPUQ), "query", *cfg, "--format", "json", "SELECT 1 AS one"], tmp_path).stdout
    assert '"one": 1' in rows
    capacity = run([str(GPUQ), "queues", *cfg, "--show", "capacity"], tmp_path)
    assert capacity.returncode == 0
    usage = run([str(GPUQ), "usage", *cfg, "--from", "-7d", "--to", "now", "--by", "queue,gpu_type",
                 "--format", "json"], tmp_path).stdout
    assert usage.strip().startswith("[")
    run([str(GPUQ), "simulate", str(SCENARIOS / "classic-60-40.yaml"), "--out", "run"], tmp_path)
    assert (tmp_path / "run" / "events.jsonl").is_file() and (tmp_path / "run" / "summary.json").is_file()
    run([str(GPUQ), "simulate", str(SCENARIOS / "classic-60-40.yaml"), "--out", "cmp",
         "--compare", str(REPO / "deploy" / "demo" / "compare-queues.yaml")], tmp_path)
    trace = REPO / "tests" / "data" / "traces" / "alibaba-gpu-v2023"
    run([str(GPUQ), "import-trace", "alibaba-v2023", str(trace), "--out", "scenario.yaml",
         "--queues", "hash:8", "--limit", "40"], tmp_path)
    assert (tmp_path / "scenario.yaml").read_text().startswith("# gpuq import-trace")
