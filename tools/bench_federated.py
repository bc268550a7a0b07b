#!/usr/bin/env python3
"""Benchmark federated FlyNN (tinyproto federate) on the fixed split (25 % test, seed 0); prints three tables.

    python tools/bench_federated.py [--seeds 5] [--skip-dask] [--timing-rows 100000] [--tables 1 2 3]

1. DP: int8 test accuracy vs ε (and T) for 2 parties (iid), mean ± std over DP seeds, on synthetic 2-class data
   (make_classification, 3 clusters per class) and digits. Hyper-parameters come from party 0 (the federate
   rule) and are fixed per data set; only the DP noise changes with the seed.
2. Parties: accuracy vs number of parties and split, (a) with one fixed configuration (identical to central
   without DP, which the table checks) and (b) with the configuration party 0 chooses in that run.
3. Wall time of federated training vs dask workers (threads and processes) on large synthetic data.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from sklearn.datasets import make_classification

from tinyproto.datasets import Dataset, Split, load_dataset, split
from tinyproto.flynn import federated as fed
from tinyproto.flynn.quantize import integer_winners, scores_from_winners

BUDGET = 2048
EPSILONS = (0.25, 0.5, 1.0, 2.0, 4.0, 16.0, 64.0)  # the five, plus two larger to show the trend
T_DIVISORS = (16, 64, 256)  # T = L·m / divisor


def synthetic(n_samples: int, seed: int = 0) -> Split:
    X, y = make_classification(n_samples=n_samples, n_features=16, n_informative=8, n_redundant=2, n_classes=2,
                               n_clusters_per_class=3, class_sep=2.0, random_state=seed)
    return split(Dataset(f"synthetic{n_samples}", X, y))


def shards_of(sp: Split, n_parties: int, split_spec: str = "iid", seed: int = 0) -> list:
    return [(sp.X_train[r], sp.y_train[r]) for r in fed.split_parties(sp.y_train, n_parties, split_spec, seed)]


def accuracy(model, sp: Split) -> float:
    return float(np.mean(model.predict(sp.X_test) == sp.y_test))


# ---------------------------------------------------------------- 1. accuracy vs ε and T


def dp_table(name: str, sp: Split, n_seeds: int) -> None:
    shards = shards_of(sp, 2)
    backend = fed.LocalBackend(shards)
    classes = fed.agree_classes(backend)
    config, _ = fed.choose_config(backend, BUDGET, 0, classes, sp.X_train.shape[1], len(np.unique(shards[0][1])))
    exact = fed.federated_fit(backend, config, classes)
    spec = exact.spec
    # Raw counts once per party; the DP release is then applied exactly as party_counts does (checked below),
    # and the test set is hashed once: the table needs hundreds of releases, not hundreds of hashings.
    raw = [fed.party_counts(shard, spec).int_counts for shard in shards]
    stage = spec.input_stage()
    test_winners = integer_winners(stage.quantize(sp.X_test), exact.model.indices, exact.model.n_winners,
                                   exact.model.sign_split)
    y_index = np.searchsorted(classes, sp.y_test)
    bits, lut = exact.model.bits, exact.model.lut

    def release_accuracy(dp: fed.DPParams, seed: int) -> float:
        streams = fed.party_seed_sequences(seed, len(shards))[1]
        total = sum(fed.dp_release(c, dp, np.random.default_rng(s)) for c, s in zip(raw, streams))
        counts = np.minimum(total, (1 << bits) - 1)
        return float(np.mean(np.argmin(scores_from_winners(test_winners, counts, bits, lut), axis=1) == y_index))

    check = fed.DPParams(1.0, 10, 2)  # the shortcut equals the pipeline
    pipeline = fed.federated_fit(backend, config, classes, check, 0)
    assert release_accuracy(check, 0) == accuracy(pipeline.model, sp)

    L, m = len(classes), config.n_hashes
    print(f"\n1. DP, 2 parties (iid), {name}: {len(sp.y_train)} train / {len(sp.y_test)} test rows, L*m = {L}x{m} = "
          f"{L * m}, s={config.n_inputs_per_hash} rho={config.n_winners} bits={config.count_bits}; "
          f"without DP {100 * accuracy(exact.model, sp):.2f} %; int8 accuracy %, mean +- std of {n_seeds} DP seeds")
    header = f"{'T':>14}" + "".join(f"{'eps=' + format(e, 'g'):>13}" for e in EPSILONS)
    print(header)
    print("-" * len(header))
    for divisor in T_DIVISORS:
        T = max(1, L * m // divisor)
        cells = []
        for eps in EPSILONS:
            accs = [release_accuracy(fed.DPParams(eps, T, 2), s) for s in range(n_seeds)]
            cells.append(f"{100 * np.mean(accs):7.2f}+-{100 * np.std(accs):4.1f}")
        print(f"{f'{T} (Lm/{divisor})':>14}" + "".join(f"{c:>13}" for c in cells))
    print(f"{'eps_0, T=Lm/64':>14}" + "".join(f"{fed.DPParams(e, max(1, L * m // 64), 2).epsilon_0:>13.2e}"
                                            for e in EPSILONS))


# ---------------------------------------------------------------- 2. accuracy vs parties


def parties_table(name: str, sp: Split, party_counts: tuple[int, ...]) -> None:
    base = fed.LocalBackend(shards_of(sp, 2))
    classes = fed.agree_classes(base)
    fixed, _ = fed.choose_config(base, BUDGET, 0, classes, sp.X_train.shape[1], 2)
    central = fed.central_fit(sp.X_train, sp.y_train, fixed, classes)
    print(f"\n2. parties, {name}, no DP. (a) one configuration (party 0 of the 2-party iid split: m={fixed.n_hashes} "
          f"s={fixed.n_inputs_per_hash} rho={fixed.n_winners} bits={fixed.count_bits}), central "
          f"{100 * accuracy(central.model, sp):.2f} %; (b) the configuration party 0 chooses in that run")
    header = (f"{'split':<15}{'N':>4}{'(a) acc %':>11}{'= central':>11}{'(a) s':>7}{'(b) acc %':>11}{'(b) m':>7}"
              f"{'party 0 rows':>14}{'classes':>9}")
    print(header)
    print("-" * len(header))
    for split_spec in ("iid", "by-class", "dirichlet:0.1"):
        for n in party_counts:
            shards = shards_of(sp, n, split_spec)
            backend = fed.LocalBackend(shards)
            started = time.perf_counter()
            fit = fed.federated_fit(backend, fixed, classes)
            seconds = time.perf_counter() - started
            same = np.array_equal(fit.int_counts, central.int_counts) and np.array_equal(fit.float_counts,
                                                                                          central.float_counts)
            own, _ = fed.choose_config(backend, BUDGET, 0, classes, sp.X_train.shape[1], len(np.unique(shards[0][1])))
            own_fit = fed.federated_fit(backend, own, classes)
            print(f"{split_spec:<15}{n:>4}{100 * accuracy(fit.model, sp):>11.2f}{'yes' if same else 'NO':>11}"
                  f"{seconds:>7.2f}{100 * accuracy(own_fit.model, sp):>11.2f}{own.n_hashes:>7}"
                  f"{len(shards[0][1]):>14}{len(np.unique(shards[0][1])):>9}")


# ---------------------------------------------------------------- 3. wall time vs workers


def timing_table(n_rows: int, n_parties: int, skip_dask: bool) -> None:
    sp = synthetic(n_rows)
    shards = shards_of(sp, n_parties)
    classes = np.unique(sp.y_train)
    config = fed.fit_to_classes(fed.default_config(0), len(classes), sp.X_train.shape[1], BUDGET)
    print(f"\n3. wall time, synthetic {len(sp.y_train)} training rows, {n_parties} parties (iid), m={config.n_hashes} "
          f"s={config.n_inputs_per_hash} rho={config.n_winners}; federated_fit (10 all-reduce rounds) after the "
          f"shards are placed; best of 3 runs")
    header = f"{'backend':<22}{'workers':>8}{'start s':>9}{'fit s':>8}{'speed-up':>10}{'= central':>11}"
    print(header)
    print("-" * len(header))
    central = fed.central_fit(sp.X_train, sp.y_train, config, classes)
    runs = [("local", None, False)]
    if not skip_dask:
        runs += [("dask threads", w, False) for w in (1, 2)] + [("dask processes", w, True) for w in (1, 2)]
    reference = None
    for label, workers, processes in runs:
        started = time.perf_counter()
        backend = fed.LocalBackend(shards) if workers is None else fed.DaskBackend(shards, n_workers=workers,
                                                                                    processes=processes)
        start_s = time.perf_counter() - started
        try:
            times = []
            for _ in range(3):
                t0 = time.perf_counter()
                fit = fed.federated_fit(backend, config, classes)
                times.append(time.perf_counter() - t0)
        finally:
            backend.close()
        best = min(times)
        reference = reference or best
        same = np.array_equal(fit.int_counts, central.int_counts)
        print(f"{label:<22}{workers or '-':>8}{start_s:>9.2f}{best:>8.2f}{reference / best:>9.2f}x"
              f"{'yes' if same else 'NO':>11}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=5, help="DP seeds per cell")
    parser.add_argument("--synthetic-rows", type=int, default=20000)
    parser.add_argument("--timing-rows", type=int, default=100000)
    parser.add_argument("--timing-parties", type=int, default=8)
    parser.add_argument("--skip-dask", action="store_true")
    parser.add_argument("--tables", nargs="+", type=int, default=[1, 2, 3], choices=[1, 2, 3])
    args = parser.parse_args()
    digits = split(load_dataset("digits"))
    if 1 in args.tables:
        dp_table(f"synthetic ({args.synthetic_rows} rows, 2 classes x 3 clusters)", synthetic(args.synthetic_rows),
                 args.seeds)
        dp_table("digits", digits, args.seeds)
    if 2 in args.tables:
        parties_table("digits", digits, (1, 2, 3, 7, 16))
    if 3 in args.tables:
        timing_table(args.timing_rows, args.timing_parties, args.skip_dask)


if __name__ == "__main__":
    main()
