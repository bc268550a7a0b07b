"""The real upload path without a board: avrdude -> the board's own bootloader (Optiboot on the Uno, stk500v2 on
the Mega 2560) running in a simulated chip behind a pty (tinyproto.device.board_sim), then the firmware's
handshake after the reset. Everything here is the path a physical board takes; nothing is mocked.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tinyproto.core.errors import TinyprotoError

from helpers import needs, tinyproto

pytestmark = [
    pytest.mark.device,
    pytest.mark.slow,
    needs("avr-gcc"),
    needs("avrdude"),
    pytest.mark.skipif(not Path("/usr/include/simavr/sim_avr.h").is_file(), reason="libsimavr-dev not installed"),
    pytest.mark.skipif(not Path("/usr/share/arduino/hardware/arduino/avr/bootloaders/optiboot/optiboot.c").is_file(),
                       reason="arduino-core-avr (Optiboot's source) not installed"),
    pytest.mark.usefixtures("private_cache"),
]

FIXTURES = Path(__file__).parent / "fixtures" / "sim"
STK_GET_SYNC = b"0 "  # STK_GET_SYNC, CRC_EOP: Optiboot answers STK_INSYNC, STK_OK
STK_IN_SYNC_OK = b"\x14\x10"


def cli(*args, timeout=300):
    return tinyproto(*args, timeout=timeout)


def read_until(port, marker: bytes, timeout: float) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while marker not in data and time.monotonic() < deadline:
        data += port.read(max(1, port.in_waiting))
    return data


def get_sync(line, deadline_s: float = 15.0) -> bytes:
    """STK_GET_SYNC, repeated every 0.25 s (as avrdude repeats it) until Optiboot answers or the deadline passes.
    The open resets the board, and Optiboot then listens for about 1 s of the chip's time; a simulator on a busy
    host may see the open a while after it happened, and a sync sent before its reset is lost with the old
    program, so a single sync sent at a fixed wall-clock delay failed under load."""
    data = b""
    deadline = time.monotonic() + deadline_s
    while STK_IN_SYNC_OK not in data and time.monotonic() < deadline:
        line.write(STK_GET_SYNC)
        data += read_until(line, STK_IN_SYNC_OK, 0.25)
    return data


def avrdude(mcu: str, protocol: str, port: str, hex_path: Path, *extra: str, **kwargs):
    return subprocess.run(["avrdude", "-p", mcu, "-c", protocol, "-P", port, "-b", "115200", *extra, "-D",
                           "-U", f"flash:w:{hex_path}:i"], capture_output=True, text=True, timeout=120, **kwargs)


def app_hex(tmp_path: Path, mcu: str, banner: str) -> Path:
    elf = tmp_path / f"boardtest-{mcu}-{banner}.elf"
    subprocess.run(["avr-gcc", f"-mmcu={mcu}", "-DF_CPU=16000000UL", "-Os", "-std=gnu99", "-Wall", "-Werror",
                    f'-DBANNER="{banner}"', "-o", str(elf), str(FIXTURES / "boardtest.c")], check=True)
    hex_path = elf.with_suffix(".hex")
    subprocess.run(["avr-objcopy", "-O", "ihex", "-R", ".eeprom", str(elf), str(hex_path)], check=True)
    return hex_path


@pytest.fixture(scope="module")
def models(built_for_board):
    """Two different models, each built with `tinyproto build`: digits / ProtoNN / 2 kB (the goal's model) and
    a small iris ProtoNN (quick to validate); the run's shared builds (conftest's built_for_board), copied."""
    dirs = [built_for_board("digits", "2kB", "uno"), built_for_board("iris", "1kB", "uno")]
    hashes = [json.loads((d / "model.json").read_text())["model_hash"] for d in dirs]
    assert hashes[0] != hashes[1]
    return dirs


@pytest.fixture
def uno(tmp_path):
    """A simulated Uno with Optiboot and erased application flash, for one test. A board paced to the wall clock
    costs CPU while it waits (0.8 s of CPU in 10 s with an application flashed): one kept for the whole module
    spent it through every other test of the module as well."""
    from tinyproto.device.board_sim import SimulatedBoard

    with SimulatedBoard("atmega328p", tmp_path / "uno-state", fresh=True) as board:
        yield board


# ---------------------------------------------------------------------------------------------- the main path


def test_flash_validate_reflash_validate(uno, models):
    first, second = models
    flashed = cli("flash", str(first), "--port", uno.port)
    assert flashed.returncode == 0, flashed.stderr
    assert "with avrdude -c arduino -b 115200" in flashed.stdout
    # how long the upload takes is measured by tools/bench_validate.py --board-sim, not asserted here
    assert re.search(r"flashed \d+ B to \S+ with avrdude", flashed.stdout), flashed.stdout

    v1 = cli("validate", str(first), "--port", uno.port, "--json", "--no-raw")
    assert v1.returncode == 0, v1.stderr
    s1 = json.loads(v1.stdout)
    assert s1["complete"] and s1["n_vectors"] == 450 and s1["target"] == uno.port
    assert s1["score_agreement"] == 1.0 and s1["label_agreement"] == 1.0

    flashed = cli("flash", str(second), "--port", uno.port)
    assert flashed.returncode == 0, flashed.stderr
    gone = cli("validate", str(first), "--port", uno.port, "--no-raw")  # the first model is gone
    assert gone.returncode == 1 and "device runs model" in gone.stderr and "Traceback" not in gone.stderr
    v2 = cli("validate", str(second), "--port", uno.port, "--json")
    assert v2.returncode == 0, v2.stderr
    s2 = json.loads(v2.stdout)
    assert s2["score_agreement"] == 1.0 and s2["label_agreement"] == 1.0 and s2["complete"]
    assert s2["raw_input"]["labels_changed"] == 0


def test_next_start_sees_the_last_upload(models, tmp_path):
    """flash.bin is the chip's flash: a restarted board runs what was uploaded before it stopped."""
    from tinyproto.device.board_sim import SimulatedBoard
    from tinyproto.device.protocol import open_device

    state = tmp_path / "state"
    model_hash = int(json.loads((models[1] / "model.json").read_text())["model_hash"], 16)
    hex_path = models[1] / json.loads((models[1] / "build.json").read_text())["hex"]
    with SimulatedBoard("atmega328p", state) as board:
        assert avrdude("atmega328p", "arduino", board.port, hex_path).returncode == 0
    assert (state / "flash.bin").stat().st_size == 32768
    with SimulatedBoard("atmega328p", state) as board, open_device(board.port) as client:
        assert client.info.model_hash == model_hash


