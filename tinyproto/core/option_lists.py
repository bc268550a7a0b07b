"""Option values as the user types them: a comma-separated list (--budgets, --models, --seeds, --boards,
--holdout-classes, --ports), the one way such a list is split, an empty item refused; and a number's spelling (the
digits 0-9 only), the one check every number option makes; and the Python API's values of those options checked
for their type (api_int, api_number, api_text, check_seed). Layer: core."""

from __future__ import annotations

from tinyproto.core.errors import TinyprotoError


def comma_items(text: str, option: str) -> list[str]:
    """'8,9' -> ['8', '9'], each item stripped; an empty item ('8,', ',9', '8,,9') is a typo, refused in one line
    (--holdout-classes 0, held out class 0 alone where 0,1 was meant)."""
    items = [item.strip() for item in str(text).split(",")]
    if any(not item for item in items):
        raise TinyprotoError(f"{option} {text!r}: give a comma-separated list without empty items")
    return items


def plain_digits(text: str) -> bool:
    """Whether a number given as text is written with the digits 0-9 (ASCII, no '_'): Python's int() and float()
    also read '２' (a full-width digit), '٢' and '1_000', so --seed ２ trained with seed 2 where --seeds ２ was
    refused. Every number option asks this one question (cli.options, --unknown-rate, sweep's --seeds)."""
    return text.isascii() and "_" not in text


MAX_SEED = 2**32 - 1  # numpy's RandomState and SeedSequence take 0..2^32-1 (the CLI's --seed accepts the same)


def api_int(value: object, what: str, low: int | None = None, high: int | None = None) -> int:
    """An option given in Python as a whole number (never a bool, a string or a float): one TinyprotoError otherwise
    (int("x") and numpy's own range checks raised ValueError from deep inside)."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TinyprotoError(f"{what} must be a whole number, not {type(value).__name__} {str(value)[:40]!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        span = f"{low}..{high}" if low is not None and high is not None else f">= {low}" if low is not None else \
            f"<= {high}"
        raise TinyprotoError(f"{what} must be in {span}, got {value}")
    return int(value)


def api_number(value: object, what: str) -> float:
    """An option given in Python as a real number (int or float, not a bool or a string)."""
    import numbers

    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TinyprotoError(f"{what} must be a number, not {type(value).__name__} {str(value)[:40]!r}")
    return float(value)


def api_text(value: object, what: str) -> str:
    """An option given in Python as text."""
    if not isinstance(value, str):
        raise TinyprotoError(f"{what} must be text (a str), not {type(value).__name__} {str(value)[:40]!r}")
    return value


def check_seed(seed: object, what: str = "--seed") -> int:
    """A training seed: a whole number in 0..MAX_SEED."""
    return api_int(seed, what, 0, MAX_SEED)
