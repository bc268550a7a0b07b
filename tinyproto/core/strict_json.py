"""JSON as tinyproto writes it, and nothing else: the parser for the files a model is rebuilt from.

json.loads accepts NaN and Infinity, turns 1e400 into inf, keeps the last of two equal keys and lets lone
surrogate escapes through; each of those would reach an int(), a float() or a header writer later as a value no
tinyproto run wrote. check_fields: the kind of every value a verb reads from such a file (a count, a fraction,
text), checked before it is used. Layer: core.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tinyproto.core.errors import TinyprotoError


def loads(text: str) -> object:
    """json.loads, refusing (ValueError / UnicodeError) what tinyproto never writes."""
    data = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                      object_pairs_hook=_unique_keys)
    _check_text(data)
    return data


def loads_unique_keys(text: str | bytes) -> object:
    """json.loads for every other file tinyproto wrote (build.json, validation.json, sweep.json, the journals,
    the manifest): it may hold NaN, but a key given twice is refused (ValueError), never read as the parser's
    pick of the two values."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a number tinyproto writes")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:24]} is beyond float64")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    data: dict = {}
    for key, value in pairs:
        if key in data:
            raise ValueError(f"key {key[:40]!r} appears twice")
        data[key] = value
    return data


def _check_text(value: object) -> None:
    """Every string (keys included) encodes as UTF-8: a lone surrogate would fail in the writer of a header."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            item.encode("utf-8")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def kind_ok(value: object, kind: str) -> bool:
    if kind == "text":
        return isinstance(value, str)
    if kind == "object":
        return isinstance(value, dict)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 2**53:
        return False  # range first: math.isfinite() of a huge int raises OverflowError
    return (kind != "count" or isinstance(value, int)) and (kind != "fraction" or value <= 1)


def check_fields(doc: dict, fields: dict[str, str], file: Path, optional: set[str] = frozenset(),
                 advice: str = "run the command that wrote it again") -> None:
    """One clear error unless every dotted key of `fields` holds a value of its kind in `doc`."""
    for key, kind in fields.items():
        value: object = doc
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if value is None and key in optional:
            continue
        if not kind_ok(value, kind):
            shown = json.dumps(value)[:24] if not isinstance(value, float) else str(value)
            what = {"text": "text", "object": "an object", "count": "a whole number >= 0",
                    "fraction": "a fraction in 0..1", "amount": "a number >= 0"}[kind]
            raise TinyprotoError(f"{file} is damaged: {key} is {shown}, not {what}; {advice}")
