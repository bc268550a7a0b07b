"""Federated model selection for FlyNN: the budget solver's choice, made with every party's rows.

Layer: federated.

`fit_flynn_under_budget` (solver.py) ranks candidate shapes by K-fold cross-validated accuracy of the integer
model on the pooled rows. Here the same candidates are ranked the same way, but no row leaves its party:

1. the parties agree on each preprocessing's input stage exactly (moment sums and the distributed |z| quantile
   of protocol.py and stats.py, once per scaling; the shared stage of wide inputs, 4 B instead of 4 B per
   feature, from an exact signed quantile search over the raw values), and try all of them, as the solver does;
2. every party places its own rows in the validation yardstick's folds (tinyproto.core.folds: a seeded hash of
   each row and its label, cut at each class's quantiles, whose histogram the parties all-reduce), so every row
   is in the fold it would be in on the pooled rows: compile's folds, exactly;
3. for each (preprocessing, s) the solver's plan of (m, ρ) shapes is hashed by every party on its own rows; the
   per-fold counts (K x L x m per shape) are all-reduced: they add up exactly, as the training counts do;
4. every party scores its rows of fold k with the counts of the other folds (total - fold k), for every count
   width and decay, and the numbers of correct predictions are all-reduced: the global K-fold accuracy of every
   candidate, exactly the solver's estimate on the pooled rows (the same folds, the same rows scored: every fold
   of the yardstick's draws, solver.ranking_folds, also where the yardstick validates one, unless that one is
   large);
5. the solver's two stages (preprocessing on a reference grid, then every shape for the best one) and its
   ranking (accuracy, then speed, then size) pick the winner; M is seeded as the solver seeds it.

Communication is counted per party as if every all-reduce moved dense vectors (int32 counts, int64 tallies);
the implementation sends sparse counts when a party's are sparse.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.folds import Folds, Plan, assign, bin_folds, class_bins, row_keys
from tinyproto.families.flynn import solver as _solver
from tinyproto.families.flynn.quantize import count_scales, fold_codes, fold_lut_weights, hash_inputs
from tinyproto.families.flynn.pricing import WIDE_FEATURES
from tinyproto.families.flynn.solver import (
    BITS_GRID, CENTRED_PREPROCESSING, DEFAULT_CAP, F_CPU, PREPROCESSING, RHO_GRID, S_GRID, SHARED_PREPROCESSING,
    Candidate, CountLimit, cycle_limit_within, estimate_cycles,
)
from tinyproto.families.flynn.seeded_index import draw_seed, seeded_indices
from tinyproto.families.flynn.hashing import project, projection_matrix
from tinyproto.federated.local_parties import row_wise

STAGE1 = ((4, 8), (8, 16, 32), (1, 2), (False,))  # the solver's reference grid for the preprocessing
STAGE2 = (S_GRID, RHO_GRID, BITS_GRID, (False, True))


# ---------------------------------------------------------------- what a party computes


def party_key_bins(shard, classes: np.ndarray, n_repeats: int, seed: int) -> np.ndarray:
    """The party's share of the yardstick's per-class histogram of row keys (tinyproto.core.folds); all-reduced
    it is the pooled rows' histogram, exactly."""
    X, y = shard
    y_index = np.searchsorted(classes, y)
    return class_bins(row_keys(X, y_index, seed, n_repeats), y_index, len(classes))


@dataclass
class PartyData:
    """A party's rows as selection needs them, computed once: int8 inputs per scaling, class indices, folds
    (repeat r's folds numbered r·K .. r·K + K - 1) and which rows each repeat scores."""

    xq: dict
    y_index: np.ndarray
    folds: np.ndarray
    scored: np.ndarray

    @staticmethod
    def pool(parts: list["PartyData"]) -> "PartyData":
        """Every party's rows as one party's, in party order."""
        xq = {scaling: np.concatenate([p.xq[scaling] for p in parts]) for scaling in parts[0].xq}
        return PartyData(xq, *_pooled_rows(parts))


