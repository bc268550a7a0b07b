"""Federated FlyNN (FlyNN-FL, Ram & Sinha, AAAI 2022): one model from data that never leaves its parties.

FlyNN trains by counting: t_lj is the number of training points of class l whose FlyHash sets bit j. Counts of
disjoint shards add up to the counts of the pooled data (the paper's Theorem 4), so τ parties that agree on the
hash (a shared seed fixes M and every other random choice) can each count locally and all-reduce the sums.
Everything before the counting has to be agreed the same way, with sums that add up *exactly*:

1. the classes: the union of the parties' label sets;
2. the hyper-parameters (`choose_config`): the budget solver's candidate shapes ranked by K-fold accuracy of
   the integer model over *every* party's rows (flynn/federated_selection.py: per-fold counts and correct-
   prediction tallies are all-reduced, no row leaves its party), so the choice tracks what `compile` picks on
   the pooled rows at any number of parties; under DP a data-independent default shape instead;
3. the standardisation: every party sends n, Σx and Σx² per feature as exact integers (each float64 is an
   integer times a power of two, so the sums are exact Python integers); mean and std follow from the exact
   totals with one rounding each, so they are bit-identical for every partition of the data, including the
   single "central" party. (FlyNNClassifier.fit uses numpy's float sums, which depend on the row order; the
   canonical statistics differ from those by an ulp or so, which is why the central baseline is this same
   pipeline with one party.);
4. the int8 step of the input stage: `choose_input_scale` takes a quantile of |z| over all training values. The
   two order statistics it interpolates are found exactly by a distributed search over the bit patterns of
   |z| (non-negative float64 order like their int64 bit patterns): each round every party counts its values
   <= 1023 cut points, the counts are summed, the interval shrinks 1024-fold; ~7 rounds of small integer
   vectors give the same quantile numpy computes on the pooled data;
5. the counts: per party, the float model's counts and the integer model's counts (the device's hash of the
   int8 inputs, as `IntFlyNN.from_classifier` recounts them), summed; saturation to the model's count bits
   happens after the sum (min(Σ, cap) is not Σ min). Parties that learn on a device (DeviceBackend) can only
   release counts already saturated on the device; re-saturating their sum is still exact, because for
   non-negative c_p: min(Σ_p min(c_p, cap), cap) = min(Σ_p c_p, cap) (if any c_p reaches the cap both sides
   are the cap, otherwise nothing was clipped). Only the deployed, saturated counts are then comparable.

Without differential privacy the federated model is therefore *identical* to the central one: same counts,
same predictions (tests/test_federated.py checks this for strongly non-IID splits too).

Differential privacy (the paper's Algorithm 2), applied by each party to its own integer counts before they
leave it. On the flattened count vector c (all L·m entries, class-major):

* budget: ε is split over the T picks, the T releases and the τ parties: ε₀ = ε / (2Tτ);
* pick T entries one at a time without replacement, each by the exponential mechanism with score c_i
  (sensitivity 1): P(i) ∝ exp(ε₀·c_i / 2). Sampling is done with the Gumbel-top-T trick (the T largest of
  ε₀·c_i/2 + Gumbel noise, in decreasing order), which has exactly the distribution of T sequential draws;
* release each picked count as c_i + Laplace(2Tτ/ε) (scale 1/ε₀), rounded to the nearest integer and clipped
  at 0 (post-processing: the integer model needs non-negative integer counts); every other entry is 0;
* T is at most L·m (`federate` caps a larger --dp-T and records both, T and T_requested).
The authors' reference code weights the exponential mechanism as exp(ε₀·c), twice as strongly as the paper;
this module follows the paper (exp(ε₀·c/2), the textbook mechanism for a sensitivity-1 score).
Each party's randomness is a numpy Generator on its own child of SeedSequence(seed) (`party_seed_sequences`),
so runs are reproducible and parties' streams independent. What DP covers: the released counts. The class set,
the standardisation sums and the quantile search counts are released without noise (under DP the shape is a
data-independent default, so model selection releases nothing), and the sum is not a secure aggregation; the report says so.

Backends: `LocalBackend` runs every party in this process (tests, central baseline); `DaskBackend` places
each party's shard once on a dask.distributed worker (client.scatter) and runs every party's computation
there (client.submit pinned to that worker); the all-reduce is a tree of additions on the cluster;
`tinyproto.device.federated.DeviceBackend` makes each party a (simulated) Uno that learns its shard with the
learning firmware and whose counts are read back over serial (`allreduce_counts`).
"""

from __future__ import annotations

import inspect
import math
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from fractions import Fraction
from typing import Any, Protocol

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.families.flynn.quantize import IntFlyNN, integer_winners
from tinyproto.families.flynn.solver import (
    DEFAULT_MAX_MS,
    F_CPU,
    MIN_HASHES,
    estimate_cycles,
    fastest_m,
    CountLimit,
    largest_m,
    model_bytes,
    solver_random_state,
)
from tinyproto.families.flynn.train import FlyNNClassifier, count_winners, draw_seed
from tinyproto.core.inputstage import InputStage, choose_input_scale, standardise_moments

Shard = tuple[np.ndarray, np.ndarray]  # (X, y) of one party

# choose_input_scale's quantile, read from its signature so the two can never disagree
INPUT_QUANTILE = float(inspect.signature(choose_input_scale).parameters["quantile"].default)
_INF_BITS = int(np.float64(np.inf).view(np.int64))  # every finite |z| has a smaller bit pattern
QUANTILE_CUTS = 1023  # cut points per search round and target: the interval shrinks 1024-fold per round
CONNECT_TIMEOUT = 20.0  # seconds: connecting to a scheduler, starting workers (--timeout)
ROUND_TIMEOUT = 600.0  # seconds: one all-reduce round on the cluster

# the shape under DP (data-independent): a middle-of-the-road FlyNN, m sized to the budget
DEFAULT_CONFIG = {"n_inputs_per_hash": 8, "n_winners": 16, "decay": 1.0, "count_bits": 1, "store_M": False,
                  "scaling": "feature", "sign_split": True}


# ---------------------------------------------------------------- seeds


def party_seed_sequences(seed: int, n_parties: int) -> tuple[np.random.SeedSequence, list[np.random.SeedSequence]]:
    """(the stream that splits the data, one independent stream per party) from SeedSequence(seed).

    A fresh root every call, so the same seed always yields the same children (spawn() counts on its object)."""
    split_ss, parties_ss = np.random.SeedSequence(int(seed)).spawn(2)
    return split_ss, parties_ss.spawn(n_parties)


