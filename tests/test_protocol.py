"""Serial protocol: the Python codec and client (tinyproto/device/protocol.py) and the device application
(firmware/tp_main.c + tp_serial.c) compiled for the host and driven through pipes and a pty, with the fake model
of tests/fixtures/protocol mirrored below in numpy."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import time
import tty
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import serial
from hypothesis import given, settings
from hypothesis import strategies as st

from tinyproto.core import wire
from tinyproto.device import protocol as P
from tinyproto.core.errors import TinyprotoError

from helpers import (APP_SOURCES, C_SOURCES, FIXTURE, MODEL_HASH, N_CLASSES, N_FEATURES,
                     PipePort, build_avr, fake_quantize, fake_scores, sizes_include)

ROOT = Path(__file__).resolve().parents[1]
FIRMWARE = ROOT / "firmware"
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True)  # derandomized: stable in CI


# ---- the fake model, mirrored from tests/fixtures/protocol/fake_model.c ------------------------------------




# ---- ports -------------------------------------------------------------------------------------------------


class BytesPort:
    """In-memory port: read() serves scripted bytes (optionally in small chunks), write() records."""

    def __init__(self, data: bytes = b"", chunk: int = 7) -> None:
        self.rx = bytearray(data)
        self.written: list[bytes] = []
        self.timeout: float | None = 0.01
        self.chunk = chunk
        self.port = "mem://test"

    def read(self, size: int = 1) -> bytes:
        n = min(size, self.chunk, len(self.rx))
        if n == 0:
            time.sleep(self.timeout or 0)
            return b""
        out = bytes(self.rx[:n])
        del self.rx[:n]
        return out

    def write(self, data: bytes) -> int:
        self.written.append(bytes(data))
        return len(data)

    def close(self) -> None:
        pass


class ScriptedDevice(BytesPort):
    """A Python stand-in for the firmware with fault injection: each request is answered by ``answer(frame,
    n)`` (n = index of the request), which returns the raw bytes to put on the line (b"" = stay silent)."""

    def __init__(self, answer) -> None:
        super().__init__()
        self.answer = answer
        self.requests: list[P.Frame] = []

    def write(self, data: bytes) -> int:
        super().write(data)
        for encoded in bytes(data).split(b"\x00"):
            if encoded:
                frame = P.decode_frame(encoded)
                self.rx += self.answer(frame, len(self.requests))
                self.requests.append(frame)
        return len(data)


def hello_payload(model_hash: int = MODEL_HASH, flags: int = 1) -> bytes:
    return struct.pack("<4sBBBIHBBBIB", b"TPRO", P.PROTO_VERSION, 1, 1, model_hash, N_FEATURES, N_CLASSES, 1, 4,
                       16_000_000, flags)


def prediction_payload(x: np.ndarray) -> bytes:
    scores = fake_scores(x)
    return (struct.pack("<BIBB", int(np.argmax(scores)), 1234, 0, int(np.argmax(scores)))
            + scores.astype("<i4").tobytes())


def good_answer(frame: P.Frame, _n: int = 0) -> bytes:
    if frame.type == P.MSG_HELLO:
        return P.encode_frame(0x81, frame.seq, hello_payload())
    if frame.type == P.MSG_PREDICT:
        return P.encode_frame(0x82, frame.seq, prediction_payload(np.frombuffer(frame.payload[2:], np.int8)))
    return P.encode_frame(0x84, frame.seq, struct.pack("<HHH", 300, 120, 0))


def answers(port: PipePort, data: bytes, quiet: float = 0.15) -> list[P.Frame]:
    """Send raw bytes to the firmware and collect every frame it sends until it has been quiet a while."""
    port.write(data)
    reader = P.FrameReader(port)
    frames = []
    while (frame := reader.read_frame(quiet)) is not None:
        frames.append(frame)
    return frames


# ---- builds ------------------------------------------------------------------------------------------------

C_FLAGS = ["-std=c99", "-pedantic", "-Wall", "-Wextra", "-Werror", "-DTP_HOST", f"-I{FIRMWARE}", f"-I{FIXTURE}"]



def build_host(cc: str, out: Path, *defines: str) -> Path:
    if shutil.which(cc) is None:
        pytest.skip(f"{cc} not installed")
    classes = [int(d.split("=")[1]) for d in defines if d.startswith("-DTP_N_CLASSES=")] or [N_CLASSES]
    include = sizes_include(out.parent / f"sizes_{out.name}", classes[0])
    subprocess.run([cc, *C_FLAGS, include, *defines, *map(str, C_SOURCES), "-o", str(out)], check=True)
    return out


@pytest.fixture(scope="session")
def host_builds(tmp_path_factory):
    """name -> host executable of the device app; built once per session, on first use."""
    out = tmp_path_factory.mktemp("tp_host")
    variants = {
        "default": ("gcc",),
        "noraw": ("gcc", "-DTP_NO_RAW_INPUT"),
        "big": ("gcc", "-DTP_N_FEATURES=300", "-DTP_N_CLASSES=70"),
        "clang": ("clang",),
        "stream": ("gcc", "-DTP_STREAMABLE=1", "-DTP_N_FEATURES=300", "-DTP_N_CLASSES=5"),
        "stream_small": ("gcc", "-DTP_STREAMABLE=1"),
    }
    cache: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in cache:
            cc, *defines = variants[name]
            cache[name] = build_host(cc, out / name, *defines)
        return cache[name]

    return get


@pytest.fixture
def device(host_builds):
    """A DeviceClient talking to the host-compiled firmware (default variant) through pipes."""
    port = PipePort(host_builds("default"))
    client = P.DeviceClient(port, n_retries=1, timeout=1.0)
    yield client
    client.close()


# ---- codec -------------------------------------------------------------------------------------------------


def test_crc16_ccitt_false_check_value():
    assert P.crc16_ccitt(b"123456789") == 0x29B1
    assert P.crc16_ccitt(b"") == 0xFFFF


@pytest.mark.parametrize(
    "raw, encoded",
    [
        (b"", b"\x01"),
        (b"\x00", b"\x01\x01"),
        (b"\x00\x00", b"\x01\x01\x01"),
        (b"\x11\x22\x00\x33", b"\x03\x11\x22\x02\x33"),
        (b"\x11\x22\x33\x44", b"\x05\x11\x22\x33\x44"),
        (bytes(range(1, 255)), b"\xff" + bytes(range(1, 255))),
        (bytes(range(1, 255)) + b"\x00", b"\xff" + bytes(range(1, 255)) + b"\x01\x01"),
        (bytes(range(1, 256)), b"\xff" + bytes(range(1, 255)) + b"\x02\xff"),
    ],
)
def test_cobs_known_vectors(raw, encoded):
    assert P.cobs_encode(raw) == encoded
    assert P.cobs_decode(encoded) == raw


@PROPERTY
@given(st.binary(max_size=1200))
def test_cobs_round_trip(data):
    encoded = P.cobs_encode(data)
    assert 0 not in encoded
    assert len(encoded) <= len(data) + len(data) // 254 + 1
    assert P.cobs_decode(encoded) == data


@pytest.mark.parametrize("bad", [b"\x05\x11\x22", b"\x02\x11\x00", b"\x00"])
def test_cobs_decode_rejects_malformed(bad):
    with pytest.raises(P.FrameError):
        P.cobs_decode(bad)


@PROPERTY
@given(st.integers(0, 255), st.integers(0, 255), st.binary(max_size=600), st.binary(max_size=60))
def test_frame_round_trip_after_garbage(type_, seq, payload, garbage):
    port = BytesPort(garbage + b"\x00" + P.encode_frame(type_, seq, payload))
    frame = P.FrameReader(port).read_frame(1.0)
    assert frame == P.Frame(type_, seq, payload)


@PROPERTY
@given(st.binary(min_size=1, max_size=40), st.data())
def test_corrupted_byte_is_dropped_and_reader_recovers(payload, data):
    wire = bytearray(P.encode_frame(0x02, 7, payload))
    pos = data.draw(st.integers(0, len(wire) - 2), label="position")
    wire[pos] ^= data.draw(st.integers(1, 255), label="xor")
    good = P.encode_frame(0x04, 8, b"ok")
    reader = P.FrameReader(BytesPort(bytes(wire) + b"\x00" + good))
    before = []
    while (frame := reader.read_frame(1.0)) != P.Frame(0x04, 8, b"ok"):
        assert frame is not None, "the good frame after the corrupted one was lost"
        before.append(frame)
    assert P.Frame(0x02, 7, payload) not in before  # the corrupted frame never passes as the original


def test_wrong_crc_truncated_frame_and_garbage_are_dropped():
    good = P.encode_frame(0x81, 3, b"hello")
    bad_crc = bytearray(good)
    bad_crc[2] ^= 0x40
    truncated = good[: len(good) // 2] + b"\x00"
    reader = P.FrameReader(BytesPort(b"\xde\xad\x00" + bytes(bad_crc) + truncated + b"\x01\x00" + good))
    assert reader.read_frame(1.0) == P.Frame(0x81, 3, b"hello")
    assert reader.bad_frames == 4  # garbage, wrong CRC, truncated, too short


def test_overlong_run_without_delimiter_is_skipped():
    good = P.encode_frame(0x84, 1, b"\x01\x02\x03\x04\x05\x06")
    reader = P.FrameReader(BytesPort(b"\x55" * 300 + b"\x00" + good, chunk=64), max_body=100)
    assert reader.read_frame(1.0) == P.Frame(0x84, 1, b"\x01\x02\x03\x04\x05\x06")
    assert reader.bad_frames == 1


def test_frames_through_pyserial_loop_url():
    port = serial.serial_for_url("loop://", timeout=0.02)
    try:
        port.write(b"junk\x00" + P.encode_frame(0x82, 9, bytes(range(256))) + P.encode_frame(0x7F, 10, b"\x01"))
        reader = P.FrameReader(port)
        assert reader.read_frame(1.0) == P.Frame(0x82, 9, bytes(range(256)))
        assert reader.read_frame(1.0) == P.Frame(0x7F, 10, b"\x01")
        assert reader.read_frame(0.05) is None
    finally:
        port.close()


# ---- client against scripted faults ------------------------------------------------------------------------


def test_client_hello_predict_stats_against_scripted_device():
    client = P.DeviceClient(ScriptedDevice(good_answer), timeout=0.2)
    hello = client.hello()
    assert (hello.model_hash, hello.n_features, hello.n_classes, hello.raw_input) == (MODEL_HASH, 8, 3, True)
    x = np.arange(-4, 4, dtype=np.int8)
    prediction = client.predict(x)
    assert prediction.cycles == 1234
    np.testing.assert_array_equal(prediction.scores, fake_scores(x))
    assert client.stats() == P.Stats(300, 120, 0)


def test_corrupted_answer_is_retried():
    def answer(frame, n):
        wire = bytearray(good_answer(frame))
        if n == 0:
            wire[3] ^= 0x10  # the first answer arrives with a flipped bit
        return bytes(wire)

    device = ScriptedDevice(answer)
    client = P.DeviceClient(device, n_retries=2, timeout=0.1)
    assert client.hello().model_hash == MODEL_HASH
    assert len(device.requests) == 2
    assert device.requests[0].seq == device.requests[1].seq  # a retry keeps its request's seq


def test_truncated_answer_without_delimiter_is_retried():
    def answer(frame, n):
        wire = good_answer(frame)
        return wire[:5] if n == 0 else wire

    client = P.DeviceClient(ScriptedDevice(answer), n_retries=1, timeout=0.1)
    assert client.hello().n_classes == N_CLASSES


def test_stale_seq_is_dropped():
    def answer(frame, n):
        stale = P.encode_frame(0x81, (frame.seq - 1) & 0xFF, hello_payload(model_hash=0xBAD))
        return stale + good_answer(frame)

    client = P.DeviceClient(ScriptedDevice(answer), timeout=0.2)
    assert client.hello().model_hash == MODEL_HASH
    assert client.stale_frames == 1


def test_device_error_crc_is_retried_then_gives_up_clearly():
    device = ScriptedDevice(lambda frame, n: P.encode_frame(0x7F, frame.seq, b"\x01"))
    client = P.DeviceClient(device, n_retries=2, timeout=0.2)
    with pytest.raises(P.DeviceError, match="received HELLO corrupted 3 times"):
        client.hello()
    assert len(device.requests) == 3


@pytest.mark.parametrize("code, message", [(2, "payload length"), (3, "does not implement PREDICT")])
def test_device_error_length_or_type_is_not_retried(code, message):
    device = ScriptedDevice(lambda frame, n: P.encode_frame(0x7F, frame.seq, bytes([code])))
    client = P.DeviceClient(device, n_retries=3, timeout=0.2)
    with pytest.raises(P.DeviceError, match=message):
        client.predict(np.zeros(N_FEATURES, np.int8))
    assert len(device.requests) == 1


def test_silent_device_raises_after_bounded_tries():
    device = ScriptedDevice(lambda frame, n: b"")
    client = P.DeviceClient(device, n_retries=2, timeout=0.1)
    start = time.monotonic()
    with pytest.raises(P.DeviceError) as info:
        client.stats()
    assert time.monotonic() - start < 1.0
    assert len(device.requests) == 3
    assert isinstance(info.value, TinyprotoError)
    assert "no answer from the device on mem://test after 3 tries" in str(info.value)
    assert "firmware flashed and the baud rate 115200" in str(info.value)


@pytest.mark.parametrize("answer, words", [
    (lambda frame, n: b"\x07garbage\x00" * 3, "it sent 81 bytes but no frame answering STATS (9 malformed)"),
    (lambda frame, n: P.encode_frame(frame.type | P.MSG_RESPONSE, (frame.seq + 1) & 255, b"\x00" * 6),
     "did not answer STATS in 3 tries: the 3 frames it sent answer no request under way"),
    (lambda frame, n: b"", "after 3 tries (it sent nothing)"),
    (lambda frame, n: P.encode_frame(P.MSG_ERROR, frame.seq, b""), "answered STATS with a malformed ERROR"),
])
def test_a_request_no_try_got_an_answer_to_says_what_the_device_sent_instead(answer, words):
    """The line says what came instead of the answer: nothing, bytes that are no frame, or frames answering no
    request under way (where a slower baud rate would not help, so it does not start "no answer")."""
    client = P.DeviceClient(ScriptedDevice(answer), n_retries=2, timeout=0.05)
    with pytest.raises(P.DeviceError) as info:
        client.stats()
    assert words in str(info.value), str(info.value)
    assert "\n" not in str(info.value)


def test_a_device_that_stops_answering_after_the_handshake_is_not_asked_about_its_firmware():
    """Silent after answering HELLO (a hang or a reset mid-run): "is the firmware flashed and the baud rate ...?"
    was untrue there, the device had answered at that rate; the line says it stopped answering and what to do."""
    def answer(frame, n):
        return P.encode_frame(P.MSG_HELLO | P.MSG_RESPONSE, frame.seq, hello_payload()) if frame.type == P.MSG_HELLO \
            else b""
    client = P.DeviceClient(ScriptedDevice(answer), n_retries=2, timeout=0.05)
    client.hello()
    with pytest.raises(P.DeviceSilent) as info:
        client.stats()
    message = str(info.value)
    assert "stopped answering: no answer to STATS in 3 tries" in message and "reset the board" in message, message
    assert "firmware flashed" not in message and not info.value.speed_may_help
    assert info.value.answered_before  # a simulated board does not call it "not a tinyproto device app" then


class SlowLine(ScriptedDevice):
    """A ScriptedDevice behind a line of `baudrate` (10 bits a byte, each way): a request's answer starts once the
    request has crossed the line and the device's earlier answers have left, and arrives a byte at a time."""

    def __init__(self, answer, baudrate: int, carries: int | None = None) -> None:
        super().__init__(answer)
        self.baudrate = baudrate  # what the port says
        self.carries = carries or baudrate  # what it carries (a simulated board slower than real time: less)
        self._up = self._down = 0.0  # when the host-to-device and the device-to-host line are free again
        self._pending: list[tuple[float, int]] = []

    def write(self, data: bytes) -> int:
        byte_s = 10.0 / self.carries
        self._up = max(self._up, time.monotonic()) + len(data) * byte_s
        before = len(self.rx)
        super().write(data)
        answer, self.rx[before:] = bytes(self.rx[before:]), b""
        start = max(self._down, self._up)
        self._pending += [(start + (i + 1) * byte_s, b) for i, b in enumerate(answer)]
        self._down = start + len(answer) * byte_s
        return len(data)

    def read(self, size: int = 1) -> bytes:
        now = time.monotonic()
        while self._pending and self._pending[0][0] <= now:
            self.rx.append(self._pending.pop(0)[1])
        return super().read(size)


