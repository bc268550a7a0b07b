"""Exact moments of a table: n, Σx and Σx² per column as exact integers, and the standardisation they give.

Each float64 is an integer times a power of two, so the sums are exact Python integers and never round; mean and
population variance are then rounded once each from the exact totals. Any partition of the same rows (the parties
of a federation, or the pooled rows in compile) therefore gives bit-identical statistics: FlyNN's solver and the
federated protocol both standardise this way, so a federated model equals the pooled one bit for bit. The centred
input stage of wide inputs takes its centres from exact column sums of float32 values the same way
(`float32_column_sums`, `centred_stage`).
Layer: core.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.inputstage import InputStage, centred_from_means, shared_stage, shared_values, standardise_moments


@dataclass(frozen=True)
class MomentSums:
    """n and, per feature, Σx = sum1 · 2^exponent and Σx² = sum2 · 2^(2·exponent), as exact integers."""

    n: int
    exponent: int
    sum1: tuple[int, ...]
    sum2: tuple[int, ...]

    def __add__(self, other: "MomentSums") -> "MomentSums":
        if len(self.sum1) != len(other.sum1):
            raise ValueError("moment sums over different numbers of features")
        e = min(self.exponent, other.exponent)
        a, b = self._shifted(e), other._shifted(e)
        return MomentSums(self.n + other.n, e, tuple(map(operator.add, a[0], b[0])),
                          tuple(map(operator.add, a[1], b[1])))

    def _shifted(self, e: int) -> tuple[list[int], list[int]]:
        k = self.exponent - e  # >= 0: re-express at the smaller exponent, exactly
        return [v << k for v in self.sum1], [v << (2 * k) for v in self.sum2]


def moment_sums(X: np.ndarray) -> MomentSums:
    """Exact n, Σx, Σx² per column. Each float64 is mantissa · 2^e with a 53-bit integer mantissa; bringing every
    value to the smallest exponent makes it an exact Python integer, and integer sums never round."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    frac, exp = np.frexp(X)
    mant = np.ldexp(frac, 53).astype(np.int64)  # exact: x = mant · 2^(exp - 53)
    exp = exp.astype(np.int64) - 53
    nonzero = mant != 0
    base = int(exp[nonzero].min()) if nonzero.any() else 0
    shift = np.where(nonzero, exp - base, 0)
    ints = mant.astype(object) << shift.astype(object)  # x = ints · 2^base, exactly
    sum1 = ints.sum(axis=0) if n else np.zeros(d, dtype=object)
    sum2 = (ints * ints).sum(axis=0) if n else np.zeros(d, dtype=object)
    return MomentSums(int(n), base, tuple(int(v) for v in sum1), tuple(int(v) for v in sum2))


def _scaled(value: int, exp2: int, denominator: int) -> Fraction:
    """value · 2^exp2 / denominator, exactly."""
    return Fraction(value << exp2, denominator) if exp2 >= 0 else Fraction(value, denominator << -exp2)


def standardisation(sums: MomentSums, scaling: str) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) by the one rule of every family (`inputstage.standardise_moments`), from the exact sums:
    mean and population variance are rounded once each from the exact totals, so any partition of the same rows
    gives bit-identical statistics, and the rule maps them to bit-identical scales."""
    if sums.n < 1:
        raise TinyprotoError("no training rows to standardise")
    means = [_scaled(s1, sums.exponent, sums.n) for s1 in sums.sum1]
    variances = [_scaled(s2, 2 * sums.exponent, sums.n) - mu * mu for s2, mu in zip(sums.sum2, means)]
    result = standardise_moments([float(mu) for mu in means], [float(v) for v in variances], scaling)
    return result.mean, result.scale


@dataclass(frozen=True)
class ColumnSums:
    """n and, per column, Σx = sums · 2^exponent as exact integers (of float32 values: see float32_column_sums)."""

    n: int
    exponent: int
    sums: tuple[int, ...]

    def __add__(self, other: "ColumnSums") -> "ColumnSums":
        if len(self.sums) != len(other.sums):
            raise ValueError("column sums over different numbers of columns")
        e = min(self.exponent, other.exponent)
        return ColumnSums(self.n + other.n, e, tuple((a << (self.exponent - e)) + (b << (other.exponent - e))
                                                     for a, b in zip(self.sums, other.sums)))

    def means(self) -> np.ndarray:
        """Each column's mean, rounded once from its exact sum: the same float64 for any partition of the rows."""
        if self.n < 1:
            raise TinyprotoError("no training rows to average")
        return np.array([float(_scaled(v, self.exponent, self.n)) for v in self.sums], dtype=np.float64)


def float32_column_sums(values: np.ndarray) -> ColumnSums:
    """Exact Σx per column of float32 values. A float32 is an integer of at most 24 bits times 2^e: the integers
    of each exponent are summed per column by bincount in float64, exactly while a partial sum stays below 2^53
    (fewer than 2^29 rows), then the few exponents are joined as Python integers."""
    x = np.asarray(values, dtype=np.float32)
    n, d = x.shape
    frac, exp = np.frexp(x)
    mant = np.ldexp(frac.astype(np.float64), 24)  # whole numbers, |mant| < 2^24: x = mant · 2^(exp - 24)
    exponents, index = np.unique(exp, return_inverse=True)
    cell = index.reshape(n, d) * d + np.arange(d)
    per = np.bincount(cell.ravel(), weights=mant.ravel(), minlength=exponents.size * d).reshape(exponents.size, d)
    base = int(exponents.min()) - 24 if n else 0
    sums = [0] * d
    for k, e in enumerate(exponents.tolist()):
        shift = e - 24 - base
        sums = [total + (int(v) << shift) for total, v in zip(sums, per[k].tolist())]
    return ColumnSums(int(n), base, tuple(sums))


def centred_stage(X: np.ndarray, bits: int, kept=None, n_inputs: int | None = None) -> InputStage:
    """The centred stage (inputstage.centred_from_means) of training rows X: the shared stage of X, and its values'
    feature means from their exact sums, which a federation's parties add up to the same means."""
    shared = shared_stage(X)
    means = float32_column_sums(shared_values(shared, X)).means()
    return centred_from_means(shared, means, bits, kept, n_inputs)


def exact_standardisation(X: np.ndarray, scaling: str = "feature") -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) of the rows of X from their exact moments (what every partition of the rows agrees on)."""
    return standardisation(moment_sums(X), scaling)


__all__ = ["ColumnSums", "MomentSums", "centred_stage", "exact_standardisation", "float32_column_sums",
           "moment_sums", "standardisation"]
