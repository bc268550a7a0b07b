"""What FlyNN needs to learn on a device: the learning firmware's SRAM and EEPROM sizes, and the host's side of
the learned counts (what the device must end with, how it packs them, which model they belong to).

Layer: families (FlyNN). Used by the solver's caller (`compile --learnable`: `count_limit`), by `tinyproto learn`
(pipeline/learn.py) and by the federated parties that learn on a device (federated/device_parties.py). The
learning firmware is the model's normal firmware built with TP_FLYNN_LEARN (firmware/tp_flynn.c, tp_main.c): the
packed counts live in SRAM beside the frame buffer, the app's state, the inference stack and the board's reserve,
and optionally in an EEPROM record (a header, then the counts).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from tinyproto.core import wire
from tinyproto.core.boards import Board
from tinyproto.core.errors import TinyprotoError
from tinyproto.core.render import model_hash
from tinyproto.families.flynn.quantize import fly_working_sram, unpack_bits
from tinyproto.families.flynn.hashing import count_winners

EEPROM_HEADER_BYTES = wire.EEPROM_HEADER_BYTES  # the record's header (firmware/tp_learn.c, tinyproto_sizes.h)
# .bss of the learning app besides the counts, the frame buffer and the input vector (checked against avr-size
# in tests/test_learn.py).
APP_STATIC_BYTES = wire.app_sram(1, 1, streamable=False, raw_input=False, learning=True).app


def count_bytes(n_hashes: int, n_classes: int, bits: int) -> int:
    """Bytes of the packed counts: L x m entries of b bits (the layout of tp_flynn_filters)."""
    return math.ceil(n_hashes * n_classes * bits / 8)


def learn_frame_bytes(n_features: int, n_classes: int) -> int:
    """The learning firmware's frame buffer (TP_FRAME_BUF_NO_RAW) + the int8 input vector its LEARN and PREDICT
    chunks are gathered in (FlyNN does not stream)."""
    sizes = wire.app_sram(n_features, n_classes, streamable=False, raw_input=False, learning=True)
    return sizes.frame + sizes.input


def fly_working_bytes(n_winners: int, n_hash_inputs: int, n_classes: int, store_M: bool, s: int = 16) -> int:
    """Σ IntFlyNN.working_sram() for these sizes (the solver needs it before a model exists; s, which only sizes
    the seeded pattern buffer, defaults to the largest the solver tries)."""
    return sum(item.nbytes for item in fly_working_sram(n_winners, n_hash_inputs, n_classes, store_M, s))


@dataclass(frozen=True)
class LearnSizes:
    """What the learning firmware needs in SRAM and, to persist, in EEPROM; every figure in bytes."""

    n_hashes: int
    n_classes: int
    bits: int
    counts: int
    frame: int
    app_static: int
    working: int
    reserve: int
    sram_total: int
    sram_board: int
    eeprom_record: int
    eeprom_board: int
    largest_m_sram: int  # at these ρ, b, inputs
    largest_m_eeprom: int

    @property
    def fits_sram(self) -> bool:
        return self.sram_total <= self.sram_board

    @property
    def fits_eeprom(self) -> bool:
        return self.eeprom_record <= self.eeprom_board

    def to_dict(self) -> dict:
        return {
            "count_bytes": self.counts,
            "counts": f"{self.n_classes} classes x {self.n_hashes} hash bits x {self.bits} bit(s)",
            "frame_buffer_bytes": self.frame,
            "app_static_bytes": self.app_static,
            "inference_stack_bytes": self.working,
            "reserved_bytes": self.reserve,
            "sram_estimate_bytes": self.sram_total,
            "board_sram_bytes": self.sram_board,
            "eeprom_record_bytes": self.eeprom_record,
            "board_eeprom_bytes": self.eeprom_board,
            "largest_m_sram": self.largest_m_sram,
            "largest_m_eeprom": self.largest_m_eeprom,
        }


def _sram_for_counts(board: Board, n_features: int, n_classes: int, working: int) -> int:
    """SRAM left for the counts once the frame buffer, the app's state, the stack and the reserve are taken."""
    return (board.sram_bytes - board.sram_reserved_bytes - learn_frame_bytes(n_features, n_classes)
            - APP_STATIC_BYTES - working)


