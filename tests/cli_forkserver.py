"""`python -m tinyproto ARGS` for the tests, started from an interpreter that has already imported numpy, SciPy and
scikit-learn: a fork server per test process (per pytest-xdist worker), started once, single-threaded, whose
forked child sets its working directory, environment and standard streams and then runs tinyproto's `__main__`
exactly as `python -m tinyproto` does. What a child costs is then the command's own work: `tinyproto compile` of
iris spent about 1 s of its 2.4 s of CPU importing scikit-learn and SciPy (`python -X importtime`).

It is a plain child process as far as the test can tell: its own pid, exit status (negative for a signal), stdout
and stderr (pipes), stdin, working directory and environment; `sys.argv`, `sys.path[0]` and `__main__` as `-m`
makes them; atexit handlers and non-daemon threads run at its end; numpy's global random state is drawn afresh.
The server starts with the environment of the request that starts it, and starts again for a request whose
environment differs in anything but the variables tinyproto reads while a command runs (FRESH_ENOUGH: the locale,
Python's and the thread libraries' settings are read at start-up or at an import), or whose SIGINT disposition
differs. What it cannot be is a fresh interpreter, so `run()` starts a real one (subprocess.run) where that could
show: coverage.py measures the run (its child processes are measured through the environment), the old server's
children still run when another environment is asked for, or the caller asks for `fresh=True` (a test of what a
new interpreter does: its start-up time, its hash seed, its imports). tinyproto itself is never preloaded: every
command imports it anew, with its environment.

Layer: tests only (nothing in tinyproto imports it).
"""

from __future__ import annotations

import array
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

# Imported by the server before it forks: what every training command imports (about 1 s of CPU in each child).
PRELOAD = ("numpy", "scipy.sparse", "scipy.special", "scipy.stats", "scipy.ndimage", "sklearn.base",
           "sklearn.utils.validation", "sklearn.model_selection", "sklearn.cluster", "sklearn.svm", "sklearn.datasets",
           "joblib", "click", "jinja2")

# Variables a child's environment may set differently from the server's and still be served: tinyproto and the
# programs it starts read them while a command runs, never at an import of what the server preloaded.
FRESH_ENOUGH = {"PYTEST_CURRENT_TEST", "TINYPROTO_CACHE", "TINYPROTO_JOBS", "TINYPROTO_DEBUG", "TMPDIR",
                "SIMUNO_LIBRARY_STEP", "PWD", "OLDPWD"}

_HEADER = struct.Struct("<q")


# ------------------------------------------------------------------------------------------------ the server


def _exit_code(exc: SystemExit) -> int:
    """The status Python's own exit gives a SystemExit (printing a non-integer code, as Python does)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code & 0xFF
    print(exc.code, file=sys.stderr)
    return 1


def _child(request: dict, stdio: list[int]) -> None:
    """In the forked child: become `python -m tinyproto ARGS` in the request's directory and environment. Never
    returns."""
    for target, fd in enumerate(stdio):
        os.dup2(fd, target)
        os.close(fd)
    code = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = os.getcwd()  # what -m puts first
        import tempfile

        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
        if "numpy" in sys.modules:
            sys.modules["numpy"].random.seed()  # a fresh interpreter seeds numpy's global state from the OS
        sys.argv = ["-m", *request["args"]]
        import runpy

        try:
            runpy.run_module("tinyproto", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as exc:
            code = _exit_code(exc)
        except KeyboardInterrupt:
            sys.excepthook(*sys.exc_info())
            code = -signal.SIGINT
        except BaseException:  # noqa: BLE001 - as Python's own top level: the traceback, exit 1
            sys.excepthook(*sys.exc_info())
            code = 1
        threading._shutdown()  # Python's exit: join the non-daemon threads, then the atexit handlers
        import atexit

        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe: Python's exit ignores it too (exit 120 aside)
                pass
        if code == -signal.SIGINT:  # an uncaught KeyboardInterrupt ends a Python process by SIGINT
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)


def serve(control: socket.socket, lifeline: int) -> None:
    """Fork a child per request on `control` (a SOCK_SEQPACKET socket: one message is a JSON request with the
    reply socket and three standard streams as SCM_RIGHTS); send the child's pid, then its exit status, on the
    reply socket. Ends when `lifeline` (the client's end of a pipe) closes."""
    import selectors

    for name in PRELOAD:
        __import__(name)
    selector = selectors.DefaultSelector()
    selector.register(control, selectors.EVENT_READ, "control")
    selector.register(lifeline, selectors.EVENT_READ, "lifeline")
    running: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, reply socket)
    while True:
        for key, _ in selector.select():
            message = b""
            if key.data == "control":
                fds = array.array("i")
                message, ancdata, _, _ = control.recvmsg(1 << 20, socket.CMSG_SPACE(4 * fds.itemsize))
            if key.data == "lifeline" or (key.data == "control" and not message):
                for pid, _ in running.values():  # the client has ended: so do the children, waited for (their CPU
                    _kill(pid)  # time then counts in the client's children's, as a subprocess's does)
                    os.waitpid(pid, 0)
                return
            if key.data == "control":
                for level, kind, data in ancdata:
                    if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                        fds.frombytes(data[:len(data) - len(data) % fds.itemsize])
                reply = socket.socket(fileno=fds[0])
                pid = os.fork()
                if pid == 0:
                    selector.close()
                    control.close()
                    os.close(lifeline)
                    reply.close()
                    for pidfd, (_, other) in running.items():
                        os.close(pidfd)
                        other.close()
                    _child(json.loads(message), list(fds[1:]))
                for fd in fds[1:]:
                    os.close(fd)
                pidfd = os.pidfd_open(pid)
                running[pidfd] = (pid, reply)
                selector.register(pidfd, selectors.EVENT_READ, "child")
                try:
                    reply.sendall(_HEADER.pack(pid))
                except OSError:
                    pass
            else:
                pidfd = key.fd
                pid, reply = running.pop(pidfd)
                selector.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                try:
                    reply.sendall(_HEADER.pack(os.waitstatus_to_exitcode(status)))
                except OSError:
                    pass
                reply.close()


