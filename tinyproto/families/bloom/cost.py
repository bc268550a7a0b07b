"""Bloom features' static cost model: cycles per inference predicted from the integer model's shape.

Each term is (how many times a unit of work runs in firmware/tp_bloom.c) x (its cycles), fitted by
`python tools/bench_bloom.py --calibrate` (non-negative least squares) on 17 synthetic shapes (d 16..150, k 1..8,
m 17..700, 2..10 classes) measured with Timer1 in the simulated Uno: within 1.8 % on every shape but the
smallest (about 1,200 cycles, +8 %: the fixed part dominates there). The compare-and-store of the MAX depends on
the input (a store only when the slot rises); its mean over random inputs is in "draw".
Re-fit when firmware/tp_bloom.c changes (tests/test_bloom.py checks a measured model against the prediction).
Layer: families (bloom).
"""

from __future__ import annotations

from tinyproto.core.cost import lower_bound_cycles
from tinyproto.families.bloom.train import BYTE_SLOTS

BLOOM_CYCLES = {
    "fixed": 262,  # calls, chunk loop, argmax set-up
    "slot": 13.73,  # per slot of phi: cleared by tp_stream_begin, read by the compaction
    "used": 1.43,  # per used slot: kept by the compaction
    "feature": 9.11,  # per input feature: load, bias, clamp, loop
    "step": 2.99,  # per xorshift16 step (ceil(k/2) per feature with byte draws, k with 16-bit draws)
    "draw": 17.25,  # per draw (k per feature): the slot map, the MAX compare (and store when it rises)
    "draw_mul": 5.86,  # per draw, m < 256 only: the 8x8 multiply of the byte map (m = 256 takes the byte as it is)
    "draw_wide": 36.57,  # per draw, m > 256 only: the 32-bit multiply of a 16-bit draw
    "row": 97.89,  # per weight row: bias read, call, score store and compare
    "mac": 11.95,  # per weight: lpm, ld, mulsu, biased 24-bit add (AVR kernel)
}


def bloom_cost_terms(model) -> dict[str, float]:
    """How many times each costed unit of work runs in one inference."""
    rows, used = model.weights.shape
    d, k, m = model.n_features, model.n_hashes, model.n_slots
    byte_draws = m <= BYTE_SLOTS
    steps = (k + 1) // 2 if byte_draws else k
    return {"fixed": 1, "slot": m, "used": used, "feature": d, "step": d * steps, "draw": d * k,
            "draw_mul": d * k if m < BYTE_SLOTS else 0, "draw_wide": 0 if byte_draws else d * k, "row": rows,
            "mac": rows * used}


def predict_cycles(model) -> dict:
    terms = bloom_cost_terms(model)
    cycles = {name: count * BLOOM_CYCLES[name] for name, count in terms.items()}
    out = {
        "hashing": int(round(cycles["feature"] + cycles["step"] + cycles["draw"] + cycles["draw_mul"] + cycles["draw_wide"])),
        "compaction": int(round(cycles["slot"] + cycles["used"])),
        "scores": int(round(cycles["row"] + cycles["mac"])),
    }
    out["total"] = int(round(sum(cycles.values())))
    out["lower_bound"] = lower_bound_cycles(model)
    return out
