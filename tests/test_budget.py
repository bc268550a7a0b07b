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


@pytest.mark.parametrize("text", ["abc", "0kB", "0", "-1kB", "2MB", "", "kB"])
def test_bad_budgets_are_user_errors(text):
    with pytest.raises(TinyprotoError):
        parse_budget(text)
