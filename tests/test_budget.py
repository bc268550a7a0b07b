"""Byte budgets as the user writes them: the accepted forms and the refusals."""

import pytest

from tinyproto.core.budget import parse_budget
from tinyproto.core.errors import TinyprotoError


@pytest.mark.parametrize(
    "text,expected",
    [("2kB", 2048), ("2KiB", 2048), ("1.5kB", 1536), ("2048B", 2048), ("2048", 2048), ("0.5kb", 512), (" 4 kB ", 4096)],
)
def test_budget_forms(text, expected):
    assert parse_budget(text) == expected


@pytest.mark.parametrize("text", ["abc", "0kB", "0", "-1kB", "2MB", "", "kB", True])  # True: an int to Python, 1 B
def test_bad_budgets_are_user_errors(text):
    with pytest.raises(TinyprotoError):
        parse_budget(text)


@pytest.mark.parametrize("text, words", [("0", "is zero"), ("0kB", "is zero"), ("0.5", "is less than one byte"),
                                         ("0.0004kB", "is less than one byte")])
def test_a_budget_below_one_byte_says_what_it_is(text, words):
    """'0.5' (bytes) rounds down to nothing: it was called zero, which is not what was written."""
    with pytest.raises(TinyprotoError, match=f"'{text}' {words}; give a positive size"):
        parse_budget(text)