def _pooled_rows(parts: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y_index, folds, scored) of the parties' rows one after another."""
    return (np.concatenate([p.y_index for p in parts]), np.concatenate([p.folds for p in parts], axis=1),
            np.concatenate([p.scored for p in parts], axis=1))


def party_setup(shard, stages: dict, classes: np.ndarray, seed: int, folds_of_bins: np.ndarray, n_folds: int,
                validated: int) -> PartyData:
    """The party's int8 inputs per scaling and its rows' folds (their keys hashed again: cheaper than keeping
    them between rounds)."""
    X, y = shard
    xq = {scaling: stage.quantize(X) for scaling, stage in stages.items()}
    y_index = np.searchsorted(classes, y)
    ids = assign(row_keys(X, y_index, seed, folds_of_bins.shape[0]), y_index, folds_of_bins)
    scored = ids < validated
    ids = ids + (np.arange(ids.shape[0]) * n_folds)[:, None]
    return PartyData(xq, y_index, ids, scored)


@dataclass
class PartyState:
    """A party's hashed rows for one (preprocessing, s): the winners of every m, its class indices and folds."""

    ranked: dict[int, np.ndarray]
    y_index: np.ndarray
    folds: np.ndarray
    scored: np.ndarray  # (R, n): the row is in a validated fold of that repeat

    @staticmethod
    def pool(parts: list["PartyState"]) -> "PartyState":
        """Every party's hashed rows as one party's, in party order."""
        ranked = {m: np.concatenate([p.ranked[m] for p in parts]) for m in parts[0].ranked}
        return PartyState(ranked, *_pooled_rows(parts))

    def split(self, parties: list) -> list["PartyState"]:
        """The pooled state cut into the parties' (each party's rows: len(party.y_index)), as views."""
        ends = np.cumsum([len(p.y_index) for p in parties])
        return [PartyState({m: r[a:b] for m, r in self.ranked.items()}, self.y_index[a:b], self.folds[:, a:b],
                           self.scored[:, a:b]) for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]


@row_wise(PartyData.pool, lambda state, parties: state.split(parties))
def party_hash(data: PartyData, scaling: str, sign_split: bool, M, m_values: list[int], k: int) -> PartyState:
    """The top-k winners of every m in m_values (M: the projection of the largest m), as the solver ranks them."""
    U = hash_inputs(data.xq[scaling], sign_split).astype(np.float64)
    return PartyState(ranked_winners(U, M, m_values, k), data.y_index, data.folds, data.scored)


def ranked_winners(U: np.ndarray, M, m_values: list[int], k: int) -> dict[int, np.ndarray]:
    """solver._ranked_winners with the projection matrix given (built once per round, not once per party)."""
    n = U.shape[0]
    P = project(U, M).astype(np.int64) if n else np.empty((0, M.shape[0]), np.int64)
    return _solver.ranked_winners_of_projection(P, m_values, k)


