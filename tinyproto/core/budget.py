"""Parse byte budgets like `2kB`, `2KiB`, `1.5kB`, `2048B`, `2048` (1 kB = 1024 bytes). Layer: core."""

from __future__ import annotations

import math
import re

from tinyproto.core.errors import TinyprotoError

MAX_BUDGET_BYTES = 1 << 30  # far beyond any AVR's flash (256 kB), small enough to stay an exact integer
_UNITS = {"": 1, "b": 1, "kb": 1024, "kib": 1024, "k": 1024}
_PATTERN = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?|\.[0-9]+)\s*([a-zA-Z]*)\s*$")


def parse_budget(text: str | int, what: str = "budget") -> int:
    """Return the budget in whole bytes. kB and KiB both mean 1024 bytes; fractions round down. `what` names the
    size in errors (e.g. '--reserve-sram')."""
    if isinstance(text, bool):  # True is an int in Python: a budget of 1 byte
        raise TinyprotoError(f"{what} {text!r} is not a size; write it like 2kB, 1.5kB, 2KiB, 2048B or 2048")
    if isinstance(text, int):
        value, unit = float(text), ""
    else:
        match = _PATTERN.match(str(text))
        if not match:
            raise TinyprotoError(
                f"{what} {text!r} is not a size; write it like 2kB, 1.5kB, 2KiB, 2048B or 2048"
            )
        value, unit = float(match.group(1)), match.group(2).lower()
    if unit not in _UNITS:
        raise TinyprotoError(f"{what} {text!r}: unknown unit {unit!r}; use B, kB or KiB (1 kB = 1024 B)")
    scaled = value * _UNITS[unit]
    if not math.isfinite(scaled) or scaled > MAX_BUDGET_BYTES:  # '999...9' (400 digits) is inf as a float
        raise TinyprotoError(f"{what} {str(text)[:40]!r} is larger than any board's flash; give a size such as 2kB")
    n_bytes = math.floor(scaled)
    if n_bytes <= 0:
        amount = "less than one byte" if scaled > 0 else "zero"  # 0.5 (bytes) rounds down to 0: not zero as written
        raise TinyprotoError(f"{what} {text!r} is {amount}; give a positive size such as 2kB")
    return n_bytes


def is_size_unit(text: str) -> bool:
    """True for a bare unit of a size (`kB`, `KiB`, `B`, `k`): what a size written with a space (`--budget 2 kB`)
    leaves behind as the next argument."""
    return str(text).strip().lower() in _UNITS and bool(str(text).strip())


def format_bytes(n_bytes: int) -> str:
    """`2048` -> `2048 B (2.00 kB)`, for reports."""
    return f"{n_bytes} B ({n_bytes / 1024:.2f} kB)"
