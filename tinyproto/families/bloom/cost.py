"""Bloom features' static cost model: cycles per inference predicted from the integer model's shape.

Each term is (how many times a unit of work runs in firmware/tp_bloom.c) x (its cycles), for the path the device
app takes: tp_stream_begin, one tp_stream_feed per int8 chunk of wire.CHUNK_BYTES features, tp_stream_end. The
inner loops marked "hand count" are the instruction cycles of the avr-gcc output (avr-objdump of the built
firmware; avr-gcc unrolls the draws for k <= 3 and keeps a loop for k >= 4, maps a draw with an 8x8 multiply for
m < 256, takes the byte for m = 256, calls __umulhisi3 for m > 256 and shifts for a power of two). The feed loop
with byte draws (every shape the solver searches: m <= 256, k <= 8) is counted whole, per feature and per chunk
for each k (FEED_CYCLES, read off the profiling simulator: exact). The rest were fitted by `python
tools/calibrate_costmodel.py --bloom` (non-negative least squares on relative errors, those counts held, the
m > 256 terms second) on 45 synthetic shapes, narrow (19 of 4 .. 64 features), wide (17 of 65 .. 784) and long
(9 of 1,000 .. 9,000: images and sensor windows, 16 .. 141 chunks), k 1 .. 8, m 8 .. 1024, both input stages, and
60 shapes drawn at random by tools/bench_costmodel.py's drawer (seed 1000), measured through the device app on
the simulated Uno: every shape within 0.8 %; left out of the fit, within 2.2 % but for the m > 256 shapes (a path
the solver does not search: 6.4 %). Before the feed was counted whole, a per-feature fit (load, steps, draws)
put 77 cycles on a chunk, whose own work is about 110 in the code (tp_stream_feed's frame saves 4 to 10
registers by k), and the rest on the features: within 1.2 % up to 784 features, 3 to 5 % low at 3,000 to 9,000.
The slots' work (clearing, compaction) is hand counted: fitted, it came out 0.5 cycle per slot low, which put
shapes of few used slots among many (a handful of features, m about 200) 3 .. 3.5 % low.
The input stage is not in the timed call, so its kind does not change the cycles.

One part depends on the input: the MAX stores a slot only when the value rises (a store costs 1 cycle inside
a feature's draws, 3 by its last draw when avr-gcc unrolled them). The first
feature to reach a slot always stores; with inputs in random order a slot reached by n distinct features stores
H(n) = 1 + 1/2 + ... + 1/n times on average, which is what "store" counts (exactly, from the model's hash). The
extremes are 1 store per used slot (every value the same) and 1 per draw (values rising along the input): on the
sweep a constant vector ran 0.5 .. 1.2 % below random ones (784 features, k = 1, m = 209: 389 stores predicted,
at most 784, +2.0 % at worst).
Layer: families (bloom).
"""

from __future__ import annotations

import numpy as np

from tinyproto.core.cost import lower_bound_cycles, timer_overflow_cycles
from tinyproto.core.wire import CHUNK_BYTES
from tinyproto.families.bloom.slots import BYTE_SLOTS

