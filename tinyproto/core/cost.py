"""What every family's cost model shares: the lower bound of one int8 multiply-accumulate on AVR.

Each family predicts its own cycles per inference (tinyproto/families/<name>/cost.py) from the shape of its
integer model, before anything is built; `tinyproto validate` prints predicted against measured cycles.
Layer: core.
"""

from __future__ import annotations

# Lower bound per int8 multiply-accumulate with one operand in flash on AVR:
# lpm (3) + ld (2) + muls (2) + add/adc into a 16-bit accumulator (2) = 9 cycles.
MIN_CYCLES_PER_MAC = 9

# The families' cost models are tested within 3 % of the simulator's measured mean cycles. A --max-latency
# limit is a promise about the device, not about the prediction, so the solvers keep that much headroom: a shape
# predicted at 0.99 ms is not accepted under a 1 ms limit when the model may be 3 % low.
COST_MODEL_TOLERANCE = 0.03


# The confidence stage (firmware/tp_judge.c), shared by every family and run after the scores of every model with
# a confidence table: one pass over the classes' 16-bit score views (the winner's and the runner-up's), the margin
# shifted right by the model's TP_JUDGE_MARGIN_SHIFT, the table read and, with --unknown-rate, one compare of the
# winning view. "class" is the pass's cycles per class (avr-gcc -Os: two loads, the pointer step, the label test,
# the compare, the loop step: 18 on the path that keeps the runner-up); judge_shift_cycles the margin's shift.
# "fixed" (the table read, the cap, the winner's subtraction) and "limit" are fitted on the simulated Uno by
# tools/bench_confidence.py (the mean cycles of one model built with its table, minus the same model without; with
# the threshold, minus with the table alone), digits 2 kB, every family: 21 to 31 and 4 to 12 cycles.
JUDGE_CYCLES = {"fixed": 27, "class": 18, "limit": 6}
MAX_JUDGE_SHIFT = 15  # the margin's shifts are 0 .. this (core/confidence.MAX_MARGIN_SHIFT)


def judge_shift_cycles(margin_shift: int) -> int:
    """Cycles of the margin's right shift by margin_shift bits, as avr-gcc -Os compiles a 16-bit shift by a
    constant (read off its code): one or two bits unrolled (2 cycles a bit), three to six a loop (5 a bit), seven
    and more a byte move and at most a few single-bit steps (at most 6 cycles)."""
    shift = int(margin_shift)
    if shift <= 2:
        return 2 * shift
    return 5 * shift if shift <= 6 else 6


# What that difference leaves out: the device app's call of tp_judge itself, which a model without a table also
# makes (into the stub). tools/bench_costmodel.py measures it by building the app without the call: 30 cycles
# buffered, 27 streamed on the simulated Uno; the buffered figure is predicted for both.
JUDGE_CALL_CYCLES = 30


def judge_cycles(n_classes: int, declines: bool, margin_shift: int | None = None) -> int:
    """Predicted cycles of tp_judge for a model of n_classes classes (declines: compiled with --unknown-rate;
    margin_shift: its TP_JUDGE_MARGIN_SHIFT, None for a model not fitted yet: the costliest)."""
    terms = JUDGE_CYCLES
    shift = (max(judge_shift_cycles(t) for t in range(MAX_JUDGE_SHIFT + 1)) if margin_shift is None
             else judge_shift_cycles(margin_shift))
    return (JUDGE_CALL_CYCLES + terms["fixed"] + terms["class"] * int(n_classes) + shift
            + (terms["limit"] if declines else 0))


def latency_cycle_limit(max_latency_ms: float | None, f_cpu_hz: int, headroom: bool = True,
                        n_classes: int | None = None) -> float | None:
    """The predicted cycles per inference a solver may accept under max_latency_ms at f_cpu_hz (None: no limit).
    headroom=False for a family's own default cap, which is a preference, not the user's promise (and is left as
    it is). n_classes: under the user's limit the family's own cycles leave room for the confidence stage every
    compiled model runs after its scores (the threshold's compare included, whether or not --unknown-rate is
    given)."""
    if max_latency_ms is None:
        return None
    cycles = max_latency_ms * 1e-3 * f_cpu_hz
    if not headroom:
        return cycles
    # the model is not fitted yet: the costliest margin shift, with the threshold
    return cycles / (1.0 + COST_MODEL_TOLERANCE) - (judge_cycles(n_classes, True) if n_classes is not None else 0)


def headroom_text() -> str:
    """How a refusal names the headroom, so a shape predicted just under the limit is not a mystery."""
    return f"keeping {COST_MODEL_TOLERANCE:.0%} headroom for the cost model's error"


# Timer1's overflow interrupt (firmware/tp_measure.c): the timed call runs with interrupts on, and Timer1 (clk/1,
# cleared at the call's start) overflows every 65,536 cycles; each overflow runs the vector's jmp (3 cycles) and
# the handler (37: five pushes and pops, SREG saved and restored, the 16-bit count loaded, incremented and stored,
# reti), read off avr-objdump; the profiling simulator runs exactly those 40 cycles per overflow (the chip adds its
# 4-cycle interrupt response). They are in the device's Timer1 figure and in the simulator's marker span alike:
# device time that none of the families' code accounts for, 0.06 % of a long inference.
TIMER1_PERIOD = 65536
TIMER1_OVERFLOW_CYCLES = 40


def timer_overflow_cycles(cycles: float, timed_calls: int = 1) -> int:
    """Cycles of the Timer1 overflow interrupts that run inside `timed_calls` timed calls (a streamed model's
    chunks, taken as equal) of `cycles` in all: a call of C cycles of its own sees n overflows where
    n = floor((C + 40 n) / 65536), i.e. n = floor(C / (65536 - 40))."""
    calls = max(int(timed_calls), 1)
    per_call = max(float(cycles), 0.0) / calls
    return calls * int(per_call // (TIMER1_PERIOD - TIMER1_OVERFLOW_CYCLES)) * TIMER1_OVERFLOW_CYCLES


def lower_bound_cycles(model) -> int:
    """Multiply-accumulates x the minimum cycles of one int8 MAC with a flash operand."""
    return int(model.multiply_accumulates()) * MIN_CYCLES_PER_MAC
