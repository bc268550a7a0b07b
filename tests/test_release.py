"""The release artefacts: `python -m build` makes an sdist and a wheel (the wheel built from the sdist, so the sdist
is complete), and each installs into a fresh virtualenv outside the checkout and runs tinyproto there.

- the wheel: a plain `pip install` with its dependencies resolved from the configured index (what a user does),
  then the whole demo loop: `tinyproto run iris --budget 1kB` (compile, build with avr-gcc since the base install
  has no PlatformIO, validate on the simulated Uno);
- the sdist: `pip install` of the .tar.gz into a venv without its own pip (pip builds it again), then
  `tinyproto compile iris --budget 1kB`.

Both run from a directory outside the checkout, so `import tinyproto` can only find the installed copy.
Also checked: the license and metadata the wheel declares, and that the data folders are inside it.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA_FOLDERS = ("templates", "firmware", "boards", "tools/simuno", "tools/pio")

pytestmark = [pytest.mark.slow]


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False, **kwargs)
    assert result.returncode == 0, (command, result.stdout[-3000:], result.stderr[-3000:])
    return result


def _fresh_venv(where: Path, with_pip: bool = True) -> Path:
    """A new virtualenv; with_pip=False skips ensurepip (4 s of CPU) where the test venv's pip installs into it."""
    _run([sys.executable, "-m", "venv", str(where), *(() if with_pip else ("--without-pip",))])
    return where / "bin"


def _env(home: Path, bin_dir: Path) -> dict:
    return {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
            "TINYPROTO_CACHE": os.environ.get("TINYPROTO_CACHE", str(Path.home() / ".cache" / "tinyproto")),
            **{k: v for k, v in os.environ.items() if k.startswith(("PIP_", "SSL_"))}}


def test_build_gives_an_sdist_and_a_wheel_with_the_data_and_the_license(release_dist):
    sdists, wheels = sorted(release_dist.glob("tinyproto-*.tar.gz")), sorted(release_dist.glob("tinyproto-*.whl"))
    assert len(sdists) == 1 and len(wheels) == 1
    with zipfile.ZipFile(wheels[0]) as wheel:
        names = wheel.namelist()
        metadata = wheel.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    for folder in DATA_FOLDERS:
        assert any(n.startswith(f"tinyproto/_data/{folder}/") for n in names), folder
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert "License-Expression: MIT AND MIT-0" in metadata
    for family in ("ProtoNN", "FlyNN", "BNC", "Bloom"):
        assert family in metadata.split("\n", 4)[3]  # the Summary line names the four families


@pytest.mark.device
def test_wheel_installs_in_a_fresh_venv_and_runs_the_demo(release_dist, tmp_path):
    # installed into by this interpreter's pip (ensurepip's own, as the new venv's would be; 3.7 s of CPU fewer): it
    # resolves the wheel's dependencies from the configured index into the new venv as that one would
    bin_dir = _fresh_venv(tmp_path / "venv", with_pip=False)
    wheel = next(release_dist.glob("tinyproto-*.whl"))
    # --no-compile: pip does not byte-compile the dependencies' thousands of modules at install (12 s of CPU of
    # this test's 20; Python compiles what the demo imports when it imports it), the resolution is the same
    _run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "-q", "--no-compile",
          str(wheel)], cwd=tmp_path, env=_env(tmp_path, bin_dir))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _env(tmp_path, bin_dir)
    where = _run([str(bin_dir / "python"), "-c", "import tinyproto, sys; print(tinyproto.__file__)"], cwd=elsewhere,
                 env=env).stdout
    assert str(tmp_path / "venv") in where and str(ROOT) not in where
    _run([str(bin_dir / "tinyproto"), "run", "iris", "--budget", "1kB", "--out", "m"], cwd=elsewhere, env=env)
    summary = json.loads((elsewhere / "m" / "validation.json").read_text())
    assert summary["passed"] and summary["score_agreement"] == 1.0 and summary["complete"]


def test_sdist_installs_in_a_fresh_venv_and_compiles(release_dist, tmp_path):
    bin_dir = _fresh_venv(tmp_path / "venv", with_pip=False)  # installed into by this interpreter's pip
    # the dependencies are the wheel test's business; here, the sdist itself must build and carry every file
    purelib = Path(_run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]
                        ).stdout.strip())
    (purelib / "borrowed-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    sdist = next(release_dist.glob("tinyproto-*.tar.gz"))
    _run([sys.executable, "-m", "pip", "--python", str(bin_dir / "python"), "install", "-q", "--no-deps", str(sdist)],
         cwd=tmp_path, env=_env(tmp_path, bin_dir))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = _env(tmp_path, bin_dir)
    _run([str(bin_dir / "tinyproto"), "compile", "iris", "--budget", "1kB", "--out", "m"], cwd=elsewhere, env=env)
    report = json.loads((elsewhere / "m" / "report.json").read_text())
    assert report["model_bytes"] <= 1024 and (elsewhere / "m" / "include" / "tinyproto_model.h").is_file()
