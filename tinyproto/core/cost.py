"""What every family's cost model shares: the lower bound of one int8 multiply-accumulate on AVR.

Each family predicts its own cycles per inference (tinyproto/families/<name>/cost.py) from the shape of its
integer model, before anything is built; `tinyproto validate` prints predicted against measured cycles.
Layer: core.
"""

from __future__ import annotations

from tinyproto.core.confidence import DOUBT_HALVINGS
from tinyproto.core.wire import CHUNK_BYTES

# Lower bound per int8 multiply-accumulate with one operand in flash on AVR:
# lpm (3) + ld (2) + muls (2) + add/adc into a 16-bit accumulator (2) = 9 cycles.
MIN_CYCLES_PER_MAC = 9

# The families' cost models are tested within 3 % of the simulator's measured mean cycles. A --max-latency
# limit is a promise about the device, not about the prediction, so the solvers keep that much headroom: a shape
# predicted at 0.99 ms is not accepted under a 1 ms limit when the model may be 3 % low.
COST_MODEL_TOLERANCE = 0.03


# The confidence stage (firmware/tp_judge.c, its AVR assembly), shared by every family and run after the scores of
# every calibrated model: one pass over the classes' 16-bit score views (the winner's and the runner-up's), the
# margin, the doubt halved once per whole TP_JUDGE_HALVING of it (at most DOUBT_HALVINGS times) and, with
# --unknown-rate, one compare of the winning view. Counted off the assembly, beyond the stub a model without
# calibration runs (which stores 0 and returns: its 8 cycles are the call's, below): "class" per class (two loads,
# the pointer step, the label test, the compare and keep, the loop step), "fixed" (the set-up, the margin, the
# halving loop's exit, the byte's store), "halving" per halving and "limit" the compare in the winner's branch.
# Beyond JUDGE_BACKWARD_CLASSES classes the pass runs forwards, its count one compare longer: one cycle more per
# class and in the fixed part. The halvings depend on the input's margin: the prediction takes the most,
# DOUBT_HALVINGS, so it is never low (on digits, 2 kB, the mean was about 4).
JUDGE_CYCLES = {"fixed": 10, "class": 16, "halving": 6, "limit": 4, "range": 4, "clip": 4,
                "clip_input": 10, "clip_call": 30}  # range: after the limit's
# compare, its branch not taken (1, not 2), lds (2), cpi, brlo (tp_judge_avr.h): 4 more at most; clip: the same
# for the clip check's count; clip_input: tp_judge_inputs' loop per int8 input (ld, subi, cpi, adc, sbc, the
# count's subi, sbci and brcc: 10), clip_call: once per call (the caller's arguments and call, the count's lds,
# first's test, the loop's entry and exit, sts, ret; counted high), which a streamed input pays per chunk
# tp_judge.c runs the pass backwards while the last class's view is within ldd's 63-byte reach of the scores:
# 4 * (classes - 1) + score byte + 1 <= 63 holds for every view up to 16 classes
JUDGE_BACKWARD_CLASSES = 16


# What that difference leaves out: the device app's call of tp_judge itself, which a model without a table also
# makes (into the stub). tools/bench_costmodel.py measures it by building the app without the call: 30 cycles
# buffered, 27 streamed on the simulated Uno; the buffered figure is predicted for both.
JUDGE_CALL_CYCLES = 30


def judge_cycles(n_classes: int, declines: bool, checks_range: bool = False, clip_inputs: int = 0) -> int:
    """Predicted cycles of tp_judge for a model of n_classes classes (declines: compiled with --unknown-rate;
    checks_range: its calibration also checks a family's range signal), with the most halvings an input can take;
    clip_inputs: with a clip check, the int8 inputs tp_judge_inputs counts (one call per chunk of the transport's
    TP_CHUNK_BYTES, as a streamed input is fed; a gathered one takes one call)."""
    terms = JUDGE_CYCLES
    forward = int(n_classes) > JUDGE_BACKWARD_CLASSES
    clips = (terms["clip"] + terms["clip_input"] * int(clip_inputs)
             + terms["clip_call"] * -(-int(clip_inputs) // CHUNK_BYTES)) if clip_inputs else 0
    return (JUDGE_CALL_CYCLES + terms["fixed"] + forward + (terms["class"] + forward) * int(n_classes)
            + terms["halving"] * DOUBT_HALVINGS + (terms["limit"] if declines else 0)
            + (terms["range"] if checks_range else 0) + clips)


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
    # the model is not fitted yet: with the threshold
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
