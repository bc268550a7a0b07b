"""The validation yardstick: which fold every training row is in, decided by the row itself.

A row's fold follows from a seeded hash of its bytes and its class, never from its position or from who holds
it: compile on the pooled rows and every party of a federation (each hashing only its own rows) put the same row
in the same fold, so both validate every candidate on the same folds and choose the same model. Every family's
solver scores its candidates on these folds, so `--model auto` compares like with like.

Balance (stratification): within each class, the hash keys are cut at the class's K-quantiles, measured on a
histogram of KEY_BINS bins per class. The histogram is a sum over rows, so parties add theirs (one all-reduce)
and then place their own rows exactly as the pooled computation would. Every class is then spread over the folds
to within one bin's rows. Identical rows (same bytes, same label) share a key and so a fold: a duplicate never
validates a model that trained on its twin. The class enters the hash as its index among the sorted classes, not
as its label's text, so recoding the labels in the same order (1, 2, 3 or 10, 20, 30 or 'a', 'b', 'c') draws the
same folds and trains the same model.

Small data sets are validated on several independent draws of the folds (repeats, each with its own hash);
large ones on the first fold only (a hold-out of a third of the rows), which keeps the search affordable.
Layer: core.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from tinyproto.core.errors import TinyprotoError

N_FOLDS = 3
KEY_BITS = 12
KEY_BINS = 1 << KEY_BITS  # histogram bins per class and repeat
MIN_VALIDATED_ROWS = 1000  # fewer training rows than this: repeat the folds until about this many are scored
MAX_REPEATS = 3
HOLD_OUT_ROWS = 2000  # more training rows than this: validate on the first fold only


@dataclass(frozen=True)
class Plan:
    """The yardstick's shape for a number of rows: K folds, R repeats, and how many folds of each repeat are
    validated (K, or 1 for large data)."""

    n_folds: int
    n_repeats: int
    validated: int

    @staticmethod
    def for_rows(n_rows: int) -> Plan:
        repeats = min(MAX_REPEATS, max(1, math.ceil(MIN_VALIDATED_ROWS / max(n_rows, 1))))
        return Plan(N_FOLDS, repeats, 1 if n_rows > HOLD_OUT_ROWS else N_FOLDS)


def row_keys(X: np.ndarray, y_index: np.ndarray, seed: int, n_repeats: int) -> np.ndarray:
    """(n_repeats, n) uint64: a seeded hash of each row's float64 bytes and its class index, one per repeat."""
    X = np.ascontiguousarray(np.asarray(X, dtype=np.float64))
    keys = np.empty((n_repeats, len(X)), dtype=np.uint64)
    for r in range(n_repeats):
        salt = f"tinyproto-folds:{int(seed)}:{r}".encode()
        for i, (row, index) in enumerate(zip(X, np.asarray(y_index))):
            # the class index's decimal text: for labels 0..K-1 it is the label's own text, which keeps the folds
            # (and so the models) drawn before the hash took the index
            h = hashlib.blake2b(row.tobytes(), digest_size=8, key=salt[:64], person=str(int(index)).encode())
            keys[r, i] = int.from_bytes(h.digest(), "little")
    return keys


def class_bins(keys: np.ndarray, y_index: np.ndarray, n_classes: int) -> np.ndarray:
    """(R, L, KEY_BINS) int64: how many rows of each class fall in each key bin. Additive over any partition of
    the rows (parties all-reduce it)."""
    R = keys.shape[0]
    bins = (keys >> np.uint64(64 - KEY_BITS)).astype(np.int64)
    flat = (np.arange(R)[:, None] * n_classes + np.asarray(y_index)[None, :]) * KEY_BINS + bins
    return np.bincount(flat.ravel(), minlength=R * n_classes * KEY_BINS).reshape(R, n_classes, KEY_BINS)


