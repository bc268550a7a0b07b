"""Board facts (SRAM, flash, clock, currents) read from boards/<name>.json. Layer: core."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace

from tinyproto.core.errors import TinyprotoError
from tinyproto.core.resources import resource_dir


@dataclass(frozen=True)
class Board:
    name: str
    title: str
    mcu: str
    f_cpu_hz: int
    voltage_v: float
    sram_bytes: int
    flash_bytes_for_sketch: int
    eeprom_bytes: int
    sram_reserved_bytes: int  # kept free for the firmware's own stack frames, protocol state and margin
    serial_baud: int  # the protocol's line: the fastest rate both the clock and the USB bridge divide exactly
    upload_protocol: str
    upload_speed: int
    mcu_active_current_ma: float
    board_active_current_ma: float
    mcu_active_current_source: str
    board_active_current_source: str
    pio_board: str = "uno"  # PlatformIO's board id (official atmelavr platform and tinyproto's offline one)
    fqbn: str = "arduino:avr:uno"  # Arduino's fully qualified board name
    bootloader: str = "optiboot"  # the bootloader the board ships with (tinyproto.device.board_sim)
    serial_port: str = "Serial (USART0)"  # where the protocol runs
    # Seconds the host stays silent after opening the port: a bootloader that stays in charge while it hears
    # bytes (the Mega's stk500v2) only starts the application after a quiet second; Optiboot needs none.
    boot_quiet_s: float = 0.0
    serial_baud_fallback: int = 115200  # `--baud` for a bridge or cable that does not carry serial_baud
    serial_baud_source: str = ""  # why serial_baud: the divisors at both ends of the line

    def with_baud(self, baud: int | None) -> "Board":
        """This board talking at `baud` (None: its own serial_baud); refused unless the clock divides it within
        the 2 % a UART tolerates (U2X: f_cpu / (8 x (UBRR + 1)))."""
        if baud is None or baud == self.serial_baud:
            return self
        if baud <= 0:
            raise TinyprotoError(f"--baud must be a positive number of bits per second, got {baud}")
        problem = baud_problem(self.f_cpu_hz, baud)
        if problem:
            raise TinyprotoError(f"{problem}; {self.title} talks at {self.serial_baud} or {self.serial_baud_fallback}")
        return replace(self, serial_baud=baud)

    @property
    def mhz(self) -> float:
        return self.f_cpu_hz / 1e6

    def energy_mj(self, seconds: float, current_ma: float) -> float:
        """V x I x t in millijoules (a model from datasheet figures, not a measurement)."""
        return self.voltage_v * current_ma * seconds


MAX_UBRR = 4095  # UBRRn is 12 bits wide on every AVR USART of the boards here
MAX_BAUD_ERROR = 0.025  # the firmware's fallback rates are +2.1 % off (115200 at 16 MHz, 57600 at 8 MHz)


def baud_problem(f_cpu_hz: int, baud: int) -> str | None:
    """Why the USART at f_cpu_hz cannot talk at `baud` (a positive rate), or None: its 12-bit divisor, its fastest
    rate, and the 2 % a UART tolerates. Checked for --baud and for the rates a board file states."""
    mhz = f_cpu_hz / 1e6
    if ubrr_of(f_cpu_hz, baud) > MAX_UBRR:
        slowest = -(-f_cpu_hz // (8 * (MAX_UBRR + 1)))
        return (f"{baud} baud is too slow for the USART at {mhz:g} MHz (its divisor has 12 bits: {slowest} baud at "
                "the least)")
    fastest = f_cpu_hz // 8  # U2X with a divisor of 0: "-100.0 % off" said nothing of being too fast
    if baud > fastest:
        return f"{baud} baud is too fast for the USART at {mhz:g} MHz ({fastest} baud at the most)"
    error = baud_error(f_cpu_hz, baud)
    if abs(error) > MAX_BAUD_ERROR:
        return f"{baud} baud is {100 * error:+.1f} % off at {mhz:g} MHz (a UART tolerates about 2 %)"
    return None


def ubrr_of(f_cpu_hz: int, baud: int) -> int:
    """The firmware's divisor (firmware/tp_transport.c TP_UBRR, double speed): the nearest f_cpu / (8 baud) - 1."""
    return max(0, (f_cpu_hz + 4 * baud) // (8 * baud) - 1)


def baud_error(f_cpu_hz: int, baud: int) -> float:
    """Relative error of the rate the USART makes for `baud` (0.0: exact)."""
    return f_cpu_hz / (8 * (ubrr_of(f_cpu_hz, baud) + 1)) / baud - 1


def available_boards() -> list[str]:
    return sorted(p.stem for p in resource_dir("boards").glob("*.json") if p.is_file())


_BOARD_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


def load_board(name: str) -> Board:
    # a board is a name from boards/, never a path: model.json's "board" comes from a file the user may edit
    if not isinstance(name, str) or not _BOARD_NAME.fullmatch(name):
        raise TinyprotoError(f"unknown board {name!r}; known boards: {', '.join(available_boards())}")
    path = resource_dir("boards") / f"{name}.json"
    if not os.path.lexists(path):  # a directory or a loop of links there is named by read_json, not "unknown"
        raise TinyprotoError(f"unknown board {name!r}; known boards: {', '.join(available_boards())}")
    from tinyproto.core.safe_io import read_json

    raw = read_json(path, "a board file", strict=True)
    problem = board_file_problem(raw, name)
    if problem:
        raise TinyprotoError(f"{path} is damaged: {problem}; fix the board file (or reinstall tinyproto)")
    return _board_from_json(raw)


_TEXT = re.compile(r"[^\x00-\x1f\x7f]{1,2000}")  # one line of text: it goes into platformio.ini and C comments
_MCU = re.compile(r"[a-z][a-z0-9]{1,31}")  # avr-gcc's -mmcu names
_IDENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:+=,-]{0,127}")  # MCU, PlatformIO board id, fqbn (and its options)
# Every field of a board file: its kind and range (the five shipped boards lie well inside). Each value reaches a
# division (clock, baud), an SRAM or flash budget, an energy figure, a compiler flag or platformio.ini.
_BOARD_FIELDS = {
    "name": ("ident", None), "title": ("text", None), "mcu": ("mcu", None),
    "f_cpu_hz": ("int", (32_768, 100_000_000)), "voltage_v": ("number", (0.5, 12.0)),
    "sram_bytes": ("int", (256, 1 << 24)), "flash_bytes_for_sketch": ("int", (1024, 1 << 26)),
    "eeprom_bytes": ("int", (0, 1 << 24)), "sram_reserved_bytes": ("int", (0, 1 << 24)),
    "serial_baud": ("int", (300, 10_000_000)), "serial_baud_fallback": ("int", (300, 10_000_000)),
    "mcu_active_current_ma": ("number", (0.001, 10_000.0)), "board_active_current_ma": ("number", (0.001, 10_000.0)),
    "mcu_active_current_source": ("text", None), "board_active_current_source": ("text", None),
    "pio_board": ("ident", None), "fqbn": ("ident", None), "serial_port": ("text", None),
    "serial_baud_source": ("text", None),
}
_OPTIONAL_BOARD_FIELDS = {"pio_board", "fqbn", "serial_port", "serial_baud_fallback", "serial_baud_source"}
_UPLOAD_FIELDS = {"protocol": ("ident", None), "speed": ("int", (300, 10_000_000)), "bootloader": ("ident", None),
                  "boot_quiet_s": ("number", (0.0, 60.0))}


