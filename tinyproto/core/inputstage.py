"""Raw float features -> standardised int8 inputs, the first stage of every deployed model.

Three kinds, priced by what they store (`stage_bytes`): "feature" (a mean and a gain per kept feature, 4 B each),
"shared" (one offset and one gain for every feature, 4 B in all: pixels, same-unit sensors) and "centred" (the
shared offset and gain, then a per-feature centre of 2 or 4 bits in int8 steps: 4 B + d/4 or d/2 B; pixels whose
typical brightness differs from place to place, see `centred_from_means`). Only the
columns a model reads are kept (`kept`, `keep_only`): the others store nothing and are never sent.
For any family: `shared_stage(X)` builds the shared stage from training rows, `stage.quantize(X)` is what the
device computes (train on it), `shared_float` its value before rounding, `stage_bytes(kind, d)` its price.

x_q[i] = clamp(round((x[i] - mean[i]) * gain[i]), -127, 127), gain[i] = 1 / (scale[i] * input_scale), with
mean and scale from `standardise_moments`, the one standardisation rule of every family (see its docstring).
"centred": x_q[i] = clamp(round((x[i] - offset) * gain - centre[i]), -127, 127), centre[i] = code[i] * step + base
(small integers, so the subtraction in float32 is the device's exactly).

On the device `mean` and `gain` are stored as IEEE half floats with one shared power-of-two exponent per array
(4 bytes per feature, instead of 8 for two float32): a half float covers 2^-24..65504, the shared exponent moves
that window to where the data lives, and decoding (integer mantissa x 2^e) is exact in float32. The arithmetic
is float32, in the order written above, on the host (numpy) and on the device (avr-libc), and `round` is
"half away from zero" done as trunc(t ± 0.5) after clamping.
Layer: core.
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


STAGE_KINDS = ("feature", "shared", "centred")
CENTRE_BITS = (2, 4)  # bits per feature of a centred stage's centre codes (they never straddle a byte)


@dataclass(frozen=True)
class InputStage:
    """The deployed input stage: which raw columns the device receives, and how they become int8.

    kind "feature": a mean and a gain per kept feature (4 B each, the default of every family).
    kind "shared":  one offset and one gain for all features (4 B in all): pixels, same-unit sensors. A family
                    that can absorb per-feature scales (ProtoNN: W diag(g) and a constant offset per projected
                    dimension) trains on standardised data and folds them into its own arrays.
    `kept` lists the raw columns (of `n_inputs`) the model reads, in order; a column no weight reads stores
    nothing and is never sent: the device's TP_N_FEATURES, the test vectors, PREDICT and PREDICT_RAW, and the C
    API (tp_input_quantize, tp_predict, tp_stream_feed) all see only the kept columns, in this order.
    `quantize` and `select` accept rows of either width (all n_inputs raw columns, or the kept ones).
    """

    mean_bits: np.ndarray  # uint16 half floats: one per kept feature, or one in all ("shared")
    mean_exp: int
    gain_bits: np.ndarray  # uint16 half floats
    gain_exp: int
    input_scale: float  # one int8 step in standardised units (for reports and float <-> int comparisons)
    kind: str = "feature"
    kept: tuple | None = None  # raw column indices the device receives (None: all of them)
    n_inputs: int | None = None  # raw width of the user's data (None: n_features)
    centre_codes: np.ndarray | None = None  # "centred": uint8 code per kept feature, < 2^centre_bits
    centre_bits: int = 0
    centre_step: int = 0  # centre = code * step + base, in int8 steps
    centre_base: int = 0

    def __post_init__(self) -> None:
        if self.kind == "centred":
            codes = np.asarray(self.centre_codes)
            if (self.centre_bits not in CENTRE_BITS or codes.ndim != 1 or codes.size < 1 or codes.min() < 0
                    or codes.max() >= 1 << self.centre_bits or not 1 <= self.centre_step <= 127
                    or not -254 <= self.centre_base <= 254
                    or abs(self.centre_base + self.centre_step * ((1 << self.centre_bits) - 1)) > 254):
                raise ValueError("a centred stage needs 2- or 4-bit codes, a step of 1..127 and centres within ±254")
            object.__setattr__(self, "centre_codes", codes.astype(np.uint8))

    @classmethod
    def from_standardisation(cls, mean: np.ndarray, std: np.ndarray, input_scale: float,
                             kept=None, n_inputs: int | None = None) -> "InputStage":
        """Build the stage from per-feature mean/std (std > 0) and the shared int8 step `input_scale`.
        With `kept`, mean and std are those of the kept columns only (of n_inputs raw columns)."""
        mean = np.asarray(mean, dtype=np.float64)
        std = np.asarray(std, dtype=np.float64)
        if not (np.isfinite(mean).all() and np.isfinite(std).all() and (std > 0).all() and input_scale > 0):
            raise TinyprotoError("the input standardisation is not finite and positive (features beyond float64?)")
        mean_bits, mean_exp = encode_half_block(mean)
        with np.errstate(over="ignore"):
            gain = 1.0 / (std * input_scale)
        gain_bits, gain_exp = encode_half_block(gain)
        stage = cls(mean_bits, mean_exp, gain_bits, gain_exp, float(input_scale), "feature",
                    _kept_tuple(kept), n_inputs if kept is not None else None)
        if not (np.isfinite(stage.mean).all() and np.isfinite(stage.gain).all()):
            raise TinyprotoError(
                "the features' means or spreads are beyond float32 (|x| > 3.4e38), which the device computes in"
            )
        return stage

    @classmethod
    def shared(cls, offset: float, gain: float, n_features: int, kept=None, n_inputs: int | None = None,
               input_scale: float = 1.0) -> "InputStage":
        """One offset and one gain for every feature: x_q = clamp(round((x - offset) * gain)). 4 bytes in flash.
        The stored (half-float) values are what the device uses: read them back with `.mean` / `.gain`."""
        if not (np.isfinite(offset) and np.isfinite(gain) and gain > 0):
            raise TinyprotoError("the shared input offset and gain must be finite (and the gain positive)")
        mean_bits, mean_exp = encode_half_block(np.array([offset], dtype=np.float64))
        gain_bits, gain_exp = encode_half_block(np.array([gain], dtype=np.float64))
        kept_t = _kept_tuple(kept)
        if kept_t is None:
            n_inputs = n_features
        elif n_inputs is None:
            raise ValueError("a shared stage with kept columns needs n_inputs, the raw width")
        return cls(mean_bits, mean_exp, gain_bits, gain_exp, float(input_scale), "shared", kept_t, int(n_inputs))

    @classmethod
    def centred(cls, offset: float, gain: float, codes: np.ndarray, bits: int, step: int, base: int, kept=None,
                n_inputs: int | None = None, input_scale: float = 1.0) -> "InputStage":
        """The shared offset and gain, then a centre per feature: code * step + base int8 steps (see module doc)."""
        shared = cls.shared(offset, gain, len(codes), kept=kept, n_inputs=n_inputs, input_scale=input_scale)
        return cls(shared.mean_bits, shared.mean_exp, shared.gain_bits, shared.gain_exp, shared.input_scale,
                   "centred", shared.kept, shared.n_inputs, np.asarray(codes), int(bits), int(step), int(base))

    @property
    def centre(self) -> np.ndarray:
        """float32 centre per kept feature (int8 steps), or zeros for the other kinds."""
        if self.kind != "centred":
            return np.zeros(self.n_features, dtype=np.float32)
        return (self.centre_codes.astype(np.int64) * self.centre_step + self.centre_base).astype(np.float32)

    @property
    def n_features(self) -> int:
        """Features the device receives (the kept columns)."""
        if self.kept is not None:
            return len(self.kept)
        if self.kind == "centred":
            return int(self.centre_codes.size)
        if self.kind == "shared":
            return int(self.n_inputs)
        return int(self.mean_bits.size)

    @property
    def n_raw(self) -> int:
        """Columns of the user's raw data."""
        return int(self.n_inputs) if self.n_inputs is not None else self.n_features

    def keep_only(self, used: np.ndarray) -> "InputStage":
        """The stage for the features where `used` (bool, n_features) is true: the others store nothing and are
        never sent (their columns leave `kept`). Stored values of the remaining features are unchanged."""
        used = np.asarray(used, dtype=bool).reshape(-1)
        if used.size != self.n_features:
            raise ValueError(f"keep_only needs {self.n_features} flags, got {used.size}")
        if used.all():
            return self
        if not used.any():
            raise TinyprotoError("the model reads no input feature at all")
        base = np.arange(self.n_raw) if self.kept is None else np.asarray(self.kept, dtype=np.int64)
        kept = tuple(int(k) for k in base[used])
        mean_bits, gain_bits = self.mean_bits, self.gain_bits
        if self.kind == "feature":
            mean_bits, gain_bits = mean_bits[used].copy(), gain_bits[used].copy()
        codes = self.centre_codes[used].copy() if self.kind == "centred" else None
        return InputStage(mean_bits, self.mean_exp, gain_bits, self.gain_exp, self.input_scale, self.kind, kept,
                          self.n_raw, codes, self.centre_bits, self.centre_step, self.centre_base)

    @property
    def mean(self) -> np.ndarray:
        return decode_half_block(self.mean_bits, self.mean_exp)

    @property
    def gain(self) -> np.ndarray:
        return decode_half_block(self.gain_bits, self.gain_exp)

    def select(self, X: np.ndarray) -> np.ndarray:
        """The kept columns of raw rows (n, n_raw), or rows that already hold only them (n, n_features)."""
        x = np.asarray(X)
        if x.ndim != 2 or x.shape[1] not in (self.n_raw, self.n_features):
            raise TinyprotoError(
                f"the model takes {self.n_raw} features per sample, got data of shape {x.shape}"
            )
        if self.kept is not None and x.shape[1] == self.n_raw and self.n_raw != self.n_features:
            return x[:, np.asarray(self.kept, dtype=np.int64)]
        return x

    def quantize(self, X: np.ndarray) -> np.ndarray:
        """Raw features -> int8 (n, n_features), bit-exact with tp_input_quantize() in firmware/tp_input.c.
        X holds all raw columns or only the kept ones (see `select`)."""
        x = np.asarray(self.select(X), dtype=np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            t = (x - self.mean) * self.gain  # float32 throughout, same order as the C code ("shared": broadcast)
            if self.kind == "centred":
                t = t - self.centre  # float32, after the gain, as tp_input.c subtracts it
        t = np.where(np.isnan(t), np.float32(0), t)  # a NaN reading maps to the mean, as in the C code
        t = np.clip(t, np.float32(-INPUT_MAX), np.float32(INPUT_MAX))
        half = np.float32(0.5)
        rounded = np.where(t >= 0, np.trunc(t + half), np.trunc(t - half))
        return rounded.astype(np.int8)

    def carrays(self) -> list[CArray]:
        if self.kind in ("shared", "centred"):
            arrays = [
                CArray("input_mean", "uint16_t", self.mean_bits,
                       "shared input offset, half float x 2^TP_INPUT_MEAN_EXP"),
                CArray("input_gain", "uint16_t", self.gain_bits, "shared input gain, half float x 2^TP_INPUT_GAIN_EXP"),
            ]
            if self.kind == "centred":
                packed = np.packbits(((self.centre_codes[:, None] >> np.arange(self.centre_bits)) & 1).reshape(-1)
                                     .astype(np.uint8), bitorder="little")
                arrays.append(CArray("input_centre", "uint8_t", packed,
                                     f"{self.centre_bits}-bit centre code per feature, LSB first: centre = code x "
                                     "TP_INPUT_CENTRE_STEP + TP_INPUT_CENTRE_BASE int8 steps"))
            return arrays
        return [
            CArray("input_mean", "uint16_t", self.mean_bits, "per-feature mean, half float x 2^TP_INPUT_MEAN_EXP"),
            CArray("input_gain", "uint16_t", self.gain_bits,
                   "per-feature 1/(std*step), half float x 2^TP_INPUT_GAIN_EXP"),
        ]

    @property
    def nbytes(self) -> int:
        """Flash bytes of the stage's arrays (what the ledger counts; stage_bytes prices a kind before one exists)."""
        return sum(a.nbytes for a in self.carrays())

    def defines(self) -> dict[str, int]:
        out = {"TP_INPUT_MEAN_EXP": self.mean_exp, "TP_INPUT_GAIN_EXP": self.gain_exp}
        if self.kind in ("shared", "centred"):  # written only when set: a per-feature stage's header is unchanged
            out["TP_INPUT_SHARED"] = 1
        if self.kind == "centred":
            out.update(TP_INPUT_CENTRE_BITS=self.centre_bits, TP_INPUT_CENTRE_STEP=self.centre_step,
                       TP_INPUT_CENTRE_BASE=self.centre_base)
        if self.kept is not None:  # which raw columns the device receives is part of the model's identity
            out["TP_N_INPUTS"] = self.n_raw
            out["TP_INPUT_COLUMNS_CRC"] = _columns_crc(self.kept)
        return out

    def to_json(self) -> dict:
        raw = {
            "mean_bits": self.mean_bits.tolist(),
            "mean_exp": self.mean_exp,
            "gain_bits": self.gain_bits.tolist(),
            "gain_exp": self.gain_exp,
            "input_scale": self.input_scale,
        }
        if self.kind != "feature":
            raw["kind"] = self.kind
        if self.kept is not None:
            raw["kept"] = list(self.kept)
        if self.n_inputs is not None:
            raw["n_inputs"] = int(self.n_inputs)
        if self.kind == "centred":
            raw.update(centre_codes=self.centre_codes.tolist(), centre_bits=self.centre_bits,
                       centre_step=self.centre_step, centre_base=self.centre_base)
        return raw

    @classmethod
    def from_json(cls, raw: dict) -> "InputStage":
        kind = str(raw.get("kind", "feature"))
        if kind not in STAGE_KINDS:
            raise ValueError(f"unknown input stage kind {kind!r}")
        return cls(
            np.asarray(raw["mean_bits"], dtype=np.uint16),
            int(raw["mean_exp"]),
            np.asarray(raw["gain_bits"], dtype=np.uint16),
            int(raw["gain_exp"]),
            float(raw["input_scale"]),
            kind,
            _kept_tuple(raw.get("kept")),
            int(raw["n_inputs"]) if raw.get("n_inputs") is not None else None,
            np.asarray(raw["centre_codes"], dtype=np.int64) if kind == "centred" else None,
            int(raw.get("centre_bits", 0)),
            int(raw.get("centre_step", 0)),
            int(raw.get("centre_base", 0)),
        )


def _kept_tuple(kept) -> tuple | None:
    if kept is None:
        return None
    kept_t = tuple(int(k) for k in np.asarray(kept).reshape(-1))
    if any(b <= a for a, b in zip(kept_t, kept_t[1:])) or (kept_t and kept_t[0] < 0):
        raise ValueError("kept columns must be ascending, distinct and non-negative")
    return kept_t


def _columns_crc(kept: tuple) -> int:
    """A 16-bit digest of the kept column list, so the model hash covers which raw columns the device sees."""
    import zlib

    return zlib.crc32(np.asarray(kept, dtype="<u4").tobytes()) & 0xFFFF


# ---------------------------------------------------------------- choosing and pricing a stage (every family)


def stage_bytes(kind: str, n_features: int, centre_bits: int = 4) -> int:
    """Flash bytes of an input stage of this kind for n_features kept features (what carrays() will sum to)."""
    if kind == "centred":
        return 4 + -(-n_features * centre_bits // 8)
    return 4 if kind == "shared" else 4 * n_features


def shared_range(X: np.ndarray, quantile: float = 0.999) -> tuple[float, float]:
    """(offset, gain) of a shared stage from training rows: the [1 - q, q] quantiles of all values map to
    -127..127 (pixels 0..255: offset 127.5, gain 127/127.5, one int8 step per grey level)."""
    values = np.asarray(X, dtype=np.float64).reshape(-1)
    step = max(1, values.size // 2_000_000)  # a deterministic sample is plenty for two quantiles
    low, high = np.quantile(values[::step], [1.0 - quantile, quantile])
    if not high > low:
        low, high = float(values.min()), float(values.max())
    if not high > low:
        high = low + 1.0
    return 0.5 * (low + high), 2.0 * INPUT_MAX / (high - low)


def shared_stage(X: np.ndarray, kept=None, n_inputs: int | None = None) -> InputStage:
    """The shared stage for training rows X (n, n_features) (X holds the kept columns when `kept` is given).

    For any family (FlyNN: hash `stage.quantize(X)`, train on exactly what the device computes; its stage then
    costs 4 B instead of 4 B per feature). Use `stage_bytes("shared", d)` to price it in a solver, and
    `shared_float(stage, X)` for the float view ((x - offset) * gain, in int8 units before rounding)."""
    offset, gain = shared_range(X)
    return InputStage.shared(offset, gain, np.asarray(X).shape[1], kept=kept, n_inputs=n_inputs)


def shared_values(stage: InputStage, X: np.ndarray) -> np.ndarray:
    """A shared stage's values before rounding, float32 (n, d), as quantize computes them and clamped: what the
    centres of a centred stage are the feature means of."""
    x = np.asarray(X, dtype=np.float32)
    return np.clip((x - stage.mean) * stage.gain, -INPUT_MAX, INPUT_MAX)


def centred_from_means(shared: InputStage, means: np.ndarray, bits: int, kept=None,
                       n_inputs: int | None = None) -> InputStage:
    """The centred stage: the shared stage's offset and gain, then each feature's mean of `shared_values` (in int8
    steps) rounded to one of 2^bits evenly spaced whole-number centres spanning the features' means.

    Why: with one offset for every pixel, a pixel that is dark in every image sits at -127 and its mirror (FlyNN's
    sign split) at +126 in every sample, so the hash rows over such pixels win for every input and say nothing;
    per pixel, what tells digits apart is the deviation from that pixel's usual value. A per-feature stage
    centres exactly but costs 4 B per feature (3 kB for 784 pixels); a few bits per feature centre well enough
    (the means' spread over 2^bits levels: 784 pixels at 2 bits are 196 B). The means come from exact sums
    (core.moments.centred_stage), so the rows of a federation's parties give the pooled rows' stage."""
    if bits not in CENTRE_BITS:
        raise ValueError(f"centre bits must be one of {CENTRE_BITS}")
    means = np.asarray(means, dtype=np.float64)
    levels = (1 << bits) - 1
    base = int(np.floor(means.min()))
    step = max(1, int(np.ceil((means.max() - base) / levels)))
    codes = np.clip(np.rint((means - base) / step), 0, levels).astype(np.int64)
    return InputStage.centred(float(shared.mean[0]), float(shared.gain[0]), codes, bits, step, base, kept=kept,
                              n_inputs=n_inputs)


def shared_float(stage: InputStage, X: np.ndarray) -> np.ndarray:
    """The stage's input before rounding and clamping, float64 (n, n_features): (x - offset) * gain."""
    return (np.asarray(stage.select(X), dtype=np.float64) - float(stage.mean[0])) * float(stage.gain[0])


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