def test_killed_upload_is_refused_then_recovered(uno, models):
    """avrdude killed midway: the application is half old, half new. The bootloader is untouched, so the next
    flash works; before it, validate refuses the half-written application through the HELLO handshake.
    The board is given another model (iris) first: had an earlier test left digits on it, a quarter of digits
    written over digits would be the whole of digits again, and validate would rightly accept it."""
    first, other = models
    flashed = cli("flash", str(other), "--port", uno.port)
    assert flashed.returncode == 0, flashed.stderr
    hex_path = first / json.loads((first / "build.json").read_text())["hex"]
    proc = subprocess.Popen(["avrdude", "-p", "atmega328p", "-c", "arduino", "-P", uno.port, "-b", "115200", "-D",
                             "-U", f"flash:w:{hex_path}:i"], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    log = b""
    deadline = time.monotonic() + 30
    while log.count(b"#") < 12 and time.monotonic() < deadline:  # a quarter of the write progress bar
        ready, _, _ = select.select([proc.stderr], [], [], 1.0)
        if ready:
            log += os.read(proc.stderr.fileno(), 256)
    assert b"Writing" in log, log.decode(errors="replace")
    proc.kill()
    proc.wait()
    proc.stderr.close()

    refused = cli("validate", str(first), "--port", uno.port, "--no-raw")
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    assert "flash" in refused.stderr  # "device runs model ... — flash first" or "is the firmware flashed?"
    recovered = cli("flash", str(first), "--port", uno.port)
    assert recovered.returncode == 0, recovered.stderr
    assert "answers with model" in recovered.stdout


def test_pio_upload_and_test_through_the_port(uno, models):
    """`pio run -t upload --upload-port P` and `pio test --upload-port P` in a generated project: the upload goes
    through avrdude and Optiboot, the test output is read from the pty (no DTR/RTS there)."""
    from tinyproto.device.build import pio_environment, prepare_pio_core

    if shutil.which("pio") is None and not (Path(sys.executable).parent / "pio").exists():
        pytest.skip("PlatformIO not installed")
    project = models[0]
    env = pio_environment(prepare_pio_core())
    env["PLATFORMIO_BUILD_DIR"] = str(project / ".pio" / "port-test-build")  # keep build.json's firmware as is
    pio = [sys.executable, "-m", "platformio"]
    upload = subprocess.run([*pio, "run", "-d", str(project), "-t", "upload", "--upload-port", uno.port],
                            capture_output=True, text=True, env=env, timeout=300)
    assert upload.returncode == 0, upload.stdout[-2000:] + upload.stderr[-2000:]
    assert "bytes of flash verified" in upload.stdout + upload.stderr
    test = subprocess.run([*pio, "test", "-d", str(project), "-e", "uno_offline", "--upload-port", uno.port],
                          capture_output=True, text=True, env=env, timeout=300)
    out = test.stdout + test.stderr
    assert test.returncode == 0, out[-3000:]
    assert "bytes of flash verified" in out and "[Errno 25]" not in out
    assert "test_model  PASSED" in out


def test_learning_on_the_board_survives_a_reset_and_a_power_cycle(tmp_path, compiled):
    """tinyproto learn --port: the learning firmware goes through the bootloader, the counts are learned over the
    port, saved to EEPROM and reloaded after a reset (reopening the port); after the board is stopped and started
    again (eeprom.bin), the counts are still there."""
    from tinyproto.device.board_sim import SimulatedBoard
    from tinyproto.device.protocol import open_device

    model = tmp_path / "iris"  # what `compile iris --model flynn --budget 1kB --learnable` writes: the run's copy
    shutil.copytree(compiled("iris", "1kB", "flynn", learnable=True), model, symlinks=True)
    state = tmp_path / "state"
    with SimulatedBoard("atmega328p", state, fresh=True) as board:
        learned = cli("learn", str(model), "--port", board.port, "--save-eeprom", "--json")
        assert learned.returncode == 0, learned.stderr
        summary = json.loads(learned.stdout)
        assert summary["target"] == board.port and summary["counts_identical"]
        assert summary["eeprom"]["saved"] and summary["eeprom"]["reloaded_identical"]
        with open_device(board.port) as client:  # one more reset
            loaded = client.eeprom_load()
            assert loaded.loaded and loaded.n_samples == summary["n_samples"]
            counts = client.read_all_counts()
            assert any(counts)
    with SimulatedBoard("atmega328p", state) as board, open_device(board.port) as client:  # power cycle
        assert client.info.learning
        client.clear()  # SRAM: all zero (the firmware starts from the compiled counts) ...
        assert not any(client.read_all_counts())
        reloaded = client.eeprom_load()  # ... the EEPROM kept the learned record
        assert reloaded.loaded and reloaded.n_samples == summary["n_samples"]
        assert client.read_all_counts() == counts


# ------------------------------------------------------------------------------------------------- the Mega


def test_mega_2560_stk500v2_upload_and_reset_on_open(tmp_path):
    """The simulated ATmega2560 runs Debian's stk500v2 bootloader, avrdude -c wiring uploads a small application
    through it, and every open of the port resets into it. (digits / ProtoNN / 2 kB flashed and validated through
    it: tests/test_boards.py and, on a second simulator, tests/test_board_independent.py.)"""
    import serial

    from tinyproto.device.board_sim import SimulatedBoard

    hex_path = app_hex(tmp_path, "atmega2560", "mega")
    with SimulatedBoard("atmega2560", tmp_path / "mega", fresh=True) as board:
        started = time.monotonic()
        result = avrdude("atmega2560", "wiring", board.port, hex_path)
        assert result.returncode == 0, result.stderr[-1500:]
        assert time.monotonic() - started < 10 and "bytes of flash verified" in result.stderr
        for _ in range(2):  # each open is a reset: the banner comes again
            with serial.Serial(board.port, 115200, timeout=0.05) as port:
                assert b"UP mega\n" in read_until(port, b"\n", 5.0)
                port.write(b"AB")
                assert read_until(port, b"BC", 2.0).endswith(b"BC")
            time.sleep(0.05)
    assert (tmp_path / "mega" / "flash.bin").stat().st_size == 256 * 1024


# ------------------------------------------------------------------------------------------------- faults


def test_avrdude_missing_names_the_package(models, monkeypatch, tmp_path):
    from tinyproto.core.boards import load_board
    from tinyproto.device.flash import flash_port

    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no avrdude anywhere
    with pytest.raises(TinyprotoError, match="apt-get install avrdude"):
        flash_port(load_board("uno"), "/dev/null", models[0] / "firmware.hex")


def test_nothing_answering_and_the_wrong_bootloader(models, tmp_path):
    """A port where nothing answers, and a Mega's bootloader for an Uno upload: one line each, naming what was
    tried. Both wait on avrdude's sync attempts, so they run side by side."""
    import pty

    from tinyproto.core.boards import load_board
    from tinyproto.device.board_sim import SimulatedBoard
    from tinyproto.device.flash import flash_port

    board = load_board("uno")
    hex_path = models[0] / json.loads((models[0] / "build.json").read_text())["hex"]
    master, slave = pty.openpty()  # a silent device: we hold both ends and never answer
    silent = os.ttyname(slave)

    def attempt(port: str) -> str:
        with pytest.raises(TinyprotoError) as info:
            flash_port(board, port, hex_path)
        return str(info.value)

    try:
        with SimulatedBoard("atmega2560", tmp_path / "mega", fresh=True) as mega, ThreadPoolExecutor(2) as pool:
            messages = list(pool.map(attempt, [silent, mega.port]))
    finally:
        os.close(master)
        os.close(slave)
    for message, port in zip(messages, [silent, mega.port]):
        assert "\n" not in message
        assert f"avrdude -c arduino -b 115200 -p atmega328p on {port}" in message
        assert "no bootloader answered" in message and "wrong port" in message
        assert f"{port} has no DTR line" in message  # a pty: the board must reset itself on open


def test_port_held_by_another_program(uno, models):
    from tinyproto.core.boards import load_board
    from tinyproto.device.flash import flash_port
    from tinyproto.device.protocol import open_device

    with open(uno.port, "rb", buffering=0) as held:
        holder = subprocess.Popen(["sleep", "30"], stdin=held)
    try:
        hex_path = models[0] / json.loads((models[0] / "build.json").read_text())["hex"]
        with pytest.raises(TinyprotoError, match=rf"in use by sleep \(pid {holder.pid}\)"):
            flash_port(load_board("uno"), uno.port, hex_path)
        with pytest.raises(TinyprotoError, match=rf"in use by sleep \(pid {holder.pid}\)"):
            open_device(uno.port)
    finally:
        holder.kill()
        holder.wait()


def test_a_simulator_holding_both_ends_of_its_pty_is_the_device():
    """Simulators (simavr's uart_pty, simuno's ELF mode) often keep their own slave fd open: the process that
    holds the master of that pty is the device, not "another program" on the port."""
    from tinyproto.device.port_checks import port_holders

    device = subprocess.Popen([sys.executable, "-c", "import os, pty, time\nm, s = pty.openpty()\n"
                               "print(os.ttyname(s), flush=True)\ntime.sleep(30)"], stdout=subprocess.PIPE, text=True)
    try:
        port = device.stdout.readline().strip()
        assert port_holders(port) == []
        with open(port, "rb", buffering=0) as held:
            monitor = subprocess.Popen(["sleep", "30"], stdin=held)
        try:
            assert port_holders(port) == [(monitor.pid, "sleep")]
        finally:
            monitor.kill()
            monitor.wait()
    finally:
        device.kill()
        device.wait()
        device.stdout.close()


def test_leonardo_upload_cannot_be_simulated():
    from tinyproto.device.board_sim import bootloader_for

    with pytest.raises(TinyprotoError, match="Caterina.*USB"):
        bootloader_for("atmega32u4")


# ------------------------------------------------------------------------------------------------ the command


def test_board_sim_command_serves_several_boards_and_stops_cleanly(tmp_path):
    """`tinyproto board-sim --count 2`: two ports, each with Optiboot answering STK_GET_SYNC;
    SIGINT stops both (exit 0, flash images written); a SIGKILLed command takes its simulators with it."""
    import serial

    proc = subprocess.Popen([sys.executable, "-m", "tinyproto", "board-sim", "--count", "2", "--state",
                             str(tmp_path / "boards"), "--fresh"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        lines = [proc.stdout.readline().split() for _ in range(2)]
        assert [name for name, _ in lines] == ["uno-0", "uno-1"]
        for _, port in lines:
            with serial.Serial(port, 115200, timeout=0.05) as line:
                assert STK_IN_SYNC_OK in get_sync(line)
        children = _children(proc.pid)
        assert len(children) == 2
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        assert not any(_alive(pid) for pid in children)
        for name in ("uno-0", "uno-1"):
            assert (tmp_path / "boards" / name / "flash.bin").stat().st_size == 32768
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not list((tmp_path / "boards").rglob("*.tmp"))

    killed = subprocess.Popen([sys.executable, "-m", "tinyproto", "board-sim", "--state",
                               str(tmp_path / "k")], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    killed.stdout.readline()
    children = _children(killed.pid)
    killed.kill()
    killed.wait()
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert children and not any(_alive(pid) for pid in children)


def test_board_sim_command_errors_are_one_line(tmp_path):
    for args, message in ((["--board", "nosuch"], "unknown board"), (["--board", "atmega32u4"], "USB")):
        result = tinyproto("board-sim", *args, "--state", str(tmp_path), timeout=30)
        assert result.returncode == 1 and message in result.stderr and "Traceback" not in result.stderr
    # two boards on one state directory would lose uploads: the second refuses
    from tinyproto.device.board_sim import SimulatedBoard

    with SimulatedBoard("atmega328p", tmp_path / "one") as board:
        with pytest.raises(TinyprotoError, match="in use by another simulated board"):
            SimulatedBoard("atmega328p", tmp_path / "one").start()
        deadline = time.monotonic() + 5
        while not board.flash_image.exists() and time.monotonic() < deadline:
            time.sleep(0.1)  # the first periodic save (every second)
        with pytest.raises(TinyprotoError, match="in use by another simulated board"):
            SimulatedBoard("atmega328p", tmp_path / "one", fresh=True).start()
        assert board.flash_image.exists()  # --fresh deletes nothing under a running board


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("image", ["flash.bin", "eeprom.bin"])
@pytest.mark.parametrize("kind", ["directory", "link"])
def test_board_sim_refuses_a_state_image_that_is_not_a_file(tmp_path, image, kind):
    """A directory at eeprom.bin was called "another board's image"; a link at flash.bin had the simulator read (and
    on exit write) the file it points at, and --fresh removed the link. One line, and nothing changed."""
    from helpers import refused

    state = tmp_path / "state"
    state.mkdir()
    mine = tmp_path / "mine.bin"
    mine.write_bytes(bytes(32768))
    if kind == "directory":
        (state / image).mkdir()
    else:
        (state / image).symlink_to(mine)
    for fresh in ([], ["--fresh"]):
        line = refused(["board-sim", "--state", str(state), *fresh], f"{state / image} (the simulated board's",
                       tmp_path)
        assert ("a directory" if kind == "directory" else "a symbolic link") in line and "move it away" in line
    assert mine.read_bytes() == bytes(32768)


@pytest.mark.parametrize("count", [1, 2])
def test_board_sim_refuses_a_state_directory_holding_other_files(tmp_path, count):
    """`--state ~` or a model directory: a flash.bin of the user's there was read as the chip's flash, rewritten at
    exit, and removed by --fresh. A state directory holds only the board's images; anything else is refused in one
    line, nothing changed."""
    from helpers import refused

    state = tmp_path / "state"
    boards = [state] if count == 1 else [state / "uno-0", state / "uno-1"]
    for folder in boards:
        folder.mkdir(parents=True)
        (folder / "flash.bin").write_bytes(b"the user's own image")
        (folder / "notes.txt").write_text("mine\n")
    for fresh in ([], ["--fresh"]):
        line = refused(["board-sim", "--count", str(count), "--state", str(state), *fresh], "notes.txt", tmp_path)
        assert "give an empty or new directory" in line, line
    assert all((folder / "flash.bin").read_bytes() == b"the user's own image" for folder in boards)


@pytest.mark.parametrize("kind", ["loop", "dangling"])
def test_board_sim_refuses_a_state_link_that_leads_nowhere(tmp_path, kind):
    """--state a link that loops (or points at nothing) was "error: File exists: state", which said nothing of what
    to do."""
    from helpers import refused

    state = tmp_path / "state"
    state.symlink_to("state" if kind == "loop" else tmp_path / "gone" / "x")
    line = refused(["board-sim", "--state", str(state)], "leads nowhere", tmp_path)
    assert "give a directory" in line, line


def test_board_sim_refuses_a_state_that_is_a_fifo(tmp_path):
    """--state a FIFO (not a regular file, so click's file check let it by) said "error: File exists: state"."""
    import os

    from helpers import refused

    os.mkfifo(tmp_path / "state")
    line = refused(["board-sim", "--state", str(tmp_path / "state")], "exists and is not a directory", tmp_path)
    assert "give a directory" in line, line
