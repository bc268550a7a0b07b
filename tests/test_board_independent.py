"""flash / validate --port against a simulated board that is NOT the project's own: tests/fixtures/plainuno, a
separately written libsimavr harness, running the same real bootloaders (Optiboot built from Debian's source,
Debian's stk500v2 for the Mega) but differing from tools/simuno in every detail the host side could come to rely
on by accident: the reset on open lands up to 100 ms late (or never), junk bytes come out after each reset, host
bytes flood the UART's FIFO instead of arriving at wire speed, the chip runs at a quarter of real time or free,
and a chip that runs into erased flash hangs. tinyproto's flash and validate must work the same on it, and fail
in one clear line where no host could succeed (no reset: nothing can start the bootloader).
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from helpers import needs, tinyproto

pytestmark = [
    pytest.mark.device,
    pytest.mark.slow,
    needs("avr-gcc"),
    needs("avrdude"),
    needs("gcc"),
    pytest.mark.skipif(not Path("/usr/include/simavr/sim_avr.h").is_file(), reason="libsimavr-dev not installed"),
    pytest.mark.skipif(not Path("/usr/share/arduino/hardware/arduino/avr/bootloaders/optiboot/optiboot.c").is_file(),
                       reason="arduino-core-avr (Optiboot's source) not installed"),
    pytest.mark.usefixtures("private_cache"),
]

HARNESS = Path(__file__).parent / "fixtures" / "plainuno" / "plainuno.c"


def cli(*args, timeout=300):
    return tinyproto(*args, timeout=timeout)


@pytest.fixture(scope="module")
def plainuno(tmp_path_factory) -> Path:
    binary = tmp_path_factory.mktemp("plainuno") / "plainuno"
    subprocess.run(["gcc", "-O2", "-std=gnu99", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(HARNESS),
                    "-lsimavr"], check=True)
    return binary


def raw_bootloader(mcu: str, out: Path) -> Path:
    """The board's bootloader as plainuno takes it: a raw binary from its first address (avr-objcopy)."""
    from tinyproto.device.bootloaders import ensure_bootloader

    subprocess.run(["avr-objcopy", "-I", "ihex", "-O", "binary", str(ensure_bootloader(mcu)), str(out)], check=True)
    return out


