"""Put a built firmware on a board with avrdude, through the board's bootloader (protocol and speed from
boards/<name>.json: the Uno's Optiboot speaks `arduino` at 115200).

One path for physical and simulated boards: a board from `tinyproto board-sim` runs the real
bootloader behind a pseudo-terminal, and avrdude cannot tell it from /dev/ttyACM0 (it only warns that a pty has
no DTR line). Every failure is one TinyprotoError line that says what was tried and the likely cause.

The Leonardo's 1200-baud touch is in device/usb_touch.py; the checks that a port exists, is a terminal and is
free (the /proc scan for its holders) in device/port_checks.py.
Layer: device.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tinyproto.core.boards import Board
from tinyproto.core.errors import TinyprotoError
from tinyproto.device.port_checks import check_port_free, has_modem_lines
from tinyproto.device.usb_touch import enter_bootloader, needs_touch

APT_AVRDUDE = "avrdude"
AVRDUDE_TIMEOUT_S = 180.0  # a 32 KB image with verify takes ~10 s at 115200 baud; this only stops a wedged avrdude
# stk500v1 (`-c arduino`) sync attempts: avrdude's default of 10 waits ~56 s on a port where nothing answers;
# Optiboot answers the first attempt after the reset, so 3 keep a margin for line noise and fail in ~17 s.
ARDUINO_SYNC_ATTEMPTS = 3
WATCH_POLL_S = 0.25  # how often a running avrdude's port is checked
PORT_GONE_S = 1.0  # a port missing this long is gone (not a re-enumeration blink)

# avrdude's device signatures of the chips tinyproto knows, to name the board that answered instead
SIGNATURES = {"1e950f": "ATmega328P (Uno, Nano)", "1e9514": "ATmega328 (not P)", "1e9801": "ATmega2560 (Mega 2560)",
              "1e9587": "ATmega32U4 (Leonardo, Micro)", "1e9406": "ATmega168"}


@dataclass(frozen=True)
class FlashResult:
    seconds: float  # avrdude's run, from start to exit
    bytes_written: int | None  # as avrdude reports it ("N bytes of flash written")
    log: str
    upload_port: str = ""  # where avrdude wrote: the given port, or the bootloader's after a 1200-baud touch


# Longer than a simulated board's polling for opens and closes of its port (tools/simuno: 1 ms; others may poll
# every 100 ms or so).
PORT_CLOSED_S = 0.25


def open_and_close(port: str) -> None:
    """Open the port, close it, wait PORT_CLOSED_S: what PlatformIO's atmelavr platform does before avrdude
    (FlushSerialBuffer), minus the DTR/RTS calls a pty cannot take. On a board with auto-reset it is one reset
    more. A simulated board that notices opens by polling its pty, and missed the first open because nobody had
    opened the pty before (its master shows no hang-up until then), sees this close, so avrdude's open is a reset
    there as on a physical board."""
    if "://" in port:
        return
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return  # avrdude's own open reports why
    os.close(fd)
    time.sleep(PORT_CLOSED_S)


def avrdude_command(board: Board, port: str, hex_path: Path) -> list[str]:
    command = ["avrdude", "-p", board.mcu, "-c", board.upload_protocol, "-P", port, "-b", str(board.upload_speed)]
    if board.upload_protocol == "arduino":
        command += ["-x", f"attempts={ARDUINO_SYNC_ATTEMPTS}"]
    return [*command, "-D", "-U", f"flash:w:{hex_path}:i"]


def _written(log: str) -> int | None:
    match = re.search(r"(\d+) bytes of flash written", log)
    return int(match.group(1)) if match else None


def _reset_hint(port: str) -> str:
    """Why the board may not have reset, for the line that says no bootloader answered. avrdude resets a board by
    pulsing DTR/RTS; on a port without them the board has to reset itself when the port is opened."""
    if "://" in port:
        return ""
    if has_modem_lines(port) is False:
        return (f"; {port} has no DTR line (a pseudo-terminal), so avrdude cannot reset the board: it must reset "
                "itself when the port is opened (tinyproto board-sim does), or be reset by hand as the upload starts")
    return "; if its auto-reset is off, press the reset button just as the upload starts"


def explain_failure(board: Board, port: str, log: str) -> str:
    """avrdude's log of a failed upload -> one line: what was tried and the likely cause."""
    tried = f"avrdude -c {board.upload_protocol} -b {board.upload_speed} -p {board.mcu} on {port}"
    signature = re.search(r"[Dd]evice signature = (?:0x)?([0-9a-fA-F]{6})", log)
    if signature and "expected signature" in log:
        found = signature.group(1).lower()
        chip = SIGNATURES.get(found, f"a chip with signature 0x{found}")
        return f"{tried}: the board answers as {chip}, not {board.mcu} — wrong board file or wrong port"
    if re.search(r"not in sync|not responding|timeout|failed to get sync|no response", log, re.IGNORECASE):
        return (f"{tried}: no bootloader answered — wrong port, a board other than the {board.title.split(' (')[0]} "
                f"(another bootloader or baud rate), no bootloader on the chip, or the board did not reset"
                f"{_reset_hint(port)}")
    if re.search(r"verification error|content mismatch", log, re.IGNORECASE):
        return f"{tried}: the flash read back differs from the image — flash again; if it repeats the chip is worn"
    if re.search(r"Permission denied", log):
        return f"{tried}: no permission to open {port} — add your user to the 'dialout' group"
    if re.search(r"cannot open port|No such file", log) and "://" in port:  # "is it plugged in?" is not the cause
        return (f"{tried}: avrdude cannot open the URL {port}; it uploads through a serial device such as "
                "/dev/ttyACM0 (validate and learn --no-flash take pyserial URLs, flash does not)")
    if re.search(r"cannot open port|No such file", log):
        return f"{tried}: cannot open {port} — is the board plugged in? (ls /dev/ttyACM* /dev/ttyUSB*)"
    last = next((line.strip() for line in reversed(log.strip().splitlines()) if "error" in line.lower()), "")
    return f"{tried} failed: {last or 'see avrdude -v'}"


