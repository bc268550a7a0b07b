"""Boards: every boards/<name>.json compiles, builds and validates the same model bit-exactly on its simulated chip
(simavr's atmega328p, atmega2560 and atmega32u4 cores, at the board's clock), with latency from the clock and energy
from the board's voltage and currents; SRAM and flash limits come from the board file."""

from __future__ import annotations

import configparser
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tinyproto.core.boards import available_boards, load_board
from tinyproto.core.errors import TinyprotoError

from conftest import needs

BOARDS = ["uno", "nano", "pro_mini_3v3", "mega2560", "leonardo"]
needs_sim = [needs("avr-gcc"), pytest.mark.skipif(not os.path.exists("/usr/include/simavr/sim_avr.h"),
                                                  reason="libsimavr-dev not installed")]
pytestmark = needs_sim


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "tinyproto", *args], capture_output=True, text=True, timeout=timeout)


# ---------------------------------------------------------------------------------------------------- board files


def test_boards_command_lists_the_five():
    result = cli("boards")
    assert result.returncode == 0, result.stderr
    listed = [line.split()[0] for line in result.stdout.splitlines()[1:] if line and not line.startswith("sources")]
    assert sorted(listed) == sorted(BOARDS)
    facts = json.loads(cli("boards", "--json").stdout)
    assert {b["name"] for b in facts} == set(BOARDS)


def test_board_files_hold_the_real_boards_facts():
    assert set(BOARDS) <= set(available_boards())
    for name in BOARDS:
        b = load_board(name)
        assert b.mcu in {"atmega328p", "atmega2560", "atmega32u4"}
        assert b.mcu_active_current_source and b.board_active_current_source  # cited
        assert b.voltage_v > 0 and b.sram_bytes >= 2048 and b.flash_bytes_for_sketch > 0 and b.eeprom_bytes >= 1024
    pro = load_board("pro_mini_3v3")
    assert (pro.f_cpu_hz, pro.voltage_v, pro.serial_baud, pro.upload_speed) == (8_000_000, 3.3, 57600, 57600)
    mega = load_board("mega2560")
    assert (mega.sram_bytes, mega.eeprom_bytes, mega.upload_protocol, mega.upload_speed) == (8192, 4096, "wiring", 115200)
    leo = load_board("leonardo")
    assert (leo.mcu, leo.sram_bytes, leo.upload_protocol) == ("atmega32u4", 2560, "avr109")
    assert "Serial1" in leo.serial_port


@pytest.mark.parametrize("baud,f_cpu", [(115200, 16_000_000), (57600, 8_000_000)])
def test_the_serial_speed_of_each_board_is_within_the_uarts_tolerance(baud, f_cpu):
    ubrr = (f_cpu + 4 * baud) // (8 * baud) - 1  # firmware/tp_main.c's TP_UBRR (U2X)
    error = f_cpu / (8 * (ubrr + 1)) / baud - 1
    assert abs(error) < 0.025  # 115200 at 8 MHz would be -3.5 %: why the Pro Mini talks at 57600
    for name in BOARDS:
        b = load_board(name)
        ubrr = (b.f_cpu_hz + 4 * b.serial_baud) // (8 * b.serial_baud) - 1
        assert abs(b.f_cpu_hz / (8 * (ubrr + 1)) / b.serial_baud - 1) < 0.025, name


def test_an_unknown_board_is_one_line_naming_the_known_ones():
    with pytest.raises(TinyprotoError) as info:
        load_board("zx81")
    message = str(info.value)
    assert "\n" not in message and all(name in message for name in BOARDS)
    result = cli("compile", "iris", "--board", "zx81", "--out", os.devnull + "-never")
    assert result.returncode != 0 and result.stderr.strip().count("\n") == 0 and "known boards" in result.stderr


def test_platformio_ini_names_envs_per_board_and_runs_the_boards_chip(tmp_path):
    from tinyproto.device.build import render_platformio_ini

    for name in BOARDS:
        b = load_board(name)
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(render_platformio_ini(b))
        assert parser.get("platformio", "default_envs") == f"{name}_sim"
        assert {f"env:{name}", f"env:{name}_offline", f"env:{name}_sim"} <= set(parser.sections())
        assert parser.get("env", "board") == b.pio_board
        assert parser.get("env", "board_build.mcu") == b.mcu
        assert parser.get("env", "board_build.f_cpu") == f"{b.f_cpu_hz}UL"
        assert f"-DTP_BAUD={b.serial_baud}UL" in parser.get("env", "build_flags")
        test_command = parser.get(f"env:{name}_sim", "test_testing_command").split()
        assert test_command[test_command.index("--mcu") + 1] == b.mcu
        assert test_command[test_command.index("--freq") + 1] == str(b.f_cpu_hz)


