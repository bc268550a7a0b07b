"""The model directory: what `compile` writes and `build` / `flash` / `validate` / `learn` read and add to.

    model.json          the trained + quantized artefact (data only, rebuilds the host reference)
    report.json         compile report (ledger, accuracies, hyper-parameters)
    test_vectors.npz    held-out vectors: raw float32, int8 inputs, true labels, reference scores and labels
    platformio.ini, src/, include/, lib/, test/   the PlatformIO project
    .tinyproto          the manifest: every path tinyproto wrote here (with its sha256 where the content is fixed)
    .tinyproto.lock     held (flock) by the one command that is writing the directory

Safety rules, in one place:
- tinyproto replaces a directory only if every entry in it is covered by its manifest and unchanged since
  tinyproto wrote it; anything else (the user's CSV, an edited source) makes it refuse, naming the entry.
- A replacement is prepared in a scratch directory beside the target and swapped in with one atomic rename,
  so a kill leaves either the old or the new directory, never half of one. Scratch directories of dead
  runs (their lock is free) are removed by the next run.
- Every command that writes a model directory holds its lock; a second one is refused at once.
Locks, pre-flight checks and the atomic swap: tinyproto/core/outdir.py. Layer: core.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyproto.core import strict_json
from tinyproto.core.errors import TinyprotoError

MODEL_FORMAT = "tinyproto-model"
MODEL_FORMAT_VERSION = 2
# Format 1 hashed the model under the runtime's former C names (TP_PN_*, TP_FLY_*: prefixes that did not follow the
# family names), so this version cannot check its recorded model hash; such a directory is refused, not trusted.
MANIFEST = ".tinyproto"
LOCK = ".tinyproto.lock"
SCRATCH_PREFIX = ".tinyproto-tmp-"  # short and independent of --out's name, so any usable name works
MAX_JSON_BYTES = 64 * 1024 * 1024
NAME_MAX = 255
# Every entry a command (re)writes in place inside a directory tinyproto made (record_outputs): build's .pio and
# build.json, validate's journal and summary, learn's projects, report's page and figures, sweep's files. The
# manifest's `owned` list is honoured only for these, so an edited manifest cannot hand a user's file to tinyproto.
OWNED_NAMES = frozenset({".pio", "build.json", "validation.json", "validation.jsonl", ".validation.jsonl.new",
                         "learning", "learned", "learn.json", "report.html", ".report.html.tmp", "figures",
                         "sweep.json", "results.jsonl", ".results.jsonl.tmp", "points"})


# ------------------------------------------------------------------------------------------------ reading


def _regular_file(path: Path, what: str) -> os.stat_result:
    """stat() of a regular file, or a one-line error (a FIFO or a device would block or never end)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise TinyprotoError(f"{path} is missing ({what})") from None
    except OSError as exc:
        raise TinyprotoError(f"cannot read {path} ({what}): {exc.strerror}") from None
    if not stat.S_ISREG(info.st_mode):
        raise TinyprotoError(f"{path} is not a regular file ({what})")
    return info


def check_regular_file(path: Path, what: str) -> None:
    """One clear error unless `path` is a regular file (checked before a reader could block on a FIFO)."""
    _regular_file(path, what)


def read_json(path: Path, what: str, strict: bool = False) -> dict:
    """A JSON object from a regular file of sane size, or one clear line saying what is wrong with it.

    strict (the files tinyproto rebuilds a model from): no NaN / Infinity literals or numbers that overflow to
    infinity, no key given twice (which value wins is the parser's whim) and no text that is not Unicode (a lone
    surrogate escape), so every later int() / float() / encode() of a field gets an ordinary value."""
    info = _regular_file(path, what)
    if info.st_size > MAX_JSON_BYTES:
        raise TinyprotoError(f"{path} is {info.st_size} bytes, too large for {what}")
    with _open_regular(path, what) as handle:  # non-blocking: a FIFO swapped in after the check cannot hang us
        raw = handle.read(MAX_JSON_BYTES + 1)
    try:
        data = strict_json.loads(raw.decode("utf-8")) if strict else json.loads(raw.decode("utf-8"))
    except (UnicodeError, ValueError, RecursionError) as exc:
        raise TinyprotoError(f"{path} is damaged: not valid JSON ({what}): {str(exc)[:80]}") from None
    if not isinstance(data, dict):
        raise TinyprotoError(f"{path} is damaged: expected a JSON object ({what})")
    return data


