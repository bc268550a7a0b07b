"""`tinyproto federate` under misuse: bad options, services that are not dask schedulers, Ctrl-C.

Every case must end quickly with one line on stderr (exit 1; Ctrl-C: 130), no traceback, no leftover processes
or temporary directories and no --out directory. Network cases use loopback servers only."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tinyproto.core.errors import TinyprotoError
from tinyproto.cli.federate import federate_command
from tinyproto.core.dask_cluster import probe_scheduler
from tinyproto.federated.dask_parties import DaskBackend

ROOT = Path(__file__).resolve().parents[1]


def refuse(tmp_path, *args, max_seconds: float = 15.0) -> str:
    out = tmp_path / "never"
    started = time.monotonic()
    result = CliRunner().invoke(federate_command, ["iris", *args, "--out", str(out)])
    assert time.monotonic() - started < max_seconds
    assert result.exit_code == 1, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not out.exists()
    return lines[0]


def test_no_flynn_within_the_default_time_cap_names_the_cap(tmp_path):
    """Was: "no FlyNN fits 1024 B within default ms per inference" (the cap's marker, not its value)."""
    import numpy as np

    from tinyproto.families.flynn.pricing import default_max_ms

    rng = np.random.default_rng(0)
    X = rng.normal(size=(40, 5000))
    X[20:, :40] += 3
    data = tmp_path / "wide.csv"
    header = ",".join(f"f{j}" for j in range(5000)) + ",label\n"
    data.write_text(header + "".join(",".join(f"{v:.2f}" for v in row) + f",{i // 20}\n" for i, row in enumerate(X)))
    out = tmp_path / "never"
    result = CliRunner().invoke(federate_command, [str(data), "--parties", "2", "--backend", "local", "--budget",
                                                   "1kB", "--out", str(out)])
    assert result.exit_code == 1, result.output
    line = result.stderr.strip().splitlines()[-1]
    assert f"within the default cap of {default_max_ms(5000):g} ms per inference" in line, line
    assert "default ms" not in line and not out.exists()


# ---------------------------------------------------------------- options


@pytest.mark.parametrize("args,expected", [
    (["--parties", "0"], "--parties"),
    (["--parties", "2", "--seed", "-1"], "--seed"),
    (["--parties", "2", "--seed", str(2**32)], "--seed"),
    (["--parties", "2", "--seed", str(10**30)], "--seed"),
    (["--parties", "2", "--workers", "0"], "--workers"),
    (["--parties", "2", "--workers", "-2"], "--workers"),
    (["--parties", "2", "--backend", "local", "--workers", "2"], "--workers"),
    (["--parties", "2", "--backend", "local", "--processes"], "--processes"),
    (["--parties", "2", "--scheduler", "tcp://127.0.0.1:1", "--workers", "2"], "--workers"),
    (["--parties", "2", "--dp-epsilon", "inf"], "--dp-epsilon"),
    (["--parties", "2", "--dp-epsilon", "nan"], "--dp-epsilon"),
    (["--parties", "2", "--dp-epsilon", "1", "--dp-T", "-5"], "--dp-T"),
    (["--parties", "2", "--dp-T", "5"], "--dp-T"),
    (["--parties", "2", "--split", "dirichlet:abc"], "dirichlet"),
    (["--parties", "2", "--split", "dirichlet:-1"], "dirichlet"),
    (["--parties", "2", "--split", "dirichlet:inf"], "dirichlet"),
    (["--parties", "2", "--split", "dirichlet:"], "dirichlet"),
    (["--parties", "2", "--split", "shuffled"], "--split"),
    (["--parties", "2", "--timeout", "0"], "--timeout"),
    (["--parties", "2", "--timeout", "nan"], "--timeout"),
    (["--parties", "2", "--backend", "local", "--scheduler", "tcp://127.0.0.1:1"], "--scheduler"),
])
def test_bad_options_are_refused_in_one_line(tmp_path, args, expected):
    assert expected in refuse(tmp_path, *args)


def test_dp_T_above_the_counts_is_capped_and_recorded(tmp_path):
    out = tmp_path / "dp"
    result = CliRunner().invoke(federate_command, ["iris", "--parties", "2", "--backend", "local", "--budget", "1kB",
                                                   "--dp-epsilon", "4", "--dp-T", "1000000", "--out", str(out),
                                                   "--json"])
    assert result.exit_code == 0, result.output
    import json

    report = json.loads(result.stdout)
    dp, m = report["dp"], report["hyperparameters"]["n_hashes"]
    assert dp["T_requested"] == 1000000 and dp["T"] == 3 * m  # 3 classes x m counts: every count released
    assert dp["epsilon_0"] == pytest.approx(4 / (2 * dp["T"] * 2))


# ---------------------------------------------------------------- services that are not a dask scheduler


class FakeService:
    """A loopback TCP server that misbehaves: 'garbage' (sends bytes that read as a 3 EiB length), 'silent'
    (accepts, says nothing), 'close' (accepts and hangs up), 'http' (answers like a web server)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.stop = threading.Event()
        self.conns: list[socket.socket] = []
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        for _ in range(2000):  # bounded: at most ~400 s of 0.2 s accept timeouts
            if self.stop.is_set():
                break
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            if self.mode == "garbage":
                conn.sendall(b"\xff\xff\xff\xff\xff\xff\xff\x2f" + os.urandom(56))
            elif self.mode == "http":
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            elif self.mode == "close":
                conn.close()
                continue
            self.conns.append(conn)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def service(request):
    s = FakeService(request.param)
    yield s
    s.close()


@pytest.mark.parametrize("service,expected", [
    ("garbage", "not a dask scheduler"),
    ("http", "not a dask scheduler"),
    ("silent", "no dask handshake within 1 s"),
    ("close", "closed the connection"),
], indirect=["service"])
def test_scheduler_that_is_not_dask_fails_fast(tmp_path, service, expected):
    pytest.importorskip("distributed")
    address = f"tcp://127.0.0.1:{service.port}"
    line = refuse(tmp_path, "--parties", "2", "--scheduler", address, "--timeout", "1", max_seconds=10)
    assert expected in line and address in line


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("address,expected", [
    (None, "connection refused"),  # a closed port
    ("tcp://no-such-host.invalid:8786", "cannot resolve host"),
    ("http://127.0.0.1:8787/status", "tcp://HOST:PORT"),
    ("https://example.invalid", "tcp://HOST:PORT"),
    ("tcp://127.0.0.1:99999", "port"),
    ("tcp://127.0.0.1:abc", "port"),
    ("tcp://", "tcp://HOST:PORT"),
])
def test_unreachable_or_malformed_scheduler_addresses(tmp_path, address, expected):
    pytest.importorskip("distributed")
    address = address or f"tcp://127.0.0.1:{free_port()}"
    line = refuse(tmp_path, "--parties", "2", "--scheduler", address, "--timeout", "2", max_seconds=10)
    assert expected in line


def test_probe_accepts_a_real_scheduler():
    pytest.importorskip("distributed")
    from distributed import LocalCluster

    with LocalCluster(n_workers=0, processes=False, protocol="tcp://", host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster:
        address = cluster.scheduler_address
        if not address.startswith("tcp://"):
            pytest.skip(f"scheduler on {address}")
        assert probe_scheduler(address, 5) == address
        with pytest.raises(TinyprotoError, match="has no workers|did not start|cannot connect"):
            DaskBackend([(None, None)], scheduler=address, timeout=3)


# ---------------------------------------------------------------- Ctrl-C


def _default_sigint() -> None:
    """The child starts as a terminal would start it: SIGINT delivered and handled by default (whatever the test
    process inherited or set)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = set(), [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.add(c)
            todo.append(c)
    return out


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _forked_workers(pid: int) -> int:
    """How many processes the fork server under `pid` has forked (dask's worker processes, starting or started)."""
    servers = [p for p in _descendants(pid) if b"forkserver" in _cmdline(p) and _parent(p) == pid]
    return sum(len(_descendants(server)) for server in servers)


def _cmdline(pid: int) -> bytes:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes()
    except OSError:
        return b""


def _parent(pid: int) -> int:
    try:
        return int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


WORKERS_STARTING = "(the fork server's first worker exists)"


@pytest.mark.parametrize("backend_args,wait_for", [
    (["--backend", "dask", "--processes", "--workers", "2"], "selection: preprocessing"),
    (["--backend", "local"], "selection: preprocessing"),
    (["--backend", "dask", "--processes", "--workers", "2"], "parties (iid)"),  # while the cluster starts
    (["--backend", "dask", "--processes", "--workers", "2"], WORKERS_STARTING),  # workers importing dask
])
def test_ctrl_c_exits_130_cleanly(tmp_path, backend_args, wait_for):
    """Ctrl-C as a terminal sends it: to the whole process group, worker processes included."""
    if backend_args[1] == "dask":
        pytest.importorskip("distributed")
    out = tmp_path / "never"
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch), PYTHONPATH=str(ROOT), COLUMNS="200", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "tinyproto", "federate", "digits", "--parties", "64",
                             *backend_args, "--out", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, cwd=tmp_path, text=True, preexec_fn=_default_sigint, start_new_session=True)
    seen = set()
    try:
        deadline = time.monotonic() + 60
        if wait_for == WORKERS_STARTING:
            while _forked_workers(proc.pid) == 0 and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        else:
            for line in proc.stdout:  # progress lines; bounded by the deadline and the process ending
                if wait_for in line or time.monotonic() > deadline:
                    break
        seen = _descendants(proc.pid)
        assert proc.poll() is None, ("the run ended before it could be interrupted", proc.stderr.read())
        os.killpg(proc.pid, signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 130, stderr
    lines = stderr.strip().splitlines()
    assert lines == ["error: interrupted; nothing was written"], stderr
    assert not out.exists()
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in seen) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(p) for p in seen)
    assert list(scratch.iterdir()) == []