def _value_problem(value: object, kind: str, limits: tuple | None) -> str | None:
    if kind in ("text", "ident", "mcu"):
        if not isinstance(value, str) or not {"text": _TEXT, "ident": _IDENT, "mcu": _MCU}[kind].fullmatch(value):
            return {"text": "one line of text", "ident": "a name of letters, digits and _ . : + = , -",
                    "mcu": "an MCU name of lower-case letters and digits"}[kind]
        return None
    if isinstance(value, bool) or not isinstance(value, int if kind == "int" else (int, float)):
        return "a whole number" if kind == "int" else "a number"
    low, high = limits
    if not low <= value <= high:  # (NaN fails this too)
        return f"{'a whole number' if kind == 'int' else 'a number'} from {low:g} to {high:g}"
    return None


def board_file_problem(raw: object, name: str) -> str | None:
    """What is wrong with a board file's content (the file boards/<name>.json), or None."""
    if not isinstance(raw, dict):
        return "not a JSON object"
    fields = [(raw, key, kind, limits, key in _OPTIONAL_BOARD_FIELDS) for key, (kind, limits) in _BOARD_FIELDS.items()]
    upload = raw.get("upload")
    if not isinstance(upload, dict):
        return "upload is not an object with the upload's protocol and speed"
    fields += [(upload, key, kind, limits, key in ("bootloader", "boot_quiet_s"))
               for key, (kind, limits) in _UPLOAD_FIELDS.items()]
    for doc, key, kind, limits, optional in fields:
        if key not in doc and optional:
            continue
        what = _value_problem(doc.get(key), kind, limits)
        if what:
            where = key if doc is raw else f"upload.{key}"
            return f"{where} is {json.dumps(doc.get(key))[:40]}, not {what}"
    if raw["name"] != name:
        return f"its name {raw['name']!r} is not its file's name {name!r}"
    if raw["sram_reserved_bytes"] >= raw["sram_bytes"]:
        return f"sram_reserved_bytes {raw['sram_reserved_bytes']} leaves nothing of sram_bytes {raw['sram_bytes']}"
    for key in ("serial_baud", "serial_baud_fallback"):  # the firmware's line: a rate its clock cannot make is no line
        if key in raw:
            problem = baud_problem(raw["f_cpu_hz"], raw[key])
            if problem:
                return f"{key}: {problem}"
    return None


