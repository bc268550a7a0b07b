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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data
from threadpoolctl import threadpool_limits

from tinyproto.core.inputstage import standardisation as inputstage_standardisation

# Prototypes per class when n_prototypes is None.
DEFAULT_PROTOTYPES_PER_CLASS = 5
# gamma = GAMMA_NUMERATOR / median(||b_j - W x_i||) at initialisation (the paper's heuristic).
GAMMA_NUMERATOR = 2.5
# Training starts at GAMMA_START * gamma and reaches gamma after GAMMA_RAMP of the epochs.
GAMMA_START = 0.6
GAMMA_RAMP = 0.5
# Lloyd iterations of the per-class k-means that places the initial prototypes.
KMEANS_ITERATIONS = 10
# Armijo backtracking: first trial step ||theta|| / ||grad|| (a move as large as the tensor), halved until accepted.
ARMIJO_TRIALS = 30
ARMIJO_SHRINK = 0.5
# Heavy-ball momentum of the SGD epochs; the Armijo step is multiplied by (1 - MOMENTUM) to keep the same reach.
MOMENTUM = 0.9
# Bold driver: a rejected epoch halves the block's step, an accepted one multiplies it by STEP_GROWTH.
STEP_GROWTH = 1.1
STEP_BACKOFF = 0.5

BLOCKS = ("Z", "B", "W")  # the paper's order


# ---- small helpers ------------------------------------------------------------------------------------------


def n_kept(fraction: float, size: int) -> int:
    """Entries a hard threshold keeps: ceil(fraction * size), at least one (an all-zero tensor is useless)."""
    return min(size, max(1, math.ceil(fraction * size - 1e-9)))


def hard_threshold(A: np.ndarray, fraction: float) -> np.ndarray:
    """Zero all but the ceil(fraction * size) largest-magnitude entries of A (in place; returns A).

    Exactly that many survive even with ties (argpartition picks a deterministic subset), so the l0 budget the
    solver paid for is never exceeded.
    """
    keep = n_kept(fraction, A.size)
    if keep >= A.size:
        return A
    drop = np.argpartition(np.abs(A).ravel(), A.size - keep)[: A.size - keep]
    A.flat[drop] = 0.0  # .flat writes through for any memory layout (reshape could silently copy)
    return A


def allocate_prototypes(class_counts: np.ndarray, n_prototypes: int | None) -> np.ndarray:
    """Prototypes per class: as even as possible, at least one per class, at most the class's sample count.

    The total is max(n_prototypes, n_classes) capped by the number of samples; the remainder of the even split
    goes to the most frequent classes first (lowest class index on ties).
    """
    counts = np.asarray(class_counts, dtype=np.int64)
    if n_prototypes is None:
        n_prototypes = DEFAULT_PROTOTYPES_PER_CLASS * counts.size
    total = int(min(max(int(n_prototypes), counts.size), counts.sum()))
    per_class = np.zeros(counts.size, dtype=np.int64)
    by_frequency = np.argsort(-counts, kind="stable")
    # Water filling: each round gives one prototype to every class with room left, most frequent first.
    while per_class.sum() < total:
        for c in by_frequency:
            if per_class.sum() == total:
                break
            if per_class[c] < counts[c]:
                per_class[c] += 1
    return per_class


def kmeans(P: np.ndarray, k: int, rng: np.random.RandomState, n_iter: int = KMEANS_ITERATIONS) -> np.ndarray:
    """k centres (k, D) of the rows of P: k-means++ seeding, then a few Lloyd iterations.

    Small and deterministic for a given rng; good enough to seed prototypes, which training then moves.
    """
    n = P.shape[0]
    if k >= n:
        return P[:k].copy()
    centres = np.empty((k, P.shape[1]))
    centres[0] = P[rng.randint(n)]
    closest = ((P - centres[0]) ** 2).sum(axis=1)
    for j in range(1, k):
        total = closest.sum()
        pick = rng.choice(n, p=closest / total) if total > 0 else rng.randint(n)
        centres[j] = P[pick]
        closest = np.minimum(closest, ((P - centres[j]) ** 2).sum(axis=1))
    for _ in range(n_iter):
        assign = np.argmin(squared_distances(P, centres.T), axis=1)
        sums = np.zeros_like(centres)
        np.add.at(sums, assign, P)
        sizes = np.bincount(assign, minlength=k)
        filled = sizes > 0  # an empty cluster keeps its old centre
        centres[filled] = sums[filled] / sizes[filled, None]
    return centres