def test_a_slow_line_is_waited_for_not_called_silent():
    """At 1200 baud a HELLO and its answer take 0.3 s, longer than a handshake try (0.25 s), and each try reset the
    reader, cutting the answer under way: learn --sim --baud 1200 said "not a tinyproto device app". 255 bytes of
    counts at 4800 baud take 0.55 s, longer than a try of 0.2 s. A try waits for what the line carries, and for an
    answer still arriving."""
    counts = bytes(range(255))

    def answer(frame, n):
        if frame.type == P.MSG_HELLO:
            return P.encode_frame(P.MSG_HELLO | P.MSG_RESPONSE, frame.seq, hello_payload(flags=P.FLAG_LEARN))
        return P.encode_frame(frame.type | P.MSG_RESPONSE, frame.seq, struct.pack("<H", 255) + counts)
    client = P.DeviceClient(SlowLine(answer, 1200), n_retries=0, timeout=0.2)
    assert client.handshake(3.0).model_hash == MODEL_HASH
    client = P.DeviceClient(SlowLine(answer, 4800), n_retries=0, timeout=0.2)
    client.hello()
    assert client.read_counts() == (255, counts)
    # a line slower than its baud says (learn --sim --baud 600 on a loaded machine): an answer still arriving
    # when the try ends is waited for, not cut by the retry and every answer after it
    client = P.DeviceClient(SlowLine(answer, 115200, carries=2400), n_retries=1, timeout=0.2)
    client.hello()
    assert client.read_counts() == (255, counts)


