"""Binary Neighbor Compression (Zhong et al., AISTATS 2017), float side: the estimator and Algorithm 1.

A BNC model is a linear hash g(x) = sign(W z) of the standardised input z into r bits, and m binary prototypes
b_j in {-1, 1}^r with fixed labels z_j; the prediction is the label of the prototype nearest to g(x) in Hamming
distance. The score of class l is minus its nearest prototype's distance, so argmax over classes is 1-NN over
prototypes (ties go to the lowest class index, as on the device).

Training (the paper's Algorithm 1):
1. W is Gaussian (rows of unit expected norm);
2. per class, k-means with m_y clusters (m split over the classes in proportion to their sizes, at least one
   each), centres C, and B~ = B = sign(W C);
3. phase 1: mini-batch SGD on the hinge surrogate (the paper's eq. 6)
       [alpha - max_{j: z_j = y} tanh(gamma W z)^T b~_j + max_{j: z_j != y} tanh(gamma W z)^T b~_j]_+
       + lambda sum_k (|w_k|^2 - 1)^2
   over W and B~ jointly, B~ projected back onto [-1, 1] after every step; then B = sign(B~);
4. phase 2: the same loss over W alone with B fixed.

Conventions shared with the integer model (quantize.py) and firmware/tp_bnc.c:
* sign(0) is +1: bit k of a code is 1 exactly when the k-th projection is >= 0 (the device tests the sign bit);
* the standardised input is clipped where the int8 input stage clips (`input_scale_` * 127), so the hash the
  estimator learns is the hash the device computes, up to int8 rounding;
* `input_stage` "feature" standardises each feature (a mean and a gain per feature on the device, 4 B each);
  "shared" is one offset and one gain for every feature (4 B in all, tinyproto.core.inputstage.shared_stage:
  pixels, same-unit sensors, wide inputs). The estimator then sees z = (x - offset) * gain / s, the device's
  int8 value before rounding divided by s, the features' RMS spread in int8 steps (so z has the unit scale the
  initialisation and the tanh slope expect); sign(W z) does not see s. The features are not centred one by
  one (the device cannot): a constant feature acts as a bias of the hash. W starts with each row orthogonal to
  the mean input on the row's support (W mean(z) = 0), so the first hash is that of the centred input, and B
  starts from that W (on 784 pixels at 2 kB this took the int8 test accuracy from ~0.88 to ~0.95, over seeds);
* prototypes are kept sorted by class (the device stores class boundaries, not one label per prototype).

Additions to the paper, each because of the 8-bit target or for determinism (see docs/models/bnc.md):
* `density` < 1 keeps only the largest |W| entries (a sparse W costs fewer bytes); phase 2 then trains the kept
  entries only, so the deployed hash is the one that was optimised;
* after every epoch the binary model's training error is measured and the best (W, B) seen is kept (plain
  SGD on this non-convex loss can wander away from a good point).
Layer: families (bnc).
"""

from __future__ import annotations

import hashlib
import threading
import warnings
from collections import OrderedDict
from numbers import Integral, Real

import numpy as np
from sklearn import config_context
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from sklearn.utils import check_random_state
from sklearn.utils._param_validation import Interval, StrOptions
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from tinyproto.core.inputstage import INPUT_MAX, choose_input_scale, shared_stage, standardisation
from tinyproto.families.bnc.pattern import pattern_mask
from tinyproto.families.solving import one_thread


def allocate_prototypes(class_sizes: np.ndarray, m: int) -> np.ndarray:
    """m prototypes over the classes in proportion to their sizes (largest remainders), at least one per class
    and at most one per training point of the class."""
    sizes = np.asarray(class_sizes, dtype=np.int64)
    m = int(min(max(m, sizes.size), sizes.sum()))
    share = sizes / sizes.sum() * (m - sizes.size)  # the first prototype of every class is fixed
    counts = 1 + np.floor(share).astype(np.int64)
    order = np.argsort(-(share - np.floor(share)), kind="stable")
    counts[order[: m - int(counts.sum())]] += 1
    while (counts > sizes).any():  # a class smaller than its share: give the surplus to the largest classes
        surplus = int((counts - sizes).clip(min=0).sum())
        counts = np.minimum(counts, sizes)
        room = sizes - counts
        for c in np.argsort(-room, kind="stable")[:surplus]:
            counts[c] += 1 if room[c] > 0 else 0
    return counts


