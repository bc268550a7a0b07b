"""Boards: every boards/<name>.json compiles, builds and validates the same model bit-exactly on its simulated chip
(simavr's atmega328p, atmega2560 and atmega32u4 cores, at the board's clock), with latency from the clock and energy
from the board's voltage and currents; SRAM and flash limits come from the board file."""

from __future__ import annotations

import configparser
import json
import os
import select
import shutil
import termios
import threading
from pathlib import Path

import numpy as np
import pytest

from tinyproto.core.boards import available_boards, load_board
from tinyproto.core.errors import TinyprotoError

from helpers import fresh_copy, needs, tinyproto

BOARDS = ["uno", "nano", "pro_mini_3v3", "mega2560", "leonardo"]
needs_sim = [needs("avr-gcc"), pytest.mark.skipif(not os.path.exists("/usr/include/simavr/sim_avr.h"),
                                                  reason="libsimavr-dev not installed")]
pytestmark = needs_sim


def cli(*args, timeout=300):
    return tinyproto(*args, timeout=timeout)


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
    assert (pro.f_cpu_hz, pro.voltage_v, pro.serial_baud, pro.upload_speed) == (8_000_000, 3.3, 500_000, 57600)
    mega = load_board("mega2560")
    assert ((mega.sram_bytes, mega.eeprom_bytes, mega.upload_protocol, mega.upload_speed)
            == (8192, 4096, "wiring", 115200))
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
        ubrr = (b.f_cpu_hz + 4 * b.serial_baud_fallback) // (8 * b.serial_baud_fallback) - 1
        assert abs(b.f_cpu_hz / (8 * (ubrr + 1)) / b.serial_baud_fallback - 1) < 0.025, name


def test_an_unknown_board_is_one_line_naming_the_known_ones():
    with pytest.raises(TinyprotoError) as info:
        load_board("zx81")
    message = str(info.value)
    assert "\n" not in message and all(name in message for name in BOARDS)
    result = cli("compile", "iris", "--board", "zx81", "--out", os.devnull + "-never")
    assert result.returncode != 0 and result.stderr.strip().count("\n") == 0 and "known boards" in result.stderr


BOARD_FILE_DAMAGE = {
    # each was taken as it stood: a NaN supply voltage made NaN energies, a serial_baud of 0 a firmware that never
    # answers, a board file naming another board, an MCU of "z80; rm -rf /" in platformio.ini, negative currents
    "voltage NaN": ('"voltage_v": 5.0', '"voltage_v": NaN', "NaN"),
    "serial_baud 0": ('"serial_baud": 1000000', '"serial_baud": 0', "serial_baud"),
    "another name": ('"name": "uno"', '"name": "other"', "name"),
    "mcu with a command": ('"mcu": "atmega328p"', '"mcu": "z80; rm -rf /"', "mcu"),
    "SRAM 10^30": ('"sram_bytes": 2048', '"sram_bytes": 1000000000000000000000000000000', "sram_bytes"),
    "SRAM as text": ('"sram_bytes": 2048', '"sram_bytes": "lots"', "sram_bytes"),
    "negative current": ('"mcu_active_current_ma": 9.0', '"mcu_active_current_ma": -9', "mcu_active_current_ma"),
    "clock 0": ('"f_cpu_hz": 16000000', '"f_cpu_hz": 0', "f_cpu_hz"),
    "pio board a path": ('"pio_board": "uno"', '"pio_board": "../../etc"', "pio_board"),
    "reserve beyond the SRAM": ('"sram_reserved_bytes": 256', '"sram_reserved_bytes": 4096', "sram_reserved_bytes"),
    "upload speed as text": ('"speed": 115200', '"speed": "fast"', "upload.speed"),
    "title with a newline": ('"title": "Arduino Uno', '"title": "x\\n[env:evil]\\nArduino Uno', "title"),
    "truncated": ('"mcu_active_current_source"', '', "JSON"),
    "a list": (None, "[]", "object"),
    # rates the clock cannot make were taken: a firmware built to talk at them never answers a real board
    "serial_baud inexact": ('"serial_baud": 1000000', '"serial_baud": 150000', "serial_baud: 150000 baud is .* off"),
    "serial_baud too fast": ('"serial_baud": 1000000', '"serial_baud": 9000000', "serial_baud: 9000000 .* too fast"),
    "serial_baud too slow": ('"serial_baud": 1000000', '"serial_baud": 300', "serial_baud: 300 baud is too slow"),
    "fallback inexact": ('"serial_baud_fallback": 115200', '"serial_baud_fallback": 777777', "serial_baud_fallback"),
    "clock that makes no rate": ('"f_cpu_hz": 16000000', '"f_cpu_hz": 20000001', "serial_baud"),
}


