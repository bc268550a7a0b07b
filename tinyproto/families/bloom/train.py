"""Bloom features (Cutkosky & Boahen): k seeded hash functions, a MAX feature map, a linear classifier. Float side.

Each input component j is hashed to k of m slots; φ(x)_i is the MAX over the components hashed to slot i (a
sparse matrix product with addition replaced by MAX), and a linear one-vs-all classifier reads φ(x).

Conventions shared by the float estimator, the integer reference (quantize.py) and firmware/tp_bloom.c:

* The hash is regenerated from a 16-bit seed by xorshift16 (the (7, 9, 8) triple, as FlyNN's seeded M), so it
  costs no stored byte: one generator stream runs over the features in order, k steps per feature, and step
  state s maps to slot (s * m) >> 16 (`seeded_slots`). The device walks the same stream as features arrive.
* Non-negative inputs. The paper's φ acts on x >= 0 (an empty slot reads 0). Here every component first goes
  through the int8 input stage and is then read as u = x + 128, clamped to 1..255 (x = -128 reads as -127): u is
  positive, so a slot reads 0 exactly when no component hashes to it -- a property of the hash, not of the
  input. Those empty slots carry no weight and store none (`used_slots`). Adding 128 to every component adds 128
  to every MAX, which the classifier's bias absorbs, so this is the MAX of the signed values.
* What MAX compares across features is set by the input stage's offset and scale (`offset`, `scaling`): "min"
  aligns every feature's training minimum (pixels: 0 stays the darkest value, the paper's setting), "mean"
  centres each feature as the other families do; "global" keeps one scale for all features (same units, such
  as pixels), "feature" divides each by its own std. The solver picks by validated int8 accuracy.
* MAX commutes with any non-decreasing map, so the int8 φ is exactly the rounded float φ: quantizing the inputs
  before or after the MAX gives the same integers.
Layer: families.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.svm import LinearSVC
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from tinyproto.core.inputstage import INPUT_MAX, standardisation, shared_stage
from tinyproto.families.bloom.slots import SEED_PERIOD, U_SCALE, bloom_max, seeded_slots, used_slots

STEP_QUANTILE = 0.995  # as every family's input step: this quantile of the training data maps to the int8 top
STEP_FLOOR = 2.5  # ... but at least this many scale units


def draw_seed(random_state) -> int:
    """The 16-bit hash seed a BloomClassifier with this random_state uses."""
    return int(check_random_state(random_state).randint(1, SEED_PERIOD + 1))


def input_offset_and_step(X: np.ndarray, offset: str, scaling: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(centre c, scale s, step) of the int8 input stage x_q = round((x - c) / (s * step)), clamped to ±127.

    scale s: the one standardisation rule's (`standardisation`, per feature or global). "mean": c is the mean and
    the 0.995 quantile of |z| maps to 127 (every family's rule). "min": the training minimum maps to -127 and the
    0.995 quantile of (x - min) / s to 127, so the whole int8 range serves values above the minimum.
    """
    X = np.asarray(X, dtype=np.float64)
    if offset == "shared":  # the stored (half-float) offset and gain, so training sees what the device computes
        stage = shared_stage(X)
        d = X.shape[1]
        return np.full(d, float(stage.mean[0])), np.ones(d), 1.0 / float(stage.gain[0])
    mean, scale = standardisation(X, scaling)
    if offset == "mean":
        z = (X - mean) / scale
        step = max(float(np.quantile(np.abs(z), STEP_QUANTILE)), STEP_FLOOR) / INPUT_MAX
        return mean, scale, step
    low = X.min(axis=0)
    above = (X - low) / scale
    step = max(float(np.quantile(above, STEP_QUANTILE)), STEP_FLOOR) / (2 * INPUT_MAX)
    return low + INPUT_MAX * step * scale, scale, step


