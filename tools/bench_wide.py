#!/usr/bin/env python3
"""Wide-input benchmark: ProtoNN on digits28 / digits16 (stand-ins for MNIST / USPS) and the narrow sets, each
run bit-exactly on the simulated Uno (every held-out vector, int8, through the device app built with
TP_NO_RAW_INPUT so only the kept features' int8 frame is buffered), plus the training time of a 10,000 x 784
CSV. Prints one table; --json writes the rows.

    python tools/bench_wide.py [--rows digits28:2kB digits28:1kB ...] [--csv-rows 10000] [--json out.json]

Until the chunked serial transport (branch `stream`) lands, `tinyproto compile` refuses 784-pixel models for
their raw-float frame's SRAM; this script measures the same solver's models on the device through int8 frames.
Columns: stage = the input stage the solver chose (feature: 4 B/kept feature; shared: 4 B; folded: shared +
2 B per projected dimension), W = its encoding, kept = features the model reads / the data's width, host =
int8 accuracy of the numpy reference on the 25 % test split, device = the simulated Uno's accuracy (exact:
every score vector equals the host's), cycles = mean measured tp_predict cycles (pred = the cost model),
SRAM = static + measured stack peak, train = solver wall time (s).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tinyproto.core.boards import load_board  # noqa: E402
from tinyproto.core.budget import parse_budget  # noqa: E402
from tinyproto.core.datasets import load_dataset, split  # noqa: E402
from tinyproto.core.render import write_sources  # noqa: E402
from tinyproto.device.build import build_project, render_platformio_ini  # noqa: E402
from tinyproto.device.protocol import open_device  # noqa: E402
from tinyproto.device.sim import SimulatedUno  # noqa: E402
from tinyproto.families import fit_under_budget, predict_cycles  # noqa: E402
from tinyproto.families.solving import SolveOptions  # noqa: E402

DEFAULT_ROWS = ["digits28:2kB", "digits28:1kB", "digits16:2kB", "digits:2kB", "breast_cancer:1kB",
                "breast_cancer:2kB"]


def device_run(model, xq: np.ndarray, workdir: Path) -> dict:
    """Build the model's firmware (int8 frames only) and run every vector on the simulated Uno."""
    write_sources(model, workdir, "bench", 0, 1 << 20)
    ini = render_platformio_ini(load_board("uno")).replace("-DTP_SIMULATED=1", "-DTP_SIMULATED=1 -DTP_NO_RAW_INPUT=1")
    (workdir / "platformio.ini").write_text(ini)
    try:
        build = build_project(workdir, "uno_sim")
    except Exception:  # PlatformIO's shared home can be mid-update by a parallel build: one retry
        build = build_project(workdir, "uno_sim")
    with SimulatedUno(build.elf) as uno, open_device(uno.port) as client:
        predictions = [client.predict(x) for x in xq]
        stats = client.stats()
    return {"scores": np.array([p.scores for p in predictions], dtype=np.int64),
            "labels": np.array([p.label for p in predictions]),
            "cycles": np.array([p.cycles for p in predictions], dtype=np.float64),
            "sram": int(stats.static_sram + stats.stack_peak), "flash": build.sizes.flash_bytes}