# ---------------------------------------------------------------------------------------------- on the simulator


@pytest.fixture(scope="module")
def validated(tmp_path_factory):
    """The same model (iris, ProtoNN, 1 kB, seed 0) compiled, built and validated with --sim for every board."""
    out = {}
    for name in BOARDS:
        model_dir = tmp_path_factory.mktemp(f"iris-{name}") / "model"
        compiled = cli("compile", "iris", "--budget", "1kB", "--board", name, "--out", str(model_dir), "--json")
        assert compiled.returncode == 0, compiled.stderr
        built = cli("build", str(model_dir))
        assert built.returncode == 0, built.stderr
        result = cli("validate", str(model_dir), "--sim", "--json")
        assert result.returncode == 0, result.stderr
        out[name] = (model_dir, json.loads(compiled.stdout), json.loads(result.stdout))
    return out


@pytest.mark.parametrize("name", BOARDS)
def test_the_same_model_validates_bit_exactly_on_every_board(validated, name):
    model_dir, report, v = validated[name]
    board = load_board(name)
    assert v["passed"] and v["board"] == name
    assert v["score_agreement"] == 1.0 and v["label_agreement"] == 1.0 and v["n_vectors"] == report["n_test"]
    assert v["simulator_marker_cycles"]["marker_minus_timer1_min"] == v["simulator_marker_cycles"]["marker_minus_timer1_max"]
    seconds = v["cycles_mean"] / board.f_cpu_hz
    assert v["latency_ms_mean"] == pytest.approx(1000 * seconds)
    assert v["energy_mj_board"] == pytest.approx(board.voltage_v * board.board_active_current_ma * seconds)
    assert v["energy_mj_mcu"] == pytest.approx(board.voltage_v * board.mcu_active_current_ma * seconds)
    assert v["flash_available_bytes"] == board.flash_bytes_for_sketch
    assert v["sram_margin_bytes"] == board.sram_bytes - v["sram_static_bytes"] - v["stack_peak_bytes"]
    build = json.loads((model_dir / "build.json").read_text())
    assert build["env"] == f"{name}_sim"
    meta = json.loads((model_dir / "model.json").read_text())
    assert meta["board"] == name


def test_cycles_follow_the_chip_and_latency_the_clock(validated):
    v = {name: validated[name][2] for name in BOARDS}
    # the same chip runs the same code in the same cycles: the Nano is an Uno; the Pro Mini only has a slower clock
    assert v["nano"]["cycles_mean"] == v["uno"]["cycles_mean"]
    assert v["pro_mini_3v3"]["cycles_mean"] == v["uno"]["cycles_mean"]
    assert v["pro_mini_3v3"]["latency_ms_mean"] == pytest.approx(2 * v["uno"]["latency_ms_mean"])
    # every board gives the same labels and scores (the device equals the host reference everywhere)
    assert len({round(x["device_accuracy"], 9) for x in v.values()}) == 1
    # the other chips run the same C within a few percent (the ATmega2560's 3-byte return addresses cost cycles)
    for name in ("mega2560", "leonardo"):
        assert v[name]["cycles_mean"] == pytest.approx(v["uno"]["cycles_mean"], rel=0.10)


def test_the_uno_env_of_an_existing_project_still_builds(validated):
    from tinyproto.device.build import build_project

    model_dir = validated["uno"][0]
    assert build_project(model_dir, "uno_sim").elf == model_dir.resolve() / ".pio" / "build" / "uno_sim" / "firmware.elf"
    with pytest.raises(TinyprotoError, match="unknown PlatformIO environment 'nano_sim'"):
        build_project(model_dir, "nano_sim")


