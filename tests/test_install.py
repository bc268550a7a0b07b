"""A real install: the wheel, installed into a fresh virtualenv outside the checkout, runs the whole loop.

The wheel is the release's (conftest's release_dist: `python -m build` of a copy of the tracked files, so nothing
is written into the checkout; made once per run, test_release installs it too) and is installed without
dependencies; the fresh venv borrows them from the test venv's site-packages through a
plain path entry (no editable-install hooks), so `import tinyproto` can only find the installed wheel.
"""

from __future__ import annotations

import json
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, **kwargs)
    assert result.returncode == 0, (command, result.stdout[-2000:], result.stderr[-2000:])
    return result


@pytest.fixture(scope="module")
def installed(tmp_path_factory, release_dist) -> Path:
    work = tmp_path_factory.mktemp("install")
    wheel = next(release_dist.glob("tinyproto-*.whl"))
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    target = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    _run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)])
    (target / "borrowed-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return venv


def test_wheel_carries_the_data_folders(installed, tmp_path):
    python = installed / "bin" / "python"
    where = _run([str(python), "-c", "import tinyproto.core.resources as r; print(r.resource_dir('firmware'))"],
                 cwd=tmp_path).stdout  # not the checkout: `python -c` imports from its working directory first
    assert "/_data/firmware" in where and str(ROOT) not in where


def test_installed_wheel_runs_the_loop_outside_the_checkout(installed, tmp_path):
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    env = {"PATH": f"{installed / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
           "TINYPROTO_CACHE": str(tmp_path / "cache")}
    python = str(installed / "bin" / "python")
    _run([python, "-m", "tinyproto", "run", "iris", "--budget", "1kB", "--out", "m"], cwd=cwd, env=env)
    summary = json.loads((cwd / "m" / "validation.json").read_text())
    assert summary["passed"] and summary["score_agreement"] == 1.0
    # portable: the project names neither the venv nor the home nor the cache (see tests/test_portable.py)
    ini = (cwd / "m" / "platformio.ini").read_text()
    assert str(installed) not in ini and str(tmp_path) not in ini and "platform = tinyproto-avr" in ini
    installed_platform = tmp_path / "cache" / "pio-core" / "platforms" / "tinyproto-avr"
    assert (installed_platform / "builder" / "frameworks" / "arduino.py").is_file()  # shipped in the wheel
