"""tinyproto flash (device/flash.py) on a simulated board behind a pty: avrdude is watched, and a port that vanishes
midway stops it at once (it blocked until the 180 s limit)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from helpers import needs

# -------------------------------------------------------------------------------------------- a port that vanishes


@pytest.fixture
def built(built_models, work) -> Path:
    """iris / ProtoNN / 1 kB built on the simulated Uno (once per run), this test's own copy."""
    model = work / "model"
    shutil.copytree(built_models("iris", "1kB"), model, symlinks=True)
    return model


@needs("avrdude")
def test_flash_stops_when_the_port_vanishes_midway(built, work):
    """Was: avrdude blocked in a write to the vanished port until the 180 s limit."""
    from tinyproto.core.boards import load_board
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.device.board_sim import SimulatedBoard
    from tinyproto.device.flash import flash_port

    model = built
    hex_path = model / json.loads((model / "build.json").read_text())["hex"]
    with SimulatedBoard("atmega328p", work / "uno-state", fresh=True) as board:
        port = board.port

        unplugged_at: list[int] = []

        def unplug_when_avrdude_writes() -> None:
            """Once avrdude wrote 1 kB to the port (past its sync, ~0.2 kB: the program's pages, ~7 kB with their
            commands), not at a delay after it started (0.3 s was still its sync, on an idle machine too)."""
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and _written_to(port) < 1024:
                time.sleep(0.002)
            unplugged_at.append(_written_to(port))
            board.stop()

        threading.Thread(target=unplug_when_avrdude_writes, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(TinyprotoError) as error:
            flash_port(load_board("uno"), port, hex_path)
        assert time.monotonic() - started < 30, "avrdude was not stopped"
        assert port in str(error.value)
        assert not _avrdude_running(port), "avrdude left running"
        assert unplugged_at and unplugged_at[0] >= 1024, "unplugged before avrdude wrote the program"


def _avrdude_pids(port: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"avrdude") and port.encode() in cmdline:
            found.append(pid)
    return found


def _avrdude_running(port: str) -> bool:
    return bool(_avrdude_pids(port))


def _written_to(port: str) -> int:
    """The bytes the avrdude on `port` has written (/proc/PID/io's wchar; 0 while none runs)."""
    for pid in _avrdude_pids(port):
        try:
            return int(next(line.split()[1] for line in Path(f"/proc/{pid}/io").read_text().splitlines()
                            if line.startswith("wchar:")))
        except OSError:  # ended meanwhile
            pass
    return 0


def test_avrdude_refusing_a_url_is_not_told_to_plug_the_board_in():
    """flash --port loop:// (or socket://...): avrdude cannot open a pyserial URL; the line said "is the board
    plugged in?"."""
    from tinyproto.core.boards import load_board
    from tinyproto.device.flash import explain_failure

    log = "avrdude: ser_open(): cannot open port loop://: No such file or directory\n"
    line = explain_failure(load_board("uno"), "loop://", log)
    assert "avrdude cannot open the URL loop://" in line and "plugged in" not in line, line
    line = explain_failure(load_board("uno"), "/dev/ttyACM7", log.replace("loop://", "/dev/ttyACM7"))
    assert "cannot open /dev/ttyACM7 — is the board plugged in?" in line, line