def standardisation(X: np.ndarray, scaling: str = "feature") -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and scale: the one rule of every family, `tinyproto.inputstage.standardisation`
    (each feature's std; a constant feature, including one whose std is only rounding noise, is scaled by its
    magnitude instead, so it stays at 0 in training and a drifting reading stays small). scaling="global" gives
    every varying feature the data's overall spread instead (pixels, same-unit sensors: one shared gain)."""
    return inputstage_standardisation(X, scaling)


def squared_distances(P: np.ndarray, B: np.ndarray) -> np.ndarray:
    """||p_i - b_j||^2 for rows p_i of P (n, D) and columns b_j of B (D, m) -> (n, m), never negative."""
    d2 = (P * P).sum(axis=1)[:, None] - 2.0 * (P @ B) + (B * B).sum(axis=0)[None, :]
    return np.maximum(d2, 0.0, out=d2)


def kernel(P: np.ndarray, B: np.ndarray, gamma2: float) -> np.ndarray:
    """exp(-gamma^2 ||p_i - b_j||^2): (n, m)."""
    d2 = squared_distances(P, B)
    d2 *= -gamma2
    return np.exp(d2, out=d2)


# ---- loss and gradients -------------------------------------------------------------------------------------


@dataclass
class Params:
    """The three trained tensors: W (D, d), B (D, m), Z (L, m)."""

    W: np.ndarray
    B: np.ndarray
    Z: np.ndarray

    def get(self, block: str) -> np.ndarray:
        return getattr(self, block)

    def replaced(self, block: str, value: np.ndarray) -> "Params":
        return Params(**{**vars(self), block: value})


def grad_Z(K: np.ndarray, Y: np.ndarray, Z: np.ndarray) -> np.ndarray:
    """Gradient of the mean squared loss w.r.t. Z (L, m), given the kernels K (n, m) of a batch."""
    R = K @ Z.T - Y
    return (2.0 / K.shape[0]) * (R.T @ K)


def _distance_sensitivity(K: np.ndarray, Y: np.ndarray, Z: np.ndarray, gamma2: float) -> np.ndarray:
    """d loss / d ||p_i - b_j||^2, (n, m): the chain rule through the residual and the kernel."""
    E = (K @ Z.T - Y) @ Z
    E *= K
    E *= -2.0 * gamma2 / K.shape[0]
    return E


def grad_B(P: np.ndarray, K: np.ndarray, Y: np.ndarray, B: np.ndarray, Z: np.ndarray, gamma2: float) -> np.ndarray:
    """Gradient w.r.t. the prototypes B (D, m), given a batch's projections P (n, D) and kernels K."""
    E = _distance_sensitivity(K, Y, Z, gamma2)
    return 2.0 * (B * E.sum(axis=0) - P.T @ E)


def grad_W(
    X: np.ndarray, P: np.ndarray, K: np.ndarray, Y: np.ndarray, B: np.ndarray, Z: np.ndarray, gamma2: float
) -> np.ndarray:
    """Gradient w.r.t. the projection W (D, d): through every projected coordinate of the batch."""
    E = _distance_sensitivity(K, Y, Z, gamma2)
    grad_P = 2.0 * (P * E.sum(axis=1)[:, None] - E @ B.T)  # (n, D)
    return grad_P.T @ X


def loss_and_grad(
    params: Params, X: np.ndarray, Y: np.ndarray, gamma2: float, block: str | None
) -> tuple[float, np.ndarray | None]:
    """Mean squared loss on (X, Y) and, when block is "W", "B" or "Z", its gradient w.r.t. that tensor."""
    P = X @ params.W.T
    K = kernel(P, params.B, gamma2)
    R = K @ params.Z.T - Y
    loss = float(np.einsum("ij,ij->", R, R)) / X.shape[0]
    if block == "Z":
        return loss, grad_Z(K, Y, params.Z)
    if block == "B":
        return loss, grad_B(P, K, Y, params.B, params.Z, gamma2)
    if block == "W":
        return loss, grad_W(X, P, K, Y, params.B, params.Z, gamma2)
    return loss, None


