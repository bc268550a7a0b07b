#!/usr/bin/env python3
"""Fit the ProtoNN cost model's cycles-per-unit constants from measurements on the simulated Uno.

Builds synthetic ProtoNN models whose shapes vary one term at a time (rows, bitmap density, prototypes,
classes, dense W), runs a few random vectors on the cycle-exact simulator, and fits the constants of
the family's cost model.PN_CYCLES by non-negative least squares. Prints the fit and each model's
measured vs predicted cycles. Paste the constants into tinyproto/families/<name>/cost.py when the C code changes.

    python tools/calibrate_costmodel.py
    python tools/calibrate_costmodel.py --flynn MODEL_DIR ...   # FLY_CYCLES from compiled FlyNN models
    python tools/calibrate_costmodel.py --wide     # PN_STREAM_CYCLES: column-coded W, projection offsets
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
from scipy.optimize import nnls

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tinyproto, not another one installed in the environment

from tinyproto.core.boards import load_board  # noqa: E402
from tinyproto.device.build import build_project, render_platformio_ini  # noqa: E402
from tinyproto.families.protonn.cost import PN_CYCLES, protonn_cost_terms  # noqa: E402
from tinyproto.device.protocol import open_device  # noqa: E402
from tinyproto.device.sim import SimulatedUno  # noqa: E402
from tinyproto.core.inputstage import InputStage  # noqa: E402
from tinyproto.families.protonn.quantize import IntProtoNN, kernel_table  # noqa: E402
from tinyproto.core.render import write_sources  # noqa: E402
from tinyproto import families  # noqa: E402

# (features d, d_hat, prototypes m, classes L, W density, table size, projection shift: > 0 right, < 0 left
#  [, kernel gamma])
SHAPES = [
    (16, 4, 8, 2, 0.3, 32, 7), (16, 12, 8, 2, 0.3, 32, 9), (64, 4, 8, 2, 0.3, 32, 10), (64, 4, 8, 2, 0.9, 32, 0),
    (64, 4, 40, 2, 0.3, 32, 3), (64, 4, 8, 10, 0.3, 32, 12), (64, 12, 60, 10, 0.4, 64, 10), (30, 10, 20, 2, 0.2, 32, 9),
    (32, 8, 16, 4, 1.0, 16, -2), (8, 3, 6, 3, 1.0, 16, 8), (64, 20, 100, 10, 0.5, 64, 7), (128, 6, 12, 3, 0.1, 32, 11),
    (64, 40, 40, 3, 0.3, 32, 9), (100, 8, 200, 5, 0.05, 64, 5), (16, 4, 33, 2, 1.0, 16, 14), (20, 36, 10, 2, 1.0, 32, 8),
    (180, 10, 30, 4, 0.1, 32, 10), (13, 5, 7, 2, 0.6, 16, 1), (16, 70, 12, 2, 0.5, 32, 9), (24, 16, 90, 3, 0.3, 32, 6),
    (40, 17, 50, 4, 0.5, 16, 10), (48, 2, 64, 6, 1.0, 64, 16), (64, 12, 60, 10, 0.4, 256, 10),
    (200, 6, 12, 3, 1.0, 32, 12), (96, 10, 20, 4, 0.04, 32, 9), (16, 3, 256, 4, 0.5, 32, 20),
    (30, 12, 30, 2, 1.0, 32, 10), (64, 8, 40, 7, 0.4, 64, 11), (40, 6, 24, 1, 0.5, 32, 9),
    (64, 12, 60, 10, 0.4, 64, 10, 0.002), (30, 30, 20, 2, 0.2, 32, 9, 0.001), (96, 10, 20, 4, 0.1, 32, 9, 0.0005),
    (64, 12, 60, 10, 0.4, 64, 10, 0.01), (16, 200, 20, 2, 1.0, 32, 0), (16, 100, 10, 2, 1.0, 32, 4, 0.0003),
]
N_VECTORS = 6
# Terms held at their hand count (the cycles of the asm instructions, see firmware/tp_protonn.c): left free, nnls
# trades them against the terms they always occur with, and mispredicts shapes unlike the calibration set.
HAND_COUNTS = {"dense_mac": 9, "dense_load": 2, "dense_step": 4, "wide_index_bit": 2, "dist_term": 13, "dist_term_reg": 11,
               "score_term": 8, "score_load": 2, "score_step": 4, "nonzero": 13, "clear_bit": 3, "rshift_asm": 2,
               "mask_step": 6}


def synthetic_model(d: int, D: int, m: int, L: int, density: float, table_size: int, proj_shift: int, *rest) -> IntProtoNN:
    *options, rng = rest
    gamma = options[0] if options else 0.05  # small gamma: a table reaching past 0xFFFF
    W = rng.integers(-127, 128, size=(D, d)) * (rng.random((D, d)) < density)
    B = rng.integers(-60, 61, size=(m, D))
    Z = rng.integers(-127, 128, size=(m, L))
    table, shift = kernel_table(gamma=gamma, b_scale=1.0, size=table_size)
    stage = InputStage.from_standardisation(np.zeros(d), np.ones(d), 1 / 32)
    return IntProtoNN(list(range(L)), stage, W.astype(np.int8), B.astype(np.int8), Z.astype(np.int8),
                      proj_shift=proj_shift, table=table, table_shift=shift, scales={})


def measure(model: IntProtoNN, workdir: Path, rng) -> float:
    write_sources(model, workdir, "synthetic", 0, 1 << 20)
    ini = render_platformio_ini(load_board("uno"))
    if model.n_features > 180:  # the raw-input frame buffer would exceed 1 KB
        ini = ini.replace("-DTP_SIMULATED=1", "-DTP_SIMULATED=1 -DTP_NO_RAW_INPUT=1")
    (workdir / "platformio.ini").write_text(ini)
    try:
        result = build_project(workdir)
    except Exception:  # PlatformIO's shared home can be mid-update by a parallel build: one retry
        result = build_project(workdir)
    cycles = []
    with SimulatedUno(result.elf) as uno, open_device(uno.port) as client:
        for _ in range(N_VECTORS):
            cycles.append(client.predict(rng.integers(-127, 128, size=model.n_features).astype(np.int8)).cycles)
    return float(np.mean(cycles))


def calibrate_flynn(model_dirs: list[Path], n_vectors: int = 40) -> None:
    """FLY_CYCLES from compiled FlyNN model directories (their held-out vectors) on the simulator."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_latency import bench_model

    from tinyproto.families.flynn.cost import FLY_CYCLES, FLY_HAND_COUNTS, FLY_STAGES, flynn_cost_terms
    from tinyproto.core.modeldir import load_model_dir

    names = list(FLY_CYCLES)
    rows, measured, labels, stages = [], [], [], []
    for path in model_dirs:
        model_dir = load_model_dir(path)
        model, vectors = families.load_int_model(model_dir), model_dir.vectors()
        with tempfile.TemporaryDirectory() as tmp:
            r = bench_model(model, vectors.xq[:n_vectors], vectors.scores[:n_vectors], None, Path(tmp))
        assert r["exact"], path
        terms = flynn_cost_terms(model)
        rows.append([terms[n] for n in names])
        measured.append(r["cycles_mean"])
        stages.append(r["stages"])
        labels.append(path.name)
        print(f"{path.name}: {r['cycles_mean']:.0f} cycles  stages {r['stages']}", flush=True)
    # each stage (GPIOR0 markers) against its own terms (the asm hand counts held), then "fixed" as the mean
    # remainder; terms no calibration model exercises keep their current value
    A = np.array(rows, dtype=float)
    fitted = {n: float(FLY_CYCLES[n]) for n in FLY_HAND_COUNTS}
    for stage, group in FLY_STAGES.items():
        free = [n for n in group if n not in FLY_HAND_COUNTS and A[:, names.index(n)].any()]
        held = [n for n in group if n not in free]
        target = np.array([st[stage] for st in stages], dtype=float)
        target -= sum(A[:, names.index(n)] * (fitted.get(n, FLY_CYCLES[n])) for n in held)
        weight = 1.0 / np.maximum(np.array(measured), 1.0)  # relative errors: small models count as much
        values, _ = nnls(A[:, [names.index(n) for n in free]] * weight[:, None], target * weight)
        fitted.update(zip(free, values))
        fitted.update({n: float(FLY_CYCLES[n]) for n in held if n not in fitted})
    rest = [total - sum(st[k] for k in FLY_STAGES) for total, st in zip(measured, stages)]
    fitted["fixed"] = float(np.mean(rest))
    consts = np.array([round(fitted[n]) for n in names], dtype=float)
    print("\nFLY_CYCLES = {")
    for name, value in zip(names, consts):
        print(f'    "{name}": {value:.0f},')
    print("}\n")
    for name, meas, pred in zip(labels, measured, A @ consts):
        print(f"{name:<32}{meas:>10.0f}{pred:>10.0f}{100 * (pred - meas) / meas:>9.1f}")


