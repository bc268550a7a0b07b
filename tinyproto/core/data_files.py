"""Reading the user's data files safely: regular files only, bounded size, text decoding, and .npz arrays.

Layer: core. The rules are in tinyproto.core.datasets' docstring; the CSV parser is core/data_csv.py.
"""

from __future__ import annotations

import io
import math
import os
import re
import stat
import zipfile
from pathlib import Path

import numpy as np

from tinyproto.core.budget import is_size_unit
from tinyproto.core.builtin_sets import BUILTIN
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.npz_arrays import NpzProblem, read_npz_arrays

MAX_FILE_BYTES = 512 * 1024 * 1024  # a 10,000 x 784 CSV of pixels is ~30 MB
MAX_VALUES = 1 << 26  # X entries (537 MB as float64)
FLOAT32_MAX = float(np.finfo(np.float32).max)
NOISE_RELATIVE = 2.0**-40  # a std below this x |mean| is floating-point noise: the feature is truly constant
CSV_SUFFIXES = (".csv", ".txt", ".tsv")

_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NONFINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Unicode's own line breaks: str.splitlines() ends lines there but the csv module does not, so a file using them
# would read as one long line and be refused for something else (duplicate column names)
_LINE_SEPARATOR = re.compile("[\u2028\u2029]")


# ---------------------------------------------------------------------------------------------- files


def _check_exists(path: Path, spec: str) -> None:
    try:
        os.stat(spec)  # the name as given: Path() drops a trailing '/', and 'data.csv/' is no file to the system
    except FileNotFoundError:
        if os.path.islink(path):
            raise TinyprotoError(
                f"{spec}: is a symbolic link to {os.readlink(path)!r}, which does not exist"
            ) from None
        hint = (f"; {spec!r} looks like the unit of a size written with a space: write the size as one word, "
                f"e.g. --budget 2{spec.strip()}" if is_size_unit(spec) else "")
        raise TinyprotoError(
            f"data {spec!r} is neither a built-in data set ({', '.join(BUILTIN)}) nor an existing file{hint}"
        ) from None
    except (OSError, ValueError) as exc:
        raise TinyprotoError(f"{spec}: cannot be read ({_reason(exc)})") from None
    mode = os.stat(path).st_mode
    if not stat.S_ISREG(mode):
        raise TinyprotoError(f"{spec}: is {_file_kind(mode)}, not a data file")


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a regular file"


def read_regular_file(path: Path, limit: int | None = None) -> bytes:
    """The bytes of a regular file of at most `limit` bytes, or a TinyprotoError. The type is checked before
    opening and again on the open descriptor (opened non-blocking, so a FIFO swapped in cannot block)."""
    name = str(path)
    limit = MAX_FILE_BYTES if limit is None else limit
    try:
        info = os.stat(path)
    except (OSError, ValueError) as exc:
        raise TinyprotoError(f"{name}: cannot be read ({_reason(exc)})") from None
    if not stat.S_ISREG(info.st_mode):
        raise TinyprotoError(f"{name}: is {_file_kind(info.st_mode)}, not a data file")
    if info.st_size > limit:
        raise TinyprotoError(f"{name}: is {_megabytes(info.st_size)}; data files are limited to {_megabytes(limit)}")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except PermissionError:
        raise TinyprotoError(f"{name}: permission denied (the file is not readable)") from None
    except OSError as exc:
        raise TinyprotoError(f"{name}: cannot be opened ({_reason(exc)})") from None
    try:
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise TinyprotoError(f"{name}: is not a regular file")
            data = handle.read(limit + 1)
    except OSError as exc:
        raise TinyprotoError(f"{name}: cannot be read ({_reason(exc)})") from None
    if len(data) > limit:
        raise TinyprotoError(f"{name}: is larger than {_megabytes(limit)}, the limit for data files")
    if not data:
        raise TinyprotoError(f"{name}: is empty")
    return data


