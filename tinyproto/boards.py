"""Board facts (SRAM, flash, clock, currents) read from boards/<name>.json."""

from __future__ import annotations

import json
from dataclasses import dataclass

from tinyproto.errors import TinyprotoError
from tinyproto.resources import resource_dir


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
    serial_baud: int
    upload_protocol: str
    upload_speed: int
    mcu_active_current_ma: float
    board_active_current_ma: float
    mcu_active_current_source: str
    board_active_current_source: str

    def energy_mj(self, seconds: float, current_ma: float) -> float:
        """V x I x t in millijoules (a model from datasheet figures, not a measurement)."""
        return self.voltage_v * current_ma * seconds


def available_boards() -> list[str]:
    return sorted(p.stem for p in resource_dir("boards").glob("*.json"))


def load_board(name: str) -> Board:
    path = resource_dir("boards") / f"{name}.json"
    if not path.is_file():
        raise TinyprotoError(f"unknown board {name!r}; known boards: {', '.join(available_boards())}")
    raw = json.loads(path.read_text())
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
    )
