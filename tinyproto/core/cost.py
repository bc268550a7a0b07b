"""What every family's cost model shares: the lower bound of one int8 multiply-accumulate on AVR.

Each family predicts its own cycles per inference (tinyproto/families/<name>/cost.py) from the shape of its
integer model, before anything is built; `tinyproto validate` prints predicted against measured cycles.
Layer: core.
"""

from __future__ import annotations

# Lower bound per int8 multiply-accumulate with one operand in flash on AVR:
# lpm (3) + ld (2) + muls (2) + add/adc into a 16-bit accumulator (2) = 9 cycles.
MIN_CYCLES_PER_MAC = 9

def lower_bound_cycles(model) -> int:
    """Multiply-accumulates x the minimum cycles of one int8 MAC with a flash operand."""
    return int(model.multiply_accumulates()) * MIN_CYCLES_PER_MAC
