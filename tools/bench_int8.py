#!/usr/bin/env python3
"""int8 against float: test accuracy of every family's deployed int8 model and of its float estimator.

For each (data set, family) it runs `compile` (seed, budget, board as given) into a scratch directory and prints
report.json's float_accuracy and int8_accuracy (both on the fixed 25 % test split) and their difference.

    python tools/make_wide_digits.py --rows 5000 --seed 0 --out /tmp/d5k.npz
    nice -n 10 python tools/bench_int8.py --data digits28 /tmp/d5k.npz [--models flynn bnc] [--budget 2kB]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tinyproto

from tinyproto import families  # noqa: E402
from tinyproto.pipeline.compile import CompileOptions, compile_model  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=["digits28"], help="built-in sets, CSV or .npz files")
    parser.add_argument("--models", nargs="+", default=list(families.names()), help="families (default: all)")
    parser.add_argument("--budget", default="2kB")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"{'data':<14}{'family':<9}{'bytes':>7}{'float %':>9}{'int8 %':>8}{'int8-float':>11}  shape")
    with tempfile.TemporaryDirectory() as tmp:
        for data in args.data:
            for family in args.models:
                out = Path(tmp) / f"{Path(data).stem}-{family}"
                report = compile_model(data, CompileOptions(family, args.budget, args.seed, "uno", out)).report
                f, q = 100 * report["float_accuracy"], 100 * report["int8_accuracy"]
                shape = families.family(family).shape_text(report["hyperparameters"])
                print(f"{Path(data).stem:<14}{family:<9}{report['model_bytes']:>7}{f:>9.2f}{q:>8.2f}{q - f:>+11.2f}"
                      f"  {shape}", flush=True)


if __name__ == "__main__":
    main()