# (d_hat, kept features, extra nonzeros per feature (None: random density 0.4), shared stage with offset,
#  projection shift, prototypes, classes): column-coded W (one nonzero per feature + extras) and row-major W
# with a projection offset
WIDE_SHAPES = [
    (10, 400, 0.4, True, 12, 40, 10), (12, 300, 0.2, False, 9, 20, 3), (20, 600, 0.5, True, 10, 30, 5),
    (10, 150, 1.0, False, 13, 20, 4), (16, 784, 0.2, True, 6, 20, 3), (8, 400, 0.4, True, 12, 40, 10),
    (6, 300, 0.2, False, 9, 20, 3), (4, 700, 0.1, True, 11, 10, 2), (8, 200, 1.0, False, 8, 30, 4),
    (10, 64, None, True, 10, 40, 10), (5, 20, None, True, 9, 20, 3), (12, 100, None, True, 12, 30, 4),
    (10, 500, 0.0, False, 12, 40, 10), (7, 784, 0.0, True, 12, 30, 10),
    (30, 25, 1.0, False, 8, 6, 2), (40, 60, 0.5, False, 10, 10, 3), (30, 80, 0.3, True, 11, 10, 3),
    (25, 40, 1.0, True, 9, 20, 2), (64, 30, 1.0, False, 12, 8, 2),
]