def test_loop_url_echo_is_not_an_answer():
    # loop:// returns our own request: a valid frame with our seq but a request type, so it must be ignored.
    client = P.DeviceClient(serial.serial_for_url("loop://", timeout=0.02), n_retries=1, timeout=0.1)
    try:
        with pytest.raises(P.DeviceError, match="no answer from the device on loop:// after 2 tries"):
            client.hello()
        assert client.stale_frames == 2
    finally:
        client.close()


def test_check_model():
    hello = P.parse_hello(hello_payload())
    P.check_model(hello, MODEL_HASH, N_FEATURES, N_CLASSES)
    message = "device runs model 0xc0ffee42, directory holds 0x12345678 — flash first"
    with pytest.raises(TinyprotoError, match=message):
        P.check_model(hello, 0x12345678, N_FEATURES, N_CLASSES)
    with pytest.raises(TinyprotoError, match="flash first"):
        P.check_model(hello, MODEL_HASH, N_FEATURES + 1, N_CLASSES)


def test_hello_from_another_device_or_version_is_refused():
    with pytest.raises(P.DeviceError, match="not a tinyproto device"):
        P.parse_hello(b"XXXX" + hello_payload()[4:])
    with pytest.raises(P.DeviceError, match="protocol version 3"):
        P.parse_hello(b"TPRO\x03" + hello_payload()[5:])


