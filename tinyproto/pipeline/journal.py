"""validation.jsonl, the journal of `tinyproto validate`: a binding line (what is validated), then one line per
measured vector, so `--resume` continues only a run of the very same model, vectors, firmware and target. Each
line is written to the file at once (a kill loses at most the line being written) and synced to the disk at
least every SYNC_EVERY_S (a power cut loses at most that much of the run): a sync per vector cost more than
validating it. Layer: pipeline."""

from __future__ import annotations

import errno
import json
import os
import stat
import time
from pathlib import Path

from tinyproto.core.errors import TinyprotoError, os_error_line
from tinyproto.core.strict_json import loads_unique_keys

JOURNAL = "validation.jsonl"
JOURNAL_NEW = ".validation.jsonl.new"
SYNC_EVERY_S = 1.0


class Journal:
    """validation.jsonl: a binding line, then one line per measured vector, each fsync'ed as it is written.

    A new run writes to a side file that replaces the old journal only once it holds a first result, so
    a run that never reached the device loses nothing of the previous one.
    """

    def __init__(self, directory: Path, binding: dict):
        self.path = Path(directory) / JOURNAL
        self.new_path = Path(directory) / JOURNAL_NEW
        self.binding = binding
        self._handle = None
        self._pending_rename = False
        self._synced_at = float("-inf")

    def resume(self, n_vectors: int, n_classes: int) -> dict[int, dict]:
        """Rows of a previous run of the same binding; a torn last line (a kill mid-write) is dropped."""
        if not self.path.exists() and not self.path.is_symlink():
            raise TinyprotoError(f"nothing to resume: {self.path} does not exist; run validate without --resume")
        handle = _open_own(self.path, os.O_RDWR | os.O_APPEND)
        try:
            return self._resume_from(handle, n_vectors, n_classes)
        except BaseException:
            handle.close()
            raise

    def _resume_from(self, handle, n_vectors: int, n_classes: int) -> dict[int, dict]:
        data = _read_all(handle)
        if not data.strip():
            raise TinyprotoError(f"{self.path} is empty: nothing to resume; run validate without --resume")
        lines = data.split(b"\n")
        good_end, rows = 0, {}
        for number, line in enumerate(lines, start=1):
            is_last = number == len(lines) or (number == len(lines) - 1 and lines[-1] == b"")
            if not line:
                if number < len(lines):
                    good_end += 1
                continue
            try:
                entry = loads_unique_keys(line.decode("utf-8"))  # bytes would be guessed UTF-16 or -32
                if number == 1:
                    if not isinstance(entry, dict) or entry.get("binding") != self.binding:
                        raise TinyprotoError(f"{self.path} belongs to another model, firmware, test vectors or "
                                             "target; run validate without --resume")
                else:
                    i, row = _journal_row(entry, n_vectors, n_classes)
                    if i in rows:
                        raise ValueError("duplicate vector")
                    rows[i] = row
            except (ValueError, TypeError, KeyError, RecursionError) as exc:  # RecursionError: deeply nested JSON
                if is_last and not data.endswith(b"\n"):
                    break  # torn by a kill: measure that vector again
                raise TinyprotoError(f"{self.path}:{number} is not a result line ({exc}); run validate without "
                                     "--resume") from None
            good_end += len(line) + 1
        os.ftruncate(handle.fileno(), min(good_end, len(data)))  # cut a torn tail: the next line starts clean
        self._handle = handle
        return rows

    def start_new(self) -> None:
        self._handle = _open_own(self.new_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        self._write({"binding": self.binding})
        self._pending_rename = True

    def append(self, row: dict) -> None:
        self._write(row)
        if self._pending_rename:  # the first result of the new run: now the old journal may go
            os.replace(self.new_path, self.path)
            self._pending_rename = False

    def _write(self, entry: dict) -> None:
        self._handle.write((json.dumps(entry) + "\n").encode())
        self._handle.flush()
        now = time.monotonic()
        if now - self._synced_at >= SYNC_EVERY_S or "binding" in entry:
            os.fsync(self._handle.fileno())
            self._synced_at = now

    def close(self) -> None:
        if self._handle is not None:
            self._handle.flush()
            os.fsync(self._handle.fileno())
            self._handle.close()
            self._handle = None
        if self._pending_rename:
            self.new_path.unlink(missing_ok=True)


def _open_own(path: Path, flags: int):
    """Open a journal without following a symbolic link and only if it is a regular file: a link or a FIFO
    planted in the model directory must not make tinyproto write to (or block on) something else."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW: a link planted at the journal's name
            raise TinyprotoError(f"cannot open {path}: it is a symbolic link; tinyproto writes only regular files "
                                 "it made: move it away") from None
        raise TinyprotoError(f"cannot open the journal: {os_error_line(exc)}") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TinyprotoError(f"{path} is not a regular file; move it away")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "r+b" if flags & os.O_RDWR else "wb")


def _read_all(handle) -> bytes:
    handle.seek(0)
    return handle.read()


def _journal_row(entry: object, n_vectors: int, n_classes: int) -> tuple[int, dict]:
    if not isinstance(entry, dict):
        raise ValueError("not an object")
    i, label, cycles, scores = entry["i"], entry["label"], entry["cycles"], entry["scores"]
    confidence, decided = entry["confidence"], entry["decided"]  # tp_judge's answer (a missing one: not resumable)
    numbers = [i, label, cycles, confidence, decided, *scores] if isinstance(scores, list) else None
    if numbers is None or not all(isinstance(v, int) and not isinstance(v, bool) for v in numbers):
        raise ValueError("fields are not integers")
    if not 0 <= i < n_vectors or len(scores) != n_classes:
        raise ValueError("vector index or score count out of range")
    return i, {"i": i, "label": label, "cycles": cycles, "scores": scores, "confidence": confidence,
               "decided": decided}
