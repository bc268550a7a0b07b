"""The one way tinyproto opens a dask.distributed cluster (`sweep`, `federate --backend dask`): a LocalCluster of
its own or a running scheduler, every wait bounded, a scheduler address probed for dask's handshake before dask
is let near it, and every failure one TinyprotoError line.

Layer: core. dask is imported only when a cluster is opened (it is an optional extra).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tinyproto.core.errors import TinyprotoError

CONNECT_TIMEOUT_S = 20.0  # connecting to a scheduler, starting workers (--timeout)
_HANDSHAKE_MAX = 1 << 20  # a dask handshake is ~100 bytes
# What a worker's tasks import besides dask (a sweep point's compile, a federated party's counts): scikit-learn and
# SciPy, about 1 s of CPU per worker process. The fork server the worker processes are forked from imports them
# once (start_forkserver_deaf_to_ctrl_c), so a cluster's workers, and every later cluster this process starts, skip
# it. Third-party modules only: tinyproto's own are imported by each worker, from the files as they are then.
WORKER_PRELOAD = ["scipy.sparse", "scipy.special", "scipy.stats", "scipy.ndimage", "sklearn.base",
                  "sklearn.utils.validation", "sklearn.model_selection", "sklearn.cluster", "sklearn.svm", "joblib"]


class DaskCluster:
    """A client on a LocalCluster of `n_workers` workers (threads of this process, or with processes=True worker
    processes: numpy-heavy Python needs them to run in parallel) or, with `scheduler`, on the running cluster
    there (waiting up to `timeout` for its first worker). close() ends what was opened, each step bounded."""

    def __init__(self, scheduler: str | None = None, n_workers: int = 1, *, processes: bool = True,
                 timeout: float = CONNECT_TIMEOUT_S) -> None:
        self.scheduler = scheduler
        self.processes = processes if not scheduler else None
        self.timeout = float(timeout)
        self.client: Any = None
        self._cluster = None
        self._scratch_context = None
        try:
            if scheduler:
                self._connect(scheduler)
            else:
                self._start_local(n_workers, processes)
        except TimeoutError as exc:
            self.close()
            raise TinyprotoError(f"dask cluster ({self.where}) did not start within {self.timeout:g} s: "
                                 f"{one_line(exc)}") from None
        except (RuntimeError, OSError) as exc:  # e.g. "Nanny failed to start", no free port
            self.close()
            raise TinyprotoError(f"could not start the dask cluster ({self.where}): {one_line(exc).rstrip('.')}"
                                 + _script_hint(scheduler, processes)) from None
        except BaseException:
            self.close()
            raise

    @property
    def where(self) -> str:
        return self.scheduler or "LocalCluster"

    def _connect(self, scheduler: str) -> None:
        from distributed import Client

        address = probe_scheduler(scheduler, self.timeout)  # a silent or foreign service: one line, no hang
        try:
            self.client = Client(address, timeout=self.timeout)
        except Exception as exc:  # refused, timed out, or an address dask cannot parse: one line, whatever it is
            raise TinyprotoError(f"cannot connect to the dask scheduler at {scheduler} within {self.timeout:g} s: "
                                 f"{one_line(exc)}") from None
        if not self.workers():
            try:
                self.client.wait_for_workers(1, timeout=self.timeout)
            except (OSError, TimeoutError):
                raise TinyprotoError(f"the dask scheduler at {scheduler} has no workers (waited "
                                     f"{self.timeout:g} s)") from None

    def _start_local(self, n_workers: int, processes: bool) -> None:
        import dask
        from distributed import Client, LocalCluster

        from tinyproto.core.outdir import private_scratch

        # the workers' files, not $TMPDIR's; removed by close(), or by the next run after a SIGKILL (its lock is free)
        self._scratch_context = private_scratch("tinyproto-dask-")
        scratch = str(self._scratch_context.__enter__())
        # dask spawns worker processes with MALLOC_TRIM_THRESHOLD_=65536, which makes glibc hand every freed numpy
        # buffer back to the OS (hashing ran 2x slower); None keeps glibc's adaptive default.
        start_method = start_forkserver_deaf_to_ctrl_c() if processes else "spawn"
        with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                              "distributed.worker.multiprocessing-method": start_method,
                              "distributed.comm.timeouts.connect": f"{self.timeout:g}s",
                              "temporary-directory": scratch}), ctrl_c_held_while_starting():
            self._cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=processes,
                                         dashboard_address="127.0.0.1:0", silence_logs=logging.CRITICAL,
                                         host="127.0.0.1" if processes else None, local_directory=scratch)
            self.client = Client(self._cluster, timeout=self.timeout)
            self.client.wait_for_workers(n_workers, timeout=self.timeout)

    def workers(self) -> list[str]:
        """The workers' addresses, sorted."""
        return sorted(self.client.scheduler_info().get("workers", {}))

    def describe(self) -> dict:
        workers = self.client.scheduler_info().get("workers", {})
        return {"scheduler": self.where, "workers": len(workers),
                "threads": sum(w.get("nthreads", 1) for w in workers.values()), "processes": self.processes}

    def close(self) -> None:
        """Close the client, then the LocalCluster (each within the timeout), then remove the scratch directory.
        Never raises: closing must not hide why we stopped (an error, Ctrl-C)."""
        client, cluster = self.client, self._cluster
        # Closing a LocalCluster whose tasks were cut short (Ctrl-C, a failed round) makes its in-process scheduler
        # log CRITICAL tracebacks about the client's closed comm: noise after the one error the user is shown.
        previous = logging.root.manager.disable
        if cluster is not None:
            logging.disable(logging.CRITICAL)
        try:
            for thing in (client, cluster):
                if thing is not None:
                    try:
                        thing.close(timeout=self.timeout)
                    except Exception:  # noqa: BLE001 - closing a broken connection must not hide the first error
                        pass
        finally:
            logging.disable(previous)
        self.client = self._cluster = None
        if self._scratch_context is not None:
            self._scratch_context.__exit__(None, None, None)
            self._scratch_context = None

    def __enter__(self) -> DaskCluster:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def refuse_in_a_worker_importing_main(call: str) -> None:
    """Called first by the functions that start worker processes (sweep, federate): multiprocessing starts each
    worker by importing the user's script again (as __mp_main__), and a script that calls sweep() at import, with
    no `if __name__ == "__main__":` guard, called it again in every worker, which then touched the sweep's own
    directory (a FileNotFoundError from writing sweep.json) while the first run said "Nanny failed to start". In
    such a worker this refuses at once, before any file is touched; the first run's error says why (_script_hint)."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):  # multiprocessing's own test
        raise TinyprotoError(f"{call} was called while a worker process imported the script that started it; "
                             "put the call under `if __name__ == \"__main__\":`")


def _script_hint(scheduler: str | None, processes: bool) -> str:
    """What the failure of a LocalCluster's worker processes to start most likely means when tinyproto runs from
    the user's own script (not the CLI): each worker imports that script again (see
    refuse_in_a_worker_importing_main). Empty for the CLI, a scheduler's cluster or thread workers."""
    import sys

    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    name = spec.name if spec is not None else getattr(main, "__file__", None)
    if scheduler or not processes or not name:
        return ""
    path = os.path.realpath(str(name)) if spec is None else ""
    if str(name).split(".")[0] == "tinyproto" or os.path.basename(str(name)) == "tinyproto" or (
            path and path.startswith(os.path.realpath(sys.prefix) + os.sep)):
        return ""  # the command line, or a tool installed beside tinyproto (pytest): not a script of the user's
    return (f"; each worker process imports {name} again: if it calls tinyproto's sweep or federate when imported, "
            "put that call under `if __name__ == \"__main__\":`")


