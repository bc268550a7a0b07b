"""What many test files share, in one place: the tinyproto command runner, the skip conditions for missing tools,
the run-wide cache of expensive artefacts (shared by pytest-xdist workers), and small checking helpers.

Test files import from here (`from helpers import ...`), never from one another.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import select
import shutil
import struct
import subprocess
import sys
import termios
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
SIMAVR_HEADER = Path("/usr/include/simavr/sim_avr.h")
OPTIBOOT_SOURCE = Path("/usr/share/arduino/hardware/arduino/avr/bootloaders/optiboot/optiboot.c")


# ------------------------------------------------------------------------------------------------ skip conditions


def needs(tool: str):
    """Skip where the program `tool` is not on PATH."""
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} not installed")


HAVE_SIMULATOR = shutil.which("avr-gcc") is not None and SIMAVR_HEADER.is_file()

# The one condition for the simulated boards: avr-gcc builds the firmware, libsimavr's headers build the host
# program that runs it (tinyproto.device.sim compiles it on first use). Apply as a decorator or in pytestmark.
needs_simulator = pytest.mark.skipif(not HAVE_SIMULATOR, reason="avr-gcc or libsimavr-dev not installed")

# The real upload path: avrdude talking to Optiboot (built from Debian's arduino-core-avr source) on a simulated chip.
needs_bootloaders = [
    needs_simulator,
    needs("avrdude"),
    needs("gcc"),
    pytest.mark.skipif(not OPTIBOOT_SOURCE.is_file(), reason="arduino-core-avr (Optiboot's source) not installed"),
]


# ------------------------------------------------------------------------------------------------ running tinyproto


def tinyproto(*args: str, cwd: Path | str | None = None, env: dict[str, str] | None = None,
              timeout: float = 600, input: str | None = None) -> subprocess.CompletedProcess:
    """`python -m tinyproto ARGS` in a child process, as a user runs it: returncode, stdout and stderr (text).
    The checkout is on the child's PYTHONPATH, so it runs this tinyproto from any working directory. Use it where
    the test needs a real process (exit status, signals, a working directory, the environment); in-process
    CliRunner calls are for checking one command's messages quickly."""
    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), child_env.get("PYTHONPATH", "")) if p)
    return subprocess.run([sys.executable, "-m", "tinyproto", *map(str, args)], cwd=cwd, env=child_env,
                          capture_output=True, text=True, timeout=timeout, input=input)


# ------------------------------------------------------------------------------------------------ run-wide cache


def run_wide_dir(tmp_path_factory) -> Path:
    """A directory shared by every worker of this pytest run (pytest-xdist gives each worker its own basetemp
    under one run directory) and by nothing else: removed with the run's other temporary directories."""
    base = tmp_path_factory.getbasetemp()
    shared = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "run-wide"
    shared.mkdir(exist_ok=True)
    return shared


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (a file next to what it guards), across processes."""
    with open(path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def made_once(root: Path, key: str, make: Callable[[Path], None]) -> Path:
    """The directory `make(directory)` fills for `key`, made once for the whole run whichever worker asks first
    (the others wait on its lock, then reuse it). Callers must treat it as read-only: hand out copies."""
    slug = re.sub(r"[^A-Za-z0-9.-]+", "-", key)[:60] + "-" + hashlib.sha256(key.encode()).hexdigest()[:12]
    final = root / slug
    with locked(root / f"{slug}.lock"):
        if not final.is_dir():
            staging = root / f"{slug}.making"
            shutil.rmtree(staging, ignore_errors=True)
            staging.mkdir()
            try:
                make(staging)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
            os.replace(staging, final)
    return final


def fresh_copy(master: Path, tmp_path_factory, name: str) -> Path:
    """A copy of `master` of the caller's own (links kept as links)."""
    copy = tmp_path_factory.mktemp(name) / master.name
    shutil.copytree(master, copy, symlinks=True)
    return copy


# ------------------------------------------------------------------------------------------------ checking helpers


def read_only(value):
    """`value` with every numpy array in it (in tuples, lists, dicts, dataclass or object attributes) made read-only:
    a result cached for several tests (functools.lru_cache helpers) raises on a test's in-place change instead of
    passing the change on to whichever test runs next."""
    seen: set[int] = set()

    def freeze(v) -> None:
        if id(v) in seen or isinstance(v, (type, str, bytes, int, float)):
            return
        seen.add(id(v))
        if isinstance(v, np.ndarray):
            v.flags.writeable = False
        elif isinstance(v, (tuple, list)):
            for item in v:
                freeze(item)
        elif isinstance(v, dict):
            for item in v.values():
                freeze(item)
        elif hasattr(v, "__dict__"):
            for item in vars(v).values():
                freeze(item)

    freeze(value)
    return value


ARRAY_RE = re.compile(r"^const (\w+) tp_(\w+)\[(\d+)\] PROGMEM = \{(.*?)\};", re.S | re.M)


def header_array_bytes(header: str) -> dict[str, int]:
    """Bytes of every array definition in a generated header, counted from its initializer."""
    from tinyproto.core.carray import CTYPES

    out = {}
    for ctype, name, count, body in ARRAY_RE.findall(header):
        values = [v for v in body.replace("\n", " ").split(",") if v.strip()]
        assert len(values) == int(count), name
        out[name] = len(values) * CTYPES[ctype][1]
    return out


class PipePort:
    """The host-compiled firmware as a port: its stdin/stdout are the serial line."""

    def __init__(self, exe: Path) -> None:
        self.proc = subprocess.Popen([str(exe)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.fd = self.proc.stdout.fileno()
        self.timeout: float | None = 0.02
        self.port = f"pipe:{exe.name}"

    @property
    def in_waiting(self) -> int:
        buf = fcntl.ioctl(self.fd, termios.FIONREAD, b"\0\0\0\0")
        return struct.unpack("i", buf)[0]

    def read(self, size: int = 1) -> bytes:
        ready, _, _ = select.select([self.fd], [], [], self.timeout)
        return os.read(self.fd, size) if ready else b""

    def write(self, data: bytes) -> int:
        self.proc.stdin.write(data)
        self.proc.stdin.flush()
        return len(data)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stdout.close()
