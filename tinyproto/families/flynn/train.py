"""FlyNN: the FlyHash Bloom-filter classifier (Sinha & Ram, KDD 2021; Ram & Sinha, AAAI 2022), float side.

FlyHash h(x) = Γ_ρ(M x): M is an m x d binary matrix with exactly s ones per row, Γ_ρ keeps the ρ largest of the
m projections (winner-take-all). Training counts, per class l and hash bit j, how many training points of
class l set bit j (t_lj); the filter weight is w_lj = (1 - c)^t_lj (c = 1: the binary filter "never seen").
A point's novelty for class l is f_l(x) = w_l · h(x) / ρ and the prediction is the least novel class.

Conventions shared by the float estimator, the integer reference (quantize.py) and firmware/tp_flynn.c:

* M is always generated from a 16-bit seed by `seeded_index.seeded_indices` (xorshift16; blocks of rows that are
  rotations of one seeded pattern: consecutive ones for narrow inputs, drawn per row for wide ones), so the same
  matrix can be stored in flash as indices or regenerated on the device.
* Winner-take-all ties at the cut go to the lower row index (`top_winners`).
* Class ties go to the lowest class index.

Preprocessing: the features are standardised (`scaling`). The papers also normalise each row; FlyHash does not
need it: every row of M has exactly s ones, so M(a·x) = a·Mx and the winners are unchanged by any per-sample
positive scaling (without the sign split, by any per-sample shift as well). What matters is the per-feature
scale, which `scaling` chooses: "feature" divides by each feature's std, "global" by one common std (keeps the
relative scales of features that share a unit, such as pixels, instead of amplifying nearly constant ones), and
"shared" subtracts one offset from every feature too, as the device's shared input stage does.

Sign split (`sign_split=True`, an addition to the papers): M projects the 2d vector [z, -z] instead of z.
Winner-take-all only reacts to large projections, so without it a sample is described only by the features
where it is unusually high; with it, unusually low features can win as well. On breast_cancer this lifts
accuracy from ~0.85 to ~0.95; on digits it is neutral to slightly positive. The device does the same on the
int8 inputs (-x is exact for x in -127..127).
Layer: families.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from tinyproto.core.inputstage import shared_range, standardisation
from tinyproto.families.flynn.hashing import count_winners, project, projection_matrix, top_winners
from tinyproto.families.flynn.seeded_index import draw_seed, seeded_indices

# The float path hashes z rounded to multiples of 2^-24 and clipped to ±2^20: any sum of up to 256 such values is
# exact in float64 (< 2^52 units), so projections do not depend on summation order and two rows with the same
# inputs tie exactly (then the lower row wins, as on the device). The rounding is far below any real signal.
_GRID = 2.0**24
_CLIP = 2.0**20
_CHUNK = 512  # samples hashed at once (bounds the n x m projection matrix in memory)


def feature_scale(X: np.ndarray, scaling: str) -> np.ndarray:
    """Per-feature divisors by the one rule of every family (`tinyproto.core.inputstage.standardise_moments`): each
    feature's std ("feature") or their root-mean-square ("global"); constant features by their magnitude."""
    return standardisation(X, scaling)[1]


def input_standardisation(X: np.ndarray, scaling: str) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) per feature for `scaling`: "feature" and "global" by the one rule of every family; "shared"
    is the device's shared input stage before its rounding, one offset and one step for every feature
    (core.inputstage.shared_range), so that a float model of a shared stage is the one its int8 model rounds
    (with the sign split the offset moves the winners, so per-feature means would make another model)."""
    if scaling != "shared":
        return standardisation(X, scaling)
    return shared_standardisation(*shared_range(X), np.asarray(X).shape[1])


def shared_standardisation(offset: float, gain: float, n_features: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) per feature of a shared stage's float view: its one offset, and one over its gain."""
    return np.full(n_features, offset, dtype=np.float64), np.full(n_features, 1.0 / gain, dtype=np.float64)


def novelty_sums(weights: np.ndarray, winners: np.ndarray) -> np.ndarray:
    """Σ_{j in winners} w_lj for every sample and class, (n, L) (the novelty times rho)."""
    return weights[:, winners].sum(axis=2).T