def _largest_m(free_bytes: int, n_classes: int, bits: int) -> int:
    return max(0, min(65535, 8 * free_bytes // (n_classes * bits))) if free_bytes > 0 else 0


def count_limit(board: Board, n_features: int, n_classes: int) -> Callable[[int, int, int, bool], int]:
    """For the FlyNN solver (`compile --learnable`): (ρ, b, hash inputs, stored M) -> the largest m whose counts
    fit both the SRAM (beside everything else the learning firmware needs) and the EEPROM record."""

    def limit(rho: int, bits: int, n_inputs: int, store_M: bool) -> int:
        working = fly_working_bytes(rho, n_inputs, n_classes, store_M)
        sram_m = _largest_m(_sram_for_counts(board, n_features, n_classes, working), n_classes, bits)
        eeprom_m = _largest_m(board.eeprom_bytes - EEPROM_HEADER_BYTES, n_classes, bits)
        return min(sram_m, eeprom_m)

    return limit


def learn_sizes(model, board: Board) -> LearnSizes:
    """The learning firmware's SRAM and EEPROM needs for this FlyNN on this board."""
    m, L, b = model.n_hashes, model.n_classes, model.bits
    working = sum(item.nbytes for item in model.working_sram())
    counts = count_bytes(m, L, b)
    frame = learn_frame_bytes(model.n_features, L)
    total = counts + frame + APP_STATIC_BYTES + working + board.sram_reserved_bytes
    return LearnSizes(
        n_hashes=m, n_classes=L, bits=b, counts=counts, frame=frame, app_static=APP_STATIC_BYTES, working=working,
        reserve=board.sram_reserved_bytes, sram_total=total, sram_board=board.sram_bytes,
        eeprom_record=EEPROM_HEADER_BYTES + counts, eeprom_board=board.eeprom_bytes,
        largest_m_sram=_largest_m(_sram_for_counts(board, model.n_features, L, working), L, b),
        largest_m_eeprom=_largest_m(board.eeprom_bytes - EEPROM_HEADER_BYTES, L, b),
    )  # fmt: skip


def check_learnable(model, board: Board, save_eeprom: bool) -> LearnSizes:
    """Refuse, before any build, a FlyNN whose counts the device cannot hold; the error says what would fit."""
    if model.count_scale != 1:  # the device adds one per row: it cannot learn counts kept divided by q
        raise TinyprotoError(
            f"this FlyNN keeps its counts divided by {model.count_scale} (a count scale the solver chose for many "
            "training rows), and the device counts one by one; recompile with `tinyproto compile DATA --model "
            "flynn --budget ... --learnable` for a model that learns on the device")
    sizes = learn_sizes(model, board)
    over = []
    if not sizes.fits_sram:
        over.append(
            f"SRAM needs {sizes.sram_total} B > {sizes.sram_board} B (counts {sizes.counts} + frame buffer "
            f"{sizes.frame} + app {sizes.app_static} + inference stack {sizes.working} + reserve {sizes.reserve})"
        )
    if save_eeprom and not sizes.fits_eeprom:
        over.append(f"the EEPROM record needs {sizes.eeprom_record} B > {sizes.eeprom_board} B")
    if over:
        fit = min(sizes.largest_m_sram, sizes.largest_m_eeprom) if save_eeprom else sizes.largest_m_sram
        one_bit = f" ({fit * sizes.bits} with 1-bit counts)" if sizes.bits > 1 else ""
        also = ""
        if fit > sizes.largest_m_eeprom:
            also = f" (which also keeps them within the EEPROM for --save-eeprom: m <= {sizes.largest_m_eeprom})"
        raise TinyprotoError(
            f"the counts do not fit the device: {sizes.n_classes} classes x m={sizes.n_hashes} x "
            f"{sizes.bits} bit(s) = {sizes.counts} B; {'; '.join(over)}. At most m={fit} fits with "
            f"{sizes.bits}-bit counts{one_bit}: recompile with `tinyproto compile DATA --model flynn --budget ... "
            f"--learnable`{also}"
        )
    return sizes


def host_reference(model) -> str:
    return f"IntFlyNN FlyHash of the same int8 vectors, counts saturated to {model.bits} bit(s)"


def layout_key(model) -> int:
    """32-bit identity of the model without its counts (M, sizes, input stage): the EEPROM record carries it so
    the firmware never loads counts saved by another model."""
    blank = replace(model, counts=np.zeros_like(model.counts))
    digest = hashlib.sha256(f"learn-layout:{model_hash(blank):08x}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def host_counts(model, xq: np.ndarray, y_index: np.ndarray) -> np.ndarray:
    """(L, m) counts the device must end with after learning (xq, y) from zero: the integer reference's winners,
    counted, saturated to the model's bits (the same computation as IntFlyNN.from_classifier)."""
    counts = count_winners(model.winners(xq), np.asarray(y_index), model.n_classes, model.n_hashes)
    return np.minimum(counts, (1 << model.bits) - 1)


def unpack_counts(packed: bytes, model) -> np.ndarray:
    """Device bytes -> (L, m) counts (the packing is (j, l) order, LSB first, like tp_flynn_filters)."""
    m, L = model.n_hashes, model.n_classes
    expected = count_bytes(m, L, model.bits)
    if len(packed) != expected:  # a device running another learning firmware (or none): no reshape error
        raise TinyprotoError(f"the device holds {len(packed)} bytes of counts, this model's {m} x {L} counts of "
                             f"{model.bits} bits take {expected} — it runs another model's learning firmware: "
                             "flash it again (tinyproto learn without --no-flash)")
    values = unpack_bits(np.frombuffer(packed, dtype=np.uint8), model.bits, m * L)
    return values.reshape(m, L).T.copy()


__all__ = ["APP_STATIC_BYTES", "EEPROM_HEADER_BYTES", "LearnSizes", "check_learnable", "count_bytes", "count_limit",
           "fly_working_bytes", "host_counts", "host_reference", "layout_key", "learn_frame_bytes", "learn_sizes",
           "unpack_counts"]
