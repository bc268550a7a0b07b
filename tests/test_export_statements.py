"""What the exported Arduino library says about its model is true for every family on every board: the score rule,
reentrancy and static state come from the family's declared facts (tests/test_family_facts.py checks those
against the runtime), every time from the board's own clock."""

from __future__ import annotations

import re

import pytest

from tinyproto import families
from tinyproto.core.boards import available_boards, load_board
from tinyproto.core.modeldir import load_model_dir
from tinyproto.pipeline.arduino import (
    QUANTIZE_CYCLES_PER_FEATURE,
    export_arduino,
    library_header,
)
from tinyproto.pipeline.compile import CompileOptions, compile_model

BOARDS = available_boards()  # what `tinyproto boards` lists


def flat(text: str) -> str:
    """The header's comment as one line of words (the template wraps long sentences)."""
    return " ".join(re.sub(r"^\s*\*\s?", "", line) for line in text.splitlines()).replace("  ", " ")


def check_statements(header: str, model_dir, model, board) -> None:
    fam = families.family_of(model)
    state = fam.static_state(model)
    text = re.sub(r"\s+", " ", flat(header))
    # which score wins, and what a score is: this family's, and no other family's
    assert f"A score is {fam.score.meaning}; the {fam.score.wins.upper()} score wins" in text
    for other in families.names():
        if other != fam.name:
            assert families.family(other).title not in text, other
            assert families.family(other).score.meaning not in text, other
    # reentrancy and static state
    assert ("NOT reentrant" in text) == (not state.reentrant)
    assert ("Reentrant:" in text) == state.reentrant
    if state.nbytes:
        assert f"Static SRAM (.bss, {state.nbytes} B," in text
        for item in state.items:
            assert re.search(rf"{re.escape(item.name)} +{item.nbytes} B", text), item
    else:
        assert "Static SRAM: none." in text and "keeps no static state" in text
    if not state.reentrant:
        assert f"keeps {sum(i.nbytes for i in state.predict)} B of static state" in text
    assert ("Streaming input (TP_STREAMABLE 1)" in text) == bool(model.defines().get("TP_STREAMABLE", 0))
    # every time at this board's clock
    cycles = int(load_model_dir(model_dir).report["predicted_cycles"]["total"])
    found = re.search(r"Cost: about (\d+) cycles = ([\d.]+) ms at ([\d.]+) MHz on the (.+?) "
                      r"\(tinyproto's cost model", text)
    assert found, text
    assert int(found[1]) == cycles
    assert float(found[2]) == round(cycles * 1000.0 / board.f_cpu_hz, 2)
    assert float(found[3]) * 1e6 == board.f_cpu_hz and found[4] == board.title
    per_feature = re.search(r"about 1,020 cycles \((\d+) us at ([\d.]+) MHz\) per feature, so about (\d+) cycles = "
                            r"([\d.]+) ms", text)
    assert per_feature, text
    assert int(per_feature[1]) == round(QUANTIZE_CYCLES_PER_FEATURE * 1e6 / board.f_cpu_hz)
    assert float(per_feature[2]) * 1e6 == board.f_cpu_hz
    assert int(per_feature[3]) == QUANTIZE_CYCLES_PER_FEATURE * model.n_features
    assert float(per_feature[4]) == round(int(per_feature[3]) * 1000.0 / board.f_cpu_hz, 2)
    assert "16 MHz" not in text or board.f_cpu_hz == 16_000_000


@pytest.mark.parametrize("name", families.names())
def test_every_statement_holds_for_every_family_on_every_board(compiled, name):
    model_dir = compiled("iris", "1kB", name)
    model = families.load_int_model(load_model_dir(model_dir))
    assert len(BOARDS) >= 5
    for board_name in BOARDS:
        board = load_board(board_name)
        check_statements(library_header(load_model_dir(model_dir), model, "TinyprotoIris", board), model_dir,
                         model, board)


def test_the_export_states_the_clock_of_the_board_the_model_was_compiled_for(tmp_path):
    """End to end: a model compiled for the 8 MHz Pro Mini exports a library whose times are at 8 MHz."""
    board = load_board("pro_mini_3v3")
    assert board.f_cpu_hz == 8_000_000
    model_dir = compile_model("iris", CompileOptions("bloom", "1kB", 0, board.name, tmp_path / "model")).out_dir
    result = export_arduino(model_dir, tmp_path / "export")
    header = (result.library_dir / "src" / f"{result.name}.h").read_text()
    model = families.load_int_model(load_model_dir(model_dir))
    check_statements(header, model_dir, model, board)
    assert "at 8 MHz" in header
    properties = (result.library_dir / "library.properties").read_text()
    assert f"A {families.family_of(model).title} classifier" in properties
