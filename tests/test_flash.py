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

        def unplug_when_avrdude_runs() -> None:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not _avrdude_running(port):
                time.sleep(0.05)
            time.sleep(0.3)
            board.stop()

        threading.Thread(target=unplug_when_avrdude_runs, daemon=True).start()
        started = time.monotonic()
        with pytest.raises(TinyprotoError) as error:
            flash_port(load_board("uno"), port, hex_path)
        assert time.monotonic() - started < 30, "avrdude was not stopped"
        assert port in str(error.value)
        assert not _avrdude_running(port), "avrdude left running"


def _avrdude_running(port: str) -> bool:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline and cmdline[0].endswith(b"avrdude") and port.encode() in cmdline:
            return True
    return False


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
