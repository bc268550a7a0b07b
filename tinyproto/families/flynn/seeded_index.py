"""FlyNN's seeded index generator: the device's PRNG (xorshift16) and the input indices of M it regenerates from
a 16-bit seed, row block by row block, exactly as firmware/tp_flynn.c does; and the seed a random_state draws.
Shared by the float estimator (train.py), the integer reference (quantize.py), the cost model and the solver.
Layer: families."""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

SEED_PERIOD = 65535  # xorshift16 visits every non-zero 16-bit state


def xorshift16_step(state: int) -> int:
    """One step of Marsaglia's xorshift16 with the full-period triple (7, 9, 8); AVR-cheap (byte moves)."""
    state ^= (state << 7) & 0xFFFF
    state ^= state >> 9
    state ^= (state << 8) & 0xFFFF
    return state


@lru_cache(maxsize=1)
def _xorshift16_cycle() -> tuple[np.ndarray, np.ndarray]:
    """The whole period once: states[k] is the state after k steps from 1, position[state] its inverse."""
    states = np.empty(SEED_PERIOD, dtype=np.uint16)
    position = np.zeros(65536, dtype=np.int64)
    state = 1
    for k in range(SEED_PERIOD):
        states[k] = state
        position[state] = k
        state = xorshift16_step(state)
    return states, position


def xorshift16_states(seed: int, n: int) -> np.ndarray:
    """The n states following `seed` (seed excluded), exactly as the device produces them."""
    if not 1 <= seed <= 0xFFFF:
        raise ValueError(f"seed must be in 1..65535, got {seed}")
    states, position = _xorshift16_cycle()
    start = position[seed] + 1
    return states[(start + np.arange(n)) % SEED_PERIOD]


BLOCK_ROWS = 32  # rows of M that share one seeded pattern (TP_FLYNN_BLOCK); a multiple of GROUP_ROWS
WIDE_BLOCK_ROWS = 16  # the same for more than WIDE_INPUTS hash inputs (block_rows)
GROUP_ROWS = 4  # rows the AVR row scan sums at once (consecutive rotations: 4 adjacent bytes per pattern entry)


WIDE_INPUTS = 256  # above this many hash inputs tp_flynn.c reads x in place (TP_FLYNN_WIDE) instead of a buffer


def random_rotations(n_inputs: int) -> bool:
    """Whether each row of a block draws its own rotation (wide inputs) instead of taking the consecutive
    rotations from the block's one drawn rotation (narrow inputs, where the AVR sums GROUP_ROWS adjacent rows at
    once). Images are smooth: rows a fixed step apart are translates of one shape that win and lose together
    (digits28, one shape, 4 seeds: consecutive rotations 3 points below a rotation per row; with a stride near
    d / golden ratio the solver's picks at 2 kB tested 1.3 points lower over 5 seeds); wide inputs are summed row
    by row anyway, so a rotation per row costs one generator step per row and nothing per input."""
    return n_inputs > WIDE_INPUTS


def block_rows(n_inputs: int) -> int:
    """Rows per seeded pattern (TP_FLYNN_BLOCK): BLOCK_ROWS, WIDE_BLOCK_ROWS for wide inputs, where the rows of a
    block are translates of one shape in the image and more patterns keep more shapes."""
    return WIDE_BLOCK_ROWS if n_inputs > WIDE_INPUTS else BLOCK_ROWS


