"""Put a built firmware on a real Uno with avrdude (the Uno's bootloader speaks the `arduino` protocol)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tinyproto.boards import Board
from tinyproto.errors import TinyprotoError


def avrdude_command(board: Board, port: str, hex_path: Path) -> list[str]:
    return [
        "avrdude", "-p", board.mcu, "-c", board.upload_protocol, "-P", port, "-b", str(board.upload_speed),
        "-D", "-U", f"flash:w:{hex_path}:i",
    ]


def flash_port(board: Board, port: str, hex_path: Path) -> str:
    """Upload `hex_path`; returns avrdude's log. A missing tool, port or a failed upload is a TinyprotoError."""
    if shutil.which("avrdude") is None:
        raise TinyprotoError("avrdude is not installed (apt-get install avrdude)")
    if not Path(port).exists() and "://" not in port:
        raise TinyprotoError(f"serial port {port} does not exist; is the board plugged in? (try ls /dev/ttyACM* /dev/ttyUSB*)")
    if not hex_path.is_file():
        raise TinyprotoError(f"firmware {hex_path} does not exist; run `tinyproto build` first")
    result = subprocess.run(avrdude_command(board, port, hex_path), capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        tail = "\n".join(result.stderr.strip().splitlines()[-4:])
        raise TinyprotoError(f"avrdude could not flash {port}:\n{tail}")
    return result.stderr