@pytest.fixture(scope="module")
def loaders(tmp_path_factory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("loaders")
    return {mcu: raw_bootloader(mcu, directory / f"{mcu}.bin") for mcu in ("atmega328p", "atmega2560")}


BOOT_START = {"atmega328p": "0x7e00", "atmega2560": "0x3e000"}


@contextmanager
def plain_board(binary: Path, loader: Path, mcu: str, *options: str, started_for_s: float = 0.0):
    """plainuno on a pty; with started_for_s, the port once the chip has run that long on its own clock (a busy
    host paces the simulation slower than the wall clock, so a sleep would not tell)."""
    if started_for_s:
        options = (*options, "--say-after", str(started_for_s))
    proc = subprocess.Popen([str(binary), str(loader), BOOT_START[mcu], "--mcu", mcu, *options],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        port = proc.stdout.readline().strip()
        assert port.startswith("/dev/pts/"), proc.stderr.read()
        if started_for_s:
            said = proc.stdout.readline().strip()  # blocks until the simulated clock gets there
            assert said == f"simulated {started_for_s:g} s", said
        yield port
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@pytest.fixture(scope="module")
def models(built_for_board):
    """digits / ProtoNN / 2 kB (the issue's model) and a small iris ProtoNN, each built with `tinyproto build`: the
    run's shared builds (conftest's built_for_board), copied."""
    return {"digits": built_for_board("digits", "2kB", "uno"), "iris": built_for_board("iris", "1kB", "uno")}


JUNK = bytes([0x00, 0xF0, 0xFF, 0x80, 0x7E, 0xFE, 0x00, 0x01, 0x3F, 0xC0])  # plainuno's first 10 bytes of junk


def read_raw(port: str, n: int, timeout: float) -> bytes:
    """The first n bytes the board sends after an open (plain os.open: pyserial's open would flush early ones)."""
    fd = os.open(port, os.O_RDWR | os.O_NOCTTY)
    try:
        data = b""
        deadline = time.monotonic() + timeout
        while len(data) < n and time.monotonic() < deadline:
            if select.select([fd], [], [], 0.05)[0]:
                data += os.read(fd, n - len(data))
        return data
    finally:
        os.close(fd)


def flash_first_try(model_dir: Path, board_name: str, port: str) -> str:
    """Upload model_dir's firmware through the board's bootloader (tinyproto.device.flash, what `tinyproto flash`
    calls) and return avrdude's log, having checked that the bootloader answered avrdude's first sync: a reset
    that lands late, or junk after it, would show as a failed attempt before a later one succeeds."""
    from tinyproto.core.boards import load_board
    from tinyproto.device.flash import flash_port

    build = json.loads((model_dir / "build.json").read_text())
    result = flash_port(load_board(board_name), port, model_dir / build["hex"])
    assert not re.search(r"not in sync|not responding|timeout|attempt 2 of", result.log, re.IGNORECASE), result.log
    return result.log


def validate_json(model_dir: Path, port: str, *extra: str) -> dict:
    result = cli("validate", str(model_dir), "--port", port, "--json", *extra)
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["complete"] and summary["score_agreement"] == 1.0 and summary["label_agreement"] == 1.0
    return summary


def test_late_reset_junk_after_reset_and_a_flooded_uart(plainuno, loaders, models):
    """The reset on open lands up to 100 ms after the open, 10 junk bytes follow every reset, and host bytes fill
    simavr's FIFO as fast as it takes them: digits/ProtoNN/2 kB flashes at the first sync and validates bit-exactly."""
    with plain_board(plainuno, loaders["atmega328p"], "atmega328p", "--reset-delay-ms", "100", "--garbage", "10",
                     "--rx", "flood") as port:
        assert read_raw(port, len(JUNK), 3.0) == JUNK  # the variant is on: junk follows the reset on open
        flash_first_try(models["digits"], "uno", port)
        summary = validate_json(models["digits"], port, "--no-raw")
        assert summary["n_vectors"] == 450


def test_a_board_at_a_quarter_of_real_time(plainuno, loaders, models):
    """A slow host: simulated time runs at 0.25x. Optiboot's 1 s window is then 4 s of wall time; avrdude and the
    handshake after the reset still get through, and every request waits for its answer."""
    with plain_board(plainuno, loaders["atmega328p"], "atmega328p", "--pace", "0.25") as port:
        flashed = cli("flash", str(models["iris"]), "--port", port)
        assert flashed.returncode == 0, flashed.stderr
        validate_json(models["iris"], port)


def test_no_reset_on_open_validates_and_refuses_to_flash_in_one_line(plainuno, loaders, models, tmp_path):
    """A board that never resets when its port is opened (a simulator that cannot see DTR, a board with its
    auto-reset cut), running free, not paced. validate needs no reset: it passes. flash cannot reach the bootloader
    (nothing can, from the host): one line naming what was tried, the missing DTR line and what to do; the
    application on the chip is untouched, validate still passes."""
    flash_image = tmp_path / "flash.bin"
    with plain_board(plainuno, loaders["atmega328p"], "atmega328p", "--flash", str(flash_image)) as port:
        flashed = cli("flash", str(models["iris"]), "--port", port)
        assert flashed.returncode == 0, flashed.stderr
    assert flash_image.stat().st_size == 32768
    with plain_board(plainuno, loaders["atmega328p"], "atmega328p", "--flash", str(flash_image), "--reset", "none",
                     "--pace", "0") as port:
        validate_json(models["iris"], port)
        started = time.monotonic()
        refused = cli("flash", str(models["digits"]), "--port", port)
        assert time.monotonic() - started < 60
        assert refused.returncode == 1 and "Traceback" not in refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1
        message = refused.stderr
        assert f"avrdude -c arduino -b 115200 -p atmega328p on {port}: no bootloader answered" in message
        assert "has no DTR line" in message and "reset by hand" in message
        validate_json(models["iris"], port)


def test_the_mega_through_its_stk500v2_on_the_other_simulator(plainuno, loaders, built_for_board, tmp_path):
    """digits/ProtoNN/2 kB for the Mega 2560: avrdude -c wiring into Debian's stk500v2, then validate over the same
    port after the reset, bit-exactly (the host keeps the quiet stk500v2 needs before its sketch starts). Then the
    same chip at 0.3 of real time (a busy host: the load of 10 on 2 cores where validate once found no answer at
    1000000 baud): the board's 1.5 s of silence is then half a second of the chip's, stk500v2 takes the first
    HELLO for an upload, and the host resets the board and waits longer before it talks again."""
    model_dir = built_for_board("digits", "2kB", "mega2560")  # compiled with --board mega2560, built
    flash_image = tmp_path / "flash.bin"
    with plain_board(plainuno, loaders["atmega2560"], "atmega2560", "--garbage", "10", "--rx", "flood", "--flash",
                     str(flash_image)) as port:
        assert "device signature = 0x1e9801" in flash_first_try(model_dir, "mega2560", port)  # the 2560 answered
        summary = validate_json(model_dir, port, "--no-raw")
        assert summary["n_vectors"] == 450
    with plain_board(plainuno, loaders["atmega2560"], "atmega2560", "--flash", str(flash_image), "--pace",
                     "0.3") as port:
        assert validate_json(model_dir, port, "--no-raw")["n_vectors"] == 450


def test_learning_and_its_eeprom_reload_on_the_other_simulator(plainuno, loaders, tmp_path, compiled):
    """tinyproto learn --port --save-eeprom: the learning firmware through Optiboot, the counts learned over the port
    equal the host's, and after the reset of a reopened port (late, with junk) the EEPROM record reloads intact."""
    model = tmp_path / "iris"  # what `compile iris --model flynn --budget 1kB --learnable` writes: the run's copy
    shutil.copytree(compiled("iris", "1kB", "flynn", learnable=True), model, symlinks=True)
    with plain_board(plainuno, loaders["atmega328p"], "atmega328p", "--reset-delay-ms", "100", "--garbage",
                     "10") as port:
        learned = cli("learn", str(model), "--port", port, "--save-eeprom", "--json")
    assert learned.returncode == 0, learned.stderr
    summary = json.loads(learned.stdout)
    assert summary["target"] == port and summary["counts_identical"]
    assert summary["eeprom"]["saved"] and summary["eeprom"]["reloaded_identical"]


def test_a_board_that_misses_the_first_open_of_its_port(plainuno, loaders, models):
    """A simulator that detects opens by polling its pty but never opened it itself sees no hang-up before the
    first program opens the port, so that first open is no reset (plain avrdude then finds no bootloader).
    `tinyproto flash` and `pio run -t upload` open and close the port before avrdude, as PlatformIO's atmelavr
    platform does, so avrdude's own open is a reset there too."""
    hex_path = models["iris"] / json.loads((models["iris"] / "build.json").read_text())["hex"]
    missed = ("--first-open", "missed", "--reset-delay-ms", "100")
    # once the window of the board's own start is over (1.5 s of its clock), only a reset brings Optiboot back
    with plain_board(plainuno, loaders["atmega328p"], "atmega328p", *missed, started_for_s=1.5) as port:
        plain = subprocess.run(["avrdude", "-p", "atmega328p", "-c", "arduino", "-P", port, "-b", "115200",
                                "-x", "attempts=1", "-D", "-U", f"flash:w:{hex_path}:i"], capture_output=True,
                               text=True, timeout=120)
        assert plain.returncode != 0 and "not in sync" in plain.stderr  # the variant is on
    with plain_board(plainuno, loaders["atmega328p"], "atmega328p", *missed, started_for_s=1.5) as port:
        flashed = cli("flash", str(models["iris"]), "--port", port)
        assert flashed.returncode == 0, flashed.stderr

    from tinyproto.device.build import pio_environment, prepare_pio_core

    if shutil.which("pio") is None and not (Path(sys.executable).parent / "pio").exists():
        pytest.skip("PlatformIO not installed")
    env = pio_environment(prepare_pio_core())
    env["PLATFORMIO_BUILD_DIR"] = str(models["iris"] / ".pio" / "port-test-build")  # keep build.json's firmware
    with plain_board(plainuno, loaders["atmega328p"], "atmega328p", *missed, started_for_s=1.5) as port:
        upload = subprocess.run([sys.executable, "-m", "platformio", "run", "-d", str(models["iris"]), "-t", "upload",
                                 "--upload-port", port], capture_output=True, text=True, env=env, timeout=300)
    out = upload.stdout + upload.stderr
    assert upload.returncode == 0, out[-2000:]
    assert "bytes of flash verified" in out