@pytest.mark.parametrize("case", sorted(BOARD_FILE_DAMAGE))
def test_every_field_of_a_board_file_is_checked(tmp_path, monkeypatch, case):
    import tinyproto.core.boards as boards

    old, new, keyword = BOARD_FILE_DAMAGE[case]
    text = (boards.resource_dir("boards") / "uno.json").read_text()
    if old is None:
        text = new
    elif case == "truncated":
        text = text[:text.index(old)]
    else:
        assert old in text
        text = text.replace(old, new, 1)
    (tmp_path / "uno.json").write_text(text)
    (tmp_path / "not_a_file.json").mkdir()  # a directory is no board file: not listed, not loaded
    monkeypatch.setattr(boards, "resource_dir", lambda name: tmp_path)
    assert boards.available_boards() == ["uno"]
    with pytest.raises(TinyprotoError, match=f"uno.json is damaged.*{keyword}") as info:
        boards.load_board("uno")
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("kind, words", [("directory", "is not a regular file"), ("loop", "loop of symbolic links"),
                                         ("dangling", "which does not exist")])
def test_a_board_file_that_is_no_file_is_named_not_called_unknown(tmp_path, monkeypatch, kind, words):
    """--board uno with boards/uno.json a directory or a broken link said "unknown board 'uno'; known boards: ..."
    (the file is there); it is named now. --board's list of known boards leaves it out; `tinyproto boards` (every
    board file, checked) names it, as it names a damaged one, where it left it out without a word."""
    import tinyproto.core.boards as boards

    {"directory": lambda p: p.mkdir(), "loop": lambda p: p.symlink_to(p.name),
     "dangling": lambda p: p.symlink_to("gone.json")}[kind](tmp_path / "uno.json")
    monkeypatch.setattr(boards, "resource_dir", lambda name: tmp_path)
    assert boards.available_boards() == []
    with pytest.raises(TinyprotoError, match=f"uno.json.*{words}"):
        boards.load_board("uno")
    with pytest.raises(TinyprotoError, match="unknown board 'nano'"):
        boards.load_board("nano")
    with pytest.raises(TinyprotoError, match=f"uno.json.*{words}"):
        boards.all_boards()


def test_tinyproto_boards_names_a_board_file_it_cannot_list(tmp_path, monkeypatch):
    """A file in boards/ whose name is no board name ("my uno.json") is named with what to do, not "unknown
    board", and `tinyproto boards` is one error line, not a listing that leaves a board out."""
    import tinyproto.core.boards as boards
    from helpers import refused

    (tmp_path / "my uno.json").write_text((boards.resource_dir("boards") / "uno.json").read_text())
    monkeypatch.setattr(boards, "resource_dir", lambda name: tmp_path)
    line = refused(["boards"], "my uno.json", tmp_path)
    assert "rename or remove it" in line, line


@pytest.mark.parametrize("verb", ["compile", "federate", "sweep"])
def test_a_board_file_naming_an_mcu_avr_gcc_does_not_know_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, verb):
    """mcu "atmega9999": compile wrote the project, and its build failed on a page of PlatformIO's log."""
    import shutil

    import tinyproto.core.boards as boards
    from tinyproto.pipeline.compile import CompileOptions, compile_model
    from tinyproto.pipeline.federate import FederateOptions, federate_model
    from tinyproto.pipeline.sweep import SweepOptions, sweep

    if shutil.which("avr-gcc") is None:
        pytest.skip("avr-gcc not installed: there is nothing to check the MCU against")
    text = (boards.resource_dir("boards") / "uno.json").read_text().replace('"atmega328p"', '"atmega9999"')
    (tmp_path / "boards").mkdir()
    (tmp_path / "boards" / "uno.json").write_text(text)
    monkeypatch.setattr(boards, "resource_dir", lambda name: tmp_path / "boards")
    out = tmp_path / "out"
    run = {"compile": lambda: compile_model("iris", CompileOptions("protonn", "1kB", out=out)),
           "federate": lambda: federate_model("iris", FederateOptions(parties=2, backend="local"), out),
           "sweep": lambda: sweep("iris", out, SweepOptions(models="protonn", budgets="1kB", device="none"))}[verb]
    with pytest.raises(TinyprotoError, match="names the MCU 'atmega9999', which avr-gcc does not know"):
        run()
    assert not out.exists()


