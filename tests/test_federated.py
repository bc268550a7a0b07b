"""Federated FlyNN: exact agreement with central training, the backends, the DP mechanism and `tinyproto federate`."""

from __future__ import annotations

import functools
import json
import math
from fractions import Fraction
from itertools import permutations

import numpy as np
import pytest
from click.testing import CliRunner

from tinyproto.core.datasets import load_dataset, split
from tinyproto.core.errors import TinyprotoError
from tinyproto.cli.federate import federate_command
from tinyproto.families.flynn.solver import solver_random_state
from tinyproto.federated.config import FlyNNConfig
from tinyproto.federated.dask_parties import DaskBackend
from tinyproto.federated.dp import (
    DPParams, dp_release, em_log_weights, em_probabilities, exponential_mechanism_picks,
)
from tinyproto.federated.local_parties import LocalBackend
from tinyproto.federated.party import party_accuracy, party_counts
from tinyproto.federated.protocol import (
    DP_SHAPE_NOTE, FederatedFit, agree_classes, central_fit, choose_config, federated_fit,
)
from tinyproto.federated.shards import parse_split, party_seed_sequences, split_parties
from tinyproto.core.moments import _scaled, moment_sums, standardisation
from tinyproto.federated.stats import (
    count_at_most, input_scale_from_order_statistics, quantile_positions, select_order_statistics, tree_sum,
)
from tinyproto.families.flynn.quantize import IntFlyNN
from tinyproto.families.flynn.solver import model_bytes
from tinyproto.families.flynn.seeded_index import draw_seed
from tinyproto.families.flynn.train import FlyNNClassifier, feature_scale
from tinyproto.core.inputstage import choose_input_scale
from tinyproto.core.modeldir import load_model_dir
from tinyproto.core.outdir import check_output_dir
from tinyproto import families

import tempfile
from pathlib import Path

from helpers import read_only, tinyproto
from tinyproto.core.manifest import LOCK

REPORT_KEYS = {
    "parties", "dp", "accuracy", "compile_accuracy", "compile_model_bytes", "accuracy_vs_compile_points",
    "counts_equal_pooled", "pooled_same_config_accuracy", "selection", "split", "backend",
    "model", "dataset", "seed", "budget_bytes", "model_bytes", "ledger", "hyperparameters", "n_test",
    "float_accuracy", "int8_accuracy", "int8_float_agreement",
}


@functools.lru_cache(maxsize=None)
def data(name: str):
    return read_only(split(load_dataset(name)))


def config_for(n_hashes=300, s=6, rho=16, bits=2, decay=0.5, scaling="feature", sign_split=True, state=5):
    return FlyNNConfig(n_hashes, s, rho, decay, bits, False, scaling, sign_split, draw_seed(state), state)


def shards(sp, n, split_spec="iid", seed=0):
    return [(sp.X_train[r], sp.y_train[r]) for r in split_parties(sp.y_train, n, split_spec, seed)]


@functools.lru_cache(maxsize=None)
def central(name: str, scaling: str = "feature"):
    sp = data(name)
    return read_only(central_fit(sp.X_train, sp.y_train, config_for(scaling=scaling)))


def assert_same_fit(a: FederatedFit, b: FederatedFit, X_test) -> None:
    np.testing.assert_array_equal(a.spec.mean, b.spec.mean)
    np.testing.assert_array_equal(a.spec.scale, b.spec.scale)
    assert a.spec.input_scale == b.spec.input_scale
    np.testing.assert_array_equal(a.int_counts, b.int_counts)
    np.testing.assert_array_equal(a.float_counts, b.float_counts)
    np.testing.assert_array_equal(a.model.counts, b.model.counts)
    np.testing.assert_array_equal(a.model.predict(X_test), b.model.predict(X_test))
    np.testing.assert_array_equal(a.clf.predict(X_test), b.clf.predict(X_test))
    assert a.model.to_json() == b.model.to_json()


# ---------------------------------------------------------------- party split


