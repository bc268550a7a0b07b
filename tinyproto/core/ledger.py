"""The byte ledger: every byte count tinyproto reports (model, working SRAM, firmware) comes from here.

Layer: core."""

from __future__ import annotations

from dataclasses import dataclass, field

from tinyproto.core.carray import CArray


@dataclass(frozen=True)
class SramItem:
    """A buffer the inference needs in SRAM (on the stack or static), with its size in bytes."""

    name: str
    nbytes: int
    what: str


@dataclass(frozen=True)
class FirmwareSizes:
    """What `avr-size -A` and the device report for a built firmware."""

    text_bytes: int
    data_bytes: int
    bss_bytes: int
    stack_peak_bytes: int | None = None  # measured on the device (stack painting); None before a run

    @property
    def flash_bytes(self) -> int:
        return self.text_bytes + self.data_bytes  # .data's initial values also live in flash

    @property
    def sram_static_bytes(self) -> int:
        return self.data_bytes + self.bss_bytes


@dataclass
class Ledger:
    arrays: list[CArray]
    working_sram: list[SramItem]
    firmware: FirmwareSizes | None = field(default=None)

    @property
    def model_bytes(self) -> int:
        """Every byte the model puts in flash: the sum over the rendered arrays."""
        return sum(a.nbytes for a in self.arrays)

    @property
    def working_sram_bytes(self) -> int:
        return sum(item.nbytes for item in self.working_sram)

    def by_array(self) -> dict[str, int]:
        return {a.name: a.nbytes for a in self.arrays}

    def to_dict(self) -> dict:
        out: dict = {
            "model_bytes": self.model_bytes,
            "arrays": {a.name: {"ctype": a.ctype, "count": a.count, "bytes": a.nbytes, "what": a.what}
                       for a in self.arrays},
            "working_sram_bytes": self.working_sram_bytes,
            "working_sram": {s.name: {"bytes": s.nbytes, "what": s.what} for s in self.working_sram},
        }
        if self.firmware is not None:
            fw = self.firmware
            out["firmware"] = {
                "flash_bytes": fw.flash_bytes,
                "text_bytes": fw.text_bytes,
                "data_bytes": fw.data_bytes,
                "bss_bytes": fw.bss_bytes,
                "sram_static_bytes": fw.sram_static_bytes,
                "stack_peak_bytes": fw.stack_peak_bytes,
            }
        return out