def test_a_board_file_naming_an_mcu_without_a_usart_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    """mcu "attiny85" (no USART, an 8-bit Timer1): avr-gcc knows it, so compile wrote the project and the build
    failed on the device app's registers."""
    import json
    import shutil

    import tinyproto.core.boards as boards
    from tinyproto.pipeline.compile import CompileOptions, compile_model

    if shutil.which("avr-gcc") is None:
        pytest.skip("avr-gcc not installed: there is nothing to check the MCU against")
    board = json.loads((boards.resource_dir("boards") / "uno.json").read_text())
    board.update(name="tiny", mcu="attiny85", f_cpu_hz=8_000_000, sram_bytes=512, flash_bytes_for_sketch=8192,
                 eeprom_bytes=512, sram_reserved_bytes=128, serial_baud=38400, serial_baud_fallback=38400)
    (tmp_path / "boards").mkdir()
    (tmp_path / "boards" / "tiny.json").write_text(json.dumps(board))
    monkeypatch.setattr(boards, "resource_dir", lambda name: tmp_path / "boards")
    out = tmp_path / "out"
    with pytest.raises(TinyprotoError, match="names the MCU 'attiny85', which lacks what tinyproto's device app "
                                             "needs .* no UDR0 or UDR1"):
        compile_model("iris", CompileOptions("protonn", "256B", board="tiny", out=out))
    assert not out.exists()


def test_the_shipped_board_files_pass_the_checks():
    from tinyproto.core.boards import board_file_problem
    from tinyproto.core.resources import resource_dir

    for name in BOARDS:
        assert board_file_problem(json.loads((resource_dir("boards") / f"{name}.json").read_text()), name) is None


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
def validated(shared_once, compiled, tmp_path_factory):
    """The same model (iris, ProtoNN, 1 kB, seed 0) compiled for every board (the run's shared copy of what `compile
    iris --budget 1kB --board B` writes), built and validated with --sim: made once per run for all workers, and
    copied for the tests of this module on each worker (they flash and validate it again). The build and the
    validation run as `tinyproto build` and `tinyproto validate --sim --json` run, in this process (click's runner,
    as conftest's built_models does): ten interpreters' start-up fewer."""
    from click.testing import CliRunner

    from tinyproto.cli import main

    def make(into: Path) -> None:
        for name in BOARDS:
            model_dir = into / name / "model"
            shutil.copytree(compiled("iris", "1kB", board=name), model_dir, symlinks=True)
            for verb in (["build", str(model_dir)], ["validate", str(model_dir), "--sim", "--json"]):
                result = CliRunner().invoke(main, verb)
                assert result.exit_code == 0, result.output
            (into / name / "compile.json").write_text((model_dir / "report.json").read_text())
            (into / name / "validate.json").write_text(result.stdout)

    master = shared_once("iris-1kB-every-board-validated", make)
    out = {}
    for name in BOARDS:
        copy = fresh_copy(master / name, tmp_path_factory, f"iris-{name}")
        out[name] = (copy / "model", json.loads((copy / "compile.json").read_text()),
                     json.loads((copy / "validate.json").read_text()))
    return out


