"""Federated model selection: the budget solver's candidates ranked by K-fold accuracy over every party's rows."""

from __future__ import annotations

import functools
import json

import numpy as np
import pytest

from tinyproto.core.datasets import load_dataset, split
from tinyproto.families.flynn.solver import solver_random_state
from tinyproto.federated.dask_parties import DaskBackend
from tinyproto.federated.local_parties import LocalBackend
from tinyproto.federated.protocol import agree_classes, agree_input_stages, central_fit, choose_config, federated_fit
from tinyproto.federated.shards import split_parties
from tinyproto.federated.stats import tree_sum
from tinyproto.federated import selection as sel
from tinyproto.families.flynn import solver
from tinyproto.families.flynn.quantize import hash_inputs
from tinyproto.families.flynn.seeded_index import draw_seed, seeded_indices
from tinyproto.core.folds import Folds

from helpers import read_only


@functools.lru_cache(maxsize=None)
def data(name: str):
    return read_only(split(load_dataset(name)))


def shards(sp, n, split_spec="iid", seed=0):
    return [(sp.X_train[r], sp.y_train[r]) for r in split_parties(sp.y_train, n, split_spec, seed)]


def compile_report(compiled, name: str, budget: str = "2kB") -> dict:
    """report.json of `compile NAME --model flynn --budget B` (seed 0), the run's shared compile (conftest's
    `compiled`): the budget solver's candidates, the chosen shape and seed, the deployed model's int8 accuracy on
    the test split (the split `data` makes). It is what fit_flynn_under_budget(X_train, y_train, SolveOptions(B, 0))
    gives: on digits at 2 kB the same 581 candidates, seed and accuracy."""
    return json.loads((compiled(name, budget, "flynn") / "report.json").read_text())


@functools.lru_cache(maxsize=None)
def selected(name: str, n: int, split_spec: str, budget: int = 2048):
    sp = data(name)
    with LocalBackend(shards(sp, n, split_spec)) as backend:
        classes = agree_classes(backend)
        return read_only(choose_config(backend, budget, 0, classes, sp.X_train.shape[1]))


