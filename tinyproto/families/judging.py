"""Every family's model, judged: its integer model plus the calibration that turns its scores into a confidence
byte and, with a decline rate, into "unknown" (tinyproto/core/confidence.py holds the arithmetic).

The calibration is fitted the same way for every family: the shape the family's solver chose is trained again
(Family.fit_shape, no search) on the training part of each validation fold (tinyproto/core/folds.py, first draw),
and the fold model's signals on the rows it did not train on say how often each margin bin is right and how novel
known rows look. The family declares only
which way its scores win (its ScoreRule): the winning score is its novelty signal, and the margin between the
winner and the runner-up its confidence signal. The calibration is two constants in the device's code (the doubt
at a tie, the margin that halves it), no array: the model's byte budget is all the family's.
Layer: families.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from tinyproto.core.confidence import (Calibration, clipped_rows, decline_threshold, fit_clip_check, fit_doubt,
                                       judge_score_byte, nearest_threshold, novelty, rate_beside, score_view,
                                       view_threshold, whole_bins, winner_and_runner_up)
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.ledger import SramItem
from tinyproto.families.solving import FoldModels, SolveOptions, calibration_splits

CONFIDENCE_JSON_KEY = "confidence"  # model.json's int_model carries the calibration under this key


def _judged_defines(self) -> dict[str, int]:
    own = super(type(self), self).defines()
    return own if self.calibration is None else {**own, **self.calibration.defines()}


def score_bound(model: Any) -> int | None:
    """The largest |score| any input can give the model, when its family proves one (a `score_bound` method of
    its integer model); None otherwise. It decides the view tp_judge reads (core/confidence.judge_score_byte)."""
    bound = getattr(model, "score_bound", None)
    return None if bound is None else int(bound())


def judge_static(model: Any) -> tuple:
    """The static SRAM of the confidence stage (firmware/tp_judge.c) that tp_predict writes: the clip check's count
    (one byte) when the model has the check, else nothing."""
    calibration = calibration_of(model)
    if calibration is None or not calibration.has_clips:
        return ()
    return (SramItem("clip_count", 1, "inputs at the clip so far, which tp_judge checks (static, tp_judge.c)"),)


def _judged_working_sram(self) -> list:
    return [*super(type(self), self).working_sram(), *judge_static(self)]


def _judged_to_json(self) -> dict:
    own = super(type(self), self).to_json()
    return own if self.calibration is None else {**own, CONFIDENCE_JSON_KEY: self.calibration.to_json()}


def _judged_reduce(self):
    plain = type(self).__mro__[1]
    fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(plain)}
    return make_judged, (plain(**fields), self.calibration)


_JUDGED_CLASSES: dict[type, type] = {}


def judged_class(plain: type) -> type:
    """The family's integer-model dataclass with one more field, its calibration: the same scores and labels, plus
    the calibration's constants among its defines. A subclass (not a wrapper), so every family's own code keeps
    working on it, dataclasses.replace included (the calibration is carried over)."""
    if plain not in _JUDGED_CLASSES:
        params = plain.__dataclass_params__  # type: ignore[attr-defined]
        _JUDGED_CLASSES[plain] = dataclasses.make_dataclass(
            f"Judged{plain.__name__}", [("calibration", Any, dataclasses.field(default=None))], bases=(plain,),
            frozen=params.frozen, eq=params.eq,
            namespace={"defines": _judged_defines, "to_json": _judged_to_json, "working_sram": _judged_working_sram,
                       "__reduce__": _judged_reduce, "__module__": __name__})
    return _JUDGED_CLASSES[plain]


def make_judged(model: Any, calibration: Calibration) -> Any:
    """The integer model with its calibration (a plain one or an already judged one)."""
    plain = type(model).__mro__[1] if is_judged(model) else type(model)
    fields = {f.name: getattr(model, f.name) for f in dataclasses.fields(plain)}
    return judged_class(plain)(**fields, calibration=calibration)


def is_judged(model: Any) -> bool:
    return type(model) in _JUDGED_CLASSES.values()


def calibration_of(model: Any) -> Calibration | None:
    """A judged model's calibration (None for any other model)."""
    return getattr(model, "calibration", None) if is_judged(model) else None


