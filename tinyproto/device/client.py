"""The request/response client of the tinyproto serial protocol (frames and messages: codec.py): one request at a
time, retries keeping their seq, vectors sent in chunks. tinyproto/device/protocol.py opens a port and gives one.

Layer: device.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from typing import Callable, Iterable, Iterator

import numpy as np

from tinyproto.core import wire
from tinyproto.core.data_checks import MAX_CLASSES
from tinyproto.core.errors import TinyprotoError
from tinyproto.device.codec import (
    CANNOT_LEARN, CHUNKED_MESSAGES, DEFAULT_TIMEOUT, DeviceError, DeviceSilent, EEPROM_SAVE_TIMEOUT, ERR_ARGUMENT,
    ERR_CRC, ERR_LENGTH, ERR_TOO_LONG, ERR_UNKNOWN_TYPE, EepromLoad, EepromSave, Frame, FrameReader, Hello, PORT_ERRORS,
    LEARNING_MESSAGES, LearnAck, MSG_CLEAR, MSG_EEPROM_LOAD, MSG_EEPROM_SAVE, MSG_ERROR, MSG_HELLO, MSG_LEARN,
    MSG_PREDICT, MSG_PREDICT_RAW, MSG_READ_COUNTS, MSG_RESPONSE, MSG_STATS, Prediction, READ_SLICE,
    RawPrediction, SerialPort, Stats, _CHUNK_FIRST, _EEPROM_LOAD, _EEPROM_SAVE, _LEARN_ACK, _READ_COUNTS,
    _REQUEST_NAMES, encode_frame, parse_hello, parse_prediction, parse_raw_prediction, parse_stats,
)


# After a lost frame in a window, the device is quiet (its ring empty) once no frame came for this long: a full
# ring at 57600 baud takes 45 ms to arrive, and the slowest inference tens of ms more.
QUIET_S = 0.25

# When this process last closed each port (open_port waits out RESET_GAP_S after it, so a reopen is a reset).
_closed_at: dict[str, float] = {}


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
    answer; after ``1 + n_retries`` tries a DeviceError says the device is silent.

    rx_ring: the bytes of the firmware's receive ring (build.json's rx_ring_bytes, sized by compile to the SRAM the
    model leaves free); a window keeps at most one byte less unanswered. None: the smallest ring any firmware has
    (wire.RX_RING_MIN), safe for every one."""

    def __init__(self, port: SerialPort, n_retries: int = 3, timeout: float = DEFAULT_TIMEOUT,
                 rx_ring: int | None = None) -> None:
        self.port = port
        self.window_bytes = wire.rx_window_bytes(wire.RX_RING_MIN if not rx_ring else rx_ring)
        self.n_retries = n_retries
        self.timeout = timeout
        self.name = str(getattr(port, "port", None) or getattr(port, "name", None) or port)
        self.info: Hello | None = None  # set by hello()
        self.stale_frames = 0
        self.echoes = 0  # of stale_frames: frames of a request type (a line that echoes what is sent: loop://)
        self._heard0 = (0, 0, 0, 0)  # what the line had carried when the request under way began
        self._mid_vector = False  # the request under way continues a vector (an ERROR argument means "order")
        self._reader = FrameReader(port)
        self._seq = 0
        self.window_restarts = 0  # windows of chunks sent again after a lost or refused frame
        # requests and vectors sent again (a retry, a restarted vector or window): the device may run a request
        # it already ran, when its answer was late rather than lost
        self.requests_sent_again = 0
        self.bytes_sent = 0  # every byte written to the port (the line's load, host to device)
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
        hello_bytes = 2 * (2 + wire.FRAME_OVERHEAD) + wire.HELLO_PAYLOAD + 1  # the request and its answer, framed
        tries = 0
        self._mark_heard()
        while True:
            tries += 1
            self._reader.reset(self._frame_gap_s())  # the bootloader's chatter may have left half a "frame"
            self._send(MSG_HELLO, seq, b"")
            left = deadline - time.monotonic()
            try:
                frame = self._await(MSG_HELLO, seq, max(0.0, min(try_timeout + self._line_s(hello_bytes), left)))
            except _Retry:
                frame = None
            if frame is not None:
                self.info = parse_hello(frame.payload)
                return self.info
            if time.monotonic() >= deadline:
                raise self._silent(tries, MSG_HELLO)

    def predict(self, xq: np.ndarray) -> Prediction:
        """The inference of int8 features, with its exact cycles. To a firmware with a receive ring that gathers
        the vector (no HELLO flag bit3) the chunks go as a window: its timed code runs only after the last chunk,
        and nothing follows that chunk until its answer, so no receive interrupt runs inside the timing. A
        streaming family times every chunk as it arrives: its chunks go one frame at a time."""
        vector = self._vector(xq, np.int8, "xq")
        stream = self._stream_windowed if self.windowed and not self.info.streams else self._stream
        _, last = stream(MSG_PREDICT, vector, 1, wire.CHUNK_BYTES)
        answer = parse_prediction(last)
        self._check_classes(len(answer.scores))
        return answer

    def predict_raw(self, raw: np.ndarray) -> RawPrediction:
        """The on-device input stage and inference from raw float32 features. On firmware with a receive ring
        (HELLO flag bit4) the chunks go as a window of frames in flight; a streaming family's cycles then include
        the receive interrupts that ran during the inference (its int8 PREDICT is the timed one: it goes one frame
        at a time)."""
        if self.info is not None and not self.info.raw_input:
            raise DeviceError("the firmware was built with TP_NO_RAW_INPUT: use predict() with int8 inputs")
        vector = self._vector(raw, np.dtype("<f4"), "raw")
        n = len(vector) // 4
        stream = self._stream_windowed if self.windowed else self._stream
        acks, last = stream(MSG_PREDICT_RAW, vector, 4, wire.RAW_CHUNK_FEATURES)
        return self._raw_prediction(n, acks, last)

    def _raw_prediction(self, n: int, acks: list[bytes], last: bytes) -> RawPrediction:
        """One vector's PREDICT_RAW answers (every chunk's acknowledgement and the last one's answer) checked and
        joined."""
        tail = n - wire.RAW_CHUNK_FEATURES * len(acks)
        for k, ack in enumerate(acks):
            if len(ack) != wire.RAW_CHUNK_FEATURES:
                raise DeviceError(f"PREDICT_RAW chunk {k} answered {len(ack)} int8 inputs, "
                                  f"expected {wire.RAW_CHUNK_FEATURES}")
        answer = parse_raw_prediction(last, tail)
        self._check_classes(len(answer.scores))
        x = np.concatenate([np.frombuffer(b"".join(acks), dtype=np.int8), answer.x])
        return RawPrediction(answer.label, answer.cycles, x, answer.scores, answer.confidence, answer.decided)

    def predict_raw_many(self, raws: Iterable[np.ndarray]) -> Iterator[RawPrediction]:
        """predict_raw of every vector, in order. On firmware with a receive ring the window runs across vectors:
        the next vector's chunks go while the device still works on the last one's, so the line does not idle for
        a round trip per vector. The cycles of this pass then include receive interrupts for every family (the
        int8 PREDICT stays the timed one). A lost or refused frame resends every vector not fully answered from
        its first chunk, at most n_retries times for one vector."""
        if self.info is not None and not self.info.raw_input:
            raise DeviceError("the firmware was built with TP_NO_RAW_INPUT: use predict() with int8 inputs")
        if not self.windowed:
            for raw in raws:
                yield self.predict_raw(raw)
            return
        vectors = (self._vector(raw, np.dtype("<f4"), "raw") for raw in raws)
        for vector, answers in self._pipeline(MSG_PREDICT_RAW, vectors, 4, wire.RAW_CHUNK_FEATURES):
            yield self._raw_prediction(len(vector) // 4, answers[:-1], answers[-1])

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

    @property
    def windowed(self) -> bool:
        """The device buffers what it receives (HELLO flag bit4): frames may go before earlier ones are answered."""
        return self.info is not None and self.info.windowed

    # -- internals --
    def _stream_windowed(self, type: int, vector: bytes, item: int, per_chunk: int,
                         head: bytes = b"") -> tuple[list[bytes], bytes]:
        """_stream with a window: every chunk's frame is sent as soon as the frames not yet answered, itself
        included, fit the device's receive ring (self.window_bytes), and the answers are taken in order. Any
        answer missing (timeout), out of order, or an ERROR a resend can fix ends the try: wait until the device
        is quiet (its ring empty, late answers dropped as stale), then send the whole vector again from its first
        chunk (first = 0 starts the vector afresh on the device), at most n_retries times."""
        n = len(vector) // item
        if n == 0:
            raise TinyprotoError("an empty vector has no features to send")
        firsts = range(0, n, per_chunk)
        payloads = [head + _CHUNK_FIRST.pack(first) + vector[first * item : min(first + per_chunk, n) * item]
                    for first in firsts]
        for attempt in range(1 + self.n_retries):
            if attempt:
                self.window_restarts += 1
                self.requests_sent_again += 1
                self._wait_quiet()
            answers = self._window(type, payloads)
            if answers is not None:
                return answers[:-1], answers[-1]
        raise DeviceError(f"the device on {self.name} kept losing or refusing the chunks of {_REQUEST_NAMES[type]} "
                          f"({1 + self.n_retries} tries) — check the cable and that the baud rate is {self._baud()}")

    def _pipeline(self, type: int, vectors: Iterator[bytes], item: int,
                  per_chunk: int) -> Iterator[tuple[bytes, list[bytes]]]:
        """(vector, its answers) for every vector, in order, through one window that runs across vectors (see
        _stream_windowed for one vector). A try fails as there (an answer missing, out of order or an ERROR a
        resend can fix); then, once the device is quiet, every vector not fully answered goes again from its first
        chunk (first = 0 starts a vector afresh), so a vector is never answered from a half that went before."""
        in_flight: deque[bytes] = deque()  # vectors begun, not fully answered, oldest first
        tries = 0  # failed tries of the oldest vector
        while True:
            try_vectors = list(in_flight)
            in_flight.clear()
            answered = yield from self._pipeline_try(type, try_vectors, vectors, in_flight, item, per_chunk)
            if not in_flight:
                return
            tries = 0 if answered else tries + 1
            if tries > self.n_retries:
                raise DeviceError(f"the device on {self.name} kept losing or refusing the chunks of "
                                  f"{_REQUEST_NAMES[type]} ({1 + self.n_retries} tries) — check the cable and that "
                                  f"the baud rate is {self._baud()}")
            self.window_restarts += 1
            self.requests_sent_again += 1
            self._wait_quiet()

    def _pipeline_try(self, type: int, again: list[bytes], fresh: Iterator[bytes], in_flight: deque,
                      item: int, per_chunk: int):
        """One try of _pipeline: first the vectors of `again`, then vectors from `fresh`, their chunks' frames sent
        as the window allows, the answers taken in order; each vector fully answered is yielded. Returns whether
        any vector was answered; the vectors begun but not answered are left in `in_flight` (oldest first)."""
        self._mid_vector = True  # an ERROR argument means "out of order" here (a lost frame): resend
        queue = deque(again)  # vectors still to begin, before any fresh one
        frames: deque[tuple[int, bytes]] = deque()  # (seq, encoded) sent, not yet answered
        pending: deque[tuple[int, bytes]] = deque()  # (seq, encoded) of the vector being sent, not yet sent
        n_frames: deque[int] = deque()  # frames of each vector in in_flight
        answered, answers, unanswered_bytes, exhausted = False, [], 0, False
        while True:
            if not pending and not exhausted:
                vector = queue.popleft() if queue else next(fresh, None)
                if vector is None:
                    exhausted = True
                else:
                    payloads = self._chunk_payloads(vector, item, per_chunk)
                    pending.extend((seq, b"\x00" + encode_frame(type, seq, payload))
                                   for seq, payload in zip((self._next_seq() for _ in payloads), payloads))
                    in_flight.append(vector)
                    n_frames.append(len(payloads))
                    continue
            batch = []
            while pending and unanswered_bytes + len(pending[0][1]) <= self.window_bytes:
                seq, encoded = pending.popleft()
                frames.append((seq, encoded))
                batch.append(encoded)
                unanswered_bytes += len(encoded)
            if batch:
                self._write(b"".join(batch), drain=False)
                if pending or not exhausted:
                    continue  # room may be left for the next vector's first frames
            if not frames:
                return answered  # every vector answered: in_flight and queue are empty
            expected, encoded = frames[0]
            try:
                frame = self._await_any(self._try_s(unanswered_bytes), {seq for seq, _ in frames})
            except PORT_ERRORS as exc:  # pyserial's SerialException is an OSError (unplugged cable, closed pty)
                raise DeviceError(f"lost the serial port {self.name}: {exc}") from exc
            if frame is None or frame.seq != expected or frame.type == MSG_ERROR or frame.type != type | MSG_RESPONSE:
                if frame is not None and frame.type == MSG_ERROR:
                    try:
                        self._on_error(type, frame.payload[0] if len(frame.payload) == 1 else -1)
                    except _ChunkOrder:
                        pass
                in_flight.extend(queue)  # not begun in this try: they follow the begun ones
                return answered
            frames.popleft()
            unanswered_bytes -= len(encoded)
            answers.append(frame.payload)
            if len(answers) == n_frames[0]:
                vector = in_flight.popleft()
                n_frames.popleft()
                answered = True
                yield vector, answers
                answers = []

    @staticmethod
    def _chunk_payloads(vector: bytes, item: int, per_chunk: int, head: bytes = b"") -> list[bytes]:
        """The payloads of a vector's chunks: `head`, the index of the chunk's first item, its items."""
        n = len(vector) // item
        if n == 0:
            raise TinyprotoError("an empty vector has no features to send")
        return [head + _CHUNK_FIRST.pack(first) + vector[first * item : min(first + per_chunk, n) * item]
                for first in range(0, n, per_chunk)]

    def _window(self, type: int, payloads: list[bytes]) -> list[bytes] | None:
        """One try of _stream_windowed: the answers in order, or None if one was lost or refused."""
        seqs = [self._next_seq() for _ in payloads]
        frames = [b"\x00" + encode_frame(type, seq, payload) for seq, payload in zip(seqs, payloads)]
        answers: list[bytes] = []
        sent, in_flight = 0, 0
        self._mid_vector = True  # an ERROR argument means "out of order" here (a lost frame): resend
        while len(answers) < len(frames):
            batch = []
            while sent < len(frames) and in_flight + len(frames[sent]) <= self.window_bytes:
                batch.append(frames[sent])
                in_flight += len(frames[sent])
                sent += 1
            if batch:
                self._write(b"".join(batch), drain=False)  # waiting for the bytes to leave would idle the line
            expected = seqs[len(answers)]
            try:
                frame = self._await_any(self._try_s(in_flight), set(seqs[len(answers) : sent]))
            except PORT_ERRORS as exc:  # pyserial's SerialException is an OSError (unplugged cable, closed pty)
                raise DeviceError(f"lost the serial port {self.name}: {exc}") from exc
            if frame is None or frame.seq != expected:
                return None  # no answer in time, or a later frame's answer: this one's request or answer was lost
            if frame.type == MSG_ERROR:
                try:
                    self._on_error(type, frame.payload[0] if len(frame.payload) == 1 else -1)
                except _ChunkOrder:
                    pass
                return None
            if frame.type != type | MSG_RESPONSE:
                return None
            answers.append(frame.payload)
            in_flight -= len(frames[len(answers) - 1])
        return answers

    def _await_any(self, timeout: float, window: set[int]) -> Frame | None:
        """The next frame answering one of the seqs in `window` (others are stale and dropped), or None."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            frame = self._read(left)
            if frame is None:
                return None
            if frame.seq in window and (frame.type == MSG_ERROR or frame.type & MSG_RESPONSE):
                return frame
            self._drop(frame)

    def _wait_quiet(self, quiet_s: float = QUIET_S) -> None:
        """Drop frames until none came for quiet_s: the device has answered everything still in its ring."""
        while True:
            try:
                frame = self._reader.read_frame(quiet_s)
            except PORT_ERRORS as exc:
                raise DeviceError(f"lost the serial port {self.name}: {exc}") from exc
            if frame is None:
                break
            self.stale_frames += 1
        self._reader.reset()

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
                self.requests_sent_again += 1
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
        self._write(b"\x00" + encode_frame(type, seq, payload))

    def _write(self, data: bytes, drain: bool = True) -> None:
        self.bytes_sent += len(data)
        try:
            self.port.write(data)
            flush = getattr(self.port, "flush", None)
            if drain and flush is not None:
                flush()
        except PORT_ERRORS as exc:  # EIO/ENXIO: the cable was pulled or the pty closed, as on a read
            raise DeviceError(f"lost the serial port {self.name} while writing to it: {exc}") from exc
        except TinyprotoError as exc:
            raise DeviceError(f"cannot write to {self.name}: {exc}") from exc

    def _request(self, type: int, payload: bytes = b"", restart: bool = True) -> bytes:
        """The answer to one request; restart False: a chunk that continues a vector (see _stream)."""
        seq = self._next_seq()
        self._mid_vector = type in CHUNKED_MESSAGES and not restart
        tries = 1 + self.n_retries
        refused: list[int] = []  # ERROR codes a retry may fix (CRC, too long)
        self._mark_heard()
        for attempt in range(tries):
            if attempt:
                self.requests_sent_again += 1
                self._reader.reset(self._frame_gap_s())
            self._send(type, seq, payload)
            try:
                frame = self._await(type, seq, self._try_s(len(payload) + 2 + wire.FRAME_OVERHEAD))
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
        raise self._silent(tries, type)

    def _await(self, type: int, seq: int, timeout: float) -> Frame | None:
        """The answer to (type, seq) within ``timeout`` s; None if none came; _Retry if the device asks for it."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            try:
                frame = self._read(left)
            except PORT_ERRORS as exc:  # pyserial's SerialException is an OSError (unplugged cable, closed pty)
                raise DeviceError(f"lost the serial port {self.name}: {exc}") from exc
            if frame is None:
                return None
            if frame.seq != seq:
                self._drop(frame)
                continue
            if frame.type == type | MSG_RESPONSE:
                return frame
            if frame.type == MSG_ERROR:  # an ERROR of another length than one code byte: an unknown error
                code = frame.payload[0] if len(frame.payload) == 1 else -1
                self._on_error(type, code)
                raise _Retry(code)
            self._drop(frame)  # a valid frame of an unexpected type: an echo (loop://) or stale

    def _drop(self, frame: Frame) -> None:
        """A well-formed frame that answers nothing under way: stale (late, another seq) or an echo."""
        self.stale_frames += 1
        self.echoes += not frame.type & MSG_RESPONSE and frame.type != MSG_ERROR

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
        if code < 0:
            raise DeviceError(f"the device on {self.name} answered {what} with a malformed ERROR (not one code byte)")
        if code not in (ERR_CRC, ERR_TOO_LONG):
            raise DeviceError(f"the device on {self.name} answered {what} with unknown error code {code}")

    def _baud(self) -> int:
        return int(getattr(self.port, "baudrate", 115200) or 115200)

    def _line_s(self, n_bytes: int) -> float:
        """The seconds the line takes to carry n_bytes at the port's baud (10 bits a byte: start, 8 data, stop)."""
        return 10.0 * n_bytes / self._baud()

    def _frame_gap_s(self) -> float:
        """Longer than any pause between two bytes of one frame (a few byte times, and a busy host's hiccup): a
        partial frame quiet for longer will not be finished."""
        return 0.1 + self._line_s(16)

    def _read(self, timeout: float) -> Frame | None:
        """The next frame within `timeout` s, or a frame still arriving then (at most what the largest frame takes
        on the line eight times over, and the timeout, more)."""
        return self._reader.read_frame(timeout, self._frame_gap_s(), self.timeout + 8 * self._line_s(self._largest()))

    def _largest(self) -> int:
        """The bytes on the line of the largest answer the device may send (its frame buffer bounds it)."""
        n_classes = self.info.n_classes if self.info is not None else MAX_CLASSES
        largest = max(wire.frame_buffer_bytes(n_classes), wire.FRAME_OVERHEAD + _READ_COUNTS.size + 255)
        return wire.cobs_bytes(largest) + 1

    def _try_s(self, sent_bytes: int) -> float:
        """How long a try waits for its answer: the timeout, plus what the line takes to carry the bytes sent and
        the largest answer at the port's baud: a few ms at 115200; at 1200 baud a HELLO and its answer alone take
        0.3 s and 255 bytes of counts 2.2 s, and a fixed wait made a slow line look silent."""
        return self.timeout + self._line_s(sent_bytes + self._largest())

    def _mark_heard(self) -> None:
        """Remember what the line carried so far: _silent says what came during the request's tries."""
        self._heard0 = (self._reader.bytes_read, self._reader.bad_frames, self.stale_frames, self.echoes)

    def _silent(self, tries: int, type: int = MSG_HELLO) -> DeviceError:
        """The error of a request no try got an answer to, saying what the device sent instead: nothing (not
        flashed, wrong port), its requests echoed, bytes that are no frame (another baud rate, another program),
        or well-formed frames that answer no request under way (late answers, a firmware out of step), where a
        slower baud rate would not help."""
        read0, bad0, stale0, echoes0 = self._heard0
        heard = self._reader.bytes_read - read0
        bad = self._reader.bad_frames - bad0
        echoes = self.echoes - echoes0
        stale = self.stale_frames - stale0 - echoes
        what = _REQUEST_NAMES.get(type, "the request")
        error = self._silent_error(tries, type, what, heard, bad, echoes, stale)
        error.answered_before = type != MSG_HELLO and getattr(self, "info", None) is not None
        return error

    def _silent_error(self, tries: int, type: int, what: str, heard: int, bad: int, echoes: int,
                      stale: int) -> DeviceSilent:
        if echoes and not stale and not bad:
            return DeviceSilent(
                f"no answer from the device on {self.name} after {tries} tries: the line echoes the requests sent "
                "(a loopback, or a board held in reset) — is the board's port the right one?", speed_may_help=False
            )
        if stale and not bad:
            return DeviceSilent(
                f"the device on {self.name} did not answer {what} in {tries} tries: the {stale} frame"
                f"{'s' if stale != 1 else ''} it sent answer{'s' if stale == 1 else ''} no request under way "
                "(late answers, or a firmware out of step) — reset the board and try again", speed_may_help=False
            )
        if heard:
            return DeviceSilent(
                f"no answer from the device on {self.name} after {tries} tries: it sent {heard} bytes but no "
                f"frame answering {what} ({bad} malformed) — is the firmware tinyproto's and the baud rate "
                f"{self._baud()}?"
            )
        if type != MSG_HELLO and getattr(self, "info", None) is not None:  # it answered at this rate before
            return DeviceSilent(
                f"the device on {self.name} stopped answering: no answer to {what} in {tries} tries (it sent "
                "nothing), after it had answered the handshake — it hung, was reset or lost power: reset the board "
                "and run the command again", speed_may_help=False
            )
        return DeviceSilent(
            f"no answer from the device on {self.name} after {tries} tries (it sent nothing) — is the firmware "
            f"flashed and the baud rate {self._baud()}?"
        )
