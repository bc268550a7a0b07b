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
# tools/calibrate_costmodel.py on 32 synthetic shapes measured in the simulator (cycle-exact): the inner-loop
# terms are held at their instruction counts (13 per nonzero, 3 per clear bit, 11 per dense term + 4 per 8,
# 13 / 11 per distance term with z in SRAM / in registers, 11 per score term, 2 per wide-index shift bit) and the
# overheads fitted by non-negative least squares on relative errors: all 32 shapes within 2.5 %. The hand counts of the inner loops are 13 per nonzero, 3 per clear bit,
# 11 per dense term (+4 per 8), 11 / 13 per distance term (z in registers / in SRAM) and 11 per score term;
# the fit moves cycles between terms that always occur together (e.g. "mask_byte" 0 with "nonzero" 15, or
# "dense_mac" 5 with "dense_step" 50 per 8), so read the sum, not one term.
PN_CYCLES = {
    "fixed": 14,  # calls, register saves, argmax set-up (the fit puts most of it in per-row / per-class terms)
    "row": 49,  # per projected dimension: row set-up, bias removal, rescale, clamp, store
    "rshift16": 7,  # per row and bit of the 16-bit rescale shift (right shift >= 8 within the 24-bit bound)
    "row32": 0,  # per row rescaled in 32 bits (right shift below 8 or beyond the 24-bit bound, left, or none)
    "rshift32": 7,  # per row and bit of a 32-bit rescale shift (right shifts below 8, or beyond the bound)
    "lshift32": 8,  # per row and bit of the 32-bit left shift (negative projection shift)
    "mask_byte": 18,  # per nonzero bitmap byte
    "zero_mask_byte": 17,  # per all-zero bitmap byte (its 8 inputs are skipped at once)
    "clear_bit": 3,  # per zero bit of a nonzero bitmap byte
    "nonzero": 13,  # per W nonzero: ldd, lpm, muls, biased 24-bit add
    "dense_row": 0,  # per row of a dense W
    "fixed_dense": 0,  # once, dense W
    "dense_step": 4,  # per 8 entries of a dense W row
    "dense_mac": 11,  # per entry of a dense W
    "proto": 33,  # per prototype: table index and lookup, store (D > 16: z read from SRAM)
    "wide_index_bit": 2,  # per prototype and bit of the index shift when the table reaches past 0xFFFF
    "dist_step": 1,  # per 4 distance terms (only when D > 64)
    "dist_term": 13,  # per |z_r - b_jr|^2 term
    "fixed_reg": 283,  # once, D <= 16: saving and restoring r2-r17 for the register-z loop
    "proto_reg": 25,  # per prototype, D <= 16 (z held in registers, one asm loop)
    "dist_term_reg": 11,  # per |z_r - b_jr|^2 term, D <= 16
    "class": 36,  # per class: call, bias removal, store, compare
    "score_step": 3,  # per 4 score terms (only when m > 64)
    "score_term": 11,  # per Z entry times a kernel
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
    terms.update(fixed=1, row=D, **{"class": L}, score_term=m * L)
    right, left = max(model.proj_shift, 0), max(-model.proj_shift, 0)
    if right >= 8 and 16384 * d + (1 << (right - 1)) < 1 << 23:  # tp_pn_rescale's 16-bit path
        terms["rshift16"] = D * (right - 8)
    else:
        terms["row32"] = D
        terms["rshift32"] = D * right
        terms["lshift32"] = D * left
    if D <= 16 and (model.table.size - 1) << model.table_shift <= 0xFFFF:  # tp_pn_kernels' register-z loop
        terms.update(fixed_reg=1, proto_reg=m, dist_term_reg=m * D)
    else:
        terms.update(proto=m, dist_term=m * D)
        if (model.table.size - 1) << model.table_shift > 0xFFFF and model.table_shift < 24:
            terms["wide_index_bit"] = m * ((model.table_shift - 8) % 8)
    if D > 64:
        terms["dist_step"] = m * (D // 4)
    if m > 64:
        terms["score_step"] = L * (m // 4)
    if model.w_dense:
        terms["dense_mac"] = D * d
        terms["dense_step"] = D * (d // 8)
        terms["dense_row"] = D
        terms["fixed_dense"] = 1
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
    projection = sum(cycles.get(k, 0) for k in ("row", "row32", "rshift16", "rshift32", "lshift32", "mask_byte",
                                                "zero_mask_byte", "clear_bit", "scanned_bit", "nonzero",
                                                "dense_mac", "dense_step", "dense_row", "fixed_dense"))
    distances = sum(cycles.get(k, 0) for k in ("proto", "wide_index_bit", "dist_term", "dist_step", "fixed_reg",
                                               "proto_reg", "dist_term_reg"))
    scores = cycles["class"] + cycles["score_term"] + cycles.get("score_step", 0)
    return {
        "projection": projection,
        "distances": distances,
        "scores": scores,
        "total": cycles["fixed"] + projection + distances + scores,
        "lower_bound": lower_bound_cycles(model),
    }


# FlyNN (firmware/tp_flynn.c): cycles per unit, fitted by tools/calibrate_costmodel.py --flynn on 19 compiled
# FlyNN models (digits, breast_cancer, wine, iris, segment at 700 B - 4 kB) measured in the simulator, stage by
# stage (GPIOR0 markers): seeded-M models within 1.6 %, stored-M models -3.0 .. +5.6 %, and iris at 2 kB +23 %
# (s = 2 over 4 inputs: most projections tie, and a tie never replaces a heap entry, so far fewer replacements
# than the expectation below). The seeded generator's work is counted exactly (the xorshift16 stream is
# replayed here); the top-rho heap's replacements depend on the input, so they enter as their expectation for
# rows in random order (rho + sum_{j >= rho} rho / (j + 1)).
FLY_CYCLES = {
    "fixed": -394,  # calls, set-up, argmin, less the marker writes the stage-by-stage fit charged to the stages
    "input_seeded": 34,  # per hash input: clamp, mirror, bias, stamp
    "input_stored": 28,  # per hash input: clamp, mirror, bias
    "row_seeded": 24,  # per row of M: tag, loop set-up, the offer compare
    "row_stored": 11,
    "prng_step": 31,  # seeded: one xorshift16 step
    "take": 12,  # seeded: an accepted proposal (index map, stamp compare and store, add)
    "reject": 4,  # seeded: a proposal rejected as a repeat within its row
    "index_mul": 6,  # seeded: per proposal when the input count is not a power of two (a multiply maps it)
    "stamp_clear": 6,  # seeded: per input when the 8-bit row tags wrap (every 255 rows)
    "stored_index": 18,  # stored M: one flash index and its add
    "heap_call_seeded": 72,  # per expected heap replacement: key, call and return (charged to hashing)
    "heap_call_stored": 62,
    "heap_replace": 13,  # per expected heap replacement: the top-rho stage itself
    "heap_level": 50,  # per expected replacement and heap level
    "winner": 56,  # lookup: per winner
    "winner_mul": 102,  # lookup: per winner when L * b is not a power of two (a 32-bit multiply)
    "lookup_class": 23,  # lookup: per winner and class, 1-bit filters
    "lookup_class_lut": 29,  # lookup: per winner and class, b-bit counts through the LUT
}
# Which FLY_CYCLES terms make up each stage tools/bench_latency.py measures (the rest is "fixed").
FLY_STAGES = {
    "prepare": ("input_seeded", "input_stored"),
    "hashing": ("row_seeded", "row_stored", "prng_step", "take", "reject", "index_mul", "stamp_clear",
                "stored_index", "heap_call_seeded", "heap_call_stored"),
    "top_rho": ("heap_replace", "heap_level"),
    "lookup": ("winner", "winner_mul", "lookup_class", "lookup_class_lut"),
}


def seeded_prefix_counts(seed: int, s: int, n_inputs: int, m_max: int) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative (xorshift16 steps, proposals) that tp_flynn.c's seeded projection loop runs for the first m rows
    of M, for every m in 0..m_max (a smaller m's M is a prefix of a larger one's)."""
    steps = np.zeros(m_max + 1, dtype=np.int64)
    proposals = np.zeros(m_max + 1, dtype=np.int64)
    state = seed
    byte_proposals = n_inputs <= 256
    n_steps = n_proposals = 0
    for row in range(m_max):
        seen: set[int] = set()
        left = s
        while left:
            state ^= (state << 7) & 0xFFFF
            state ^= state >> 9
            state ^= (state << 8) & 0xFFFF
            n_steps += 1
            for value in (((state >> 8) & 0xFF, state & 0xFF) if byte_proposals else (state,)):
                n_proposals += 1
                index = (value * n_inputs) >> (8 if byte_proposals else 16)
                if index not in seen:
                    seen.add(index)
                    left -= 1
                if left == 0:
                    break
        steps[row + 1], proposals[row + 1] = n_steps, n_proposals
    return steps, proposals


def _seeded_counts(seed: int, m: int, s: int, n_inputs: int) -> tuple[int, int]:
    """(xorshift16 steps, proposals) tp_flynn.c's seeded projection loop runs for an m x s M."""
    steps, proposals = seeded_prefix_counts(seed, s, n_inputs, m)
    return int(steps[m]), int(proposals[m])


def expected_heap_replacements(m: int, rho: int) -> float:
    return rho + sum(rho / (j + 1) for j in range(rho, m))


def flynn_cost_terms(model) -> dict[str, float]:
    """How many times each costed unit of work runs in one FlyNN inference (heap replacements: expected)."""
    m, s = model.indices.shape
    rho, L, n_in = model.n_winners, model.n_classes, model.n_hash_inputs
    replacements = expected_heap_replacements(m, rho)
    terms = {name: 0.0 for name in FLY_CYCLES}
    terms.update(fixed=1, heap_replace=replacements,
                 heap_level=replacements * max(int(rho).bit_length() - 1, 0), winner=rho)
    terms["lookup_class" if model.bits == 1 else "lookup_class_lut"] = rho * L
    if (L * model.bits) & (L * model.bits - 1):
        terms["winner_mul"] = rho
    if model.store_M:
        terms.update(input_stored=n_in, row_stored=m, stored_index=m * s, heap_call_stored=replacements)
    else:
        steps, proposals = _seeded_counts(model.seed, m, s, n_in)
        terms.update(input_seeded=n_in, row_seeded=m, prng_step=steps, take=m * s, reject=proposals - m * s,
                     stamp_clear=(m // 255) * n_in, heap_call_seeded=replacements)
        if n_in & (n_in - 1):
            terms["index_mul"] = proposals
    return terms


def _flynn_cycles(model) -> dict:
    terms = flynn_cost_terms(model)
    cycles = {name: count * FLY_CYCLES[name] for name, count in terms.items()}
    out = {stage: int(round(sum(cycles[k] for k in names))) for stage, names in FLY_STAGES.items()}
    out["total"] = int(round(sum(cycles.values())))
    out["lower_bound"] = lower_bound_cycles(model)
    return out