def armijo_step(params: Params, block: str, fraction: float, X: np.ndarray, Y: np.ndarray, gamma2: float) -> float:
    """Largest step eta (first guess ||theta|| / ||grad||, then halving) with a sufficient projected decrease.

    Sufficient decrease for projected gradient steps: f(theta+) <= f(theta) + <g, theta+ - theta>
    + ||theta+ - theta||^2 / (2 eta), with theta+ = HT(theta - eta g). Returns 0 when the gradient vanishes.
    """
    theta = params.get(block)
    loss, grad = loss_and_grad(params, X, Y, gamma2, block)
    grad_norm = float(np.linalg.norm(grad))
    if grad_norm == 0.0:
        return 0.0
    eta = max(float(np.linalg.norm(theta)), 1e-3) / grad_norm
    for _ in range(ARMIJO_TRIALS):
        moved = hard_threshold(theta - eta * grad, fraction)
        step = moved - theta
        new_loss, _ = loss_and_grad(params.replaced(block, moved), X, Y, gamma2, None)
        if new_loss <= loss + float(np.vdot(grad, step)) + float(np.vdot(step, step)) / (2.0 * eta):
            break
        eta *= ARMIJO_SHRINK
    return eta


def sgd_epoch(
    block: str,
    params: Params,
    Xs: np.ndarray,
    Y: np.ndarray,
    gamma2: float,
    eta: float,
    fraction: float,
    order: np.ndarray,
    batch_size: int,
) -> None:
    """One epoch of projected heavy-ball SGD on one block (in place); the other two blocks stay fixed.

    Because they stay fixed, what depends only on them is computed once per epoch instead of per batch: the
    projections for the Z and B epochs, and the kernels for the Z epoch.
    """
    theta = params.get(block)
    velocity = np.zeros_like(theta)
    P_all = Xs @ params.W.T if block != "W" else None
    K_all = kernel(P_all, params.B, gamma2) if block == "Z" else None
    for start in range(0, order.size, batch_size):
        idx = order[start : start + batch_size]
        if block == "Z":
            grad = grad_Z(K_all[idx], Y[idx], params.Z)
        elif block == "B":
            P = P_all[idx]
            grad = grad_B(P, kernel(P, params.B, gamma2), Y[idx], params.B, params.Z, gamma2)
        else:
            X = Xs[idx]
            P = X @ params.W.T
            grad = grad_W(X, P, kernel(P, params.B, gamma2), Y[idx], params.B, params.Z, gamma2)
        velocity *= MOMENTUM
        velocity += grad
        theta -= eta * velocity
        hard_threshold(theta, fraction)


def gamma_schedule(gamma: float, epoch: int, n_epochs: int) -> float:
    """gamma used in epoch `epoch` (1-based): linear ramp from GAMMA_START * gamma to gamma, then constant."""
    ramp_epochs = max(1.0, GAMMA_RAMP * n_epochs)
    progress = min(1.0, (epoch - 1) / ramp_epochs)
    return gamma * (GAMMA_START + (1.0 - GAMMA_START) * progress)


# ---- the estimator ------------------------------------------------------------------------------------------


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
        with threadpool_limits(limits=1, user_api="blas"):
            params = self._initialise(Xs, y_index, rng)
            self.gamma_ = self._initial_gamma(Xs @ params.W.T, params.B)
            self.n_iter_, self.loss_curve_ = self._train(params, Xs, Y, rng)
        self.W_, self.B_, self.Z_ = params.W, params.B, params.Z
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
        for epoch in range(1, n_epochs + 1):
            gamma2 = gamma_schedule(self.gamma_, epoch, n_epochs) ** 2
            loss = loss_and_grad(params, Xs, Y, gamma2, None)[0]  # gamma may have changed: re-measure
            for block in BLOCKS:
                if not eta.get(block):  # first epoch, or the gradient vanished last time
                    eta[block] = (1.0 - MOMENTUM) * armijo_step(params, block, fractions[block], Xs, Y, gamma2)
                theta = params.get(block)
                saved = theta.copy()
                sgd_epoch(block, params, Xs, Y, gamma2, eta[block], fractions[block], rng.permutation(n), batch_size)
                new_loss = loss_and_grad(params, Xs, Y, gamma2, None)[0]
                if new_loss <= loss:  # also rejects NaN
                    loss = new_loss
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
