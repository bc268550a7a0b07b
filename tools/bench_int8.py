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
    nice -n 5 python tools/bench_int8.py --quick --panel --seeds 0 1 2        # the panel below, every family

`--panel` adds the sets of PANEL, made here (no download): narrow tables (river's banana and phishing,
breast_cancer, wine, segment, make_classification at several seeds, cluster counts and difficulties), sensor
windows of 200 to 700 samples per axis (tools/make_sensor_windows.py) and images (digits28, the 5,000 x 784 set of
tools/make_wide_digits.py). Each row prints the test accuracy of the float estimator and of the int8 model, their
gap (int8 - float), the gap's standard error paired over the test rows (the standard deviation of each row's
int8-right minus float-right, over the square root of the rows), the labels the two agree on, and the shape; the
closing table gives, per family, the mean gap over the panel and how many rows are more than 1 point below float
and more than two standard errors below zero.

`--stages` (FlyNN, with `--quick`) scores the solver's chosen shape stage by stage on the same test rows: the
float model; the same on the int8-rounded inputs (each dequantized through the stage); the integer hash of the
int8 inputs (the device's, mirror -x since model format 8) with its unsaturated counts; the counts' linear b-bit
codes min(t // q, 2^b - 1) through decay_lut's weights (what FlyNN shipped before the
calibrated lut and, with q > 1, the logarithmic codes); the deployed int8 model; then two lines not shipped, each
compared with the line it varies instead of the line before: the integer hash with the one's complement mirror
~x = -x - 1 of model format 7 (against the device's hash), and, with b > 1, b-bit codes whose edges are a
weighted 1-D k-means of the float weights (1 - c)^(t/q) of the training counts, each (class, bit) weighted as
the calibrated lut weighs it, and a lut of the clusters' means (against the deployed model: what code edges
fitted to the counts would give at this shape). Each line gives the accuracy, and the gap and label agreement
against the line before (or the line it varies) and against the float model.

    nice -n 5 python tools/bench_int8.py --quick --stages --panel mc12x4c3 win600s --models flynn --seeds 1
"""

from __future__ import annotations

import argparse
import gzip
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout's tinyproto
sys.path.insert(0, str(REPO / "tools"))  # the generators of sensor windows and 784-pixel digits

from tinyproto import families  # noqa: E402
from tinyproto.core.budget import parse_budget  # noqa: E402
from tinyproto.core.datasets import load_dataset, split  # noqa: E402
from tinyproto.families.solving import SolveOptions  # noqa: E402
from tinyproto.pipeline.compile import CompileOptions, compile_model  # noqa: E402


# ---------------------------------------------------------------- the panel: sets unlike digits, made offline


def _river_file(name: str) -> Path:
    import river

    return Path(river.__file__).parent / "datasets" / name


def _banana() -> tuple[np.ndarray, np.ndarray]:
    """river's banana (5,300 x 2, 2 classes), from its LIBSVM-format text."""
    with zipfile.ZipFile(_river_file("banana.zip")) as zf:
        lines = zf.read("banana.all.txt").decode().split("\n")
    rows = [line.split() for line in lines if line.strip()]
    X = np.array([[float(field.split(":")[1]) for field in row[1:]] for row in rows])
    return X, np.array([int(row[0]) for row in rows])


def _phishing() -> tuple[np.ndarray, np.ndarray]:
    """river's phishing (1,250 x 9, 2 classes), label last."""
    with gzip.open(_river_file("phishing.csv.gz"), "rt") as f:
        rows = [line.strip().split(",") for line in f.read().splitlines()[1:] if line.strip()]
    table = np.array(rows, dtype=np.float64)
    return table[:, :-1], table[:, -1].astype(np.int64)


def _classification(n: int, d: int, informative: int, classes: int, clusters: int, seed: int,
                    flip: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification

    return make_classification(n_samples=n, n_features=d, n_informative=informative, n_classes=classes,
                               n_clusters_per_class=clusters, flip_y=flip, random_state=seed)


def _windows(rows: int, samples: int, seed: int, spikes: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    from make_sensor_windows import sensor_windows

    return sensor_windows(rows, samples, seed, spikes)


def _wide_digits(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    from make_wide_digits import wide_digits

    return wide_digits(rows, seed)


# name -> how the set is made; a built-in set's name is its own (the compile loads it)
PANEL = {
    "banana": _banana,
    "phishing": _phishing,
    "breast_cancer": None,
    "wine": None,
    "segment": None,
    "mc40x5c3": lambda: _classification(3000, 40, 10, 5, 3, 1),  # like issue 31's low-accuracy set
    "mc20x3c2": lambda: _classification(2000, 20, 6, 3, 2, 2),
    "mc12x4c3": lambda: _classification(3000, 12, 4, 4, 3, 3, flip=0.1),  # noisy labels, low accuracy
    "mc30x6c2": lambda: _classification(1500, 30, 5, 6, 2, 4),
    "mc8x2c4": lambda: _classification(2400, 8, 5, 2, 4, 5),
    "win200": lambda: _windows(1000, 200, 1),  # 600 features
    "win600s": lambda: _windows(800, 600, 2, spikes=0.01),  # 1,800 features, single-sample shocks
    "win700": lambda: _windows(600, 700, 4),  # 2,100 features
    "digits28": None,
    "digits5k": lambda: _wide_digits(5000, 0),  # 5,000 x 784
}


def panel_files(names: list[str], tmp: str) -> list[str]:
    """The data arguments for PANEL's `names`: a built-in name as it is, any other written to an .npz in tmp."""
    out = []
    for name in names:
        make = PANEL[name]
        if make is None:
            out.append(name)
            continue
        X, y = make()
        path = Path(tmp) / f"{name}.npz"
        np.savez(path, X=np.asarray(X, dtype=np.float64), y=np.asarray(y))
        out.append(str(path))
    return out


# ---------------------------------------------------------------- one (data, family, seed) point


def quick(data: str, family: str, budget: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict, int]:
    """(float right, int8 right, labels equal: bool per test row; chosen; model bytes) from the solver alone."""
    sp = split(load_dataset(data))
    clf, model, info = families.fit_under_budget(family, sp.X_train, sp.y_train,
                                                 SolveOptions(parse_budget(budget), seed))
    float_pred = clf.predict(sp.X_test)
    int8_pred = np.asarray(model.classes)[model.labels(model.scores(model.input_stage.quantize(sp.X_test)))]
    return (float_pred == sp.y_test, int8_pred == sp.y_test, float_pred == int8_pred, info["chosen"],
            sum(a.nbytes for a in model.carrays()))


def compiled(data: str, family: str, budget: str, seed: int, tmp: str) -> tuple[int, int, int, int, dict, int]:
    out = Path(tmp) / f"{Path(data).stem}-{family}-{seed}"
    report = compile_model(data, CompileOptions(family, budget, seed, "uno", out)).report
    n = int(report["n_test"])
    return (round(report["float_accuracy"] * n), round(report["int8_accuracy"] * n),
            round((1 - report["int8_float_agreement"]) * n), n, report["hyperparameters"], int(report["model_bytes"]))


def _dequantized(stage, xq: np.ndarray) -> np.ndarray:
    """Raw values whose rounding through `stage` gives xq (the int8 inputs' float view)."""
    t = np.asarray(xq, dtype=np.float64) + (stage.centre if stage.kind == "centred" else 0.0)
    return t / stage.gain.astype(np.float64) + stage.mean.astype(np.float64)


def flynn_stages(data: str, budget: str, seed: int) -> tuple[list[tuple[str, np.ndarray]], np.ndarray, str]:
    """([(stage, predicted class index per test row)], true class index per row, shape) of FlyNN's chosen shape."""
    from tinyproto.families.flynn.hashing import count_winners, project, projection_matrix, top_winners
    from tinyproto.families.flynn.quantize import decay_lut, integer_winners

    sp = split(load_dataset(data))
    clf, model, info = families.fit_under_budget("flynn", sp.X_train, sp.y_train,
                                                 SolveOptions(parse_budget(budget), seed))
    y_train, y_test = (np.searchsorted(clf.classes_, y) for y in (sp.y_train, sp.y_test))
    stage, L, m, q = model.input_stage, clf.classes_.size, clf.n_hashes_, model.count_scale
    xq_train, xq_test = (stage.quantize(X).astype(np.int64) for X in (sp.X_train, sp.X_test))

    def float_weights(counts: np.ndarray) -> np.ndarray:
        return (counts < q).astype(np.float64) if model.bits == 1 else np.power(1.0 - clf.decay, counts / q)

    def predicted(w_train: np.ndarray, w_test: np.ndarray, weigh) -> np.ndarray:
        weights = weigh(count_winners(w_train, y_train, L, m))
        return np.argmin(weights[:, w_test].sum(axis=2).T, axis=1)

    def complement_winners(xq: np.ndarray) -> np.ndarray:  # the mirror ~x of model format 7
        u = np.hstack([xq, -xq - 1]) if model.sign_split else xq
        return top_winners(project(u, projection_matrix(model.indices, u.shape[1])).astype(np.int64), model.n_winners)

    device = [integer_winners(x, model.indices, model.n_winners, model.sign_split) for x in (xq_train, xq_test)]
    stages = [
        ("float model", np.searchsorted(clf.classes_, clf.predict(sp.X_test))),
        ("float, int8-rounded inputs", predicted(clf.winners(_dequantized(stage, xq_train)),
                                                 clf.winners(_dequantized(stage, xq_test)), float_weights)),
        ("integer hash, mirror -x", predicted(*device, float_weights)),
        (f"{model.bits}-bit linear codes, decay_lut", predicted(*device, linear_codes_through(
            decay_lut(clf.decay, model.bits), q, model.bits))),
        ("int8 model (deployed)", model.labels(model.scores(xq_test))),
        (NOT_SHIPPED, predicted(complement_winners(xq_train), complement_winners(xq_test), float_weights)),
    ]
    if model.bits > 1:
        stages.append((FITTED_CODES, predicted(*device, fitted_codes(clf.decay, q, model.bits, y_train, device[0],
                                                                     L, m))))
    luts = "" if model.bits == 1 else (f", lut {model.lut.tolist()} (decay_lut: "
                                       f"{decay_lut(clf.decay, model.bits).tolist()})")
    return stages, y_test, families.family("flynn").shape_text(info["chosen"]) + f", {stage.kind} stage" + luts


def linear_codes_through(lut: np.ndarray, q: int, bits: int):
    """Weights through the linear codes min(t // q, 2^bits - 1) and `lut` (FlyNN's codes and lut before the
    calibrated lut and the logarithmic codes of a count scale)."""
    cap = (1 << bits) - 1
    if bits == 1:
        return lambda counts: (np.minimum(counts // q, cap) == 0).astype(np.float64)
    return lambda counts: lut[np.minimum(counts // q, cap)].astype(np.float64)


def fitted_codes(decay: float, q: int, bits: int, y_train: np.ndarray, winners: np.ndarray, L: int, m: int):
    """Weights through b-bit codes with fitted edges (not shipped): the distinct training counts t ordered, their
    float weights (1 - c)^(t/q) clustered into 2^b groups of consecutive counts by a weighted 1-D k-means (each
    (class, bit) entry weighing as often as the training rows' winners read it, as calibrated_lut weighs it;
    started at the weighted quantiles), each group's weight its mean rounded to the lut's 1/255 steps."""
    from tinyproto.families.flynn.hashing import count_winners

    raw = count_winners(winners, y_train, L, m)
    reads = np.broadcast_to(raw.sum(axis=0, keepdims=True), raw.shape).reshape(-1).astype(np.float64)
    values, where = np.unique(raw.reshape(-1), return_inverse=True)
    weight = np.bincount(where, weights=reads, minlength=len(values))
    x = np.power(1.0 - decay, values / q)
    levels = 1 << bits
    cdf = np.cumsum(weight) / max(weight.sum(), 1.0)
    centres = x[np.minimum(np.searchsorted(cdf, (np.arange(levels) + 0.5) / levels), len(x) - 1)].copy()
    for _ in range(50):
        code = np.argmin(np.abs(x[:, None] - centres[None, :]), axis=1)
        for k in range(levels):
            if weight[code == k].sum() > 0:
                centres[k] = np.average(x[code == k], weights=weight[code == k])
    code = np.argmin(np.abs(x[:, None] - centres[None, :]), axis=1)
    lut = np.round(255 * centres)[code]  # the weight of each distinct count
    table = dict(zip(values.tolist(), lut.tolist()))
    return lambda counts: np.vectorize(lambda t: table.get(int(t), lut[-1]), otypes=[np.float64])(counts)


NOT_SHIPPED = "format 7's mirror ~x (vs -x)"  # stage lines compared with the line they vary, not the line before
FITTED_CODES = "fitted code edges (vs deployed)"
COMPARED_WITH = {NOT_SHIPPED: "integer hash, mirror -x", FITTED_CODES: "int8 model (deployed)"}


def print_stages(data: str, budget: str, seed: int) -> None:
    stages, y, shape = flynn_stages(data, budget, seed)
    print(f"{Path(data).stem} flynn seed {seed}: {shape}")
    float_ok, before = stages[0][1] == y, stages[0][1]
    for name, labels in stages:
        if name in COMPARED_WITH:
            before = dict(stages)[COMPARED_WITH[name]]
        ok = labels == y
        prev_ok = before == y
        print(f"  {name:<32}{100 * ok.mean():>7.2f} %   vs the line before {100 * (ok.mean() - prev_ok.mean()):+6.2f}"
              f" (se {paired_se(prev_ok, ok):.2f}, agree {100 * np.mean(labels == before):6.2f} %)   vs float"
              f" {100 * (ok.mean() - float_ok.mean()):+6.2f} (se {paired_se(float_ok, ok):.2f})", flush=True)
        before = labels


def paired_se(right_f: np.ndarray, right_q: np.ndarray) -> float:
    """Standard error (in points) of the mean of int8-right minus float-right over the same rows."""
    d = right_q.astype(np.float64) - right_f.astype(np.float64)
    return 100.0 * float(np.std(d, ddof=1)) / np.sqrt(d.size) if d.size > 1 else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", nargs="+", default=[], help="built-in sets, CSV or .npz files")
    parser.add_argument("--panel", nargs="*", default=None, metavar="NAME",
                        help=f"the panel's sets (default: all of {', '.join(PANEL)})")
    parser.add_argument("--models", nargs="+", default=list(families.names()), help="families (default: all)")
    parser.add_argument("--budget", default="2kB")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--quick", action="store_true", help="the solver and host reference only, no directory")
    parser.add_argument("--stages", action="store_true", help="FlyNN with --quick: the chosen shape stage by stage")
    args = parser.parse_args()
    if args.stages and (not args.quick or args.models != ["flynn"]):
        parser.error("--stages needs --quick and --models flynn")
    if args.panel is not None and any(name not in PANEL for name in args.panel):
        parser.error(f"--panel takes names from: {', '.join(PANEL)}")
    gaps: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        data = list(args.data)
        if args.panel is not None:
            data += panel_files(args.panel or list(PANEL), tmp)
        if not data:
            data = ["digits28"]
        if args.stages:
            for spec in data:
                for seed in args.seeds:
                    print_stages(spec, args.budget, seed)
            return
        print(f"{'data':<14}{'family':<9}{'seed':>5}{'bytes':>7}{'float %':>9}{'int8 %':>8}{'int8-float':>11}"
              f"{'se':>6}{'agree %':>9}{'right f/q of n':>17}{'differ':>7}  shape")
        for spec in data:
            for family in args.models:
                for seed in args.seeds:
                    if args.quick:
                        ok_f, ok_q, same, chosen, nbytes = quick(spec, family, args.budget, seed)
                        right_f, right_q, differ, n = int(ok_f.sum()), int(ok_q.sum()), int((~same).sum()), len(same)
                        se = f"{paired_se(ok_f, ok_q):>6.2f}"
                    else:
                        right_f, right_q, differ, n, chosen, nbytes = compiled(spec, family, args.budget, seed, tmp)
                        # report.json keeps no row-by-row labels: the bound from the disagreeing rows (each at most
                        # one row's right or wrong apart)
                        se = f"<{100 * np.sqrt(differ / n / max(n - 1, 1)):>5.2f}"
                    f, q = 100 * right_f / n, 100 * right_q / n
                    gaps.setdefault(family, []).append((q - f, float(se.lstrip("<"))))
                    shape = families.family(family).shape_text(chosen) or " ".join(
                        f"{k}={v}" for k, v in chosen.items() if k != "random_state")
                    print(f"{Path(spec).stem:<14}{family:<9}{seed:>5}{nbytes:>7}{f:>9.2f}{q:>8.2f}{q - f:>+11.2f}"
                          f"{se}{100 * (n - differ) / n:>9.2f}{f'{right_f}/{right_q} of {n}':>17}{differ:>7}  {shape}",
                          flush=True)
    print(f"\n{'family':<9}{'runs':>5}{'mean int8-float':>17}{'worst':>8}{'< -1 pt':>9}{'< -1 pt and -2 se':>19}")
    for family, rows in gaps.items():
        g = np.array([gap for gap, _ in rows])
        beyond = sum(1 for gap, se in rows if gap < -1 and gap < -2 * se)
        print(f"{family:<9}{len(rows):>5}{g.mean():>+17.2f}{g.min():>+8.2f}{int((g < -1).sum()):>9}{beyond:>19}")


if __name__ == "__main__":
    main()
