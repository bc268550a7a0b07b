"""The shared fixtures cannot carry one test's changes into another, and the suite runs in a random order."""

from __future__ import annotations

import importlib.util
import json
import shutil
import tomllib
from pathlib import Path

from tinyproto.core.outdir import check_output_dir


def test_compiled_hands_out_a_fresh_copy_per_call(compiled):
    first = compiled("iris", "0.5kB", "flynn")
    report = json.loads((first / "report.json").read_text())
    (first / "report.json").write_text("{}")  # what a careless test might do to the directory it got
    shutil.rmtree(first / "include")
    (first / "build.json").write_text("{}")
    second = compiled("iris", "0.5kB", "flynn")
    assert second != first
    assert json.loads((second / "report.json").read_text()) == report
    assert (second / "include").is_dir() and not (second / "build.json").exists()
    check_output_dir(second)  # its manifest still matches: nothing in it was changed


def test_the_test_extras_run_the_suite_in_random_order():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert any(req.startswith("pytest-randomly") for req in pyproject["project"]["optional-dependencies"]["test"])
    assert importlib.util.find_spec("pytest_randomly") is not None, "pip install -e '.[test]' (tools/setup.sh)"