CENTRED_SUPPORT = 8  # the fewest features a row reads for _centred_rows to centre it


def _centred_rows(W: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """Each row of W minus its component along mu restricted to the row's support: W mu = 0, so sign(W z) starts
    as the hash of the centred input z - mu (a shared stage cannot centre the features one by one). Only rows
    reading at least CENTRED_SUPPORT features: on fewer, losing one direction would leave the rows too alike (on
    2 features every row would hash the same direction)."""
    support = (W != 0) & ((W != 0).sum(axis=1, keepdims=True) >= CENTRED_SUPPORT)
    M = support * mu[None, :]
    norm = (M * M).sum(axis=1, keepdims=True)
    coef = np.where(norm > 0, (W * M).sum(axis=1, keepdims=True) / np.where(norm > 0, norm, 1.0), 0.0)
    return W - coef * M


def kept_weights(n_bits: int, n_features: int, density: float) -> int:
    """Entries of W a model of this density keeps: at least one per row, at most all."""
    return int(min(n_bits * n_features, max(n_bits, round(density * n_bits * n_features))))


def binary_codes(A: np.ndarray) -> np.ndarray:
    """Projections (n, r) -> {-1, +1} codes with sign(0) = +1."""
    return np.where(A >= 0, 1.0, -1.0)


def class_scores(codes: np.ndarray, B: np.ndarray, proto_class: np.ndarray, n_classes: int) -> np.ndarray:
    """Minus the Hamming distance to each class's nearest prototype, (n, L). codes (n, r) and B (m, r) in
    {-1, +1}; Hamming distance = (r - code . b) / 2."""
    r = B.shape[1]
    # float32 is exact here (a sum of r terms of +-1 is an integer, r < 2^24) and halves the product's cost: the
    # solver scores every epoch of every candidate with this
    dots = codes.astype(np.float32) @ B.T.astype(np.float32)  # (n, m)
    out = np.full((codes.shape[0], n_classes), -np.inf)
    if proto_class.size and np.all(proto_class[1:] >= proto_class[:-1]):
        # prototypes sorted by class (as trained): each class's largest dot product over its run of columns in one
        # call, then the distance of that one; the distance falls as the product grows and both are exact, so these
        # are the loop's values
        present, starts = np.unique(proto_class, return_index=True)
        out[:, present] = -((r - np.maximum.reduceat(dots, starts, axis=1)) / 2.0)
        return out
    dist = (r - dots) / 2.0
    for c in range(n_classes):
        mine = proto_class == c
        if mine.any():
            out[:, c] = -dist[:, mine].min(axis=1)
    return out


def nearest_classes(A: np.ndarray, Bt: np.ndarray, proto_class: np.ndarray, n_classes: int) -> np.ndarray:
    """argmax(class_scores(binary_codes(A), binary_codes(Bt), ...), axis=1): the class of the prototype nearest
    to each projection's code. With the prototypes sorted by class (as trained) that is the class of the first
    column of the largest code . b (the lowest class among the nearest, as argmax over the class scores breaks
    ties): one argmax over the products instead of a reduction per class."""
    if not (proto_class.size and np.all(proto_class[1:] >= proto_class[:-1])):
        return np.argmax(class_scores(binary_codes(A), binary_codes(Bt), proto_class, n_classes), axis=1)
    one, minus = np.float32(1.0), np.float32(-1.0)  # float32 products are exact, as in class_scores
    dots = np.where(A >= 0, one, minus) @ np.where(Bt >= 0, one, minus).T
    return proto_class[np.argmax(dots, axis=1)]


def _without_shared_codes(B: np.ndarray, proto_class: np.ndarray, row_codes: np.ndarray,
                          y_index: np.ndarray) -> np.ndarray:
    """B with no code held by prototypes of two classes where the training rows decide between them. A code that
    prototypes of several classes hold is a tie for every input that hashes to it, and a tie goes to the lowest
    class: with one feature (one sign: two codes) every class held both codes and the model answered class 0
    for everything (33 % on three learnable classes). The code goes to the class of most training rows hashing to
    it; in each other class its prototype becomes a copy of one of that class's own codes (the bytes and the
    prototypes' order are kept), or, in a class without a code of its own, that code with its first bit flipped. A
    code no training row has is left."""
    B = B.copy()
    codes, owners = np.unique(B, axis=0, return_inverse=True)
    owners = owners.ravel()
    classes_of = [np.unique(proto_class[owners == k]) for k in range(len(codes))]
    shared = [k for k in range(len(codes)) if classes_of[k].size > 1]
    if not shared:
        return B
    winner = {}
    for k in shared:
        rows = np.all(row_codes == codes[k], axis=1)
        votes = np.bincount(y_index[rows], minlength=int(proto_class.max()) + 1)[classes_of[k]]
        if votes.max() > 0:
            winner[k] = int(classes_of[k][np.argmax(votes)])
    for k, owner in winner.items():
        for c in classes_of[k]:
            if c != owner:
                B[(proto_class == c) & (owners == k)] = _code_kept_by(c, k, B, proto_class, owners, codes, winner)
    return B


def _code_kept_by(c: int, lost: int, B: np.ndarray, proto_class: np.ndarray, owners: np.ndarray,
                  codes: np.ndarray, winner: dict[int, int]) -> np.ndarray:
    """The code class c's prototypes take in place of code `lost`, which another class won: one of c's codes that
    no class won, else one c won itself (neither kind is ever replaced, so B still holds it), else `lost` with its
    first bit flipped, one bit away, so the winner's exact match takes the inputs of `lost` rather than the lowest
    class."""
    decided = np.isin(owners, list(winner))
    undecided = np.flatnonzero((proto_class == c) & ~decided)
    won = np.flatnonzero((proto_class == c) & np.array([winner.get(j) == c for j in owners]))
    for own in (undecided, won):
        if own.size:
            return B[own[0]]
    return codes[lost] * np.r_[-1.0, np.ones(B.shape[1] - 1)]


def _prototype_gradient(shape: tuple[int, int], jp: np.ndarray, jn: np.ndarray, TA: np.ndarray,
                        active: np.ndarray) -> np.ndarray:
    """The prototypes' gradient of a mini-batch, bit for bit what
        gB = np.zeros(shape); np.add.at(gB, jp, -TA); np.add.at(gB, jn, TA)
    gives (each entry summed in that order: jp's rows, then jn's, each in row order), in one unbuffered add over
    the flat array, which numpy runs ~10x faster than add.at over rows. An inactive row's TA is all zeros (+0 or
    -0), and adding a zero to an entry that starts at +0 changes none of its bits: those rows are left out."""
    r = shape[1]
    gB = np.zeros(shape)
    rows = np.concatenate([jp[active], jn[active]])
    TA = TA[active]
    values = np.concatenate([-TA, TA])
    np.add.at(gB.reshape(-1), (rows[:, None] * r + np.arange(r)).reshape(-1), values.reshape(-1))
    return gB


def _kmeans_centres(Zc: np.ndarray, k: int, seed: int) -> np.ndarray:
    """k-means centres of one class's rows (one initialisation, seeded; one thread, as BNCClassifier.fit runs it)."""
    # duplicate points can leave fewer distinct clusters: not an error. Zc is finite (standardised and clipped) and
    # the parameters valid by construction: scikit-learn's checks of both are skipped (they cost more than the fit
    # on a class of a few dozen rows; the result is the same)
    with warnings.catch_warnings(), config_context(assume_finite=True, skip_parameter_validation=True):
        warnings.simplefilter("ignore", ConvergenceWarning)
        centres = KMeans(n_clusters=k, n_init=1, random_state=seed).fit(Zc).cluster_centers_
    centres.flags.writeable = False  # shared by every fit that asks the memo for it
    return centres


def _rows_key(Zc: np.ndarray) -> tuple:
    """What identifies a class's rows for _KMeansMemo: their shape, type and a digest of their bytes."""
    Zc = np.ascontiguousarray(Zc)
    return Zc.shape, Zc.dtype.str, hashlib.blake2b(Zc.tobytes(), digest_size=16).digest()


class _KMeansMemo:
    """The per-class k-means results of this process, by (rows, k, seed), least recently used dropped past
    MAX_BYTES. A solver fits many shapes on the same rows with the same seed (the densities of one r, the same
    folds again: on 120 digits rows at 1 kB, 1,180 distinct k-means of 2,530 asked for), and k-means with one
    initialisation, a fixed seed and one thread is a function of its rows: a result asked for again is the one
    computed, bit for bit. Also the number of distinct rows of a class (np.unique's cost, per class per fit)."""

    MAX_BYTES = 32 << 20
    ENTRY_BYTES = 256  # what an entry costs besides its array (the key, the dictionary's slot)

    def __init__(self) -> None:
        self._entries: OrderedDict = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()  # fits may run in threads (a dask worker's)

    def get(self, key):
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key, value):
        with self._lock:
            if key not in self._entries:
                self._entries[key] = value
                self._bytes += self.ENTRY_BYTES + getattr(value, "nbytes", 0)
                while self._bytes > self.MAX_BYTES and len(self._entries) > 1:
                    _, dropped = self._entries.popitem(last=False)
                    self._bytes -= self.ENTRY_BYTES + getattr(dropped, "nbytes", 0)
        return value


