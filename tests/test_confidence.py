"""Confidence and "unknown": the integer signals, the calibration, the judged model and its files, and (device) the
simulated Uno answering every vector's confidence and decision exactly as the host reference."""

from __future__ import annotations

import dataclasses
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from tinyproto.core import confidence as C
from tinyproto.core.errors import TinyprotoError


def test_the_doubt_halves_for_every_whole_halving_of_margin():
    assert C.halvings(np.array([0, 3, 4, 7, 8, 65535]), 4).tolist() == [0, 0, 1, 1, 2, C.DOUBT_HALVINGS]
    assert C.confidence_bytes(np.array([0, 9, 10, 25, 30, 79, 80, 65535]), 200, 10).tolist() == [
        55, 55, 155, 205, 230, 254, 255, 255]  # 255 - (200 >> k): 200, 100, 50, 25, ..., 1, 0
    assert C.confidence_bytes(np.array([0, 65535]), 0, 65535).tolist() == [255, 255]
    # the view rounds down (two bytes of the int32); the margin is the uint16 difference the way the scores win
    assert C.score_view(np.array([-1, 255, 256, -257, 2**31 - 1]), 1).tolist() == [-1, 0, 1, -2, 2**23 - 1]
    assert C.margins(np.array([5, -3]), np.array([-32768, -3]), lowest_wins=False).tolist() == [32773, 0]
    assert C.margins(np.array([2]), np.array([9]), lowest_wins=True).tolist() == [7]


def test_the_view_is_the_smallest_byte_that_fits_the_proven_bound():
    assert C.judge_score_byte(48) == 0 and C.judge_score_byte(C.VIEW_MAX) == 0
    assert C.judge_score_byte(C.VIEW_MAX + 1) == 1 and C.judge_score_byte(256 * C.VIEW_MAX) == 1
    assert C.judge_score_byte(256 * C.VIEW_MAX + 1) == 2 and C.judge_score_byte(None) == 2


def test_a_threshold_in_the_view_declines_what_it_declines_in_score_units_up_to_a_view_step():
    """view_threshold carries a novelty threshold (decline: novelty > threshold) into the 16-bit view: unchanged
    when the view is the score; else the view's decision equals the score's except within one step of the
    threshold; beyond the view it is clamped where the device's limit stays inside int16."""
    assert C.view_threshold(-12, 0, lowest_wins=False) == -12 and C.view_threshold(6, 0, lowest_wins=True) == 6
    scores = np.arange(-5000, 5000, 7)
    for lowest_wins in (False, True):
        calibration = C.Calibration(0, 1, lowest_wins, score_byte=1)
        novel = C.novelty(scores, lowest_wins)
        above = C.view_threshold(1234, 1, lowest_wins)
        in_view = C.novelty(C.score_view(scores, 1), lowest_wins) > above
        differ = in_view != (novel > 1234)
        assert not differ.any() or np.abs(novel[differ] - 1234).max() < 256
        assert calibration.defines()["TP_JUDGE_SCORE_BYTE"] == 1
    assert C.view_threshold(10**9, 1, lowest_wins=True) == C.VIEW_MAX + 1
    assert C.view_threshold(-(10**9), 1, lowest_wins=False) == -C.VIEW_MAX - 1


def test_fit_doubt_finds_the_doubt_and_halving_the_hits_were_drawn_with():
    """Rows whose hits are drawn with the very curve the device computes (doubt 160 at a tie, halved every 25 of
    margin): the fit recovers both closely, and its Brier score is no worse than the true pair's. Rows all right
    need no doubt; a step (wrong below margin 8, right from 8) is fitted by a tie's full doubt and a halving that
    ranks every wrong row below every right one."""
    rng = np.random.default_rng(0)
    margin = rng.integers(0, 200, size=20000)
    right = rng.random(20000) < C.confidence_bytes(margin, 160, 25) / 255.0
    doubt, halving = C.fit_doubt(margin, right)
    assert abs(doubt - 160) <= 12 and 21 <= halving <= 29

    def brier(d, h):
        return float(np.mean((C.confidence_bytes(margin, d, h) / 255.0 - right) ** 2))

    assert brier(doubt, halving) <= brier(160, 25)
    assert C.fit_doubt(np.array([0, 5, 90]), np.ones(3, bool)) == (0, 1)
    margin = np.array([0, 2, 4, 6] * 5 + [8, 20, 40, 300] * 20)
    doubt, halving = C.fit_doubt(margin, margin >= 8)
    conf = C.confidence_bytes(margin, doubt, halving)
    assert doubt == 255 and conf[margin < 8].max() < conf[margin >= 8].min()


def test_runner_up_follows_the_score_rule():
    scores = np.array([[5, 9, 7], [3, 1, 2]])
    labels = np.array([1, 1])
    w, r = C.winner_and_runner_up(scores, labels, lowest_wins=False)
    assert w.tolist() == [9, 1] and r.tolist() == [7, 3]
    w, r = C.winner_and_runner_up(scores, labels, lowest_wins=True)
    assert r.tolist() == [5, 2]
    assert C.novelty(np.array([4]), True).tolist() == [4] and C.novelty(np.array([4]), False).tolist() == [-4]


def test_decline_threshold_declines_at_most_the_rate():
    values = np.arange(100)
    t = C.decline_threshold(values, 0.05)
    assert np.mean(values > t) == pytest.approx(0.05)
    assert np.mean(np.zeros(50) > C.decline_threshold(np.zeros(50), 0.05)) == 0  # ties are never split


def test_figures():
    assert C.auroc(np.array([3, 4]), np.array([1, 2])) == 1.0
    assert C.auroc(np.array([1, 2]), np.array([1, 2])) == 0.5
    assert C.expected_calibration_error(np.array([255, 255]), np.array([True, False])) == pytest.approx(0.5)
    fig = C.judged_figures(np.array([255, 128, 10]), np.array([0, 255, 1]), np.array([0, 1, 1]),
                           np.array([0, 1, 0]))
    assert fig["coverage"] == pytest.approx(2 / 3) and fig["accepted_accuracy"] == 0.5 and fig["accuracy"] == 2 / 3


def test_risk_coverage_and_reliability_bins_by_hand():
    confidence = np.array([250, 250, 200, 100, 100, 20])
    correct = np.array([True, True, False, True, False, False])
    coverage, risk = C.risk_coverage(confidence, correct)
    # thresholds 250, 200, 100, 20: rows of one byte are answered together
    np.testing.assert_allclose(coverage, [2 / 6, 3 / 6, 5 / 6, 1.0])
    np.testing.assert_allclose(risk, [0.0, 1 / 3, 2 / 5, 3 / 6])
    bins = C.reliability_bins(confidence, correct)  # tenths of confidence: 250 -> 9, 200 -> 7, 100 -> 3, 20 -> 0
    assert [b[0] for b in bins] == [1, 2, 1, 2]
    assert bins[-1] == (2, pytest.approx(250 / 255), 1.0) and bins[1][2] == 0.5
    ece = sum(n / 6 * abs(acc - mean) for n, mean, acc in bins)
    assert C.expected_calibration_error(confidence, correct) == pytest.approx(ece)
    assert C.risk_coverage(np.array([], dtype=np.int64), np.array([], dtype=bool))[0].size == 0


@pytest.mark.parametrize("text,value", [("5%", 0.05), ("0.1", 0.1), (" 12.5% ", 0.125)])
def test_rate_parses(text, value):
    assert C.parse_rate(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["0", "-1%", "abc", "60%", "nan", "\uff15%", "0_05"])
def test_bad_rate_is_one_clear_error(text):
    with pytest.raises(TinyprotoError, match="--unknown-rate"):
        C.parse_rate(text)


def test_holdout_classes_must_name_classes_and_leave_two():
    assert C.parse_classes("8, 9", list(range(10))) == [8, 9]
    with pytest.raises(TinyprotoError, match="no class '12'"):
        C.parse_classes("12", list(range(10)))
    with pytest.raises(TinyprotoError, match="at least two"):
        C.parse_classes("0,1", [0, 1, 2])


def test_holdout_classes_are_read_as_labels_are():
    """A label '02' is the class 2 (core.labels), so --holdout-classes 02 names it too; it said "no class '02'"."""
    assert C.parse_classes("02,+3", [0, 1, 2, 3, 4]) == [2, 3]
    assert C.parse_classes("-1.0", [-3, -2, -1]) == [-1]
    assert C.parse_classes(" \u0063\u0327 ", ["a b", "\u00e7", "x"]) == ["\u00e7"]  # NFC, as a label cell
    assert C.parse_classes("True", [False, True, 2]) == [True]
    with pytest.raises(TinyprotoError, match="no class '1.5'"):
        C.parse_classes("1.5", [0, 1, 2])
    with pytest.raises(TinyprotoError, match="no class '1'"):
        C.parse_classes("1", ["a", "b", "c"])


