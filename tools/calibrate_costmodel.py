#!/usr/bin/env python3
"""Fit the ProtoNN cost model's cycles-per-unit constants from measurements on the simulated Uno.

Builds synthetic ProtoNN models whose shapes vary one term at a time (rows, bitmap density, prototypes,
classes, dense W), runs a few random vectors on the cycle-exact simulator, and fits the constants of
tinyproto.device.costmodel.PN_CYCLES by non-negative least squares. Prints the fit and each model's
measured vs predicted cycles. Paste the constants into costmodel.py when the C code changes.

    python tools/calibrate_costmodel.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

from tinyproto.boards import load_board
from tinyproto.device.build import build_project, render_platformio_ini
from tinyproto.device.costmodel import PN_CYCLES, protonn_cost_terms
from tinyproto.device.protocol import open_device
from tinyproto.device.sim import SimulatedUno
from tinyproto.inputstage import InputStage
from tinyproto.protonn.quantize import IntProtoNN, kernel_table
from tinyproto.render import write_sources

# (features d, d_hat, prototypes m, classes L, W density, table size)
SHAPES = [
    (16, 4, 8, 2, 0.3, 32), (16, 12, 8, 2, 0.3, 32), (64, 4, 8, 2, 0.3, 32), (64, 4, 8, 2, 0.9, 32),
    (64, 4, 40, 2, 0.3, 32), (64, 4, 8, 10, 0.3, 32), (64, 12, 60, 10, 0.4, 64), (30, 10, 20, 2, 0.2, 32),
    (32, 8, 16, 4, 1.0, 16), (8, 3, 6, 3, 1.0, 16), (64, 20, 100, 10, 0.5, 64), (128, 6, 12, 3, 0.1, 32),
    (64, 40, 40, 3, 0.3, 32), (100, 8, 200, 5, 0.05, 64), (16, 4, 33, 2, 1.0, 16), (20, 36, 10, 2, 1.0, 32),
    (180, 10, 30, 4, 0.1, 32), (13, 5, 7, 2, 0.6, 16),
]
N_VECTORS = 6


def synthetic_model(d: int, D: int, m: int, L: int, density: float, table_size: int, rng) -> IntProtoNN:
    W = rng.integers(-127, 128, size=(D, d)) * (rng.random((D, d)) < density)
    B = rng.integers(-60, 61, size=(m, D))
    Z = rng.integers(-127, 128, size=(m, L))
    table, shift = kernel_table(gamma=0.05, b_scale=1.0, size=table_size)
    stage = InputStage.from_standardisation(np.zeros(d), np.ones(d), 1 / 32)
    return IntProtoNN(list(range(L)), stage, W.astype(np.int8), B.astype(np.int8), Z.astype(np.int8),
                      proj_shift=7, table=table, table_shift=shift, scales={})


def measure(model: IntProtoNN, workdir: Path, rng) -> float:
    write_sources(model, workdir, "synthetic", 0, 1 << 20)
    (workdir / "platformio.ini").write_text(render_platformio_ini(load_board("uno")))
    try:
        result = build_project(workdir)
    except Exception:  # PlatformIO's shared home can be mid-update by a parallel build: one retry
        result = build_project(workdir)
    cycles = []
    with SimulatedUno(result.elf) as uno, open_device(uno.port) as client:
        for _ in range(N_VECTORS):
            cycles.append(client.predict(rng.integers(-127, 128, size=model.n_features).astype(np.int8)).cycles)
    return float(np.mean(cycles))


def main() -> None:
    rng = np.random.default_rng(0)
    names = list(PN_CYCLES)
    rows, measured = [], []
    for shape in SHAPES:
        model = synthetic_model(*shape, rng)
        with tempfile.TemporaryDirectory() as tmp:
            cycles = measure(model, Path(tmp), rng)
        terms = protonn_cost_terms(model)
        rows.append([terms[n] for n in names])
        measured.append(cycles)
        print(f"shape {shape}: {cycles:.0f} cycles", flush=True)
    A, b = np.array(rows, dtype=float), np.array(measured)
    fitted, _ = nnls(A, b)
    print("\nPN_CYCLES = {")
    for name, value in zip(names, fitted):
        print(f'    "{name}": {round(value)},')
    print("}\n")
    predicted = A @ np.round(fitted)
    print(f"{'shape':<32}{'measured':>10}{'fitted':>10}{'error %':>9}{'current':>10}")
    current = A @ np.array([PN_CYCLES[n] for n in names], dtype=float)
    for shape, meas, pred, cur in zip(SHAPES, b, predicted, current):
        print(f"{str(shape):<32}{meas:>10.0f}{pred:>10.0f}{100 * (pred - meas) / meas:>9.1f}{cur:>10.0f}")


if __name__ == "__main__":
    main()
