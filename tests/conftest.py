"""Shared fixtures: compiled model directories are trained once per session (training takes seconds) and handed
out as copies, one per call, so no test can change what another one sees."""

from __future__ import annotations

import fcntl
import os
import re
import select
import shutil
import struct
import subprocess
import termios
from pathlib import Path

import numpy as np
import pytest

from tinyproto.core.carray import CTYPES
from tinyproto.pipeline.compile import compile_model

ARRAY_RE = re.compile(r"^const (\w+) tp_(\w+)\[(\d+)\] PROGMEM = \{(.*?)\};", re.S | re.M)


def needs(tool: str):
    return pytest.mark.skipif(shutil.which(tool) is None, reason=f"{tool} not installed")


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


def header_array_bytes(header: str) -> dict[str, int]:
    """Bytes of every array definition in a generated header, counted from its initializer."""
    out = {}
    for ctype, name, count, body in ARRAY_RE.findall(header):
        values = [v for v in body.replace("\n", " ").split(",") if v.strip()]
        assert len(values) == int(count), name
        out[name] = len(values) * CTYPES[ctype][1]
    return out


@pytest.fixture(scope="session")
def compiled(tmp_path_factory):
    """compiled(data, budget, family='protonn', seed=0) -> a model directory of the caller's own.

    Each model is trained once per session into a master directory that no test ever sees; every call hands out
    a fresh copy of it. So a test may build, validate, learn in or damage what it got without changing what any
    other test gets: results do not depend on the order the tests run in. (A copy costs milliseconds; a build
    in it costs the same as in a shared directory, PlatformIO's start-up dominates either way.)"""
    masters: dict[tuple, Path] = {}

    def make(data: str, budget: str, family: str = "protonn", seed: int = 0) -> Path:
        key = (data, budget, family, seed)
        if key not in masters:
            master = tmp_path_factory.mktemp(f"master-{family}-{data}-{budget}") / "model"
            compile_model(data, family, budget, seed, "uno", master)
            masters[key] = master
        copy = tmp_path_factory.mktemp(f"{family}-{data}-{budget}") / "model"
        shutil.copytree(masters[key], copy, symlinks=True)
        return copy

    return make


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory):
    """PlatformIO's home, the toolchain package and simuno in a per-module cache, never the user's
    (restored afterwards for other modules)."""
    previous = os.environ.get("TINYPROTO_CACHE")
    os.environ["TINYPROTO_CACHE"] = str(tmp_path_factory.mktemp("tinyproto-cache"))
    yield
    if previous is None:
        os.environ.pop("TINYPROTO_CACHE", None)
    else:
        os.environ["TINYPROTO_CACHE"] = previous


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
