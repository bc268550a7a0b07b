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
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.inputstage import InputStage
from tinyproto.families.protonn.quantize import IntProtoNN, drop_unread, quantize_protonn
from tinyproto.families.protonn.train import ProtoNNClassifier

TABLE_SIZES = (16, 32, 64)
DIMENSIONS = (3, 5, 8, 10, 12, 15, 20, 25, 30, 40)
PROTOS_PER_CLASS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20)
MIN_W_DENSITY = 0.05
MIN_W_DENSITY_FEATURES = 256
MAX_CANDIDATES = 10
VALIDATION_FRACTION = 0.2
# input stage -> (the classifier's standardisation, the device's stage); see the module docstring
STAGES = {"feature": ("feature", "feature"), "shared": ("global", "shared"), "folded": ("feature", "shared")}
# Above this many training rows the shapes are searched on a stratified sample of them (one validation split),
# and only the chosen shape is refitted on every row: a 10,000 x 784 CSV then trains in well under a minute.
SEARCH_ROWS = 2000


@dataclass(frozen=True)
class Shape:
    n_components: int  # d_hat
    n_prototypes: int  # m
    nnz_W: int  # nonzeros W may keep
    table_size: int
    stage: str = "feature"  # a key of STAGES

    def sparsity_W(self, n_features: int) -> float:
        # Slightly under nnz/size so that ceil(s * size) can never round up past nnz.
        return min(1.0, (self.nnz_W - 0.5) / (self.n_components * n_features))

    def as_dict(self, n_features: int) -> dict:
        return {
            "n_components": self.n_components,
            "n_prototypes": self.n_prototypes,
            "sparsity_W": round(self.sparsity_W(n_features), 4),
            "sparsity_B": 1.0,
            "sparsity_Z": 1.0,
            "table_size": self.table_size,
            "input_stage": self.stage,
        }


def placeholder_model(n_features: int, n_classes: int, shape: Shape, spread: bool = False) -> IntProtoNN:
    """An IntProtoNN of this shape with dummy values: its arrays have the rendered sizes, and (spread=True: the
    nonzeros evenly spread over W, the 16-bit rescale) its predicted cycles are close to a trained model's."""
    D, d = shape.n_components, n_features
    W = np.zeros(D * d, dtype=np.int8)
    if spread:
        W[np.linspace(0, D * d - 1, num=min(shape.nnz_W, D * d)).astype(np.int64)] = 1
    else:
        W[: shape.nnz_W] = 1
    zeros16 = np.zeros(d, dtype=np.uint16)
    shared = STAGES[shape.stage][1] == "shared"
    model = IntProtoNN(
        classes=list(range(n_classes)),
        input_stage=InputStage.shared(1.0, 1.0, d) if shared else InputStage(zeros16, 0, zeros16, 0, 1.0),
        W_q=W.reshape(D, d),
        B_q=np.zeros((shape.n_prototypes, D), dtype=np.int8),
        Z_q=np.zeros((shape.n_prototypes, n_classes), dtype=np.int8),
        proj_shift=8 if spread else 0,
        table=np.zeros(shape.table_size, dtype=np.uint8),
        table_shift=0,
        scales={},
        offset=np.zeros(D, dtype=np.int16) if shared else None,
    )
    # the unread features store nothing: dense rows, the bitmap and a per-feature stage shrink with them
    return drop_unread(model)


def placeholder_bytes(n_features: int, n_classes: int, shape: Shape) -> int:
    """Model bytes of a ProtoNN of this shape, from the arrays that would be rendered."""
    return sum(a.nbytes for a in placeholder_model(n_features, n_classes, shape).carrays())


def model_cycles(model: IntProtoNN) -> int:
    """Predicted AVR cycles per inference of this integer model (the family's cost model)."""
    from tinyproto.families import predict_cycles

    return int(predict_cycles(model)["total"])


def model_bytes(model: IntProtoNN) -> int:
    return sum(a.nbytes for a in model.carrays())


def largest_nnz_in_time(n_features: int, n_classes: int, D: int, m: int, table_size: int, max_cycles: float,
                        high: int, stage: str = "feature") -> int:
    """Most W nonzeros (at most `high`) whose spread placeholder is predicted within max_cycles, or 0.

    An estimate: a trained W's nonzeros cluster differently and its rescale shift differs, so the trained model
    is checked exactly (enforce_latency) after quantization."""
    def fits(nnz: int) -> bool:
        model = placeholder_model(n_features, n_classes, Shape(D, m, nnz, table_size, stage), spread=True)
        return model_cycles(model) <= max_cycles

    return _largest_fitting(fits, high)


