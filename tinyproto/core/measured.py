"""Figures a device or a file supplies (cycles, stack bytes, counts, sizes), checked before they are divided,
scaled or drawn.

A device is not trusted to send sensible figures: a firmware that answers every score correctly may still report
0 cycles per inference (a broken timer, a tampered counter), and a file may hold 0, a negative number, NaN or
10^300 where a count belongs. Every derived figure goes through this module: a ratio of a figure that is not a
finite positive number is None ("not measured"), never a ZeroDivisionError or an infinity in a report; a figure
drawn on a log axis must be positive; and `cycle_problem` names what is wrong with a device's cycle counts, so
validate fails a `cycles` check with that detail instead of deriving latency and energy from it.
Layer: core.
"""

from __future__ import annotations

import math
import numbers
from typing import Iterable

MAX_CYCLES = 2**32 - 1  # the wire's u32; a count at the limit has wrapped or saturated


def is_number(value: object) -> bool:
    """A real, finite int or float, numpy's included (not a bool, not NaN or infinite, not an int too large for a
    float)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return False
    try:
        return math.isfinite(float(value))
    except OverflowError:
        return False


def is_positive(value: object) -> bool:
    return is_number(value) and float(value) > 0


def ratio(numerator: object, denominator: object) -> float | None:
    """numerator / denominator, or None unless the numerator is a finite number and the denominator a finite
    positive one."""
    if not is_number(numerator) or not is_positive(denominator):
        return None
    result = float(numerator) / float(denominator)
    return result if math.isfinite(result) else None


def drawable(values: Iterable[object]) -> bool:
    """Every value can be drawn on a log axis (finite and positive)."""
    return all(is_positive(v) for v in values)


PLAUSIBLE_FACTOR = 4  # a count beyond 4x the cost model's prediction (tested within 3 % of the mean) or below


def plausible_cycles(lower_bound: object, predicted: object) -> tuple[int, int] | None:
    """The counts a device may report for one inference of a model: at least its MAC lower bound (the fewest cycles
    its multiply-accumulates can take) and its predicted cycles / PLAUSIBLE_FACTOR, at most PLAUSIBLE_FACTOR x the
    prediction (the cost models are tested within 3 % of the mean; one model's inferences differ by a few %).
    None when the model gives no usable figures."""
    if not is_positive(predicted):
        return None
    low = max(int(lower_bound) if is_number(lower_bound) else 1, int(float(predicted) / PLAUSIBLE_FACTOR), 1)
    return low, max(low, int(float(predicted) * PLAUSIBLE_FACTOR))


def cycle_problem(cycles: Iterable[object], plausible: tuple[int, int] | None = None,
                  basis: str = "") -> str | None:
    """What is wrong with a device's per-inference cycle counts, or None. Every inference costs cycles, so 0 is
    a broken or tampered counter, as is a count at the u32 limit (wrapped or saturated); with `plausible` (lo, hi)
    (see plausible_cycles; `basis` says where it comes from) a count outside it is no measurement of this model."""
    values = list(cycles)
    bad = [v for v in values if not is_number(v) or not 0 < float(v) < MAX_CYCLES]
    if bad:
        zero = sum(1 for v in bad if is_number(v) and float(v) == 0)
        shown = ", ".join(sorted({repr(v) for v in bad})[:3])
        what = "0 cycles (no inference takes none)" if zero == len(bad) else f"cycle counts out of range ({shown})"
        return f"{len(bad)} of {len(values)} inferences reported {what}"
    if plausible is None:
        return None
    low, high = plausible
    outside = [int(v) for v in values if not low <= float(v) <= high]
    if not outside:
        return None
    shown = ", ".join(str(v) for v in sorted(set(outside))[:3])
    return (f"{len(outside)} of {len(values)} inferences reported cycle counts outside {low}..{high}{basis} "
            f"({shown}{', ...' if len(set(outside)) > 3 else ''})")


def stack_problem(stack_peak: object, static_reported: object, static_built: int, sram_bytes: int) -> str | None:
    """What is wrong with a device's STATS figures, or None. The stack is painted at start-up and every call uses
    some, so a peak of 0 (or more than the board's SRAM) is not a measurement; the static SRAM (.data + .bss) the
    firmware reports is at most what its build recorded (which also counts .noinit) and never 0."""
    if not isinstance(stack_peak, numbers.Integral) or isinstance(stack_peak, bool) or not 0 < stack_peak <= sram_bytes:
        return (f"the device reported a stack peak of {stack_peak!r} B, outside 1..{sram_bytes} (its SRAM): "
                "not a measurement")
    if (not isinstance(static_reported, numbers.Integral) or isinstance(static_reported, bool)
            or not 0 < static_reported <= static_built):
        return (f"the device reported {static_reported!r} B of static SRAM, the firmware built holds {static_built} B: "
                "another firmware answered")
    return None