# ---------------------------------------------------------------- the estimator


class FlyNNClassifier(ClassifierMixin, BaseEstimator):
    """FlyHash Bloom-filter classifier (FBFC / FBFC*), single-pass, order-independent training.

    Parameters
    ----------
    n_hashes : m, the number of FlyHash rows (bits of each per-class filter).
    n_inputs_per_hash : s, ones per row of M (clipped to the number of features).
    n_winners : ρ, winners kept by the winner-take-all (clipped to m).
    decay : c in (0, 1]; weight (1 - c)^t for a bit seen t times in the class (1.0 = binary filter).
    scaling : "feature" (per-feature std), "global" (one std for every feature) or "shared" (one offset and one
        step for every feature: the float view of the device's shared input stage).
    sign_split : hash [z, -z] (2d inputs) instead of z, so low values can win too.
    temperature : predict_proba = softmax(-f / temperature), f the novelty in [0, 1]; None means 1 / ρ, i.e.
        softmax of minus the raw novelty sums (a binary filter: minus the number of never-seen winners).
    random_state : draws the 16-bit seed of M.
    count_scale : q >= 1; the filters read the counts divided by q, t / q (a binary filter: a bit scores 1 when
        the class set it fewer than q times). The solver sets the q of the integer model it quantizes from this
        estimator (quantize.count_scales: tall tables whose counts would saturate), so the float model is the
        one the int8 model rounds; training (the counts themselves) does not depend on it.
    """

    _parameter_constraints: dict = {
        "n_hashes": [Interval(Integral, 1, 65535, closed="both")],
        "n_inputs_per_hash": [Interval(Integral, 1, 255, closed="both")],
        "n_winners": [Interval(Integral, 1, 255, closed="both")],
        "decay": [Interval(Real, 0, 1, closed="right")],
        "scaling": [StrOptions({"feature", "global", "shared"})],
        "sign_split": ["boolean"],
        "temperature": [Interval(Real, 0, None, closed="neither"), None],
        "random_state": ["random_state"],
        "count_scale": [Interval(Integral, 1, 1 << 30, closed="both")],
    }

    def __init__(
        self,
        n_hashes: int = 1024,
        n_inputs_per_hash: int = 8,
        n_winners: int = 32,
        decay: float = 0.5,
        scaling: str = "feature",
        sign_split: bool = True,
        temperature: float | None = None,
        random_state=None,
        count_scale: int = 1,
    ) -> None:
        self.n_hashes = n_hashes
        self.n_inputs_per_hash = n_inputs_per_hash
        self.n_winners = n_winners
        self.decay = decay
        self.scaling = scaling
        self.sign_split = sign_split
        self.temperature = temperature
        self.random_state = random_state
        self.count_scale = count_scale

    # -- training

    def fit(self, X, y) -> "FlyNNClassifier":
        """Standardise with X's statistics, draw M, count the winners of every training point."""
        self._validate_params()
        X, y = validate_data(self, X, y, reset=True)
        check_classification_targets(y)
        self._initialise(X, np.unique(y))
        self._count(X, y)
        return self

    def partial_fit(self, X, y, classes=None) -> "FlyNNClassifier":
        """Add the counts of one batch. The first call fixes the standardisation from its batch and needs
        `classes`; counts are additive, so later batches in any order give the same filters."""
        first = not hasattr(self, "classes_")
        if first:
            self._validate_params()
            if classes is None:
                raise ValueError("classes must be passed on the first call to partial_fit")
        X, y = validate_data(self, X, y, reset=first)
        check_classification_targets(y)
        if first:
            self._initialise(X, np.unique(np.asarray(classes)))
        elif classes is not None and not np.array_equal(np.unique(classes), self.classes_):
            raise ValueError("classes differ from those given on the first call to partial_fit")
        self._count(X, y)
        return self

    def _initialise(self, X: np.ndarray, classes: np.ndarray) -> None:
        self.classes_ = classes
        n_features = X.shape[1]
        self.mean_, self.scale_ = input_standardisation(X, self.scaling)
        self.n_hash_inputs_ = 2 * n_features if self.sign_split else n_features
        self.n_hashes_ = int(self.n_hashes)
        self.n_inputs_per_hash_ = min(int(self.n_inputs_per_hash), self.n_hash_inputs_)
        self.n_winners_ = min(int(self.n_winners), self.n_hashes_)
        self.M_seed_ = draw_seed(self.random_state)
        self.M_indices_ = seeded_indices(self.M_seed_, self.n_hashes_, self.n_inputs_per_hash_, self.n_hash_inputs_)
        self._M = projection_matrix(self.M_indices_, self.n_hash_inputs_)
        self.counts_ = np.zeros((classes.size, self.n_hashes_), dtype=np.int64)

    def _count(self, X: np.ndarray, y: np.ndarray) -> None:
        if not np.isin(y, self.classes_).all():
            raise ValueError("y contains labels not in classes")
        y_index = np.searchsorted(self.classes_, y)
        winners = self.winners(X, validate=False)
        self.counts_ += count_winners(winners, y_index, self.classes_.size, self.n_hashes_)

    # -- inference

    def transform_input(self, X: np.ndarray) -> np.ndarray:
        """Standardised features z (n, d)."""
        return (np.asarray(X, dtype=np.float64) - self.mean_) / self.scale_

    def hash_inputs(self, Z: np.ndarray) -> np.ndarray:
        """What M projects: z on the exact-sum grid, or [z, -z] with the sign split (n, n_hash_inputs_)."""
        Z = np.round(np.clip(Z, -_CLIP, _CLIP) * _GRID) / _GRID
        return np.hstack([Z, -Z]) if self.sign_split else Z

    def winners(self, X, validate: bool = True) -> np.ndarray:
        """FlyHash of X as the (n, ρ) winning row indices."""
        if validate:
            check_is_fitted(self)
            X = validate_data(self, X, reset=False)
        Z = self.hash_inputs(self.transform_input(X))
        parts = [top_winners(project(Z[i : i + _CHUNK], self._M), self.n_winners_) for i in range(0, len(Z), _CHUNK)]
        return np.concatenate(parts) if parts else np.empty((0, self.n_winners_), dtype=np.int64)

    def filter_weights(self) -> np.ndarray:
        """w_lj = (1 - c)^(t_lj / q), (L, m); c = 1 gives the binary filter (1 where seen fewer than q times)."""
        check_is_fitted(self)
        q = int(self.count_scale)
        if self.decay == 1.0:
            return (self.counts_ < q).astype(np.float64)
        return np.power(1.0 - float(self.decay), self.counts_.astype(np.float64) / q)

    def novelty(self, X) -> np.ndarray:
        """f_l(x) = w_l · h(x) / ρ, (n, L), in [0, 1]; lower means more familiar."""
        winners = self.winners(X)
        return novelty_sums(self.filter_weights(), winners) / self.n_winners_

    def decision_function(self, X) -> np.ndarray:
        """Higher is more likely: -f (n, L); binary problems: f_0 - f_1 (positive favours classes_[1])."""
        f = self.novelty(X)
        if self.classes_.size == 2:
            return f[:, 0] - f[:, 1]
        return -f

    def predict(self, X) -> np.ndarray:
        """The least novel class; ties go to the lowest class index."""
        f = self.novelty(X)
        return self.classes_[np.argmin(f, axis=1)]

    def predict_proba(self, X) -> np.ndarray:
        """softmax(-f / temperature); the default temperature 1/ρ makes the logits minus the novelty sums."""
        f = self.novelty(X)
        temperature = self.temperature if self.temperature is not None else 1.0 / self.n_winners_
        logits = -f / temperature
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        return p / p.sum(axis=1, keepdims=True)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        # FlyHash needs d >> 1: on the 2-feature blobs of sklearn's accuracy check every row of M sees the same
        # one or two inputs, so the hash cannot separate the classes. Say so instead of faking a feature map.
        tags.classifier_tags.poor_score = True
        return tags
