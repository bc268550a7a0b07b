"""Confidence and "unknown": the integer signals read from a score vector, their calibration, and the figures that
judge them (expected calibration error, AUROC, coverage).

Every family's device computes, after its scores, two integers from the winning score and the runner-up
(firmware/tp_judge.c does exactly what `Calibration.judge` does here), both on the scores' 16-bit view: each int32
score shifted right by 8 * score_byte bits (tp_judge reads two of its bytes), score_byte the smallest that the
family's proven score bound fits in 16 bits (0 for FlyNN and BNC, whose scores are small; 2, exact for any int32,
when a family proves none):

- the confidence byte, from the margin (winner - runner-up) in that view: 255 less a doubt that starts at `doubt`
  (a tie) and halves for every whole `halving` of margin, 255 - (doubt >> (margin // halving)). The host fits the
  two integers on cross-validated rows (fit_doubt: the lowest Brier score); the device subtracts and shifts, at
  most DOUBT_HALVINGS times. No table: the stage costs the device code only (docs/guides/confidence.md).
- the novelty: how bad the winning score is (minus it when the highest score wins, the score itself when the
  lowest wins), in the same view. With a decline threshold the device answers UNKNOWN_LABEL when the novelty
  exceeds it.
- with a range (a family whose integer model has a `range_signal`: Bloom features' feature-map sum), a second
  signal the family's runtime computes beside its scores, as a uint16: outside the range the training rows gave it
  (widened to whole bins of RANGE_BIN: the device compares one byte, the bin), the device answers UNKNOWN_LABEL
  whatever the scores say (an input beyond anything seen in training can make a
  linear score grow, and so look surer: docs/guides/confidence.md).
- with a clip check (every family, fitted when it pays: fit_clip_check), the count of the input's int8 values at
  the clip (+127, -127 or either: the `clip_side`), which the runtime counts as the input arrives: more than
  `clip_above` of them answers UNKNOWN_LABEL whatever the scores say. An input beyond the training range in some
  feature reaches the clip there; a family whose scores discard magnitude (FlyNN's hash, BNC's binary code) cannot
  tell it from a known one (docs/guides/confidence.md).

The calibration is fitted on rows the model did not train on (cross-validation: see families/judging.py), so the
byte means what it says: among rows given confidence c, about c/255 are classified correctly.
Layer: core.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.labels import code_labels, plain
from tinyproto.core.option_lists import comma_items, plain_digits

DOUBT_HALVINGS = 8  # a byte's doubt is 0 after 8 halvings: the device's loop runs at most this often
MAX_HALVING = 2**16 - 1  # the margin's step is a uint16 the device subtracts
UNKNOWN_LABEL = 255  # the label the device answers for a declined input (never a class: at most 255 classes)
ECE_BINS = 10  # expected calibration error: ten equal-width bins of confidence
MAX_UNKNOWN_RATE = 0.5
VIEW_BITS = 16  # tp_judge compares and subtracts scores in 16 bits
MAX_SCORE_BYTE = 2  # bytes 2-3 of an int32 are its exact 16-bit view whatever its value
# A view within +-VIEW_MAX: the decline limit, clamped to +-(VIEW_MAX + 1), then stays strictly inside int16, so
# the compiler never sees a compare with a constant answer (-Wtype-limits is an error in the build).
VIEW_MAX = 2**15 - 3
RANGE_MAX = 2**16 - 1  # a family's range signal is a uint16 on the device
RANGE_BIN = 256  # the range is whole bins of this width from its low end: the device keeps (signal - low) >> 8
RANGE_MAX_BINS = 255  # the bin count is a byte the device compares with one cpi
RANGE_NOVELTY = 2**20  # novelty_score: a row outside the range ranks above every view's novelty (|view| < 2**15)
# The clip check's sides: the int8 values that count as at the clip, as the device tests each input read as a byte,
# (uint8_t)(x - FROM) < SPAN: side -> (FROM, SPAN), TP_UNKNOWN_CLIP_FROM and TP_UNKNOWN_CLIP_SPAN in the header of a
# model with the check (firmware/tp_judge.c reads them as given), and the host's count (clip_counts) alike
CLIP_SIDES = {"high": (127, 1),  # +127
              "low": (128, 2),  # -128, -127
              "both": (127, 3)}  # +127, -128, -127
CLIP_ORDER = ("both", "high", "low")  # fit_clip_check tries the sides in this order
CLIP_MAX_ABOVE = 3  # the check is kept only when at most this many clipped inputs are normal (fit_clip_check)
CLIP_SHARE = 0.1  # of the --unknown-rate: the most of the known rows the clip check may decline
CLIP_COUNT_MAX = 255  # the device's count is a byte that stops at 255


def winner_and_runner_up(scores: np.ndarray, labels: np.ndarray, lowest_wins: bool) -> tuple[np.ndarray, np.ndarray]:
    """(winning score, best score of any other class) per row, as int64."""
    scores = np.asarray(scores, dtype=np.int64)
    rows = np.arange(len(scores))
    winner = scores[rows, labels]
    others = scores.copy()
    sentinel = np.iinfo(np.int64).max if lowest_wins else np.iinfo(np.int64).min
    others[rows, labels] = sentinel
    runner = others.min(axis=1) if lowest_wins else others.max(axis=1)
    return winner, runner


def judge_score_byte(score_bound: int | None) -> int:
    """The byte of each int32 score tp_judge's 16-bit view starts at: the smallest that keeps every score the
    family proves possible within +-VIEW_MAX after the shift (MAX_SCORE_BYTE when it proves none: a view of the
    top two bytes is exact for any int32, if coarse)."""
    if score_bound is None:
        return MAX_SCORE_BYTE
    for byte in range(MAX_SCORE_BYTE + 1):
        if -((-int(score_bound)) >> (8 * byte)) <= VIEW_MAX:  # the bound rounded up, as -bound rounds down
            return byte
    return MAX_SCORE_BYTE


def score_view(scores: np.ndarray, score_byte: int) -> np.ndarray:
    """The 16-bit view tp_judge reads of each int32 score: score >> (8 * score_byte), rounded down (two of its
    bytes, little-endian), as int64."""
    return np.asarray(scores, dtype=np.int64) >> (8 * int(score_byte))


def margins(winner_view: np.ndarray, runner_view: np.ndarray, lowest_wins: bool) -> np.ndarray:
    """How far the winner is ahead of the runner-up, in the view (never negative: the view keeps the order), as the
    device's uint16 difference."""
    ahead = (np.asarray(runner_view, np.int64) - winner_view if lowest_wins
             else np.asarray(winner_view, np.int64) - runner_view)
    return ahead & 0xFFFF


