"""The code base passes its linter: `ruff check` over tinyproto/, tests/ and tools/ with the rule set and line
length in pyproject.toml ([tool.ruff]). Skipped only where ruff is not installed (the test extras install it)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str] | None:
    beside_python = Path(sys.executable).with_name("ruff")
    if beside_python.is_file():
        return [str(beside_python)]
    found = shutil.which("ruff")
    return [found] if found else None


def test_ruff_finds_nothing():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff not installed (pip install -e '.[test]')")
    result = subprocess.run([*ruff, "check", "--no-cache", "--output-format", "concise", "tinyproto", "tests", "tools"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_rule_set_is_stated_in_pyproject():
    import tomllib

    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ruff"]
    assert config["line-length"] == 120
    assert {"E9", "F", "E501"} <= set(config["lint"]["select"])  # E501: the line length above is enforced


def test_no_test_file_imports_another():
    """Shared test code lives in tests/helpers.py (and fixtures in conftest.py): a test file that imports another
    runs that file's module-level code and couples two subjects."""
    import ast

    offenders = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("test_"):
                offenders.append(f"{path.name}:{node.lineno} imports {node.module}")
            elif isinstance(node, ast.Import):
                offenders += [f"{path.name}:{node.lineno} imports {a.name}" for a in node.names
                              if a.name.startswith("test_")]
    assert offenders == []
