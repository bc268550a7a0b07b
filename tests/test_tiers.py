"""The test tiers (CONTRIBUTING.md): the list of measured slow tests names tests that exist, and a listed test is
left out of the fast tier."""

import subprocess
import sys

from conftest import SLOW_LIST, TESTS, measured_slow, nonexistent_tests

ROOT = TESTS.parent


def test_every_listed_slow_test_exists():
    """A renamed or deleted test must leave tests/slow_tests.txt too, or the fast tier would quietly grow."""
    missing = nonexistent_tests(measured_slow())
    assert not missing, f"{SLOW_LIST.name} lists tests that do not exist: {missing}"


def test_a_listed_test_is_not_in_the_fast_tier():
    listed = sorted(n for n in measured_slow() if n.startswith("tests/test_bnc.py::"))
    assert listed, "the check needs one listed test of tests/test_bnc.py"
    result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0", "-p", "no:randomly",
                             "-m", "not device and not slow", "tests/test_bnc.py"],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    collected = set(result.stdout.split())
    assert not collected & set(listed)
    assert any(line.startswith("tests/test_bnc.py::") for line in collected)  # the fast ones stay