def bin_folds(histogram: np.ndarray, n_folds: int) -> np.ndarray:
    """(R, L, KEY_BINS) fold of every bin: a bin's rows go to the fold where the middle of the bin falls among
    its class's rows in key order (the class cut at its K-quantiles)."""
    total = histogram.sum(axis=2, keepdims=True)
    middle = np.cumsum(histogram, axis=2) - histogram / 2.0
    return np.minimum((n_folds * middle // np.maximum(total, 1)).astype(np.int64), n_folds - 1)


def assign(keys: np.ndarray, y_index: np.ndarray, folds_of_bins: np.ndarray) -> np.ndarray:
    """(R, n) fold of each row, from its key, its class and the bins' folds."""
    R = keys.shape[0]
    bins = (keys >> np.uint64(64 - KEY_BITS)).astype(np.int64)
    return folds_of_bins[np.arange(R)[:, None], np.asarray(y_index)[None, :], bins]


@dataclass(frozen=True)
class Folds:
    """The fold of every row in every repeat, and which folds are validated."""

    ids: np.ndarray  # (n_repeats, n) in 0..n_folds-1
    n_folds: int
    validated: int  # folds 0..validated-1 of each repeat are validation parts
    # each row's class index, when known: a part whose training rows hold a single class is not validated (a
    # class whose rows are all one row, repeated, sits in one fold, and no classifier trains on one class)
    labels: np.ndarray | None = field(default=None, compare=False, repr=False)

    @staticmethod
    def standard(X: np.ndarray, y: np.ndarray, seed: int) -> Folds:
        """The yardstick for these rows (Plan.for_rows), drawn from the rows themselves."""
        plan = Plan.for_rows(len(y))
        classes, y_index = np.unique(np.asarray(y), return_inverse=True)
        keys = row_keys(X, y_index, seed, plan.n_repeats)
        ids = assign(keys, y_index, bin_folds(class_bins(keys, y_index, len(classes)), plan.n_folds))
        return Folds(ids, plan.n_folds, plan.validated, labels=y_index)

    @property
    def n_repeats(self) -> int:
        return int(self.ids.shape[0])

    @property
    def n_rows(self) -> int:
        return int(self.ids.shape[1])

    def parts(self) -> list[tuple[int, int]]:
        """(repeat, fold) of every validation part, in order."""
        return [(r, f) for r in range(self.n_repeats) for f in range(self.validated)]

    def splits(self, repeat: int | None = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """(training rows, validation rows) of every validation part (of one repeat, if given) that has both and
        whose training rows hold at least two classes."""
        out, single_class = [], 0
        for r, f in self.parts():
            inside = self.ids[r] == f
            if (repeat is not None and r != repeat) or not inside.any() or inside.all():
                continue
            fit = np.flatnonzero(~inside)
            if self.labels is not None and np.unique(self.labels[fit]).size < 2:
                single_class += 1
                continue
            out.append((fit, np.flatnonzero(inside)))
        if not out and self.n_rows:
            raise TinyprotoError("cannot validate a model on these rows: copies of a row share a fold, and here "
                                 + ("every fold leaves a single class to train on" if single_class else
                                    "every row sits in one fold") + "; each class needs rows that differ")
        return out

    def scored(self) -> np.ndarray:
        """(R, n) bool: the row is validated in that repeat (its fold is a validation part)."""
        return self.ids < self.validated

    def n_scored(self) -> int:
        """Rows in the validation parts that have both sides (a part left with one class to train on counts too:
        FlyNN, whose counts need no training, scores it)."""
        sizes = self.part_sizes()
        return int(sum(int(s) for s in sizes if 0 < s < self.n_rows))

    def n_validated_rows(self) -> int:
        """Distinct rows validated in at least one draw (a row scored in several draws counts once)."""
        return int(np.count_nonzero(self.scored().any(axis=0))) if self.n_repeats else 0

    def part_sizes(self) -> np.ndarray:
        """Rows in each validation part, in the order of parts()."""
        return np.array([int(np.count_nonzero(self.ids[r] == f)) for r, f in self.parts()], dtype=np.int64)

    def part_accuracies(self, correct_per_part) -> list[float]:
        """Each non-empty validation part's accuracy from its correct predictions (in the order of parts())."""
        sizes = self.part_sizes()
        return [float(c) / int(s) for c, s in zip(correct_per_part, sizes) if s > 0]

    def describe(self) -> str:
        what = (f"{self.n_folds}-fold cross-validation" if self.validated == self.n_folds
                else f"a hold-out of one of {self.n_folds} folds")
        times = f", {self.n_repeats} draws of the folds" if self.n_repeats > 1 else ""
        return f"{what}{times} (folds by a seeded hash of each row, stratified by class)"

    def to_json(self) -> dict:
        return {"n_folds": self.n_folds, "n_repeats": self.n_repeats, "validated_folds": self.validated,
                "scored_rows": self.n_scored(), "description": self.describe()}


__all__ = ["Folds", "N_FOLDS", "Plan", "assign", "bin_folds", "class_bins", "row_keys"]
