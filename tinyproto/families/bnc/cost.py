"""BNC's static cost model: cycles per inference predicted from the integer model's shape.

Each term is (iterations of a loop of firmware/tp_bnc.c) x (cycles per iteration), for the path the device app
takes: a vector of d <= wire.CHUNK_BYTES features arrives as one chunk and goes through tp_bnc_project() (one
row at a time, the sum in registers); a wider one arrives in ceil(d / 64) chunks and each chunk adds its terms to
r running sums (tp_stream_feed: a sparse W through the same bitmap kernel, row by row, with the first chunk
walking each row's rest to find the next row's nonzeros; a dense W by a C loop; a seeded W by a cursor per row),
then tp_stream_end() packs the r signs. The Hamming stage (tp_bnc_classify) is the same for both.

The inner loops' figures marked "hand count" are the instruction cycles of the avr-gcc output (avr-objdump of
the built firmware); the rest were fitted by `python tools/calibrate_costmodel.py --bnc`
(non-negative least squares on relative errors, those hand counts held) on 48 synthetic shapes of every layout
(dense, bitmap, seeded W), narrow and wide, r 8 .. 128, both input stages, and 60 shapes drawn at random by
tools/bench_costmodel.py's drawer (seed 1000), measured through the device app on the simulated Uno: every shape
within 1.8 %, and within 4.5 % when the shape is left out of the fit (the table in that tool's output). The input
stage is not in the timed call, so its kind does not change the cycles. The work depends only on the model (its
bitmap, its seeded positions), except for two small data-dependent branches (the packing of a sign bit in
tp_stream_end, a new nearest prototype): a few cycles per bit and per prototype, at most 0.3 % between vectors on
the sweep. Layer: families (bnc).
"""

from __future__ import annotations

import numpy as np

from tinyproto.core.cost import lower_bound_cycles, timer_overflow_cycles
from tinyproto.core.wire import CHUNK_BYTES