@contextmanager
def ctrl_c_held_while_starting() -> Iterator[None]:
    """A Ctrl-C or a SIGTERM (the CLI's interrupt too) while dask starts a cluster takes effect once it has started
    (then it is closed as usual): a KeyboardInterrupt inside LocalCluster's constructor leaves a half-built cluster
    that dask's exit hook fails to close, with a traceback. The signal is raised again on leaving, to whatever
    handler was in place. A start that fails after one was received failed because of it (`kill -TERM` to the
    process group also stops the workers being started: "Nanny failed to start"): that is the interruption, not an
    error of its own. An ignored signal stays ignored. (Not SIGHUP: it also ends multiprocessing's resource
    tracker, which ignores the other two, and a start that went on would relaunch it with a warning.)"""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held = [signum for signum in (signal.SIGINT, signal.SIGTERM)
            if signal.getsignal(signum) not in (signal.SIG_IGN, None)]
    received: list[int] = []
    previous = {signum: signal.signal(signum, lambda signum, frame: received.append(signum)) for signum in held}
    failed = None
    try:
        yield
    except Exception as exc:
        if not received:
            raise
        failed = exc
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        signal.raise_signal(received[0])
    if failed is not None:  # a handler in place that only took note: the start still failed because of the signal
        raise KeyboardInterrupt from None


