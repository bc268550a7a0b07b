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


def latency_cycle_limit(max_latency_ms: float | None, f_cpu_hz: int, headroom: bool = True) -> float | None:
    """The predicted cycles per inference a solver may accept under max_latency_ms at f_cpu_hz (None: no limit).
    headroom=False for a family's own default cap, which is a preference, not the user's promise."""
    if max_latency_ms is None:
        return None
    cycles = max_latency_ms * 1e-3 * f_cpu_hz
    return cycles / (1.0 + COST_MODEL_TOLERANCE) if headroom else cycles


def headroom_text() -> str:
    """How a refusal names the headroom, so a shape predicted just under the limit is not a mystery."""
    return f"keeping {COST_MODEL_TOLERANCE:.0%} headroom for the cost model's error"


def lower_bound_cycles(model) -> int:
    """Multiply-accumulates x the minimum cycles of one int8 MAC with a flash operand."""
    return int(model.multiply_accumulates()) * MIN_CYCLES_PER_MAC
