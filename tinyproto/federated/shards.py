"""Dividing the training rows among the parties, and each party's own random stream.

Layer: federated. Every random choice of a federated run descends from one SeedSequence(seed): one child splits
the data (`split_parties`), the others are the parties' own streams (their DP noise), so runs are reproducible
and the parties' streams independent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tinyproto.core.errors import TinyprotoError

Shard = tuple[np.ndarray, np.ndarray]  # (X, y) of one party


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


__all__ = ["Shard", "SplitSpec", "parse_split", "party_seed_sequences", "split_parties"]
