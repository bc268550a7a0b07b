"""Checks every data source passes before training: shape, range, classes, and features the device can see.

Layer: core. The rules are in tinyproto.core.datasets' docstring.
"""

from __future__ import annotations

import math

import numpy as np

from tinyproto.core.data_files import FLOAT32_MAX, NOISE_RELATIVE
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.inputstage import standardise_moments

MAX_CLASSES = 255
MAX_FEATURES = 65535  # the device counts and indexes input columns in 16 bits (tp_input.c, the families' loops)


# ---------------------------------------------------------------------------------------------- checks


def check_training_arrays(X, y, source: str, columns: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The checks any training rows pass, whoever gives them (a data file, or the Python API's arrays: lists, a
    pandas DataFrame and Series, numpy arrays): numbers in a 2-D X with one label per row, finite and within
    float32's range, labels all numbers or all text, 2 to 255 classes. Returns (X, y) as numpy arrays: a numeric
    ndarray as it was (its dtype kept, so a model is the same bit for bit), anything else as float64."""
    if X is None or y is None:
        raise TinyprotoError(f"{source}: both X (the features) and y (the labels) are needed, got "
                             f"{'X None' if X is None else 'y None'}")
    raw = X if isinstance(X, np.ndarray) else np.asarray(X)  # a DataFrame: its values
    if raw.dtype.kind == "c" or np.asarray(y).dtype.kind == "c":
        raise TinyprotoError(f"{source}: complex numbers; features and labels must be real numbers")
    if raw.dtype.kind in "biuf":
        X = raw
    else:
        try:
            with np.errstate(over="ignore", invalid="ignore"):
                X = np.asarray(raw, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            raise TinyprotoError(f"{source}: features must be numeric") from None
    y = np.asarray(y)
    if X.ndim != 2 or y.ndim != 1 or X.shape[0] != y.shape[0]:
        raise TinyprotoError(f"{source}: X must be (n, d) and y (n,), got {X.shape} and {y.shape}")
    if X.shape[0] == 0 or X.shape[1] == 0:
        raise TinyprotoError(f"{source}: no samples or no features (X has shape {X.shape})")
    if X.shape[1] > MAX_FEATURES:
        raise TinyprotoError(f"{source}: {X.shape[1]:,} features; the device indexes inputs in 16 bits, at most "
                             f"{MAX_FEATURES:,} (reduce or pool the columns first)")

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
    if y.dtype.kind == "f" and not np.isfinite(y).all():
        raise TinyprotoError(f"{source}: {int((~np.isfinite(y)).sum())} labels are NaN or infinite; every row needs "
                             "its class")
    try:
        classes = np.unique(y)
    except TypeError:  # numpy cannot order them: 1 and 'a', or None among numbers
        raise TinyprotoError(f"{source}: the labels mix numbers and text (or hold values that cannot be ordered, "
                             "such as None); give every label as a number, or every one as text") from None
    if classes.size < 2:
        raise TinyprotoError(f"{source}: needs at least two classes, found {classes.size}")
    if classes.size > MAX_CLASSES:
        raise TinyprotoError(f"{source}: {classes.size} classes; the device supports at most {MAX_CLASSES}")
    return X, y


def validate_xy(X: np.ndarray, y: np.ndarray, source: str,
                columns: list[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Shape, range, class and usefulness checks, each with one clear message. `columns` names the features."""
    X, y = check_training_arrays(X, y, source, columns)
    X = X.astype(np.float64, copy=False)

    def column(j: int) -> str:
        return columns[j] if columns is not None else f"column {j}"

    classes, counts = np.unique(y, return_counts=True)
    if counts.min() < 2:
        raise TinyprotoError(
            f"{source}: class {_plain(classes[counts.argmin()])!r} has a single sample; every class needs at least 4 "
            "(for the stratified 25 % test split)"
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


def check_int8_inputs_vary(X: np.ndarray, source: str, y: np.ndarray | None = None) -> None:
    """Refuse data whose int8 inputs cannot tell its rows apart: every feature standardised (the one rule) and put
    on the int8 grid (`choose_input_scale`, as every family does). This happens when a few enormous outliers set
    each feature's std, so every ordinary value rounds to the same int8 step. Two views of it:
    - every feature takes a single int8 value in all but a handful of rows;
    - with the labels `y`: the rows' int8 vectors separate the classes by less than half of what the raw rows do
      (grouping equal vectors, the best any model of them can score on these rows, over the majority class).
      Two outliers among 68 rows pass the first view (they are the rows that differ) and not this one."""
    from tinyproto.core.inputstage import INPUT_MAX, choose_input_scale, standardisation

    every = max(1, len(X) // 4000)
    X = X[::every]  # a deterministic sample is plenty for this
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
    if y is None:
        return
    classes = np.unique(np.asarray(y)[::every], return_inverse=True)[1]
    majority = int(np.bincount(classes).max())
    raw_best = _best_by_groups(X, classes)[1] - majority
    vectors, int8_best = _best_by_groups(q.astype(np.uint8), classes)
    int8_best -= majority
    if raw_best > 0 and int8_best < 0.5 * raw_best:
        raise TinyprotoError(
            f"{source}: on the int8 grid the device sees, the rows fall into {vectors} distinct "
            f"input vectors, which separate the classes on {int8_best} rows beyond always answering the largest "
            f"class, where the raw values separate them on {raw_best}; a model would be useless (a few huge outliers "
            "setting every feature's spread?); remove the outliers or transform the features (e.g. log)"
        )


def _best_by_groups(A: np.ndarray, classes: np.ndarray) -> tuple[int, int]:
    """(groups, best): the number of distinct rows of A, and the most rows any model of A's rows can label right
    (rows with equal values in A share one answer: the most common class among them)."""
    keys: dict[bytes, int] = {}
    group = np.fromiter((keys.setdefault(row.tobytes(), len(keys)) for row in np.ascontiguousarray(A)),
                        dtype=np.int64, count=len(A))
    table = np.zeros((len(keys), int(classes.max()) + 1), dtype=np.int64)
    np.add.at(table, (group, classes), 1)
    return len(keys), int(table.max(axis=1).sum())