@pytest.fixture(scope="module")
def iris_dirs(tmp_path_factory):
    """One small ProtoNN, compiled without and with --unknown-rate and --clip-check (class 2 held out of the third)."""
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    root = tmp_path_factory.mktemp("confidence")
    plain = compile_model("iris", CompileOptions("protonn", "1kB", out=root / "plain", jobs=1))
    unknown = compile_model("iris", CompileOptions("protonn", "1kB", out=root / "unknown", jobs=1, unknown_rate="5%",
                                                   clip_check=True))
    held = compile_model("iris", CompileOptions("protonn", "1kB", out=root / "held", jobs=1, unknown_rate="5%",
                                                clip_check=True, holdout_classes="2"))
    return plain, unknown, held


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.suffix in (".c", ".h", ".ini")}


def test_without_the_option_the_generated_c_differs_only_by_the_threshold(iris_dirs):
    from tinyproto.core.render import CLIP_PROTOTYPE

    plain, unknown, _ = iris_dirs
    a, b = _files(plain.out_dir), _files(unknown.out_dir)
    assert a.keys() == b.keys()
    differing = [name for name in a if a[name] != b[name]]
    assert differing == ["include/tinyproto_model.h"]
    only_a = set(a[differing[0]].decode().splitlines()) - set(b[differing[0]].decode().splitlines())
    only_b = set(b[differing[0]].decode().splitlines()) - set(a[differing[0]].decode().splitlines())
    assert all("TP_MODEL_HASH" in line for line in only_a)
    # the threshold, and the clip check iris's rows (which rarely reach the int8 clip) are given: its defines, the
    # renames of its count and function, and the function's prototype
    assert sorted(line.split()[1] for line in only_b if line.startswith("#define")) == [
        "TP_MODEL_HASH", "TP_UNKNOWN_CLIPS", "TP_UNKNOWN_CLIP_FROM", "TP_UNKNOWN_CLIP_SPAN", "TP_UNKNOWN_LABEL",
        "TP_UNKNOWN_LIMIT",
        "tp_clip_count", "tp_judge_inputs"]
    assert [line for line in only_b if not line.startswith("#define")] == [CLIP_PROTOTYPE]
    assert "TP_UNKNOWN" not in a["include/tinyproto_model.h"].decode()
    assert "clip" not in a["include/tinyproto_model.h"].decode()
    assert plain.report["model_bytes"] == unknown.report["model_bytes"] <= 1024


def test_the_clip_check_is_asked_for_apart_from_the_rate(iris_dirs, tmp_path):
    """--unknown-rate alone fits the threshold only: the header differs from the plain model's by the threshold's
    defines, with no clip check (its count, function and flash), although iris's rows would keep one; and
    --clip-check without a rate is one clear error."""
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    plain, _, _ = iris_dirs
    alone = compile_model("iris", CompileOptions("protonn", "1kB", out=tmp_path / "alone", jobs=1, unknown_rate="5%"))
    a, b = _files(plain.out_dir), _files(alone.out_dir)
    header_a, header_b = (set(f["include/tinyproto_model.h"].decode().splitlines()) for f in (a, b))
    assert sorted(line.split()[1] for line in header_b - header_a) == [
        "TP_MODEL_HASH", "TP_UNKNOWN_LABEL", "TP_UNKNOWN_LIMIT"]
    assert "clips" not in alone.report["confidence"]["calibration"]
    with pytest.raises(TinyprotoError, match="--clip-check is part of --unknown-rate"):
        compile_model("iris", CompileOptions("protonn", "1kB", out=tmp_path / "no", clip_check=True))
    assert not (tmp_path / "no").exists()


def test_report_gives_coverage_calibration_and_held_out_figures(iris_dirs):
    plain, unknown, held = iris_dirs
    conf = plain.report["confidence"]
    assert conf["coverage"] == 1.0 and "held_out" not in conf
    assert 0 <= conf["ece"] <= 1 and 0 <= conf["calibration"]["doubt"] <= 255 and conf["calibration"]["halving"] >= 1
    # the fold models are the final model's shape trained on each fold (Family.fit_shape), not a search each
    assert conf["calibration"]["fold_models"] == ["chosen shape"] * conf["calibration"]["folds"] == ["chosen shape"] * 3
    assert "confidence" not in plain.ledger.by_array()  # two constants in the code, no array in flash
    figures = held.report["confidence"]["held_out"]
    assert figures["rows"] == 50 and 0 <= figures["auroc"] <= 1 and 0 <= figures["declined"] <= 1
    # every row of class 2 is a test row: the 100 rows of classes 0 and 1 split as before, plus all 50 of class 2
    assert held.report["n_train"] + held.report["n_test"] == 150
    from tinyproto.core.modeldir import load_model_dir

    in_test = int(np.sum(load_model_dir(plain.out_dir).vectors().y == 2))  # class 2's rows of the fixed test split
    assert held.report["n_test"] == plain.report["n_test"] - in_test + 50


def test_judged_model_round_trips_and_survives_replace_and_pickle(iris_dirs):
    from tinyproto import families
    from tinyproto.core.modeldir import load_model_dir

    _, unknown, _ = iris_dirs
    model = families.load_int_model(load_model_dir(unknown.out_dir))
    assert model.calibration.unknown_above is not None
    again = pickle.loads(pickle.dumps(model))
    assert again.to_json() == model.to_json()
    changed = dataclasses.replace(model, Z_q=model.Z_q.copy())
    assert changed.calibration == model.calibration
    vectors = load_model_dir(unknown.out_dir).vectors()
    confidence, decided = families.judge(model, vectors.scores, vectors.labels, vectors.xq)
    assert np.array_equal(confidence, vectors.confidence) and np.array_equal(decided, vectors.decided)
    assert model.calibration.has_clips  # iris's inputs rarely reach the clip: the check is fitted, and needs them
    with pytest.raises(ValueError, match="int8 inputs"):
        families.judge(model, vectors.scores, vectors.labels)


def test_a_fold_whose_shape_breaks_the_limits_is_searched_instead():
    """fold_model: the chosen shape on the fold's rows, unless it cannot keep the budget or latency limit there
    (the family's fit_shape raises TinyprotoError): then the family's whole search runs on those rows."""
    from tinyproto.families.judging import fold_model
    from tinyproto.families.solving import SolveOptions

    X, y = np.zeros((30, 2)), np.arange(30) % 3
    calls = []

    def search(X_fold, y_fold, options):
        calls.append(options.folds.validated)
        return None, "searched model", {}

    def shape_ok(X_fold, y_fold, chosen, options):
        return None, f"{chosen['n']} on {len(X_fold)} rows"

    def shape_too_slow(X_fold, y_fold, chosen, options):
        raise TinyprotoError("predicted too slow on these rows")

    assert fold_model(search, shape_ok, {"n": 4}, X, y, SolveOptions(100)) == ("4 on 30 rows", "chosen shape")
    assert calls == []
    assert fold_model(search, shape_too_slow, {"n": 4}, X, y, SolveOptions(100)) == ("searched model", "searched")
    assert calls == [1]  # the fallback search validates on one part of the fold's rows


def test_calibration_takes_the_fold_models_the_solver_left():
    """A model the solver left for the chosen shape and fold (FoldModels) is taken as it is; another shape or
    another fold is trained."""
    from tinyproto.families.judging import fold_model
    from tinyproto.families.solving import FoldModels, SolveOptions

    X, y = np.zeros((30, 2)), np.arange(30) % 3
    left = FoldModels()
    left.offer({"n": 4}, 1, "the solver's model")
    options = SolveOptions(100, fold_models=left)

    def shape(X_fold, y_fold, chosen, options):
        return None, f"{chosen['n']} trained"

    assert fold_model(None, shape, {"n": 4}, X, y, options, 1) == ("the solver's model", "chosen shape")
    assert fold_model(None, shape, {"n": 4}, X, y, options, 0) == ("4 trained", "chosen shape")
    assert fold_model(None, shape, {"n": 5}, X, y, options, 1) == ("5 trained", "chosen shape")


