"""Raw float features -> standardised int8 inputs, the first stage of every deployed model.

x_q[i] = clamp(round((x[i] - mean[i]) * gain[i]), -127, 127), gain[i] = 1 / (std[i] * input_scale).

On the device `mean` and `gain` are stored as IEEE half floats with one shared power-of-two exponent per array
(4 bytes per feature, instead of 8 for two float32): a half float covers 2^-24..65504, the shared exponent moves
that window to where the data lives, and decoding (integer mantissa x 2^e) is exact in float32. The arithmetic
is float32, in the order written above, on the host (numpy) and on the device (avr-libc), and `round` is
"half away from zero" done as trunc(t ± 0.5) after clamping.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyproto.carray import CArray
from tinyproto.errors import TinyprotoError

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
        mean_bits, mean_exp = encode_half_block(np.asarray(mean, dtype=np.float64))
        gain = 1.0 / (np.asarray(std, dtype=np.float64) * input_scale)
        gain_bits, gain_exp = encode_half_block(gain)
        return cls(mean_bits, mean_exp, gain_bits, gain_exp, float(input_scale))

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


def choose_input_scale(Z: np.ndarray, quantile: float = 0.995, floor: float = 2.5) -> float:
    """int8 step for standardised data Z: the `quantile` of |Z| (at least `floor` std) maps to 127.

    Clipping rare outliers (digits has pixels that reach 20+ std) keeps resolution for the bulk of the data.
    """
    clip = max(float(np.quantile(np.abs(Z), quantile)), floor)
    return clip / INPUT_MAX
