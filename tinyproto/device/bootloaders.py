"""The bootloaders simulated boards run (tinyproto.device.board_sim): which one a board ships with, and where its
Intel HEX comes from -- Optiboot built once from Debian's arduino-core-avr source (Debian's prebuilt hex overruns
the boot section), Debian's stk500v2 and ATmegaBOOT hex files as shipped. The Leonardo's Caterina speaks USB CDC
and cannot be simulated (simavr has no USB host); asking for it is one clear error.
Layer: device."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tinyproto.core.errors import TinyprotoError

APT_BOOTLOADER_PACKAGE = "arduino-core-avr"
ARDUINO_BOOTLOADERS = Path("/usr/share/arduino/hardware/arduino/avr/bootloaders")
OPTIBOOT_SOURCE = ARDUINO_BOOTLOADERS / "optiboot"
STK500V2_MEGA_HEX = ARDUINO_BOOTLOADERS / "stk500v2" / "stk500boot_v2_mega2560.hex"
ATMEGABOOT_PRO_8MHZ_HEX = ARDUINO_BOOTLOADERS / "atmega" / "ATmegaBOOT_168_atmega328_pro_8MHz.hex"


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
        raise TinyprotoError("building Optiboot needs avr-gcc; "
                             "install it with: sudo apt-get install gcc-avr binutils-avr avr-libc")
    inputs = b"".join((OPTIBOOT_SOURCE / name).read_bytes()
                      for name in ("optiboot.c", "boot.h", "pin_defs.h", "stk500.h")
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
            result = subprocess.run(command, capture_output=True, encoding="utf-8", errors="replace", check=False,
                                    timeout=120)
            if result.returncode != 0:
                detail = " ".join(result.stderr.strip().splitlines()[-2:])
                raise TinyprotoError(f"could not build Optiboot from {source}: {detail}")
        # The code must end before the version word at 0x7FFE: the defect of Debian's prebuilt hex.
        code = _hex_addresses(hex_tmp.read_text(encoding="utf-8")) - {0x7FFE, 0x7FFF}
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


def board_bootloader(board) -> Bootloader:
    """The bootloader a board (tinyproto.core.boards.Board) ships with, from its file's `upload.bootloader`."""
    if board.mcu in _NOT_SIMULABLE:
        raise TinyprotoError(f"{board.name} ({board.mcu}): {_NOT_SIMULABLE[board.mcu]}")
    if board.bootloader not in BOOTLOADERS_BY_NAME:
        raise TinyprotoError(f"{board.name}: no simulated {board.bootloader} bootloader; simulated: "
                             f"{', '.join(sorted(BOOTLOADERS_BY_NAME))}")
    loader = BOOTLOADERS_BY_NAME[board.bootloader]
    if loader.mcu != board.mcu:
        raise TinyprotoError(f"{board.name}: {loader.name} is for the {loader.mcu}, the board has an {board.mcu}")
    return loader
