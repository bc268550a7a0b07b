"""Load the user's data (built-in name, CSV, .npz) into one validated, numeric `Dataset`.

Every problem with the data is a `TinyprotoError` with one line naming the file, the line/row and column, and
what is wrong; nothing the data contains can raise anything else, hang, or yield a silently useless model.

Files: only regular files are read (a directory, FIFO, device, socket or dangling symlink is refused before it
is opened, and the file is opened non-blocking and checked again), at most MAX_FILE_BYTES of them.

CSV (.csv, .txt, .tsv), documented handling:
* encoding: UTF-8, with or without a byte-order mark; UTF-16/UTF-32 with a byte-order mark (or UTF-16 without
  one, recognised by its NUL bytes); anything else that is not UTF-8 is read as Windows-1252/Latin-1 text.
  Other NUL or control characters mean binary data and are refused;
* the first non-blank line is the header and must name the columns (a line of numbers only is refused: the
  file has no header). The delimiter is ',' unless the header has no ',' but ';' or a tab (European Excel,
  TSV). Non-empty column names must be unique; --label must name exactly one column (default: the last);
* blank lines (and lines of only delimiters) are skipped; CRLF / CR line ends, cells quoted or padded with
  spaces are fine; one trailing delimiter per line is ignored; every other line must have the header's number
  of fields;
* feature cells are ASCII decimal numbers (1, -2.5, .5, 3e-4). Refused with the line and column: empty cells,
  NaN/inf, values beyond float32 (|x| > 3.4e38, the device's arithmetic), thousands/decimal commas, hex,
  booleans and any other text;
* labels: whitespace-trimmed text. If every label is a whole number (7, 007, 7.0) they become integer class
  ids, so the ids match the user's; non-whole numbers (1.5: a regression target?), a mix of numbers and text,
  empty or NaN labels are refused.

.npz: arrays X (n, d) and y (n,) (or (n, 1)), loaded without pickle. X is bool/int/float; y is int, bool
(0/1), whole floats (1.0 -> 1) or strings. Object, complex, structured, non-whole float labels, NaN/inf or
out-of-float32 X, wrong shapes and empty arrays are refused.

Then for every source (`validate_xy`): 2..255 classes with at least 2 samples each, and features the device can
see: not every feature constant, no feature that varies by less than the device resolves (0.1 % of its
magnitude: the half-float mean; subtract an offset), and no feature's spread a million times smaller than the
data's overall spread (the input stage's half-float gains share one exponent; see
inputstage.standardise_moments). Truly constant features (std at floating-point noise) are fine.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
import os
import re
import stat
import warnings
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.inputstage import standardise_moments

BUILTIN = ("digits", "breast_cancer", "wine", "iris", "segment")
TEST_FRACTION = 0.25
MAX_CLASSES = 255
MAX_FILE_BYTES = 512 * 1024 * 1024  # a 10,000 x 784 CSV of pixels is ~30 MB
MAX_VALUES = 1 << 26  # X entries (537 MB as float64)
FLOAT32_MAX = float(np.finfo(np.float32).max)
NOISE_RELATIVE = 2.0**-40  # a std below this x |mean| is floating-point noise: the feature is truly constant
CSV_SUFFIXES = (".csv", ".txt", ".tsv")

_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NONFINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class Dataset:
    name: str
    X: np.ndarray  # float64 (n, d), finite, within float32
    y: np.ndarray  # original labels (n,): int64 or str
    columns: tuple[str, ...] | None = None  # feature names for messages ("column 2 ('width')"), CSV only


@dataclass(frozen=True)
class Split:
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


def load_dataset(spec: str, label: str | None = None) -> Dataset:
    """`spec` is a built-in name, a .csv file (header row; label = last column or `label`) or an .npz (X, y)."""
    if not isinstance(spec, str) or not spec.strip():
        raise TinyprotoError(f"no data given: name a built-in data set ({', '.join(BUILTIN)}), a CSV or an .npz file")
    if spec in BUILTIN:
        if label is not None:
            raise TinyprotoError(
                f"--label {label!r} is for CSV files; the built-in data set {spec!r} has its own labels"
            )
        return _load_builtin(spec)
    path = Path(spec)
    suffix = path.suffix.lower()
    _check_exists(path, spec)
    if suffix not in CSV_SUFFIXES + (".npz",):
        raise TinyprotoError(
            f"{spec}: unsupported file type {path.suffix!r}; use a .csv (or .txt/.tsv) or an .npz file"
        )
    raw = read_regular_file(path)
    if suffix == ".npz":
        if label is not None:
            raise TinyprotoError(f"--label {label!r} is for CSV files; {spec} has its labels in the array y")
        X, y = _load_npz(raw, spec)
        columns = None
    else:
        X, y, columns = _load_csv(raw, spec, label)
    X, y = validate_xy(X, y, source=spec, columns=columns)
    return Dataset(path.stem or path.name, X, y, tuple(columns) if columns is not None else None)


# ---------------------------------------------------------------------------------------------- built-ins


def _load_builtin(name: str) -> Dataset:
    if name == "segment":
        return _load_segment()
    from sklearn import datasets as skd

    loader = {
        "digits": skd.load_digits,
        "breast_cancer": skd.load_breast_cancer,
        "wine": skd.load_wine,
        "iris": skd.load_iris,
    }[name]
    bunch = loader()
    return Dataset(name, np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target))


def _load_segment() -> Dataset:
    """UCI image segments (2310 x 19, 7 classes), as shipped inside the `river` package (no download)."""
    try:
        import river
    except ImportError:
        raise TinyprotoError("the segment data set ships with the `river` package: pip install river") from None
    archive = Path(river.__file__).parent / "datasets" / "segment.csv.zip"
    with zipfile.ZipFile(archive) as zf:
        text = zf.read(zf.namelist()[0]).decode()
    rows = list(csv.reader(io.StringIO(text)))
    X = np.array([[float(v) for v in row[:-1]] for row in rows[1:]], dtype=np.float64)
    y = np.array([row[-1] for row in rows[1:]])
    return Dataset("segment", X, y)


# ---------------------------------------------------------------------------------------------- files


def _check_exists(path: Path, spec: str) -> None:
    try:
        os.stat(path)
    except FileNotFoundError:
        if os.path.islink(path):
            raise TinyprotoError(
                f"{spec}: is a symbolic link to {os.readlink(path)!r}, which does not exist"
            ) from None
        raise TinyprotoError(
            f"data {spec!r} is neither a built-in data set ({', '.join(BUILTIN)}) nor an existing file"
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


# ---------------------------------------------------------------------------------------------- CSV


def _clean(cell: str) -> str:
    """A cell without surrounding spaces/tabs and one pair of surrounding double quotes."""
    cell = cell.strip(" \t")
    if len(cell) >= 2 and cell[0] == cell[-1] == '"':
        cell = cell[1:-1].strip(" \t")
    return cell


def _blank(record: list[str]) -> bool:
    return all(not c.strip(" \t") for c in record)


def _choose_delimiter(first_line: str) -> str:
    for delimiter in (",", ";", "\t"):
        try:
            fields = next(csv.reader([first_line], delimiter=delimiter))
        except (csv.Error, StopIteration):
            continue
        if len(fields) >= 2:
            return delimiter
    return ","


class _Columns:
    """Header names and the label column, with names for messages."""

    def __init__(self, names: list[str], label_col: int):
        self.names = names
        self.label_col = label_col
        self.features = [j for j in range(len(names)) if j != label_col]

    def describe(self, j: int) -> str:
        return f"column {j + 1} ({self.names[j]!r})" if self.names[j] else f"column {j + 1} (unnamed)"

    def feature_names(self) -> list[str]:
        return [self.describe(j) for j in self.features]


def _load_csv(raw: bytes, name: str, label: str | None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    text = decode_text(raw, name)
    lines = text.splitlines()  # only to find the header line; the parse below uses the csv module
    first = next((i for i, line in enumerate(lines) if line.strip(" \t,;")), None)
    if first is None:
        raise TinyprotoError(f"{name}: has no header and no data (only blank lines)")
    delimiter = _choose_delimiter(lines[first])
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header, header_line = None, 0
        for record in reader:
            if not _blank(record):
                header, header_line = record, reader.line_num
                break
        if header is None:
            raise TinyprotoError(f"{name}: has no header and no data (only blank lines)")
        # "a,b,label," with "1,2,x," rows: a trailing delimiter; with "1,2,x,y" rows: an unnamed last column
        first = next((record for record in reader if not _blank(record)), None)
        first_line = reader.line_num
        trailing_delimiter = (len(header) > 1 and not header[-1].strip(" \t") and
                              (first is None or len(first) < len(header) or not first[-1].strip(" \t")))
        columns = _header(header[:-1] if trailing_delimiter else header, header_line, name, label)
        fast = None if trailing_delimiter else _fast_csv_body(text, header_line, columns, delimiter)
        if fast is not None:
            X, labels, label_lines = fast
        else:
            records = [] if first is None else [(first, first_line)]
            X, labels, label_lines = _csv_body(records, reader, columns, name)
    except csv.Error as exc:
        raise TinyprotoError(f"{name}, line {reader.line_num}: cannot be parsed as CSV ({_reason(exc)})") from None
    y = _typed_labels(labels, label_lines, name, columns)
    label_name = columns.names[columns.label_col]
    if all(_NUMBER.fullmatch(columns.names[j]) for j in columns.features) and label_name in {_clean(v) for v in labels}:
        raise TinyprotoError(
            f"{name}, line {header_line}: the first line looks like data (numbers, then the class {label_name!r}), "
            "not a header; add a header line naming the columns (e.g. f1,f2,...,label)"
        )
    return X, y, columns.feature_names()


def _header(header: list[str], line: int, name: str, label: str | None) -> _Columns:
    names = [_clean(h) for h in header]
    seen: dict[str, int] = {}
    for j, h in enumerate(names):
        if h and h in seen:
            raise TinyprotoError(
                f"{name}, line {line}: columns {seen[h] + 1} and {j + 1} are both named {h!r}; "
                "column names must be unique"
            )
        seen.setdefault(h, j)
    if label is not None:
        wanted = label.strip()
        if not wanted:
            raise TinyprotoError("--label is empty: name the label column")
        if wanted not in seen:
            shown = ", ".join(repr(h) for h in names[:12]) + (", ..." if len(names) > 12 else "")
            raise TinyprotoError(f"{name}: no column named {label!r} for --label; the columns are {shown}")
        label_col = seen[wanted]
    else:
        label_col = len(names) - 1
    if all(_NUMBER.fullmatch(h) for h in names) and (label is None or not _NUMBER.fullmatch(label.strip())):
        raise TinyprotoError(
            f"{name}, line {line}: the first line is all numbers ({', '.join(names[:4])}"
            f"{', ...' if len(names) > 4 else ''}); it must be a header naming the columns (e.g. f1,f2,...,label)"
        )
    if len(names) < 2:
        raise TinyprotoError(
            f"{name}, line {line}: only one column ({names[0]!r}); needs feature columns and a label column "
            "(separated by ',', ';' or tabs)"
        )
    return _Columns(names, label_col)


def _fast_csv_body(text: str, header_line: int, columns: _Columns, delimiter: str):
    """The common case (every row well-formed, every value a plain finite number) at numpy speed, or None.

    `_csv_body` is the reference: whenever anything is unusual this returns None and that parse decides (and
    names the line of the problem). What numpy's loadtxt accepts here is a subset of what `_number` accepts
    (tests/test_data_inputs.py checks the two agree), so the fast path never changes what is accepted.
    """
    if "\ufeff" in text or text.count("\r") != text.count("\r\n"):
        return None  # lone CRs: let the csv module count the lines
    pos = -1
    for _ in range(header_line):
        pos = text.find("\n", pos + 1)
        if pos < 0:
            return None
    body = text[pos + 1:]
    if "\r" in body:
        body = body.replace("\r\n", "\n")
        if "\r" in body:
            return None
    n, features, label_col = len(columns.names), columns.features, columns.label_col
    if len(body) // max(2 * n, 1) * len(features) > 2 * MAX_VALUES:
        return None
    if '"' not in body:
        physical = body.split("\n")
        keep = [i for i, line in enumerate(physical) if line]
        lines = [physical[i] for i in keep]
        if any(line.count(delimiter) != n - 1 for line in lines):
            return None
        if label_col == n - 1:
            labels = [line.rsplit(delimiter, 1)[1] for line in lines]
        else:
            labels = [line.split(delimiter, label_col + 1)[label_col] for line in lines]
        label_lines = [header_line + 1 + i for i in keep]
        numbers = lines
        usecols = features
    else:
        reader = csv.reader(io.StringIO(body, newline=""), delimiter=delimiter)
        records, label_lines = [], []
        try:
            for record in reader:
                if not record:
                    continue
                if len(record) != n:
                    return None
                records.append(record)
                label_lines.append(header_line + reader.line_num)
        except csv.Error:
            return None
        labels = [r[label_col] for r in records]
        numbers = [delimiter.join(r[j] for j in features) for r in records]
        if any(line.count(delimiter) != len(features) - 1 or '"' in line or "\n" in line for line in numbers):
            return None
        usecols = None
    if not numbers or any(not _clean(v) for v in labels):
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            X = np.loadtxt(numbers, delimiter=delimiter, usecols=usecols, dtype=np.float64, comments=None,
                           quotechar=None, ndmin=2)
    except Exception:  # anything loadtxt dislikes: the reference parse explains it
        return None
    if X.shape != (len(labels), len(features)) or X.size > MAX_VALUES:
        return None
    if not np.isfinite(X).all() or np.abs(X).max() > FLOAT32_MAX:
        return None
    return X, labels, label_lines


def _csv_body(records: list, reader, columns: _Columns, name: str):
    """The reference parse: `records` (already read (record, line) pairs), then the rest of `reader`."""
    n = len(columns.names)
    features = columns.features
    label_col = columns.label_col
    blocks: list[np.ndarray] = []  # rows are packed into float64 blocks as they come (bounded memory)
    rows: list[list[float]] = []
    n_rows = 0
    labels: list[str] = []
    label_lines: list[int] = []
    for record, line in itertools.chain(records, ((r, reader.line_num) for r in reader)):
        if _blank(record):
            continue
        if len(record) != n and not (len(record) == n + 1 and not record[-1].strip(" \t")):
            hint = " (an unquoted delimiter inside a value?)" if len(record) > n else ""
            raise TinyprotoError(f"{name}, line {line}: has {len(record)} fields, the header has {n}{hint}")
        n_rows += 1
        if n_rows * len(features) > MAX_VALUES:
            raise TinyprotoError(f"{name}: more than {MAX_VALUES:,} feature values; tinyproto's limit")
        rows.append([_number(record[j], name, line, columns, j) for j in features])
        if len(rows) == 4096:
            blocks.append(np.array(rows, dtype=np.float64))
            rows = []
        labels.append(record[label_col])
        label_lines.append(line)
    if not n_rows:
        raise TinyprotoError(f"{name}: has a header but no data rows")
    blocks.append(np.array(rows, dtype=np.float64).reshape(-1, len(features)))
    return np.concatenate(blocks), labels, label_lines


def _number(cell: str, name: str, line: int, columns: _Columns, j: int) -> float:
    text = _clean(cell)
    if _NUMBER.fullmatch(text):
        value = float(text)
        if abs(value) <= FLOAT32_MAX:
            return value
        problem = f"{_short(text)} is beyond float32's range (|x| > 3.4e38), which the device computes in"
    elif not text:
        problem = "is empty (a missing value); fill or drop the row"
    elif _NONFINITE.fullmatch(text):
        problem = f"holds {text!r}: NaN or infinite values are not accepted; clean or impute them first"
    else:
        problem = f"holds {_short(text)}, which is not a number{_number_hint(text)}"
    raise TinyprotoError(f"{name}, line {line}, {columns.describe(j)}: {problem}")


def _number_hint(text: str) -> str:
    low = text.lower()
    if "," in text:
        return " (decimal or thousands commas are not accepted: use '.' for decimals and no separators)"
    if low.lstrip("+-").startswith(("0x", "0b", "0o")):
        return " (only decimal numbers are accepted)"
    if low in ("true", "false", "yes", "no", "t", "f"):
        return " (write booleans as 1 and 0)"
    if "_" in text or " " in text or "'" in text:
        return " (no digit separators)"
    return ""


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _typed_labels(raw_labels: list[str], lines: list[int], name: str, columns: _Columns) -> np.ndarray:
    """Text labels -> int64 class ids when every one is a whole number, else str; problems name the line."""
    where = columns.describe(columns.label_col)
    labels = [_clean(v) for v in raw_labels]
    numeric: list[int] = []
    text: list[int] = []
    for i, value in enumerate(labels):
        if not value:
            raise TinyprotoError(f"{name}, line {lines[i]}: the label ({where}) is empty; every row needs a class")
        if _NONFINITE.fullmatch(value):
            raise TinyprotoError(f"{name}, line {lines[i]}: the label ({where}) is {value!r}, not a class")
        (numeric if _NUMBER.fullmatch(value) else text).append(i)
    if numeric and text:
        a, b = numeric[0], text[0]
        raise TinyprotoError(
            f"{name}: the label column ({where}) mixes numbers ({labels[a]!r}, line {lines[a]}) and text "
            f"({_short(labels[b])}, line {lines[b]}); make every label a number or every label text"
        )
    if text:
        return np.asarray(labels)
    ids = []
    for i, value in enumerate(labels):
        if len(value) > 40:  # no class id needs more digits (and int() refuses > 4300 of them)
            raise TinyprotoError(f"{name}, line {lines[i]}: the label {_short(value)} is too large for a class id")
        number = int(value) if _INTEGER.fullmatch(value) else float(value)
        if isinstance(number, float) and not number.is_integer():
            raise TinyprotoError(
                f"{name}, line {lines[i]}: the label ({where}) is {value!r}, not a whole number; labels are "
                "class names or integer ids (is this column a measurement? choose the label with --label)"
            )
        number = int(number)
        if not -(2**63) <= number < 2**63:
            raise TinyprotoError(f"{name}, line {lines[i]}: the label {_short(value)} is too large for a class id")
        ids.append(number)
    return np.asarray(ids, dtype=np.int64)


# ---------------------------------------------------------------------------------------------- .npz


def _load_npz(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
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
        with np.load(io.BytesIO(raw), allow_pickle=False) as data:
            X, y = data["X"], data["y"]
    except TinyprotoError:
        raise
    except MemoryError:
        raise TinyprotoError(f"{name}: too large to load into memory") from None
    except Exception as exc:  # a damaged archive raises many types (BadZipFile, EOFError, zlib.error, ...)
        raise TinyprotoError(f"{name}: cannot be read as .npz ({type(exc).__name__}: {_reason(exc)})") from None
    return _npz_features(X, name), _npz_labels(y, name)


def _check_npy_header(archive: zipfile.ZipFile, member: str, key: str, name: str) -> None:
    """Refuse object arrays and oversized shapes from the .npy header, before any data is decompressed."""
    with archive.open(member) as handle:
        version = np.lib.format.read_magic(handle)
        read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
        shape, _, dtype = read(handle)
    if dtype.hasobject:
        raise TinyprotoError(
            f"{name}: array {key} holds Python objects, which need pickle (never loaded); save {key} as numbers "
            "(or y as fixed-width strings)"
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
            raise TinyprotoError(f"{name}: y holds {int(y.max())}, too large for a class id")
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
            raise TinyprotoError(f"{name}: y holds {float(np.abs(y).max())!r}, too large for a class id")
        return y.astype(np.int64)
    if kind in "US":
        if kind == "S":
            try:
                y = np.array([v.decode("utf-8") for v in y.tolist()])
            except UnicodeDecodeError:
                raise TinyprotoError(f"{name}: y holds bytes that are not UTF-8 text") from None
        labels = [v.strip() for v in y.tolist()]
        for i, v in enumerate(labels):
            if not v:
                raise TinyprotoError(f"{name}: y[{i}] is an empty string, not a class")
            if _CONTROL.search(v):
                raise TinyprotoError(f"{name}: y[{i}] contains a control character")
        return np.asarray(labels) if labels else np.asarray(labels, dtype=str)
    what = {"c": "complex numbers", "V": "records", "M": "dates", "m": "time spans"}.get(kind, f"dtype {y.dtype}")
    raise TinyprotoError(f"{name}: y holds {what}; labels must be integers or strings")


# ---------------------------------------------------------------------------------------------- checks


def validate_xy(X: np.ndarray, y: np.ndarray, source: str,
                columns: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Shape, range, class and usefulness checks, each with one clear message. `columns` names the features."""
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError, OverflowError):
        raise TinyprotoError(f"{source}: features must be numeric") from None
    y = np.asarray(y)
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
        raise TinyprotoError(f"{source}: X must be (n, d) and y (n,), got {X.shape} and {y.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise TinyprotoError(f"{source}: no samples or no features (X has shape {X.shape})")

    def column(j: int) -> str:
        return columns[j] if columns is not None else f"column {j}"

    def cell(row: int, col: int) -> str:  # 0-based array indices, or a named column
        return f"row {row + 1}, {columns[col]}" if columns is not None else f"X[{row}, {col}]"

    bad = ~np.isfinite(X)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise TinyprotoError(
            f"{source}: {int(bad.sum())} feature values are NaN or infinite (first at {cell(row, col)}); "
            "clean or impute them first"
        )
    big = np.abs(X) > FLOAT32_MAX
    if big.any():
        row, col = np.argwhere(big)[0]
        raise TinyprotoError(
            f"{source}: {cell(row, col)} is {X[row, col]:.3g}, beyond float32's range (|x| > 3.4e38), "
            "which the device computes in"
        )
    classes, counts = np.unique(y, return_counts=True)
    if classes.size < 2:
        raise TinyprotoError(f"{source}: needs at least two classes, found {classes.size}")
    if classes.size > MAX_CLASSES:
        raise TinyprotoError(f"{source}: {classes.size} classes; the device supports at most {MAX_CLASSES}")
    if counts.min() < 2:
        raise TinyprotoError(
            f"{source}: class {_plain(classes[counts.argmin()])!r} has a single sample; every class needs at least 2"
        )
    check_features_usable(X, source, column)
    return X, y


def check_features_usable(X: np.ndarray, source: str, column=lambda j: f"column {j}") -> None:
    """Refuse features the device cannot use, by the rule of inputstage.standardise_moments."""
    rule = standardise_moments(X.mean(axis=0), X.var(axis=0), "feature")
    magnitude = np.abs(rule.mean)
    # constant for the device, yet more than floating-point noise (a column of 0.3s has std ~1e-17): refuse
    # rather than let the variation vanish without a word; an offset makes it visible
    lost = rule.constant & (rule.std > NOISE_RELATIVE * magnitude) & (rule.std > 0)
    if lost.any():
        j = int(np.argmax(lost))
        if rule.std[j] <= 2.0**-100 and magnitude[j] <= 2.0**-90:
            why = "its values are below 1e-27, which float32 on the device cannot resolve; scale it up"
        else:
            why = (f"its std {rule.std[j]:.3g} around {rule.mean[j]:.7g} is {rule.std[j] / magnitude[j]:.2g} of its "
                   "magnitude, finer than the device's half-float mean (good to 2.4e-4 of it); subtract an offset "
                   "(e.g. its minimum) from the column, or drop it")
        raise TinyprotoError(f"{source}: {column(j)} varies too little for the device to see: {why}")
    if rule.constant.all():
        tiny = float(np.abs(X).max()) < 2.0**-100
        why = ("every value is below 1e-30 in magnitude, which float32 on the device cannot resolve" if tiny else
               "every feature is constant (or varies by less than 0.1 % of its magnitude, which the device's "
               "half-float input stage cannot resolve)")
        raise TinyprotoError(f"{source}: no feature varies: {why}; a model would be useless")
    if rule.floored.any():
        j = int(np.argmax(rule.floored))
        widest = int(np.argmax(rule.std))
        raise TinyprotoError(
            f"{source}: {column(j)} varies by {rule.std[j]:.3g} (std) while {column(widest)} varies by "
            f"{rule.std[widest]:.3g}: the device's input gains (half floats with one shared exponent) cannot span "
            "both; rescale the features (or drop the outlier values)"
        )


def _plain(value):
    return value.item() if hasattr(value, "item") else value


def split(dataset: Dataset, seed: int = 0) -> Split:
    """The fixed stratified split used for every reported figure (25 % test)."""
    from sklearn.model_selection import train_test_split

    classes, counts = np.unique(dataset.y, return_counts=True)
    n_test = int(np.ceil(TEST_FRACTION * len(dataset.y)))
    if n_test < classes.size or counts.min() < 4:
        raise TinyprotoError(
            f"{dataset.name}: too few samples ({len(dataset.y)} rows, smallest class {counts.min()}) for a "
            f"stratified 25 % test split; every class needs at least 4 samples"
        )
    X_tr, X_te, y_tr, y_te = train_test_split(
        dataset.X, dataset.y, test_size=TEST_FRACTION, stratify=dataset.y, random_state=seed
    )
    names = dataset.columns
    check_features_usable(X_tr, f"{dataset.name} (training split)",
                          (lambda j: names[j]) if names is not None else (lambda j: f"column {j}"))
    check_int8_inputs_vary(X_tr, f"{dataset.name} (training split)")
    return Split(X_tr, y_tr, X_te, y_te)


def check_int8_inputs_vary(X: np.ndarray, source: str) -> None:
    """Refuse data whose int8 inputs would all be constant: every feature standardised (the one rule) and put
    on the int8 grid (`choose_input_scale`, as every family does) takes a single value. This happens when a few
    enormous outliers set each feature's std, so every ordinary value rounds to the same int8 step."""
    from tinyproto.core.inputstage import INPUT_MAX, choose_input_scale, standardisation

    X = X[:: max(1, len(X) // 4000)]  # a deterministic sample is plenty for this
    mean, scale = standardisation(X)
    Z = (X - mean) / scale
    step = choose_input_scale(Z)
    n, d = X.shape
    q = np.clip(np.rint(Z / step), -INPUT_MAX, INPUT_MAX).astype(np.int64) + INPUT_MAX  # 0..254
    counts = np.bincount((q + (2 * INPUT_MAX + 1) * np.arange(d)).reshape(-1), minlength=(2 * INPUT_MAX + 1) * d)
    differing = n - counts.reshape(d, -1).max(axis=1)  # rows off each feature's most common int8 value
    if not (differing >= max(2, math.ceil(0.005 * n))).any():
        raise TinyprotoError(
            f"{source}: on the int8 grid every feature takes one value in all but a handful of rows, so a model "
            "would be useless (a few huge outliers setting every feature's spread?); remove the outliers or "
            "transform the features (e.g. log)"
        )
