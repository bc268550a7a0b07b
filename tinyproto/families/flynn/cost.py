"""FlyNN's static cost model: cycles per inference predicted from the integer model's shape.

Layer: families (flynn).
"""

from __future__ import annotations

import numpy as np

from tinyproto.core.cost import lower_bound_cycles

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


def predict_cycles(model) -> dict:
    terms = flynn_cost_terms(model)
    cycles = {name: count * FLY_CYCLES[name] for name, count in terms.items()}
    out = {stage: int(round(sum(cycles[k] for k in names))) for stage, names in FLY_STAGES.items()}
    out["total"] = int(round(sum(cycles.values())))
    out["lower_bound"] = lower_bound_cycles(model)
    return out
