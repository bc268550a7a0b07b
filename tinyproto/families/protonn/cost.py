"""ProtoNN's static cost model: cycles per inference predicted from the integer model's shape.

Each term is (number of inner-loop iterations) x (cycles per iteration of firmware/tp_protonn.c), fitted by
tools/calibrate_costmodel.py on synthetic models measured on the simulated Uno (cycle-exact).
Layer: families (protonn).
"""

from __future__ import annotations

import numpy as np

from tinyproto.core.cost import lower_bound_cycles, timer_overflow_cycles
from tinyproto.core.wire import CHUNK_BYTES
from tinyproto.families.protonn.encoding import DENSE_GROUP
from tinyproto.families.protonn.quantize import ACC24_MAX_ROW_NNZ

# ProtoNN, AVR assembly kernels (firmware/tp_protonn.c, TP_PROTONN_ASM): cycles per unit of each term. The inner-loop
# terms are held at their instruction counts (13 per nonzero, 3 per clear bit, 4 per 8 dense inputs and group, 13 / 11
# per distance term with z in SRAM / in registers, 9 per dense W entry + 2 per input load and group, 8 per score
# product + 2 per kernel load and group, 2 per bit of
# the asm rescale shift); the overheads are fitted function by function by `tools/calibrate_costmodel.py
# --protonn-functions 160` (non-negative least squares on relative errors; 160 shapes drawn with seed 5000, each
# function's own cycles from the profiling simulator: tp_protonn_kernels for the distance terms, tp_protonn_scores
# for the score terms, the rest of the timed call for the projection and fixed terms). The fit moves cycles between
# terms that always occur together, so read the sum, not one term.
PN_CYCLES = {
    # tp_predict's own code around its three calls and the device app's timed call (less the empty call): 61
    # cycles on every row-major shape of --protonn-functions (the timed span less tp_protonn_*'s cycles), held
    "fixed": 61,
    "fixed_bitmap": 59,  # once, a bitmap W: tp_protonn_project's frame and row loop set-up
    "rescale_call": 32,  # per row of a dense W whose rescale avr-gcc leaves out of line (rescale_out_of_line)
    "row": 51,  # per projected dimension, C rescale: row set-up, bias removal, clamp, store (the fit: in row32)
    "rshift16": 0,  # per row and bit of the 16-bit rescale shift (right shift >= 8 within the 24-bit bound)
    "row32": 9,  # per row rescaled in 32 bits (right shift below 8 or beyond the 24-bit bound, left, or none)
    "rshift32": 7,  # per row and bit of a 32-bit rescale shift (right shifts below 8, or beyond the bound)
    "lshift32": 13,  # per row and bit of the 32-bit left shift (negative projection shift)
    "row_asm": 40,  # per projected dimension, asm rescale (TP_PROTONN_ROW_Z_ASM): set-up, bias, clamp, store
    "rshift_asm": 2,  # per row and bit of the asm rescale shift (RSHIFT - 8)
    "mask_byte": 6,  # per nonzero bitmap byte: lpm, test, branch
    "zero_mask_byte": 7,  # per all-zero bitmap byte (its 8 inputs are skipped at once)
    "mask_step": 6,  # per bitmap byte of rows longer than 64 inputs (a loop: pointer step, counter)
    "clear_bit": 3,  # per zero bit of a nonzero bitmap byte
    "nonzero": 13,  # per W nonzero: ldd, lpm, muls, biased 24-bit add
    "dense_group": 0,  # per group of up to 4 rows of a dense W: sums set up and stored
    "fixed_dense": 20,  # once, dense W
    # per row of a dense W rescaled in C: the group kernel stores its 24-bit sum to acc[], the rescale reads it back;
    # fitted alone (`calibrate_costmodel.py --protonn-dense-rows 40`: 8.3) on 40 dense shapes drawn with seed 3000.
    # The function-by-function refit (--protonn-functions) gave 13, which put a 200-row dense shape 3.6 % over
    # (tests/test_protonn_kernels_avr.py, dist-24bit): its random draws hold few dense shapes.
    "dense_row_c": 11,
    # per group of a dense W with a projection offset: the group's sums stored to acc[] and its loop of offset
    # rescales set up (avr-objdump of a 6-input group: 93 cycles besides its MACs, 52 a row besides the rescale's
    # own); fitted with offset_row on seeds 7 and 11 of tools/bench_costmodel.py's draw (68, 48)
    "dense_group_c": 55,
    # a dense W with the asm rescale (TP_PROTONN_ROW_Z_ASM: the group kernel stores z itself), counted from its
    # code (tp_protonn_avr.h, TP_PROTONN_DENSE_GROUP_ASM): per row its sum's three movs, z's two bytes moved, the
    # clamp to +127 taken (cpi, cpc, brlt, ldi, rjmp: 6) and st (2); 3 more for a row below +128 (the second
    # compare: 9 instead of 6, counted on random vectors like the offset rescale's clamps); per group the ldi of
    # the zero and 0x80 registers, the output pointer's movw and clr r1; tp_protonn_project's frame and group loop
    # (avr-gcc's C around the kernel) in dense_z_frame_cycles. Exact on the profiling simulator.
    "dense_z_row": 13,
    "dense_z_in": 3,
    "dense_z_group": 4,
    "dense_z_frame": 1,  # its count is dense_z_frame_cycles(D)
    # a dense W rescaled in C with a projection shift below 8 (no offset): tp_protonn_project besides the kernels'
    # dense_mac, dense_load and dense_step, counted whole (dense_c_project_cycles: its layout's count, DENSE_C_FRAME,
    # and each row's rescale paths replayed on random vectors; exact on the profiling simulator)
    "dense_c_project": 1,
    # a bitmap W over more than 511 features (the C row loop, TP_PROTONN_ASM_ROWS 0): tp_protonn_row_dot
    # (out of line, data-independent) per row, bitmap byte, bit scanned up to a byte's highest set bit and nonzero,
    # and tp_protonn_project (its frame and each row's inlined 32-bit rescale) counted whole by
    # c_rows_project_cycles; exact on the profiling simulator (tests/test_costmodel.py)
    "c_bitmap_row": 67,
    "c_bitmap_byte": 14,
    "c_bitmap_bit": 10,
    "c_bitmap_nonzero": 17,
    "c_rows_project": 1,
    "dense_step": 4,  # per 8 inputs and group of a dense W (the loop step)
    "dense_load": 2,  # per input and group of a dense W: ld x_i
    "dense_mac": 9,  # per entry of a dense W: lpm, muls, biased 24-bit add
    # the general distance loop (more than 16 dimensions, or a table reaching past 0xFFFF): every part is a count of
    # its code, exact on the profiling simulator (general_kernels_cycles; tests/test_costmodel.py): its frame once
    # and its work per prototype besides the distance terms (the table index, always computed and clamped in
    # constant time, the lookup, store, kernel sum and loop)
    "kernels_frame": 1,  # its count: general_kernels_cycles(...)[0]
    "kernels_proto": 1,  # its count: m * general_kernels_cycles(...)[1]
    "dist_step": 3,  # per 4 distance terms (only when D > 64): dec, brne (hand count; the last brne's cycle
    # saved is the step counter's ldi)
    "dist_term": 13,  # per |z_r - b_jr|^2 term
    "fixed_reg": 98,  # once, D <= 16: saving and restoring r2-r17 for the register-z loop
    # per prototype, D <= 16 (z held in registers, one asm loop), a distance beyond the table's reach: the table
    # index's compare (cpc, brsh, ldi), lookup, store, kernel sum and loop, less the first term's cycle that
    # dist_term_reg counts (avr-objdump: 21, and 22 when the reach's low byte is not 0, one more cpi/cpc)
    "proto_reg": 21,
    "proto_reg_reach_low": 1,
    "reach_index_reg": 1,  # a distance within reach: its index shift instead (its count: mean_reach_index_cycles)
    "dist_term_reg": 11,  # per |z_r - b_jr|^2 term, D <= 16
    "class": 30,  # per class: bias removal, store, compare
    "score_group": 128,  # per group of up to 5 classes: clear the sums, set-up (the fit adds the r2-r17 saves)
    "score_load": 2,  # per prototype and group: ld k_j
    "score_step": 4,  # per 8 prototypes and group: the loop step
    "score_term": 8,  # per Z entry times a kernel: lpm, mul, 24-bit add
}
SCORE_GROUP = 5  # classes per kernel load (quantize.SCORE_GROUP, TP_PROTONN_SCORE_GROUP)
# The portable C loops, which the AVR build falls back to outside the assembly kernels' proven bounds
# (d > 511 features, D > 255 dimensions or m > 256 prototypes): the previous calibration of the same C code.
PN_CYCLES_C = {
    "fixed": 62, "row": 181, "mask_byte": 15, "scanned_bit": 11, "nonzero": 21, "dense_mac": 20, "proto": 25,
    "dist_term": 26, "class": 40, "score_term": 21,
}


