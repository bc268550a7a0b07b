#!/usr/bin/env python3
"""Benchmark: ProtoNN under budgets on the fixed split (seed 0, 25 % test); prints a table.

    python tools/bench_protonn.py [--data digits breast_cancer] [--budgets 1kB 2kB 4kB 16kB] [--seed 0]

Goals (issue 2): digits @2 kB int8 >= 96 %, int8 loss <= 0.5 pt, search + training <= 20 s.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tinyproto.core.budget import parse_budget
from tinyproto.core.datasets import load_dataset, split
from tinyproto.families.protonn.solver import fit_protonn_under_budget
from tinyproto.families.solving import SolveOptions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", default=["digits", "breast_cancer"])
    parser.add_argument("--budgets", nargs="+", default=["1kB", "2kB", "4kB", "16kB"])
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    header = (f"{'data':<14}{'budget':>8}{'bytes':>7}{'d_hat':>6}{'m':>5}{'s_W':>7}{'float %':>9}{'int8 %':>8}"
              f"{'loss pt':>8}{'train s':>8}")
    print(header)
    print("-" * len(header))
    for name in args.data:
        sp = split(load_dataset(name))
        for budget in args.budgets:
            started = time.perf_counter()
            clf, model, info = fit_protonn_under_budget(sp.X_train, sp.y_train,
                                                        SolveOptions(parse_budget(budget), args.seed))
            seconds = time.perf_counter() - started
            float_acc = 100 * np.mean(clf.predict(sp.X_test) == sp.y_test)
            int8_acc = 100 * np.mean(model.predict(sp.X_test) == sp.y_test)
            chosen = info["chosen"]
            print(f"{name:<14}{budget:>8}{sum(a.nbytes for a in model.carrays()):>7}{chosen['n_components']:>6}"
                  f"{chosen['n_prototypes']:>5}{chosen['sparsity_W']:>7.3f}{float_acc:>9.2f}{int8_acc:>8.2f}"
                  f"{float_acc - int8_acc:>8.2f}{seconds:>8.1f}")


if __name__ == "__main__":
    main()
