"""Parties on the workers of a dask.distributed cluster (`tinyproto federate --backend dask`).

Layer: federated. dask is imported only when a DaskBackend is made (it is an optional extra). Every wait is
bounded, and a scheduler address is probed for dask's handshake before dask is let near it.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tinyproto.core.dask_cluster import CONNECT_TIMEOUT_S, DaskCluster, cpu_count, one_line
from tinyproto.core.errors import TinyprotoError
from tinyproto.federated.local_parties import BackendBase, map_parties
from tinyproto.federated.shards import Shard
from tinyproto.federated.stats import tree_sum

CONNECT_TIMEOUT = CONNECT_TIMEOUT_S  # seconds: connecting to a scheduler, starting workers (--timeout)
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
        self.cluster: DaskCluster | None = None
        self.client = None
        self.scheduler = scheduler
        self.processes = processes
        self.timeout = float(timeout)
        self.round_timeout = float(round_timeout)
        try:
            workers = n_workers or max(1, min(len(shards), cpu_count()))
            # processes=False: workers are threads of this process talking over inproc:// (no ports, no spawned
            # interpreters); processes=True gives real parallelism
            self.cluster = DaskCluster(scheduler, workers, processes=processes, timeout=self.timeout)
            self.client = self.cluster.client
            self.workers = self.cluster.workers()
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
            raise TinyprotoError(f"dask ({self.scheduler or 'LocalCluster'}): placing the shards took more than "
                                 f"{self.round_timeout:g} s: {one_line(exc)}") from None
        except BaseException:
            self.close()
            raise
        self._n_parties = len(shards)

    @property
    def n_parties(self) -> int:
        return self._n_parties

    def describe(self) -> dict:
        return {"name": self.name, "scheduler": self.scheduler or "LocalCluster", "workers": len(self.workers),
                "processes": self.cluster.processes if self.cluster is not None else None,
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
                                 f"{one_line(exc)}") from None
        except Exception as exc:  # KilledWorker, CommClosedError, cancelled futures
            if type(exc).__module__.startswith("distributed"):
                raise TinyprotoError(f"dask: {what} failed ({self.scheduler or 'LocalCluster'}): "
                                     f"{type(exc).__name__}: {one_line(exc)}") from None
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
        if self.cluster is not None:
            self.cluster.close()
        self.cluster = self.client = None


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


__all__ = ["CONNECT_TIMEOUT", "DaskBackend", "ROUND_TIMEOUT"]
