"""IntBloom: the integer Bloom-features model that runs on the device, and its bit-exact numpy reference.

The device computes, for an int8 input x (TP_N_FEATURES values, fed in order, possibly in chunks):

    u_j      = clamp(x_j, -127, 127) + 128                 (uint8, 1..255: never 0)
    φ_i      = max over the (j, l) with h_l(j) = i of u_j   (uint8, 0 for a slot no component hashes to)
    φ'       = the φ_i of the used slots, in slot order     (TP_BLOOM_USED values; an unused slot is always 0)
    s_r      = Σ_p W[r, p] φ'_p + b_r                       (int32; W int8 in flash, b int16 or int32)
    scores   = s (L > 2), or (0, s_0) for two classes (one weight row: class 1 wins only on s_0 > 0)
    label    = argmax, ties to the lowest index

h_l(j) comes from TP_BLOOM_SEED by xorshift16 (train.seeded_slots): no byte of the hash is stored.

Scale: W ≈ coef / w_step with one shared w_step (max |coef| maps to 127); the classifier read φ = u / 256, so the
integer score is 256 / w_step times the float decision and b = round(intercept * 256 / w_step), plus, from the
training rows, what W's rounding costs a row of mean features (from_classifier).

Flash arrays (render order): the input stage, `bloom_W` (int8, R x TP_BLOOM_USED, row-major: one class's weights
are adjacent, the order the dot products read them) and `bloom_b` (int16 when every bias fits, else int32).
Layer: families.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tinyproto.core.carray import CArray
from tinyproto.core.inputstage import InputStage
from tinyproto.core.ledger import SramItem
from tinyproto.families import IntModelCommon, StaticState
from tinyproto.families.bloom.slots import U_SCALE, bloom_max, seeded_slots, used_slots

if TYPE_CHECKING:
    from tinyproto.families.bloom.train import BloomClassifier

WEIGHT_MAX = 127
INT16_MAX = 32767
RANGE_FEATURES_MAX = 0xFF00  # a range check's bin rides beside a feature index no feature has (tp_bloom.c)


STEP_QUANTILES = (1.0, 0.999, 0.995, 0.99, 0.98)  # of |coefficient|, mapped to 127: from_classifier's candidates


def _quantized(coef: np.ndarray, intercept: np.ndarray, phi: np.ndarray | None,
               quantile: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(int8 weights, rounded biases, step) with this quantile of |coef| at 127; with φ (the training rows' int8
    features), each bias corrected by what W's rounding and clipping cost a row of mean features."""
    top = float(np.quantile(np.abs(coef), quantile))
    step = top / WEIGHT_MAX if top > 0 else 1.0
    weights = np.clip(np.round(coef / step), -WEIGHT_MAX, WEIGHT_MAX)
    bias = intercept * U_SCALE / step
    if phi is not None:
        bias = bias + (coef / step - weights) @ phi.mean(axis=0)  # phi in u units (the score's)
    return weights, np.round(bias), step


