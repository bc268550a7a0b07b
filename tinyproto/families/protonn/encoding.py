"""Exact encodings of ProtoNN's int8 projection W (D x d) in flash, and the choice of the smallest.

    dense        D * d int8, row-major                                   (the asm row kernel, buffered input)
    bitmap       D * ceil(d / 8) bytes of nonzero bits + nnz values, row-major
    col_bytes    nnz one-byte codes + nnz values, column-major: code = row | 0x80 on the last nonzero of a
                 feature's column (D <= 128)
    col_nibbles  the same in 4 bits (row 0..7, bit 3 on a column's last nonzero), two codes per byte, low
                 nibble first (D <= 8): ceil(nnz / 2) + nnz bytes

The column-major codes store W in the order a streamed input needs it: feature i's nonzeros come right after
feature i - 1's, so the projection accumulates p_r += W[r, i] x_i as the features arrive, with no index of
the feature at all. That needs every column to hold a nonzero, which the integer model guarantees (a feature
no weight reads is not kept: it stores nothing and is never sent). The bitmap costs D * d / 8 bytes whatever
the nonzeros (980 B for D = 10 at 784 features); the column codes scale with the nonzeros only.
Layer: families (protonn).
"""

from __future__ import annotations

import numpy as np

ENCODINGS = ("dense", "bitmap", "col_bytes", "col_nibbles")  # ties go to the earlier (faster) one
ENCODING_ID = {name: i for i, name in enumerate(ENCODINGS)}
COL_LAST = 0x80  # col_bytes: the last nonzero of its column
NIBBLE_LAST = 0x8


def mask_row_bytes(n_features: int) -> int:
    return (n_features + 7) // 8


def feasible(W: np.ndarray) -> list[str]:
    """The encodings that represent W exactly."""
    D = W.shape[0]
    names = ["dense", "bitmap"]
    if W.size and (W != 0).any(axis=0).all():
        if D <= 128:
            names.append("col_bytes")
        if D <= 8:
            names.append("col_nibbles")
    return names


def encoded_bytes(W: np.ndarray, name: str) -> int:
    """Flash bytes of W under encoding `name` (index arrays + values), as the carrays will sum them."""
    D, d = W.shape
    nnz = int(np.count_nonzero(W))
    if name == "dense":
        return D * d
    if name == "bitmap":
        return D * mask_row_bytes(d) + nnz
    if name == "col_bytes":
        return 2 * nnz
    if name == "col_nibbles":
        return (nnz + 1) // 2 + nnz
    raise ValueError(f"unknown W encoding {name!r}")


def smallest(W: np.ndarray) -> str:
    """The exact encoding with the fewest bytes (ties: the earlier in ENCODINGS, the faster)."""
    names = feasible(W)
    return min(names, key=lambda n: (encoded_bytes(W, n), ENCODINGS.index(n)))


DENSE_GROUP = 4  # rows projected together by the dense kernel (firmware/tp_protonn.c, TP_PROTONN_DENSE_GROUP_ASM)


def dense_layout(W: np.ndarray) -> np.ndarray:
    """The dense encoding as the device reads it: rows in groups of DENSE_GROUP (the last group the rest), each
    group input by input with its rows' weights together (W[r0:r0+G].T flattened), so one read of x_i serves
    the whole group. Same bytes as encode(W, "dense")."""
    W = np.asarray(W, dtype=np.int8)
    return np.concatenate([W[r:r + DENSE_GROUP].T.reshape(-1) for r in range(0, W.shape[0], DENSE_GROUP)]
                          ) if W.size else W.reshape(-1)


def bitmap_stream(W: np.ndarray) -> np.ndarray:
    """The bitmap encoding as the device reads it: row by row, each group of 8 inputs as its nonzero bitmap
    byte (bit k = input 8g + k) followed by those nonzeros (int8 bit patterns), so one flash pointer walks a
    row (no second pointer to swap in per byte). Same bytes as encode(W, "bitmap")'s mask + values."""
    W = np.asarray(W, dtype=np.int8)
    mask = np.packbits(W != 0, axis=1, bitorder="little")
    rows, groups = mask.shape
    # each group as 9 cells (its bitmap byte, then its 8 inputs, the last group padded with zeros), of which the
    # bitmap byte and the nonzeros are kept, in row-major order: the stream, without a Python loop per group
    inputs = np.zeros((rows, groups * 8), dtype=np.int8)
    inputs[:, :W.shape[1]] = W
    inputs = inputs.reshape(rows, groups, 8)
    cells = np.concatenate([mask[:, :, None], inputs.view(np.uint8)], axis=2)
    kept = np.concatenate([np.ones((rows, groups, 1), dtype=bool), inputs != 0], axis=2)
    return cells[kept]


def column_codes(W: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, values) of W column by column: code = row | last-of-column flag (one per nonzero)."""
    cols, rows = np.nonzero(W.T)  # column-major order: by feature, then row
    last = np.ones(cols.size, dtype=bool)
    last[:-1] = cols[1:] != cols[:-1]
    return rows.astype(np.int64), last, W.T[cols, rows].astype(np.int8)


def encode(W: np.ndarray, name: str) -> dict[str, np.ndarray]:
    """The flash arrays of W under `name`: {"mask"|"codes"|"dense": ..., "values": ...}."""
    W = np.asarray(W, dtype=np.int8)
    if name == "dense":
        return {"dense": W}
    if name == "bitmap":
        return {"mask": np.packbits(W != 0, axis=1, bitorder="little"), "values": W[W != 0]}
    rows, last, values = column_codes(W)
    if name == "col_bytes":
        return {"codes": (rows | np.where(last, COL_LAST, 0)).astype(np.uint8), "values": values}
    nibbles = (rows | np.where(last, NIBBLE_LAST, 0)).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(0))
    return {"codes": (nibbles[0::2] | (nibbles[1::2] << 4)).astype(np.uint8), "values": values}


def decode(arrays: dict[str, np.ndarray], name: str, shape: tuple[int, int]) -> np.ndarray:
    """W back from its flash arrays (the round trip the tests check; the C code walks the same format)."""
    D, d = shape
    if name == "dense":
        return np.asarray(arrays["dense"], dtype=np.int8).reshape(D, d)
    W = np.zeros((D, d), dtype=np.int8)
    values = np.asarray(arrays["values"], dtype=np.int8)
    if name == "bitmap":
        bits = np.unpackbits(np.asarray(arrays["mask"], dtype=np.uint8).reshape(D, -1), axis=1,
                             bitorder="little")[:, :d].astype(bool)
        W[bits] = values  # boolean indexing walks row-major, as the values were stored
        return W
    codes = np.asarray(arrays["codes"], dtype=np.uint8)
    if name == "col_nibbles":
        codes = np.stack([codes & 0xF, codes >> 4], axis=1).reshape(-1)[: values.size]
        rows, last = codes & 0x7, (codes & NIBBLE_LAST) != 0
    else:
        rows, last = codes & 0x7F, (codes & COL_LAST) != 0
    feature = np.concatenate([[0], np.cumsum(last)[:-1]]).astype(np.int64)
    W[rows.astype(np.int64), feature] = values
    return W
