"""ProtoNN float training (Gupta et al., ICML 2017) as a scikit-learn classifier.

Model, for a standardised input z = (x - mean_) / scale_:

    scores_l(x) = sum_j Z_[l, j] * exp(-gamma_^2 * ||W_ z - B_[:, j]||^2),    label = argmax_l (ties -> lowest l)

Training follows the paper's Algorithm 1: minimise the mean squared loss ||y_i - scores(x_i)||^2 (y_i one-hot)
by alternating projected mini-batch SGD over Z, then B, then W, with hard thresholding (keep the largest-magnitude
fraction s of the entries) after every step, so the l0 constraints hold throughout training, not only at the end.

Optimiser details (tuned on several data sets and splits, not on one):

- Initialisation as in the paper: Gaussian W, hard-thresholded (a sparse random projection); prototypes by k-means
  per class in the projected space; Z one-hot of the prototype's class; gamma = 2.5 / median ||W x_i - b_j||.
- Step sizes: each block's first step comes from an Armijo backtracking search on the full training set (projected
  sufficient decrease). SGD then uses heavy-ball momentum, so the Armijo step is scaled by (1 - momentum).
- Epoch-level backtracking ("bold driver"): after every block epoch the full training loss is checked; if it went
  up, the epoch is undone and that block's step is halved, otherwise the step grows by 10 %. This replaces a fixed
  eta_0 / t schedule, which is either too slow or unstable depending on the data set: the step decays exactly as
  much as the loss surface demands, and the training loss never increases within a gamma level.
- gamma is ramped from 60 % to 100 % of its final value over the first half of the epochs: with the paper's sharp
  kernel most kernel values start near 0, so gradients vanish and random initialisations get stuck.
Layer: families.
"""


from __future__ import annotations

import math

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from tinyproto.families.solving import one_thread
from tinyproto.families.protonn.optim import (  # noqa: F401  (re-exported: tests and tools import them from here)
    ARMIJO_SHRINK,
    ARMIJO_TRIALS,
    BLOCKS,
    DEFAULT_PROTOTYPES_PER_CLASS,
    GAMMA_NUMERATOR,
    GAMMA_RAMP,
    GAMMA_START,
    KMEANS_ITERATIONS,
    MOMENTUM,
    Params,
    STEP_BACKOFF,
    STEP_GROWTH,
    _distance_sensitivity,
    allocate_prototypes,
    fit_score_scale,
    armijo_step,
    gamma_schedule,
    grad_B,
    grad_W,
    grad_Z,
    hard_threshold,
    kernel,
    kmeans,
    loss_and_grad,
    mean_squared_loss,
    n_kept,
    sgd_epoch,
    squared_distances,
    standardisation,
)


# The SGD epochs run in float32 (the initialisation and everything after training in float64): the kernels' exp
# and the small matrix products cost about half, and the model is quantized to int8 afterwards, so float64's extra
# digits do not reach the device (int8 test accuracy at 2 kB the same on digits, breast_cancer and wine).
TRAIN_DTYPE = np.float32


