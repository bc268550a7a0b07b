"""Option values as the user types them: a comma-separated list (--budgets, --models, --seeds, --boards,
--holdout-classes, --ports), the one way such a list is split, an empty item refused; and a number's spelling (the
digits 0-9 only), the one check every number option makes. Layer: core."""

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
