"""FlyNN's static cost model: cycles per inference predicted from the integer model's shape.

Layer: families (flynn).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy.special import digamma

from tinyproto.core.cost import lower_bound_cycles, timer_overflow_cycles
from tinyproto.families.flynn.hashing import split_inputs
from tinyproto.families.flynn.seeded_index import (
    GROUP_ROWS,
    WIDE_INPUTS,
    block_rows,
    seeded_walk,
)

# FlyNN (firmware/tp_flynn.c): cycles per unit of work. The counts follow the C code: the seeded generator's work
# exactly (the proposal stream is replayed: patterns, repeat-scan compares, xorshift16 steps), the narrow seeded scan
# counted whole (seeded_scan_cycles: each group's four offers by their outcomes), the loops avr-gcc unrolls (the input
# loop for s <= 2), the lookup (tp_flynn_lookup, out of line) by its cycles per (classes, count bits) (LOOKUP_CYCLES;
# more classes by its code layout, LOOKUP_LAYOUTS; other (L, b) by its parts: lookup_walk's bit offsets and byte
# refills, row * (L b) a multiply, a shift or nothing), and the top-rho heap replayed on random inputs over the
# model's own rows (simulated_heap: a seeded M's rows are rotations of one pattern, not rows in random order, and
# repeated rows tie), each kind of sift step counted. The cycles per unit: the hand counts (FLY_HAND_COUNTS: the
# narrow seeded and stored projections, tp_flynn_sift's and tp_flynn_heapify's steps, exact on the profiling
# simulator, and LOOKUP_CYCLES) held; the wide projections per layout (WIDE_SEEDED_CYCLES, WIDE_STORED_CYCLES); the
# other terms fitted function by function on the profiling simulator by `tools/calibrate_costmodel.py
# --flynn-functions 160` (the benchmark's drawer, seed 4000: 4..784 features, seeded and stored M, split or not, s
# 1..16, rho 8..64, 1..4 count bits, 2..10 classes): tp_flynn_project's own cycles for the "hashing" stage (the heap's
# callers included), tp_flynn_lookup's for the lookup's parts, and the rest of the timed call (less Timer1's
# overflows) for the prepare terms, the argmin and "fixed". Several fitted terms come out 0 (collinear with others):
# the split between fitted terms is not physical, the totals are what is checked (tools/bench_costmodel.py,
# docs/guides/latency-and-cost-model.md).
FLY_CYCLES = {
    "fixed": 55,  # tp_predict's call, set-up and return besides the hash and the lookup (--flynn-functions)
    # narrow M (at most 256 hash inputs): the timed call besides tp_flynn_project, the heap's functions and the
    # lookup, counted whole from its compiled code (its count is narrow_call_cycles(...), which replaces fixed,
    # class_argmin and the input_* / prepare_* terms there)
    "narrow_call": 1,
    "input_seeded": 28,  # per hash input: the two biased copies
    "input_stored": 12,  # per hash input: one biased copy
    # narrow seeded M, once: tp_fly_fill's call and loops, the cyclic extension's TP_FLY_BLOCK bytes
    "prepare_seeded": 294,
    "prepare_stored": 13,  # narrow stored M, once: tp_fly_fill's call and loops
    "block": 183,  # wide seeded M of a power-of-two input count: per block (the pattern's call, state in and out)
    "byte": 6,  # seeded: per proposal byte drawn (pattern or rotation): its fetch (asm hand count; byte_map maps it)
    "prng_step": 11,  # seeded: one xorshift16 step on top of its byte (asm hand count)
    "pattern_proposal": 8,  # seeded: a pattern proposal's sentinel store, scan set-up and verdict (asm)
    "compare": 5,  # seeded: one repeat-scan compare (asm)
    "accept": 5,  # seeded: a pattern proposal taken (asm)
    # narrow seeded M: tp_flynn_project counted whole from its code besides the generator's steps and the asm sum's
    # offsets (seeded_scan_cycles: the frame, blocks, groups and each group's four offers by avr-gcc's layout)
    "seeded_scan": 1,  # its count is seeded_scan_cycles(...)
    "byte_map": 3,  # seeded, narrow: a proposal byte's map b -> (b * inputs) >> 8 (mul, mov; none for 256 inputs)
    "block_map": 1,  # seeded, narrow: per block, the input count the map multiplies by (ldi, mov; 256: a mov of 0)
    "take": 21,  # seeded: per pattern offset of a group (one offset, four adjacent inputs: asm hand count)
    "take_loop": 3,  # seeded, s > 32: the counted loop's decrement and branch per offset (asm hand count)
    "row_loop": 9,  # per row when s > 2, wide seeded or stored M: the input loop's set-up (avr-gcc unrolls s <= 2)
    "row_stored": 15,  # wide stored M: per row
    "stored_index": 16,  # stored M: one flash index and its add (wide inputs: see wide_stored_index)
    # narrow stored M (tp_flynn_project, asm hand counts, exact on the profiling simulator): a row's sum set up, its
    # floor test, the 32-bit row count's step and test; avr-gcc unrolls the input loop for s <= 2 ("_loop": the
    # counted loop of s > 2, its end pointer set up per row); a row that fills the heap (its 32-bit key stored at
    # heap[filled]) or replaces its root (the key and the call of tp_flynn_sift); the function's call frame (eleven
    # register saves and restores, set-up, ret) and the tp_flynn_heapify call
    "narrow_stored_row": 19,
    "narrow_stored_row_loop": 24,
    "narrow_stored_index": 13,
    "narrow_stored_index_loop": 16,
    "narrow_stored_fill": 35,
    "narrow_stored_fill_loop": 34,
    "narrow_stored_replace": 24,
    "narrow_stored_replace_loop": 23,
    "narrow_stored_once": 66,
    "narrow_stored_once_loop": 65,
    "wide_proposal": 0,  # wide inputs, seeded: one 16-bit proposal (xorshift16 step, 32-bit map)
    "wide_shift_map": 30,  # wide inputs, seeded, a power-of-two input count: gcc maps a proposal by a shift loop
    "wide_compare": 14,  # wide inputs, seeded: one repeat-scan compare (C)
    "wide_take": 26,  # wide inputs: one input of a row read from x in place
    "wide_stored_index": 21,  # wide inputs, stored M: a 16-bit flash index and its input
    "wide_stored_pair": 4,  # wide inputs, stored M, s = 2, sign split: per index, the unrolled pair's extra moves
    "wide_stored_mirror": 12,  # wide inputs, stored M, sign split: a mirrored input
    "wide_row": 57,  # wide inputs, seeded: per row besides its rotation's proposal
    "wide_wrap": 1,  # wide inputs, seeded: an index p + r wrapped past the end
    "wide_mirror": 13,  # wide inputs with the sign split: a mirrored input
    "heap_fill": 44,  # per row of the first rho: it leaves the scan and is appended (charged to hashing)
    "heap_call_seeded": 53,  # per heap replacement: its key, the call and the new floor (charged to hashing)
    "heap_call_stored": 19,
    # tp_flynn_sift and tp_flynn_heapify as avr-gcc compiles them (avr-objdump; SIFT_STATS counts each step):
    "heapify": 22,  # per sift call of tp_flynn_heapify's loop: the key loaded, the call, the loop step
    "heapify_fixed": 34,  # tp_flynn_heapify: six register saves and restores, set-up, the loop's last exit, ret
    "sift": 59,  # per call: ten register saves and restores, the final store, the new floor read, ret
    "sift_level_pair": 64,  # a level moved at a node with two children: child offset, both keys, compares, store
    "sift_level_left": 47,  # a level moved at the last node with one child
    "sift_right": 2,  # the right child smaller: its key and offset taken
    "sift_stop_pair": 54,  # the key stays at a node with two children (child_key >= key)
    "sift_stop_left": 37,  # the key stays at the last node with one child
    "sift_stop_leaf": 12,  # the key reaches a leaf: the loop's first test leaves
    "sift_wide_compare": 1,  # per child-offset test when the heap has 256 bytes or more (rho >= 64): one more
    # instruction (the 16-bit bound takes a register or a second branch)
    "winner": 0,  # lookup: per winner
    "winner_mul": 51,  # lookup: per winner when L * b is not a power of two (a 32-bit multiply)
    "winner_shift": 63,  # lookup: per winner when L * b is 2 or 4 (a 32-bit shift, then the offset's shift)
    "class_loop": 28,  # lookup: per winner when L > 2 (avr-gcc unrolls the class loop of two classes)
    # lookup: per winner when L = 2, by count bits: avr-gcc unrolls the pair of classes into code of its own for each
    # b, which costs this much more (or less) than the class loop's terms say; fitted per b (signed least squares) on
    # the two-class shapes of the --flynn-functions draw (seed 4000), tp_predict's own cycles
    "winner_pair1": -7,
    "winner_pair2": 2,
    "winner_pair3": 22,
    "winner_pair4": -28,
    "class_once": 46,  # lookup: per class once: its sum cleared, widened to the int32 score
    "lookup_table_once": 1,  # tp_flynn_lookup of an (L, b) in LOOKUP_CYCLES: its count is the cycles once
    "lookup_table_winner": 1,  # ... and its count is rho times the cycles per winner
    "lookup_once": 0,  # tp_flynn_lookup's call frame: the register saves and restores, the sums' frame, the call
    "class_argmin": 36,  # tp_predict: per class after the first, the argmin's compare
    "winner_unaligned": 0,  # lookup: per winner when L * b is not a multiple of 8 (the bit offset is not always 0)
    "lookup_class": 19,  # lookup: per winner and class, 1-bit filters
    "lookup_class_lut": 27,  # lookup: per winner and class, b-bit counts through the LUT
    "lookup_class_aligned": 4,  # lookup: per winner and class when L b is a multiple of 8 (every winner's counts start
    # a byte): avr-gcc lays the class loop out otherwise (the refill test at its bottom, the sums through Z)
    "lookup_class_bit": 2,  # lookup: per winner, class and count bit: the bit buffer's shift by b (TP_FLYNN_SHIFT_OUT's
    # lsr / ror pair, asm)
    "lookup_align": 12,  # lookup: per bit of a winner's first filter byte shifted to its first count (lookup_walk)
    "lookup_refill": 11,  # lookup: per filter byte fetched after a winner's first (lookup_walk), 1, 2 or 4 count bits:
    # avr-gcc sees that the bits left are then always 0 (a multiple of b), so the byte joins the buffer unshifted
    "lookup_refill_shift": 0,  # the same, 3 count bits: the byte shifted up by the bits left (a loop)
    "lookup_refill_bit": 16,  # lookup: per bit a fetched byte is shifted up to join the bit buffer (lookup_walk)
}
# tp_flynn_lookup, the winners' counts summed per class (kept out of line: its code is a function of the classes L
# and count bits b alone), read off the profiling simulator for every (L, b) the solvers draw: (cycles once: the
# call, frame, sums cleared and widened to scores; per winner: its key, row offset, filter walk and class loop, as
# the bit offsets of random rows make it; of which __umulhisi3, the row offset's multiply where avr-gcc calls it).
# `python tools/calibrate_costmodel.py --flynn-lookup 48` prints it. Other (L, b): the lookup_* terms above.
LOOKUP_CLASSES = tuple(range(2, 11))
LOOKUP_BITS = (1, 2, 3, 4)
LOOKUP_CYCLES: dict[tuple[int, int], tuple[float, float, float]] = {
    (2, 1): (135.0, 134.07, 0.0), (2, 2): (141.1, 153.88, 0.0),
    (2, 3): (127.0, 182.43, 22.0), (2, 4): (49.1, 50.98, 0.0),
    (3, 1): (159.7, 182.97, 22.0), (3, 2): (157.9, 209.78, 22.0),
    (3, 3): (151.1, 235.2, 22.0), (3, 4): (159.3, 220.86, 22.0),
    (4, 1): (208.3, 192.86, 0.0), (4, 2): (174.3, 172.96, 0.0),
    (4, 3): (196.3, 258.38, 22.0), (4, 4): (174.3, 205.96, 0.0),
    (5, 1): (221.8, 239.89, 22.0), (5, 2): (220.0, 283.07, 22.0),
    (5, 3): (219.2, 312.92, 22.0), (5, 4): (221.3, 293.86, 22.0),
    (6, 1): (250.7, 263.3, 22.0), (6, 2): (248.1, 311.88, 22.0),
    (6, 3): (241.8, 350.31, 22.0), (6, 4): (223.1, 340.98, 22.0),
    (7, 1): (315.4, 283.79, 22.0), (7, 2): (306.9, 337.28, 22.0),
    (7, 3): (301.1, 393.96, 22.0), (7, 4): (308.3, 370.86, 22.0),
    (8, 1): (320.3, 215.96, 0.0), (8, 2): (310.3, 330.96, 0.0),
    (8, 3): (307.3, 430.96, 22.0), (8, 4): (310.3, 390.96, 0.0),
    (9, 1): (365.3, 335.56, 22.0), (9, 2): (360.2, 405.06, 22.0),
    (9, 3): (363.3, 477.13, 22.0), (9, 4): (364.3, 449.86, 22.0),
    (10, 1): (396.2, 358.06, 22.0), (10, 2): (392.3, 431.86, 22.0),
    (10, 3): (392.0, 513.93, 22.0), (10, 4): (363.3, 519.96, 22.0),
}
# tp_flynn_lookup beyond LOOKUP_CYCLES' classes, by its code. avr-gcc compiles it in one layout per count bits b, row
# offset (row * L b: __umulhisi3's multiply, 22 cycles with its call, or a shift where L b is a power of two),
# alignment (L b a multiple of 8: every winner's counts start a byte, the first byte's shift loop is gone and the
# class loop laid out otherwise) and, for exactly 128 classes (sums of 256 bytes), class loops counted in a register;
# the immediates aside, a layout's code is the same for every L (avr-objdump). Per winner it costs W + C L + the row
# offset's shift (lookup_row_shift) + its refills and shifts (lookup_per_winner): a filter byte fetched after the
# first costs LOOKUP_REFILL (6 cycles with 1 count bit, 7 with 2 or 4: cpse/cpi and the branch, the pointer's step,
# lpm, or; 15 with 3 bits, and 5 a bit of the byte's shift-up loop), a bit of the first byte's shift to the winner's
# first count LOOKUP_ALIGN_BIT (asr, ror, dec, brpl), both asm hand counts, as lookup_walk's means over the winners'
# bit offsets; once it costs O + P L (the frame, the sums cleared and widened to scores). W, C, O, P: lines through
# the cycles on the profiling simulator, `python tools/calibrate_costmodel.py --flynn-lookup-layouts 24` (11 to 200
# classes, 1 to 4 bits, rho 8 and 64: all within 0.07 %; 216 more of 14 to 199 classes held out: within 0.17 %). The
# unaligned layouts' C is their class loop's hand count: 25 cycles (1 bit: the count's xor), 28 + 2 b through the LUT
# (b bits shifted out, two cycles each), which the line through the simulator's cycles confirms.
LOOKUP_REFILL = {1: (6, 0), 2: (7, 0), 3: (15, 5), 4: (7, 0)}  # b: (cycles a refill, a bit of its shift-up)
LOOKUP_ALIGN_BIT = 5
LOOKUP_LAYOUTS: dict[tuple[int, bool, bool, bool], tuple[float, float, float, float]] = {
    # (b, shift, aligned, 128 classes): (W, C, O, P); the unaligned layouts' W and C are hand counts (the line
    # through the simulator's cycles gives 86.9 and 25.00, 88.2 and 32.00, 87.9 and 34.00, 87.7 and 36.00)
    (1, False, False, False): (87, 25, 121.4, 28.01),
    (1, False, True, False): (73.96, 24.38, 81.1, 28.01),
    (1, True, True, False): (24.96, 25.39, 85.8, 27.98),
    (1, True, True, True): (3658.98, 0, 3800.1, 0),
    (2, False, False, False): (88, 32, 110.6, 28.07),
    (2, False, True, False): (71.96, 37.5, 83.1, 28.01),
    (2, True, True, False): (19.96, 37.5, 86.8, 27.98),
    (2, True, True, True): (4948.96, 0, 3793.3, 0),
    (3, False, False, False): (88, 34, 111.7, 28.01),
    (3, False, True, False): (73.96, 39, 82.9, 28.01),
    (3, False, True, True): (5194.96, 0, 3790.3, 0),
    (4, False, False, False): (88, 36, 113.6, 28.0),
    (4, False, True, False): (71.96, 42, 83.1, 28.01),
    (4, True, True, False): (19.96, 42, 86.8, 27.98),
    (4, True, True, True): (5524.96, 0, 3793.3, 0),
}


def lookup_layout(n_classes: int, bits: int) -> tuple[int, bool, bool, bool]:
    """tp_flynn_lookup's code layout for L classes of b count bits: (b, row offset a shift, L b a multiple of 8,
    exactly 128 classes)."""
    n = n_classes * bits
    return bits, n & (n - 1) == 0, n % 8 == 0, n_classes == 128


def lookup_row_shift(n_classes: int, bits: int) -> int:
    """Cycles per winner of the row's byte offset where L b is a power of two, 2^(k + 3): row << k (hand count: one
    bit unrolled, an add and three adc; more bits a loop of 7 cycles a bit, its counter's ldi less the last
    branch); 0 where avr-gcc multiplies (the multiply is in the layout's W)."""
    n = n_classes * bits
    k = n.bit_length() - 4
    if n & (n - 1) or k < 1:
        return 0
    return 4 if k == 1 else 7 * k


def lookup_per_winner(n_classes: int, bits: int, w: float, c: float) -> float:
    """tp_flynn_lookup's cycles per winner: w + c L, the row offset's shift and the filter walk's refills and shifts
    (hand counts)."""
    align, refills, refill_bits = lookup_walk(n_classes, bits)
    per_refill, per_refill_bit = LOOKUP_REFILL[bits]
    return (w + c * n_classes + lookup_row_shift(n_classes, bits) + per_refill * refills
            + per_refill_bit * refill_bits + LOOKUP_ALIGN_BIT * align)


NARROW_STORED = tuple(name for name in FLY_CYCLES if name.startswith("narrow_stored_"))
FLY_HAND_COUNTS = NARROW_STORED + ("narrow_call", "lookup_table_once", "lookup_table_winner", "lookup_class_bit",
                                   "byte", "byte_map", "block_map", "seeded_scan",
                                   "prng_step", "pattern_proposal", "compare", "accept",
                                   "take", "take_loop", "heapify", "heapify_fixed", "sift",
                   "sift_level_pair", "sift_level_left", "sift_right", "sift_stop_pair", "sift_stop_left",
                   "sift_stop_leaf", "sift_wide_compare")
# The wide stored-M terms (wide_stored_*) are --flynn-functions' (tools/calibrate_costmodel.py --flynn-wide-stored 36
# fits them alone, on 36 wide stored-M shapes of seed 2000), but the unrolled pair's (4 cycles an index at s = 2 with
# the sign split: 77.8 cycles a row measured with it, 53.3 without), which the random shapes hold too few of.
# Held when fitting as well: a wrapped index's one subtract (left free, it trades against the takes: a row's wraps
# are about half its takes) and the shift map of a power-of-two input count (too few shapes have one).
FLY_HELD = FLY_HAND_COUNTS + ("wide_shift_map", "wide_wrap", "wide_stored_pair", "winner_pair1", "winner_pair2",
                              "winner_pair3", "winner_pair4")
# A seeded M over more than 256 hash inputs (tp_flynn_project reads x in place): avr-gcc compiles the row loop in a
# layout of its own with and without the sign split and for s = 1, 2 and more (unrolled, or a loop), and no one set
# of terms fits them all (one fit had s = 2 with the split 3 to 6 % low and s = 1 1 to 5 % high). So each layout
# has its cycles per unit (per block, proposal, compare, input taken, row, wrapped index, mirrored input, heap fill
# and replacement, and once), fitted on the function's own cycles (its __umulhisi3 calls included) on the
# profiling simulator: tools/calibrate_costmodel.py --flynn-wide-seeded 32 (32 shapes of each layout, seed 6000,
# within 0.7 %; 32 more, seed 6001, held out: within 2.4 %). The units of one layout are collinear (s fixed: an
# input taken per row), so a value alone is not a cost; their sums are. A power-of-two input count (a shift map)
# keeps FLY_CYCLES' terms.
WIDE_SEEDED_CYCLES: dict[tuple[bool, int], tuple[float, ...]] = {
    (False, 1): (0, 90.4, 31.5, 0, 0, 0.7, 0, 42, 28.7, 69),
    (False, 2): (176.5, 0, 0, 58.7, 0, 1.2, 0, 54.2, 23, 12.7),
    (False, 3): (0, 60.6, 13, 23.2, 17.4, 1.3, 0, 40.2, 31.1, 103.2),
    (True, 1): (0, 75.2, 0, 0, 20.2, 1.2, 5.8, 39.6, 31.8, 87.6),
    (True, 2): (162.5, 0, 0, 66.4, 0, 1.2, 3.6, 37.8, 31.9, 113.5),
    (True, 3): (50.4, 67, 13.2, 26.5, 8.5, 1.6, 3.9, 37.9, 33, 51),
}
WIDE_SEEDED_UNITS = ("block", "wide_proposal", "wide_compare", "wide_take", "wide_row", "wide_wrap", "wide_mirror",
                     "heap_fill", "heap_call_seeded", "once")


def wide_seeded_layout(split: bool, s: int) -> tuple[bool, int]:
    """The WIDE_SEEDED_CYCLES layout of a wide seeded M: (sign split, 1, 2 or 3 for s >= 3)."""
    return (bool(split), min(int(s), 3))


def wide_seeded_term(layout: tuple[bool, int], unit: str) -> str:
    """The FLY_CYCLES name of one unit of one wide seeded layout, e.g. ws_split2_wide_row."""
    return f"ws_{'split' if layout[0] else 'plain'}{layout[1]}_{unit}"


WIDE_SEEDED_TERMS = tuple(wide_seeded_term(layout, unit) for layout in WIDE_SEEDED_CYCLES for unit in WIDE_SEEDED_UNITS)
FLY_CYCLES.update({wide_seeded_term(layout, unit): cycles for layout, values in WIDE_SEEDED_CYCLES.items()
                   for unit, cycles in zip(WIDE_SEEDED_UNITS, values)})
FLY_HELD += WIDE_SEEDED_TERMS  # fitted by --flynn-wide-seeded alone

# A stored M over more than 256 hash inputs (16-bit flash indices, x read in place): avr-gcc compiles its row loop
# in a layout of its own with and without the sign split and for s = 1, 2 and more, as for a wide seeded M, so each
# layout has its cycles per unit (per row, index, mirrored input, heap fill and replacement, and once), fitted on
# tp_flynn_project's own cycles on the profiling simulator: tools/calibrate_costmodel.py --flynn-wide-stored-layouts
# 24 (24 shapes of each layout, seed 2100; 24 more, seed 2101, held out: exact but for the sign split at s = 1,
# within 0.4 %, and at s >= 3, within 0.54 %). The whole-cycle values are the code's own: the fit recovers them
# exactly. One shared fit of these terms had s = 2 without the split 3.8 cycles a row high (bench_costmodel seed
# 7003: +4.6 %).
WIDE_STORED_CYCLES: dict[tuple[bool, int], tuple[float, ...]] = {
    (False, 1): (36, 0, 0, 35, 24, 66),
    (False, 2): (0, 26.5, 0, 35, 24, 66),
    (False, 3): (24, 21, 0, 34, 23, 65),
    (True, 1): (40.4, 0, 1.8, 33.7, 25.9, 70.5),
    (True, 2): (0, 37, 3, 34, 23, 70),
    (True, 3): (24, 25, 3, 34, 23, 70),
}
WIDE_STORED_UNITS = ("row", "index", "mirror", "heap_fill", "heap_call", "once")


def wide_stored_term(layout: tuple[bool, int], unit: str) -> str:
    """The FLY_CYCLES name of one unit of one wide stored layout, e.g. wst_split2_index."""
    return f"wst_{'split' if layout[0] else 'plain'}{layout[1]}_{unit}"


WIDE_STORED_TERMS = tuple(wide_stored_term(layout, unit) for layout in WIDE_STORED_CYCLES for unit in WIDE_STORED_UNITS)
FLY_CYCLES.update({wide_stored_term(layout, unit): cycles for layout, values in WIDE_STORED_CYCLES.items()
                   for unit, cycles in zip(WIDE_STORED_UNITS, values)})
FLY_HELD += WIDE_STORED_TERMS  # fitted by --flynn-wide-stored-layouts alone

# A narrow seeded M's projection (tp_flynn_project with the asm scan of tp_flynn_avr.h), counted from its code
# (avr-objdump; tools/calibrate_costmodel.py --flynn-seeded-scan walks it and checks it on the profiling simulator).
# avr-gcc lays the function out by M modulo 4 (it knows the rows left, M - j, modulo 4: 0 and 1 share a layout), and
# duplicates the code after each of a group's four inlined TP_FLYNN_OFFERs by what it then knows (the heap known full
# after a call, known filling after an append), so a group's offers cost what its four rows' outcomes together make
# them, not a sum per row. A row is S (not above the floor; a row past M too), R (it replaces the heap's root: its
# key and the call of tp_flynn_sift), A (appended while the heap fills) or H (appended last: the call of
# tp_flynn_heapify). SEEDED_OFFER_CYCLES: per layout, the cycles of each outcome tuple (SEEDED_OFFER_PATTERNS' order,
# the callees' own cycles aside) from the group's rows-left test to its loop step. The last group takes the code of
# its rows left (SEEDED_LAST_EXTRA more; one row left: SEEDED_LAST_ONE). SEEDED_FRAME: per layout the call frame with
# the last group's exit, per block (the generator's state in and out, the pattern pointer, the rotation's base and
# the block's end; the last pattern offset's verdict one cycle short of "accept"), per group (the sum's set-up, the
# rows left, the loop step).
SEEDED_OFFER_PATTERNS = ("SSSS", "SSSR", "SSRS", "SSRR", "SRSS", "SRSR", "SRRS", "SRRR", "RSSS", "RSSR", "RSRS", "RSRR",
                         "RRSS", "RRSR", "RRRS", "RRRR", "HSSS", "HSSR", "HSRS", "HSRR", "HRSS", "HRSR", "HRRS", "HRRR",
                         "AHSS", "AHSR", "AHRS", "AHRR", "AAHS", "AAHR", "AAAH", "AAAA")
SEEDED_OFFER_CYCLES = {
    0: (22, 48, 81, 104, 82, 109, 123, 146, 83, 109, 127, 150, 126, 153, 167, 190,
        93, 119, 137, 160, 136, 163, 177, 200, 152, 179, 193, 216, 211, 234, 252, 246),
    2: (23, 51, 52, 75, 82, 105, 108, 131, 66, 94, 93, 116, 109, 132, 135, 158,
        85, 113, 112, 135, 128, 151, 154, 177, 142, 165, 168, 191, 184, 207, 225, 219),
    3: (24, 55, 51, 74, 84, 107, 110, 133, 85, 116, 111, 134, 126, 149, 152, 175,
        106, 137, 132, 155, 147, 170, 173, 196, 164, 187, 190, 213, 205, 228, 247, 241),
}
SEEDED_LAST_EXTRA = {0: 0, 2: 3, 3: 1}  # the last group's offers by M mod 4: its tuple's cycles and these
SEEDED_LAST_ONE = {"SSSS": 9, "RSSS": 88, "HSSS": 98}  # M mod 4 = 1: one row left, the others cleared
SEEDED_FRAME = {0: (96, 58, 77), 2: (95, 58, 75), 3: (95, 58, 75)}  # (once, per block, per group)
OFFER_OUTCOMES = "SRAH"  # a row's outcome, its digit in a group's base-4 code (row k: digit k)


def seeded_layout(m: int) -> int:
    """avr-gcc's layout of a narrow seeded tp_flynn_project: M mod 4, with 1 laid out as 0."""
    return {0: 0, 1: 0, 2: 2, 3: 3}[int(m) % GROUP_ROWS]


def offer_code(pattern: str) -> int:
    """A group's outcome tuple as its base-4 code (row k's outcome, OFFER_OUTCOMES' index, is digit k)."""
    return sum(OFFER_OUTCOMES.index(o) * 4**k for k, o in enumerate(pattern))


OFFER_PATTERN_OF_CODE = {offer_code(p): p for p in SEEDED_OFFER_PATTERNS}


def seeded_scan_cycles(m: int, blocks: int, groups: int, offers: dict, last: dict) -> float:
    """A narrow seeded M's tp_flynn_project besides the generator's steps and the sum's offsets (FLY_CYCLES' byte,
    prng_step, ..., take): its frame, blocks and groups, and the offers of the groups before the last (`offers`) and
    of the last (`last`), each {outcome tuple: mean count}."""
    layout = seeded_layout(m)
    once, per_block, per_group = SEEDED_FRAME[layout]
    table = dict(zip(SEEDED_OFFER_PATTERNS, SEEDED_OFFER_CYCLES[layout]))
    if m % GROUP_ROWS == 1:
        tail = sum(count * SEEDED_LAST_ONE[p] for p, count in last.items())
    else:
        tail = sum(count * (table[p] + SEEDED_LAST_EXTRA[layout]) for p, count in last.items())
    return once + per_block * blocks + per_group * groups + tail + sum(count * table[p] for p, count in offers.items())


# Which FLY_CYCLES terms make up each stage tools/bench_latency.py measures (the rest is "fixed").
FLY_STAGES = {
    "prepare": ("input_seeded", "input_stored", "prepare_seeded", "prepare_stored", "narrow_call"),
    "hashing": ("row_loop", "block", "byte", "byte_map", "block_map", "prng_step", "pattern_proposal", "compare",
                "accept", "seeded_scan", "take",
                "take_loop", "row_stored", "stored_index", "wide_proposal", "wide_shift_map", "wide_compare",
                "wide_take", "wide_row", "wide_stored_index", "wide_stored_pair", "wide_stored_mirror", "wide_wrap",
                "wide_mirror", "heap_fill",
                "heap_call_seeded", "heap_call_stored") + NARROW_STORED + WIDE_SEEDED_TERMS + WIDE_STORED_TERMS,
    "top_rho": ("heapify", "heapify_fixed", "sift", "sift_level_pair", "sift_level_left", "sift_right",
                "sift_stop_pair", "sift_stop_left", "sift_stop_leaf", "sift_wide_compare"),
    "lookup": ("winner", "winner_mul", "winner_shift", "lookup_table_once", "lookup_table_winner", "lookup_once",
               "class_argmin", "class_loop", "winner_pair1", "winner_pair2",
               "winner_pair3", "winner_pair4", "class_once", "winner_unaligned", "lookup_class", "lookup_class_lut",
               "lookup_class_aligned", "lookup_class_bit",
               "lookup_align", "lookup_refill", "lookup_refill_shift", "lookup_refill_bit"),
}
TAKE_UNROLLED = 32  # tp_flynn.c unrolls the four-row sum up to this s, and loops beyond


@dataclass(frozen=True)
class WalkCounts:
    """Prefix counts of one seeded M (seed, s, hash inputs) for every m up to m_max: what the cost of any m needs
    (a smaller m's M is a prefix of a larger one's)."""

    s: int
    n_inputs: int
    n_features: int
    pattern_proposals: np.ndarray
    compares: np.ndarray
    wraps: np.ndarray
    mirrors: np.ndarray  # inputs of the mirrored half (index >= d) in the first m rows
    indices: np.ndarray  # (m_max, s) the rows themselves: tie-prone shapes replay their heap entries
    _sifts: dict = field(default_factory=dict, compare=False, repr=False)  # rho -> simulated_heap (and its offers)

    @classmethod
    def replay(cls, seed: int, s: int, n_inputs: int, n_features: int, m_max: int) -> "WalkCounts":
        walk = seeded_walk(seed, m_max, s, n_inputs)
        mirrored = np.count_nonzero(walk.indices >= n_features, axis=1) if n_inputs > n_features else np.zeros(m_max)
        mirrors = np.concatenate([[0], np.cumsum(mirrored)]).astype(np.int64)
        return cls(s, n_inputs, n_features, walk.pattern_proposals, walk.compares, walk.wraps, mirrors, walk.indices)

    @property
    def m_max(self) -> int:
        return int(self.pattern_proposals.size - 1)

    def _replay(self, rho: int, noisy: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """simulated_heap over these rows: on heap_trials(rho) vectors (or the given ones: use_heap_work), or on
        HEAP_TRIALS_NOISY (noisy)."""
        key = ("noisy", rho) if noisy else rho
        if key not in self._sifts:
            self._sifts[key] = simulated_heap(self.indices, self.n_features, self.n_inputs, rho,
                                              trials=HEAP_TRIALS_NOISY if noisy else None)
        return self._sifts[key]

    def heap_work(self, m: int, rho: int, noisy: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(replacements, heapify): the sift steps (SIFT_STATS) of the top-rho heap over the first m rows, replayed
        on random inputs over these very rows (simulated_heap): rows of a seeded block are rotations of one
        pattern, so they are not in random order, and repeated rows tie (a tie never enters). noisy: the replay of
        HEAP_TRIALS_NOISY vectors."""
        m = min(m, self.m_max)
        if m < rho:
            return np.zeros(len(SIFT_STATS)), np.zeros(len(SIFT_STATS))
        replaced, heapified, _ = self._replay(rho, noisy)
        return replaced[m], heapified

    def offer_patterns(self, m: int, rho: int, noisy: bool = False) -> tuple[dict[str, float], dict[str, float]]:
        """The outcome tuples (SEEDED_OFFER_PATTERNS) of the groups of the first m rows before the last, and of the
        last (its rows past m S: their sums are cleared), as mean counts over the heap replay's vectors."""
        m = min(m, self.m_max)
        if m < rho:
            return {}, {}
        codes = self._replay(rho, noisy)[2]
        key = ("offers", noisy, rho)
        if key not in self._sifts:  # per group, the codes' counts over the vectors, cumulative
            trials, groups = codes.shape
            flat = (codes + 4**GROUP_ROWS * np.arange(groups)[None, :]).ravel()
            per_group = np.bincount(flat, minlength=groups * 4**GROUP_ROWS).reshape(groups, 4**GROUP_ROWS)
            self._sifts[key] = np.vstack([np.zeros(4**GROUP_ROWS), np.cumsum(per_group, axis=0)]) / trials
        last = -(-m // GROUP_ROWS) - 1
        tail = np.bincount(codes[:, last] % 4 ** (m - GROUP_ROWS * last), minlength=4**GROUP_ROWS) / len(codes)
        return _patterns_of(self._sifts[key][last]), _patterns_of(tail)

    def replay_noise(self, m: int, rho: int) -> float:
        """The standard error of the heap replay's mean replacements among the first m rows: its vectors' spread
        over the square root of their number (0 where the vectors were given: use_heap_work). A function of the
        first m rows and rho alone, like the replay, so that a prefix of M's rows (the solver's ExactCycles) and
        the chosen model decide alike."""
        m = min(m, self.m_max)
        if m < rho or ("given", rho) in self._sifts:
            return 0.0
        key = ("replaced", rho)
        if key not in self._sifts:  # per vector, the rows replaced among the first m, for every m
            codes = self._replay(rho)[2]
            digits = (codes[:, :, None] // 4 ** np.arange(GROUP_ROWS)) % 4
            taken = (digits == OFFER_OUTCOMES.index("R")).reshape(len(codes), -1)
            self._sifts[key] = np.hstack([np.zeros((len(codes), 1)), np.cumsum(taken, axis=1)])
        replaced = self._sifts[key][:, m]
        return float(replaced.std(ddof=1) / math.sqrt(replaced.size)) if replaced.size > 1 else 0.0

    def use_heap_work(self, rho: int, sifts: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """Price the top-rho heap by these sift steps (simulated_heap on given inputs) instead of random ones."""
        self._sifts[rho] = sifts
        self._sifts[("given", rho)] = True
        for key in [k for k in self._sifts if isinstance(k, tuple) and k[-1] == rho and k[0] != "given"]:
            del self._sifts[key]

    def replacements(self, m: int, rho: int) -> float:
        return float(self.heap_work(m, rho)[0][0])


@lru_cache(maxsize=None)
def expected_sift_stats(rho: int) -> tuple[np.ndarray, np.ndarray]:
    """(per replacement, heapify): the sift steps (SIFT_STATS) of one replacement in tp_flynn.c's min-heap of ρ
    keys when rows come in random order, and of building the heap of ρ random keys, replayed on a fixed
    pseudo-random stream (the expectation has no closed form; a newcomer often ranks low among the winners)."""
    rng = np.random.default_rng(rho)
    replaced, heapified = [0] * len(SIFT_STATS), [0] * len(SIFT_STATS)
    for _ in range(8):
        stream = rng.permutation(40 * rho + 64)
        heap = _heapify(stream[:rho].tolist(), heapified)
        for key in stream[rho:].tolist():
            if key > heap[0]:
                _sift(heap, key, replaced)
    return np.array(replaced, dtype=float) / max(replaced[0], 1), np.array(heapified, dtype=float) / 8


def expected_heap_replacements(m: int, rho: int) -> float:
    """Rows after the first ρ that enter the top-ρ heap, for rows in random order (row j enters with chance
    ρ / (j + 1)); the first ρ rows are appended and the heap is built once (heap_fill, heapify)."""
    return rho * (_harmonic(m) - _harmonic(rho)) if m > rho else 0.0


HEAP_TRIALS = 64  # random input vectors the heap is replayed on at least (their mean is the prediction)
HEAP_TRIALS_SMALL = 128  # ... for a heap of 16 winners or fewer
HEAP_TRIALS_NOISY = 1024  # ... where those leave the replay's mean noisy (HEAP_NOISE)
HEAP_NOISE = 0.01  # the largest standard error of the replay's mean, as a share of the predicted cycles


def heap_trials(rho: int) -> int:
    """Vectors to replay a heap of rho winners on: HEAP_TRIALS, HEAP_TRIALS_SMALL for rho <= 16. 16 vectors for
    rho = 32 and 64 left the replay of a heap-bound shape 3 % above its mean (bench_costmodel seed 7002: a stored M
    over 472 inputs, rho = 32); 64 take compile wine --model flynn --budget 2kB from 3.65 to 4.38 s of CPU, digits'
    unchanged. A heap of 8 or 16 winners among a few dozen rows does its work much by the vector (seed 7102's stored
    M of 35 rows, rho = 8: 64 vectors gave 2.4 % below the mean over 4,096); on the 120 shapes of rho <= 16 of seeds
    7001 to 7003, 7101 and 7102 64 vectors are within 2.55 % of the mean over 2,048 (6 beyond 1 %), 128 within 1.56 %
    (3), 256 within 1.14 % (1); 128 take compile wine --model flynn --budget 2kB from 4.6 to 5.0 s of CPU. It
    depends on rho alone, so that the replay of a prefix of M's rows (the solver's ExactCycles) gives the very figure
    the chosen model's own replay gives. Where the replay's own vectors spread too widely for its mean
    (WalkCounts.replay_noise), cost_terms replays HEAP_TRIALS_NOISY vectors instead."""
    return HEAP_TRIALS_SMALL if rho <= 16 else max(HEAP_TRIALS, 512 // max(int(rho), 1))


# What one tp_flynn_sift call does, counted by the replay (SIFT_STATS): the branches of its loop cost differently
# (read off avr-objdump of the firmware: FLY_CYCLES' sift_* terms), so the replay counts each kind of step.
SIFT_STATS = ("calls", "level_pair", "level_left", "right", "stop_pair", "stop_left", "stop_leaf")


def simulated_heap(indices: np.ndarray, n_features: int, n_inputs: int, rho: int, trials: int | None = None,
                   x: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(replaced[m], heapified, codes): the sift steps (SIFT_STATS) of the rows after the first rho among the first m
    that enter tp_flynn.c's min-heap, cumulative over m, shape (m_max + 1, len(SIFT_STATS)); those of building the
    heap of the first rho rows once (tp_flynn_heapify); and per vector and group of GROUP_ROWS rows the rows'
    outcomes (S, R, A, H: offer_code), shape (trials, ceil(m_max / GROUP_ROWS)), rows past m_max S.
    Mean over `trials` fixed pseudo-random int8 vectors (hash
    inputs x, and -x with the sign split). Keys as on the device: projection, then the lower row; a row enters only
    strictly above the floor. trials: default heap_trials(rho). x: replay these int8 vectors instead
    (tools/calibrate_costmodel.py, to count the very inferences it measured).

    The replay is tp_flynn_sift's loop, inlined: each replacement is kept as its row and the hole where its key
    came to rest (and whether the stopping node's right child was the smaller), which decide its steps
    (_sift_steps), counted per row at the end."""
    m_max = len(indices)
    k = len(SIFT_STATS)
    if m_max < rho:
        return np.zeros((m_max + 1, k)), np.zeros(k), np.zeros((1, 0), dtype=np.int64)
    if x is None:
        trials = heap_trials(rho) if trials is None else trials
        x = np.random.default_rng(rho).integers(-127, 128, size=(trials, n_features))
    x = np.asarray(x, dtype=np.int64)
    trials = len(x)
    u = split_inputs(x) if n_inputs > n_features else x
    P = _projections(u, np.asarray(indices))  # (trials, m_max)
    heapified = [0] * k
    groups = -(-m_max // GROUP_ROWS)
    outcome = np.zeros((trials, groups * GROUP_ROWS), dtype=np.int64)  # S
    outcome[:, :rho] = OFFER_OUTCOMES.index("A")
    outcome[:, rho - 1] = OFFER_OUTCOMES.index("H")
    n, last, stride = rho, rho - 1, 2 * rho
    heaps = (P[:, :rho] * 65536 + (65535 - np.arange(rho))[None, :]).tolist()
    for heap in heaps:
        _heapify(heap, heapified)
    floors = [heap[0] >> 16 for heap in heaps]
    events: list[int] = []  # per replacement: (its vector, its row) * stride + 2 * its key's last hole + whether
    # the right child was the smaller where it stopped
    append = events.append
    row = rho
    while row < m_max:  # spans of rows, each as long as the rows before it: the floors only rise, so a row not
        # above its vector's floor at a span's start never enters in the span (about rho rows of a span are)
        stop = min(m_max, 2 * row)
        span = P[:, row:stop]
        t_of, j_of = np.nonzero(span > np.array(floors)[:, None])
        sums = span[t_of, j_of]
        j_of += row
        t_now, floor, heap = -1, 0, heaps[0]
        for t, p, key, event in zip(t_of.tolist(), sums.tolist(), (sums * 65536 + (65535 - j_of)).tolist(),
                                    ((t_of * m_max + j_of) * stride).tolist()):
            if t != t_now:  # the next vector's rows (np.nonzero gives them in order, vector by vector)
                if t_now >= 0:
                    floors[t_now] = floor
                t_now, floor, heap = t, floors[t], heaps[t]
            if p > floor:
                hole, child = 0, 1
                while child < n:
                    c = heap[child]
                    if child < last:
                        right = heap[child + 1]
                        if right < c:
                            child += 1
                            c = right
                    if c >= key:
                        break
                    heap[hole] = c
                    hole, child = child, 2 * child + 1
                heap[hole] = key
                floor = heap[0] >> 16
                append(event + 2 * hole + (child < n and not child & 1))
        if t_now >= 0:
            floors[t_now] = floor
        row = stop
    steps = np.zeros((m_max + 1, k))
    if events:
        where, code = np.divmod(np.array(events, dtype=np.int64), stride)
        trial, rows = np.divmod(where, m_max)
        table = _sift_steps(n)[code]
        for i in range(k):
            steps[:, i] = np.bincount(rows + 1, weights=table[:, i], minlength=m_max + 1)
        outcome[trial, rows] = OFFER_OUTCOMES.index("R")
    codes = (outcome.reshape(trials, groups, GROUP_ROWS) * 4 ** np.arange(GROUP_ROWS)).sum(axis=2)
    return np.cumsum(steps, axis=0) / trials, np.array(heapified, dtype=float) / trials, codes


def _projections(u: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """P[t, j] = sum of u[t, indices[j]] (int64): gathered a column of indices at a time from u's transpose (whole
    rows of it), in int32 where the sums fit."""
    narrow = np.abs(u).max(initial=0) * max(indices.shape[1], 1) < 2**31
    uT = np.ascontiguousarray(u.T, dtype=np.int32 if narrow else np.int64)
    PT = np.zeros((len(indices), len(u)), dtype=uT.dtype)
    for column in indices.T:
        PT += uT[column]
    return PT.T.astype(np.int64)


@lru_cache(maxsize=None)
def _sift_steps(n: int) -> np.ndarray:
    """The steps (SIFT_STATS) of a tp_flynn_sift from the root of a heap of n keys, by 2 * the hole where the key
    comes to rest + whether the right child was the smaller where it stopped (_sift's counts): each level of the
    root's path to that hole was moved at a node with two children, or at the last one with a left child only (its
    child is n - 1), and a right child is taken at every even node on the path."""
    table = np.zeros((2 * n, len(SIFT_STATS)))
    for hole in range(n):
        depth = rights = 0
        node = hole
        while node:
            rights += node % 2 == 0
            node = (node - 1) // 2
            depth += 1
        left = int(n % 2 == 0 and hole == n - 1)
        stop = 6 if 2 * hole + 1 >= n else 4 if 2 * hole + 2 < n else 5
        for right in (0, 1):
            table[2 * hole + right, :4] = (1, depth - left, left, rights + right)
            table[2 * hole + right, stop] = 1
    return table


def _patterns_of(counts: np.ndarray) -> dict[str, float]:
    """{outcome tuple: count} of a histogram over group codes (a code the code has no path for is an error)."""
    out = {}
    for code in np.nonzero(counts)[0].tolist():
        if code not in OFFER_PATTERN_OF_CODE:
            raise ValueError(f"no offer path for outcome code {code}")
        out[OFFER_PATTERN_OF_CODE[code]] = float(counts[code])
    return out


@lru_cache(maxsize=4096)
def expected_offer_patterns(m: int, rho: int) -> tuple[tuple[tuple[str, float], ...], tuple[tuple[str, float], ...]]:
    """offer_patterns for m rows in random order: the first rho appended (the last one H), then row j replaces the
    root with chance rho / (j + 1), independently (expected_heap_replacements' rows); rows past m S."""
    if m < rho:
        return (), ()
    groups = -(-m // GROUP_ROWS)
    j = np.arange(groups * GROUP_ROWS)
    p = np.where((j < m) & (j >= rho), rho / (j + 1.0), 0.0).reshape(groups, GROUP_ROWS)
    fill = np.where(j < rho, OFFER_OUTCOMES.index("A"), 0)
    fill[rho - 1] = OFFER_OUTCOMES.index("H")
    fill = fill.reshape(groups, GROUP_ROWS)
    digit = 4 ** np.arange(GROUP_ROWS)
    taken = (np.arange(1 << GROUP_ROWS)[:, None] >> np.arange(GROUP_ROWS)) & 1  # each row S (0) or R (1)

    def chances(g: np.ndarray) -> np.ndarray:
        """The chance of each code summed over the groups g (an appended row's p is 0: never taken)."""
        out = np.zeros(4**GROUP_ROWS)
        chance = np.where(taken[:, None, :], p[g][None], 1 - p[g][None]).prod(axis=2)  # (patterns, groups)
        np.add.at(out, np.where(fill[g][None] > 0, fill[g][None], taken[:, None, :]) @ digit, chance)
        return out

    filling = int(-(-rho // GROUP_ROWS))  # the groups with an appended row come first
    head = chances(np.arange(min(filling, groups - 1)))
    middle = np.arange(filling, groups - 1)
    if middle.size:  # no appended row: the code is the taken rows'
        q = p[middle][None]
        head[taken @ digit] += np.where(taken[:, None, :], q, 1 - q).prod(axis=2).sum(axis=1)
    return tuple(_patterns_of(head).items()), tuple(_patterns_of(chances(np.array([groups - 1]))).items())


def _sift(heap: list, key: int, stats, hole: int = 0) -> int:
    """tp_flynn_sift: put key at hole and move it down the min-heap, adding its steps to stats (SIFT_STATS order);
    returns the levels it moved."""
    n, moves = len(heap), 0
    stats[0] += 1
    while True:
        child = 2 * hole + 1
        if child >= n:
            stats[6] += 1  # no child: the loop's first test leaves
            break
        pair = child + 1 < n
        if pair and heap[child + 1] < heap[child]:
            child += 1
            stats[3] += 1
        if heap[child] >= key:
            stats[4 if pair else 5] += 1
            break
        stats[1 if pair else 2] += 1
        heap[hole], hole, moves = heap[child], child, moves + 1
    heap[hole] = key
    return moves


def _heapify(keys: list, stats) -> list:
    """tp_flynn_heapify: bottom-up, as the device builds the heap of the first rho rows."""
    for hole in range(len(keys) // 2 - 1, -1, -1):
        _sift(keys, keys[hole], stats, hole)
    return keys


def _harmonic(n: int) -> float:
    """H_n = sum_{k=1..n} 1/k in O(1) (digamma), so the solver can price thousands of shapes quickly."""
    return float(digamma(n + 1) + np.euler_gamma)


@dataclass(frozen=True)
class FlyShape:
    """The shape of a FlyNN inference as the cost model sees it."""

    m: int  # hash rows
    s: int  # inputs per row
    n_inputs: int  # hash inputs (2d with the sign split)
    rho: int  # winners
    bits: int  # count bits
    n_classes: int
    store_M: bool
    split: bool = False  # the sign split (hash inputs x and -x)


@dataclass(frozen=True)
class GeneratorTotals:
    """The seeded generator's work for the shape's m rows: exact (a replay of the seed) or expected."""

    pattern_proposals: float
    compares: float
    wraps: float
    mirrors: float
    sifts: np.ndarray | None = None  # the replacements' sift steps (SIFT_STATS); None: expected, random order
    heapify: np.ndarray | None = None  # building the heap's sift steps; None: expected for random keys
    offers: tuple | None = None  # a narrow seeded M's groups by outcome tuple (offer_patterns); None: expected


def cost_terms(counts: WalkCounts, m: int, rho: int, bits: int, n_classes: int, store_M: bool) -> dict[str, float]:
    """How many times each costed unit of work runs in one FlyNN inference of the first m rows of `counts`' M
    (heap replacements: their mean over random vectors). The one source of both predict_cycles and the solver's
    ExactCycles. Where the replay's mean is noisy (its vectors' replacements spread so widely that their standard
    error, at a replacement's cycles, is above HEAP_NOISE of the total), the replay of HEAP_TRIALS_NOISY vectors:
    seed 7302's flynn-057 of tools/bench_costmodel.py (a seeded M of s = 2 over 5 inputs, rho = 32: ten distinct
    rows, whose ties make one vector's cycles about 56,400 or 68,000) was 1.3 % noisy on 64 vectors."""
    terms = _replayed_terms(counts, m, rho, bits, n_classes, store_M, False)
    noise = counts.replay_noise(m, rho)
    if noise and noise * replacement_cycles(terms) > HEAP_NOISE * total_cycles(terms):
        terms = _replayed_terms(counts, m, rho, bits, n_classes, store_M, True)
    return terms


def replacement_cycles(terms: dict[str, float]) -> float:
    """A heap replacement's mean cycles in these terms: its sift (the replay's steps; the heap's build aside) and
    the call's (heap_call_seeded's)."""
    calls = terms["sift"] - terms["heapify"]
    if calls <= 0:
        return 0.0
    sift = sum(terms[name] * FLY_CYCLES[name] for name in FLY_STAGES["top_rho"] if name.startswith("sift"))
    return sift / terms["sift"] + FLY_CYCLES["heap_call_seeded"]


def _replayed_terms(counts: WalkCounts, m: int, rho: int, bits: int, n_classes: int, store_M: bool,
                    noisy: bool) -> dict[str, float]:
    sifts, heapify = counts.heap_work(m, rho, noisy)
    offers = counts.offer_patterns(m, rho, noisy) if not store_M and counts.n_inputs <= WIDE_INPUTS else None
    return shape_terms(FlyShape(m, counts.s, counts.n_inputs, rho, bits, n_classes, store_M,
                                counts.n_inputs > counts.n_features),
                       GeneratorTotals(counts.pattern_proposals[m], counts.compares[m], counts.wraps[m],
                                       counts.mirrors[m], sifts, heapify, offers))


def shape_terms(shape: FlyShape, walk: GeneratorTotals) -> dict[str, float]:
    """cost_terms from the generator's totals for the shape's m rows (exact from a replay, or expected; the heap's
    replacements and sift levels replayed, or their expectation for rows in random order)."""
    m, s, n_in, rho, bits, L, store_M = (shape.m, shape.s, shape.n_inputs, shape.rho, shape.bits, shape.n_classes,
                                         shape.store_M)
    pattern_proposals, compares, wraps, mirrors, sifts, heapify = (
        walk.pattern_proposals, walk.compares, walk.wraps, walk.mirrors, walk.sifts, walk.heapify)
    wide = n_in > WIDE_INPUTS
    if sifts is None or heapify is None:
        per_replacement, expected_heapify = expected_sift_stats(int(rho))
        sifts = per_replacement * expected_heap_replacements(m, rho) if sifts is None else sifts
        heapify = expected_heapify if heapify is None else heapify
    replacements = float(sifts[0])
    steps = np.asarray(sifts) + np.asarray(heapify)
    terms = {name: 0.0 for name in FLY_CYCLES}
    terms.update(fixed=1, heapify=float(heapify[0]), heapify_fixed=1 if rho >= 2 else 0, winner=rho)
    terms.update({f"sift_{name}" if name != "calls" else "sift": float(v) for name, v in zip(SIFT_STATS, steps)})
    if 4 * rho > 255:  # two child-offset tests per step that reaches a node with a child, one at a leaf
        terms["sift_wide_compare"] = 2 * (terms["sift_level_pair"] + terms["sift_level_left"] + terms["sift_stop_pair"]
                                          + terms["sift_stop_left"]) + terms["sift_stop_leaf"]
    terms.update(lookup_terms(L, bits, rho))
    terms["class_argmin"] = L - 1
    terms["wide_stored_mirror" if store_M else "wide_mirror"] = float(mirrors) if wide else 0.0
    if store_M and not wide:  # counted off tp_flynn_project's code: the input loop unrolled for s <= 2
        loop = "_loop" if s > 2 else ""
        terms.update({f"narrow_stored_row{loop}": m, f"narrow_stored_index{loop}": m * s,
                      f"narrow_stored_fill{loop}": rho, f"narrow_stored_replace{loop}": replacements,
                      f"narrow_stored_once{loop}": 1}, fixed=0, class_argmin=0, narrow_call=narrow_call_cycles(shape))
        return terms
    terms["heap_fill"] = rho
    if s > 2:
        terms["row_loop"] = m if store_M or wide else 0
    if store_M:
        layout = wide_seeded_layout(shape.split, s)
        if layout in WIDE_STORED_CYCLES:  # the layout's own cycles
            units = dict(row=m, index=m * s, mirror=float(mirrors), heap_fill=rho, heap_call=replacements, once=1)
            terms.update(heap_fill=0, row_loop=0, wide_stored_mirror=0.0)
            terms.update({wide_stored_term(layout, unit): units[unit] for unit in WIDE_STORED_UNITS})
            return terms
        terms.update(row_stored=m, heap_call_stored=replacements, wide_stored_index=m * s,
                     wide_stored_pair=m * s if s == 2 and shape.split else 0)
        return terms
    blocks = -(-m // block_rows(n_in))
    terms.update(block=blocks, heap_call_seeded=replacements)
    if wide and n_in & (n_in - 1):  # each block's pattern, then a rotation per row; the layout's own cycles
        units = dict(block=blocks, wide_proposal=pattern_proposals + m, wide_compare=compares, wide_take=m * s,
                     wide_row=m, wide_wrap=wraps, wide_mirror=float(mirrors), heap_fill=rho,
                     heap_call_seeded=replacements, once=1)
        layout = wide_seeded_layout(shape.split, s)
        terms.update(block=0, heap_call_seeded=0, heap_fill=0, wide_mirror=0.0, row_loop=0)
        terms.update({wide_seeded_term(layout, unit): units[unit] for unit in WIDE_SEEDED_UNITS})
    elif wide:  # a power-of-two input count: the proposal mapped by a shift loop
        proposals = pattern_proposals + m
        terms.update(wide_proposal=proposals, wide_compare=compares, wide_take=m * s, wide_wrap=wraps, wide_row=m,
                     wide_shift_map=proposals if n_in & (n_in - 1) == 0 else 0)
    else:  # counted whole: the frame, blocks, groups, the generator's steps and each group's four offers
        groups = _groups(m)
        drawn = pattern_proposals + blocks  # each block's pattern, then its one rotation
        if walk.offers is not None:
            offers, last = walk.offers
        else:
            offers, last = (dict(p) for p in expected_offer_patterns(int(m), int(rho)))
        mapped = n_in != 256
        terms.update(fixed=0, class_argmin=0, narrow_call=narrow_call_cycles(shape), byte=drawn,
                     byte_map=drawn * mapped,
                     block_map=blocks * mapped,
                     prng_step=(drawn + 1) // 2, pattern_proposal=pattern_proposals, compare=compares,
                     accept=blocks * s, take=groups * s, take_loop=groups * s if s > TAKE_UNROLLED else 0,
                     seeded_scan=seeded_scan_cycles(m, blocks, groups, offers, last), block=0, heap_fill=0,
                     heap_call_seeded=0)
    return terms


def narrow_argmin_cycles(n_classes: int, third: int, fourth: int) -> int:
    """The argmin over the class scores in tp_predict, against the three classes narrow_call_cycles' bases hold:
    the third class costs `third` (two classes save it), the fourth `fourth` and every later one 33."""
    L = n_classes
    return -third if L <= 2 else 0 if L == 3 else fourth + 33 * (L - 4)


def narrow_call_cycles(shape: FlyShape) -> int:
    """The timed call of a narrow M (at most 256 hash inputs) besides tp_flynn_project, tp_flynn_sift,
    tp_flynn_heapify and tp_flynn_lookup: tp_predict's frame, the biased input copies, the cyclic extension of a
    seeded M's copy, the calls and the argmin over the classes, and the device app's timed wrapper (less the judge
    stage). Counted from avr-gcc's code and read off the profiling simulator by layout (the timed span less those
    functions' cycles, d = 4 to 256 features, 2 to 10 classes, rho = 8 to 64); the same for every input.

    - seeded M: the input copied twice, 28 cycles a feature (two copies of a 14-cycle loop step), 52 with the sign
      split (its second loop, 12 more a copy); the extension's 32 bytes through a displacement (std Z+q) while
      2 * inputs - 1 <= 63, else 3 cycles a byte more (96); where the copy buffer (2 * inputs + 32 bytes) is more
      than ten times the caller's heap (4 rho bytes: rho = 8 and more than 144 inputs) avr-gcc no longer inlines
      tp_flynn_hash (56 cycles more, 62 with the split); the argmin 35 cycles for the third class and 44 the fourth
      (39 and 40 with tp_flynn_hash out of line), 33 each later one;
    - stored M, one copy: 26 cycles a feature with the split, 10 without. With the split, 3 cycles less once the
      frame (the copy and the heap, inputs + 4 rho bytes) is past ldd's reach (63), and the argmin 39 cycles for
      the third class and 29 the fourth up to rho = 16, 35 and 44 from 32 on. Without it, with rho = 8 and a frame
      past that reach, avr-gcc allocates its registers otherwise: 3 cycles less, and from four classes on 12
      cycles a feature; else the argmin 39 cycles for the third class, 40 the fourth. Every later class 33."""
    L, n_in, rho, split = shape.n_classes, shape.n_inputs, shape.rho, shape.split
    d = n_in // 2 if split else n_in
    if not shape.store_M:
        cycles = (446 + 52 * d) if split else (407 + 28 * d)
        if 2 * n_in - 1 > 63:
            cycles += 96
        if 2 * n_in + 32 > 10 * 4 * rho:  # tp_flynn_hash out of line
            return cycles + (62 if split else 56) + narrow_argmin_cycles(L, 39, 40)
        return cycles + narrow_argmin_cycles(L, 35, 44)
    if split:  # a frame (the copy and the heap) past ldd's reach: 3 cycles less
        return ((149 if n_in + 4 * rho > 63 else 152) + 26 * d
                + narrow_argmin_cycles(L, *((39, 29) if rho <= 16 else (35, 44))))
    tight = rho == 8 and n_in + 32 > 63  # a frame past ldd's reach with rho = 8: another register allocation
    if tight and L >= 4:
        return 169 + 12 * d + 33 * (L - 4)
    return (138 if tight else 141) + 10 * d + narrow_argmin_cycles(L, 39, 40)


def lookup_terms(L: int, bits: int, rho: int, table: bool = True) -> dict[str, float]:
    """tp_flynn_lookup's terms: its cycles once and per winner off LOOKUP_CYCLES for the (L, b) it holds (table),
    then off its layout's code (LOOKUP_LAYOUTS, more classes), else by the fitted parts of its code (the class
    loop, the filter walk, the row offset's multiply or shift: what --flynn-functions fits)."""
    if table and (L, bits) in LOOKUP_CYCLES:
        once, per_winner, _ = LOOKUP_CYCLES[(L, bits)]
        return {"lookup_table_once": once, "lookup_table_winner": rho * per_winner}
    if table and lookup_layout(L, bits) in LOOKUP_LAYOUTS:  # more classes: its layout's code
        w, c, o, p = LOOKUP_LAYOUTS[lookup_layout(L, bits)]
        return {"lookup_table_once": o + p * L, "lookup_table_winner": rho * lookup_per_winner(L, bits, w, c)}
    terms = {"lookup_class" if bits == 1 else "lookup_class_lut": rho * L,
             "lookup_class_aligned": rho * L if (L * bits) % 8 == 0 else 0}
    align, refills, refill_bits = lookup_walk(L, bits)
    terms.update(lookup_class_bit=rho * L * bits, lookup_align=rho * align, lookup_refill_bit=rho * refill_bits)
    terms["lookup_refill" if 8 % bits == 0 else "lookup_refill_shift"] = rho * refills
    if (L * bits) & (L * bits - 1):
        terms["winner_mul"] = rho
    elif (L * bits) % 8:  # row * (L b) is a 32-bit shift, and the bit offset is one of two or four
        terms["winner_shift"] = rho
    if (L * bits) % 8:
        terms["winner_unaligned"] = rho
    terms["class_once"] = L
    terms["class_loop"] = rho if L > 2 else 0
    if L == 2 and f"winner_pair{bits}" in FLY_CYCLES:  # fitted for the 1 .. 4 bits the solver draws
        terms[f"winner_pair{bits}"] = rho
    terms["lookup_once"] = 1
    return terms


@lru_cache(maxsize=None)
def lookup_walk(n_classes: int, bits: int) -> tuple[float, float, float]:
    """Per winner, what tp_predict's filter walk does besides its per-class work, as the mean over the bit offsets
    o = (j L b) mod 8 a random winning row j can have (the multiples of gcd(L b, 8)): the first byte is shifted
    right by o bits, then a byte is fetched whenever fewer than b bits are left, shifted up by the bits left.
    Returns (first-shift bits, fetches after the first, their shift bits)."""
    L, b = n_classes, bits
    offsets = range(0, 8, math.gcd(L * b, 8))
    align = refills = refill_bits = 0
    for offset in offsets:
        have = 8 - offset
        align += offset
        for _ in range(L):
            if have < b:
                refills += 1
                refill_bits += have
                have += 8
            have -= b
    n = len(offsets)
    return align / n, refills / n, refill_bits / n


def _groups(m: int) -> int:
    """Row groups the narrow scan sums: GROUP_ROWS rows at a time, a block's last group may be short only in the
    model's last block (block_rows is a multiple of GROUP_ROWS)."""
    return -(-m // GROUP_ROWS)


def estimate_cycles(m: int, s: int, rho: int, bits: int, n_classes: int, n_inputs: int, store_M: bool) -> float:
    """Expected cycles before a seed is fixed: the generator's counts as their expectation for uniform
    proposals (half of a split model's inputs mirrored, half the rotated indices wrapped)."""
    blocks = -(-m // block_rows(n_inputs))
    per_pattern = sum(n_inputs / (n_inputs - k) for k in range(s))  # coupon collector: proposals per pattern
    compares = sum((k + 1) * n_inputs / (n_inputs - k) for k in range(s))  # scans of k entries + the sentinel
    terms = shape_terms(FlyShape(m, s, n_inputs, rho, bits, n_classes, store_M),
                        GeneratorTotals(blocks * per_pattern, blocks * compares, m * s / 2, m * s / 2))
    return float(sum(count * FLY_CYCLES[name] for name, count in terms.items() if count))


def total_cycles(terms: dict[str, float]) -> int:
    """The terms' cycles and the Timer1 overflow interrupts that run among them (one timed call). Terms that do not
    run are skipped (most of FLY_CYCLES' in any one shape): adding their 0.0 changes no sum."""
    own = sum(count * FLY_CYCLES[name] for name, count in terms.items() if count)
    return int(round(own)) + timer_overflow_cycles(own)


def flynn_cost_terms(model, x: np.ndarray | None = None) -> dict[str, float]:
    """How many times each costed unit of work runs in one FlyNN inference of `model` (x: the heap's work as these
    int8 vectors give it, their mean; default: its expectation over random vectors)."""
    m, s = model.indices.shape
    counts = WalkCounts.replay(model.seed, s, model.n_hash_inputs, model.n_features, m)
    if model.store_M:  # a stored M is whatever the model holds; only its mirrored inputs matter here
        mirrored = np.count_nonzero(model.indices >= model.n_features, axis=1) if model.sign_split else np.zeros(m)
        counts = WalkCounts(s, model.n_hash_inputs, model.n_features, counts.pattern_proposals, counts.compares,
                            counts.wraps, np.concatenate([[0], np.cumsum(mirrored)]).astype(np.int64), model.indices)
    if x is not None:
        counts.use_heap_work(model.n_winners, simulated_heap(model.indices, model.n_features, model.n_hash_inputs,
                                                             model.n_winners, x=x))
    return cost_terms(counts, m, model.n_winners, model.bits, model.n_classes, model.store_M)


def predict_cycles(model) -> dict:
    terms = flynn_cost_terms(model)
    cycles = {name: count * FLY_CYCLES[name] for name, count in terms.items()}
    out = {stage: int(round(sum(cycles[k] for k in names))) for stage, names in FLY_STAGES.items()}
    out["total"] = total_cycles(terms)
    out["lower_bound"] = lower_bound_cycles(model)
    return out