def halvings(margin: np.ndarray, halving: int) -> np.ndarray:
    """How often the doubt halves per row, exactly as tp_judge.c: the whole halvings in the margin, at most
    DOUBT_HALVINGS (a byte is 0 by then)."""
    return np.minimum(np.asarray(margin, dtype=np.int64) // int(halving), DOUBT_HALVINGS)


def confidence_bytes(margin: np.ndarray, doubt: int, halving: int) -> np.ndarray:
    """The confidence byte per row, exactly as tp_judge.c: 255 - (doubt >> halvings)."""
    return 255 - (np.int64(doubt) >> halvings(margin, halving))


def novelty(winner: np.ndarray, lowest_wins: bool) -> np.ndarray:
    """How unlike the training rows an input is, from its winning score: larger is more novel."""
    winner = np.asarray(winner, dtype=np.int64)
    return winner if lowest_wins else -winner


@dataclass(frozen=True)
class Calibration:
    """What the device needs to judge its own answer: the scores' view, the doubt at a tie and the margin that
    halves it, and the decline threshold (None: the model never answers unknown, and its header and code are those
    of a model without the option)."""

    doubt: int  # 0..255: 255 less the confidence byte of a tie (margin 0)
    halving: int  # 1..MAX_HALVING: each whole one of these in the margin (in the view) halves the doubt
    lowest_wins: bool
    unknown_above: int | None = None  # novelty (in the view) > this: UNKNOWN_LABEL
    unknown_rate: float | None = None  # the share of known rows the threshold was fitted to decline
    score_byte: int = 0  # the view: score >> (8 * score_byte) (judge_score_byte)
    range_low: int | None = None  # the family's range signal below this: UNKNOWN_LABEL (None: no range check)
    range_high: int | None = None  # ... or above this
    clip_side: str | None = None  # "high", "low" or "both": the int8 values the clip check counts (None: no check)
    clip_above: int | None = None  # more inputs than this at the clip: UNKNOWN_LABEL

    @property
    def has_range(self) -> bool:
        return self.range_low is not None

    @property
    def has_clips(self) -> bool:
        return self.clip_side is not None

    def _clip_inputs(self, xq: np.ndarray | None) -> np.ndarray:
        if xq is None:
            raise ValueError("this calibration checks the inputs' clip: the rows' int8 inputs are needed")
        return xq

    def clip_counts(self, xq: np.ndarray | None) -> np.ndarray | None:
        """Per row, how many of its int8 inputs are at the clip on the checked side(s), as the device counts them
        (a byte that stops at 255); None without a clip check."""
        return clip_counts(self._clip_inputs(xq), self.clip_side) if self.has_clips else None

    def defines(self) -> dict[str, int]:
        """The header's lines of the confidence stage (two constants in the code: no array in flash)."""
        out = {"TP_JUDGE_DOUBT": int(self.doubt), "TP_JUDGE_HALVING": int(self.halving),
               "TP_SCORE_LOWEST_WINS": int(self.lowest_wins), "TP_JUDGE_SCORE_BYTE": int(self.score_byte)}
        if self.unknown_above is not None:
            # the device compares the winning score's view itself: the novelty is minus it when the highest wins
            out["TP_UNKNOWN_LABEL"] = UNKNOWN_LABEL
            out["TP_UNKNOWN_LIMIT"] = int(self.unknown_above if self.lowest_wins else -self.unknown_above)
        if self.has_range:  # the device declines when ((signal - low) mod 2^16) >> 8 >= bins: one byte compared
            out["TP_UNKNOWN_RANGE_LOW"] = int(self.range_low)
            out["TP_UNKNOWN_RANGE_BINS"] = (int(self.range_high) - int(self.range_low) + 1) // RANGE_BIN
        if self.has_clips:  # the runtime counts the inputs at the clip; the device declines above the count
            out["TP_UNKNOWN_CLIP_FROM"], out["TP_UNKNOWN_CLIP_SPAN"] = CLIP_SIDES[self.clip_side]
            out["TP_UNKNOWN_CLIPS"] = int(self.clip_above)
        return out

    def signals(self, scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(margin, novelty) per row, in the view tp_judge computes them in."""
        winner, runner = winner_and_runner_up(scores, np.asarray(labels, dtype=np.int64), self.lowest_wins)
        winner, runner = score_view(winner, self.score_byte), score_view(runner, self.score_byte)
        return margins(winner, runner, self.lowest_wins), novelty(winner, self.lowest_wins)

    def outside(self, signal: np.ndarray | None) -> np.ndarray | None:
        """Per row, whether the family's range signal is outside the range (None without a range check)."""
        if not self.has_range:
            return None
        if signal is None:
            raise ValueError("this calibration checks a range: the model's range signal is needed")
        signal = np.asarray(signal, dtype=np.int64)
        return (signal < self.range_low) | (signal > self.range_high)

    def clipped(self, xq: np.ndarray | None) -> np.ndarray | None:
        """Per row, whether the clip check declines it (None without a clip check)."""
        return clipped_rows(self._clip_inputs(xq), self.clip_side, self.clip_above) if self.has_clips else None

    def judge(self, scores: np.ndarray, labels: np.ndarray, signal: np.ndarray | None = None,
              xq: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(confidence byte, decided label) per row: the host reference of tp_judge(); `signal` is the family's
        range signal per row (needed when the calibration checks a range), `xq` the rows' int8 inputs (needed when
        it checks their clip)."""
        labels = np.asarray(labels, dtype=np.int64)
        margin, novel = self.signals(scores, labels)
        confidence = confidence_bytes(margin, self.doubt, self.halving)
        decided = labels.copy()
        if self.unknown_above is not None:
            decided[novel > self.unknown_above] = UNKNOWN_LABEL
        for declined in (self.outside(signal), self.clipped(xq)):
            if declined is not None:
                decided[declined] = UNKNOWN_LABEL
        return confidence, decided

    def novelty_score(self, novel: np.ndarray, signal: np.ndarray | None,
                      xq: np.ndarray | None = None) -> np.ndarray:
        """The novelty score the AUROC ranks: the winning score's novelty, except that a row outside the range, or
        with more inputs at the clip than the check allows, is more novel than every other row (by how far outside,
        or how many inputs clipped), as the device declines it whatever its scores."""
        novel = np.asarray(novel, dtype=np.int64)
        beyond = np.zeros(len(novel), dtype=np.int64)
        declined = np.zeros(len(novel), dtype=bool)
        outside = self.outside(signal)
        if outside is not None:
            signal = np.asarray(signal, dtype=np.int64)
            beyond = np.maximum(beyond, np.where(outside, np.maximum(self.range_low - signal,
                                                                     signal - self.range_high), 0))
            declined |= outside
        clipped = self.clipped(xq)
        if clipped is not None:
            beyond = np.maximum(beyond, np.where(clipped, self.clip_counts(xq), 0))
            declined |= clipped
        return np.where(declined, RANGE_NOVELTY + beyond, novel)

    def to_json(self) -> dict:
        out = {"doubt": int(self.doubt), "halving": int(self.halving), "lowest_wins": bool(self.lowest_wins),
               "unknown_above": None if self.unknown_above is None else int(self.unknown_above),
               "unknown_rate": self.unknown_rate, "score_byte": int(self.score_byte)}
        if self.has_range:  # only then: a model without one keeps its model.json (and hash) as before
            out["range"] = [int(self.range_low), int(self.range_high)]
        if self.has_clips:  # likewise
            out["clips"] = {"side": self.clip_side, "above": int(self.clip_above)}
        return out

    @staticmethod
    def from_json(raw: dict) -> Calibration:
        if not _is_int_in(raw.get("doubt"), 0, 255) or not _is_int_in(raw.get("halving"), 1, MAX_HALVING):
            raise TinyprotoError(f"the confidence's doubt must be 0 to 255 and its halving 1 to {MAX_HALVING}")
        above = raw.get("unknown_above")
        if above is not None and not _is_int_in(above, -VIEW_MAX - 1, VIEW_MAX + 1):
            raise TinyprotoError("the unknown threshold must be a 16-bit integer")
        if not _is_int_in(raw.get("score_byte"), 0, MAX_SCORE_BYTE):
            raise TinyprotoError(f"the confidence's score_byte must be 0 to {MAX_SCORE_BYTE}")
        rate = raw.get("unknown_rate")
        if rate is not None and not (isinstance(rate, (int, float)) and not isinstance(rate, bool)
                                     and 0 < rate <= MAX_UNKNOWN_RATE):
            raise TinyprotoError(f"the confidence's unknown_rate must be above 0 and at most {MAX_UNKNOWN_RATE}")
        if not isinstance(raw.get("lowest_wins"), bool):
            raise TinyprotoError("the confidence's lowest_wins must be true or false")
        low = high = None
        if "range" in raw:
            pair = raw["range"]
            if (not isinstance(pair, list) or len(pair) != 2 or not all(_is_int_in(v, 0, RANGE_MAX) for v in pair)
                    or pair[0] > pair[1] or (pair[1] - pair[0] + 1) % RANGE_BIN
                    or (pair[1] - pair[0] + 1) // RANGE_BIN > RANGE_MAX_BINS or above is None):
                raise TinyprotoError("the unknown range must be two integers 0 to 65535, low <= high, spanning "
                                     f"1 to {RANGE_MAX_BINS} whole bins of {RANGE_BIN}, beside a threshold")
            low, high = pair
        side = clip_above = None
        if "clips" in raw:
            clips = raw["clips"]
            if (not isinstance(clips, dict) or set(clips) != {"side", "above"} or clips["side"] not in CLIP_SIDES
                    or not _is_int_in(clips["above"], 0, CLIP_COUNT_MAX - 1) or above is None):
                raise TinyprotoError("the unknown clip check must name a side (high, low or both) and a count 0 to "
                                     f"{CLIP_COUNT_MAX - 1}, beside a threshold")
            side, clip_above = clips["side"], clips["above"]
        return Calibration(raw["doubt"], raw["halving"], raw["lowest_wins"], above,
                           None if rate is None else float(rate), raw["score_byte"], low, high, side, clip_above)


def clip_counts(xq: np.ndarray, side: str) -> np.ndarray:
    """Per row, how many int8 inputs sit at the clip: +127 ("high"), -127 or -128 ("low") or either ("both"),
    tested as the device does (CLIP_SIDES: each value read as a byte, (x - FROM) mod 256 < SPAN), stopping at
    CLIP_COUNT_MAX as the device's byte does."""
    xq = np.asarray(xq, dtype=np.int64)
    if xq.ndim != 2:
        raise ValueError("clip_counts needs rows of int8 inputs")
    start, span = CLIP_SIDES[side]
    return np.minimum(((xq - start) % 256 < span).sum(axis=1), CLIP_COUNT_MAX).astype(np.int64)


def clipped_rows(xq: np.ndarray, side: str, above: int) -> np.ndarray:
    """Per row, whether the clip check (side, above) declines it: more than `above` of its int8 inputs at the clip
    (what tp_judge decides from tp_judge_inputs' count)."""
    return clip_counts(xq, side) > int(above)


def fit_clip_check(xq_parts: list[np.ndarray], rate: float) -> tuple[str, int] | None:
    """(side, clip_above) of the clip check, from known rows the model did not train on (each part: one fold's
    validation rows, in that fold model's int8 inputs), or None when it does not pay. Per side (CLIP_ORDER), the
    smallest count that at most CLIP_SHARE of the rate of the rows exceed; the first side whose count is at most
    CLIP_MAX_ABOVE is kept. Clipping then marks the edge of the training range (most rows never reach it, a few
    in a feature or two): an input beyond that edge in more features is declined. The share is small because the
    check takes it from the score threshold's (rate_beside): on data where the clip says nothing new, every row it
    declines is one the threshold no longer may. A stage that maps the data's own extremes to
    the clip (pixels: blank is -127), where dozens of inputs clip in every row, keeps no check: its count says what
    the row looks like, not how far it is out, and would only take rows from the score threshold's share."""
    if sum(len(x) for x in xq_parts) == 0:
        return None
    for side in CLIP_ORDER:  # per part: fold models may keep different input columns
        counts = np.concatenate([clip_counts(x, side) for x in xq_parts])
        above = 0
        while above < CLIP_COUNT_MAX and np.mean(counts > above) > CLIP_SHARE * rate:
            above += 1
        if above <= CLIP_MAX_ABOVE:
            return side, above
    return None


def rate_beside(rate: float, declined_share: float) -> float:
    """The rate a score threshold fitted on the rows another check leaves answers that makes the two together
    decline `rate` of all the rows (0 when the other check already declines that many)."""
    if declined_share >= rate:
        return 0.0
    return (rate - declined_share) / (1.0 - declined_share)


def whole_bins(low: int, high: int) -> tuple[int, int] | None:
    """The range the device checks for a signal range low .. high: widened to whole bins of RANGE_BIN (half the
    extra below, half above, kept within 0 .. RANGE_MAX); None when it would take more than RANGE_MAX_BINS bins
    (nearly every uint16: nothing worth checking)."""
    bins = -(-(int(high) - int(low) + 1) // RANGE_BIN)
    if bins > RANGE_MAX_BINS:
        return None
    low = int(low) - (bins * RANGE_BIN - (int(high) - int(low) + 1)) // 2
    low = min(max(low, 0), RANGE_MAX + 1 - bins * RANGE_BIN)
    return low, low + bins * RANGE_BIN - 1


def _is_int_in(value, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def view_threshold(threshold: int, score_byte: int, lowest_wins: bool) -> int:
    """A novelty threshold in score units as one in the view, kept where the device's limit (TP_UNKNOWN_LIMIT,
    minus it when the highest score wins) stays strictly inside int16: beyond every view it answers alike."""
    shift = 8 * int(score_byte)
    # decline: novelty > threshold; the view rounds the winner down, so the novelty rounds down when the lowest
    # score wins (winner >> shift) and up when the highest does (-(winner >> shift))
    view = (int(threshold) >> shift) if lowest_wins else -((-int(threshold)) >> shift)
    return min(max(view, -VIEW_MAX - 1), VIEW_MAX + 1)


# the margins a halving is tried at: every step up to 32, then 16 per doubling (a few percent apart) up to the largest
HALVING_CANDIDATES = np.unique(np.concatenate([np.arange(1, 33),
                                               np.rint(2.0 ** (np.arange(5 * 16, 16 * 16 + 1) / 16.0))])
                               .clip(1, MAX_HALVING).astype(np.int64))


def fit_doubt(margin: np.ndarray, correct: np.ndarray) -> tuple[int, int]:
    """(doubt, halving) whose confidence bytes predict these rows' hits best: the lowest Brier score (the smallest
    halving, then the smallest doubt, among equals). The host's replacement for a table and a division on the
    device: every halving candidate, and for each every doubt 0..255 at once (rows grouped by their halvings)."""
    margin = np.asarray(margin, dtype=np.int64)
    correct = np.asarray(correct, dtype=np.float64)
    if len(margin) == 0:
        return 0, 1
    doubts = np.arange(256, dtype=np.int64)
    best, best_fit = np.inf, (0, 1)
    for halving in HALVING_CANDIDATES:
        k = halvings(margin, int(halving))
        rows = np.bincount(k, minlength=DOUBT_HALVINGS + 1).astype(np.float64)
        hits = np.bincount(k, weights=correct, minlength=DOUBT_HALVINGS + 1)
        p = (255 - (doubts[:, None] >> np.arange(DOUBT_HALVINGS + 1)[None, :])) / 255.0  # (doubt, halvings)
        brier = (p * p * rows - 2.0 * p * hits).sum(axis=1)  # + sum(hits), the same for every candidate
        d = int(np.argmin(brier))
        if brier[d] < best - 1e-9:
            best, best_fit = float(brier[d]), (d, int(halving))
    return best_fit


def decline_threshold(novelty_values: np.ndarray, rate: float) -> int:
    """The smallest integer threshold that declines (novelty > threshold) at most `rate` of these rows."""
    values = np.sort(np.asarray(novelty_values, dtype=np.int64))
    n = len(values)
    keep = int(np.ceil((1.0 - rate) * n))  # at least this many rows stay accepted
    if keep <= 0:
        return int(values[0]) - 1
    return int(values[min(keep, n) - 1])


def nearest_threshold(novelty_values: np.ndarray, rate: float) -> int:
    """The integer threshold whose declined share (novelty > threshold) of these rows is nearest `rate`, the larger
    threshold among equals: for a novelty of few distinct values (a Hamming distance in bits), where one step holds
    several percent of the rows and decline_threshold's "at most" would always round the share down."""
    values = np.sort(np.asarray(novelty_values, dtype=np.int64))
    if len(values) == 0:
        raise ValueError("no rows to fit a threshold on")
    candidates = np.unique(values)  # a threshold between two values declines what the lower one does
    declined = 1.0 - np.searchsorted(values, candidates, side="right") / len(values)
    miss = np.abs(declined - rate)
    return int(candidates[np.flatnonzero(miss <= miss.min() + 1e-12)[-1]])


def parse_rate(text: str) -> float:
    """'5%' or '0.05' -> 0.05; one clear error otherwise."""
    raw = str(text).strip()
    try:
        if not plain_digits(raw):  # float() reads '５%' and '0_05' (the digits 0-9 only, as --budget)
            raise ValueError(raw)
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise TinyprotoError(f"--unknown-rate must be a share like 5% or 0.05, not {text!r}") from None
    return check_rate(value, text)


def check_rate(value: float, given: object, what: str = "--unknown-rate") -> float:
    """A share of known rows to decline, above 0 and at most MAX_UNKNOWN_RATE (given: as the user wrote it)."""
    if not 0.0 < value <= MAX_UNKNOWN_RATE:
        raise TinyprotoError(f"{what} must be above 0 and at most {100 * MAX_UNKNOWN_RATE:g}%, not {given!r}")
    return value


def parse_classes(text: str, known: list) -> list:
    """'8,9' -> the class values named (as the data set spells them); one clear error otherwise."""
    if not str(text).strip(", "):
        raise TinyprotoError("--holdout-classes needs at least one class, e.g. 8,9")
    names = comma_items(text, "--holdout-classes")
    by_text = {str(c): c for c in known}
    by_value = {(type(c), c): c for c in known}

    def named(name: str):
        """The class a name means, read as a label is (core.labels: '02', '+2' and '2.0' are the class 2, text is
        trimmed and NFC), or None."""
        if name in by_text:
            return by_text[name]
        try:
            value = plain(code_labels([name], lambda i: "--holdout-classes", "a class")[0])
        except TinyprotoError:
            return None
        return by_value.get((type(value), value))

    found = {n: named(n) for n in names}
    missing = [n for n in names if found[n] is None]
    if missing:
        raise TinyprotoError(f"--holdout-classes: no class {missing[0]!r} in the data (classes: "
                             f"{', '.join(str(c) for c in known)[:200]})")
    chosen = list(dict.fromkeys(found[n] for n in names))
    if len(known) - len(chosen) < 2:
        raise TinyprotoError("--holdout-classes must leave at least two classes to train on")
    return chosen


def held_out_classes(text: str, labels) -> list:
    """parse_classes against the distinct values of `labels` (in the order their text sorts)."""
    return parse_classes(text, sorted(set(np.asarray(labels).tolist()), key=str))


# --- the figures -------------------------------------------------------------------------------------------------

def reliability_bins(confidence: np.ndarray, correct: np.ndarray) -> list[tuple[int, float, float]]:
    """The reliability diagram's points: per non-empty bin of ECE_BINS equal-width bins of confidence,
    (rows, mean confidence, accuracy), confidence as a share (byte / 255)."""
    conf = np.asarray(confidence, dtype=np.float64) / 255.0
    correct = np.asarray(correct, dtype=np.float64)
    bins = np.minimum((conf * ECE_BINS).astype(np.int64), ECE_BINS - 1)
    out = []
    for k in range(ECE_BINS):
        inside = bins == k
        if inside.any():
            out.append((int(inside.sum()), float(conf[inside].mean()), float(correct[inside].mean())))
    return out


def expected_calibration_error(confidence: np.ndarray, correct: np.ndarray) -> float:
    """Σ over ECE_BINS equal-width bins of (rows in bin / rows) * |accuracy - mean confidence|, in [0, 1]."""
    n = len(np.asarray(confidence))
    if n == 0:
        return 0.0
    return float(sum(rows / n * abs(accuracy - mean) for rows, mean, accuracy in reliability_bins(confidence, correct)))


def risk_coverage(confidence: np.ndarray, correct: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The risk-coverage curve of answering only rows whose confidence byte is at least a threshold, for every
    threshold the byte takes (highest first): (coverage: share of rows answered, risk: share of the answered rows
    classified wrongly). Rows of one byte value are answered or declined together, as a device threshold would."""
    conf = np.asarray(confidence, dtype=np.int64)
    correct = np.asarray(correct, dtype=bool)
    if len(conf) == 0:
        return np.zeros(0), np.zeros(0)
    values = np.unique(conf)[::-1]
    answered = np.array([(conf >= v).sum() for v in values], dtype=np.float64)
    wrong = np.array([(~correct & (conf >= v)).sum() for v in values], dtype=np.float64)
    return answered / len(conf), wrong / answered


def auroc(positive: np.ndarray, negative: np.ndarray) -> float | None:
    """P(a positive's score > a negative's), ties counted half (the Mann-Whitney statistic); None if a side is
    empty."""
    pos = np.asarray(positive, dtype=np.float64)
    neg = np.asarray(negative, dtype=np.float64)
    if len(pos) == 0 or len(neg) == 0:
        return None
    both = np.concatenate([pos, neg])
    order = np.argsort(both, kind="mergesort")
    ranks = np.empty(len(both))
    sorted_values = both[order]
    i = 0
    while i < len(both):  # average ranks over ties
        j = i
        while j + 1 < len(both) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return float((ranks[:len(pos)].sum() - len(pos) * (len(pos) + 1) / 2.0) / (len(pos) * len(neg)))


def judged_figures(confidence: np.ndarray, decided: np.ndarray, labels: np.ndarray, y: np.ndarray,
                   known: np.ndarray | None = None) -> dict:
    """report.json's / validation.json's figures of judged answers: coverage (share of known rows accepted),
    accuracy on the accepted known rows, expected calibration error (known rows), mean confidence."""
    labels, y, decided = (np.asarray(v, dtype=np.int64) for v in (labels, y, decided))
    known = np.ones(len(y), dtype=bool) if known is None else np.asarray(known, dtype=bool)
    correct = (labels == y) & known
    accepted = (decided != UNKNOWN_LABEL) & known
    n_known = int(known.sum())
    return {
        "coverage": float(accepted.sum() / n_known) if n_known else None,
        "accepted_accuracy": float(correct[accepted].mean()) if accepted.any() else None,
        "accuracy": float(correct[known].mean()) if n_known else None,
        "ece": expected_calibration_error(np.asarray(confidence)[known], correct[known]),
        "ece_bins": ECE_BINS,
        "mean_confidence": float(np.mean(np.asarray(confidence)[known]) / 255.0) if n_known else None,
    }


__all__ = ["CLIP_SIDES", "Calibration", "DOUBT_HALVINGS", "UNKNOWN_LABEL", "auroc", "clip_counts", "clipped_rows",
           "confidence_bytes", "decline_threshold", "expected_calibration_error", "fit_clip_check", "fit_doubt",
           "halvings", "judge_score_byte", "judged_figures", "margins", "nearest_threshold", "novelty",
           "parse_classes", "parse_rate", "rate_beside", "reliability_bins", "risk_coverage", "score_view",
           "view_threshold", "whole_bins", "winner_and_runner_up"]
