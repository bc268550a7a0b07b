"""BNC's static cost model: cycles per inference predicted from the integer model's shape.

Each term is (iterations of a loop of firmware/tp_bnc.c) x (cycles per iteration), fitted on models measured on
the simulated Uno (cycle-exact; tools/bench_bnc.py --calibrate re-measures). The work does not depend on the
input except for features that are exactly 0 (their weights are skipped), so the model counts every feature.
Layer: families (bnc).
"""

from __future__ import annotations

import numpy as np

from tinyproto.core.cost import lower_bound_cycles

BNC_CYCLES = {
    "fixed": 200,  # calls, argmax set-up
    "row": 30,  # per row of W: call, sum set-up, sign test, code bit
    "dense_mac": 14,  # per dense W entry: lpm, ld, muls, 32-bit add in registers
    "mask_byte": 10,  # per sparse bitmap byte
    "mask_bit": 5,  # per bit shifted out of a bitmap byte (up to its highest set bit)
    "sparse_mac": 14,  # per W nonzero
    "proto": 20,  # per prototype: loop, compare with the class's nearest
    "proto_byte": 20,  # per prototype byte: lpm, xor, popcount, add
    "class": 24,  # per class: end of its prototypes, score, argmax step
}
STAGES = {
    "projection": ("row", "dense_mac", "mask_byte", "mask_bit", "sparse_mac"),
    "hamming": ("proto", "proto_byte", "class"),
}


def bnc_cost_terms(n_features: int, n_bits: int, nonzeros: int, n_prototypes: int, n_classes: int,
                   dense: bool, mask_bits: int | None = None) -> dict[str, float]:
    """How many times each costed unit of work runs in one BNC inference. mask_bits: the bits the sparse loop
    shifts out (the sum of the bitmap bytes' bit lengths; estimated as 8 per byte holding a nonzero if None)."""
    R = (n_bits + 7) // 8
    mask_bytes = n_bits * ((n_features + 7) // 8)
    terms = {name: 0.0 for name in BNC_CYCLES}
    terms.update(fixed=1, row=n_bits, proto=n_prototypes, proto_byte=n_prototypes * R, **{"class": n_classes})
    if dense:
        terms["dense_mac"] = n_features * n_bits
    else:
        if mask_bits is None:
            mask_bits = 8 * min(mask_bytes, nonzeros)
        terms.update(mask_byte=mask_bytes, mask_bit=mask_bits, sparse_mac=nonzeros)
    return terms


def shape_cycles(n_features: int, n_bits: int, nonzeros: int, n_prototypes: int, n_classes: int,
                 dense: bool) -> int:
    terms = bnc_cost_terms(n_features, n_bits, nonzeros, n_prototypes, n_classes, dense)
    return int(round(sum(count * BNC_CYCLES[name] for name, count in terms.items())))


def mask_bit_count(model) -> int:
    """Bits tp_bnc.c's sparse row loop shifts out: per bitmap byte, the position of its highest set bit + 1."""
    mask = np.packbits(np.asarray(model.W_q) != 0, axis=1, bitorder="little")
    return int(sum(int(v).bit_length() for v in mask.reshape(-1)))


def predict_cycles(model) -> dict:
    dense = model.w_dense
    terms = bnc_cost_terms(model.n_features, model.n_bits, model.nonzeros, model.n_prototypes, model.n_classes,
                           dense, None if dense else mask_bit_count(model))
    cycles = {name: count * BNC_CYCLES[name] for name, count in terms.items()}
    out = {stage: int(round(sum(cycles[k] for k in names))) for stage, names in STAGES.items()}
    out["total"] = int(round(sum(cycles.values())))
    out["lower_bound"] = lower_bound_cycles(model)
    return out
