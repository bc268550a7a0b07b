"""The tinyproto serial protocol, version 2 (docs/design.md, "Serial protocol"): its constants, the frame codec
and the messages. The client is tinyproto/device/client.py; tinyproto/device/protocol.py opens ports and
re-exports all three.

A frame on the wire is ``COBS(body) 0x00`` with ``body = type u8 | seq u8 | payload | crc16 u16 LE`` and
CRC-16/CCITT-FALSE over type, seq and payload. Everything here works on any pyserial-like object (``read(n)``
honouring a timeout, ``write(b)``), so the codec is tested with in-memory streams and ``loop://``, and a real Uno,
a simulated Uno's pty and a TCP bridge are one code path through :func:`open_device`.

Vectors travel in chunks of at most ``wire.CHUNK_BYTES`` (int8) or ``wire.RAW_CHUNK_FEATURES`` (float32)
features, each ``first u16 | data`` (LEARN: ``label u8 | first u16 | data``); every chunk but the last is
acknowledged, the last one's answer is the message's answer. Every size comes from tinyproto/core/wire.py, which
also writes each project's include/tinyproto_sizes.h.

Layer: device.
"""

from __future__ import annotations

import binascii
import struct
import termios
import time
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from tinyproto.core import wire
from tinyproto.core.errors import TinyprotoError

PROTO_VERSION = wire.PROTO_VERSION
MAGIC = b"TPRO"
RUNTIME_ABI = 1  # TP_RUNTIME_ABI of firmware/tinyproto.h (tests/test_protocol.py checks they agree)
INPUT_BYTES = 1  # HELLO's bytes per input feature (int8) and per score (int32): every firmware of this protocol

MSG_HELLO = 0x01
MSG_PREDICT = 0x02
MSG_PREDICT_RAW = 0x03
MSG_STATS = 0x04
# On-device learning: only the FlyNN learning firmware (TP_FLYNN_LEARN) answers these; others say "unknown type".
MSG_LEARN = 0x05
MSG_READ_COUNTS = 0x06
MSG_CLEAR = 0x07
MSG_EEPROM_SAVE = 0x08
MSG_EEPROM_LOAD = 0x09
LEARNING_MESSAGES = (MSG_LEARN, MSG_READ_COUNTS, MSG_CLEAR, MSG_EEPROM_SAVE, MSG_EEPROM_LOAD)
CHUNKED_MESSAGES = (MSG_PREDICT, MSG_PREDICT_RAW, MSG_LEARN)
MSG_RESPONSE = 0x80
MSG_ERROR = 0x7F

ERR_CRC = 1
ERR_LENGTH = 2
ERR_UNKNOWN_TYPE = 3
ERR_TOO_LONG = 4
ERR_ARGUMENT = 5
ERROR_NAMES = {ERR_CRC: "CRC", ERR_LENGTH: "length", ERR_UNKNOWN_TYPE: "unknown type", ERR_TOO_LONG: "frame too long",
               ERR_ARGUMENT: "argument out of range"}
_REQUEST_NAMES = {MSG_HELLO: "HELLO", MSG_PREDICT: "PREDICT", MSG_PREDICT_RAW: "PREDICT_RAW", MSG_STATS: "STATS",
                  MSG_LEARN: "LEARN", MSG_READ_COUNTS: "READ_COUNTS", MSG_CLEAR: "CLEAR",
                  MSG_EEPROM_SAVE: "EEPROM_SAVE", MSG_EEPROM_LOAD: "EEPROM_LOAD"}

FLAG_RAW = 0x01
FLAG_LEARN = 0x02
FLAG_EEPROM = 0x04
FLAG_STREAM = 0x08
FLAG_WINDOW = 0x10  # the device buffers received bytes in a receive ring (TP_RX_RING): frames may go ahead
EEPROM_LOADED, EEPROM_EMPTY, EEPROM_OTHER = 0, 1, 2
CANNOT_LEARN = "this firmware cannot learn; run tinyproto learn (it builds the learning firmware)"