def range_signal(model: Any, xq: np.ndarray | None) -> np.ndarray | None:
    """The family's range signal of these int8 inputs (a `range_signal(xq)` method of its integer model: a uint16
    its runtime computes beside the scores, e.g. Bloom features' feature-map sum), when its calibration checks a
    range; None otherwise."""
    calibration = calibration_of(model)
    if calibration is None or not calibration.has_range:
        return None
    if xq is None:
        raise ValueError("this model declines inputs outside a range: its int8 inputs are needed to judge them")
    return np.asarray(model.range_signal(np.asarray(xq)), dtype=np.int64)


def novelty_score(model: Any, scores: np.ndarray, labels: np.ndarray, lowest_wins: bool,
                  xq: np.ndarray | None = None) -> np.ndarray:
    """The novelty score of every row (larger: less like the training rows) that the held-out AUROC ranks: the
    winning score's novelty, and with a range check a row outside the range above every row inside it."""
    winner = winner_and_runner_up(scores, np.asarray(labels, dtype=np.int64), lowest_wins)[0]
    calibration = calibration_of(model)
    if calibration is None or not (calibration.has_range or calibration.has_clips):
        return novelty(winner, lowest_wins)
    # the view's novelty (what the device compares), so a row outside the range ranks above all of them
    view = novelty(score_view(winner, calibration.score_byte), lowest_wins)
    return calibration.novelty_score(view, range_signal(model, xq), xq)


