"""The serial line's speed per board: the fastest rate the clock divides exactly (the USB bridges' side is stated
in each board file), a fallback within the UART's tolerance, and `--baud` refusing a rate the clock cannot make."""

from __future__ import annotations

import pytest

from tinyproto.core.boards import available_boards, baud_error, load_board, ubrr_of
from tinyproto.core.errors import TinyprotoError


@pytest.mark.parametrize("name", available_boards())
def test_each_board_talks_at_an_exact_rate_and_says_why(name):
    board = load_board(name)
    assert baud_error(board.f_cpu_hz, board.serial_baud) == 0.0
    assert board.serial_baud >= 500_000 and board.serial_baud_fallback < board.serial_baud
    assert abs(baud_error(board.f_cpu_hz, board.serial_baud_fallback)) < 0.025
    assert "exact" in board.serial_baud_source and "upload" in board.serial_baud_source.lower()
    # at least 160 cycles per byte: the receive interrupt and the frame decoding must keep up
    assert board.f_cpu_hz // (board.serial_baud // 10) >= 160


def test_the_divisors_of_the_fast_rates():
    assert ubrr_of(16_000_000, 1_000_000) == 1 and ubrr_of(16_000_000, 500_000) == 3
    assert ubrr_of(8_000_000, 500_000) == 1 and ubrr_of(16_000_000, 115_200) == 16
    assert baud_error(16_000_000, 115_200) == pytest.approx(0.0212, abs=1e-4)


def test_with_baud_falls_back_or_refuses_in_one_line():
    uno = load_board("uno")
    assert uno.with_baud(None) is uno and uno.with_baud(115200).serial_baud == 115200
    with pytest.raises(TinyprotoError) as info:
        load_board("pro_mini_3v3").with_baud(115200)  # -3.5 % at 8 MHz
    assert "\n" not in str(info.value) and "-3.5 %" in str(info.value)


@pytest.mark.parametrize("baud", [1, 7, 300, 488])
def test_a_rate_below_what_the_12_bit_divisor_reaches_is_refused(baud):
    """The nearest divisor of these rates is exact on paper but does not fit UBRR's 12 bits."""
    with pytest.raises(TinyprotoError, match="too slow for the USART at 16 MHz"):
        load_board("uno").with_baud(baud)
    assert load_board("uno").with_baud(489).serial_baud == 489


@pytest.mark.parametrize("baud", [2_000_001, 4_000_000, 99_999_999_999])
def test_a_rate_above_what_the_clock_reaches_is_called_too_fast(baud):
    """A rate past f_cpu / 8 (the divisor at 0 with U2X) was "-100.0 % off", which said nothing of being too fast."""
    with pytest.raises(TinyprotoError, match="too fast for the USART at 16 MHz \\(2000000 baud at the most\\)"):
        load_board("uno").with_baud(baud)
    assert load_board("uno").with_baud(2_000_000).serial_baud == 2_000_000


def test_a_board_silent_at_the_fast_rate_is_told_the_fallback_in_one_line():
    from tinyproto.pipeline.validate import BuildInfo, line_baud, no_answer_hint

    uno = load_board("uno")
    silent = TinyprotoError("no answer from the device on /dev/ttyACM0 after 40 tries")
    hint = no_answer_hint(silent, uno, 1_000_000, "/dev/ttyACM0")
    assert "\n" not in str(hint) and "--baud 115200" in str(hint) and "1000000 baud" in str(hint)
    assert no_answer_hint(silent, uno, 115200, "/dev/ttyACM0") is silent  # nothing slower to fall back to
    from tinyproto.device.codec import DeviceSilent

    echoed = DeviceSilent("no answer from the device on loop:// after 4 tries: the line echoes the requests sent",
                          speed_may_help=False)
    assert no_answer_hint(echoed, uno, 1_000_000, "loop://") is echoed  # was replaced by the baud hint
    missing = TinyprotoError("serial port /dev/ttyACM9 does not exist — is the Uno plugged in?")
    assert no_answer_hint(missing, uno, 1_000_000, "/dev/ttyACM9") is missing  # not a question of speed
    build = BuildInfo(*[None] * 7, serial_baud=115200)
    assert line_baud(uno, build, None) == 115200  # the rate the firmware was built for, not the board's default
    with pytest.raises(TinyprotoError) as info:
        line_baud(uno, build, 1_000_000)
    assert "\n" not in str(info.value) and "--baud 1000000" in str(info.value)


@pytest.mark.parametrize("baud, words", [(3, "too slow"), (10**23, "too fast"), (300000, "% off")])
def test_validate_refuses_a_rate_the_board_cannot_make_rather_than_suggesting_a_build_at_it(baud, words):
    """`validate --baud 3` said "build it for 3 first (compile --baud 3 ...)", which compile then refuses."""
    from tinyproto.pipeline.validate import BuildInfo, line_baud

    with pytest.raises(TinyprotoError, match=words) as info:
        line_baud(load_board("uno"), BuildInfo(*[None] * 7, serial_baud=1_000_000), baud)
    assert "build it for" not in str(info.value)
