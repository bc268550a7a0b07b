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
    max_latency_ms: float | None = None,
    f_cpu_hz: int = 16_000_000,
):
    """(fitted float estimator, integer model, solver info) for `family`; with max_latency_ms, only models whose
    predicted cycles per inference (tinyproto.device.costmodel) fit that many ms at f_cpu_hz."""
    if family == "protonn":
        from tinyproto.protonn.solver import fit_protonn_under_budget

        return fit_protonn_under_budget(X_train, y_train, budget_bytes, seed, progress, max_latency_ms, f_cpu_hz)
    if family == "flynn":
        from tinyproto.flynn.solver import fit_flynn_under_budget

        if max_latency_ms is None:
            return fit_flynn_under_budget(X_train, y_train, budget_bytes, seed, progress)
        return fit_flynn_under_budget(X_train, y_train, budget_bytes, seed, progress, max_inference_ms=max_latency_ms,
                                      f_cpu=f_cpu_hz, exact_latency=True)
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
