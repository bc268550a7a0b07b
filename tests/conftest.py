"""Shared fixtures: compiled model directories are built once per session (training takes seconds)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest

from tinyproto.carray import CTYPES
from tinyproto.compile import compile_model

ARRAY_RE = re.compile(r"^const (\w+) tp_(\w+)\[(\d+)\] PROGMEM = \{(.*?)\};", re.S | re.M)


def needs(tool: str):
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} not installed")


def header_array_bytes(header: str) -> dict[str, int]:
    """Bytes of every array definition in a generated header, counted from its initializer."""
    out = {}
    for ctype, name, count, body in ARRAY_RE.findall(header):
        values = [v for v in body.replace("\n", " ").split(",") if v.strip()]
        assert len(values) == int(count), name
        out[name] = len(values) * CTYPES[ctype][1]
    return out


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """compiled(data, budget, family='protonn', seed=0) -> model directory (cached per session)."""
    cache: dict[tuple, Path] = {}

    def make(data: str, budget: str, family: str = "protonn", seed: int = 0) -> Path:
        key = (data, budget, family, seed)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{family}-{data}-{budget}") / "model"
            compile_model(data, family, budget, seed, "uno", out)
            cache[key] = out
        return cache[key]

    return make


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    """PlatformIO's home, the toolchain package and simuno in a per-module cache, never the user's
    (restored afterwards for other modules)."""
    previous = os.environ.get("TINYPROTO_CACHE")
    os.environ["TINYPROTO_CACHE"] = str(tmp_path_factory.mktemp("tinyproto-cache"))
    yield
    if previous is None:
        os.environ.pop("TINYPROTO_CACHE", None)
    else:
        os.environ["TINYPROTO_CACHE"] = previous
