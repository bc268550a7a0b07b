"""Shared fixtures: compiled model directories are built once per session (training takes seconds)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tinyproto.compile import compile_model


def needs(tool: str):
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} not installed")


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
