"""Raw float features -> standardised int8 inputs, the first stage of every deployed model.

x_q[i] = clamp(round((x[i] - mean[i]) * gain[i]), -127, 127), gain[i] = 1 / (scale[i] * input_scale), with
mean and scale from `standardise_moments`, the one standardisation rule of every family (see its docstring).

On the device `mean` and `gain` are stored as IEEE half floats with one shared power-of-two exponent per array
(4 bytes per feature, instead of 8 for two float32): a half float covers 2^-24..65504, the shared exponent moves
that window to where the data lives, and decoding (integer mantissa x 2^e) is exact in float32. The arithmetic
is float32, in the order written above, on the host (numpy) and on the device (avr-libc), and `round` is
"half away from zero" done as trunc(t ± 0.5) after clamping.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyproto.core.carray import CArray
from tinyproto.core.errors import TinyprotoError

INPUT_MAX = 127  # int8 inputs are symmetric: -127..127
_HALF_MAX_EXP = 14  # scale so the largest magnitude lands in [2^14, 2^15): well inside half's 65504


def _shared_exponent(values: np.ndarray) -> int:
    largest = float(np.max(np.abs(values))) if values.size else 0.0
    if largest == 0.0 or not np.isfinite(largest):
        return 0
    return int(np.floor(np.log2(largest))) - _HALF_MAX_EXP


def encode_half_block(values: np.ndarray) -> tuple[np.ndarray, int]:
    """Values -> (uint16 half-float bit patterns, shared exponent e) with value ~= half * 2^e."""
    exponent = _shared_exponent(values)
    halves = np.ldexp(np.asarray(values, dtype=np.float64), -exponent).astype(np.float16)
    # A value within half an 11-bit ulp of float32's largest rounds up to 2^128, which float32 cannot hold:
    # round those few toward zero instead (an error of one half-float ulp, only next to float32's limit).
    with np.errstate(over="ignore"):
        overflow = ~np.isfinite(np.ldexp(halves.astype(np.float64), exponent).astype(np.float32))
    if overflow.any():
        halves[overflow] = np.nextafter(halves[overflow], np.float16(0))
    return halves.view(np.uint16).copy(), exponent


def decode_half_block(bits: np.ndarray, exponent: int) -> np.ndarray:
    """The float32 values the device decodes (exact: an 11-bit mantissa times a power of two)."""
    halves = np.asarray(bits, dtype=np.uint16).view(np.float16).astype(np.float64)
    return np.ldexp(halves, exponent).astype(np.float32)


@dataclass(frozen=True)
class InputStage:
    mean_bits: np.ndarray  # uint16 half floats
    mean_exp: int
    gain_bits: np.ndarray  # uint16 half floats
    gain_exp: int
    input_scale: float  # one int8 step in standardised units (for reports and float <-> int comparisons)

    @classmethod
    def from_standardisation(cls, mean: np.ndarray, std: np.ndarray, input_scale: float) -> "InputStage":
        """Build the stage from per-feature mean/std (std > 0) and the shared int8 step `input_scale`."""
        mean = np.asarray(mean, dtype=np.float64)
        std = np.asarray(std, dtype=np.float64)
        if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all() and input_scale > 0):
            raise TinyprotoError("the input standardisation is not finite and positive (features beyond float64?)")
        mean_bits, mean_exp = encode_half_block(mean)
        with np.errstate(over="ignore"):
            gain = 1.0 / (std * input_scale)
        gain_bits, gain_exp = encode_half_block(gain)
        stage = cls(mean_bits, mean_exp, gain_bits, gain_exp, float(input_scale))
        if not (np.isfinite(stage.mean).all() and np.isfinite(stage.gain).all()):
            raise TinyprotoError(
                "the features' means or spreads are beyond float32 (|x| > 3.4e38), which the device computes in"
            )
        return stage

    @property
    def n_features(self) -> int:
        return int(self.mean_bits.size)

    @property
    def mean(self) -> np.ndarray:
        return decode_half_block(self.mean_bits, self.mean_exp)

    @property
    def gain(self) -> np.ndarray:
        return decode_half_block(self.gain_bits, self.gain_exp)

    def quantize(self, X: np.ndarray) -> np.ndarray:
        """Raw features (n, d) -> int8 (n, d), bit-exact with tp_input_quantize() in firmware/tp_input.c."""
        x = np.asarray(X, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != self.n_features:
            raise TinyprotoError(
                f"the model takes {self.n_features} features per sample, got data of shape {x.shape}"
            )
        with np.errstate(over="ignore", invalid="ignore"):
            t = (x - self.mean) * self.gain  # float32 throughout, same order as the C code
        t = np.where(np.isnan(t), np.float32(0), t)  # a NaN reading maps to the mean, as in the C code
        t = np.clip(t, np.float32(-INPUT_MAX), np.float32(INPUT_MAX))
        half = np.float32(0.5)
        rounded = np.where(t >= 0, np.trunc(t + half), np.trunc(t - half))
        return rounded.astype(np.int8)

    def carrays(self) -> list[CArray]:
        return [
            CArray("input_mean", "uint16_t", self.mean_bits, "per-feature mean, half float x 2^TP_INPUT_MEAN_EXP"),
            CArray("input_gain", "uint16_t", self.gain_bits, "per-feature 1/(std*step), half float x 2^TP_INPUT_GAIN_EXP"),
        ]

    def defines(self) -> dict[str, int]:
        return {"TP_INPUT_MEAN_EXP": self.mean_exp, "TP_INPUT_GAIN_EXP": self.gain_exp}

    def to_json(self) -> dict:
        return {
            "mean_bits": self.mean_bits.tolist(),
            "mean_exp": self.mean_exp,
            "gain_bits": self.gain_bits.tolist(),
            "gain_exp": self.gain_exp,
            "input_scale": self.input_scale,
        }

    @classmethod
    def from_json(cls, raw: dict) -> "InputStage":
        return cls(
            np.asarray(raw["mean_bits"], dtype=np.uint16),
            int(raw["mean_exp"]),
            np.asarray(raw["gain_bits"], dtype=np.uint16),
            int(raw["gain_exp"]),
            float(raw["input_scale"]),
        )


# ---------------------------------------------------------------- the one standardisation rule

CONSTANT_RELATIVE = 2.0**-10  # std <= this x |mean|: the feature is constant for the device (see standardisation)
SPREAD_FLOOR_RELATIVE = 2.0**-20  # scale >= this x the data's overall spread S
ABSOLUTE_FLOOR = 2.0**-100  # std <= this: constant (far below float32's normal range, 2^-126, and its steps)


@dataclass(frozen=True)
class Standardisation:
    """What `standardise_moments` decided, feature by feature (for checks and messages)."""

    mean: np.ndarray  # float64 (d,)
    scale: np.ndarray  # float64 (d,), > 0 and finite
    std: np.ndarray  # the population std it started from
    spread: float  # S, the root-mean-square of the stds: the data's overall spread
    constant: np.ndarray  # bool (d,): spread invisible to the device -> scale = max(|mean|, S)
    floored: np.ndarray  # bool (d,): varies, but scale raised to the floor S * 2^-20


def standardise_moments(mean, variance, scaling: str = "feature") -> Standardisation:
    """THE input standardisation of every family (ProtoNN, FlyNN, federated FlyNN): z = (x - mean) / scale.

    From per-feature means and population variances (numpy's on the training set, or the federated path's
    exact all-reduced ones: the same (mean, variance) give bit-identical results whoever computes them):

        std_j = sqrt(variance_j),  S = sqrt(mean_j std_j^2)  (the data's overall spread, "global" scaling's std)
        constant_j  <=>  std_j <= max(2^-10 |mean_j|, 2^-100)
        scale_j = max(|mean_j|, S)            if constant_j (1.0 if that is <= 2^-100 too: nothing varies)
                = max(std_j,  2^-20 S)        otherwise, scaling="feature" (each feature's own std)
                = max(S,      2^-20 S) = S    otherwise, scaling="global" (one std for all: pixels share a unit)

    Why these numbers (the device computes (x - mean) * gain in float32 from half-float mean and gain):
    * a constant feature (a column of 0.3s has std ~5e-17, pure rounding noise) taught the model nothing; the
      old rule divided by that noise, so a reading of 0.31 became 1e14 std and saturated the int8 input.
      Here it is scaled by its own magnitude (or the data's spread when it is 0): 0.31 becomes z = 0.033, and a
      reading that drifts from the training constant moves the input only by its relative change;
    * "constant" means "the device cannot see the variation": the mean is stored as a half float (11
      significant bits), so it is only good to 2^-12 |mean|; with std below 2^-10 |mean| that storage error
      alone would shift every input by more than a quarter std. 2^-100 keeps every step far inside float32;
    * the floor 2^-20 S keeps all gains (proportional to 1 / scale) within 2^26 of each other for up to 4096
      features (the largest std is at most sqrt(d) S), so every gain is a normal half float under the gain
      block's shared exponent (2^-14..2^15, full 11-bit precision). Data that needs it (one column a
      millionth of the others' spread) is refused by tinyproto.core.datasets before training, so on accepted
      data the floor never changes a scale; it only makes the estimators safe on anything.
    On data without such columns (every built-in set) scale_j is exactly numpy's std (or the global S), so the
    families' figures are unchanged.
    """
    mean = np.asarray(mean, dtype=np.float64).reshape(-1)
    variance = np.maximum(np.asarray(variance, dtype=np.float64).reshape(-1), 0.0)
    if mean.shape != variance.shape:
        raise ValueError("mean and variance must have the same length")
    if scaling not in ("feature", "global"):
        raise ValueError(f"unknown scaling {scaling!r}")
    std = np.sqrt(variance)
    spread = float(np.sqrt(np.mean(std**2))) if std.size else 0.0
    magnitude = np.abs(mean)
    constant = std <= np.maximum(CONSTANT_RELATIVE * magnitude, ABSOLUTE_FLOOR)
    fallback = np.maximum(magnitude, spread)
    fallback = np.where(fallback > ABSOLUTE_FLOOR, fallback, 1.0)
    floor = SPREAD_FLOOR_RELATIVE * spread
    varying = std if scaling == "feature" else np.full_like(std, spread)
    floored = ~constant & (varying < floor)
    scale = np.where(constant, fallback, np.maximum(varying, floor))
    return Standardisation(mean, scale, std, spread, constant, floored)


def standardisation(X: np.ndarray, scaling: str = "feature") -> tuple[np.ndarray, np.ndarray]:
    """(mean, scale) of the rows of X by `standardise_moments` (numpy's mean and population variance)."""
    X = np.asarray(X, dtype=np.float64)
    result = standardise_moments(X.mean(axis=0), X.var(axis=0), scaling)
    return result.mean, result.scale


def choose_input_scale(Z: np.ndarray, quantile: float = 0.995, floor: float = 2.5) -> float:
    """int8 step for standardised data Z: the `quantile` of |Z| (at least `floor` std) maps to 127.

    Clipping rare outliers (digits has pixels that reach 20+ std) keeps resolution for the bulk of the data.
    """
    clip = max(float(np.quantile(np.abs(Z), quantile)), floor)
    return clip / INPUT_MAX
