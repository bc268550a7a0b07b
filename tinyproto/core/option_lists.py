"""Comma-separated option values (--budgets, --models, --seeds, --boards, --holdout-classes, --ports): the one way
such a list is split, and an empty item refused. Layer: core."""

from __future__ import annotations

from tinyproto.core.errors import TinyprotoError


def comma_items(text: str, option: str) -> list[str]:
    """'8,9' -> ['8', '9'], each item stripped; an empty item ('8,', ',9', '8,,9') is a typo, refused in one line
    (--holdout-classes 0, held out class 0 alone where 0,1 was meant)."""
    items = [item.strip() for item in str(text).split(",")]
    if any(not item for item in items):
        raise TinyprotoError(f"{option} {text!r}: give a comma-separated list without empty items")
    return items
