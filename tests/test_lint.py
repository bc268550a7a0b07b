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


def test_tinyproto_reads_and_writes_text_as_utf8():
    """Every text file tinyproto reads or writes names its encoding: without one Python takes the locale's, so under
    LC_ALL=C a data set named café wrote no header (UnicodeEncodeError, exit 70) and the generated C would depend
    on the locale. Flags write_text / read_text / open / os.fdopen in text mode without encoding=."""
    import ast

    def unnamed(call: ast.Call) -> bool:
        if any(k.arg == "encoding" for k in call.keywords):
            return False
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr in ("write_text", "read_text"):
            return True
        builtin_open = isinstance(f, ast.Name) and f.id == "open"
        os_fdopen = isinstance(f, ast.Attribute) and f.attr == "fdopen" and getattr(f.value, "id", None) == "os"
        if not (builtin_open or os_fdopen):
            return False
        modes = [*call.args[1:2], *(k.value for k in call.keywords if k.arg == "mode")]
        if modes and not isinstance(modes[0], ast.Constant):
            return False  # a mode chosen at run time (binary either way in tinyproto)
        return "b" not in (modes[0].value if modes else "r")

    found = [f"{path.relative_to(ROOT)}:{node.lineno}" for path in sorted((ROOT / "tinyproto").rglob("*.py"))
             for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
             if isinstance(node, ast.Call) and unnamed(node)]
    assert found == [], found