BNC_CYCLES = {
    # ---- one chunk (d <= 64): tp_bnc_project
    "fixed": 267.5,  # sparse W: calls, frames (not used: sparse_frame counts them)
    "fixed_dense": 224.3,  # dense W: calls, frames
    "fixed_seeded": 249.4,  # seeded W: calls, frames
    # ---- one chunk, a sparse W: tp_bnc_project counted from its code on the profiling simulator (each row's mask
    # bytes, 17 cycles a byte and 2 more for one with a set bit, beside the bits' hand counts; per row the sign
    # test, the code bit and the loop, by how avr-gcc lays the row loop out: one code byte or several, rows of one
    # bitmap byte (d <= 8) or a byte loop); sparse_frame: the function's frame, tp_bnc_classify's and the device
    # app's stream calls around them (sparse_frame_cycles). Exact for r a multiple of 8 (the solver's r).
    "row": 2,  # per row, one code byte (r <= 8), rows of one bitmap byte (d <= 8)
    "row_dense": 71.2,  # per row of a dense W: call, register saves, sign test, code bit
    "code_byte": 104.3,  # per code byte: its loop and store, and its 8 rows' work that no layout adds to
    "dense_mac": 21,  # hand count, per dense W entry: the C loop (ld, lpm, muls, 32-bit add, loop)
    "row_multibyte": 11.625,  # per row, one code byte, rows of several bitmap bytes (d > 8): the byte loop's set-up
    "row_bytes": 10.875,  # per row, several code bytes, rows of one bitmap byte
    "row_bytes_multibyte": 19.875,  # per row, several code bytes, rows of several bitmap bytes
    "mask_byte": 17,  # per sparse bitmap byte: lpm, zero test, loop
    "nonzero_byte": 2,  # per bitmap byte with a set bit: into and out of its bit tests
    "sparse_frame": 1,  # its count is sparse_frame_cycles(...)
    "set_bit": 16,  # hand count, per W nonzero: lpm, ldd, muls, sign extension, 32-bit add
    "clear_bit": 3,  # hand count, per clear bit of a bitmap byte that has a set bit (sbrs, rjmp)
    "seeded_weight": 84.7,  # xorshift16 step, scaled offset (two 8x8 muls), segment step, ld x, lpm, muls, add
    "seeded_row": 12.3,  # per row of a seeded W: the cursor reset (the rest is in code_byte)
    "seeded_uneven": 6.5,  # per weight when K does not divide d: avr-gcc cannot drop the segment-length step
    "seeded_long": 7,  # hand count, per weight in a segment of d // K + 1 features (d % K of a row's K)
    # ---- the Hamming stage (every path)
    "proto": 13,  # hand count, per prototype: loop, compare with the class's nearest
    "proto_byte": 32,  # hand count, per prototype byte: ld, lpm, xor, popcount, 16-bit add, loop
    "proto_1byte": 36,  # hand count, per prototype of a one-byte code (r <= 8): avr-gcc drops the byte loop (lpm,
    # ld, eor, an inline 17-instruction popcount, the compare with the class's nearest, the index step, loop)
    "class": 76,  # hand count, per class: end of its prototypes, score, argmax step
    "class_1byte": 60,  # hand count, the same for a one-byte code: the class's end count, its nearest distance
    # negated to the int32 score and stored, the argmax compare (fitted, this and proto_1byte put every r = 8
    # bitmap shape 28 to 105 cycles high: 34.3 per prototype under the class's 76)
    # ---- several chunks (d > 64): tp_stream_begin / feed per chunk / end
    "chunked_fixed": 161.3,  # per vector: begin, end, calls
    "chunk": 274.7,  # sparse W, per chunk: tp_feed_step, tp_stream_feed's checks, tp_bnc_feed_aligned's frame
    "code_bit": 32.2,  # per code bit slot (8 per code byte): tp_stream_end's sign packing
    "part_row": 128.1,  # sparse W, per row and chunk: the row's sum and offset in and out, tp_bnc_part's call
    "part_mask_byte": 17,  # hand count, sparse W, per bitmap byte in tp_bnc_part: lpm, zero test, loop
    "part_nonzero_byte": 7,  # hand count, sparse W, per bitmap byte with a set bit: into and out of the kernel
    "rest_row": 43,  # sparse W, per row: the first chunk's tp_bnc_rest_of_row call
    "rest_byte": 31,  # hand count, sparse W, per bitmap byte after the first chunk: lpm, popcount, 16-bit add
    "stream_dense_chunk": 110.7,  # dense W, per chunk: tp_feed_step, tp_stream_feed's checks and frame
    "stream_dense_begin_row": 13,  # hand count, dense W, per row: tp_stream_begin clears its sum
    "stream_dense_row": 29,  # hand count, dense W, per row and chunk: the sum in and out, loop
    "stream_dense_mac": 23,  # hand count, dense W, per weight: ld, lpm, muls, sign extension, 32-bit add, loop
    "stream_seeded_chunk": 246.7,  # seeded W, per chunk: tp_feed_step, tp_stream_feed's checks and frame
    "stream_seeded_row": 20.6,  # seeded W, per row: its cursor set up by the first chunk
    "stream_seeded_weight": 189.1,  # seeded W, per weight: the first chunk's PRNG steps, a peek, the multiply-add
    "stream_seeded_row_chunk": 49.6,  # seeded W, per row and chunk: the cursor's sum in and out, loop
    "stream_seeded_peek_fail": 81,  # hand count, seeded W, per row and chunk that ends before the row's last weight
    "stream_seeded_long": 7,  # hand count, seeded W, per peek into a segment of d // K + 1 features (d % K of K)
}
# Held at their hand count when fitting (tools/calibrate_costmodel.py --bnc): left free, nnls trades them against
# the per-row terms they always occur with.
HAND_COUNTS = {name: BNC_CYCLES[name] for name in (
    "dense_mac", "seeded_long", "proto", "proto_byte", "proto_1byte", "class", "class_1byte", "set_bit", "clear_bit",
    "row", "row_multibyte", "row_bytes", "row_bytes_multibyte", "mask_byte", "nonzero_byte", "sparse_frame",
    "part_mask_byte", "part_nonzero_byte", "rest_byte", "stream_dense_begin_row", "stream_dense_row",
    "stream_dense_mac",
    "stream_seeded_peek_fail", "stream_seeded_long")}
