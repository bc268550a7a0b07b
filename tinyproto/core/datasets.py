"""Load the user's data (built-in name, CSV, .npz) into one validated, numeric `Dataset`.

Modules: built-in sets in core/builtin_sets.py (incl. `digits16` / `digits28`, stand-ins for USPS- and
MNIST-sized inputs), safe file reading, text decoding and .npz in core/data_files.py, CSV in core/data_csv.py,
the checks every source passes in core/data_checks.py. Any width loads (a 10,000 x 784 CSV in under a second;
4,096 columns and more); whether a model fits it is the solver's answer (fitted, or refused naming the limit).

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
  TSV). Non-empty column names must be unique; --label must name exactly one column (default: the last, and a
  file whose header names exactly one other column label/labels/class/classes/target is refused without it);
* blank lines (and lines of only delimiters) are skipped; CRLF / CR line ends, cells quoted or padded with
  spaces are fine; one trailing delimiter per line is ignored; every other line must have the header's number
  of fields;
* feature cells are ASCII decimal numbers (1, -2.5, .5, 3e-4). Refused with the line and column: empty cells,
  NaN/inf, values beyond float32 (|x| > 3.4e38, the device's arithmetic), thousands/decimal commas (except a
  ';'-separated file with no '.' between two digits anywhere and some ',' between two digits: a spreadsheet in
  a decimal-comma locale, whose feature cells are read with ',' as the decimal point), hex,
  booleans and any other text (when --label was not given, the message suggests --label for that column). An
  empty cell's message lists every line that has one;
* a feature column named '', 'index', 'Unnamed: 0', 'row', 'row.names' or 'rownames' whose values count the
  rows in order from 0 or 1 is a data frame's row index (pandas' to_csv by default) and is refused: the device
  never sees it;
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
inputstage.standardise_moments). Truly constant features (std at floating-point noise) are fine. After the
split, the training rows on the int8 grid must still tell the classes apart: refused when every feature is one
int8 value in all but a handful of rows, or when the rows' int8 vectors separate the classes (beyond the largest
class) on less than half the rows the raw values do (a few huge outliers setting every feature's spread).
Layer: core.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyproto.core.builtin_sets import BUILTIN, load_builtin
from tinyproto.core.data_checks import (MAX_CLASSES, check_features_usable, check_int8_inputs_vary,  # noqa: F401
                                        validate_xy)
from tinyproto.core.data_csv import load_csv
from tinyproto.core.data_files import (CSV_SUFFIXES, MAX_FILE_BYTES, MAX_VALUES, _check_exists,  # noqa: F401
                                       decode_text, load_npz, read_regular_file)
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.option_lists import check_seed

TEST_FRACTION = 0.25



@dataclass(frozen=True)
class Dataset:
    name: str
    X: np.ndarray  # float64 (n, d), finite, within float32
    y: np.ndarray  # original labels (n,): int64 or str
    columns: tuple[str, ...] | None = None  # feature names for messages ("column 2 ('width')"), CSV only
    # the file's own name without its suffix, as the system gave it (a name that is not UTF-8 keeps its bytes as
    # surrogate escapes, where `name` shows U+FFFD): the default output directory is named after it
    file_stem: str | None = None
    # the data file as the user named it (None for a built-in set): what a message about the data names, so that
    # "my data: too few samples" names the file, "data/my data.csv", not its stem
    source: str | None = None

    @property
    def where(self) -> str:
        """The data set as messages name it: the file as given, or the built-in set's name."""
        return self.source or self.name


@dataclass(frozen=True)
class Split:
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