BLOOM_CYCLES = {
    "fixed": 38.3,  # calls, set-up, the label, the first chunk's tp_stream_begin call and the last's end
    "chunk": 39.7,  # per chunk: tp_feed_step's frame, tests and call (45 cycles in its code) less the empty call
    # the device subtracts (tp_stream_feed's own work per chunk: FEED_CYCLES)
    "slot": 12.75,  # hand count, per slot of phi: cleared four at a time by tp_stream_begin (st, 3 std, adiw,
    # ldi, pointer compare, brne: 15 per 4), then read by the compaction (ld, and, breq taken, cp, cpc, brne: 9)
    "slot_reload": 1,  # hand count, per slot, more than two classes: the compaction's end pointer no longer fits
    # in registers beside the argmax's, so avr-gcc reloads a byte of it (ldi) every step
    "slot_rem": 2,  # hand count, per slot of m % 4: tp_stream_begin's remainder, unrolled (one sts)
    "slot_wide": 0,  # per slot, m > 256 only: 16-bit loop counters
    "wide_fixed": 60.9,  # m > 256 only: the 16-bit draws' code around the loops
    "range": 1,  # hand count, per cycle, with --unknown-rate's range check only: its compaction (tp_bloom_avr.h,
    # tp_bloom_compact) takes 9 cycles a slot like avr-gcc's loop (ld, add, adc, cpse skipping, cpi, brne) but 1,
    # not 3, per used slot and no reload; more: per slot, a shifted sum's mov and lsr (1 + shift), m > 256's
    # ldi and cpc (2); once, the sum's set-up and the stores of tp_bloom_next with the bin (2 + 5), less the
    # stores of tp_bloom_next it replaces (6: two ldi, two sts), 1
    "used": 3,  # hand count, per used slot: kept by the compaction (breq not taken, st, adiw)
    # m > 256 (16-bit draws) or k > 8: the feed loop by its parts (FIT_LATER: with 16-bit draws a step and a draw
    # always come together, so the fit puts both on the step)
    "feature": 7.9,  # per input feature: load, bias, clamp, loop
    "step": 20,  # per xorshift16 step (ceil(k/2) per feature with byte draws, k with 16-bit draws)
    "draw": 0,  # per draw (k per feature): the slot map, the MAX compare
    "store": 1,  # hand count, per MAX store (the slot rises) inside a feature's draws: st, a branch not taken
    "store_last": 3,  # hand count, per store by a feature's last draw (k <= 3 or odd): st and a jump back
    "pair_loop": 0,  # per pair of byte draws when k >= 4 (the draws' loop is not unrolled): its count and branch
    "loop_feature": 7.7,  # per feature when k >= 4: the draws' loop set-up
    "draw_mul": 6,  # per draw, byte draws with m < 256 and k > 8 only: the 8x8 multiply of the byte map (FEED_CYCLES'
    # difference between m < 256 and m = 256 is 5 to 6.5 a draw)
    "feed_feature": 1,  # byte draws, k <= 8: a feature's cycles in tp_stream_feed, FEED_CYCLES (hand count)
    "feed_chunk": 1,  # byte draws, k <= 8: a chunk's own cycles in tp_stream_feed, FEED_CYCLES (hand count)
    "ranged_draw": 4,  # hand count, per draw, --unknown-rate's range check with k = 1 or 3 and m = 256 only: phi then
    # lies behind the stream's next-feature index (firmware/tp_bloom.c, struct tp_bloom_ranged) and avr-gcc reaches
    # it through X, which has no displacement: adiw and sbiw around each draw's load (RANGED_FEED_KS)
    "ranged_store": 2,  # hand count, per MAX store, the same models: the adiw before the store
    "draw_wide": 33.7,  # per draw, m > 256 only: the 16 x 16 -> 32-bit multiply of a draw (__umulhisi3)
    "draw_pow2": 5,  # hand count, per draw, m > 256 a power of two: avr-gcc shifts instead of multiplying
    "draw_shift": 7,  # hand count, per bit of that shift (16 - log2 m per draw): a 32-bit shift loop
    "row": 79.6,  # per weight row: bias read and call (the fit puts the rest in "fixed" and "row_argmax")
    "row_bias32": 4.6,  # per weight row with 32-bit biases (else 16-bit)
    "argmax_fixed": 53.4,  # more than two classes, once: tp_stream_end's argmax set-up and the registers it saves
    "row_argmax": 0,  # per weight row, more than two classes: the score's store and the argmax step (two classes
    # have one row, whose sign is the label)
    "mac": 11,  # hand count, per weight (used <= 256, AVR kernel): lpm, ld, mulsu, biased 24-bit add
    "mac_group": 4,  # hand count, per 4 weights of a row (AVR kernel): dec, breq, rjmp
    "mac_c": 22.1,  # per weight, used > 256: the portable C loop (32-bit sum)
    "row_c": 0,  # per weight row, used > 256: the C loop's call and set-up
}
HAND_COUNTS = {name: BLOOM_CYCLES[name] for name in ("store", "store_last", "mac", "mac_group", "draw_pow2",
                                                     "draw_shift", "slot", "slot_reload", "slot_rem",
                                                     "used", "feed_feature", "feed_chunk", "draw_mul", "range",
                                                     "ranged_draw", "ranged_store")}