def test_a_model_too_big_for_the_unos_sram_is_refused_there_and_runs_on_the_mega(tmp_path):
    rng = np.random.default_rng(0)
    n, d = 160, 320  # 320 raw float inputs: a 1.6 kB serial frame, too much beside the buffers on a 2 kB chip
    y = rng.integers(0, 2, n)
    X = rng.normal(size=(n, d)) + y[:, None] * np.linspace(0, 1.5, d)
    data = tmp_path / "wide.npz"
    np.savez(data, X=X.astype(np.float32), y=y)
    refused = cli("compile", str(data), "--budget", "2kB", "--board", "uno", "--out", str(tmp_path / "uno"))
    assert refused.returncode != 0 and "more than the 2048 B of Arduino Uno" in refused.stderr
    mega_dir = tmp_path / "mega"
    accepted = cli("compile", str(data), "--budget", "2kB", "--board", "mega2560", "--out", str(mega_dir))
    assert accepted.returncode == 0, accepted.stderr
    assert cli("build", str(mega_dir)).returncode == 0
    result = cli("validate", str(mega_dir), "--sim", "--json")
    assert result.returncode == 0, result.stderr
    v = json.loads(result.stdout)
    assert v["passed"] and v["score_agreement"] == 1.0 and v["sram_static_bytes"] > 1024  # over the Uno's 1 kB frame cap


def test_the_pro_minis_real_bootloader_takes_the_upload_at_57600_and_8_mhz(validated, tmp_path):
    """The physical board's path on the simulated Pro Mini: avrdude -c arduino -b 57600 into Debian's ATmegaBOOT
    (8 MHz build) on an ATmega328P clocked at 8 MHz, then the protocol at 57600 from the application."""
    from tinyproto.device.board_sim import SimulatedBoard, board_bootloader

    board = load_board("pro_mini_3v3")
    loader = board_bootloader(board)
    assert (loader.protocol, loader.speed, loader.boot_start) == ("arduino", 57600, 0x7800)
    model_dir = validated["pro_mini_3v3"][0]
    with SimulatedBoard(board.mcu, tmp_path / "state", board.f_cpu_hz, bootloader=loader) as sim:
        flashed = cli("flash", str(model_dir), "--port", sim.port, timeout=120)
        assert flashed.returncode == 0, flashed.stderr + flashed.stdout
        result = cli("validate", str(model_dir), "--port", sim.port, "--json", timeout=120)
    assert result.returncode == 0, result.stderr
    v = json.loads(result.stdout)
    assert v["passed"] and v["score_agreement"] == 1.0
    assert v["cycles_mean"] == validated["pro_mini_3v3"][2]["cycles_mean"]  # same chip, same figures as --sim


def test_the_leonardos_upload_is_refused_by_name_but_its_sim_path_works(validated):
    from tinyproto.device.board_sim import board_bootloader

    with pytest.raises(TinyprotoError, match="Caterina.*USB"):
        board_bootloader(load_board("leonardo"))
    assert validated["leonardo"][2]["passed"]


@pytest.mark.parametrize("name", ["pro_mini_3v3", "leonardo"])
def test_pio_test_of_the_board_sim_env_runs_on_the_boards_chip(validated, name):
    """`pio test -e <board>_sim`: the Unity test firmware (USART1 on the ATmega32U4, the board's baud) in simuno with
    the board's --mcu / --freq."""
    from tinyproto.device.build import run_pio_test

    passed, log = run_pio_test(validated[name][0])
    assert passed, log[-2000:]


def test_digits_2kb_through_the_megas_own_bootloader(tmp_path):
    """The physical Mega's path on the simulated ATmega2560: compile digits (ProtoNN, 2 kB) for the Mega, flash
    it with avrdude -c wiring into Debian's stk500v2 bootloader, and validate over the same port, bit-exactly.
    (stk500v2 keeps the chip while it hears bytes: the host stays quiet for the board's boot_quiet_s first.)"""
    from tinyproto.device.board_sim import SimulatedBoard, board_bootloader

    board = load_board("mega2560")
    assert board.boot_quiet_s > 0
    model_dir = tmp_path / "digits-mega"
    compiled = cli("compile", "digits", "--budget", "2kB", "--board", "mega2560", "--out", str(model_dir))
    assert compiled.returncode == 0, compiled.stderr
    assert cli("build", str(model_dir)).returncode == 0
    with SimulatedBoard(board.mcu, tmp_path / "state", board.f_cpu_hz, bootloader=board_bootloader(board)) as sim:
        flashed = cli("flash", str(model_dir), "--port", sim.port, timeout=120)
        assert flashed.returncode == 0, flashed.stderr + flashed.stdout
        result = cli("validate", str(model_dir), "--port", sim.port, "--json", "--no-raw", timeout=300)
    assert result.returncode == 0, result.stderr
    v = json.loads(result.stdout)
    assert v["passed"] and v["score_agreement"] == 1.0 and v["n_vectors"] == 450
