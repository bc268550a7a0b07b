"""`--model auto` against the test split: for each data set and seed, every family's validated int8 accuracy and
spread on the shared folds (what auto ranks), its test accuracy, auto's pick and how far it is from the best
family on the test split. Prints one table row per (data set, seed) as it goes.

    python tools/bench_auto.py [--data digits,breast_cancer,wine,segment,digits28] [--seeds 0,1,2] [--budget 2kB]

Auto's pick is fit_best_family's rule (tinyproto/families/choosing.py: the families within one standard error
of the best validated accuracy are tied, and the fewest predicted cycles, then bytes, wins among them), applied to
the same fits; "best val" is the family with the best validated accuracy alone (the rule before ties were
counted), for comparison. Board checks are left out (every family fits the Uno at these sizes). --json FILE
appends each (data set, seed)'s figures as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from tinyproto import families
from tinyproto.core.budget import parse_budget
from tinyproto.core.datasets import load_dataset, split
from tinyproto.core.folds import Folds
from tinyproto.families import SolveOptions, choosing, default_jobs


def one(data: str, seed: int, budget: int, jobs: int) -> dict:
    sp = split(load_dataset(data))
    options = SolveOptions(budget, seed, n_jobs=jobs, folds=Folds.standard(sp.X_train, sp.y_train, seed))
    rows = {}
    for name in families.names():
        _, model, info = families.fit_under_budget(name, sp.X_train, sp.y_train, options)
        parts = info["chosen_validation"].get("fold_accuracies", [])
        rows[name] = {"family": name, "val_int8_accuracy": families.validation_accuracy(info), "parts": parts,
                      "spread": float(np.std(parts, ddof=1)) if len(parts) > 1 else 0.0,
                      "test": float(np.mean(model.predict(sp.X_test) == sp.y_test)),
                      "predicted_cycles": int(families.predict_cycles(model)["total"]),
                      "model_bytes": sum(a.nbytes for a in model.carrays())}
    n_rows = options.folds.n_validated_rows()
    pick = choosing.choose(list(rows.values()), n_rows)["family"]
    best_val = max(rows, key=lambda n: rows[n]["val_int8_accuracy"])
    best = max(rows, key=lambda n: rows[n]["test"])
    return {"data": data, "seed": seed, "rows": rows, "pick": pick, "best_val": best_val, "best": best,
            "tied": [r["family"] for r in choosing.tied_with_best(list(rows.values()), n_rows)],
            "validated_rows": n_rows, "gap": 100 * (rows[best]["test"] - rows[pick]["test"]),
            "gap_best_val": 100 * (rows[best]["test"] - rows[best_val]["test"]), "folds": options.folds.describe()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="digits,breast_cancer,wine,segment,digits28")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--budget", default="2kB")
    ap.add_argument("--jobs", type=int, default=default_jobs())
    ap.add_argument("--json", type=Path, default=None, help="append every run's figures here, one JSON line each")
    args = ap.parse_args()
    names = families.names()
    print("| data | seed | " + " | ".join(f"{n} val ± spread / test" for n in names)
          + " | tied (1 s.e.) | auto | gap | best val | gap | best on test |")
    print("|---" * (len(names) + 8) + "|")
    for data in args.data.split(","):
        for seed in [int(s) for s in args.seeds.split(",")]:
            started = time.perf_counter()
            r = one(data, seed, parse_budget(args.budget), args.jobs)
            cells = [f"{100 * r['rows'][n]['val_int8_accuracy']:.1f} ± {100 * r['rows'][n]['spread']:.1f} / "
                     f"{100 * r['rows'][n]['test']:.1f}" for n in names]
            print(f"| {data} | {seed} | " + " | ".join(cells) + f" | {', '.join(r['tied'])} | {r['pick']} | "
                  f"{r['gap']:.1f} | {r['best_val']} | {r['gap_best_val']:.1f} | {r['best']} |"
                  f" <!-- {time.perf_counter() - started:.0f} s; {r['folds']}; {r['validated_rows']} rows -->",
                  flush=True)
            if args.json is not None:
                with args.json.open("a") as out:
                    out.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