@pytest.mark.parametrize("spec", ["iid", "by-class", "dirichlet:0.1", "dirichlet:100"])
@pytest.mark.parametrize("n", [1, 2, 7])
def test_split_is_a_partition_into_non_empty_parties(spec, n):
    y = data("digits").y_train
    parts = split_parties(y, n, spec, seed=3)
    assert len(parts) == n and all(len(p) > 0 for p in parts)
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(len(y)))
    again = split_parties(y, n, spec, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))


def test_non_iid_splits_are_non_iid():
    y = data("digits").y_train
    by_class = split_parties(y, 5, "by-class")
    assert max(np.unique(y[p]).size for p in by_class) <= 3  # 10 classes over 5 contiguous parts
    dirichlet = split_parties(y, 5, "dirichlet:0.1")
    shares = np.array([[np.mean(y[p] == c) for c in range(10)] for p in dirichlet])
    assert shares.max(axis=1).min() > 0.3  # every party is dominated by some class (iid: ~0.1)


def test_split_refuses_bad_specs_and_sizes():
    with pytest.raises(TinyprotoError):
        parse_split("dirichlet:0")
    with pytest.raises(TinyprotoError):
        parse_split("random")
    with pytest.raises(TinyprotoError):
        split_parties(np.array([0, 1, 0]), 4)


# ---------------------------------------------------------------- exact statistics


def test_moment_sums_are_exact_and_independent_of_the_partition():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 5)) * np.array([1e-300, 1.0, 1e8, 3.0, 0.0]) + np.array([0, 5, -7e8, 0.1, 2.5])
    X[::7, 1] = 0.0
    whole = moment_sums(X)
    exact_sum = [sum((Fraction(v) for v in X[:, j]), Fraction(0)) for j in range(5)]
    exact_sq = [sum((Fraction(v) ** 2 for v in X[:, j]), Fraction(0)) for j in range(5)]
    for j in range(5):
        assert _scaled(whole.sum1[j], whole.exponent, 1) == exact_sum[j]
        assert _scaled(whole.sum2[j], 2 * whole.exponent, 1) == exact_sq[j]
    parts = tree_sum([moment_sums(X[i::3]) for i in range(3)])
    for scaling in ("feature", "global"):
        mean, scale = standardisation(whole, scaling)
        mean3, scale3 = standardisation(parts, scaling)
        np.testing.assert_array_equal(mean, mean3)
        np.testing.assert_array_equal(scale, scale3)
        np.testing.assert_allclose(mean, X.mean(axis=0), rtol=1e-12, atol=1e-300)
        np.testing.assert_allclose(scale, feature_scale(X, scaling), rtol=1e-9)
    constant_scale = standardisation(whole, "feature")[1][4]  # constant: max(|mean|, S), S the RMS std
    assert constant_scale == pytest.approx(np.sqrt(np.mean(X.std(axis=0) ** 2)))


@pytest.mark.parametrize("shape,levels", [((1, 2), None), ((7, 3), None), ((500, 9), None), ((400, 5), 4)])
def test_distributed_quantile_equals_choose_input_scale(shape, levels):
    rng = np.random.default_rng(sum(shape))
    Z = rng.standard_normal(shape) * 3 if levels is None else rng.integers(-levels, levels + 1, shape) * 1.5
    parts = [np.sort(np.abs(Z[i::3]).reshape(-1).view(np.int64)) for i in range(3)]
    k, k1, t = quantile_positions(Z.size)
    (a, b), rounds = select_order_statistics(lambda cuts: sum(count_at_most(p, cuts) for p in parts), [k, k1])
    ordered = np.sort(np.abs(Z).reshape(-1))
    assert (a, b) == (ordered[k], ordered[k1]) and rounds <= 8
    assert input_scale_from_order_statistics(a, b, t) == choose_input_scale(Z)


