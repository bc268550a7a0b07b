"""Bloom features' static cost model: cycles per inference predicted from the integer model's shape.

Each term is (how many times a unit of work runs in firmware/tp_bloom.c) x (its cycles), fitted by
`python tools/bench_bloom.py --calibrate` (non-negative least squares) on 14 synthetic shapes (d 16..150, k 1..8,
m 17..700, 2..10 classes) measured with Timer1 in the simulated Uno: within 2.0 % on every shape but the
smallest (1,191 cycles, +13 %: the fixed part dominates there). The fit puts the generator step into the draws
(two byte draws per step everywhere but k = 1) and the compaction's store into the per-slot term.
Re-fit when firmware/tp_bloom.c changes (tests/test_bloom.py checks a measured model against the prediction).
Layer: families (bloom).
"""

from __future__ import annotations

from tinyproto.core.cost import lower_bound_cycles
from tinyproto.families.bloom.train import BYTE_SLOTS

BLOOM_CYCLES = {
    "fixed": 330,  # calls, chunk loop, argmax set-up
    "slot": 13.2,  # per slot of phi: cleared by tp_stream_begin, read by the compaction
    "used": 0,  # per used slot: kept by the compaction
    "feature": 6.6,  # per input feature: load, bias, clamp, loop
    "step": 0,  # per xorshift16 step (ceil(k/2) per feature with byte draws, k with 16-bit draws)
    "draw": 26.4,  # per draw (k per feature): the slot map, the MAX compare (and store when it rises)
    "draw_wide": 36.4,  # per draw, m > 256 only: the 32-bit multiply of a 16-bit draw
    "row": 158,  # per weight row: bias read, call, score store and compare
    "mac": 11.04,  # per weight: lpm, ld, mulsu, biased 24-bit add (AVR kernel)
}


def bloom_cost_terms(model) -> dict[str, float]:
    """How many times each costed unit of work runs in one inference."""
    rows, used = model.weights.shape
    d, k, m = model.n_features, model.n_hashes, model.n_slots
    byte_draws = m <= BYTE_SLOTS
    steps = (k + 1) // 2 if byte_draws else k
    return {"fixed": 1, "slot": m, "used": used, "feature": d, "step": d * steps, "draw": d * k,
            "draw_wide": 0 if byte_draws else d * k, "row": rows, "mac": rows * used}


def predict_cycles(model) -> dict:
    terms = bloom_cost_terms(model)
    cycles = {name: count * BLOOM_CYCLES[name] for name, count in terms.items()}
    out = {
        "hashing": int(round(cycles["feature"] + cycles["step"] + cycles["draw"] + cycles["draw_wide"])),
        "compaction": int(round(cycles["slot"] + cycles["used"])),
        "scores": int(round(cycles["row"] + cycles["mac"])),
    }
    out["total"] = int(round(sum(cycles.values())))
    out["lower_bound"] = lower_bound_cycles(model)
    return out
