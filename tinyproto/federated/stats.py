"""Exact statistics for the federation: sums that add up to the pooled data's, bit for bit.

Layer: federated. Every quantity the parties all-reduce is an exact integer sum, so the order of the additions
(a tree on a cluster, a loop here) never changes the result:

* the standardisation: n, Σx and Σx² per feature as exact integers (each float64 is an integer times a power of
  two); mean and population variance are rounded once each from the exact totals, so any partition of the rows
  gives bit-identical statistics;
* the int8 step of the input stage: `choose_input_scale` takes a quantile of |z| over all training values. The
  two order statistics it interpolates are found exactly by a distributed search over the bit patterns of |z|
  (non-negative float64 order like their int64 bit patterns): each round every party counts its values <= 1023
  cut points, the counts are summed, the interval shrinks 1024-fold; ~7 rounds of small integer vectors give
  the same quantile numpy computes on the pooled data.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tinyproto.core.inputstage import INPUT_MAX, choose_input_scale, shared_range
from tinyproto.core.moments import MomentSums, moment_sums, standardisation  # noqa: F401  (the parties' sums)

# choose_input_scale's quantile, read from its signature so the two can never disagree
INPUT_QUANTILE = float(inspect.signature(choose_input_scale).parameters["quantile"].default)
_INF_BITS = int(np.float64(np.inf).view(np.int64))  # every finite |z| has a smaller bit pattern
QUANTILE_CUTS = 1023  # cut points per search round and target: the interval shrinks 1024-fold per round


def tree_sum(values: list) -> Any:
    """Pairwise sum (the order is irrelevant: every all-reduced quantity is an exact integer sum). A type with a
    `sum_all` static method adds the whole list in one call (selection.SparseCounts: one count per shape instead of
    a thousand parties' pairwise additions)."""
    values = list(values)
    sum_all = getattr(type(values[0]), "sum_all", None) if len(values) > 1 else None
    if sum_all is not None and all(type(v) is type(values[0]) for v in values):
        return sum_all(values)
    if len(values) > 2 and isinstance(values[0], np.ndarray) and values[0].dtype.kind in "iu" \
            and all(isinstance(v, np.ndarray) and v.dtype == values[0].dtype and v.shape == values[0].shape
                    for v in values):  # integer arrays of one type: added in place into one (the same wrap-around
        total = values[0].copy()  # as pairs; no stacked copy of every party's array)
        for v in values[1:]:
            np.add(total, v, out=total)
        return total
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


# ---------------------------------------------------------------- exact distributed quantile (the int8 step)


def count_at_most(sorted_bits: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """How many of a party's values have a bit pattern <= each cut (int64)."""
    return np.searchsorted(sorted_bits, np.asarray(cuts, dtype=np.int64), side="right").astype(np.int64)


def select_order_statistics(count: Callable[[np.ndarray], np.ndarray], ks: Sequence[int],
                            n_cuts: int = QUANTILE_CUTS, signed: bool = False) -> tuple[list[float], int]:
    """The k-th smallest (0-based) values for each k in ks, exactly, and the rounds it took.

    `count(cuts)` returns the summed number of values whose key is <= each cut: the float64 bit pattern of a
    non-negative value, or with `signed` its `order_keys` (any finite value). The answer for k is the smallest key
    p with count(p) >= k + 1; every round narrows each k's interval [lo, hi] to one of n_cuts + 1 slices, all k
    sharing one query.
    """
    lo = {k: (_NEG_INF_KEY if signed else 0) for k in ks}
    hi = {k: _INF_BITS for k in ks}
    rounds = 0
    while any(lo[k] < hi[k] for k in ks):
        open_ks = [k for k in ks if lo[k] < hi[k]]
        cuts = {k: _cuts(lo[k], hi[k], n_cuts) for k in open_ks}
        totals = count(np.concatenate([np.asarray(cuts[k], dtype=np.int64) for k in open_ks]))
        rounds += 1
        offset = 0
        for k in open_ks:
            c = cuts[k]
            got = totals[offset: offset + len(c)]
            offset += len(c)
            above = np.flatnonzero(got >= k + 1)
            if above.size:
                first = int(above[0])
                hi[k] = c[first]
                if first > 0:
                    lo[k] = c[first - 1] + 1
            else:
                lo[k] = c[-1] + 1
    return [float(values_of_keys(np.array([lo[k]], dtype=np.int64))[0]) for k in ks], rounds


_MAGNITUDE = np.int64(0x7FFF_FFFF_FFFF_FFFF)
_NEG_INF_KEY = int(np.int64(np.float64(-np.inf).view(np.int64)) ^ _MAGNITUDE)


def order_keys(values: np.ndarray) -> np.ndarray:
    """int64 keys that sort as the float64 values do, negative ones included: a non-negative value keeps its bit
    pattern, a negative one gets its magnitude bits flipped (so a larger magnitude is a smaller key). -0.0 is
    counted as +0.0, as numpy's sort treats them as equal."""
    bits = (np.asarray(values, dtype=np.float64) + 0.0).view(np.int64)  # x + 0.0 turns -0.0 into +0.0
    return np.where(bits < 0, bits ^ _MAGNITUDE, bits)


def values_of_keys(keys: np.ndarray) -> np.ndarray:
    """The float64 values of order_keys (its inverse)."""
    keys = np.asarray(keys, dtype=np.int64)
    return np.where(keys < 0, keys ^ _MAGNITUDE, keys).view(np.float64)


def _cuts(lo: int, hi: int, n_cuts: int) -> list[int]:
    """Up to n_cuts distinct integers in [lo, hi - 1], evenly spread (all of them when the range is short)."""
    width = hi - lo
    if width <= n_cuts:
        return list(range(lo, hi))
    return sorted({lo + (width * i) // (n_cuts + 1) for i in range(1, n_cuts + 1)})


def quantile_positions(n_values: int, q: float = INPUT_QUANTILE) -> tuple[int, int, float]:
    """(k, k + 1, t) of numpy's 'linear' quantile: h = (n - 1)·q, k = floor h, t = h - k; the quantile is
    lerp(a[k], a[k + 1], t) of the sorted values a."""
    h = (n_values - 1) * q
    k = math.floor(h)
    return k, min(k + 1, n_values - 1), h - k


def input_scale_from_order_statistics(a_k: float, a_k1: float, t: float) -> float:
    """choose_input_scale on the pooled |z| given the two order statistics it interpolates: np.quantile of the
    pair at t runs numpy's own interpolation on the same two numbers, so the result is bit-identical."""
    return choose_input_scale(np.array([[a_k, a_k1]], dtype=np.float64), quantile=t)


def exact_input_scale(count: Callable[[np.ndarray], np.ndarray], n_values: int) -> tuple[float, int]:
    """(the int8 step choose_input_scale gives on the pooled |z|, search rounds): `count(cuts)` is the summed
    count of values whose bit pattern is <= each cut, over n_values values in all."""
    k, k1, t = quantile_positions(n_values)
    (a_k, a_k1), rounds = select_order_statistics(count, [k, k1])
    return input_scale_from_order_statistics(a_k, a_k1, t), rounds


# ---------------------------------------------------------------- exact distributed shared input range


SHARED_QUANTILE = float(inspect.signature(shared_range).parameters["quantile"].default)
SHARED_EXACT_VALUES = 2_000_000  # shared_range takes every value up to this many (then a row-order sample)


def exact_shared_range(count: Callable[[np.ndarray], np.ndarray], n_values: int) -> tuple[float, float, int]:
    """(offset, gain, search rounds) of `shared_range` on the pooled raw values: its [1 - q, q] quantiles (and
    the minimum and maximum, its fallback) found exactly by one signed order-statistic search; `count(cuts)` is
    the summed count of values whose order_keys are <= each cut, over n_values values in all.

    shared_range itself computes the quantiles exactly on up to SHARED_EXACT_VALUES values; beyond that it
    samples every step-th value in the pooled row order, which no party can reproduce, so the federation then
    uses the exact quantiles of all values."""
    low_k, low_k1, low_t = quantile_positions(n_values, 1.0 - SHARED_QUANTILE)
    high_k, high_k1, high_t = quantile_positions(n_values, SHARED_QUANTILE)
    ks = sorted({0, n_values - 1, low_k, low_k1, high_k, high_k1})
    found, rounds = select_order_statistics(count, ks, signed=True)
    value = dict(zip(ks, found))
    low = _lerp(value[low_k], value[low_k1], low_t)
    high = _lerp(value[high_k], value[high_k1], high_t)
    if not high > low:  # shared_range's fallbacks, in its order
        low, high = value[0], value[n_values - 1]
    if not high > low:
        high = low + 1.0
    offset, gain = 0.5 * (low + high), 2.0 * INPUT_MAX / (high - low)
    return offset, gain, rounds


def _lerp(a: float, b: float, t: float) -> float:
    """numpy's linear quantile between two neighbouring order statistics: np.quantile of the pair at t runs
    numpy's own interpolation on the same two numbers, so the result is bit-identical to the pooled quantile."""
    return float(np.quantile(np.array([a, b], dtype=np.float64), t))


__all__ = ["INPUT_QUANTILE", "MomentSums", "SHARED_QUANTILE", "count_at_most", "exact_input_scale",
           "exact_shared_range", "moment_sums", "order_keys", "select_order_statistics", "standardisation",
           "tree_sum", "values_of_keys"]
