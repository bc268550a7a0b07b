"""Bloom features' hash and MAX feature map, the part the integer reference shares with the float estimator (no
scikit-learn: `validate`, `build` and `export` rebuild a model without importing it). The conventions are in
train.py's docstring: the xorshift16 stream from a 16-bit seed, slot (v * m) >> bits, u = x + 128, empty slots
unused. Layer: families.
"""

from __future__ import annotations

import numpy as np

SEED_PERIOD = 65535  # xorshift16 visits every non-zero 16-bit state
U_SCALE = 256.0  # float φ = u / 256 with u = x + 128: the integer φ over this scale


def xorshift16_step(state: int) -> int:
    """One xorshift16 step, (7, 9, 8): the generator of firmware/tp_bloom.c (and FlyNN's seeded M)."""
    state ^= (state << 7) & 0xFFFF
    state ^= state >> 9
    state ^= (state << 8) & 0xFFFF
    return state


BYTE_SLOTS = 256  # m <= this: every generator step gives two 8-bit draws; above it, one 16-bit draw


def hash_draws(seed: int, n_features: int, n_hashes: int, n_slots: int) -> tuple[np.ndarray, int]:
    """((d, k) raw draws, their width in bits) of the device's hash stream from `seed`.

    m <= 256: every feature starts on a fresh xorshift16 step and takes its k draws from the steps' bytes, high
    byte first (ceil(k/2) steps per feature; an odd k leaves the last low byte unused, so the device keeps no
    half-used step between features or chunks). m > 256: one 16-bit draw per step, k steps per feature."""
    if not 1 <= seed <= 0xFFFF:
        raise ValueError(f"seed must be in 1..65535, got {seed}")
    if not (1 <= n_slots <= 65535 and n_hashes >= 1 and n_features >= 1):
        raise ValueError("need 1 <= m <= 65535, k >= 1, d >= 1")
    byte_draws = n_slots <= BYTE_SLOTS
    per_feature = (n_hashes + 1) // 2 if byte_draws else n_hashes
    states = np.empty(n_features * per_feature, dtype=np.int64)
    state = seed
    for t in range(states.size):
        state = xorshift16_step(state)
        states[t] = state
    if not byte_draws:
        return states.reshape(n_features, n_hashes), 16
    steps = states.reshape(n_features, per_feature)
    draws = np.stack([steps >> 8, steps & 0xFF], axis=2).reshape(n_features, 2 * per_feature)
    return draws[:, :n_hashes], 8


def seeded_slots(seed: int, n_features: int, n_hashes: int, n_slots: int) -> np.ndarray:
    """(d, k) slot h_l(j) of every feature j and hash function l: draw v of `bits` bits maps to (v * m) >> bits.

    The map is monotone in v, exact in integers on the device (8x8 multiplies for byte draws) and uniform up to
    one part in floor(2^bits / m): with byte draws some slots take two byte values where others take one, a fixed
    skew of the hash the model is trained with (the device pays one multiply per draw instead of a 32-bit one).
    """
    draws, bits = hash_draws(seed, n_features, n_hashes, n_slots)
    return (draws * n_slots) >> bits


def used_slots(slots: np.ndarray) -> np.ndarray:
    """The slots at least one feature hashes to, in increasing order (the only ones with weights)."""
    return np.unique(np.asarray(slots).reshape(-1))


def bloom_max(U: np.ndarray, slots: np.ndarray, used: np.ndarray) -> np.ndarray:
    """φ restricted to the used slots: (n, len(used)), φ_p = max over the components hashed to slot used[p].

    U must be non-negative (every used slot has at least one component, so no slot reads the empty 0 here)."""
    U = np.asarray(U)
    column = np.searchsorted(used, np.asarray(slots))  # (d, k) -> position among the used slots
    out = np.zeros((U.shape[0], used.size), dtype=U.dtype)
    for l in range(column.shape[1]):
        order = np.argsort(column[:, l], kind="stable")
        cols = column[order, l]
        starts = np.flatnonzero(np.r_[True, cols[1:] != cols[:-1]])
        # reduceat takes the MAX of each run of features that share a slot under this hash function
        targets = cols[starts]  # distinct within one hash function
        out[:, targets] = np.maximum(out[:, targets], np.maximum.reduceat(U[:, order], starts, axis=1))
    return out
