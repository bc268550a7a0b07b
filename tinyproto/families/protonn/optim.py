"""ProtoNN training internals: hard thresholding, prototype allocation and k-means seeding, the loss, its
gradients, the Armijo step and one projected SGD epoch (the estimator is in train.py, whose docstring explains
the optimiser). Layer: families (protonn).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

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
    if A.flags.c_contiguous:  # reshape is then a view; indexing it is several times faster than .flat
        A.reshape(-1)[drop] = 0.0
    else:
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


def fit_score_scale(params: Params, Xs: np.ndarray, Y: np.ndarray, gamma2: float) -> None:
    """Scale Z (in place) by the factor that best fits the one-hot targets at the first epoch's gamma.

    The one-hot Z of the initialisation gives a class with k prototypes scores up to k, so the starting loss is
    dominated by scores that are too large. Any step that shrinks every kernel (moving the projections away from
    all prototypes) then lowers the loss, and the epoch-level backtracking accepts it: training could end with
    every score 0 for the classes pushed away (argmax ties: class 0 for most inputs), although the
    initialisation already separated the classes (seen: 3 clusters labelled -1, -2, -3, 100 % cross-validated,
    34.8 % on the test split). With the least-squares scale the starting loss is already below that state's,
    so such a step is rejected."""
    S = kernel(Xs @ params.W.T, params.B, gamma2) @ params.Z.T
    norm = float(np.einsum("ij,ij->", S, S))
    if norm > 0.0:
        params.Z *= float(np.einsum("ij,ij->", S, Y)) / norm


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
    """Per-feature mean and scale: the one rule of every family, `tinyproto.core.inputstage.standardisation`
    (each feature's std; a constant feature, including one whose std is only rounding noise, is scaled by its
    magnitude instead, so it stays at 0 in training and a drifting reading stays small). scaling="global" gives
    every varying feature the data's overall spread instead (pixels, same-unit sensors: one shared gain)."""
    return inputstage_standardisation(X, scaling)


def squared_distances(P: np.ndarray, B: np.ndarray, P2: np.ndarray | None = None,
                      B2: np.ndarray | None = None) -> np.ndarray:
    """||p_i - b_j||^2 for rows p_i of P (n, D) and columns b_j of B (D, m) -> (n, m), never negative.

    P2, B2: the squared norms (P * P).sum(axis=1) and (B * B).sum(axis=0) when the caller already has them (an SGD
    epoch keeps one side fixed; each row of P is summed on its own, so a batch's rows of P2 are its own values)."""
    P2 = (P * P).sum(axis=1) if P2 is None else P2
    B2 = (B * B).sum(axis=0) if B2 is None else B2
    # (P2 - 2 P B) + B2, in place: -2 x + a is a - 2 x exactly (negation is exact, addition commutes)
    d2 = P @ B
    d2 *= -2.0
    d2 += P2[:, None]
    d2 += B2[None, :]
    return np.maximum(d2, 0.0, out=d2)


def kernel(P: np.ndarray, B: np.ndarray, gamma2: float, P2: np.ndarray | None = None,
           B2: np.ndarray | None = None) -> np.ndarray:
    """exp(-gamma^2 ||p_i - b_j||^2): (n, m)."""
    d2 = squared_distances(P, B, P2, B2)
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


def mean_squared_loss(K: np.ndarray, Z: np.ndarray, Y: np.ndarray) -> float:
    """Mean squared loss of the scores K Z^T against the one-hot targets Y, given the kernels K (n, m)."""
    R = K @ Z.T - Y
    return float(np.einsum("ij,ij->", R, R)) / K.shape[0]


def loss_and_grad(
    params: Params, X: np.ndarray, Y: np.ndarray, gamma2: float, block: str | None
) -> tuple[float, np.ndarray | None]:
    """Mean squared loss on (X, Y) and, when block is "W", "B" or "Z", its gradient w.r.t. that tensor."""
    P = X @ params.W.T
    K = kernel(P, params.B, gamma2)
    loss = mean_squared_loss(K, params.Z, Y)
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
    P_all: np.ndarray | None = None,
    K_all: np.ndarray | None = None,
) -> None:
    """One epoch of projected heavy-ball SGD on one block (in place); the other two blocks stay fixed.

    Because they stay fixed, what depends only on them is computed once per epoch instead of per batch: the
    projections for the Z and B epochs, and the kernels for the Z epoch. P_all (Xs W^T) and K_all (its kernels)
    may be given when the caller already has them for the current W, B and gamma2.
    """
    theta = params.get(block)
    velocity = np.zeros_like(theta)
    if block != "W" and P_all is None:
        P_all = Xs @ params.W.T
    if block == "Z" and K_all is None:
        K_all = kernel(P_all, params.B, gamma2)
    # the side of the distances the block does not move: the projections' norms (B epoch), the prototypes' (W)
    P2_all = (P_all * P_all).sum(axis=1) if block == "B" else None
    B2 = (params.B * params.B).sum(axis=0) if block == "W" else None
    for start in range(0, order.size, batch_size):
        idx = order[start : start + batch_size]
        if block == "Z":
            grad = grad_Z(K_all[idx], Y[idx], params.Z)
        elif block == "B":
            P = P_all[idx]
            grad = grad_B(P, kernel(P, params.B, gamma2, P2=P2_all[idx]), Y[idx], params.B, params.Z, gamma2)
        else:
            X = Xs[idx]
            P = X @ params.W.T
            grad = grad_W(X, P, kernel(P, params.B, gamma2, B2=B2), Y[idx], params.B, params.Z, gamma2)
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
