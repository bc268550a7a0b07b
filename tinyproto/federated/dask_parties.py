"""Parties on the workers of a dask.distributed cluster (`tinyproto federate --backend dask`).

Layer: federated. dask is imported only when a DaskBackend is made (it is an optional extra). Every wait is
bounded, and a scheduler address is probed for dask's handshake before dask is let near it.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tinyproto.core.errors import TinyprotoError
from tinyproto.federated.local_parties import BackendBase, map_parties
from tinyproto.federated.shards import Shard
from tinyproto.federated.stats import tree_sum

CONNECT_TIMEOUT = 20.0  # seconds: connecting to a scheduler, starting workers (--timeout)
ROUND_TIMEOUT = 600.0  # seconds: one all-reduce round on the cluster


class DaskBackend(BackendBase):
    """Parties on the workers of a dask.distributed cluster, in chunks: worker w holds the shards of parties
    w, w + W, w + 2W, ... as one scattered list (party i on worker i mod W), and every round is one task per
    worker that runs all its parties. An all-reduce first sums within the chunk (on the worker), then a tree of
    additions across the workers brings one result to the coordinator: per round W tasks and log2(W) levels,
    whatever the number of parties, and each worker holds only its own parties' rows and results.

    Every wait is bounded: connecting (`connect_timeout`, after a probe that the address speaks dask's protocol)
    and every round (`round_timeout`); a timeout or a lost worker is a TinyprotoError naming what was tried."""

    name = "dask"

    def __init__(self, shards: Sequence[Shard], scheduler: str | None = None, n_workers: int | None = None,
                 processes: bool = False, timeout: float = CONNECT_TIMEOUT,
                 round_timeout: float = ROUND_TIMEOUT) -> None:
        from distributed import Client, LocalCluster

        self._cluster = None
        self._scratch = None
        self.client = None
        self.scheduler = scheduler
        self.processes = processes
        self.timeout = float(timeout)
        self.round_timeout = float(round_timeout)
        try:
            if scheduler:
                address = probe_scheduler(scheduler, self.timeout)
                try:
                    self.client = Client(address, timeout=self.timeout)
                except (OSError, TimeoutError, ValueError) as exc:
                    raise TinyprotoError(f"cannot connect to the dask scheduler at {scheduler} within "
                                         f"{self.timeout:g} s: {_one_line(exc)}") from None
            else:
                import dask

                from tinyproto.core.outdir import private_scratch

                workers = n_workers or max(1, min(len(shards), _cpu_count()))
                # removed by close(); one a SIGKILLed run left is removed by the next run (its lock is free)
                self._scratch_context = private_scratch("tinyproto-dask-")
                self._scratch = str(self._scratch_context.__enter__())
                # processes=False: workers are threads of this process talking over inproc:// (no ports, no
                # spawned interpreters). processes=True gives real parallelism. dask spawns worker processes
                # with MALLOC_TRIM_THRESHOLD_=65536, which makes glibc hand every freed numpy buffer back to the
                # OS (hashing ran 2x slower); None keeps glibc's adaptive default.
                with dask.config.set({"distributed.nanny.pre-spawn-environ.MALLOC_TRIM_THRESHOLD_": None,
                                      "distributed.comm.timeouts.connect": f"{self.timeout:g}s",
                                      "temporary-directory": self._scratch}):
                    self._cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=processes,
                                                 dashboard_address="127.0.0.1:0", silence_logs=logging.ERROR,
                                                 host="127.0.0.1" if processes else None,
                                                 local_directory=self._scratch)
                self.client = Client(self._cluster, timeout=self.timeout)
                self.client.wait_for_workers(workers, timeout=self.timeout)
            self.workers = sorted(self.client.scheduler_info()["workers"])
            if not self.workers:
                raise TinyprotoError(f"the dask scheduler at {scheduler} has no workers")
            W = min(len(self.workers), len(shards))
            self.placement = [self.workers[i % W] for i in range(len(shards))]
            self.chunks = [list(range(w, len(shards), W)) for w in range(W)]
            self.handles = [self._wait(self.client.scatter([[(np.asarray(shards[i][0]), np.asarray(shards[i][1]))
                                                              for i in chunk]], workers=[self.workers[w]],
                                                            hash=False, timeout=self.round_timeout),
                                       "placing the shards")[0]
                            for w, chunk in enumerate(self.chunks)]
        except TimeoutError as exc:
            self.close()
            raise TinyprotoError(f"dask cluster ({scheduler or 'LocalCluster'}) did not start within "
                                 f"{self.timeout:g} s: {_one_line(exc)}") from None
        except (RuntimeError, OSError) as exc:  # e.g. "Nanny failed to start", no free port
            self.close()
            raise TinyprotoError(f"could not start the dask cluster ({scheduler or 'LocalCluster'}): "
                                 f"{_one_line(exc)}") from None
        except BaseException:
            self.close()
            raise
        self._n_parties = len(shards)

    @property
    def n_parties(self) -> int:
        return self._n_parties

    def describe(self) -> dict:
        return {"name": self.name, "scheduler": self.scheduler or "LocalCluster", "workers": len(self.workers),
                "processes": self.processes if self._cluster is not None else None,
                "reduction": "per-worker chunk sums, then a tree of additions across workers"}

    def _wait(self, value, what: str):
        """Resolve futures (or a list of them) within round_timeout; worker loss -> one-line TinyprotoError."""
        from distributed import Future

        try:
            if isinstance(value, Future):
                return value.result(timeout=self.round_timeout)
            if isinstance(value, list) and value and isinstance(value[0], Future):
                return self.client.gather(value) if self.round_timeout is None else \
                    _gather_with_timeout(self.client, value, self.round_timeout)
            return value
        except TinyprotoError:
            raise
        except TimeoutError:
            raise TinyprotoError(f"dask: {what} did not finish within {self.round_timeout:g} s "
                                 f"({self.scheduler or 'LocalCluster'})") from None
        except (OSError, RuntimeError) as exc:
            raise TinyprotoError(f"dask: {what} failed ({self.scheduler or 'LocalCluster'}): "
                                 f"{_one_line(exc)}") from None
        except Exception as exc:  # KilledWorker, CommClosedError, cancelled futures
            if type(exc).__module__.startswith("distributed"):
                raise TinyprotoError(f"dask: {what} failed ({self.scheduler or 'LocalCluster'}): "
                                     f"{type(exc).__name__}: {_one_line(exc)}") from None
            raise

    def _chunk_args(self, per_party: Sequence | None) -> list:
        return [None if per_party is None else [per_party[i] for i in chunk] for chunk in self.chunks]

    def _submit_chunks(self, runner: Callable, fn: Callable, handles: list, args: tuple,
                       per_party: Sequence | None) -> list:
        if len(handles) > 1 and _payload_bytes(args) > _BROADCAST_BYTES:  # one copy straight to each worker
            args = self._wait(self.client.scatter([args], broadcast=True, hash=False, timeout=self.round_timeout),
                              "broadcasting the round's arguments")[0]
        return [self.client.submit(runner, h, fn, args, pp, workers=[self.workers[w]], allow_other_workers=False,
                                   pure=False)
                for w, (h, pp) in enumerate(zip(handles, self._chunk_args(per_party)))]

    def derive(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list:
        return self._submit_chunks(map_parties, fn, handles, args, per_party)

    def map(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> list:
        per_chunk = self._wait(self._submit_chunks(map_parties, fn, handles, args, per_party), fn.__name__)
        out: list = [None] * self._n_parties
        for chunk, results in zip(self.chunks, per_chunk):
            for i, r in zip(chunk, results):
                out[i] = r
        return out

    def run_on(self, party: int, fn: Callable, *args) -> Any:
        w = party % len(self.chunks)
        pos = self.chunks[w].index(party)
        future = self.client.submit(_chunk_one, self.handles[w], pos, fn, args, workers=[self.workers[w]],
                                    allow_other_workers=False, pure=False)
        return self._wait(future, fn.__name__)

    def allreduce(self, fn: Callable, handles: list, *args, per_party: Sequence | None = None) -> Any:
        """Sum within each worker's chunk, then a tree of additions across workers; one result comes back."""
        level = self._submit_chunks(_chunk_sum, fn, handles, args, per_party)
        while len(level) > 1:
            level = [self.client.submit(operator.add, level[i], level[i + 1], pure=False) if i + 1 < len(level)
                     else level[i] for i in range(0, len(level), 2)]
        return self._wait(level[0], f"all-reduce of {fn.__name__}")

    def release(self, handles: list) -> None:
        for h in handles:
            h.release()

    def close(self) -> None:
        client, cluster = getattr(self, "client", None), self._cluster
        # Closing a LocalCluster whose tasks were cut short (Ctrl-C, a failed round) makes its in-process scheduler
        # log CRITICAL tracebacks about the client's closed comm: noise after the one error the user is shown.
        previous = logging.root.manager.disable
        if cluster is not None:
            logging.disable(logging.CRITICAL)
        try:
            if client is not None:
                try:
                    client.close(timeout=self.timeout)
                except Exception:  # noqa: BLE001 - closing a broken connection must not hide the first error
                    pass
            if cluster is not None:
                try:
                    cluster.close(timeout=self.timeout)
                except Exception:  # noqa: BLE001
                    pass
        finally:
            logging.disable(previous)
        self.client = self._cluster = None
        if self._scratch is not None:
            self._scratch_context.__exit__(None, None, None)
            self._scratch = None


_BROADCAST_BYTES = 1 << 20


def _payload_bytes(value) -> int:
    """Bytes of the numpy arrays in value (tuples, lists, dicts of them), roughly."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, (tuple, list)):
        return sum(_payload_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_payload_bytes(v) for v in value.values())
    if callable(getattr(value, "nbytes", None)):  # e.g. selection.HeldOutWeights
        return int(value.nbytes())
    return 0


def _chunk_sum(chunk: list, fn: Callable, args: tuple, per_party: list | None) -> Any:
    return tree_sum(map_parties(chunk, fn, args, per_party))


def _chunk_one(chunk: list, pos: int, fn: Callable, args: tuple) -> Any:
    return fn(chunk[pos], *args)


def _gather_with_timeout(client, futures: list, timeout: float) -> list:
    from distributed import wait

    done = wait(futures, timeout=timeout)  # raises TimeoutError
    del done
    return client.gather(futures)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return (text[:200] + "...") if len(text) > 200 else (text or type(exc).__name__)


def probe_scheduler(address: str, timeout: float = CONNECT_TIMEOUT) -> str:
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
        raise TinyprotoError(f"--scheduler {address}: cannot resolve host {host!r} ({_one_line(exc)})") from None
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
        raise TinyprotoError(f"{where}: cannot connect ({_one_line(exc)})") from None
    return f"tcp://{host if ':' not in host else '[' + host + ']'}:{port}"


_HANDSHAKE_MAX = 1 << 20  # a dask handshake is ~100 bytes


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


__all__ = ["CONNECT_TIMEOUT", "DaskBackend", "ROUND_TIMEOUT", "probe_scheduler"]
