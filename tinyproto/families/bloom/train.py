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

SEED_PERIOD = 65535  # xorshift16 visits every non-zero 16-bit state
U_SCALE = 256.0  # float φ = u / 256 with u = x + 128: the integer φ over this scale
STEP_QUANTILE = 0.995  # as every family's input step: this quantile of the training data maps to the int8 top
STEP_FLOOR = 2.5  # ... but at least this many scale units


def xorshift16_step(state: int) -> int:
    """One xorshift16 step, (7, 9, 8): the generator of firmware/tp_bloom.c (and FlyNN's seeded M)."""
    state ^= (state << 7) & 0xFFFF
    state ^= state >> 9
    state ^= (state << 8) & 0xFFFF
    return state


BYTE_SLOTS = 256  # m <= this: every generator step gives two 8-bit draws; above it, one 16-bit draw


def hash_draws(seed: int, n_features: int, n_hashes: int, n_slots: int) -> tuple[np.ndarray, int]:
    """((d, k) raw draws, their width in bits) of the device's hash stream from `seed`.

    m <= 256: every feature starts on a fresh xorshift16 step and takes its k draws from the steps' bytes, high
    byte first (ceil(k/2) steps per feature; an odd k leaves the last low byte unused, so the device keeps no
    half-used step between features or chunks). m > 256: one 16-bit draw per step, k steps per feature."""
    if not 1 <= seed <= 0xFFFF:
        raise ValueError(f"seed must be in 1..65535, got {seed}")
    if not (1 <= n_slots <= 65535 and n_hashes >= 1 and n_features >= 1):
        raise ValueError("need 1 <= m <= 65535, k >= 1, d >= 1")
    byte_draws = n_slots <= BYTE_SLOTS
    per_feature = (n_hashes + 1) // 2 if byte_draws else n_hashes
    states = np.empty(n_features * per_feature, dtype=np.int64)
    state = seed
    for t in range(states.size):
        state = xorshift16_step(state)
        states[t] = state
    if not byte_draws:
        return states.reshape(n_features, n_hashes), 16
    steps = states.reshape(n_features, per_feature)
    draws = np.stack([steps >> 8, steps & 0xFF], axis=2).reshape(n_features, 2 * per_feature)
    return draws[:, :n_hashes], 8


def seeded_slots(seed: int, n_features: int, n_hashes: int, n_slots: int) -> np.ndarray:
    """(d, k) slot h_l(j) of every feature j and hash function l: draw v of `bits` bits maps to (v * m) >> bits.

    The map is monotone in v, exact in integers on the device (8x8 multiplies for byte draws) and uniform up to
    one part in floor(2^bits / m): with byte draws some slots take two byte values where others take one, a fixed
    skew of the hash the model is trained with (the device pays one multiply per draw instead of a 32-bit one).
    """
    draws, bits = hash_draws(seed, n_features, n_hashes, n_slots)
    return (draws * n_slots) >> bits


def used_slots(slots: np.ndarray) -> np.ndarray:
    """The slots at least one feature hashes to, in increasing order (the only ones with weights)."""
    return np.unique(np.asarray(slots).reshape(-1))


def bloom_max(U: np.ndarray, slots: np.ndarray, used: np.ndarray) -> np.ndarray:
    """φ restricted to the used slots: (n, len(used)), φ_p = max over the components hashed to slot used[p].

    U must be non-negative (every used slot has at least one component, so no slot reads the empty 0 here)."""
    U = np.asarray(U)
    column = np.searchsorted(used, np.asarray(slots))  # (d, k) -> position among the used slots
    out = np.zeros((U.shape[0], used.size), dtype=U.dtype)
    for l in range(column.shape[1]):
        order = np.argsort(column[:, l], kind="stable")
        cols = column[order, l]
        starts = np.flatnonzero(np.r_[True, cols[1:] != cols[:-1]])
        # reduceat takes the MAX of each run of features that share a slot under this hash function
        targets = cols[starts]  # distinct within one hash function
        out[:, targets] = np.maximum(out[:, targets], np.maximum.reduceat(U[:, order], starts, axis=1))
    return out


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
