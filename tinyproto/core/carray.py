"""CArray: one constant array of the deployed model, exactly as it is rendered into C.

The ledger counts bytes from these objects and the renderer prints them, so the two cannot disagree.
Layer: core.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# C type -> (numpy dtype used to hold and check the values, bytes per element on AVR and host alike)
CTYPES: dict[str, tuple[type, int]] = {
    "int8_t": (np.int8, 1),
    "uint8_t": (np.uint8, 1),
    "int16_t": (np.int16, 2),
    "uint16_t": (np.uint16, 2),
    "int32_t": (np.int32, 4),
    "uint32_t": (np.uint32, 4),
}


@dataclass(frozen=True)
class CArray:
    """A flat constant array placed in flash (PROGMEM). `values` is 1-D and already of the C type."""

    name: str  # C identifier without the `tp_` prefix, e.g. "W_values"
    ctype: str  # one of CTYPES
    values: np.ndarray
    what: str  # one line for the ledger: what the array holds and why it has this size

    def __post_init__(self) -> None:
        dtype, _ = CTYPES[self.ctype]
        values = np.ascontiguousarray(self.values).reshape(-1)
        if values.size == 0:
            raise ValueError(f"array {self.name} is empty; omit it instead (C forbids empty arrays)")
        info = np.iinfo(dtype)
        if values.min() < info.min or values.max() > info.max:
            raise ValueError(f"array {self.name} has values outside {self.ctype}")
        object.__setattr__(self, "values", values.astype(dtype))

    @property
    def count(self) -> int:
        return int(self.values.size)

    @property
    def nbytes(self) -> int:
        return self.count * CTYPES[self.ctype][1]