def test_protonn_leaves_exactly_the_models_fit_shape_trains_on_the_folds():
    """Each fold model ProtoNN's solver leaves is the one its fit_shape trains on that fold's rows, bit for bit:
    reusing it changes no calibration."""
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.core.folds import Folds
    from tinyproto.families.protonn.solver import fit_chosen_protonn, fit_protonn_under_budget
    from tinyproto.families.solving import FoldModels, SolveOptions

    sp = split(load_dataset("wine"))
    standard = Folds.standard(sp.X_train, sp.y_train, 0)
    folds = dataclasses.replace(standard, ids=standard.ids[:1])  # one draw of the folds: a third of the fits
    options = SolveOptions(700, 0, folds=folds, fold_models=FoldModels())
    _, _, info = fit_protonn_under_budget(sp.X_train, sp.y_train, options)
    splits = folds.splits()
    assert len(options.fold_models) == len(splits)
    for k, (fit_rows, _) in enumerate(splits):
        left = options.fold_models.take(info["chosen"], k)
        trained = fit_chosen_protonn(sp.X_train[fit_rows], sp.y_train[fit_rows], info["chosen"], options)[1]
        assert left.to_json() == trained.to_json()


@pytest.mark.parametrize("bits,count_scale", [(1, 1), (2, 1), (1, 3), (2, 2)])
def test_flynn_leaves_each_training_row_out_exactly(bits, count_scale):
    """IntFlyNN.left_out_scores: row i's scores are those of the same filters counted without row i (the model
    recounted from the other rows), for every row, weighed through the deployed model's lut (with counts of 2 bits
    or more it is calibrated on all the rows' counts: quantize.calibrated_lut); a model whose counts these rows do
    not give answers None."""
    from dataclasses import replace

    from tinyproto.families.flynn.quantize import IntFlyNN
    from tinyproto.families.flynn.train import FlyNNClassifier

    rng = np.random.default_rng(0)
    X = rng.standard_normal((40, 5))
    y = np.arange(40) % 3
    clf = FlyNNClassifier(n_hashes=48, n_winners=6, decay=0.5, random_state=0).fit(X, y)
    model = IntFlyNN.from_classifier(clf, X, y, bits=bits, count_scale=count_scale)
    left_out = model.left_out_scores(X, y)
    for i in range(len(y)):
        rest = np.arange(len(y)) != i
        without = replace(IntFlyNN.from_classifier(clf, X[rest], y[rest], bits=bits, input_stage=model.input_stage,
                                                   count_scale=count_scale), lut_values=model.lut_values)
        assert np.array_equal(left_out[i], without.scores(model.input_stage.quantize(X[i:i + 1]))[0])
    # not the rows the counts were made of (half of them: with a count scale one row less can floor to the same)
    assert model.left_out_scores(X[:20], y[:20]) is None


def test_the_threshold_comes_from_left_out_rows_when_the_family_gives_them():
    """With a family's exact left-out scores the decline threshold is the rate's quantile of those rows'
    novelty (no fold model, no carry); without them, the fold models' median."""
    from tinyproto.families.judging import left_out_novelty

    class Counting:
        classes = ["a", "b"]

        def left_out_scores(self, X, y_index):
            return np.c_[X[:, 0], X[:, 0] + 1 - 2 * y_index]  # lowest wins: the row's own class by one

        @staticmethod
        def labels(scores):
            return np.argmin(scores, axis=1)

    X = np.arange(20, dtype=np.float64)[:, None]
    y = np.array(["a", "b"] * 10)
    novel = left_out_novelty(Counting(), X, y, lowest_wins=True)
    assert novel.tolist() == [v - (i % 2) for i, v in enumerate(range(20))]
    assert C.decline_threshold(novel, 0.1) == 16  # the two rows of novelty 18 declined: 10 %
    assert left_out_novelty(object(), X, y, lowest_wins=True) is None


def test_the_nearest_threshold_declines_the_share_nearest_the_rate():
    novel = np.repeat([1, 2, 3, 4], [40, 30, 24, 6])  # declined above 3: 6 %, above 2: 30 %
    assert C.nearest_threshold(novel, 0.05) == 3 and C.decline_threshold(novel, 0.05) == 4
    assert C.nearest_threshold(novel, 0.18) == 3  # 6 % and 30 % both 12 points away: the larger threshold
    assert C.nearest_threshold(novel, 0.2) == 2 and C.nearest_threshold(np.array([7]), 0.05) == 7


def test_bnc_threshold_declines_about_the_rate_of_the_rows_it_was_fitted_on():
    """BNC's scores are Hamming distances in bits, one unit for every model of a shape: the fold models' thresholds
    (each the nearest the rate on its rows) are kept as they are (not rescaled by the models' median distances), and
    their median declines about the asked share of the rows it was fitted on (each fold model's validation rows,
    which it did not train on) and of rows the final model did not train on."""
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.core.folds import Folds
    from tinyproto.families.bnc.quantize import IntBNC
    from tinyproto.families.bnc.train import BNCClassifier
    from tinyproto.families.judging import calibrate
    from tinyproto.families.solving import SolveOptions, calibration_splits

    sp = split(load_dataset("digits"))
    X, y, rate = sp.X_train, sp.y_train, 0.05
    trained = []

    def fit_shape(X_fit, y_fit, chosen, options):  # a small BNC, few epochs: the threshold's arithmetic is the subject
        clf = BNCClassifier(n_bits=64, n_prototypes=10, epochs_joint=3, epochs_w=3, random_state=0).fit(X_fit, y_fit)
        trained.append(IntBNC.from_classifier(clf))
        return clf, trained[-1]

    folds = Folds.standard(X, y, 0)
    final = fit_shape(X, y, {}, None)[1]
    judged, info = calibrate(None, fit_shape, {}, final, X, y, SolveOptions(2048, 0, folds=folds), False, rate)
    assert info["carried_thresholds"] == info["fold_thresholds"]
    assert info["fold_scales"] != [info["final_scale"]] * 3  # scales that differ: a rescaling would have moved them
    above = judged.calibration.unknown_above
    assert above == int(np.median(info["fold_thresholds"]))

    def declined(model, rows):
        return (-model.scores(model.input_stage.quantize(rows)).max(axis=1) > above).astype(float)

    fitted_on = np.concatenate([declined(model, X[val_rows])
                                for model, (_, _, val_rows) in zip(trained[1:], calibration_splits(folds))])
    assert rate / 2 <= fitted_on.mean() <= rate * 1.5
    assert rate / 3 <= declined(final, sp.X_test).mean() <= rate * 2


def test_holdout_and_rate_errors_are_one_line(tmp_path):
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    with pytest.raises(TinyprotoError, match="--holdout-classes: no class"):
        compile_model("iris", CompileOptions("protonn", "1kB", out=tmp_path / "x", holdout_classes="7"))
    for typo in ("0,", ",0", "0,,1"):  # "0," held out class 0 alone where "0,1" was meant: every list option refuses
        with pytest.raises(TinyprotoError, match="without empty items"):
            compile_model("iris", CompileOptions("protonn", "1kB", out=tmp_path / "x", holdout_classes=typo))
    with pytest.raises(TinyprotoError, match="needs at least one class"):
        compile_model("iris", CompileOptions("protonn", "1kB", out=tmp_path / "x", holdout_classes=" , "))
    with pytest.raises(TinyprotoError, match="--unknown-rate"):
        compile_model("iris", CompileOptions("protonn", "1kB", out=tmp_path / "x", unknown_rate="lots"))
    assert not (tmp_path / "x").exists()


@pytest.mark.device
def test_simulated_uno_answers_confidence_and_unknown_like_the_host(iris_dirs):
    """Every vector's label, scores, confidence byte and unknown decision on the simulated Uno, each its own
    check of validate (the held-out class makes some vectors unknown)."""
    from tinyproto.pipeline.firmware import build_model_dir
    from tinyproto.pipeline.validate import validate

    if shutil.which("avr-gcc") is None:
        pytest.skip("avr-gcc not installed")
    _, _, held = iris_dirs
    from rich.console import Console

    build_model_dir(held.out_dir, None, Console(quiet=True))
    summary = validate(held.out_dir)
    checks = summary["checks"]
    assert summary["passed"] and checks["confidence"]["ok"] and checks["unknown"]["ok"]
    from tinyproto import families
    from tinyproto.core.modeldir import load_model_dir

    vectors = load_model_dir(held.out_dir).vectors()
    assert np.any(vectors.decided == C.UNKNOWN_LABEL)
    calibration = families.load_int_model(load_model_dir(held.out_dir)).calibration
    clipped = C.clip_counts(vectors.xq, calibration.clip_side) > calibration.clip_above
    assert clipped.any() and (vectors.decided[clipped] == C.UNKNOWN_LABEL).all()  # the clip check, on the device too