@dataclass
class SparseCounts:
    """Per shape (m, ρ): a flat count vector of `sizes[shape]` entries, as (key, count) pairs that may repeat
    a key (their counts add), or dense (key None: `values` is the whole vector, uint8 / uint16 / ...) once at
    least a quarter of the entries are non-zero, where a dense vector (<= 4 B per entry) is smaller than pairs
    (16 B per pair).
    Adding concatenates pairs; pairs past a quarter of the entries are compacted (one bincount), so a sum never
    holds more than about twice the dense bytes, and what travels between workers is the smaller form."""

    sizes: dict
    keys: dict
    values: dict

    def __add__(self, other: "SparseCounts") -> "SparseCounts":
        keys, values = {}, {}
        for shape, size in self.sizes.items():
            ka, va, kb, vb = self.keys[shape], self.values[shape], other.keys[shape], other.values[shape]
            if ka is not None and kb is None:
                ka, va, kb, vb = kb, vb, ka, va
            if ka is None:  # dense + (dense or pairs)
                summed = va.astype(np.int64)
                if kb is None:
                    summed += vb
                else:
                    np.add.at(summed, kb, vb)
                keys[shape], values[shape] = _smaller_form(summed)
                continue
            keys[shape] = np.concatenate([ka, kb])
            values[shape] = np.concatenate([va, vb])
            if 4 * keys[shape].size > size:  # pairs past the dense size: compact (and maybe go dense)
                keys[shape], values[shape] = _compact(keys[shape], values[shape], size)
        return SparseCounts(self.sizes, keys, values)

    @staticmethod
    def sum_all(parts: list["SparseCounts"]) -> "SparseCounts":
        """The sum of many (what pairwise __add__ gives, in its smaller form): per shape, every part's pairs counted
        at once and the dense parts added (exact: integer counts, bincount's float64 weights exact below 2^53)."""
        first = parts[0]
        keys, values = {}, {}
        for shape, size in first.sizes.items():
            pair_keys = [p.keys[shape] for p in parts if p.keys[shape] is not None]
            pair_values = [p.values[shape] for p in parts if p.keys[shape] is not None]
            summed = _dense(np.concatenate(pair_keys), np.concatenate(pair_values), size) if pair_keys \
                else np.zeros(size, dtype=np.int64)
            for p in parts:
                if p.keys[shape] is None:
                    summed += p.values[shape]
            keys[shape], values[shape] = _smaller_form(summed)
        return SparseCounts(first.sizes, keys, values)

    def dense(self, shape, n_folds: int, n_classes: int) -> np.ndarray:
        return _dense(self.keys[shape], self.values[shape], self.sizes[shape]).reshape(n_folds, n_classes, shape[0])


def _dense(keys: np.ndarray | None, values: np.ndarray, size: int) -> np.ndarray:
    """The whole vector, int64 (bincount's float64 weights are exact below 2^53)."""
    if keys is None:
        return values.astype(np.int64)
    return np.rint(np.bincount(keys, weights=values, minlength=size)).astype(np.int64)


def _smaller_form(summed: np.ndarray) -> tuple[np.ndarray | None, np.ndarray]:
    """(non-zero keys, their counts), or (None, the dense vector in the narrowest unsigned type that holds it:
    per-fold counts rarely pass 255) when that is smaller."""
    nonzero = np.flatnonzero(summed)
    if 4 * nonzero.size >= summed.size:
        return None, narrowest(summed)
    return nonzero, summed[nonzero]


def narrowest(counts: np.ndarray) -> np.ndarray:
    """Non-negative integer counts in uint8, uint16, uint32 or int64, the first that holds the largest."""
    top = int(counts.max()) if counts.size else 0
    for dtype in (np.uint8, np.uint16, np.uint32):
        if top <= np.iinfo(dtype).max:
            return counts.astype(dtype)
    return counts.astype(np.int64)


def _compact(keys: np.ndarray, values: np.ndarray, size: int) -> tuple[np.ndarray | None, np.ndarray]:
    """The summed vector in its smaller form."""
    return _smaller_form(_dense(keys, values, size))


@row_wise(PartyState.pool)
def party_fold_counts(state: PartyState, shapes: list[tuple[int, int]], n_folds: int, n_classes: int) -> SparseCounts:
    """Counts t_lj of each fold (of every repeat) of the party's rows, for each shape (m, ρ): key
    (fold·L + class)·m + j, n_folds counting every repeat's folds."""
    keys, values, sizes = {}, {}, {}
    base = (state.folds * n_classes + state.y_index)[:, :, None]  # (repeats, n, 1)
    every_winner = {}  # m -> the keys of all k winners (a shape's are its first ρ): one product per m, not per shape
    for m, rho in shapes:
        size = n_folds * n_classes * m
        if m not in every_winner:
            every_winner[m] = base * m + state.ranked[m][None, :, :]
        flat = every_winner[m][:, :, :rho].reshape(-1)
        if 4 * flat.size > size:  # a large party sends the smaller form
            keys[(m, rho)], values[(m, rho)] = _smaller_form(np.bincount(flat, minlength=size))
        else:
            keys[(m, rho)], values[(m, rho)] = flat, _ones(flat.size)
        sizes[(m, rho)] = size
    return SparseCounts(sizes, keys, values)


