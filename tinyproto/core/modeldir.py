"""The model directory: what `compile` writes and `build` / `flash` / `validate` / `learn` read and add to.

    model.json          the trained + quantized artefact (data only, rebuilds the host reference)
    report.json         compile report (ledger, accuracies, hyper-parameters)
    test_vectors.npz    held-out vectors: raw float32, int8 inputs, true labels, reference scores and labels
    platformio.ini, src/, include/, lib/, test/   the PlatformIO project
    .tinyproto          the manifest: every path tinyproto wrote here (with its sha256 where the content is fixed)
    .tinyproto.lock     held (flock) by the one command that is writing the directory

This module holds the directory's schema: model.json's format and fields, the test vectors, the project's
entries. What tinyproto wrote and may replace (the manifest): core/manifest.py; locks, pre-flight checks and the
atomic swap: core/outdir.py; reading and writing files safely: core/safe_io.py. Layer: core.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.manifest import NAME_MAX, remake_advice
from tinyproto.core.npz_arrays import NpzProblem, read_npz_arrays
from tinyproto.core.strict_json import check_fields
from tinyproto.core.safe_io import file_sha256, open_regular, read_json

MODEL_FORMAT = "tinyproto-model"
MODEL_FORMAT_VERSION = 8
# Format 1 hashed the model under the runtime's former C names (TP_PN_*, TP_FLY_*: prefixes that did not follow the
# family names), so this version cannot check its recorded model hash; such a directory is refused, not trusted.
# Format 2 had no model prefix: its generated header gives every model the same C names (tp_predict), so a build
# would refuse it as edited; it is refused here, with the reason.
# Format 3 had no TP_JUDGE_SCORE_BITS (the confidence stage's width) among its defines, so its recorded model hash
# is not the one this version computes for the same arrays: refused with the reason too, never called "edited".
# Format 4 cut the confidence stage's margin share by a division (TP_JUDGE_SCORE_BITS); format 5 shifts the margin of
# a 16-bit view of the scores (TP_JUDGE_SCORE_BYTE, TP_JUDGE_MARGIN_SHIFT), so a format-4 table means other bins.
# Format 5 read the confidence byte from a 16-byte table of margin bins; format 6 has no table (a doubt halved per
# TP_JUDGE_HALVING of margin: TP_JUDGE_DOUBT), so a format-5 calibration means nothing to this runtime.
# Format 6 FlyNN models had no calibrated count lut (format 7 stores it, and counts scaled by q > 1 as logarithmic
# codes), so a format-6 FlyNN header is not what this version renders from the same model.json.
# Format 7 FlyNN firmware mirrored an input as ~x = -x - 1 for the sign split, format 8 as -x (the float model's
# mirror): the same model.json and header, other winners, so a format-7 directory's vectors and firmware would
# disagree with this version's reference.


MAX_VECTOR_VALUES = 1 << 28  # an array of test_vectors.npz (compile's data sets hold at most 1 << 26 values)
def int_model_digest(int_model: dict) -> str:
    """sha256 of model.json's int_model in canonical form: binds every field (class names included), where
    the 32-bit model hash covers what the device computes with."""
    canonical = json.dumps(int_model, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class TestVectors:
    X_raw: np.ndarray  # float32 (n, d)
    xq: np.ndarray  # int8 (n, d): what the device receives
    y: np.ndarray  # int64 (n,): true class index
    scores: np.ndarray  # int64 (n, L): host reference scores
    labels: np.ndarray  # int64 (n,): host reference class index
    # host reference of tp_judge (core/confidence.py): the confidence byte, and the label or 255 (unknown); a model
    # without calibration answers 0 and its label. y is 255 for a row of a class held out of training.
    confidence: np.ndarray | None = None  # int64 (n,)
    decided: np.ndarray | None = None  # int64 (n,)

    KEYS = ("X_raw", "xq", "y", "scores", "labels", "confidence", "decided")

    def __post_init__(self) -> None:
        if self.confidence is None:
            object.__setattr__(self, "confidence", np.zeros(len(self.labels), dtype=np.int64))
        if self.decided is None:
            object.__setattr__(self, "decided", np.asarray(self.labels, dtype=np.int64).copy())

    def save(self, path: Path) -> None:
        np.savez(path, X_raw=self.X_raw, xq=self.xq, y=self.y, scores=self.scores, labels=self.labels,
                 confidence=self.confidence, decided=self.decided)

    @classmethod
    def load(cls, path: Path) -> "TestVectors":
        handle = open_regular(path, "the test vectors")  # one that cannot be read is said so, not "damaged"
        try:
            with handle:
                arrays = read_npz_arrays(handle, cls.KEYS, MAX_VECTOR_VALUES)
        except NpzProblem as exc:  # what is missing or wrong, in words (never numpy's exception class)
            raise TinyprotoError(f"{path} is damaged: {exc}; {remake_advice(path.parent)}") from None
        except OSError as exc:
            raise TinyprotoError(f"{path} cannot be read ({exc.strerror or exc}); {remake_advice(path.parent)}") \
                from None
        return cls(*(arrays[k] for k in cls.KEYS))

    def check_shapes(self, n_features: int, n_classes: int, path: Path) -> None:
        n = self.labels.shape[0] if self.labels.ndim == 1 else -1
        expected = {"X_raw": (n, n_features), "xq": (n, n_features), "y": (n,), "scores": (n, n_classes),
                    "labels": (n,), "confidence": (n,), "decided": (n,)}
        for key in self.KEYS:
            array = getattr(self, key)
            kinds = "f" if key == "X_raw" else "iu"  # y of floats (3.5) was validated, its accuracy against nothing
            if array.shape != expected[key] or array.dtype.kind not in kinds or n < 1:
                raise TinyprotoError(f"{path} is damaged: it does not fit the model of model.json ({n_features} "
                                     f"features, {n_classes} classes): its array {key} has shape {array.shape} "
                                     f"{array.dtype}; {remake_advice(path.parent)}")


# report.json's figures any verb reads (each may be absent): report's own, stricter list is report_data's
REPORT_FIGURES = {"model_bytes": "count", "budget_bytes": "count", "float_accuracy": "fraction",
                  "int8_accuracy": "fraction"}


@dataclass(frozen=True)
class ModelDir:
    path: Path
    meta: dict  # model.json
    report: dict  # report.json

    @property
    def model_hash(self) -> int:
        return int(self.meta["model_hash"], 16)

    def require_report(self) -> dict:
        """report.json, for the verbs that record or check figures from it (build, validate, flash): a missing one
        was read as empty, and validate then blamed build.json ("model_bytes is 330, not report.json's None")."""
        if not os.path.lexists(self.path / "report.json"):  # (a loop or a directory there: read_json says so)
            raise TinyprotoError(f"{self.path} has no report.json (the compile report); "
                                 f"{remake_advice(self.path)}")
        return self.report

    def int_model_json(self) -> dict:
        """model.json's int_model, checked against its recorded sha256 (a damaged or edited one is refused).
        `tinyproto.families.load_int_model` rebuilds the integer model from it."""
        raw = self.meta.get("int_model")
        if not isinstance(raw, dict):
            raise TinyprotoError(f"{self.path / 'model.json'} is damaged: no int_model")
        if "int_model_sha256" not in self.meta:
            raise TinyprotoError(f"{self.path / 'model.json'} has no int_model_sha256 (written by an older "
                                 f"tinyproto, or edited); {remake_advice(self.path)}")
        if self.meta["int_model_sha256"] != int_model_digest(raw):
            raise TinyprotoError(f"{self.path / 'model.json'} was changed after it was written: its int_model "
                                 "does not match its recorded sha256")
        classes = raw.get("classes")
        if (not isinstance(classes, list) or len(classes) < 2
                or not all(isinstance(c, (str, int)) and not isinstance(c, bool) for c in classes)
                or len({json.dumps(c) for c in classes}) != len(classes)):
            # the device answers with class indices: names that repeat or are not names make its labels ambiguous
            raise TinyprotoError(f"{self.path / 'model.json'} is damaged: its classes must be two or more distinct "
                                 "names or numbers")
        return raw

    def header_args(self) -> tuple[str, int, int]:
        """(dataset, seed, budget_bytes) for the generated header's banner, as compile wrote them (load_model_dir
        checked their types)."""
        return str(self.meta["dataset"]), int(self.meta["seed"]), int(self.meta["budget_bytes"])

    @property
    def prefix(self) -> str:
        """The model's C prefix (every external symbol of its runtime: <prefix>_predict, ...), as compile wrote it
        (load_model_dir refuses a model.json without one)."""
        return str(self.meta["prefix"])

    @property
    def board(self) -> str:
        """The name of the board the model was compiled for (load_model_dir refuses a model.json without one)."""
        return str(self.meta["board"])

    def vectors(self) -> TestVectors:
        """test_vectors.npz, refused unless it is the file compile wrote (model.json's vectors_sha256): every verb
        that reads it (validate, report's figures, learn) gets the rows the model was tested on, never edited ones
        (an out-of-range label was an internal error in report's figures, NaN inputs were drawn)."""
        path = self.path / "test_vectors.npz"
        vectors = TestVectors.load(path)  # first: a damaged file says so, with what is wrong with it
        if file_sha256(path, "the test vectors") != self.meta.get("vectors_sha256"):
            raise TinyprotoError(f"{path} is damaged or edited: not the file tinyproto wrote (its sha256 differs "
                                 f"from model.json's); {remake_advice(self.path)}")
        return vectors


def load_model_dir(path: Path) -> ModelDir:
    path = Path(path)
    if not path.is_dir():
        raise TinyprotoError(f"{path} is not a directory; give a model directory written by `tinyproto compile`")
    meta_path = path / "model.json"
    if not os.path.lexists(meta_path):  # a loop of links or an unreadable one is not "no model.json"
        raise TinyprotoError(f"{path} is not a tinyproto model directory (no model.json); "
                             "run `tinyproto compile` first")
    meta = read_json(meta_path, "the model", strict=True, advice=remake_advice(path))
    if meta.get("format") != MODEL_FORMAT or not _is_int(meta.get("format_version"), MODEL_FORMAT_VERSION,
                                                         MODEL_FORMAT_VERSION):
        if meta.get("format") == MODEL_FORMAT and _is_int(meta.get("format_version"), 1, MODEL_FORMAT_VERSION - 1):
            raise TinyprotoError(f"{meta_path}: a model of format version {meta['format_version']}, "
                                 f"written by an older tinyproto whose generated header differs; "
                                 f"{remake_advice(path)}")
        raise TinyprotoError(f"{meta_path}: not a tinyproto model of format version {MODEL_FORMAT_VERSION}")
    _check_meta_fields(meta, meta_path, remake_advice(path))
    digest = meta.get("model_hash")
    if not isinstance(digest, str) or len(digest) != 10 or not digest.startswith("0x"):
        raise TinyprotoError(f"{meta_path} is damaged: model_hash {digest!r} is not a 32-bit hex value")
    try:
        int(digest, 16)
    except ValueError:
        raise TinyprotoError(f"{meta_path} is damaged: model_hash {digest!r} is not a 32-bit hex value") from None
    report_path = path / "report.json"
    report = (read_json(report_path, "the model's report", advice=remake_advice(path))
              if os.path.lexists(report_path) else {})
    if report:
        # the figures the verbs take from it beside the report verb's own checks (learn printed int8_accuracy
        # [1] as an internal error at its end; validate and build record model_bytes and budget_bytes)
        check_fields(report, REPORT_FIGURES, report_path, optional=set(REPORT_FIGURES), advice=remake_advice(path))
    return ModelDir(path, meta, report)


def _is_int(value: object, low: int, high: int) -> bool:
    """An int (never a bool: True == 1 in Python) within [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


# model.json's fields outside int_model that compile always writes and the verbs build from: the board the
# firmware is for, the C prefix of its symbols, and the header banner's data set, seed and budget
WRITTEN_FIELDS = ("dataset", "prefix", "seed", "board", "budget_bytes")


def _check_meta_fields(meta: dict, meta_path: Path, advice: str) -> None:
    """model.json's fields outside int_model are not covered by its hashes, yet go into generated C (the header's
    banner) and file names: each must have the type and range compile writes, or the directory is refused."""
    from tinyproto.core.budget import MAX_BUDGET_BYTES

    missing = [key for key in WRITTEN_FIELDS if key not in meta]
    if missing:  # a default in its place would build another model: uno's firmware for a Mega's, other C symbols
        raise TinyprotoError(f"{meta_path} is damaged: it has no {missing[0]} (compile writes it; a default in its "
                             f"place would build another firmware); {advice}")
    dataset = meta["dataset"]
    if not isinstance(dataset, str) or not 0 < len(dataset) <= NAME_MAX:
        raise TinyprotoError(f"{meta_path} is damaged: dataset must be a name of 1 to {NAME_MAX} characters")
    if not _is_int(meta["seed"], 0, 2**63 - 1):
        raise TinyprotoError(f"{meta_path} is damaged: seed {str(meta['seed'])[:40]!r} is not a non-negative "
                             "integer")
    from tinyproto.core.render import PREFIX_MAX, check_prefix

    try:
        check_prefix(meta["prefix"] if isinstance(meta["prefix"], str) else "?")
    except TinyprotoError:
        raise TinyprotoError(f"{meta_path} is damaged: prefix {str(meta['prefix'])[:40]!r} is not a lower-case C "
                             f"identifier of at most {PREFIX_MAX} characters") from None
    if not _is_int(meta["budget_bytes"], 1, MAX_BUDGET_BYTES):
        raise TinyprotoError(f"{meta_path} is damaged: budget_bytes {str(meta['budget_bytes'])[:40]!r} is not "
                             "a positive number of bytes")


PROJECT_ENTRIES = ("platformio.ini", "src", "include", "lib", "test")


def check_project_files(directory: Path) -> None:
    """Refuse a PlatformIO project in which a FIFO, a device or a socket sits in a source's place (the compiler
    would block on it, or read /dev/zero for ever): regular files and directories only, links followed."""
    directory = Path(directory)
    for name in PROJECT_ENTRIES:
        top = directory / name
        if not os.path.lexists(top):
            continue
        paths = [top]
        if top.is_dir():
            for root, dirs, files in os.walk(top):  # does not descend into linked directories
                paths += [Path(root) / entry for entry in dirs + files]
        for path in paths:
            try:
                mode = os.stat(path).st_mode
            except OSError as exc:
                raise TinyprotoError(f"{path} cannot be read ({exc.strerror}); {remake_advice(directory)}") from None
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise TinyprotoError(f"{path} is not a regular file (a FIFO or a device in a source's place); "
                                     f"{remake_advice(directory)}")