def test_predict_checks_the_vector_before_sending():
    client = P.DeviceClient(ScriptedDevice(good_answer), timeout=0.2)
    client.hello()
    with pytest.raises(TinyprotoError, match="7 features, the device model 8"):
        client.predict(np.zeros(7, np.int8))
    with pytest.raises(TinyprotoError, match="int8"):
        client.predict(np.full(8, 300))


# ---- opening ports -----------------------------------------------------------------------------------------


def test_open_nonexistent_port():
    with pytest.raises(TinyprotoError, match="serial port /dev/ttyTINYPROTO9 does not exist"):
        P.open_device("/dev/ttyTINYPROTO9")


def test_open_unknown_url_scheme():
    with pytest.raises(TinyprotoError, match="cannot open nope://x"):
        P.open_device("nope://x")


@contextmanager
def pty_firmware(exe: Path):
    """The host-compiled firmware behind a pseudo-terminal, the way simuno exposes a simulated Uno."""
    master, slave = os.openpty()
    tty.setraw(slave)
    path = os.ttyname(slave)
    proc = subprocess.Popen([str(exe)], stdin=master, stdout=master)
    os.close(master)
    try:
        yield path
    finally:
        os.close(slave)  # the firmware reads EIO/EOF and exits
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def test_open_device_on_a_pty(host_builds):
    with pty_firmware(host_builds("default")) as path:
        with P.open_device(path, handshake_timeout=3.0) as client:
            assert client.info.model_hash == MODEL_HASH
            x = np.array([1, -2, 3, -4, 5, -6, 7, -8], np.int8)
            np.testing.assert_array_equal(client.predict(x).scores, fake_scores(x))


def test_open_busy_port(host_builds):
    with pty_firmware(host_builds("default")) as path:
        holder = serial.Serial(path, exclusive=True)
        try:
            with pytest.raises(TinyprotoError, match=f"serial port {path} is busy"):
                P.open_device(path, handshake_timeout=0.5)
        finally:
            holder.close()


def test_a_board_that_needs_silence_is_reset_again_with_a_longer_one(monkeypatch):
    """A board whose bootloader starts the sketch only after a silence (the Mega's stk500v2) takes an early HELLO
    for an upload and stays in it: while no HELLO is answered the host reopens the port (a reset) and doubles the
    silence, QUIET_ROUNDS times; a silent port then gets the same one-line answer as any other. A board with no
    such bootloader gets one open and one handshake, as before."""
    master, slave = os.openpty()
    opened, quiet = [], []
    real_open, real_sleep = P.open_port, time.sleep

    def open_port(url, baud=115200):
        opened.append(url)
        return real_open(url, baud)

    def sleep(seconds):
        quiet.append(seconds)
        real_sleep(seconds)

    monkeypatch.setattr(P, "open_port", open_port)
    monkeypatch.setattr(P.time, "sleep", sleep)
    try:
        with pytest.raises(P.DeviceError, match=r"no answer from the device on /dev/pts/\d+ after \d+ tries"):
            P.open_device(os.ttyname(slave), handshake_timeout=0.3, boot_quiet_s=0.05)
        assert len(opened) == P.QUIET_ROUNDS == 3
        assert [q for q in quiet if q >= 0.05] == [0.05, 0.1, 0.2]  # (open_port's own short wait for a reset)
        opened.clear()
        with pytest.raises(P.DeviceError, match="no answer from the device"):
            P.open_device(os.ttyname(slave), handshake_timeout=0.3)
        assert len(opened) == 1
    finally:
        os.close(master)
        os.close(slave)