FRAME_OVERHEAD = wire.FRAME_OVERHEAD  # type, seq, crc16
MAX_BODY = 8192  # host-side guard: a longer run without a delimiter is garbage (the Uno has 2 KB of SRAM)
READ_SLICE = 0.02  # s: the port's own read timeout; deadlines are kept by the reader's loop
DEFAULT_TIMEOUT = 1.0  # s per try: frames take < 40 ms at 115200 baud, inference tens of ms on the Uno
EEPROM_SAVE_TIMEOUT = 5.0  # s: the ATmega328P writes an EEPROM byte in 3.4 ms, so a fresh 1 KB record takes ~3.5 s
_HELLO = struct.Struct("<4sBBBIHBBBIB")  # magic proto abi family hash n_features n_classes in_b score_b f_cpu flags
_STATS = struct.Struct("<HHH")
_LEARN_ACK = struct.Struct("<II")  # n_samples, cycles
_CHUNK_FIRST = struct.Struct("<H")
_READ_COUNTS = struct.Struct("<HB")  # offset, length
_EEPROM_SAVE = struct.Struct("<HH")  # bytes written, record bytes
_EEPROM_LOAD = struct.Struct("<BI")  # status, n_samples
_PREDICTION_HEAD = struct.Struct("<BIBB")  # label, cycles, confidence, decided label
# The codec's structs are the sizes wire.py emits for the firmware: one of them changed alone is a bug.
assert (_HELLO.size, _STATS.size, _LEARN_ACK.size, _CHUNK_FIRST.size, _PREDICTION_HEAD.size) == (
    wire.HELLO_PAYLOAD, wire.STATS_PAYLOAD, wire.LEARN_ACK, wire.CHUNK_FIRST, wire.PREDICTION_HEAD)


# What a port's calls raise when the line goes away (an unplugged board, a closed pty): pyserial's SerialException
# is an OSError, but its flush (tcdrain) and reset_input_buffer (tcflush) raise termios.error, which is not.
PORT_ERRORS = (OSError, termios.error)


class DeviceError(TinyprotoError):
    """The device did not answer, answered garbage, or refused a request."""


class DeviceSilent(DeviceError):
    """The device never answered a request: every try timed out. speed_may_help: a slower baud rate may help (it
    sent nothing, or bytes that are no frame), not when the line echoes the requests or frames came that answer
    another request. answered_before: it had answered the handshake (the app runs; a later request went unanswered)."""

    def __init__(self, message: str, speed_may_help: bool = True, answered_before: bool = False) -> None:
        super().__init__(message)
        self.speed_may_help = speed_may_help
        self.answered_before = answered_before


class FrameError(ValueError):
    """A received frame is malformed (broken COBS, too short, wrong CRC)."""


class SerialPort(Protocol):
    """What the codec needs from a port: pyserial's ``Serial`` and the test doubles have it."""

    timeout: float | None

    def read(self, size: int = 1) -> bytes: ...

    def write(self, data: bytes) -> int | None: ...


# ---- codec -------------------------------------------------------------------------------------------------


def crc16_ccitt(data: bytes, crc: int = 0xFFFF) -> int:
    """CRC-16/CCITT-FALSE (poly 0x1021, init 0xFFFF, no reflection, no xorout); "123456789" -> 0x29B1."""
    return binascii.crc_hqx(data, crc)  # crc_hqx is exactly this shift register, in C


_CODE_BYTES = [bytes((code,)) for code in range(256)]


def cobs_encode(data: bytes) -> bytes:
    """COBS without the trailing delimiter; the output holds no 0x00. Same block rule as firmware/tp_serial.c: a
    block is a code byte (its data bytes + 1) and up to 254 bytes; a block shorter than 254 stands for its bytes
    and the zero after them, a full one (code 0xFF) for its bytes alone. Split on the zeros (raw float features
    hold many), so the work per block is C's, not a Python loop's."""
    data = bytes(data)
    if len(data) < 254:
        # every frame validation sends: no piece can fill a block, so each is its code byte and its bytes (one
        # join, a few times faster than the general loop below on the many zero bytes of raw pixel floats)
        return b"".join([_CODE_BYTES[len(piece) + 1] + piece for piece in data.split(b"\x00")])
    out = bytearray()
    pieces = data.split(b"\x00")
    last = len(pieces) - 1
    for k, piece in enumerate(pieces):
        n = len(piece)
        at = 0
        # full blocks; the last piece keeps a 254-byte remainder whole (nothing follows: no block after it)
        while n - at > 254 or (n - at == 254 and k < last):
            out.append(0xFF)
            out += piece[at : at + 254]
            at += 254
        if n - at == 254:
            out.append(0xFF)
            out += piece[at:]
        else:
            out.append(n - at + 1)
            out += piece[at:]
    return bytes(out)