def proposal_stream(seed: int, n: int, n_inputs: int) -> np.ndarray:
    """The first n proposals of the device's stream, as input indices in 0..n_inputs-1.

    n_inputs <= 256: every xorshift16 state yields two bytes, high byte first, and a byte b proposes
    (b * n_inputs) >> 8; n_inputs > 256: every state v is one proposal (v * n_inputs) >> 16. Uniform up to one
    part in floor(2^8 / n) (resp. 2^16 / n); the winners do not need more.
    """
    if n_inputs <= 256:
        states = xorshift16_states(seed, (n + 1) // 2).astype(np.int64)
        raw = np.stack([states >> 8, states & 0xFF], axis=1).reshape(-1)[:n]
        return (raw * n_inputs) >> 8
    return (xorshift16_states(seed, n).astype(np.int64) * n_inputs) >> 16


@dataclass(frozen=True)
class SeededWalk:
    """What firmware/tp_flynn.c does to regenerate a seeded M: the indices and, for the cost model, the generator
    work of the first m rows for every m (arrays of m_max + 1; a smaller m's M is a prefix): the pattern
    proposals and repeat-scan compares of the ceil(m / block_rows(d)) blocks those rows need."""

    indices: np.ndarray  # (m, s)
    pattern_proposals: np.ndarray  # (m + 1,)
    compares: np.ndarray  # (m + 1,) one per entry scanned, the proposal itself included as the sentinel
    wraps: np.ndarray  # (m + 1,) indices whose p + r passed the inputs' end (the wide loop subtracts once)


def seeded_walk(seed: int, n_rows: int, n_per_row: int, n_inputs: int) -> SeededWalk:
    """Regenerate a seeded M exactly as firmware/tp_flynn.c does (see seeded_indices)."""
    if not 1 <= n_per_row <= n_inputs:
        raise ValueError(f"need 1 <= s <= d, got s={n_per_row}, d={n_inputs}")
    s, n = n_per_row, n_inputs
    per_row, block = random_rotations(n), block_rows(n)
    out = np.empty((n_rows, s), dtype=np.int64)
    proposals = np.zeros(n_rows + 1, dtype=np.int64)
    compares = np.zeros(n_rows + 1, dtype=np.int64)
    wrapped = np.zeros(n_rows + 1, dtype=np.int64)
    blocks = -(-n_rows // block)
    # enough for all but patterns with many repeats (s close to d)
    chunk = max(256, blocks * (2 * s + 1) + (n_rows if per_row else 0))
    stream, pos, drawn = proposal_stream(seed, chunk, n), 0, 0
    n_prop = n_cmp = 0

    def need(k: int) -> None:  # at least k unread proposals in `stream`
        nonlocal stream, pos, drawn
        if pos + k > stream.size:
            drawn += pos
            stream = proposal_stream(seed, drawn + max(chunk, k), n)[drawn:]
            pos = 0

    row = 0
    while row < n_rows:
        pattern: list[int] = []
        while len(pattern) < s:
            need(1)
            p = int(stream[pos])
            pos += 1
            n_prop += 1
            # the device scans the entries taken so far, then itself as a sentinel, up to the first equal one
            hit = pattern.index(p) if p in pattern else -1
            n_cmp += (hit + 1) if hit >= 0 else len(pattern) + 1
            if hit < 0:
                pattern.append(p)
        offsets = np.asarray(pattern, dtype=np.int64)
        take = min(block, n_rows - row)
        if per_row:  # wide: each row draws its own rotation
            need(take)
            rotations = stream[pos : pos + take].astype(np.int64)
            pos += take
        else:  # narrow: one rotation r0 per block, row t takes the pattern rotated by r0 + t
            need(1)
            rotations = int(stream[pos]) + np.arange(take)
            pos += 1
            rotations %= n
        idx = offsets[None, :] + rotations[:, None]
        out[row : row + take] = np.where(idx >= n, idx - n, idx)
        wrapped[row + 1 : row + take + 1] = wrapped[row] + np.cumsum(np.count_nonzero(idx >= n, axis=1))
        proposals[row + 1 : row + take + 1], compares[row + 1 : row + take + 1] = n_prop, n_cmp
        row += take
    return SeededWalk(out, proposals, compares, wrapped)


def seeded_indices(seed: int, n_rows: int, n_per_row: int, n_features: int) -> np.ndarray:
    """The (n_rows, n_per_row) input indices of M, as firmware/tp_flynn.c regenerates them.

    One proposal stream (`proposal_stream`) runs through all rows. M is built in blocks of block_rows(d) rows
    (32; 16 for wide inputs): a block first draws a pattern of s distinct offsets (a proposal equal to one already
    taken is rejected). Narrow inputs then draw one rotation r0 and row t of the block takes the inputs
    (offset + r0 + t) mod d (consecutive rotations); wide inputs (random_rotations) draw one rotation r per row
    and take (offset + r) mod d. Every row has s distinct inputs and, over the seed, is a uniform random
    s-subset; the rows of a block are translates of one pattern. On the device the rotation costs nothing per
    input (a cyclically extended input buffer, or one compare on wide inputs), there is no per-input
    bookkeeping, and consecutive rotations let the AVR sum GROUP_ROWS rows from adjacent bytes at once: one
    generator byte per block besides the pattern (one 16-bit step per row on wide inputs).
    """
    return seeded_walk(seed, n_rows, n_per_row, n_features).indices


def draw_seed(random_state) -> int:
    """The 16-bit seed of M that a FlyNNClassifier with this random_state uses."""
    from sklearn.utils import check_random_state

    return int(check_random_state(random_state).randint(1, SEED_PERIOD + 1))
