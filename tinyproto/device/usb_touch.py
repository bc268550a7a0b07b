"""The 1200-baud touch: how a board whose bootloader is entered through its own USB port (the Leonardo's
Caterina) is put into that bootloader, and where its port then appears.

The Leonardo (ATmega32U4) has no USB-serial bridge: its Caterina bootloader is entered by a "1200-baud touch"
of the board's own USB port (open at 1200 baud, close; the running sketch's USB stack resets the chip), after
which Caterina enumerates as a port of its own -- often under a new name -- for about 8 s. `enter_bootloader`
does that touch and finds the new port (what the Arduino IDE and PlatformIO do). It is tested against a pty
double that records the baud rates it is opened at and then "re-enumerates" as a second pty speaking AVR109;
a real Caterina cannot be simulated here (simavr has no USB device side), so the reset itself is not.
Layer: device.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tinyproto.core.boards import Board
from tinyproto.core.errors import TinyprotoError

# Bootloaders entered by a 1200-baud touch of the board's native USB port rather than by a DTR reset.
TOUCH_BOOTLOADERS = frozenset({"caterina"})
TOUCH_BAUD = 1200
# Caterina waits 8 s for avrdude after the touch; its port appears within 1-2 s on Linux.
BOOTLOADER_PORT_WAIT_S = 8.0
# A port that keeps its name and never vanishes between two polls is taken as the bootloader's after this long
# (the Arduino IDE does the same): on some hosts the re-enumeration is quicker than one poll.
SAME_PORT_AFTER_S = 3.0
PORT_POLL_S = 0.1
SERIAL_PORT_GLOBS = ("ttyACM*", "ttyUSB*")


def needs_touch(board: Board) -> bool:
    """The board's bootloader is entered by a 1200-baud touch (the Leonardo's Caterina)."""
    return board.bootloader in TOUCH_BOOTLOADERS


def list_serial_ports() -> set[str]:
    """The USB serial ports present now (/dev/ttyACM*, /dev/ttyUSB*)."""
    return {str(p) for pattern in SERIAL_PORT_GLOBS for p in Path("/dev").glob(pattern)}


def touch_1200(port: str) -> None:
    """Open `port` at 1200 baud with DTR low and close it: the sketch's USB CDC code resets into the bootloader."""
    import serial

    try:
        with serial.Serial(port, TOUCH_BAUD) as line:
            try:
                line.dtr = False
            except OSError:
                pass  # a port without modem lines: opening at 1200 baud is the signal
    except (serial.SerialException, OSError) as exc:
        raise TinyprotoError(f"cannot open {port} at {TOUCH_BAUD} baud to reset the board into its bootloader: "
                             f"{exc}") from None


def enter_bootloader(port: str, list_ports: Callable[[], Iterable[str]] | None = None,
                     wait_s: float = BOOTLOADER_PORT_WAIT_S, sleep: Callable[[float], None] = time.sleep,
                     clock: Callable[[], float] = time.monotonic) -> str:
    """The 1200-baud touch of `port`, then the bootloader's port: the first port that appears afterwards (a port
    that vanished and came back under its old name counts as new), else `port` itself once SAME_PORT_AFTER_S have
    passed without it vanishing."""
    list_ports = list_ports or list_serial_ports
    before = set(list_ports())
    touch_1200(port)
    started = clock()
    vanished = False
    while clock() - started < wait_s:
        sleep(PORT_POLL_S)
        now = set(list_ports())
        new = sorted(now - before)
        if new:
            return new[0]
        vanished = vanished or port not in now
        before &= now
        if not vanished and port in now and clock() - started >= SAME_PORT_AFTER_S:
            return port
    raise TinyprotoError(f"no bootloader port appeared within {wait_s:.0f} s after the {TOUCH_BAUD}-baud touch of "
                         f"{port}: is it the Leonardo's own USB port (not a USB-serial adapter)? If the sketch on it "
                         "has no USB stack (tinyproto's firmware), double-press the reset button and flash within "
                         "8 s, giving the port that appears")
