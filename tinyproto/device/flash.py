"""Put a built firmware on a board with avrdude, through the board's bootloader (protocol and speed from
boards/<name>.json: the Uno's Optiboot speaks `arduino` at 115200).

One path for physical and simulated boards: a board from `tinyproto board-sim` runs the real
bootloader behind a pseudo-terminal, and avrdude cannot tell it from /dev/ttyACM0 (it only warns that a pty has
no DTR line). Every failure is one TinyprotoError line that says what was tried and the likely cause.

The Leonardo (ATmega32U4) has no USB-serial bridge: its Caterina bootloader is entered by a "1200-baud touch"
of the board's own USB port (open at 1200 baud, close; the running sketch's USB stack resets the chip), after
which Caterina enumerates as a port of its own -- often under a new name -- for about 8 s. `enter_bootloader`
does that touch and finds the new port (what the Arduino IDE and PlatformIO do). It is tested against a pty
double that records the baud rates it is opened at and then "re-enumerates" as a second pty speaking AVR109;
a real Caterina cannot be simulated here (simavr has no USB device side), so the reset itself is not.
Layer: device.
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import shutil
import stat
import subprocess
import termios
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tinyproto.core.boards import Board
from tinyproto.core.errors import TinyprotoError

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


@dataclass(frozen=True)
class FlashResult:
    seconds: float  # avrdude's run, from start to exit
    bytes_written: int | None  # as avrdude reports it ("N bytes of flash written")
    log: str
    upload_port: str = ""  # where avrdude wrote: the given port, or the bootloader's after a 1200-baud touch


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


MEMORY_DEVICES_MAJOR = 1  # Linux: /dev/null, /dev/zero, /dev/urandom, ... (shared by every process, no tty)


def port_holders(port: str) -> list[tuple[int, str]]:
    """(pid, program) of the other processes that have `port` open, from /proc (what `fuser` does). Processes of
    other users are invisible without privileges; pyserial's exclusive lock catches those that lock.

    For a pseudo-terminal (/dev/pts/N, a simulated board) a process that also holds its master side is the
    device itself -- a simulator keeping its own slave open, like tools/simuno's ELF mode or simavr's uart_pty --
    and not counted."""
    try:
        wanted = os.stat(os.path.realpath(port))
    except OSError:
        return []
    if not stat.S_ISCHR(wanted.st_mode) or os.major(wanted.st_rdev) == MEMORY_DEVICES_MAJOR:
        return []  # not a serial line (a file; /dev/null, /dev/zero): opening it says what is wrong
    pts_index = _pts_index(os.path.realpath(port))
    holders = []
    own = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        fd_dir = f"/proc/{entry.name}/fd"
        try:
            fds = os.listdir(fd_dir)
        except OSError:
            continue
        holds_slave = holds_master = False
        for fd in fds:
            try:
                st = os.stat(f"{fd_dir}/{fd}")
            except OSError:
                continue
            if st.st_rdev == wanted.st_rdev and st.st_ino == wanted.st_ino and st.st_dev == wanted.st_dev:
                holds_slave = True
            elif pts_index is not None and _is_master_of(entry.name, fd, pts_index):
                holds_master = True
        if holds_slave and not holds_master:
            holders.append((int(entry.name), _program(entry.name)))
    return holders


def _pts_index(path: str) -> int | None:
    match = re.fullmatch(r"/dev/pts/(\d+)", path)
    return int(match.group(1)) if match else None


def _is_master_of(pid: str, fd: str, index: int) -> bool:
    """fd of process pid is /dev/ptmx for pts `index` (Linux shows `tty-index:` in its fdinfo)."""
    try:
        if not os.readlink(f"/proc/{pid}/fd/{fd}").endswith("ptmx"):
            return False
        with open(f"/proc/{pid}/fdinfo/{fd}") as info:
            return f"tty-index:\t{index}\n" in info.read()
    except OSError:
        return False


def _program(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return comm.read().strip()
    except OSError:
        return "?"


def check_port_free(port: str, must_be_terminal: bool = True) -> None:
    """A port another program holds is refused: two programs on one serial line corrupt each other's bytes."""
    if "://" in port:
        return
    if must_be_terminal:
        _check_is_terminal(port)
    holders = port_holders(port)
    if holders:
        who = ", ".join(f"{name} (pid {pid})" for pid, name in holders[:3])
        raise TinyprotoError(f"serial port {port} is in use by {who}; close it first (a serial monitor, "
                             "another tinyproto or avrdude run)")


def check_port_usable(port: str) -> None:
    """Refuse, in one line and before any long work (a build), a --port that cannot be the board's: missing, not
    a character device, not openable (permission, a dead device) or not a terminal, or held by another program.
    A pyserial URL (rfc2217://, socket://) is checked when it is opened."""
    if "://" in port:
        return
    try:
        mode = os.stat(port).st_mode
    except FileNotFoundError:
        raise TinyprotoError(f"serial port {port} does not exist; is the board plugged in? "
                             "(try ls /dev/ttyACM* /dev/ttyUSB*)") from None
    except OSError as exc:
        raise TinyprotoError(f"cannot use serial port {port}: {exc.strerror}") from None
    if not stat.S_ISCHR(mode):
        raise TinyprotoError(f"{port} is not a serial port (not a character device); give the board's port, "
                             "e.g. /dev/ttyACM0 or /dev/ttyUSB0")
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        hint = " (add yourself to the dialout group)" if exc.errno == errno.EACCES else ""
        raise TinyprotoError(f"cannot open serial port {port}: {exc.strerror}{hint}") from None
    os.close(fd)
    check_port_free(port)


def _check_is_terminal(port: str) -> None:
    """/dev/null, a regular file or a directory given as --port: say so, instead of blaming whoever has it open."""
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return  # avrdude's own open reports why (missing, permission)
    try:
        is_terminal = os.isatty(fd)
    finally:
        os.close(fd)
    if not is_terminal:
        raise TinyprotoError(f"{port} is not a serial port (not a terminal device); give the board's port, "
                             "e.g. /dev/ttyACM0 or /dev/ttyUSB0")


def _written(log: str) -> int | None:
    match = re.search(r"(\d+) bytes of flash written", log)
    return int(match.group(1)) if match else None


def has_modem_lines(port: str) -> bool | None:
    """Whether `port` has DTR/RTS (TIOCMGET works): a USB-serial bridge does, a pseudo-terminal (a simulated
    board) does not. None if the port cannot be opened to ask or is no terminal."""
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not os.isatty(fd):
            return None
        fcntl.ioctl(fd, termios.TIOCMGET, b"\0\0\0\0")
        return True
    except OSError as exc:
        return False if exc.errno in (errno.ENOTTY, errno.EINVAL) else None
    finally:
        os.close(fd)


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
        raise TinyprotoError(f"serial port {port} does not exist; is the board plugged in? (try ls /dev/ttyACM* /dev/ttyUSB*)")
    if not hex_path.is_file():
        raise TinyprotoError(f"firmware {hex_path} does not exist; run `tinyproto build` first")
    check_port_free(port)
    if needs_touch(board):
        port = enter_bootloader(port, list_ports or list_serial_ports)
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
                            text=True, errors="replace")
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
