"""BNC's static cost model: cycles per inference predicted from the integer model's shape.

Each term is (iterations of a loop of firmware/tp_bnc.c) x (cycles per iteration), fitted on models measured on
the simulated Uno (cycle-exact; tools/bench_bnc.py --calibrate re-measures). The work does not depend on the
input except for features that are exactly 0 (their weights are skipped), so the model counts every feature.
Layer: families (bnc).
"""

from __future__ import annotations

from tinyproto.core.cost import lower_bound_cycles

BNC_CYCLES = {
    "fixed": 200,  # calls, clearing state, argmax set-up
    "sum": 20,  # per projection sum: clear, sign test, code bit
    "feature": 30,  # per feature: call, pointer set-up
    "dense_mac": 22,  # per dense W entry: lpm, muls, 32-bit add into SRAM
    "mask_byte": 12,  # per sparse bitmap byte
    "mask_bit": 6,  # per bit shifted out of a nonzero bitmap byte (up to its highest set bit: ~8)
    "sparse_mac": 24,  # per W nonzero
    "proto": 20,  # per prototype: loop, compare with the class's nearest
    "proto_byte": 16,  # per prototype byte: lpm, xor, popcount, add
    "class": 24,  # per class: end of its prototypes, score, argmax step
}
STAGES = {
    "projection": ("sum", "feature", "dense_mac", "mask_byte", "mask_bit", "sparse_mac"),
    "hamming": ("proto", "proto_byte", "class"),
}


def bnc_cost_terms(n_features: int, n_bits: int, nonzeros: int, n_prototypes: int, n_classes: int,
                   dense: bool) -> dict[str, float]:
    """How many times each costed unit of work runs in one BNC inference."""
    R = (n_bits + 7) // 8
    terms = {name: 0.0 for name in BNC_CYCLES}
    terms.update(fixed=1, sum=n_bits, feature=n_features, proto=n_prototypes, proto_byte=n_prototypes * R,
                 **{"class": n_classes})
    if dense:
        terms["dense_mac"] = n_features * n_bits
    else:
        terms.update(mask_byte=n_features * R, mask_bit=min(8 * n_features * R, 8 * nonzeros),
                     sparse_mac=nonzeros)
    return terms


def shape_cycles(n_features: int, n_bits: int, nonzeros: int, n_prototypes: int, n_classes: int,
                 dense: bool) -> int:
    terms = bnc_cost_terms(n_features, n_bits, nonzeros, n_prototypes, n_classes, dense)
    return int(round(sum(count * BNC_CYCLES[name] for name, count in terms.items())))


def predict_cycles(model) -> dict:
    terms = bnc_cost_terms(model.n_features, model.n_bits, model.nonzeros, model.n_prototypes, model.n_classes,
                           model.w_dense)
    cycles = {name: count * BNC_CYCLES[name] for name, count in terms.items()}
    out = {stage: int(round(sum(cycles[k] for k in names))) for stage, names in STAGES.items()}
    out["total"] = int(round(sum(cycles.values())))
    out["lower_bound"] = lower_bound_cycles(model)
    return out
