#!/usr/bin/env python3
"""Benchmark federated FlyNN (tinyproto federate) on the fixed split (25 % test, seed 0); prints three tables.

    python tools/bench_federated.py [--data digits segment] [--parties 1 4 32 128 1000] [--tables 1 2 3]
                                    [--splits iid dirichlet:0.1 by-class] [--dp-seeds 3] [--timing-parties 128]
                                    [--plot federated.png]

1. Parties: int8 test accuracy and bytes of the federated model (hyper-parameters chosen by federated model
   selection over every party's rows) against parties x split, next to what `compile --model flynn` deploys from
   the pooled rows (same budget and seed); the counts' exact check against the same configuration on the pooled
   rows; wall time on the local backend (selection + training).
2. Wall time on dask worker processes (LocalCluster, 1 and 2 workers), same protocol, --timing-parties parties.
3. DP: accuracy against epsilon (the data-independent default shape, T = L*m/64), mean +- std over DP seeds.
--plot PATH also draws tables 1 and 3 as a PNG (matplotlib, as `tinyproto report`): accuracy against parties per
split next to compile's, and accuracy against epsilon. --data also takes a CSV or .npz file.
segment needs river (installed by the test extras).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from tinyproto.core.datasets import Split, load_dataset, split
from tinyproto.pipeline.federate import default_dp_T
from tinyproto.federated.dask_parties import DaskBackend
from tinyproto.federated.dp import DPParams
from tinyproto.federated.local_parties import LocalBackend
from tinyproto.federated.protocol import agree_classes, central_fit, choose_config, federated_fit
from tinyproto.federated.shards import split_parties
from tinyproto.families.flynn.solver import fit_flynn_under_budget
from tinyproto.families.solving import SolveOptions

BUDGET = 2048
EPSILONS = (1.0, 4.0, 16.0, 64.0, 256.0)
SPLITS = ("iid", "dirichlet:0.1", "by-class")


def shards_of(sp: Split, n_parties: int, split_spec: str = "iid", seed: int = 0) -> list:
    return [(sp.X_train[r], sp.y_train[r]) for r in split_parties(sp.y_train, n_parties, split_spec, seed)]


def accuracy(model, sp: Split) -> float:
    return float(np.mean(model.predict(sp.X_test) == sp.y_test))


def run(backend, sp: Split, dp: float | None = None, seed: int = 0):
    """The federate protocol on a placed backend: (fit, config, info)."""
    classes = agree_classes(backend)
    config, info = choose_config(backend, BUDGET, seed, classes, sp.X_train.shape[1], dp=dp is not None)
    params = None
    if dp is not None:
        params = DPParams(dp, default_dp_T(len(classes), config.n_hashes), backend.n_parties)
    return federated_fit(backend, config, classes, dp=params, seed=seed), config, info


# ---------------------------------------------------------------- 1. accuracy vs parties


def parties_table(name: str, sp: Split, party_counts, splits=SPLITS) -> dict:
    """Prints table 1 for one data set; returns {"compile": accuracy, split: [(parties, accuracy), ...]}."""
    _, ref_model, ref_info = fit_flynn_under_budget(sp.X_train, sp.y_train, SolveOptions(BUDGET, 0))
    ref_acc = accuracy(ref_model, sp)
    c = ref_info["chosen"]
    print(f"\n1. {name}: {len(sp.y_train)} train / {len(sp.y_test)} test rows, {BUDGET} B, no DP. compile on the "
          f"pooled rows: {100 * ref_acc:.2f} %, {ref_model.model_bytes()} B (m={c['n_hashes']} s="
          f"{c['n_inputs_per_hash']} rho={c['n_winners']} b={c['count_bits']} {c['scaling']})")
    results: dict = {"compile": ref_acc}
    header = (f"{'split':<15}{'N':>6}{'acc %':>8}{'vs compile':>11}{'bytes':>7}{'m':>6}{'s':>4}{'rho':>5}{'b':>3}"
              f"{'counts = pooled':>17}{'sel. MB/party':>15}{'rounds':>8}{'wall s':>8}")
    print(header)
    print("-" * len(header))
    for split_spec in splits:
        for n in party_counts:
            if n > len(sp.y_train):
                continue
            started = time.perf_counter()
            with LocalBackend(shards_of(sp, n, split_spec)) as backend:
                fit, config, info = run(backend, sp)
            seconds = time.perf_counter() - started
            pooled = central_fit(sp.X_train, sp.y_train, config, fit.spec.classes)
            same = np.array_equal(fit.int_counts, pooled.int_counts) and np.array_equal(fit.float_counts,
                                                                                        pooled.float_counts)
            acc = accuracy(fit.model, sp)
            results.setdefault(split_spec, []).append((n, acc))
            comm = info["selection_communication"]
            print(f"{split_spec:<15}{n:>6}{100 * acc:>8.2f}{100 * (acc - ref_acc):>+11.2f}{fit.model.model_bytes():>7}"
                  f"{config.n_hashes:>6}{config.n_inputs_per_hash:>4}{config.n_winners:>5}{config.count_bits:>3}"
                  f"{'yes' if same else 'NO':>17}{comm['bytes_sent_per_party'] / 1e6:>15.1f}"
                  f"{comm['allreduce_rounds'] + 3 + fit.quantile_rounds:>8}{seconds:>8.1f}", flush=True)
    return results


# ---------------------------------------------------------------- 2. wall time vs dask workers


def timing_table(name: str, sp: Split, n_parties: int) -> None:
    print(f"\n2. {name}, {n_parties} parties (iid) on dask worker processes (LocalCluster): wall time of the whole "
          "protocol (selection + training) after the shards are placed; best of 2 runs")
    header = f"{'workers':>8}{'start s':>9}{'run s':>8}{'speed-up':>10}{'acc %':>8}{'= local':>9}"
    print(header)
    print("-" * len(header))
    shards = shards_of(sp, n_parties)
    with LocalBackend(shards) as local:
        expected, _, _ = run(local, sp)
    reference = None
    for workers in (1, 2):
        started = time.perf_counter()
        with DaskBackend(shards, n_workers=workers, processes=True) as backend:
            start_s = time.perf_counter() - started
            times = []
            for _ in range(2):
                t0 = time.perf_counter()
                fit, _, _ = run(backend, sp)
                times.append(time.perf_counter() - t0)
        best = min(times)
        reference = reference or best
        same = fit.model.to_json() == expected.model.to_json()
        print(f"{workers:>8}{start_s:>9.2f}{best:>8.2f}{reference / best:>9.2f}x{100 * accuracy(fit.model, sp):>8.2f}"
              f"{'yes' if same else 'NO':>9}", flush=True)


# ---------------------------------------------------------------- 3. DP


def dp_table(name: str, sp: Split, n_parties: int, n_seeds: int) -> dict:
    """Prints table 3 for one data set; returns {epsilon: (mean accuracy, std)}."""
    with LocalBackend(shards_of(sp, n_parties)) as backend:
        exact, config, _ = run(backend, sp, None)
        classes = agree_classes(backend)
        dconfig, _ = choose_config(backend, BUDGET, 0, classes, sp.X_train.shape[1], dp=True)
        no_noise = federated_fit(backend, dconfig, classes)
        T = default_dp_T(len(classes), dconfig.n_hashes)
        print(f"\n3. {name}, DP, {n_parties} parties (iid): default shape m={dconfig.n_hashes} "
              f"s={dconfig.n_inputs_per_hash} rho={dconfig.n_winners} b={dconfig.count_bits}, T = L*m/64 = {T}; "
              f"that shape without DP {100 * accuracy(no_noise.model, sp):.2f} %, selected shape without DP "
              f"{100 * accuracy(exact.model, sp):.2f} %; int8 accuracy %, mean +- std of {n_seeds} seeds")
        header = "".join(f"{'eps=' + format(e, 'g'):>14}" for e in EPSILONS)
        print(header)
        print("-" * len(header))
        cells, results = [], {}
        for eps in EPSILONS:
            dp = DPParams(eps, T, n_parties)
            accs = [accuracy(federated_fit(backend, dconfig, classes, dp=dp, seed=s).model, sp)
                    for s in range(n_seeds)]
            cells.append(f"{100 * np.mean(accs):7.2f}+-{100 * np.std(accs):4.1f}")
            results[eps] = (float(np.mean(accs)), float(np.std(accs)))
        print("".join(f"{c:>14}" for c in cells), flush=True)
    return results


def plot(path: str, parties: dict, dp: dict) -> None:
    """Tables 1 and 3 as one PNG: per data set, accuracy against parties (one line per split, compile's accuracy
    dashed), and accuracy against epsilon."""
    from matplotlib.figure import Figure

    names = list(dict.fromkeys(list(parties) + list(dp)))
    panels = [(name, "parties") for name in names if name in parties] + [(name, "dp") for name in names if name in dp]
    fig = Figure(figsize=(4.2 * len(panels), 3.6), dpi=100, layout="constrained")
    for i, (name, kind) in enumerate(panels):
        ax = fig.add_subplot(1, len(panels), i + 1)
        if kind == "parties":
            for split_spec, points in parties[name].items():
                if split_spec != "compile" and points:
                    ax.plot(*zip(*[(n, 100 * a) for n, a in points]), "-o", label=split_spec)
            ax.axhline(100 * parties[name]["compile"], color="black", linestyle="--", label="compile (pooled rows)")
            shown = [100 * a for key, points in parties[name].items() if key != "compile" for _, a in points]
            shown.append(100 * parties[name]["compile"])
            ax.set_ylim(min(shown) - 2, max(shown) + 2)  # at least 4 points tall: a 1-row change looks like one
            ax.set_xscale("log")
            counts = sorted({n for key, points in parties[name].items() if key != "compile" for n, _ in points})
            ax.set_xticks(counts, [str(n) for n in counts])
            ax.minorticks_off()
            ax.set_xlabel("parties")
            ax.set_title(f"{name}: federated, {BUDGET} B, no DP")
        else:
            eps = sorted(dp[name])
            ax.errorbar(eps, [100 * dp[name][e][0] for e in eps], yerr=[100 * dp[name][e][1] for e in eps], fmt="-o")
            ax.set_xscale("log")
            ax.set_xlabel("epsilon")
            ax.set_title(f"{name}: DP, default shape")
        ax.set_ylabel("int8 test accuracy (%)")
        ax.grid(alpha=0.3)
        if kind == "parties":
            ax.legend(fontsize=8)
    fig.savefig(path, format="png", metadata={"Software": None})
    print(f"\nwrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", nargs="+", default=["digits", "segment"])
    parser.add_argument("--parties", nargs="+", type=int, default=[1, 4, 32, 128, 1000])
    parser.add_argument("--splits", nargs="+", default=list(SPLITS))
    parser.add_argument("--timing-parties", type=int, default=128)
    parser.add_argument("--dp-parties", type=int, default=4)
    parser.add_argument("--dp-seeds", type=int, default=3)
    parser.add_argument("--tables", nargs="+", type=int, default=[1, 2, 3], choices=[1, 2, 3])
    parser.add_argument("--plot", metavar="PATH", help="also draw tables 1 and 3 as a PNG")
    args = parser.parse_args()
    parties, dp = {}, {}
    for name in args.data:
        dataset = load_dataset(name)
        sp = split(dataset)
        if 1 in args.tables:
            parties[dataset.name] = parties_table(name, sp, args.parties, args.splits)
        if 2 in args.tables:
            timing_table(name, sp, args.timing_parties)
        if 3 in args.tables:
            dp[dataset.name] = dp_table(name, sp, args.dp_parties, args.dp_seeds)
    if args.plot and (parties or dp):
        plot(args.plot, parties, dp)


if __name__ == "__main__":
    main()