@pytest.mark.parametrize("name", BOARDS)
def test_the_same_model_validates_bit_exactly_on_every_board(validated, name):
    model_dir, report, v = validated[name]
    board = load_board(name)
    assert v["passed"] and v["board"] == name
    assert v["score_agreement"] == 1.0 and v["label_agreement"] == 1.0 and v["n_vectors"] == report["n_test"]
    assert (v["simulator_marker_cycles"]["marker_minus_timer1_min"]
            == v["simulator_marker_cycles"]["marker_minus_timer1_max"])
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
    assert (build_project(model_dir, "uno_sim").elf
            == model_dir.resolve() / ".pio" / "build" / "uno_sim" / "firmware.elf")
    with pytest.raises(TinyprotoError, match="unknown PlatformIO environment 'nano_sim'"):
        build_project(model_dir, "nano_sim")


def test_a_model_too_big_for_the_unos_sram_is_refused_there_and_runs_on_the_mega(tmp_path):
    rng = np.random.default_rng(0)
    n, d = 120, 2048  # FlyNN holds the d int8 inputs (2 kB): too much for a 2 kB chip, not for 8 kB
    y = rng.integers(0, 2, n)
    X = rng.normal(size=(n, d)) + y[:, None] * np.linspace(0, 1.5, d)
    data = tmp_path / "wide.npz"
    np.savez(data, X=X.astype(np.float32), y=y)
    refused = cli("compile", str(data), "--model", "flynn", "--budget", "2kB", "--board", "uno",
                  "--out", str(tmp_path / "uno"))
    assert refused.returncode != 0 and "more than the 2048 B of Arduino Uno" in refused.stderr
    mega_dir = tmp_path / "mega"
    accepted = cli("compile", str(data), "--model", "flynn", "--budget", "2kB", "--board", "mega2560",
                   "--out", str(mega_dir))
    assert accepted.returncode == 0, accepted.stderr
    assert cli("build", str(mega_dir)).returncode == 0
    result = cli("validate", str(mega_dir), "--sim", "--json")
    assert result.returncode == 0, result.stderr
    v = json.loads(result.stdout)
    assert v["passed"] and v["score_agreement"] == 1.0
    assert v["sram_static_bytes"] + v["stack_peak_bytes"] > 2048  # what the Uno could not have held


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


def test_digits_2kb_through_the_megas_own_bootloader(built_for_board, tmp_path):
    """The physical Mega's path on the simulated ATmega2560: compile digits (ProtoNN, 2 kB) for the Mega, flash
    it with avrdude -c wiring into Debian's stk500v2 bootloader, and validate over the same port, bit-exactly.
    (stk500v2 keeps the chip while it hears bytes: the host stays quiet for the board's boot_quiet_s first.)"""
    from tinyproto.device.board_sim import SimulatedBoard, board_bootloader

    board = load_board("mega2560")
    assert board.boot_quiet_s > 0
    model_dir = built_for_board("digits", "2kB", "mega2560")  # compiled with --board mega2560, built
    with SimulatedBoard(board.mcu, tmp_path / "state", board.f_cpu_hz, bootloader=board_bootloader(board)) as sim:
        flashed = cli("flash", str(model_dir), "--port", sim.port, timeout=120)
        assert flashed.returncode == 0, flashed.stderr + flashed.stdout
        result = cli("validate", str(model_dir), "--port", sim.port, "--json", "--no-raw", timeout=300)
    assert result.returncode == 0, result.stderr
    v = json.loads(result.stdout)
    assert v["passed"] and v["score_agreement"] == 1.0 and v["n_vectors"] == 450


# ------------------------------------------------------------------------------------- the Leonardo's 1200-baud touch