def flash_port(board: Board, port: str, hex_path: Path,
               list_ports: Callable[[], Iterable[str]] | None = None) -> FlashResult:
    """Upload `hex_path` through the board's bootloader (after a 1200-baud touch of `port` for the Leonardo). A
    missing tool or port, a busy port or a failed upload is one TinyprotoError line."""
    if shutil.which("avrdude") is None:
        raise TinyprotoError(f"avrdude is not installed; install it with: sudo apt-get install {APT_AVRDUDE}")
    if not Path(port).exists() and "://" not in port:
        raise TinyprotoError(f"serial port {port} does not exist; is the board plugged in? "
                             "(try ls /dev/ttyACM* /dev/ttyUSB*)")
    if not hex_path.is_file():
        raise TinyprotoError(f"firmware {hex_path} does not exist; run `tinyproto build` first")
    check_port_free(port)
    if needs_touch(board):
        port = enter_bootloader(port, list_ports)
    else:
        open_and_close(port)
    started = time.monotonic()
    returncode, log = run_watched(avrdude_command(board, port, hex_path), port)
    seconds = time.monotonic() - started
    if returncode != 0:
        raise TinyprotoError(explain_failure(board, port, log))
    return FlashResult(seconds, _written(log), log, port)


def run_watched(command: list[str], port: str, limit_s: float = AVRDUDE_TIMEOUT_S) -> tuple[int, str]:
    """Run avrdude on `port` while watching the port: avrdude blocks for ever in a write to a port whose device
    went away (a board unplugged, a simulator stopped), so it is stopped as soon as the port is gone for
    PORT_GONE_S, and after `limit_s` whatever happens. Returns (exit status, stdout + stderr)."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                            encoding="utf-8", errors="replace")
    deadline = time.monotonic() + limit_s
    gone_since: float | None = None
    try:
        while True:
            try:
                out, err = proc.communicate(timeout=WATCH_POLL_S)
                return proc.returncode, out + err
            except subprocess.TimeoutExpired:
                pass
            now = time.monotonic()
            if "://" not in port and not os.path.exists(port):
                gone_since = gone_since if gone_since is not None else now
                if now - gone_since >= PORT_GONE_S:
                    raise TinyprotoError(f"serial port {port} disappeared while avrdude was flashing it (board "
                                         "unplugged?); plug it back in and flash again")
            else:
                gone_since = None
            if now > deadline:
                raise TinyprotoError(f"avrdude did not finish flashing {port} within {limit_s:.0f} s (a board "
                                     "that stopped answering midway?); flash again")
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    """End avrdude if it still runs (TERM, then KILL) and reap it: no process is left behind."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            proc.kill()
    try:
        proc.communicate(timeout=5)
    except (subprocess.TimeoutExpired, ValueError, OSError):
        proc.kill()
        proc.wait()


def upload_target(board, port: str | None, upload_port: str | None) -> str | None:
    """Where avrdude writes: --upload-port, else --port (None without a port). The Leonardo needs both: avrdude
    goes through its own USB port (a 1200-baud touch starts Caterina), tinyproto's protocol through Serial1 and a
    USB-serial adapter."""
    if upload_port and not port:
        raise TinyprotoError("--upload-port needs --port too: the port the firmware answers on after the upload")
    if port is None:
        return None
    if needs_touch(board) and upload_port in (None, port):
        raise TinyprotoError(f"the {board.title.split(' (')[0]} is flashed through its own USB port and talks on "
                             f"{board.serial_port.split(' (')[0]} through a USB-serial adapter: give --upload-port "
                             "(its USB port, e.g. /dev/ttyACM0) and --port (the adapter's, e.g. /dev/ttyUSB0)")
    return upload_port or port
