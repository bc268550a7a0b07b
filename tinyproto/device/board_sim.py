"""A simulated board that behaves like the real one at its serial port: `tinyproto board-sim`.

`SimulatedUno` (tinyproto.device.sim) loads an ELF straight into the simulated chip: fast, for `--sim`.
`SimulatedBoard` is the other half: simuno's board mode (tools/simuno, `--bootloader`) runs the board's real
bootloader and nothing else, so whatever reaches the port goes the way it goes on a physical board:

- the chip starts in its boot section (BOOTRST), in the board's own bootloader (boards/<name>.json
  `upload.bootloader`): Optiboot for the Uno and the current Nano (built once from Debian's arduino-core-avr source;
  see `ensure_bootloader`), Debian's ATmegaBOOT hex at 57600 baud for the Pro Mini 3.3 V (8 MHz), Debian's stk500v2
  hex for the ATmega2560 (Mega 2560);
- opening the port is an external reset (what DTR and the reset capacitor do); power-on at start;
- simulated time is paced to the wall clock, so the bootloader's 1 s window and avrdude's timeouts relate as
  they do on the board;
- flash and EEPROM live in a state directory (flash.bin, eeprom.bin; raw images written atomically whenever
  they change and at exit), so the next start sees the last upload and the learned counts, as a chip would.

An upload is therefore `avrdude -c <protocol> -b <speed> -P <port> -U flash:w:fw.hex:i` with the protocol and
speed of the board file: `tinyproto flash DIR --port PORT` and PlatformIO's `pio run -t upload --upload-port
PORT` take exactly the path they take with a board on /dev/ttyACM0.

The bootloaders themselves (which one a board ships with, building Optiboot) are tinyproto.device.bootloaders.
The Leonardo (ATmega32U4) cannot be simulated this way: its Caterina bootloader speaks USB CDC, and simavr has
no USB host; `bootloader_for("atmega32u4")` says so (tinyproto.device.usb_touch does its 1200-baud touch on a real one).

Command line (runs until Ctrl-C / SIGTERM; one line `<name> <port>` per board on stdout):

    tinyproto board-sim [--board uno] [--count N] [--state DIR] [--fresh]
Layer: device.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

from tinyproto.core.errors import TinyprotoError
from tinyproto.device.bootloaders import (  # the board's bootloader, by board or MCU (re-exported)
    _BOOTLOADERS,
    _NOT_SIMULABLE,
    BOOTLOADERS_BY_NAME,
    Bootloader,
    board_bootloader,
    bootloader_for,
    ensure_bootloader,
)

__all__ = [
    "BOOTLOADERS_BY_NAME", "Bootloader", "SimulatedBoard", "board_bootloader", "bootloader_for", "default_state_dir",
    "ensure_bootloader", "resolve_board", "resolve_board_loader", "serve",
]

FLASH_IMAGE = "flash.bin"
EEPROM_IMAGE = "eeprom.bin"
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0  # simuno writes flash + EEPROM on its way out (a Mega's 256 KB image included)


@contextlib.contextmanager
def _state_lock(directory: Path):
    """The lock simuno holds on its state directory while it runs (flock on the directory itself: nothing is
    left on disk, and a killed holder releases it)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise TinyprotoError(f"the state directory {directory} is in use by another simulated board") from None
        yield
    finally:
        os.close(fd)


def default_state_dir(name: str) -> Path:
    from tinyproto.device.sim import tinyproto_cache_dir

    return tinyproto_cache_dir() / "boards" / name


