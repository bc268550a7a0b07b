"""The built-in data sets: sklearn's (digits, breast_cancer, wine, iris), UCI segment from `river`, and two wide
image sets made from sklearn's digits.

`digits16` and `digits28` are stand-ins for USPS-sized (16 x 16 = 256 pixels) and MNIST-sized (28 x 28 = 784
pixels) inputs, for tests, docs and benchmarks on machines without a download: every 8 x 8 digit is upsampled
with scipy.ndimage.zoom(image, side / 8, order=1) (bilinear, so no value leaves 0..16), scaled to 0..255 and
rounded to whole numbers, as USPS/MNIST pixels are. They hold the same 1,797 samples and labels as `digits`, so
they are wider, not harder: the information is digits', spread over more (correlated) pixels.
Layer: core.
"""

from __future__ import annotations

import csv
import io
import zipfile
from pathlib import Path

import numpy as np

from tinyproto.core.errors import TinyprotoError

BUILTIN = ("digits", "breast_cancer", "wine", "iris", "segment", "digits16", "digits28")
WIDE_SIDES = {"digits16": 16, "digits28": 28}


def load_builtin(name: str) -> tuple[np.ndarray, np.ndarray]:
    """(X float64 (n, d), y) of the built-in data set `name` (one of BUILTIN)."""
    if name == "segment":
        return _load_segment()
    if name in WIDE_SIDES:
        return upsampled_digits(WIDE_SIDES[name])
    from sklearn import datasets as skd

    loader = {
        "digits": skd.load_digits,
        "breast_cancer": skd.load_breast_cancer,
        "wine": skd.load_wine,
        "iris": skd.load_iris,
    }[name]
    bunch = loader()
    return np.asarray(bunch.data, dtype=np.float64), np.asarray(bunch.target)


def upsampled_digits(side: int) -> tuple[np.ndarray, np.ndarray]:
    """sklearn's digits upsampled to side x side pixels (bilinear zoom), 0..255, rounded: (X (n, side^2), y)."""
    from scipy.ndimage import zoom
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.asarray(bunch.images, dtype=np.float64)  # (n, 8, 8), values 0..16
    # One zoom over the stack (factor 1 on the sample axis) equals zooming each image: order=1 interpolates
    # along each axis separately, and a factor of 1 leaves the sample axis untouched.
    big = zoom(images, (1, side / 8, side / 8), order=1)
    pixels = np.clip(np.rint(big * (255.0 / 16.0)), 0, 255)
    return pixels.reshape(len(images), side * side), np.asarray(bunch.target)


def _load_segment() -> tuple[np.ndarray, np.ndarray]:
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
    return X, y