_KMEANS_MEMO = _KMeansMemo()


class BNCClassifier(ClassifierMixin, BaseEstimator):
    """Binary Neighbor Compression: a learned r-bit linear hash and m learned binary prototypes, 1-NN in Hamming
    distance.

    Parameters
    ----------
    n_bits : r, bits of the hash (rows of W).
    n_prototypes : m, binary prototypes in all (split over the classes by size, at least one per class).
    density : fraction of W's entries kept (the largest magnitudes); 1.0 is a dense W.
    input_stage : "feature" (per-feature standardisation) or "shared" (one offset and gain for all features;
        the fitted stage is `stage_`, what IntBNC.from_classifier deploys).
    seeded_per_row : K; if set, each row of W reads K features at positions regenerated from a seed
        (pattern.py: no bytes for the positions, for wide inputs), fixed before training; density is ignored.
    alpha : hinge margin as a fraction of r (the surrogate's scores t^T b~ lie in [-r, r]).
    gamma : tanh slope of the relaxed sign.
    lam : weight of the row-norm penalty sum_k (|w_k|^2 - 1)^2.
    learning_rate : SGD step for W and B~ (decays as 1 / (1 + epoch / 10)).
    batch_size : mini-batch size.
    epochs_joint, epochs_w : passes over the data in phase 1 (W and B~) and phase 2 (W alone).
    random_state : W's Gaussian draw, k-means, the mini-batch order.
    """

    _parameter_constraints: dict = {
        "n_bits": [Interval(Integral, 1, 1024, closed="both")],
        "n_prototypes": [Interval(Integral, 1, 65535, closed="both")],
        "density": [Interval(Real, 0, 1, closed="right")],
        "seeded_per_row": [Interval(Integral, 1, 255, closed="both"), None],
        "input_stage": [StrOptions({"feature", "shared"})],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "gamma": [Interval(Real, 0, None, closed="neither")],
        "lam": [Interval(Real, 0, None, closed="left")],
        "learning_rate": [Interval(Real, 0, None, closed="neither")],
        "batch_size": [Interval(Integral, 1, None, closed="left")],
        "epochs_joint": [Interval(Integral, 0, None, closed="left")],
        "epochs_w": [Interval(Integral, 0, None, closed="left")],
        "random_state": ["random_state"],
    }

    def __init__(
        self,
        n_bits: int = 32,
        n_prototypes: int = 40,
        density: float = 1.0,
        seeded_per_row: int | None = None,
        input_stage: str = "feature",
        alpha: float = 0.25,
        gamma: float = 1.0,
        lam: float = 1.0,
        learning_rate: float = 0.05,
        batch_size: int = 128,
        epochs_joint: int = 30,
        epochs_w: int = 30,
        random_state=None,
    ) -> None:
        self.n_bits = n_bits
        self.n_prototypes = n_prototypes
        self.density = density
        self.seeded_per_row = seeded_per_row
        self.input_stage = input_stage
        self.alpha = alpha
        self.gamma = gamma
        self.lam = lam
        self.learning_rate = learning_rate
        self.batch_size = batch_size
        self.epochs_joint = epochs_joint
        self.epochs_w = epochs_w
        self.random_state = random_state

    # -- training

    def fit(self, X, y) -> "BNCClassifier":
        # The matrices are small (a mini-batch times r or m) and so are the per-class k-means: one thread is
        # fastest. On a shared machine multi-threaded BLAS or OpenMP (KMeans) waiting for busy cores made each fit
        # several times slower (a 300-row search: 127 s with OpenMP on 2 busy cores, 24 s with one thread), and
        # one thread also keeps KMeans's sums in one order whatever the machine's core count.
        with one_thread():
            return self._fit(X, y)

    def _fit(self, X, y) -> "BNCClassifier":
        self._validate_params()
        X, y = validate_data(self, X, y, dtype=np.float64)
        check_classification_targets(y)
        rng = check_random_state(self.random_state)
        self.classes_, y_index = np.unique(y, return_inverse=True)
        L = self.classes_.size
        self._fit_input_stage(X)
        Z = self.transform_input(X)
        n, d = Z.shape
        r = int(self.n_bits)
        W = rng.standard_normal((r, d)) / np.sqrt(d)
        counts = allocate_prototypes(np.bincount(y_index, minlength=L), int(self.n_prototypes))
        centres = self._centres(Z, y_index, counts, rng)
        self.proto_class_ = np.repeat(np.arange(L), counts)
        Bt = binary_codes(centres @ W.T)  # (m, r)
        mask = np.ones_like(W, dtype=bool)
        self.pattern_seed_, self.per_row_ = 0, 0
        if self.seeded_per_row is not None:  # a fixed seeded pattern from the start (pattern.py)
            self.pattern_seed_ = int(rng.randint(1, 65536))
            self.per_row_ = min(int(self.seeded_per_row), d)
            mask = pattern_mask(self.pattern_seed_, r, d, self.per_row_)
            W = W * mask
        if self.input_stage == "shared":  # start from the centred input's hash, B from the W that is trained
            W = _centred_rows(W * mask, Z.mean(axis=0))
            Bt = binary_codes(centres @ W.T)
        if L > 1:
            W, Bt = self._sgd(Z, y_index, W, Bt, mask, rng, int(self.epochs_joint), train_b=True)
            Bt = binary_codes(Bt)
            if self.density < 1.0 and self.seeded_per_row is None:
                mask = self._sparsity_mask(W)
                W = W * mask
            W, Bt = self._sgd(Z, y_index, W, Bt, mask, rng, int(self.epochs_w), train_b=False)
        self.W_ = W * mask
        self.B_ = _without_shared_codes(binary_codes(Bt), self.proto_class_, binary_codes(Z @ self.W_.T), y_index)
        # what the quantizer needs to keep each row's threshold where training put it (quantize.row_int8)
        self.input_mean_, self.input_var_ = Z.mean(axis=0), Z.var(axis=0)
        self.n_bits_, self.n_prototypes_ = r, int(counts.sum())
        return self

    def _fit_input_stage(self, X) -> None:
        """mean_, scale_ and input_scale_ such that z = (x - mean_) / scale_ and the device's int8 input is
        round(z / input_scale_) clipped to +-127 (exactly so for a shared stage, whose stored values are used)."""
        if self.input_stage == "shared":
            stage = shared_stage(X)
            offset, gain = float(stage.mean[0]), float(stage.gain[0])
            U = np.clip((X - offset) * gain, -INPUT_MAX, INPUT_MAX)  # int8 steps, before rounding
            spread = float(np.sqrt(np.mean(U.var(axis=0))))
            spread = spread if np.isfinite(spread) and spread > 1e-3 else 1.0
            self.stage_ = stage
            self.mean_ = np.full(X.shape[1], offset)
            self.scale_ = np.full(X.shape[1], spread / gain)
            self.input_scale_ = 1.0 / spread
            return
        self.stage_ = None  # IntBNC.from_classifier builds the per-feature stage from mean_, scale_, input_scale_
        self.mean_, self.scale_ = standardisation(X)
        Z0 = (X - self.mean_) / self.scale_
        self.input_scale_ = choose_input_scale(Z0)

    def _centres(self, Z, y_index, counts, rng) -> np.ndarray:
        """Per-class k-means centres, class by class (so prototypes come sorted by class)."""
        out = []
        for c, k in enumerate(counts):
            Zc = Z[y_index == c]
            rows = _rows_key(Zc)
            n_distinct = _KMEANS_MEMO.get(("distinct", rows))
            if n_distinct is None:
                n_distinct = _KMEANS_MEMO.put(("distinct", rows), len(np.unique(Zc, axis=0)))
            if k >= n_distinct:  # as many prototypes as distinct points: the points are the centres
                distinct = np.unique(Zc, axis=0)
                out.append(distinct[np.arange(k) % len(distinct)])
                continue
            seed = int(rng.randint(2**31 - 1))
            centres = _KMEANS_MEMO.get(("kmeans", rows, int(k), seed))
            if centres is None:
                centres = _KMEANS_MEMO.put(("kmeans", rows, int(k), seed), _kmeans_centres(Zc, int(k), seed))
            out.append(centres)
        return np.vstack(out)

    def _sparsity_mask(self, W: np.ndarray) -> np.ndarray:
        """Exactly `kept_weights(r, d, density)` entries: each row's largest (so no bit is constant), then the
        largest of the rest, magnitudes relative to their row's largest (each row's scale is free)."""
        r, d = W.shape
        rel = np.abs(W) / (np.abs(W).max(axis=1, keepdims=True) + 1e-300)
        mask = np.zeros((r, d), dtype=bool)
        mask[np.arange(r), np.argmax(rel, axis=1)] = True
        extra = kept_weights(r, d, float(self.density)) - r
        if extra > 0:
            order = np.argsort(-np.where(mask, -1.0, rel), axis=None, kind="stable")[:extra]
            mask.reshape(-1)[order] = True
        return mask

    def _sgd(self, Z, y_index, W, Bt, mask, rng, epochs, train_b):
        """Mini-batch SGD on the hinge surrogate; returns the (W, B~) with the fewest binary training errors."""
        n = len(Z)
        r = W.shape[0]
        alpha = float(self.alpha) * r
        gamma, lam, bs = float(self.gamma), float(self.lam), int(self.batch_size)
        same = y_index[:, None] == self.proto_class_[None, :]  # (n, m)
        best = (self._train_errors(Z, y_index, W, Bt), W.copy(), Bt.copy())
        for epoch in range(epochs):
            lr = float(self.learning_rate) / (1.0 + epoch / 10.0)
            order = rng.permutation(n)
            for start in range(0, n, bs):
                idx = order[start : start + bs]
                Zb, pos = Z[idx], same[idx]
                T = np.tanh(gamma * (Zb @ W.T))  # (b, r)
                S = T @ Bt.T  # (b, m)
                jp = np.argmax(np.where(pos, S, -np.inf), axis=1)
                jn = np.argmax(np.where(pos, -np.inf, S), axis=1)
                rows = np.arange(len(idx))
                active = (alpha - S[rows, jp] + S[rows, jn]) > 0
                a = active[:, None] / len(idx)
                gT = (Bt[jn] - Bt[jp]) * a
                gW = (gT * gamma * (1.0 - T * T)).T @ Zb
                norms = (W * W).sum(axis=1, keepdims=True)
                # the norm penalty's step is capped at the row itself: a longer one overshoots past zero, and the
                # cubic term then grows without bound (overflow within a few batches at a large learning rate)
                gW += np.minimum(4.0 * lam * (norms - 1.0), 1.0 / lr) * W
                W = W - lr * gW * mask
                if train_b:
                    Bt = np.clip(Bt - lr * _prototype_gradient(Bt.shape, jp, jn, T * a, active), -1.0, 1.0)
            errors = self._train_errors(Z, y_index, W, Bt)
            if errors < best[0]:
                best = (errors, W.copy(), Bt.copy())
        return best[1], best[2]

    def _train_errors(self, Z, y_index, W, Bt) -> int:
        return int(np.sum(nearest_classes(Z @ W.T, Bt, self.proto_class_, self.classes_.size) != y_index))

    # -- inference

    def transform_input(self, X) -> np.ndarray:
        """Standardised z, clipped where the int8 input stage clips."""
        Z = (np.asarray(X, dtype=np.float64) - self.mean_) / self.scale_
        limit = INPUT_MAX * self.input_scale_
        return np.clip(Z, -limit, limit)

    def codes(self, X) -> np.ndarray:
        """g(x) = sign(W z) in {-1, +1}, (n, r)."""
        check_is_fitted(self)
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return binary_codes(self.transform_input(X) @ self.W_.T)

    def decision_function(self, X) -> np.ndarray:
        """Minus the Hamming distance to each class's nearest prototype (n, L); two classes: s_1 - s_0."""
        scores = class_scores(self.codes(X), self.B_, self.proto_class_, self.classes_.size)
        if self.classes_.size == 2:
            return scores[:, 1] - scores[:, 0]
        return scores

    def predict(self, X) -> np.ndarray:
        scores = class_scores(self.codes(X), self.B_, self.proto_class_, self.classes_.size)
        return self.classes_[np.argmax(scores, axis=1)]