# The C projection of a row-major W beyond the row kernels' 24-bit bound (d > 511: TP_PN_ASM_ROWS 0) while the
# distances and scores still run the assembly kernels (D <= 255, m <= 256: TP_PN_ASM 1); the rescale is counted by
# PN_CYCLES' 32-bit terms. Fitted with the rest of the call's terms by --protonn-functions (--protonn-c fits them
# alone, PN_CYCLES held).
PN_C_ROWS_CYCLES = {
    "c_row": 153,  # per row of a dense W: tp_pn_row_dot's call and loop (a bitmap W's: c_bitmap_*, counted)
    "c_dense_mac": 23,  # per dense W entry: the C dot product
}

# The streamed projection (firmware/tp_protonn.c, tp_stream_*: column-major W codes, and tp_predict of a
# column-major W), counted whole from its compiled code (stream_projection_cycles; exact on the profiling simulator,
# tests/test_costmodel.py), and the projection offset of a shared input stage (tp_protonn_rescale_offset, counted
# by offset_rescale_cycles): each unit's count is its cycles.
PN_STREAM_CYCLES = {
    "stream_projection": 1,  # its count is stream_projection_cycles(model)
    "offset_row": 0,  # per row of a row-major W with an offset: the rescale's call and z's store (the call's body
    # is offset_rescale, counted)
    "offset_rescale": 1,  # tp_protonn_rescale_offset's own cycles (mean_offset_rescale_cycles: an avr-objdump count)
}

