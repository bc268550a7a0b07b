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

The Leonardo (ATmega32U4) cannot be simulated this way: its Caterina bootloader speaks USB CDC, and simavr has
no USB host; `bootloader_for("atmega32u4")` says so.

Command line (runs until Ctrl-C / SIGTERM; one line `<name> <port>` per board on stdout):

    tinyproto board-sim [--board uno] [--count N] [--state DIR] [--fresh]
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType


from tinyproto.core.errors import TinyprotoError

APT_BOOTLOADER_PACKAGE = "arduino-core-avr"
ARDUINO_BOOTLOADERS = Path("/usr/share/arduino/hardware/arduino/avr/bootloaders")
OPTIBOOT_SOURCE = ARDUINO_BOOTLOADERS / "optiboot"
STK500V2_MEGA_HEX = ARDUINO_BOOTLOADERS / "stk500v2" / "stk500boot_v2_mega2560.hex"
ATMEGABOOT_PRO_8MHZ_HEX = ARDUINO_BOOTLOADERS / "atmega" / "ATmegaBOOT_168_atmega328_pro_8MHz.hex"
FLASH_IMAGE = "flash.bin"
EEPROM_IMAGE = "eeprom.bin"
_START_TIMEOUT_S = 10.0
_STOP_TIMEOUT_S = 5.0  # simuno writes flash + EEPROM on its way out (a Mega's 256 KB image included)


@dataclass(frozen=True)
class Bootloader:
    mcu: str
    name: str
    protocol: str  # avrdude -c
    speed: int  # avrdude -b
    boot_start: int  # byte address of the boot section (BOOTRST) and the largest application + 1


_OPTIBOOT_328P = Bootloader("atmega328p", "Optiboot 4.4 (Debian arduino-core-avr source)", "arduino", 115200, 0x7E00)
_STK500V2_2560 = Bootloader("atmega2560", "stk500v2 (Debian arduino-core-avr hex)", "wiring", 115200, 0x3E000)
# The Pro Mini 3.3 V / 8 MHz ships with ATmegaBOOT (boards.txt pro.menu.cpu.8MHzatmega328): 57600 baud, a 2 KB boot
# section. Debian's hex is built for 8 MHz, so it runs only on a chip clocked at 8 MHz.
_ATMEGABOOT_PRO8 = Bootloader("atmega328p", "ATmegaBOOT 168 for the Pro 8 MHz (Debian arduino-core-avr hex)", "arduino",
                              57600, 0x7800)
_BOOTLOADERS = {b.mcu: b for b in (_OPTIBOOT_328P, _STK500V2_2560)}  # an MCU's usual bootloader (16 MHz boards)
# boards/<name>.json `upload.bootloader` -> the bootloader (the Uno and the current Nano: Optiboot)
BOOTLOADERS_BY_NAME = {"optiboot": _OPTIBOOT_328P, "stk500v2": _STK500V2_2560, "atmegaboot_pro_8mhz": _ATMEGABOOT_PRO8}
_NOT_SIMULABLE = {
    "atmega32u4": "the Leonardo's Caterina bootloader speaks USB CDC and simavr has no USB host, so its upload "
                  "cannot be simulated here (its application can still run in the simulator)",
}  # fmt: skip

# Optiboot as the Arduino core's Makefile builds it for the atmega328 target, except LED_START_FLASHES=0:
# with gcc 5.4 the LED-flashing variant is 532 bytes, runs past 0x7FFF and its version word overwrites code
# (Debian's prebuilt optiboot_atmega328.hex has exactly that defect); without the flashes it is 496 bytes.
_OPTIBOOT_FLAGS = [
    "-g", "-Wall", "-Os", "-fno-inline-small-functions", "-fno-split-wide-types", "-mshort-calls",
    "-mmcu=atmega328p", "-DF_CPU=16000000L", "-DBAUD_RATE=115200", "-DLED_START_FLASHES=0",
    "-Wl,--section-start=.text=0x7e00", "-Wl,--section-start=.version=0x7ffe",
    "-Wl,--relax", "-Wl,--gc-sections", "-nostartfiles", "-nostdlib",
]  # fmt: skip


def bootloader_for(mcu: str) -> Bootloader:
    """The bootloader a board with this MCU ships with; a clear error for boards that cannot be simulated."""
    if mcu in _NOT_SIMULABLE:
        raise TinyprotoError(f"{mcu}: {_NOT_SIMULABLE[mcu]}")
    if mcu not in _BOOTLOADERS:
        known = ", ".join(sorted(_BOOTLOADERS))
        raise TinyprotoError(f"no simulated bootloader for {mcu}; boards with a simulated bootloader: {known}")
    return _BOOTLOADERS[mcu]


def _cache_dir() -> Path:
    from tinyproto.device.sim import tinyproto_cache_dir

    return tinyproto_cache_dir() / "bootloaders"


def _missing_package(what: str) -> TinyprotoError:
    return TinyprotoError(
        f"the simulated board's bootloader needs {what}; install it with: sudo apt-get install {APT_BOOTLOADER_PACKAGE}"
    )