def feature_scores(phi: np.ndarray, weights: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """The score vectors tp_predict writes for feature maps φ, (n, L): φ W^T + b; with two classes W is one row and
    the scores are (0, s), so that argmax gives the second class where s > 0, as the C code decides."""
    s = phi @ weights.T + bias
    return np.hstack([np.zeros_like(s), s]) if s.shape[1] == 1 else s


def integer_inputs(xq: np.ndarray) -> np.ndarray:
    """u = clamp(x, -127, 127) + 128 as int64 (1..255)."""
    return np.clip(np.asarray(xq, dtype=np.int64), -127, 127) + 128


@dataclass
class IntBloom(IntModelCommon):
    """The deployed Bloom-features model: everything the C runtime needs, plus the numpy reference."""

    classes: list
    input_stage: InputStage
    seed: int  # the hash seed (xorshift16 state before the first step)
    n_slots: int  # m, the hash range
    n_hashes: int  # k
    weights: np.ndarray  # (R, p) int8 values, R = 1 for two classes, else L; p = used slots
    bias: np.ndarray  # (R,) int
    weight_step: float  # reported: float coefficient = weight * weight_step
    family: str = "bloom"  # the registry name (tinyproto.families)
    family_id = 4  # TP_FAMILY_ID

    def __post_init__(self) -> None:
        self.weights = np.asarray(self.weights, dtype=np.int64)
        self.bias = np.asarray(self.bias, dtype=np.int64).reshape(-1)
        if not 1 <= self.n_hashes <= 64 or not 1 <= self.n_slots <= 65535 or not 1 <= self.seed <= 65535:
            raise ValueError("need 1 <= k <= 64, 1 <= m <= 65535 and a seed in 1..65535")
        # the hash is a pure function of (seed, d, k, m): computed once per model, not per call
        self._slots = seeded_slots(self.seed, self.n_features, self.n_hashes, self.n_slots)
        self._used = used_slots(self._slots)
        rows = 1 if self.n_classes == 2 else self.n_classes
        if not 2 <= self.n_classes <= 255:
            raise ValueError("need 2..255 classes")
        if self.weights.shape != (rows, self.n_used):
            raise ValueError(f"weights must be ({rows}, {self.n_used}): one row per class (one for two classes)")
        if self.weights.min() < -128 or self.weights.max() > 127:
            raise ValueError("weights must be int8")
        # |s| <= 128 * 255 * p + |b| must fit the device's int32 accumulator
        if self.bias.shape != (rows,) or np.abs(self.bias).max() + 128 * 255 * self.n_used >= 2**31:
            raise ValueError("bias must hold one int32 per weight row, with room for the sum")

    # -- sizes

    @property
    def slots(self) -> np.ndarray:
        return self._slots

    @property
    def used(self) -> np.ndarray:
        return self._used

    @property
    def n_used(self) -> int:
        return int(self.used.size)

    @property
    def bias_bits(self) -> int:
        return 16 if np.abs(self.bias).max() <= INT16_MAX else 32

    # -- construction

    @classmethod
    def from_classifier(cls, clf: BloomClassifier, X: np.ndarray | None = None,
                        pick_step: bool = False, quantiles: tuple[float, ...] | None = None) -> "IntBloom":
        """Quantize a fitted BloomClassifier: its input stage as it stands, W to int8 with one shared step, the
        biases into the score scale.

        The step: the largest |coefficient| maps to 127, unless pick_step (with the training rows X): then each of
        `quantiles` (STEP_QUANTILES) of |coefficient| maps to 127 in turn (the weights beyond it clip to ±127) and
        the step whose int8 model gives the float model's label on the most of those rows ships (ties: the larger
        step). Agreement, not accuracy: on a noisy table (bench_int8's mc30x6c2, seed 1: float 52.6 % right on
        the training rows) the training rows' int8 accuracy preferred the 98th percentile by 5 rows of 1,125,
        which agreed with the float model on 88 % of the test rows, against 98 % for the largest.
        One step is shared by every class's row, so with many classes the largest weight left most of the others a
        few steps: on audit20's many60 (60 classes of 8 slots, seed 0) a quarter of the weights were within ±2 steps.

        Given the training rows X, each bias also takes back what rounding W costs a row of mean features:
        b = round(intercept · 256 / step + Σ_p (coef_p / step - W_p) · mean φ_p), mean φ over X's int8 features.
        MAX over a few hashed inputs gives features whose mean is far larger than their spread, so W's rounding
        errors (±0.5 step each, summed over every used slot) added a per-class constant that moved the winner:
        on 1,500 rows of make_classification(n_features=30, n_informative=5, n_classes=6, n_clusters_per_class=2,
        random_state=4) at 2 kB (the shared stage, k = 8, 161 used slots; half the weights within ±4 steps) the
        int8 labels agreed with the float model's on 79 % of the test rows, 98 % with the correction."""
        if clf.offset == "shared":  # one offset and gain: 4 bytes (the values are already half floats)
            stage = InputStage.shared(float(clf.centre_[0]), 1.0 / clf.input_step_, len(clf.centre_))
        else:
            stage = InputStage.from_standardisation(clf.centre_, clf.scale_, clf.input_step_)
        quantiles = STEP_QUANTILES if quantiles is None else tuple(quantiles)
        coef = np.asarray(clf.coef_, dtype=np.float64)
        intercept = np.asarray(clf.intercept_, dtype=np.float64)
        phi = None
        if X is not None and len(X):
            slots = seeded_slots(int(clf.seed_), stage.n_features, int(clf.n_hashes), int(clf.n_slots))
            phi = bloom_max(integer_inputs(stage.quantize(np.asarray(X, dtype=np.float64))), slots,
                            used_slots(slots))
        if phi is None or not pick_step:
            quantiles = (1.0,)
        candidates = [_quantized(coef, intercept, phi, q) for q in quantiles]
        weights, bias, step = candidates[0]
        if len(candidates) > 1:
            target = np.searchsorted(clf.classes_, clf.predict(np.asarray(X, dtype=np.float64)))
            agreement = [int(np.sum(np.argmax(feature_scores(phi, w, b), axis=1) == target)) for w, b, _ in candidates]
            weights, bias, step = candidates[int(np.argmax(agreement))]  # ties: the first, the larger step
        return cls(classes=clf.classes_.tolist(), input_stage=stage, seed=int(clf.seed_), n_slots=int(clf.n_slots),
                   n_hashes=int(clf.n_hashes), weights=weights, bias=bias, weight_step=step)

    # -- the integer contract

    def features(self, xq: np.ndarray) -> np.ndarray:
        """φ' (n, p): the used slots' MAX of u, int64."""
        return bloom_max(integer_inputs(xq), self.slots, self.used)

    @property
    def range_shift(self) -> int:
        """TP_BLOOM_RANGE_SHIFT: each φ value's right shift in range_signal, the least that keeps the sum of
        the used slots' values within 16 bits (0 up to 257 used slots)."""
        shift = 0
        while self.n_used * (255 >> shift) > 0xFFFF:
            shift += 1
        return shift

    def range_signal(self, xq: np.ndarray) -> np.ndarray:
        """The range signal tp_judge checks with --unknown-rate (families/judging.training_range): Σ (φ' >> shift)
        over the used slots, a uint16, as tp_stream_end sums it while it compacts φ. How much the input fills the
        feature map: an input beyond the training rows' range (a weaker or stronger signal than any class) moves
        it where a linear score may only grow surer. (n,) int64; None for a model of more than
        RANGE_FEATURES_MAX features, which keeps no range (tp_bloom.c keeps the bin beside a feature index of 0xFF00
        or more, which no feature of such a model may have)."""
        if self.n_features > RANGE_FEATURES_MAX:
            return None
        return (self.features(xq) >> self.range_shift).sum(axis=1)

    def scores(self, xq: np.ndarray) -> np.ndarray:
        """The int32 score vectors tp_predict writes, (n, L) int64."""
        return feature_scores(self.features(xq), self.weights, self.bias)

    def labels(self, scores: np.ndarray) -> np.ndarray:
        """np.argmax returns the lowest index among ties, as the C loop does."""
        return np.argmax(np.asarray(scores), axis=1)

    def predict(self, X: np.ndarray) -> np.ndarray:
        """Raw float features -> original class labels, through the input stage."""
        return np.asarray(self.classes)[self.labels(self.scores(self.input_stage.quantize(X)))]

    def carrays(self) -> list[CArray]:
        rows, p = self.weights.shape
        bias_type = "int16_t" if self.bias_bits == 16 else "int32_t"
        return [
            *self.input_stage.carrays(),
            CArray("bloom_W", "int8_t", self.weights.reshape(-1),
                   f"weights, int8 ({rows} x {p} used of {self.n_slots} slots)"),
            CArray("bloom_b", bias_type, self.bias, f"bias per weight row, {self.bias_bits}-bit"),
        ]

    def defines(self) -> dict[str, int]:
        out = {
            "TP_BLOOM_M": self.n_slots,
            "TP_BLOOM_K": self.n_hashes,
            "TP_BLOOM_USED": self.n_used,
            "TP_BLOOM_ROWS": int(self.weights.shape[0]),
            "TP_BLOOM_SEED": self.seed,
            "TP_BLOOM_BIAS_BITS": self.bias_bits,
            "TP_STREAMABLE": 1,
        }
        if self.checks_range:  # decided here once: firmware/tp_bloom.c reads it
            out["TP_BLOOM_RANGE_SHIFT"] = self.range_shift
        out.update(self.input_stage.defines())
        return out

    @property
    def checks_range(self) -> bool:
        """A judged model (families/judging.py) whose calibration checks the range of φ's sum: its header then
        names TP_BLOOM_RANGE_SHIFT, its runtime keeps the sum's bin (on an AVR in the low byte of the stream's next
        feature index), and the compaction sums φ."""
        calibration = getattr(self, "calibration", None)
        return calibration is not None and calibration.has_range

    def working_sram(self) -> list[SramItem]:
        """φ lives in static SRAM (m bytes) with the stream's generator state; nothing holds the input vector."""
        return list(self.static_state().items)

    def static_state(self) -> StaticState:
        """firmware/tp_bloom.c's static variables, which tp_predict uses too (it runs the stream): not reentrant."""
        items = (
            SramItem("bloom_phi", self.n_slots, f"φ: one uint8 MAX per slot ({self.n_slots} slots, static)"),
            SramItem("bloom_stream", 4, "hash generator state and the next expected feature index (static)"),
        )
        # with a range check the bin of φ's sum, which tp_judge checks, rides in the next expected feature index's
        # low byte once the input is scored (tp_bloom.c: struct tp_bloom_ranged): no byte more on the AVR
        return StaticState(predict=items)

    def model_bytes(self) -> int:
        return sum(a.nbytes for a in self.carrays())

    def score_bound(self) -> int:
        """A weight row's score is its bias plus its weights times features of 0..255: it lies between the bias
        with its negative weights at 255 and the bias with its positive weights at 255 (two classes: also 0)."""
        W = self.weights.astype(np.int64)
        high = self.bias + 255 * np.clip(W, 0, None).sum(axis=1)
        low = self.bias + 255 * np.clip(W, None, 0).sum(axis=1)
        return int(max(np.abs(high).max(), np.abs(low).max()))

    def multiply_accumulates(self) -> int:
        """One int8 x uint8 product per weight (the lower bound's unit)."""
        return int(self.weights.size)

    # -- serialisation

    def to_json(self) -> dict:
        return {
            **self.json_head(),
            "seed": self.seed,
            "n_slots": self.n_slots,
            "n_hashes": self.n_hashes,
            "weights": self.weights.tolist(),
            "bias": self.bias.tolist(),
            "weight_step": self.weight_step,
        }

    @classmethod
    def from_json(cls, raw: dict) -> "IntBloom":
        return cls(**cls.head_from_json(raw),
                   seed=int(raw["seed"]), n_slots=int(raw["n_slots"]), n_hashes=int(raw["n_hashes"]),
                   weights=np.asarray(raw["weights"], dtype=np.int64), bias=np.asarray(raw["bias"], dtype=np.int64),
                   weight_step=float(raw["weight_step"]))