def test_open_device_handshake_times_out_on_silent_port():
    master, slave = os.openpty()
    try:
        start = time.monotonic()
        with pytest.raises(P.DeviceError, match=r"no answer from the device on /dev/pts/\d+ after \d+ tries"):
            P.open_device(os.ttyname(slave), handshake_timeout=0.6)
        assert 0.5 < time.monotonic() - start < 2.0
    finally:
        os.close(master)
        os.close(slave)


# ---- the device application compiled for the host ----------------------------------------------------------


def test_host_firmware_hello(device):
    hello = device.hello()
    assert hello == P.Hello(
        proto=P.PROTO_VERSION, abi=1, family=1, model_hash=MODEL_HASH, n_features=N_FEATURES, n_classes=N_CLASSES,
        input_bytes=1, score_bytes=4, f_cpu=0, flags=1,
    )  # fmt: skip
    P.check_model(hello, MODEL_HASH, N_FEATURES, N_CLASSES)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.integers(-128, 127), min_size=N_FEATURES, max_size=N_FEATURES))
def test_host_firmware_predict_equals_fake_model(host_builds, values):
    x = np.array(values, np.int8)
    port = PipePort(host_builds("default"))
    try:
        prediction = P.DeviceClient(port, timeout=1.0).predict(x)
    finally:
        port.close()
    scores = fake_scores(x)
    np.testing.assert_array_equal(prediction.scores, scores)
    assert prediction.label == int(np.argmax(scores))
    assert prediction.cycles == 0


def test_host_firmware_predict_raw(device):
    raw = np.array([0.5, -1.0, 2.0, 100.0, -100.0, 0.1, np.nan, -np.inf], np.float32)
    answer = device.predict_raw(raw)
    np.testing.assert_array_equal(answer.x, fake_quantize(raw))
    np.testing.assert_array_equal(answer.scores, fake_scores(fake_quantize(raw)))
    assert answer.label == int(np.argmax(answer.scores))


def test_host_firmware_answers_invalid_frames_with_errors_and_recovers(device):
    port = device.port
    good = P.encode_frame(0x01, 5, b"")
    bad_crc = bytearray(good)
    bad_crc[2] ^= 0x01  # the seq byte (never turns into a delimiter)
    cases = [
        (b"\x13\x37\x42\x00", P.ERR_CRC),  # garbage: a COBS block cut short
        (bytes(bad_crc), P.ERR_CRC),
        (P.encode_frame(0x02, 6, b"\x01\x02"), P.ERR_LENGTH),
        (P.encode_frame(0x01, 7, b"\x00"), P.ERR_LENGTH),
        (P.encode_frame(0x55, 8, b""), P.ERR_UNKNOWN_TYPE),
        (P.encode_frame(0x02, 9, bytes(400)), P.ERR_TOO_LONG),
        (P.cobs_encode(b"\x01\x0a") + b"\x00", P.ERR_LENGTH),  # shorter than type + seq + crc
    ]
    for sent, code in cases:
        frames = answers(port, sent)
        assert [(f.type, f.payload) for f in frames] == [(P.MSG_ERROR, bytes([code]))], sent.hex()
    assert answers(port, b"\x00\x00\x00") == []  # empty frames are resync, not errors
    assert device.stats().frames_bad == len(cases)
    x = np.full(N_FEATURES, -7, np.int8)
    np.testing.assert_array_equal(device.predict(x).scores, fake_scores(x))


def test_host_firmware_error_frames_echo_the_request_seq(device):
    (frame,) = answers(device.port, P.encode_frame(0x66, 0xAB, b""))
    assert (frame.type, frame.seq) == (P.MSG_ERROR, 0xAB)


def test_host_firmware_garbage_between_requests(device):
    rng = np.random.default_rng(0)
    for _ in range(20):
        answers(device.port, rng.integers(0, 256, size=int(rng.integers(1, 80)), dtype=np.uint8).tobytes(), 0.02)
        x = rng.integers(-128, 128, size=N_FEATURES, dtype=np.int8)
        np.testing.assert_array_equal(device.predict(x).scores, fake_scores(x))


def test_host_firmware_without_raw_input(host_builds):
    port = PipePort(host_builds("noraw"))
    client = P.DeviceClient(port, n_retries=0, timeout=1.0)
    try:
        assert not client.hello().raw_input
        with pytest.raises(P.DeviceError, match="TP_NO_RAW_INPUT"):
            client.predict_raw(np.zeros(N_FEATURES, np.float32))
        client.info = None  # bypass the client-side check: the firmware itself must refuse
        with pytest.raises(P.DeviceError, match="does not implement PREDICT_RAW"):
            client.predict_raw(np.zeros(N_FEATURES, np.float32))
        x = np.arange(N_FEATURES, dtype=np.int8)
        np.testing.assert_array_equal(client.predict(x).scores, fake_scores(x))
    finally:
        client.close()


def test_host_firmware_big_frames_span_several_cobs_blocks(host_builds):
    """300 features, 70 classes: 19 PREDICT_RAW chunks, and answers of 301 bytes with zero-free runs > 254 bytes."""
    port = PipePort(host_builds("big"))
    client = P.DeviceClient(port, timeout=1.0)
    try:
        assert (client.hello().n_features, client.info.n_classes) == (300, 70)
        raw = np.linspace(0.1, 7.0, 300).astype(np.float32)  # no zero byte anywhere in x
        answer = client.predict_raw(raw)
        np.testing.assert_array_equal(answer.x, fake_quantize(raw))
        np.testing.assert_array_equal(answer.scores, fake_scores(fake_quantize(raw), 70))
        x = np.full(300, 99, np.int8)
        np.testing.assert_array_equal(client.predict(x).scores, fake_scores(x, 70))
    finally:
        client.close()