def wide_model(D: int, d: int, extra, shared: bool, proj_shift: int, m: int, L: int, rng) -> IntProtoNN:
    if extra is None:
        W = rng.integers(-127, 128, size=(D, d)) * (rng.random((D, d)) < 0.4)
    else:
        W = np.zeros((D, d), dtype=np.int64)
        W[rng.integers(0, D, size=d), np.arange(d)] = rng.integers(1, 128, size=d)
        flat = rng.choice(D * d, size=int(extra * d), replace=False)
        W.flat[flat] = rng.integers(1, 128, size=flat.size) * rng.choice([-1, 1], size=flat.size)
    table, shift = kernel_table(gamma=0.05, b_scale=1.0, size=32)
    stage = (InputStage.shared(127.5, 1.0, d) if shared else
             InputStage.from_standardisation(np.zeros(d), np.ones(d), 1 / 32))
    offset = rng.integers(-300, 300, size=D).astype(np.int16) if shared else None
    return IntProtoNN(list(range(L)), stage, W.astype(np.int8), rng.integers(-60, 61, size=(m, D)).astype(np.int8),
                      rng.integers(-127, 128, size=(m, L)).astype(np.int8), proj_shift=proj_shift, table=table,
                      table_shift=shift, scales={}, offset=offset)


def calibrate_wide() -> None:
    """PN_STREAM_CYCLES with PN_CYCLES held: the streamed projection and the offset rescale."""
    from tinyproto.families.protonn.cost import PN_STREAM_CYCLES, predict_cycles

    rng = np.random.default_rng(1)
    names = list(PN_STREAM_CYCLES)
    rows, rest, measured, models = [], [], [], []
    for shape in WIDE_SHAPES:
        model = wide_model(*shape, rng)
        with tempfile.TemporaryDirectory() as tmp:
            cycles = measure(model, Path(tmp), rng)
        terms = protonn_cost_terms(model)
        held = sum(count * PN_CYCLES.get(name, 0) for name, count in terms.items() if name not in PN_STREAM_CYCLES)
        rows.append([terms.get(n, 0) for n in names])
        rest.append(held)
        measured.append(cycles)
        models.append(model)
        print(f"shape {shape} ({model.w_encoding}): {cycles:.0f} cycles", flush=True)
    A, b, held = np.array(rows, dtype=float), np.array(measured), np.array(rest, dtype=float)
    weight = 1.0 / b
    fitted, _ = nnls(A * weight[:, None], (b - held) * weight)
    print("\nPN_STREAM_CYCLES = {")
    for name, value in zip(names, fitted):
        print(f'    "{name}": {round(value)},')
    print("}\n")
    for shape, model, meas, pred in zip(WIDE_SHAPES, models, b, held + A @ np.round(fitted)):
        print(f"{str(shape):<40}{model.w_encoding:>12}{meas:>10.0f}{pred:>10.0f}{100 * (pred - meas) / meas:>9.1f}"
              f"{predict_cycles(model)['total']:>10}")


def main() -> None:
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "--flynn":
        calibrate_flynn([Path(p) for p in sys.argv[2:]])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--wide":
        calibrate_wide()
        return
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
    free = [i for i, n in enumerate(names) if n not in HAND_COUNTS]
    fixed = np.array([HAND_COUNTS.get(n, 0.0) for n in names])
    fitted = fixed.copy()
    weight = 1.0 / b  # relative errors: a small model's error counts as much as a large one's
    fitted[free], _ = nnls(A[:, free] * weight[:, None], (b - A @ fixed) * weight)
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