# ---------------------------------------------------------------- splitting the training data into parties


@dataclass(frozen=True)
class SplitSpec:
    kind: str  # "iid", "by-class" or "dirichlet"
    alpha: float | None = None  # dirichlet concentration

    def __str__(self) -> str:
        return f"dirichlet:{self.alpha:g}" if self.kind == "dirichlet" else self.kind


def parse_split(spec: str) -> SplitSpec:
    """'iid', 'by-class' or 'dirichlet:ALPHA' (ALPHA > 0; small ALPHA = very uneven class mixes)."""
    text = spec.strip().lower()
    if text in ("iid", "by-class"):
        return SplitSpec(text)
    if text.startswith("dirichlet:"):
        try:
            alpha = float(text.split(":", 1)[1])
        except ValueError:
            alpha = float("nan")
        if not (alpha > 0 and math.isfinite(alpha)):
            raise TinyprotoError(f"--split {spec!r}: the Dirichlet concentration must be a positive number")
        return SplitSpec("dirichlet", alpha)
    raise TinyprotoError(f"--split {spec!r}: choose iid, by-class or dirichlet:ALPHA (e.g. dirichlet:0.1)")


def split_parties(y: np.ndarray, n_parties: int, spec: SplitSpec | str = "iid", seed: int = 0) -> list[np.ndarray]:
    """Row indices of each party (sorted, disjoint, covering every row; no party is empty).

    iid: a random permutation cut into equal parts. by-class: rows sorted by class (shuffled within a class)
    and cut into equal contiguous parts, so each party holds one or a few classes. dirichlet:α: every class is
    divided among the parties in proportions drawn from Dirichlet(α, ..., α), the usual non-IID benchmark;
    a party left empty receives one row from the largest party.
    """
    spec = parse_split(spec) if isinstance(spec, str) else spec
    y = np.asarray(y)
    n = len(y)
    if not 1 <= n_parties <= n:
        raise TinyprotoError(f"need 1 <= parties <= {n} (the training rows), got {n_parties}")
    rng = np.random.default_rng(party_seed_sequences(seed, n_parties)[0])
    if spec.kind == "iid":
        parts = np.array_split(rng.permutation(n), n_parties)
    elif spec.kind == "by-class":
        order = rng.permutation(n)
        order = order[np.argsort(_class_index(y)[order], kind="stable")]
        parts = np.array_split(order, n_parties)
    else:
        parts = _dirichlet_parts(_class_index(y), n_parties, float(spec.alpha), rng)
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


def _class_index(y: np.ndarray) -> np.ndarray:
    return np.unique(y, return_inverse=True)[1].reshape(-1)


def _dirichlet_parts(y_index: np.ndarray, n_parties: int, alpha: float, rng: np.random.Generator) -> list[list[int]]:
    parts: list[list[int]] = [[] for _ in range(n_parties)]
    for c in range(int(y_index.max()) + 1):
        rows = rng.permutation(np.flatnonzero(y_index == c))
        shares = rng.dirichlet(np.full(n_parties, alpha))
        if not np.all(np.isfinite(shares)):
            raise TinyprotoError(f"--split dirichlet:{alpha:g}: the concentration is too extreme to sample; "
                                 "use a value between 1e-3 and 1e6")
        cuts = np.round(np.cumsum(shares) * len(rows)).astype(np.int64)
        for p, chunk in enumerate(np.split(rows, cuts[:-1])):
            parts[p].extend(chunk.tolist())
    for p in range(n_parties):  # deterministic repair: the largest party gives up its last row
        if not parts[p]:
            donor = max(range(n_parties), key=lambda q: len(parts[q]))
            parts[p].append(parts[donor].pop())
    return parts


# ---------------------------------------------------------------- exact standardisation statistics


@dataclass(frozen=True)
class MomentSums:
    """n and, per feature, Σx = sum1 · 2^exponent and Σx² = sum2 · 2^(2·exponent), as exact integers."""

    n: int
    exponent: int
    sum1: tuple[int, ...]
    sum2: tuple[int, ...]

    def __add__(self, other: "MomentSums") -> "MomentSums":
        if len(self.sum1) != len(other.sum1):
            raise ValueError("moment sums over different numbers of features")
        e = min(self.exponent, other.exponent)
        a, b = self._shifted(e), other._shifted(e)
        return MomentSums(self.n + other.n, e, tuple(map(operator.add, a[0], b[0])),
                          tuple(map(operator.add, a[1], b[1])))

    def _shifted(self, e: int) -> tuple[list[int], list[int]]:
        k = self.exponent - e  # >= 0: re-express at the smaller exponent, exactly
        return [v << k for v in self.sum1], [v << (2 * k) for v in self.sum2]


def moment_sums(X: np.ndarray) -> MomentSums:
    """Exact n, Σx, Σx² per column. Each float64 is mantissa · 2^e with a 53-bit integer mantissa; bringing every
    value to the smallest exponent makes it an exact Python integer, and integer sums never round."""
    X = np.asarray(X, dtype=np.float64)
    n, d = X.shape
    frac, exp = np.frexp(X)
    mant = np.ldexp(frac, 53).astype(np.int64)  # exact: x = mant · 2^(exp - 53)
    exp = exp.astype(np.int64) - 53
    nonzero = mant != 0
    base = int(exp[nonzero].min()) if nonzero.any() else 0
    shift = np.where(nonzero, exp - base, 0)
    ints = mant.astype(object) << shift.astype(object)  # x = ints · 2^base, exactly
    sum1 = ints.sum(axis=0) if n else np.zeros(d, dtype=object)
    sum2 = (ints * ints).sum(axis=0) if n else np.zeros(d, dtype=object)
    return MomentSums(int(n), base, tuple(int(v) for v in sum1), tuple(int(v) for v in sum2))


def _scaled(value: int, exp2: int, denominator: int) -> Fraction:
    """value · 2^exp2 / denominator, exactly."""
    return Fraction(value << exp2, denominator) if exp2 >= 0 else Fraction(value, denominator << -exp2)


