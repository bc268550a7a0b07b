"""Choose ProtoNN's shape (d_hat, m, s_W, table size) to maximise held-out int8 accuracy within a byte budget.

Bytes are never estimated by a separate formula: every candidate is sized by building a placeholder
IntProtoNN of that shape and summing its CArrays, the same code path that renders the header.

B and Z are stored dense: a sparse int8 encoding needs at least a 1-bit mask per entry, so it only saves
bytes below 87.5 % density, and the paper's s_B = s_Z = 0.8 would save ~8 % of their bytes at an accuracy
cost. The budget therefore goes to W's nonzeros, in W's smallest exact encoding (encoding.py: dense, bitmap,
or column codes that scale with the nonzeros), which the solver fills.

The input stage is priced like every array and chosen per data set (STAGES): per-feature standardisation on the
device (4 B per kept feature), one shared offset and gain (4 B; trained on globally scaled data), or per-feature
standardisation folded into W and a projection offset (4 + 2 d_hat B). Each kind that fits the budget is
probed with one mid-sized shape of its own candidate list, on the same folds; the best validated int8 accuracy
(ties: fewer predicted cycles, then bytes) picks the kind whose shapes are then searched.
Layer: families.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import numpy as np

from tinyproto.core.cost import headroom_text, latency_cycle_limit
from tinyproto.core.errors import BudgetTooSmall, TinyprotoError
from tinyproto.core.folds import Folds
from tinyproto.families.solving import SolveOptions, fit_final_and_folds, map_in_processes
from tinyproto.families.protonn.quantize import IntProtoNN, drop_unread, quantize_protonn
from tinyproto.families.protonn.shapes import (STAGES, TABLE_SIZES, Shape, candidate_shapes, fastest_shape,
                                               largest_nnz, minimum_budget, model_bytes, model_cycles)
from tinyproto.families.protonn.train import ProtoNNClassifier

# Above this many training rows the shapes are searched on a stratified sample of them (one validation split),
# and only the chosen shape is refitted on every row: a 10,000 x 784 CSV then trains in well under a minute.
SEARCH_ROWS = 2000


__all__ = ["fit_chosen_protonn", "fit_protonn_under_budget", "fit_shape", "minimum_budget", "model_bytes",
           "model_cycles", "rank_candidates"]


def fit_shape(shape: Shape, X: np.ndarray, y: np.ndarray, seed: int) -> tuple[ProtoNNClassifier, IntProtoNN]:
    scaling, stage = STAGES[shape.stage]
    clf = ProtoNNClassifier(
        n_components=shape.n_components,
        n_prototypes=shape.n_prototypes,
        sparsity_W=shape.sparsity_W(X.shape[1]),
        random_state=seed,
        scaling=scaling,
    ).fit(X, y)
    return clf, quantize_protonn(clf, X, table_size=shape.table_size, stage=stage)


def fit_chosen_protonn(X_train: np.ndarray, y_train: np.ndarray, chosen: dict,
                       options: SolveOptions) -> tuple[ProtoNNClassifier, IntProtoNN]:
    """The shape fit_protonn_under_budget chose (its info["chosen"]) trained on these rows, no search: the
    solver's final fit (fit_shape, then its budget and latency guards), which it is on the solver's own rows."""
    shape = Shape(int(chosen["n_components"]), int(chosen["n_prototypes"]), int(chosen["nnz_W"]),
                  int(chosen["table_size"]), str(chosen["input_stage"]))
    clf, model = fit_shape(shape, X_train, y_train, options.seed)
    # the solver's own limit, room for the confidence stage included
    max_cycles = latency_cycle_limit(options.max_latency_ms, options.f_cpu_hz, n_classes=len(model.classes))
    model = enforce_latency(enforce_budget(model, options.budget_bytes), max_cycles)
    if model is None:
        raise TinyprotoError(f"ProtoNN {_shape_text(chosen)} is predicted too slow on these rows")
    return clf, model


def enforce_budget(model: IntProtoNN, budget: int) -> IntProtoNN:
    """Last guard of the hard contract: drop W's smallest nonzeros until the model fits (normally a no-op)."""
    while sum(a.nbytes for a in model.carrays()) > budget:
        W = model.W_q.copy()
        nz = np.flatnonzero(W)
        if nz.size <= 1:
            raise TinyprotoError(f"internal: cannot bring the model under {budget} B")
        excess = sum(a.nbytes for a in model.carrays()) - budget
        drop = nz[np.argsort(np.abs(W.flat[nz]), kind="stable")[: max(1, excess)]]
        W.flat[drop] = 0
        model = drop_unread(replace(model, W_q=W))
    return model