def largest_nnz(n_features: int, n_classes: int, D: int, m: int, table_size: int, budget: int,
                stage: str = "feature") -> int:
    """Most W nonzeros that fit the budget for this (D, m, table), or 0 if not even one fits.

    Bytes grow monotonically with the nonzeros, so a binary search over placeholder models finds it.
    """
    def fits(nnz: int) -> bool:
        return placeholder_bytes(n_features, n_classes, Shape(D, m, nnz, table_size, stage)) <= budget

    return _largest_fitting(fits, D * n_features)


def _largest_fitting(fits: Callable[[int], bool], high: int) -> int:
    """Largest n in 1..high with fits(n) (fits is monotone: true up to some n, false after), or 0 if none."""
    if high < 1 or not fits(1):
        return 0
    low = 1
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def minimum_budget(n_features: int, n_classes: int, stage: str | None = None) -> int:
    """The smallest model: d_hat = 1, one prototype per class, one W nonzero, the smallest table (with the
    cheapest input stage, or the given one)."""
    stages = STAGES if stage is None else (stage,)
    return min(placeholder_bytes(n_features, n_classes, Shape(1, n_classes, 1, TABLE_SIZES[0], k)) for k in stages)


def table_size_for(budget: int) -> int:
    return 64 if budget >= 1536 else 32 if budget >= 768 else 16


def min_nnz(D: int, n_features: int) -> int:
    """The sparsest W the solver considers: one nonzero per row, and at least MIN_W_DENSITY of W (of at most
    MIN_W_DENSITY_FEATURES features: on wide inputs, 5 % of a 784-wide W is already 392 nonzeros per 10 rows)."""
    return max(D, math.ceil(MIN_W_DENSITY * D * min(n_features, MIN_W_DENSITY_FEATURES)))


def candidate_shapes(n_features: int, class_counts: np.ndarray, budget: int,
                     max_cycles: float | None = None, stage: str = "feature") -> list[Shape]:
    """Feasible shapes, spread over the trade-off between projection width, prototypes and W density.

    With max_cycles, each shape's W nonzeros are also capped so that its predicted cycles fit (an estimate
    from a placeholder; the trained model is checked exactly), and shapes that cannot fit are left out."""
    L = len(class_counts)
    max_per_class = int(class_counts.min())
    table_size = table_size_for(budget)
    shapes = []
    for D in (D for D in DIMENSIONS if D <= max(3, n_features)):
        for per_class in (p for p in PROTOS_PER_CLASS if p <= max_per_class):
            m = per_class * L
            nnz = largest_nnz(n_features, L, D, m, table_size, budget, stage)
            if max_cycles is not None and nnz >= min_nnz(D, n_features):
                nnz = largest_nnz_in_time(n_features, L, D, m, table_size, max_cycles, nnz, stage)
            if nnz >= min_nnz(D, n_features):
                shapes.append(Shape(D, m, nnz, table_size, stage))
    return _spread(shapes, MAX_CANDIDATES)


def fastest_shape(n_features: int, n_classes: int, budget: int, stage: str = "feature") -> Shape:
    """The shape with the fewest predicted cycles the solver would consider within the budget: the narrowest
    projection, one prototype per class, the sparsest W (or, when even that does not fit, the smallest model)."""
    D = min(DIMENSIONS[0], max(1, n_features))
    table_size = table_size_for(budget)
    nnz = min(min_nnz(D, n_features), largest_nnz(n_features, n_classes, D, n_classes, table_size, budget, stage))
    if nnz < 1:
        return Shape(1, n_classes, 1, TABLE_SIZES[0], stage)
    return Shape(D, n_classes, nnz, table_size, stage)


def _spread(shapes: list[Shape], limit: int) -> list[Shape]:
    """Keep at most `limit` shapes: for each d_hat the two with most prototypes, widest d_hat first."""
    by_dim: dict[int, list[Shape]] = {}
    for shape in shapes:
        by_dim.setdefault(shape.n_components, []).append(shape)
    picked = []
    for D in sorted(by_dim, reverse=True):
        ranked = sorted(by_dim[D], key=lambda s: s.n_prototypes, reverse=True)
        picked.extend(ranked[:2])
    if len(picked) <= limit:
        return picked
    step = len(picked) / limit
    return [picked[int(i * step)] for i in range(limit)]


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


