"""The model families behind one interface: fit under a budget, and rebuild the integer model from JSON."""

from __future__ import annotations

from typing import Callable

import numpy as np

from tinyproto.errors import TinyprotoError

FAMILIES = ("protonn", "flynn")


def fit_under_budget(
    family: str,
    X_train: np.ndarray,
    y_train: np.ndarray,
    budget_bytes: int,
    seed: int,
    progress: Callable[[str], None] | None = None,
):
    """(fitted float estimator, integer model, solver info) for `family`."""
    if family == "protonn":
        from tinyproto.protonn.solver import fit_protonn_under_budget

        return fit_protonn_under_budget(X_train, y_train, budget_bytes, seed, progress)
    if family == "flynn":
        from tinyproto.flynn.solver import fit_flynn_under_budget

        return fit_flynn_under_budget(X_train, y_train, budget_bytes, seed, progress)
    raise TinyprotoError(f"unknown model {family!r}; choose one of {', '.join(FAMILIES)}")


def int_model_from_json(raw: dict):
    """Rebuild the integer model (and so the host reference) from model.json's `int_model`."""
    family = raw.get("family")
    if family == "protonn":
        from tinyproto.protonn.quantize import IntProtoNN

        return IntProtoNN.from_json(raw)
    if family == "flynn":
        from tinyproto.flynn.quantize import IntFlyNN

        return IntFlyNN.from_json(raw)
    raise TinyprotoError(f"model.json names an unknown model family {family!r}")