def standardisation(sums: MomentSums, scaling: str) -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) by the one rule of every family (`inputstage.standardise_moments`), from the exact sums:
    mean and population variance are rounded once each from the exact totals, so any partition of the same rows
    gives bit-identical statistics, and the rule maps them to bit-identical scales."""
    if sums.n < 1:
        raise TinyprotoError("no training rows to standardise")
    means = [_scaled(s1, sums.exponent, sums.n) for s1 in sums.sum1]
    variances = [_scaled(s2, 2 * sums.exponent, sums.n) - mu * mu for s2, mu in zip(sums.sum2, means)]
    result = standardise_moments([float(mu) for mu in means], [float(v) for v in variances], scaling)
    return result.mean, result.scale


# ---------------------------------------------------------------- exact distributed quantile (the int8 step)


def count_at_most(sorted_bits: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """How many of a party's values have a bit pattern <= each cut (int64)."""
    return np.searchsorted(sorted_bits, np.asarray(cuts, dtype=np.int64), side="right").astype(np.int64)


def select_order_statistics(count: Callable[[np.ndarray], np.ndarray], ks: Sequence[int],
                            n_cuts: int = QUANTILE_CUTS) -> tuple[list[float], int]:
    """The k-th smallest (0-based) non-negative values for each k in ks, exactly, and the rounds it took.

    `count(cuts)` returns the summed number of values whose float64 bit pattern is <= each cut. The answer for k
    is the smallest pattern p with count(p) >= k + 1; every round narrows each k's interval [lo, hi] to one of
    n_cuts + 1 slices, all k sharing one query.
    """
    lo = {k: 0 for k in ks}
    hi = {k: _INF_BITS for k in ks}
    rounds = 0
    while any(lo[k] < hi[k] for k in ks):
        open_ks = [k for k in ks if lo[k] < hi[k]]
        cuts = {k: _cuts(lo[k], hi[k], n_cuts) for k in open_ks}
        totals = count(np.concatenate([np.asarray(cuts[k], dtype=np.int64) for k in open_ks]))
        rounds += 1
        offset = 0
        for k in open_ks:
            c = cuts[k]
            got = totals[offset: offset + len(c)]
            offset += len(c)
            above = np.flatnonzero(got >= k + 1)
            if above.size:
                first = int(above[0])
                hi[k] = c[first]
                if first > 0:
                    lo[k] = c[first - 1] + 1
            else:
                lo[k] = c[-1] + 1
    return [float(np.int64(lo[k]).view(np.float64)) for k in ks], rounds


