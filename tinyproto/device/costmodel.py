"""Static cost model: cycles per inference predicted from the model's shape, before anything is built.

Each term is (number of inner-loop iterations) x (cycles per iteration of the avr-gcc -Os code in
firmware/tp_<family>.c). The per-iteration figures are fitted by tools/calibrate_costmodel.py on synthetic
models measured on the simulated Uno (cycle-exact; 12 shapes, every one within 3 %). `tinyproto validate`
prints predicted vs measured for every real model, and tools/bench_device.py tabulates the error.
"""

from __future__ import annotations

import numpy as np

# Lower bound per int8 multiply-accumulate with one operand in flash on AVR:
# lpm (3) + ld (2) + muls (2) + add/adc into a 16-bit accumulator (2) = 9 cycles.
MIN_CYCLES_PER_MAC = 9

# ProtoNN: cycles per unit of each term (avr-gcc 5.4 -Os, firmware/tp_protonn.c), fitted by
# tools/calibrate_costmodel.py on synthetic models measured in the simulator (which is cycle-exact).
PN_CYCLES = {
    "fixed": 62,  # call, argmax set-up
    "row": 181,  # per projected dimension: call, rescale shift, clamp, store
    "mask_byte": 15,  # per bitmap byte
    "scanned_bit": 11,  # per bitmap bit up to the byte's highest set bit
    "nonzero": 21,  # per W nonzero: load, multiply, 32-bit accumulate
    "dense_mac": 20,  # per entry of a dense W
    "proto": 25,  # per prototype: table index and lookup
    "dist_term": 26,  # per |z_r - b_jr|^2 term
    "class": 40,  # per class: accumulator set-up, store, compare
    "score_term": 21,  # per Z entry times a kernel
}


def rx_frame_bytes(n_features: int, n_classes: int) -> int:
    """The device app's one frame buffer (firmware/tp_main.c sizes it the same way from the header):
    the largest of a raw-feature request, its work area and the replies, rounded up to 4 bytes."""
    need = max(4 + 4 * n_features, 5 * n_features + 4 * n_classes, 9 + n_features + 4 * n_classes, 25)
    return (need + 3) // 4 * 4


def lower_bound_cycles(model) -> int:
    """Multiply-accumulates x the minimum cycles of one int8 MAC with a flash operand."""
    return int(model.multiply_accumulates()) * MIN_CYCLES_PER_MAC


def predict_cycles(model) -> dict:
    if model.family == "protonn":
        return _protonn_cycles(model)
    if model.family == "flynn":
        return _flynn_cycles(model)
    raise ValueError(model.family)


def protonn_cost_terms(model) -> dict[str, int]:
    """How many times each costed unit of work runs in one ProtoNN inference (data-independent)."""
    D, m, L, d = model.n_components, model.n_prototypes, model.n_classes, model.n_features
    terms = {"fixed": 1, "row": D, "proto": m, "dist_term": m * D, "class": L, "score_term": m * L,
             "mask_byte": 0, "scanned_bit": 0, "nonzero": 0, "dense_mac": 0}
    if model.w_dense:
        terms["dense_mac"] = D * d
    else:
        mask = np.packbits(model.W_q != 0, axis=1, bitorder="little").reshape(-1)
        terms["mask_byte"] = int(mask.size)
        # the bit loop of a byte stops after its highest set bit
        terms["scanned_bit"] = int(sum(int(b).bit_length() for b in mask))
        terms["nonzero"] = int(np.count_nonzero(model.W_q))
    return terms


def _protonn_cycles(model) -> dict:
    terms = protonn_cost_terms(model)
    cycles = {name: count * PN_CYCLES[name] for name, count in terms.items()}
    projection = sum(cycles[k] for k in ("row", "mask_byte", "scanned_bit", "nonzero", "dense_mac"))
    distances = cycles["proto"] + cycles["dist_term"]
    scores = cycles["class"] + cycles["score_term"]
    return {
        "projection": projection,
        "distances": distances,
        "scores": scores,
        "total": cycles["fixed"] + projection + distances + scores,
        "lower_bound": lower_bound_cycles(model),
    }


def _flynn_cycles(model) -> dict:
    """FlyNN's cycle model lives with its solver (which uses it to cap inference time while searching)."""
    from tinyproto.flynn.solver import estimate_cycles

    m, s = model.indices.shape
    total = int(round(estimate_cycles(m, s, model.n_winners, model.bits, model.n_classes, model.n_hash_inputs,
                                      model.store_M)))
    return {"total": total, "lower_bound": lower_bound_cycles(model)}
