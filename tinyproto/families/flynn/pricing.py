"""FlyNN shapes priced before training: model bytes (exactly Σ CArray.nbytes) and predicted cycles (the cost model),
and the largest m within a byte budget or a time cap. Used by the solver and the federated selection.

Layer: families (flynn).
"""

from __future__ import annotations

import numpy as np

from tinyproto.families.flynn.cost import WalkCounts, cost_terms, estimate_cycles, total_cycles

MAX_HASHES = 8192
DEFAULT_MAX_MS = 20.0  # leaves room under a 30 ms-per-inference target on a 16 MHz Uno
# Beyond 256 features the default cap doubles: receiving the input itself takes longer than that (784 bytes at
# 115200 baud are 68 ms), and the row sums grow with the features.
WIDE_FEATURES = 256
WIDE_DEFAULT_MAX_MS = 40.0
DEFAULT_CAP = "default"  # max_inference_ms not given: default_max_ms(n_features)


def default_max_ms(n_features: int) -> float:
    """The time cap a FlyNN gets when the user sets none."""
    return WIDE_DEFAULT_MAX_MS if n_features > WIDE_FEATURES else DEFAULT_MAX_MS


INPUT_STAGE_BYTES_PER_FEATURE = 4  # mean + gain, half floats

# ---------------------------------------------------------------- bytes


def model_bytes(m: int, s: int, bits: int, n_classes: int, n_features: int, n_inputs: int, store_M: bool,
                stage: int | None = None) -> int:
    """Σ CArray.nbytes of IntFlyNN.carrays() for these sizes: the very arrays it renders (quantize.row_arrays),
    filled with zeros; stage: the input stage's bytes (default: a mean and a gain per feature)."""
    from tinyproto.families.flynn.quantize import pack_bits, row_arrays

    stage = INPUT_STAGE_BYTES_PER_FEATURE * n_features if stage is None else stage
    if m < 1:
        return stage
    packed = pack_bits(np.zeros(m * n_classes, dtype=np.int64), bits)
    lut = np.zeros(1 << bits, dtype=np.uint8) if bits > 1 else None
    rows = row_arrays(n_classes, bits, n_inputs, store_M, 0.0, packed, lut, np.zeros((m, s), dtype=np.int64))
    return stage + sum(a.nbytes for a in rows)


def rows_bytes(m: int, s: int, bits: int, n_classes: int, n_inputs: int, store_M: bool) -> int:
    """The bytes that grow with m: the filters (and the LUT), and a stored M's indices."""
    return model_bytes(m, s, bits, n_classes, 0, n_inputs, store_M, stage=0)


def largest_m(budget: int, s: int, bits: int, n_classes: int, n_features: int, n_inputs: int, store_M: bool,
              stage: int | None = None) -> int:
    """The largest m whose model fits the budget (0 if none); exact, by a closed form then a step down."""
    stage = INPUT_STAGE_BYTES_PER_FEATURE * n_features if stage is None else stage
    free = budget - stage - ((1 << bits) if bits > 1 else 0)
    per_row_bits = n_classes * bits + (8 * s * (1 if n_inputs <= 256 else 2) if store_M else 0)
    m = max(0, min(MAX_HASHES, (8 * free) // per_row_bits if free > 0 else 0))
    while m > 0 and model_bytes(m, s, bits, n_classes, n_features, n_inputs, store_M, stage) > budget:
        m -= 1
    return m


def fastest_m(max_cycles: float | None, s: int, rho: int, bits: int, n_classes: int, n_inputs: int,
              store_M: bool) -> int:
    """The largest m whose expected inference time is within max_cycles (bisection; cost grows with m)."""
    if max_cycles is None:
        return MAX_HASHES
    lo, hi = 0, MAX_HASHES
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate_cycles(mid, s, rho, bits, n_classes, n_inputs, store_M) <= max_cycles:
            lo = mid
        else:
            hi = mid - 1
    return lo


class ExactCycles:
    """Predicted cycles of the family's cost model (cost.cost_terms, the very function predict_cycles uses) for
    every prefix m of one seeded M (seed, s, inputs): the proposal stream is replayed once for the largest m (a
    smaller m's M is a prefix of it), so the cost of any m is exact with respect to the cost model and O(1)."""

    def __init__(self, seed: int, s: int, n_inputs: int, m_max: int, n_features: int):
        """n_features: the model's inputs (n_inputs = 2 n_features with the sign split): the heap replay draws
        them and mirrors them as the device does."""
        self.s, self.n_inputs = s, n_inputs
        self.counts = WalkCounts.replay(seed, s, n_inputs, n_features, m_max)
        self._cycles: dict[tuple[int, int, int, int, bool], int] = {}

    @property
    def m_max(self) -> int:
        return self.counts.m_max

    def cycles(self, m: int, rho: int, bits: int, n_classes: int, store_M: bool) -> int:
        # Remembered per shape: the solver prices the same shape once for every decay and count scale it scores.
        key = (m, rho, bits, n_classes, store_M)
        if key not in self._cycles:
            self._cycles[key] = total_cycles(cost_terms(self.counts, m, rho, bits, n_classes, store_M))
        return self._cycles[key]

    def largest_m(self, max_cycles: float, m_high: int, rho: int, bits: int, n_classes: int, store_M: bool) -> int:
        """The largest m <= m_high predicted within max_cycles (cost grows with m), or 0."""
        lo, hi = 0, min(m_high, self.m_max)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.cycles(mid, rho, bits, n_classes, store_M) <= max_cycles:
                lo = mid
            else:
                hi = mid - 1
        return lo
