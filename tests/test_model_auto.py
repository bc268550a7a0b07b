"""`--model auto`: every registered family under the same budget; the best validated int8 accuracy is kept."""

from __future__ import annotations

import json

import pytest

from tinyproto import families
from tinyproto.core.errors import TinyprotoError
from tinyproto.pipeline.compile import compile_model


def test_auto_keeps_the_family_with_the_best_validated_accuracy(tmp_path):
    result = compile_model("iris", families.AUTO, "1kB", 0, out=tmp_path / "auto")
    auto = result.report["auto"]
    assert [row["family"] for row in auto["families"]] == list(families.names())
    fitted = [row for row in auto["families"] if "refused" not in row]
    best = max(row["val_int8_accuracy"] for row in fitted)
    chosen = next(row for row in fitted if row["family"] == auto["chosen"])
    assert chosen["val_int8_accuracy"] == best
    tied = [row for row in fitted if row["val_int8_accuracy"] == best]
    assert chosen["predicted_cycles"] == min(row["predicted_cycles"] for row in tied)
    meta = json.loads((tmp_path / "auto" / "model.json").read_text())
    assert meta["family"] == auto["chosen"] == result.report["model"]
    assert all(row["model_bytes"] <= 1024 for row in fitted)


def test_auto_refuses_in_one_message_when_no_family_fits(tmp_path):
    with pytest.raises(TinyprotoError, match="no model family fits: protonn: .*needs"):
        compile_model("iris", families.AUTO, "8B", 0, out=tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_auto_is_not_learnable(tmp_path):
    with pytest.raises(TinyprotoError, match="--learnable is for --model flynn"):
        compile_model("iris", families.AUTO, "1kB", 0, out=tmp_path / "x", learnable=True)