# The feed loop with byte draws (m <= 256), per k: (cycles per feature, per chunk) in tp_stream_feed, for an 8x8
# multiply's map (m < 256) and for the byte taken as it is (m = 256). A feature's: the loop's test, the load and
# bias, ceil(k/2) xorshift16 steps, k draws mapped and compared, with no MAX store (stores are the "store" terms);
# a chunk's: the call frame (avr-gcc saves 4 to 10 registers depending on k and the map), the out-of-order and
# length checks, the generator state loaded and stored, the loop's exit. avr-gcc lays the loop out differently
# for each k (registers, which branch falls through), so no sum of per-step costs gives these: they are read off
# the profiling simulator, each exactly linear in features and chunks (tools/calibrate_costmodel.py
# --bloom-feed: 640 .. 1,300 features, residual 0), and tests/test_costmodel.py checks them against the code.
FEED_CYCLES = {  # k: ((per feature, per chunk) with the multiply, (per feature, per chunk) with m = 256)
    1: ((35, 77), (30, 67)), 2: ((54, 90), (41, 72)), 3: ((80, 97), (62, 68)), 4: ((106, 90), (81, 64)),
    5: ((129, 102), (103, 65)), 6: ((150, 94), (116, 64)), 7: ((181, 98), (138, 73)), 8: ((200, 90), (151, 64)),
}
# The k whose feed loop, with m = 256 (the byte taken as it is), costs more with a range check (ranged_draw,
# ranged_store): tools/calibrate_costmodel.py's bloom_feed_cycles(..., ranged=True) for k = 1 .. 8, m = 200 and 256,
# 640, 650 and 1,280 features gave FEED_CYCLES exactly but for these, whose extra is 4 a draw and 2 a store with a
# residual of 0 (640, 650, 1,280 and 333 features). Before it was counted, a range-checked k = 3 model on sensor
# windows (3 x 200 samples, m = 256) ran 14.4 % above its prediction (65,116 cycles against 55,738).
RANGED_FEED_KS = (1, 3)
# m > 256 (16-bit draws; not searched by the solver), and k > 8 with byte draws: the feed's terms per step (feature,
# step, draw, ...), fitted after the rest on the shapes that take that path
FIT_LATER = ("slot_wide", "wide_fixed", "draw_wide", "mac_c", "row_c", "feature", "step", "draw", "pair_loop",
             "loop_feature")


def harmonic(n: np.ndarray) -> np.ndarray:
    """H(n) = 1 + 1/2 + ... + 1/n for integer n >= 0 (H(0) = 0)."""
    n = np.asarray(n, dtype=np.int64)
    table = np.concatenate([[0.0], np.cumsum(1.0 / np.arange(1, max(int(n.max(initial=0)), 1) + 1))])
    return table[n]


def expected_stores(model) -> tuple[float, float]:
    """Mean MAX stores of one inference for inputs in random order, (by a feature's last draw, by its other
    draws): the t-th distinct feature to reach a slot stores with probability 1/t (a feature meeting a slot it
    already reached never does), from the model's hash. A shape without one (the solver's plan) takes d k / used
    features per used slot, a share 1/k of the stores by last draws."""
    slots = getattr(model, "slots", None)
    k = model.n_hashes
    if slots is None:
        used = int(model.weights.shape[1])
        per_slot = model.n_features * k / max(used, 1)
        total = used * (np.log(per_slot) + 0.5772 + 0.5 / per_slot) if per_slot > 1 else float(used)
        return total / k, total * (k - 1) / k
    slots = np.asarray(slots)
    seen: dict[int, set] = {}
    last = other = 0.0
    for j, row in enumerate(slots):  # features in feed order, each feature's draws in order
        for l, slot in enumerate(row.tolist()):
            reached = seen.setdefault(slot, set())
            if j in reached:
                continue
            reached.add(j)
            if l == k - 1:
                last += 1.0 / len(reached)
            else:
                other += 1.0 / len(reached)
    return last, other