def test_central_fit_matches_the_stock_estimator_up_to_ulps():
    """The canonical statistics are the correctly rounded ones; numpy's float sums differ by ulps only."""
    sp, ref = data("digits"), central("digits")
    clf = FlyNNClassifier(300, 6, 16, 0.5, "feature", True, random_state=5).fit(sp.X_train, sp.y_train)
    np.testing.assert_allclose(ref.spec.mean, clf.mean_, rtol=1e-13)
    np.testing.assert_allclose(ref.spec.scale, clf.scale_, rtol=1e-12)
    stock = IntFlyNN.from_classifier(clf, sp.X_train, sp.y_train, bits=2)
    assert np.mean(stock.predict(sp.X_test) == ref.model.predict(sp.X_test)) > 0.99
    assert ref.spec.input_scale == pytest.approx(choose_input_scale(clf.transform_input(sp.X_train)), rel=1e-12)


# ---------------------------------------------------------------- federated == central


@pytest.mark.parametrize("split_spec", ["iid", "by-class", "dirichlet:0.1"])
@pytest.mark.parametrize("n", [2, 3, 7])
def test_federated_equals_central_exactly(split_spec, n):
    sp = data("digits")
    with LocalBackend(shards(sp, n, split_spec, seed=n)) as backend:
        fit = federated_fit(backend, config_for(), agree_classes(backend))
    assert_same_fit(fit, central("digits"), sp.X_test)


def test_federated_equals_central_with_global_scaling_and_stored_M():
    sp = data("breast_cancer")
    config = FlyNNConfig(200, 8, 16, 1.0, 1, True, "global", False, draw_seed(9), 9)
    with LocalBackend(shards(sp, 4, "by-class")) as backend:
        fit = federated_fit(backend, config, agree_classes(backend))
    assert_same_fit(fit, central_fit(sp.X_train, sp.y_train, config), sp.X_test)


@pytest.fixture(scope="module")
def dask_backend():
    pytest.importorskip("distributed")
    sp = data("digits")
    backend = DaskBackend(shards(sp, 3, "dirichlet:0.1"), n_workers=2, processes=False)
    yield backend
    backend.close()


def test_dask_backend_equals_local_backend(dask_backend):
    sp = data("digits")
    assert len(set(dask_backend.placement)) == 2  # the parties really are on different workers
    # one chunk (one task per round) per worker, whatever the number of parties
    assert len(dask_backend.handles) == 2 and sorted(sum(dask_backend.chunks, [])) == [0, 1, 2]
    classes = agree_classes(dask_backend)
    fit = federated_fit(dask_backend, config_for(), classes)
    assert_same_fit(fit, central("digits"), sp.X_test)
    dp = DPParams(2.0, 50, 3)
    with LocalBackend(shards(sp, 3, "dirichlet:0.1")) as local:
        local_dp = federated_fit(local, config_for(), classes, dp=dp, seed=4)
    np.testing.assert_array_equal(federated_fit(dask_backend, config_for(), classes, dp=dp, seed=4).int_counts,
                                  local_dp.int_counts)
    assert dask_backend.map(party_accuracy, dask_backend.handles, fit.model) == \
        [party_accuracy(s, fit.model) for s in shards(sp, 3, "dirichlet:0.1")]


# ---------------------------------------------------------------- hyper-parameters from every party


def test_config_fits_the_budget_for_all_classes_and_dp_gets_the_data_independent_default():
    sp = data("digits")
    parts = shards(sp, 20, "by-class")
    assert np.unique(parts[0][1]).size == 1
    with LocalBackend(parts) as backend:
        classes = agree_classes(backend)
        config, info = choose_config(backend, 1024, 0, classes, 64, dp=True)
        assert info["hyperparameter_source"] == DP_SHAPE_NOTE
        assert info["selection_communication"]["allreduce_rounds"] == 0  # nothing released to choose it
        fit = federated_fit(backend, config, classes)
    assert fit.model.model_bytes() <= 1024
    assert fit.model.model_bytes() == model_bytes(config.n_hashes, config.n_inputs_per_hash, config.count_bits, 10,
                                                  64, 128, False)
    # the default is the same whatever the data: another data set with as many classes and features, same shape
    other = [(np.random.default_rng(i).standard_normal((30, 64)), np.arange(30) % 10) for i in range(2)]
    with LocalBackend(other) as backend:
        assert choose_config(backend, 1024, 0, classes, 64, dp=True)[0] == config


