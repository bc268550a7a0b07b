"""Static cost model: cycles per inference predicted from the model's shape, before anything is built.

Each term is (number of inner-loop iterations) x (cycles per iteration of the avr-gcc -Os code in
firmware/tp_<family>.c). The per-iteration figures were calibrated once against simavr (cycle-exact) on
digits / breast_cancer models; `tinyproto validate` prints predicted vs measured for every model, and
tools/bench_device.py tracks the error.
"""

from __future__ import annotations

import numpy as np

# Lower bound per int8 multiply-accumulate with one operand in flash on AVR:
# lpm (3) + ld (2) + muls (2) + add/adc into a 16-bit accumulator (2) = 9 cycles.
MIN_CYCLES_PER_MAC = 9

# ProtoNN inner loops (cycles per iteration, avr-gcc 5.4 -Os).
PN_BITMAP_BIT = 9  # one bit of W's nonzero bitmap, zero bit
PN_NONZERO = 24  # one W nonzero: load, multiply, 32-bit accumulate
PN_DENSE_MAC = 24  # one dense W entry
PN_ROW = 60  # per projected dimension: rescale + clamp
PN_DIST = 30  # one (z_r - b_jr)^2 term
PN_PROTO = 80  # per prototype: table index and lookup
PN_SCORE = 20  # one Z entry times the kernel, into a 32-bit score
PN_FIXED = 200  # call, clear scores, argmax setup


def rx_frame_bytes(n_features: int, n_classes: int) -> int:
    """Serial receive buffer the device app reserves: the largest request (raw float32 features) + framing."""
    payload = 4 * n_features
    body = 2 + payload + 2  # type, seq, payload, crc16
    return body + body // 254 + 2  # COBS overhead byte(s) and the delimiter


def lower_bound_cycles(model) -> int:
    """Multiply-accumulates x the minimum cycles of one int8 MAC with a flash operand."""
    return int(model.multiply_accumulates()) * MIN_CYCLES_PER_MAC


def predict_cycles(model) -> dict:
    if model.family == "protonn":
        return _protonn_cycles(model)
    if model.family == "flynn":
        from tinyproto.flynn.quantize import predict_flynn_cycles

        return predict_flynn_cycles(model)
    raise ValueError(model.family)


def _protonn_cycles(model) -> dict:
    D, m, L, d = model.n_components, model.n_prototypes, model.n_classes, model.n_features
    nnz = int(np.count_nonzero(model.W_q))
    if model.w_dense:
        projection = D * d * PN_DENSE_MAC
    else:
        bits = D * 8 * ((d + 7) // 8)
        projection = (bits - nnz) * PN_BITMAP_BIT + nnz * PN_NONZERO
    projection += D * PN_ROW
    distances = m * D * PN_DIST + m * PN_PROTO
    scores = m * L * PN_SCORE  # upper estimate: prototypes with a zero kernel are skipped on the device
    total = PN_FIXED + projection + distances + scores
    return {
        "projection": projection,
        "distances": distances,
        "scores": scores,
        "total": total,
        "lower_bound": lower_bound_cycles(model),
    }