class ProtoNNClassifier(ClassifierMixin, BaseEstimator):
    """ProtoNN: sparse low-dimensional projection + a few labelled prototypes with an RBF kernel.

    Parameters
    ----------
    n_components : projected dimension D (rows of W_).
    n_prototypes : total number of prototypes m; None -> 5 per class. Split over classes as evenly as possible,
        at least one per class and at most the class's sample count, so the fitted m (B_.shape[1]) can differ.
    sparsity_W, sparsity_B, sparsity_Z : fraction in (0, 1] of entries of W_, B_, Z_ allowed to be nonzero
        (l0 constraints, enforced by hard thresholding after every training step: at most ceil(s * size)).
    gamma : final kernel width; None -> 2.5 / median distance between projected samples and initial prototypes.
    n_epochs : outer alternating iterations; each runs one SGD epoch on Z, then B, then W.
    batch_size : mini-batch size of the SGD epochs.
    random_state : seeds W's initialisation, the k-means seeding and the mini-batch order.

    Fitted attributes
    -----------------
    classes_, n_features_in_, mean_, scale_ (standardisation, part of the model), W_ (D, d), B_ (D, m),
    Z_ (L, m), gamma_, prototype_class_ (m,) (class each prototype was initialised for), n_iter_ (epochs run),
    loss_curve_ (training loss after each epoch).

    Cost of fit: O(n_epochs * n_samples * (D * d + m * (D + L))) in vectorised numpy.
    """

    def __init__(
        self,
        n_components: int = 10,
        n_prototypes: int | None = None,
        sparsity_W: float = 1.0,
        sparsity_B: float = 1.0,
        sparsity_Z: float = 1.0,
        gamma: float | None = None,
        n_epochs: int = 40,
        batch_size: int = 64,
        random_state=None,
        scaling: str = "feature",
    ) -> None:
        self.n_components = n_components
        self.n_prototypes = n_prototypes
        self.sparsity_W = sparsity_W
        self.sparsity_B = sparsity_B
        self.sparsity_Z = sparsity_Z
        self.gamma = gamma
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.random_state = random_state
        self.scaling = scaling

    # ---- fit ----------------------------------------------------------------------------------------------

    def fit(self, X, y) -> "ProtoNNClassifier":
        """Standardise, initialise (sparse random W, per-class k-means prototypes, one-hot Z) and train."""
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        self._check_params()
        self.classes_, y_index = np.unique(y, return_inverse=True)
        if self.classes_.size < 2:
            raise ValueError(f"ProtoNNClassifier needs at least 2 classes; got 1 class ({self.classes_[0]!r})")
        rng = check_random_state(self.random_state)

        self.mean_, self.scale_ = standardisation(X, self.scaling)
        Xs = (X - self.mean_) / self.scale_
        Y = np.eye(self.classes_.size)[y_index]

        # The matrices are tiny: a second BLAS thread only adds synchronisation, and when the other core is busy
        # (parallel fits, other jobs) its spin-waiting can make a fit several times slower.
        with one_thread("blas"):
            params = self._initialise(Xs, y_index, rng)
            self.gamma_ = self._initial_gamma(Xs @ params.W.T, params.B)
            fit_score_scale(params, Xs, Y, gamma_schedule(self.gamma_, 1, int(self.n_epochs)) ** 2)
            params = Params(W=params.W.astype(TRAIN_DTYPE), B=params.B.astype(TRAIN_DTYPE),
                            Z=params.Z.astype(TRAIN_DTYPE))
            self.n_iter_, self.loss_curve_ = self._train(params, Xs.astype(TRAIN_DTYPE), Y.astype(TRAIN_DTYPE), rng)
        self.W_, self.B_, self.Z_ = (params.W.astype(np.float64), params.B.astype(np.float64),
                                     params.Z.astype(np.float64))
        return self

    def _check_params(self) -> None:
        if int(self.n_components) < 1:
            raise ValueError(f"n_components must be >= 1; got {self.n_components!r}")
        if self.n_prototypes is not None and int(self.n_prototypes) < 1:
            raise ValueError(f"n_prototypes must be >= 1 or None; got {self.n_prototypes!r}")
        for name in ("sparsity_W", "sparsity_B", "sparsity_Z"):
            value = getattr(self, name)
            if not 0.0 < float(value) <= 1.0:
                raise ValueError(f"{name} must be in (0, 1]; got {value!r}")
        if self.gamma is not None and not float(self.gamma) > 0.0:
            raise ValueError(f"gamma must be > 0 or None; got {self.gamma!r}")
        if int(self.n_epochs) < 1 or int(self.batch_size) < 1:
            raise ValueError(f"n_epochs and batch_size must be >= 1; got {self.n_epochs!r}, {self.batch_size!r}")

    def _initialise(self, Xs: np.ndarray, y_index: np.ndarray, rng: np.random.RandomState) -> Params:
        """Gaussian W (hard-thresholded: a sparse random projection), k-means prototypes per class, one-hot Z."""
        n_classes = self.classes_.size
        W = rng.standard_normal((int(self.n_components), Xs.shape[1]))
        hard_threshold(W, self.sparsity_W)
        # Unit-variance projected coordinates whatever the sparsity, so gamma and step sizes see the same scale.
        W /= math.sqrt(max(1.0, np.count_nonzero(W) / W.shape[0]))
        P = Xs @ W.T

        per_class = allocate_prototypes(np.bincount(y_index, minlength=n_classes), self.n_prototypes)
        centres = [kmeans(P[y_index == c], int(per_class[c]), rng) for c in range(n_classes)]
        B = np.ascontiguousarray(np.concatenate(centres).T)  # (D, m)
        self.prototype_class_ = np.repeat(np.arange(n_classes), per_class)
        Z = np.ascontiguousarray(np.eye(n_classes)[:, self.prototype_class_])  # (L, m)
        hard_threshold(B, self.sparsity_B)
        hard_threshold(Z, self.sparsity_Z)
        return Params(W=W, B=B, Z=Z)

    def _initial_gamma(self, P: np.ndarray, B: np.ndarray) -> float:
        if self.gamma is not None:
            return float(self.gamma)
        median = float(np.median(np.sqrt(squared_distances(P, B))))
        return GAMMA_NUMERATOR / median if median > 0 else 1.0

    def _train(
        self, params: Params, Xs: np.ndarray, Y: np.ndarray, rng: np.random.RandomState
    ) -> tuple[int, list[float]]:
        """Alternating projected SGD over Z, B, W with epoch-level backtracking; returns (epochs, loss curve)."""
        n = Xs.shape[0]
        batch_size = min(int(self.batch_size), n)
        n_epochs = int(self.n_epochs)
        fractions = {"W": self.sparsity_W, "B": self.sparsity_B, "Z": self.sparsity_Z}
        eta: dict[str, float] = {}
        curve: list[float] = []
        # The full set's projections P = Xs W^T, their squared distances D2 to the prototypes and kernels K of the
        # current parameters, kept across the blocks: a Z epoch changes none of them, a B epoch D2 and K, and a
        # rejected epoch restores the parameters they belong to. A new gamma only needs K again from D2, and with
        # an unchanged gamma the epoch starts from the loss the last one ended with (of the same K and Z). Each is
        # what loss_and_grad would compute again from the same arrays, so the fit is the same.
        P = Xs @ params.W.T
        D2 = squared_distances(P, params.B)
        K, K_gamma2, loss = None, None, None
        for epoch in range(1, n_epochs + 1):
            gamma2 = gamma_schedule(self.gamma_, epoch, n_epochs) ** 2
            if gamma2 != K_gamma2:  # gamma has changed: re-measure
                K, K_gamma2 = _kernel_of(D2, gamma2), gamma2
                loss = mean_squared_loss(K, params.Z, Y)
            for block in BLOCKS:
                if not eta.get(block):  # first epoch, or the gradient vanished last time
                    eta[block] = (1.0 - MOMENTUM) * armijo_step(params, block, fractions[block], Xs, Y, gamma2)
                theta = params.get(block)
                saved = theta.copy()
                sgd_epoch(block, params, Xs, Y, gamma2, eta[block], fractions[block], rng.permutation(n), batch_size,
                          P_all=P, K_all=K)
                new_P = Xs @ params.W.T if block == "W" else P
                new_D2 = D2 if block == "Z" else squared_distances(new_P, params.B)
                new_K = K if block == "Z" else _kernel_of(new_D2, gamma2)
                new_loss = mean_squared_loss(new_K, params.Z, Y)
                if new_loss <= loss:  # also rejects NaN
                    loss, P, D2, K = new_loss, new_P, new_D2, new_K
                    eta[block] *= STEP_GROWTH
                else:
                    theta[...] = saved
                    eta[block] *= STEP_BACKOFF
            curve.append(loss)
        return n_epochs, curve

    # ---- inference ----------------------------------------------------------------------------------------

    def standardize(self, X) -> np.ndarray:
        """(X - mean_) / scale_ with the training set's statistics (part of the model)."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return (X - self.mean_) / self.scale_

    def project(self, X) -> np.ndarray:
        """Standardised inputs projected by W_: (n, D)."""
        return self.standardize(X) @ self.W_.T

    def kernels(self, X) -> np.ndarray:
        """exp(-gamma_^2 ||W_ z - b_j||^2) for every sample and prototype: (n, m)."""
        P = self.project(X)
        return kernel(P, self.B_, self.gamma_**2)

    def class_scores(self, X) -> np.ndarray:
        """Score of every class, (n, L): sum_j Z_[l, j] * kernel_j."""
        return self.kernels(X) @ self.Z_.T

    def decision_function(self, X) -> np.ndarray:
        """sklearn's contract: (n, L) class scores; with two classes a (n,) score, > 0 meaning classes_[1].

        The binary score is (c1 - c0) / (c0 + c1) with c the nonnegative class masses behind predict_proba, so
        its sign matches predict and its ranking matches predict_proba[:, 1]; class_scores gives the raw (n, 2).
        """
        check_is_fitted(self)
        scores = self.class_scores(X)
        if self.classes_.size != 2:
            return scores
        mass, total = _class_mass(scores)
        return (mass[:, 1] - mass[:, 0]) / total

    def predict(self, X) -> np.ndarray:
        """Label with the largest class score (ties -> lowest class index, as on the device)."""
        check_is_fitted(self)
        return self.classes_[np.argmax(self.class_scores(X), axis=1)]

    def predict_proba(self, X) -> np.ndarray:
        """Class scores clipped at 0 and normalised per sample; uniform when all scores are equal."""
        mass, total = _class_mass(self.class_scores(X))
        return mass / total[:, None]


def _kernel_of(D2: np.ndarray, gamma2: float) -> np.ndarray:
    """optim.kernel's exp(-gamma^2 d2) of squared distances already measured (a new array; D2 is kept)."""
    K = D2 * -gamma2
    return np.exp(K, out=K)


def _class_mass(scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nonnegative per-class masses and their row sums (always > 0), ordered like the scores.

    Normally the scores clipped at 0. A sample whose scores are all <= 0 but not all equal (far from every
    prototype, with negative Z entries) would clip to all zeros, and a uniform answer would disagree with
    predict's argmax; it uses scores - min(scores) instead. All-equal scores give equal masses (uniform).
    """
    mass = np.maximum(scores, 0.0)
    total = mass.sum(axis=1)
    shifted = total <= 0.0
    if np.any(shifted):
        mass[shifted] = scores[shifted] - scores[shifted].min(axis=1, keepdims=True)
        total[shifted] = mass[shifted].sum(axis=1)
    flat = total <= 0.0
    mass[flat] = 1.0
    total[flat] = scores.shape[1]
    return mass, total
