"""The model directory: what `compile` writes and `build` / `flash` / `validate` read.

    model.json          the trained + quantized artefact (data only, rebuilds the host reference)
    report.json         compile report (ledger, accuracies, hyper-parameters)
    test_vectors.npz    held-out vectors: raw float32, int8 inputs, true labels, reference scores and labels
    platformio.ini, src/, include/, lib/, test/   the PlatformIO project
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from tinyproto.errors import TinyprotoError

MODEL_FORMAT = "tinyproto-model"
MODEL_FORMAT_VERSION = 1


@dataclass(frozen=True)
class TestVectors:
    X_raw: np.ndarray  # float32 (n, d)
    xq: np.ndarray  # int8 (n, d): what the device receives
    y: np.ndarray  # int64 (n,): true class index
    scores: np.ndarray  # int64 (n, L): host reference scores
    labels: np.ndarray  # int64 (n,): host reference class index

    def save(self, path: Path) -> None:
        np.savez(path, X_raw=self.X_raw, xq=self.xq, y=self.y, scores=self.scores, labels=self.labels)

    @classmethod
    def load(cls, path: Path) -> "TestVectors":
        with np.load(path, allow_pickle=False) as data:
            return cls(*(data[k] for k in ("X_raw", "xq", "y", "scores", "labels")))


@dataclass(frozen=True)
class ModelDir:
    path: Path
    meta: dict  # model.json
    report: dict  # report.json

    @property
    def model_hash(self) -> int:
        return int(self.meta["model_hash"], 16)

    def int_model(self):
        from tinyproto.families import int_model_from_json

        return int_model_from_json(self.meta["int_model"])

    def vectors(self) -> TestVectors:
        return TestVectors.load(self.path / "test_vectors.npz")


def write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


def load_model_dir(path: Path) -> ModelDir:
    path = Path(path)
    meta_path = path / "model.json"
    if not meta_path.is_file():
        raise TinyprotoError(f"{path} is not a tinyproto model directory (no model.json); run `tinyproto compile` first")
    meta = json.loads(meta_path.read_text())
    if meta.get("format") != MODEL_FORMAT or meta.get("format_version") != MODEL_FORMAT_VERSION:
        raise TinyprotoError(f"{meta_path}: not a tinyproto model of format version {MODEL_FORMAT_VERSION}")
    report_path = path / "report.json"
    report = json.loads(report_path.read_text()) if report_path.is_file() else {}
    return ModelDir(path, meta, report)


@contextmanager
def atomic_directory(out: Path) -> Iterator[Path]:
    """Yield a scratch directory that replaces `out` only if the block succeeds: no half-written output.

    An existing `out` is replaced only when it is empty or a previous tinyproto model directory.
    """
    out = Path(out).resolve()
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not (out / "model.json").is_file())):
        raise TinyprotoError(f"{out} exists and is not a tinyproto model directory; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    scratch.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary directory
    try:
        yield scratch
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    if out.exists():
        trash = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, trash / "old")
        shutil.rmtree(trash, ignore_errors=True)
    os.replace(scratch, out)