def _reason(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return " ".join(str(text).split())


def _megabytes(n: int) -> str:
    return f"{n / (1024 * 1024):.0f} MB" if n >= 1024 * 1024 else f"{n} bytes"


# ---------------------------------------------------------------------------------------------- text


_BOMS = (
    (b"\xef\xbb\xbf", "utf-8", "UTF-8"),
    (b"\xff\xfe\x00\x00", "utf-32-le", "UTF-32"),
    (b"\x00\x00\xfe\xff", "utf-32-be", "UTF-32"),
    (b"\xff\xfe", "utf-16-le", "UTF-16"),
    (b"\xfe\xff", "utf-16-be", "UTF-16"),
)


def decode_text(raw: bytes, name: str) -> str:
    """Bytes -> text by the rules in the module docstring; binary data is refused."""
    if raw.startswith(b"PK\x03\x04") or raw.startswith(b"\x93NUMPY"):
        raise TinyprotoError(f"{name}: is a zip/NumPy archive, not CSV text (an .npz file needs the .npz suffix)")
    text = None
    for bom, codec, title in _BOMS:
        if raw.startswith(bom):
            try:
                text = raw[len(bom):].decode(codec)
            except UnicodeDecodeError as exc:
                raise TinyprotoError(
                    f"{name}: starts with a {title} byte-order mark but is not valid {title} (byte {exc.start})"
                ) from None
            break
    if text is None:
        nul = raw.find(b"\x00")
        if nul >= 0:
            codec = _utf16_without_bom(raw)
            try:
                text = raw.decode(codec) if codec else None
            except UnicodeDecodeError:
                text = None
            if text is None:
                raise TinyprotoError(
                    f"{name}: contains NUL bytes (first at byte {nul}): binary data, or UTF-16/32 text without a "
                    "byte-order mark; save it as UTF-8 CSV"
                )
        else:
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                try:
                    text = raw.decode("cp1252")
                except UnicodeDecodeError:
                    text = raw.decode("latin-1")
    text = text.lstrip("\ufeff").rstrip("\x1a")  # a doubled BOM; a DOS end-of-file mark
    bad = _CONTROL.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        raise TinyprotoError(
            f"{name}, line {line}: control character U+{ord(bad.group()):04X}: not CSV text (binary data?)"
        )
    separator = _LINE_SEPARATOR.search(text)
    if separator:
        line = text.count("\n", 0, separator.start()) + 1
        raise TinyprotoError(
            f"{name}, line {line}: Unicode line separator U+{ord(separator.group()):04X}, which CSV does not end "
            "lines with; save the file with ordinary line ends (LF or CRLF)"
        )
    return text


def _utf16_without_bom(raw: bytes) -> str | None:
    """'utf-16-le'/'utf-16-be' when the NULs sit at every odd/even byte (mostly-ASCII UTF-16), else None."""
    if len(raw) % 2:
        return None
    sample = raw[:65536]
    even, odd = sample[0::2], sample[1::2]
    if odd.count(0) > 0.9 * len(odd) and even.count(0) < 0.1 * len(even):
        return "utf-16-le"
    if even.count(0) > 0.9 * len(even) and odd.count(0) < 0.1 * len(odd):
        return "utf-16-be"
    return None



# ---------------------------------------------------------------------------------------------- .npz


def load_npz(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    if not raw.startswith(b"PK"):
        raise TinyprotoError(f"{name}: is not an .npz file (not a zip archive); save it with numpy.savez")
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            members = {m[:-4]: m for m in archive.namelist() if m.endswith(".npy")}
            missing = [k for k in ("X", "y") if k not in members]
            if missing:
                found = ", ".join(sorted(members)) or "none"
                raise TinyprotoError(
                    f"{name}: an .npz data file needs arrays named 'X' and 'y' (missing {', '.join(missing)}; "
                    f"arrays found: {found})"
                )
            for key in ("X", "y"):
                _check_npy_header(archive, members[key], key, name)
        arrays = read_npz_arrays(raw, ("X", "y"), MAX_VALUES)
        X, y = arrays["X"], arrays["y"]
    except TinyprotoError:
        raise
    except MemoryError:
        raise TinyprotoError(f"{name}: too large to load into memory") from None
    except NpzProblem as exc:
        raise TinyprotoError(f"{name}: {exc}; save it again with numpy.savez(path, X=X, y=y)") from None
    except Exception:  # the archive's directory or an array's .npy header is damaged (BadZipFile, EOFError, ...)
        raise TinyprotoError(f"{name}: is not a complete .npz archive (cut short or overwritten); save it again "
                             "with numpy.savez(path, X=X, y=y)") from None
    return _npz_features(X, name), _npz_labels(y, name)


def _check_npy_header(archive: zipfile.ZipFile, member: str, key: str, name: str) -> None:
    """Refuse object arrays and oversized shapes from the .npy header, before any data is decompressed."""
    with archive.open(member) as handle:
        version = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(handle)
    if dtype.hasobject:
        raise TinyprotoError(
            f"{name}: array {key} holds Python objects, which need pickle (never loaded); save {key} as numbers"
            + (" (or as fixed-width strings: y.astype(str))" if key == "y" else " (X.astype(np.float32))")
        )
    if math.prod(shape) > MAX_VALUES:
        raise TinyprotoError(f"{name}: array {key} has shape {shape}, more than {MAX_VALUES:,} values")


def _npz_features(X: np.ndarray, name: str) -> np.ndarray:
    kind = X.dtype.kind
    if kind not in "biuf":
        what = {"c": "complex numbers", "U": "strings", "S": "bytes", "V": "records", "M": "dates",
                "m": "time spans"}.get(kind, f"dtype {X.dtype}")
        raise TinyprotoError(f"{name}: X holds {what}; it must be real numbers (bool, int or float)")
    if X.ndim != 2:
        hint = " (one feature: X.reshape(-1, 1))" if X.ndim == 1 else " (flatten samples: X.reshape(len(X), -1))"
        raise TinyprotoError(f"{name}: X has shape {X.shape}; it must be 2-D, samples x features{hint}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise TinyprotoError(f"{name}: X has shape {X.shape}: no samples or no features")
    with np.errstate(over="ignore", invalid="ignore"):
        return X.astype(np.float64)


def _npz_labels(y: np.ndarray, name: str) -> np.ndarray:
    if y.ndim == 2 and 1 in y.shape:
        y = y.reshape(-1)
    if y.ndim != 1:
        hint = " (one-hot? use y.argmax(axis=1))" if y.ndim == 2 else ""
        raise TinyprotoError(f"{name}: y has shape {y.shape}; it must be 1-D, one class per sample{hint}")
    kind = y.dtype.kind
    if kind == "b":
        return y.astype(np.int64)
    if kind == "i":
        return y.astype(np.int64)
    if kind == "u":
        if y.size and int(y.max()) >= 2**63:
            raise TinyprotoError(f"{name}: y holds {int(y.max())}, too large for a class id (a 64-bit integer); save "
                                 "the labels as text (y.astype(str)) or as smaller numbers")
        return y.astype(np.int64)
    if kind == "f":
        bad = ~np.isfinite(y)
        if bad.any():
            i = int(np.argmax(bad))
            raise TinyprotoError(f"{name}: y[{i}] is {float(y[i])!r}, not a class (missing label?)")
        fractional = y != np.round(y)
        if fractional.any():
            i = int(np.argmax(fractional))
            raise TinyprotoError(
                f"{name}: y[{i}] is {float(y[i])!r}, not a whole number; labels must be integers or strings "
                "(a regression target? tinyproto classifies)"
            )
        if y.size and float(np.abs(y).max()) >= 2.0**63:
            raise TinyprotoError(f"{name}: y holds {float(np.abs(y).max())!r}, too large for a class id (a 64-bit "
                                 "integer); save the labels as text (y.astype(str)) or as smaller numbers")
        return y.astype(np.int64)
    if kind in "US":
        if kind == "S":
            try:
                y = np.array([v.decode("utf-8") for v in y.tolist()])
            except UnicodeDecodeError:
                raise TinyprotoError(f"{name}: y holds bytes that are not UTF-8 text") from None
        labels = y.tolist()
        for i, v in enumerate(labels):
            if _CONTROL.search(v):
                raise TinyprotoError(f"{name}: y[{i}] contains a control character")
        if not labels:
            return np.asarray(labels, dtype=str)
        from tinyproto.core.labels import code_labels

        return code_labels(labels, lambda i: f"{name}: y[{i}]", "the label")  # the one coding, as a CSV's
    what = {"c": "complex numbers", "V": "records", "M": "dates", "m": "time spans"}.get(kind, f"dtype {y.dtype}")
    raise TinyprotoError(f"{name}: y holds {what}; labels must be integers or strings")


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")