def bench_row(data: str, budget: str, seed: int = 0) -> dict:
    dataset = load_dataset(data)
    sp = split(dataset)
    started = time.perf_counter()
    _, model, info = fit_under_budget("protonn", sp.X_train, sp.y_train, SolveOptions(parse_budget(budget), seed))
    train_s = time.perf_counter() - started
    xq = model.input_stage.quantize(sp.X_test)
    reference = model.scores(xq)
    classes = np.asarray(model.classes)
    y_index = np.array([int(np.flatnonzero(classes == v)[0]) for v in sp.y_test])
    host_acc = float(np.mean(model.labels(reference) == y_index))
    with tempfile.TemporaryDirectory() as tmp:
        run = device_run(model, xq, Path(tmp))
    exact = bool(np.array_equal(run["scores"], reference) and np.array_equal(run["labels"], model.labels(reference)))
    chosen = info["chosen"]
    return {
        "data": data, "budget": budget, "stage": chosen.get("input_stage", "feature"), "w_encoding": model.w_encoding,
        "kept": model.n_features, "width": dataset.X.shape[1], "d_hat": chosen["n_components"],
        "m": chosen["n_prototypes"], "nnz_W": int(np.count_nonzero(model.W_q)),
        "bytes": sum(a.nbytes for a in model.carrays()), "host_accuracy": host_acc,
        "device_accuracy": float(np.mean(run["labels"] == y_index)), "exact": exact, "n_test": len(y_index),
        "cycles": float(run["cycles"].mean()), "ms": float(run["cycles"].mean()) / 16_000.0,
        "predicted_cycles": int(predict_cycles(model)["total"]), "sram": run["sram"], "train_s": round(train_s, 1),
    }


def csv_training(rows: int, budget: str = "2kB") -> dict:
    """Train on a rows x 784 CSV (digits28 rows resampled with a seed): load + solver, wall and CPU seconds."""


    data = load_dataset("digits28")
    rng = np.random.default_rng(0)
    pick = rng.integers(0, len(data.y), size=rows)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "wide.csv"
        with path.open("w") as out:
            out.write(",".join(f"p{i}" for i in range(784)) + ",label\n")
            for row, label in zip(data.X[pick].astype(int), data.y[pick]):
                out.write(",".join(map(str, row)) + f",{label}\n")
        started = time.perf_counter()
        cpu0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
        sp = split(load_dataset(str(path)))
        loaded = time.perf_counter() - started
        # one process (n_jobs=1), so that the CPU time below is all of it
        _, model, info = fit_under_budget("protonn", sp.X_train, sp.y_train,
                                          SolveOptions(parse_budget(budget), 0, n_jobs=1))
        wall = time.perf_counter() - started
        cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu0
    return {"rows": rows, "budget": budget, "load_s": round(loaded, 1), "wall_s": round(wall, 1),
            "cpu_s": round(cpu, 1), "bytes": sum(a.nbytes for a in model.carrays()),
            "stage": info["chosen"].get("input_stage"), "w_encoding": model.w_encoding}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="*", default=DEFAULT_ROWS, help="DATA:BUDGET pairs")
    parser.add_argument("--csv-rows", type=int, default=10_000, help="rows of the 784-column CSV (0: skip)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = []
    head = (f"{'data':<14}{'budget':>7}{'stage':>8}{'W':>12}{'kept':>10}{'d^':>4}{'m':>5}{'nnz':>6}{'bytes':>6}"
            f"{'host %':>8}{'device %':>9}{'exact':>6}{'cycles':>8}{'pred':>8}{'ms':>6}{'SRAM':>6}{'train s':>8}")
    print(head)
    print("-" * len(head))
    for spec in args.rows:
        data, budget = spec.split(":")
        r = bench_row(data, budget)
        results.append(r)
        print(f"{r['data']:<14}{r['budget']:>7}{r['stage']:>8}{r['w_encoding']:>12}{r['kept']:>5}/{r['width']:<4}"
              f"{r['d_hat']:>4}{r['m']:>5}{r['nnz_W']:>6}{r['bytes']:>6}{100 * r['host_accuracy']:>8.2f}"
              f"{100 * r['device_accuracy']:>9.2f}{'yes' if r['exact'] else 'NO':>6}{r['cycles']:>8.0f}"
              f"{r['predicted_cycles']:>8}{r['ms']:>6.2f}{r['sram']:>6}{r['train_s']:>8.1f}", flush=True)
    if args.csv_rows:
        c = csv_training(args.csv_rows)
        results.append(c)
        print(f"\n{c['rows']:,} x 784 CSV at {c['budget']}: load + split {c['load_s']} s, load + train "
              f"{c['wall_s']} s wall, {c['cpu_s']} s CPU in one process ({c['bytes']} B, {c['stage']} stage, "
              f"W {c['w_encoding']})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