def start_forkserver_deaf_to_ctrl_c() -> str:
    """Start multiprocessing's fork server (once per process) with SIGINT ignored, and name the start method worker
    processes use: "forkserver", or "spawn" where the server cannot start.

    Ctrl-C in a terminal signals the whole process group, workers included, and a worker that gets it while it
    starts prints a KeyboardInterrupt traceback. An ignored signal stays ignored through exec, so the fork server
    and every worker forked from it never see Ctrl-C; this process shuts them down. The server's output goes to
    /dev/null (core/quiet_workers.py): a worker still starting when the cluster closes prints nothing. The fork
    server also imports dask, numpy and WORKER_PRELOAD once instead of once per worker. The signal is ignored only
    while the server is spawned (milliseconds): a Ctrl-C then is not seen."""
    import multiprocessing
    from multiprocessing import forkserver

    multiprocessing.get_context("forkserver").set_forkserver_preload(["distributed", "numpy", *WORKER_PRELOAD,
                                                                         "tinyproto.core.quiet_workers"])
    in_main = threading.current_thread() is threading.main_thread()
    handler = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main else None
    try:
        with short_temp_dir():
            _multiprocessing_dir_in_scratch()
            forkserver.ensure_running()
    except OSError:
        return "spawn"
    finally:
        if in_main:
            signal.signal(signal.SIGINT, handler)
    return "forkserver"


def _multiprocessing_dir_in_scratch() -> None:
    """multiprocessing keeps the fork server's socket in a `pymp-*` directory of $TMPDIR that it removes at exit,
    which a SIGKILL skips: that directory stayed for ever. Give it a locked private scratch of this process's
    lifetime instead (core/outdir.py), which the next run removes once its lock has no holder (once per process)."""
    import atexit
    import multiprocessing

    config = multiprocessing.current_process()._config  # what multiprocessing.util.get_temp_dir() reads first
    if config.get("tempdir") is not None:
        return
    from tinyproto.core.outdir import private_scratch

    scratch = private_scratch("tinyproto-mp-")
    config["tempdir"] = str(scratch.__enter__())
    atexit.register(scratch.__exit__, None, None, None)


UNIX_SOCKET_PATH_MAX = 107  # sun_path holds 108 bytes with the final NUL
# multiprocessing's "/tinyproto-mp-XXXXXXXX/listener-XXXXXXXX" (40 bytes) below the temp dir
_SOCKET_NAME_BYTES = 40


@contextmanager
def short_temp_dir() -> Iterator[None]:
    """The fork server listens on a Unix socket in a directory of tempfile's: under a long $TMPDIR its path would
    not fit a socket address, so /tmp (or /dev/shm) serves for that while it starts; multiprocessing removes the
    directory when this process exits."""
    import tempfile

    if len(os.fsencode(tempfile.gettempdir())) + _SOCKET_NAME_BYTES <= UNIX_SOCKET_PATH_MAX:
        yield
        return
    previous = tempfile.tempdir
    tempfile.tempdir = next((d for d in ("/tmp", "/dev/shm") if os.access(d, os.W_OK | os.X_OK)), previous)
    try:
        yield
    finally:
        tempfile.tempdir = previous