def cobs_decode(data: bytes) -> bytes:
    """Inverse of :func:`cobs_encode` (input without the delimiter); raises FrameError if malformed."""
    out = bytearray()
    i, n = 0, len(data)
    while i < n:
        code = data[i]
        if code == 0:
            raise FrameError("0x00 inside a COBS frame")
        end = i + code
        if end > n:
            raise FrameError("COBS block cut short")
        block = data[i + 1 : end]
        if 0 in block:
            raise FrameError("0x00 inside a COBS frame")
        out += block
        i = end
        if code != 0xFF and i < n:
            out.append(0)
    return bytes(out)


@dataclass(frozen=True)
class Frame:
    type: int
    seq: int
    payload: bytes


def encode_frame(type: int, seq: int, payload: bytes = b"") -> bytes:
    """One frame as it goes on the wire: COBS(type seq payload crc16) 0x00."""
    body = bytes((type & 0xFF, seq & 0xFF)) + bytes(payload)
    return cobs_encode(body + struct.pack("<H", crc16_ccitt(body))) + b"\x00"


def decode_frame(encoded: bytes) -> Frame:
    """One frame without its delimiter -> Frame; FrameError if the COBS, the length or the CRC is wrong."""
    body = cobs_decode(encoded)
    if len(body) < FRAME_OVERHEAD:
        raise FrameError(f"frame of {len(body)} bytes is shorter than its header and CRC")
    (crc,) = struct.unpack_from("<H", body, len(body) - 2)
    if crc16_ccitt(body[:-2]) != crc:
        raise FrameError("CRC mismatch")
    return Frame(body[0], body[1], body[2:-2])


