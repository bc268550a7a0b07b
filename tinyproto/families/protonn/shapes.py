"""ProtoNN candidate shapes and their exact sizes: every byte figure comes from a placeholder IntProtoNN of
the shape (its CArrays, the same code path that renders the header), every cycle figure from the cost model.
Layer: families (protonn).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from tinyproto.core.inputstage import InputStage
from tinyproto.families.protonn.quantize import IntProtoNN, drop_unread

TABLE_SIZES = (16, 32, 64)
DIMENSIONS = (3, 5, 8, 10, 12, 15, 20, 25, 30, 40)
PROTOS_PER_CLASS = (1, 2, 3, 4, 5, 6, 8, 10, 15, 20)
MIN_W_DENSITY = 0.05
MIN_W_DENSITY_FEATURES = 256
MAX_CANDIDATES = 10
# input stage -> (the classifier's standardisation, the device's stage); see the module docstring
STAGES = {"feature": ("feature", "feature"), "shared": ("global", "shared"), "folded": ("feature", "shared")}


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