def cpu_count() -> int:
    """CPUs this process may run on (its affinity), the default number of LocalCluster workers."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:200] + "...") if len(text) > 200 else (text or type(exc).__name__)


def probe_scheduler(address: str, timeout: float = CONNECT_TIMEOUT_S) -> str:
    """Check that `address` is a reachable dask scheduler before dask tries it (dask can wait forever on a
    service that accepts and stays silent, or read garbage as a 3 EiB message length). Returns the address in
    tcp://HOST:PORT form; TinyprotoError (one line, naming the address) otherwise.

    A dask comm listener writes its handshake first: an 8-byte length, then frames (a count, their lengths,
    msgpack); the probe reads that much, bounded in time and size, without sending anything."""
    import socket
    import struct
    from concurrent.futures import ThreadPoolExecutor
    from concurrent.futures import TimeoutError as FutureTimeout

    text = address.strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "tcp", text
    if scheme.lower() != "tcp":
        raise TinyprotoError(f"--scheduler {address!r}: give the scheduler's tcp://HOST:PORT address (e.g. "
                             f"tcp://127.0.0.1:8786); {scheme}:// is not a dask scheduler protocol tinyproto uses")
    host, colon, port_text = rest.rstrip("/").rpartition(":")
    if not colon:
        host, port_text = rest.rstrip("/"), "8786"
    host = host.strip("[]")
    if not host or "/" in host or "/" in port_text:
        raise TinyprotoError(f"--scheduler {address!r}: expected tcp://HOST:PORT")
    try:
        port = int(port_text)
    except ValueError:
        port = -1
    if not 1 <= port <= 65535:
        raise TinyprotoError(f"--scheduler {address!r}: the port must be a number in 1..65535")
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        infos = pool.submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM).result(timeout=timeout)
    except FutureTimeout:
        raise TinyprotoError(f"--scheduler {address}: resolving {host!r} took more than {timeout:g} s") from None
    except (OSError, UnicodeError) as exc:  # UnicodeError: a name idna cannot encode (a label over 63 characters)
        raise TinyprotoError(f"--scheduler {address}: cannot resolve host {host!r} ({one_line(exc)})") from None
    finally:
        pool.shutdown(wait=False)
    family, _, _, _, sockaddr = infos[0]
    deadline = time.monotonic() + timeout

    def recv_exactly(sock, n: int) -> bytes:
        data = b""
        while len(data) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            chunk = sock.recv(n - len(data))
            if not chunk:
                raise ConnectionError("the connection was closed")
            data += chunk
        return data

    where = f"--scheduler {address}"
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(sockaddr)
            (total,) = struct.unpack("<Q", recv_exactly(sock, 8))
            if not 16 <= total <= _HANDSHAKE_MAX:
                raise ValueError(f"its first message would be {total} bytes long")
            body = recv_exactly(sock, total)
            (n_frames,) = struct.unpack_from("<Q", body)
            if not 1 <= n_frames <= 64 or 8 + 8 * n_frames > total:
                raise ValueError("its first message is not a dask handshake")
    except TimeoutError:
        raise TinyprotoError(f"{where}: no dask handshake within {timeout:g} s (is it a dask scheduler?)") from None
    except ValueError as exc:
        raise TinyprotoError(f"{where}: not a dask scheduler ({exc})") from None
    except ConnectionError as exc:
        if isinstance(exc, ConnectionRefusedError):
            raise TinyprotoError(f"{where}: connection refused (no scheduler listening on {host}:{port})") from None
        raise TinyprotoError(f"{where}: the service closed the connection without a dask handshake") from None
    except OSError as exc:
        raise TinyprotoError(f"{where}: cannot connect ({one_line(exc)})") from None
    return f"tcp://{host if ':' not in host else '[' + host + ']'}:{port}"