class FrameReader:
    """Reads frames from a port, dropping anything malformed and resynchronising on the next 0x00.

    The port's own read timeout only bounds one ``read``; :meth:`read_frame` keeps an overall deadline.
    """

    def __init__(self, port: SerialPort, max_body: int = MAX_BODY) -> None:
        self.port = port
        self.max_encoded = max_body + max_body // 254 + 2
        self.bad_frames = 0  # frames dropped as malformed (a noisy line shows here)
        self.bytes_read = 0  # every byte read from the port (the line's load, device to host)
        self._buf = bytearray()
        self._skipping = False  # inside an over-long run: drop bytes up to the next delimiter
        self._last_byte_at = 0.0  # time.monotonic() of the last byte read

    def reset(self, quiet_s: float = 0.0) -> None:
        """Forget a partial frame (before a retry: its tail may never come); quiet_s: only if no byte came for that
        long. A frame still arriving (a slow line, a simulated board slower than real time) is kept: a retry keeps
        its request's seq, so that answer is the retry's too, and forgetting its start made every answer that
        outlasted a try malformed, try after try."""
        if time.monotonic() - self._last_byte_at >= quiet_s:
            self._buf.clear()
            self._skipping = False

    def read_frame(self, timeout: float, finish_s: float = 0.0, finish_max_s: float = 0.0) -> Frame | None:
        """The next well-formed frame, or None when ``timeout`` seconds pass without one. finish_s: a frame still
        arriving when the time is up (its last byte came within finish_s) is waited for, up to finish_max_s more (a
        slow line, a simulated board slower than real time: an answer that outlasted every try was lost)."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self._pop_frame()
            if frame is not None:
                return frame
            now = time.monotonic()
            if now >= deadline and not (now < deadline + finish_max_s and self._buf and not self._skipping
                                        and now - self._last_byte_at < finish_s):
                return None
            self._buf += self._read_some()

    def _read_some(self) -> bytes:
        waiting = getattr(self.port, "in_waiting", 0) or 0
        data = self.port.read(max(1, min(waiting, 4096)))
        if data:
            self.bytes_read += len(data)
            self._last_byte_at = time.monotonic()
        return data

    def _pop_frame(self) -> Frame | None:
        while True:
            end = self._buf.find(0)
            if end < 0:
                if len(self._buf) > self.max_encoded:
                    self.bad_frames += not self._skipping  # one over-long run counts once
                    self._buf.clear()
                    self._skipping = True
                return None
            encoded = bytes(self._buf[:end])
            del self._buf[: end + 1]
            if self._skipping:
                self._skipping = False
                continue
            if not encoded:
                continue  # 0x00 0x00: an empty frame (resync preamble)
            try:
                return decode_frame(encoded)
            except FrameError:
                self.bad_frames += 1


# ---- messages ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    proto: int
    abi: int
    family: int  # TP_FAMILY_ID of the model (each family's IntModel.family_id)
    model_hash: int
    n_features: int
    n_classes: int
    input_bytes: int
    score_bytes: int
    f_cpu: int  # 0 on the host build
    flags: int

    @property
    def raw_input(self) -> bool:
        """The firmware answers PREDICT_RAW (not built with TP_NO_RAW_INPUT)."""
        return bool(self.flags & FLAG_RAW)

    @property
    def learning(self) -> bool:
        """The FlyNN learning firmware (TP_FLYNN_LEARN): LEARN / READ_COUNTS / CLEAR, inference on SRAM counts."""
        return bool(self.flags & FLAG_LEARN)

    @property
    def eeprom(self) -> bool:
        """The learning firmware can save its counts to EEPROM and load them back (the record fits)."""
        return bool(self.flags & FLAG_EEPROM)

    @property
    def streams(self) -> bool:
        """The family consumes each chunk as it arrives (TP_STREAMABLE 1): its cycles are timed chunk by chunk."""
        return bool(self.flags & FLAG_STREAM)

    @property
    def windowed(self) -> bool:
        """The device buffers what it receives in a receive ring (the AVR app with a ring, not the learning
        firmware): a window of frames may be in flight, up to one byte less than the ring not yet answered."""
        return bool(self.flags & FLAG_WINDOW)


@dataclass(frozen=True, eq=False)
class Prediction:
    label: int
    cycles: int  # Timer1 cycles of the model's code (every chunk of a streaming family) minus the call overhead
    scores: np.ndarray  # int32 (n_classes,)
    confidence: int = 0  # tp_judge's confidence byte
    decided: int = 0  # tp_judge's answer: the label, or 255 (unknown) for a declined input


@dataclass(frozen=True, eq=False)
class RawPrediction:
    label: int
    cycles: int
    x: np.ndarray  # int8 (n_features,): the device's tp_input_quantize() output
    scores: np.ndarray  # int32 (n_classes,)
    confidence: int = 0
    decided: int = 0


@dataclass(frozen=True)
class LearnAck:
    n_samples: int  # samples learned since start-up / CLEAR (or as restored by EEPROM_LOAD), this one included
    cycles: int  # Timer1 cycles of tp_flynn_learn(); 0 on the host build


@dataclass(frozen=True)
class EepromSave:
    written: int  # EEPROM bytes that differed and were written (the rest were left alone: endurance)
    record: int  # bytes of the whole record (header + counts)


@dataclass(frozen=True)
class EepromLoad:
    status: int  # EEPROM_LOADED, EEPROM_EMPTY (no valid record) or EEPROM_OTHER (another model's record)
    n_samples: int  # the device's sample counter afterwards

    @property
    def loaded(self) -> bool:
        return self.status == EEPROM_LOADED


@dataclass(frozen=True)
class Stats:
    stack_peak: int  # bytes of stack ever used, from RAMEND down (0 on the host build)
    static_sram: int  # .data + .bss (0 on the host build)
    frames_bad: int  # invalid frames the device answered with ERROR since reset


def parse_hello(payload: bytes) -> Hello:
    if len(payload) != _HELLO.size or not payload.startswith(MAGIC):
        raise DeviceError(f"not a tinyproto device (HELLO answer {payload[:8].hex()}…, {len(payload)} bytes)")
    magic, proto, *fields = _HELLO.unpack(payload)
    if proto != PROTO_VERSION:
        raise DeviceError(f"device speaks protocol version {proto}, this tinyproto speaks {PROTO_VERSION}")
    hello = Hello(proto, *fields)
    if hello.abi != RUNTIME_ABI:
        raise DeviceError(f"device runs tinyproto runtime ABI {hello.abi}, this tinyproto builds ABI {RUNTIME_ABI} "
                          "— build and flash the firmware again")
    if (hello.input_bytes, hello.score_bytes) != (INPUT_BYTES, wire.SCORE_BYTES):
        raise DeviceError(f"device announces {hello.input_bytes} byte(s) per input and {hello.score_bytes} per score; "
                          f"protocol {PROTO_VERSION} sends {INPUT_BYTES} and {wire.SCORE_BYTES} — not a tinyproto "
                          "firmware of this version")
    return hello


def _prediction_head(payload: bytes, what: str) -> tuple[int, int, int, int]:
    if len(payload) < _PREDICTION_HEAD.size:
        raise DeviceError(f"{what} answer of {len(payload)} bytes is too short")
    return _PREDICTION_HEAD.unpack_from(payload)


def parse_prediction(payload: bytes) -> Prediction:
    label, cycles, confidence, decided = _prediction_head(payload, "PREDICT")
    scores = payload[_PREDICTION_HEAD.size :]
    if len(scores) % 4:
        raise DeviceError(f"PREDICT answer of {len(payload)} bytes does not hold whole int32 scores")
    return Prediction(label, cycles, np.frombuffer(scores, dtype="<i4").astype(np.int32), confidence, decided)


def parse_raw_prediction(payload: bytes, n_features: int) -> RawPrediction:
    label, cycles, confidence, decided = _prediction_head(payload, "PREDICT_RAW")
    rest = payload[_PREDICTION_HEAD.size :]
    if len(rest) < n_features or (len(rest) - n_features) % 4:
        raise DeviceError(f"PREDICT_RAW answer of {len(payload)} bytes does not fit {n_features} features")
    x = np.frombuffer(rest[:n_features], dtype=np.int8).copy()
    scores = np.frombuffer(rest[n_features:], dtype="<i4").astype(np.int32)
    return RawPrediction(label, cycles, x, scores, confidence, decided)


def parse_stats(payload: bytes) -> Stats:
    if len(payload) != _STATS.size:
        raise DeviceError(f"STATS answer of {len(payload)} bytes, expected {_STATS.size}")
    return Stats(*_STATS.unpack(payload))


def check_model(hello: Hello, model_hash: int, n_features: int, n_classes: int, family_id: int | None = None,
                f_cpu_hz: int | None = None) -> None:
    """Refuse to validate a model directory against a device that runs another model (its hash, sizes and family),
    or a firmware built for another clock than the board's (every latency would be off by their ratio)."""
    if hello.model_hash != model_hash:
        raise TinyprotoError(
            f"device runs model 0x{hello.model_hash:08x}, directory holds 0x{model_hash:08x} — flash first"
        )
    if (hello.n_features, hello.n_classes) != (n_features, n_classes):
        raise TinyprotoError(
            f"device model has {hello.n_features} features / {hello.n_classes} classes, directory holds "
            f"{n_features} / {n_classes} — flash first"
        )
    if family_id is not None and hello.family != family_id:
        raise TinyprotoError(f"device reports model family id {hello.family}, the directory's model has "
                             f"{family_id} — flash first")
    if f_cpu_hz is not None and hello.f_cpu != f_cpu_hz:
        raise TinyprotoError(f"device firmware runs at {hello.f_cpu} Hz, the board at {f_cpu_hz} Hz — it was built for "
                             "another board or clock: build and flash it again")