_ONES = np.ones(0, dtype=np.int64)


def _ones(n: int) -> np.ndarray:
    """n ones (int64), a read-only slice of one array of ones kept for every call: a party's pairs each count 1 (a
    thousand small parties asked for one array per shape each; a slice costs a tenth of np.broadcast_to's view).
    Nothing writes into a pair's counts: sums make new arrays."""
    global _ONES
    ones = _ONES
    if ones.size < n:
        ones = np.ones(max(n, 2 * ones.size, 4096), dtype=np.int64)
        ones.flags.writeable = False
        _ONES = ones
    return ones[:n]


ROW_BLOCK = 512  # rows scored at a time (bounds memory: repeats x rows x weightings x L x ρ)


def held_out_weights(per_fold: np.ndarray, n_folds: int, weightings: list[tuple[int, float, int]]) -> np.ndarray:
    """What every party needs to score its rows, from the all-reduced per-fold counts (RK, L, m): for each fold
    f of each repeat and each (bits, decay, count scale), the weight of every filter bit in the model trained
    without fold f, (RK, weightings, L, m) uint8. Binary filters weigh [t == 0] (score = zeros among the winners),
    others lut[t], t the scaled and saturated count read as the deployed model's (quantize.fold_codes) and lut
    the one calibrated on that fold's counts so read (quantize.calibrated_lut); the lowest score wins, as in the
    solver."""
    total = per_fold[:n_folds].sum(axis=0)  # one repeat's folds hold every row once
    held_out = total[None] - per_fold
    out = np.empty((per_fold.shape[0], len(weightings), *per_fold.shape[1:]), dtype=np.uint8)
    folds = np.arange(per_fold.shape[0])[:, None, None]
    deployed, counted = int(total.sum()), held_out.sum(axis=(1, 2))[:, None, None]  # rows times ρ
    for k, (bits, decay, count_scale) in enumerate(weightings):
        t = fold_codes(held_out, count_scale, bits, counted, deployed)  # as the deployed model's counts
        out[:, k] = (t == 0) if bits == 1 else fold_lut_weights(held_out, t, folds, decay, bits, count_scale,
                                                                 deployed)
    return out


class HeldOutWeights:
    """What the coordinator broadcasts for scoring: the all-reduced per-fold counts of every shape (narrowest
    type) and the weightings to score; each process expands them to held_out_weights once, on first use, and every
    party it runs shares that (the weights are up to 10x the counts' bytes, so they are not sent)."""

    def __init__(self, per_fold: dict, weightings: dict, n_folds: int) -> None:
        self.per_fold = per_fold  # shape -> (RK, L, m) counts
        self.weightings = weightings  # shape -> [(bits, decay, count scale), ...]
        self.n_folds = n_folds
        self._expanded: dict = {}
        self._tables: dict = {}

    def __getitem__(self, shape) -> np.ndarray:
        if shape not in self._expanded:
            self._expanded[shape] = held_out_weights(self.per_fold[shape].astype(np.int64), self.n_folds,
                                                     self.weightings[shape])
        return self._expanded[shape]

    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.per_fold.values())

    def gather_tables(self, plan: list) -> "GatherTables":
        """Every shape of `plan` in one table (see GatherTables), made once per plan in this process."""
        key = tuple(plan)
        if key not in self._tables:
            self._tables[key] = GatherTables.of(self, plan)
        return self._tables[key]

    def __getstate__(self) -> dict:  # only the counts travel
        return {"per_fold": self.per_fold, "weightings": self.weightings, "n_folds": self.n_folds}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._expanded = {}
        self._tables = {}


@functools.lru_cache(maxsize=256)
def _weighting_class_offsets(n_w: int, L: int, m: int) -> np.ndarray:
    """(k·L + c)·m for every weighting k and class c, shaped to broadcast over (repeat, row, k, c, winner): with the
    fold's offset f·(n_w·L·m) and the winner j, the flat index of W[f, k, c, j]. The same for every party of a
    round (a thousand parties asked for it once per shape each); read-only, as it is shared."""
    kc = ((np.arange(n_w)[:, None] * L + np.arange(L)[None, :]) * m)[None, None, :, :, None]
    kc.flags.writeable = False
    return kc