def judge(model: Any, scores: np.ndarray, labels: np.ndarray,
          xq: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(confidence byte, decided label) per row of any model: a model without calibration answers confidence 0
    and its label (what the firmware does without a calibration). `xq`: the rows' int8 inputs, needed by a
    calibration that checks a range (range_signal)."""
    calibration = calibration_of(model)
    if calibration is not None:
        return calibration.judge(scores, labels, range_signal(model, xq), xq)
    labels = np.asarray(labels, dtype=np.int64)
    return np.zeros(len(labels), dtype=np.int64), labels.copy()


def split_json(raw: dict) -> tuple[dict, dict | None]:
    """model.json's int_model -> (the family's own fields, the calibration's or None)."""
    if CONFIDENCE_JSON_KEY not in raw:
        return raw, None
    rest = {k: v for k, v in raw.items() if k != CONFIDENCE_JSON_KEY}
    calibration = raw[CONFIDENCE_JSON_KEY]
    if not isinstance(calibration, dict):
        raise TinyprotoError("the model's confidence calibration is damaged")
    return rest, calibration


def wrap_from_json(model: Any, calibration_json: dict | None, lowest_wins: bool) -> Any:
    if calibration_json is None:
        return model
    calibration = Calibration.from_json(calibration_json)
    if calibration.lowest_wins != lowest_wins:
        raise TinyprotoError("the model's confidence calibration reads its scores the wrong way round")
    return make_judged(model, calibration)


def _signals(model: Any, X: np.ndarray, lowest_wins: bool,
             xq: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class index, margin, novelty) of the integer model on raw rows (or on their int8 inputs `xq`), in score
    units (int64)."""
    scores = model.scores(model.input_stage.quantize(X) if xq is None else xq)
    labels = np.asarray(model.labels(scores), dtype=np.int64)
    winner, runner = winner_and_runner_up(scores, labels, lowest_wins)
    return labels, np.abs(winner - runner), novelty(winner, lowest_wins)


def score_scale(model: Any, X: np.ndarray, lowest_wins: bool) -> float:
    """The typical size of a model's winning score on the rows it trained on (the median of its magnitude), or 0
    when most of them are 0 (FlyNN's novelty of a row it learned: its counts already have a fixed meaning).
    Two models of one family trained on similar rows differ in their scores' scale (quantisation, shape); the
    ratio of their scales carries a threshold from one to the other."""
    winner = np.abs(_signals(model, X, lowest_wins)[2]).astype(np.float64)
    return float(np.median(winner))


def left_out_novelty(model: Any, X: np.ndarray, y: np.ndarray, lowest_wins: bool) -> np.ndarray | None:
    """The novelty of each training row under the final model as if it had not learned that row, when the family
    computes that exactly (a `left_out_scores(X, y_index)` method of its integer model: FlyNN's counts less the
    row's own), else None. Fold models, trained on two thirds of the rows, find known rows more novel than the
    final model does, and a threshold fitted on them declines fewer known rows than asked."""
    left_out_scores = getattr(model, "left_out_scores", None)
    if left_out_scores is None:
        return None
    classes = list(model.classes)
    index = {c: i for i, c in enumerate(classes)}
    if any(v not in index for v in y.tolist()):
        return None
    scores = left_out_scores(X, np.asarray([index[v] for v in y.tolist()], dtype=np.int64))
    if scores is None:
        return None
    labels = np.asarray(model.labels(scores), dtype=np.int64)
    return novelty(winner_and_runner_up(scores, labels, lowest_wins)[0], lowest_wins)


def fixed_units(model: Any) -> bool:
    """The family's scores have one unit for every model of a shape (a true `scores_in_fixed_units` of its integer
    model: BNC's Hamming distances in bits), so a threshold of a fold model of the final model's shape holds for the
    final model unchanged, without carrying it by the ratio of their score scales. Such a novelty takes few values,
    one step holding several percent of the rows: each fold's threshold is the one whose declined share of its
    rows is nearest the rate (nearest_threshold), not the largest share at most the rate, which always rounds
    down (and fold models, trained on two thirds of the rows, already find known rows more novel than the final
    model does)."""
    return bool(getattr(model, "scores_in_fixed_units", False))


def carry(threshold: int, fold_scale: float, final_scale: float) -> int:
    """A fold model's threshold on the final model's scale (unchanged when either scale is 0)."""
    if fold_scale <= 0 or final_scale <= 0:
        return int(threshold)
    value = round(threshold * final_scale / fold_scale)
    return int(min(max(value, -(2**31) + 1), 2**31 - 1))


def fold_model(fit: Callable, fit_shape: Callable, chosen: dict, X: np.ndarray, y: np.ndarray,
               options: SolveOptions, fold: int | None = None) -> tuple[Any, str]:
    """(the integer model, how it was trained) of one validation fold: the final model's shape trained on the
    fold's training rows (the family's fit_shape, no search), so the calibration describes the shape that ships; only a
    shape that cannot keep the limits on these rows (TinyprotoError) has the family's whole search run instead.
    A model the solver already trained for this shape on this fold (options.fold_models; `fold`: its index in
    options.folds.splits()) is that same model, taken instead of training it again."""
    if options.fold_models is not None and fold is not None:
        left = options.fold_models.take(chosen, fold)
        if left is not None:
            return left, "chosen shape"
    quiet = options.with_(progress=None, fold_models=None)
    try:
        return fit_shape(X, y, chosen, quiet)[1], "chosen shape"
    except TinyprotoError:
        from tinyproto.core.folds import Folds

        # the fold's own search validated on one part of its rows: a third of the work
        inner = dataclasses.replace(Folds.standard(X, y, options.seed), validated=1)
        return fit(X, y, quiet.with_(folds=inner))[1], "searched"


def calibrate(fit: Callable, fit_shape: Callable, chosen: dict, model: Any, X: np.ndarray, y: np.ndarray,
              options: SolveOptions, lowest_wins: bool, unknown_rate: float | None,
              own_cycles: Callable | None = None) -> tuple[Any, dict]:
    """The final model judged: the shape it has (`chosen`, its solver's info["chosen"]) is trained again on each
    validation fold's training rows (fold_model); their margins on their validation rows, carried to the final
    model's scale (score_scale) and view, and whether each row was classified right, fit the doubt and its
    halving (fit_doubt); with unknown_rate, their novelty on those rows gives the decline threshold."""
    from tinyproto.core.folds import Folds

    folds = options.folds if options.folds is not None else Folds.standard(X, y, options.seed)
    splits = calibration_splits(folds)
    score_byte = judge_score_byte(score_bound(model))
    final_scale = score_scale(model, X, lowest_wins)
    carried_margins, hits, novelties, inputs, scales, trained = [], [], [], [], [], []
    for k, (index, fit_rows, val_rows) in enumerate(splits, start=1):
        options.say(f"confidence: fold {k}/{len(splits)}")
        fold, how = fold_model(fit, fit_shape, chosen, X[fit_rows], y[fit_rows], options, index)
        trained.append(how)
        fold_xq = fold.input_stage.quantize(X[val_rows])
        labels, fold_margin, fold_novelty = _signals(fold, X[val_rows], lowest_wins, fold_xq)
        classes = np.asarray(fold.classes, dtype=object)
        scale = score_scale(fold, X[fit_rows], lowest_wins)
        # a fold model of the final shape whose scores have a fixed unit (BNC's bits) needs no carrying, as its
        # threshold does not (fixed_units)
        same_unit = fixed_units(model) and how == "chosen shape"
        ratio = final_scale / scale if scale > 0 and final_scale > 0 and not same_unit else 1.0
        carried_margins.append(np.floor(fold_margin * ratio / 2.0 ** (8 * score_byte)).astype(np.int64))
        hits.append(np.asarray([classes[i] == t for i, t in zip(labels, y[val_rows])], dtype=bool))
        scales.append(scale)
        novelties.append(fold_novelty)
        inputs.append(fold_xq)
    all_margins, all_hits = np.concatenate(carried_margins), np.concatenate(hits)
    doubt, halving = fit_doubt(all_margins, all_hits)
    info: dict = {"rows": int(len(all_margins)), "folds": len(splits), "fold_models": trained,
                  "cv_accuracy": float(all_hits.mean()), "score_byte": score_byte, "doubt": doubt,
                  "halving": halving, "fold_scales": scales, "final_scale": final_scale}
    threshold, low_high, clips = None, (None, None), None
    if unknown_rate is not None:
        # the clip check first (fit_clip_check: on the fold models' validation rows, in each one's int8 inputs),
        # then each fold's threshold on the rows it leaves answered, at the rate that makes the two together decline
        # the asked share of that fold's rows (rate_beside): the check shares the rate, it does not add to it
        asked = fit_clip_check(inputs, unknown_rate) if options.clip_check else None  # compile --clip-check
        clips = _within_latency(asked, model, options, own_cycles)
        fit_threshold = nearest_threshold if fixed_units(model) else decline_threshold
        thresholds = []
        for fold_novelty, fold_xq in zip(novelties, inputs):
            kept = _answered(clips, fold_xq)
            thresholds.append(fit_threshold(fold_novelty[kept], rate_beside(unknown_rate, 1.0 - kept.mean())))
        # each fold model's threshold, carried to the final model's scale (as it is when the family's scores have a
        # fixed unit and the fold model the final model's shape: fixed_units), then their median, in the view; the
        # final model's own training rows would look too familiar to fit it on, unless its family can leave each
        # row out exactly (left_out_novelty): then those rows, as the model would see them unlearned, decide
        same_unit = fixed_units(model)
        carried = [t if same_unit and how == "chosen shape" else carry(t, s, final_scale)
                   for t, s, how in zip(thresholds, scales, trained)]
        left_out = left_out_novelty(model, X, y, lowest_wins)
        if left_out is None:
            chosen, fitted_on = int(np.median(carried)), "fold models"
        else:
            kept = _answered(clips, model.input_stage.quantize(X))
            chosen = decline_threshold(left_out[kept], rate_beside(unknown_rate, 1.0 - kept.mean()))
            fitted_on = "left-out training rows"
        threshold = view_threshold(chosen, score_byte, lowest_wins)
        info.update(unknown_rate=unknown_rate, fold_thresholds=thresholds, carried_thresholds=carried,
                    unknown_above=threshold, threshold_fitted_on=fitted_on)
        if clips is not None:
            declined = 1.0 - np.concatenate([_answered(clips, xq) for xq in inputs]).mean()
            info["clips"] = {"side": clips[0], "above": clips[1], "fold_declined": float(declined)}
        low_high = training_range(model, X)
        if low_high[0] is not None:
            info["range"] = list(low_high)
    calibration = Calibration(doubt, halving, lowest_wins, threshold, unknown_rate, score_byte, *low_high,
                              *(clips or (None, None)))
    return make_judged(model, calibration), info


def _within_latency(clips: tuple[str, int] | None, model: Any, options: SolveOptions,
                    own_cycles: Callable | None) -> tuple[str, int] | None:
    """The clip check, unless its cycles (tp_judge_inputs reads every input: core/cost.judge_cycles) would take the
    model past the user's --max-latency, which the solver kept with only tp_judge's own cycles beside the family's
    (`own_cycles`: the family's cost model, model -> {"total": ...})."""
    if clips is None or options.max_latency_ms is None or own_cycles is None:
        return clips
    from tinyproto.core.cost import judge_cycles, latency_cycle_limit

    ranged = getattr(model, "range_signal", None) is not None  # a range check's 4 cycles counted if it may have one
    total = own_cycles(model)["total"] + judge_cycles(model.n_classes, True, ranged, model.n_features)
    return clips if total <= latency_cycle_limit(options.max_latency_ms, options.f_cpu_hz) else None


def _answered(clips: tuple[str, int] | None, xq: np.ndarray) -> np.ndarray:
    """Per row, whether the clip check (side, above) leaves it answered (every row without a check)."""
    if clips is None:
        return np.ones(len(xq), dtype=bool)
    return ~clipped_rows(xq, *clips)


def training_range(model: Any, X: np.ndarray) -> tuple[int | None, int | None]:
    """(low, high) of the family's range signal (a `range_signal` method of its integer model) that the device
    accepts: the range the final model's training rows give it, widened to whole bins of 256 (the device compares
    one byte: core/confidence.whole_bins; a wider margin, 1/8 of the range a side, lost the sensor windows' held-out
    classes, which lie just outside it); (None, None) for a family without one. The signal does not depend on what
    the model learned (Bloom features' feature-map sum: the input stage and the hash), so its own training rows
    are as new to it as any: the range of n rows leaves about 2 / (n + 1) of new known rows outside."""
    signal_of = getattr(model, "range_signal", None)
    if signal_of is None:
        return None, None
    raw = signal_of(model.input_stage.quantize(X))
    if raw is None:  # the family keeps no range for this model
        return None, None
    signal = np.asarray(raw, dtype=np.int64)
    checked = whole_bins(int(signal.min()), int(signal.max()))
    return (None, None) if checked is None else checked


def fit_judged(fit: Callable, fit_shape: Callable, X: np.ndarray, y: np.ndarray, options: SolveOptions,
               lowest_wins: bool, unknown_rate: float | None,
               own_cycles: Callable | None = None) -> tuple[Any, Any, dict]:
    """A family's solver under the whole budget (the calibration puts no array in flash), then its calibration
    (info["confidence"])."""
    inner = options.with_(fold_models=FoldModels())  # the solver's fold models, reused
    clf, model, info = fit(X, y, inner)
    judged, info["confidence"] = calibrate(fit, fit_shape, info["chosen"], model, X, y, inner, lowest_wins,
                                           unknown_rate, own_cycles)
    return clf, judged, info


__all__ = ["calibrate", "calibration_of", "fit_judged", "is_judged", "judge", "judge_static", "judged_class",
           "make_judged", "novelty_score", "range_signal", "split_json", "training_range", "wrap_from_json"]