STAGES = {
    "projection": ("fixed", "fixed_dense", "fixed_seeded", "seeded_weight", "seeded_row", "seeded_uneven",
                   "seeded_long", "code_byte", "row", "row_multibyte", "row_bytes", "row_bytes_multibyte",
                   "sparse_frame", "row_dense", "dense_mac", "mask_byte",
                   "nonzero_byte",
                   "set_bit", "clear_bit", "chunked_fixed", "chunk", "code_bit", "part_row", "part_mask_byte",
                   "part_nonzero_byte", "rest_row", "rest_byte", "stream_dense_begin_row", "stream_dense_row",
                   "stream_dense_mac", "stream_dense_chunk", "stream_seeded_chunk", "stream_seeded_row",
                   "stream_seeded_weight", "stream_seeded_row_chunk", "stream_seeded_peek_fail", "stream_seeded_long"),
    "hamming": ("proto", "proto_byte", "proto_1byte", "class", "class_1byte"),
}


# The device app's stream calls around a one-chunk sparse BNC's tp_bnc_project and tp_bnc_classify (the timed
# calls less the two functions), by code bytes R: measured on the profiling simulator for every R of the solver's
# bit grid (r = 8 .. 128); 207 from R = 4 on except R = 5 (211: not on the grid).
SPARSE_STREAM_CYCLES = {1: 171, 2: 176, 3: 204, 5: 211, 6: 209}


def sparse_frame_cycles(n_features: int, n_bits: int) -> int:
    """A one-chunk sparse BNC's frames: tp_bnc_project's (68 with one code byte and rows of one bitmap byte, 83
    with several code bytes, 85 with rows of several bitmap bytes), tp_bnc_classify's (69 with one code byte,
    112 with several: its register saves) and the stream calls' (SPARSE_STREAM_CYCLES)."""
    R = (n_bits + 7) // 8
    project = 85 if n_features > 8 else (68 if R == 1 else 83)
    return project + (69 if R == 1 else 112) + SPARSE_STREAM_CYCLES.get(R, 207)


