"""Reading and writing the files tinyproto reads back, safely: regular files only (a FIFO or a device in a file's
place is refused, never blocked on), bounded sizes, one clear line per problem, and JSON written through a
temporary file and a rename so a reader never sees half a file. Layer: core.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import tempfile
from pathlib import Path

from tinyproto.core import strict_json
from tinyproto.core.errors import TinyprotoError

MAX_JSON_BYTES = 64 * 1024 * 1024


class Unreadable(TinyprotoError):
    """A file that is there but cannot be read (no read permission, a loop of symbolic links): never "missing",
    "damaged" or "changed", which would send the user to recompile what is only unreadable."""


def cannot_read(path: Path, what: str, exc: OSError) -> Unreadable:
    """The one line for a file the system will not let us read, with what to do about it."""
    import errno

    hint = {errno.EACCES: "; make it readable (chmod u+r) or run as its owner",
            errno.EPERM: "; make it readable (chmod u+r) or run as its owner",
            errno.ELOOP: "; it is a loop of symbolic links: put the file itself there"}.get(exc.errno, "")
    return Unreadable(f"cannot read {path} ({what}): {exc.strerror}{hint}")


def _regular_file(path: Path, what: str) -> os.stat_result:
    """stat() of a regular file, or a one-line error (a FIFO or a device would block or never end)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):  # "is missing" of a file that is there as a link said nothing to do
            raise TinyprotoError(f"{path} ({what}) is a symbolic link to {os.readlink(path)}, which does not exist; "
                                 "put the file itself there") from None
        raise TinyprotoError(f"{path} is missing ({what})") from None
    except OSError as exc:
        raise cannot_read(path, what, exc) from None
    if not stat.S_ISREG(info.st_mode):
        raise TinyprotoError(f"{path} is not a regular file ({what})")
    return info


def resolved(path: Path, what: str, advice: str = "give a path without the loop") -> Path:
    """Path(path).resolve(), a loop of symbolic links on the way being one line naming `what` (Python 3.11 raises
    RuntimeError for it, later versions OSError: either was an internal error)."""
    try:
        return Path(path).resolve()
    except (RuntimeError, OSError):
        raise TinyprotoError(f"{path} ({what}) leads into a loop of symbolic links; {advice}") from None


def check_regular_file(path: Path, what: str) -> None:
    """One clear error unless `path` is a regular file (checked before a reader could block on a FIFO)."""
    _regular_file(path, what)


def read_json(path: Path, what: str, strict: bool = False, advice: str | None = None) -> dict:
    """A JSON object from a regular file of sane size, or one clear line saying what is wrong with it.

    strict (the files tinyproto rebuilds a model from): no NaN / Infinity literals or numbers that overflow to
    infinity, no key given twice (which value wins is the parser's whim) and no text that is not Unicode (a lone
    surrogate escape), so every later int() / float() / encode() of a field gets an ordinary value."""
    info = _regular_file(path, what)
    if info.st_size > MAX_JSON_BYTES:
        raise TinyprotoError(f"{path} is {info.st_size} bytes, too large for {what}")
    with open_regular(path, what) as handle:  # non-blocking: a FIFO swapped in after the check cannot hang us
        raw = handle.read(MAX_JSON_BYTES + 1)
    try:
        data = strict_json.loads(raw.decode("utf-8")) if strict else strict_json.loads_unique_keys(raw.decode("utf-8"))
    except (UnicodeError, ValueError, RecursionError) as exc:
        raise TinyprotoError(f"{path} is damaged: not valid JSON ({what}): {str(exc)[:80]}"
                             + (f"; {advice}" if advice else "")) from None
    if not isinstance(data, dict):
        raise TinyprotoError(f"{path} is damaged: expected a JSON object ({what})" + (f"; {advice}" if advice else ""))
    return data


def write_json(path: Path, data: dict) -> None:
    """Write JSON via a temporary file (.<name>.XXXXXXXX.tmp, a name of its own) and a rename: a reader never sees
    half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:64]}.", suffix=".tmp", dir=path.parent)
    _write_and_replace(fd, Path(tmp), path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode("utf-8"))


def write_bytes_atomic(path: Path, content: bytes) -> None:
    """Write `content` to `path` through the temporary file .<name>.tmp beside it and a rename (a reader sees the
    old or the new file). The caller holds the directory's lock, so the fixed temporary name is its own (a name
    record_outputs can own); O_NOFOLLOW refuses a link there."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    _write_and_replace(fd, tmp, path, content)


def _write_and_replace(fd: int, tmp: Path, path: Path, content: bytes) -> None:
    """The one way tinyproto replaces a file: write `content` to the open temporary file `tmp`, fsync, make it an
    ordinary file (mkstemp's are private) and rename it over `path`. The temporary file never outlives a failure (a
    full disk, a directory at `path`, Ctrl-C), and a failed write names `path`."""
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        _name_the_file(exc, path, tmp)
        raise


def _name_the_file(exc: BaseException, path: Path, tmp: Path) -> None:
    """A failed write() (a full disk) raises OSError without a file name, a failed rename names the temporary file
    that is gone once the error is printed: give it the file being written."""
    if isinstance(exc, OSError) and (not exc.filename or exc.filename == str(tmp)):
        exc.filename, exc.filename2 = str(path), None


def open_regular(path: Path, what: str):
    """A binary reader on a regular file. Opened non-blocking and checked on the descriptor, so a FIFO or a
    device put in a file's place (or swapped in after a check) is refused instead of blocking or never ending."""
    _regular_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise cannot_read(path, what, exc) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise TinyprotoError(f"{path} is not a regular file ({what})")
    return os.fdopen(fd, "rb")


def read_text_file(path: Path, what: str, limit: int = MAX_JSON_BYTES) -> str:
    """The text of a regular file of at most `limit` bytes (undecodable bytes replaced), or one clear error."""
    with open_regular(path, what) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TinyprotoError(f"{path} is over {limit} bytes, too large for {what}")
    return data.decode("utf-8", errors="replace")


def read_bytes_file(path: Path, what: str, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or one clear error (never blocks on a FIFO)."""
    with open_regular(path, what) as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise TinyprotoError(f"{path} is over {limit} bytes, too large for {what}")
    return data


def file_sha256(path: Path, what: str = "a file to check") -> str:
    digest = hashlib.sha256()
    with open_regular(path, what) as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