def write_json(path: Path, data: dict) -> None:
    """Write JSON via a temporary file and a rename: a reader never sees half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _open_regular(path: Path, what: str):
    """A binary reader on a regular file. Opened non-blocking and checked on the descriptor, so a FIFO or a
    device put in a file's place (or swapped in after a check) is refused instead of blocking or never ending."""
    _regular_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise TinyprotoError(f"cannot read {path} ({what}): {exc.strerror}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TinyprotoError(f"{path} is not a regular file ({what})")
    return os.fdopen(fd, "rb")


def read_text_file(path: Path, what: str, limit: int = MAX_JSON_BYTES) -> str:
    """The text of a regular file of at most `limit` bytes (undecodable bytes replaced), or one clear error."""
    with _open_regular(path, what) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TinyprotoError(f"{path} is over {limit} bytes, too large for {what}")
    return data.decode("utf-8", errors="replace")


def read_bytes_file(path: Path, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or one clear error (never blocks on a FIFO)."""
    with _open_regular(path, what) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TinyprotoError(f"{path} is over {limit} bytes, too large for {what}")
    return data


def file_sha256(path: Path, what: str = "a file to check") -> str:
    digest = hashlib.sha256()
    with _open_regular(path, what) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


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

    KEYS = ("X_raw", "xq", "y", "scores", "labels")

    def save(self, path: Path) -> None:
        np.savez(path, X_raw=self.X_raw, xq=self.xq, y=self.y, scores=self.scores, labels=self.labels)

    @classmethod
    def load(cls, path: Path) -> "TestVectors":
        _regular_file(path, "the test vectors")
        try:
            with np.load(path, allow_pickle=False) as data:
                arrays = [np.asarray(data[k]) for k in cls.KEYS]
        except Exception as exc:  # zipfile, numpy and OS errors alike: the file is not what compile wrote
            raise TinyprotoError(f"{path} is damaged ({type(exc).__name__}); run `tinyproto compile` again") from None
        return cls(*arrays)

    def check_shapes(self, n_features: int, n_classes: int, path: Path) -> None:
        n = self.labels.shape[0] if self.labels.ndim == 1 else -1
        expected = {"X_raw": (n, n_features), "xq": (n, n_features), "y": (n,), "scores": (n, n_classes),
                    "labels": (n,)}
        for key in self.KEYS:
            array = getattr(self, key)
            if array.shape != expected[key] or array.dtype.kind not in "iuf" or n < 1:
                raise TinyprotoError(f"{path} does not fit the model: array {key} has shape {array.shape}")


@dataclass(frozen=True)
class ModelDir:
    path: Path
    meta: dict  # model.json
    report: dict  # report.json

    @property
    def model_hash(self) -> int:
        return int(self.meta["model_hash"], 16)

    def int_model_json(self) -> dict:
        """model.json's int_model, checked against its recorded sha256 (a damaged or edited one is refused).
        `tinyproto.families.load_int_model` rebuilds the integer model from it."""
        raw = self.meta.get("int_model")
        if not isinstance(raw, dict):
            raise TinyprotoError(f"{self.path / 'model.json'} is damaged: no int_model")
        if "int_model_sha256" not in self.meta:
            raise TinyprotoError(f"{self.path / 'model.json'} has no int_model_sha256 (written by an older "
                                 "tinyproto, or edited); run `tinyproto compile` again")
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
        return str(self.meta.get("dataset", "?")), int(self.meta.get("seed", 0)), int(self.meta.get("budget_bytes", 0))

    def vectors(self) -> TestVectors:
        return TestVectors.load(self.path / "test_vectors.npz")


def load_model_dir(path: Path) -> ModelDir:
    path = Path(path)
    if not path.is_dir():
        raise TinyprotoError(f"{path} is not a directory; give a model directory written by `tinyproto compile`")
    meta_path = path / "model.json"
    if not meta_path.exists():
        raise TinyprotoError(f"{path} is not a tinyproto model directory (no model.json); run `tinyproto compile` first")
    meta = read_json(meta_path, "the model", strict=True)
    if meta.get("format") != MODEL_FORMAT or not _is_int(meta.get("format_version"), MODEL_FORMAT_VERSION,
                                                         MODEL_FORMAT_VERSION):
        if meta.get("format") == MODEL_FORMAT and _is_int(meta.get("format_version"), 1, MODEL_FORMAT_VERSION - 1):
            raise TinyprotoError(f"{meta_path}: a model of format version {meta['format_version']}, written by an older "
                                 f"tinyproto whose generated C names differ; run `tinyproto compile` again")
        raise TinyprotoError(f"{meta_path}: not a tinyproto model of format version {MODEL_FORMAT_VERSION}")
    _check_meta_fields(meta, meta_path)
    digest = meta.get("model_hash")
    if not isinstance(digest, str) or len(digest) != 10 or not digest.startswith("0x"):
        raise TinyprotoError(f"{meta_path} is damaged: model_hash {digest!r} is not a 32-bit hex value")
    try:
        int(digest, 16)
    except ValueError:
        raise TinyprotoError(f"{meta_path} is damaged: model_hash {digest!r} is not a 32-bit hex value") from None
    report_path = path / "report.json"
    report = read_json(report_path, "the compile report") if report_path.exists() else {}
    return ModelDir(path, meta, report)


def _is_int(value: object, low: int, high: int) -> bool:
    """An int (never a bool: True == 1 in Python) within [low, high]."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check_meta_fields(meta: dict, meta_path: Path) -> None:
    """model.json's fields outside int_model are not covered by its hashes, yet go into generated C (the header's
    banner) and file names: each must have the type and range compile writes, or the directory is refused."""
    from tinyproto.core.budget import MAX_BUDGET_BYTES

    dataset = meta.get("dataset", "?")
    if not isinstance(dataset, str) or not 0 < len(dataset) <= NAME_MAX:
        raise TinyprotoError(f"{meta_path} is damaged: dataset must be a name of 1 to {NAME_MAX} characters")
    if not _is_int(meta.get("seed", 0), 0, 2**63 - 1):
        raise TinyprotoError(f"{meta_path} is damaged: seed {str(meta.get('seed'))[:40]!r} is not a non-negative "
                             "integer")
    if not _is_int(meta.get("budget_bytes", 1), 1, MAX_BUDGET_BYTES):
        raise TinyprotoError(f"{meta_path} is damaged: budget_bytes {str(meta.get('budget_bytes'))[:40]!r} is not "
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
                raise TinyprotoError(f"{path} cannot be read ({exc.strerror}); run `tinyproto compile` again") from None
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                raise TinyprotoError(f"{path} is not a regular file (a FIFO or a device in a source's place); "
                                     "run `tinyproto compile` again")


# ------------------------------------------------------------------------------------------------ manifest


def read_manifest(directory: Path) -> dict | None:
    path = directory / MANIFEST
    if not path.is_file() or path.is_symlink():
        return None
    try:
        if path.stat().st_size > MAX_JSON_BYTES:
            return None
        data = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("written_by") != "tinyproto" or not isinstance(data.get("files"), dict):
        return None
    owned = data.get("owned", [])
    if not isinstance(owned, list) or not all(isinstance(name, str) for name in owned):
        return None
    return data


def write_manifest(directory: Path) -> None:
    """Record every file now under `directory` with its sha256 (called last when a directory is created)."""
    files = {}
    for path in sorted(Path(directory).rglob("*")):
        rel = path.relative_to(directory).as_posix()
        if path.is_file() and not path.is_symlink() and rel not in (MANIFEST, LOCK):
            files[rel] = file_sha256(path)
    write_json(Path(directory) / MANIFEST, {"written_by": "tinyproto", "version": 1, "files": files})


def record_outputs(directory: Path, *names: str) -> None:
    """Add entries tinyproto (re)writes in place to the manifest: a file whose content changes from run to run
    (build.json, validation.jsonl) or a whole tree (.pio, learning/): covered whatever its content."""
    unknown = set(names) - OWNED_NAMES
    if unknown:
        raise ValueError(f"record_outputs: {sorted(unknown)} missing from OWNED_NAMES")
    directory = Path(directory)
    for name in names:  # called by every writer before it writes: nothing is written through a planted link
        check_output_entry(directory / name)
    data = read_manifest(directory)
    if data is None:
        return  # a directory from before manifests: nothing to extend, and replacing it stays refused
    owned = set(data.get("owned", [])) | set(names)
    if owned != set(data.get("owned", [])):
        write_json(directory / MANIFEST, {**data, "owned": sorted(owned)})


MAX_OUTPUT_ENTRIES = 100_000  # a tree of outputs larger than this is not one tinyproto wrote (.pio holds ~20)


def check_output_entry(path: Path) -> None:
    """Refuse to write `path` (an output tinyproto rewrites in place) when it, or anything inside it, is a symbolic
    link or a special file: someone else put it there, and writing would go through it to another file."""
    if not os.path.lexists(path):
        return
    entries = [path]
    if path.is_dir() and not path.is_symlink():
        for count, (folder, dirs, files) in enumerate(os.walk(path)):  # os.walk does not follow links
            if count > MAX_OUTPUT_ENTRIES:
                break
            entries.extend(Path(folder) / name for name in dirs + files)
    for entry in entries:
        try:
            mode = os.lstat(entry).st_mode
        except OSError:
            continue  # vanished meanwhile: nothing to write through
        if stat.S_ISLNK(mode) or not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
            raise TinyprotoError(f"{entry} is {kind}, where tinyproto writes its output; tinyproto did not make "
                                 "it and will not write through it: move it away, nothing was written")


def foreign_entries(directory: Path, limit: int = 3) -> list[str]:
    """Entries of `directory` that tinyproto did not write or that changed since it wrote them."""
    directory = Path(directory)
    data = read_manifest(directory)
    if data is None:
        entries = sorted(p.name for p in directory.iterdir())
        return entries[:limit] if entries else []
    files, owned = data["files"], set(data.get("owned", [])) & OWNED_NAMES
    foreign: list[str] = []

    def covered(rel: str) -> bool:
        return any(rel == o or rel.startswith(o + "/") for o in owned)

    def walk(folder: Path) -> None:
        for entry in sorted(folder.iterdir()):
            if len(foreign) >= limit:
                return
            rel = entry.relative_to(directory).as_posix()
            if rel in (MANIFEST, LOCK) or covered(rel):
                continue
            if entry.is_symlink() or not (entry.is_dir() or entry.is_file()):
                foreign.append(rel)
            elif entry.is_dir():
                if not any(f.startswith(rel + "/") for f in files):
                    foreign.append(rel + "/")
                else:
                    walk(entry)
            elif rel not in files:
                foreign.append(rel)
            elif files[rel] != file_sha256(entry):
                foreign.append(f"{rel} (changed since tinyproto wrote it)")

    walk(directory)
    return foreign