def _cuts(lo: int, hi: int, n_cuts: int) -> list[int]:
    """Up to n_cuts distinct integers in [lo, hi - 1], evenly spread (all of them when the range is short)."""
    width = hi - lo
    if width <= n_cuts:
        return list(range(lo, hi))
    return sorted({lo + (width * i) // (n_cuts + 1) for i in range(1, n_cuts + 1)})


def quantile_positions(n_values: int, q: float = INPUT_QUANTILE) -> tuple[int, int, float]:
    """(k, k + 1, t) of numpy's 'linear' quantile: h = (n - 1)·q, k = floor h, t = h - k; the quantile is
    lerp(a[k], a[k + 1], t) of the sorted values a."""
    h = (n_values - 1) * q
    k = math.floor(h)
    return k, min(k + 1, n_values - 1), h - k


def input_scale_from_order_statistics(a_k: float, a_k1: float, t: float) -> float:
    """choose_input_scale on the pooled |z| given the two order statistics it interpolates: np.quantile of the
    pair at t runs numpy's own interpolation on the same two numbers, so the result is bit-identical."""
    return choose_input_scale(np.array([[a_k, a_k1]], dtype=np.float64), quantile=t)


# ---------------------------------------------------------------- the shared configuration


@dataclass(frozen=True)
class FlyNNConfig:
    """Every hyper-parameter the parties share; `random_state` draws M's 16-bit `seed` (draw_seed)."""

    n_hashes: int
    n_inputs_per_hash: int
    n_winners: int
    decay: float
    count_bits: int
    store_M: bool
    scaling: str
    sign_split: bool
    seed: int
    random_state: int

    def chosen(self) -> dict:
        """The hyper-parameters as `compile` reports them (model.json / report.json `hyperparameters`)."""
        out = asdict(self)
        out.pop("random_state")
        return out


@dataclass(frozen=True)
class FederatedSpec:
    """What every party needs to hash and count: the configuration, the classes and the agreed input stage."""

    config: FlyNNConfig
    classes: np.ndarray
    mean: np.ndarray
    scale: np.ndarray
    input_scale: float | None = None  # known after the quantile search

    @property
    def n_features(self) -> int:
        return int(self.mean.size)

    def input_stage(self) -> InputStage:
        if self.input_scale is None:
            raise ValueError("the int8 step is not agreed yet")
        return InputStage.from_standardisation(self.mean, self.scale, self.input_scale)


def config_from_solver(chosen: dict, seed: int) -> FlyNNConfig:
    """FlyNNConfig from the solver's info['chosen'] (fit with random_state=seed)."""
    state = solver_random_state(seed)
    if draw_seed(state) != int(chosen["seed"]):  # the solver changed how it seeds M: fail loudly, never silently
        raise AssertionError("fit_flynn_under_budget no longer draws M's seed from its first random draw")
    return FlyNNConfig(int(chosen["n_hashes"]), int(chosen["n_inputs_per_hash"]), int(chosen["n_winners"]),
                       float(chosen["decay"]), int(chosen["count_bits"]), bool(chosen["store_M"]),
                       str(chosen["scaling"]), bool(chosen["sign_split"]), int(chosen["seed"]), state)


def default_config(seed: int) -> FlyNNConfig:
    """DEFAULT_CONFIG with the largest m allowed (fit_to_classes sizes it); M seeded as the solver would."""
    state = solver_random_state(seed)
    c = DEFAULT_CONFIG
    return FlyNNConfig(8192, c["n_inputs_per_hash"], c["n_winners"], c["decay"], c["count_bits"], c["store_M"],
                       c["scaling"], c["sign_split"], draw_seed(state), state)


def fit_to_classes(config: FlyNNConfig, n_classes: int, n_features: int, budget_bytes: int,
                   max_inference_ms: float | None = DEFAULT_MAX_MS,
                   count_limit: CountLimit | None = None) -> FlyNNConfig:
    """Shrink m (and s, as the solver caps it) so the filters of all n_classes fit the budget and the time cap
    (and, with count_limit, the learning firmware's SRAM/EEPROM: parties that learn on a device).

    Party 0 may hold fewer classes than the federation; its configuration would then overflow the budget."""
    n_in = 2 * n_features if config.sign_split else n_features
    s = min(config.n_inputs_per_hash, max(1, n_in // 2))
    max_cycles = None if max_inference_ms is None else max_inference_ms * 1e-3 * F_CPU
    m = min(config.n_hashes,
            largest_m(budget_bytes, s, config.count_bits, n_classes, n_features, n_in, config.store_M),
            fastest_m(max_cycles, s, config.n_winners, config.count_bits, n_classes, n_in, config.store_M))
    if count_limit is not None:
        m = min(m, count_limit(config.n_winners, config.count_bits, n_in, config.store_M))
    if m < max(MIN_HASHES, config.n_winners):
        need = model_bytes(max(MIN_HASHES, config.n_winners), s, config.count_bits, n_classes, n_features, n_in,
                           config.store_M)
        where = " and the learning firmware's SRAM/EEPROM" if count_limit is not None else ""
        raise TinyprotoError(f"the chosen FlyNN (rho={config.n_winners}) does not fit {budget_bytes} B{where} for "
                             f"{n_classes} classes; it needs about {need} B")
    return FlyNNConfig(m, s, config.n_winners, config.decay, config.count_bits, config.store_M, config.scaling,
                       config.sign_split, config.seed, config.random_state)


def build_estimator(spec: FederatedSpec) -> FlyNNClassifier:
    """A FlyNNClassifier with the agreed configuration, standardisation and M, and zero counts.

    Uses the public partial_fit: its first call fixes the standardisation from its batch, so a one-row batch at
    the agreed mean sets mean_ exactly (the mean of one row is that row); then the agreed scale replaces the
    one-row std and the row's counts are cleared. M comes from random_state, as in any fit.
    """
    c = spec.config
    clf = FlyNNClassifier(n_hashes=c.n_hashes, n_inputs_per_hash=c.n_inputs_per_hash, n_winners=c.n_winners,
                          decay=c.decay, scaling=c.scaling, sign_split=c.sign_split, random_state=c.random_state)
    clf.partial_fit(spec.mean[None, :], spec.classes[:1], classes=spec.classes)
    clf.scale_ = np.array(spec.scale, dtype=np.float64)
    clf.counts_ = np.zeros_like(clf.counts_)
    if clf.M_seed_ != c.seed or not np.array_equal(clf.mean_, spec.mean):
        raise AssertionError("the estimator did not take the agreed seed / mean")
    return clf


# ---------------------------------------------------------------- what each party computes on its own shard


def party_classes(shard: Shard) -> np.ndarray:
    return np.unique(shard[1])


def party_moment_sums(shard: Shard) -> MomentSums:
    return moment_sums(shard[0])


def party_abs_z_bits(shard: Shard, spec: FederatedSpec) -> np.ndarray:
    """Sorted bit patterns of |z| over the party's values, z exactly as FlyNNClassifier.transform_input makes it
    (kept on the party for the quantile search)."""
    z = np.abs(build_estimator(spec).transform_input(shard[0])).reshape(-1)
    return np.sort(z.view(np.int64))


@dataclass(frozen=True)
class DPParams:
    """The paper's Algorithm 2 budget: ε over T picks + T releases and τ parties."""

    epsilon: float
    T: int  # the T used (at most L·m: more picks than counts do not exist)
    n_parties: int
    T_requested: int | None = None  # --dp-T as given (None: the default rule)

    def __post_init__(self) -> None:
        if not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise TinyprotoError(f"--dp-epsilon must be a positive number, got {self.epsilon}")
        if self.T < 1:
            raise TinyprotoError(f"--dp-T must be at least 1, got {self.T}")
        if self.n_parties < 1:
            raise TinyprotoError(f"need at least one party, got {self.n_parties}")

    @property
    def epsilon_0(self) -> float:
        return self.epsilon / (2 * self.T * self.n_parties)

    @property
    def laplace_scale(self) -> float:
        return 2 * self.T * self.n_parties / self.epsilon

    def to_json(self) -> dict:
        return {
            "epsilon": self.epsilon,
            "T": self.T,
            "T_requested": self.T_requested,
            "parties": self.n_parties,
            "epsilon_0": self.epsilon_0,
            "laplace_scale": self.laplace_scale,
            "epsilon_per_party": self.epsilon / self.n_parties,
            "mechanism": "per party: T exponential-mechanism picks without replacement, P(i) ~ exp(epsilon_0 * "
                         "count_i / 2) (the paper; the authors' code uses exp(epsilon_0 * count_i)), each picked "
                         "count + Laplace(laplace_scale), rounded to the nearest integer and clipped at 0; "
                         "other entries 0",
            "covers": "the released per-class counts only; class set, standardisation sums, quantile-search "
                      "counts are released without noise (the model shape is a data-independent default under DP); no secure "
                      "aggregation",
        }


def em_log_weights(counts: np.ndarray, epsilon_0: float) -> np.ndarray:
    """log of the exponential-mechanism weights exp(ε₀·count/2) (score = count, sensitivity 1)."""
    return np.asarray(counts, dtype=np.float64) * (epsilon_0 / 2.0)


def em_probabilities(counts: np.ndarray, epsilon_0: float) -> np.ndarray:
    """The first pick's distribution: exp(ε₀·c_i/2) / Σ_k exp(ε₀·c_k/2), computed without overflow."""
    logw = em_log_weights(counts, epsilon_0)
    w = np.exp(logw - logw.max())
    return w / w.sum()


def exponential_mechanism_picks(counts: np.ndarray, T: int, epsilon_0: float, rng: np.random.Generator) -> np.ndarray:
    """T distinct indices of the flat `counts`, in pick order, distributed as T sequential draws without
    replacement with P ∝ exp(ε₀·c/2) among the entries left (Gumbel-top-T: the T largest log-weight + Gumbel)."""
    flat = np.asarray(counts).reshape(-1)
    T = min(int(T), flat.size)
    keys = em_log_weights(flat, epsilon_0) + rng.gumbel(size=flat.size)
    return np.argsort(-keys, kind="stable")[:T]


def dp_release(counts: np.ndarray, dp: DPParams, rng: np.random.Generator) -> np.ndarray:
    """Algorithm 2 on one party's (L, m) counts: T picked entries get Laplace noise (rounded, clipped at 0),
    every other entry is released as 0. Returns int64 (L, m) with at most T non-zeros."""
    flat = np.asarray(counts, dtype=np.int64).reshape(-1)
    picks = exponential_mechanism_picks(flat, dp.T, dp.epsilon_0, rng)
    noisy = flat[picks] + rng.laplace(0.0, dp.laplace_scale, size=picks.size)
    out = np.zeros_like(flat)
    out[picks] = np.maximum(np.rint(noisy), 0).astype(np.int64)
    return out.reshape(np.shape(counts))


@dataclass(frozen=True)
class CountRelease:
    """What a party sends in the counting all-reduce: integer-model counts (noised under DP) and, without DP, the
    float model's counts as well."""

    int_counts: np.ndarray
    float_counts: np.ndarray | None

    def __add__(self, other: "CountRelease") -> "CountRelease":
        both = self.float_counts is not None and other.float_counts is not None
        floats = self.float_counts + other.float_counts if both else None
        return CountRelease(self.int_counts + other.int_counts, floats)


def party_counts(shard: Shard, spec: FederatedSpec, dp: DPParams | None = None,
                 seed_seq: np.random.SeedSequence | None = None) -> CountRelease:
    """Hash and count the party's rows with the float model and the device's integer hash; apply DP if asked
    (before anything leaves the party)."""
    X, y = shard
    clf = build_estimator(spec)
    y_index = np.searchsorted(spec.classes, y)
    if not np.array_equal(spec.classes[np.clip(y_index, 0, len(spec.classes) - 1)], y):
        raise ValueError("a party holds labels outside the agreed classes")
    L, m = len(spec.classes), clf.n_hashes_
    int_winners = integer_winners(spec.input_stage().quantize(X), clf.M_indices_, clf.n_winners_, clf.sign_split)
    int_counts = count_winners(int_winners, y_index, L, m)
    if dp is None:
        return CountRelease(int_counts, count_winners(clf.winners(X), y_index, L, m))
    rng = np.random.default_rng(seed_seq)
    return CountRelease(dp_release(int_counts, dp, rng), None)


def party_accuracy(shard: Shard, model: IntFlyNN) -> float:
    """A party's check of the model it received: integer-model accuracy on its own training rows."""
    X, y = shard
    return float(np.mean(model.predict(X) == y)) if len(y) else float("nan")


# ---------------------------------------------------------------- backends: where the parties run


def tree_sum(values: list) -> Any:
    """Pairwise sum (the order is irrelevant: every all-reduced quantity is an exact integer sum)."""
    values = list(values)
    while len(values) > 1:
        values = [values[i] + values[i + 1] if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


class Backend(Protocol):
    """Where the parties run. `handles[i]` stands for party i's shard wherever it lives; `derive` keeps a per-party
    result there (another handle list); `map` brings per-party results to the coordinator; `allreduce` sums them."""

    name: str
    handles: list

    @property
    def n_parties(self) -> int: ...

    def describe(self) -> dict: ...

    def derive(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list: ...

    def map(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list: ...

    def run_on(self, party: int, fn: Callable, *args) -> Any: ...

    def allreduce(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> Any: ...

    def allreduce_counts(self, spec: FederatedSpec, dp: DPParams | None,
                         seeds: Sequence[np.random.SeedSequence]) -> CountRelease: ...

    def release(self, handles: list) -> None: ...

    def close(self) -> None: ...


class LocalBackend:
    """Every party in this process, one after another: for tests and for the central baseline."""

    name = "local"

    def __init__(self, shards: Sequence[Shard]) -> None:
        self.handles: list = [(np.asarray(X), np.asarray(y)) for X, y in shards]

    @property
    def n_parties(self) -> int:
        return len(self.handles)

    def describe(self) -> dict:
        return {"name": self.name}

    def derive(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list:
        """Per-party state fn(handle, *args[, per_party[i]]) kept where the party is (here: in memory)."""
        return self.map(fn, handles, *args, per_party=per_party)

    def release(self, handles: list) -> None:
        pass

    def map(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list:
        """fn(handle_i, *args[, per_party[i]]) for every party, results returned to the coordinator."""
        return [fn(h, *args, *(() if per_party is None else (per_party[i],))) for i, h in enumerate(handles)]

    def run_on(self, party: int, fn: Callable, *args) -> Any:
        return fn(self.handles[party], *args)

    def allreduce(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> Any:
        return tree_sum(self.map(fn, handles, *args, per_party=per_party))

    def allreduce_counts(self, spec: FederatedSpec, dp: DPParams | None,
                         seeds: Sequence[np.random.SeedSequence]) -> CountRelease:
        """The counting round: every party's `party_counts` (the host's hash of its int8 rows), summed.
        tinyproto.device.federated.DeviceBackend overrides it: there the devices learn and are read back."""
        return self.allreduce(party_counts, self.handles, spec, dp, per_party=seeds)

    def close(self) -> None:
        pass

    def __enter__(self) -> "LocalBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class DaskBackend:
    """Parties on the workers of a dask.distributed cluster, in chunks: worker w holds the shards of parties
    w, w + W, w + 2W, ... as one scattered list (party i on worker i mod W), and every round is one task per
    worker that runs all its parties. An all-reduce first sums within the chunk (on the worker), then a tree of
    additions across the workers brings one result to the coordinator: per round W tasks and log2(W) levels,
    whatever the number of parties, and each worker holds only its own parties' rows and results.

    Every wait is bounded: connecting (`connect_timeout`, after a probe that the address speaks dask's protocol)
    and every round (`round_timeout`); a timeout or a lost worker is a TinyprotoError naming what was tried."""

    name = "dask"

    def __init__(self, shards: Sequence[Shard], scheduler: str | None = None, n_workers: int | None = None,
                 processes: bool = False, timeout: float = CONNECT_TIMEOUT,
                 round_timeout: float = ROUND_TIMEOUT) -> None:
        import logging

        from distributed import Client, LocalCluster

        self._cluster = None
        self._scratch = None
        self.client = None
        self.scheduler = scheduler
        self.processes = processes
        self.timeout = float(timeout)
        self.round_timeout = float(round_timeout)
        try:
            if scheduler:
                address = probe_scheduler(scheduler, self.timeout)
                try:
                    self.client = Client(address, timeout=self.timeout)
                except (OSError, TimeoutError, ValueError) as exc:
                    raise TinyprotoError(f"cannot connect to the dask scheduler at {scheduler} within "
                                         f"{self.timeout:g} s: {_one_line(exc)}") from None
            else:
                import dask

                import tempfile

                workers = n_workers or max(1, min(len(shards), _cpu_count()))
                self._scratch = tempfile.mkdtemp(prefix="tinyproto-dask-")  # removed by close()
                # processes=False: workers are threads of this process talking over inproc:// (no ports, no
                # spawned interpreters). processes=True gives real parallelism. dask spawns worker processes
                # with MALLOC_TRIM_THRESHOLD_=65536, which makes glibc hand every freed numpy buffer back to the
                # OS (hashing ran 2x slower); None keeps glibc's adaptive default.
                with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                                      "distributed.comm.timeouts.connect": f"{self.timeout:g}s",
                                      "temporary-directory": self._scratch}):
                    self._cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                                                 dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR,
                                                 host="127.0.0.1" if processes else None,
                                                 local_directory=self._scratch)
                self.client = Client(self._cluster, timeout=self.timeout)
                self.client.wait_for_workers(workers, timeout=self.timeout)
            self.workers = sorted(self.client.scheduler_info()["workers"])
            if not self.workers:
                raise TinyprotoError(f"the dask scheduler at {scheduler} has no workers")
            W = min(len(self.workers), len(shards))
            self.placement = [self.workers[i % W] for i in range(len(shards))]
            self.chunks = [list(range(w, len(shards), W)) for w in range(W)]
            self.handles = [self._wait(self.client.scatter([[(np.asarray(shards[i][0]), np.asarray(shards[i][1]))
                                                              for i in chunk]], workers=[self.workers[w]],
                                                            hash=False, timeout=self.round_timeout),
                                       "placing the shards")[0]
                            for w, chunk in enumerate(self.chunks)]
        except TimeoutError as exc:
            self.close()
            raise TinyprotoError(f"dask cluster ({scheduler or 'LocalCluster'}) did not start within "
                                 f"{self.timeout:g} s: {_one_line(exc)}") from None
        except (RuntimeError, OSError) as exc:  # e.g. "Nanny failed to start", no free port
            self.close()
            raise TinyprotoError(f"could not start the dask cluster ({scheduler or 'LocalCluster'}): "
                                 f"{_one_line(exc)}") from None
        except BaseException:
            self.close()
            raise
        self._n_parties = len(shards)

    @property
    def n_parties(self) -> int:
        return self._n_parties

    def describe(self) -> dict:
        return {"name": self.name, "scheduler": self.scheduler or "LocalCluster", "workers": len(self.workers),
                "processes": self.processes if self._cluster is not None else None,
                "reduction": "per-worker chunk sums, then a tree of additions across workers"}

    def _wait(self, value, what: str):
        """Resolve futures (or a list of them) within round_timeout; worker loss -> one-line TinyprotoError."""
        from distributed import Future

        try:
            if isinstance(value, Future):
                return value.result(timeout=self.round_timeout)
            if isinstance(value, list) and value and isinstance(value[0], Future):
                return self.client.gather(value) if self.round_timeout is None else \
                    _gather_with_timeout(self.client, value, self.round_timeout)
            return value
        except TinyprotoError:
            raise
        except TimeoutError:
            raise TinyprotoError(f"dask: {what} did not finish within {self.round_timeout:g} s "
                                 f"({self.scheduler or 'LocalCluster'})") from None
        except (OSError, RuntimeError) as exc:
            from distributed.client import FutureCancelledError

            raise TinyprotoError(f"dask: {what} failed ({self.scheduler or 'LocalCluster'}): "
                                 f"{_one_line(exc)}") from None
        except Exception as exc:  # KilledWorker, CommClosedError, cancelled futures
            if type(exc).__module__.startswith("distributed"):
                raise TinyprotoError(f"dask: {what} failed ({self.scheduler or 'LocalCluster'}): "
                                     f"{type(exc).__name__}: {_one_line(exc)}") from None
            raise

    def _chunk_args(self, per_party: Sequence | None) -> list:
        return [None if per_party is None else [per_party[i] for i in chunk] for chunk in self.chunks]

    def _submit_chunks(self, runner: Callable, fn: Callable, handles: list, args: tuple,
                       per_party: Sequence | None) -> list:
        if len(handles) > 1 and _payload_bytes(args) > _BROADCAST_BYTES:  # one copy straight to each worker
            args = self._wait(self.client.scatter([args], broadcast=True, hash=False, timeout=self.round_timeout),
                              "broadcasting the round's arguments")[0]
        return [self.client.submit(runner, h, fn, args, pp, workers=[self.workers[w]], allow_other_workers=False,
                                   pure=False)
                for w, (h, pp) in enumerate(zip(handles, self._chunk_args(per_party)))]

    def derive(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list:
        return self._submit_chunks(_chunk_map, fn, handles, args, per_party)

    def map(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list:
        per_chunk = self._wait(self._submit_chunks(_chunk_map, fn, handles, args, per_party), fn.__name__)
        out: list = [None] * self._n_parties
        for chunk, results in zip(self.chunks, per_chunk):
            for i, r in zip(chunk, results):
                out[i] = r
        return out

    def run_on(self, party: int, fn: Callable, *args) -> Any:
        w = party % len(self.chunks)
        pos = self.chunks[w].index(party)
        future = self.client.submit(_chunk_one, self.handles[w], pos, fn, args, workers=[self.workers[w]],
                                    allow_other_workers=False, pure=False)
        return self._wait(future, fn.__name__)

    def allreduce(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> Any:
        """Sum within each worker's chunk, then a tree of additions across workers; one result comes back."""
        level = self._submit_chunks(_chunk_sum, fn, handles, args, per_party)
        while len(level) > 1:
            level = [self.client.submit(operator.add, level[i], level[i + 1], pure=False) if i + 1 < len(level)
                     else level[i] for i in range(0, len(level), 2)]
        return self._wait(level[0], f"all-reduce of {fn.__name__}")

    def allreduce_counts(self, spec: FederatedSpec, dp: DPParams | None,
                         seeds: Sequence[np.random.SeedSequence]) -> CountRelease:
        return self.allreduce(party_counts, self.handles, spec, dp, per_party=seeds)

    def release(self, handles: list) -> None:
        for h in handles:
            h.release()

    def close(self) -> None:
        client, cluster = getattr(self, "client", None), self._cluster
        if client is not None:
            try:
                client.close(timeout=self.timeout)
            except Exception:  # noqa: BLE001 - closing a broken connection must not hide the first error
                pass
        if cluster is not None:
            try:
                cluster.close(timeout=self.timeout)
            except Exception:  # noqa: BLE001
                pass
        self.client = self._cluster = None
        if self._scratch is not None:
            import shutil

            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> "DaskBackend":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_BROADCAST_BYTES = 1 << 20


def _payload_bytes(value) -> int:
    """Bytes of the numpy arrays in value (tuples, lists, dicts of them), roughly."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(_payload_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_payload_bytes(v) for v in value.values())
    return 0


def _chunk_map(chunk: list, fn: Callable, args: tuple, per_party: list | None) -> list:
    return [fn(h, *args, *(() if per_party is None else (per_party[j],))) for j, h in enumerate(chunk)]


def _chunk_sum(chunk: list, fn: Callable, args: tuple, per_party: list | None) -> Any:
    return tree_sum(_chunk_map(chunk, fn, args, per_party))


def _chunk_one(chunk: list, pos: int, fn: Callable, args: tuple) -> Any:
    return fn(chunk[pos], *args)


def _gather_with_timeout(client, futures: list, timeout: float) -> list:
    from distributed import wait

    done = wait(futures, timeout=timeout)  # raises TimeoutError
    del done
    return client.gather(futures)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:200] + "...") if len(text) > 200 else (text or type(exc).__name__)


def probe_scheduler(address: str, timeout: float = CONNECT_TIMEOUT) -> str:
    """Check that `address` is a reachable dask scheduler before dask tries it (dask can wait forever on a
    service that accepts and stays silent, or read garbage as a 3 EiB message length). Returns the address in
    tcp://HOST:PORT form; TinyprotoError (one line, naming the address) otherwise.

    A dask comm listener writes its handshake first: an 8-byte length, then frames (a count, their lengths,
    msgpack); the probe reads that much, bounded in time and size, without sending anything."""
    import socket
    import struct
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    text = address.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "tcp", text
    if scheme.lower() != "tcp":
        raise TinyprotoError(f"--scheduler {address!r}: give the scheduler's tcp://HOST:PORT address (e.g. "
                             f"tcp://127.0.0.1:8786); {scheme}:// is not a dask scheduler protocol tinyproto uses")
    host, colon, port_text = rest.rstrip("/").rpartition(":")
    if not colon:
        host, port_text = rest.rstrip("/"), "8786"
    host = host.strip("[]")
    if not host or "/" in host or "/" in port_text:
        raise TinyprotoError(f"--scheduler {address!r}: expected tcp://HOST:PORT")
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise TinyprotoError(f"--scheduler {address!r}: the port must be a number in 1..65535")
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        infos = pool.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM).result(timeout=timeout)
    except FutureTimeout:
        raise TinyprotoError(f"--scheduler {address}: resolving {host!r} took more than {timeout:g} s") from None
    except OSError as exc:
        raise TinyprotoError(f"--scheduler {address}: cannot resolve host {host!r} ({_one_line(exc)})") from None
    finally:
        pool.shutdown(wait=False)
    family, _, _, _, sockaddr = infos[0]
    deadline = time.monotonic() + timeout

    def recv_exactly(sock, n: int) -> bytes:
        data = b""
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the connection was closed")
            data += chunk
        return data

    where = f"--scheduler {address}"
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(sockaddr)
            (total,) = struct.unpack("<Q", recv_exactly(sock, 8))
            if not 16 <= total <= _HANDSHAKE_MAX:
                raise ValueError(f"its first message would be {total} bytes long")
            body = recv_exactly(sock, total)
            (n_frames,) = struct.unpack_from("<Q", body)
            if not 1 <= n_frames <= 64 or 8 + 8 * n_frames > total:
                raise ValueError("its first message is not a dask handshake")
    except TimeoutError:
        raise TinyprotoError(f"{where}: no dask handshake within {timeout:g} s (is it a dask scheduler?)") from None
    except ValueError as exc:
        raise TinyprotoError(f"{where}: not a dask scheduler ({exc})") from None
    except ConnectionError as exc:
        if isinstance(exc, ConnectionRefusedError):
            raise TinyprotoError(f"{where}: connection refused (no scheduler listening on {host}:{port})") from None
        raise TinyprotoError(f"{where}: the service closed the connection without a dask handshake") from None
    except OSError as exc:
        raise TinyprotoError(f"{where}: cannot connect ({_one_line(exc)})") from None
    return f"tcp://{host if ':' not in host else '[' + host + ']'}:{port}"


_HANDSHAKE_MAX = 1 << 20  # a dask handshake is ~100 bytes


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ---------------------------------------------------------------- the protocol


@dataclass
class FederatedFit:
    clf: FlyNNClassifier  # float model (DP: its counts are the released integer-hash counts)
    model: IntFlyNN  # the deployed integer model
    spec: FederatedSpec
    int_counts: np.ndarray  # summed, before saturation (device parties: sums of their saturated counts)
    float_counts: np.ndarray  # summed (DP: = int_counts)
    quantile_rounds: int


def agree_classes(backend: Backend, handles: list | None = None) -> np.ndarray:
    """The union of the parties' classes, sorted as np.unique sorts them."""
    handles = backend.handles if handles is None else handles
    return np.unique(np.concatenate(backend.map(party_classes, handles)))


def party_z_bits(shard: Shard, mean: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Sorted bit patterns of |z| over the party's values, z = (x - mean) / scale exactly as
    FlyNNClassifier.transform_input computes it (kept on the party for the quantile search)."""
    z = np.abs((np.asarray(shard[0], dtype=np.float64) - mean) / scale).reshape(-1)
    return np.sort(z.view(np.int64))


def agree_input_stages(backend: Backend, communication=None, scalings: Sequence[str] = ("feature", "global")
                       ) -> dict:
    """{"n": rows, scaling: (mean, scale, int8 step)} for each scaling, by the same exact all-reduces as the
    training (moment sums once, one distributed quantile search per scaling)."""
    from tinyproto.federated.selection import Communication

    comm = communication if communication is not None else Communication()
    handles = backend.handles
    sums = backend.allreduce(party_moment_sums, handles)
    comm.allreduce(1, 8 + sum((abs(v).bit_length() + 8) // 8 for v in sums.sum1 + sums.sum2), broadcast=False)
    stages: dict = {"n": sums.n}
    n_values = sums.n * len(sums.sum1)
    k, k1, t = quantile_positions(n_values)
    for scaling in scalings:
        mean, scale = standardisation(sums, scaling)
        z_bits = backend.derive(party_z_bits, handles, mean, scale)

        def count(cuts: np.ndarray) -> np.ndarray:
            comm.allreduce(len(cuts), 8)
            return backend.allreduce(count_at_most, z_bits, cuts)

        (a_k, a_k1), _ = select_order_statistics(count, [k, k1])
        backend.release(z_bits)
        stages[scaling] = (mean, scale, input_scale_from_order_statistics(a_k, a_k1, t))
    return stages


DP_SHAPE_NOTE = ("data-independent default shape (differential privacy: ranking shapes on the parties' rows would "
                 "release information the DP budget does not cover, and splitting epsilon over ~500 candidate "
                 "accuracies would leave each too noisy to rank; the default depends only on the budget, the "
                 "number of classes and features, which are public)")


def choose_config(backend: Backend, budget_bytes: int, seed: int, classes: np.ndarray, n_features: int, *,
                  dp: bool = False, count_limit: CountLimit | None = None,
                  progress: Callable[[str], None] | None = None) -> tuple[FlyNNConfig, dict]:
    """The hyper-parameters every party will use.

    Without DP: the budget solver's candidates ranked by K-fold accuracy over every party's rows
    (flynn/federated_selection.py; no row leaves its party). With DP: a data-independent default shape sized to
    the budget (DP_SHAPE_NOTE). count_limit (parties that learn on a device, `device.learn.count_limit`) keeps
    the counts learnable."""
    from tinyproto.federated.selection import Communication, select_config

    comm = Communication()
    if dp:
        info: dict = {"candidates": [], "cv_accuracy": None, "validation": "none: the shape is not chosen from data"}
        config = fit_to_classes(default_config(seed), len(classes), n_features, budget_bytes,
                                count_limit=count_limit)
        source = DP_SHAPE_NOTE
    else:
        stages = agree_input_stages(backend, comm)
        best, info = select_config(backend, budget_bytes, seed, classes, n_features, stages,
                                   count_limit=count_limit, progress=progress, communication=comm)
        state = solver_random_state(seed)
        config = FlyNNConfig(best.m, best.s, best.rho, best.decay, best.bits, best.store_M, best.scaling,
                             best.sign_split, draw_seed(state), state)
        source = ("federated model selection: the budget solver's candidates ranked by K-fold accuracy of the "
                  "integer model over every party's rows (all-reduced counts and correct-prediction tallies)")
    n_in = 2 * n_features if config.sign_split else n_features
    cycles = estimate_cycles(config.n_hashes, config.n_inputs_per_hash, config.n_winners, config.count_bits,
                             len(classes), n_in, config.store_M)
    info = {
        **info,
        "chosen": config.chosen(),
        "hyperparameter_source": source,
        "model_bytes": model_bytes(config.n_hashes, config.n_inputs_per_hash, config.count_bits, len(classes),
                                   n_features, n_in, config.store_M),
        "estimated_cycles": int(cycles),
        "estimated_ms": cycles / F_CPU * 1e3,
        "selection_communication": {
            "allreduce_rounds": comm.rounds,
            "bytes_sent_per_party": comm.sent,
            "bytes_received_per_party": comm.received,
            "counted_as": "dense vectors per all-reduce (count vectors int32, tallies and quantile counts int64, "
                          "moment sums as their exact integers); sparse count vectors are sent when smaller",
        },
    }
    return config, info



def federated_fit(backend: Backend, config: FlyNNConfig, classes: np.ndarray, dp: DPParams | None = None, seed: int = 0,
                  progress: Callable[[str], None] | None = None) -> FederatedFit:
    """Standardisation, int8 step and counts agreed by all-reduces over the backend's parties; the model."""
    say = progress or (lambda message: None)
    handles = backend.handles
    sums = backend.allreduce(party_moment_sums, handles)
    mean, scale = standardisation(sums, config.scaling)
    spec = FederatedSpec(config, np.asarray(classes), mean, scale)
    say(f"all-reduce: standardisation of {len(mean)} features from {sums.n} rows (exact sums)")

    z_bits = backend.derive(party_abs_z_bits, handles, spec)  # stays with each party for the search rounds
    n_values = sums.n * spec.n_features
    k, k1, t = quantile_positions(n_values)
    (a_k, a_k1), rounds = select_order_statistics(lambda cuts: backend.allreduce(count_at_most, z_bits, cuts), [k, k1])
    spec = FederatedSpec(config, spec.classes, mean, scale, input_scale_from_order_statistics(a_k, a_k1, t))
    say(f"all-reduce: int8 step from the exact {INPUT_QUANTILE:g} quantile of |z| ({rounds} rounds)")

    per_party = party_seed_sequences(seed, backend.n_parties)[1]
    total = backend.allreduce_counts(spec, dp, per_party)
    say(f"all-reduce: counts of {len(classes)} classes x {config.n_hashes} hash bits"
        + (f" (DP: epsilon={dp.epsilon:g}, T={dp.T})" if dp else ""))
    float_counts = total.float_counts if total.float_counts is not None else total.int_counts
    clf, model = assemble(spec, total.int_counts, float_counts)
    return FederatedFit(clf, model, spec, total.int_counts, float_counts, rounds)


def assemble(spec: FederatedSpec, int_counts: np.ndarray, float_counts: np.ndarray) -> tuple[FlyNNClassifier, IntFlyNN]:
    """The float estimator and the integer model from summed counts (saturated to the count bits only now)."""
    c = spec.config
    clf = build_estimator(spec)
    clf.counts_ = np.asarray(float_counts, dtype=np.int64).copy()
    model = IntFlyNN(  # the same fields IntFlyNN.from_classifier fills, with the all-reduced counts
        classes=spec.classes.tolist(),
        input_stage=spec.input_stage(),
        sign_split=bool(c.sign_split),
        seed=int(clf.M_seed_),
        indices=clf.M_indices_,
        n_winners=int(clf.n_winners_),
        bits=int(c.count_bits),
        counts=np.minimum(int_counts, (1 << c.count_bits) - 1),
        decay=1.0 if c.count_bits == 1 else float(c.decay),
        store_M=bool(c.store_M),
    )
    return clf, model


def central_fit(X: np.ndarray, y: np.ndarray, config: FlyNNConfig, classes: np.ndarray | None = None) -> FederatedFit:
    """The same configuration trained on the pooled rows (one party, no DP): the federated model's reference."""
    backend = LocalBackend([(X, y)])
    return federated_fit(backend, config, agree_classes(backend) if classes is None else classes)


__all__ = [
    "Backend", "CountRelease", "DPParams", "DaskBackend", "FederatedFit", "FederatedSpec", "FlyNNConfig",
    "LocalBackend", "MomentSums", "SplitSpec", "agree_classes", "assemble", "build_estimator", "central_fit", "choose_config",
    "config_from_solver", "dp_release", "em_probabilities", "exponential_mechanism_picks", "federated_fit",
    "fit_to_classes", "moment_sums", "parse_split", "party_accuracy", "party_counts", "party_seed_sequences",
    "select_order_statistics", "split_parties", "standardisation",
]
