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


def cycle_problem(cycles: Iterable[object]) -> str | None:
    """What is wrong with a device's per-inference cycle counts, or None. Every inference costs cycles, so 0 is
    a broken or tampered counter, as is a count at the u32 limit (wrapped or saturated)."""
    values = list(cycles)
    bad = [v for v in values if not is_number(v) or not 0 < float(v) < MAX_CYCLES]
    if not bad:
        return None
    zero = sum(1 for v in bad if is_number(v) and float(v) == 0)
    shown = ", ".join(sorted({repr(v) for v in bad})[:3])
    what = "0 cycles (no inference takes none)" if zero == len(bad) else f"cycle counts out of range ({shown})"
    return f"{len(bad)} of {len(values)} inferences reported {what}"