@dataclass
class GatherTables:
    """Every (shape, weighting) of a plan as one gather, for parties of a few rows (where one gather per shape
    costs more in numpy calls than in arithmetic). Candidate g (shapes in plan order, each shape's weightings in
    order) scores class c of a row in fold f with winners w_0..w_{ρ-1} of its m as
    sum_j flat[f·stride[g] + offset[g, c] + w_j] over j < ρ_g: flat holds every shape's held_out_weights
    (RK, weightings, L, m) one after another; winners past ρ_g (up to the largest ρ) are read and masked out."""

    flat: np.ndarray  # every shape's weights, flattened, concatenated
    stride: np.ndarray  # (G,): one fold's entries of the candidate's shape
    offset: np.ndarray  # (G, L): where candidate g's weights of class c start in fold 0
    m_index: np.ndarray  # (G,): which of m_values the candidate's m is
    m_values: list  # the distinct m of the plan, ascending
    mask: np.ndarray  # (G, k) uint8: 1 for j < ρ_g
    k: int  # the largest ρ

    @staticmethod
    def of(weights, plan: list) -> "GatherTables":
        m_values = sorted({m for m, _ in plan})
        k = max(rho for _, rho in plan)
        parts, strides, starts, ms, m_index, rhos = [], [], [], [], [], []
        start, L = 0, 0
        for m, rho in plan:
            W = weights[(m, rho)]
            n_w, L = W.shape[1], W.shape[2]
            parts.append(W.reshape(-1))
            strides += [n_w * L * m] * n_w
            starts += [start + w * L * m for w in range(n_w)]  # weighting w's class 0 in fold 0
            ms += [m] * n_w
            m_index += [m_values.index(m)] * n_w
            rhos += [rho] * n_w
            start += W.size
        offsets = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(L)[None, :] * np.asarray(ms)[:, None]
        mask = (np.arange(k)[None, :] < np.asarray(rhos)[:, None]).astype(np.uint8)
        return GatherTables(np.concatenate(parts), np.asarray(strides, dtype=np.int64),
                            offsets.astype(np.int64), np.asarray(m_index), m_values, mask, k)

    def correct(self, state: "PartyState") -> np.ndarray:
        """party_correct of the plan's every candidate in one gather (the party's rows all at once)."""
        n = len(state.y_index)
        winners = np.zeros((n, len(self.m_values), self.k), dtype=np.int64)  # past a short m's ρ: masked
        for i, m in enumerate(self.m_values):
            ranked = state.ranked[m][:, :self.k]
            winners[:, i, :ranked.shape[1]] = ranked
        index = (state.folds[:, :, None] * self.stride)[:, :, :, None, None] + self.offset[None, None, :, :, None] \
            + winners[:, self.m_index][None, :, :, None, :]  # (R, n, G, L, k)
        taken = self.flat.take(index) * self.mask[:, None, :]
        scores = taken.sum(axis=4, dtype=np.int64)  # (R, n, G, L)
        hits = (np.argmin(scores, axis=3) == state.y_index[None, :, None]) & state.scored[:, :, None]
        return hits.sum(axis=(0, 1), dtype=np.int64)


GATHER_AT_ONCE = 1 << 18  # index entries (R x rows x candidates x L x ρ) a party scores in one gather, at most


