"""Host side of the tinyproto serial protocol, version 2 (docs/design.md, "Serial protocol").

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
import errno
import struct
import time
from dataclasses import dataclass
from typing import Callable, Protocol

import numpy as np

from tinyproto.core import wire
from tinyproto.core.errors import TinyprotoError

PROTO_VERSION = wire.PROTO_VERSION
MAGIC = b"TPRO"

MSG_HELLO = 0x01
MSG_PREDICT = 0x02
MSG_PREDICT_RAW = 0x03
MSG_STATS = 0x04
# On-device learning: only the FlyNN learning firmware (TP_FLY_LEARN) answers these; others say "unknown type".
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
_PREDICTION_HEAD = struct.Struct("<BI")  # label, cycles
# The codec's structs are the sizes wire.py emits for the firmware: one of them changed alone is a bug.
assert (_HELLO.size, _STATS.size, _LEARN_ACK.size, _CHUNK_FIRST.size, _PREDICTION_HEAD.size) == (
    wire.HELLO_PAYLOAD, wire.STATS_PAYLOAD, wire.LEARN_ACK, wire.CHUNK_FIRST, wire.PREDICTION_HEAD)


class DeviceError(TinyprotoError):
    """The device did not answer, answered garbage, or refused a request."""


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


def cobs_encode(data: bytes) -> bytes:
    """COBS without the trailing delimiter; the output holds no 0x00. Same block rule as firmware/tp_serial.c."""
    out = bytearray()
    i, n = 0, len(data)
    while True:
        limit = min(n, i + 254)
        zero = data.find(0, i, limit)
        end = zero if zero >= 0 else limit
        out.append(end - i + 1)
        out += data[i:end]
        if end >= n:
            return bytes(out)
        # A full 254-byte run carries no implied zero; any shorter run stopped at one, which the code implies.
        i = end if end - i == 254 else end + 1


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
        self._buf = bytearray()
        self._skipping = False  # inside an over-long run: drop bytes up to the next delimiter

    def reset(self) -> None:
        """Forget a partial frame (before a retry: its tail may never come)."""
        self._buf.clear()
        self._skipping = False

    def read_frame(self, timeout: float) -> Frame | None:
        """The next well-formed frame, or None when ``timeout`` seconds pass without one."""
        deadline = time.monotonic() + timeout
        while True:
            frame = self._pop_frame()
            if frame is not None:
                return frame
            if time.monotonic() >= deadline:
                return None
            self._buf += self._read_some()

    def _read_some(self) -> bytes:
        waiting = getattr(self.port, "in_waiting", 0) or 0
        return self.port.read(max(1, min(waiting, 4096)))

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
    family: int  # TP_FAMILY_ID: 1 protonn, 2 flynn
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
        """The FlyNN learning firmware (TP_FLY_LEARN): LEARN / READ_COUNTS / CLEAR, inference on SRAM counts."""
        return bool(self.flags & FLAG_LEARN)

    @property
    def eeprom(self) -> bool:
        """The learning firmware can save its counts to EEPROM and load them back (the record fits)."""
        return bool(self.flags & FLAG_EEPROM)

    @property
    def streams(self) -> bool:
        """The family consumes each chunk as it arrives (TP_STREAMABLE 1): its cycles are timed chunk by chunk."""
        return bool(self.flags & FLAG_STREAM)


@dataclass(frozen=True, eq=False)
class Prediction:
    label: int
    cycles: int  # Timer1 cycles of the model's code (every chunk of a streaming family) minus the call overhead
    scores: np.ndarray  # int32 (n_classes,)


@dataclass(frozen=True, eq=False)
class RawPrediction:
    label: int
    cycles: int
    x: np.ndarray  # int8 (n_features,): the device's tp_input_quantize() output
    scores: np.ndarray  # int32 (n_classes,)


@dataclass(frozen=True)
class LearnAck:
    n_samples: int  # samples learned since start-up / CLEAR (or as restored by EEPROM_LOAD), this one included
    cycles: int  # Timer1 cycles of tp_fly_learn(); 0 on the host build


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
    return Hello(proto, *fields)


def _prediction_head(payload: bytes, what: str) -> tuple[int, int]:
    if len(payload) < _PREDICTION_HEAD.size:
        raise DeviceError(f"{what} answer of {len(payload)} bytes is too short")
    return _PREDICTION_HEAD.unpack_from(payload)


def parse_prediction(payload: bytes) -> Prediction:
    label, cycles = _prediction_head(payload, "PREDICT")
    scores = payload[_PREDICTION_HEAD.size :]
    if len(scores) % 4:
        raise DeviceError(f"PREDICT answer of {len(payload)} bytes does not hold whole int32 scores")
    return Prediction(label, cycles, np.frombuffer(scores, dtype="<i4").astype(np.int32))


def parse_raw_prediction(payload: bytes, n_features: int) -> RawPrediction:
    label, cycles = _prediction_head(payload, "PREDICT_RAW")
    rest = payload[_PREDICTION_HEAD.size :]
    if len(rest) < n_features or (len(rest) - n_features) % 4:
        raise DeviceError(f"PREDICT_RAW answer of {len(payload)} bytes does not fit {n_features} features")
    x = np.frombuffer(rest[:n_features], dtype=np.int8).copy()
    scores = np.frombuffer(rest[n_features:], dtype="<i4").astype(np.int32)
    return RawPrediction(label, cycles, x, scores)


def parse_stats(payload: bytes) -> Stats:
    if len(payload) != _STATS.size:
        raise DeviceError(f"STATS answer of {len(payload)} bytes, expected {_STATS.size}")
    return Stats(*_STATS.unpack(payload))


def check_model(hello: Hello, model_hash: int, n_features: int, n_classes: int) -> None:
    """Refuse to validate a model directory against a device that runs another model."""
    if hello.model_hash != model_hash:
        raise TinyprotoError(
            f"device runs model 0x{hello.model_hash:08x}, directory holds 0x{model_hash:08x} — flash first"
        )
    if (hello.n_features, hello.n_classes) != (n_features, n_classes):
        raise TinyprotoError(
            f"device model has {hello.n_features} features / {hello.n_classes} classes, directory holds "
            f"{n_features} / {n_classes} — flash first"
        )


# ---- client ------------------------------------------------------------------------------------------------


class _Retry(Exception):
    """The device asked for the request again (it received it corrupted)."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class _ChunkOrder(Exception):
    """The device refused a chunk as not continuing the vector under way (an acknowledgement was lost)."""