def enforce_latency(model: IntProtoNN, max_cycles: float | None) -> IntProtoNN | None:
    """Drop W's smallest nonzeros until the predicted cycles fit max_cycles (exact with respect to the cost
    model); None when even one nonzero per row is too slow. Every dropped nonzero saves 10 to 35 cycles."""
    if max_cycles is None:
        return model
    floor = model.n_components
    while True:
        excess = model_cycles(model) - max_cycles
        if excess <= 0:
            return model
        W = model.W_q.copy()
        nz = np.flatnonzero(W)
        if nz.size <= floor:
            return None
        count = min(nz.size - floor, max(1, int(excess // 35)))
        drop = nz[np.argsort(np.abs(W.flat[nz]), kind="stable")[:count]]
        W.flat[drop] = 0
        model = drop_unread(replace(model, W_q=W))


def int8_accuracy(model: IntProtoNN, X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(model.predict(X) == y))


# "Within noise" of the best validation accuracy: NOISE_SE standard errors of a proportion measured on the
# validation split, sqrt(a (1 - a) / n) at the best accuracy a. Among the shapes within it the solver prefers
# fewer predicted cycles, then fewer bytes.
NOISE_SE = 0.0


def noise_margin(best_accuracy: float, n_val: int, k: float | None = None) -> float:
    k = NOISE_SE if k is None else k
    return k * math.sqrt(max(best_accuracy * (1.0 - best_accuracy), 0.0) / max(n_val, 1))


def rank_candidates(tried: list[dict], margin: float) -> list[int]:
    """Candidate indices, best first: those within `margin` of the best validation accuracy by fewest predicted
    cycles, then fewest bytes, then search order; then the rest by accuracy, cycles, bytes, order."""
    best = max(t["val_int8_accuracy"] for t in tried)

    def key(i: int) -> tuple:
        t = tried[i]
        near = t["val_int8_accuracy"] >= best - margin - 1e-12
        if near:
            return (0, 0.0, t["predicted_cycles"], t["model_bytes"], i)
        return (1, -t["val_int8_accuracy"], t["predicted_cycles"], t["model_bytes"], i)

    return sorted(range(len(tried)), key=key)


def _shape_text(shape: dict) -> str:
    return f"d_hat={shape['n_components']} m={shape['n_prototypes']} s_W={shape['sparsity_W']:g}"


def fit_protonn_under_budget(X_train: np.ndarray, y_train: np.ndarray,
                             options: SolveOptions) -> tuple[ProtoNNClassifier, IntProtoNN, dict]:
    """Search shapes on an inner validation split, refit the chosen one on all training data, quantize, check bytes
    (and, with max_latency_ms, the predicted cycles at f_cpu_hz: the family's cost model on the int8 model).

    Every candidate is judged as the int8 model it quantizes to: validation accuracy, bytes, predicted cycles.
    Among the candidates within noise of the best validation accuracy (noise_margin) the fewest predicted cycles
    win, then the fewest bytes."""

    budget_bytes, random_state, progress = options.budget_bytes, options.seed, options.progress
    max_latency_ms, f_cpu_hz = options.max_latency_ms, options.f_cpu_hz
    if options.learn_on is not None:
        raise TinyprotoError("ProtoNN does not learn on the device (--learnable)")
    started = time.perf_counter()
    n_features = X_train.shape[1]
    classes, counts = np.unique(y_train, return_counts=True)
    floor = minimum_budget(n_features, len(classes))
    if budget_bytes < floor:
        raise BudgetTooSmall(budget_bytes, floor, f"ProtoNN on {n_features} features and {len(classes)} classes",
                             "d_hat=1, one prototype per class")
    max_cycles = latency_cycle_limit(max_latency_ms, f_cpu_hz, n_classes=len(classes))

    def ms(cycles: float) -> float:
        return 1000.0 * cycles / f_cpu_hz

    folds = options.folds if options.folds is not None else Folds.standard(X_train, y_train, random_state)
    search_splits = _search_splits(folds, y_train, random_state)
    splits = [(X_train[fit], y_train[fit], X_train[val], y_train[val]) for fit, val in search_splits]
    X_fit, y_fit, X_val, y_val = splits[0]
    _, fit_counts = np.unique(y_fit, return_counts=True)
    tried: list[dict] = []
    kept: list[Shape] = []
    part_correct: list[list[int]] = []
    split_models: list[list[IntProtoNN]] = []  # per kept shape, its model on each split
    n_val = sum(len(v[3]) for v in splits)

    def evaluate_all(batch: list[Shape]) -> list[dict | None]:
        """Validate a batch of shapes (in options.n_jobs processes when the data is large enough to pay for them)."""
        results = _map_shapes(batch, splits, budget_bytes, max_cycles, random_state, options.n_jobs)
        out = []
        for shape, result in zip(batch, results):
            if result is None:  # even one W nonzero per row is predicted too slow
                out.append(None)
                continue
            correct, cycles, nbytes, models = result
            kept.append(shape)
            part_correct.append(correct)
            split_models.append(models)
            tried.append({**shape.as_dict(n_features), "val_int8_accuracy": sum(correct) / n_val, "model_bytes": nbytes,
                          "predicted_cycles": cycles, "predicted_latency_ms": round(ms(cycles), 4)})
            out.append(tried[-1])
        return out

    def evaluate(shape: Shape) -> dict | None:
        return evaluate_all([shape])[0]

    per_stage = {stage: candidate_shapes(n_features, fit_counts, budget_bytes, max_cycles, stage)
                 for stage in STAGES if minimum_budget(n_features, len(classes), stage) <= budget_bytes}
    nonempty = {stage: shapes for stage, shapes in per_stage.items() if shapes}
    stage_probe: dict = {}
    if len(nonempty) > 1:  # probe each input stage with a mid-sized shape of its own list, on the same folds
        probes = {stage: stage_shapes[len(stage_shapes) // 2] for stage, stage_shapes in nonempty.items()}
        if progress:
            for stage, probe in probes.items():
                progress(f"input stage {stage}: probe d_hat={probe.n_components} m={probe.n_prototypes}")
        stage_probe = dict(zip(probes, evaluate_all(list(probes.values()))))
        scored = {k: v for k, v in stage_probe.items() if v is not None}
        chosen_stage = (min(scored, key=lambda k: (-scored[k]["val_int8_accuracy"], scored[k]["predicted_cycles"],
                                                   scored[k]["model_bytes"])) if scored else next(iter(nonempty)))
    elif nonempty:
        chosen_stage = next(iter(nonempty))
    else:  # nothing fits (a latency limit, or a budget at the minimum): the per-feature stage, as ever
        chosen_stage = "feature" if "feature" in per_stage else next(iter(per_stage), "feature")
    shapes = [sh for sh in per_stage.get(chosen_stage, []) if sh not in kept]  # probes are already evaluated
    if not per_stage.get(chosen_stage) and max_cycles is None:
        shapes = [Shape(1, len(classes), largest_nnz(n_features, len(classes), 1, len(classes), TABLE_SIZES[0],
                                                     budget_bytes, chosen_stage), TABLE_SIZES[0], chosen_stage)]

    if progress:
        for i, shape in enumerate(shapes, start=1):
            progress(f"candidate {i}/{len(shapes)}: d_hat={shape.n_components} m={shape.n_prototypes}")
    evaluate_all(shapes)
    if not tried and max_cycles is not None:  # the placeholders' estimate may be pessimistic: the fastest shape
        evaluate(fastest_shape(n_features, len(classes), budget_bytes, chosen_stage))
    if not tried:
        _refuse(X_fit, y_fit, X_val, y_val, n_features, len(classes), budget_bytes, max_latency_ms, random_state, ms)
    margin = noise_margin(max(t["val_int8_accuracy"] for t in tried), n_val)
    order = rank_candidates(tried, margin)
    for attempt, index in enumerate(order):
        best = kept[index]
        chosen = {**best.as_dict(n_features), "nnz_W": best.nnz_W}  # nnz_W: the shape, exactly (fit_chosen)
        if options.fold_models is not None:  # a split on all of its fold's training rows is fit_chosen_protonn's fit
            for k, ((fit_rows, _), full) in enumerate(zip(search_splits, folds.splits())):
                model_k = split_models[index][k]
                if len(fit_rows) == len(full[0]) and len(model_k.classes) == len(classes):
                    options.fold_models.offer(chosen, k, model_k)
        if progress:
            progress(f"refit d_hat={best.n_components} m={best.n_prototypes} on all training data")
        refit_args = (best, X_train, y_train, random_state, budget_bytes, max_cycles)
        # the first refit beside the calibration's fold models the search did not train (the shape's other folds)
        if attempt == 0:
            (clf, model), fold_models = fit_final_and_folds(_refit, refit_args, fit_chosen_protonn, chosen, X_train,
                                                            y_train, options.with_(folds=folds))
            if options.fold_models is not None:
                options.fold_models.offer_all(chosen, fold_models)
        else:
            clf, model = _refit(*refit_args)
        if model is not None:
            break
    else:  # every refit was predicted too slow (each validated one fitted): not seen in practice
        _refuse(X_fit, y_fit, X_val, y_val, n_features, len(classes), budget_bytes, max_latency_ms, random_state, ms)
    chosen_index = index
    runners = [i for i in order if i != chosen_index][:RUNNERS_UP]
    info = {
        "chosen": chosen,
        "candidates": tried,
        "chosen_validation": dict(tried[chosen_index], fold_accuracies=[
            k / len(v[3]) for k, v in zip(part_correct[chosen_index], splits)]),
        "validation": folds.describe() + ", int8 model"
                      + (f" (each fit on at most {SEARCH_ROWS} of its training rows)"
                         if any(len(s[1]) >= SEARCH_ROWS for s in splits) else ""),
        "folds": folds.to_json(),
        "runners_up": [tried[i] for i in runners],
        "selection": ("the fewest predicted cycles, then bytes, among the candidates "
                      + (f"within {NOISE_SE:g} standard error ({100 * margin:.2f} points) of"
                         if NOISE_SE else "tied with") + f" the best int8 accuracy over {n_val} "
                      + "validated samples"),
        "noise_margin": margin,
        "max_latency_ms": max_latency_ms,
        "gamma": float(clf.gamma_),
        "search_seconds": round(time.perf_counter() - started, 2),
        "minimum_budget_bytes": floor,
        "input_stage": chosen_stage,
        "input_stage_probe": {k: (None if v is None else {"val_int8_accuracy": v["val_int8_accuracy"],
                                                          "model_bytes": v["model_bytes"]})
                              for k, v in stage_probe.items()},
        "search_rows": int(max(len(s[1]) for s in splits)),
        "w_encoding": model.w_encoding,
        "features_kept": model.n_features,
        # the raw columns the device receives, in order (None: all): the C API and the sketch take these only
        "input_columns": None if model.input_stage.kept is None else list(model.input_stage.kept),
    }
    return clf, model, info


RUNNERS_UP = 5


# Below this many training values in a batch of fits (summed over its shapes and splits) starting worker processes
# costs more than it saves (each imports numpy, scikit-learn and tinyproto: about 1.5 s of CPU).
PARALLEL_MIN_VALUES = 400_000


def _refit(shape: Shape, X: np.ndarray, y: np.ndarray, seed: int, budget_bytes: int,
           max_cycles) -> tuple[ProtoNNClassifier, IntProtoNN | None]:
    """The shape trained on all the training rows, within the budget and the latency limit (None: too slow)."""
    clf, model = fit_shape(shape, X, y, seed)
    return clf, enforce_latency(enforce_budget(model, budget_bytes), max_cycles)


def _validate_on_split(shape: Shape, split: tuple, budget_bytes: int, max_cycles, seed: int):
    """(correct predictions, predicted cycles, bytes, the integer model) of a shape trained on one split's training
    rows and scored on its validation rows, or None if even its sparsest W is predicted too slow."""
    Xf, yf, Xv, yv = split
    _, model = fit_shape(shape, Xf, yf, seed)
    model = enforce_latency(enforce_budget(model, budget_bytes), max_cycles)
    if model is None:
        return None
    return int(np.sum(model.predict(Xv) == yv)), model_cycles(model), model_bytes(model), model


def _map_shapes(shapes: list[Shape], splits: list, budget_bytes: int, max_cycles, seed: int,
                n_jobs: int) -> list:
    """Per shape, (correct predictions per split, max predicted cycles, max bytes, the model of each split), or None
    when too slow on a split. Every (shape, split) fit is one task, in n_jobs processes when the work is large
    enough to pay for starting them; every task's seed is fixed before dispatch and the results are gathered in
    task order, so they do not depend on n_jobs."""
    tasks = [(shape, split, budget_bytes, max_cycles, seed) for shape in shapes for split in splits]
    n_values = sum(split[0].size for split in splits) * len(shapes)
    outcomes = map_in_processes(_validate_on_split, tasks, n_jobs if n_values >= PARALLEL_MIN_VALUES else 1)
    results = []
    for i in range(len(shapes)):
        per_split = outcomes[i * len(splits):(i + 1) * len(splits)]
        if any(outcome is None for outcome in per_split):
            results.append(None)
            continue
        results.append(([o[0] for o in per_split], max(o[1] for o in per_split), max(o[2] for o in per_split),
                        [o[3] for o in per_split]))
    return results


def _search_splits(folds, y: np.ndarray, random_state: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The yardstick's (training rows, validation rows), each training part cut to a stratified sample of
    SEARCH_ROWS rows when larger (deterministic for the seed): every row of each part is still validated."""
    from sklearn.model_selection import train_test_split

    out = []
    for fit, val in folds.splits():
        if len(fit) > SEARCH_ROWS:
            counts = np.unique(y[fit], return_counts=True)[1]
            fit, _ = train_test_split(fit, train_size=SEARCH_ROWS, random_state=random_state,
                                      stratify=y[fit] if counts.min() >= 2 else None)
            fit = np.sort(fit)
        out.append((fit, val))
    return out


def _refuse(X_fit, y_fit, X_val, y_val, n_features, n_classes, budget_bytes, max_latency_ms, random_state, ms):
    """No shape fits the latency limit: name the fastest shape within the budget, its latency and accuracy."""
    shape = fastest_shape(n_features, n_classes, budget_bytes)
    _, model = fit_shape(shape, X_fit, y_fit, random_state)
    model = enforce_budget(model, budget_bytes)
    raise TinyprotoError(
        f"no ProtoNN within {budget_bytes} B is predicted to run in {max_latency_ms:g} ms ({headroom_text()}); "
        f"the fastest shape within "
        f"the budget ({_shape_text(shape.as_dict(n_features))}) is predicted at {ms(model_cycles(model)):.3f} ms "
        f"with {100 * int8_accuracy(model, X_val, y_val):.1f} % validation accuracy: raise --max-latency"
    )