def _board_from_json(raw: dict) -> Board:
    return Board(
        name=raw["name"],
        title=raw["title"],
        mcu=raw["mcu"],
        f_cpu_hz=int(raw["f_cpu_hz"]),
        voltage_v=float(raw["voltage_v"]),
        sram_bytes=int(raw["sram_bytes"]),
        flash_bytes_for_sketch=int(raw["flash_bytes_for_sketch"]),
        eeprom_bytes=int(raw["eeprom_bytes"]),
        sram_reserved_bytes=int(raw["sram_reserved_bytes"]),
        serial_baud=int(raw["serial_baud"]),
        upload_protocol=raw["upload"]["protocol"],
        upload_speed=int(raw["upload"]["speed"]),
        mcu_active_current_ma=float(raw["mcu_active_current_ma"]),
        board_active_current_ma=float(raw["board_active_current_ma"]),
        mcu_active_current_source=raw["mcu_active_current_source"],
        board_active_current_source=raw["board_active_current_source"],
        pio_board=raw.get("pio_board", raw["name"]),
        fqbn=raw.get("fqbn", f"arduino:avr:{raw['name']}"),
        bootloader=raw["upload"].get("bootloader", "optiboot"),
        boot_quiet_s=float(raw["upload"].get("boot_quiet_s", 0.0)),
        serial_port=raw.get("serial_port", "Serial (USART0)"),
        serial_baud_fallback=int(raw.get("serial_baud_fallback", 115200)),
        serial_baud_source=raw.get("serial_baud_source", ""),
    )


def all_boards() -> list[Board]:
    """Every board file, each checked: a boards/NAME.json that is a directory, a broken link or unreadable is
    named by load_board, never left out of `tinyproto boards` without a word."""
    every = sorted(resource_dir("boards").glob("*.json"))
    for path in every:
        if not _BOARD_NAME.fullmatch(path.stem):
            raise TinyprotoError(f"{path}: not a board file name (letters, digits, '_', '.' and '-', at most 64); "
                                 "rename or remove it")
    return [load_board(path.stem) for path in every]


def boards_table_rows() -> list[tuple[str, ...]]:
    """One row per board for `tinyproto boards`."""
    rows = []
    for b in all_boards():
        rows.append((b.name, b.mcu, f"{b.mhz:g} MHz", f"{b.voltage_v:g} V", f"{b.sram_bytes}",
                     f"{b.flash_bytes_for_sketch}", f"{b.eeprom_bytes}", f"{b.serial_baud}",
                     f"{b.upload_protocol}@{b.upload_speed}",
                     f"{b.mcu_active_current_ma:g}/{b.board_active_current_ma:g} mA"))
    return rows