@pytest.mark.device
@pytest.mark.parametrize("family,data,held,budget", [("flynn", "iris", "2", "1kB"), ("bnc", "iris", "2", "1kB"),
                                                     ("bloom", "segment", "sky", "2kB")])
def test_every_family_counts_its_inputs_at_the_clip_on_the_simulated_uno(tmp_path, family, data, held, budget):
    """The clip check through each family's own runtime (FlyNN's tp_predict on the gathered input, BNC's and Bloom
    features' tp_stream_feed chunk by chunk, beside Bloom features' range check; on iris's test rows Bloom
    features' stage clips none, on segment's sky many): every vector's answer on the simulated Uno, int8 and raw,
    equals the host reference's, and some are declined for their clipped inputs."""
    from rich.console import Console

    from tinyproto import families
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.pipeline.compile import CompileOptions, compile_model
    from tinyproto.pipeline.firmware import build_model_dir
    from tinyproto.pipeline.validate import validate

    if shutil.which("avr-gcc") is None:
        pytest.skip("avr-gcc not installed")
    out = tmp_path / family
    compile_model(data, CompileOptions(family, budget, out=out, jobs=1, unknown_rate="5%", clip_check=True,
                                       holdout_classes=held))
    calibration = families.load_int_model(load_model_dir(out)).calibration
    vectors = load_model_dir(out).vectors()
    assert calibration.has_clips
    clipped = C.clip_counts(vectors.xq, calibration.clip_side) > calibration.clip_above
    assert clipped.any() and (vectors.decided[clipped] == C.UNKNOWN_LABEL).all()
    build_model_dir(out, None, Console(quiet=True))
    summary = validate(out)
    checks = summary["checks"]
    assert summary["passed"] and checks["unknown"]["ok"] and checks["raw_input"]["ok"]


_JUDGE_DRIVER = r"""
#include <stdio.h>
#include "tinyproto_model.h"
uint8_t tp_predict(const int8_t *x, int32_t *scores) { (void)x; (void)scores; return 0; }
int main(void)
{
    long values[TP_N_CLASSES];
    unsigned label;
    while (scanf("%u", &label) == 1) {
        int32_t scores[TP_N_CLASSES];
        for (int c = 0; c < TP_N_CLASSES; ++c) {
            if (scanf("%ld", &values[c]) != 1) return 1;
            scores[c] = (int32_t)values[c];
        }
        uint8_t confidence = 0;
        uint8_t decided = tp_judge(scores, (uint8_t)label, &confidence);
        printf("%u %u\n", (unsigned)confidence, (unsigned)decided);
    }
    return 0;
}
"""


