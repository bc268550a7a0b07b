"""IntFlyNN: the integer FlyNN that runs on the device, and its bit-exact numpy reference.

The device computes, for an int8 input x (TP_N_FEATURES values):

    u        = x, or [x, -x] with the sign split             (TP_FLYNN_INPUTS = d or 2d values: the float model's
                                                               [z, -z] on the input stage's -127..127; with the
                                                               split, -128, which only a caller's own int8 can
                                                               hold, reads as +128: hashing.split_inputs)
    P_j      = Σ_{i in row j of M} u_i                        (exact; the C adds u_i + 128 in uint16)
    W        = the TP_FLYNN_RHO rows with the largest P_j; ties at the cut go to the lower row index
    score_l  = Σ_{j in W} lut[t_lj]                           (int32; TP_FLYNN_BITS == 1: Σ_{j in W} [t_lj == 0])
    label    = argmin_l score_l, ties to the lowest index

t_lj is the code of the training count of class l on hash bit j: the count itself (q = 1), or with a count scale
q > 1 (a power of two: count_scales) its logarithmic code floor(log2(t // q + 1)) (scaled_counts), saturated to
TP_FLYNN_BITS bits;
lut[k] is the FBFC* weight (1 - c)^(t/q) scaled to uint8 for the counts t that code k stands for: their mean,
weighted by how often the training rows' winners read them (`calibrated_lut`; a code no count reaches weighs
the smallest count it stands for). With one bit the filter is binary (FBF): a bit scores 1 when the class never
set it (set it fewer than q times). score_l is the novelty f_l times ρ (times 255 for lut models), so argmin is
unchanged.

Flash arrays (render order): the input stage, `flynn_filters` (t_lj packed LSB-first, entry (j, l) at bit
(j·L + l)·b), `flynn_lut` (b > 1 only) and `flynn_M` (only when M is stored: row-major m x s indices, uint8 when
TP_FLYNN_INPUTS <= 256). A seeded M costs no data: the device regenerates it from TP_FLYNN_SEED
(seeded_index.seeded_indices).
Layer: families.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tinyproto.core.carray import CArray
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.inputstage import InputStage, choose_input_scale
from tinyproto.core.ledger import SramItem
from tinyproto.families import IntModelCommon
from tinyproto.families.flynn.seeded_index import (
    BLOCK_ROWS,
    WIDE_INPUTS,
    block_rows,
    seeded_indices,
)
from tinyproto.families.flynn.hashing import count_winners, project, projection_matrix, split_inputs, top_winners

if TYPE_CHECKING:
    from tinyproto.families.flynn.train import FlyNNClassifier

LUT_SCALE = 255  # lut entries are uint8
MAX_BITS = 8


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """Flat non-negative values < 2^bits -> bytes, value k at bits [k·bits, (k+1)·bits), LSB first."""
    values = np.asarray(values, dtype=np.int64).reshape(-1)
    planes = (values[:, None] >> np.arange(bits)) & 1
    return np.packbits(planes.reshape(-1).astype(np.uint8), bitorder="little")


SMALL_COUNT_SCALES = (2, 4)


def count_scales(n_rows: int, n_classes: int, m: int, rho: int, bits: int, learnable: bool = False) -> tuple[int, ...]:
    """The count scales q the solver tries for a shape, beside q = 1 (the counts as they are):
    * where a class's mean count per hash bit (n_rows * rho / (L * m)) exceeds 16 times the largest count b bits
      hold, every bit the class ever sets would saturate: the three powers of two around mean / (2^b - 1);
    * else, with counts of 2 bits or more, the small scales 2 and 4 where q * (2^b - 1) a class's rows
      (n_rows / L) can reach: the bits a class sets are not set evenly, and those its rows share (on sensor
      windows, most of a class's rows) saturate long before the mean does. A binary filter (b = 1) keeps "the
      class ever set this bit".
    A learnable model keeps 1: the device adds one per row. Depends on sizes only, so the federated selection
    tries the same scales; the search keeps q = 1 unless a scale validates better."""
    if learnable:
        return (1,)
    cap = (1 << bits) - 1
    mean = n_rows * rho / (n_classes * m)
    if mean >= 16 * cap:
        q0 = 1 << int(np.floor(np.log2(mean / cap)))
        return (1, q0, 2 * q0, 4 * q0)
    per_class = n_rows / n_classes
    return (1,) + tuple(q for q in SMALL_COUNT_SCALES if cap > 1 and q * cap <= per_class)


def scaled_counts(raw: np.ndarray, count_scale: int, bits: int) -> np.ndarray:
    """The deployed count codes, saturated to `bits` bits: with q = 1 the raw training counts themselves (what a
    model that learns on the device adds one by one); with a count scale q > 1 logarithmic codes,
    k = floor(log2(t // q + 1)): k for t // q in [2^k - 1, 2^(k+1) - 1), the last code open.

    Linear codes t // q gave the top code every count from (2^b - 1) q up, and on tables whose classes set a hash
    bit tens of times that was most of them: at the shape the solver chose (2-bit codes, q = 4), a noisy 12-feature
    table (tools/bench_int8.py's mc12x4c3, seed 1) lost 5.73 points to them (int8 57.87 % against 63.60 % float)
    and sensor windows with shocks (win600s, seed 1) 4.50; in log2 codes, 62.53 % and 98.50 % (float 99.50 %):
    `bench_int8.py --quick --stages` at commit 0b989db. A model directory from before these codes (model format
    6) is refused by every verb, to be compiled again (core/modeldir.MODEL_FORMAT_VERSION)."""
    return fold_codes(raw, count_scale, bits, 1, 1)  # the deployed model read as itself


def _log2_of_steps(steps: np.ndarray, cap: int) -> np.ndarray:
    """min(floor(log2(steps)), cap) for whole steps >= 1 (exact in float64 below 2^53)."""
    _, length = np.frexp(steps.astype(np.float64))  # steps = mantissa * 2^length, mantissa in [0.5, 1)
    return np.minimum(length.astype(np.int64) - 1, cap)


def fold_codes(raw: np.ndarray, count_scale: int, bits: int, rows, deployed_rows: int) -> np.ndarray:
    """The codes of a fold model's counts `raw` read as the deployed model's: a model counted on `rows` rows
    (broadcasting with raw) stands for the one counted on all `deployed_rows`, whose counts are deployed_rows/rows
    times larger, so count t takes the code of t * deployed_rows / rows, k = floor(log2(floor(t N / (q n)) + 1))
    (N = deployed_rows, n = rows; exact integers). With n = N: the deployed codes (scaled_counts). With q = 1 the
    codes are the counts themselves (a model that learns on the device counts one by one).

    Why: logarithmic codes saturate at q (2^(2^b - 1) - 1), and the deployed model counts every training row, a
    fold model of K folds (K - 1)/K of them: validated at their own counts, the fold models saturated fewer filter
    bits than the model that ships, and the search preferred the scales that saturate once all rows are counted.
    On sensor windows (tools/make_sensor_windows.py --rows 800 --samples 1000 --seed 9 --spikes 0.005, solver
    seed 1, 2 kB) it chose 2-bit codes with q = 4 and ρ = 64 at 97.0 % cross-validated; that shape counted on
    random 70 % and 80 % of the training rows scored 94.5 and 93.8 % of the test rows (means of 5 draws), on all
    of them 86.0 % (the float weights of the same counts: 94.7, 96.3, 94.5 %). With the fold models read as the
    shipped one the search chose q = 4, ρ = 32, c = 0.5: 98.0 % (its float model 95.5 %)."""
    raw = np.asarray(raw, dtype=np.int64)
    q, cap, N = int(count_scale), (1 << bits) - 1, int(deployed_rows)
    if q == 1:
        return np.minimum(raw, cap)
    counts = raw if raw.min(initial=0) >= 0 else np.maximum(raw, 0)
    n = np.maximum(np.asarray(rows, dtype=np.int64), 1)  # a model that counted nothing has no counts to code
    sizes, which = np.unique(n, return_inverse=True)  # the folds' row counts: a handful, n broadcasts
    top = int(counts.max(initial=0))
    if sizes.size * (top + 1) <= max(counts.size, 1 << 16):  # one code per (fold size, count), then a gather: the
        # solver codes thousands of arrays of the same few folds
        table = _log2_of_steps(np.arange(top + 1, dtype=np.int64)[None, :] * N // (q * sizes[:, None]) + 1, cap)
        return table.reshape(-1).take(which.reshape(n.shape) * (top + 1) + counts)
    return _log2_of_steps(counts * N // (q * n) + 1, cap)


def row_arrays(n_classes: int, bits: int, n_inputs: int, store_M: bool, decay: float, packed: np.ndarray,
               lut: np.ndarray | None, indices: np.ndarray, count_scale: int = 1) -> list[CArray]:
    """The arrays that grow with m (filters, the count LUT, a stored M), exactly as rendered. IntFlyNN.carrays()
    fills them with the model's values; the solver prices a shape by the same arrays filled with zeros
    (pricing.model_bytes), so the budget arithmetic and the ledger are one."""
    m, s = indices.shape
    L, b = n_classes, bits
    if b > 1:
        counted = f"codes floor(log2(t_lj/{count_scale} + 1)) of the counts" if count_scale != 1 else "counts t_lj"
        what = f"{counted} saturated to {b} bits, entry (j*L+l), LSB first"
    else:
        times = f" at least {count_scale} times" if count_scale != 1 else ""
        what = f"binary filters: bit (j*L+l) = class l set hash bit j{times}"
    arrays = [CArray("flynn_filters", "uint8_t", packed, f"{what} ({m}x{L}x{b} bits)")]
    if b > 1:
        arrays.append(CArray("flynn_lut", "uint8_t", lut, f"round(255*(1-c)^t), c={decay:g}"))
    if store_M:
        ctype = "uint8_t" if n_inputs <= 256 else "uint16_t"
        arrays.append(CArray("flynn_M", ctype, indices.reshape(-1), f"M: {m} rows x {s} input indices"))
    return arrays


def unpack_bits(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """Inverse of pack_bits."""
    planes = np.unpackbits(np.asarray(packed, dtype=np.uint8), bitorder="little")[: count * bits]
    return (planes.reshape(count, bits).astype(np.int64) << np.arange(bits)).sum(axis=1)


def decay_lut(decay: float, bits: int) -> np.ndarray:
    """lut[t] = round(255 (1 - c)^t) for t < 2^bits (the last entry stands for every count >= 2^bits - 1)."""
    t = np.arange(1 << bits, dtype=np.float64)
    return np.floor(LUT_SCALE * np.power(1.0 - decay, t) + 0.5).astype(np.int64)


_WEIGHT_UNIT = 1 << 16  # calibrated_lut sums weights in these units: every sum is a whole number below 2^53
_TABLE_MAX = 1 << 20  # larger counts are weighed one distinct count at a time rather than through a table


def calibrated_lut(raw: np.ndarray, decay: float, bits: int, count_scale: int = 1, rows=None,
                   deployed_rows: int | None = None) -> np.ndarray:
    """The lut of a model with a count scale q > 1 whose training counts are `raw` (L, m), or one per leading index
    ((..., L, m) -> (..., 2^bits)); with q = 1 decay_lut's (the codes are the counts themselves):
    lut[k] = round(255 w_k), w_k the mean float weight (1 - c)^(t/q) of the counts t that code k
    (scaled_counts) stands for, each (class, hash bit) entry weighted by how often the training rows' winners
    read it (Σ_l t_lj, the rows that set bit j: a test row's winners fall where the training rows' did). A code
    no entry is read at weighs the smallest count it stands for.

    Why: with linear codes the top code stands for every count from (2^b - 1) q up, whose float weights run from
    (1 - c)^(2^b - 1) down to 0, and decay_lut gave it the largest of them: at commit 2285a20, on 3,000 rows of
    make_classification(n_features=12, n_informative=4, n_classes=4, n_clusters_per_class=3, flip_y=0.1,
    random_state=3), seed 2, 2 kB (2-bit counts, q = 4, c = 0.25) the top weight fell from 108 to 41 and the int8
    model went from 58.13 % to 60.53 % of the test rows (float 62.67 %). Exact integer sums (weights in 2^-16
    units), so the federated parties' summed counts give the compile's lut bit for bit.

    rows (one per leading index) and deployed_rows: the lut of fold models read as the deployed model's
    (fold_codes): each count t of a model counted on n rows is coded and weighed as t * deployed_rows / n."""
    raw = np.asarray(raw, dtype=np.int64)
    n_codes = 1 << bits
    lead = raw.shape[:-2]
    if count_scale == 1:  # codes are the counts: only the top one stands for several, and a model that learns on
        # devices sums saturated counts (federated parties): decay_lut, which every party reproduces
        return np.broadcast_to(decay_lut(decay, bits), lead + (n_codes,)).copy()
    groups = int(np.prod(lead, dtype=np.int64))
    reads = np.broadcast_to(raw.sum(axis=-2, keepdims=True), raw.shape)
    if rows is None:
        codes = scaled_counts(raw, count_scale, bits)
        units_of_reads = reads * _weight_units(raw, decay, count_scale)
    else:
        n = np.broadcast_to(np.asarray(rows, dtype=np.int64), lead).reshape(lead + (1, 1))
        codes = fold_codes(raw, count_scale, bits, n, int(deployed_rows))
        units = np.stack([_weight_units(group, decay, count_scale, int(deployed_rows), max(int(n_g), 1))
                          for group, n_g in zip(raw.reshape((-1,) + raw.shape[-2:]), n.reshape(-1))])
        units_of_reads = reads * units.reshape(raw.shape)
    index = (np.arange(groups, dtype=np.int64).reshape(lead + (1, 1)) * n_codes + codes).reshape(-1)
    size = groups * n_codes
    # float64 sums of whole numbers below 2^53 (L·n·ρ reads of at most 2^16 units each) are exact
    den = np.bincount(index, weights=reads.reshape(-1).astype(np.float64), minlength=size).astype(np.int64)
    num = np.bincount(index, weights=units_of_reads.reshape(-1).astype(np.float64),
                      minlength=size).astype(np.int64)
    # a code no entry is read at (none of the training counts, so none of the stored codes): the weight of the
    # smallest count it stands for, q (2^k - 1), whose t / q is 2^k - 1
    smallest = np.exp2(np.arange(n_codes)) - 1.0
    default = np.tile(np.floor(LUT_SCALE * np.power(1.0 - decay, smallest) + 0.5).astype(np.int64), groups)
    read = den > 0
    lut = default.copy()
    lut[read] = (2 * LUT_SCALE * num[read] + den[read] * _WEIGHT_UNIT) // (2 * den[read] * _WEIGHT_UNIT)
    return lut.reshape(lead + (n_codes,))


def fold_lut_weights(held_out: np.ndarray, codes: np.ndarray, fold_of: np.ndarray, decay: float, bits: int,
                     count_scale: int, deployed_rows: int | None = None) -> np.ndarray:
    """The weight of each count code in `codes` through the lut of the fold model it is scored by: `held_out`
    (folds, L, m) the fold models' counts, `fold_of` (broadcasting with codes) each code's fold. With q = 1 every
    fold's lut is decay_lut's (calibrated_lut), so one table is read instead of a lut per fold (the solver and the
    federated selection score thousands of such arrays). deployed_rows: the fold models read as the deployed
    model (fold_codes; `codes` must be theirs), each fold's rows its counts' sum, as deployed_rows is the
    deployed model's (both in rows times ρ)."""
    if count_scale == 1:
        return decay_lut(decay, bits)[codes]
    rows = None if deployed_rows is None else held_out.sum(axis=(-2, -1))
    luts = calibrated_lut(held_out, decay, bits, count_scale, rows, deployed_rows)  # (folds, 2^bits)
    return luts.reshape(-1).take(np.asarray(fold_of) * luts.shape[-1] + codes)  # luts[fold_of, codes], flat: faster


def _weight_units(raw: np.ndarray, decay: float, count_scale: int, times: int = 1, per: int = 1) -> np.ndarray:
    """round((1 - c)^(t/q) * _WEIGHT_UNIT) of every count t in raw read as t * times / per (fold_codes), each
    distinct t computed once with math.pow (the same float arithmetic whichever way the counts are grouped):
    through a table of 0..max t when the counts are a training set's, else over the distinct counts."""
    def unit(t: int) -> int:
        return math.floor(math.pow(1.0 - decay, (t * times) / (count_scale * per)) * _WEIGHT_UNIT + 0.5)

    low, top = int(raw.min(initial=0)), int(raw.max(initial=0))
    if low >= 0 and top <= _TABLE_MAX:
        return np.array([unit(t) for t in range(top + 1)], dtype=np.int64)[raw]
    values, where = np.unique(raw, return_inverse=True)
    return np.array([unit(int(t)) for t in values], dtype=np.int64)[where.reshape(raw.shape)]


def hash_inputs(xq: np.ndarray, sign_split: bool) -> np.ndarray:
    """int8 inputs -> the int64 values M projects: x, or [x, -x] with the sign split (hashing.split_inputs)."""
    x = np.asarray(xq, dtype=np.int64)
    return split_inputs(x) if sign_split else x


@dataclass
class IntFlyNN(IntModelCommon):
    """The deployed FlyNN: everything the C runtime needs, plus the numpy reference of its arithmetic."""

    classes: list
    input_stage: InputStage
    sign_split: bool
    seed: int  # M's seed; the device uses it when M is not stored
    indices: np.ndarray  # (m, s) rows of M over the TP_FLYNN_INPUTS hash inputs
    n_winners: int  # ρ
    bits: int  # b, bits per saturated count
    counts: np.ndarray  # (L, m) saturated counts, 0..2^b - 1
    decay: float  # c, reported and used for the lut
    store_M: bool
    count_scale: int = 1  # q: > 1, counts are log2 codes of the training counts // q (scaled_counts); 1 to learn
    lut_values: np.ndarray | None = None  # b > 1: the calibrated lut (calibrated_lut); None: decay_lut's
    family: str = "flynn"  # the registry name (tinyproto.families)
    family_id = 2  # TP_FAMILY_ID
    # a score is a sum of ρ lut weights (1 per winner with one bit): one unit for every model of the same shape (ρ,
    # bits, decay, count scale; a calibrated lut weighs each code by the float weight (1-c)^(t/q) of its counts, which
    # depends on the counts' spread, not on the number of rows), so a fold model's margins hold for the final model
    # as they are (families/judging.py).
    # Carried by the ratio of the two models' median winning score on their own training rows instead, they were
    # scaled by how familiar those rows looked: 9 against 36 to 40 on segment with sky held out (most models: 0, no
    # carrying), which shrank the margins fourfold and made the confidence 5.4 points too sure (ECE 6.60 points)
    scores_in_fixed_units = True

    def __post_init__(self) -> None:
        self.indices = np.asarray(self.indices, dtype=np.int64)
        self.counts = np.asarray(self.counts, dtype=np.int64)
        m, s = self.indices.shape
        if not 1 <= self.bits <= MAX_BITS:
            raise ValueError(f"bits must be 1..{MAX_BITS}")
        if not 1 <= self.n_winners <= min(m, 255):
            raise ValueError("need 1 <= rho <= min(m, 255)")
        if not 1 <= s <= min(self.n_hash_inputs, 255) or m > 65535 or self.n_classes > 255:
            raise ValueError("unsupported sizes: need s <= min(inputs, 255), m <= 65535, L <= 255")
        if isinstance(self.count_scale, bool) or not isinstance(self.count_scale, int) or \
                not 1 <= self.count_scale <= 1 << 30:
            raise ValueError(f"count_scale must be a whole number from 1 to 2^30, got {self.count_scale!r}")
        if self.counts.shape != (self.n_classes, m) or self.counts.min() < 0 or self.counts.max() >= 1 << self.bits:
            raise ValueError("counts must be (L, m) and fit in `bits` bits")
        if self.lut_values is not None:
            lut = np.asarray(self.lut_values)
            if (self.bits == 1 or lut.shape != (1 << self.bits,) or not np.issubdtype(lut.dtype, np.integer)
                    or lut.min() < 0 or lut.max() > LUT_SCALE):
                raise ValueError(f"a lut needs 2^bits whole numbers from 0 to {LUT_SCALE} (and bits > 1)")
            self.lut_values = lut.astype(np.int64)
        if not self.store_M and not np.array_equal(self.indices, seeded_indices(self.seed, m, s, self.n_hash_inputs)):
            # a model from before the block format of consecutive rotations (or an edited one): the device would
            # regenerate a different M, so refuse it in one line rather than deploy wrong winners
            raise TinyprotoError("this FlyNN's seeded M is not the one the current runtime regenerates from its seed "
                                 "(a model from an older tinyproto?): recompile it with `tinyproto compile`")

    # -- sizes

    @property
    def n_hash_inputs(self) -> int:
        return 2 * self.n_features if self.sign_split else self.n_features

    @property
    def n_hashes(self) -> int:
        return int(self.indices.shape[0])

    @property
    def n_inputs_per_hash(self) -> int:
        return int(self.indices.shape[1])

    @property
    def lut(self) -> np.ndarray:
        return decay_lut(self.decay, self.bits) if self.lut_values is None else self.lut_values

    def score_bound(self) -> int:
        """No score exceeds ρ winners of the largest weight (1 per winner with one bit, else the lut's largest),
        and none is negative, whatever the input or the counts learned on the device."""
        return int(self.n_winners) * (1 if self.bits == 1 else int(np.max(self.lut)))

    def left_out_scores(self, X: np.ndarray, y_index: np.ndarray) -> np.ndarray | None:
        """The scores of each training row (X raw, y_index its class index) as this model would give it had that row
        not been learned: its own class's counts less its own winners (exact: the filters are counts of the
        training rows' winners), weighed through this model's lut. None when these rows' counts are not this
        model's (e.g. counts learned on the device): the judging stage then fits on fold models instead
        (families/judging.py)."""
        winners = self.winners(self.input_stage.quantize(X))
        y_index = np.asarray(y_index, dtype=np.int64)
        raw = count_winners(winners, y_index, self.n_classes, self.n_hashes)
        if not np.array_equal(scaled_counts(raw, self.count_scale, self.bits), self.counts):
            return None
        scores = scores_from_winners(winners, self.counts, self.bits, self.lut)
        # >= 0: the row itself set each of its winners
        own = scaled_counts(raw[y_index[:, None], winners] - 1, self.count_scale, self.bits)
        weights = (own == 0).astype(np.int64) if self.bits == 1 else self.lut[own]
        scores[np.arange(len(y_index)), y_index] = weights.sum(axis=1)
        return scores

    # -- construction

    @classmethod
    def from_classifier(
        cls,
        clf: FlyNNClassifier,
        X: np.ndarray,
        y: np.ndarray,
        *,
        bits: int = 1,
        store_M: bool = False,
        input_scale: float | None = None,
        input_stage: InputStage | None = None,
        count_scale: int = 1,
    ) -> "IntFlyNN":
        """Quantize a fitted FlyNNClassifier.

        X, y are its training data: they fix the int8 step (choose_input_scale on the standardised X) and the
        counts are recounted with the integer hash of the quantized X, so the filters describe exactly what the
        device will see (the float and int8 winners differ in a few near-ties), and with bits > 1 the lut is
        calibrated on those counts (calibrated_lut). bits=1 deploys the binary filter
        whatever clf.decay is: with one-bit counts, Σ (1-c)^t over ρ winners is K·n_0 + K(1-c)(ρ - n_0), which
        ranks classes exactly like n_0, the number of never-seen winners.
        """
        X = np.asarray(X, dtype=np.float64)
        if input_stage is not None:  # e.g. a shared stage (inputstage.shared_stage): the counts follow it
            stage = input_stage
        else:
            if input_scale is None:
                input_scale = choose_input_scale(clf.transform_input(X))
            stage = InputStage.from_standardisation(clf.mean_, clf.scale_, input_scale)
        winners = integer_winners(stage.quantize(X), clf.M_indices_, clf.n_winners_, clf.sign_split)
        y_index = np.searchsorted(clf.classes_, np.asarray(y))
        counts = count_winners(winners, y_index, clf.classes_.size, clf.n_hashes_)
        return cls(
            classes=clf.classes_.tolist(),
            input_stage=stage,
            sign_split=bool(clf.sign_split),
            seed=int(clf.M_seed_),
            indices=clf.M_indices_,
            n_winners=int(clf.n_winners_),
            bits=int(bits),
            counts=scaled_counts(counts, count_scale, bits),
            decay=1.0 if bits == 1 else float(clf.decay),
            store_M=bool(store_M),
            count_scale=int(count_scale),
            lut_values=None if bits == 1 or count_scale == 1 else calibrated_lut(counts, float(clf.decay), bits,
                                                                                 count_scale),
        )

    # -- the integer contract

    def winners(self, xq: np.ndarray) -> np.ndarray:
        """(n, ρ) winning rows of the device's FlyHash."""
        return integer_winners(xq, self.indices, self.n_winners, self.sign_split)

    def scores(self, xq: np.ndarray) -> np.ndarray:
        """The int32 score vectors tp_predict writes, (n, L) int64."""
        return scores_from_winners(self.winners(xq), self.counts, self.bits, self.lut)

    def labels(self, scores: np.ndarray) -> np.ndarray:
        """Least novel class; np.argmin returns the lowest index among ties, as the C loop does."""
        return np.argmin(np.asarray(scores), axis=1)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Raw float features -> original class labels, through the input stage."""
        return np.asarray(self.classes)[self.labels(self.scores(self.input_stage.quantize(X)))]

    def carrays(self) -> list[CArray]:
        return list(self.input_stage.carrays()) + row_arrays(
            self.n_classes, self.bits, self.n_hash_inputs, self.store_M, self.decay,
            pack_bits(self.counts.T.reshape(-1), self.bits),  # (j, l) order: one hash's classes are adjacent
            self.lut, self.indices, self.count_scale)

    def defines(self) -> dict[str, int]:
        m, s = self.indices.shape
        out = {
            "TP_FLYNN_M": m,
            "TP_FLYNN_S": s,
            "TP_FLYNN_RHO": self.n_winners,
            "TP_FLYNN_BITS": self.bits,
            "TP_FLYNN_INPUTS": self.n_hash_inputs,
            "TP_FLYNN_SPLIT": int(self.sign_split),
            "TP_FLYNN_SEEDED": int(not self.store_M),
            "TP_FLYNN_BLOCK": block_rows(self.n_hash_inputs),
            "TP_FLYNN_SEED": self.seed,
        }
        out.update(self.input_stage.defines())
        return out

    def working_sram(self) -> list[SramItem]:
        """The buffers tp_predict keeps on the stack: O(ρ + d + L), never the m projections, never d floats."""
        return fly_working_sram(self.n_winners, self.n_hash_inputs, self.n_classes, self.store_M,
                                self.n_inputs_per_hash)

    def model_bytes(self) -> int:
        return sum(a.nbytes for a in self.carrays())

    def multiply_accumulates(self) -> int:
        """Accumulate steps per inference (the lower bound's unit): m*s projection adds of an input picked by a
        flash index, plus one filter look-up per winner and class."""
        m, s = self.indices.shape
        return m * s + self.n_winners * self.n_classes

    # -- serialisation

    def to_json(self) -> dict:
        return {
            **self.json_head(),
            "sign_split": self.sign_split,
            "seed": self.seed,
            "indices": self.indices.tolist(),
            "n_winners": self.n_winners,
            "bits": self.bits,
            "counts": self.counts.tolist(),
            "decay": self.decay,
            "store_M": self.store_M,
            # only when not 1: the models of before it (and every model with unsaturated counts) keep their bytes
            **({"count_scale": self.count_scale} if self.count_scale != 1 else {}),
            **({"lut": self.lut_values.tolist()} if self.lut_values is not None else {}),
        }

    @classmethod
    def from_json(cls, raw: dict) -> "IntFlyNN":
        return cls(
            **cls.head_from_json(raw),
            sign_split=bool(raw["sign_split"]),
            seed=int(raw["seed"]),
            indices=np.asarray(raw["indices"], dtype=np.int64),
            n_winners=int(raw["n_winners"]),
            bits=int(raw["bits"]),
            counts=np.asarray(raw["counts"], dtype=np.int64),
            decay=float(raw["decay"]),
            store_M=bool(raw["store_M"]),
            count_scale=raw.get("count_scale", 1),
            lut_values=None if raw.get("lut") is None else np.asarray(raw["lut"], dtype=np.int64),
        )


# ---------------------------------------------------------------- the reference arithmetic, reusable by the solver



def fly_working_sram(rho: int, n_inputs: int, n_classes: int, store_M: bool, s: int) -> list[SramItem]:
    """IntFlyNN.working_sram() for these sizes (the solver and the learning firmware need it before a model)."""
    items = [
        SramItem("fly_heap", 4 * rho, f"top-{rho} min-heap of (uint16 value, uint16 row)"),
        SramItem("fly_sums", 2 * n_classes, "uint16 novelty sum per class (at most 255 * rho)"),
    ]
    wide = n_inputs > WIDE_INPUTS
    if not wide:
        size = n_inputs if store_M else 2 * n_inputs + BLOCK_ROWS
        items.append(SramItem("fly_inputs", size, f"{n_inputs} hash inputs as uint8 (u + 128)"
                              + ("" if store_M else f", cyclically extended to {size}: a rotated row never wraps")))
    if not store_M:
        items.append(SramItem("fly_pattern", (s + 1) * (2 if wide else 1),
                              f"the current block's {s} seeded offsets and a scan sentinel"))
    return items


def integer_projections(xq: np.ndarray, indices: np.ndarray, sign_split: bool) -> np.ndarray:
    """P (n, m) int64: exact sums of s hash inputs (float64 sums of integers this small are exact)."""
    u = hash_inputs(xq, sign_split)
    return project(u, projection_matrix(indices, u.shape[1])).astype(np.int64)


def integer_winners(xq: np.ndarray, indices: np.ndarray, rho: int, sign_split: bool, chunk: int = 512) -> np.ndarray:
    """(n, ρ) winners of the device's FlyHash, hashed `chunk` samples at a time to bound memory."""
    u = hash_inputs(xq, sign_split)
    M = projection_matrix(indices, u.shape[1])
    parts = [top_winners(project(u[i : i + chunk], M).astype(np.int64), rho) for i in range(0, len(u), chunk)]
    return np.concatenate(parts) if parts else np.empty((0, rho), dtype=np.int64)


def scores_from_winners(winners: np.ndarray, counts: np.ndarray, bits: int, lut: np.ndarray) -> np.ndarray:
    """score_l = Σ_{j in W} lut[t_lj] (binary: Σ [t_lj == 0]), (n, L) int64."""
    weights = (counts == 0).astype(np.int64) if bits == 1 else lut[counts]
    return weights[:, winners].sum(axis=2).T
