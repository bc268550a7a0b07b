"""libFuzzer over the device's frame parser + dispatcher (tools/fuzz): a bounded run must find no crash."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUN_FUZZ = ROOT / "tools" / "fuzz" / "run_fuzz.py"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("clang") is None, reason="clang not installed")
def test_fuzz_serial_no_crash(tmp_path):
    cmd = [sys.executable, str(RUN_FUZZ), "--runs", "120000", "--seconds", "45", "--workdir", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    if result.returncode == 2 and "libFuzzer" in result.stderr:
        pytest.skip(result.stderr.strip())
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    match = re.search(r"fuzz_serial: (\d+) executions in [\d.]+ s \((\d+) exec/s\), 0 crashes", result.stdout)
    assert match, result.stdout
    assert int(match.group(1)) >= 100_000


def test_run_fuzz_explains_missing_clang(tmp_path):
    env = {"PATH": str(tmp_path)}  # an empty PATH: no clang anywhere
    result = subprocess.run(
        [sys.executable, str(RUN_FUZZ), "--workdir", str(tmp_path)], capture_output=True, text=True, env=env
    )
    assert result.returncode == 2
    assert "clang not found — install clang and libFuzzer" in result.stderr