@row_wise(PartyState.pool)
def party_correct(state: PartyState, weights, plan: list) -> np.ndarray:
    """How many of the party's rows each candidate classifies correctly, every row scored (once per repeat) by
    the model of the folds it is not in: the solver's _cv_accuracies restricted to this party's rows. plan lists
    the shapes; weights[shape] is held_out_weights (RK, weightings, L, m); the lowest score wins. A party of a few
    rows scores every shape in one gather (HeldOutWeights.gather_tables), the same sums in one numpy call each."""
    n = len(state.y_index)
    tables = weights.gather_tables(plan) if plan and hasattr(weights, "gather_tables") else None
    if tables is not None and state.folds.shape[0] * n * tables.offset.size * tables.k <= GATHER_AT_ONCE:
        return tables.correct(state)
    out = []
    for m, rho in plan:
        W = weights[(m, rho)]
        n_w, L = W.shape[1], W.shape[2]
        flat = W.reshape(-1)
        correct = np.zeros(n_w, dtype=np.int64)
        kc = _weighting_class_offsets(n_w, L, m)
        for start in range(0, n, ROW_BLOCK):
            rows = slice(start, start + ROW_BLOCK)
            index = (state.folds[:, rows] * (n_w * L * m))[:, :, None, None, None] + kc \
                + state.ranked[m][rows, :rho][None, :, None, None, :]
            scores = flat.take(index).sum(axis=4, dtype=np.int64)  # (R, rows, weightings, L)
            hits = (np.argmin(scores, axis=3) == state.y_index[rows][None, :, None]) \
                & state.scored[:, rows][:, :, None]
            correct += hits.reshape(-1, n_w).sum(axis=0)
        out.append(correct)
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


# ---------------------------------------------------------------- the coordinator


@dataclass
class Communication:
    rounds: int = 0
    sent: int = 0  # bytes per party
    received: int = 0

    def allreduce(self, n_values: int, itemsize: int, broadcast: bool = True) -> None:
        self.rounds += 1
        self.sent += n_values * itemsize
        self.received += n_values * itemsize if broadcast else 0


