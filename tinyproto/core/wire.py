"""Every size the host and the device app share, decided here once and emitted into each project's
include/tinyproto_sizes.h (core/render.render_sizes_header, templates/tinyproto_sizes.h.j2): frame layout, chunk payload, the frame buffer, the
EEPROM record header. The C side (firmware/tp_*.c) only reads these macros; tests/test_protocol.py fails when
one side changes alone.

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
# The AVR app's receive ring (filled by the USART interrupt): the host may have up to RX_WINDOW_BYTES of frames
# on the way that the device has not answered yet, so the line stays busy while the device computes and answers.
# 256 because the ring's u8 indices then wrap by themselves; one slot stays free to tell full from empty.
RX_RING_BYTES = 256
RX_WINDOW_BYTES = RX_RING_BYTES - 1

# EEPROM record of the learning firmware (little-endian):
#   0 'T' 'F' | 2 layout key u32 | 6 count bytes u16 | 8 n_samples u32 | 12 crc16 u16 | 14 packed counts
EE_MAGIC_AT, EE_KEY_AT, EE_COUNT_BYTES_AT, EE_SAMPLES_AT, EE_CRC_AT = 0, 2, 6, 8, 12
EEPROM_HEADER_BYTES = 14

# Static SRAM of the device app besides its frame buffer, the int8 input buffer and the FlyNN counts (AVR: no
# padding): parser 9 (pointer 2, cap 2, len 2, code, left, flags), bad-frame counter 2, next expected feature 2,
# type of the vector under way 1, Timer1 overflows 2, calibrated call overhead 2, the last vector's confidence
# and decided label 2. A streaming family adds the
# chunk handed to it (first 2, n 1) and the vector's cycles so far 4; the learning firmware its label 1 and sample
# counter 4. tests/test_learn.py and tests/test_widths.py check these against avr-size.
APP_STATIC_BYTES = 9 + 2 + 2 + 1 + 2 + 2 + 2
RX_RING_STATIC_BYTES = RX_RING_BYTES + 2  # the ring and its head and tail indices
STREAM_STATIC_BYTES = 2 + 1 + 4
LEARN_STATIC_BYTES = 1 + 4


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
    ring: int = RX_RING_STATIC_BYTES  # the receive ring (not in the learning firmware, which answers one by one)

    @property
    def total(self) -> int:
        return self.frame + self.input + self.app + self.ring


def app_sram(n_features: int, n_classes: int, streamable: bool, raw_input: bool = True,
             learning: bool = False) -> AppSram:
    app = APP_STATIC_BYTES + (STREAM_STATIC_BYTES if streamable else 0) + (LEARN_STATIC_BYTES if learning else 0)
    return AppSram(frame_buffer_bytes(n_classes, raw_input), input_buffer_bytes(n_features, streamable), app,
                   0 if learning else RX_RING_STATIC_BYTES)


def sizes_defines(n_classes: int) -> dict[str, int]:
    """Every macro of include/tinyproto_sizes.h, in the order written."""
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
        "TP_RX_RING": RX_RING_BYTES,
    }
