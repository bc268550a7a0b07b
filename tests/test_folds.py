"""The validation yardstick (tinyproto.core.folds): a row's fold follows from the row, so compile and every
partition of the rows into parties draw the same folds, balanced per class; and federated training without DP
deploys exactly the model compile deploys from the pooled rows."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from tinyproto.core.folds import Folds, Plan, assign, bin_folds, class_bins, row_keys


def _table(n=600, d=5, classes=3, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)), rng.integers(0, classes, size=n)


def test_folds_are_deterministic_seeded_and_follow_the_rows_not_their_order():
    X, y = _table()
    a = Folds.standard(X, y, 0)
    assert np.array_equal(a.ids, Folds.standard(X, y, 0).ids)
    assert not np.array_equal(a.ids, Folds.standard(X, y, 1).ids)
    order = np.random.default_rng(5).permutation(len(y))
    shuffled = Folds.standard(X[order], y[order], 0)
    assert np.array_equal(shuffled.ids, a.ids[:, order])


def test_parties_summing_their_histograms_place_every_row_as_the_pooled_rows_do():
    X, y = _table(n=900)
    classes, y_index = np.unique(y, return_inverse=True)
    pooled = Folds.standard(X, y, 3)
    parties = np.array_split(np.random.default_rng(1).permutation(len(y)), 7)
    plan = Plan.for_rows(len(y))
    keys = [row_keys(X[p], y_index[p], 3, plan.n_repeats) for p in parties]
    histogram = sum(class_bins(k, y_index[p], len(classes)) for k, p in zip(keys, parties))
    folds_of_bins = bin_folds(histogram, plan.n_folds)
    for k, p in zip(keys, parties):
        assert np.array_equal(assign(k, y_index[p], folds_of_bins), pooled.ids[:, p])


def test_every_class_is_spread_evenly_over_the_folds():
    X, y = _table(n=1500, classes=5)
    folds = Folds.standard(X, y, 0)
    for r in range(folds.n_repeats):
        for c in np.unique(y):
            per_fold = np.bincount(folds.ids[r][y == c], minlength=folds.n_folds)
            assert per_fold.max() - per_fold.min() <= 2, per_fold  # within a bin's rows of exact


def test_duplicates_share_a_fold_and_do_not_break_the_balance():
    X, y = _table(n=300)
    X, y = np.concatenate([X, X, X[:50]]), np.concatenate([y, y, y[:50]])  # every row at least twice
    folds = Folds.standard(X, y, 0)
    assert np.array_equal(folds.ids[:, :300], folds.ids[:, 300:600])
    sizes = np.bincount(folds.ids[0], minlength=folds.n_folds)
    assert sizes.min() > 0.8 * len(y) / folds.n_folds
    assert all(len(v) and len(t) for t, v in folds.splits())


def test_small_data_is_repeated_and_large_data_held_out():
    assert Plan.for_rows(133).n_repeats > 1 and Plan.for_rows(133).validated == Plan.for_rows(133).n_folds
    assert Plan.for_rows(5000) == Plan(Plan.for_rows(5000).n_folds, 1, 1)


# federate compares its model with a reference: what compile's solver deploys from the pooled rows
# (pipeline.federate._compile_reference, seconds of solver). On digits the real function computes it, once per run for
# each exact input (whichever worker asks first), so digits' three partitions compare with one solve of it; on the
# other data sets the reference is the model `compile` itself wrote (read from its directory, its calibration left
# out), which every test here compares with anyway: a second solve of the same rows would only repeat it.
REFERENCE_SOLVED_ON = "digits"


def _solved_once(shared_once):
    """_compile_reference by the real function, shared by every test and worker of the run."""
    from tinyproto.pipeline import federate

    real = federate._compile_reference

    def once(sp, budget_bytes, seed, board, learnable):
        digest = hashlib.sha256()
        for a in (sp.X_train, sp.y_train, sp.X_test, sp.y_test):
            a = np.ascontiguousarray(a)
            digest.update(f"{a.dtype.str}{a.shape}".encode() + a.tobytes())
        key = f"federate-reference-{digest.hexdigest()}-{budget_bytes}-{seed}-{board.name}-{learnable}"

        def make(into: Path) -> None:
            (into / "reference.json").write_text(json.dumps(real(sp, budget_bytes, seed, board, learnable)))

        return json.loads((shared_once(key, make) / "reference.json").read_text())

    return once


def _compiled_as_reference(central: Path):
    """_compile_reference's answer read from what `compile` wrote into `central` (same budget, seed and board)."""
    from tinyproto import families
    from tinyproto.pipeline import federate

    model_json = json.loads((central / "model.json").read_text())
    report = json.loads((central / "report.json").read_text())

    def reference(sp, budget_bytes, seed, board, learnable):
        asked = (budget_bytes, seed, board.name, learnable)
        assert asked == (model_json["budget_bytes"], model_json["seed"], model_json["board"], False), asked
        model = families.int_model_from_json({k: v for k, v in model_json["int_model"].items() if k != "confidence"})
        return {"accuracy": float(np.mean(model.predict(sp.X_test) == sp.y_test)),
                "model_bytes": model.model_bytes(), "hyperparameters": report["hyperparameters"],
                "cv_accuracy": report["solver"]["cv_accuracy"],
                "digests": federate.deployed_digests(model, seed, budget_bytes), "seed": seed,
                "budget_bytes": budget_bytes}

    return reference