def test_a_ctrl_c_inside_a_finalizer_is_not_lost(monkeypatch):
    """Python drops a KeyboardInterrupt raised inside __del__ (dask's Future.__del__ runs whenever a result is
    dropped): federate would have gone on and written its output. Under interrupts_kept it comes back outside."""
    from tinyproto.pipeline.interrupts import interrupts_kept

    # Ctrl-C as a terminal delivers it, whatever disposition the suite inherited (nohup and background jobs start
    # with SIGINT ignored, and interrupts_kept rightly leaves an ignored SIGINT alone); restored afterwards.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    try:
        _ctrl_c_inside_a_finalizer_is_not_lost(monkeypatch, interrupts_kept)
    finally:
        signal.signal(signal.SIGINT, previous)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _ctrl_c_inside_a_finalizer_is_not_lost(monkeypatch, interrupts_kept) -> None:
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    dropped = []
    monkeypatch.setattr(sys, "unraisablehook", dropped.append)

    class Result:
        def __del__(self):
            signal.raise_signal(signal.SIGINT)  # Ctrl-C while the finalizer runs

    def wait_for_interrupt(seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.01)
        return False

    Result()  # without the guard: reported as unraisable and dropped
    assert not wait_for_interrupt(3) and len(dropped) == 1 and dropped[0].exc_type is KeyboardInterrupt
    dropped.clear()
    waits_finished = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_kept() as interrupted:
            Result()
            # the interrupt comes back during the wait (a busy machine may take a while), not after it
            waits_finished.append(wait_for_interrupt(60))
    assert waits_finished == [] and dropped == []
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    with pytest.raises(KeyboardInterrupt):  # a Ctrl-C swallowed elsewhere: the next progress step raises it
        with interrupts_kept() as interrupted:
            try:
                signal.raise_signal(signal.SIGINT)
            except KeyboardInterrupt:
                pass
            interrupted()


def test_a_tiny_epsilon_releases_clipped_counts_not_wrapped_ones():
    """Noise of scale 2TN/1e-300 overflows int64 when rounded; the release clips it instead of wrapping it negative."""
    import numpy as np

    from tinyproto.federated.dp import RELEASE_MAX, DPParams, dp_release

    counts = np.arange(12, dtype=np.int64).reshape(3, 4)
    params = DPParams(epsilon=1e-300, T=6, n_parties=2)
    out = dp_release(counts, params, np.random.default_rng(0))
    assert out.shape == (12,) or out.shape == (3, 4)
    assert out.min() >= 0 and out.max() <= RELEASE_MAX and np.count_nonzero(out) <= 6


def test_a_host_name_idna_cannot_encode_is_one_line():
    from tinyproto.core.errors import TinyprotoError
    from tinyproto.core.dask_cluster import probe_scheduler

    with pytest.raises(TinyprotoError, match="cannot resolve host"):
        probe_scheduler("tcp://" + "a" * 300 + ":8786", timeout=5)