# ------------------------------------------------------------------------------------------------ the client


def measured_by_coverage(env) -> bool:
    """Whether coverage.py measures a process with this environment (tools/coverage.sh): then every command runs in a
    new interpreter, which coverage's settings in the environment reach, and no server serves."""
    return bool(env.get("COVERAGE_PROCESS_CONFIG") or env.get("COVERAGE_PROCESS_START"))


class ForkServer:
    """The client's end: one server per process that asks, started at the first request with that request's
    environment, and started again (when none of its children runs) for a request whose start-up environment or
    SIGINT disposition differs: a new interpreter would start with those too."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._control: socket.socket | None = None
        self._lifeline = -1
        self._start_env: dict[str, str] = {}
        self._sigint_ignored = False
        self._pid = -1
        self._running = 0  # children under way
        self._atexit = False

    def _start(self, env: dict[str, str]) -> None:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_end, write_end = os.pipe()
        self._proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; sys.path[0] = sys.argv[1]; import cli_forkserver as s; "
             "s.serve(__import__('socket').socket(fileno=int(sys.argv[2])), int(sys.argv[3]))",
             os.path.dirname(os.path.abspath(__file__)), str(theirs.fileno()), str(read_end)],
            pass_fds=(theirs.fileno(), read_end), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, env=env)
        theirs.close()
        os.close(read_end)
        self._control, self._lifeline, self._start_env = ours, write_end, _start_up(env)
        self._sigint_ignored, self._pid = signal.getsignal(signal.SIGINT) == signal.SIG_IGN, os.getpid()
        if not self._atexit:
            import atexit

            atexit.register(self.close)
            self._atexit = True

    def _stop(self) -> None:
        if self._proc is not None and self._pid == os.getpid():
            os.close(self._lifeline)
            self._control.close()
            self._proc.wait()
        self._proc = None

    def close(self) -> None:
        """End the server (its running children with it) and wait for it."""
        with self._lock:
            self._stop()

    def _acquire(self, env: dict[str, str]) -> bool:
        """Whether a child with this environment comes from the server (then counted as running until _release):
        the server is started, or started again with this environment, where need be."""
        if measured_by_coverage(os.environ) or measured_by_coverage(env):
            return False
        sigint_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
        with self._lock:
            if self._pid != os.getpid():  # a fork of the process that started it: start one of its own
                self._proc, self._running = None, 0
            alive = self._proc is not None and self._proc.poll() is None
            if not (alive and self._start_env == _start_up(env) and self._sigint_ignored == sigint_ignored):
                if alive and self._running:
                    return False  # the old server's children still run: a new interpreter for this one
                self._stop()
                self._start(env)
            self._running += 1
            return True

    def _release(self) -> None:
        with self._lock:
            self._running -= 1

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a child with this environment would come from the server (started for it if need be)."""
        if self._acquire(env):
            self._release()
            return True
        return False

    def run(self, args: list[str], cwd: str | None, env: dict[str, str], timeout: float | None,
            input: str | None) -> subprocess.CompletedProcess:
        """As subprocess.run([python, -m, tinyproto, *args], capture_output=True, text=True, ...)."""
        command = [sys.executable, "-m", "tinyproto", *args]
        ours, theirs = socket.socketpair()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        in_r, in_w = os.pipe() if input is not None else (_inherited_stdin(), -1)
        request = json.dumps({"args": list(args), "cwd": os.path.abspath(cwd or os.getcwd()), "env": env}).encode()
        try:
            with self._lock:
                self._control.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS,
                                                   array.array("i", [theirs.fileno(), in_r, out_w, err_w]))])
        finally:
            for fd in (theirs.fileno(), in_r, out_w, err_w):
                os.close(fd)
            theirs.detach()
        deadline = None if timeout is None else time.monotonic() + timeout
        pid = _HEADER.unpack(_recv_exactly(ours, _HEADER.size, deadline, None))[0]
        stdout, stderr = bytearray(), bytearray()
        readers = [threading.Thread(target=_drain, args=(out_r, stdout), daemon=True),
                   threading.Thread(target=_drain, args=(err_r, stderr), daemon=True)]
        if in_w >= 0:
            readers.append(threading.Thread(target=_feed, args=(in_w, input.encode()), daemon=True))
        for reader in readers:
            reader.start()
        try:
            for reader in readers:
                reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
                if reader.is_alive():
                    raise subprocess.TimeoutExpired(command, timeout)
            status = _HEADER.unpack(_recv_exactly(ours, _HEADER.size, deadline, command))[0]
        except subprocess.TimeoutExpired:  # as subprocess.run: kill it, wait for it, raise with what it wrote
            _kill(pid)
            _recv_exactly(ours, _HEADER.size, None, None)  # its status: it has ended
            raise subprocess.TimeoutExpired(command, timeout, bytes(stdout), bytes(stderr)) from None
        finally:
            ours.close()
        return subprocess.CompletedProcess(command, status, _text(stdout), _text(stderr))


