"""The CSV reader: header, delimiter, a numpy fast path for well-formed files and a reference parse that names
the line and column of any problem (rules: tinyproto.core.datasets' docstring). Layer: core.
"""

from __future__ import annotations

import csv
import difflib
import itertools
import re
import shlex
import warnings

import numpy as np

from tinyproto.core.data_files import (_NONFINITE, _NUMBER, FLOAT32_MAX, MAX_VALUES, _reason,
                                       _short, decode_text)
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.labels import code_labels


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

    def __init__(self, names: list[str], label_col: int, label_given: bool = True):
        self.names = names
        self.label_col = label_col
        self.label_given = label_given  # False: the default (the last column); a text column hints --label
        self.decimal_comma = False  # a ';' file whose numbers use the decimal comma (12,5): read as 12.5
        self.features = [j for j in range(len(names)) if j != label_col]

    def describe(self, j: int) -> str:
        return f"column {j + 1} ({self.names[j]!r})" if self.names[j] else f"column {j + 1} (unnamed)"

    def feature_names(self) -> list[str]:
        return [self.describe(j) for j in self.features]


def load_csv(raw: bytes, name: str, label: str | None) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Pass `raw` as the only reference to the bytes (load_csv(read_regular_file(...))): it is dropped once
    decoded, so a file near the size limit is not held twice while it is parsed."""
    text = decode_text(raw, name)
    del raw
    header_text = _first_nonblank_line(text)  # only to choose the delimiter; the parse below uses the csv module
    if header_text is None:
        raise TinyprotoError(f"{name}: has no header and no data (only blank lines)")
    delimiter = _choose_delimiter(header_text)
    decimal_comma = delimiter == ";" and _writes_decimal_commas(text)
    reader = csv.reader(_lines(text), delimiter=delimiter)
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
        columns = _header(header[:-1] if trailing_delimiter else header, header_line, name, label, decimal_comma)
        fast = None if trailing_delimiter else _fast_csv_body(text, header_line, columns, delimiter)
        if fast is not None:
            X, labels, label_lines = fast
        else:
            records = [] if first is None else [(first, first_line)]
            X, labels, label_lines = _csv_body(records, reader, columns, name)
    except csv.Error as exc:
        raise TinyprotoError(f"{name}, line {reader.line_num}: cannot be parsed as CSV ({_reason(exc)})") from None
    _refuse_row_index(X, name, columns)
    y = _typed_labels(labels, label_lines, name, columns)
    label_name = columns.names[columns.label_col]
    if all(_numeric(columns.names[j], decimal_comma) for j in columns.features) and \
            label_name in {_clean(v) for v in labels}:
        raise TinyprotoError(
            f"{name}, line {header_line}: the first line looks like data (numbers, then the class {label_name!r}), "
            "not a header; add a header line naming the columns (e.g. f1,f2,...,label)"
        )
    return X, y, columns.feature_names()


# the header pandas' to_csv (index=True, its default), R's write.csv and spreadsheets give a column of row numbers
_INDEX_NAMES = {"", "index", "unnamed: 0", "row", "row.names", "rownames"}


def _refuse_row_index(X: np.ndarray, name: str, columns: _Columns) -> None:
    """An unnamed (or "index") feature column that counts the rows 0, 1, 2, ... or 1, 2, 3, ... is the row index
    a data frame library wrote, not a measurement: the device will never see it, and on a file sorted by class it
    predicts the class, so the model would be scored on it and then be useless on the board."""
    n = X.shape[0]
    if n < 3:
        return
    for k, j in enumerate(columns.features):
        if columns.names[j].casefold() in _INDEX_NAMES and X[0, k] in (0.0, 1.0) and \
                np.array_equal(X[:, k], X[0, k] + np.arange(n, dtype=np.float64)):
            raise TinyprotoError(
                f"{name}: {columns.describe(j)} holds the row numbers {int(X[0, k])}, {int(X[0, k]) + 1}, "
                f"{int(X[0, k]) + 2}, ... (the row index a data frame writes, e.g. pandas' to_csv without "
                "index=False), not a measurement the device will see; delete that column"
            )


_LINE = re.compile(r"[^\r\n]*")
_LINE_WITH_END = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+")


def _lines(text: str):
    """The lines of `text` with their ends, as io.StringIO(text, newline="") yields them to the csv module, but
    lazily: StringIO copies its text at 4 bytes per character (2 GB for a 500 MB file, on top of the text)."""
    return (match.group() for match in _LINE_WITH_END.finditer(text))


def _first_nonblank_line(text: str) -> str | None:
    """The first line with a cell in it, found lazily: splitting a 500 MB file into lines for this cost a
    list of millions of strings (decode_text has refused the other characters str.splitlines() breaks at)."""
    for match in _LINE.finditer(text):
        if match.group().strip(" \t,;"):
            return match.group()
    return None


def _header(header: list[str], line: int, name: str, label: str | None, decimal_comma: bool = False) -> _Columns:
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
            raise TinyprotoError(f"{name}: no column named {label!r} for --label{_did_you_mean(wanted, names)}; "
                                 f"the columns are {shown}")
        label_col = seen[wanted]
    else:
        label_col = len(names) - 1
        _refuse_a_label_column_left_out(names, line, name)
    if all(_numeric(h, decimal_comma) for h in names) and (label is None or not _NUMBER.fullmatch(label.strip())):
        raise TinyprotoError(
            f"{name}, line {line}: the first line is all numbers ({', '.join(names[:4])}"
            f"{', ...' if len(names) > 4 else ''}); it must be a header naming the columns (e.g. f1,f2,...,label)"
        )
    if len(names) < 2:
        raise TinyprotoError(
            f"{name}, line {line}: only one column ({names[0]!r}); needs feature columns and a label column "
            "(separated by ',', ';' or tabs)"
        )
    columns = _Columns(names, label_col, label_given=label is not None)
    columns.decimal_comma = decimal_comma
    return columns


# Headers that name the label column (Kaggle's MNIST CSV has `label` first): not 'y', an accelerometer's axis
_LABEL_NAMES = {"label", "labels", "class", "classes", "target"}


def _refuse_a_label_column_left_out(names: list[str], line: int, name: str) -> None:
    """Without --label the label is the last column; a header naming another column 'label' (or 'class',
    'target') means the user's classes are there, and the last column would be trained on as the label: pixel783
    of an MNIST CSV gave 'too few samples', an integer feature such as a weekday could give a model of it."""
    if names[-1].casefold() in _LABEL_NAMES:
        return
    named = [j for j, h in enumerate(names[:-1]) if h.casefold() in _LABEL_NAMES]
    if len(named) == 1:
        j = named[0]
        raise TinyprotoError(
            f"{name}, line {line}: column {j + 1} is named {names[j]!r}, but without --label the label is the last "
            f"column ({names[-1]!r}); pass --label {shlex.quote(names[j])} (or --label {shlex.quote(names[-1])} to "
            "keep the last column)"
        )


# A ';'-separated file whose numbers are written 12,5 and never 12.5: a spreadsheet in a locale with the decimal
# comma (German, French, ... Excel). Its feature cells are read with the comma as the decimal point.
_DIGIT_COMMA_DIGIT = re.compile(r"\d,\d")
_DIGIT_POINT_DIGIT = re.compile(r"\d\.\d")


def _writes_decimal_commas(text: str) -> bool:
    return bool(_DIGIT_COMMA_DIGIT.search(text)) and not _DIGIT_POINT_DIGIT.search(text)


def _as_point(text: str, decimal_comma: bool) -> str:
    """A cell's number text with its one decimal comma made a point, in a decimal-comma file (else unchanged)."""
    return text.replace(",", ".") if decimal_comma and text.count(",") == 1 else text


