#!/usr/bin/env python3
"""BNC on the host, unbudgeted, against a tuned 1-NN (the paper's claim: kNN-level accuracy from binary prototypes).

    python tools/bench_bnc.py [--data digits segment] [--seed 0] [--input-stage feature shared]

Same split as everywhere (stratified, 25 % test, seed 0). 1-NN is tuned by 5-fold cross-validation on the
training split over the input scaling (none / standardised) and the metric (euclidean / manhattan). BNC is tuned
on a stratified 25 % hold-out of the training split over r (bits) and m (prototypes, as a fraction of the training
rows), then refit on the whole training split; the table gives its float test accuracy and that of the int8 model
the device would run (IntBNC, the bit-exact reference of firmware/tp_bnc.c). --input-stage: the int8 input stage
BNC is trained behind, one row per stage ("feature": a mean and gain per feature; "shared": one offset and gain
for all, what the solver may choose on wide inputs such as digits28).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.model_selection import GridSearchCV, train_test_split
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import StandardScaler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tinyproto.core.datasets import load_dataset, split  # noqa: E402
from tinyproto.families.bnc.quantize import IntBNC  # noqa: E402
from tinyproto.families.bnc.train import BNCClassifier  # noqa: E402

BITS = (64, 128, 256)
PROTOTYPE_FRACTIONS = (0.1, 0.3)


def tuned_1nn(X, y, seed: int) -> GridSearchCV:
    pipe = Pipeline([("scale", StandardScaler()), ("knn", KNeighborsClassifier(n_neighbors=1))])
    grid = {"scale": ["passthrough", StandardScaler()], "knn__metric": ["euclidean", "manhattan"]}
    return GridSearchCV(pipe, grid, cv=5).fit(X, y)


def tuned_bnc(X, y, seed: int, input_stage: str = "feature") -> tuple[BNCClassifier, dict]:
    tr, va = train_test_split(np.arange(len(y)), test_size=0.25, stratify=y, random_state=seed)
    best = None
    for r in BITS:
        for fraction in PROTOTYPE_FRACTIONS:
            params = {"n_bits": r, "n_prototypes": max(1, int(fraction * len(tr))), "input_stage": input_stage}
            acc = BNCClassifier(**params, random_state=seed).fit(X[tr], y[tr]).score(X[va], y[va])
            if best is None or acc > best[0]:
                best = (acc, params)
    chosen = dict(best[1], n_prototypes=max(1, int(best[1]["n_prototypes"] * len(y) / len(tr))))
    return BNCClassifier(**chosen, random_state=seed).fit(X, y), chosen


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=["digits", "segment"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--input-stage", nargs="+", default=["feature"], choices=["feature", "shared"])
    args = parser.parse_args()
    print(f"{'data':10} {'stage':8} {'1-NN (tuned)':>13} {'BNC float':>10} {'BNC int8':>9} {'BNC - 1-NN':>11}  "
          "BNC shape, seconds")
    for name in args.data:
        sp = split(load_dataset(name))
        knn = tuned_1nn(sp.X_train, sp.y_train, args.seed)
        knn_acc = knn.score(sp.X_test, sp.y_test)
        for stage in args.input_stage:
            started = time.perf_counter()
            clf, shape = tuned_bnc(sp.X_train, sp.y_train, args.seed, stage)
            float_acc = clf.score(sp.X_test, sp.y_test)
            int8_acc = float(np.mean(IntBNC.from_classifier(clf).predict(sp.X_test) == sp.y_test))
            print(f"{name:10} {stage:8} {100 * knn_acc:12.2f}% {100 * float_acc:9.2f}% {100 * int8_acc:8.2f}% "
                  f"{100 * (int8_acc - knn_acc):+10.2f}  r={shape['n_bits']} m={shape['n_prototypes']}, "
                  f"{time.perf_counter() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
