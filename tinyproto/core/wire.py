"""Every size the host and the device app share, decided here once and emitted into each project's
include/tinyproto_sizes.h (core/render.render_sizes_header, templates/tinyproto_sizes.h.j2): frame layout, chunk
payload, the frame buffer, the EEPROM record header. The C side (firmware/tp_*.c) only reads these macros;
tests/test_protocol.py fails when one side changes alone.

Layer: core (pure data; tinyproto/device/frames.py and the pipeline import it, the renderer writes it).
"""

from __future__ import annotations

from dataclasses import dataclass

PROTO_VERSION = 2  # 2: every vector travels in chunks of at most CHUNK_BYTES
FRAME_OVERHEAD = 4  # type u8, seq u8 ... crc16 u16 around the payload
HELLO_PAYLOAD = 21  # "TPRO" proto abi family hash(4) n_features(2) n_classes in_b score_b f_cpu(4) flags
STATS_PAYLOAD = 6  # stack peak u16, static SRAM u16, bad frames u16
PREDICTION_HEAD = 7  # label u8, cycles u32, confidence u8, decided label u8: a final PREDICT(_RAW) answer's start
LEARN_ACK = 8  # n_samples u32, cycles u32
CHUNK_FIRST = 2  # every vector chunk starts with the index of its first feature, u16
CHUNK_BYTES = 64  # at most this many vector bytes per frame: int8 features, or 16 float32 features
RAW_CHUNK_FEATURES = CHUNK_BYTES // 4  # float32 features per PREDICT_RAW chunk
LEARN_LABEL = 1  # a LEARN chunk carries the label (u8) before its first-feature index
SCORE_BYTES = 4  # int32 per class
# The AVR app's receive ring (filled by the USART interrupt): the host may have up to ring - 1 bytes of frames on
# the way that the device has not answered yet, so the line stays busy while the device computes and answers. The
# ring takes what the model leaves free of the board's SRAM, up to RX_RING_MAX (its indices are u8; 256 wraps by
# itself), and is left out when it would not hold two of the largest requests: a window of one frame is
# stop-and-wait, which the USART's own two bytes already do. Decided per model by rx_ring_bytes(); the generated
# header (TP_RX_RING, 0: no ring) and build.json carry it to the firmware and to the host.
RX_RING_MAX = 256
RX_RING_BYTES = RX_RING_MAX  # the ring of a model with SRAM to spare (and of projects rendered without a board)
RX_RING_INDICES = 2  # its head and tail indices, u8 each


def cobs_bytes(n: int) -> int:
    """Bytes of COBS(n bytes) before the delimiter: one code byte per started run of 254."""
    return n + n // 254 + 1


# The largest request a window carries as it goes on the wire: the host's leading 0x00, COBS(body), the delimiter.
WINDOW_FRAME_BYTES = 1 + cobs_bytes(FRAME_OVERHEAD + CHUNK_FIRST + CHUNK_BYTES) + 1
RX_RING_MIN = 2 * WINDOW_FRAME_BYTES + 1  # two whole requests in flight, and the slot that tells full from empty


def rx_ring_bytes(free_bytes: int) -> int:
    """The receive ring for `free_bytes` of SRAM left by everything else (indices included): the largest ring up to
    RX_RING_MAX that fits, or 0 (no ring: stop-and-wait) when fewer than RX_RING_MIN bytes would."""
    ring = min(RX_RING_MAX, free_bytes - RX_RING_INDICES)
    return ring if ring >= RX_RING_MIN else 0


def rx_ring_static_bytes(ring: int) -> int:
    """SRAM of a ring of `ring` bytes with its indices (0 for no ring)."""
    return ring + RX_RING_INDICES if ring else 0


def rx_window_bytes(ring: int) -> int:
    """Bytes the host may have unanswered on the way to a ring of `ring` bytes (one slot tells full from empty)."""
    return max(0, ring - 1)


RX_WINDOW_BYTES = rx_window_bytes(RX_RING_BYTES)

# EEPROM record of the learning firmware (little-endian):
#   0 'T' 'F' | 2 layout key u32 | 6 count bytes u16 | 8 n_samples u32 | 12 crc16 u16 | 14 packed counts
EE_MAGIC_AT, EE_KEY_AT, EE_COUNT_BYTES_AT, EE_SAMPLES_AT, EE_CRC_AT = 0, 2, 6, 8, 12
EEPROM_HEADER_BYTES = 14

# Static SRAM of the device app besides its frame buffer, the int8 input buffer and the FlyNN counts (AVR: no
# padding): parser 9 (pointer 2, cap 2, len 2, code, left, flags), bad-frame counter 2, next expected feature 2,
# type of the vector under way 1, Timer1 overflows 2, calibrated call overhead 2, the last vector's confidence
# and decided label 2. A streaming family adds the chunk handed to it (first 2, n 1) and the vector's cycles so
# far 4; the learning firmware its label 1, sample counter 4, and the last LEARN's seq 1, flag 1 and cycles 4 (a
# LEARN sent again is answered again, not learned twice). tests/test_learn.py and tests/test_widths.py check
# these against avr-size.
APP_STATIC_BYTES = 9 + 2 + 2 + 1 + 2 + 2 + 2
STREAM_STATIC_BYTES = 2 + 1 + 4
LEARN_STATIC_BYTES = 1 + 4 + 1 + 1 + 4


