"""Compile a generated model with the host C compiler and run it: the host half of the equivalence tests.

Layer: device."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.render import family_runtime
from tinyproto.core.resources import resource_dir

HOST_CFLAGS = ["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-pedantic"]


def build_host_runner(project_dir: Path, out: Path, family: str, cc: str = "gcc") -> Path:
    """Compile tools/host_runner.c + the project's runtime for the host; returns the executable."""
    if shutil.which(cc) is None:
        raise TinyprotoError(f"host C compiler {cc!r} not found (apt-get install gcc)")
    lib = project_dir / "lib" / "tinyproto"
    sources = [resource_dir("tools") / "host_runner.c", lib / "tp_input.c", lib / "tp_judge.c",
               lib / family_runtime(family)]
    cmd = [cc, *HOST_CFLAGS, f"-I{project_dir / 'include'}", f"-I{lib}", *map(str, sources), "-lm", "-o", str(out)]
    result = subprocess.run(cmd, capture_output=True, encoding="utf-8", errors="replace")
    if result.returncode != 0:
        raise TinyprotoError(f"host build of the generated C failed:\n{result.stderr.strip()}")
    return out


def run_int8(runner: Path, xq: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Labels (n,) and int32 scores (n, L) the host-compiled C returns for int8 vectors."""
    data = np.ascontiguousarray(xq, dtype=np.int8).tobytes()
    out = subprocess.run([str(runner)], input=data, capture_output=True, check=True).stdout.decode()
    rows = np.array([line.split() for line in out.splitlines()], dtype=np.int64)
    return rows[:, 0], rows[:, 1:]


def run_raw(runner: Path, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The C input stage and prediction on float32 raw features: (xq (n, d), labels, scores)."""
    data = np.ascontiguousarray(X, dtype="<f4").tobytes()
    out = subprocess.run([str(runner), "raw"], input=data, capture_output=True, check=True).stdout.decode()
    xs, preds = [], []
    for line in out.splitlines():
        left, right = line.split("|")
        xs.append(left.split())
        preds.append(right.split())
    xq = np.array(xs, dtype=np.int64).astype(np.int8)
    pred = np.array(preds, dtype=np.int64)
    return xq, pred[:, 0], pred[:, 1:]