def _judge_rows(n_classes: int, score_byte: int, lowest_wins: bool, rows: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """Random and extreme int32 scores within the bound the view was chosen for (small ones, the bound at both
    ends, every class tied, only the extremes), and each row's label by the score rule."""
    rng = np.random.default_rng(3)
    top = 2**31 - 1 if score_byte == 2 else C.VIEW_MAX * 256**score_byte
    assert C.judge_score_byte(top) == score_byte
    scores = rng.integers(-top - (score_byte == 2), top + 1, size=(rows, n_classes), dtype=np.int64)
    scores[:rows // 4] = rng.integers(-50 * 256**score_byte, 50 * 256**score_byte, size=(rows // 4, n_classes))
    extremes = [top, -top - (score_byte == 2), 0, 1, -1] * n_classes
    scores[rows // 4:rows // 4 + 10] = [extremes[:n_classes]] * 10
    scores[rows // 4 + 10:rows // 4 + 20] = 7  # every class tied
    scores[rows // 4 + 20:rows // 4 + 30] = rng.choice([-top, top], size=(10, n_classes))
    labels = (scores.argmin(axis=1) if lowest_wins else scores.argmax(axis=1)).astype(np.int64)
    return scores, labels


def _write_judge_header(directory: Path, n_classes: int, calibration) -> str:
    """The generated model header of a model of n_classes classes with this calibration and no arrays."""
    from tinyproto.core.render import jinja_env

    defines = [("TP_N_CLASSES", str(n_classes)), *((k, f"({v})" if v < 0 else str(v))
                                                   for k, v in calibration.defines().items())]
    header = jinja_env().get_template("tinyproto_model.h.j2").render(
        version="test", family="test", dataset="test", seed=0, model_bytes=0, budget_bytes=16, abi=1,
        defines=defines, arrays=[])
    (directory / "tinyproto_model.h").write_text(header)
    return header


@pytest.mark.parametrize("lowest_wins", [False, True])
@pytest.mark.parametrize("score_byte,halving,doubt,above", [
    (0, 1, 200, 10), (0, 7, 255, 10), (1, 3, 128, 10), (2, 300, 90, 10), (0, 65535, 77, 10), (1, 1, 0, 10),
    (1, 2, 255, C.VIEW_MAX + 1), (0, 5, 31, -C.VIEW_MAX - 1)])
def test_host_compiled_tp_judge_equals_the_reference(tmp_path, lowest_wins, score_byte, halving, doubt, above):
    """tp_judge.c, compiled for the host, against Calibration.judge on random and extreme scores (both score
    rules, every view, the smallest and largest halving and doubt, a decline threshold inside and beyond both ends
    of a bounded view): the same confidence byte and answer for every row. The scores are drawn within the bound
    the view was chosen for."""
    import subprocess

    from tinyproto.core.resources import resource_dir

    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    scores, labels = _judge_rows(5, score_byte, lowest_wins)
    calibration = C.Calibration(doubt, halving, lowest_wins, unknown_above=above, score_byte=score_byte)
    header = _write_judge_header(tmp_path, 5, calibration)
    (tmp_path / "driver.c").write_text("#define TP_MODEL_DATA\n" + _JUDGE_DRIVER)
    firmware = resource_dir("firmware")
    subprocess.run(["gcc", "-std=gnu99", "-Wall", "-Wextra", "-Werror", f"-I{tmp_path}", f"-I{firmware}",
                    str(tmp_path / "driver.c"), str(firmware / "tp_judge.c"), "-o", str(tmp_path / "judge")],
                   check=True, capture_output=True)
    text = "\n".join(f"{l} " + " ".join(str(int(v)) for v in row) for l, row in zip(labels, scores))
    out = subprocess.run([str(tmp_path / "judge")], input=text.encode(), capture_output=True, check=True).stdout
    device = np.array([line.split() for line in out.decode().splitlines()], dtype=np.int64)
    confidence, decided = calibration.judge(scores, labels)
    np.testing.assert_array_equal(device[:, 0], confidence)
    np.testing.assert_array_equal(device[:, 1], decided)
    declined = (decided == C.UNKNOWN_LABEL).mean()
    assert 0 < declined < 1 if above == 10 else declined in (0.0, 1.0)
    if doubt == 0 or halving == 65535:  # no doubt to halve, or no uint16 margin reaches one halving
        assert set(confidence.tolist()) == {255 - doubt}
    else:
        assert len(set(confidence.tolist())) > 3
    assert f"TP_JUDGE_SCORE_BYTE {score_byte}" in header and f"TP_JUDGE_HALVING {halving}" in header


_AVR_JUDGE_DRIVER = r"""
#include <string.h>
#include <avr/io.h>
#include <avr/pgmspace.h>
#include "tinyproto_model.h"
#include "judge_rows.h"
uint8_t tp_predict(const int8_t *x, int32_t *scores) { (void)x; (void)scores; return 0; }
static void put(uint8_t byte)
{
    while (!(UCSR0A & (1 << UDRE0))) {
    }
    UDR0 = byte;
}
int main(void)
{
    UBRR0H = 0;
    UBRR0L = 1; /* 1 Mbaud at 16 MHz with U2X0 */
    UCSR0A = 1 << U2X0;
    UCSR0B = (1 << TXEN0) | (1 << RXEN0);
    while (!(UCSR0A & (1 << RXC0))) { /* the host's go: it listens from here on */
    }
    (void)UDR0;
    for (uint16_t r = 0; r < JUDGE_ROWS; ++r) {
        int32_t scores[TP_N_CLASSES];
        memcpy_P(scores, judge_scores[r], sizeof scores);
        uint8_t confidence = 0;
        uint8_t decided = tp_judge(scores, pgm_read_byte(&judge_labels[r]), &confidence);
        put(confidence);
        put(decided);
    }
    for (;;) {
    }
}
"""


def _judge_on_the_simulated_uno(directory: Path, scores, labels, driver: str, extra: str = "") -> np.ndarray:
    """Build `driver` with firmware/tp_judge.c and the rows (and the header _write_judge_header wrote in directory)
    for the simulated Uno, run it, and return its (confidence, decision) bytes, one row per score row."""
    import serial

    from tinyproto.core.resources import resource_dir
    from tinyproto.device.sim import SimulatedUno

    rows = ",\n".join("{" + ", ".join(f"{int(v)}L" for v in row) + "}" for row in scores)
    (directory / "judge_rows.h").write_text(
        f"#define JUDGE_ROWS {len(scores)}\n"
        f"static const int32_t judge_scores[JUDGE_ROWS][TP_N_CLASSES] PROGMEM = {{\n{rows}}};\n"
        f"static const uint8_t judge_labels[JUDGE_ROWS] PROGMEM = {{{', '.join(str(int(v)) for v in labels)}}};\n"
        + extra)
    (directory / "driver.c").write_text(driver)
    firmware = resource_dir("firmware")
    elf = directory / "judge.elf"
    __import__("subprocess").run(["avr-gcc", "-std=gnu99", "-Os", "-mmcu=atmega328p", "-DF_CPU=16000000UL", "-Wall",
                                  "-Wextra", "-Werror", f"-I{directory}", f"-I{firmware}", str(directory / "driver.c"),
                                  str(firmware / "tp_judge.c"), "-o", str(elf)], check=True, capture_output=True)
    with SimulatedUno(elf, markers=False) as uno, serial.Serial(uno.port, 1_000_000, timeout=10) as port:
        port.write(b"g")
        answer = port.read(2 * len(scores))
    assert len(answer) == 2 * len(scores), f"the simulated Uno answered {len(answer)} of {2 * len(scores)} bytes"
    return np.frombuffer(answer, dtype=np.uint8).reshape(-1, 2).astype(np.int64)


@pytest.mark.device
@pytest.mark.parametrize("n_classes,score_byte,lowest_wins,halving,doubt,above", [
    (10, 0, True, 3, 200, 10), (10, 1, False, 1, 255, 10), (16, 2, True, 300, 90, -C.VIEW_MAX - 1),
    (16, 2, False, 7, 128, 10), (17, 0, False, 2, 160, C.VIEW_MAX + 1), (20, 1, True, 65535, 77, 10),
    (2, 0, False, 1, 0, -C.VIEW_MAX - 1), (2, 1, True, 5, 31, C.VIEW_MAX + 1)])
def test_the_avr_assembly_of_tp_judge_equals_the_reference(tmp_path, n_classes, score_byte, lowest_wins, halving,
                                                           doubt, above):
    """tp_judge's AVR assembly, run on the simulated Uno on random and extreme scores: the same confidence byte
    and answer as Calibration.judge for every row. Both score rules, every view, both loops (backward up to 16
    classes, forward beyond), 2 classes, the smallest and largest halving and doubt, and decline thresholds inside
    and at both clamps."""
    if shutil.which("avr-gcc") is None:
        pytest.skip("avr-gcc not installed")
    scores, labels = _judge_rows(n_classes, score_byte, lowest_wins, rows=160)
    calibration = C.Calibration(doubt, halving, lowest_wins, unknown_above=above, score_byte=score_byte)
    _write_judge_header(tmp_path, n_classes, calibration)
    device = _judge_on_the_simulated_uno(tmp_path, scores, labels, _AVR_JUDGE_DRIVER)
    confidence, decided = calibration.judge(scores, labels)
    np.testing.assert_array_equal(device[:, 0], confidence)
    np.testing.assert_array_equal(device[:, 1], decided)


def test_a_sweep_point_carries_the_rate_and_the_confidence_figures(tmp_path):
    from tinyproto.pipeline.sweep_points import PointSettings, run_point

    point = {"model": "protonn", "budget_bytes": 1024, "seed": 0, "board": "uno"}
    record = run_point(point, "iris", str(tmp_path / "p"), PointSettings(device="none", unknown_rate="5%"))
    assert record["status"] == "ok", record["error"]
    assert set(record["confidence"]) == {"coverage", "accepted_accuracy", "ece", "mean_confidence"}
    assert (tmp_path / "p" / "model.json").read_text().count('"unknown_above": null') == 0


def test_a_model_without_calibration_reports_no_confidence(tmp_path):
    """A producer that writes a plain integer model (federated training): the firmware answers confidence 0 and
    its label, the test vectors say the same, and report.json claims no calibration."""
    from tinyproto import families
    from tinyproto.core.boards import load_board
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.pipeline.compile import Fitted, TrainedOn, write_model_directory

    dataset = load_dataset("iris")
    sp = split(dataset)
    clf, model, info = families.fit_under_budget("protonn", sp.X_train, sp.y_train, families.SolveOptions(1024))
    assert not families.calibrated(model)
    result = write_model_directory(Fitted(clf, model, info), TrainedOn(dataset, sp, 0, 1024, load_board("uno")),
                                   tmp_path / "plain")
    assert result.report["confidence"] is None
    vectors = load_model_dir(tmp_path / "plain").vectors()
    assert not vectors.confidence.any() and np.array_equal(vectors.decided, vectors.labels)
    assert "TP_JUDGE_DOUBT" not in (tmp_path / "plain" / "include" / "tinyproto_model.h").read_text()


def test_the_cost_model_counts_the_confidence_stage(iris_dirs):
    """predict_cycles adds tp_judge's cycles (core/cost.judge_cycles) to the family's own for a calibrated model,
    and the threshold's compare with --unknown-rate."""
    from tinyproto import families
    from tinyproto.core.cost import judge_cycles
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.families import load_int_model, predict_cycles

    plain_dir, unknown_dir, _ = iris_dirs
    judged = load_int_model(load_model_dir(unknown_dir.out_dir))
    assert judged.defines()["TP_JUDGE_HALVING"] == judged.calibration.halving
    own = families.family_of(judged).predict_cycles(judged)["total"]
    assert judged.calibration.has_clips  # iris's rows rarely reach the clip: the check reads every input
    assert predict_cycles(judged)["total"] == own + judge_cycles(judged.n_classes, True, False, judged.n_features)
    assert judge_cycles(judged.n_classes, True, False, 4) == judge_cycles(judged.n_classes, True) + 4 + 4 * 10 + 30
    without_limit = load_int_model(load_model_dir(plain_dir.out_dir))
    assert predict_cycles(without_limit)["judge"] == judge_cycles(judged.n_classes, False)
    bare = type(judged).__mro__[1](**{f.name: getattr(judged, f.name)
                                      for f in dataclasses.fields(type(judged).__mro__[1])})
    assert "judge" not in predict_cycles(bare) and predict_cycles(bare)["total"] == own
    assert judge_cycles(10, True) > judge_cycles(10, False)


@pytest.mark.device
def test_predicted_cycles_with_the_stage_match_the_simulated_uno(built_models):
    """A compiled model runs tp_judge in its timed call; the prediction counts it, so predicted and measured
    agree within the cost model's tolerance (iris ProtoNN 1 kB: the stage is about 5 % of its cycles)."""
    import json

    from tinyproto.core.cost import COST_MODEL_TOLERANCE

    model_dir = built_models("iris", "1kB")
    validation = json.loads((model_dir / "validation.json").read_text())
    report = json.loads((model_dir / "report.json").read_text())
    assert report["predicted_cycles"]["judge"] > 0 and validation["passed"]
    assert abs(validation["predicted_error"]) < COST_MODEL_TOLERANCE


def test_the_goals_table_marks_every_missed_goal():
    """tools/bench_confidence.py --goals: each goal is checked against the figures and a miss is marked `!` and
    counted: the AUROC per family, and for the families with the stricter goals also the declined share and
    the accuracy on the accepted rows above the accuracy on all; the calibration error for every family."""

    from bench_confidence import goal_row

    good = {"held_out": {"auroc": 0.93, "declined": 0.5}, "accepted_accuracy": 0.99, "accuracy": 0.98, "ece": 0.01}
    assert goal_row("protonn", good)[1] == 0
    bad = {"held_out": {"auroc": 0.86, "declined": 0.3}, "accepted_accuracy": 0.97, "accuracy": 0.98, "ece": 0.06}
    cells, missed = goal_row("protonn", bad)
    assert missed == 4 and all(cell.endswith(" !") for cell in cells)
    cells, missed = goal_row("bnc", bad)  # AUROC 0.85 is its goal; no declined or accepted-accuracy goal
    assert missed == 1 and cells[3].endswith(" !") and not cells[0].endswith("!")


_RANGE_DRIVER = r"""
#include <stdio.h>
#include "tinyproto_model.h"
uint8_t tp_range_signal;
uint8_t tp_predict(const int8_t *x, int32_t *scores) { (void)x; (void)scores; return 0; }
int main(void)
{
    unsigned label, signal;
    while (scanf("%u %u", &label, &signal) == 2) {
        int32_t scores[TP_N_CLASSES];
        for (int c = 0; c < TP_N_CLASSES; ++c) {
            long value;
            if (scanf("%ld", &value) != 1) return 1;
            scores[c] = (int32_t)value;
        }
        tp_range_signal = (uint8_t)((uint16_t)(signal - TP_UNKNOWN_RANGE_LOW) >> 8); /* the runtime's bin */
        uint8_t confidence = 0;
        uint8_t decided = tp_judge(scores, (uint8_t)label, &confidence);
        printf("%u %u\n", (unsigned)confidence, (unsigned)decided);
    }
    return 0;
}
"""

_AVR_RANGE_DRIVER = _AVR_JUDGE_DRIVER.replace(
    "uint8_t tp_predict(", "uint8_t tp_range_signal;\nuint8_t tp_predict(").replace(
    "        uint8_t confidence = 0;\n",
    "        tp_range_signal = (uint8_t)((uint16_t)(pgm_read_word(&judge_signals[r]) - TP_UNKNOWN_RANGE_LOW) >> 8);\n"
    "        uint8_t confidence = 0;\n")


def _range_rows(low: int, high: int, rows: int) -> np.ndarray:
    """Range signals at and beside both ends of [low, high], inside it, and anywhere in 0..65535."""
    rng = np.random.default_rng(5)
    edges = [low - 1, low, low + 1, high - 1, high, high + 1, 0, 65535]
    signal = np.concatenate([rng.integers(low, high + 1, rows // 2), rng.integers(0, 65536, rows)])[:rows]
    signal[:len(edges)] = edges
    return np.clip(signal, 0, 65535)


@pytest.mark.parametrize("low,high", [(100, 611), (0, 65279), (256, 65535), (3000, 3255)])
def test_host_compiled_tp_judge_declines_outside_the_range_like_the_reference(tmp_path, low, high):
    """With a range (a family's range signal, Bloom features' φ sum, whose bin (signal - low) >> 8 the runtime
    keeps), tp_judge.c compiled for the host answers unknown for a signal outside [low, high] whatever the scores,
    as Calibration.judge does: both ends and the values beside them, a range starting at 0 and one ending at
    65535 (the most bins, 255), and a single bin."""
    import subprocess

    from tinyproto.core.resources import resource_dir

    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    scores, labels = _judge_rows(5, 1, False, rows=200)
    signal = _range_rows(low, high, 200)
    calibration = C.Calibration(120, 9, False, unknown_above=C.VIEW_MAX + 1, score_byte=1, range_low=low,
                                range_high=high)
    _write_judge_header(tmp_path, 5, calibration)
    (tmp_path / "driver.c").write_text("#define TP_MODEL_DATA\n" + _RANGE_DRIVER)
    firmware = resource_dir("firmware")
    subprocess.run(["gcc", "-std=gnu99", "-Wall", "-Wextra", "-Werror", f"-I{tmp_path}", f"-I{firmware}",
                    str(tmp_path / "driver.c"), str(firmware / "tp_judge.c"), "-o", str(tmp_path / "judge")],
                   check=True, capture_output=True)
    text = "\n".join(f"{l} {s} " + " ".join(str(int(v)) for v in row) for l, s, row in zip(labels, signal, scores))
    out = subprocess.run([str(tmp_path / "judge")], input=text.encode(), capture_output=True, check=True).stdout
    device = np.array([line.split() for line in out.decode().splitlines()], dtype=np.int64)
    confidence, decided = calibration.judge(scores, labels, signal)
    np.testing.assert_array_equal(device[:, 0], confidence)
    np.testing.assert_array_equal(device[:, 1], decided)
    outside = (signal < low) | (signal > high)
    assert outside.any() and (~outside).any()  # the limit alone declines nothing: the range does it all
    assert ((decided == C.UNKNOWN_LABEL) == outside).all()


@pytest.mark.device
@pytest.mark.parametrize("n_classes,lowest_wins,above,low,high", [
    (10, False, 10, 100, 611), (17, True, 10, 0, 65279), (2, False, -C.VIEW_MAX - 1, 256, 65535),
    (4, True, C.VIEW_MAX + 1, 3000, 3255)])
def test_the_avr_assembly_of_tp_judge_checks_the_range_like_the_reference(tmp_path, n_classes, lowest_wins, above,
                                                                          low, high):
    """tp_judge's AVR assembly with a range, on the simulated Uno: the same confidence byte and answer as
    Calibration.judge for every row (both score rules, both loops, a threshold that declines some rows or none,
    ranges at both ends of 0..65535 and of one value)."""
    if shutil.which("avr-gcc") is None:
        pytest.skip("avr-gcc not installed")
    scores, labels = _judge_rows(n_classes, 0, lowest_wins, rows=160)
    signal = _range_rows(low, high, 160)
    calibration = C.Calibration(200, 3, lowest_wins, unknown_above=above, score_byte=0, range_low=low,
                                range_high=high)
    _write_judge_header(tmp_path, n_classes, calibration)
    values = ", ".join(str(int(v)) for v in signal)
    signals = f"static const uint16_t judge_signals[JUDGE_ROWS] PROGMEM = {{{values}}};\n"
    device = _judge_on_the_simulated_uno(tmp_path, scores, labels, _AVR_RANGE_DRIVER, extra=signals)
    confidence, decided = calibration.judge(scores, labels, signal)
    np.testing.assert_array_equal(device[:, 0], confidence)
    np.testing.assert_array_equal(device[:, 1], decided)
    assert (decided[(signal < low) | (signal > high)] == C.UNKNOWN_LABEL).all()


def test_a_range_round_trips_and_a_model_without_one_keeps_its_json():
    """The range is written into model.json only when there is one (a model without it keeps its bytes and hash),
    read back as it was, and a damaged one is one clear error; the novelty score ranks a row outside the range
    above every row inside it."""
    plain = C.Calibration(100, 5, False, unknown_above=-40, unknown_rate=0.05, score_byte=1)
    assert "range" not in plain.to_json() and "TP_UNKNOWN_RANGE_LOW" not in plain.defines()
    ranged = dataclasses.replace(plain, range_low=10, range_high=10 + 2 * 256 - 1)
    assert C.Calibration.from_json(ranged.to_json()) == ranged
    assert ranged.defines()["TP_UNKNOWN_RANGE_LOW"] == 10 and ranged.defines()["TP_UNKNOWN_RANGE_BINS"] == 2
    for bad in ([521, 10], [-1, 510], [1, 70000], [1], "1,2", [10, 90], [0, 65535]):  # [10, 90]: not whole bins
        with pytest.raises(TinyprotoError, match="range"):
            C.Calibration.from_json({**ranged.to_json(), "range": bad})
    with pytest.raises(TinyprotoError, match="range"):
        C.Calibration.from_json({**ranged.to_json(), "unknown_above": None})
    novel = ranged.novelty_score(np.array([5, 500, -3, 0]), np.array([50, 50, 9, 526]))
    assert novel[3] > novel[2] > novel[1] > novel[0]  # 5 above the range, 1 below it, then by the view
    with pytest.raises(ValueError):
        ranged.judge(np.zeros((2, 3)), np.zeros(2, dtype=int))


def test_a_range_is_widened_to_whole_bins_the_device_compares_in_one_byte():
    """whole_bins: the range of the training rows' signals, widened to whole bins of 256 (half the extra below,
    half above), kept within 0..65535, and none when it would take more than 255 bins."""
    assert C.whole_bins(1000, 1000) == (873, 1128)  # 255 more: 127 below, 128 above
    assert C.whole_bins(1000, 1255) == (1000, 1255)
    assert C.whole_bins(1000, 1256) == (873, 1384)
    assert C.whole_bins(3, 300) == (0, 511)  # the extra below would go under 0: all of it above
    assert C.whole_bins(65400, 65535) == (65280, 65535)
    assert C.whole_bins(0, 255 * 256 - 1) == (0, 255 * 256 - 1)
    assert C.whole_bins(0, 255 * 256) is None
    for low, high in [(5, 9), (17083, 28515), (0, 0), (65535, 65535)]:
        wide = C.whole_bins(low, high)
        assert wide[0] <= low and high <= wide[1] <= C.RANGE_MAX and (wide[1] - wide[0] + 1) % C.RANGE_BIN == 0


# ---- the clip check: more int8 inputs at the clip than the training rows allow answers unknown ----------------

_CLIP_FEATURES = 21


def _clip_rows(rows: int) -> np.ndarray:
    """int8 inputs with values at and beside both clips (-128 too, which an int8 PREDICT may carry), so rows have
    0, 1, 2 and many clipped values on either side."""
    rng = np.random.default_rng(11)
    x = rng.integers(-120, 121, (rows, _CLIP_FEATURES))
    edge = np.array([127, -127, -128, 126, -126])
    where = rng.random((rows, _CLIP_FEATURES)) < rng.choice([0.0, 0.03, 0.1, 0.5], size=(rows, 1))
    x[where] = rng.choice(edge, size=int(where.sum()))
    x[0], x[1] = 127, -128  # every input at a clip
    return x.astype(np.int8)


_CLIP_DRIVER = r"""
#include <stdio.h>
#include "tinyproto_model.h"
void tp_judge_inputs(const int8_t *x, uint16_t first, uint16_t n);
uint8_t tp_predict(const int8_t *x, int32_t *scores) { (void)x; (void)scores; return 0; }
int main(void)
{
    unsigned label;
    while (scanf("%u", &label) == 1) {
        int8_t x[NX];
        int32_t scores[TP_N_CLASSES];
        for (int i = 0; i < NX; ++i) {
            int v;
            if (scanf("%d", &v) != 1) return 1;
            x[i] = (int8_t)v;
        }
        for (int c = 0; c < TP_N_CLASSES; ++c) {
            long value;
            if (scanf("%ld", &value) != 1) return 1;
            scores[c] = (int32_t)value;
        }
        tp_judge_inputs(x + 3, 0, 7);                 /* a vector begun and dropped: the next first == 0 restarts */
        for (uint16_t first = 0; first < NX; first = (uint16_t)(first + 5u)) {  /* chunks, as the stream feeds */
            uint16_t n = (uint16_t)(NX - first < 5 ? NX - first : 5);
            tp_judge_inputs(x + first, first, n);
        }
        tp_judge_inputs(x, 1, 0);                     /* an empty chunk counts nothing */
        uint8_t confidence = 0;
        uint8_t decided = tp_judge(scores, (uint8_t)label, &confidence);
        printf("%u %u\n", (unsigned)confidence, (unsigned)decided);
    }
    return 0;
}
"""


@pytest.mark.parametrize("side,above", [("both", 0), ("high", 1), ("low", 0), ("both", 254), ("low", 2)])
def test_host_compiled_tp_judge_declines_inputs_at_the_clip_like_the_reference(tmp_path, side, above):
    """With a clip check, the inputs handed to tp_judge_inputs in chunks (a chunk with first == 0 starting the
    count again) and tp_judge.c compiled for the host answer unknown exactly where Calibration.judge does: more
    inputs than `above` at +127 (high), -127 or -128 (low) or either (both)."""
    import subprocess

    from tinyproto.core.resources import resource_dir

    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    scores, labels = _judge_rows(5, 1, False, rows=200)
    x = _clip_rows(200)
    calibration = C.Calibration(120, 9, False, unknown_above=C.VIEW_MAX + 1, score_byte=1, clip_side=side,
                                clip_above=above)
    _write_judge_header(tmp_path, 5, calibration)
    (tmp_path / "driver.c").write_text(f"#define TP_MODEL_DATA\n#define NX {_CLIP_FEATURES}\n" + _CLIP_DRIVER)
    firmware = resource_dir("firmware")
    subprocess.run(["gcc", "-std=gnu99", "-Wall", "-Wextra", "-Werror", f"-I{tmp_path}", f"-I{firmware}",
                    str(tmp_path / "driver.c"), str(firmware / "tp_judge.c"), "-o", str(tmp_path / "judge")],
                   check=True, capture_output=True)
    text = "\n".join(f"{l} " + " ".join(str(int(v)) for v in xs) + " " + " ".join(str(int(v)) for v in row)
                     for l, xs, row in zip(labels, x, scores))
    out = subprocess.run([str(tmp_path / "judge")], input=text.encode(), capture_output=True, check=True).stdout
    device = np.array([line.split() for line in out.decode().splitlines()], dtype=np.int64)
    confidence, decided = calibration.judge(scores, labels, xq=x)
    np.testing.assert_array_equal(device[:, 0], confidence)
    np.testing.assert_array_equal(device[:, 1], decided)
    clipped = C.clip_counts(x, side) > above
    assert ((decided == C.UNKNOWN_LABEL) == clipped).all()  # the limit declines nothing: the check does it all
    assert clipped.any() == (above < 254) and (~clipped).any()


def test_tp_judge_refuses_a_clip_check_without_its_side_from_the_header(tmp_path):
    """The side's bytes are decided by the host (CLIP_SIDES) and written into the header of a model with a clip
    check; tp_judge.c has no rule of its own for them: a header with the check but without them stops the build
    with its #error, and the same header with them builds."""
    import subprocess

    from tinyproto.core.resources import resource_dir

    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    calibration = C.Calibration(120, 9, False, unknown_above=10, score_byte=1, clip_side="high", clip_above=1)
    header = _write_judge_header(tmp_path, 5, calibration)
    firmware = resource_dir("firmware")
    command = ["gcc", "-std=gnu99", "-Wall", "-Wextra", "-Werror", f"-I{tmp_path}", f"-I{firmware}", "-c",
               str(firmware / "tp_judge.c"), "-o", str(tmp_path / "judge.o")]
    subprocess.run(command, check=True, capture_output=True)
    for name in ("TP_UNKNOWN_CLIP_FROM", "TP_UNKNOWN_CLIP_SPAN"):
        lines = [line for line in header.splitlines() if not line.startswith(f"#define {name} ")]
        assert len(lines) == len(header.splitlines()) - 1
        (tmp_path / "tinyproto_model.h").write_text("\n".join(lines) + "\n")
        failed = subprocess.run(command, capture_output=True, text=True)
        assert failed.returncode != 0 and "a clip check needs TP_UNKNOWN_CLIP_FROM and _SPAN" in failed.stderr


_AVR_CLIP_DRIVER = _AVR_JUDGE_DRIVER.replace(
    "uint8_t tp_predict(", "uint8_t tp_range_signal;\nvoid tp_judge_inputs(const int8_t *x, uint16_t first, "
    "uint16_t n);\nuint8_t tp_predict(").replace(
    "        uint8_t confidence = 0;\n",
    "        int8_t x[NX];\n"
    "        memcpy_P(x, judge_inputs[r], NX);\n"
    "        tp_judge_inputs(x + 3, 0, 7);\n"
    "        for (uint16_t first = 0; first < NX; first = (uint16_t)(first + 5u)) {\n"
    "            tp_judge_inputs(x + first, first, (uint16_t)(NX - first < 5 ? NX - first : 5));\n"
    "        }\n"
    "        tp_judge_inputs(x, 1, 0);\n"
    "#ifdef TP_UNKNOWN_RANGE_LOW\n"
    "        tp_range_signal = (uint8_t)((uint16_t)(pgm_read_word(&judge_signals[r]) - TP_UNKNOWN_RANGE_LOW) >> 8);\n"
    "#endif\n"
    "        uint8_t confidence = 0;\n")


@pytest.mark.device
@pytest.mark.parametrize("n_classes,lowest_wins,above,side,clips,ranged", [
    (10, False, 10, "both", 0, False), (17, True, 10, "high", 1, True), (2, False, -C.VIEW_MAX - 1, "low", 0, True),
    (4, True, C.VIEW_MAX + 1, "both", 254, False)])
def test_the_avr_assembly_of_tp_judge_checks_the_clip_like_the_reference(tmp_path, n_classes, lowest_wins, above,
                                                                         side, clips, ranged):
    """tp_judge's AVR assembly with a clip check (and with Bloom features' range check beside it), on the
    simulated Uno, the inputs counted in chunks by tp_judge_inputs: the same confidence byte and answer as
    Calibration.judge for every row (both score rules, both loops, a threshold that declines some rows, all or
    none, every side)."""
    if shutil.which("avr-gcc") is None:
        pytest.skip("avr-gcc not installed")
    scores, labels = _judge_rows(n_classes, 0, lowest_wins, rows=160)
    x, signal = _clip_rows(160), _range_rows(3000, 3255, 160)
    calibration = C.Calibration(200, 3, lowest_wins, unknown_above=above, score_byte=0, clip_side=side,
                                clip_above=clips, **(dict(range_low=3000, range_high=3255) if ranged else {}))
    _write_judge_header(tmp_path, n_classes, calibration)
    extra = (f"#define NX {_CLIP_FEATURES}\nstatic const int8_t judge_inputs[JUDGE_ROWS][NX] PROGMEM = {{"
             + ",\n".join("{" + ", ".join(str(int(v)) for v in row) + "}" for row in x) + "};\n"
             + f"static const uint16_t judge_signals[JUDGE_ROWS] PROGMEM = {{{', '.join(map(str, signal))}}};\n")
    device = _judge_on_the_simulated_uno(tmp_path, scores, labels, _AVR_CLIP_DRIVER, extra=extra)
    confidence, decided = calibration.judge(scores, labels, signal if ranged else None, x)
    np.testing.assert_array_equal(device[:, 0], confidence)
    np.testing.assert_array_equal(device[:, 1], decided)
    assert (decided[C.clip_counts(x, side) > clips] == C.UNKNOWN_LABEL).all()


def test_clip_counts_and_the_check_the_host_fits():
    """clip_counts counts +127, -127 / -128 or either, stopping at 255 like the device's byte; fit_clip_check keeps
    the first side (both, high, low) on which at most three clipped inputs are normal for all but a tenth of the
    rate of the rows, and no check when more clip in every row; rate_beside shares the rate between the checks."""
    x = np.array([[127, -127, -128, 126, 0], [0, 0, 0, 0, 0], [127, 127, 5, -126, -127]], dtype=np.int8)
    assert C.clip_counts(x, "high").tolist() == [1, 0, 2]
    assert C.clip_counts(x, "low").tolist() == [2, 0, 1]
    assert C.clip_counts(x, "both").tolist() == [3, 0, 3]
    assert C.clip_counts(np.full((1, 300), 127, dtype=np.int8), "both").tolist() == [255]
    rng = np.random.default_rng(0)
    calm = rng.integers(-100, 101, (400, 10)).astype(np.int8)
    edge = calm.copy()
    edge[:30, 0] = 127  # 7.5 % of the rows reach +127 once, 1 % twice
    edge[:4, 1] = 127
    assert C.fit_clip_check([calm[:200], calm[200:, 1:]], 0.05) == ("both", 0)  # parts of different widths
    assert C.fit_clip_check([edge], 0.05) == ("both", 2)  # 0.5 % of the rows (a tenth of the rate) may exceed it
    assert C.fit_clip_check([edge], 0.25) == ("both", 1)
    low = edge.copy()
    low[:, 2:6] = -127  # four inputs at -127 in every row: only the high side keeps a check
    assert C.fit_clip_check([low], 0.05) == ("high", 2)
    assert C.fit_clip_check([np.tile(np.array([127, -127], dtype=np.int8), (50, 5))], 0.05) is None
    assert C.rate_beside(0.05, 0.0) == 0.05 and C.rate_beside(0.05, 0.06) == 0.0
    share = 0.01
    assert abs(share + (1 - share) * C.rate_beside(0.05, share) - 0.05) < 1e-12


def test_a_clip_check_round_trips_and_a_model_without_one_keeps_its_json():
    """The check is written into model.json and the header only when there is one, read back as it was, and a
    damaged one is one clear error; the novelty score ranks a row over the clip above every other."""
    plain = C.Calibration(100, 5, False, unknown_above=-40, unknown_rate=0.05, score_byte=1)
    assert "clips" not in plain.to_json() and not any("CLIP" in k for k in plain.defines())
    clipped = dataclasses.replace(plain, clip_side="low", clip_above=1)
    assert C.Calibration.from_json(clipped.to_json()) == clipped
    defines = clipped.defines()  # -128 and -127 read as bytes: (uint8_t)(x - 128) < 2
    assert [defines[f"TP_UNKNOWN_CLIP{k}"] for k in ("_FROM", "_SPAN", "S")] == [128, 2, 1]
    for bad in ({"side": "up", "above": 1}, {"side": "low", "above": 255}, {"side": "low"}, [1, 2],
                {"side": "low", "above": True}):
        with pytest.raises(TinyprotoError, match="clip"):
            C.Calibration.from_json({**clipped.to_json(), "clips": bad})
    with pytest.raises(TinyprotoError, match="clip"):
        C.Calibration.from_json({**clipped.to_json(), "unknown_above": None})
    x = np.array([[-127, -127, -127], [-127, -128, 0], [-127, 0, 0], [0, 0, 0]], dtype=np.int8)
    novel = clipped.novelty_score(np.array([5, 500, 900, 0]), None, x)
    assert novel[0] > novel[1] > novel[2] > novel[3]  # 3 and 2 over the clip, then by the view
    with pytest.raises(ValueError):
        clipped.judge(np.zeros((2, 3)), np.zeros(2, dtype=int))


def test_the_clip_checks_count_is_in_the_ledger_and_its_cycles_keep_the_latency_limit(iris_dirs):
    """A model with a clip check lists its count's static byte among its SRAM (the ledger, the Arduino library's
    statements: tp_predict then keeps static state), and the check is kept only when its cycles leave the model
    within the user's --max-latency."""
    from tinyproto import families
    from tinyproto.core.cost import judge_cycles, latency_cycle_limit
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.families import SolveOptions, load_int_model
    from tinyproto.families.judging import _within_latency
    from tinyproto.pipeline.arduino import family_statements

    plain_dir, unknown_dir, _ = iris_dirs
    judged = load_int_model(load_model_dir(unknown_dir.out_dir))
    plain = load_int_model(load_model_dir(plain_dir.out_dir))
    assert [item.name for item in families.judge_static(judged)] == ["clip_count"]
    assert families.judge_static(plain) == ()
    assert "clip_count" in {item.name for item in judged.working_sram()}
    assert "clip_count" not in {item.name for item in plain.working_sram()}
    statements = family_statements(judged)
    assert "clip_count" in [name for name, _, _ in statements["static"]] and not statements["reentrant"]
    clips = (judged.calibration.clip_side, judged.calibration.clip_above)
    with_check = judge_cycles(judged.n_classes, True, False, judged.n_features)
    options = SolveOptions(1024, max_latency_ms=1.0, f_cpu_hz=16_000_000)
    limit = latency_cycle_limit(1.0, 16_000_000)
    assert _within_latency(clips, judged, options, lambda m: {"total": int(limit) - with_check}) == clips
    assert _within_latency(clips, judged, options, lambda m: {"total": int(limit) - with_check + 1}) is None
    assert _within_latency(clips, judged, SolveOptions(1024), lambda m: {"total": 10**9}) == clips


def test_flynn_keeps_its_fold_models_margins_in_their_unit(monkeypatch):
    """FlyNN's scores are sums of lut weights, one unit for every model of a shape (scores_in_fixed_units, as BNC's
    bits): its fold models' margins fit the curve as they are, whatever the median winning score of each model's own
    training rows, which measures how familiar they look to it (carried by that ratio, 9 against 36 to 40 on
    segment with sky held out, the confidence was 5.4 points too sure). A family without a fixed unit carries them."""
    from tinyproto import families
    from tinyproto.core.datasets import load_dataset, split
    from tinyproto.families import judging
    from tinyproto.families.flynn.quantize import IntFlyNN
    from tinyproto.families.solving import SolveOptions

    assert IntFlyNN.scores_in_fixed_units
    sp = split(load_dataset("wine"))

    def curve(final_scale: float, fixed: bool | None = None):
        calls = []

        def scale(model, X, lowest_wins):
            calls.append(1)
            return final_scale if len(calls) == 1 else 10.0  # the final model's is asked first, then each fold's

        monkeypatch.setattr(judging, "score_scale", scale)
        if fixed is not None:
            monkeypatch.setattr(judging, "fixed_units", lambda model: fixed)
        # 256 B: the fold models' margins and their unit are the same machinery at any budget, in half the search
        # of 1 kB (1.4 s of CPU against 2.8 s per fit on this machine)
        _, model, _ = families.fit_judged("flynn", sp.X_train, sp.y_train, SolveOptions(256, 0), None)
        monkeypatch.undo()
        return model.calibration.doubt, model.calibration.halving

    assert curve(10.0) == curve(2.5) == curve(10.0, False)  # the ratio 1/4 changes nothing in FlyNN's unit
    assert curve(2.5, False) != curve(10.0, False)  # carried, it would