def _round4(n: int) -> int:
    return (n + 3) // 4 * 4


def frame_buffer_bytes(n_classes: int, raw_input: bool = True) -> int:
    """The device app's one frame buffer: the largest request (a LEARN chunk), the PREDICT_RAW work area
    (floats moved to 0, their int8 at 4n, scores in the last 4C bytes), every answer, rounded up to 4 bytes."""
    scores = SCORE_BYTES * n_classes
    need = max(
        FRAME_OVERHEAD + LEARN_LABEL + CHUNK_FIRST + CHUNK_BYTES,  # the largest request
        FRAME_OVERHEAD + HELLO_PAYLOAD,
        FRAME_OVERHEAD + PREDICTION_HEAD + scores,  # final PREDICT answer
        FRAME_OVERHEAD + EEPROM_HEADER_BYTES + 4,  # EEPROM_SAVE builds the header past its 4-byte answer
    )
    if raw_input:
        need = max(need, 5 * RAW_CHUNK_FEATURES + scores,  # floats + their int8, clear of the scores tail
                   FRAME_OVERHEAD + PREDICTION_HEAD + RAW_CHUNK_FEATURES + scores)  # final PREDICT_RAW answer
    return _round4(need)


def frame_buffer_limit(sram_bytes: int) -> int:
    """TP_MAX_BUF: the largest frame buffer the device app builds with on a board of `sram_bytes` (half its SRAM;
    platformio.ini's build flag, and firmware/tp_app.h's #error above it)."""
    return sram_bytes // 2


def most_classes(sram_bytes: int) -> int:
    """The most classes whose frame buffer (scores of 4 B each) fits frame_buffer_limit on that board."""
    limit = frame_buffer_limit(sram_bytes)
    return max((n for n in range(1, 256) if frame_buffer_bytes(n) <= limit), default=0)


def input_buffer_bytes(n_features: int, streamable: bool) -> int:
    """The app's int8 input vector: a streamable family consumes each chunk as it comes and needs none."""
    return 0 if streamable else n_features


def n_chunks(n_features: int, per_chunk: int = CHUNK_BYTES) -> int:
    return -(-n_features // per_chunk)


@dataclass(frozen=True)
class AppSram:
    """Static SRAM of the device app (everything but the model family's own state), in bytes."""

    frame: int
    input: int
    app: int
    ring: int = rx_ring_static_bytes(RX_RING_BYTES)  # the receive ring and its indices (0: none)

    @property
    def total(self) -> int:
        return self.frame + self.input + self.app + self.ring


def app_sram(n_features: int, n_classes: int, streamable: bool, raw_input: bool = True,
             learning: bool = False, rx_ring: int = RX_RING_BYTES) -> AppSram:
    """rx_ring: the model's receive ring (rx_ring_bytes; 0: none). The learning firmware has none: it answers
    one request at a time and keeps its SRAM for the counts."""
    app = APP_STATIC_BYTES + (STREAM_STATIC_BYTES if streamable else 0) + (LEARN_STATIC_BYTES if learning else 0)
    return AppSram(frame_buffer_bytes(n_classes, raw_input), input_buffer_bytes(n_features, streamable), app,
                   0 if learning else rx_ring_static_bytes(rx_ring))


def sizes_defines(n_classes: int, rx_ring: int = RX_RING_BYTES) -> dict[str, int]:
    """Every macro of include/tinyproto_sizes.h, in the order written; rx_ring: the model's receive ring (0: none)."""
    if rx_ring and not RX_RING_MIN <= rx_ring <= RX_RING_MAX:
        raise ValueError(f"a receive ring is 0 or {RX_RING_MIN}..{RX_RING_MAX} bytes, not {rx_ring}")
    return {
        "TP_PROTO_VERSION": PROTO_VERSION,
        "TP_FRAME_OVERHEAD": FRAME_OVERHEAD,
        "TP_HELLO_PAYLOAD": HELLO_PAYLOAD,
        "TP_STATS_PAYLOAD": STATS_PAYLOAD,
        "TP_PRED_HEAD": PREDICTION_HEAD,
        "TP_LEARN_ACK": LEARN_ACK,
        "TP_CHUNK_FIRST": CHUNK_FIRST,
        "TP_CHUNK_BYTES": CHUNK_BYTES,
        "TP_RAW_CHUNK": RAW_CHUNK_FEATURES,
        "TP_LEARN_LABEL": LEARN_LABEL,
        "TP_EE_MAGIC_AT": EE_MAGIC_AT,
        "TP_EE_KEY_AT": EE_KEY_AT,
        "TP_EE_COUNT_BYTES_AT": EE_COUNT_BYTES_AT,
        "TP_EE_SAMPLES_AT": EE_SAMPLES_AT,
        "TP_EE_CRC_AT": EE_CRC_AT,
        "TP_EE_HEADER": EEPROM_HEADER_BYTES,
        "TP_FRAME_BUF_RAW": frame_buffer_bytes(n_classes, raw_input=True),
        "TP_FRAME_BUF_NO_RAW": frame_buffer_bytes(n_classes, raw_input=False),
        "TP_RX_RING": rx_ring,
    }
