"""`--model auto`: every registered family under the same budget; the best validated int8 accuracy is kept."""

from __future__ import annotations

import json

import pytest

from tinyproto import families
from tinyproto.families import choosing
from tinyproto.core.errors import TinyprotoError
from tinyproto.pipeline.compile import CompileOptions, compile_model


def test_auto_keeps_the_cheapest_family_within_one_standard_error_of_the_best(tmp_path):
    result = compile_model("iris", CompileOptions(families.AUTO, "1kB", 0, out=tmp_path / "auto"))
    auto = result.report["auto"]
    assert [row["family"] for row in auto["families"]] == list(families.names())
    fitted = [row for row in auto["families"] if "refused" not in row]
    best = max(row["val_int8_accuracy"] for row in fitted)
    n_rows = auto["validated_rows"]
    assert 0 < n_rows <= result.report["n_train"]
    tied = [row for row in fitted
            if best - row["val_int8_accuracy"] <= choosing.difference_noise(best, row["val_int8_accuracy"], n_rows)]
    assert auto["tied_with_best"] == [row["family"] for row in tied]
    chosen = next(row for row in fitted if row["family"] == auto["chosen"])
    assert chosen in tied
    assert chosen["predicted_cycles"] == min(row["predicted_cycles"] for row in tied)
    meta = json.loads((tmp_path / "auto" / "model.json").read_text())
    assert meta["family"] == auto["chosen"] == result.report["model"]
    assert all(row["model_bytes"] <= 1024 for row in fitted)


def test_the_one_standard_error_rule():
    rows = [{"family": "a", "val_int8_accuracy": 0.95, "predicted_cycles": 9000, "model_bytes": 900},
            {"family": "b", "val_int8_accuracy": 0.94, "predicted_cycles": 3000, "model_bytes": 900},
            {"family": "c", "val_int8_accuracy": 0.90, "predicted_cycles": 1000, "model_bytes": 100}]
    # 1,000 rows: one standard error of 0.95 - 0.94 is 1.0 point, of 0.95 - 0.90 1.2 points
    assert [r["family"] for r in choosing.tied_with_best(rows, 1000)] == ["a", "b"]
    assert choosing.choose(rows, 1000)["family"] == "b"
    # 100,000 rows: 0.1 point; the best is ahead of the others by more than their noise
    assert choosing.choose(rows, 100_000)["family"] == "a"
    # equal cycles: the fewer bytes, then the first in order
    rows[1]["predicted_cycles"] = 9000
    assert choosing.choose(rows, 1000)["family"] == "a"
    rows[1]["model_bytes"] = 800
    assert choosing.choose(rows, 1000)["family"] == "b"


def test_auto_refuses_in_one_message_when_no_family_fits(tmp_path):
    with pytest.raises(TinyprotoError, match="no model family fits: protonn: .*needs"):
        compile_model("iris", CompileOptions(families.AUTO, "8B", 0, out=tmp_path / "none"))
    assert not (tmp_path / "none").exists()


def test_auto_is_not_learnable(tmp_path):
    with pytest.raises(TinyprotoError, match="--learnable is for --model flynn"):
        compile_model("iris", CompileOptions(families.AUTO, "1kB", 0, out=tmp_path / "x", learnable=True))


def test_the_auto_table_prints_each_refusal_whole():
    """A family's refusal is a sentence the user acts on: printed whole under the table, markup-like brackets
    included (it was cut to 60 characters inside the cycles column)."""
    from rich.console import Console

    from tinyproto.cli.tables import _print_auto

    reason = ("no FlyNN's buffers fit the board's SRAM: the device app with 2100 int8 inputs already needs 428 B "
              "more than it has (the smallest need 42 B); use fewer features or a family that streams its input [x]")
    report = {"auto": {"chosen": "bnc", "selection": "the best validated int8 accuracy",
                       "families": [{"family": "flynn", "refused": reason},
                                    {"family": "bnc", "val_int8_accuracy": 0.9, "model_bytes": 2000,
                                     "predicted_cycles": 7000}]}}
    console = Console(record=True, width=100)
    _print_auto(console, report)
    text = " ".join(console.export_text().split())
    assert f"flynn refused: {reason}" in text