def fit_protonn_under_budget(
    X_train: np.ndarray,
    y_train: np.ndarray,
    budget_bytes: int,
    random_state: int = 0,
    progress: Callable[[str], None] | None = None,
    max_latency_ms: float | None = None,
    f_cpu_hz: int = 16_000_000,
) -> tuple[ProtoNNClassifier, IntProtoNN, dict]:
    """Search shapes on an inner validation split, refit the chosen one on all training data, quantize, check bytes
    (and, with max_latency_ms, the predicted cycles at f_cpu_hz: the family's cost model on the int8 model).

    Every candidate is judged as the int8 model it quantizes to: validation accuracy, bytes, predicted cycles.
    Among the candidates within noise of the best validation accuracy (noise_margin) the fewest predicted cycles
    win, then the fewest bytes."""
    from sklearn.model_selection import train_test_split

    started = time.perf_counter()
    n_features = X_train.shape[1]
    classes, counts = np.unique(y_train, return_counts=True)
    floor = minimum_budget(n_features, len(classes))
    if budget_bytes < floor:
        raise TinyprotoError(
            f"budget {budget_bytes} B is too small for ProtoNN on {n_features} features and {len(classes)} classes: "
            f"the smallest model (d_hat=1, one prototype per class) needs {floor} B"
        )
    if max_latency_ms is not None and not (max_latency_ms > 0 and math.isfinite(max_latency_ms)):
        raise TinyprotoError(f"--max-latency must be a positive number of milliseconds, got {max_latency_ms}")
    max_cycles = None if max_latency_ms is None else max_latency_ms * 1e-3 * f_cpu_hz

    def ms(cycles: float) -> float:
        return 1000.0 * cycles / f_cpu_hz

    X_search, y_search = _search_rows(X_train, y_train, random_state)
    X_fit, X_val, y_fit, y_val = train_test_split(
        X_search, y_search, test_size=VALIDATION_FRACTION, stratify=y_search, random_state=random_state
    )
    folds = _folds(X_search, y_search, random_state) if len(y_search) == len(y_train) else []
    _, fit_counts = np.unique(folds[0][1] if folds else y_fit, return_counts=True)
    tried: list[dict] = []
    kept: list[Shape] = []
    n_val = sum(len(v[3]) for v in folds) if folds else len(y_val)

    def evaluate(shape: Shape) -> dict | None:
        correct = cycles = nbytes = 0
        for Xf, yf, Xv, yv in (folds or [(X_fit, y_fit, X_val, y_val)]):
            _, model = fit_shape(shape, Xf, yf, random_state)
            model = enforce_latency(enforce_budget(model, budget_bytes), max_cycles)
            if model is None:  # even one W nonzero per row is predicted too slow
                return None
            correct += int(np.sum(model.predict(Xv) == yv))
            cycles, nbytes = max(cycles, model_cycles(model)), max(nbytes, model_bytes(model))
        kept.append(shape)
        tried.append({**shape.as_dict(n_features), "val_int8_accuracy": correct / n_val, "model_bytes": nbytes,
                      "predicted_cycles": cycles, "predicted_latency_ms": round(ms(cycles), 4)})
        return tried[-1]

    per_stage = {stage: candidate_shapes(n_features, fit_counts, budget_bytes, max_cycles, stage)
                 for stage in STAGES if minimum_budget(n_features, len(classes), stage) <= budget_bytes}
    per_stage = {stage: shapes for stage, shapes in per_stage.items() if shapes} or per_stage
    stage_probe: dict = {}
    if len(per_stage) > 1:  # probe each input stage with a mid-sized shape of its own list, on the same folds
        for stage, stage_shapes in per_stage.items():
            probe = stage_shapes[len(stage_shapes) // 2]
            if progress:
                progress(f"input stage {stage}: probe d_hat={probe.n_components} m={probe.n_prototypes}")
            stage_probe[stage] = evaluate(probe)
        scored = {k: v for k, v in stage_probe.items() if v is not None}
        chosen_stage = (min(scored, key=lambda k: (-scored[k]["val_int8_accuracy"], scored[k]["predicted_cycles"],
                                                   scored[k]["model_bytes"])) if scored else next(iter(per_stage)))
    else:
        chosen_stage = next(iter(per_stage)) if per_stage else "feature"
    shapes = [sh for sh in per_stage.get(chosen_stage, []) if sh not in kept]  # probes are already evaluated
    if not per_stage.get(chosen_stage) and max_cycles is None:
        shapes = [Shape(1, len(classes), largest_nnz(n_features, len(classes), 1, len(classes), TABLE_SIZES[0],
                                                     budget_bytes, chosen_stage), TABLE_SIZES[0], chosen_stage)]

    for i, shape in enumerate(shapes, start=1):
        if progress:
            progress(f"candidate {i}/{len(shapes)}: d_hat={shape.n_components} m={shape.n_prototypes}")
        evaluate(shape)
    if not tried and max_cycles is not None:  # the placeholders' estimate may be pessimistic: the fastest shape
        evaluate(fastest_shape(n_features, len(classes), budget_bytes, chosen_stage))
    if not tried:
        _refuse(X_fit, y_fit, X_val, y_val, n_features, len(classes), budget_bytes, max_latency_ms, random_state, ms)
    margin = noise_margin(max(t["val_int8_accuracy"] for t in tried), n_val)
    order = rank_candidates(tried, margin)
    for index in order:
        best = kept[index]
        if progress:
            progress(f"refit d_hat={best.n_components} m={best.n_prototypes} on all training data")
        clf, model = fit_shape(best, X_train, y_train, random_state)
        model = enforce_latency(enforce_budget(model, budget_bytes), max_cycles)
        if model is not None:
            break
    else:  # every refit was predicted too slow (each validated one fitted): not seen in practice
        _refuse(X_fit, y_fit, X_val, y_val, n_features, len(classes), budget_bytes, max_latency_ms, random_state, ms)
    chosen_index = index
    runners = [i for i in order if i != chosen_index][:RUNNERS_UP]
    info = {
        "chosen": best.as_dict(n_features),
        "candidates": tried,
        "chosen_validation": tried[chosen_index],
        "runners_up": [tried[i] for i in runners],
        "selection": (f"the fewest predicted cycles, then bytes, among the candidates "
                      + (f"within {NOISE_SE:g} standard error ({100 * margin:.2f} points) of"
                         if NOISE_SE else "tied with") + f" the best int8 accuracy over {n_val} "
                      + ("cross-validated" if folds else "validation") + " samples"),
        "noise_margin": margin,
        "max_latency_ms": max_latency_ms,
        "gamma": float(clf.gamma_),
        "search_seconds": round(time.perf_counter() - started, 2),
        "minimum_budget_bytes": floor,
        "input_stage": chosen_stage,
        "input_stage_probe": {k: (None if v is None else {"val_int8_accuracy": v["val_int8_accuracy"],
                                                          "model_bytes": v["model_bytes"]})
                              for k, v in stage_probe.items()},
        "search_rows": int(len(y_search)),
        "w_encoding": model.w_encoding,
        "features_kept": model.n_features,
    }
    return clf, model, info


RUNNERS_UP = 5
VALIDATION_FOLDS = 3  # > 1: stratified K-fold cross-validation of every candidate; else one VALIDATION_FRACTION split


def _search_rows(X, y, random_state) -> tuple[np.ndarray, np.ndarray]:
    """All training rows, or a stratified sample of SEARCH_ROWS of them (deterministic for the seed)."""
    if len(y) <= SEARCH_ROWS:
        return X, y
    from sklearn.model_selection import train_test_split

    X_s, _, y_s, _ = train_test_split(X, y, train_size=SEARCH_ROWS, stratify=y, random_state=random_state)
    return X_s, y_s


def _folds(X, y, random_state) -> list[tuple]:
    """(X_fit, y_fit, X_val, y_val) per fold, or [] for the single split."""
    from sklearn.model_selection import StratifiedKFold

    k = min(VALIDATION_FOLDS, int(np.unique(y, return_counts=True)[1].min()))
    if k < 2:
        return []
    splitter = StratifiedKFold(k, shuffle=True, random_state=random_state)
    return [(X[a], y[a], X[b], y[b]) for a, b in splitter.split(X, y)]


def _refuse(X_fit, y_fit, X_val, y_val, n_features, n_classes, budget_bytes, max_latency_ms, random_state, ms):
    """No shape fits the latency limit: name the fastest shape within the budget, its latency and accuracy."""
    shape = fastest_shape(n_features, n_classes, budget_bytes)
    _, model = fit_shape(shape, X_fit, y_fit, random_state)
    model = enforce_budget(model, budget_bytes)
    raise TinyprotoError(
        f"no ProtoNN within {budget_bytes} B is predicted to run in {max_latency_ms:g} ms; the fastest shape within "
        f"the budget ({_shape_text(shape.as_dict(n_features))}) is predicted at {ms(model_cycles(model)):.3f} ms "
        f"with {100 * int8_accuracy(model, X_val, y_val):.1f} % validation accuracy: raise --max-latency"
    )