def test_firmware_builds_warning_free_with_clang(host_builds):
    port = PipePort(host_builds("clang"))
    try:
        assert P.DeviceClient(port, timeout=1.0).hello().model_hash == MODEL_HASH
    finally:
        port.close()


# ---- AVR build (size figures) and, when simuno is around, the AVR firmware itself ---------------------------



def avr_sizes(elf: Path) -> dict[str, int]:
    text = subprocess.run(["avr-size", "-A", "-d", str(elf)], capture_output=True, text=True, check=True).stdout
    return {m[1]: int(m[2]) for m in re.finditer(r"^(\.\w+)\s+(\d+)", text, re.M)}


@pytest.mark.device
def test_avr_build_is_small(tmp_path):
    sizes = avr_sizes(build_avr(tmp_path / "fw.elf"))
    assert sizes[".data"] == 0  # no initialised data: nothing copied to SRAM
    # exactly what tinyproto/core/wire.py says: frame buffer + 8-byte input vector + the app's own state
    assert sizes[".bss"] == wire.app_sram(N_FEATURES, N_CLASSES, streamable=False).total
    assert sizes[".text"] < 4096
    noraw = avr_sizes(build_avr(tmp_path / "noraw.elf", "-DTP_NO_RAW_INPUT"))
    assert noraw[".bss"] == wire.app_sram(N_FEATURES, N_CLASSES, streamable=False, raw_input=False).total
    stream = avr_sizes(build_avr(tmp_path / "stream.elf", "-DTP_STREAMABLE=1"))
    fake_sums = 4 * N_CLASSES  # the fake model's own running state
    assert stream[".bss"] == wire.app_sram(N_FEATURES, N_CLASSES, streamable=True).total + fake_sums


