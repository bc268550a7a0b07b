"""`--model auto`'s rule: which family to ship, from every family's validated int8 accuracy on the same folds.

A validated accuracy is a mean over a finite number of rows, so two families whose accuracies differ by less than
that mean's noise are not told apart by the yardstick: which one validates higher changes with the draw of the
folds (`--seed`), and so would the pick. The rule is the one-standard-error rule: every family within one
standard error of the best validated accuracy is tied with it, and among the tied the model that costs least on
the device ships (fewer predicted cycles, then fewer bytes, then registry order). A family ahead by more than
the noise is picked on its accuracy alone.

The standard error of the difference between the best accuracy a and another family's b is taken as for two
independent means over the n distinct rows validated, sqrt((a (1 - a) + b (1 - b)) / n). The families are scored
on the same rows, so their errors are positively correlated and the true error of the difference is smaller:
the rule errs on the side of calling a difference a tie. Rows validated again in another draw of the folds are
counted once (the draws reuse the rows). Layer: families.
"""

from __future__ import annotations

import math

RULE = ("the best validated int8 accuracy, every family on the same folds of the same rows; the families within one "
        "standard error of the best (sqrt((a(1-a) + b(1-b)) / n), n the distinct rows validated) are tied with it, "
        "and among those the fewest predicted cycles, then the fewest bytes, wins; spread: the standard deviation "
        "of each family's accuracy over the validation parts")


def difference_noise(best: float, other: float, n_rows: int) -> float:
    """One standard error of best - other, two accuracies each a mean over the same n_rows validated rows."""
    if n_rows <= 0:
        return 0.0
    return math.sqrt((best * (1.0 - best) + other * (1.0 - other)) / n_rows)


def tied_with_best(rows: list[dict], n_rows: int) -> list[dict]:
    """The rows (each with "val_int8_accuracy") within one standard error of the best one, the best included."""
    best = max(row["val_int8_accuracy"] for row in rows)
    return [row for row in rows
            if best - row["val_int8_accuracy"] <= difference_noise(best, row["val_int8_accuracy"], n_rows)]


def choose(rows: list[dict], n_rows: int) -> dict:
    """The row auto ships: among the rows tied with the best validated accuracy, the fewest predicted cycles, then
    the fewest model bytes, then the first in registry order (rows are given in that order)."""
    tied = tied_with_best(rows, n_rows)
    return min(tied, key=lambda row: (row["predicted_cycles"], row["model_bytes"]))


__all__ = ["RULE", "choose", "difference_noise", "tied_with_best"]
