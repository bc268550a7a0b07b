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
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import hashlib
import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from tinyproto.core.errors import TinyprotoError

MODEL_FORMAT = "tinyproto-model"
MODEL_FORMAT_VERSION = 1
MANIFEST = ".tinyproto"
LOCK = ".tinyproto.lock"
SCRATCH_PREFIX = ".tinyproto-tmp-"  # short and independent of --out's name, so any usable name works
MAX_JSON_BYTES = 64 * 1024 * 1024
NAME_MAX = 255


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


def read_json(path: Path, what: str) -> dict:
    """A JSON object from a regular file of sane size, or one clear line saying what is wrong with it."""
    info = _regular_file(path, what)
    if info.st_size > MAX_JSON_BYTES:
        raise TinyprotoError(f"{path} is {info.st_size} bytes, too large for {what}")
    try:
        data = json.loads(Path(path).read_bytes().decode("utf-8"))
    except PermissionError:
        raise TinyprotoError(f"cannot read {path} ({what}): permission denied") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
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


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
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
        return raw

    def vectors(self) -> TestVectors:
        return TestVectors.load(self.path / "test_vectors.npz")


def load_model_dir(path: Path) -> ModelDir:
    path = Path(path)
    if not path.is_dir():
        raise TinyprotoError(f"{path} is not a directory; give a model directory written by `tinyproto compile`")
    meta_path = path / "model.json"
    if not meta_path.exists():
        raise TinyprotoError(f"{path} is not a tinyproto model directory (no model.json); run `tinyproto compile` first")
    meta = read_json(meta_path, "the model")
    if meta.get("format") != MODEL_FORMAT or meta.get("format_version") != MODEL_FORMAT_VERSION:
        raise TinyprotoError(f"{meta_path}: not a tinyproto model of format version {MODEL_FORMAT_VERSION}")
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


# ------------------------------------------------------------------------------------------------ manifest


def _manifest(directory: Path) -> dict | None:
    path = directory / MANIFEST
    if not path.is_file() or path.is_symlink():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if data.get("written_by") != "tinyproto" or not isinstance(data.get("files"), dict):
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
    directory = Path(directory)
    data = _manifest(directory)
    if data is None:
        return  # a directory from before manifests: nothing to extend, and replacing it stays refused
    owned = set(data.get("owned", [])) | set(names)
    if owned != set(data.get("owned", [])):
        write_json(directory / MANIFEST, {**data, "owned": sorted(owned)})


def foreign_entries(directory: Path, limit: int = 3) -> list[str]:
    """Entries of `directory` that tinyproto did not write or that changed since it wrote them."""
    directory = Path(directory)
    data = _manifest(directory)
    if data is None:
        entries = sorted(p.name for p in directory.iterdir())
        return entries[:limit] if entries else []
    files, owned = data["files"], set(data.get("owned", []))
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


# ------------------------------------------------------------------------------------------------ locking


def _try_lock(lock_path: Path, verb: str) -> int | None:
    """An flock'ed descriptor on lock_path, or None when another live process holds it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {verb}\n".encode())
    return fd


def _holder(lock_path: Path) -> str:
    try:
        pid, _, verb = lock_path.read_text().strip().partition(" ")
        return f"`tinyproto {verb}`, pid {pid}"
    except OSError:
        return "another tinyproto command"


@contextmanager
def locked(directory: Path, verb: str) -> Iterator[None]:
    """Hold the model directory's lock while `verb` writes into it; refuse at once if another command has it."""
    directory = Path(directory)
    lock_path = directory / LOCK
    try:
        fd = _try_lock(lock_path, verb)
    except OSError as exc:
        raise TinyprotoError(f"cannot lock {directory} for writing: {exc.strerror}") from None
    if fd is None:
        raise TinyprotoError(f"{directory} is in use by {_holder(lock_path)}; wait for it to finish")
    try:
        if os.fstat(fd).st_ino != os.stat(lock_path).st_ino:  # replaced by a compile while we waited
            raise TinyprotoError(f"{directory} was replaced while opening it; run the command again")
        yield
    finally:
        os.close(fd)


# ------------------------------------------------------------------------------------------------ replacing


