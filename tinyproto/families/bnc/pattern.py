"""The seeded sparsity pattern of W for wide inputs: which K of the d features each row of W reads, regenerated
from a 16-bit seed on the device (0 bytes of flash; only the r x K int8 values are stored).

Row k's t-th weight sits in segment t of the d features, [floor(t d / K), floor((t + 1) d / K)), at offset
(s * len) >> 16, where s is the next xorshift16 state (the same (7, 9, 8) generator FlyNN's seeded M uses) and
len the segment's length; the states run on from TP_BNC_SEED through the rows in order, one step per weight.
Stratified positions are distinct and increasing within a row (the stream meets them in arriving order) and
spread over the whole input (a pixel image is sampled everywhere). firmware/tp_bnc.c computes the same numbers
with the segment lengths stepped incrementally (no division). Layer: families (bnc).
"""

from __future__ import annotations

import numpy as np


def xorshift16(state: int) -> int:
    state ^= (state << 7) & 0xFFFF
    state ^= state >> 9
    state ^= (state << 8) & 0xFFFF
    return state


def seeded_positions(seed: int, n_bits: int, n_features: int, per_row: int) -> np.ndarray:
    """(r, K) feature indices of W's weights, exactly as tp_bnc.c regenerates them."""
    if not 1 <= seed <= 0xFFFF or not 1 <= per_row <= min(n_features, 255):
        raise ValueError("need a seed in 1..65535 and 1 <= K <= min(d, 255) weights per row")
    if -(-n_features // per_row) > 255:
        raise ValueError("segments of at most 255 features: K >= d / 255 (the device scales by an 8-bit length)")
    q, rem = divmod(n_features, per_row)
    out = np.empty((n_bits, per_row), dtype=np.int64)
    state = seed
    for k in range(n_bits):
        start, acc = 0, 0
        for t in range(per_row):
            acc += rem
            length = q
            if acc >= per_row:
                acc -= per_row
                length += 1
            state = xorshift16(state)
            out[k, t] = start + ((state * length) >> 16)
            start += length
    return out


def pattern_mask(seed: int, n_bits: int, n_features: int, per_row: int) -> np.ndarray:
    mask = np.zeros((n_bits, n_features), dtype=bool)
    mask[np.repeat(np.arange(n_bits), per_row), seeded_positions(seed, n_bits, n_features, per_row).reshape(-1)] = True
    return mask