def select_config(backend, budget_bytes: int, seed: int, classes: np.ndarray, n_features: int, stages: dict,
                  *, count_limit: CountLimit | None = None, max_inference_ms: float | str | None = DEFAULT_CAP,
                  sram_room: int | None = None, progress: Callable[[str], None] | None = None,
                  communication: Communication | None = None):
    """The solver's candidate set ranked by federated K-fold accuracy; returns (the winning Candidate, info).

    stages: scaling -> its InputStage ("feature", "global", "shared", and "centred2" / "centred4" on wide inputs),
    agreed beforehand by exact all-reduces.
    The row count n is the sum of the parties' (from the moment sums)."""
    from tinyproto.families.flynn.solver import solver_random_state

    started = time.perf_counter()
    say = progress or (lambda message: None)
    comm = communication or Communication()
    L, d = len(classes), n_features
    budget = int(budget_bytes)
    max_cycles = cycle_limit_within(budget, L, d, max_inference_ms, F_CPU)
    seed_M = draw_seed(solver_random_state(seed))
    n_rows = int(stages["n"])
    plan = Plan.for_rows(n_rows)  # the yardstick compile's solver draws on the pooled rows
    K, n_repeats = plan.n_folds, plan.n_repeats
    tried: dict[Candidate, Candidate] = {}
    limits = _solver.PlanLimits(budget, max_cycles, L, d, count_limit, sram_room)
    replays = _solver.CycleReplays(seed_M)  # the solver's stream replays, one per (s, inputs)
    centred = CENTRED_PREPROCESSING if d > WIDE_FEATURES else ()  # as the solver: wide inputs only
    preprocessings = PREPROCESSING + SHARED_PREPROCESSING + centred  # the solver's, in its order (ties keep the first)
    scalings = {scaling for scaling, _ in preprocessings}
    histogram = backend.allreduce(party_key_bins, backend.handles, np.asarray(classes), n_repeats, seed)
    comm.allreduce(histogram.size, 4)
    folds_of_bins = bin_folds(histogram, K)
    on_yardstick = int(sum(histogram[r][folds_of_bins[r] < plan.validated].sum() for r in range(n_repeats)))
    ranked = _solver.ranked_folds(K, plan.validated, on_yardstick)  # the folds the solver ranks on
    n_scored = int(sum(histogram[r][folds_of_bins[r] < ranked].sum() for r in range(n_repeats)))
    setup = backend.derive(party_setup, backend.handles, {sc: stages[sc] for sc in scalings}, np.asarray(classes),
                           seed, folds_of_bins, K, ranked)  # the folds the solver ranks on (ranking_folds)
    RK = n_repeats * K

    def evaluate(scaling: str, sign_split: bool, s_grid, rho_grid, bits_grid, store_grid) -> None:
        n_in = 2 * d if sign_split else d
        for s in sorted({min(s, max(1, n_in // 2)) for s in s_grid}):
            plan = _solver.exact_plan(limits, s, _solver.ShapeGrid(rho_grid, bits_grid, store_grid), n_in,
                                      stages[scaling].nbytes, replays)
            if not plan:
                continue
            by_shape: dict[tuple[int, int], list[Candidate]] = {}
            for c in plan:
                for q in count_scales(n_rows, L, c.m, c.rho, c.bits, learnable=count_limit is not None):
                    c_q = replace(c, scaling=scaling, sign_split=sign_split, count_scale=q)  # as the solver
                    if c_q not in tried:
                        by_shape.setdefault((c.m, c.rho), []).append(c_q)
            if not by_shape:
                continue
            m_values = sorted({m for m, _ in by_shape})
            k = max(rho for _, rho in by_shape)
            M = projection_matrix(seeded_indices(seed_M, max(m_values), s, n_in), n_in)
            states = backend.derive(party_hash, setup, scaling, sign_split, M, m_values, k)
            shapes = sorted(by_shape)
            summed = backend.allreduce(party_fold_counts, states, shapes, RK, L)
            comm.allreduce(sum(RK * L * m for m, _ in shapes), 4, broadcast=False)
            work = [(shape, sorted({(c.bits, c.decay, c.count_scale) for c in by_shape[shape]})) for shape in shapes]
            weights = HeldOutWeights({shape: narrowest(summed.dense(shape, RK, L)) for shape in shapes},
                                     dict(work), K)
            comm.received += weights.nbytes()  # the summed per-fold counts come back to every party
            correct = backend.allreduce(party_correct, states, weights, shapes)
            comm.allreduce(sum(len(w) for _, w in work), 8)
            backend.release(states)
            accuracy = {}
            i = 0
            for shape, weightings in work:
                for weighting in weightings:
                    accuracy[(shape, weighting)] = int(correct[i]) / n_scored
                    i += 1
            for shape, group in by_shape.items():
                for c in group:
                    tried[c] = replace(c, cv_accuracy=accuracy[(shape, (c.bits, c.decay, c.count_scale))])

    for scaling, sign_split in preprocessings:
        evaluate(scaling, sign_split, *STAGE1)
        say(f"selection: preprocessing {scaling}/{'split' if sign_split else 'plain'} tried on all parties")
    if not tried:
        learnable = " with counts that fit the device's SRAM and EEPROM" if count_limit else ""
        raise TinyprotoError(_solver.no_fit_message(budget, max_inference_ms, d, learnable))
    best_prep = max(tried.values(), key=_solver.candidate_rank)
    evaluate(best_prep.scaling, best_prep.sign_split, *STAGE2)
    backend.release(setup)
    candidates = list(tried.values())
    best = max(candidates, key=_solver.candidate_rank)
    say(f"selection: {len(candidates)} candidates ranked on the yardstick's folds over all parties' rows")
    n_in = 2 * d if best.sign_split else d
    cycles = estimate_cycles(best.m, best.s, best.rho, best.bits, L, n_in, best.store_M)
    info = {
        "cv_accuracy": best.cv_accuracy,
        "validation": f"{Folds(np.zeros((n_repeats, 0), dtype=np.int64), K, ranked).describe()} of the "
                      "integer model over every party's rows: each party places its own rows in the folds compile "
                      "draws on the pooled rows; per-fold counts and correct-prediction tallies are all-reduced",
        "candidates": [asdict(c) for c in candidates],
        "estimated_cycles": int(cycles),
        "estimated_ms": cycles / F_CPU * 1e3,
        "max_inference_ms": max_inference_ms,
        "selection_seconds": round(time.perf_counter() - started, 3),
    }
    return best, info


__all__ = ["Communication", "party_key_bins", "select_config"]