@pytest.mark.device
@pytest.mark.skipif(not (ROOT / "tools" / "simuno" / "simuno.c").exists(), reason="tools/simuno not present")
def test_avr_firmware_on_simuno(tmp_path):
    """The real AVR build on the cycle-exact simulator: protocol, Timer1 cycles against the GPIOR0 markers
    (Timer1 = marker span of the call - marker span of the empty calibration call), SRAM figures."""
    simuno = tmp_path / "simuno"
    built = subprocess.run(
        ["cc", "-O2", "-std=gnu99", str(ROOT / "tools/simuno/simuno.c"), "-lsimavr", "-o", str(simuno)],
        capture_output=True,
    )
    if built.returncode != 0:
        pytest.skip("simuno does not build here (libsimavr-dev missing?)")
    elf = build_avr(tmp_path / "fw.elf", "-DTP_FAKE_SPIN=20000")  # ~0.7 M cycles: several Timer1 overflows
    markers = tmp_path / "markers.txt"
    proc = subprocess.Popen(
        [str(simuno), "--pty", "--parent-pipe", "--markers", str(markers), str(elf)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        path = proc.stdout.readline().split()[1]  # "PTY /dev/pts/N"
        with P.open_device(path, handshake_timeout=5.0, timeout=3.0) as client:
            assert client.info.f_cpu == 16_000_000
            x = np.arange(-3, 5, dtype=np.int8)
            prediction = client.predict(x)
            raw = np.array([0.5, -1.0, 2.0, 100.0, -100.0, 0.1, 7.0, -3.0], np.float32)
            raw_answer = client.predict_raw(raw)
            stats = client.stats()
    finally:
        proc.stdin.close()  # --parent-pipe: simuno exits
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    np.testing.assert_array_equal(prediction.scores, fake_scores(x))
    np.testing.assert_array_equal(raw_answer.x, fake_quantize(raw))
    np.testing.assert_array_equal(raw_answer.scores, fake_scores(fake_quantize(raw)))
    events = [tuple(map(int, line.split())) for line in markers.read_text().split("\n") if line.strip()]
    calibration = dict(events[:2])
    spans = [b[1] - a[1] for a, b in zip(events[2::2], events[3::2])]
    assert [a[0] for a in events[:2]] == [17, 18] and all(v in (1, 2) for v, _ in events[2:])
    overhead = calibration[18] - calibration[17]
    assert prediction.cycles == spans[0] - overhead > 65536 * 5
    assert raw_answer.cycles == spans[1] - overhead
    assert stats.static_sram == wire.app_sram(N_FEATURES, N_CLASSES, streamable=False).total
    assert 30 < stats.stack_peak < 200 and stats.frames_bad == 0


# ---- streamed vectors ---------------------------------------------------------------------------------------


def test_client_sends_wide_vectors_in_bounded_chunks(host_builds):
    """300 features: 5 PREDICT chunks of <= 64 B and 19 PREDICT_RAW chunks of <= 16 floats, none above the payload
    the firmware's frame buffer takes; the streaming fake model gets each chunk as it arrives."""
    port = PipePort(host_builds("stream"))
    client = P.DeviceClient(port, timeout=1.0)
    sent: list[bytes] = []
    write = port.write
    port.write = lambda data: (sent.append(bytes(data)), write(data))[1]
    try:
        assert client.hello().streams and client.info.raw_input
        rng = np.random.default_rng(3)
        x = rng.integers(-128, 128, size=300, dtype=np.int8)
        prediction = client.predict(x)
        np.testing.assert_array_equal(prediction.scores, fake_scores(x, 5))
        assert prediction.label == int(np.argmax(fake_scores(x, 5)))
        raw = rng.normal(0, 4, size=300).astype(np.float32)
        answer = client.predict_raw(raw)
        np.testing.assert_array_equal(answer.x, fake_quantize(raw))
        np.testing.assert_array_equal(answer.scores, fake_scores(fake_quantize(raw), 5))
    finally:
        client.close()
    frames = [P.decode_frame(e) for data in sent for e in data.split(b"\x00") if e]
    chunks = [f for f in frames if f.type in (P.MSG_PREDICT, P.MSG_PREDICT_RAW)]
    assert len(chunks) == 5 + 19
    assert max(len(f.payload) for f in chunks) == wire.CHUNK_FIRST + wire.CHUNK_BYTES
    assert all(len(f.payload) + wire.FRAME_OVERHEAD <= wire.frame_buffer_bytes(5) for f in frames)


@pytest.mark.parametrize("variant", ["default", "stream_small"])
def test_host_firmware_refuses_chunks_out_of_order_and_past_the_end(host_builds, variant):
    port = PipePort(host_builds(variant))
    client = P.DeviceClient(port, n_retries=0, timeout=1.0)
    try:
        def send(first: int, data: bytes, seq: int) -> list[tuple[int, bytes]]:
            wire_bytes = P.encode_frame(P.MSG_PREDICT, seq, struct.pack("<H", first) + data)
            return [(f.type, f.payload) for f in answers(port, wire_bytes)]

        assert send(4, bytes(4), 1) == [(P.MSG_ERROR, bytes([P.ERR_ARGUMENT]))]  # no vector under way
        assert send(0, bytes(4), 2) == [(P.MSG_PREDICT | P.MSG_RESPONSE, b"")]  # features 0..3: acknowledged
        assert send(2, bytes(4), 3) == [(P.MSG_ERROR, bytes([P.ERR_ARGUMENT]))]  # does not continue at 4
        assert send(4, bytes(5), 4) == [(P.MSG_ERROR, bytes([P.ERR_LENGTH]))]  # past feature 8
        x = np.arange(-4, 4, dtype=np.int8)
        (typ, payload), = send(4, x[4:].tobytes(), 5)  # the vector under way is still intact
        assert typ == P.MSG_PREDICT | P.MSG_RESPONSE
        expected = fake_scores(np.concatenate([np.zeros(4, np.int8), x[4:]]))
        np.testing.assert_array_equal(P.parse_prediction(payload).scores, expected)
        assert send(0, bytes(wire.CHUNK_BYTES + 1), 6)[0][0] == P.MSG_ERROR  # more than one chunk's payload
        np.testing.assert_array_equal(client.predict(x).scores, fake_scores(x))
    finally:
        client.close()


def test_a_lost_acknowledgement_restarts_the_vector():
    """The device took a chunk but its answer was lost: the resent chunk is out of order, so the client starts
    the vector again instead of failing."""
    state = {"next": 0, "dropped": False}
    n = 2 * wire.CHUNK_BYTES + 5

    def answer(frame, _n):
        first = struct.unpack_from("<H", frame.payload)[0]
        data = frame.payload[2:]
        if first not in (0, state["next"]):
            return P.encode_frame(P.MSG_ERROR, frame.seq, bytes([P.ERR_ARGUMENT]))
        state["next"] = first + len(data)
        if first == wire.CHUNK_BYTES and not state["dropped"]:
            state["dropped"] = True
            return b""  # taken, but the acknowledgement never arrives
        if state["next"] < n:
            return P.encode_frame(0x82, frame.seq, b"")
        return P.encode_frame(0x82, frame.seq, struct.pack("<BIBB", 1, 7, 0, 1) + bytes(4 * N_CLASSES))

    device = ScriptedDevice(answer)
    client = P.DeviceClient(device, n_retries=2, timeout=0.1)
    assert client.predict(np.ones(n, np.int8)).label == 1
    firsts = [struct.unpack_from("<H", f.payload)[0] for f in device.requests]
    assert firsts == [0, 64, 64, 0, 64, 128]


# ---- one place for every shared size ------------------------------------------------------------------------


def _c_defines(path: Path, prefix: str) -> dict[str, int]:
    text = path.read_text()
    return {m[1]: int(m[2], 0) for m in re.finditer(rf"#define\s+({prefix}\w+)\s+(0x[0-9A-Fa-f]+|\d+)", text)}


def test_message_types_flags_and_error_codes_agree_with_tp_serial_h():
    c = _c_defines(FIRMWARE / "tp_serial.h", "TP_")
    for name, value in vars(P).items():
        for py, cpre in (("MSG_", "TP_MSG_"), ("ERR_", "TP_ERR_"), ("FLAG_", "TP_HELLO_FLAG_")):
            if name.startswith(py) and isinstance(value, int):
                assert c[cpre + name[len(py):]] == value, name
    assert {k for k in c if k.startswith("TP_MSG_")} == {"TP_MSG_" + k[4:] for k in vars(P) if k.startswith("MSG_")}
    # sizes live only in the generated header: tp_serial.h and the app never define them by hand
    for source in [FIRMWARE / "tp_serial.h", FIRMWARE / "tp_app.h", *APP_SOURCES]:
        assert not set(_c_defines(source, "TP_")) & set(wire.sizes_defines(N_CLASSES)), source.name


@pytest.mark.parametrize("name, delta", [("TP_FRAME_BUF_RAW", -4), ("TP_CHUNK_BYTES", 24), ("TP_RAW_CHUNK", 1),
                                         ("TP_FRAME_BUF_NO_RAW", -4)])
def test_a_size_changed_on_the_c_side_alone_fails_the_build(tmp_path, name, delta):
    """The generated header edited by hand (or a firmware expecting other sizes) must not build."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")

    def edit(text: str) -> str:
        value = wire.sizes_defines(N_CLASSES)[name]
        return text.replace(f"#define {name} {value}u", f"#define {name} {value + delta}u")

    flags = ["-DTP_NO_RAW_INPUT"] if name == "TP_FRAME_BUF_NO_RAW" else []
    result = subprocess.run(["gcc", *C_FLAGS, sizes_include(tmp_path, edit=edit), *flags, "-c",
                             str(FIRMWARE / "tp_main.c"), "-o", str(tmp_path / "m.o")], capture_output=True, text=True)
    assert result.returncode != 0 and "tinyproto_sizes.h" in result.stderr


def test_a_size_changed_on_the_python_side_alone_is_caught():
    """The codec's structs are checked against wire.py at import, and wire.py against the firmware's layout
    rules: a frame buffer one word smaller than the largest chunk request is refused by the C guards above."""
    for classes in (1, 2, 10, 70, 255):
        raw, noraw = wire.frame_buffer_bytes(classes), wire.frame_buffer_bytes(classes, raw_input=False)
        assert raw % 4 == 0 and noraw % 4 == 0 and noraw <= raw
        assert noraw >= wire.FRAME_OVERHEAD + wire.LEARN_LABEL + wire.CHUNK_FIRST + wire.CHUNK_BYTES
        assert raw >= 5 * wire.RAW_CHUNK_FEATURES + 4 * classes
    assert P._HELLO.size == wire.HELLO_PAYLOAD and P.FRAME_OVERHEAD == wire.FRAME_OVERHEAD


@pytest.mark.device
@pytest.mark.skipif(not (ROOT / "tools" / "simuno" / "simuno.c").exists(), reason="tools/simuno not present")
def test_avr_streaming_firmware_times_every_chunk(tmp_path):
    """The streamable fake model on the simulated Uno, 150 features: each PREDICT chunk (3) and PREDICT_RAW chunk
    (10) is one timed call between GPIOR0 markers, and the answer's cycles are their sum minus one calibrated
    overhead per chunk (what validate checks as a constant offset per vector)."""
    simuno = tmp_path / "simuno"
    built = subprocess.run(
        ["cc", "-O2", "-std=gnu99", str(ROOT / "tools/simuno/simuno.c"), "-lsimavr", "-o", str(simuno)],
        capture_output=True,
    )
    if built.returncode != 0:
        pytest.skip("simuno does not build here (libsimavr-dev missing?)")
    elf = build_avr(tmp_path / "fw.elf", "-DTP_STREAMABLE=1", "-DTP_N_FEATURES=150")
    markers = tmp_path / "markers.txt"
    proc = subprocess.Popen(
        [str(simuno), "--pty", "--parent-pipe", "--markers", str(markers), str(elf)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        path = proc.stdout.readline().split()[1]
        with P.open_device(path, handshake_timeout=5.0, timeout=3.0) as client:
            assert client.info.streams and client.info.n_features == 150
            x = (np.arange(150) % 200 - 100).astype(np.int8)
            prediction = client.predict(x)
            raw = np.linspace(-9, 9, 150).astype(np.float32)
            raw_answer = client.predict_raw(raw)
            stats = client.stats()
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    np.testing.assert_array_equal(prediction.scores, fake_scores(x))
    np.testing.assert_array_equal(raw_answer.x, fake_quantize(raw))
    np.testing.assert_array_equal(raw_answer.scores, fake_scores(fake_quantize(raw)))
    events = [tuple(map(int, line.split())) for line in markers.read_text().split("\n") if line.strip()]
    overhead = events[1][1] - events[0][1]
    spans = [b[1] - a[1] for a, b in zip(events[2::2], events[3::2]) if (a[0], b[0]) == (1, 2)]
    assert len(spans) == 3 + 10
    assert prediction.cycles == sum(spans[:3]) - 3 * overhead > 0
    assert raw_answer.cycles == sum(spans[3:]) - 10 * overhead
    # no 150-byte input vector: frame buffer + the app's state + the fake model's running sums only
    assert stats.static_sram == wire.app_sram(150, N_CLASSES, streamable=True).total + 4 * N_CLASSES


# ---- the label tie-break: the C runtime and the host reference must agree ------------------------------------


@pytest.mark.parametrize("family", ["protonn", "flynn"])
def test_tied_scores_give_the_lowest_class_on_both_sides(compiled, tmp_path, family):
    """Class 1 made a copy of class 0 (ProtoNN: its Z column; FlyNN: its counts), so their scores tie on every
    vector: the generated C (host-compiled) and the numpy reference must both answer the lower class, and agree
    on every label. Flipping the tie-break on one side alone fails here."""
    from dataclasses import replace

    from tinyproto import families
    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.core.render import write_sources
    from tinyproto.device.hostc import build_host_runner, run_int8

    if shutil.which("gcc") is None:
        pytest.skip("gcc not installed")
    model_dir = load_model_dir(compiled("digits", "2kB", family))
    model = families.load_int_model(model_dir)
    if family == "protonn":
        Z = model.Z_q.copy()
        Z[:, 1] = Z[:, 0]
        tied = replace(model, Z_q=Z)
    else:
        counts = model.counts.copy()
        counts[1] = counts[0]
        tied = replace(model, counts=counts)
    write_sources(tied, tmp_path, "ties", 0, 1 << 20)
    xq = model_dir.vectors().xq.astype(np.int8)
    labels, scores = run_int8(build_host_runner(tmp_path, tmp_path / "runner", family), xq)
    reference = tied.scores(xq)
    np.testing.assert_array_equal(scores, reference)
    np.testing.assert_array_equal(labels, tied.labels(reference))
    assert np.all(scores[:, 0] == scores[:, 1]) and not np.any(labels == 1)  # the tie exists; class 0 wins it
    assert np.any(labels == 0)


def test_the_host_knows_the_firmware_runtime_abi():
    """HELLO's abi is refused unless it is TP_RUNTIME_ABI of the runtime this tinyproto builds (codec.RUNTIME_ABI)."""
    header = (Path(__file__).resolve().parents[1] / "firmware" / "tinyproto.h").read_text()
    assert int(re.search(r"#define TP_RUNTIME_ABI (\d+)", header).group(1)) == P.RUNTIME_ABI
