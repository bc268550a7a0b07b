"""What many test files share, in one place: the tinyproto command runner, the skip conditions for missing tools,
the run-wide cache of expensive artefacts (shared by pytest-xdist workers), and small checking helpers.

Test files import from here (`from helpers import ...`), never from one another.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import select
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
# The package's layers, highest first (tests/test_layers.py enforces them; docs/design.md explains them).
LAYER_RANK = {"cli": 5, "pipeline": 4, "federated": 3, "families": 2, "device": 2, "core": 1}
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
              timeout: float = 600, input: str | None = None, fresh: bool = False) -> subprocess.CompletedProcess:
    """`python -m tinyproto ARGS` in a child process, as a user runs it: returncode, stdout and stderr (text).
    The checkout is on the child's PYTHONPATH, so it runs this tinyproto from any working directory. Use it where
    the test needs a real process (exit status, a working directory, the environment); in-process CliRunner calls
    are for checking one command's messages quickly. The child comes from a fork server that has imported numpy,
    SciPy and scikit-learn already (tests/cli_forkserver.py: about 1 s of CPU less per training command), unless
    something the test could observe would differ there: then, and with fresh=True (a test of a new interpreter:
    its start, its hash seed, its imports), it is a new interpreter. A test that signals, kills or talks to the
    process while it runs starts it itself (subprocess.Popen)."""
    import cli_forkserver

    child_env = dict(os.environ if env is None else env)
    child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), child_env.get("PYTHONPATH", "")) if p)
    return cli_forkserver.run(args, cwd=cwd, env=child_env, timeout=timeout, input=input, fresh=fresh)


# ------------------------------------------------------------------------------------------------ killing a run


def scratch_dirs(parent: Path) -> list[str]:
    """The names of the scratch directories in `parent` (a replaced output's new contents, written beside it)."""
    from tinyproto.core.manifest import SCRATCH_PREFIX

    return sorted(p.name for p in parent.iterdir() if p.name.startswith(SCRATCH_PREFIX))


def new_scratch_files(parent: Path, before: set[str]) -> set[str]:
    """The names in the scratch directories of `parent` not in `before` (the output's scratch holds its lock from
    its start; the empty one check_output_dir makes and removes at once to probe the parent is not counted)."""
    names: set[str] = set()
    for name in set(scratch_dirs(parent)) - before:
        try:
            names.update(os.listdir(parent / name))
        except OSError:  # removed meanwhile
            pass
    return names


def _read_lines(stream, into: list[str]) -> None:
    for line in iter(stream.readline, ""):
        into.append(line)  # as it comes


def signal_when(command: list[str], reached: Callable[[subprocess.Popen, list[str]], bool],
                sig: int = signal.SIGKILL, then: float = 0.0, timeout: float = 600,
                again: Callable[[], None] | None = None, tries: int = 5) -> tuple[subprocess.Popen, list[str], str]:
    """Start `command` (a session of its own), send it `sig` as soon as reached(proc, its stdout lines so far)
    holds (polled every 2 ms; `then` seconds later), and wait for it: an event seen from outside, not a delay,
    which lands elsewhere on a slower or busier machine. Returns the process (ended), its stdout lines and its
    stderr; what it left running in its session and still holding its pipes after 30 s (a solver's workers) is
    killed.

    Fails if it ended first, unless `again` is given: a moment a few milliseconds of the command's CPU long (a
    small model's files written) can pass while this process waits for a core; a command that ended (exit 0)
    before the signal reached it is then tried afresh, after again() has put back what it changed, up to `tries`
    times."""
    for _ in range(tries if again is not None else 1):
        proc, lines, errors, signalled = _signal_once(command, reached, sig, then, timeout)
        if signalled and proc.returncode != 0:  # exit 0: it ended between the moment and the signal
            return proc, lines, errors
        if again is None or proc.returncode != 0:
            break
        again()
    raise AssertionError(f"it ended (exit {proc.returncode}) before the moment: {''.join(lines)}{errors}")


def _signal_once(command, reached, sig, then, timeout) -> tuple[subprocess.Popen, list[str], str, bool]:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    lines: list[str] = []
    errors: list[str] = []
    readers = [threading.Thread(target=_read_lines, args=pair, daemon=True)
               for pair in ((proc.stdout, lines), (proc.stderr, errors))]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + timeout
        while not reached(proc, lines) and proc.poll() is None:
            assert time.monotonic() < deadline, f"the moment never came in {timeout} s"
            time.sleep(0.002)
        signalled = proc.poll() is None
        if signalled:
            time.sleep(then)
            proc.send_signal(sig)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    for reader in readers:  # to the end of its output
        reader.join(timeout=30)
    if any(reader.is_alive() for reader in readers):  # what it left running holds its pipes (a solver's workers)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its session: those, nothing of this test run
        except ProcessLookupError:
            pass
        for reader in readers:
            reader.join(timeout=30)
    return proc, lines, "".join(errors), signalled


def snapshot(root: Path, own_files_at_root: bool = False) -> dict[str, str]:
    """Every entry under root with its content hash. tinyproto's manifest and lock in the directories it owns are
    left out; own_files_at_root: root itself is a directory tinyproto owns (a model directory), so are its."""
    from tinyproto.core.manifest import LOCK, MANIFEST

    snap = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.name in (MANIFEST, LOCK) and (own_files_at_root or path.parent != root):
            continue
        if path.is_symlink():
            snap[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            snap[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            snap[rel] = "dir" if path.is_dir() else "other"
    return snap


def refused(args: list[str], keyword: str, watch: Path, code: int | None = None,
            own_files_at_root: bool = False) -> str:
    """Run tinyproto in-process; it must refuse (exit 1, or click's 2; `code` when given) in one `error:` line
    naming `keyword`, with no traceback, changing nothing under `watch` (see snapshot). Returns that line."""
    from click.testing import CliRunner

    from tinyproto.cli import main

    before = snapshot(watch, own_files_at_root)
    result = CliRunner().invoke(main, args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code in ((1, 2) if code is None else (code,)), (result.exit_code, result.output)
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    assert lines and lines[-1].startswith(("error:", "Error:")), result.stderr
    assert len([line for line in lines if line.startswith("error:")]) <= 1, result.stderr
    assert keyword.lower() in lines[-1].lower(), (keyword, lines[-1])
    assert snapshot(watch, own_files_at_root) == before, "a file changed, appeared or vanished"
    return lines[-1]


def accepted(args: list[str]) -> str:
    """Run tinyproto in-process; it must succeed. Returns what it printed."""
    from click.testing import CliRunner

    from tinyproto.cli import main

    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    return result.output


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


# ----------------------------------------------------------------------------------------- synthetic integer models


def sensor_windows(rows_per_class: int, samples: int = 500, seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Accelerometer-like windows: 3 axes of `samples` readings each (gravity on z), five activities that differ
    in frequency and amplitude, each row with a random phase and noise (a wide, real-shaped input)."""
    rng = np.random.default_rng(seed)
    rows, y = [], []
    for c, (freq, amp) in enumerate([(0.3, 0.05), (1.8, 1.0), (3.0, 2.2), (1.4, 1.3), (1.1, 0.7)]):
        for _ in range(rows_per_class):
            t = np.arange(samples) / 50.0
            wave = amp * rng.uniform(0.7, 1.3) * np.sin(2 * np.pi * freq * t + rng.uniform(0, 6.3))
            rows.append(np.concatenate([wave + 9.81 * (axis == 2) + rng.normal(0, 0.3, samples) for axis in range(3)]))
            y.append(c)
    return np.array(rows), np.array(y)


def random_model(seed: int, d: int, r: int, m: int, L: int, density: float, per_row: int = 0):
    """A valid IntBNC with random contents (every layout the C code has: dense/sparse/seeded, r % 8 != 0,
    m > 255). per_row > 0: a seeded W with that many weights per row (density is ignored)."""
    from tinyproto.core.inputstage import InputStage
    from tinyproto.families.bnc.pattern import pattern_mask
    from tinyproto.families.bnc.quantize import IntBNC
    from tinyproto.families.bnc.train import allocate_prototypes

    rng = np.random.default_rng(seed)
    W = rng.integers(-128, 128, size=(r, d))
    pattern_seed = 0
    if per_row:
        pattern_seed = int(rng.integers(1, 65536))
        W[~pattern_mask(pattern_seed, r, d, per_row)] = 0
    else:
        W[rng.random((r, d)) > density] = 0
        W[np.arange(r), rng.integers(0, d, size=r)] = rng.choice([-127, 5, 127], size=r)  # no row all zero
    counts = allocate_prototypes(np.full(L, 1000), m)
    stage = InputStage.from_standardisation(rng.normal(size=d), rng.uniform(0.5, 2, size=d), 0.03)
    return IntBNC(classes=list(range(L)), input_stage=stage, W_q=W, B_bits=rng.integers(0, 2, size=(m, r)),
                  proto_counts=counts, pattern_seed=pattern_seed, per_row=per_row)


def one_per_column(D, d, extra, rng):
    """An int8 W (D x d) with one nonzero per column plus `extra` more, never an empty column."""
    W = np.zeros((D, d), dtype=np.int8)
    W[rng.integers(0, D, size=d), np.arange(d)] = rng.choice([-128, -127, -1, 1, 5, 127], size=d)
    flat = rng.choice(D * d, size=extra, replace=False)
    W.flat[flat] = rng.integers(1, 128, size=extra) * rng.choice([-1, 1], size=extra)  # never 0: no empty column
    return W


def synthetic(D, d, m, L, rng, *, stage="feature", density=None, n_raw=None, proj_shift=9):
    """(model, X): a ProtoNN integer model with W of a chosen structure (density None: one nonzero per column plus a
    few), an informative kernel table, and the requested input stage (kept columns when n_raw > d)."""
    from dataclasses import replace

    from tinyproto.core.inputstage import InputStage
    from tinyproto.families.protonn.quantize import IntProtoNN, kernel_table

    if density is None:
        W = one_per_column(D, d, d // 5, rng)
    else:
        W = (rng.integers(-128, 128, size=(D, d)) * (rng.random((D, d)) < density)).astype(np.int8)
    n_raw = n_raw or d
    kept = None if n_raw == d else np.sort(rng.choice(n_raw, size=d, replace=False))
    if stage == "shared":
        input_stage = InputStage.shared(127.5, 127 / 127.5, d, kept=kept, n_inputs=n_raw)
        offset = rng.integers(-512, 513, size=D).astype(np.int16)
    else:
        input_stage = InputStage.from_standardisation(rng.normal(100, 30, d), rng.uniform(20, 60, d), 1 / 40,
                                                      kept=kept, n_inputs=n_raw if kept is not None else None)
        offset = None
    model = IntProtoNN(list(range(L)), input_stage, W, rng.integers(-60, 61, size=(m, D)).astype(np.int8),
                       rng.integers(-127, 128, size=(m, L)).astype(np.int8), proj_shift=proj_shift,
                       table=np.zeros(32, dtype=np.uint8), table_shift=0, scales={}, offset=offset)
    X = rng.integers(0, 256, size=(12, n_raw)).astype(np.float32)
    X[0, :] = np.nan
    X[1, :] = 1e6
    z = model.projections(model.input_stage.quantize(X))
    B = np.clip(z[: min(m, len(z))] + rng.integers(-3, 4, size=z[: min(m, len(z))].shape), -127, 127)
    B_q = model.B_q.copy()
    B_q[: len(B)] = B
    dist = ((z[:, None, :] - B_q.astype(np.int64)[None]) ** 2).sum(axis=2)
    gamma = float(np.sqrt(np.log(2) / max(float(np.median(dist)), 1.0)))
    table, shift = kernel_table(gamma=gamma, b_scale=1.0, size=32)
    return replace(model, B_q=B_q, table=table, table_shift=shift), X

# ------------------------------------------------------------------------------------- the protocol's fake model
# tests/fixtures/protocol/fake_model.c: the device app (firmware/tp_main.c ...) built around a fake model whose
# scores numpy mirrors below, for the serial protocol's tests (on the host and on the simulated Uno).

FIRMWARE = ROOT / "firmware"
FIXTURE = ROOT / "tests" / "fixtures" / "protocol"
N_FEATURES, N_CLASSES, MODEL_HASH = 8, 3, 0xC0FFEE42
APP_SOURCES = [FIRMWARE / name for name in ("tp_main.c", "tp_transport.c", "tp_measure.c", "tp_learn.c")]
C_SOURCES = [*APP_SOURCES, FIRMWARE / "tp_serial.c", FIRMWARE / "tp_judge.c", FIXTURE / "fake_model.c"]


def fake_scores(x: np.ndarray, n_classes: int = N_CLASSES) -> np.ndarray:
    c = np.arange(n_classes)[:, None]
    i = np.arange(x.shape[-1])[None, :]
    weights = (7 * c + 3 * i) % 11 - 5
    return weights @ x.astype(np.int64) + 100000 * np.arange(n_classes) - 150000


def fake_quantize(raw: np.ndarray) -> np.ndarray:
    t = raw.astype(np.float32) * np.float32(16)
    t = np.where(np.isnan(t), np.float32(0), t)
    return np.trunc(np.clip(t, -127, 127)).astype(np.int8)


def sizes_include(where: Path, n_classes: int = N_CLASSES, edit=None) -> str:
    """-I of a directory holding the generated include/tinyproto_sizes.h (edit: text -> text, one side changed)."""
    where.mkdir(parents=True, exist_ok=True)
    from tinyproto.core import render

    text = render.render_sizes_header(n_classes)
    (where / "tinyproto_sizes.h").write_text(edit(text) if edit else text)
    return f"-I{where}"


AVR_FLAGS = ["-mmcu=atmega328p", "-Os", "-std=gnu99", "-Wall", "-Wextra", "-Werror", "-DF_CPU=16000000UL"]


def build_avr(out: Path, *defines: str) -> Path:
    if shutil.which("avr-gcc") is None:
        pytest.skip("avr-gcc not installed")
    include = sizes_include(out.parent / f"sizes_{out.name}")
    cmd = ["avr-gcc", *AVR_FLAGS, f"-I{FIRMWARE}", f"-I{FIXTURE}", include, *defines, *map(str, C_SOURCES), "-o",
           str(out)]
    subprocess.run(cmd, check=True)
    return out


def compiled_model(compiled, family: str):
    """The integer model of the `compiled` fixture's iris model (1 kB) of `family`."""
    from tinyproto import families
    from tinyproto.core.modeldir import load_model_dir

    return families.load_int_model(load_model_dir(compiled("iris", "1kB", family)))


def variants(compiled) -> list:
    """Every layout whose static state differs: each family's compiled model, ProtoNN's row-major (dense,
    bitmap) and column-coded (streamed, 24- and 32-bit sums) W, BNC's dense, sparse and seeded W, Bloom features
    with --unknown-rate's range check (the bin in the stream's next-feature index, just before φ)."""
    from tinyproto import families
    from tinyproto.core.confidence import Calibration
    from tinyproto.families.judging import make_judged

    rng = np.random.default_rng(5)
    models = [compiled_model(compiled, name) for name in families.names()]
    for D, d, density, stage, n_raw in [(12, 40, 0.3, "shared", None), (12, 300, None, "shared", 784),
                                        (6, 300, None, "feature", 400), (4, 700, 1.0, "feature", None)]:
        models.append(synthetic(D, d, 20, 3, rng, stage=stage, density=density, n_raw=n_raw)[0])
    models += [random_model(9, 64, 40, 30, 10, 1.0), random_model(9, 64, 40, 30, 10, 0.3),
               random_model(3, 50, 19, 12, 4, 0.0, per_row=5)]
    models.append(make_judged(compiled_model(compiled, "bloom"), Calibration(100, 5, False, -10, 0.05, 0, 256, 767)))
    return models


# ------------------------------------------------------------------------------------------------ Arduino IDE


# ------------------------------------------------------------------------------------------------ a fake device


class FakeDevice:
    """A tinyproto device on a pseudo-terminal, served by a thread, answering HELLO, PREDICT, PREDICT_RAW and STATS
    from a built model directory's own reference (model.json, build.json, test_vectors.npz) as the firmware does
    (no receive ring; vectors of one chunk), unless `tamper` changes an answer: tamper(type, k, answer) with the
    request's type, its count k among requests of that type, and the true answer's fields as a dict (edit it and
    return None), or bytes to write instead (b"" for silence), or FakeDevice.CLOSE to pull the cable."""

    CLOSE = object()

    def __init__(self, model_dir: Path, tamper=None) -> None:
        import threading

        from tinyproto import families
        from tinyproto.core.modeldir import load_model_dir

        md = load_model_dir(model_dir)
        self.model = families.load_int_model(md)
        self.vectors = np.load(Path(model_dir) / "test_vectors.npz")
        self.static = int(json.loads((Path(model_dir) / "build.json").read_text())["sram_static_bytes"])
        self.model_hash = md.model_hash
        self.tamper = tamper or (lambda type, k, answer: None)
        self.counts: dict[int, int] = {}
        self.master, self.slave = os.openpty()
        import tty

        tty.setraw(self.slave)
        self.port = os.ttyname(self.slave)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> "FakeDevice":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for fd in (self.master, self.slave):
            if fd is not None:
                os.close(fd)

    def _answer(self, type: int, payload: bytes) -> dict | None:
        from tinyproto.device import codec

        v = self.vectors
        if type == codec.MSG_HELLO:
            return {"magic": codec.MAGIC, "proto": codec.PROTO_VERSION, "abi": codec.RUNTIME_ABI,
                    "family": self.model.family_id, "hash": self.model_hash, "n_features": self.model.n_features,
                    "n_classes": self.model.n_classes, "input_bytes": 1, "score_bytes": 4, "f_cpu": 16_000_000,
                    "flags": codec.FLAG_RAW}
        if type == codec.MSG_STATS:
            return {"stack_peak": 113, "static_sram": self.static, "frames_bad": 0}
        if type == codec.MSG_PREDICT:
            x = np.frombuffer(payload[2:], dtype=np.int8)
            i = int(np.flatnonzero((v["xq"] == x).all(axis=1))[0])
        elif type == codec.MSG_PREDICT_RAW:
            raw = np.frombuffer(payload[2:], dtype="<f4")
            i = int(np.flatnonzero((v["X_raw"].view(np.uint32) == raw.view(np.uint32)).all(axis=1))[0])
        else:
            return None
        return {"label": int(v["labels"][i]), "cycles": 4480, "confidence": int(v["confidence"][i]),
                "decided": int(v["decided"][i]), "x": [int(q) for q in v["xq"][i]],
                "scores": [int(s) for s in v["scores"][i]], "raw": type == codec.MSG_PREDICT_RAW}

    @staticmethod
    def _encode(type: int, answer: dict) -> bytes:
        from tinyproto.device import codec

        if type == codec.MSG_HELLO:
            return codec._HELLO.pack(*answer.values())
        if type == codec.MSG_STATS:
            return struct.pack("<HHH", *(value & 0xFFFF for value in answer.values()))
        head = struct.pack("<BIBB", answer["label"] & 255, answer["cycles"] & 0xFFFFFFFF, answer["confidence"] & 255,
                           answer["decided"] & 255)
        x = np.array(answer["x"], dtype=np.int8).tobytes() if answer["raw"] else b""
        return head + x + np.array(answer["scores"], dtype="<i4").tobytes()

    def _serve(self) -> None:
        from tinyproto.device import codec

        class Master:
            timeout = 0.02

            def __init__(self, fd):
                self.fd = fd

            def read(self, size=1):
                ready, _, _ = select.select([self.fd], [], [], 0.02)
                return os.read(self.fd, 4096) if ready else b""

        reader = codec.FrameReader(Master(self.master))
        while not self._stop.is_set():
            try:
                frame = reader.read_frame(0.05)
            except OSError:
                return
            if frame is None:
                continue
            k = self.counts.get(frame.type, 0)
            self.counts[frame.type] = k + 1
            answer = self._answer(frame.type, frame.payload)
            if answer is None:
                os.write(self.master, codec.encode_frame(codec.MSG_ERROR, frame.seq, bytes((codec.ERR_UNKNOWN_TYPE,))))
                continue
            instead = self.tamper(frame.type, k, answer)
            if instead is FakeDevice.CLOSE:
                os.close(self.master)
                os.close(self.slave)
                self.master = self.slave = None
                return
            if instead is None:
                instead = codec.encode_frame(frame.type | codec.MSG_RESPONSE, frame.seq,
                                             self._encode(frame.type, answer))
            os.write(self.master, instead)


def other_user_python() -> str | None:
    """An interpreter another user may run: this one if its files are world-readable, else the system python3 of
    the same version (it borrows this environment's packages through PYTHONPATH)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run([shutil.which("runuser") or "runuser", "-u", "nobody", "--", candidate, "-c",
                                "import sys; print(sys.version_info[:2])"],
                               capture_output=True, text=True, cwd="/", env={"PATH": "/usr/bin:/bin"})
        if probe.returncode == 0 and probe.stdout.strip() == str(tuple(sys.version_info[:2])):
            return candidate
    return None