@pytest.fixture
def federate_and_compile(tmp_path, compiled, shared_once, monkeypatch):
    """federate_and_compile(data, parties, split) -> {report, same_int_model}: `federate DATA --parties N --split S
    --backend local` against what `compile DATA --model <that family> --budget 2kB --seed 0` writes (the run's
    shared compile of it)."""
    from tinyproto.pipeline import federate
    from tinyproto.pipeline.federate import FederateOptions, federate_model

    from tinyproto import families

    def run(data: str, parties: int, split: str) -> dict:
        federated_family = families.learnable_names()[0]  # the family federated training trains
        central = compiled(data, "2kB", federated_family)
        monkeypatch.setattr(federate, "_compile_reference", _solved_once(shared_once) if data == REFERENCE_SOLVED_ON
                            else _compiled_as_reference(central))
        options = FederateOptions(parties=parties, backend="local", split_spec=split)
        federated = federate_model(data, options, out=tmp_path / "federated")
        report = federated.report
        central_json = json.loads((central / "model.json").read_text())
        federated_json = json.loads((tmp_path / "federated/model.json").read_text())
        central_model = {k: v for k, v in central_json["int_model"].items() if k != "confidence"}
        return {"report": report, "same_int_model": central_model == federated_json["int_model"]}

    return run


@pytest.mark.parametrize("data,parties,split", [("digits", 1, "iid"), ("digits", 5, "by-class"),
                                                ("segment", 8, "dirichlet:0.3")])
def test_federated_without_dp_is_the_model_compile_deploys(federate_and_compile, data, parties, split):
    out = federate_and_compile(data, parties, split)
    # compile's model less its calibration (which a federated model does not carry); the report's
    # identical_to_compile compares both rendered headers
    assert out["same_int_model"] and out["report"]["identical_to_compile"] is True


@pytest.mark.slow
def test_on_wide_inputs_the_parties_agree_on_compiles_centred_stage(tmp_path, federate_and_compile):
    """784 pixels: compile also tries a centred stage (a 2- or 4-bit centre per pixel, from the feature means of
    the shared stage's values); the parties agree on it from the exact sums of those values, so the federated
    model is still compile's, centred stage included."""
    out = federate_and_compile("digits28", 4, "by-class")
    assert out["same_int_model"] and out["report"]["identical_to_compile"] is True
    federated = json.loads((tmp_path / "federated/model.json").read_text())
    assert federated["int_model"]["input_stage"]["kind"] == "centred"


@pytest.mark.slow
@pytest.mark.parametrize("data,split", [("digits", "iid"), ("segment", "dirichlet:0.3")])
def test_a_thousand_parties_still_deploy_compiles_model(federate_and_compile, data, split):
    out = federate_and_compile(data, 1000, split)
    assert out["same_int_model"] and out["report"]["identical_to_compile"] is True


def _classes_of_copies(varied_class: bool, seed=0):
    """Three classes of 30 rows; classes 1 and 2 are each one row repeated (binary features do this), class 0
    varies unless varied_class is False."""
    rng = np.random.default_rng(seed)
    first = rng.normal(size=(30, 4)) if varied_class else np.full((30, 4), -1.0)
    X = np.concatenate([first, np.ones((30, 4)), np.zeros((30, 4))])
    return X, np.repeat([0, 1, 2], 30)


def test_a_part_that_leaves_one_class_to_train_on_is_not_validated():
    X, y = _classes_of_copies(varied_class=True)
    folds = Folds.standard(X, y, 0)
    assert np.array_equal(np.unique(folds.ids[0, y == 1]).size, 1)  # copies share a fold
    splits = folds.splits()
    assert splits and all(np.unique(y[t]).size >= 2 for t, _ in splits)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(folds.splits(repeat=0), splits))


def test_rows_that_are_all_copies_are_refused_in_one_line():
    from tinyproto.core.errors import TinyprotoError

    X, y = _classes_of_copies(varied_class=False)
    X, y = X[y < 2], y[y < 2]  # two classes, each one row repeated
    with pytest.raises(TinyprotoError, match="each class needs rows that differ"):
        Folds.standard(X, y, 0).splits()


@pytest.mark.parametrize("family", __import__("tinyproto.families", fromlist=["names"]).names())
def test_every_family_trains_on_classes_of_copies(family):
    from tinyproto import families
    from tinyproto.families import SolveOptions

    X, y = _classes_of_copies(varied_class=True)
    options = SolveOptions(512, 0, n_jobs=1, folds=Folds.standard(X, y, 0))
    _, model, _ = families.fit_judged(family, X, y, options, None)
    assert list(model.classes) == [0, 1, 2]
