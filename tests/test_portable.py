"""Portable model directories: no path of the checkout, the virtualenv, the cache or a home directory in any file
tinyproto writes, and a model directory copied to another path, or to another user with another home, builds and
validates there with tinyproto, and with `pio run` / `pio test` run by hand in the directory.

Every command runs in a child process with its own HOME and no TINYPROTO_CACHE, the way a user runs it: the
PlatformIO home is the one the generated platformio.ini names (`core_dir = ~/.cache/tinyproto/pio-core`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import site
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tinyproto.core.resources import IMPORT_ROOT

from helpers import other_user_python

pytestmark = [
    pytest.mark.skipif(shutil.which("avr-gcc") is None, reason="avr-gcc not installed"),
    pytest.mark.skipif(not Path("/usr/include/simavr/sim_avr.h").is_file(), reason="libsimavr-dev not installed"),
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("platformio", "SCons")),
                       reason="platformio / scons not installed"),
]

# An absolute path in text: "/" starting a word, then a name and another "/". The only ones allowed are
# example device paths in comments (/dev/ttyACM0).
ABSOLUTE_PATH = re.compile(r"(?:^|[^A-Za-z0-9_.)}*/<>-])(/[A-Za-z_][A-Za-z0-9_.-]*/)")
ALLOWED_ROOTS = {"/dev/"}
RUNUSER = shutil.which("runuser") or "runuser"  # /usr/sbin: not on a user's PATH


def text_files(directory: Path) -> dict[str, str]:
    """Every text file of a model directory, except PlatformIO's build cache (.pio: object files, SCons's database)."""
    out = {}
    for path in sorted(directory.rglob("*")):
        rel = path.relative_to(directory)
        if not path.is_file() or rel.parts[0] == ".pio":
            continue
        data = path.read_bytes()
        if b"\0" in data:
            continue  # binary (test_vectors.npz)
        out[rel.as_posix()] = data.decode("utf-8", "replace")
    return out


def assert_no_absolute_path(directory: Path, *forbidden: str) -> None:
    needles = {str(IMPORT_ROOT), sys.prefix, sys.base_prefix, str(Path(sys.executable).parent), str(Path.home()),
               *forbidden}
    files = text_files(directory)
    assert "platformio.ini" in files and "model.json" in files
    for name, text in files.items():
        for needle in needles:
            assert needle not in text, f"{name} holds {needle}"
        roots = set(ABSOLUTE_PATH.findall(text)) - ALLOWED_ROOTS
        assert not roots, f"{name} holds absolute paths starting {sorted(roots)}"


def user_env(home: Path, python_path: list[str]) -> dict[str, str]:
    """A user's environment: own HOME, no tinyproto or PlatformIO variables, tinyproto importable."""
    return {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "PYTHONPATH": os.pathsep.join(python_path)}


def run(command: list[str], env: dict[str, str], cwd: Path, user: str | None = None) -> str:
    if user is not None:
        command = [RUNUSER, "-u", user, "--", "env", *[f"{k}={v}" for k, v in env.items()], *command]
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result.stdout


def build_validate_and_pio(python: str, model: Path, env: dict[str, str], user: str | None = None) -> None:
    """tinyproto build + validate, then `pio run -e uno_offline` and `pio test -e uno_sim` in the directory."""
    run([python, "-m", "tinyproto", "build", str(model)], env, model.parent, user)
    run([python, "-m", "tinyproto", "validate", str(model), "--json"], env, model.parent, user)
    summary = json.loads((model / "validation.json").read_text())
    assert summary["passed"] and summary["score_agreement"] == 1.0 and summary["label_agreement"] == 1.0
    out = run([python, "-m", "platformio", "run", "-e", "uno_offline"], env, model, user)
    assert "SUCCESS" in out
    assert (model / ".pio" / "build" / "uno_offline" / "firmware.hex").is_file()
    out = run([python, "-m", "platformio", "test", "-e", "uno_sim"], env, model, user)
    assert "8 test cases: 8 succeeded" in out, out[-2000:]


@pytest.fixture(scope="module")
def model(compiled) -> Path:
    return compiled("iris", "1kB")


def copy_model(source: Path, target: Path) -> Path:
    shutil.copytree(source, target, ignore=shutil.ignore_patterns(".pio"))
    return target


def test_a_fresh_model_directory_names_no_absolute_path(model, tmp_path):
    assert_no_absolute_path(model, str(model.parent), os.environ.get("TINYPROTO_CACHE", str(IMPORT_ROOT)))
    ini = (model / "platformio.ini").read_text()
    assert "core_dir = ~/.cache/tinyproto/pio-core" in ini and "platform = tinyproto-avr" in ini


def test_copied_to_another_path_and_home_it_builds_validates_and_runs_pio(model, tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    moved = copy_model(model, tmp_path / "elsewhere" / "my model")  # a space in the path, too
    env = user_env(home, [str(IMPORT_ROOT), *site.getsitepackages()])
    build_validate_and_pio(sys.executable, moved, env)
    assert (home / ".cache" / "tinyproto" / "pio-core" / "platforms" / "tinyproto-avr" / "platform.json").is_file()
    assert_no_absolute_path(moved, str(model.parent), str(tmp_path), str(home))


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root and runuser")
def test_copied_to_another_user_it_builds_validates_and_runs_pio(model):
    python = other_user_python()
    if python is None:
        pytest.skip("no Python interpreter of this version that the user nobody may run")
    # Outside pytest's tmp_path (mode 0700, root's): a world-traversable directory owned by the other user.
    root = Path(tempfile.mkdtemp(prefix="tinyproto-portable-"))
    try:
        os.chmod(root, 0o755)
        home = root / "home"
        home.mkdir()
        moved = copy_model(model, root / "work" / "model")
        subprocess.run(["chown", "-R", "nobody:nogroup", str(root)], check=True)
        env = user_env(home, [str(IMPORT_ROOT), *site.getsitepackages()])
        build_validate_and_pio(python, moved, env, user="nobody")
        core = home / ".cache" / "tinyproto" / "pio-core"
        assert core.is_dir() and core.owner() == "nobody"  # the other user prepared a PlatformIO home of its own
        assert_no_absolute_path(moved, str(model.parent), str(root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
