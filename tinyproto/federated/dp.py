"""Differential privacy for the released counts (Ram & Sinha, AAAI 2022, Algorithm 2).

Layer: federated. Each party applies it to its own integer counts before they leave it. On the flattened count
vector c (all L·m entries, class-major):

* budget: ε is split over the T picks, the T releases and the τ parties: ε₀ = ε / (2Tτ);
* pick T entries one at a time without replacement, each by the exponential mechanism with score c_i
  (sensitivity 1): P(i) ∝ exp(ε₀·c_i / 2). Sampling is done with the Gumbel-top-T trick (the T largest of
  ε₀·c_i/2 + Gumbel noise, in decreasing order), which has exactly the distribution of T sequential draws;
* release each picked count as c_i + Laplace(2Tτ/ε) (scale 1/ε₀), rounded to the nearest integer and clipped
  at 0 (post-processing: the integer model needs non-negative integer counts); every other entry is 0;
* T is at most L·m (`federate` caps a larger --dp-T and records both, T and T_requested).
The authors' reference code weights the exponential mechanism as exp(ε₀·c), twice as strongly as the paper;
this module follows the paper (exp(ε₀·c/2), the textbook mechanism for a sensitivity-1 score). What DP covers:
the released counts. The class set, the standardisation sums and the quantile search counts are released
without noise (under DP the shape is a data-independent default, so model selection releases nothing), and the
sum is not a secure aggregation; the report says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyproto.core.errors import TinyprotoError


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
                      "counts are released without noise (the model shape is a data-independent default under DP); "
                      "no secure aggregation",
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


RELEASE_MAX = 2**31  # far above any saturated count (at most 2^8 - 1), far below int64 even summed over parties


def dp_release(counts: np.ndarray, dp: DPParams, rng: np.random.Generator) -> np.ndarray:
    """Algorithm 2 on one party's (L, m) counts: T picked entries get Laplace noise (rounded, clipped at 0),
    every other entry is released as 0. Returns int64 (L, m) with at most T non-zeros."""
    flat = np.asarray(counts, dtype=np.int64).reshape(-1)
    picks = exponential_mechanism_picks(flat, dp.T, dp.epsilon_0, rng)
    noisy = flat[picks] + rng.laplace(0.0, dp.laplace_scale, size=picks.size)
    out = np.zeros_like(flat)
    # clipped above too: a tiny epsilon makes the noise overflow int64 (it would wrap to a negative count); any
    # count past RELEASE_MAX saturates the deployed counts all the same
    out[picks] = np.clip(np.rint(noisy), 0, RELEASE_MAX).astype(np.int64)
    return out.reshape(np.shape(counts))


__all__ = ["DPParams", "dp_release", "em_probabilities", "exponential_mechanism_picks"]