def check_output_dir(out: Path) -> Path:
    """Refuse an --out that could not be written, before any training: returns the absolute path."""
    out = Path(os.path.abspath(out))
    if len(out.name.encode()) > NAME_MAX:
        raise TinyprotoError(f"--out name is {len(out.name.encode())} bytes long; file names are limited to {NAME_MAX}")
    if out.is_symlink():
        raise TinyprotoError(f"--out {out} is a symbolic link; give the directory itself")
    if out.exists():
        if not out.is_dir():
            raise TinyprotoError(f"--out {out} exists and is not a directory; choose another --out")
        _check_replaceable(out)
        _check_not_in_use(out)
        ancestor = out.parent
    else:
        ancestor = out.parent
        while not ancestor.exists():
            if ancestor.is_symlink():  # a dangling link on the way
                raise TinyprotoError(f"cannot create {out}: {ancestor} is a broken symbolic link")
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise TinyprotoError(f"cannot create {out}: {ancestor} is not a directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise TinyprotoError(f"cannot write --out {out}: {ancestor} is not writable")
    return out


def _check_replaceable(out: Path) -> None:
    try:
        if not any(out.iterdir()):
            return
        foreign = foreign_entries(out)
    except PermissionError:
        raise TinyprotoError(f"--out {out} cannot be read (permission denied); choose another --out") from None
    if foreign:
        if _manifest(out) is None:
            raise TinyprotoError(f"--out {out} is not empty and was not written by tinyproto (it holds "
                                 f"{', '.join(foreign)}); choose another --out, nothing was changed")
        raise TinyprotoError(f"--out {out} holds files tinyproto did not write ({', '.join(foreign)}); "
                             "choose another --out or move them away, nothing was changed")


def _check_not_in_use(directory: Path) -> None:
    """Refuse now, not after training, if another command holds the directory's lock."""
    lock_path = directory / LOCK
    if not lock_path.is_file() or lock_path.is_symlink():
        return
    try:
        fd = _try_lock(lock_path, "check")
    except OSError:
        return  # not lockable here: the real attempt at the end will say why
    if fd is None:
        raise TinyprotoError(f"{directory} is in use by {_holder(lock_path)}; wait for it to finish")
    os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS):
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(a))


def remove_stale_scratch(parent: Path) -> None:
    """Delete scratch directories that killed runs left in `parent` (their lock is no longer held)."""
    try:
        candidates = [p for p in parent.iterdir() if p.name.startswith(SCRATCH_PREFIX)]
    except OSError:
        return
    for scratch in candidates:
        lock_path = scratch / LOCK
        if scratch.is_symlink() or not scratch.is_dir() or not lock_path.is_file():
            continue
        try:
            fd = _try_lock(lock_path, "cleanup")
        except OSError:
            continue
        if fd is not None:
            try:
                shutil.rmtree(scratch, ignore_errors=True)
            finally:
                os.close(fd)


@contextmanager
def atomic_directory(out: Path, verb: str = "compile") -> Iterator[Path]:
    """Yield a scratch directory that replaces `out` only if the block succeeds: no half-written output.

    `out` may be missing, empty, or a directory tinyproto wrote and nobody changed since (see the module doc).
    """
    out = check_output_dir(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_scratch(out.parent)
    scratch = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=out.parent))
    fd = None
    try:
        fd = _try_lock(scratch / LOCK, verb)  # held across the swap: the new directory is born locked
        scratch.chmod(0o755)  # mkdtemp makes it private; the result is an ordinary directory
        yield scratch
        write_manifest(scratch)
        _swap_in(scratch, out, verb)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    finally:
        if fd is not None:
            os.close(fd)


def _swap_in(scratch: Path, out: Path, verb: str) -> None:
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise TinyprotoError(f"--out {out} changed while training (it is no longer a directory); nothing written")
    if not out.exists():
        try:
            os.rename(scratch, out)  # fails if a directory appeared there meanwhile: then replace it as below
            return
        except OSError as exc:
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                raise
    with locked(out, verb):
        _check_replaceable(out)  # again: the user may have added a file while we trained
        if _exchange(scratch, out):
            old = scratch  # the old directory now sits at the scratch name
        else:
            old = Path(tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=out.parent))
            os.replace(out, old)
            os.replace(scratch, out)
    shutil.rmtree(old, ignore_errors=True)