class DeviceClient:
    """Request/response client. Every request gets a fresh seq, kept by its retries; answers carrying another
    seq are stale and dropped. A try ends after ``timeout`` s without the answer or on an ERROR CRC / too long
    answer; after ``1 + n_retries`` tries a DeviceError says the device is silent."""

    def __init__(self, port: SerialPort, n_retries: int = 3, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.port = port
        self.n_retries = n_retries
        self.timeout = timeout
        self.name = str(getattr(port, "port", None) or getattr(port, "name", None) or port)
        self.info: Hello | None = None  # set by hello()
        self.stale_frames = 0
        self._mid_vector = False  # the request under way continues a vector (an ERROR argument means "order")
        self._reader = FrameReader(port)
        self._seq = 0
        if getattr(port, "timeout", None) is None or port.timeout > READ_SLICE:
            port.timeout = READ_SLICE  # short reads; overall deadlines are ours

    # -- public API --
    def hello(self) -> Hello:
        self.info = parse_hello(self._request(MSG_HELLO))
        return self.info

    def handshake(self, deadline_s: float, try_timeout: float = 0.25) -> Hello:
        """HELLO until ``deadline_s`` seconds pass: opening a real Uno resets it and its bootloader listens for
        ~1-2 s before our firmware runs, so the first HELLOs are lost (or eaten by the bootloader)."""
        deadline = time.monotonic() + deadline_s
        seq = self._next_seq()
        tries = 0
        while True:
            tries += 1
            self._reader.reset()  # the bootloader's chatter may have left half a "frame"
            self._send(MSG_HELLO, seq, b"")
            left = deadline - time.monotonic()
            try:
                frame = self._await(MSG_HELLO, seq, max(0.0, min(try_timeout, left)))
            except _Retry:
                frame = None
            if frame is not None:
                self.info = parse_hello(frame.payload)
                return self.info
            if time.monotonic() >= deadline:
                raise self._silent(tries)

    def predict(self, xq: np.ndarray) -> Prediction:
        vector = self._vector(xq, np.int8, "xq")
        _, last = self._stream(MSG_PREDICT, vector, 1, wire.CHUNK_BYTES)
        answer = parse_prediction(last)
        self._check_classes(len(answer.scores))
        return answer

    def predict_raw(self, raw: np.ndarray) -> RawPrediction:
        if self.info is not None and not self.info.raw_input:
            raise DeviceError("the firmware was built with TP_NO_RAW_INPUT: use predict() with int8 inputs")
        vector = self._vector(raw, np.dtype("<f4"), "raw")
        n = len(vector) // 4
        acks, last = self._stream(MSG_PREDICT_RAW, vector, 4, wire.RAW_CHUNK_FEATURES)
        tail = n - wire.RAW_CHUNK_FEATURES * len(acks)
        for k, ack in enumerate(acks):
            if len(ack) != wire.RAW_CHUNK_FEATURES:
                raise DeviceError(f"PREDICT_RAW chunk {k} answered {len(ack)} int8 inputs, "
                                  f"expected {wire.RAW_CHUNK_FEATURES}")
        answer = parse_raw_prediction(last, tail)
        self._check_classes(len(answer.scores))
        x = np.concatenate([np.frombuffer(b"".join(acks), dtype=np.int8), answer.x])
        return RawPrediction(answer.label, answer.cycles, x, answer.scores)

    def stats(self) -> Stats:
        return parse_stats(self._request(MSG_STATS))

    # -- on-device learning (the FlyNN learning firmware) --
    def learn(self, xq: np.ndarray, label: int) -> LearnAck:
        """Add one labelled int8 sample to the device's counts (saturating, like the host's)."""
        self._require_learning("LEARN")
        if self.info is not None and not 0 <= int(label) < self.info.n_classes:
            raise TinyprotoError(f"class index {label} is out of range for {self.info.n_classes} classes")
        vector = self._vector(xq, np.int8, "xq")
        _, answer = self._stream(MSG_LEARN, vector, 1, wire.CHUNK_BYTES, head=bytes((int(label) & 0xFF,)))
        if len(answer) != _LEARN_ACK.size:
            raise DeviceError(f"LEARN answer of {len(answer)} bytes, expected {_LEARN_ACK.size}")
        return LearnAck(*_LEARN_ACK.unpack(answer))

    def read_counts(self, offset: int = 0, length: int = 255) -> tuple[int, bytes]:
        """(total count bytes, up to `length` bytes of the packed counts from `offset`); the device sends fewer
        when its frame buffer is smaller, or none at the end."""
        self._require_learning("READ_COUNTS")
        answer = self._request(MSG_READ_COUNTS, _READ_COUNTS.pack(offset, min(length, 255)))
        if len(answer) < 2:
            raise DeviceError(f"READ_COUNTS answer of {len(answer)} bytes is too short")
        (total,) = struct.unpack_from("<H", answer)
        data = answer[2:]
        if len(data) > length or offset + len(data) > total:
            raise DeviceError(f"READ_COUNTS answered {len(data)} bytes at {offset} of {total}")
        return total, data

    def read_all_counts(self, progress: Callable[[int], None] | None = None) -> bytes:
        """Every packed count byte, in as many READ_COUNTS chunks as the device's frame buffer needs."""
        total, out = None, bytearray()
        while total is None or len(out) < total:
            total, chunk = self.read_counts(len(out))
            if not chunk and len(out) < total:
                raise DeviceError(f"READ_COUNTS stopped at byte {len(out)} of {total}")
            out += chunk
            if progress:
                progress(len(chunk))
        return bytes(out)

    def clear(self) -> None:
        """Every count and the sample counter to 0."""
        self._require_learning("CLEAR")
        self._request(MSG_CLEAR)

    def eeprom_save(self) -> EepromSave:
        """Persist the counts (only the EEPROM bytes that change are written)."""
        self._require_learning("EEPROM_SAVE", eeprom=True)
        usual, self.timeout = self.timeout, max(self.timeout, EEPROM_SAVE_TIMEOUT)
        try:
            answer = self._request(MSG_EEPROM_SAVE)
        finally:
            self.timeout = usual
        if len(answer) != _EEPROM_SAVE.size:
            raise DeviceError(f"EEPROM_SAVE answer of {len(answer)} bytes, expected {_EEPROM_SAVE.size}")
        return EepromSave(*_EEPROM_SAVE.unpack(answer))

    def eeprom_load(self) -> EepromLoad:
        """Replace the SRAM counts by the EEPROM record, if it holds a valid one for this model."""
        self._require_learning("EEPROM_LOAD", eeprom=True)
        answer = self._request(MSG_EEPROM_LOAD)
        if len(answer) != _EEPROM_LOAD.size:
            raise DeviceError(f"EEPROM_LOAD answer of {len(answer)} bytes, expected {_EEPROM_LOAD.size}")
        return EepromLoad(*_EEPROM_LOAD.unpack(answer))

    def _require_learning(self, what: str, eeprom: bool = False) -> None:
        """Refuse before sending when the HELLO already says the firmware cannot do it."""
        if self.info is None:
            return  # not known yet: the device's own ERROR unknown type gives the same message
        if not self.info.learning:
            raise DeviceError(CANNOT_LEARN)
        if eeprom and not self.info.eeprom:
            raise DeviceError(f"the learning firmware on {self.name} has no {what}: its counts do not fit the EEPROM")

    def close(self) -> None:
        self.port.close()
        _closed_at[self.name] = time.monotonic()  # see open_port: the next open must be a reset

    def __enter__(self) -> DeviceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals --
    def _stream(self, type: int, vector: bytes, item: int, per_chunk: int,
                head: bytes = b"") -> tuple[list[bytes], bytes]:
        """Send `vector` (items of `item` bytes) in chunks of `per_chunk` items: (the acknowledgements of every
        chunk but the last, the last one's answer). A chunk the device finds out of order (its acknowledgement
        was lost and the chunk sent again) restarts the vector from its first chunk, at most n_retries times."""
        n = len(vector) // item
        if n == 0:
            raise TinyprotoError("an empty vector has no features to send")
        for _ in range(1 + self.n_retries):
            acks: list[bytes] = []
            try:
                for first in range(0, n, per_chunk):
                    k = min(per_chunk, n - first)
                    chunk = vector[first * item : (first + k) * item]
                    answer = self._request(type, head + _CHUNK_FIRST.pack(first) + chunk, restart=first == 0)
                    if first + k == n:
                        return acks, answer
                    acks.append(answer)
            except _ChunkOrder:
                continue
        raise DeviceError(f"the device on {self.name} kept refusing the chunks of {_REQUEST_NAMES[type]} as out "
                          "of order")

    def _vector(self, values: np.ndarray, dtype: np.dtype | type, what: str) -> bytes:
        arr = np.asarray(values)
        if arr.ndim != 1:
            raise TinyprotoError(f"{what} must be one vector (1-D), got shape {arr.shape}")
        if self.info is not None and arr.shape[0] != self.info.n_features:
            raise TinyprotoError(f"{what} has {arr.shape[0]} features, the device model {self.info.n_features}")
        if np.dtype(dtype) == np.int8 and arr.dtype != np.int8:
            if not np.issubdtype(arr.dtype, np.integer) or arr.min(initial=0) < -128 or arr.max(initial=0) > 127:
                raise TinyprotoError(f"{what} must hold int8 values, got {arr.dtype}")
        return arr.astype(dtype).tobytes()

    def _check_classes(self, n: int) -> None:
        if self.info is not None and n != self.info.n_classes:
            raise DeviceError(f"device answered {n} scores, its HELLO announced {self.info.n_classes} classes")

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFF
        return self._seq

    def _send(self, type: int, seq: int, payload: bytes) -> None:
        # The leading 0x00 ends whatever partial frame the device may hold (noise, an interrupted request).
        data = b"\x00" + encode_frame(type, seq, payload)
        try:
            self.port.write(data)
            flush = getattr(self.port, "flush", None)
            if flush is not None:
                flush()
        except (OSError, TinyprotoError) as exc:
            raise DeviceError(f"cannot write to {self.name}: {exc}") from exc

    def _request(self, type: int, payload: bytes = b"", restart: bool = True) -> bytes:
        """The answer to one request; restart False: a chunk that continues a vector (see _stream)."""
        seq = self._next_seq()
        self._mid_vector = type in CHUNKED_MESSAGES and not restart
        tries = 1 + self.n_retries
        refused: list[int] = []  # ERROR codes a retry may fix (CRC, too long)
        for attempt in range(tries):
            if attempt:
                self._reader.reset()
            self._send(type, seq, payload)
            try:
                frame = self._await(type, seq, self.timeout)
            except _Retry as retry:
                refused.append(retry.code)
                continue
            if frame is not None:
                return frame.payload
        what = _REQUEST_NAMES[type]
        if len(refused) == tries and all(code == ERR_TOO_LONG for code in refused):
            raise DeviceError(
                f"the device on {self.name} found {what} too long {tries} times — it runs a model with fewer "
                "features (check hello() / check_model)"
            )
        if len(refused) == tries:
            raise DeviceError(
                f"the device on {self.name} received {what} corrupted {tries} times — check the cable and that "
                f"the baud rate is {self._baud()}"
            )
        raise self._silent(tries)

    def _await(self, type: int, seq: int, timeout: float) -> Frame | None:
        """The answer to (type, seq) within ``timeout`` s; None if none came; _Retry if the device asks for it."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                frame = self._reader.read_frame(left)
            except OSError as exc:  # pyserial's SerialException is an OSError (unplugged cable, closed pty)
                raise DeviceError(f"lost the serial port {self.name}: {exc}") from exc
            if frame is None:
                return None
            if frame.seq != seq:
                self.stale_frames += 1
                continue
            if frame.type == type | MSG_RESPONSE:
                return frame
            if frame.type == MSG_ERROR and len(frame.payload) == 1:
                self._on_error(type, frame.payload[0])
                raise _Retry(frame.payload[0])
            self.stale_frames += 1  # a valid frame of an unexpected type: an echo (loop://) or stale

    def _on_error(self, type: int, code: int) -> None:
        """Raise for errors a retry cannot fix; return for corruption (CRC, too long), which it can."""
        what = _REQUEST_NAMES[type]
        if code == ERR_UNKNOWN_TYPE and type in LEARNING_MESSAGES:
            raise DeviceError(f"the device on {self.name} does not implement {what}: {CANNOT_LEARN}")
        if code == ERR_UNKNOWN_TYPE:
            hint = " (firmware built with TP_NO_RAW_INPUT?)" if type == MSG_PREDICT_RAW else ""
            raise DeviceError(f"the device on {self.name} does not implement {what}{hint}")
        if code == ERR_ARGUMENT and self._mid_vector:
            raise _ChunkOrder(code)
        if code == ERR_ARGUMENT:
            raise DeviceError(f"the device on {self.name} refused a field of {what} as out of range")
        if code == ERR_LENGTH:
            raise DeviceError(
                f"the device on {self.name} rejected the {what} payload length — it runs a model with another "
                "number of features (check hello() / check_model)"
            )
        if code not in (ERR_CRC, ERR_TOO_LONG):
            raise DeviceError(f"the device on {self.name} answered {what} with unknown error code {code}")

    def _baud(self) -> int:
        return int(getattr(self.port, "baudrate", 115200) or 115200)

    def _silent(self, tries: int) -> DeviceError:
        return DeviceError(
            f"no answer from the device on {self.name} after {tries} tries — is the firmware flashed and the "
            f"baud rate {self._baud()}?"
        )


# ---- opening a port ----------------------------------------------------------------------------------------

_MISSING = {errno.ENOENT, errno.ENODEV, errno.ENXIO}
_BUSY = {errno.EBUSY, errno.EAGAIN, errno.EWOULDBLOCK}
_DENIED = {errno.EACCES, errno.EPERM}


def _open_error(port_url: str, exc: Exception) -> TinyprotoError:
    code = getattr(exc, "errno", None)
    text = str(exc)
    if code in _MISSING or "No such file" in text:
        return TinyprotoError(
            f"serial port {port_url} does not exist — is the Uno plugged in? (list ports: "
            "python -m serial.tools.list_ports)"
        )
    if code in _BUSY or "lock" in text.lower() or "busy" in text.lower():
        return TinyprotoError(
            f"serial port {port_url} is busy — close the serial monitor or other program that has it open"
        )
    if code == errno.ECONNREFUSED:
        return TinyprotoError(f"nothing accepts connections at {port_url} (connection refused)")
    if "Inappropriate ioctl" in text or "Is a directory" in text or "(22, 'Invalid argument')" in text:
        return TinyprotoError(f"{port_url} is not a serial port (not a terminal device); give the board's port, "
                              "e.g. /dev/ttyACM0 or /dev/ttyUSB0")
    if code in _DENIED:
        return TinyprotoError(f"no permission to open {port_url} — add your user to the 'dialout' group")
    return TinyprotoError(f"cannot open serial port {port_url}: {text}")


# Opening a board's port resets it (DTR pulls RESET low through a capacitor) only if the port was closed long
# enough before: the capacitor recharges in ~1 ms on an Uno, and a simulated board notices the close by polling.
# A reopen of a port this process closed waits out the rest of this gap, so it is a reset on both.
RESET_GAP_S = 0.05
_closed_at: dict[str, float] = {}


def _wait_reset_gap(port_url: str) -> None:
    closed = _closed_at.get(port_url)
    if closed is not None:
        left = RESET_GAP_S - (time.monotonic() - closed)
        if left > 0:
            time.sleep(left)


def _check_not_held(port_url: str) -> None:
    """Another program holding the port (a serial monitor, avrdude) would share its bytes: refuse, naming it.
    A simulator holding both ends of its pty is the device, not another program (see port_holders)."""
    from tinyproto.device.flash import check_port_free

    check_port_free(port_url, must_be_terminal=False)  # pyserial's open says it if the port is no terminal


def open_port(port_url: str, baud: int = 115200) -> SerialPort:
    """Open a pyserial URL (``/dev/ttyACM0``, ``/dev/pts/N``, ``loop://``, ``socket://host:port``) for
    exclusive use; each failure becomes one clear TinyprotoError."""
    import serial  # pyserial; imported here so that `tinyproto --help` stays fast

    _check_not_held(port_url)
    _wait_reset_gap(port_url)
    try:
        return serial.serial_for_url(
            port_url, baudrate=baud, timeout=READ_SLICE, write_timeout=5.0, exclusive=True
        )
    except ValueError as exc:  # unknown URL scheme, unsupported baud rate
        raise TinyprotoError(f"cannot open {port_url}: {exc}") from exc
    except (serial.SerialException, OSError) as exc:
        raise _open_error(port_url, exc) from exc


def open_device(
    port_url: str,
    baud: int = 115200,
    handshake_timeout: float = 5.0,
    n_retries: int = 3,
    timeout: float = DEFAULT_TIMEOUT,
    boot_quiet_s: float = 0.0,
) -> DeviceClient:
    """Open the port and complete the HELLO handshake (retried until ``handshake_timeout`` s, which covers the
    Uno's reset + bootloader: no fixed sleep, the first answer ends the wait); the returned client's ``info``
    holds the device's Hello."""
    port = open_port(port_url, baud)
    client = DeviceClient(port, n_retries=n_retries, timeout=timeout)
    try:
        time.sleep(boot_quiet_s)  # a board whose bootloader waits for silence (Board.boot_quiet_s)
        client.handshake(handshake_timeout)
    except BaseException:
        port.close()
        raise
    return client
