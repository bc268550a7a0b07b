#!/usr/bin/env python3
"""Bloom features benchmarks (fixed split: stratified, 25 % test, seed 0).

    python tools/bench_bloom.py                 # all three tables below
    python tools/bench_bloom.py --host          # 1. host, unbudgeted: Bloom vs random Fourier features, same m
    python tools/bench_bloom.py --device        # 2. simulated Uno: compile -> build -> validate (bit-exact)
    python tools/bench_bloom.py --wide          # 3. digits28 (784 pixels) at 2 kB on the host, phi streamed
    python tools/bench_bloom.py --calibrate     # fit tinyproto/families/bloom/cost.py on synthetic shapes

1. For each m: Bloom features (the float BloomClassifier; input stage, k and C by 3-fold CV on the training split;
   and its int8 model) against a linear SVM on random Fourier features (sklearn's RBFSampler, m components; gamma
   and C by the same CV), both with the same standardised inputs.
2. `tinyproto compile --model bloom` at each budget, then build and validate on the simulated Uno.
3. digits upsampled to 28x28 (scipy zoom, order 1, 0..255, rounded: the stand-in for MNIST-sized input) with the
   int8 model's bytes counted without the input stage (784 x 4 B per-feature stage today; a shared stage, the
   wide-inputs work, costs a few bytes), and the C runtime fed in 32-feature chunks on the host.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sklearn.datasets import load_breast_cancer, load_digits  # noqa: E402
from sklearn.model_selection import GridSearchCV, train_test_split  # noqa: E402

from tinyproto.families.bloom.quantize import IntBloom  # noqa: E402
from tinyproto.families.bloom.train import BloomClassifier  # noqa: E402
from tinyproto.families.solving import SolveOptions  # noqa: E402


def split(name: str):
    if name == "digits28":
        X, y = digits28()
    else:
        X, y = {"digits": load_digits, "breast_cancer": load_breast_cancer}[name](return_X_y=True)
    return train_test_split(X, y, test_size=0.25, stratify=y, random_state=0)


def digits28():
    from scipy.ndimage import zoom

    X, y = load_digits(return_X_y=True)
    images = [np.round(np.clip(zoom(im.reshape(8, 8) / 16.0 * 255.0, 28 / 8, order=1), 0, 255)) for im in X]
    return np.array(images).reshape(len(X), -1), y


# ---------------------------------------------------------------- 1. host: Bloom vs random Fourier features


def host_table(names: list[str], ms: list[int]) -> None:
    from sklearn.kernel_approximation import RBFSampler
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler
    from sklearn.svm import LinearSVC

    print("1. host, unbudgeted: Bloom features vs random Fourier features (linear SVM), same m")
    print(f"{'data':<15}{'m':>6}{'k':>4}{'used':>6}{'Bloom float':>13}{'Bloom int8':>12}{'RFF':>8}{'gap pt':>8}"
          f"{'s':>7}")
    for name in names:
        Xtr, Xte, ytr, yte = split(name)
        for m in ms:
            started = time.perf_counter()
            grid = {"n_hashes": [1, 2, 3, 4, 6, 8], "C": [0.1, 1.0, 10.0]}
            stages = [{"offset": ["min"], "scaling": ["global", "feature"], **grid},
                      {"offset": ["mean"], "scaling": ["feature"], **grid}]
            bloom = GridSearchCV(BloomClassifier(n_slots=m, random_state=0), stages, cv=3).fit(Xtr, ytr)
            clf = bloom.best_estimator_
            int8 = float(np.mean(IntBloom.from_classifier(clf).predict(Xte) == yte))
            rff = GridSearchCV(make_pipeline(StandardScaler(), RBFSampler(n_components=m, random_state=0),
                                             LinearSVC(max_iter=5000, random_state=0)),
                               {"rbfsampler__gamma": [0.3 / Xtr.shape[1], 1.0 / Xtr.shape[1], 3.0 / Xtr.shape[1]],
                                "linearsvc__C": [0.1, 1.0, 10.0]}, cv=3).fit(Xtr, ytr)
            rff_acc = rff.score(Xte, yte)
            print(f"{name:<15}{m:>6}{clf.n_hashes:>4}{clf.used_.size:>6}{100 * clf.score(Xte, yte):>13.2f}"
                  f"{100 * int8:>12.2f}{100 * rff_acc:>8.2f}{100 * (rff_acc - int8):>8.2f}"
                  f"{time.perf_counter() - started:>7.1f}", flush=True)


# ---------------------------------------------------------------- 2. simulated Uno


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tinyproto", *args], capture_output=True, text=True, cwd=REPO)


def device_table(names: list[str], budgets: list[str]) -> None:
    print("2. simulated Uno: tinyproto compile --model bloom, build, validate --sim (every score compared)")
    print(f"{'data':<15}{'budget':>7}{'bytes':>6}{'m':>5}{'k':>3}{'used':>5}{'acc %':>7}{'exact':>6}{'cycles':>8}"
          f"{'ms':>6}{'pred':>7}{'err %':>6}{'mJ mcu':>8}{'mJ brd':>8}{'flash':>6}{'sram':>6}")
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            for budget in budgets:
                out = Path(tmp) / f"{name}-{budget}"
                compiled = cli("compile", name, "--model", "bloom", "--budget", budget, "--out", str(out))
                if compiled.returncode != 0:
                    print(f"{name:<15}{budget:>7}  {compiled.stderr.strip()}")
                    continue
                assert cli("build", str(out)).returncode == 0
                validated = cli("validate", str(out), "--sim", "--json")
                v = json.loads(validated.stdout)
                h = json.loads((out / "model.json").read_text())["hyperparameters"]
                print(f"{name:<15}{budget:>7}{v['model_bytes']:>6}{h['n_slots']:>5}{h['n_hashes']:>3}{h['n_used']:>5}"
                      f"{100 * v['device_accuracy']:>7.2f}{'yes' if v['passed'] else 'NO':>6}"
                      f"{v['cycles_mean']:>8.0f}{v['latency_ms_mean']:>6.2f}{v['predicted_cycles']:>7}"
                      f"{100 * v['predicted_error']:>6.1f}{v['energy_mj_mcu']:>8.4f}{v['energy_mj_board']:>8.4f}"
                      f"{v['flash_bytes']:>6}{v['sram_static_bytes'] + v['stack_peak_bytes']:>6}", flush=True)


# ---------------------------------------------------------------- 3. digits28 on the host, streamed


def wide_table(budget: int) -> None:
    from tinyproto.families.bloom import solver
    from tinyproto.core.render import write_sources

    Xtr, Xte, ytr, yte = split("digits28")
    stage = solver.stage_bytes(Xtr.shape[1])
    print(f"3. digits28 (784 pixels) within {budget + stage} B ({budget} B and a per-feature input stage's {stage} B; "
          f"the solver may spend them on a shared stage and more weights), host; C fed in 32-pixel chunks")
    started = time.perf_counter()
    # the solver prices today's per-feature input stage; give it that much on top so the model part is `budget`
    clf, model, info = solver.fit_bloom_under_budget(Xtr, ytr, SolveOptions(budget + stage, 0))
    seconds = time.perf_counter() - started
    stage_used = sum(a.nbytes for a in model.input_stage.carrays())  # the solver may choose the shared stage
    model_part = model.model_bytes() - stage_used
    xq = model.input_stage.quantize(Xte)
    host = model.scores(xq)
    with tempfile.TemporaryDirectory() as tmp:
        write_sources(model, Path(tmp), "digits28", 0, model.model_bytes())
        streamed = stream_scores(Path(tmp), xq, chunk=32)
    c = info["chosen"]
    acc = float(np.mean(np.asarray(model.classes)[model.labels(host)] == yte))
    print(f"m={c['n_slots']} k={c['n_hashes']} used={c['n_used']} {c['offset']}/{c['scaling']} C={c['C']:g}: "
          f"int8 {100 * acc:.2f} %, float {100 * clf.score(Xte, yte):.2f} %, {model_part} B of weights + biases "
          f"(+ {stage_used} B input stage), C streamed == host: "
          f"{np.array_equal(streamed, host)}, phi {c['n_slots']} B of SRAM, search {seconds:.1f} s")


STREAM_MAIN = r"""
#include <stdio.h>
#include "tinyproto.h"
#include "tinyproto_model.h"
void tp_stream_begin(void);
void tp_stream_feed(const int8_t *xq, uint16_t first, uint8_t n);
uint8_t tp_stream_end(int32_t *scores);
int main(int argc, char **argv)
{
    int chunk = argc > 1 ? atoi(argv[1]) : 32;
    int8_t part[255];
    int32_t scores[TP_N_CLASSES];
    for (;;) {
        tp_stream_begin();
        for (int first = 0; first < TP_N_FEATURES; first += chunk) { /* never more than `chunk` features held */
            int n = TP_N_FEATURES - first < chunk ? TP_N_FEATURES - first : chunk;
            if (fread(part, 1, (size_t)n, stdin) != (size_t)n) return 0;
            tp_stream_feed(part, (uint16_t)first, (uint8_t)n);
        }
        printf("%u", (unsigned)tp_stream_end(scores));
        for (int l = 0; l < TP_N_CLASSES; ++l) printf(" %ld", (long)scores[l]);
        printf("\n");
    }
}
"""


def stream_scores(project: Path, xq: np.ndarray, chunk: int) -> np.ndarray:
    """Scores of the host-compiled tp_bloom.c fed through tp_stream_* in chunks of `chunk` features."""
    main = project / "stream_main.c"
    main.write_text("#include <stdlib.h>\n" + STREAM_MAIN)
    lib = project / "lib" / "tinyproto"
    exe = project / "stream"
    subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{project / 'include'}", f"-I{lib}",
                    str(main), str(lib / "tp_bloom.c"), "-o", str(exe)], check=True)
    out = subprocess.run([str(exe), str(chunk)], input=np.ascontiguousarray(xq, dtype=np.int8).tobytes(),
                         capture_output=True, check=True).stdout.decode()
    return np.array([line.split()[1:] for line in out.splitlines()], dtype=np.int64)


# ---------------------------------------------------------------- calibration of the cost model


SHAPES = [  # (d, k, m, classes)
    (16, 1, 17, 2), (64, 1, 64, 10), (64, 3, 300, 10), (20, 2, 700, 3), (64, 2, 100, 10), (64, 3, 256, 10),
    (64, 4, 150, 3), (64, 6, 221, 10), (128, 2, 200, 5), (150, 1, 40, 10), (150, 5, 255, 2), (30, 8, 90, 4),
    (100, 3, 256, 10), (40, 7, 120, 6), (30, 8, 256, 2), (64, 4, 256, 3), (50, 1, 256, 7),
]


def synthetic_model(d: int, k: int, m: int, classes: int, seed: int) -> IntBloom:
    from tinyproto.core.inputstage import InputStage
    from tinyproto.families.bloom.slots import seeded_slots, used_slots

    rng = np.random.RandomState(seed)
    rows = 1 if classes == 2 else classes
    used = used_slots(seeded_slots(seed, d, k, m)).size
    return IntBloom(classes=list(range(classes)),
                    input_stage=InputStage.from_standardisation(np.zeros(d), np.ones(d), 1.0), seed=seed,
                    n_slots=m, n_hashes=k, weights=rng.randint(-127, 128, size=(rows, used)),
                    bias=rng.randint(-30000, 30000, size=rows), weight_step=1.0)


def measure(model: IntBloom, vectors: np.ndarray, workdir: Path) -> float:
    """Mean Timer1 cycles of tp_predict on the simulated Uno (and a check that every score is the host's)."""
    from tinyproto.core.boards import load_board
    from tinyproto.core.render import write_sources
    from tinyproto.device.build import build_project, render_platformio_ini
    from tinyproto.device.protocol import open_device
    from tinyproto.device.sim import SimulatedUno

    write_sources(model, workdir, "calibration", 0, 1 << 20)
    (workdir / "platformio.ini").write_text(render_platformio_ini(load_board("uno")))
    elf = build_project(workdir, "uno_sim").elf
    with SimulatedUno(elf) as uno, open_device(uno.port) as client:
        predictions = [client.predict(x) for x in vectors]
    scores = np.array([p.scores for p in predictions], dtype=np.int64)
    assert np.array_equal(scores, model.scores(vectors)), "device scores differ from the host reference"
    return float(np.mean([p.cycles for p in predictions]))


def calibrate() -> None:
    from scipy.optimize import nnls

    from tinyproto.families.bloom.cost import BLOOM_CYCLES, bloom_cost_terms

    names = list(BLOOM_CYCLES)
    rows, measured = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (d, k, m, classes) in enumerate(SHAPES):
            model = synthetic_model(d, k, m, classes, 1000 + i)
            vectors = np.random.RandomState(i).randint(-128, 128, size=(4, d)).astype(np.int8)
            cycles = measure(model, vectors, Path(tmp) / f"s{i}")
            terms = bloom_cost_terms(model)
            rows.append([terms[n] for n in names])
            measured.append(cycles)
            print(f"d={d} k={k} m={m} L={classes} used={model.n_used}: {cycles:.0f} cycles", flush=True)
    A, b = np.array(rows, dtype=np.float64), np.array(measured)
    coef, _ = nnls(A, b)
    fitted = {n: round(float(c), 2) for n, c in zip(names, coef)}
    print("BLOOM_CYCLES =", json.dumps(fitted))
    err = (A @ coef - b) / b
    print("relative error per shape:", " ".join(f"{100 * e:+.1f}" for e in err))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--host", action="store_true")
    parser.add_argument("--device", action="store_true")
    parser.add_argument("--wide", action="store_true")
    parser.add_argument("--calibrate", action="store_true")
    parser.add_argument("--data", nargs="+", default=["digits", "breast_cancer"])
    parser.add_argument("--m", nargs="+", type=int, default=[100, 200, 400, 1000])
    parser.add_argument("--budgets", nargs="+", default=["1kB", "2kB"])
    args = parser.parse_args()
    if args.calibrate:
        calibrate()
        return
    everything = not (args.host or args.device or args.wide)
    if args.host or everything:
        host_table(args.data, args.m)
    if args.device or everything:
        device_table(args.data, args.budgets)
    if args.wide or everything:
        wide_table(2048)


if __name__ == "__main__":
    main()
