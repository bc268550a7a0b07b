"""The simulated Uno (tools/simuno + tinyproto.device.sim) with tiny firmwares from tests/fixtures/sim/simtest.c."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tinyproto.core.errors import TinyprotoError

pytestmark = [
    pytest.mark.device,
    pytest.mark.skipif(shutil.which("avr-gcc") is None, reason="avr-gcc not installed"),
    pytest.mark.skipif(not Path("/usr/include/simavr/sim_avr.h").is_file(), reason="libsimavr-dev not installed"),
    pytest.mark.usefixtures("private_cache"),
]

FIXTURES = Path(__file__).parent / "fixtures" / "sim"
EOT = 0x04  # ends the echo firmware




@pytest.fixture(scope="module")
def simuno(private_cache) -> Path:
    from tinyproto.device.sim import ensure_simulator

    return ensure_simulator()


@pytest.fixture(scope="module")
def firmware(tmp_path_factory):
    """firmware("ECHO") -> ELF of simtest.c built with -DTEST_ECHO (cached per module)."""
    out = tmp_path_factory.mktemp("simtest")
    built: dict[str, Path] = {}

    def make(mode: str) -> Path:
        if mode not in built:
            elf = out / f"simtest_{mode.lower()}.elf"
            subprocess.run(
                ["avr-gcc", "-mmcu=atmega328p", "-DF_CPU=16000000UL", "-Os", "-std=gnu99", "-Wall", "-Wextra",
                 "-Werror", f"-DTEST_{mode}", "-o", str(elf), str(FIXTURES / "simtest.c")],
                check=True,
            )  # fmt: skip
            built[mode] = elf
        return built[mode]

    return make


def _read_exactly(port, n: int, timeout: float = 10.0) -> bytes:
    data = b""
    deadline = time.monotonic() + timeout
    while len(data) < n and time.monotonic() < deadline:
        data += port.read(n - len(data))
    return data


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie still answers kill(0); Popen.wait() reaped ours, so this is a live process
    return True


def test_pty_echo_is_binary_clean_and_loses_no_byte(simuno, firmware):
    serial = pytest.importorskip("serial")
    from tinyproto.device.sim import SimulatedUno

    payload = bytes(b for b in range(256) if b != EOT) * 8  # 2040 bytes: far more than the UART's 64-byte FIFO
    with SimulatedUno(firmware("ECHO"), markers=False) as uno:
        assert uno.port.startswith("/dev/")
        with serial.Serial(uno.port, 115200, timeout=1) as port:
            port.write(payload)
            assert _read_exactly(port, len(payload)) == payload
            uno.ensure_running()
            port.write(bytes([EOT]))
            assert uno.wait(timeout=10) == 0  # the firmware ended with cli + sleep
        with pytest.raises(TinyprotoError, match="firmware finished"):
            uno.ensure_running()


def test_stdio_echo(simuno, firmware):
    payload = bytes([0, 255, 10, 13, 0x11, 0x13]) + b"tinyproto" * 50
    result = subprocess.run(
        [str(simuno), "--stdio", str(firmware("ECHO"))], input=payload + bytes([EOT]) + b"ignored",
        capture_output=True, timeout=20, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == payload


def test_markers_give_exact_cycle_counts(simuno, firmware):
    from tinyproto.device.sim import SimulatedUno

    with SimulatedUno(firmware("MARKERS")) as uno:
        assert uno.wait(timeout=10) == 0
        markers = uno.markers()
    assert [value for value, _ in markers] == [1, 2] * 3
    spans = [markers[i + 1][1] - markers[i][1] for i in range(0, len(markers), 2)]
    # out GPIOR0 (1 cycle) + sbiw/brne loop (4n - 1) + ldi (1): exactly 4n + 1 between the two OUTs
    assert spans == [4 * n + 1 for n in (1, 1000, 40000)]


def test_timeout_crash_and_missing_elf(simuno, firmware, tmp_path):
    from tinyproto.device.sim import EXIT_CRASH, EXIT_TIMEOUT, SimulatedUno

    spin = subprocess.run([str(simuno), "--stdio", "--timeout-cycles", "1000000", str(firmware("SPIN"))],
                          capture_output=True, timeout=20, check=False)  # fmt: skip
    assert spin.returncode == EXIT_TIMEOUT
    crash = subprocess.run([str(simuno), "--stdio", str(firmware("CRASH"))], capture_output=True, timeout=20,
                           check=False)  # fmt: skip
    assert crash.returncode == EXIT_CRASH
    assert b"crashed" in crash.stderr
    with pytest.raises(TinyprotoError, match="does not exist"), SimulatedUno(tmp_path / "missing.elf"):
        pass


def test_two_instances_run_in_parallel(simuno, firmware):
    serial = pytest.importorskip("serial")
    from tinyproto.device.sim import SimulatedUno

    with SimulatedUno(firmware("ECHO")) as first, SimulatedUno(firmware("ECHO")) as second:
        assert first.port != second.port
        results: dict[str, bytes] = {}

        def talk(uno, payload: bytes) -> None:
            with serial.Serial(uno.port, 115200, timeout=1) as port:
                port.write(payload)
                results[uno.port] = _read_exactly(port, len(payload))

        payloads = {first.port: b"first" * 200, second.port: b"second" * 200}
        threads = [threading.Thread(target=talk, args=(uno, payloads[uno.port])) for uno in (first, second)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=20)
        assert results == payloads


def test_no_process_left_behind_and_idle_does_not_spin(simuno, firmware):
    from tinyproto.device.sim import SimulatedUno

    with pytest.raises(RuntimeError), SimulatedUno(firmware("ECHO")) as uno:
        pid = uno._proc.pid
        ticks_before = _cpu_ticks(pid)
        time.sleep(0.6)  # the firmware polls an empty receiver: simuno must mostly sleep
        busy = (_cpu_ticks(pid) - ticks_before) / os.sysconf("SC_CLK_TCK")
        raise RuntimeError("failure inside the block")
    assert busy < 0.3, f"simuno used {busy:.2f} s of CPU in 0.6 s while the firmware waited for input"
    assert not _alive(pid)
    assert uno.returncode is not None


def test_simuno_exits_when_its_parent_pipe_closes(simuno, firmware):
    proc = subprocess.Popen([str(simuno), "--pty", "--parent-pipe", str(firmware("ECHO"))],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    assert proc.stdout.readline().startswith(b"PTY /dev/")
    proc.stdin.close()  # what the kernel does when the parent dies, however abruptly
    assert proc.wait(timeout=10) == 4
    proc.stdout.close()
    proc.stderr.close()


def test_kill_9_of_the_python_process_leaves_nothing_behind(simuno, firmware, tmp_path):
    """A SIGKILLed parent cannot clean up: the simulator must leave no temporary file or directory and no process
    (simuno sees its --parent-pipe close and exits)."""
    import sys

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    script = (
        "import sys, time\n"
        "from tinyproto.device.sim import SimulatedUno\n"
        "uno = SimulatedUno(sys.argv[1]).__enter__()\n"
        "print(uno._proc.pid, uno.port, flush=True)\n"
        "time.sleep(60)\n"
    )
    env = dict(os.environ, TMPDIR=str(tmp))
    parent = subprocess.Popen([sys.executable, "-c", script, str(firmware("ECHO"))], stdout=subprocess.PIPE,
                              env=env, text=True)
    pid, port = parent.stdout.readline().split()
    assert _alive(int(pid)) and Path(port).exists()
    parent.kill()
    parent.wait()
    parent.stdout.close()
    deadline = time.monotonic() + 5
    while _alive(int(pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(int(pid))
    assert list(tmp.iterdir()) == []  # no tinyproto-sim-* directory, no markers or stderr file


def test_ensure_simulator_names_apt_packages_when_gcc_is_missing(monkeypatch, tmp_path):
    from tinyproto.device import sim

    monkeypatch.setenv("TINYPROTO_CACHE", str(tmp_path))
    real_which = shutil.which
    monkeypatch.setattr(sim.shutil, "which", lambda name, *a, **k: None if name == "gcc" else real_which(name))
    with pytest.raises(TinyprotoError, match="apt-get install gcc libsimavr-dev"):
        sim.ensure_simulator()


def test_parse_markers_ignores_a_torn_last_line():
    from tinyproto.device.sim import parse_markers

    assert parse_markers("1 100\n2 250\n") == [(1, 100), (2, 250)]
    assert parse_markers("1 100\n2 25") == [(1, 100)]
    assert parse_markers("") == []


def _cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime



def test_the_inline_step_is_libsimavrs_step(simuno, firmware, built_models, tmp_path, monkeypatch):
    """simuno steps the chip with its own loop (libsimavr 1.6's avr_run without its calls per instruction);
    SIMUNO_LIBRARY_STEP=1 makes it call avr_run. A real firmware given the same bytes (from a file, so when they
    arrive does not depend on the host) answers with the same bytes and writes every GPIOR0 marker at the same
    cycle both ways: its receive and transmit interrupts, the UART's and Timer1's cycle timers, its sleeps and
    the receive interrupts inside its timed calls (the requests come faster than it answers) all run alike."""
    import struct

    import numpy as np

    from tinyproto.core.modeldir import load_model_dir
    from tinyproto.device.codec import (
        MSG_HELLO, MSG_PREDICT, MSG_PREDICT_RAW, MSG_RESPONSE, decode_frame, encode_frame,
    )  # fmt: skip
    from tinyproto.device.sim import EXIT_TIMEOUT
    from tinyproto.pipeline.validate import load_build_info

    model_dir = load_model_dir(built_models("iris", "1kB"))
    build, vectors = load_build_info(model_dir), model_dir.vectors()
    first = struct.pack("<H", 0)
    requests = [b"\x00", encode_frame(MSG_HELLO, 0)]
    for i in range(16):
        requests.append(encode_frame(MSG_PREDICT, 2 * i + 1, first + vectors.xq[i].astype(np.int8).tobytes()))
        requests.append(encode_frame(MSG_PREDICT_RAW, 2 * i + 2, first + vectors.X_raw[i].astype("<f4").tobytes()))
    feed = tmp_path / "requests.bin"
    feed.write_bytes(b"".join(requests))
    runs = {}
    for step in ("inline", "library"):
        if step == "library":
            monkeypatch.setenv("SIMUNO_LIBRARY_STEP", "1")
        said = subprocess.run([str(simuno), "-v", "--stdio", "--timeout-cycles", "1000", str(firmware("SPIN"))],
                              capture_output=True, timeout=20, check=False)  # fmt: skip
        assert f"{step} step".encode() in said.stderr  # the switch took effect
        markers = tmp_path / f"markers-{step}.txt"
        with feed.open("rb") as stdin:
            run = subprocess.run([str(simuno), "--stdio", "--markers", str(markers), "--timeout-cycles", "4000000",
                                  str(build.elf)],
                                 stdin=stdin, capture_output=True, timeout=60, check=False)  # fmt: skip
        assert run.returncode == EXIT_TIMEOUT, run.stderr
        runs[step] = (run.stdout, markers.read_text())
    answers = [decode_frame(frame).type for frame in runs["inline"][0].split(b"\x00") if frame]
    assert answers.count(MSG_PREDICT | MSG_RESPONSE) >= 8 and answers.count(MSG_PREDICT_RAW | MSG_RESPONSE) >= 8
    assert runs["inline"] == runs["library"]



@pytest.mark.parametrize("env, expected", [
    ({"TINYPROTO_CACHE": "relcache"}, "{cwd}/relcache"),
    ({"TINYPROTO_CACHE": "./a/../relcache"}, "{cwd}/relcache"),
    ({"XDG_CACHE_HOME": "relcache", "HOME": "{home}"}, "{home}/.cache/tinyproto"),
    ({"XDG_CACHE_HOME": "", "HOME": "{home}"}, "{home}/.cache/tinyproto"),
    ({"XDG_CACHE_HOME": "{home}/xdg"}, "{home}/xdg/tinyproto"),
    ({"HOME": ""}, "{account}/.cache/tinyproto"),
    ({"HOME": "relhome"}, "{account}/.cache/tinyproto"),
    ({"HOME": None}, "{account}/.cache/tinyproto"),
])
def test_the_cache_is_an_absolute_path_whatever_the_variables(env, expected, monkeypatch, tmp_path):
    """XDG_CACHE_HOME=relcache put the cache below the working directory, where PlatformIO, run in the model
    directory, found no home and tried for a minute to download one; HOME="" put it at /.cache. A relative
    XDG_CACHE_HOME is ignored (the XDG spec), a relative TINYPROTO_CACHE is the working directory's, and HOME
    unset, empty or relative is the account's home."""
    import pwd

    from tinyproto.device.sim import tinyproto_cache_dir

    names = {"cwd": str(tmp_path), "home": str(tmp_path / "home"), "account": pwd.getpwuid(os.getuid()).pw_dir}
    monkeypatch.chdir(tmp_path)
    for variable in ("TINYPROTO_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    for variable, value in env.items():
        if value is None:
            monkeypatch.delenv(variable, raising=False)
        else:
            monkeypatch.setenv(variable, value.format(**names))
    cache = tinyproto_cache_dir()
    assert cache.is_absolute() and str(cache) == os.path.normpath(expected.format(**names)), cache


@pytest.mark.parametrize("variable, value", [("TINYPROTO_CACHE", "/dev/null"), ("TINYPROTO_CACHE", "file"),
                                             ("TINYPROTO_CACHE", "file/cache"), ("XDG_CACHE_HOME", "file")])
def test_a_cache_that_is_not_a_directory_is_one_line_naming_the_variable(built_models, monkeypatch, tmp_path,
                                                                          variable, value):
    """TINYPROTO_CACHE=/dev/null (or a file, or a path below one) said only "File exists: /dev/null"."""
    from helpers import refused

    model = built_models("iris", "1kB")
    (tmp_path / "file").write_text("mine\n")
    value = value if value.startswith("/") else str(tmp_path / value)
    monkeypatch.delenv("TINYPROTO_CACHE", raising=False)
    monkeypatch.setenv(variable, value)
    for verb in (["build", str(model)], ["validate", str(model), "--sim"]):
        line = refused(verb, f"{variable}={value}", tmp_path, own_files_at_root=True)
        assert "is not a directory" in line and "point TINYPROTO_CACHE at a directory" in line, line
    assert (tmp_path / "file").read_text() == "mine\n"


def test_a_home_where_the_cache_cannot_be_made_is_one_line_saying_what_to_do(built_models, monkeypatch, tmp_path):
    """HOME=/proc (a home nobody may write, even root) said only "No such file or directory: /proc/.cache"."""
    from helpers import refused

    model = built_models("iris", "1kB")
    for variable in ("TINYPROTO_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("HOME", "/proc")
    for verb in (["build", str(model)], ["validate", str(model), "--sim"]):
        line = refused(verb, "/proc/.cache/tinyproto", tmp_path, own_files_at_root=True)
        assert "cannot create" in line and "point TINYPROTO_CACHE at a directory you can write" in line, line