def n_chunks(n_features: int, chunk: int = CHUNK_BYTES) -> int:
    return -(-n_features // chunk)


def max_peek_fails(n_features: int, n_bits: int, chunk: int = CHUNK_BYTES) -> int:
    """Rows x chunks that end before the row's last weight, at most, for seeded positions not known yet (the last
    weight at the last feature): an upper bound, so a shape's estimate never falls below the model's cycles."""
    return n_bits * ((n_features - 1) // chunk)


def bnc_cost_terms(n_features: int, n_bits: int, nonzeros: int, n_prototypes: int, n_classes: int,
                   dense: bool, nonzero_bytes: float | None = None, per_row: int = 0,
                   peek_fails: float | None = None) -> dict[str, float]:
    """How many times each costed unit of work runs in one BNC inference (a vector fed in int8 chunks of
    wire.CHUNK_BYTES). nonzero_bytes: bitmap bytes with a set bit; peek_fails: a seeded W's rows x chunks that end
    before the row's last weight (the model's own counts; upper bounds from the shape if None)."""
    d, r = n_features, n_bits
    R = (r + 7) // 8
    row_bytes = (d + 7) // 8
    mask_bytes = r * row_bytes
    terms = {name: 0.0 for name in BNC_CYCLES}
    terms["class_1byte" if R == 1 else "class"] = n_classes
    if R == 1:
        terms["proto_1byte"] = n_prototypes
    else:
        terms.update(proto=n_prototypes, proto_byte=n_prototypes * R)
    if nonzero_bytes is None and not dense and not per_row:
        # at most one bitmap byte per nonzero: an upper bound (a trained W's nonzeros share bytes), so the
        # solver's latency limit holds for the model it trains (on the sweep's random W: +0 .. +15 %)
        nonzero_bytes = min(mask_bytes, nonzeros)
    chunks = n_chunks(d)
    if chunks == 1:
        terms["code_byte"] = R
        if per_row:
            terms.update(fixed_seeded=1, seeded_row=r, seeded_weight=r * per_row, seeded_long=r * (d % per_row),
                         seeded_uneven=r * per_row if d % per_row else 0)
        elif dense:
            terms.update(fixed_dense=1, row_dense=r, dense_mac=d * r)
        else:
            # with one bitmap byte per row (d <= 8) avr-gcc drops the byte loop, with one code byte the code loop
            row = ("row" if row_bytes == 1 else "row_multibyte") if R == 1 else (
                "row_bytes" if row_bytes == 1 else "row_bytes_multibyte")
            terms.update({row: r}, code_byte=0, sparse_frame=sparse_frame_cycles(d, r), mask_byte=mask_bytes,
                         nonzero_byte=nonzero_bytes, set_bit=nonzeros, clear_bit=8 * nonzero_bytes - nonzeros)
        return terms
    terms.update(chunked_fixed=1, code_bit=8 * R)
    if per_row:
        if peek_fails is None:
            peek_fails = max_peek_fails(d, r)
        # a failing peek looks at the row's next segment: long for d % K of the K segments
        long_peeks = r * (d % per_row) + peek_fails * (d % per_row) / per_row
        terms.update(stream_seeded_chunk=chunks, stream_seeded_row=r, stream_seeded_weight=r * per_row,
                     stream_seeded_row_chunk=r * chunks, stream_seeded_peek_fail=peek_fails,
                     stream_seeded_long=long_peeks)
    elif dense:
        terms.update(stream_dense_chunk=chunks, stream_dense_begin_row=r, stream_dense_row=r * chunks,
                     stream_dense_mac=d * r)
    else:
        first_bytes = (min(d, CHUNK_BYTES) + 7) // 8
        terms.update(chunk=chunks, part_row=r * chunks, part_mask_byte=mask_bytes, part_nonzero_byte=nonzero_bytes,
                     set_bit=nonzeros, clear_bit=8 * nonzero_bytes - nonzeros, rest_row=r,
                     rest_byte=r * (row_bytes - first_bytes))
    return terms


def shape_cycles(n_features: int, n_bits: int, nonzeros: int, n_prototypes: int, n_classes: int,
                 dense: bool, per_row: int = 0) -> int:
    """Predicted cycles of a shape before any model exists (the solver's plan): the bitmap's nonzero bytes and a
    seeded W's failed peeks at their upper bounds, so the trained model's prediction is never above it."""
    terms = bnc_cost_terms(n_features, n_bits, nonzeros, n_prototypes, n_classes, dense, None, per_row)
    own = sum(count * BNC_CYCLES[name] for name, count in terms.items())
    return int(round(own)) + timer_overflow_cycles(own, n_chunks(n_features))


def nonzero_mask_bytes(model) -> int:
    """Bitmap bytes of the model's sparse W that hold a set bit (the asm kernel runs only for those)."""
    mask = np.packbits(np.asarray(model.W_q) != 0, axis=1, bitorder="little")
    return int(np.count_nonzero(mask))


def seeded_peek_fails(model, chunk: int = CHUNK_BYTES) -> int:
    """Rows x chunks of a seeded W that end before the row's last weight: each costs one peek that fails."""
    from tinyproto.families.bnc.pattern import seeded_positions

    last = seeded_positions(int(model.pattern_seed), model.n_bits, model.n_features, int(model.per_row))[:, -1]
    return int(np.sum(last // chunk))


def cost_terms(model) -> dict[str, float]:
    """bnc_cost_terms with the model's own counts (its bitmap's nonzero bytes, its seeded positions)."""
    dense = model.w_dense
    sparse = not dense and not model.seeded
    return bnc_cost_terms(model.n_features, model.n_bits, model.nonzeros, model.n_prototypes, model.n_classes,
                          dense, nonzero_mask_bytes(model) if sparse else None, model.per_row,
                          seeded_peek_fails(model) if model.seeded else None)


def predict_cycles(model) -> dict:
    cycles = {name: count * BNC_CYCLES[name] for name, count in cost_terms(model).items()}
    out = {stage: int(round(sum(cycles[k] for k in names))) for stage, names in STAGES.items()}
    own = sum(cycles.values())
    out["timer_overflows"] = timer_overflow_cycles(own, n_chunks(model.n_features))  # one timed call a chunk
    out["total"] = int(round(own)) + out["timer_overflows"]
    out["lower_bound"] = lower_bound_cycles(model)
    return out