class LeonardoDouble:
    """The Leonardo's native USB port as a pseudo-terminal. It records every baud rate the host leaves on the line;
    when the host closes it at 1200 baud (the "touch"), the board "re-enumerates": a second pty appears (the
    Caterina bootloader's port) answering AVR109 as Caterina does, and the first one vanishes. Flash writes land
    in `flash`. Only the serial side is modelled: the USB reset itself cannot be simulated here."""

    SIGNATURE = bytes([0x87, 0x95, 0x1E])  # ATmega32U4, as AVR109's 's' sends it (low byte first)
    BLOCK = 128

    def __init__(self, flash_bytes: int = 32768) -> None:
        self.app_master, slave = os.openpty()
        self.app_port = os.ttyname(slave)
        os.close(slave)
        self.bauds: list[int] = []
        self.boot_port: str | None = None
        self.flash = bytearray(b"\xff" * flash_bytes)
        self.commands: list[str] = []
        self.exited = threading.Event()
        self._stop = threading.Event()
        # Read before the thread starts: a thread scheduled late (a loaded machine) must still see the touch as a
        # change of speed, even when the 1200-baud open and close are already over.
        self._initial_speed = self._speed()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def list_ports(self) -> set[str]:
        return {p for p in (None if self.app_master is None else self.app_port, self.boot_port) if p}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        for fd in (self.app_master, getattr(self, "boot_master", None)):
            if fd is not None:
                os.close(fd)

    # -- the application's port: watch the line speed until a 1200-baud close
    def _speed(self) -> int:
        return termios.tcgetattr(self.app_master)[5]

    def _run(self) -> None:
        poller = select.poll()
        poller.register(self.app_master, select.POLLHUP)
        was_open = False
        last = self._initial_speed
        while not self._stop.is_set():
            speed = self._speed()
            if speed != last:
                self.bauds.append(speed)
                last = speed
            hung_up = any(ev & select.POLLHUP for _, ev in poller.poll(2))
            if not hung_up:
                was_open = True
            elif (was_open or self.bauds) and speed == termios.B1200:
                self._reenumerate()
                return

    def _reenumerate(self) -> None:
        self.boot_master, slave = os.openpty()
        self.boot_port = os.ttyname(slave)
        os.close(slave)
        os.close(self.app_master)  # after the new port exists: the pty numbers differ, as new USB ports do
        self.app_master = None
        self._caterina()

    # -- Caterina's side of AVR109
    def _read(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            if self._stop.is_set():
                raise EOFError
            ready, _, _ = select.select([self.boot_master], [], [], 0.05)
            if ready:
                try:
                    out += os.read(self.boot_master, n - len(out))
                except OSError:  # no one has the port open (EIO): wait for avrdude
                    pass
        return out

    def _caterina(self) -> None:
        address = 0  # words for flash
        ok = b"\r"
        try:
            while not self._stop.is_set():
                c = self._read(1)
                self.commands.append(c.decode("latin-1"))
                reply = b"?"
                if c == b"S":
                    reply = b"CATERIN"
                elif c == b"V":
                    reply = b"10"
                elif c == b"v":
                    reply = b"?"
                elif c == b"p":
                    reply = b"S"
                elif c == b"a":
                    reply = b"Y"
                elif c == b"b":
                    reply = b"Y" + self.BLOCK.to_bytes(2, "big")
                elif c == b"t":
                    reply = b"\x44\x00"
                elif c in (b"T", b"x", b"y"):
                    self._read(1)
                    reply = ok
                elif c in (b"P", b"L"):
                    reply = ok
                elif c == b"E":
                    self.exited.set()  # before the reply: avrdude cannot have exited on it yet (no race)
                    os.write(self.boot_master, ok)
                    return
                elif c == b"s":
                    reply = self.SIGNATURE
                elif c == b"e":
                    self.flash[:] = b"\xff" * len(self.flash)
                    reply = ok
                elif c == b"A":
                    address = int.from_bytes(self._read(2), "big")
                    reply = ok
                elif c == b"B":
                    size = int.from_bytes(self._read(2), "big")
                    memory = self._read(1)
                    data = self._read(size)
                    if memory == b"F":
                        self.flash[2 * address:2 * address + size] = data
                        address += size // 2
                    reply = ok
                elif c == b"g":
                    size = int.from_bytes(self._read(2), "big")
                    memory = self._read(1)
                    if memory == b"F":
                        reply = bytes(self.flash[2 * address:2 * address + size])
                        address += size // 2
                    else:
                        reply = b"\xff" * size
                elif c == b"\x1b":
                    continue
                os.write(self.boot_master, reply)
        except EOFError:
            return


def hex_image(path) -> bytes:
    """The bytes of an Intel HEX file (data records; the firmware is below 64 KB), from address 0."""
    image = bytearray()
    for line in path.read_text().split():
        count, address, kind = int(line[1:3], 16), int(line[3:7], 16), int(line[7:9], 16)
        if kind == 0:
            data = bytes.fromhex(line[9:9 + 2 * count])
            image[len(image):address + count] = b"\xff" * max(0, address + count - len(image))
            image[address:address + count] = data
    return bytes(image)


@pytest.fixture
def leonardo_double():
    double = LeonardoDouble()
    yield double
    double.close()


needs_avrdude = pytest.mark.skipif(shutil.which("avrdude") is None, reason="avrdude not installed")


@needs_avrdude
def test_the_leonardo_is_touched_at_1200_baud_and_flashed_on_its_bootloaders_new_port(validated, leonardo_double):
    """flash_port on the Leonardo: open its USB port at 1200 baud and close it, find the port Caterina appears on,
    and avrdude -c avr109 -b 57600 there. The double records the line speed and answers AVR109 like Caterina."""
    from tinyproto.device.flash import flash_port

    board = load_board("leonardo")
    hex_path = validated["leonardo"][0] / ".pio" / "build" / "leonardo_sim" / "firmware.hex"
    result = flash_port(board, leonardo_double.app_port, hex_path, list_ports=leonardo_double.list_ports)
    assert leonardo_double.bauds == [termios.B1200]  # the touch: one open at 1200 baud, then the close
    assert result.upload_port == leonardo_double.boot_port != leonardo_double.app_port
    assert leonardo_double.exited.is_set()  # avrdude ended with AVR109's E (exit bootloader)
    image = hex_image(hex_path)
    assert result.bytes_written == len(image)
    assert bytes(leonardo_double.flash[:len(image)]) == image  # written and verified byte for byte
    assert "1e9587" in result.log  # avrdude read the ATmega32U4 signature the double sends


@needs_avrdude
def test_tinyproto_flash_on_the_leonardo_uploads_by_usb_and_answers_on_serial1(validated, leonardo_double,
                                                                               monkeypatch):
    """`tinyproto flash DIR --port SERIAL1 --upload-port USB`: the upload goes through the double's touch and
    Caterina, the handshake through USART1 of the simulated ATmega32U4 (the adapter's port)."""
    from click.testing import CliRunner

    from tinyproto.cli import main
    from tinyproto.device import usb_touch
    from tinyproto.device.sim import SimulatedUno

    monkeypatch.setattr(usb_touch, "list_serial_ports", leonardo_double.list_ports)
    board = load_board("leonardo")
    model_dir = validated["leonardo"][0]
    elf = model_dir / ".pio" / "build" / "leonardo_sim" / "firmware.elf"
    with SimulatedUno(elf, board=board) as chip:
        result = CliRunner().invoke(main, ["flash", str(model_dir), "--port", chip.port,
                                           "--upload-port", leonardo_double.app_port])
    assert result.exit_code == 0, result.output
    assert f"to {leonardo_double.boot_port} with avrdude -c avr109" in " ".join(result.output.split())
    assert leonardo_double.bauds == [termios.B1200] and leonardo_double.exited.is_set()
    # without --upload-port the Leonardo is refused with the reason, in one line
    refused = cli("flash", str(model_dir), "--port", chip.port)
    assert refused.returncode == 1 and "--upload-port" in refused.stderr and refused.stderr.count("\n") == 1


def test_no_bootloader_port_after_the_touch_is_one_clear_error(leonardo_double):
    from tinyproto.device.usb_touch import enter_bootloader

    with pytest.raises(TinyprotoError, match="no bootloader port appeared.*reset button"):
        enter_bootloader(leonardo_double.app_port, list_ports=lambda: {leonardo_double.app_port}, wait_s=0.3)


def test_run_takes_the_board(tmp_path):
    """`tinyproto run --board nano`: compiled, built and validated for the Nano (its own environment)."""
    model_dir = tmp_path / "nano"
    result = cli("run", "iris", "--budget", "1kB", "--board", "nano", "--out", str(model_dir))
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((model_dir / "model.json").read_text())["board"] == "nano"
    assert json.loads((model_dir / "build.json").read_text())["env"] == "nano_sim"
    v = json.loads((model_dir / "validation.json").read_text())
    assert v["passed"] and v["board"] == "nano" and v["score_agreement"] == 1.0
    unknown = cli("run", "iris", "--board", "zx81", "--out", str(tmp_path / "never"))
    assert unknown.returncode == 1 and "known boards" in unknown.stderr and not (tmp_path / "never").exists()
