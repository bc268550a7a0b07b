"""`--model auto` against the test split: for each data set and seed, every family's validated int8 accuracy and
spread on the shared folds (what auto ranks), its test accuracy, auto's pick and how far it is from the best
family on the test split. Prints one table row per (data set, seed) as it goes.

    python tools/bench_auto.py [--data digits,breast_cancer,wine,segment,digits28] [--seeds 0,1,2] [--budget 2kB]

Auto's pick is fit_best_family's rule (the best validated accuracy; ties: fewer predicted cycles, then bytes),
applied to the same fits; board checks are left out (every family fits the Uno at these sizes).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tinyproto import families
from tinyproto.core.budget import parse_budget
from tinyproto.core.datasets import load_dataset, split
from tinyproto.core.folds import Folds
from tinyproto.families import SolveOptions, default_jobs


def one(data: str, seed: int, budget: int, jobs: int) -> dict:
    sp = split(load_dataset(data))
    options = SolveOptions(budget, seed, n_jobs=jobs, folds=Folds.standard(sp.X_train, sp.y_train, seed))
    rows = {}
    for name in families.names():
        _, model, info = families.fit_under_budget(name, sp.X_train, sp.y_train, options)
        parts = info["chosen_validation"].get("fold_accuracies", [])
        rows[name] = {"val": families.validation_accuracy(info),
                      "spread": float(np.std(parts, ddof=1)) if len(parts) > 1 else 0.0,
                      "test": float(np.mean(model.predict(sp.X_test) == sp.y_test)),
                      "cycles": int(families.predict_cycles(model)["total"]),
                      "bytes": sum(a.nbytes for a in model.carrays())}
    pick = max(rows, key=lambda n: (rows[n]["val"], -rows[n]["cycles"], -rows[n]["bytes"]))
    best = max(rows, key=lambda n: rows[n]["test"])
    return {"rows": rows, "pick": pick, "best": best, "gap": 100 * (rows[best]["test"] - rows[pick]["test"]),
            "folds": options.folds.describe()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="digits,breast_cancer,wine,segment,digits28")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--budget", default="2kB")
    ap.add_argument("--jobs", type=int, default=default_jobs())
    args = ap.parse_args()
    names = families.names()
    print("| data | seed | " + " | ".join(f"{n} val ± spread / test" for n in names) + " | auto | best on test | gap (points) |")
    print("|---" * (len(names) + 5) + "|")
    for data in args.data.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            started = time.perf_counter()
            r = one(data, seed, parse_budget(args.budget), args.jobs)
            cells = [f"{100 * r['rows'][n]['val']:.1f} ± {100 * r['rows'][n]['spread']:.1f} / "
                     f"{100 * r['rows'][n]['test']:.1f}" for n in names]
            print(f"| {data} | {seed} | " + " | ".join(cells) + f" | {r['pick']} | {r['best']} | {r['gap']:.1f} |"
                  f" <!-- {time.perf_counter() - started:.0f} s; {r['folds']} -->", flush=True)


if __name__ == "__main__":
    main()