def _numeric(text: str, decimal_comma: bool) -> bool:
    return bool(_NUMBER.fullmatch(_as_point(text, decimal_comma)))


def _did_you_mean(wanted: str, names: list[str]) -> str:
    """' (did you mean 'Activity'?)' for a --label that differs from a column name in case or by a typo."""
    same_case = [h for h in names if h and h.casefold() == wanted.casefold()]
    close = same_case or difflib.get_close_matches(wanted, [h for h in names if h], n=1, cutoff=0.75)
    return f" (did you mean {close[0]!r}?)" if close else ""


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
        del body  # (a copy of the text: not kept beside its lines)
        keep = [i for i, line in enumerate(physical) if line]
        lines = [physical[i] for i in keep]
        if any(line.count(delimiter) != n - 1 for line in lines):
            return None
        if label_col == n - 1:
            labels = [line.rsplit(delimiter, 1)[1] for line in lines]
        else:
            labels = [line.split(delimiter, label_col + 1)[label_col] for line in lines]
        label_lines = [header_line + 1 + i for i in keep]
        numbers = [line.replace(",", ".") for line in lines] if columns.decimal_comma else lines
        usecols = features
    else:
        reader = csv.reader(_lines(body), delimiter=delimiter)
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
        if columns.decimal_comma:
            numbers = [line.replace(",", ".") for line in numbers]
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
    rows_in = itertools.chain(records, ((r, reader.line_num) for r in reader))
    for record, line in rows_in:
        if _blank(record):
            continue
        if len(record) != n and not (len(record) == n + 1 and not record[-1].strip(" \t")):
            hint = " (an unquoted delimiter inside a value?)" if len(record) > n else ""
            raise TinyprotoError(f"{name}, line {line}: has {len(record)} fields, the header has {n}{hint}")
        n_rows += 1
        if n_rows * len(features) > MAX_VALUES:
            raise TinyprotoError(f"{name}: more than {MAX_VALUES:,} feature values; tinyproto's limit")
        try:
            rows.append([_number(record[j], name, line, columns, j) for j in features])
        except _EmptyCell as exc:
            raise TinyprotoError(f"{exc}{_empty_rows(line, rows_in, columns)}") from None
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
    if _numeric(text, columns.decimal_comma):
        value = float(_as_point(text, columns.decimal_comma))
        if abs(value) <= FLOAT32_MAX:
            return value
        problem = f"{_short(text)} is beyond float32's range (|x| > 3.4e38), which the device computes in"
    elif not text:
        raise _EmptyCell(f"{name}, line {line}, {columns.describe(j)}: is empty (a missing value)")
    elif _NONFINITE.fullmatch(text):
        problem = f"holds {text!r}: NaN or infinite values are not accepted; clean or impute them first"
    else:
        problem = f"holds {_short(text)}, which is not a number{_number_hint(text) or _label_hint(columns, j)}"
    raise TinyprotoError(f"{name}, line {line}, {columns.describe(j)}: {problem}")


