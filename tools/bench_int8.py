#!/usr/bin/env python3
"""int8 against float: test accuracy of every family's deployed int8 model and of its float estimator.

For each (data set, family, seed) it runs `compile` (budget, board as given) into a scratch directory and prints
report.json's float_accuracy and int8_accuracy (both on the fixed 25 % test split), the rows each got right, the
rows where the two disagree, and the shape. `--quick` runs the family's solver on the same split and scores the
same float estimator and host int8 reference without writing a model directory (no confidence stage: the same
model, in less time).

    python tools/make_wide_digits.py --rows 5000 --seed 0 --out /tmp/d5k.npz
    python tools/make_sensor_windows.py --rows 2000 --samples 500 --seed 3 --out /tmp/windows.npz
    nice -n 10 python tools/bench_int8.py --data digits28 /tmp/d5k.npz [--models flynn bnc] [--budget 2kB]
    nice -n 10 python tools/bench_int8.py --quick --data /tmp/windows.npz --models bnc --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tinyproto

from tinyproto import families  # noqa: E402
from tinyproto.core.budget import parse_budget  # noqa: E402
from tinyproto.core.datasets import load_dataset, split  # noqa: E402
from tinyproto.families.solving import SolveOptions  # noqa: E402
from tinyproto.pipeline.compile import CompileOptions, compile_model  # noqa: E402


def quick(data: str, family: str, budget: str, seed: int) -> tuple[int, int, int, int, dict, int]:
    """(float right, int8 right, disagreeing rows, test rows, chosen, model bytes) from the solver alone."""
    sp = split(load_dataset(data))
    clf, model, info = families.fit_under_budget(family, sp.X_train, sp.y_train,
                                                 SolveOptions(parse_budget(budget), seed))
    float_pred = clf.predict(sp.X_test)
    int8_pred = np.asarray(model.classes)[model.labels(model.scores(model.input_stage.quantize(sp.X_test)))]
    return (int(np.sum(float_pred == sp.y_test)), int(np.sum(int8_pred == sp.y_test)),
            int(np.sum(float_pred != int8_pred)), len(sp.y_test), info["chosen"],
            sum(a.nbytes for a in model.carrays()))


def compiled(data: str, family: str, budget: str, seed: int, tmp: str) -> tuple[int, int, int, int, dict, int]:
    out = Path(tmp) / f"{Path(data).stem}-{family}-{seed}"
    report = compile_model(data, CompileOptions(family, budget, seed, "uno", out)).report
    n = int(report["n_test"])
    return (round(report["float_accuracy"] * n), round(report["int8_accuracy"] * n),
            round((1 - report["int8_float_agreement"]) * n), n, report["hyperparameters"], int(report["model_bytes"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=["digits28"], help="built-in sets, CSV or .npz files")
    parser.add_argument("--models", nargs="+", default=list(families.names()), help="families (default: all)")
    parser.add_argument("--budget", default="2kB")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--quick", action="store_true", help="the solver and host reference only, no directory")
    args = parser.parse_args()
    print(f"{'data':<14}{'family':<9}{'seed':>5}{'bytes':>7}{'float %':>9}{'int8 %':>8}{'int8-float':>11}"
          f"{'right f/q of n':>17}{'differ':>7}  shape")
    with tempfile.TemporaryDirectory() as tmp:
        for data in args.data:
            for family in args.models:
                for seed in args.seeds:
                    if args.quick:
                        right_f, right_q, differ, n, chosen, nbytes = quick(data, family, args.budget, seed)
                    else:
                        right_f, right_q, differ, n, chosen, nbytes = compiled(data, family, args.budget, seed, tmp)
                    f, q = 100 * right_f / n, 100 * right_q / n
                    shape = families.family(family).shape_text(chosen) or " ".join(
                        f"{k}={v}" for k, v in chosen.items() if k != "random_state")
                    print(f"{Path(data).stem:<14}{family:<9}{seed:>5}{nbytes:>7}{f:>9.2f}{q:>8.2f}{q - f:>+11.2f}"
                          f"{f'{right_f}/{right_q} of {n}':>17}{differ:>7}  {shape}", flush=True)


if __name__ == "__main__":
    main()
