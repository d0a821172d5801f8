"""Every module the code imports is declared in pyproject.toml, and every declared dependency is
used (issue 9, item 13): deptry over the packages, the benchmarks and the tests, configured in
pyproject.toml's [tool.deptry]. aiohttp (collector/http.py) used to arrive only through another
package."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def deptry(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "deptry", ".", "--no-ansi", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def test_every_import_is_declared_and_every_dependency_used() -> None:
    r = deptry()
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Success! No dependency issues found." in r.stdout + r.stderr


def test_deptry_catches_an_undeclared_import(tmp_path: Path) -> None:
    """The check can fail: the same pyproject without aiohttp is refused, naming the import."""
    text = (REPO / "pyproject.toml").read_text()
    stripped = "\n".join(line for line in text.splitlines() if not line.strip().startswith('"aiohttp'))
    assert stripped != text
    (tmp_path / "pyproject.toml").write_text(stripped)
    r = deptry("--config", str(tmp_path / "pyproject.toml"))
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert "collector/http.py" in out and "DEP003 'aiohttp' imported but it is a transitive dependency" in out
