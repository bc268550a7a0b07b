"""The one label coding: how a label is read (from a CSV cell, an .npz array), and how a label becomes the class
index the model, the test vectors and the device use. Every reader and every comparison goes through here, so a
label means the same class in training, cross-validation, the test split, the host reference, the device and
the reports.

Reading (`code_labels`): text is trimmed and put in Unicode NFC form (so 'é' typed as one or two code points is
one class). If every label is a number, they must all be whole numbers and become int64 class ids: "7", "007",
"+7", "7.0" and 7.0 are one class, 7; "-1" is -1. Otherwise every label must be text (no mix of numbers and
text), compared as text. Empty, NaN or infinite labels and ids beyond int64 are refused.

Classes (`class_list`): the distinct labels in ascending order (numbers by value, text by code point): class
index i of the model is class_list(y)[i], whatever order the rows come in. `encode(y, classes)` maps labels to
those indices and refuses a label the model does not know.
Layer: core.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable

import numpy as np

from tinyproto.core.errors import TinyprotoError

_NUMBER = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_NONFINITE = re.compile(r"[+-]?(?:nan|inf|infinity)", re.IGNORECASE)
MAX_ID_DIGITS = 40  # no class id needs more (and int() refuses thousands of digits)


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def normal_text(label: str) -> str:
    return unicodedata.normalize("NFC", label.strip())


def code_labels(raw: list[str], where: Callable[[int], str], column: str = "the label") -> np.ndarray:
    """Labels read as text -> int64 class ids when every one is a number (whole), else NFC text. `where(i)` names
    label i's place for messages ("data.csv, line 7"); `column` names the label column."""
    labels = [normal_text(v) for v in raw]
    numeric: list[int] = []
    text: list[int] = []
    for i, value in enumerate(labels):
        if not value:
            raise TinyprotoError(f"{where(i)}: {column} is empty (an empty string); every row needs a class")
        if _NONFINITE.fullmatch(value):
            raise TinyprotoError(f"{where(i)}: {column} is {value!r}, not a class")
        (numeric if _NUMBER.fullmatch(value) else text).append(i)
    if numeric and text:
        a, b = numeric[0], text[0]
        raise TinyprotoError(
            f"{where(a)}: {column} mixes numbers ({labels[a]!r}) and text ({_short(labels[b])}, {where(b)}); "
            "make every label a number or every label text")
    if text:
        return np.asarray(labels)
    ids = []
    for i, value in enumerate(labels):
        if len(value) > MAX_ID_DIGITS:
            raise TinyprotoError(f"{where(i)}: the label {_short(value)} is too large for a class id (a 64-bit "
                                 "integer); give such classes as text (a letter before the digits) or as smaller "
                                 "numbers")
        number = int(value) if _INTEGER.fullmatch(value) else float(value)
        if isinstance(number, float) and not number.is_integer():
            raise TinyprotoError(
                f"{where(i)}: {column} is {value!r}, not a whole number; labels are class names or integer ids "
                "(is this column a measurement? choose the label with --label)")
        number = int(number)
        if not -(2**63) <= number < 2**63:
            raise TinyprotoError(f"{where(i)}: the label {_short(value)} is too large for a class id (a 64-bit "
                                 "integer); give such classes as text (a letter before the digits) or as smaller "
                                 "numbers")
        ids.append(number)
    return np.asarray(ids, dtype=np.int64)


def plain(value):
    """A numpy scalar as the Python value model.json stores (np.int64(7) -> 7, np.str_('a') -> 'a')."""
    return value.item() if hasattr(value, "item") else value


def class_list(y: np.ndarray) -> list:
    """The classes of labels `y` in model order: distinct values, ascending."""
    return [plain(c) for c in np.unique(np.asarray(y))]


def encode(y: np.ndarray, classes: list, what: str = "the data") -> np.ndarray:
    """Labels -> indices into `classes` (int64); a label not among them is one clear error."""
    index = {plain(c): i for i, c in enumerate(classes)}
    values = [plain(v) for v in np.asarray(y).tolist()]
    unknown = sorted({repr(v) for v in values if v not in index or type(v) is not type(classes[index[v]])})
    if unknown:
        raise TinyprotoError(f"{what} has labels the model does not know: {', '.join(unknown[:5])} (model classes: "
                             f"{', '.join(map(repr, classes[:10]))}{', ...' if len(classes) > 10 else ''})")
    return np.array([index[v] for v in values], dtype=np.int64)