class SimulatedBoard:
    """One simulated board on a fresh pseudo-terminal (`.port`), running its real bootloader, while the context
    is open. Flash and EEPROM persist in `state_dir` (flash.bin, eeprom.bin).

    >>> with SimulatedBoard("atmega328p", state_dir) as board:
    ...     subprocess.run(["avrdude", "-c", "arduino", "-P", board.port, ...])
    """

    def __init__(self, mcu: str, state_dir: Path | str, f_cpu_hz: int = 16_000_000, fresh: bool = False,
                 bootloader: Bootloader | None = None) -> None:
        self.bootloader = bootloader or bootloader_for(mcu)
        if self.bootloader.mcu != mcu:
            raise TinyprotoError(f"{self.bootloader.name} is a bootloader for the {self.bootloader.mcu}, not the {mcu}")
        self.mcu = mcu
        self.state_dir = Path(state_dir)
        self.f_cpu_hz = f_cpu_hz
        self.fresh = fresh
        self.port: str | None = None
        self.returncode: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr_file = None

    @property
    def flash_image(self) -> Path:
        return self.state_dir / FLASH_IMAGE

    @property
    def eeprom_image(self) -> Path:
        return self.state_dir / EEPROM_IMAGE

    def __enter__(self) -> SimulatedBoard:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def start(self) -> str:
        from tinyproto.device.sim import ensure_simulator

        binary = ensure_simulator()
        hex_path = ensure_bootloader(self.bootloader)
        from tinyproto.device.sim import check_image_file

        self.state_dir.mkdir(parents=True, exist_ok=True)
        for image, what in ((self.flash_image, "the simulated board's flash image"),
                            (self.eeprom_image, "the simulated board's EEPROM image")):
            check_image_file(image, what)  # before --fresh too: it removes only images this class wrote
        if self.fresh:  # a new chip: only the images this class writes are removed, and never under a running board
            with _state_lock(self.state_dir):
                for image in (self.flash_image, self.eeprom_image):
                    image.unlink(missing_ok=True)
        self._stderr_file = tempfile.TemporaryFile(prefix="tinyproto-board-")
        command = [str(binary), "--bootloader", str(hex_path), "--mcu", self.mcu, "--freq", str(self.f_cpu_hz),
                   "--flash", str(self.flash_image.resolve()), "--eeprom", str(self.eeprom_image.resolve()),
                   "--parent-pipe"]
        try:
            # Own session: a Ctrl-C in the terminal reaches Python, which stops simuno itself (it saves first).
            self._proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=self._stderr_file, start_new_session=True)
            self.port = self._read_pty_line()
        except BaseException:
            self.stop()
            raise
        return self.port

    def _read_pty_line(self) -> str:
        from tinyproto.device.sim import read_pty_line

        return read_pty_line(self._proc, f"{self.mcu} board", self.stderr_text, _STOP_TIMEOUT_S)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self) -> int | None:
        """SIGTERM; simuno writes flash and EEPROM and exits 0. Returns its exit status."""
        proc, self._proc = self._proc, None
        if proc is None:
            return self.returncode
        if proc.poll() is None:
            try:
                os.kill(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout=_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()
        self.returncode = proc.returncode
        return self.returncode

    def stderr_text(self) -> str:
        if self._stderr_file is None:
            return ""
        fd = self._stderr_file.fileno()
        return os.pread(fd, os.fstat(fd).st_size, 0).decode("utf-8", "replace").strip()


# ------------------------------------------------------------------------------------------------ command line


def resolve_board(name: str) -> tuple[str, int, str]:
    """--board NAME -> (mcu, f_cpu_hz, title): a board file (boards/NAME.json) or, for boards without one, an MCU
    name with a simulated bootloader (atmega2560 = the Mega 2560's chip)."""
    return resolve_board_loader(name)[:3]


def resolve_board_loader(name: str) -> tuple[str, int, str, Bootloader]:
    """resolve_board plus the bootloader the simulated board runs."""
    from tinyproto.core.boards import available_boards, load_board

    if name in available_boards():
        board = load_board(name)
        loader = board_bootloader(board)
        if (board.upload_protocol, board.upload_speed) != (loader.protocol, loader.speed):
            raise TinyprotoError(
                f"boards/{name}.json uploads with -c {board.upload_protocol} -b {board.upload_speed}, the simulated "
                f"{board.mcu}'s bootloader ({loader.name}) speaks -c {loader.protocol} -b {loader.speed}"
            )
        return board.mcu, board.f_cpu_hz, board.title, loader
    if name in _BOOTLOADERS or name in _NOT_SIMULABLE:
        loader = bootloader_for(name)
        return loader.mcu, 16_000_000, f"{name} board", loader
    raise TinyprotoError(f"unknown board {name!r}; give a board file name ({', '.join(available_boards())}) "
                         f"or an MCU ({', '.join(sorted(_BOOTLOADERS))})")


def _describe(name: str, board: SimulatedBoard) -> str:
    loader = board.bootloader
    return (f"{name}: {loader.name} on {board.port}; upload with avrdude -p {board.mcu} -c {loader.protocol} "
            f"-b {loader.speed} -P {board.port}; flash and EEPROM kept in {board.state_dir}")


# what a simulated board keeps in its state directory: its images, and their temporary names while simuno writes one
STATE_NAMES = frozenset({FLASH_IMAGE, EEPROM_IMAGE, f"{FLASH_IMAGE}.tmp", f"{EEPROM_IMAGE}.tmp"})


def check_state_dir(directory: Path) -> None:
    """A --state directory holds only the board's images: `--state ~` or a model directory would have had a
    flash.bin of the user's read as the chip's flash and overwritten at exit (or removed by --fresh)."""
    if os.path.islink(directory) and not os.path.exists(directory):  # mkdir said only "File exists"
        raise TinyprotoError(f"--state {directory} is a symbolic link that leads nowhere (a dangling link or a loop); "
                             "give a directory, or a new name")
    if os.path.lexists(directory) and not Path(directory).is_dir():  # a file, a FIFO, a device: "File exists"
        raise TinyprotoError(f"--state {directory} exists and is not a directory; give a directory, or a new name")
    if not Path(directory).is_dir():
        return  # made by the board
    others = sorted(entry.name for entry in Path(directory).iterdir() if entry.name not in STATE_NAMES)
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        raise TinyprotoError(f"--state {directory} holds files that are not a simulated board's ({shown}); a board "
                             f"keeps only {FLASH_IMAGE} and {EEPROM_IMAGE} there and rewrites them: give an empty "
                             "or new directory")


def serve(board_name: str, count: int, state: Path | None, fresh: bool, out=sys.stdout, err=sys.stderr) -> int:
    """Start `count` boards, print `<name> <port>` per board, run until SIGINT/SIGTERM, stop them cleanly."""
    if count < 1:
        raise TinyprotoError("--count must be at least 1")
    mcu, f_cpu, title, loader = resolve_board_loader(board_name)
    names = [board_name if count == 1 else f"{board_name}-{i}" for i in range(count)]
    if state is not None:
        dirs = [state] if count == 1 else [state / name for name in names]
        for directory in dirs:
            check_state_dir(directory)
    else:
        dirs = [default_state_dir(name) for name in names]
    stop_requested: list[int] = []

    def on_signal(signo, frame):  # noqa: ARG001 - signal handler signature
        stop_requested.append(signo)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    boards: list[SimulatedBoard] = []
    try:
        for name, directory in zip(names, dirs):
            board = SimulatedBoard(mcu, directory, f_cpu, fresh=fresh, bootloader=loader)
            board.start()
            boards.append(board)
            print(f"{name} {board.port}", file=out, flush=True)
            print(_describe(name, board), file=err, flush=True)
        print(f"{count} simulated {title} running; Ctrl-C stops {'it' if count == 1 else 'them'}", file=err, flush=True)
        while not stop_requested:
            for name, board in zip(names, boards):
                if not board.running:
                    raise TinyprotoError(f"simulated board {name} stopped (status {board.stop()}): "
                                         f"{board.stderr_text() or 'no reason given'}")
            time.sleep(0.2)
    finally:
        for board in boards:
            board.stop()
        for signo, handler in previous.items():
            signal.signal(signo, handler)
    return 0