# The streamed projection's code as avr-gcc -Os compiles it (avr-objdump; on the profiling simulator each function's
# cycles equal these counts exactly for col_bytes and col_nibbles W, 24- and 32-bit sums, D = 4 to 100, 20 to 784
# features, every projection shift of -7 to 28 with 24-bit sums and of -2 to 17 with 32-bit ones; a left shift of
# 8 or more is within 1 %, beyond those not measured). Keyed by the sums' width (TP_PROTONN_ACC24: True) and, for
# tp_stream_feed, the encoding:
STREAM_APP = (1, 40)  # the device app's own cycles in the timed calls beyond the empty one: once, and per chunk
STREAM_BEGIN = {True: (17, 11), False: (17, 13)}  # tp_stream_begin: its code pointers set, and each row's sum
# cleared (three or four st, the loop); a nibble-coded W also clears its nibble flag (STREAM_BEGIN_NIBBLES)
STREAM_BEGIN_NIBBLES = 2
# tp_stream_feed: per call (a chunk: its frame, the code and value pointers loaded and stored), per feature (x
# loaded, the loop) and per nonzero (its code and value read, muls, the add into its row's sum in SRAM), for a
# nibble-coded W apart for a low nibble (read in place) and a high one (the byte fetched, swapped)
STREAM_FEED = {
    ("col_bytes", True): (55, 7, 46, 46), ("col_bytes", False): (59, 7, 50, 50),
    ("col_nibbles", True): (68, 7, 49, 52), ("col_nibbles", False): (76, 7, 54, 57),
}
# tp_stream_end: its frame, the calls of the distance and score kernels and the row loop's last exit, then per
# row (stream_end_row_cycles) the sum loaded (24 bits sign-extended: 13 cycles; 32: 8), the rescale inlined with
# the paths its clamps take, z stored and the loop (7). With an offset the row calls tp_protonn_rescale_offset
# (28 cycles a row besides it, and a frame of 93).
STREAM_END_FRAME = {True: 74, False: 58}
STREAM_END_FRAME_RSHIFT8 = 80  # the 16-bit rescale by 8 (byte moves only): two registers more saved
STREAM_END_OFFSET = (93, 28)
# The 16-bit rescale by 15 or more: the shifted value has 9 bits or fewer, so avr-gcc drops the clamps (all but
# -128's at 16) and shifts by byte moves, muls or a short loop, a layout per shift: (frame, cycles a row)
STREAM_END_HIGH_RSHIFT = {15: (74, 41), 16: (86, 39), 17: (88, 29), 18: (88, 30), 19: (88, 31), 20: (88, 33),
                          21: (88, 33), 22: (88, 32), 23: (88, 30)}
STREAM_END_RSHIFT24 = (63, 8)  # 24-bit sums shifted by 24 or more (the 32-bit rescale): z is 0 or -1
# The final clamp to +-127 of a 32-bit value: at +128 or above (cpi, cpc x3, brge taken, ldi), within, below -127;
# the 16-bit rescale's (TP_PROTONN_AVR_RESCALE: d <= 511, a right shift of 8 or more, no offset; _rescale16)
CLAMP32 = (7, 12, 14)
CLAMP16 = (5, 8, 10)
CLAMP32_CALLED = (8, 12, 14)  # tp_protonn_rescale out of line (a dense W, a left shift): +127 returned a cycle later
# A left shift or none clamps the sum to +-127 first (two compares of 32 bits): within, outside
CLAMP_FIRST = {True: (14, 17), False: (13, 16)}


def _clamp(s: np.ndarray, cycles: tuple[int, int, int]) -> np.ndarray:
    high, within, low = cycles
    return np.where(s >= 128, high, np.where(s < -127, low, within))


def stream_end_row_cycles(p: np.ndarray, proj_shift: int, acc24: bool, rescale16: bool) -> np.ndarray:
    """Cycles of tp_stream_end's row loop for each projection sum p (no offset), as avr-gcc -Os compiles the
    inlined rescale by the sums' width and the shift: tp_protonn_avr.h's 16-bit one (rescale16, _rescale16) or
    tp_protonn.c's in 32 bits (frame apart: stream_end_frame)."""
    p = np.asarray(p, dtype=np.int64)
    if rescale16 and proj_shift >= 15:
        return np.full(p.shape, STREAM_END_HIGH_RSHIFT[proj_shift][1], dtype=np.int64)
    if acc24 and proj_shift >= 24:
        return np.full(p.shape, STREAM_END_RSHIFT24[1], dtype=np.int64)
    cycles = np.full(p.shape, (13 if acc24 else 8) + 7, dtype=np.int64)
    if proj_shift > 0:
        r = proj_shift
        s = (p + (1 << (r - 1))) >> r
        cycles += rounding_add_cycles(r)
        if rescale16:  # (p + half) >> 8 by a byte move (6), the rest on two bytes, a 16-bit clamp
            rest = r - 8
            cycles += 6 + (0 if rest == 0 else 2 * rest if rest <= 2 else 5 * rest) + _clamp(s, CLAMP16)
        else:
            cycles += shift32_cycles(r) + _clamp(s, CLAMP32)
    else:
        inside, outside = CLAMP_FIRST[bool(acc24)]
        cycles += np.where(np.abs(p) > 127, outside, inside)
        if proj_shift < 0:  # clamped to +-127, shifted left, clamped again
            cycles += shift32_cycles(-proj_shift) + _clamp(np.clip(p, -127, 127) << -proj_shift, CLAMP32)
    return cycles


def stream_end_frame(model) -> int:
    """tp_stream_end's cycles besides its rows (stream_end_row_cycles) and the rescale_offset calls."""
    acc24 = stream_acc24(model)
    if model.offset is not None:
        return STREAM_END_OFFSET[0]
    if _rescale16(model) and model.proj_shift >= 15:
        return STREAM_END_HIGH_RSHIFT[model.proj_shift][0]
    if _rescale16(model) and model.proj_shift == 8:
        return STREAM_END_FRAME_RSHIFT8
    if acc24 and model.proj_shift >= 24:
        return STREAM_END_RSHIFT24[0]
    return STREAM_END_FRAME[acc24]


def stream_acc24(model) -> bool:
    """Whether the streamed projection sums in 24 bits (TP_PROTONN_ACC24: every row within ACC24_MAX_ROW_NNZ)."""
    return bool(np.count_nonzero(model.W_q, axis=1).max() <= ACC24_MAX_ROW_NNZ)


