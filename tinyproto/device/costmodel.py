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

# ProtoNN, AVR assembly kernels (firmware/tp_protonn.c, TP_PN_ASM): cycles per unit of each term, fitted by
# tools/calibrate_costmodel.py (non-negative least squares) on 16 synthetic shapes measured in the simulator
# (cycle-exact), with the projection's inner-loop costs held at their hand counts (13 per nonzero, 3 per clear
# bit, 11 per dense term, 4 per 8-term dense step): every shape within 2.4 %.
PN_CYCLES = {
    "fixed": 126,  # calls, register saves, argmax set-up
    "row": 102,  # per projected dimension: row set-up, bias removal, rescale, clamp, store
    "mask_byte": 15,  # per nonzero bitmap byte
    "zero_mask_byte": 19,  # per all-zero bitmap byte (its 8 inputs are skipped at once)
    "clear_bit": 3,  # per zero bit of a nonzero bitmap byte
    "nonzero": 13,  # per W nonzero: ldd, lpm, muls, biased 24-bit add
    "dense_row": 44,  # per row of a dense W: its out-of-line call
    "dense_step": 4,  # per 8 entries of a dense W row
    "dense_mac": 11,  # per entry of a dense W
    "proto": 41,  # per prototype: call, table index and lookup, store
    "dist_step": 4,  # per 4 distance terms (only when D > 32)
    "dist_term": 13,  # per |z_r - b_jr|^2 term
    "class": 88,  # per class: call, bias removal, store, compare
    "score_step": 4,  # per 4 score terms (only when m > 32)
    "score_term": 10,  # per Z entry times a kernel
}
# The portable C loops, which the AVR build falls back to outside the assembly kernels' proven bounds
# (d > 511 features, D > 255 dimensions or m > 256 prototypes): the previous calibration of the same C code.
PN_CYCLES_C = {
    "fixed": 62, "row": 181, "mask_byte": 15, "scanned_bit": 11, "nonzero": 21, "dense_mac": 20, "proto": 25,
    "dist_term": 26, "class": 40, "score_term": 21,
}


def protonn_uses_asm(model) -> bool:
    """Whether the AVR build runs the assembly kernels (the same test as TP_PN_ASM in tp_protonn.c)."""
    return model.n_features <= 511 and model.n_components <= 255 and model.n_prototypes <= 256


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
    if not protonn_uses_asm(model):
        return _protonn_c_terms(model)
    terms = {name: 0 for name in PN_CYCLES}
    terms.update(fixed=1, row=D, proto=m, dist_term=m * D, **{"class": L}, score_term=m * L)
    if D > 32:
        terms["dist_step"] = m * (D // 4)
    if m > 32:
        terms["score_step"] = L * (m // 4)
    if model.w_dense:
        terms["dense_mac"] = D * d
        terms["dense_step"] = D * (d // 8)
        terms["dense_row"] = D
    else:
        mask = np.packbits(model.W_q != 0, axis=1, bitorder="little").reshape(-1)
        nonzero_bytes = mask[mask != 0]
        terms["mask_byte"] = int(nonzero_bytes.size)
        terms["zero_mask_byte"] = int(mask.size - nonzero_bytes.size)
        terms["nonzero"] = int(np.count_nonzero(model.W_q))
        terms["clear_bit"] = 8 * int(nonzero_bytes.size) - terms["nonzero"]
    return terms


def _protonn_c_terms(model) -> dict[str, int]:
    D, m, L, d = model.n_components, model.n_prototypes, model.n_classes, model.n_features
    terms = {"fixed": 1, "row": D, "proto": m, "dist_term": m * D, "class": L, "score_term": m * L,
             "mask_byte": 0, "scanned_bit": 0, "nonzero": 0, "dense_mac": 0}
    if model.w_dense:
        terms["dense_mac"] = D * d
    else:
        mask = np.packbits(model.W_q != 0, axis=1, bitorder="little").reshape(-1)
        terms["mask_byte"] = int(mask.size)
        terms["scanned_bit"] = int(sum(int(b).bit_length() for b in mask))
        terms["nonzero"] = int(np.count_nonzero(model.W_q))
    return terms


def _protonn_cycles(model) -> dict:
    terms = protonn_cost_terms(model)
    table = PN_CYCLES if protonn_uses_asm(model) else PN_CYCLES_C
    cycles = {name: count * table[name] for name, count in terms.items()}
    projection = sum(cycles.get(k, 0) for k in ("row", "mask_byte", "zero_mask_byte", "clear_bit", "scanned_bit",
                                                "nonzero", "dense_mac", "dense_step", "dense_row"))
    distances = cycles["proto"] + cycles["dist_term"] + cycles.get("dist_step", 0)
    scores = cycles["class"] + cycles["score_term"] + cycles.get("score_step", 0)
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
