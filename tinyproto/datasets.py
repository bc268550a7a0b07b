"""Load the user's data (built-in name, CSV, .npz) into one validated, numeric `Dataset`."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinyproto.errors import TinyprotoError

BUILTIN = ("digits", "breast_cancer", "wine", "iris", "segment")
TEST_FRACTION = 0.25


@dataclass(frozen=True)
class Dataset:
    name: str
    X: np.ndarray  # float64 (n, d), finite
    y: np.ndarray  # original labels (n,)


@dataclass(frozen=True)
class Split:
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray


def load_dataset(spec: str, label: str | None = None) -> Dataset:
    """`spec` is a built-in name, a .csv file (header row; label = last column or `label`) or an .npz (X, y)."""
    if spec in BUILTIN:
        return _load_builtin(spec)
    path = Path(spec)
    if not path.exists():
        raise TinyprotoError(
            f"data {spec!r} is neither a built-in data set ({', '.join(BUILTIN)}) nor an existing file"
        )
    if path.suffix.lower() == ".npz":
        X, y = _load_npz(path)
    elif path.suffix.lower() in (".csv", ".txt"):
        X, y = _load_csv(path, label)
    else:
        raise TinyprotoError(f"{path}: unsupported file type {path.suffix!r}; use .csv or .npz")
    return Dataset(path.stem, *validate_xy(X, y, source=str(path)))


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
    import io
    import zipfile

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


def _load_npz(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as data:
            if "X" not in data or "y" not in data:
                raise TinyprotoError(f"{path}: an .npz data file needs arrays named 'X' and 'y'")
            X, y = data["X"], data["y"]
    except (ValueError, OSError) as exc:
        raise TinyprotoError(f"{path}: cannot read as .npz without pickle ({exc})") from None
    if X.dtype == object or y.dtype == object:
        raise TinyprotoError(f"{path}: X and y must be plain numeric arrays")
    return X, y


def _load_csv(path: Path, label: str | None) -> tuple[np.ndarray, np.ndarray]:
    with path.open(newline="") as handle:
        rows = list(csv.reader(handle))
    if len(rows) < 2:
        raise TinyprotoError(f"{path}: needs a header row and at least one data row")
    header, body = [h.strip() for h in rows[0]], rows[1:]
    label_col = len(header) - 1
    if label is not None:
        if label not in header:
            raise TinyprotoError(f"{path}: no column named {label!r}; columns are {', '.join(header)}")
        label_col = header.index(label)
    feature_cols = [i for i in range(len(header)) if i != label_col]
    if not feature_cols:
        raise TinyprotoError(f"{path}: needs at least one feature column besides the label")
    X = np.empty((len(body), len(feature_cols)), dtype=np.float64)
    labels = []
    for r, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise TinyprotoError(f"{path}:{r}: has {len(row)} fields, the header has {len(header)}")
        for c, col in enumerate(feature_cols):
            try:
                X[r - 2, c] = float(row[col])
            except ValueError:
                raise TinyprotoError(
                    f"{path}:{r}: column {header[col]!r} holds {row[col]!r}, which is not a number"
                ) from None
        labels.append(row[label_col].strip())
    return X, _labels_as_array(labels)


def _labels_as_array(labels: list[str]) -> np.ndarray:
    """Integer labels stay integers (so class ids match the user's), anything else stays text."""
    try:
        return np.asarray([int(v) for v in labels])
    except ValueError:
        return np.asarray(labels)


def validate_xy(X: np.ndarray, y: np.ndarray, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Shape, finiteness and class checks, each with one clear message."""
    try:
        X = np.asarray(X, dtype=np.float64)
    except (TypeError, ValueError):
        raise TinyprotoError(f"{source}: features must be numeric") from None
    y = np.asarray(y)
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
        raise TinyprotoError(f"{source}: X must be (n, d) and y (n,), got {X.shape} and {y.shape}")
    bad = ~np.isfinite(X)
    if bad.any():
        row, col = np.argwhere(bad)[0]
        raise TinyprotoError(
            f"{source}: {int(bad.sum())} feature values are NaN or infinite (first at row {row}, column {col}); "
            "clean or impute them first"
        )
    classes, counts = np.unique(y, return_counts=True)
    if classes.size < 2:
        raise TinyprotoError(f"{source}: needs at least two classes, found {classes.size}")
    if classes.size > 255:
        raise TinyprotoError(f"{source}: {classes.size} classes; the device supports at most 255")
    if counts.min() < 2:
        raise TinyprotoError(
            f"{source}: class {classes[counts.argmin()]!r} has a single sample; every class needs at least 2"
        )
    return X, y


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
    return Split(X_tr, y_tr, X_te, y_te)