def load_dataset(spec: str, label: str | None = None) -> Dataset:
    """`spec` is a built-in name, a .csv file (header row; label = last column or `label`) or an .npz (X, y)."""
    if isinstance(spec, os.PathLike):  # a pathlib.Path is a file's name too
        spec = os.fspath(spec)
        spec = spec if isinstance(spec, str) else os.fsdecode(spec)
    if spec is not None and not isinstance(spec, str):  # arrays or a DataFrame were "no data given"
        raise TinyprotoError(f"data must be a built-in data set's name or a file's path, not {type(spec).__name__}; "
                             "to train on arrays in Python, use tinyproto.families.fit_under_budget(family, X, y, "
                             "options), or save them with numpy.savez(path, X=X, y=y)")
    if not isinstance(spec, str) or not spec.strip():
        raise TinyprotoError(f"no data given: name a built-in data set ({', '.join(BUILTIN)}), a CSV or an .npz file")
    if spec in BUILTIN:
        if label is not None:
            raise TinyprotoError(
                f"--label {label!r} is for CSV files; the built-in data set {spec!r} has its own labels"
            )
        return Dataset(spec, *load_builtin(spec))
    path = Path(spec)
    suffix = path.suffix.lower()
    _check_exists(path, spec)
    if suffix not in CSV_SUFFIXES + (".npz",):
        raise TinyprotoError(
            f"{spec}: unsupported file type {path.suffix!r}; use a .csv (or .txt/.tsv) or an .npz file"
        )
    if suffix == ".npz":
        if label is not None:
            raise TinyprotoError(f"--label {label!r} is for CSV files; {spec} has its labels in the array y")
        X, y = load_npz(read_regular_file(path), spec)
        columns = None
    else:
        X, y, columns = load_csv(read_regular_file(path), spec, label)  # the bytes' only reference: freed once decoded
    X, y = validate_xy(X, y, source=spec, columns=columns)
    return Dataset(_display_name(path.stem or path.name), X, y, tuple(columns) if columns is not None else None,
                   path.stem or path.name, _display_name(spec))


def _display_name(name: str) -> str:
    """The data set's name as it goes into model.json, headers and reports: a file name that is not valid
    UTF-8 (os.fsdecode's surrogate escapes) is shown with U+FFFD instead of making every writer fail."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")


def default_out_dir(dataset: Dataset, suffix: str = "") -> Path:
    """build/NAME (NAME the data file's name without its suffix, or the built-in set's, then `suffix`), the default
    model directory: its name as UTF-8 bytes on disk whatever the locale. Under a locale that is not UTF-8 (LC_ALL=C)
    the file system encoding is ASCII, so a non-ASCII name ("café") could not be encoded and every verb failed on the
    path. A file name that is not UTF-8 is refused: its bytes would make a directory no verb accepts, and U+FFFD in
    their place a name that is not the file's."""
    raw = (dataset.file_stem or dataset.name).encode("utf-8", "surrogateescape")
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TinyprotoError(f"the data file's name '{raw.decode('utf-8', 'backslashreplace')}' is not UTF-8, so no "
                             "directory build/<name> is made from it; give --out DIR") from None
    return Path("build") / os.fsdecode(raw + suffix.encode("utf-8"))


def split(dataset: Dataset, seed: int = 0) -> Split:
    """The fixed stratified split used for every reported figure (25 % test)."""
    from sklearn.model_selection import train_test_split

    if not isinstance(dataset, Dataset):  # an AttributeError ("'str' object has no attribute 'y'") said nothing
        raise TinyprotoError(f"split() takes the Dataset that load_dataset() returns, not {type(dataset).__name__}")
    check_seed(seed, "the split's seed")

    classes, counts = np.unique(dataset.y, return_counts=True)
    n_test = int(np.ceil(TEST_FRACTION * len(dataset.y)))
    if n_test < classes.size or counts.min() < 4:
        raise TinyprotoError(
            f"{dataset.where}: too few samples ({len(dataset.y)} rows, smallest class {counts.min()}) for a "
            f"stratified 25 % test split; every class needs at least 4 samples"
        )
    X_tr, X_te, y_tr, y_te = train_test_split(
        dataset.X, dataset.y, test_size=TEST_FRACTION, stratify=dataset.y, random_state=seed
    )
    names = dataset.columns
    check_features_usable(X_tr, f"{dataset.where} (training split)",
                          (lambda j: names[j]) if names is not None else (lambda j: f"column {j}"))
    check_int8_inputs_vary(X_tr, f"{dataset.where} (training split)", y_tr)
    return Split(X_tr, y_tr, X_te, y_te)

__all__ = ["BUILTIN", "CSV_SUFFIXES", "MAX_CLASSES", "MAX_FILE_BYTES", "MAX_VALUES", "TEST_FRACTION", "Dataset",
           "Split", "check_features_usable", "check_int8_inputs_vary", "decode_text", "load_dataset",
           "read_regular_file", "split", "validate_xy"]