def _start_up(env: dict[str, str]) -> dict[str, str]:
    """What of an environment a new interpreter reads at its start or at an import of what the server preloads."""
    return {k: v for k, v in env.items() if k not in FRESH_ENOUGH}


def _text(data: bytearray) -> str:
    """What subprocess.run(text=True) makes of a stream: the locale's encoding, universal newlines."""
    import locale

    return bytes(data).decode(locale.getpreferredencoding(False)).replace("\r\n", "\n").replace("\r", "\n")


def _recv_exactly(sock: socket.socket, n: int, deadline: float | None, command) -> bytes:
    data = b""
    while len(data) < n:
        sock.settimeout(None if deadline is None else max(0.001, deadline - time.monotonic()))
        try:
            chunk = sock.recv(n - len(data))
        except socket.timeout:
            raise subprocess.TimeoutExpired(command, 0) from None
        if not chunk:
            raise RuntimeError("the tinyproto fork server ended")
        data += chunk
    return data


def _drain(fd: int, into: bytearray) -> None:
    try:
        while chunk := os.read(fd, 1 << 16):
            into += chunk
    finally:
        os.close(fd)


def _feed(fd: int, data: bytes) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view):]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)


def _inherited_stdin() -> int:
    """The caller's stdin for the child, as subprocess.run passes it on (/dev/null where the caller has none)."""
    try:
        return os.dup(0)
    except OSError:
        return os.open(os.devnull, os.O_RDONLY)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


SERVER = ForkServer()
WATCHERS: list = []  # callables given each command the server runs (conftest's tier guard, as for a Popen)


def run(args, cwd=None, env: dict[str, str] | None = None, timeout: float | None = None, input: str | None = None,
        fresh: bool = False) -> subprocess.CompletedProcess:
    """`python -m tinyproto ARGS` as subprocess.run(..., capture_output=True, text=True) runs it: from the fork
    server where nothing the test could observe differs, else in a fresh interpreter."""
    args = [str(a) for a in args]
    child_env = dict(os.environ if env is None else env)
    if not fresh and SERVER._acquire(child_env):
        try:
            for watch in WATCHERS:
                watch([sys.executable, "-m", "tinyproto", *args])
            return SERVER.run(args, None if cwd is None else str(cwd), child_env, timeout, input)
        finally:
            SERVER._release()
    return subprocess.run([sys.executable, "-m", "tinyproto", *args], cwd=cwd, env=child_env, capture_output=True,
                          text=True, timeout=timeout, input=input)