# ---------------------------------------------------------------- differential privacy


def test_dp_parameters_follow_the_paper():
    dp = DPParams(2.0, 25, 4)
    assert dp.epsilon_0 == pytest.approx(2.0 / (2 * 25 * 4))
    assert dp.laplace_scale == pytest.approx(2 * 25 * 4 / 2.0) == pytest.approx(1 / dp.epsilon_0)
    for bad in [dict(epsilon=0.0, T=1, n_parties=1), dict(epsilon=1.0, T=0, n_parties=1),
                dict(epsilon=-1.0, T=1, n_parties=1)]:
        with pytest.raises(TinyprotoError):
            DPParams(**bad)


def test_exponential_mechanism_weights_are_exp_eps0_count_over_2():
    counts = np.array([0, 1, 3, 7, 7, 12])
    eps0 = 0.3
    w = np.exp(eps0 * counts / 2)
    np.testing.assert_allclose(em_probabilities(counts, eps0), w / w.sum(), rtol=1e-12)
    np.testing.assert_allclose(em_log_weights(counts, eps0), eps0 * counts / 2)
    assert np.isfinite(em_probabilities(np.array([0, 10**9]), 1.0)).all()  # no overflow


def test_exponential_mechanism_sampling_matches_sequential_draws():
    """Gumbel-top-2 vs the paper's two sequential draws without replacement: ordered pair frequencies."""
    counts = np.array([0, 2, 5])
    eps0 = 0.4
    rng = np.random.default_rng(0)
    n = 20000
    observed: dict[tuple, int] = {}
    for _ in range(n):
        pair = tuple(exponential_mechanism_picks(counts, 2, eps0, rng).tolist())
        observed[pair] = observed.get(pair, 0) + 1
    w = np.exp(eps0 * counts / 2)
    chi2 = 0.0
    for i, j in permutations(range(3), 2):
        p = w[i] / w.sum() * w[j] / (w.sum() - w[i])
        chi2 += (observed.get((i, j), 0) - n * p) ** 2 / (n * p)
    assert chi2 < 25.7  # chi-square, 5 degrees of freedom, p = 1e-4


def test_dp_release_picks_at_most_T_non_negative_integers_with_laplace_noise():
    rng = np.random.default_rng(1)
    counts = rng.integers(0, 50, size=(4, 100))
    dp = DPParams(1.0, 30, 2)
    out = dp_release(counts, dp, rng)
    assert out.dtype == np.int64 and out.shape == counts.shape and out.min() >= 0
    assert np.count_nonzero(out) <= 30
    everything = DPParams(1e3, counts.size, 1)  # pick all: the noise is Laplace(scale) around each count
    noise = np.concatenate([dp_release(counts + 10**6, everything, rng) - (counts + 10**6) for _ in range(20)])
    assert np.mean(np.abs(noise)) == pytest.approx(everything.laplace_scale, rel=0.1)


def test_dp_runs_are_seeded_and_each_party_releases_at_most_T():
    sp = data("digits")
    parts = shards(sp, 3)
    config = config_for()
    dp = DPParams(4.0, 40, 3)
    with LocalBackend(parts) as backend:
        classes = agree_classes(backend)
        a = federated_fit(backend, config, classes, dp=dp, seed=1)
        b = federated_fit(backend, config, classes, dp=dp, seed=1)
        c = federated_fit(backend, config, classes, dp=dp, seed=2)
    np.testing.assert_array_equal(a.int_counts, b.int_counts)
    assert not np.array_equal(a.int_counts, c.int_counts)
    assert a.int_counts.min() >= 0 and np.count_nonzero(a.int_counts) <= 3 * dp.T
    streams = party_seed_sequences(1, 3)[1]
    releases = [party_counts(p, a.spec, dp, s) for p, s in zip(parts, streams)]
    assert all(np.count_nonzero(r.int_counts) <= dp.T and r.float_counts is None for r in releases)
    np.testing.assert_array_equal(tree_sum(releases).int_counts, a.int_counts)  # the parties' releases, summed