class BloomClassifier(ClassifierMixin, BaseEstimator):
    """Bloom features + a linear one-vs-all classifier (LinearSVC, squared hinge, L2).

    Parameters
    ----------
    n_slots : m, the hash range (slots no feature hashes to are dropped: they read a constant).
    n_hashes : k, hash functions per input component.
    offset : "min" or "mean": which training value of each feature the input stage aligns (see module doc);
        "shared": one offset and one gain for every feature (4 bytes however wide the input: pixels, same-unit
        sensors); `scaling` is then unused.
    scaling : "global" (one scale for all features) or "feature" (each feature's std).
    C : the linear SVM's inverse regularisation.
    random_state : draws the 16-bit hash seed.
    """

    _parameter_constraints: dict = {
        "n_slots": [Interval(Integral, 1, 65535, closed="both")],
        "n_hashes": [Interval(Integral, 1, 64, closed="both")],
        "offset": [StrOptions({"min", "mean", "shared"})],
        "scaling": [StrOptions({"feature", "global"})],
        "C": [Interval(Real, 0, None, closed="neither")],
        "random_state": ["random_state"],
    }

    def __init__(self, n_slots: int = 128, n_hashes: int = 2, offset: str = "min", scaling: str = "global",
                 C: float = 1.0, random_state=None) -> None:
        self.n_slots = n_slots
        self.n_hashes = n_hashes
        self.offset = offset
        self.scaling = scaling
        self.C = C
        self.random_state = random_state

    def fit(self, X, y) -> "BloomClassifier":
        """Fix the input stage and the hash from X, then train the linear classifier on φ(X)."""
        self._validate_params()
        X, y = validate_data(self, X, y, reset=True)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if self.classes_.size < 2:
            raise ValueError(f"BloomClassifier needs at least 2 classes; got {self.classes_.size} class")
        self.centre_, self.scale_, self.input_step_ = input_offset_and_step(X, self.offset, self.scaling)
        self.seed_ = draw_seed(self.random_state)
        self.slots_ = seeded_slots(self.seed_, X.shape[1], int(self.n_hashes), int(self.n_slots))
        self.used_ = used_slots(self.slots_)
        # The primal problem always: with more slots than rows (wide inputs, a fold's few rows) the dual that
        # scikit-learn's "auto" picks then ran its 5,000 iterations without converging (50 times the time, a
        # ConvergenceWarning per fit); the primal solver reaches the same optimum in about a dozen.
        svm = LinearSVC(C=float(self.C), dual=False, max_iter=5000, random_state=0)
        svm.fit(self.features(X, validate=False), y)
        self.coef_ = svm.coef_.copy()  # (1, p) for two classes (positive favours classes_[1]), else (L, p)
        self.intercept_ = svm.intercept_.copy()
        return self

    def inputs(self, X) -> np.ndarray:
        """u / 256: the input stage without rounding, read as non-negative (u = t + 128 in 1..255)."""
        t = (np.asarray(X, dtype=np.float64) - self.centre_) / (self.scale_ * self.input_step_)
        return (np.clip(t, -INPUT_MAX, INPUT_MAX) + 128.0) / U_SCALE

    def features(self, X, validate: bool = True) -> np.ndarray:
        """φ(X) over the used slots, (n, p)."""
        if validate:
            check_is_fitted(self)
            X = validate_data(self, X, reset=False)
        return bloom_max(self.inputs(X), self.slots_, self.used_)

    def decision_function(self, X) -> np.ndarray:
        scores = self.features(X) @ self.coef_.T + self.intercept_
        return scores[:, 0] if self.classes_.size == 2 else scores

    def predict(self, X) -> np.ndarray:
        scores = self.decision_function(X)
        if scores.ndim == 1:  # LinearSVC's rule: class 1 only when the decision is positive
            return self.classes_[(scores > 0).astype(int)]
        return self.classes_[np.argmax(scores, axis=1)]

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # MAX over a handful of hashed components needs d >> 1: on sklearn's 2-feature blobs every slot sees
        # one of two inputs. Say so instead of faking a feature map.
        tags.classifier_tags.poor_score = True
        return tags
