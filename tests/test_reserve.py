"""Budgets beside the user's code: compile --reserve-sram / --reserve-flash measure the model's library by building
it and refuse, in one line, a model that does not fit what the user's sketch leaves; a model that fits really runs
beside a sketch that uses that much (built with the Arduino IDE's builder, run on the simulated Uno)."""

from __future__ import annotations

import re
import shutil

import numpy as np
import pytest

from tinyproto import families
from tinyproto.core.boards import load_board
from tinyproto.core.budget import parse_budget
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.modeldir import load_model_dir
from tinyproto.pipeline.compile import Reserve, beside_sketch

from arduino_builder import ARDUINO_HARDWARE
from beside_sketch import ANSWER, build, run_lines, size_own_sketch, sram_used
from helpers import needs, refused

SRAM_RESERVE, FLASH_RESERVE = 1200, 20 * 1024  # the goal: beside a sketch using 1,200 B of SRAM and 20 kB of flash

needs_arduino = pytest.mark.skipif(
    shutil.which("arduino-builder") is None or not (ARDUINO_HARDWARE / "arduino" / "avr").is_dir(),
    reason="arduino-builder / arduino-core-avr not installed (apt-get install arduino-builder arduino-core-avr)")


def test_reserves_read_like_budgets():
    assert Reserve.parse("1.2kB", "20kB") == Reserve(1228, 20480)
    assert Reserve.parse(None, None) == Reserve(0, 0) and not Reserve.parse(None, None).given
    with pytest.raises(TinyprotoError, match="--reserve-sram 'lots' is not a size"):
        Reserve.parse("lots", None)
    assert parse_budget("2kB") == 2048  # the budget's own messages are unchanged


def test_an_unreadable_reserve_is_refused_in_one_line_before_training(work):
    refused(["compile", "iris", "--budget", "1kB", "--reserve-flash", "20 parsecs"], "--reserve-flash", work)


@pytest.mark.parametrize("option,whole", [("--reserve-flash", "32256"), ("--reserve-flash", "40kB"),
                                          ("--reserve-sram", "2048"), ("--reserve-sram", "3kB")])
def test_a_reserve_of_the_whole_board_is_refused_before_training(work, option, whole):
    message = refused(["compile", "iris", "--budget", "1kB", option, whole], "leaves nothing for the model", work)
    assert "Arduino Uno" in message


def digits_model(compiled):
    model_dir = compiled("digits", "2kB")
    return model_dir, families.load_int_model(load_model_dir(model_dir))


@pytest.mark.device
@needs("avr-gcc")
def test_a_model_that_does_not_fit_beside_the_sketch_is_refused_naming_what_and_by_how_much(compiled):
    _, model = digits_model(compiled)
    board = load_board("uno")
    with pytest.raises(TinyprotoError) as refusal:
        beside_sketch(model, board, Reserve(1900, 30 * 1024))
    message = str(refusal.value)
    assert "\n" not in message
    flash = re.search(r"flash: the model's runtime and data need (\d+) B, (\d+) B more than the (\d+) B", message)
    sram = re.search(r"SRAM: the model needs (\d+) B .*?, (\d+) B more than the (\d+) B", message)
    assert flash and sram, message
    assert int(flash.group(3)) == board.flash_bytes_for_sketch - 30 * 1024
    assert int(flash.group(1)) - int(flash.group(3)) == int(flash.group(2))
    assert int(sram.group(3)) == board.sram_bytes - 1900
    assert int(sram.group(1)) - int(sram.group(3)) == int(sram.group(2))
    with pytest.raises(TinyprotoError, match="SRAM: .*--reserve-sram 2000 leaves") as only_sram:
        beside_sketch(model, board, Reserve(2000, 0))
    assert "flash:" not in str(only_sram.value)


@pytest.mark.device
@needs("avr-gcc")
def test_the_export_states_the_librarys_own_flash_and_sram_measured_by_building_it(compiled, tmp_path, monkeypatch):
    from tinyproto.device.library_cost import measure_library
    from tinyproto.pipeline.arduino import export_arduino

    model_dir, model = digits_model(compiled)
    cost = measure_library(model, load_board("uno"))
    assert cost.flash_bytes > sum(a.nbytes for a in model.carrays())  # the code too, not only the model's data
    assert cost.caller_bytes == 5 * model.n_features + 4 * model.n_classes
    export = export_arduino(model_dir, tmp_path / "export")
    header = " ".join((export.library_dir / "src" / f"{export.name}.h").read_text().replace(" * ", " ").split())
    assert (f"{cost.flash_bytes} B of flash" in header and f"{cost.static_sram_bytes} B of static SRAM" in header
            and f"at most {cost.stack_bound_bytes} B of stack" in header and f"{cost.sram_bytes} B of SRAM" in header)
    monkeypatch.setattr(shutil, "which", lambda name: None)  # no avr-gcc: the header says so, nothing invented
    export = export_arduino(model_dir, tmp_path / "without")
    header = (export.library_dir / "src" / f"{export.name}.h").read_text()
    assert "was not measured (avr-gcc was not installed" in header and "B of flash (runtime" not in header


# ------------------------------------------------------------------------------------------------ a real sketch


@pytest.mark.device
@pytest.mark.slow
@needs_arduino
@needs("avr-gcc")
def test_a_model_that_fits_runs_beside_a_sketch_using_what_was_reserved(compiled, tmp_path):
    """The goal's case: digits under 2 kB with 1,200 B of SRAM and 20 kB of flash reserved. A sketch of its own
    is sized to use exactly that (its flash; its globals plus its measured stack), then the model is added: every
    score is the host's, the flash fits the board and the free SRAM the stack never reached is at least what compile
    said would be left (its stack figure is a bound, not a guess)."""
    from tinyproto.pipeline.arduino import export_arduino

    model_dir, model = digits_model(compiled)
    vectors = load_model_dir(model_dir).vectors()
    lines = [" ".join(str(np.float32(v)) for v in row) for row in vectors.X_raw[:10]]
    beside = beside_sketch(model, load_board("uno"), Reserve(SRAM_RESERVE, FLASH_RESERVE))
    export = export_arduino(model_dir, tmp_path / "export")
    sram, flash, own, used_alone = size_own_sketch(tmp_path, export.out_dir, lines, SRAM_RESERVE, FLASH_RESERVE)
    assert FLASH_RESERVE - 8 <= own.flash_bytes <= FLASH_RESERVE, own
    assert SRAM_RESERVE - 8 <= used_alone <= SRAM_RESERVE, used_alone

    elf, both = build(tmp_path, "Beside", export.out_dir, sram, flash, with_model=True)
    assert both.flash_bytes <= load_board("uno").flash_bytes_for_sketch
    assert both.flash_bytes - own.flash_bytes <= beside["library"]["flash_bytes"]
    answers = run_lines(elf, lines)
    for i, answer in enumerate(answers):
        numbers = [int(v) for v in ANSWER.match(answer).group(1).split()]
        assert numbers[0] == int(vectors.labels[i]) and numbers[1:] == vectors.scores[i].tolist(), (i, answer)
    free = min(2048 - sram_used(a) for a in answers)
    assert free >= beside["sram_left_bytes"] >= 0, (free, beside)