def _hex_addresses(text: str) -> set[int]:
    """Every byte address the data records of an Intel HEX text write."""
    base, addresses = 0, set()
    for line in text.split():
        count, offset, kind = int(line[1:3], 16), int(line[3:7], 16), int(line[7:9], 16)
        if kind == 0:
            addresses.update(range(base + offset, base + offset + count))
        elif kind == 2:
            base = int(line[9:13], 16) << 4
        elif kind == 4:
            base = int(line[9:13], 16) << 16
    return addresses


def _build_optiboot() -> Path:
    source = OPTIBOOT_SOURCE / "optiboot.c"
    if not source.is_file():
        raise _missing_package(f"Optiboot's source ({source} is missing)")
    if shutil.which("avr-gcc") is None or shutil.which("avr-objcopy") is None:
        raise TinyprotoError("building Optiboot needs avr-gcc; install it with: sudo apt-get install gcc-avr binutils-avr avr-libc")
    inputs = b"".join((OPTIBOOT_SOURCE / name).read_bytes() for name in ("optiboot.c", "boot.h", "pin_defs.h", "stk500.h")
                      if (OPTIBOOT_SOURCE / name).is_file())
    digest = hashlib.sha256(inputs + " ".join(_OPTIBOOT_FLAGS).encode()).hexdigest()[:16]
    out = _cache_dir() / f"optiboot_atmega328-{digest}.hex"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Private scratch directory next to the result: parallel first uses never see a half-written hex.
    with tempfile.TemporaryDirectory(prefix=".optiboot-", dir=out.parent) as scratch:
        elf = Path(scratch) / "optiboot.elf"
        hex_tmp = Path(scratch) / "optiboot.hex"
        steps = [
            ["avr-gcc", *_OPTIBOOT_FLAGS, f"-I{OPTIBOOT_SOURCE}", "-o", str(elf), str(source)],
            ["avr-objcopy", "-j", ".text", "-j", ".data", "-j", ".version", "-O", "ihex", str(elf), str(hex_tmp)],
        ]
        for command in steps:
            result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=120)
            if result.returncode != 0:
                detail = " ".join(result.stderr.strip().splitlines()[-2:])
                raise TinyprotoError(f"could not build Optiboot from {source}: {detail}")
        # The code must end before the version word at 0x7FFE: the defect of Debian's prebuilt hex.
        code = _hex_addresses(hex_tmp.read_text()) - {0x7FFE, 0x7FFF}
        if not code or min(code) != _OPTIBOOT_328P.boot_start or max(code) >= 0x7FFE:
            raise TinyprotoError(f"Optiboot built from {source} does not fit the 512-byte boot section below its "
                                 "version word (0x7E00..0x7FFD)")
        os.replace(hex_tmp, out)
    return out


def ensure_bootloader(mcu: str | Bootloader) -> Path:
    """Intel HEX of `mcu`'s bootloader (or of a given Bootloader): Optiboot built into the cache (once per source
    hash), or Debian's hex."""
    loader = mcu if isinstance(mcu, Bootloader) else bootloader_for(mcu)
    if loader is _OPTIBOOT_328P:
        return _build_optiboot()
    if loader is _ATMEGABOOT_PRO8:
        if not ATMEGABOOT_PRO_8MHZ_HEX.is_file():
            raise _missing_package(f"the Pro Mini's ATmegaBOOT ({ATMEGABOOT_PRO_8MHZ_HEX} is missing)")
        return ATMEGABOOT_PRO_8MHZ_HEX
    if not STK500V2_MEGA_HEX.is_file():
        raise _missing_package(f"the Mega's stk500v2 bootloader ({STK500V2_MEGA_HEX} is missing)")
    return STK500V2_MEGA_HEX


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
        self.state_dir.mkdir(parents=True, exist_ok=True)
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


def board_bootloader(board) -> Bootloader:
    """The bootloader a board (tinyproto.boards.Board) ships with, from its file's `upload.bootloader`."""
    if board.mcu in _NOT_SIMULABLE:
        raise TinyprotoError(f"{board.name} ({board.mcu}): {_NOT_SIMULABLE[board.mcu]}")
    if board.bootloader not in BOOTLOADERS_BY_NAME:
        raise TinyprotoError(f"{board.name}: no simulated {board.bootloader} bootloader; simulated: "
                             f"{', '.join(sorted(BOOTLOADERS_BY_NAME))}")
    loader = BOOTLOADERS_BY_NAME[board.bootloader]
    if loader.mcu != board.mcu:
        raise TinyprotoError(f"{board.name}: {loader.name} is for the {loader.mcu}, the board has an {board.mcu}")
    return loader


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


def serve(board_name: str, count: int, state: Path | None, fresh: bool, out=sys.stdout, err=sys.stderr) -> int:
    """Start `count` boards, print `<name> <port>` per board, run until SIGINT/SIGTERM, stop them cleanly."""
    if count < 1:
        raise TinyprotoError("--count must be at least 1")
    mcu, f_cpu, title, loader = resolve_board_loader(board_name)
    names = [board_name if count == 1 else f"{board_name}-{i}" for i in range(count)]
    if state is not None:
        dirs = [state] if count == 1 else [state / name for name in names]
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

