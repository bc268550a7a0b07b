"""FlyNN's hash, the part the integer reference shares with the float estimator (no scikit-learn: `validate`,
`build` and `export` rebuild a model without importing it): the sign split's int8 hash inputs [x, -x], M as a
sparse matrix, its projections, the winner-take-all (ties at the cut to the lower row index) and the per-class
counts of the winners. The conventions
are in train.py's docstring. Layer: families.
"""

from __future__ import annotations

import numpy as np
from scipy import sparse


def projection_matrix(indices: np.ndarray, n_features: int) -> sparse.csr_matrix:
    """M as a sparse 0/1 float64 matrix (m, d), m·s non-zeros: `Z @ M.T` gives every projection at once, exactly
    for integer inputs (sums of small integers are exact in float64)."""
    m, s = indices.shape
    data = np.ones(m * s, dtype=np.float64)
    return sparse.csr_matrix((data, indices.reshape(-1), np.arange(0, m * s + 1, s)), shape=(m, n_features))


def project(Z: np.ndarray, M: sparse.csr_matrix) -> np.ndarray:
    """P = Z M^T as a dense (n, m) array."""
    return np.asarray(M @ np.asarray(Z, dtype=np.float64).T).T


def split_inputs(x: np.ndarray) -> np.ndarray:
    """The sign split's hash inputs of int8 values x (n, d): [x, -x] (n, 2d), the float model's [z, -z], exact for
    the input stage's -127..127. The device biases both halves by 127 (x + 127 and -x + 127 = x ^ 0x7F, one
    instruction each), so -128, which no input stage gives, reads as +128 in both halves.

    Why not the one's complement ~x = -x - 1 of before (model format 7): it shifted every row's projection by minus
    its number of mirrored inputs against the float model's, which reordered the winners: 0.4 to 1.6 points of
    accuracy on 6 of 7 runs of `tools/bench_int8.py --quick --stages` (the quantization guide)."""
    x = np.asarray(x, dtype=np.int64)
    return np.hstack([np.where(x == -128, 128, x), -x])


# ---------------------------------------------------------------- winner-take-all


def top_winners(P: np.ndarray, rho: int) -> np.ndarray:
    """Indices (n, rho) of the rho largest entries of each row of P; ties at the cut go to the lower index.

    Exact for float and integer P: everything above the rho-th largest value wins, then the value equal to it
    is taken in index order until rho winners are found (the same set a stable descending sort gives).
    """
    n, m = P.shape
    if not 1 <= rho <= m:
        raise ValueError(f"need 1 <= rho <= m, got rho={rho}, m={m}")
    cut = -np.partition(-P, rho - 1, axis=1)[:, rho - 1 : rho]
    above = P > cut
    equal = P == cut
    need = rho - above.sum(axis=1, keepdims=True)
    chosen = above | (equal & (np.cumsum(equal, axis=1) <= need))
    rows, cols = np.nonzero(chosen)  # row-major: each row's winners come out in increasing index
    return cols.reshape(n, rho)


def count_winners(winners: np.ndarray, y_index: np.ndarray, n_classes: int, n_hashes: int) -> np.ndarray:
    """t_lj: how many samples of class l have bit j among their winners, (L, m) int64."""
    flat = y_index[:, None] * n_hashes + winners
    return np.bincount(flat.reshape(-1), minlength=n_classes * n_hashes).reshape(n_classes, n_hashes)
