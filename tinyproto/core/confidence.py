"""Confidence and "unknown": the integer signals read from a score vector, their calibration, and the figures that
judge them (expected calibration error, AUROC, coverage).

Every family's device computes, after its scores, two integers from the winning score and the runner-up
(firmware/tp_judge.c does exactly what `signals` does here):

- the margin bin: |winner - runner-up| / (|winner| + |runner-up| + 1), a scale-free share in [0, 1), cut into
  CONFIDENCE_BINS equal bins by a short integer division (no library call, nothing wider than 32 bits). The confidence byte is a flash table indexed by the bin: the share of
  cross-validated rows of that bin the model classified correctly (isotonic, so a larger margin is never less
  sure), times 255.
- the novelty: how bad the winning score is (minus it when the highest score wins, the score itself when the
  lowest wins). With a decline threshold the device answers UNKNOWN_LABEL when the novelty exceeds it.

The calibration is fitted on rows the model did not train on (cross-validation: see families/judging.py), so the
byte means what it says: among rows given confidence c, about c/255 are classified correctly.
Layer: core.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinyproto.core.carray import CArray
from tinyproto.core.errors import TinyprotoError

CONFIDENCE_BINS = 16  # the margin share's bins: 16 bytes of flash
BIN_BITS = 4  # CONFIDENCE_BINS == 1 << BIN_BITS: the device's division makes BIN_BITS quotient bits
UNKNOWN_LABEL = 255  # the label the device answers for a declined input (never a class: at most 255 classes)
ECE_BINS = 10  # expected calibration error: ten equal-width bins of confidence
MAX_UNKNOWN_RATE = 0.5
# Every score within +-NARROW_SCORE_MAX: |winner| + |runner-up| + 1 < 65535, so tp_judge computes the margin in
# 16 bits (TP_JUDGE_SCORE_BITS 16) with the 32-bit result bit for bit, in about 100 B less AVR code. Two short of
# the int16 range: the decline limit, clamped to +-(bound + 1), then stays strictly inside it, so the compiler
# never sees a compare with a constant answer (-Wtype-limits is an error in the build).
NARROW_SCORE_MAX = 2**15 - 3

assert CONFIDENCE_BINS == 1 << BIN_BITS


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


def margin_bins(winner: np.ndarray, runner: np.ndarray) -> np.ndarray:
    """The margin share's bin (0 .. CONFIDENCE_BINS-1) per row, exactly as tp_judge.c computes it: uint32
    arithmetic (modulo 2^32), BIN_BITS steps of restoring division of |winner - runner| by |winner| + |runner| + 1,
    each step comparing m with den - m (never forming 2m, which could need a 33rd bit)."""
    mask = np.int64(0xFFFFFFFF)
    winner = np.asarray(winner, dtype=np.int64)
    runner = np.asarray(runner, dtype=np.int64)
    m = np.abs(winner - runner) & mask
    den = (np.abs(winner) + np.abs(runner) + 1) & mask
    q = np.zeros(len(m), dtype=np.int64)
    for _ in range(BIN_BITS):
        rest = (den - m) & mask
        take = m >= rest
        q = (q << 1) | take
        m = np.where(take, (m - rest) & mask, (m + m) & mask)
    return q


def novelty(winner: np.ndarray, lowest_wins: bool) -> np.ndarray:
    """How unlike the training rows an input is, from its winning score: larger is more novel."""
    winner = np.asarray(winner, dtype=np.int64)
    return winner if lowest_wins else -winner


def isotonic_table(bins: np.ndarray, correct: np.ndarray) -> np.ndarray:
    """Per margin bin, the share of rows classified correctly, made non-decreasing (pool adjacent violators,
    weighted by rows), as a byte 0..255. A bin no row fell in takes its neighbours' pooled value."""
    counts = np.bincount(bins, minlength=CONFIDENCE_BINS).astype(np.float64)
    hits = np.bincount(bins, weights=np.asarray(correct, dtype=np.float64), minlength=CONFIDENCE_BINS)
    blocks: list[list[float]] = []  # [hits, rows, first bin, last bin]
    for k in range(CONFIDENCE_BINS):
        if counts[k] == 0:
            continue
        blocks.append([hits[k], counts[k], k, k])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            h, n, _, last = blocks.pop()
            blocks[-1][0] += h
            blocks[-1][1] += n
            blocks[-1][3] = last
    share = np.zeros(CONFIDENCE_BINS)
    if not blocks:
        return np.zeros(CONFIDENCE_BINS, dtype=np.uint8)
    for h, n, first, last in blocks:
        share[int(first):int(last) + 1] = h / n
    # empty bins: below the first block its value, between blocks the lower block's (kept monotone), above the last
    filled = np.zeros(CONFIDENCE_BINS, dtype=bool)
    for _, _, first, last in blocks:
        filled[int(first):int(last) + 1] = True
    value = blocks[0][0] / blocks[0][1]
    for k in range(CONFIDENCE_BINS):
        if filled[k]:
            value = share[k]
        else:
            share[k] = value
    return np.clip(np.rint(255.0 * share), 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class Calibration:
    """What the device needs to judge its own answer: the confidence table, and the decline threshold (None:
    the model never answers unknown, and its header and code are those of a model without the option)."""

    table: np.ndarray  # uint8 (CONFIDENCE_BINS,)
    lowest_wins: bool
    unknown_above: int | None = None  # novelty > this: UNKNOWN_LABEL
    unknown_rate: float | None = None  # the share of known rows the threshold was fitted to decline

    def carray(self) -> CArray:
        return CArray("confidence", "uint8_t", np.asarray(self.table, dtype=np.uint8),
                      f"confidence byte per margin bin ({CONFIDENCE_BINS} bins, fitted on cross-validated rows)")

    def defines(self, score_bound: int | None = None) -> dict[str, int]:
        """The header's lines of the confidence stage; score_bound: the largest |score| the model can give (the
        family's proof), None when it gives none."""
        out = {"TP_CONFIDENCE_BINS": CONFIDENCE_BINS, "TP_SCORE_LOWEST_WINS": int(self.lowest_wins),
               "TP_JUDGE_SCORE_BITS": judge_score_bits(score_bound)}
        if self.unknown_above is not None:
            # the device compares the winning score itself: the novelty is minus it when the highest wins
            limit = self.unknown_above if self.lowest_wins else -self.unknown_above
            if out["TP_JUDGE_SCORE_BITS"] == 16:
                # beyond every score the limit answers alike for any value out there: the nearest one in 16 bits
                limit = min(max(limit, -(score_bound + 1)), score_bound + 1)
            out["TP_UNKNOWN_LABEL"] = UNKNOWN_LABEL
            out["TP_UNKNOWN_LIMIT"] = int(limit)
        return out

    def judge(self, scores: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(confidence byte, decided label) per row: the host reference of tp_judge()."""
        labels = np.asarray(labels, dtype=np.int64)
        winner, runner = winner_and_runner_up(scores, labels, self.lowest_wins)
        confidence = np.asarray(self.table, dtype=np.int64)[margin_bins(winner, runner)]
        decided = labels.copy()
        if self.unknown_above is not None:
            decided[novelty(winner, self.lowest_wins) > self.unknown_above] = UNKNOWN_LABEL
        return confidence, decided

    def to_json(self) -> dict:
        return {"table": [int(v) for v in self.table], "lowest_wins": bool(self.lowest_wins),
                "unknown_above": None if self.unknown_above is None else int(self.unknown_above),
                "unknown_rate": self.unknown_rate}

    @staticmethod
    def from_json(raw: dict) -> Calibration:
        table = np.asarray(raw["table"], dtype=np.int64)
        if table.shape != (CONFIDENCE_BINS,) or table.min() < 0 or table.max() > 255:
            raise TinyprotoError(f"the confidence table must be {CONFIDENCE_BINS} bytes")
        above = raw.get("unknown_above")
        if above is not None and (isinstance(above, bool) or not isinstance(above, int)
                                  or not -(2**31) < above < 2**31):
            raise TinyprotoError("the unknown threshold must be a 32-bit integer")
        rate = raw.get("unknown_rate")
        if not isinstance(raw.get("lowest_wins"), bool):
            raise TinyprotoError("the confidence's lowest_wins must be true or false")
        return Calibration(table.astype(np.uint8), raw["lowest_wins"], above,
                           None if rate is None else float(rate))


def judge_score_bits(score_bound: int | None) -> int:
    """The width tp_judge computes the margin in: 16 when every score is proven within +-NARROW_SCORE_MAX."""
    return 16 if score_bound is not None and 0 <= int(score_bound) <= NARROW_SCORE_MAX else 32


def decline_threshold(novelty_values: np.ndarray, rate: float) -> int:
    """The smallest integer threshold that declines (novelty > threshold) at most `rate` of these rows."""
    values = np.sort(np.asarray(novelty_values, dtype=np.int64))
    n = len(values)
    keep = int(np.ceil((1.0 - rate) * n))  # at least this many rows stay accepted
    if keep <= 0:
        return int(values[0]) - 1
    return int(values[min(keep, n) - 1])


def parse_rate(text: str) -> float:
    """'5%' or '0.05' -> 0.05; one clear error otherwise."""
    raw = str(text).strip()
    try:
        value = float(raw[:-1]) / 100.0 if raw.endswith("%") else float(raw)
    except ValueError:
        raise TinyprotoError(f"--unknown-rate must be a share like 5% or 0.05, not {text!r}") from None
    if not 0.0 < value <= MAX_UNKNOWN_RATE:
        raise TinyprotoError(f"--unknown-rate must be above 0 and at most {100 * MAX_UNKNOWN_RATE:g}%, "
                             f"not {text!r}")
    return value


def parse_classes(text: str, known: list) -> list:
    """'8,9' -> the class values named (as the data set spells them); one clear error otherwise."""
    names = [part.strip() for part in str(text).split(",") if part.strip()]
    if not names:
        raise TinyprotoError("--holdout-classes needs at least one class, e.g. 8,9")
    by_text = {str(c): c for c in known}
    missing = [n for n in names if n not in by_text]
    if missing:
        raise TinyprotoError(f"--holdout-classes: no class {missing[0]!r} in the data (classes: "
                             f"{', '.join(str(c) for c in known)[:200]})")
    chosen = list(dict.fromkeys(by_text[n] for n in names))
    if len(known) - len(chosen) < 2:
        raise TinyprotoError("--holdout-classes must leave at least two classes to train on")
    return chosen


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


__all__ = ["CONFIDENCE_BINS", "Calibration", "UNKNOWN_LABEL", "auroc", "decline_threshold",
           "expected_calibration_error", "isotonic_table", "judge_score_bits", "judged_figures", "margin_bins", "novelty",
           "parse_classes", "parse_rate", "reliability_bins", "risk_coverage", "winner_and_runner_up"]