def bloom_cost_terms(model) -> dict[str, float]:
    """How many times each costed unit of work runs in one inference (int8 chunks of wire.CHUNK_BYTES)."""
    rows, used = model.weights.shape
    d, k, m = model.n_features, model.n_hashes, model.n_slots
    byte_draws = m <= BYTE_SLOTS
    steps = (k + 1) // 2 if byte_draws else k
    bias = getattr(model, "bias_bits", 32)
    asm = used <= 256
    last, other = expected_stores(model)
    pow2 = not byte_draws and m & (m - 1) == 0  # (v * m) >> 16 is a shift by 16 - log2(m)
    looped = k >= 4 if byte_draws else k >= 2  # avr-gcc keeps a loop over the draws (else it unrolls them)
    if looped and (k % 2 == 0 or not byte_draws):  # the last draw is inside the loop: a store costs 1 there too
        last, other = 0.0, last + other
    ranged = model.checks_range
    shift = model.range_shift if ranged else 0
    chunks = -(-d // CHUNK_BYTES)
    terms = {"fixed": 1, "chunk": chunks, "slot": m, "slot_reload": m if rows > 1 and not ranged else 0,
             "slot_rem": m % 4, "slot_wide": 0 if byte_draws else m, "wide_fixed": 0 if byte_draws else 1,
             "row_argmax": rows if rows > 1 else 0, "argmax_fixed": 1 if rows > 1 else 0,
             "row_c": 0 if asm else rows,
             "range": used + m * ((1 + shift if shift else 0) + (2 if m > 256 else 0)) + 1 if ranged else 0,
             "used": 0 if ranged else used, "store": other, "store_last": last, "row": rows,
             "row_bias32": rows if bias == 32 else 0, "mac": rows * used if asm else 0,
             "mac_group": rows * (used // 4) if asm else 0, "mac_c": 0 if asm else rows * used}
    terms.update({name: 0 for name in ("feature", "step", "draw", "pair_loop", "loop_feature", "draw_mul",
                                       "feed_feature", "feed_chunk", "draw_wide", "draw_pow2", "draw_shift")})
    ranged_feed = ranged and m == BYTE_SLOTS and k in RANGED_FEED_KS
    terms.update(ranged_draw=d * k if ranged_feed else 0, ranged_store=last + other if ranged_feed else 0)
    if byte_draws and k in FEED_CYCLES:  # the feed loop as compiled, counted whole
        per_feature, per_chunk = FEED_CYCLES[k][m == BYTE_SLOTS]
        terms.update(feed_feature=d * per_feature, feed_chunk=chunks * per_chunk)
        return terms
    terms.update({"feature": d, "step": d * steps, "draw": d * k,
                  "pair_loop": d * (k // 2 if byte_draws else k) if looped else 0, "loop_feature": d if looped else 0,
                  "draw_mul": d * k if m < BYTE_SLOTS else 0, "draw_wide": 0 if byte_draws or pow2 else d * k,
                  "draw_pow2": d * k if pow2 else 0,
                  "draw_shift": d * k * (16 - m.bit_length() + 1) if pow2 else 0})
    return terms


cost_terms = bloom_cost_terms  # the name tools/calibrate_costmodel.py reads in every family's cost module


def predict_cycles(model) -> dict:
    terms = bloom_cost_terms(model)
    cycles = {name: count * BLOOM_CYCLES[name] for name, count in terms.items()}
    hashing = ("feature", "step", "draw", "store", "store_last", "pair_loop", "loop_feature", "draw_mul",
               "feed_feature", "feed_chunk", "draw_wide", "draw_pow2", "draw_shift", "ranged_draw", "ranged_store")
    out = {
        "hashing": int(round(sum(cycles[n] for n in hashing))),
        "compaction": int(round(sum(cycles[n] for n in ("slot", "slot_reload", "slot_rem", "slot_wide", "wide_fixed",
                                                               "range", "used")))),
        "scores": int(round(sum(cycles[n] for n in ("row", "row_bias32", "argmax_fixed", "row_argmax", "mac",
                                                     "mac_group", "mac_c", "row_c")))),
    }
    own = sum(cycles.values())
    out["timer_overflows"] = timer_overflow_cycles(own, terms["chunk"])  # one timed call a chunk
    out["total"] = int(round(own)) + out["timer_overflows"]
    out["lower_bound"] = lower_bound_cycles(model)
    return out