def stream_projection_cycles(model, x: np.ndarray | None = None) -> float:
    """The streamed projection's cycles of one inference (its rescale's clamps: the mean over OFFSET_TRIALS fixed
    random int8 vectors, or over the int8 vectors x; an offset's rescale apart, offset_rescale): the device app's
    calls, tp_stream_begin, every chunk's tp_stream_feed and tp_stream_end less the distance and score kernels."""
    D, d = model.n_components, model.n_features
    acc24 = stream_acc24(model)
    chunks = -(-d // CHUNK_BYTES)
    nnz = int(np.count_nonzero(model.W_q))
    per_chunk, per_feature, low, high = STREAM_FEED[(model.w_encoding, acc24)]
    nibbles = model.w_encoding == "col_nibbles"
    cycles = (STREAM_APP[0] + STREAM_APP[1] * chunks
              + STREAM_BEGIN[acc24][0] + STREAM_BEGIN[acc24][1] * D + (STREAM_BEGIN_NIBBLES if nibbles else 0)
              + per_chunk * chunks + per_feature * d + low * ((nnz + 1) // 2) + high * (nnz // 2)
              + stream_end_frame(model))
    if model.offset is not None:
        return float(cycles + STREAM_END_OFFSET[1] * D)
    p = projection_sums(model, x)
    rows = stream_end_row_cycles(p, model.proj_shift, acc24, _rescale16(model))
    return float(cycles + rows.sum(axis=1).mean())


# tp_protonn_rescale_offset (firmware/tp_protonn.c), the rescale of every row of a model with a projection offset
# (row-major and streamed W alike, out of line): its cycles from avr-objdump of the three forms avr-gcc gives it, a
# right shift (TP_PROTONN_PROJ_RSHIFT > 0), a left shift and none; per path of its clamps, from its first
# instruction to its ret. The caller's side (the call, the store of z) is offset_row / stream_offset_row.
OFFSET_FETCH = 12  # o_r's flash address (r doubled, added) and its two lpm
OFFSET_ENTRY = {"right": 2, "left": 3, "none": 0}  # moving p to the registers the form shifts in
OFFSET_LEFT_CLAMP = {"low": 18, "in": 15, "high": 18}  # left shift: p clamped to +-32767 first (two compares)
OFFSET_CLAMP = {  # then the clamp of the shifted sum to +-1024, per form: above 1024, within, below -1024
    "right": (11, 16, 16),
    "left": (9, 14, 17),
    "none": (24, 27, 30),  # no shift: the +-32767 and +-1024 compares merged into one chain
}
OFFSET_NONE_FAR = (11, 16)  # no shift, p above 32767 or below -32767: the chain's first or second compare clamps it
OFFSET_TAIL = (11, 14, 15)  # q = clamped + o_r (add, adc), its clamp to +-127 and ret: above 127, within, below


def shift32_cycles(count: int) -> int:
    """avr-gcc -Os's shift of an int32 by a constant count (arithmetic right or left): one bit inline (4 cycles),
    8 or 16 bits by byte moves (6 and 5), any other count a loop of 7 cycles a bit with its counter's ldi."""
    if count <= 0:
        return 0
    return {1: 4, 8: 6, 16: 5}.get(count, 7 * count)


def rounding_add_cycles(shift: int) -> int:
    """The rounding half 1 << (shift - 1) added to an int32: from its lowest nonzero byte up (adiw + adc + adc for
    a half below 64 costs the same 4 cycles as four subi / sbci)."""
    return 4 - min((shift - 1) // 8, 3)


def offset_rescale_cycles(p: np.ndarray, proj_shift: int, offset: np.ndarray) -> np.ndarray:
    """Cycles of tp_protonn_rescale_offset for each projection sum p (..., D) of rows with offsets o (D,)."""
    p = np.asarray(p, dtype=np.int64)
    right, left = max(proj_shift, 0), max(-proj_shift, 0)
    form = "right" if right else ("left" if left else "none")
    cycles = np.full(p.shape, OFFSET_FETCH + OFFSET_ENTRY[form], dtype=np.int64)
    if form == "right":
        s = (p + (1 << (right - 1))) >> right
        cycles += rounding_add_cycles(right) + shift32_cycles(right)
    elif form == "left":
        low, high = p < -32767, p > 32767
        cycles += np.where(low, OFFSET_LEFT_CLAMP["low"], np.where(high, OFFSET_LEFT_CLAMP["high"],
                                                                   OFFSET_LEFT_CLAMP["in"]))
        s = np.clip(p, -32767, 32767) << left
        cycles += shift32_cycles(left)
    else:
        s = p
    above, below = s > 1024, s < -1024
    high, within, low = OFFSET_CLAMP[form]
    clamp = np.where(above, high, np.where(below, low, within))
    if form == "none":
        clamp = np.where(p > 32767, OFFSET_NONE_FAR[0], np.where(p < -32767, OFFSET_NONE_FAR[1], clamp))
    q = np.clip(s, -1024, 1024) + np.asarray(offset, dtype=np.int64)
    tail_high, tail_in, tail_low = OFFSET_TAIL
    return cycles + clamp + np.where(q > 127, tail_high, np.where(q < -127, tail_low, tail_in))


OFFSET_TRIALS = 64  # random int8 vectors the offset rescale's clamps are replayed on (their mean is the count)


def trial_vectors(n_features: int) -> np.ndarray:
    """The OFFSET_TRIALS fixed random int8 vectors (int64) every data-dependent term of the model is replayed on."""
    return np.random.default_rng(0).integers(-127, 128, size=(OFFSET_TRIALS, n_features))


def projection_sums(model, x: np.ndarray | None = None) -> np.ndarray:
    """The projection's sums W·x before any rescale (int64, one row per vector) of the vectors x, by default
    trial_vectors."""
    if x is None:
        x = trial_vectors(model.n_features)
    return np.asarray(x, dtype=np.int64) @ np.asarray(model.W_q, dtype=np.int64).T


def mean_offset_rescale_cycles(model) -> float:
    """tp_protonn_rescale_offset's cycles of one inference (every row), the mean over OFFSET_TRIALS fixed random
    int8 vectors: its clamps are taken or not with the projection sums."""
    p = projection_sums(model)
    return float(offset_rescale_cycles(p, model.proj_shift, model.offset).sum(axis=1).mean())


def dense_z_frame_cycles(n_components: int) -> int:
    """tp_protonn_project's own C code for a dense W with the asm rescale: its frame and the loop over groups of
    4 rows (and the last group of D % 4), as avr-gcc -Os lays them out: read off the profiling simulator
    (tp_protonn_project's cycles less the group kernels' counted ones) for D = 2 to 60. One group (D <= 4) is
    straight code; from two full groups on the loop keeps its counter in the frame, and a remainder group beside
    them costs the loop more registers to reload."""
    full, rest = divmod(n_components, 4)
    if full <= 1:
        return 72 + (12 if full and rest else 0)
    return 124 + 24 * full if rest else 97 + 15 * full


def dense_z_rows_in(model) -> float:
    """Rows of a dense W with the asm rescale whose z is below +128 before its clamp (the clamp's longer path),
    per inference: the mean over OFFSET_TRIALS fixed random int8 vectors (mean_offset_rescale_cycles' vectors)."""
    right = model.proj_shift
    q = (projection_sums(model) + (1 << (right - 1))) >> right
    return float((q < 128).sum(axis=1).mean())


# tp_protonn_project of a dense W rescaled in C (the row kernels in assembly, a projection shift below 8, no
# offset), besides the group kernels' MAC, input load and loop-step terms: read off the profiling simulator per
# rescale form and D layout (full groups of 4 rows, the remainder group of D % 4), on inputs of 0 (every clamp's
# within path), less each row's rounding add, shift and clamp paths (dense_c_row_cycles): the groups' register
# moves, stores of the 24-bit sums to acc[] and reads back, the bias removal, the rescale's set-up and z's store,
# the loop and the frame. A right shift of 1 to 7 takes the same code around its shift; a left shift or none with
# full groups and a remainder (rescale_out_of_line) calls tp_protonn_rescale per row (its cycles counted here too).
# Keyed by form: (remainder group alone, D = 1 to 3), (one full group, remainder 0 to 3), (from two full groups,
# per remainder 0 to 3: once, per full group). A left shift of 1 keeps its one-bit shift inline in the loop of
# full groups alone (193 a group instead of 197).
DENSE_C_FRAME = {
    "right": ((137, 169, 221), (257, 373, 407, 456), ((119, 197), (170, 233), (204, 233), (251, 229))),
    "left1": ((136, 183, 218), (253, 439, 488, 636), ((119, 193), (192, 326), (243, 326), (308, 282))),
    "left": ((136, 183, 218), (253, 439, 488, 636), ((119, 197), (192, 326), (243, 326), (308, 282))),
    "none": ((136, 167, 227), (265, 444, 494, 643), ((119, 193), (193, 330), (245, 330), (311, 286))),
}


def dense_c_form(proj_shift: int) -> str:
    """The C rescale's form for DENSE_C_FRAME: a right shift, a left shift of 1, a longer left shift, or none."""
    if proj_shift > 0:
        return "right"
    return "none" if proj_shift == 0 else ("left1" if proj_shift == -1 else "left")


def dense_c_frame_cycles(n_components: int, proj_shift: int) -> int:
    """tp_protonn_project's cycles for a dense W rescaled in C besides the kernels' MAC, load and step terms and
    each row's data-dependent rescale (dense_c_row_cycles), by D's layout (DENSE_C_FRAME)."""
    rest_only, one, loop = DENSE_C_FRAME[dense_c_form(proj_shift)]
    full, rest = divmod(n_components, 4)
    if full == 0:
        return rest_only[rest - 1]
    if full == 1:
        return one[rest]
    once, per_group = loop[rest]
    return once + per_group * full


def dense_c_row_cycles(p: np.ndarray, proj_shift: int, n_features: int, out_of_line: bool = False) -> np.ndarray:
    """The C rescale's cycles for each projection sum p that depend on the shift and the data: the rounding add,
    the shift (shift32_cycles) and the final clamp's path (CLAMP32); a left shift or none clamps to +-127 first
    (CLAMP_FIRST's 24-bit sums). An odd number of features costs one cycle more a row: the bias n << 15 then has
    a nonzero middle byte to subtract (sbci). Out of line (rescale_out_of_line), a left-shifted sum at +128 or
    above takes one cycle more to return +127 (CLAMP32_CALLED)."""
    p = np.asarray(p, dtype=np.int64)
    cycles = np.full(p.shape, n_features & 1, dtype=np.int64)
    if proj_shift > 0:
        s = (p + (1 << (proj_shift - 1))) >> proj_shift
        return cycles + rounding_add_cycles(proj_shift) + shift32_cycles(proj_shift) + _clamp(s, CLAMP32)
    inside, outside = CLAMP_FIRST[True]
    cycles += np.where(np.abs(p) > 127, outside, inside)
    if proj_shift < 0:
        cycles += shift32_cycles(-proj_shift) + _clamp(np.clip(p, -127, 127) << -proj_shift,
                                                       CLAMP32_CALLED if out_of_line else CLAMP32)
    return cycles


def dense_c_project_cycles(model, x: np.ndarray | None = None) -> float:
    """tp_protonn_project's cycles of one inference for a dense W rescaled in C (and tp_protonn_rescale's, out of
    line) besides the kernels' MAC, load and step terms: the layout's count and every row's rescale paths, the
    mean over OFFSET_TRIALS fixed random int8 vectors (or over the vectors x)."""
    p = projection_sums(model, x)
    rows = dense_c_row_cycles(p, model.proj_shift, model.n_features, rescale_out_of_line(model))
    rows = rows.sum(axis=1).mean()
    return float(dense_c_frame_cycles(model.n_components, model.proj_shift) + rows)


# tp_protonn_project around the C row loop (a bitmap W over more than 511 features, no offset): its frame, and per
# row the call's side and z's store besides the rescale's rounding add, shift and clamps (a right shift; a left
# shift or none, which clamps the 32-bit sum to +-127 first: CLAMP_FIRST[False]); read off the profiling simulator
# on inputs of 0 for shifts of -2 to 16 and D = 2 to 30
C_ROWS_PROJECT = (55, 20, 18)  # once, a row with a right shift, a row with a left shift or none
C_ROWS_CLAMP_RIGHT = (7, 12, 11)  # a right-shifted sum's clamp here: below -127 three cycles sooner than CLAMP32
C_ROWS_OFFSET = (49, 21)  # with an offset: once, and per row the call of tp_protonn_rescale_offset and z's store


def c_rows_project_cycles(model, x: np.ndarray | None = None) -> float:
    """tp_protonn_project's own cycles around the C row loop of a bitmap W: its frame and every row's inlined
    rescale, the mean over OFFSET_TRIALS fixed random int8 vectors (or over the vectors x); with an offset its
    frame and each row's call and store only (C_ROWS_OFFSET: tp_protonn_rescale_offset is offset_rescale)."""
    if model.offset is not None:
        return float(C_ROWS_OFFSET[0] + C_ROWS_OFFSET[1] * model.n_components)
    p = projection_sums(model, x)
    frame, right_row, other_row = C_ROWS_PROJECT
    r = model.proj_shift
    if r > 0:
        s = (p + (1 << (r - 1))) >> r
        rows = right_row + rounding_add_cycles(r) + shift32_cycles(r) + _clamp(s, C_ROWS_CLAMP_RIGHT)
    else:
        inside, outside = CLAMP_FIRST[False]
        rows = other_row + np.where(np.abs(p) > 127, outside, inside)
        if r < 0:
            rows = rows + shift32_cycles(-r) + _clamp(np.clip(p, -127, 127) << -r, CLAMP32)
    return float(frame + rows.sum(axis=1).mean())


# The largest D the layout counts were checked at (exact on the profiling simulator up to 240 dimensions; 250 to
# 255 take a few hundred cycles more or less, avr-gcc's group loop changing near its 8-bit counter's end): beyond,
# the fitted row terms.
DENSE_C_MAX_DIM = 240


def dense_c_counted(model) -> bool:
    """Whether tp_protonn_project is counted whole by dense_c_project_cycles: a dense W in the row kernels rescaled
    in C (no asm rescale, no offset) with a projection shift below 8, up to DENSE_C_MAX_DIM dimensions."""
    return (model.w_dense and protonn_uses_asm_rows(model) and model.offset is None and model.proj_shift < 8
            and model.n_components <= DENSE_C_MAX_DIM)


def reach_index_cycles(table_shift: int) -> int:
    """The register-z loop's table index of a distance within the table's reach (TP_PROTONN_INDEX_SHIFT, beyond
    the 3 cycles the clamp to the last entry takes instead): the high byte moved and shifted right by SHIFT - 8,
    or the low two bytes shifted left by 8 - SHIFT (lsl, rol) and the high byte moved."""
    return 1 + (table_shift - 8 if table_shift >= 8 else 2 * (8 - table_shift))


def general_kernels_cycles(table_shift: int, table_size: int, n_components: int) -> tuple[int, int]:
    """The general distance loop's cycles besides its distance terms (13 each, and 3 per 4 terms above 64
    dimensions): (once, per prototype), counted from the code avr-gcc lays out for tp_protonn_proto_kernel's table
    index and read off the profiling simulator for every index form. The index is always computed, then clamped in
    constant time (cpi, brlo or ldi: 2 cycles either way), so neither count depends on the distances.

    - a table within 0xFFFF (D > 16): per prototype 37 besides the index shift, which is the middle byte shifted
      right by SHIFT - 8 (lsr) or the low two bytes copied (movw) and shifted left by 8 - SHIFT (lsl, rol); once
      48 cycles (its call, register saves, set-up), 16 more with a left shift (four more registers saved);
    - past 0xFFFF, shifts of 9 to 15: per prototype 33 and two a bit (lsr, ror of the middle bytes); once 64;
    - shifts of 16 to 23: per prototype 30 and one a bit (lsr of the high byte); once 48;
    - 24 and beyond (the index is 0): per prototype 23; once 65;
    - above 64 dimensions (the distance loop over groups of 4 terms) the frame takes 9 cycles more where it is
      48, else 10."""
    reach = (table_size - 1) << table_shift
    if reach <= 0xFFFF:
        frame = 48 + (16 if table_shift < 8 else 0)
        per_proto = 37 + (table_shift - 8 if table_shift >= 8 else 1 + 2 * (8 - table_shift))
    elif table_shift < 16:
        frame, per_proto = 64, 33 + 2 * (table_shift - 8)
    elif table_shift < 24:
        frame, per_proto = 48, 30 + (table_shift - 16)
    else:
        frame, per_proto = 65, 23
    if n_components > 64:
        frame += 9 if frame == 48 else 10
    return frame, per_proto


def mean_reach_index_cycles(model) -> float:
    """The register-z loop's index shifts of one inference: its prototypes within the table's reach (data-
    dependent) times reach_index_cycles, the mean over OFFSET_TRIALS fixed random int8 vectors (the offset
    rescale's)."""
    x = trial_vectors(model.n_features).astype(np.int8)
    z = model.projections(x).astype(np.int64)
    dist = ((z[:, None, :] - np.asarray(model.B_q, dtype=np.int64)[None]) ** 2).sum(axis=2)
    within = (dist < (model.table.size - 1) << model.table_shift).sum(axis=1).mean()
    return float(within) * reach_index_cycles(model.table_shift)


def rescale_out_of_line(model) -> bool:
    """Whether avr-gcc -Os keeps tp_protonn_rescale out of line, called per row: a dense W rescaled in C (no asm
    rescale, no offset) with a left shift or none, whose rows fall in full groups and a remainder (D > 4, D % 4:
    two call sites); a right shift (smaller) or one call site is inlined (the profiling simulator's symbols)."""
    D = model.n_components
    return model.w_dense and model.offset is None and model.proj_shift <= 0 and D > 4 and D % 4 != 0


def protonn_uses_asm(model) -> bool:
    """Whether the AVR build runs the assembly kernels (the same test as TP_PROTONN_ASM in tp_protonn.c)."""
    return model.n_components <= 255 and model.n_prototypes <= 256


def protonn_uses_asm_rows(model) -> bool:
    """Whether the projection runs the assembly row kernels (TP_PROTONN_ASM_ROWS: also d <= 511, row-major W)."""
    return protonn_uses_asm(model) and model.n_features <= 511 and model.w_encoding in ("dense", "bitmap")


def _stream_terms(model) -> dict[str, float]:
    terms = {name: 0 for name in PN_STREAM_CYCLES}
    # the device app feeds chunks of CHUNK_BYTES features, each timed (validate sums them): counted whole
    terms["stream_projection"] = stream_projection_cycles(model)
    if model.offset is not None:  # the offset rescale does the shift (counted in offset_rescale)
        terms["offset_rescale"] = mean_offset_rescale_cycles(model)
    return terms


def _rescale16(model) -> bool:
    """tp_protonn_rescale's 16-bit path (TP_PROTONN_ASM_ROWS, right shift >= 8 within the 24-bit bound)."""
    right, d = max(model.proj_shift, 0), model.n_features
    return (protonn_uses_asm(model) and d <= 511 and right >= 8
            and 16384 * d + (1 << (right - 1)) < 1 << 23)


def protonn_cost_terms(model) -> dict[str, int]:
    """How many times each costed unit of work runs in one ProtoNN inference (data-independent)."""
    D, m, L, d = model.n_components, model.n_prototypes, model.n_classes, model.n_features
    streamed = model.w_encoding in ("col_bytes", "col_nibbles")
    if not protonn_uses_asm(model):
        return _protonn_c_terms(model)
    terms = {name: 0 for name in PN_CYCLES}
    groups = -(-L // SCORE_GROUP)
    terms.update(fixed=1, row=D, **{"class": L}, score_term=m * L, score_group=groups, score_load=m * groups,
                 score_step=(m // 8) * groups)
    right, left = max(model.proj_shift, 0), max(-model.proj_shift, 0)
    if not streamed and model.offset is None and right >= 8 and 16384 * d + (1 << (right - 1)) < 1 << 23:
        terms.update(row=0, row_asm=D, rshift_asm=D * (right - 8))  # the row kernels' asm rescale
    elif model.offset is None and right >= 8 and 16384 * d + (1 << (right - 1)) < 1 << 23:  # 16-bit path
        terms["rshift16"] = D * (right - 8)
    else:
        terms["row32"] = D
        terms["rshift32"] = D * right
        terms["lshift32"] = D * left
    if D <= 16 and (model.table.size - 1) << model.table_shift <= 0xFFFF:  # tp_protonn_kernels' register-z loop
        terms.update(fixed_reg=1, proto_reg=m, dist_term_reg=m * D, reach_index_reg=mean_reach_index_cycles(model))
        if ((model.table.size - 1) << model.table_shift) & 0xFF:
            terms["proto_reg_reach_low"] = m
    else:  # the general loop
        frame, per_proto = general_kernels_cycles(model.table_shift, model.table.size, D)
        terms.update(kernels_frame=frame, kernels_proto=m * per_proto, dist_term=m * D)
    if D > 64:
        terms["dist_step"] = m * (D // 4)
    terms.update({name: 0 for name in PN_STREAM_CYCLES})
    if model.offset is not None:  # tp_protonn_rescale_offset instead of the plain rescale: counted on its own
        terms.update(row32=0, rshift32=0, lshift32=0, offset_row=D, offset_rescale=mean_offset_rescale_cycles(model))
    if streamed:  # the row terms and tp_predict's own code give way to the streamed projection's, counted whole
        for name in ("fixed", "row", "row32", "rshift16", "rshift32", "lshift32", "offset_row", "row_asm",
                     "rshift_asm"):
            terms[name] = 0
        terms.update(_stream_terms(model))
    elif not protonn_uses_asm_rows(model):  # d > 511: the C row loop, then the asm distances and scores
        terms.update({name: 0 for name in PN_C_ROWS_CYCLES}, c_row=D)
        if model.w_dense:
            terms["c_dense_mac"] = D * d
        else:  # a bitmap W, counted whole: the row loop's code and tp_protonn_project's (the offset rescale apart)
            mask = np.packbits(model.W_q != 0, axis=1, bitorder="little").reshape(-1)
            terms.update(c_row=0, row=0, row32=0, rshift32=0, lshift32=0, c_bitmap_row=D, c_bitmap_byte=int(mask.size),
                         c_bitmap_bit=int(sum(int(b).bit_length() for b in mask)),
                         c_bitmap_nonzero=int(np.count_nonzero(model.W_q)),
                         c_rows_project=c_rows_project_cycles(model))
    elif model.w_dense:
        groups = -(-D // DENSE_GROUP)
        terms["dense_mac"] = D * d
        terms["dense_step"] = groups * (d // 8)
        terms["dense_load"] = groups * d
        terms["dense_group"] = groups
        terms["fixed_dense"] = 1
        terms["dense_row_c"] = 0 if terms["row_asm"] else D  # the asm rescale stores z from the registers
        terms["dense_group_c"] = groups if model.offset is not None else 0
        terms["rescale_call"] = D if rescale_out_of_line(model) else 0
        if terms["row_asm"]:  # the group kernel's asm rescale: counted whole
            terms.update(row_asm=0, dense_group=0, fixed_dense=0, dense_z_row=D, dense_z_in=dense_z_rows_in(model),
                         dense_z_group=groups, dense_z_frame=dense_z_frame_cycles(D))
        elif dense_c_counted(model):  # the C rescale: counted whole
            terms.update(row=0, row32=0, rshift32=0, lshift32=0, dense_group=0, fixed_dense=0, dense_row_c=0,
                         rescale_call=0, dense_c_project=dense_c_project_cycles(model))
    else:
        mask = np.packbits(model.W_q != 0, axis=1, bitorder="little").reshape(-1)
        nonzero_bytes = mask[mask != 0]
        terms["fixed_bitmap"] = 1
        terms["mask_byte"] = int(nonzero_bytes.size)
        terms["zero_mask_byte"] = int(mask.size - nonzero_bytes.size)
        terms["nonzero"] = int(np.count_nonzero(model.W_q))
        terms["clear_bit"] = 8 * int(nonzero_bytes.size) - terms["nonzero"]
        if mask.size // max(D, 1) > 8:  # rows longer than 64 inputs loop over their bitmap bytes
            terms["mask_step"] = int(mask.size)
    return terms


def _protonn_c_terms(model) -> dict[str, int]:
    D, m, L, d = model.n_components, model.n_prototypes, model.n_classes, model.n_features
    terms = {"fixed": 1, "row": D, "proto": m, "dist_term": m * D, "class": L, "score_term": m * L,
             "mask_byte": 0, "scanned_bit": 0, "nonzero": 0, "dense_mac": 0}
    if model.w_encoding in ("col_bytes", "col_nibbles"):
        terms["row"] = 0
        terms.update(_stream_terms(model))
    elif model.w_dense:
        terms["dense_mac"] = D * d
    else:
        mask = np.packbits(model.W_q != 0, axis=1, bitorder="little").reshape(-1)
        terms["mask_byte"] = int(mask.size)
        terms["scanned_bit"] = int(sum(int(b).bit_length() for b in mask))
        terms["nonzero"] = int(np.count_nonzero(model.W_q))
    return terms


def predict_cycles(model) -> dict:
    terms = protonn_cost_terms(model)
    table = {**(PN_CYCLES if "dist_term_reg" in terms else PN_CYCLES_C), **PN_STREAM_CYCLES, **PN_C_ROWS_CYCLES}
    cycles = {name: count * table[name] for name, count in terms.items()}
    projection = sum(cycles.get(k, 0) for k in ("row", "row32", "rshift16", "rshift32", "lshift32", "row_asm",
                                                "rshift_asm", "mask_byte", "mask_step",
                                                "zero_mask_byte", "clear_bit", "scanned_bit", "nonzero",
                                                "dense_mac", "dense_step", "dense_load", "dense_group", "dense_group_c",
                                                "fixed_dense", "fixed_bitmap", "rescale_call", "dense_row_c",
                                                "dense_z_row", "dense_z_in",
                                                "dense_z_group", "dense_z_frame", "dense_c_project",
                                                "c_bitmap_row", "c_bitmap_byte", "c_bitmap_bit", "c_bitmap_nonzero",
                                                "c_rows_project",
                                                *PN_STREAM_CYCLES, *PN_C_ROWS_CYCLES))
    distances = sum(cycles.get(k, 0) for k in ("kernels_frame", "kernels_proto", "dist_term", "dist_step",
                                               "fixed_reg", "proto_reg", "proto_reg_reach_low", "reach_index_reg",
                                               "dist_term_reg"))
    scores = sum(cycles.get(k, 0) for k in ("class", "score_term", "score_step", "score_group", "score_load"))
    own = cycles["fixed"] + projection + distances + scores
    # a streamed W is timed chunk by chunk (the device app's calls), a row-major one in one call
    calls = -(-model.n_features // CHUNK_BYTES) if model.w_encoding in ("col_bytes", "col_nibbles") else 1
    overflows = timer_overflow_cycles(own, calls)
    return {
        "projection": projection,
        "distances": distances,
        "scores": scores,
        "timer_overflows": overflows,
        "total": int(round(own)) + overflows,  # whole cycles, like every family
        "lower_bound": lower_bound_cycles(model),
    }