def test_federated_tallies_are_the_pooled_cross_validation_on_compiles_folds():
    """Every candidate's accuracy is exactly the solver's estimate on the pooled rows with the yardstick's folds
    (which the parties drew from their own rows): counts and correct predictions add up exactly."""
    sp = data("wine")
    parts = shards(sp, 6, "dirichlet:0.3")
    with LocalBackend(parts) as backend:
        classes = agree_classes(backend)
        stages = agree_input_stages(backend)
        config, info = choose_config(backend, 1024, 0, classes, sp.X_train.shape[1])
    X = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    y_index = np.searchsorted(classes, y)
    folds = Folds.standard(X, y, 0)
    seed_M = draw_seed(solver_random_state(0))
    candidates = [solver.Candidate(**c) for c in info["candidates"]]
    rng = np.random.default_rng(0)
    # and every one with a count scale: the folds' counts are coded as the deployed model's (quantize.fold_codes)
    scaled = [i for i, c in enumerate(candidates) if c.count_scale > 1 and c.bits > 1]
    assert len(scaled) >= 4
    for i in sorted(set(rng.choice(len(candidates), 12, replace=False)) | set(scaled[:: max(1, len(scaled) // 8)])):
        c = candidates[i]
        U = hash_inputs(stages[c.scaling].quantize(X), c.sign_split).astype(float)
        ranked = solver._ranked_winners(U, seeded_indices(seed_M, c.m, c.s, U.shape[1]), [c.m], c.rho)
        assert c.cv_accuracy == solver._cv_accuracies(ranked[c.m], y_index, folds, len(classes), c.m,
                                                      [(c.bits, c.decay, c.count_scale)])[0]
    best = max(candidates, key=solver.candidate_rank)
    assert (config.n_hashes, config.n_inputs_per_hash, config.n_winners, config.count_bits) == \
        (best.m, best.s, best.rho, best.bits)
    assert info["cv_accuracy"] == best.cv_accuracy


@pytest.mark.parametrize("n", [2400, 7500])
def test_on_large_data_the_parties_rank_on_the_folds_the_solver_ranks_on(n):
    """Where the yardstick validates one fold of three (more than 2,000 training rows), the solver ranks FlyNN's
    candidates on every fold unless that hold-out is large (solver.ranking_folds), and so do the parties: the same
    candidates, accuracies and choice as the solver's on the pooled rows."""
    from tinyproto.families import SolveOptions

    rng = np.random.default_rng(4)
    y = np.arange(n) % 3
    X = rng.standard_normal((3, 5))[y] + 1.2 * rng.standard_normal((n, 5))
    folds = Folds.standard(X, y, 0)
    assert folds.validated == 1 and (solver.ranking_folds(folds) is folds) == (n == 7500)
    parts = [(X[i::3], y[i::3]) for i in range(3)]
    with LocalBackend(parts) as backend:
        config, info = choose_config(backend, 512, 0, agree_classes(backend), 5)
    pooled_X, pooled_y = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    _, _, central = solver.fit_flynn_under_budget(pooled_X, pooled_y, SolveOptions(512, 0))
    chosen = central["chosen"]
    assert (config.n_hashes, config.n_inputs_per_hash, config.n_winners, config.count_bits, config.decay,
            config.count_scale, config.scaling, config.sign_split) == \
        (chosen["n_hashes"], chosen["n_inputs_per_hash"], chosen["n_winners"], chosen["count_bits"],
         chosen["decay"], chosen.get("count_scale", 1), chosen["scaling"], chosen["sign_split"])
    assert info["cv_accuracy"] == central["cv_accuracy"]
    assert central["chosen_validation"].get("ranked_accuracy", central["cv_accuracy"]) == central["cv_accuracy"]
    assert ("ranked_accuracy" in central["chosen_validation"]) == (n == 2400)
    key = lambda c: (c["scaling"], c["sign_split"], c["s"], c["m"], c["rho"], c["bits"], c["decay"],  # noqa: E731
                     c["store_M"], c["count_scale"])
    accuracy = {key(c): c["cv_accuracy"] for c in info["candidates"]}
    assert all(accuracy[key(c)] == c["cv_accuracy"] for c in central["candidates"])


def test_selection_uses_the_solvers_candidates_and_tracks_compile(compiled):
    """With four parties the candidate set is the solver's (same shapes, bytes, cycles) and the winner's accuracy on
    the test split is within a point of what compile deploys."""
    sp = data("digits")
    config, info = selected("digits", 4, "iid")
    report = compile_report(compiled, "digits")
    central = report["solver"]
    shape = lambda c: (c["scaling"], c["sign_split"], c["s"], c["m"], c["rho"], c["bits"], c["decay"],  # noqa: E731
                       c["store_M"], c["model_bytes"], c["est_cycles"])
    assert {shape(c) for c in central["candidates"]} <= {shape(c) for c in info["candidates"]} | \
        {shape(c) for c in central["candidates"] if c["scaling"] != config.scaling}
    with LocalBackend(shards(sp, 4)) as backend:
        fit = federated_fit(backend, config, agree_classes(backend))
    acc = np.mean(fit.model.predict(sp.X_test) == sp.y_test)
    assert acc >= report["int8_accuracy"] - 0.01
    assert fit.model.model_bytes() <= 2048 and config.seed == report["hyperparameters"]["seed"]
    comm = info["selection_communication"]
    assert comm["allreduce_rounds"] > 10 and comm["bytes_sent_per_party"] > 0


@pytest.mark.parametrize("n,split_spec", [(64, "by-class")])
def test_many_small_parties_choose_as_well_as_few(compiled, n, split_spec):
    sp = data("digits")
    config, info = selected("digits", n, split_spec)
    with LocalBackend(shards(sp, n, split_spec)) as backend:
        fit = federated_fit(backend, config, agree_classes(backend))
    deployed = compile_report(compiled, "digits")["int8_accuracy"]
    assert np.mean(fit.model.predict(sp.X_test) == sp.y_test) >= deployed - 0.015


def test_selection_is_identical_on_dask_and_deterministic():
    pytest.importorskip("distributed")
    BUDGET = 512  # the same selection steps as at 1 kB over fewer candidate shapes
    sp = data("wine")
    parts = shards(sp, 5, "dirichlet:0.5")
    with LocalBackend(parts) as backend:
        classes = agree_classes(backend)
        local = choose_config(backend, BUDGET, 3, classes, sp.X_train.shape[1])
        again = choose_config(backend, BUDGET, 3, classes, sp.X_train.shape[1])
    with DaskBackend(parts, n_workers=2, processes=False) as backend:
        remote = choose_config(backend, BUDGET, 3, classes, sp.X_train.shape[1])
    strip = lambda info: {k: v for k, v in info.items() if k != "selection_seconds"}  # noqa: E731
    assert local[0] == again[0] == remote[0]
    assert strip(local[1]) == strip(again[1]) == strip(remote[1])


@pytest.mark.parametrize("n,split_spec", [(12, "dirichlet:0.3")])
def test_one_gather_for_every_shape_tallies_as_the_loop_over_shapes(monkeypatch, n, split_spec):
    """A party of a few rows scores every shape in one gather (selection.GatherTables), a larger one shape by
    shape: forced either way on the same parties (rows from 1 to dozens), every party's tallies are the same."""
    sp = data("wine")
    parts = shards(sp, n, split_spec)
    assert min(len(y) for _, y in parts) <= 2 < max(len(y) for _, y in parts)
    tallies = {}
    per_party = sel.party_correct
    for way, at_once in (("one gather", 1 << 62), ("per shape", -1)):
        monkeypatch.setattr(sel, "GATHER_AT_ONCE", at_once)
        seen = []

        def recorded(state, weights, plan):
            seen.append(per_party(state, weights, plan))
            return seen[-1]

        monkeypatch.setattr(sel, "party_correct", recorded)
        with LocalBackend(parts) as backend:
            tallies[way] = (choose_config(backend, 1024, 0, agree_classes(backend), sp.X_train.shape[1]), seen)
    (config, info), seen = tallies["one gather"]
    (config_loop, info_loop), seen_loop = tallies["per shape"]
    assert len(seen) == len(seen_loop) > n
    assert all(a.dtype == b.dtype and np.array_equal(a, b) for a, b in zip(seen, seen_loop))
    assert config == config_loop and info["candidates"] == info_loop["candidates"]


def test_the_local_backend_runs_row_wise_steps_once_on_the_pooled_rows_with_the_same_tallies(monkeypatch):
    """LocalBackend hashes, counts per fold and tallies every party's rows in one call on the pooled rows (the steps
    are row-wise, their sums exact integers): the same choice and every candidate's accuracy as one call per party,
    on parties of 1 to dozens of rows."""
    from tinyproto.federated.local_parties import RowWise

    sp = data("wine")
    parts = shards(sp, 12, "dirichlet:0.3")
    assert min(len(y) for _, y in parts) <= 2 < max(len(y) for _, y in parts)
    steps = (sel.party_hash, sel.party_fold_counts, sel.party_correct)
    pooled_calls = []
    for fn in steps:
        rows = fn.row_wise

        def counted(handles, pool=rows.pool, name=fn.__name__):
            pooled_calls.append((name, len(handles)))
            return pool(handles)

        monkeypatch.setattr(fn, "row_wise", RowWise(counted, rows.split))
    with LocalBackend(parts) as backend:
        pooled = choose_config(backend, 1024, 0, agree_classes(backend), sp.X_train.shape[1])
    assert {name for name, _ in pooled_calls} == {fn.__name__ for fn in steps}
    assert all(n == len(parts) for _, n in pooled_calls)
    for fn in steps:
        monkeypatch.delattr(fn, "row_wise")
    with LocalBackend(parts) as backend:
        per_party = choose_config(backend, 1024, 0, agree_classes(backend), sp.X_train.shape[1])
    strip = lambda info: {k: v for k, v in info.items() if k != "selection_seconds"}  # noqa: E731
    assert pooled[0] == per_party[0] and strip(pooled[1]) == strip(per_party[1])


def test_sparse_counts_add_exactly():
    rng = np.random.default_rng(0)
    sizes = {(4, 2): 40}
    dense = np.zeros(40, dtype=np.int64)
    parts = []
    for _ in range(7):
        keys, values = np.unique(rng.integers(0, 40, 15), return_counts=True)
        dense[keys] += values
        parts.append(sel.SparseCounts(sizes, {(4, 2): keys}, {(4, 2): values.astype(np.int64)}))
    np.testing.assert_array_equal(tree_sum(parts).dense((4, 2), 2, 5).reshape(-1), dense)


def test_sparse_counts_turn_dense_when_smaller_and_still_add_exactly():
    """Pairs cost 16 B each, a dense vector at most 4 B per entry (the narrowest unsigned type): sums switch to the
    dense form once a quarter of the entries are set (what travels between workers is the smaller form), in any
    order of addition; counts past 255 widen the type."""
    rng = np.random.default_rng(1)
    size = 600
    sizes = {(20, 4): size}
    parts, dense = [], np.zeros(size, dtype=np.int64)
    for n_keys in [3, 40, 200, 5, 1, 400, 0, 30]:
        keys = rng.integers(0, size, n_keys)
        np.add.at(dense, keys, 1)
        parts.append(sel.SparseCounts(sizes, {(20, 4): keys}, {(20, 4): np.ones(n_keys, dtype=np.int64)}))
    for order in (parts, parts[::-1], parts[3:] + parts[:3]):
        total = tree_sum(order)
        np.testing.assert_array_equal(total.dense((20, 4), 3, 10).reshape(-1), dense)
        assert total.keys[(20, 4)] is None and total.values[(20, 4)].dtype == np.uint8  # counts < 256
    small = parts[0] + parts[3]
    assert small.keys[(20, 4)] is not None  # 8 pairs: still pairs
    mixed = total + small
    np.testing.assert_array_equal(mixed.dense((20, 4), 3, 10).reshape(-1),
                                  dense + small.dense((20, 4), 3, 10).reshape(-1))
    np.testing.assert_array_equal((small + total).dense((20, 4), 3, 10), mixed.dense((20, 4), 3, 10))  # pairs first
    big = sel.SparseCounts(sizes, {(20, 4): np.zeros(300, dtype=np.int64)}, {(20, 4): np.ones(300, dtype=np.int64)})
    wide = total + big
    assert wide.values[(20, 4)].dtype == np.uint16 and wide.dense((20, 4), 3, 10)[0, 0, 0] == dense[0] + 300
    assert sel.narrowest(np.array([2**40])).dtype == np.int64


def test_federate_is_byte_identical_for_the_same_inputs(tmp_path):
    from tinyproto.pipeline.federate import FederateOptions, federate_model

    outs = []
    for name in ("a", "b"):
        # 0.5 kB: the same writes as at 1 kB, 3.7 s of CPU per federation against 5.1 to 6.1 s on this machine
        options = FederateOptions(5, backend="local", split_spec="dirichlet:0.5", seed=11, budget="0.5kB")
        result = federate_model("wine", options, tmp_path / name)
        outs.append(result.out_dir)
    for f in ("model.json", "test_vectors.npz"):
        assert (outs[0] / f).read_bytes() == (outs[1] / f).read_bytes()
    a, b = (json.loads((o / "report.json").read_text()) for o in outs)
    for report in (a, b):
        for key in ("train_seconds", "federated_seconds"):
            report.pop(key, None)
        report["solver"].pop("selection_seconds", None)
        report["selection"].pop("selection_seconds", None)
    assert a == b


# ---------------------------------------------------------------- wide inputs: the shared input stage


@pytest.mark.parametrize("shape,kind", [((1, 1), "normal"), ((3, 2), "ties"), ((300, 7), "normal"),
                                        ((50, 3), "negative"), ((20, 2), "constant"), ((0, 0), "digits28")])
def test_shared_range_is_agreed_exactly(shape, kind):
    """The shared stage's offset and gain from the parties' exact quantile search equal shared_range on the
    pooled values, bit for bit, for any sign of the values, ties, constants and any partition."""
    from tinyproto.core.inputstage import shared_range
    from tinyproto.federated.stats import count_at_most, exact_shared_range, order_keys, values_of_keys

    rng = np.random.default_rng(shape[0])
    X = {"normal": lambda: rng.normal(size=shape) * 3 - 1,
         "ties": lambda: np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 3.0]]),
         "negative": lambda: -rng.exponential(size=shape), "constant": lambda: np.full(shape, -2.5),
         "digits28": lambda: data("digits28").X_train}[kind]()
    for n_parts in (1, 3, 7):
        parts = [np.sort(order_keys(X[i::n_parts].reshape(-1))) for i in range(n_parts)]
        offset, gain, rounds = exact_shared_range(lambda cuts: sum(count_at_most(p, cuts) for p in parts), X.size)
        assert (offset, gain) == shared_range(X) and rounds <= 8
    v = np.concatenate([rng.normal(size=200), [-0.0, 0.0, -1e300, 1e300, 5e-324, -5e-324]])
    keys = order_keys(v)
    assert np.array_equal(values_of_keys(keys), v + 0.0)
    assert np.array_equal(np.argsort(keys, kind="stable"), np.argsort(v + 0.0, kind="stable"))


def test_wide_inputs_get_the_shared_stage_as_in_compile(compiled):
    """digits16 at 1 kB: a per-feature stage alone is 1024 B, so only the shared stage (4 B) leaves room, as the
    budget solver finds. The federation considers the same candidates, agrees the shared stage exactly (the one
    shared_stage builds on the pooled rows), its counts equal the pooled ones, and under DP the default shape
    takes the shared stage too (it would not fit otherwise)."""
    from tinyproto.core.inputstage import shared_stage

    sp = data("digits16")
    report = compile_report(compiled, "digits16", "1kB")
    central = report["solver"]
    assert report["hyperparameters"]["scaling"] == "shared"
    parts = shards(sp, 16, "by-class")
    with LocalBackend(parts) as backend:
        classes = agree_classes(backend)
        config, info = choose_config(backend, 1024, 0, classes, sp.X_train.shape[1])
        fit = federated_fit(backend, config, classes)
        dp_config, dp_info = choose_config(backend, 1024, 0, classes, sp.X_train.shape[1], dp=True)
    key = lambda c: (c["scaling"], c["sign_split"], c["s"], c["m"], c["rho"], c["bits"], c["decay"],  # noqa: E731
                     c["store_M"], c["model_bytes"], c["est_cycles"])
    stage1 = lambda cs: {key(c) for c in cs if c["s"] in (4, 8) and c["rho"] in (8, 16, 32)  # noqa: E731
                         and c["bits"] in (1, 2) and not c["store_M"]}
    assert stage1(info["candidates"]) == stage1(central["candidates"])
    assert config.scaling == "shared" and fit.model.model_bytes() == info["model_bytes"] <= 1024
    expected = shared_stage(sp.X_train)
    assert fit.model.input_stage.kind == "shared"
    assert (fit.model.input_stage.mean_bits.tobytes(), fit.model.input_stage.gain_bits.tobytes()) == \
        (expected.mean_bits.tobytes(), expected.gain_bits.tobytes())
    pooled = central_fit(sp.X_train, sp.y_train, config, classes)
    np.testing.assert_array_equal(fit.int_counts, pooled.int_counts)
    np.testing.assert_array_equal(fit.float_counts, pooled.float_counts)
    assert dp_config.scaling == "shared" and dp_info["model_bytes"] <= 1024