def test_large_epsilon_recovers_central():
    sp, ref = data("digits"), central("digits")
    parts = shards(sp, 2)
    central_acc = np.mean(ref.model.predict(sp.X_test) == sp.y_test)
    L, m = ref.int_counts.shape
    with LocalBackend(parts) as backend:
        classes = agree_classes(backend)
        everything = federated_fit(backend, config_for(), classes, dp=DPParams(1e12, L * m, 2), seed=0)
        half = federated_fit(backend, config_for(), classes, dp=DPParams(1e9, L * m // 2, 2), seed=0)
    np.testing.assert_array_equal(everything.int_counts, ref.int_counts)  # noise ~1e-8, rounded away
    assert np.mean(half.model.predict(sp.X_test) == sp.y_test) >= central_acc - 0.05


# ---------------------------------------------------------------- the command


def run_cli(*args):
    return CliRunner().invoke(federate_command, list(args), catch_exceptions=False)


def test_federate_writes_a_model_directory(tmp_path):
    out = tmp_path / "fed"
    result = run_cli("wine", "--parties", "3", "--split", "by-class", "--budget", "1kB", "--out", str(out),
                     "--backend", "local", "--json")
    assert result.exit_code == 0, result.output
    md = load_model_dir(out)
    report = md.report
    assert REPORT_KEYS <= set(report)
    assert report["parties"] == 3 and report["dp"] is None and report["split"] == "by-class"
    assert report["counts_equal_pooled"] is True and report["counts_differing_from_pooled"] == 0
    assert report["accuracy"] == report["pooled_same_config_accuracy"] == report["int8_accuracy"]
    assert report["accuracy_vs_compile_points"] == pytest.approx(100 * (report["accuracy"] -
                                                                         report["compile_accuracy"]), abs=1e-4)
    assert report["selection"]["candidates"] > 50 and report["selection"]["bytes_sent_per_party"] > 0
    assert "equals" not in json.dumps({k: v for k, v in report.items() if k != "ledger"})
    assert report["model_bytes"] <= report["budget_bytes"] == 1024
    model = families.load_int_model(md)
    vectors = md.vectors()
    np.testing.assert_array_equal(model.scores(vectors.xq), vectors.scores)
    assert md.meta["hyperparameters"] == report["hyperparameters"]
    assert json.loads(result.stdout)["parties"] == 3
    assert {p.name for p in out.iterdir()} >= {"model.json", "report.json", "test_vectors.npz", "platformio.ini"}
    # the report is written once, inside the atomic directory: what the command returned is what is on disk, and
    # the directory's manifest (written at the swap) still matches it, so nothing rewrote a file afterwards
    assert json.loads(result.stdout) == report
    check_output_dir(out)


def test_federate_on_dask_with_dp(tmp_path):
    pytest.importorskip("distributed")
    out = tmp_path / "fed-dp"
    result = run_cli("iris", "--parties", "2", "--dp-epsilon", "2", "--dp-T", "20", "--out", str(out),
                     "--seed", "3")
    assert result.exit_code == 0, result.output
    report = load_model_dir(out).report
    assert report["backend"] == "dask" and report["cluster"]["workers"] == 2
    dp = report["dp"]
    assert (dp["epsilon"], dp["T"]) == (2.0, 20)
    assert math.isclose(dp["epsilon_0"], 2 / (2 * 20 * 2)) and math.isclose(dp["laplace_scale"], 2 * 20 * 2 / 2)
    assert report["counts_equal_pooled"] is False
    assert report["hyperparameter_source"] == DP_SHAPE_NOTE


@pytest.mark.parametrize("args", [
    ["--parties", "0"],
    ["--parties", "-3"],
    ["--parties", "100000"],
    ["--parties", "2", "--dp-epsilon", "0"],
    ["--parties", "2", "--dp-epsilon", "-1"],
    ["--parties", "2", "--dp-epsilon", "1", "--dp-T", "0"],
    ["--parties", "2", "--split", "dirichlet:0"],
])
def test_federate_refuses_bad_arguments(tmp_path, args):
    out = tmp_path / "never"
    result = CliRunner().invoke(federate_command, ["iris", *args, "--backend", "local", "--out", str(out)])
    assert result.exit_code != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert not out.exists()


# ---------------------------------------------------------------- parties that learn on a (simulated) Uno


def needs_simulated_uno():
    import os
    import shutil

    if shutil.which("avr-gcc") is None or not os.path.exists("/usr/include/simavr/sim_avr.h"):
        pytest.skip("needs avr-gcc and libsimavr-dev")


def tinyproto_cli(*args):
    return tinyproto(*args, timeout=300)


def test_device_parties_release_saturated_counts_and_the_resaturated_sum_is_exact():
    """Each simulated Uno learns its shard; its counts (read with READ_COUNTS) saturate on the device, so their sum
    is not the pooled sum, but the deployed (re-saturated) counts equal central training exactly."""
    needs_simulated_uno()
    from tinyproto.core.boards import load_board
    from tinyproto.federated.device_parties import DeviceBackend

    sp = data("wine")
    config = config_for(n_hashes=120, s=6, rho=16, bits=2)
    classes = np.unique(sp.y_train)
    with DeviceBackend(shards(sp, 2, "by-class"), load_board("uno")) as backend:
        fit = federated_fit(backend, config, classes)
        parties = backend.describe()["device_parties"]
    ref = central_fit(sp.X_train, sp.y_train, config, classes)
    assert [p["counts_identical_to_host"] for p in parties] == [True, True]
    assert all(p["entries_at_cap"] > 0 for p in parties)  # the devices did saturate
    assert not np.array_equal(fit.int_counts, ref.int_counts)  # so the raw sums differ ...
    np.testing.assert_array_equal(fit.model.counts, ref.model.counts)  # ... but not the model
    np.testing.assert_array_equal(fit.model.predict(sp.X_test), ref.model.predict(sp.X_test))


def test_federate_sim_backend_equals_local_and_validates_on_the_simulator(tmp_path):
    needs_simulated_uno()
    out = tmp_path / "fed-sim"
    result = run_cli("wine", "--parties", "3", "--split", "dirichlet:0.5", "--json", "--backend", "sim", "--out",
                     str(out))
    assert result.exit_code == 0, result.output
    report = load_model_dir(out).report
    assert report["backend"] == "sim" and report["counts_equal_pooled"] is True
    assert report["counts_differing_from_pooled"] == 0
    parties = report["cluster"]["device_parties"]
    assert len(parties) == 3 and all(p["counts_identical_to_host"] for p in parties)
    assert sum(p["n_samples"] for p in parties) == sum(report["party_rows"])
    # the device-learned model is the one the same configuration gives on the pooled rows, exactly
    sim_model, sp, chosen = load_model_dir(out), data("wine"), report["hyperparameters"]
    config = FlyNNConfig(chosen["n_hashes"], chosen["n_inputs_per_hash"], chosen["n_winners"], chosen["decay"],
                             chosen["count_bits"], chosen["store_M"], chosen["scaling"], chosen["sign_split"],
                             chosen["seed"], solver_random_state(report["seed"]))
    pooled = central_fit(sp.X_train, sp.y_train, config).model
    assert sim_model.meta["int_model"] == json.loads(json.dumps(pooled.to_json()))
    built = tinyproto_cli("build", str(out))
    assert built.returncode == 0, built.stderr
    checked = tinyproto_cli("validate", str(out), "--sim", "--json")
    assert checked.returncode == 0, checked.stderr
    validation = json.loads(checked.stdout)
    assert validation["complete"] and validation["score_agreement"] == validation["label_agreement"] == 1.0


def test_federate_port_backend_refuses_a_missing_port(tmp_path):
    out = tmp_path / "never"
    result = CliRunner().invoke(federate_command, ["iris", "--parties", "1", "--backend", "port", "--ports",
                                                   "/dev/does-not-exist", "--out", str(out)])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: serial port /dev/does-not-exist does not exist")
    assert not out.exists()
    for args in (["--backend", "port"], ["--backend", "sim", "--ports", "/dev/null"],
                 ["--backend", "port", "--ports", "/dev/null,/dev/null"]):
        result = CliRunner().invoke(federate_command, ["iris", "--parties", "2", *args, "--out", str(out)])
        assert result.exit_code == 1 and result.stderr.startswith("error: ") and not out.exists()
    # an empty item (a trailing comma) was dropped: "/dev/ttyACM0," went on as one port, as --budgets "1kB," never did
    result = CliRunner().invoke(federate_command, ["iris", "--parties", "1", "--backend", "port", "--ports",
                                                   "/dev/does-not-exist,", "--out", str(out)])
    assert result.exit_code == 1 and "without empty items" in result.stderr and not out.exists(), result.stderr


def test_many_parties_are_summarised_not_listed(tmp_path):
    """40 parties: the terminal gives the spread of rows and classes per party; report.json keeps every party's."""
    out = tmp_path / "fed"
    result = CliRunner().invoke(federate_command, ["iris", "--parties", "40", "--backend", "local", "--out", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads((out / "report.json").read_text())
    rows = sorted(report["party_rows"])
    assert len(rows) == 40
    text = " ".join(result.output.split())
    assert f"40 parties: min {rows[0]}, median {rows[20]}, max {rows[-1]}" in text
    rows_cell = text[text.index("rows per party"):text.index("classes per party")]
    assert rows_cell.count(",") <= 3  # not 39 commas of a list
# ----------------------------------------------------------------------------------------- device parties' scratch


def test_federate_device_parties_build_in_a_private_scratch_removed_after_a_kill(work):
    """The learning project of `federate --backend sim` goes to a locked private scratch: removed on close, and
    one a SIGKILL left (its lock free) is removed by the next run, never left in $TMPDIR for ever."""
    import numpy as np

    from tinyproto.core.boards import load_board
    from tinyproto.federated.device_parties import DeviceBackend

    tmp = Path(tempfile.gettempdir())
    stale = tmp / "tinyproto-federate-killed"
    stale.mkdir()
    (stale / LOCK).write_text("999999 scratch\n")
    shards = [(np.zeros((4, 2), np.float32), np.array([0, 1, 0, 1]))]
    backend = DeviceBackend(shards, load_board("uno"))
    assert not stale.exists(), "a killed run's scratch stayed"
    scratch = [p for p in tmp.iterdir() if p.name.startswith("tinyproto-federate-")]
    assert len(scratch) == 1 and (scratch[0] / LOCK).is_file()
    backend.close()
    assert not any(p.name.startswith("tinyproto-federate-") for p in tmp.iterdir())


def test_federate_sim_fails_on_device_figures_that_are_no_measurement(tmp_path, monkeypatch):
    """Devices that learn every count right but report 0 cycles per learning step: learn_cycles_mean was reported
    as 0.0 and the command succeeded. Now the figure is null and named in report.json, and federate exits 1 saying
    so (as learn does for one device)."""
    needs_simulated_uno()
    from tinyproto.device import client
    from tinyproto.device.codec import LearnAck

    learn = client.DeviceClient.learn
    monkeypatch.setattr(client.DeviceClient, "learn",
                        lambda self, xq, label: LearnAck(learn(self, xq, label).n_samples, 0))
    out = tmp_path / "fed"
    result = CliRunner().invoke(federate_command, ["iris", "--parties", "2", "--backend", "sim", "--json", "--out",
                                                   str(out)])
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines()[-1].startswith("error: the devices' figures are not measurements: "
                                                             "party 0: "), result.stderr
    assert "0 cycles" in result.stderr
    parties = load_model_dir(out).report["cluster"]["device_parties"]
    assert all(p["counts_identical_to_host"] and p["learn_cycles_mean"] is None for p in parties)
    assert all(len(p["device_figure_problems"]) == 1 for p in parties)