class _EmptyCell(TinyprotoError):
    """The first empty feature cell; `_csv_body` adds every other row that has one before the user sees it."""


def _empty_rows(first_line: int, rest, columns: _Columns) -> str:
    """The end of the empty-cell message: every line with an empty feature cell (the first at `first_line`, then
    the rest of the file), so that one round of cleaning fixes them all, and what to do."""
    n = len(columns.names)
    lines = [first_line] + [line for record, line in rest if len(record) >= n and not _blank(record)
                            and any(not _clean(record[j]) for j in columns.features)]
    if len(lines) == 1:
        return "; it is the only one: fill it, or delete the row"
    shown = ", ".join(str(line) for line in lines[:10]) + (", ..." if len(lines) > 10 else "")
    return f"; {len(lines)} rows have an empty cell (lines {shown}): fill them, or delete those rows"


def _number_hint(text: str) -> str:
    low = text.lower()
    if "," in text:
        return (" (decimal or thousands commas are not accepted: use '.' for decimals and no separators; a "
                "';'-separated file is read with decimal commas when none of its numbers has a '.')")
    if low.lstrip("+-").startswith(("0x", "0b", "0o")):
        return " (only decimal numbers are accepted)"
    if low in ("true", "false", "yes", "no", "t", "f"):
        return " (write booleans as 1 and 0)"
    if re.search(r"[_ ']", text) and _NUMBER.fullmatch(re.sub(r"[_ ']", "", text)):
        return " (no digit separators)"  # 1_000, 1 000, 1'000; not a name such as class_0
    return ""


def _label_hint(columns: _Columns, j: int) -> str:
    """A text cell in a feature column while the label column is the default: the labels may be this column."""
    if columns.label_given:
        return ""
    name = columns.names[j]
    if not name or not name.isprintable():
        return "; if this column holds the labels, give it a header name and pass it as --label"
    return f"; if this column holds the labels, pass --label {shlex.quote(name)} (the default is the last column)"


def _typed_labels(raw_labels: list[str], lines: list[int], name: str, columns: _Columns) -> np.ndarray:
    """Text labels -> class labels by the one label coding (core/labels.py); problems name the line."""
    return code_labels([_clean(v) for v in raw_labels], lambda i: f"{name}, line {lines[i]}",
                       f"the label ({columns.describe(columns.label_col)})")
