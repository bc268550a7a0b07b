"""Choose ProtoNN's shape (d_hat, m, s_W, table size) to maximise held-out int8 accuracy within a byte budget.

Bytes are never estimated by a separate formula: every candidate is sized by building a placeholder
IntProtoNN of that shape and summing its CArrays, the same code path that renders the header.

B and Z are stored dense: a sparse int8 encoding needs at least a 1-bit mask per entry, so it only saves
bytes below 87.5 % density, and the paper's s_B = s_Z = 0.8 would save ~8 % of their bytes at an accuracy
cost. The budget therefore goes to W's sparsity (bitmap + nonzero values), which the solver fills.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np

from tinyproto.errors import TinyprotoError
from tinyproto.inputstage import InputStage
from tinyproto.protonn.quantize import IntProtoNN, quantize_protonn
from tinyproto.protonn.train import ProtoNNClassifier

TABLE_SIZES = (16, 32, 64)
DIMENSIONS = (3, 5, 8, 10, 12, 15, 20, 25, 30, 40)
PROTOS_PER_CLASS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20)
MIN_W_DENSITY = 0.05
MAX_CANDIDATES = 10
VALIDATION_FRACTION = 0.2


@dataclass(frozen=True)
class Shape:
    n_components: int  # d_hat
    n_prototypes: int  # m
    nnz_W: int  # nonzeros W may keep
    table_size: int

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
        }


def placeholder_bytes(n_features: int, n_classes: int, shape: Shape) -> int:
    """Model bytes of a ProtoNN of this shape, from the arrays that would be rendered."""
    D, d = shape.n_components, n_features
    W = np.zeros(D * d, dtype=np.int8)
    W[: shape.nnz_W] = 1
    zeros16 = np.zeros(d, dtype=np.uint16)
    model = IntProtoNN(
        classes=list(range(n_classes)),
        input_stage=InputStage(zeros16, 0, zeros16, 0, 1.0),
        W_q=W.reshape(D, d),
        B_q=np.zeros((shape.n_prototypes, D), dtype=np.int8),
        Z_q=np.zeros((shape.n_prototypes, n_classes), dtype=np.int8),
        proj_shift=0,
        table=np.zeros(shape.table_size, dtype=np.uint8),
        table_shift=0,
        scales={},
    )
    return sum(a.nbytes for a in model.carrays())


def largest_nnz(n_features: int, n_classes: int, D: int, m: int, table_size: int, budget: int) -> int:
    """Most W nonzeros that fit the budget for this (D, m, table), or 0 if not even one fits.

    Bytes grow monotonically with the nonzeros, so a binary search over placeholder models finds it.
    """
    def fits(nnz: int) -> bool:
        return placeholder_bytes(n_features, n_classes, Shape(D, m, nnz, table_size)) <= budget

    low, high = 0, D * n_features  # fits(low) is assumed true for 0 nonzeros; found by search
    if not fits(1):
        return 0
    low = 1
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def minimum_budget(n_features: int, n_classes: int) -> int:
    """The smallest model: d_hat = 1, one prototype per class, one W nonzero, the smallest table."""
    return placeholder_bytes(n_features, n_classes, Shape(1, n_classes, 1, TABLE_SIZES[0]))


def candidate_shapes(n_features: int, class_counts: np.ndarray, budget: int) -> list[Shape]:
    """Feasible shapes, spread over the trade-off between projection width, prototypes and W density."""
    L = len(class_counts)
    max_per_class = int(class_counts.min())
    table_size = 64 if budget >= 1536 else 32 if budget >= 768 else 16
    shapes = []
    for D in (D for D in DIMENSIONS if D <= max(3, n_features)):
        for per_class in (p for p in PROTOS_PER_CLASS if p <= max_per_class):
            m = per_class * L
            nnz = largest_nnz(n_features, L, D, m, table_size, budget)
            if nnz >= max(D, MIN_W_DENSITY * D * n_features):
                shapes.append(Shape(D, m, nnz, table_size))
    return _spread(shapes, MAX_CANDIDATES)


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
    clf = ProtoNNClassifier(
        n_components=shape.n_components,
        n_prototypes=shape.n_prototypes,
        sparsity_W=shape.sparsity_W(X.shape[1]),
        random_state=seed,
    ).fit(X, y)
    return clf, quantize_protonn(clf, X, table_size=shape.table_size)


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
        model = replace(model, W_q=W)
    return model


def int8_accuracy(model: IntProtoNN, X: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(model.predict(X) == y))


def fit_protonn_under_budget(
    X_train: np.ndarray,
    y_train: np.ndarray,
    budget_bytes: int,
    random_state: int = 0,
    progress: Callable[[str], None] | None = None,
) -> tuple[ProtoNNClassifier, IntProtoNN, dict]:
    """Search shapes on an inner validation split, refit the best on all training data, quantize, check bytes."""
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
    X_fit, X_val, y_fit, y_val = train_test_split(
        X_train, y_train, test_size=VALIDATION_FRACTION, stratify=y_train, random_state=random_state
    )
    _, fit_counts = np.unique(y_fit, return_counts=True)
    shapes = candidate_shapes(n_features, fit_counts, budget_bytes)
    if not shapes:
        shapes = [Shape(1, len(classes), largest_nnz(n_features, len(classes), 1, len(classes), TABLE_SIZES[0], budget_bytes), TABLE_SIZES[0])]
    tried = []
    for i, shape in enumerate(shapes, start=1):
        if progress:
            progress(f"candidate {i}/{len(shapes)}: d_hat={shape.n_components} m={shape.n_prototypes}")
        _, model = fit_shape(shape, X_fit, y_fit, random_state)
        tried.append({**shape.as_dict(n_features), "val_int8_accuracy": int8_accuracy(model, X_val, y_val)})
    best_index = max(range(len(shapes)), key=lambda i: (tried[i]["val_int8_accuracy"], -i))
    best = shapes[best_index]
    if progress:
        progress(f"refit d_hat={best.n_components} m={best.n_prototypes} on all training data")
    clf, model = fit_shape(best, X_train, y_train, random_state)
    model = enforce_budget(model, budget_bytes)
    info = {
        "chosen": best.as_dict(n_features),
        "candidates": tried,
        "gamma": float(clf.gamma_),
        "search_seconds": round(time.perf_counter() - started, 2),
        "minimum_budget_bytes": floor,
    }
    return clf, model, info

